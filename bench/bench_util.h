/* Shared pieces of the issue-2 benchmarks (bench/kreg_bench.cc,
 * bench/kreg_race.cc): clocks and medians, the child processes that hold one
 * configuration each, an rcache set up the way a kernel-watched md sets it
 * up, and io_uring fixed buffers as a stand-in for ibv_reg_mr (they pin the
 * pages the same way). See bench/README.md. */
#ifndef UCX_KREG_BENCH_UTIL_H
#define UCX_KREG_BENCH_UTIL_H

#include "ucm_kernel/ucm_kernel.h"

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

struct EnvSetting {
    const char *name;
    const char *value; /* nullptr: unset */
};

/* The environment of a kernel-source process, and of a hooks process
 * (UCX defaults: whatever the caller's environment said is dropped). */
inline std::vector<EnvSetting> env_kernel(const char *mode)
{
    return {{"UCX_KREG_MODE", mode}, {"UCX_MEM_MALLOC_HOOKS", "n"},
            {"UCX_MEM_MMAP_HOOK_MODE", "none"}};
}

inline std::vector<EnvSetting> env_hooks()
{
    return {{"UCX_KREG_MODE", nullptr}, {"UCX_MEM_MALLOC_HOOKS", nullptr},
            {"UCX_MEM_MMAP_HOOK_MODE", nullptr}};
}

struct ChildResult {
    int         status = -1; /* exit code, or 128+signal */
    std::string out;         /* its stdout */
};

/* fork + exec of this very program with args and env changes; its stdout is
 * collected, its stderr passes through. */
inline ChildResult run_self(const std::vector<std::string> &args,
                            const std::vector<EnvSetting> &env)
{
    int fds[2];
    if (pipe2(fds, O_CLOEXEC) != 0) {
        die("pipe");
    }
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid < 0) {
        die("fork");
    }
    if (pid == 0) {
        dup2(fds[1], STDOUT_FILENO);
        for (const EnvSetting &e : env) {
            if (e.value) {
                setenv(e.name, e.value, 1);
            } else {
                unsetenv(e.name);
            }
        }
        std::vector<char *> argv;
        static char self[] = "kreg-bench-child";
        argv.push_back(self);
        for (const std::string &a : args) {
            argv.push_back(const_cast<char *>(a.c_str()));
        }
        argv.push_back(nullptr);
        execv("/proc/self/exe", argv.data());
        fprintf(stderr, "bench: exec /proc/self/exe: %s\n", strerror(errno));
        _exit(127);
    }
    close(fds[1]);
    ChildResult res;
    char buf[4096];
    ssize_t n;
    while ((n = read(fds[0], buf, sizeof(buf))) != 0) {
        if (n < 0) {
            if (errno == EINTR) {
                continue;
            }
            break;
        }
        res.out.append(buf, static_cast<size_t>(n));
    }
    close(fds[0]);
    int st = 0;
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {
    }
    res.status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    return res;
}

/* kreg_start() and a check that the source runs in `mode` with the event
 * declared external; on failure it is stopped again. */
inline bool kernel_start(const std::string &mode)
{
    if (kreg_start() != UCS_OK) {
        fprintf(stderr, "bench: kreg_start failed\n");
        kreg_stop();
        return false;
    }
    kreg_caps_t caps;
    kreg_query(&caps);
    if (!caps.running || !caps.external_event || (mode != kreg_mode_str(caps.mode))) {
        fprintf(stderr, "bench: kernel source not as asked (%s, mode %s, want %s)\n",
                caps.running ? "running" : "not running", kreg_mode_str(caps.mode),
                mode.c_str());
        kreg_stop();
        return false;
    }
    return true;
}

/* ---- pinning: io_uring fixed buffers on a sparse table ---------------- */

class Pinner {
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

struct Region {
    ucs_rcache_region_t super;
    uint64_t            gen;  /* which registration this is */
    uint64_t            pfn;  /* first page at registration (root only) */
    int                 slot; /* Pinner slot, -1 if not pinned */
};

struct Cache {
    ucs_rcache_t *rc      = nullptr;
    bool          kernel  = false; /* kreg_start()ed: watch in mem_reg */
    bool          watch   = true;  /* P4 turns it off for its baseline */
    Pinner       *pinner  = nullptr;
    int           pagemap = -1;
    std::atomic<uint64_t> regs{0}, deregs{0}, refusals{0};
    std::atomic<uint64_t> next_gen{0};
};

inline ucs_status_t cache_mem_reg(void *context, ucs_rcache_t *rcache, void *arg,
                                  ucs_rcache_region_t *rregion, uint16_t flags)
{
    Cache *c        = static_cast<Cache *>(context);
    Region *r       = reinterpret_cast<Region *>(rregion);
    void *start     = reinterpret_cast<void *>(rregion->super.start);
    const size_t len = rregion->super.end - rregion->super.start;
    const bool watch = c->kernel && c->watch;

    if (watch) {
        kreg_reason_t why;
        if (!kreg_watch(start, len, &why)) {
            c->refusals.fetch_add(1, std::memory_order_relaxed);
            return UCS_ERR_UNSUPPORTED;
        }
    }
    r->slot = -1;
    if (c->pinner) {
        r->slot = c->pinner->pin(start, len);
        if (r->slot < 0) {
            if (watch) {
                kreg_unwatch(start, len);
            }
            return UCS_ERR_IO_ERROR;
        }
    }
    r->pfn = pfn_of(c->pagemap, start);
    r->gen = ++c->next_gen;
    c->regs.fetch_add(1, std::memory_order_relaxed);
    return UCS_OK;
}

inline void cache_mem_dereg(void *context, ucs_rcache_t *rcache,
                            ucs_rcache_region_t *rregion)
{
    Cache *c  = static_cast<Cache *>(context);
    Region *r = reinterpret_cast<Region *>(rregion);
    if (r->slot >= 0) {
        c->pinner->unpin(r->slot);
    }
    if (c->kernel && c->watch) {
        kreg_unwatch(reinterpret_cast<void *>(rregion->super.start),
                     rregion->super.end - rregion->super.start);
    }
    c->deregs.fetch_add(1, std::memory_order_relaxed);
}

inline void cache_dump(void *context, ucs_rcache_t *rcache,
                       ucs_rcache_region_t *rregion, char *buf, size_t max)
{
    snprintf(buf, max, "gen %lu",
             static_cast<unsigned long>(reinterpret_cast<Region *>(rregion)->gen));
}

inline const ucs_rcache_ops_t *cache_ops()
{
    static const ucs_rcache_ops_t ops = {cache_mem_reg, cache_mem_dereg, cache_dump};
    return &ops;
}

/* kernel: kreg_start() first (the caller), then this. hooks: this alone,
 * with UCX's default UCM settings, installs UCM's hooks. */
inline bool cache_create(Cache *c, bool kernel, const char *name)
{
    ucs_rcache_params_t p;
    memset(&p, 0, sizeof(p));
    p.region_struct_size = sizeof(Region);
    p.alignment          = page_size();
    p.max_alignment      = page_size();
    p.ucm_events         = UCM_EVENT_VM_UNMAPPED;
    p.ucm_event_priority = 1000;
    p.ops                = cache_ops();
    p.context            = c;
    p.flags              = 0;
    p.max_regions        = ULONG_MAX;
    p.max_size           = SIZE_MAX;
    p.max_unreleased     = SIZE_MAX;
    c->kernel            = kernel;
    ucs_status_t st      = ucs_rcache_create(&p, name, nullptr, &c->rc);
    if (st != UCS_OK) {
        fprintf(stderr, "bench: ucs_rcache_create: %s\n", ucs_status_string(st));
        return false;
    }
    return true;
}

inline void cache_destroy(Cache *c)
{
    if (c->rc) {
        ucs_rcache_destroy(c->rc);
        c->rc = nullptr;
    }
}

/* The lookup of a kernel-watched md: prepare, then get. */
inline ucs_status_t cache_get(Cache *c, void *addr, size_t len, Region **r)
{
    if (c->kernel) {
        kreg_prepare_lookup(addr, len);
    }
    ucs_rcache_region_t *rr = nullptr;
    ucs_status_t st = ucs_rcache_get(c->rc, addr, len, PROT_READ | PROT_WRITE,
                                     nullptr, &rr);
    *r = reinterpret_cast<Region *>(rr);
    return st;
}

inline void cache_put(Cache *c, Region *r)
{
    ucs_rcache_region_put(c->rc, &r->super);
}

} // namespace kb

#endif
