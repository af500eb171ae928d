/* md_bench: a registration cache hit as a UCT user meets it, the
 * ib_regcache component's md against UCX's stock IB md (issue 10). Needs a
 * verbs device: run it in the Soft-RoCE VM (make bench-vm).
 *
 *   bench/md_bench --lib BUILD/.libs/libuct_ib_regcache.so [--reps N]
 *                  [--ms MS] [--device DEV]
 *
 * One operation = uct_md_mem_reg + uct_md_mem_dereg of a 64 KiB buffer
 * that is already in the md's cache (the first registration is made before
 * timing, and every later one must return the same handle: a hit). Each
 * configuration runs in a process of its own (hooks and UCX's external
 * event are process-global): the program re-executes itself.
 *
 *   default    the library dlopen'ed before UCT is used, md "ib_regcache",
 *              UCM's hooks off (as kreg-run runs it): the kernel source as
 *              a user gets it (the notifier where its module is loaded,
 *              else userfaultfd)
 *   uffd       the same with UCX_KREG_BACKEND=uffd, only where the notifier
 *              module is loaded (then default is the notifier)
 *   stock_md   no library: UCX's stock md "ib" with its own rcache and
 *              UCX's default UCM hooks
 *
 * A run takes every configuration once, in an order that rotates from run
 * to run; a child times batches of operations for about MS ms, each batch
 * between two runs of a reference loop, and reports the median batch in ns
 * per operation and in reference-loop iterations (bench_util.h, "the speed
 * state"). Printed: for each configuration but stock_md, the median over
 * the runs of the ratio to stock_md measured in the same run, in
 * reference-loop units, and a raw line with the ns and their ratio:
 *
 *   # backend: NAME mode: NAME (...)     what "default" is here
 *   P2 md_hit_64k.default/stock_md 1.23
 *   # raw md_hit_64k.default/stock_md: 61.0 ns vs 49.6 ns (medians); ...
 *
 * Exit status: 0, or 1 if a child failed (no device, not a hit, ...). */
#include "bench_util.h"
#include "test/regcache/uct_component.h"

#include <uct/api/uct.h>

#include <dlfcn.h>
#include <map>

using namespace bench;

namespace {

constexpr size_t kLen = 64 * 1024;

/* ---- child ---------------------------------------------------------------- */

/* ns per operation, batches of `batch` operations for about `ms` of wall
 * time, each between two reference loops (bench_util.h, "the speed
 * state"): the median batch in ns and in reference-loop units */
template <class Op> batch_times time_ops(Op &&op, double ms)
{
    constexpr unsigned batch = 2000;
    return time_batches([&]() -> double {
        const uint64_t t0 = now_ns();
        for (unsigned i = 0; i < batch; ++i) {
            if (!op()) {
                return -1;
            }
        }
        return static_cast<double>(now_ns() - t0) / batch;
    }, ms);
}

int child(const std::string &config, const std::string &lib,
          const std::string &device, double ms)
{
    const bool ours = (config != "stock_md");
    if (ours && (dlopen(lib.c_str(), RTLD_NOW | RTLD_GLOBAL) == nullptr)) {
        fprintf(stderr, "md_bench: dlopen %s: %s\n", lib.c_str(), dlerror());
        return 3;
    }

    std::string md_name;
    uct_component_h component = find_component(ours ? "ib_regcache" : "ib",
                                                md_name,
                                                device.empty() ? nullptr :
                                                                 device.c_str());
    if (component == nullptr) {
        fprintf(stderr, "md_bench: no md resource of %s%s%s (no verbs device?)\n",
                ours ? "ib_regcache" : "ib", device.empty() ? "" : " on ",
                device.c_str());
        return 3;
    }
    uct_md_config_t *md_config;
    uct_md_h md;
    if ((uct_md_config_read(component, nullptr, nullptr, &md_config) != UCS_OK) ||
        (uct_md_open(component, md_name.c_str(), md_config, &md) != UCS_OK)) {
        fprintf(stderr, "md_bench: cannot open md %s\n", md_name.c_str());
        return 3;
    }
    uct_config_release(md_config);

    if (ours) {
        kreg_caps_t caps;
        kreg_query(&caps);
        if (!caps.running) {
            fprintf(stderr, "md_bench: kernel source not running (%s)\n",
                    kreg_reason_str(caps.reason));
            uct_md_close(md);
            return 3;
        }
        printf("# backend: %s mode: %s (config %s: %s)\n",
               kreg_backend_str(caps.backend), kreg_mode_str(caps.mode),
               config.c_str(), caps.why_backend);
    }

    void *buf = mmap(nullptr, kLen, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (buf == MAP_FAILED) {
        die("mmap");
    }
    memset(buf, 1, kLen);

    uct_mem_h first;
    if (uct_md_mem_reg(md, buf, kLen, UCT_MD_MEM_ACCESS_ALL, &first) != UCS_OK) {
        fprintf(stderr, "md_bench: first registration failed\n");
        return 3;
    }
    uct_md_mem_dereg(md, first);

    bool hit = true;
    const batch_times t = time_ops([&]() {
        uct_mem_h memh;
        if (uct_md_mem_reg(md, buf, kLen, UCT_MD_MEM_ACCESS_ALL, &memh) != UCS_OK) {
            return false;
        }
        hit = hit && (memh == first);
        uct_md_mem_dereg(md, memh);
        return true;
    }, ms);

    uct_md_close(md);
    munmap(buf, kLen);
    if ((t.ns < 0) || !hit) {
        fprintf(stderr, "md_bench: %s: %s\n", config.c_str(),
                (t.ns < 0) ? "a registration failed" : "a registration missed the cache");
        return 4;
    }
    printf("R md_hit_64k %.2f\n", t.ns);
    printf("R md_hit_64k.ref %.4f\n", t.in_ref);
    printf("R md_hit_64k.ref_ns %.4f\n", t.ref_ns);
    return 0;
}

/* ---- parent --------------------------------------------------------------- */

std::vector<env_change> child_env(const std::string &config)
{
    /* stock_md: UCX's defaults (hooks); ours: the kernel source, hooks off */
    return env_for((config == "stock_md") ? "hooks" : config);
}

int parent(int reps, const std::string &lib, const std::string &device,
           double ms)
{
    std::vector<std::string> cfgs = {"default", "stock_md"};
    if (access("/dev/kreg_notifier", R_OK | W_OK) == 0) {
        cfgs.push_back("uffd");
    }
    std::map<std::string, std::vector<double>> ns;        /* cfg -> per run */
    std::map<std::string, std::vector<double>> ratios;    /* cfg -> per run */
    std::map<std::string, std::vector<double>> ns_ratios; /* the same in ns */
    std::map<std::string, std::vector<double>> ref_ns;    /* the loop's speed */
    std::string backend_line;
    int rc = 0;

    printf("# md_bench: uct_md_mem_reg + uct_md_mem_dereg of a cached 64 KiB "
           "buffer; %d runs, %.0f ms per child\n", reps, ms);
    for (int rep = 0; rep < reps; ++rep) {
        std::map<std::string, double> run, run_ns, run_ref_ns;
        for (size_t i = 0; i < cfgs.size(); ++i) {
            const std::string &cfg = cfgs[(i + rep) % cfgs.size()];
            std::vector<std::string> args = {"--child", cfg, "--lib", lib, "--ms",
                                             std::to_string(ms)};
            if (!device.empty()) {
                args.insert(args.end(), {"--device", device});
            }
            child_result res = kreg_tools::run_self("md-bench-child", args,
                                                   child_env(cfg), 120, true);
            read_child_results(res.output, cfg, &backend_line,
                               [&](const char *key, double v) {
                                   if (strcmp(key, "md_hit_64k.ref") == 0) {
                                       run[cfg] = v;
                                   } else if (strcmp(key, "md_hit_64k") == 0) {
                                       run_ns[cfg] = v;
                                   } else if (strcmp(key, "md_hit_64k.ref_ns") == 0) {
                                       run_ref_ns[cfg] = v;
                                   }
                               });
            if (res.status != 0) {
                fprintf(stderr, "md_bench: child %s exited with %d\n", cfg.c_str(),
                        res.status);
                rc = 1;
            }
        }
        for (const auto &[cfg, v] : run) {
            ns[cfg].push_back(run_ns[cfg]);
            ref_ns[cfg].push_back(run_ref_ns[cfg]);
            if ((cfg != "stock_md") && run.count("stock_md") && (run["stock_md"] > 0) &&
                (run_ns["stock_md"] > 0)) {
                ratios[cfg].push_back(v / run["stock_md"]);
                ns_ratios[cfg].push_back(run_ns[cfg] / run_ns["stock_md"]);
            }
        }
    }
    if (!backend_line.empty()) {
        printf("%s\n", backend_line.c_str());
    }
    for (const std::string &cfg : cfgs) {
        if (cfg == "stock_md") {
            continue;
        }
        const std::string label = "md_hit_64k." + cfg + "/stock_md";
        const auto &r = ratios[cfg];
        if (r.empty()) {
            printf("P2 %s n/a\n", label.c_str());
            rc = 1;
            continue;
        }
        const auto mm = std::minmax_element(r.begin(), r.end());
        printf("P2 %s %.2f\n", label.c_str(), median(r));
        printf("# raw %s: %.1f ns vs %.1f ns (medians); ratio over %zu runs %.2f..%.2f; "
               "in reference-loop units (the figure), the ratio of ns %.2f; the loop "
               "%.2f vs %.2f ns an iteration\n",
               label.c_str(), median(ns[cfg]), median(ns["stock_md"]), r.size(),
               *mm.first, *mm.second, median(ns_ratios[cfg]), median(ref_ns[cfg]),
               median(ref_ns["stock_md"]));
    }
    return rc;
}

} // namespace

int main(int argc, char **argv)
{
    std::string cfg, lib, device;
    int reps  = 7;
    double ms = 300;
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        if ((a == "--child") && (i + 1 < argc)) {
            cfg = argv[++i];
        } else if ((a == "--lib") && (i + 1 < argc)) {
            lib = argv[++i];
        } else if ((a == "--device") && (i + 1 < argc)) {
            device = argv[++i];
        } else if ((a == "--reps") && (i + 1 < argc)) {
            reps = std::max(1, atoi(argv[++i]));
        } else if ((a == "--ms") && (i + 1 < argc)) {
            ms = std::max(1.0, atof(argv[++i]));
        } else {
            fprintf(stderr, "usage: %s --lib LIBUCT_IB_REGCACHE.so [--reps N] "
                    "[--ms MS] [--device DEV]\n", argv[0]);
            return 2;
        }
    }
    if (lib.empty()) {
        fprintf(stderr, "md_bench: --lib is required\n");
        return 2;
    }
    if (!cfg.empty()) {
        return child(cfg, lib, device, ms);
    }
    return parent(reps, lib, device, ms);
}
