/*
 * The ib_regcache memory domain: UCX's own IB md, opened through UCX
 * (uct_ib_md_open), decorated so that every registration the md's rcache
 * makes is watched by libucm_kernel before it is made.
 *
 *   mem_reg   -> kreg_prepare_lookup(addr, len), then UCX's rcache mem_reg
 *                (ucs_rcache_get). On a miss the rcache calls back into the
 *                md, which reaches
 *   reg_key   -> kreg_watch(range), then UCX's reg_key (ibv_reg_mr...).
 *                If the range cannot be watched the registration fails with
 *                kWatchRefused and mem_reg registers the buffer uncached.
 *   dereg_key -> UCX's dereg_key, then kreg_unwatch(range).
 *
 * rkey pack/unpack, atomic and indirect keys, ODP: UCX's, untouched.
 *
 * Hazard 3: UCX's stock "ib" mds get the same decoration (their caches rely
 * on the same external events), see kreg_stock_md_open; UCP's own cache is
 * disabled (component.c); the knem component, whose cache relies on the
 * same events, makes our md refuse to open.
 */
#include "ib_regcache.h"

#include <ucm_kernel/ucm_kernel.h>
#include <ucs/debug/log.h>
#include <ucs/sys/stubs.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <mutex>
#include <new>
#include <type_traits>

namespace {

/* Registration status that means "the kernel refused to watch the range"
 * ("Operation rejected"): UCX's registration paths (verbs, mlx5 devx) return
 * NO_MEMORY, IO_ERROR or UNSUPPORTED, never this. The rcache keeps a failed
 * region with its status, so later lookups of the same range fail fast with
 * it and go uncached without asking the kernel again. */
constexpr ucs_status_t kWatchRefused = UCS_ERR_REJECTED;

/* Private bits in uct_ib_mem_t::flags. UCX 1.13.1 uses bits 0..4. */
constexpr uint32_t kMemhWatchedDefault = 1u << 31; /* UCT_IB_MR_DEFAULT watched */
constexpr uint32_t kMemhWatchedStrict  = 1u << 30; /* UCT_IB_MR_STRICT_ORDER    */
constexpr uint32_t kMemhUncached       = 1u << 29; /* our own, not an rcache region */
static_assert(UCT_IB_MEM_FLAG_RELAXED_ORDERING < (1u << 29),
              "UCX uses the flag bits ib_regcache keeps for itself");
static_assert(UCT_IB_MR_LAST == 2, "one watched bit per memory region type");

uint32_t watched_bit(uct_ib_mr_type_t mr_type)
{
    return (mr_type == UCT_IB_MR_DEFAULT) ? kMemhWatchedDefault :
                                            kMemhWatchedStrict;
}

/* One per decorated md. md->super.ops and md->ops point into it, so the
 * state of an md is found from its ops pointers without a lookup. */
struct MdState {
    uct_md_ops_t          md_ops;
    uct_ib_md_ops_t       ib_ops;
    const uct_md_ops_t    *orig_md_ops;
    const uct_ib_md_ops_t *orig_ib_ops;
    bool                  own;        /* opened by ib_regcache, not stock ib */
    bool                  decorated;  /* registrations are watched          */
    bool                  stop_kreg;  /* holds a kreg_start() to pair       */
    std::atomic<uint64_t> watched{0};
    std::atomic<uint64_t> uncached{0};
};

static_assert(std::is_standard_layout_v<MdState>);

MdState *state_of(uct_ib_md_t *md)
{
    auto *p = reinterpret_cast<const char*>(md->super.ops);
    return reinterpret_cast<MdState*>(const_cast<char*>(p) -
                                      offsetof(MdState, md_ops));
}

/* Serializes md opens of both components. */
std::mutex g_open_lock;
uct_component_md_open_func_t g_stock_md_open;

/* The md whose rcache registration runs on this thread: reg_key only
 * watches registrations made for the cache (not the md's own uncached or
 * internal ones). */
thread_local uct_ib_md_t *t_caching_md;

std::atomic<unsigned> g_refusal_logged[KREG_REASON_LAST];

void log_refusal(uct_ib_md_t *md, void *address, size_t length,
                 kreg_reason_t reason)
{
    unsigned r = (reason < KREG_REASON_LAST) ? reason : KREG_REASON_OTHER;

    if (g_refusal_logged[r].fetch_add(1, std::memory_order_relaxed) == 0) {
        ucs_diag("ib_regcache: %s: %p..%p cannot be watched (%s): such "
                 "buffers are registered without the cache",
                 kreg_md_dev_name(md), address,
                 UCS_PTR_BYTE_OFFSET(address, length), kreg_reason_str(reason));
    } else {
        ucs_debug("ib_regcache: %s: %p..%p not watched (%s), uncached",
                  kreg_md_dev_name(md), address,
                  UCS_PTR_BYTE_OFFSET(address, length), kreg_reason_str(reason));
    }
}

/* The range of an rcache region's memh, as it was registered. */
void memh_range(uct_ib_mem_t *memh, void **address_p, size_t *length_p)
{
    auto *region = ucs_container_of(memh, uct_ib_rcache_region_t, memh);

    *address_p = reinterpret_cast<void*>(region->super.super.start);
    *length_p  = region->super.super.end - region->super.super.start;
}

/* ---- uct_ib_md_ops_t wrappers: the rcache's registration path ---- */

template <bool Multithreaded>
ucs_status_t watched_reg(uct_ib_md_t *md, void *address, size_t length,
                         uint64_t access, uct_ib_mem_t *memh,
                         uct_ib_mr_type_t mr_type, int silent)
{
    MdState *st = state_of(md);
    auto orig   = Multithreaded ? st->orig_ib_ops->reg_multithreaded :
                                  st->orig_ib_ops->reg_key;
    kreg_reason_t reason = KREG_REASON_NONE;
    ucs_status_t status;

    if (t_caching_md != md) {
        return orig(md, address, length, access, memh, mr_type, silent);
    }

    if (!kreg_watch(address, length, &reason)) {
        log_refusal(md, address, length, reason);
        return kWatchRefused;
    }

    status = orig(md, address, length, access, memh, mr_type, silent);
    if (status != UCS_OK) {
        /* includes UNSUPPORTED from reg_multithreaded: UCX then falls back
         * to reg_key, which watches again */
        kreg_unwatch(address, length);
        return status;
    }

    memh->flags |= watched_bit(mr_type);
    st->watched.fetch_add(1, std::memory_order_relaxed);
    return UCS_OK;
}

template <bool Multithreaded>
ucs_status_t watched_dereg(uct_ib_md_t *md, uct_ib_mem_t *memh,
                           uct_ib_mr_type_t mr_type)
{
    MdState *st = state_of(md);
    auto orig   = Multithreaded ? st->orig_ib_ops->dereg_multithreaded :
                                  st->orig_ib_ops->dereg_key;
    uint32_t bit = watched_bit(mr_type);
    ucs_status_t status;
    void *address;
    size_t length;

    status = orig(md, memh, mr_type);
    if (memh->flags & bit) {
        memh->flags &= ~bit;
        memh_range(memh, &address, &length);
        kreg_unwatch(address, length);
    }
    return status;
}

/* ---- uncached registration: UCX's direct path, through the md's ops ---- */

/* Mirrors uct_ib_md_access_flags() of UCX 1.13.1. */
uint64_t access_flags(uct_ib_md_t *md, unsigned flags, size_t length)
{
    uint64_t access = UCT_IB_MEM_ACCESS_FLAGS;

    if ((flags & UCT_MD_MEM_FLAG_NONBLOCK) && (length > 0) &&
        (length <= md->config.odp.max_size)) {
        access |= IBV_ACCESS_ON_DEMAND;
    }
    if (md->relaxed_order) {
        access |= IBV_ACCESS_RELAXED_ORDERING;
    }
    return access;
}

/* Mirrors uct_ib_md_reg_mr(): multithreaded above the threshold when the
 * md supports it, else reg_key. Calls UCX's ops, never the watched ones. */
ucs_status_t plain_reg_mr(uct_ib_md_t *md, const uct_ib_md_ops_t *ops,
                          void *address, size_t length, uint64_t access,
                          int silent, uct_ib_mem_t *memh,
                          uct_ib_mr_type_t mr_type)
{
    ucs_status_t status;

    if (length >= md->config.min_mt_reg) {
        status = ops->reg_multithreaded(md, address, length, access, memh,
                                        mr_type, silent);
        if (status != UCS_ERR_UNSUPPORTED) {
            if (status == UCS_OK) {
                memh->flags |= UCT_IB_MEM_MULTITHREADED;
            }
            return status;
        }
    }
    return ops->reg_key(md, address, length, access, memh, mr_type, silent);
}

ucs_status_t plain_dereg_key(uct_ib_md_t *md, const uct_ib_md_ops_t *ops,
                             uct_ib_mem_t *memh, uct_ib_mr_type_t mr_type)
{
    return (memh->flags & UCT_IB_MEM_MULTITHREADED) ?
           ops->dereg_multithreaded(md, memh, mr_type) :
           ops->dereg_key(md, memh, mr_type);
}

/* Mirrors uct_ib_memh_dereg(). */
ucs_status_t plain_memh_dereg(uct_ib_md_t *md, const uct_ib_md_ops_t *ops,
                              uct_ib_mem_t *memh)
{
    ucs_status_t s, status = UCS_OK;

    if (memh->flags & UCT_IB_MEM_FLAG_ATOMIC_MR) {
        memh->flags &= ~UCT_IB_MEM_FLAG_ATOMIC_MR;
        s = ops->dereg_atomic_key(md, memh);
        if (s != UCS_OK) {
            status = s;
        }
    }
    if (memh->flags & UCT_IB_MEM_FLAG_RELAXED_ORDERING) {
        s = plain_dereg_key(md, ops, memh, UCT_IB_MR_STRICT_ORDER);
        memh->flags &= ~UCT_IB_MEM_FLAG_RELAXED_ORDERING;
        if (s != UCS_OK) {
            status = s;
        }
    }
    s = plain_dereg_key(md, ops, memh, UCT_IB_MR_DEFAULT);
    return (s != UCS_OK) ? s : status;
}

/* Registers like UCX's direct method (REG_METHODS=direct) would; the
 * handle is marked so that mem_dereg frees it here, not in the rcache.
 * Not mirrored: the NUMA policy UCX applies to ODP regions. */
ucs_status_t uncached_reg(uct_ib_md_t *md, MdState *st, void *address,
                          size_t length, unsigned flags, uct_mem_h *memh_p)
{
    const uct_ib_md_ops_t *ops = st->orig_ib_ops;
    uint64_t access = access_flags(md, flags, length);
    int silent      = !!(flags & UCT_MD_MEM_FLAG_HIDE_ERRORS);
    ucs_status_t status;
    uct_ib_mem_t *memh;

    memh = static_cast<uct_ib_mem_t*>(calloc(1, md->memh_struct_size));
    if (memh == nullptr) {
        uct_md_log_mem_reg_error(flags, "ib_regcache: %s: no memory for a "
                                 "memory handle", kreg_md_dev_name(md));
        return UCS_ERR_NO_MEMORY;
    }

    memh->lkey          = UCT_IB_INVALID_MKEY;
    memh->rkey          = UCT_IB_INVALID_MKEY;
    memh->atomic_rkey   = UCT_IB_INVALID_MKEY;
    memh->indirect_rkey = UCT_IB_INVALID_MKEY;
    memh->flags         = kMemhUncached;
    if (access & IBV_ACCESS_ON_DEMAND) {
        memh->flags |= UCT_IB_MEM_FLAG_ODP;
    }
    if (flags & UCT_MD_MEM_ACCESS_REMOTE_ATOMIC) {
        memh->flags |= UCT_IB_MEM_ACCESS_REMOTE_ATOMIC;
    }

    status = plain_reg_mr(md, ops, address, length, access, silent, memh,
                          UCT_IB_MR_DEFAULT);
    if (status != UCS_OK) {
        free(memh);
        return status;
    }

    if (md->relaxed_order) {
        status = plain_reg_mr(md, ops, address, length,
                              access & ~IBV_ACCESS_RELAXED_ORDERING, silent,
                              memh, UCT_IB_MR_STRICT_ORDER);
        if (status != UCS_OK) {
            plain_memh_dereg(md, ops, memh);
            free(memh);
            return status;
        }
        memh->flags |= UCT_IB_MEM_FLAG_RELAXED_ORDERING;
    }

    if (md->config.odp.prefetch) {
        ops->mem_prefetch(md, memh, address, length);
    }

    st->uncached.fetch_add(1, std::memory_order_relaxed);
    *memh_p = memh;
    return UCS_OK;
}

/* ---- uct_md_ops_t wrappers ---- */

ucs_status_t kreg_mem_reg(uct_md_h uct_md, void *address, size_t length,
                          unsigned flags, uct_mem_h *memh_p)
{
    auto *md         = reinterpret_cast<uct_ib_md_t*>(uct_md);
    MdState *st      = state_of(md);
    uct_ib_md_t *out = t_caching_md;
    ucs_status_t status;

    kreg_prepare_lookup(address, length);

    t_caching_md = md;
    status       = st->orig_md_ops->mem_reg(uct_md, address, length, flags,
                                            memh_p);
    t_caching_md = out;

    if (status != kWatchRefused) {
        return status;
    }
    return uncached_reg(md, st, address, length, flags, memh_p);
}

ucs_status_t kreg_mem_dereg(uct_md_h uct_md,
                            const uct_md_mem_dereg_params_t *params)
{
    auto *md    = reinterpret_cast<uct_ib_md_t*>(uct_md);
    MdState *st = state_of(md);
    auto *memh  = static_cast<uct_ib_mem_t*>(
            UCT_MD_MEM_DEREG_FIELD_VALUE(params, memh, FIELD_MEMH, nullptr));
    ucs_status_t status;

    if ((memh == nullptr) || !(memh->flags & kMemhUncached)) {
        return st->orig_md_ops->mem_dereg(uct_md, params);
    }

    status = plain_memh_dereg(md, st->orig_ib_ops, memh);
    free(memh);
    if (UCT_MD_MEM_DEREG_FIELD_VALUE(params, flags, FIELD_FLAGS, 0) &
        UCT_MD_MEM_DEREG_FLAG_INVALIDATE) {
        kreg_invoke_completion(params->comp, UCS_OK);
    }
    return status;
}

void kreg_md_close(uct_md_h uct_md)
{
    auto *md    = reinterpret_cast<uct_ib_md_t*>(uct_md);
    MdState *st = state_of(md);

    ucs_debug("ib_regcache: closing %s md %s: %lu registrations watched, "
              "%lu uncached", st->own ? "own" : "stock ib",
              kreg_md_dev_name(md),
              (unsigned long)st->watched.load(),
              (unsigned long)st->uncached.load());

    /* UCX's close destroys the rcache, whose deregistrations still come
     * through st's ops: free st only afterwards. */
    st->orig_md_ops->close(uct_md);

    if (st->stop_kreg) {
        kreg_stop();
    }
    delete st;
}

bool is_ucx_unsupported_fn(const void *fn)
{
    return fn == reinterpret_cast<const void*>(
                         &ucs_empty_function_return_unsupported);
}

/* Takes md's ops into a new state. With decorate, registrations through
 * the rcache are watched; else only close is ours (to pair kreg_stop). */
MdState *adopt(uct_ib_md_t *md, bool own, bool decorate, bool stop_kreg)
{
    auto *st = new (std::nothrow) MdState();

    if (st == nullptr) {
        return nullptr;
    }

    st->orig_md_ops = md->super.ops;
    st->orig_ib_ops = md->ops;
    st->md_ops      = *md->super.ops;
    st->ib_ops      = *md->ops;
    st->own         = own;
    st->decorated   = decorate;
    st->stop_kreg   = stop_kreg;

    st->md_ops.close = kreg_md_close;
    if (decorate) {
        st->md_ops.mem_reg   = kreg_mem_reg;
        st->md_ops.mem_dereg = kreg_mem_dereg;
        st->ib_ops.reg_key   = watched_reg<false>;
        st->ib_ops.dereg_key = watched_dereg<false>;
        if (!is_ucx_unsupported_fn(
                    reinterpret_cast<const void*>(md->ops->reg_multithreaded))) {
            st->ib_ops.reg_multithreaded   = watched_reg<true>;
            st->ib_ops.dereg_multithreaded = watched_dereg<true>;
        }
    }

    md->super.ops = &st->md_ops;
    md->ops       = &st->ib_ops;
    return st;
}

/* Stock "ib" md_open, wrapped (hazard 3). Once the unmap event is
 * declared external UCM installs no hooks for a new rcache, so a stock md's
 * cache would hear only of the ranges we watch; and a stock md opened
 * before ours (UCP opens every md, "ib" comes first) would install UCM's
 * malloc and mmap hooks for the whole process. So with this library loaded
 * every stock IB md takes the kernel event source too and is decorated like
 * ours, keeping its own component and transport names. If the source cannot
 * start, the stock md runs as UCX made it (hooks, or no cache), and so do
 * ours. */
ucs_status_t kreg_stock_md_open(uct_component_t *component,
                                const char *md_name,
                                const uct_md_config_t *config, uct_md_h *md_p)
{
    std::lock_guard<std::mutex> guard(g_open_lock);
    ucs_status_t kst, status;
    uct_ib_md_t *md;
    uct_md_h uct_md;

    kst    = kreg_start();
    status = g_stock_md_open(component, md_name, config, &uct_md);
    if (status != UCS_OK) {
        kreg_stop();
        return status;
    }

    md = reinterpret_cast<uct_ib_md_t*>(uct_md);
    if (adopt(md, false, (kst == UCS_OK) && (md->rcache != nullptr), true) ==
        nullptr) {
        uct_md->ops->close(uct_md);
        kreg_stop();
        return UCS_ERR_NO_MEMORY;
    }
    if ((kst == UCS_OK) && (md->rcache != nullptr)) {
        ucs_debug("ib_regcache: stock ib md %s: registration cache watched "
                  "by the kernel too", md_name);
    }
    *md_p = uct_md;
    return UCS_OK;
}

} // namespace

extern "C" ucs_status_t kreg_md_open(uct_component_t *component,
                                     const char *md_name,
                                     const uct_md_config_t *uct_md_config,
                                     uct_md_h *md_p)
{
    auto *config = reinterpret_cast<const kreg_md_config_t*>(uct_md_config);
    std::lock_guard<std::mutex> guard(g_open_lock);
    ucs_status_t kst, status;
    uct_ib_md_t *md;
    uct_md_h uct_md;
    bool decorate;

    if (kreg_ucp_rcache_state == KREG_UCP_RCACHE_ENABLED_BY_USER) {
        ucs_error("ib_regcache: %s refused: UCX_RCACHE_ENABLE=%s enables "
                  "UCP's own registration cache, whose hits bypass the "
                  "kernel checks and which would cache registrations made "
                  "uncached; unset it or set it to 'n'", md_name,
                  kreg_ucp_rcache_value);
        return UCS_ERR_UNSUPPORTED;
    }

    if (kreg_component_loaded("knem")) {
        ucs_error("ib_regcache: %s refused: the knem component keeps a "
                  "registration cache of its own that relies on the same "
                  "unmap events and is not watched", md_name);
        return UCS_ERR_UNSUPPORTED;
    }

    /* Before UCX creates the md's rcache: it must see the external event
     * declaration, so that UCM installs no hooks for it. */
    kst = kreg_start();
    if ((kst != UCS_OK) && config->require_kernel) {
        kreg_stop();
        ucs_error("ib_regcache: %s refused: the kernel event source cannot "
                  "start (%s) and " "UCX_" KREG_MD_CONFIG_PREFIX
                  "REQUIRE_KERNEL=y", md_name, ucs_status_string(kst));
        return UCS_ERR_UNSUPPORTED;
    }

    status = kreg_ib_md_open(md_name, &config->ib.super, &uct_md);
    if (status != UCS_OK) {
        kreg_stop();
        return status;
    }

    md                  = reinterpret_cast<uct_ib_md_t*>(uct_md);
    md->super.component = &kreg_component;
    decorate            = (kst == UCS_OK) && (md->rcache != nullptr);

    if (adopt(md, true, decorate, true) == nullptr) {
        uct_md->ops->close(uct_md);
        kreg_stop();
        return UCS_ERR_NO_MEMORY;
    }

    if (decorate) {
        ucs_debug("ib_regcache: %s: registration cache watched by the kernel",
                  md_name);
    } else if (kst == UCS_OK) {
        ucs_debug("ib_regcache: %s: md has no registration cache "
                  "(UCX_IB_REG_METHODS), nothing to watch", md_name);
    } else {
        ucs_diag("ib_regcache: %s: kernel event source unavailable (%s): "
                 "running UCX's md as is (UCM hooks, or no cache)", md_name,
                 ucs_status_string(kst));
    }

    *md_p = uct_md;
    return UCS_OK;
}

extern "C" void kreg_stock_ib_hook_install(void)
{
    std::lock_guard<std::mutex> guard(g_open_lock);

    g_stock_md_open            = uct_ib_component.md_open;
    uct_ib_component.md_open   = kreg_stock_md_open;
}

extern "C" void kreg_stock_ib_hook_remove(void)
{
    std::lock_guard<std::mutex> guard(g_open_lock);

    if (uct_ib_component.md_open == kreg_stock_md_open) {
        uct_ib_component.md_open = g_stock_md_open;
    }
}
