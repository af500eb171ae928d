/* The benchmarks' cache (bench/kreg_bench.cc, bench/kreg_race.cc): an
 * rcache set up the way a kernel-watched md sets it up, with io_uring fixed
 * buffers as a stand-in for ibv_reg_mr (they pin the pages the same way). */
#ifndef UCX_KREG_BENCH_CACHE_H
#define UCX_KREG_BENCH_CACHE_H

#include "bench_util.h"
#include "tools/rcache_params.h"

#include <liburing.h>
#include <sys/uio.h>

namespace bench {

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
    static const ucs_rcache_ops_t ops =
            kreg_tools::watched_rcache_ops(cache_mem_reg, cache_mem_dereg, cache_dump);
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
                        kreg_ucs_rcache_get(c->rc, addr, len, PROT_READ | PROT_WRITE,
                                       nullptr, &rr);
    *r = reinterpret_cast<bench_region *>(rr);
    return st;
}

inline void cache_put(bench_cache *c, bench_region *r)
{
    ucs_rcache_region_put(c->rc, &r->super);
}

} // namespace bench

#endif
