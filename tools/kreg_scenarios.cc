/*
 * kreg_scenarios: for each way of changing the address space, cache a
 * registration (an io_uring fixed buffer, see uring_rcache.h), change the
 * mapping, put new data at the same address, look it up again and send it
 * with WRITE_FIXED. "ok" if the new bytes come out, "STALE" if the old ones.
 *
 * The rows are in scenarios.cc, the oracle in scenario_oracle.cc; this file
 * runs every (scenario, thread, column) in a fresh child (this program
 * again, with --one), because UCM hooks and the external event declaration
 * are process-global, and prints the table. Columns: hooks (UCX's own),
 * kernel (libucm_kernel as a user gets it: the notifier module where it is
 * loaded, else userfaultfd), uffd (userfaultfd beside the notifier, where
 * the notifier is the default), none (nothing watches: the oracle must see
 * STALE).
 */
#include "child_process.h"
#include "scenarios.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <stdexcept>
#include <string>
#include <unistd.h>
#include <vector>

using namespace kreg_tools;

namespace {

const char *JEMALLOC_SO = "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2";

/* ---- one case, in this process ---- */
int run_one(const std::string &sname, const std::string &thread,
            const std::string &srcname)
{
    const scenario *s = find_scenario(sname);
    source src;
    if ((s == nullptr) || !source_parse(srcname, &src) ||
        ((thread != "same") && (thread != "other"))) {
        fprintf(stderr, "bad --one arguments\n");
        return 2;
    }
    std::string res;
    try {
        uring_rcache rc(src);
        ctx c{rc, thread == "other"};
        res = s->run(c);
        const auto &k = rc.counters();
        printf("COUNTERS registrations=%lu hits=%lu uncached=%lu "
               "watch_refusals=%lu\n", (unsigned long)k.registrations,
               (unsigned long)k.hits, (unsigned long)k.uncached,
               (unsigned long)k.watch_refusals);
    } catch (const std::exception &e) {
        res = std::string("FAIL:") + e.what();
    }
    for (auto &ch : res) { /* one token per verdict */
        if (ch == ' ') {
            ch = '_';
        }
    }
    printf("RESULT %s\n", res.c_str());
    fflush(stdout);
    return 0;
}

/* ---- the matrix: one child per case ---- */

/* A column of the table: a source, and the environment its children get. */
struct column {
    const char *name;
    source      src;
    const char *backend; /* UCX_KREG_BACKEND, or nullptr */
};

struct outcome {
    std::string verdict;
    std::string output;
};

outcome run_case(const scenario &s, const char *thread, const column &col,
                 int timeout_s)
{
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
    if (s.malloc_conf != nullptr) { /* the sanitizer must own malloc */
        return {"skip:jemalloc can't be preloaded under a sanitizer", ""};
    }
#endif
    std::vector<env_change> env;
    if (col.src != source::hooks) {
        env.push_back({"UCX_MEM_MALLOC_HOOKS", "n"});
        env.push_back({"UCX_MEM_MMAP_HOOK_MODE", "none"});
    }
    if (col.backend != nullptr) {
        env.push_back({"UCX_KREG_BACKEND", col.backend});
    }
    if (col.src == source::none) {
        /* Where the module is loaded, kreg_start() would start synchronous
         * delivery, which tells the rcache of the pinned pages' change on
         * its own: the control must watch nothing. */
        env.push_back({"UCX_KREG_SYNC", "n"});
    }
    if (s.exits_with_live_threads) {
        /* LeakSanitizer cannot stop threads exit() leaves running ("Running
         * thread ... was not suspended"), then reports memory they still
         * hold as leaked: memory in use when exit() was called is no leak. */
        const char *asan = getenv("ASAN_OPTIONS");
        env.push_back({"ASAN_OPTIONS",
                       std::string(asan ? asan : "") + ":detect_leaks=0"});
    }
    if (s.malloc_conf != nullptr) {
        env.push_back({"LD_PRELOAD", JEMALLOC_SO});
        env.push_back({"MALLOC_CONF", s.malloc_conf});
    }
    child_result r = run_self("kreg_scenarios",
                             {"--one", s.name, thread, source_name(col.src)}, env,
                             timeout_s, true);
    outcome o;
    o.output = r.output;
    const size_t pos = o.output.rfind("RESULT ");
    if (r.timed_out()) {
        o.verdict = "FAIL:timeout";
    } else if (pos != std::string::npos) {
        const size_t end = o.output.find('\n', pos);
        o.verdict = o.output.substr(pos + 7, end == std::string::npos ?
                                             std::string::npos : end - pos - 7);
    } else if (r.status > 128) {
        o.verdict = "FAIL:signal" + std::to_string(r.status - 128);
    } else {
        o.verdict = "FAIL:no-result(exit" + std::to_string(r.status) + ")";
    }
    return o;
}

void usage(FILE *f)
{
    fprintf(f,
            "usage: kreg_scenarios [--source hooks|kernel|uffd|none|all] "
            "[--scenario NAME] [--thread same|other] [--mode verify|plain]\n"
            "                      [--timeout SEC] [--verbose] [--list]\n"
            "       kreg_scenarios --one SCENARIO same|other SOURCE\n"
            "Prints '<scenario> <thread> <source> <ok|STALE|skip:why|FAIL:what>'"
            " per case, then a summary.\n"
            "Exits 1 if the kernel source has a STALE or FAIL, or if the 'none'"
            " control shows no STALE.\n");
}

} // namespace

int main(int argc, char **argv)
{
    /* uffd beside kernel only where the kernel column is the notifier */
    const bool notifier = access("/dev/kreg_notifier", R_OK | W_OK) == 0;
    const column hooks{"hooks", source::hooks, nullptr};
    const column kernel{"kernel", source::kernel, nullptr};
    const column uffd{"uffd", source::kernel, "uffd"};
    const column none{"none", source::none, nullptr};
    std::vector<column> all = {hooks, kernel, none};
    if (notifier) {
        all.insert(all.begin() + 2, uffd);
    }
    std::vector<column> columns = all;
    std::vector<std::string> threads = {"same", "other"};
    std::string only_scenario;
    int timeout_s = 30;
    bool verbose  = false;

    for (int i = 1; i < argc; ++i) {
        std::string a = argv[i];
        auto next = [&]() -> std::string {
            if (i + 1 >= argc) {
                usage(stderr);
                exit(2);
            }
            return argv[++i];
        };
        if (a == "--one" && i + 3 < argc) {
            return run_one(argv[i + 1], argv[i + 2], argv[i + 3]);
        } else if (a == "--source") {
            std::string v = next();
            if (v != "all") {
                columns.clear();
                for (const column &c : all) {
                    if (v == c.name) {
                        columns.push_back(c);
                    }
                }
                if (columns.empty()) {
                    usage(stderr);
                    return 2;
                }
            }
        } else if (a == "--scenario") {
            only_scenario = next();
            if (find_scenario(only_scenario) == nullptr) {
                fprintf(stderr, "unknown scenario '%s' (see --list)\n",
                        only_scenario.c_str());
                return 2;
            }
        } else if (a == "--thread") {
            std::string v = next();
            if (v != "same" && v != "other") {
                usage(stderr);
                return 2;
            }
            threads = {v};
        } else if (a == "--mode") {
            setenv("UCX_KREG_MODE", next().c_str(), 1);
        } else if (a == "--timeout") {
            timeout_s = std::max(1, atoi(next().c_str()));
        } else if (a == "--verbose" || a == "-v") {
            verbose = true;
        } else if (a == "--list") {
            for (const scenario *s : scenarios()) {
                printf("%-18s %s\n", s->name, s->what);
            }
            return 0;
        } else if (a == "--help" || a == "-h") {
            usage(stdout);
            return 0;
        } else {
            usage(stderr);
            return 2;
        }
    }

    const char *mode = getenv("UCX_KREG_MODE");
    printf("# kreg_scenarios: UCX_KREG_MODE=%s; kernel is %s; hooks children keep "
           "the UCX_MEM_* environment, the others run with UCX_MEM_MALLOC_HOOKS=n "
           "UCX_MEM_MMAP_HOOK_MODE=none\n", mode ? mode : "(default)",
           notifier ? "the notifier module" : "userfaultfd (no notifier module here)");

    std::map<std::string, std::map<std::string, int>> tally; /* column->kind */
    std::vector<std::string> hooks_stale;
    bool kernel_bad = false;
    for (const scenario *s : scenarios()) {
        if (!only_scenario.empty() && only_scenario != s->name) {
            continue;
        }
        for (const auto &t : threads) {
            for (const column &col : columns) {
                /* A skip is the address space's doing (another mapping,
                 * under ASan its allocator's, took the address the case
                 * needs): try again before reporting it. */
                outcome o;
                for (int attempt = 0; attempt < 3; ++attempt) {
                    o = run_case(*s, t.c_str(), col, timeout_s);
                    if (o.verdict.rfind("skip:", 0) != 0) {
                        break;
                    }
                }
                printf("%s %s %s %s\n", s->name, t.c_str(), col.name,
                       o.verdict.c_str());
                bool bad = o.verdict.rfind("FAIL", 0) == 0;
                if (verbose || bad) {
                    std::string out = o.output;
                    size_t p = 0;
                    while (p < out.size()) { /* indent the child's output */
                        size_t e = out.find('\n', p);
                        printf("    | %s\n", out.substr(p, e - p).c_str());
                        if (e == std::string::npos) {
                            break;
                        }
                        p = e + 1;
                    }
                }
                fflush(stdout);
                std::string kind = o.verdict.substr(0, o.verdict.find(':'));
                ++tally[col.name][kind];
                if ((col.src == source::kernel) && (kind == "STALE" || kind == "FAIL")) {
                    kernel_bad = true;
                }
                if ((col.src == source::hooks) && (kind == "STALE")) {
                    hooks_stale.push_back(std::string(s->name) + "/" + t);
                }
            }
        }
    }

    printf("# summary:");
    for (const column &col : columns) {
        auto &k = tally[col.name];
        printf("  %s ok=%d STALE=%d skip=%d FAIL=%d;", col.name, k["ok"], k["STALE"],
               k["skip"], k["FAIL"]);
    }
    printf("\n");
    if (!hooks_stale.empty()) {
        printf("# STALE under UCX's hooks:");
        for (const auto &h : hooks_stale) {
            printf(" %s", h.c_str());
        }
        printf("\n");
    }
    int rc = 0;
    if (kernel_bad) {
        printf("# ERROR: a kernel column has STALE or FAIL cases\n");
        rc = 1;
    }
    const bool ran_none = std::any_of(columns.begin(), columns.end(),
                                      [](const column &c) { return c.src == source::none; });
    if (ran_none && tally["none"]["STALE"] == 0 && only_scenario.empty()) {
        printf("# ERROR: the 'none' control showed no STALE: the oracle "
               "cannot fail\n");
        rc = 1;
    }
    return rc;
}
