/* kreg_bench: what libucm_kernel costs next to UCX's own memory hooks.
 *
 *   build/bench/kreg_bench                 # 7 runs, ~60 ms per measurement
 *   build/bench/kreg_bench --reps 5 --ms 100
 *   build/bench/kreg_bench --quick         # seconds; for a smoke test
 *   build/bench/kreg_bench --busy [...]    # P2-P4 idle and with every CPU busy
 *   build/bench/kreg_bench --threads [...] # P3 with 0-1024 other threads
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
 *      (malloc_free_300k, malloc_touch_free_300k, mmap_munmap_4k, _1m;
 *      the mmaps at one fixed place in every process, see p1_slot)
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
 * --busy (busy_load.h): as mpirun places ranks, the measured process is
 * bound to the first CPU it may use (a rank, which keeps that CPU busy
 * itself) and each other CPU runs a busy-polling process; every run
 * measures P2, P3 and P4 once idle (the same binding, no pollers) and once
 * busy, which goes first alternating, and each figure is printed as
 *   P2 hit_64k.default/hooks idle RATIO busy RATIO
 * with the load in the first line and the pollers' CPU share after it.
 *
 * See bench/README.md for what each figure measures. Nothing is asserted:
 * the exit code is non-zero only if a child failed or a check inside a
 * measurement (a hit that missed, a stale region) went wrong. */
#include "kreg_bench.h"

#include "bench_util.h"
#include "busy_load.h"

#include <algorithm>
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

/* One figure: the value compared (key of cfg against base_key of
 * base_cfg). P2's is in reference-loop units (a hit is pure CPU,
 * bench_util.h "the speed state"), its raw line also gives the ratio of the
 * ns (ns_key). */
struct figure {
    std::string num, key, cfg, base_cfg, base_key, label, ns_key;
};

/* A figure over the runs of one load. */
struct summary {
    bool   ok = false;
    size_t n  = 0;
    double ratio = 0, lo = 0, hi = 0; /* median and range of the ratio   */
    double a = 0, b = 0, ns_ratio = 0; /* medians of the ns, of their ratio */
    double ref_a = 0, ref_b = 0;       /* the reference loop, ns an iteration */
};

bool value(const run_timings &r, const std::string &cfg, const std::string &key, double *v)
{
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
}

summary summarize(const figure &f, const std::vector<run_timings> &runs)
{
    const std::string ns_key      = f.ns_key.empty() ? f.key : f.ns_key;
    const std::string base_ns_key = f.ns_key.empty() ? f.base_key : f.ns_key;
    std::vector<double> ratios, a, b, ns_ratios, ra, rb;
    for (const run_timings &r : runs) {
        double x = 0, y = 0, xn = 0, yn = 0;
        if (value(r, f.cfg, f.key, &x) && value(r, f.base_cfg, f.base_key, &y) && y > 0 &&
            value(r, f.cfg, ns_key, &xn) && value(r, f.base_cfg, base_ns_key, &yn) &&
            yn > 0) {
            ratios.push_back(x / y);
            a.push_back(xn);
            b.push_back(yn);
            ns_ratios.push_back(xn / yn);
        }
        if (!f.ns_key.empty()) {
            if (value(r, f.cfg, f.ns_key + ".ref_ns", &x)) {
                ra.push_back(x);
            }
            if (value(r, f.base_cfg, f.ns_key + ".ref_ns", &x)) {
                rb.push_back(x);
            }
        }
    }
    summary s;
    if (ratios.empty()) {
        return s;
    }
    const auto mm = std::minmax_element(ratios.begin(), ratios.end());
    s.ok       = true;
    s.n        = ratios.size();
    s.ratio    = median(ratios);
    s.lo       = *mm.first;
    s.hi       = *mm.second;
    s.a        = median(a);
    s.b        = median(b);
    s.ns_ratio = median(ns_ratios);
    s.ref_a    = median(ra);
    s.ref_b    = median(rb);
    return s;
}

std::vector<figure> figures(const std::vector<std::string> &cfgs, bool with_p1)
{
    std::vector<figure> figs;
    if (with_p1) {
        for (const char *w : {"malloc_free_300k", "malloc_touch_free_300k",
                              "mmap_munmap_4k", "mmap_munmap_1m"}) {
            for (const std::string &cfg : cfgs) {
                const bool sync = (cfg == "sync") || (cfg == "sync_unpinned");
                if ((cfg != "default") && (cfg != "hooks") && !sync) {
                    continue;
                }
                figs.push_back({"P1", std::string("P1.") + w, cfg, "no_ucx",
                                std::string("P1.") + w,
                                std::string(w) + "." + cfg + "/no_ucx"});
                if (sync) {
                    /* what the issue asks of it: against the hooks */
                    figs.push_back({"P1", std::string("P1.") + w, cfg, "hooks",
                                    std::string("P1.") + w,
                                    std::string(w) + "." + cfg + "/hooks"});
                    if (strncmp(w, "mmap", 4) == 0) {
                        /* the same in reference-loop units, the speed
                         * state divided out (a comment line, not P1) */
                        const std::string k = std::string("P1.") + w;
                        figs.push_back({"# ref", k + ".ref", cfg, "hooks", k + ".ref",
                                        std::string(w) + "." + cfg + "/hooks.ref", k});
                    }
                }
            }
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
        const bool sync = (cfg == "sync") || (cfg == "sync_unpinned") ||
                          (cfg == "sync_user");
        if ((cfg == "default") || (cfg == "uffd") || sync) {
            for (const char *k : {"munmap_1m", "munmap_1m_to_rcache"}) {
                figs.push_back({"P3", std::string("P3.") + k, cfg, "hooks",
                                std::string("P3.") + k,
                                std::string(k) + "." + cfg + "/hooks"});
            }
            if (sync) {
                continue; /* no watch of ours: no P4 */
            }
            figs.push_back({"P4", "P4.miss_64k_watch", cfg, cfg, "P4.miss_64k_nowatch",
                            "miss_64k." + cfg + "/nowatch"});
        }
    }
    return figs;
}

/* median (and range) over the runs of one key of one configuration */
bool per_config(const std::vector<run_timings> &runs, const std::string &cfg,
                const std::string &key, double *med, double *lo, double *hi,
                size_t *n = nullptr)
{
    std::vector<double> v;
    for (const run_timings &r : runs) {
        double x = 0;
        if (value(r, cfg, key, &x)) {
            v.push_back(x);
        }
    }
    if (v.empty()) {
        return false;
    }
    const auto mm = std::minmax_element(v.begin(), v.end());
    *med = median(v);
    *lo  = *mm.first;
    *hi  = *mm.second;
    if (n != nullptr) {
        *n = v.size();
    }
    return true;
}

/* Every configuration once, in an order that rotates with rep. */
run_timings run_configs(const std::vector<std::string> &cfgs, int rep, bool p2p4_only,
                        std::string *backend_line, int *rc,
                        const std::vector<std::string> &extra = {})
{
    run_timings run;
    for (size_t i = 0; i < cfgs.size(); ++i) {
        const std::string &cfg = cfgs[(i + rep) % cfgs.size()];
        std::vector<std::string> args = {"--child", cfg, "--ms",
                                         std::to_string(g_target_ms), "--inner",
                                         std::to_string(g_inner)};
        if (p2p4_only) {
            args.push_back("--p2p4");
        }
        args.insert(args.end(), extra.begin(), extra.end());
        child_result res = run_self(args, env_for(cfg));
        read_child_results(res.output, cfg, backend_line,
                           [&](const char *key, double v) { run[cfg][key] = v; });
        if (res.status != 0) {
            fprintf(stderr, "bench: child %s exited with %d\n", cfg.c_str(), res.status);
            *rc = 1;
        }
    }
    return run;
}

/* "uffd" beside "default" only where the default is the notifier */
bool notifier_is_default()
{
    return access("/dev/kreg_notifier", R_OK | W_OK) == 0;
}

int parent(int reps)
{
    /* sync_user: synchronous delivery's signal and handler without the
     * module (P3 only), where "sync" cannot run too */
    std::vector<std::string> cfgs = {"no_ucx", "default", "hooks", "plain", "sync_user"};
    if (notifier_is_default()) {
        cfgs.push_back("uffd");
        cfgs.push_back("sync"); /* UCX's own cache, synchronous delivery */
        /* the same reporting every unmap (UCX_KREG_SYNC_UNPINNED=y) */
        cfgs.push_back("sync_unpinned");
    }
    std::vector<run_timings> runs;
    std::string backend_line;
    int rc = 0;
    const uint64_t t0 = now_ns();
    printf("# kreg_bench: %d runs, %.0f ms per measurement, median of %d per child; "
           "loadavg %s\n", reps, g_target_ms, g_inner, loadavg().c_str());
    for (int rep = 0; rep < reps; ++rep) {
        runs.push_back(run_configs(cfgs, rep, false, &backend_line, &rc));
    }
    if (!backend_line.empty()) {
        printf("%s\n", backend_line.c_str());
    }

    for (const figure &f : figures(cfgs, true)) {
        const summary s = summarize(f, runs);
        if (!s.ok) {
            printf("%s %s n/a\n", f.num.c_str(), f.label.c_str());
            rc = 1;
            continue;
        }
        printf("%s %s %.2f\n", f.num.c_str(), f.label.c_str(), s.ratio);
        printf("# raw %s: %.1f ns vs %.1f ns (medians); ratio over %zu runs %.2f..%.2f",
               f.label.c_str(), s.a, s.b, s.n, s.lo, s.hi);
        if (!f.ns_key.empty()) {
            /* the loop's own speed per configuration: were the library to
             * slow the CPU down (a busy thread), it would show here */
            printf("; in reference-loop units (the figure), the ratio of ns %.2f; "
                   "the loop %.2f vs %.2f ns an iteration", s.ns_ratio, s.ref_a, s.ref_b);
        }
        printf("\n");
    }
    /* the check's cost inside one process (kreg_bench_measure.cc) */
    for (const char *key : {"P2.hit_64k", "P2.hit_1m"}) {
        for (const std::string &cfg : cfgs) {
            double med, lo, hi;
            size_t n;
            if (per_config(runs, cfg, std::string(key) + ".inproc", &med, &lo, &hi, &n)) {
                printf("# in-process %s.%s/ucs_rcache_get %.2f (over %zu runs %.2f..%.2f)\n",
                       key + 3, cfg.c_str(), med, n, lo, hi);
            }
        }
    }
    /* absolute ns per hit */
    for (const char *key : {"P2.hit_64k", "P2.hit_1m"}) {
        printf("# raw %s ns per hit:", key + 3);
        for (const std::string &cfg : cfgs) {
            double med, lo, hi;
            if (per_config(runs, cfg, key, &med, &lo, &hi)) {
                printf(" %s=%.1f", cfg.c_str(), med);
            }
        }
        printf("\n");
    }
    printf("# %.1f s, loadavg %s\n", (now_ns() - t0) / 1e9, loadavg().c_str());
    return rc;
}

/* --busy: P2, P3 and P4 with the node idle and with every CPU busy
 * (busy_load.h), the two loads in turn within each run (which goes first
 * alternates), each figure printed for both. */
int parent_busy(int reps)
{
    busy_load load;
    if (!load.bind_rank()) {
        fprintf(stderr, "bench: cannot bind to a CPU: %s\n", strerror(errno));
        return 2;
    }
    std::vector<std::string> cfgs = {"default", "hooks"};
    if (notifier_is_default()) {
        cfgs.push_back("uffd");
    }
    std::vector<run_timings> idle, busy;
    std::string backend_line;
    int rc = 0;
    double busy_wall = 0, busy_cpu = 0;
    const uint64_t t0 = now_ns();
    printf("# kreg_bench --busy: %s; idle: the same binding, nothing else started; "
           "%d runs, %.0f ms per measurement, median of %d per child; loadavg %s\n",
           load.describe().c_str(), reps, g_target_ms, g_inner, loadavg().c_str());
    fflush(stdout);
    for (int rep = 0; rep < reps; ++rep) {
        for (int phase = 0; phase < 2; ++phase) {
            const bool loaded = (phase + rep) % 2 == 1;
            if (!loaded) {
                idle.push_back(run_configs(cfgs, rep, true, &backend_line, &rc));
                continue;
            }
            if (!load.start()) {
                fprintf(stderr, "bench: cannot start the pollers: %s\n", strerror(errno));
                return 2;
            }
            const uint64_t b0 = now_ns();
            busy.push_back(run_configs(cfgs, rep, true, &backend_line, &rc));
            busy_wall += (now_ns() - b0) / 1e9;
            busy_cpu += busy_load::cpu_seconds();
            busy_load::stop();
        }
    }
    if (!backend_line.empty()) {
        printf("%s\n", backend_line.c_str());
    }
    /* the load as it was: each poller's CPU time over the busy phases */
    if (load.pollers() > 0) {
        printf("# pollers: %.0f%% of a CPU each over the busy phases (%.1f s)\n",
               100.0 * busy_cpu / (busy_wall * static_cast<double>(load.pollers())),
               busy_wall);
    }
    for (const figure &f : figures(cfgs, false)) {
        const summary si = summarize(f, idle), sb = summarize(f, busy);
        if (!si.ok || !sb.ok) {
            printf("%s %s n/a\n", f.num.c_str(), f.label.c_str());
            rc = 1;
            continue;
        }
        printf("%s %s idle %.2f busy %.2f\n", f.num.c_str(), f.label.c_str(), si.ratio,
               sb.ratio);
        printf("# raw %s: idle %.1f vs %.1f ns (ratio over %zu runs %.2f..%.2f), "
               "busy %.1f vs %.1f ns (%.2f..%.2f)", f.label.c_str(), si.a, si.b, si.n,
               si.lo, si.hi, sb.a, sb.b, sb.lo, sb.hi);
        if (!f.ns_key.empty()) {
            printf("; ratio of ns idle %.2f busy %.2f; the loop idle %.2f vs %.2f, "
                   "busy %.2f vs %.2f ns an iteration", si.ns_ratio, sb.ns_ratio,
                   si.ref_a, si.ref_b, sb.ref_a, sb.ref_b);
        }
        printf("\n");
    }
    for (const char *key : {"P2.hit_64k", "P2.hit_1m"}) {
        for (const std::string &cfg : cfgs) {
            double mi, li, hi, mb, lb, hb;
            if (per_config(idle, cfg, std::string(key) + ".inproc", &mi, &li, &hi) &&
                per_config(busy, cfg, std::string(key) + ".inproc", &mb, &lb, &hb)) {
                printf("# in-process %s.%s/ucs_rcache_get idle %.2f (%.2f..%.2f) busy %.2f "
                       "(%.2f..%.2f)\n", key + 3, cfg.c_str(), mi, li, hi, mb, lb, hb);
            }
        }
    }
    for (const char *key : {"P2.hit_64k", "P2.hit_1m"}) {
        for (int loaded = 0; loaded < 2; ++loaded) {
            printf("# raw %s ns per hit, %s:", key + 3, loaded ? "busy" : "idle");
            for (const std::string &cfg : cfgs) {
                double med, lo, hi;
                if (per_config(loaded ? busy : idle, cfg, key, &med, &lo, &hi)) {
                    printf(" %s=%.1f", cfg.c_str(), med);
                }
            }
            printf("\n");
        }
    }
    /* a hit waits for the library's threads only when an event is on its
     * way: in a loop of hits there is none */
    for (const char *key : {"P2.hit_64k", "P2.hit_1m"}) {
        printf("# hits that waited for the library's threads (median, most of a run):");
        for (int loaded = 0; loaded < 2; ++loaded) {
            for (const std::string &cfg : cfgs) {
                double med, lo, hi;
                if (per_config(loaded ? busy : idle, cfg, std::string(key) + ".waits", &med,
                               &lo, &hi) && is_kernel_config(cfg)) {
                    printf(" %s.%s.%s=%.0f,%.0f", loaded ? "busy" : "idle", key + 3,
                           cfg.c_str(), med, hi);
                }
            }
        }
        printf("\n");
    }
    printf("# %.1f s, loadavg %s\n", (now_ns() - t0) / 1e9, loadavg().c_str());
    return rc;
}

std::vector<std::string> split_list(const std::string &v)
{
    std::vector<std::string> out;
    size_t b = 0;
    for (;;) {
        const size_t e = v.find(',', b);
        out.push_back(v.substr(b, e == std::string::npos ? std::string::npos : e - b));
        if (e == std::string::npos) {
            return out;
        }
        b = e + 1;
    }
}

/* --threads: P3 with other threads in the process (asleep, spinning in
 * user space, making system calls), T of them, hooks against synchronous
 * delivery ("sync" where the module is loaded, else "sync_user", the
 * signal alone), every T and kind in every run. Printed: the two side by
 * side at each T, each against itself with one other thread and with none
 * (P3(T)/P3(1), the goal, and P3(T)/P3(0); ratios within a run),
 * and the other threads' own rate during P3,
 * sync against hooks. */
int parent_threads(int reps, const std::vector<std::string> &kinds,
                   const std::vector<int> &counts)
{
    const std::string sync = notifier_is_default() ? "sync" : "sync_user";
    const std::vector<std::string> cfgs = {"hooks", sync};
    std::map<std::string, std::map<int, std::vector<run_timings>>> runs;
    std::string backend_line;
    int rc = 0;
    const uint64_t t0 = now_ns();
    printf("# kreg_bench --threads: P3 (munmap of a cached, pinned 1 MiB) with T "
           "other threads; %d runs, %.0f ms per measurement, median of %d per child; "
           "loadavg %s\n", reps, g_target_ms, g_inner, loadavg().c_str());
    fflush(stdout);
    for (int rep = 0; rep < reps; ++rep) {
        for (const std::string &kind : kinds) {
            for (int n : counts) {
                runs[kind][n].push_back(run_configs(
                        cfgs, rep, true, &backend_line, &rc,
                        {"--bg", kind + ":" + std::to_string(n)}));
            }
        }
    }
    if (!backend_line.empty()) {
        printf("%s\n", backend_line.c_str());
    }
    const std::string key = "P3.munmap_1m";
    for (const std::string &kind : kinds) {
        for (int n : counts) {
            const std::vector<run_timings> &r = runs[kind][n];
            const summary s = summarize({"P3T", key, sync, "hooks", key, ""}, r);
            printf("P3T %s T=%d munmap_1m.%s/hooks ", kind.c_str(), n, sync.c_str());
            if (s.ok) {
                printf("%.2f", s.ratio);
            } else {
                printf("n/a");
            }
            /* each configuration against itself with base other threads,
             * run by run: the median, or < 0 with no pair */
            auto against = [&](const std::string &cfg, int base, const std::string &k) {
                std::vector<double> v;
                const std::vector<run_timings> &z = runs[kind][base];
                for (size_t i = 0; i < r.size() && i < z.size(); ++i) {
                    double x, y;
                    if (value(r[i], cfg, k, &x) && value(z[i], cfg, k, &y) && y > 0) {
                        v.push_back(x / y);
                    }
                }
                return v.empty() ? -1.0 : median(v);
            };
            for (const std::string &cfg : cfgs) {
                for (int base : {1, 0}) {
                    const double m = against(cfg, base, key);
                    if (m >= 0) {
                        printf("  %s P3(T)/P3(%d) %.2f", cfg.c_str(), base, m);
                    }
                }
            }
            summary b, cpu;
            /* threads that count their iterations */
            if (n > 0 && (kind == "spinning" || kind == "syscalls" || kind == "apart")) {
                b   = summarize({"P3T", "P3.bg_rate", sync, "hooks", "P3.bg_rate", ""}, r);
                cpu = summarize({"P3T", "P3.bg_cpu", sync, "hooks", "P3.bg_cpu", ""}, r);
                if (b.ok) {
                    printf("  their rate %s/hooks %.3f", sync.c_str(), b.ratio);
                }
            }
            printf("\n");
            /* what sync adds as T grows, beside what the same T costs
             * hooks in the same run: each run's sync P3(T)/P3(1) over its
             * hooks P3(T)/P3(1), the median (a reading only; the goal is
             * the line above) */
            {
                std::vector<double> g;
                const std::vector<run_timings> &z = runs[kind][1];
                for (size_t i = 0; i < r.size() && i < z.size(); ++i) {
                    double sx, sy, hx, hy;
                    if (value(r[i], sync, key, &sx) && value(z[i], sync, key, &sy) &&
                        value(r[i], "hooks", key, &hx) && value(z[i], "hooks", key, &hy) &&
                        sy > 0 && hx > 0 && hy > 0) {
                        g.push_back((sx / sy) / (hx / hy));
                    }
                }
                if (!g.empty()) {
                    printf("# growth %s T=%d: %s's P3(T)/P3(1) over hooks', run by run: "
                           "median %.2f over %zu runs\n", kind.c_str(), n, sync.c_str(),
                           median(g), g.size());
                }
            }
            /* the same in reference-loop units, which divide out the
             * speed state a child ran in (bench/README.md, "Noise") */
            printf("# ref %s T=%d: P3(T)/P3(1) in reference-loop units:", kind.c_str(), n);
            for (const std::string &cfg : cfgs) {
                const double m = against(cfg, 1, key + ".ref");
                if (m >= 0) {
                    printf(" %s %.2f", cfg.c_str(), m);
                }
            }
            printf("\n");
            /* what the other threads did against what they ran: a rate
             * lost with its CPU time was taken (holds, the CPU given to
             * another thread), one lost at the same CPU time was slowed */
            if (b.ok && cpu.ok) {
                printf("# %s T=%d: their rate %s/hooks over %zu runs %.3f..%.3f; their "
                       "CPUs %.3f (%.3f vs %.3f CPUs)", kind.c_str(), n, sync.c_str(), b.n,
                       b.lo, b.hi, cpu.ratio, cpu.a, cpu.b);
                std::vector<double> queued, held, slept, passes, parked, parked_held;
                for (const run_timings &x : r) {
                    double v;
                    if (value(x, sync, "P3.queued", &v)) {
                        queued.push_back(v);
                    }
                    if (value(x, sync, "P3.held", &v)) {
                        held.push_back(v);
                    }
                    if (value(x, sync, "P3.held_waits", &v)) {
                        slept.push_back(v);
                    }
                    if (value(x, sync, "P3.passes", &v)) {
                        passes.push_back(v);
                    }
                    if (value(x, sync, "P3.parked", &v)) {
                        parked.push_back(v);
                    }
                    if (value(x, sync, "P3.parked_held", &v)) {
                        parked_held.push_back(v);
                    }
                }
                if (!queued.empty() && !held.empty() && !slept.empty()) {
                    printf("; changes queued %.0f/s, holds %.0f/s, of them slept %.0f/s",
                           median(queued), median(held), median(slept));
                }
                if (!passes.empty() && !parked.empty() && !parked_held.empty()) {
                    printf("; let go at interrupts %.0f/s, parked %.0f/s, armed by a "
                           "parked thread's call %.0f/s",
                           median(passes), median(parked), median(parked_held));
                }
                /* the mechanism ran: P3's pinned change went through the
                 * module (an unpinned P3 measured UCM's hooks instead) */
                if ((sync == "sync") && !queued.empty() && (median(queued) == 0)) {
                    printf("\n# error: the module queued no change during P3");
                    rc = 1;
                }
                /* the same from their start: each thread's first change
                 * (kreg_bench_measure.cc) and the calibration included */
                const summary ba  = summarize({"P3T", "P3.bg_rate_all", sync, "hooks",
                                               "P3.bg_rate_all", ""}, r);
                const summary ca  = summarize({"P3T", "P3.bg_cpu_all", sync, "hooks",
                                               "P3.bg_cpu_all", ""}, r);
                std::vector<double> held_all;
                for (const run_timings &x : r) {
                    double v;
                    if (value(x, sync, "P3.held_all", &v)) {
                        held_all.push_back(v);
                    }
                }
                if (ba.ok && ca.ok && !held_all.empty()) {
                    printf("\n# %s T=%d: from their start, their first change included: "
                           "their rate %s/hooks %.3f (%.3f..%.3f), their CPUs %.3f, holds "
                           "%.0f/s", kind.c_str(), n, sync.c_str(), ba.ratio, ba.lo, ba.hi,
                           ca.ratio, median(held_all));
                }
                printf("\n# %s T=%d: their rate, run by run (%s, hooks, 1e6/s):", kind.c_str(),
                       n, sync.c_str());
                for (const run_timings &x : r) {
                    double v, h;
                    if (value(x, sync, "P3.bg_rate", &v) && value(x, "hooks", "P3.bg_rate", &h)) {
                        printf(" %.1f,%.1f", v / 1e6, h / 1e6);
                    }
                }
                printf("\n");
            }
            if (s.ok) {
                printf("# raw %s T=%d: %.1f vs %.1f us (medians); ratio over %zu runs "
                       "%.2f..%.2f\n", kind.c_str(), n, s.a / 1e3, s.b / 1e3, s.n,
                       s.lo, s.hi);
            } else {
                rc = 1;
            }
        }
    }
    printf("# %.1f s, loadavg %s\n", (now_ns() - t0) / 1e9, loadavg().c_str());
    return rc;
}

} // namespace

int main(int argc, char **argv)
{
    std::string cfg;
    int reps  = 7;
    bool busy = false, threads = false;
    std::vector<std::string> kinds = {"asleep", "stacks", "spinning", "apart", "syscalls"};
    /* the goal is against T = 1; T = 0 is the stricter base */
    std::vector<int> counts = {0, 1, 4, 16, 64, 1024};
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
        } else if (a == "--p2p4") {
            g_p2p4_only = true;
        } else if (a == "--busy") {
            busy = true;
        } else if (a == "--threads") {
            threads = true;
        } else if (a == "--bg" && i + 1 < argc) {
            const std::string v = argv[++i];
            const size_t colon  = v.find(':');
            g_bg_kind = v.substr(0, colon);
            g_bg_n    = (colon == std::string::npos) ? 0 : atoi(v.c_str() + colon + 1);
        } else if (a == "--kinds" && i + 1 < argc) {
            kinds = split_list(argv[++i]);
        } else if (a == "--counts" && i + 1 < argc) {
            counts.clear();
            for (const std::string &n : split_list(argv[++i])) {
                char *end;
                const long v = strtol(n.c_str(), &end, 10);
                if (n.empty() || (*end != '\0') || (v < 0) || (v > 4096)) {
                    fprintf(stderr, "%s: --counts: '%s' is not a number of threads 0..4096\n",
                            argv[0], n.c_str());
                    return 2;
                }
                counts.push_back(static_cast<int>(v));
            }
        } else if (a == "--quick") {
            reps        = 2;
            g_target_ms = 5;
            g_inner     = 1;
        } else {
            fprintf(stderr,
                    "usage: %s [--busy|--threads [--kinds asleep,stacks,spinning,apart,syscalls] "
                    "[--counts 0,1,4,16,64,1024]] [--reps N] [--ms MS] [--inner K] "
                    "[--quick]\n", argv[0]);
            return 2;
        }
    }
    if (!cfg.empty()) {
        return child(cfg);
    }
    if (threads) {
        for (const std::string &k : kinds) {
            if ((k != "asleep") && (k != "stacks") && (k != "spinning") && (k != "syscalls") &&
                (k != "apart")) {
                fprintf(stderr,
                        "%s: --kinds: '%s' is none of asleep, stacks, spinning, apart, "
                        "syscalls\n",
                        argv[0], k.c_str());
                return 2;
            }
        }
        /* P3(T)/P3(1) and P3(T)/P3(0) need their bases in the run */
        for (int base : {1, 0}) {
            if (std::find(counts.begin(), counts.end(), base) == counts.end()) {
                counts.insert(counts.begin(), base);
            }
        }
        std::sort(counts.begin(), counts.end());
        counts.erase(std::unique(counts.begin(), counts.end()), counts.end());
        return parent_threads(reps, kinds, counts);
    }
    return busy ? parent_busy(reps) : parent(reps);
}
