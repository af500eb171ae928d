/* Shared pieces of the benchmarks (bench/kreg_bench.cc, bench/kreg_race.cc,
 * bench/md_bench.cc): clocks and medians, and the child processes that hold
 * one configuration each and report to the parent. The cache they measure
 * is in bench_cache.h. See bench/README.md. */
#ifndef UCX_KREG_BENCH_UTIL_H
#define UCX_KREG_BENCH_UTIL_H

#include "ucm_kernel/ucm_kernel.h"
#include "tools/child_process.h"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <csignal>
#include <functional>
#include <fcntl.h>
#include <mutex>
#include <string>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <vector>

#include <ucm/api/ucm.h>
/* rcache.h has no extern "C" of its own */
extern "C" {
#include <ucs/memory/rcache.h>
}

namespace bench {

inline uint64_t now_ns()
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + ts.tv_nsec;
}

inline size_t page_size()
{
    static const size_t size = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    return size;
}

inline double median(std::vector<double> v)
{
    if (v.empty()) {
        return 0;
    }
    std::sort(v.begin(), v.end());
    const size_t n = v.size();
    return (n % 2) ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* ---- the speed state ------------------------------------------------- *
 * The CPU's speed moves under a benchmark here: in the Soft-RoCE guest
 * (qemu TCG) a fixed loop runs at one speed for seconds, then 1.7x slower
 * for seconds (3.5 vs 6 ns an iteration), and a shared host does the like
 * through steal time. Two processes timed one after the other then compare
 * the machine's states, not the code: under TCG the same cache hit took
 * 520 ns in one process and 1050 ns in the next, whatever the
 * configuration. So a pure-CPU figure (a cache hit) is also expressed in
 * iterations of a fixed reference loop timed right before and after each
 * batch, which moves with the state (bench/README.md, "Noise"). */
inline double reference_ns()
{
    static volatile uint64_t cells[64];
    constexpr unsigned kIters = 300000; /* ~0.4 ms on the host, ~1-2 ms under TCG */
    const uint64_t t0 = now_ns();
    uint64_t sum = 0;
    for (unsigned i = 0; i < kIters; ++i) {
        sum += cells[i & 63];
        cells[(i * 7) & 63] = sum;
    }
    return static_cast<double>(now_ns() - t0) / kIters;
}

struct batch_times {
    double ns;     /* median ns per operation over the batches */
    double in_ref; /* median over the batches of ns per operation divided by
                      the reference loop's ns per iteration around it */
    double ref_ns; /* median ns per iteration of the reference loop */
};

/* Runs batch() (returns ns per operation, < 0 on failure) for about ms of
 * wall time and at least min_batches times, each between two reference
 * loops. {-1, -1, -1} if a batch failed. */
template <class Batch>
batch_times time_batches(Batch &&batch, double ms, size_t min_batches = 5)
{
    std::vector<double> ns, in_ref, ref;
    const uint64_t end = now_ns() + static_cast<uint64_t>(ms * 1e6);
    double before      = reference_ns();
    ref.push_back(before);
    do {
        const double op = batch();
        if (op < 0) {
            return {-1, -1, -1};
        }
        const double after = reference_ns();
        ns.push_back(op);
        in_ref.push_back(op / ((before + after) / 2));
        ref.push_back(after);
        before = after;
    } while ((now_ns() < end) || (ns.size() < min_batches));
    return {median(ns), median(in_ref), median(ref)};
}

[[noreturn]] inline void die(const char *what)
{
    fprintf(stderr, "bench: %s: %s\n", what, strerror(errno));
    exit(2);
}

/*
 * Where a measured mmap lands, the same in every configuration: 1 MiB free
 * inside a reserved PROT_NONE area, 512 KiB into a 2 MiB page table the
 * reservation keeps (no merge: other protection; no page table freed). Left
 * to mmap(NULL), a mapping lands below whatever the process mapped last: it
 * merges with a neighbour (munmap then splits a VMA) or not, and its 2 MiB
 * page table may be its own (munmap may then free it); under TCG one
 * configuration's 1 MiB mmap+munmap took 52 or 135 us from process to
 * process, and the spread went with the place. Map it with
 * MAP_FIXED_NOREPLACE; the
 * reservation stays for the process.
 */
inline char *fixed_slot()
{
    const size_t huge = size_t(2) << 20;
    char *area = static_cast<char *>(mmap(nullptr, 2 * huge, PROT_NONE,
                                          MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                                          -1, 0));
    if (area == MAP_FAILED) {
        die("mmap");
    }
    char *slot = reinterpret_cast<char *>(
            ((reinterpret_cast<uintptr_t>(area) + huge - 1) & ~(huge - 1)) + huge / 4);
    if (munmap(slot, size_t(1) << 20) != 0) {
        die("munmap");
    }
    return slot;
}

/* Keeps the compiler from dropping a malloc/free pair or a store. */
inline void escape(void *p)
{
    asm volatile("" : : "g"(p) : "memory");
}

/* ---- one configuration per process ---------------------------------- */

using kreg_tools::child_result;
using kreg_tools::env_change;

/* The configurations a child runs in, by name:
 *   no_ucx, hooks   UCX's defaults (UCM installs its hooks when an rcache
 *                   is created; no_ucx never creates one)
 *   default         the kernel source as a user gets it: nothing set
 *   plain           the default backend in plain mode (measurements only)
 *   uffd, uffd-plain, notifier, notifier-plain   one backend, one mode
 *   sync, sync_unpinned  UCX's own cache fed by synchronous delivery (the
 *                   second with UCX_KREG_SYNC_UNPINNED=y: every unmap reported)
 *   sync_user       UCX's defaults with UCM_EVENT_VM_UNMAPPED external and
 *                   no source of ours: the benchmark reports its own unmaps
 *                   from a signal handler (kreg_bench's P3, any machine)
 * Kernel configurations run with UCM's hooks off. */
inline bool is_kernel_config(const std::string &name)
{
    return (name != "no_ucx") && (name != "hooks") && (name != "sync_user");
}

inline std::vector<env_change> env_for(const std::string &name)
{
    std::vector<env_change> env = {{"UCX_KREG_BACKEND", std::nullopt},
                                  {"UCX_KREG_MODE", std::nullopt},
                                  {"UCX_KREG_SYNC", std::nullopt},
                                  {"UCX_KREG_SYNC_UNPINNED", std::nullopt}};
    if ((name == "sync") || (name == "sync_unpinned")) {
        /* UCX's own cache as a stock transport's, fed by synchronous
         * delivery; UCX's UCM settings as a user has them */
        env[0].second = "notifier";
        env[2].second = "y";
        if (name == "sync_unpinned") {
            env[3].second = "y"; /* every unmap of this process's own */
        }
        env.push_back({"UCX_MEM_MALLOC_HOOKS", std::nullopt});
        env.push_back({"UCX_MEM_MMAP_HOOK_MODE", std::nullopt});
        return env;
    }
    if (!is_kernel_config(name)) {
        env.push_back({"UCX_MEM_MALLOC_HOOKS", std::nullopt});
        env.push_back({"UCX_MEM_MMAP_HOOK_MODE", std::nullopt});
        return env;
    }
    env.push_back({"UCX_MEM_MALLOC_HOOKS", "n"});
    env.push_back({"UCX_MEM_MMAP_HOOK_MODE", "none"});
    const size_t dash     = name.find('-');
    const std::string b   = name.substr(0, dash);
    const bool plain_mode = (name == "plain") ||
                            ((dash != std::string::npos) && (name.substr(dash + 1) == "plain"));
    if ((b == "uffd") || (b == "notifier")) {
        env[0].second = b;
    }
    if (plain_mode) {
        env[1].second = "plain";
    }
    return env;
}

inline child_result run_self(const std::vector<std::string> &args,
                            const std::vector<env_change> &env)
{
    return kreg_tools::run_self("kreg-bench-child", args, env, 0, false);
}

/* Reads a child's output: each "R KEY VALUE" line goes to on_result, the
 * "# backend: ..." line of the "default" child to *backend_line, and any
 * other line that is not a comment to stderr, tagged with the child's
 * configuration (a child's complaint must not be lost). */
inline void read_child_results(const std::string &output, const std::string &cfg,
                               std::string *backend_line,
                               const std::function<void(const char *key,
                                                        double value)> &on_result)
{
    size_t pos = 0;
    while (pos < output.size()) {
        size_t eol = output.find('\n', pos);
        if (eol == std::string::npos) {
            eol = output.size();
        }
        const std::string line = output.substr(pos, eol - pos);
        pos = eol + 1;
        char key[128];
        double v;
        if (sscanf(line.c_str(), "R %127s %lf", key, &v) == 2) {
            on_result(key, v);
        } else if ((line.rfind("# backend:", 0) == 0) && (cfg == "default")) {
            *backend_line = line;
        } else if (!line.empty() && (line[0] != '#')) {
            fprintf(stderr, "[%s] %s\n", cfg.c_str(), line.c_str());
        }
    }
}

/*
 * sync_user: synchronous delivery's user-space part without the module, so
 * that P3's share of it can be measured where no module loads (the host)
 * and beside the module's in the guest. After each measured munmap the
 * thread sends itself the signal, and its handler does what libucm_kernel's
 * does: a system call (DRAIN), the report to UCM, a system call (the
 * acknowledgement). The module's callback (a page-table walk to the first
 * pinned page, the queue, send_sig_info) is not in it; raise() is one
 * system call more than the module's path has.
 */
inline std::atomic<uintptr_t> g_sync_user_addr{0};
inline std::atomic<size_t>    g_sync_user_len{0};
inline bool                   g_sync_user = false;

inline void sync_user_handler(int, siginfo_t *, void *)
{
    const int saved = errno;
    syscall(SYS_getppid);
    ucm_vm_munmap(reinterpret_cast<void *>(g_sync_user_addr.load()),
                  g_sync_user_len.load());
    syscall(SYS_getppid);
    errno = saved;
}

/* before UCX creates its caches (UCM then installs no unmap hook) */
inline bool sync_user_start()
{
    struct sigaction sa = {};
    sa.sa_sigaction = sync_user_handler;
    sa.sa_flags     = SA_SIGINFO | SA_RESTART;
    sigemptyset(&sa.sa_mask);
    if (sigaction(SIGRTMIN + 4, &sa, nullptr) != 0) {
        fprintf(stderr, "bench: sigaction: %s\n", strerror(errno));
        return false;
    }
    ucm_set_external_event(UCM_EVENT_VM_UNMAPPED);
    g_sync_user = true;
    return true;
}

/* After a measured munmap(p, len): where the module's signal is taken. */
inline void sync_user_report(void *p, size_t len)
{
    if (g_sync_user) {
        g_sync_user_addr = reinterpret_cast<uintptr_t>(p);
        g_sync_user_len  = len;
        raise(SIGRTMIN + 4);
    }
}

/* kreg_start() and a check that the source runs as the configuration
 * asks, with the event declared external; on failure it is stopped again.
 * Prints "# backend: NAME mode: NAME" for the parent. */
inline bool kernel_start(const std::string &config)
{
    if (kreg_start() != UCS_OK) {
        fprintf(stderr, "bench: kreg_start failed (%s)\n", config.c_str());
        kreg_stop();
        return false;
    }
    kreg_caps_t caps;
    kreg_query(&caps);
    const std::string backend = kreg_backend_str(caps.backend);
    const std::string mode    = kreg_mode_str(caps.mode);
    const bool want_plain     = config.find("plain") != std::string::npos;
    const bool backend_ok     = (config.rfind("uffd", 0) == 0) ? backend == "uffd" :
                                (config.rfind("notifier", 0) == 0) ? backend == "notifier" :
                                ((config == "sync") || (config == "sync_unpinned")) ?
                                        caps.sync_delivery :
                                caps.running;
    if (!caps.running || !caps.external_event || !backend_ok ||
        (want_plain != (mode == "plain"))) {
        fprintf(stderr, "bench: kernel source not as asked (%s, backend %s, mode %s, "
                "want %s)\n", caps.running ? "running" : "not running",
                backend.c_str(), mode.c_str(), config.c_str());
        kreg_stop();
        return false;
    }
    printf("# backend: %s mode: %s (config %s: %s)\n", backend.c_str(), mode.c_str(),
           config.c_str(), caps.why_backend);
    return true;
}

} // namespace bench

#endif
