/* The parameters of an rcache kept current by libucm_kernel (or, with the
 * hooks on, by UCM): page alignment, the one event UCM reports, no limits.
 * The io_uring cache, the GoogleTest token cache and the benchmarks' cache
 * all create theirs from this; the md takes UCX's IB settings instead
 * (src/uct/ib_regcache/ucx_1_13.c). */
#ifndef KREG_TOOLS_RCACHE_PARAMS_H
#define KREG_TOOLS_RCACHE_PARAMS_H

#include <climits>
#include <cstdint>
#include <unistd.h>

#include <ucm/api/ucm.h>
#include <ucm_kernel/ucm_kernel.h> /* KREG_UCS_RCACHE_* */

namespace kreg_tools {

/* Regions of region_size bytes (a ucs_rcache_region_t first), reported to
 * ops with ctx. Event priority 1000: UCM calls it before a benchmark's
 * probe handler at 2000. */
inline ucs_rcache_params_t watched_rcache_params(size_t region_size,
                                                 const ucs_rcache_ops_t *ops,
                                                 void *ctx)
{
    ucs_rcache_params_t params = {};
    params.region_struct_size  = region_size;
#if !KREG_UCS_RCACHE_GET_ALIGNS /* since 1.17 each lookup passes it */
    params.alignment           = kreg_page_size;
    params.max_alignment       = kreg_page_size;
#endif
    params.ucm_events          = UCM_EVENT_VM_UNMAPPED;
    params.ucm_event_priority  = 1000;
    params.ops                 = ops;
    params.context             = ctx;
    params.flags               = 0;
    params.max_regions         = ULONG_MAX;
    params.max_size            = SIZE_MAX;
    params.max_unreleased      = SIZE_MAX;
    return params;
}

/* The ops of such a cache on every UCX it builds against: UCS 1.18+ calls
 * a merge callback unconditionally (these caches keep nothing to merge). */
inline ucs_rcache_ops_t watched_rcache_ops(decltype(ucs_rcache_ops_t::mem_reg) reg,
                                           decltype(ucs_rcache_ops_t::mem_dereg) dereg,
                                           decltype(ucs_rcache_ops_t::dump_region) dump)
{
    ucs_rcache_ops_t ops = {};
    ops.mem_reg     = reg;
    ops.mem_dereg   = dereg;
#if KREG_UCS_RCACHE_OPS_MERGE
    ops.merge       = [](void *, ucs_rcache_t *, void *, ucs_rcache_region_t *) {};
#endif
    ops.dump_region = dump;
    return ops;
}

} // namespace kreg_tools

#endif
