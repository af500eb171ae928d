/* Shared pieces of the issue-2 benchmarks (bench/kreg_bench.cc,
 * bench/kreg_race.cc): clocks and medians, the child processes that hold one
 * configuration each, an rcache set up the way a kernel-watched md sets it
 * up, and io_uring fixed buffers as a stand-in for ibv_reg_mr (they pin the
 * pages the same way). See bench/README.md. */
#ifndef UCX_KREG_BENCH_UTIL_H
#define UCX_KREG_BENCH_UTIL_H

#include "ucm_kernel/ucm_kernel.h"
#include "tools/child_process.h"
#include "tools/rcache_params.h"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fcntl.h>
#include <liburing.h>
#include <mutex>
#include <string>
#include <sys/mman.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <vector>

#include <ucm/api/ucm.h>
/* rcache.h has no extern "C" of its own */
extern "C" {
#include <ucs/memory/rcache.h>
}

namespace kb {

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

/* Keeps the compiler from dropping a malloc/free pair or a store. */
inline void escape(void *p)
{
    asm volatile("" : : "g"(p) : "memory");
}

[[noreturn]] inline void die(const char *what)
{
    fprintf(stderr, "bench: %s: %s\n", what, strerror(errno));
    exit(2);
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
 * Kernel configurations run with UCM's hooks off. */
inline bool is_kernel_config(const std::string &name)
{
    return (name != "no_ucx") && (name != "hooks");
}

inline std::vector<env_change> env_for(const std::string &name)
{
    std::vector<env_change> env = {{"UCX_KREG_BACKEND", std::nullopt},
                                  {"UCX_KREG_MODE", std::nullopt}};
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

/* ---- pinning: io_uring fixed buffers on a sparse table ---------------- */

class page_pinner {
public:
    bool open(unsigned slots)
    {
        if (io_uring_queue_init(4, &ring_, 0) != 0) {
            return false;
        }
        int rc = io_uring_register_buffers_sparse(&ring_, slots);
        if (rc != 0) {
            fprintf(stderr, "bench: io_uring_register_buffers_sparse: %s\n",
                    strerror(-rc));
            io_uring_queue_exit(&ring_);
            return false;
        }
        for (unsigned i = slots; i > 0; --i) {
            free_.push_back(i - 1);
        }
        open_ = true;
        return true;
    }

    void close()
    {
        if (open_) {
            io_uring_queue_exit(&ring_);
            open_ = false;
        }
    }

    /* Returns the slot, or -errno. */
    int pin(void *addr, size_t len)
    {
        std::lock_guard<std::mutex> guard(lock_);
        if (free_.empty()) {
            return -ENOSPC;
        }
        const int slot = free_.back();
        struct iovec iov = {addr, len};
        __u64 tag = 0;
        int rc = io_uring_register_buffers_update_tag(&ring_, slot, &iov, &tag, 1);
        if (rc < 0) {
            return rc;
        }
        free_.pop_back();
        return slot;
    }

    void unpin(int slot)
    {
        std::lock_guard<std::mutex> guard(lock_);
        struct iovec iov = {nullptr, 0};
        __u64 tag = 0;
        int rc = io_uring_register_buffers_update_tag(&ring_, slot, &iov, &tag, 1);
        if (rc < 0) {
            fprintf(stderr, "bench: unpin slot %d: %s\n", slot, strerror(-rc));
        }
        free_.push_back(slot);
    }

private:
    struct io_uring  ring_ {};
    bool             open_ = false;
    std::vector<int> free_;
    std::mutex       lock_; /* dereg may run in another thread's rcache call */
};

/* PFN of the page at addr (root only), 0 if not present or unknown. */
inline uint64_t pfn_of(int pagemap_fd, const void *addr)
{
    if (pagemap_fd < 0) {
        return 0;
    }
    uint64_t entry = 0;
    const off_t off = static_cast<off_t>(reinterpret_cast<uintptr_t>(addr) /
                                         page_size() * sizeof(entry));
    if (pread(pagemap_fd, &entry, sizeof(entry), off) != sizeof(entry)) {
        return 0;
    }
    if (!(entry & (1ull << 63))) {
        return 0;
    }
    return entry & ((1ull << 55) - 1);
}

/* ---- the rcache of a kernel-watched md -------------------------------- */

struct bench_region {
    ucs_rcache_region_t super;
    kreg_watch_t        watch;
    uint64_t            gen;  /* which registration this is */
    uint64_t            pfn;  /* first page at registration (root only) */
    int                 slot; /* page_pinner slot, -1 if not pinned */
};

struct bench_cache {
    ucs_rcache_t *rc      = nullptr;
    bool          kernel  = false; /* kreg_start()ed: watch in mem_reg */
    bool          watch   = true;  /* P4 turns it off for its baseline */
    page_pinner       *pinner  = nullptr;
    int           pagemap = -1;
    std::atomic<uint64_t> regs{0}, deregs{0}, refusals{0};
    std::atomic<uint64_t> next_gen{0};
};

/* what kreg_register_watched calls to register (pin) and to undo it */
struct pin_args {
    bench_cache  *c;
    bench_region *r;
};

inline ucs_status_t cache_pin(void *arg, void *start, size_t len)
{
    auto *a    = static_cast<pin_args *>(arg);
    a->r->slot = -1;
    if (a->c->pinner) {
        a->r->slot = a->c->pinner->pin(start, len);
        if (a->r->slot < 0) {
            return UCS_ERR_IO_ERROR;
        }
    }
    return UCS_OK;
}

inline void cache_unpin(void *arg)
{
    auto *a = static_cast<pin_args *>(arg);
    if (a->r->slot >= 0) {
        a->c->pinner->unpin(a->r->slot);
        a->r->slot = -1;
    }
}

inline ucs_status_t cache_mem_reg(void *context, ucs_rcache_t *rcache, void *arg,
                                  ucs_rcache_region_t *rregion, uint16_t flags)
{
    bench_cache *c         = static_cast<bench_cache *>(context);
    bench_region *r        = reinterpret_cast<bench_region *>(rregion);
    void *start      = reinterpret_cast<void *>(rregion->super.start);
    const size_t len = rregion->super.end - rregion->super.start;
    pin_args pin{c, r};
    ucs_status_t st;

    if (c->kernel && c->watch) {
        st = kreg_register_watched(start, len, &r->watch, cache_pin, cache_unpin,
                                   &pin, nullptr);
        if (st == UCS_ERR_REJECTED) {
            c->refusals.fetch_add(1, std::memory_order_relaxed);
        }
    } else {
        static const uint64_t always = 1; /* hooks: nothing of ours to check */
        r->watch          = kreg_watch_t{};
        r->watch.counter  = &always;
        r->watch.snapshot = always;
        st                = cache_pin(&pin, start, len);
    }
    if (st != UCS_OK) {
        return st;
    }
    r->pfn = pfn_of(c->pagemap, start);
    r->gen = ++c->next_gen;
    c->regs.fetch_add(1, std::memory_order_relaxed);
    return UCS_OK;
}

inline void cache_mem_dereg(void *context, ucs_rcache_t *rcache,
                            ucs_rcache_region_t *rregion)
{
    bench_cache *c  = static_cast<bench_cache *>(context);
    bench_region *r = reinterpret_cast<bench_region *>(rregion);
    pin_args pin{c, r};
    cache_unpin(&pin);
    if (c->kernel && c->watch) {
        kreg_unwatch(&r->watch);
    }
    c->deregs.fetch_add(1, std::memory_order_relaxed);
}

inline void cache_dump(void *context, ucs_rcache_t *rcache,
                       ucs_rcache_region_t *rregion, char *buf, size_t max)
{
    snprintf(buf, max, "gen %lu",
             static_cast<unsigned long>(reinterpret_cast<bench_region *>(rregion)->gen));
}

inline const ucs_rcache_ops_t *cache_ops()
{
    static const ucs_rcache_ops_t ops = {cache_mem_reg, cache_mem_dereg, cache_dump};
    return &ops;
}

/* kernel: kreg_start() first (the caller), then this. hooks: this alone,
 * with UCX's default UCM settings, installs UCM's hooks. */
inline bool cache_create(bench_cache *c, bool kernel, const char *name)
{
    const ucs_rcache_params_t p =
            kreg_tools::watched_rcache_params(sizeof(bench_region), cache_ops(), c);
    c->kernel            = kernel;
    ucs_status_t st      = ucs_rcache_create(&p, name, nullptr, &c->rc);
    if (st != UCS_OK) {
        fprintf(stderr, "bench: ucs_rcache_create: %s\n", ucs_status_string(st));
        return false;
    }
    return true;
}

inline void cache_destroy(bench_cache *c)
{
    if (c->rc) {
        ucs_rcache_destroy(c->rc);
        c->rc = nullptr;
    }
}

/* The lookup of a kernel-watched md (kreg_rcache_get), or UCX's own. */
inline ucs_status_t cache_get(bench_cache *c, void *addr, size_t len, bench_region **r)
{
    ucs_rcache_region_t *rr = nullptr;
    ucs_status_t st =
            c->kernel ? kreg_rcache_get(c->rc, addr, len, PROT_READ | PROT_WRITE,
                                        nullptr, offsetof(bench_region, watch), &rr) :
                        ucs_rcache_get(c->rc, addr, len, PROT_READ | PROT_WRITE,
                                       nullptr, &rr);
    *r = reinterpret_cast<bench_region *>(rr);
    return st;
}

inline void cache_put(bench_cache *c, bench_region *r)
{
    ucs_rcache_region_put(c->rc, &r->super);
}

} // namespace kb

#endif
