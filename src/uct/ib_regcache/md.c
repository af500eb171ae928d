/*
 * The caching md: a ucs_rcache of our own over UCX's IB md, kept correct by
 * libucm_kernel. (UCX's md is the same object, with our ops table: see
 * kreg_md_t in ib_regcache.h; its own operations are reached through the
 * version layer, kreg_ucx_ib_*.)
 *
 *   mem_reg    kreg_rcache_get: the event source's lookup check, the rcache
 *              lookup, and a region whose watch is no longer current is
 *              dropped and looked up again. On a miss the rcache calls
 *   region_register   kreg_register_watched: watch the range, register it
 *              with UCX's md (its own mem_reg), confirm that the pages did
 *              not change while they were pinned, else undo and retry.
 *   mem_dereg  ucs_rcache_region_put; the rcache deregisters (UCX's md's
 *              mem_dereg, then kreg_unwatch) when the region goes.
 *   uncached   a range the kernel will not watch (UCS_ERR_REJECTED), or no
 *              cache at all: UCX's md's own mem_reg, in a heap handle.
 *
 * What UCP and the transports get as memh is a copy of UCX's handle (see
 * kreg_memh_t in ib_regcache.h); calls that need the original translate
 * back with kreg_memh_of(). Everything else (rkey pack/unpack, atomic and
 * indirect keys, ODP, mem_advise) is UCX's md's (ucx_1_13.c).
 */
#include "ib_regcache.h"
#include "ucx_layer.h"

#include <ucs/debug/log_def.h>
#include <ucs/sys/compiler_def.h>
#include <ucs/type/status.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

static void kreg_md_count(uint64_t *counter)
{
    __atomic_fetch_add(counter, 1, __ATOMIC_RELAXED);
}

/* A hit may add KREG_MEMH_FLAG_ATOMIC to a region other threads use. */
static uint32_t kreg_memh_flags(const kreg_memh_t *memh)
{
    return __atomic_load_n(&memh->flags, __ATOMIC_RELAXED);
}

static void kreg_memh_copy(kreg_memh_t *memh, size_t size)
{
    memh->size = (uint32_t)size;
    memcpy(kreg_memh_ucx(memh), memh->inner, size);
}

void kreg_md_memh_sync(kreg_md_t *md, kreg_memh_t *memh)
{
    /* Only when something changed: the copy of a cached region is read by
     * other threads' transports, and what they read (lkey, rkey) never
     * changes; mkey_pack changes flags and the atomic/indirect keys once. */
    if (memcmp(kreg_memh_ucx(memh), memh->inner, memh->size) != 0) {
        memcpy(kreg_memh_ucx(memh), memh->inner, memh->size);
    }
}

/* ---- the rcache's registration callbacks -------------------------------- */

typedef struct {
    kreg_md_t     *md;
    kreg_region_t *region;
    unsigned      flags;
} kreg_reg_arg_t;

/* kreg_register_watched's reg: UCX's md registers the region's range */
static ucs_status_t kreg_md_ib_reg(void *arg, void *address, size_t length)
{
    kreg_reg_arg_t *a = arg;
    ucs_status_t status;

    status = kreg_ucx_ib_mem_reg(a->md, address, length, a->flags,
                                 &a->region->memh.inner);
    if (status != UCS_OK) {
        a->region->memh.inner = NULL;
        return status;
    }
    kreg_memh_copy(&a->region->memh, a->md->memh_size);
    return UCS_OK;
}

/* kreg_register_watched's dereg: the pages changed while being pinned */
static void kreg_md_ib_dereg(void *arg)
{
    kreg_reg_arg_t *a = arg;
    ucs_status_t status;

    status = kreg_ucx_ib_mem_dereg(a->md, a->region->memh.inner, NULL);
    if (status != UCS_OK) {
        ucs_warn("ib_regcache: %s: deregistration of a changed region "
                 "failed: %s", a->md->name, ucs_status_string(status));
    }
    a->region->memh.inner = NULL;
}

/* libibverbs exports these (IBVERBS_1.1) but its headers no longer declare
 * them: the reference counted MADV_DONTFORK/MADV_DOFORK of fork protection
 * that ibv_reg_mr and ibv_dereg_mr take and drop themselves. */
int ibv_dontfork_range(void *base, size_t size);
int ibv_dofork_range(void *base, size_t size);

/*
 * Hazard "DONTFORK split after the watch": with fork protection on
 * (UCX_IB_FORK_INIT=try, UCX's default: rdma-core 44 turns it on even where
 * the kernel copies pinned pages at fork, and ibv_is_fork_initialized()
 * then says "unneeded"), ibv_reg_mr marks its range MADV_DONTFORK. That
 * splits the VMA at the range's ends, and splitting a VMA inside a 2 MiB
 * block it covers sends MMU_NOTIFY_CLEAR for the whole block
 * (__split_huge_pmd, whether or not a huge page is mapped there): the
 * watch, taken just before, sees its pages change while they were only
 * split, and the registration is refused (three times, then uncached).
 * Taking rdma-core's reference first makes the split happen before the
 * watch; ibv_reg_mr then finds the range marked and madvises nothing, and
 * neither does its dereg while ours is held (also across the retries of
 * kreg_register_watched). Ours is dropped after the region's last dereg,
 * as rdma-core would have dropped its own. Without fork protection both
 * calls do nothing (and, like ibv_reg_mr, make a later ibv_fork_init fail).
 * Returns whether a reference was taken.
 */
static int kreg_md_dontfork(void *address, size_t length)
{
    return ibv_dontfork_range(address, length) == 0;
}

static void kreg_md_dofork(kreg_region_t *region, void *address, size_t length)
{
    if ((region->memh.flags & KREG_MEMH_FLAG_DONTFORK) &&
        (ibv_dofork_range(address, length) != 0)) {
        ucs_debug("ib_regcache: MADV_DOFORK of %p..%p failed: %m", address,
                  UCS_PTR_BYTE_OFFSET(address, length));
    }
    region->memh.flags &= ~KREG_MEMH_FLAG_DONTFORK;
}

/*
 * Hazard "merge over an unmap in flight": on a miss UCS's rcache merges the
 * requested range with the cached regions it overlaps and registers the
 * union, silently (UCS_RCACHE_MEM_REG_HIDE_ERRORS), because a merge may
 * fail where the requested range alone would not: then UCS registers the
 * requested range alone. Our unmap events reach the rcache from a thread of
 * ours, after the munmap returned (the notifier's reader), so a neighbour
 * whose pages were just unmapped can still be in the tree: the union spans
 * a hole and ibv_reg_mr fails with EFAULT. UCX 1.13's IB md drops the
 * silence on the way (its mem_reg passes silent=0) and logs that as an
 * error. A silent registration is therefore checked first, by one call
 * that changes nothing: msync(MS_ASYNC) fails with ENOMEM on a range that
 * is not all mapped. A hole the unmap left and something mapped since is
 * no hole: that union registers and is watched as it is now.
 */
static int kreg_md_range_has_hole(void *address, size_t length)
{
    return (msync(address, length, MS_ASYNC) != 0) && (errno == ENOMEM);
}

ucs_status_t kreg_md_region_register(kreg_md_t *md, kreg_region_t *region,
                                     unsigned uct_flags, int silent)
{
    void *address         = (void*)region->super.super.start;
    size_t length         = region->super.super.end - region->super.super.start;
    kreg_reg_arg_t arg    = {md, region, uct_flags};
    kreg_reason_t reason  = KREG_REASON_NONE;
    ucs_status_t status;

    if (silent) {
        if (kreg_md_range_has_hole(address, length)) {
            ucs_debug("ib_regcache: %s: %p..%p is not all mapped (a merge "
                      "over an unmap in flight?): not registered", md->name,
                      address, UCS_PTR_BYTE_OFFSET(address, length));
            return UCS_ERR_IO_ERROR;
        }
        arg.flags |= UCT_MD_MEM_FLAG_HIDE_ERRORS;
    }

    region->memh.flags = kreg_md_dontfork(address, length) ?
                         KREG_MEMH_FLAG_DONTFORK : 0;
    status = kreg_register_watched(address, length, &region->watch,
                                   kreg_md_ib_reg, kreg_md_ib_dereg,
                                   &arg, &reason);
    if (status != UCS_OK) {
        kreg_md_dofork(region, address, length);
    }
    if (status == UCS_OK) {
        region->memh.flags |= KREG_MEMH_FLAG_CACHED;
        if (uct_flags & UCT_MD_MEM_ACCESS_REMOTE_ATOMIC) {
            region->memh.flags |= KREG_MEMH_FLAG_ATOMIC;
        }
        kreg_md_count(&md->regions);
        ucs_trace("ib_regcache: %s: registered %p..%p for the cache, memh %p",
                  md->name, address, UCS_PTR_BYTE_OFFSET(address, length),
                  region->memh.inner);
    } else if (status == UCS_ERR_REJECTED) {
        /* libucm_kernel logged why (once per reason); mem_reg goes uncached */
        ucs_debug("ib_regcache: %s: %p..%p not watched (%s), uncached",
                  md->name, address, UCS_PTR_BYTE_OFFSET(address, length),
                  kreg_reason_str(reason));
    }
    return status;
}

void kreg_md_region_deregister(kreg_md_t *md, kreg_region_t *region)
{
    ucs_status_t status;

    ucs_trace("ib_regcache: %s: deregistering %p..%p, memh %p", md->name,
              (void*)region->super.super.start, (void*)region->super.super.end,
              region->memh.inner);
    status = kreg_ucx_ib_mem_dereg(md, region->memh.inner, NULL);
    if (status != UCS_OK) {
        ucs_warn("ib_regcache: %s: deregistration of 0x%lx..0x%lx failed: %s",
                 md->name, region->super.super.start, region->super.super.end,
                 ucs_status_string(status));
    }
    kreg_unwatch(&region->watch);
    kreg_md_dofork(region, (void*)region->super.super.start,
                   region->super.super.end - region->super.super.start);
}

void kreg_md_region_dump(kreg_md_t *md, kreg_region_t *region, char *buf,
                         size_t max)
{
    const kreg_watch_t *w = &region->watch;

    snprintf(buf, max, "memh %p watch 0x%lx..0x%lx slot %u%s",
             region->memh.inner, w->start, w->end, w->slot,
             (w->counter == NULL) ? " (none yet)" :
             kreg_watch_is_current(w) ? "" : " (stale)");
}

/* ---- uncached ------------------------------------------------------------ */

static ucs_status_t kreg_md_reg_uncached(kreg_md_t *md, void *address,
                                         size_t length, unsigned flags,
                                         uct_mem_h *memh_p)
{
    kreg_memh_t *memh;
    ucs_status_t status;

    memh = malloc(sizeof(*memh) + md->memh_size);
    if (memh == NULL) {
        ucs_log((flags & UCT_MD_MEM_FLAG_HIDE_ERRORS) ? UCS_LOG_LEVEL_DIAG :
                                                        UCS_LOG_LEVEL_ERROR,
                "ib_regcache: %s: no memory for a memory handle", md->name);
        return UCS_ERR_NO_MEMORY;
    }

    status = kreg_ucx_ib_mem_reg(md, address, length, flags, &memh->inner);
    if (status != UCS_OK) {
        free(memh);
        return status;
    }

    memh->flags = 0;
    kreg_memh_copy(memh, md->memh_size);
    kreg_md_count(&md->uncached);
    ucs_trace("ib_regcache: %s: registered %p..%p uncached, memh %p",
              md->name, address, UCS_PTR_BYTE_OFFSET(address, length),
              memh->inner);
    *memh_p = kreg_memh_ucx(memh);
    return UCS_OK;
}

/* ---- mem_reg / mem_dereg ------------------------------------------------- */

ucs_status_t kreg_md_mem_reg(kreg_md_t *md, void *address, size_t length,
                             unsigned flags, uct_mem_h *memh_p)
{
    ucs_rcache_region_t *rregion;
    kreg_region_t *region;
    ucs_status_t status;

    if (ucs_likely(md->rcache != NULL)) {
        status = kreg_rcache_get(md->rcache, address, length,
                                 PROT_READ | PROT_WRITE, &flags,
                                 ucs_offsetof(kreg_region_t, watch), &rregion);
        if (ucs_likely(status == UCS_OK)) {
            region = ucs_derived_of(rregion, kreg_region_t);
            if ((flags & UCT_MD_MEM_ACCESS_REMOTE_ATOMIC) &&
                !(kreg_memh_flags(&region->memh) & KREG_MEMH_FLAG_ATOMIC)) {
                /* registered without: mkey_pack makes the atomic key */
                kreg_ucx_memh_want_atomic(region->memh.inner);
                __atomic_fetch_or(&region->memh.flags, KREG_MEMH_FLAG_ATOMIC,
                                  __ATOMIC_RELAXED);
                kreg_md_memh_sync(md, &region->memh);
            }
            ucs_trace("ib_regcache: %s: %p..%p from the cache, region 0x%lx..0x%lx",
                      md->name, address, UCS_PTR_BYTE_OFFSET(address, length),
                      region->super.super.start, region->super.super.end);
            *memh_p = kreg_memh_ucx(&region->memh);
            return UCS_OK;
        } else if (status != UCS_ERR_REJECTED) {
            return status;
        }
    }
    return kreg_md_reg_uncached(md, address, length, flags, memh_p);
}

ucs_status_t kreg_md_mem_dereg(kreg_md_t *md, uct_mem_h ucx_memh,
                               uct_completion_t *invalidate_comp)
{
    kreg_memh_t *memh = kreg_memh_of(ucx_memh);
    kreg_region_t *region;
    ucs_status_t status;

    if (kreg_memh_flags(memh) & KREG_MEMH_FLAG_CACHED) {
        region = ucs_container_of(memh, kreg_region_t, memh);
        ucs_trace("ib_regcache: %s: release region 0x%lx..0x%lx", md->name,
                  region->super.super.start, region->super.super.end);
        if (invalidate_comp != NULL) {
            ucs_rcache_region_invalidate(md->rcache, &region->super,
                                         kreg_ucx_invalidate_cb,
                                         invalidate_comp);
        }
        ucs_rcache_region_put(md->rcache, &region->super);
        return UCS_OK;
    }

    ucs_trace("ib_regcache: %s: deregistering uncached memh %p", md->name,
              memh->inner);
    status = kreg_ucx_ib_mem_dereg(md, memh->inner, invalidate_comp);
    free(memh);
    return status;
}
