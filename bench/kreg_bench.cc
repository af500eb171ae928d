/* kreg_bench: what libucm_kernel costs next to UCX's own memory hooks.
 *
 *   build/bench/kreg_bench                 # 7 runs, ~60 ms per measurement
 *   build/bench/kreg_bench --reps 5 --ms 100
 *   build/bench/kreg_bench --quick         # seconds; for a smoke test
 *
 * Every configuration runs in its own child process (hooks and UCX's
 * external-event declaration are process-global): "no_ucx" never calls into
 * UCX, "hooks" is a plain ucs_rcache with UCX's default UCM settings (malloc
 * and mmap hooks installed), "default" is the kernel source as a user gets
 * it with nothing set (the notifier where its module is loaded, else
 * userfaultfd; exact), "plain" the same backend in plain mode, and where the
 * notifier is the default, "uffd" the userfaultfd backend beside it (see
 * bench_util.h, env_for). Kernel processes run with UCM's hooks off. The
 * parent runs the children in turn, rotating their order each run, and
 * prints for every figure the median over the runs of the ratio measured
 * within one run:
 *
 *   # backend: NAME mode: NAME                     what "default" is here
 *   P1 <workload>.<default|hooks>/no_ucx <ratio>   unregistered malloc/mmap
 *      (malloc_free_300k, malloc_touch_free_300k, mmap_munmap_4k, _1m)
 *   P2 hit_<size>.<config>/hooks <ratio>           cache hit (lookup+get+put)
 *   P3 munmap_1m[_to_rcache].<config>/hooks <ratio> freeing a cached buffer
 *   P4 miss_64k.<config>/nowatch <ratio>           the watch in a miss
 *   # raw ...                                      medians in ns per op
 *   # in-process hit_<size>.<config>/ucs_rcache_get <ratio>
 *        the hit against ucs_rcache_get alone on the same rcache, batches
 *        alternating in one process: what the check adds, nothing else
 *
 * P2's ratio is of the hit in iterations of a reference loop timed around
 * each batch (bench_util.h, "the speed state": under TCG the CPU's speed
 * moves by up to 1.7x between processes); its raw line gives the ns and
 * their ratio too.
 *
 * See bench/README.md for what each figure measures. Nothing is asserted:
 * the exit code is non-zero only if a child failed or a check inside a
 * measurement (a hit that missed, a stale region) went wrong. */
#include "kreg_bench.h"

#include "bench_util.h"

#include <map>

using namespace bench;

namespace {

/* ---- parent -------------------------------------------------------------- */

using run_timings = std::map<std::string, std::map<std::string, double>>; /* cfg -> key -> ns */

std::string loadavg()
{
    char buf[64] = "?";
    FILE *f = fopen("/proc/loadavg", "r");
    if (f) {
        if (!fgets(buf, sizeof(buf), f)) {
            strcpy(buf, "?");
        }
        fclose(f);
    }
    std::string s(buf);
    if (!s.empty() && s.back() == '\n') {
        s.pop_back();
    }
    return s;
}

int parent(int reps)
{
    /* "uffd" beside "default" only where the default is the notifier */
    const bool notifier = access("/dev/kreg_notifier", R_OK | W_OK) == 0;
    std::vector<std::string> cfgs = {"no_ucx", "default", "hooks", "plain"};
    if (notifier) {
        cfgs.push_back("uffd");
    }
    std::vector<run_timings> runs;
    std::string backend_line;
    int rc = 0;
    const uint64_t t0 = now_ns();
    printf("# kreg_bench: %d runs, %.0f ms per measurement, median of %d per child; "
           "loadavg %s\n", reps, g_target_ms, g_inner, loadavg().c_str());
    for (int rep = 0; rep < reps; ++rep) {
        run_timings run;
        for (size_t i = 0; i < cfgs.size(); ++i) {
            const std::string &cfg = cfgs[(i + rep) % cfgs.size()];
            std::vector<std::string> args = {"--child", cfg, "--ms",
                                             std::to_string(g_target_ms), "--inner",
                                             std::to_string(g_inner)};
            child_result res = run_self(args, env_for(cfg));
            read_child_results(res.output, cfg, &backend_line,
                               [&](const char *key, double v) { run[cfg][key] = v; });
            if (res.status != 0) {
                fprintf(stderr, "bench: child %s exited with %d\n", cfg.c_str(),
                        res.status);
                rc = 1;
            }
        }
        runs.push_back(run);
    }
    if (!backend_line.empty()) {
        printf("%s\n", backend_line.c_str());
    }

    /* key: the value compared; P2's is in reference-loop units (a hit is
     * pure CPU, bench_util.h "the speed state"), its raw line also gives
     * the ratio of the ns */
    struct figure {
        std::string num, key, cfg, base_cfg, base_key, label, ns_key;
    };
    std::vector<figure> figs;
    for (const char *w : {"malloc_free_300k", "malloc_touch_free_300k", "mmap_munmap_4k",
                          "mmap_munmap_1m"}) {
        for (const char *cfg : {"default", "hooks"}) {
            figs.push_back({"P1", std::string("P1.") + w, cfg, "no_ucx",
                            std::string("P1.") + w, std::string(w) + "." + cfg + "/no_ucx"});
        }
    }
    for (const char *size : {"64k", "1m"}) {
        for (const std::string &cfg : cfgs) {
            if (is_kernel_config(cfg)) {
                const std::string key = std::string("P2.hit_") + size;
                figs.push_back({"P2", key + ".ref", cfg, "hooks", key + ".ref",
                                std::string("hit_") + size + "." + cfg + "/hooks", key});
            }
        }
    }
    for (const std::string &cfg : cfgs) {
        if ((cfg == "default") || (cfg == "uffd")) {
            for (const char *k : {"munmap_1m", "munmap_1m_to_rcache"}) {
                figs.push_back({"P3", std::string("P3.") + k, cfg, "hooks",
                                std::string("P3.") + k, std::string(k) + "." + cfg + "/hooks"});
            }
            figs.push_back({"P4", "P4.miss_64k_watch", cfg, cfg, "P4.miss_64k_nowatch",
                            "miss_64k." + cfg + "/nowatch"});
        }
    }
    auto value = [](const run_timings &r, const std::string &cfg, const std::string &key,
                    double *v) {
        auto c = r.find(cfg);
        if (c == r.end()) {
            return false;
        }
        auto k = c->second.find(key);
        if (k == c->second.end()) {
            return false;
        }
        *v = k->second;
        return true;
    };
    for (const figure &f : figs) {
        const std::string ns_key = f.ns_key.empty() ? f.key : f.ns_key;
        const std::string base_ns_key = f.ns_key.empty() ? f.base_key : f.ns_key;
        std::vector<double> ratios, a, b, ns_ratios;
        for (const run_timings &r : runs) {
            double x = 0, y = 0, xn = 0, yn = 0;
            if (value(r, f.cfg, f.key, &x) && value(r, f.base_cfg, f.base_key, &y) &&
                y > 0 && value(r, f.cfg, ns_key, &xn) &&
                value(r, f.base_cfg, base_ns_key, &yn) && yn > 0) {
                ratios.push_back(x / y);
                a.push_back(xn);
                b.push_back(yn);
                ns_ratios.push_back(xn / yn);
            }
        }
        if (ratios.empty()) {
            printf("%s %s n/a\n", f.num.c_str(), f.label.c_str());
            rc = 1;
            continue;
        }
        const auto mm = std::minmax_element(ratios.begin(), ratios.end());
        printf("%s %s %.2f\n", f.num.c_str(), f.label.c_str(), median(ratios));
        printf("# raw %s: %.1f ns vs %.1f ns (medians); ratio over %zu runs %.2f..%.2f",
               f.label.c_str(), median(a), median(b), ratios.size(), *mm.first,
               *mm.second);
        if (!f.ns_key.empty()) {
            /* the loop's own speed per configuration: were the library to
             * slow the CPU down (a busy thread), it would show here */
            std::vector<double> ra, rb;
            for (const run_timings &r : runs) {
                double x = 0;
                if (value(r, f.cfg, f.ns_key + ".ref_ns", &x)) {
                    ra.push_back(x);
                }
                if (value(r, f.base_cfg, f.ns_key + ".ref_ns", &x)) {
                    rb.push_back(x);
                }
            }
            printf("; in reference-loop units (the figure), the ratio of ns %.2f; "
                   "the loop %.2f vs %.2f ns an iteration", median(ns_ratios),
                   median(ra), median(rb));
        }
        printf("\n");
    }
    /* the check's cost inside one process (kreg_bench_measure.cc) */
    for (const char *key : {"P2.hit_64k", "P2.hit_1m"}) {
        for (const std::string &cfg : cfgs) {
            std::vector<double> v;
            for (const run_timings &r : runs) {
                double x = 0;
                if (value(r, cfg, std::string(key) + ".inproc", &x)) {
                    v.push_back(x);
                }
            }
            if (!v.empty()) {
                const auto mm = std::minmax_element(v.begin(), v.end());
                printf("# in-process %s.%s/ucs_rcache_get %.2f (over %zu runs %.2f..%.2f)\n",
                       key + 3, cfg.c_str(), median(v), v.size(), *mm.first, *mm.second);
            }
        }
    }
    /* absolute ns per hit */
    for (const char *key : {"P2.hit_64k", "P2.hit_1m"}) {
        printf("# raw %s ns per hit:", key + 3);
        for (const std::string &cfg : cfgs) {
            std::vector<double> v;
            for (const run_timings &r : runs) {
                double x = 0;
                if (value(r, cfg, key, &x)) {
                    v.push_back(x);
                }
            }
            if (!v.empty()) {
                printf(" %s=%.1f", cfg.c_str(), median(v));
            }
        }
        printf("\n");
    }
    printf("# %.1f s, loadavg %s\n", (now_ns() - t0) / 1e9, loadavg().c_str());
    return rc;
}

} // namespace

int main(int argc, char **argv)
{
    std::string cfg;
    int reps = 7;
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        if (a == "--child" && i + 1 < argc) {
            cfg = argv[++i];
        } else if (a == "--reps" && i + 1 < argc) {
            reps = std::max(1, atoi(argv[++i]));
        } else if (a == "--ms" && i + 1 < argc) {
            g_target_ms = std::max(1.0, atof(argv[++i]));
        } else if (a == "--inner" && i + 1 < argc) {
            g_inner = std::max(1, atoi(argv[++i]));
        } else if (a == "--quick") {
            reps        = 2;
            g_target_ms = 5;
            g_inner     = 1;
        } else {
            fprintf(stderr,
                    "usage: %s [--reps N] [--ms MS] [--inner K] [--quick]\n", argv[0]);
            return 2;
        }
    }
    if (!cfg.empty()) {
        return child(cfg);
    }
    return parent(reps);
}
