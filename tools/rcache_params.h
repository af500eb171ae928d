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
extern "C" {
#include <ucs/memory/rcache.h> /* has no C++ guards */
}

namespace kreg_tools {

/* Regions of region_size bytes (a ucs_rcache_region_t first), reported to
 * ops with ctx. Event priority 1000: UCM calls it before a benchmark's
 * probe handler at 2000. */
inline ucs_rcache_params_t watched_rcache_params(size_t region_size,
                                                 const ucs_rcache_ops_t *ops,
                                                 void *ctx)
{
    const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    ucs_rcache_params_t params = {};
    params.region_struct_size  = region_size;
    params.alignment           = page;
    params.max_alignment       = page;
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

} // namespace kreg_tools

#endif
