/*
 * ib_regcache: a UCT component whose memory domain is a registration cache
 * of its own (UCS ucs_rcache, kept correct by libucm_kernel) over UCX's IB
 * md, and whose transports are UCX's verbs transports on that IB md.
 *
 * This header is the part that does not depend on UCX's version: it sees
 * UCX only through its installed public headers (uct/api/uct.h,
 * ucs/memory/rcache.h). Everything that depends on UCX's internals is in
 * the version layer (ucx_layer.h, ucx_1_13.c or ucx_1_16.c).
 *
 *   component.c  load time: version check, UCP's own cache, registration
 *   open.c       the open policy: kernel source, inner md, rcache or
 *                pass-through, reg_cost
 *   md.c         the caching md: mem_reg (hit, miss, uncached), mem_dereg
 *   ucx_1_13.c   everything UCX-version dependent: UCX 1.13-1.15
 *   ucx_1_16.c   and 1.16-1.22 (configure builds one; ucx_layer.h is
 *                their interface; ucx_common.c what both do alike)
 *   reg_methods.c  UCX 1.13-1.15's REG_METHODS lists and the stock "ib" md's
 *                policy next to this library (the foreign rcache hazard)
 *   ucs_module.c libucs_kreg (UCX 1.22): UCP's own cache off in time
 *
 * Nothing here is visible outside the library (-fvisibility=hidden).
 */
#ifndef UCX_KREG_IB_REGCACHE_H
#define UCX_KREG_IB_REGCACHE_H

#include <ucm_kernel/ucm_kernel.h>
#include <uct/api/uct.h>
#include <ucs/datastruct/linear_func.h>
#include <ucs/memory/rcache.h>
#include <ucs/sys/compiler_def.h>

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Names under which the component and its transports are listed. The wire
 * address carries a checksum of the transport name, so both peers need this
 * component to talk over them. */
#define KREG_COMPONENT_NAME     "ib_regcache"
#define KREG_MD_CONFIG_PREFIX   "IB_REGCACHE_"
#define KREG_RC_TL_NAME         "rc_kreg"
#define KREG_UD_TL_NAME         "ud_kreg"
/* UCX's mlx5 transports (rc_mlx5, dc_mlx5, ud_mlx5; "_x" as in UCX's
 * aliases rc_x, dc_x, ud_x: a name has at most UCT_TL_NAME_MAX - 1 = 9
 * characters). They list devices only on an mlx5 device. */
#define KREG_RC_MLX5_TL_NAME    "rc_kreg_x"
#define KREG_DC_MLX5_TL_NAME    "dc_kreg_x"
#define KREG_UD_MLX5_TL_NAME    "ud_kreg_x"

/* ---- memory handles ------------------------------------------------------
 *
 * UCP and the transports cast a memory handle to UCX's own (uct_ib_mem_t:
 * lkey, rkey, flags; mlx5 a larger struct), so the handle this md hands out
 * is a byte copy of the one UCX's IB md returned, placed right after a
 * kreg_memh_t that says where the original is. In a cached registration the
 * kreg_memh_t is the last member of the rcache region, so the copy lives in
 * the region; an uncached registration gets a heap block of the same shape.
 */
typedef struct kreg_memh {
    uct_mem_h inner;   /* UCX's handle, as its md's mem_reg returned it */
    uint32_t  flags;   /* KREG_MEMH_FLAG_* */
    uint32_t  size;    /* bytes of the copy that follows */
} kreg_memh_t;

enum {
    KREG_MEMH_FLAG_CACHED = 1u << 0, /* in an rcache region (else heap)    */
    KREG_MEMH_FLAG_ATOMIC = 1u << 1, /* registered or upgraded with remote
                                        atomic access */
    KREG_MEMH_FLAG_DONTFORK = 1u << 2 /* holds a reference of rdma-core's
                                         fork protection (md.c)        */
};

/* The copy handed out as uct_mem_h, and back. */
static inline uct_mem_h kreg_memh_ucx(kreg_memh_t *memh)
{
    return (uct_mem_h)(memh + 1);
}

static inline kreg_memh_t *kreg_memh_of(uct_mem_h ucx_memh)
{
    return (kreg_memh_t*)ucx_memh - 1;
}

/* An rcache region: what the event source needs for the exact check (the
 * watch, with its counter snapshot) and the registration. */
typedef struct kreg_region {
    ucs_rcache_region_t super;
    kreg_watch_t        watch;
    kreg_memh_t         memh;   /* last: UCX's memh copy follows */
} kreg_region_t;

_Static_assert(ucs_offsetof(kreg_region_t, memh) + sizeof(kreg_memh_t) ==
               sizeof(kreg_region_t),
               "the memh copy must follow the region without padding");

/* ---- the caching md ------------------------------------------------------
 *
 * The md UCT and UCP hold is UCX's IB md object itself, opened with UCX's
 * own cache off, with its ops table and component replaced by ours (the
 * version layer keeps its original ops and calls them for registration,
 * key packing and everything else). It has to be that object: UCX's
 * transports cast the md they are opened with to UCX's IB md, and
 * uct_iface_mem_alloc() gives the memory it registers to iface->md, which
 * callers use with the md they opened (ucx_perftest asserts they are one).
 */
typedef struct kreg_md {
    uct_md_h          ib_md;        /* UCX's IB md object (also ours)       */
    ucs_rcache_t      *rcache;      /* ours; NULL: registrations pass
                                       through to UCX's md (uncached)      */
    size_t            memh_size;    /* bytes of UCX's memh                  */
    uint64_t          cap_flags;    /* UCX's md's UCT_MD_FLAG_*             */
    ucs_linear_func_t reg_cost;     /* what our md_attr reports             */
    int               kreg_started; /* holds a kreg_start() to pair         */
    char              name[UCT_MD_NAME_MAX];
    /* counters, for the close log and tests */
    uint64_t          regions;      /* registrations made for the cache     */
    uint64_t          uncached;     /* registrations made without it        */
} kreg_md_t;

/* What open.c needs of the component's md configuration, read by the
 * version layer from UCX's IB md config it embeds. */
typedef struct kreg_md_open_config {
    const void *ucx;             /* the layer's config, for kreg_ucx_*      */
    int        require_kernel;   /* UCX_IB_REGCACHE_REQUIRE_KERNEL          */
    int        want_cache;       /* the configuration asks for a cache (1.13:
                                    "rcache" in UCX_IB_REG_METHODS and no
                                    implicit ODP before it; 1.16+: always)  */
    const char *reg_methods;     /* for the log: 1.13's REG_METHODS, or ""  */
    double     rcache_overhead;  /* UCX's RCACHE_OVERHEAD, seconds          */
} kreg_md_open_config_t;

/* open.c: fills md (zeroed by the version layer, which then takes over the
 * IB md's ops) or returns an error with nothing held. kreg_md_close undoes
 * it, UCX's IB md included. */
ucs_status_t kreg_md_open(kreg_md_t *md, const char *md_name,
                          const kreg_md_open_config_t *config);
void kreg_md_close(kreg_md_t *md);

/* md.c: the md operations the version layer forwards to. */
ucs_status_t kreg_md_mem_reg(kreg_md_t *md, void *address, size_t length,
                             unsigned flags, uct_mem_h *memh_p);
/* invalidate_comp: NULL, or the completion of UCT_MD_MEM_DEREG_FLAG_INVALIDATE */
ucs_status_t kreg_md_mem_dereg(kreg_md_t *md, uct_mem_h memh,
                               uct_completion_t *invalidate_comp);
/* After a call of UCX's md that may change the original handle (mkey_pack
 * creates atomic and indirect keys on demand): bring the copy up to date. */
void kreg_md_memh_sync(kreg_md_t *md, kreg_memh_t *memh);
/* The rcache's callbacks (through the layer's rcache ops). */
ucs_status_t kreg_md_region_register(kreg_md_t *md, kreg_region_t *region,
                                     unsigned uct_flags, int silent);
void kreg_md_region_deregister(kreg_md_t *md, kreg_region_t *region);
void kreg_md_region_dump(kreg_md_t *md, kreg_region_t *region, char *buf,
                         size_t max);

/* component.c: UCP's own registration cache (UCX_RCACHE_ENABLE) caches
 * memory handles above the md, its hits never reach our check (on the
 * notifier that reopens the cross-thread window the counter closes), and
 * it would keep handles registered uncached. It is turned off by default
 * before UCP reads its configuration (preloaded, 1.13-1.21: the
 * constructor; 1.22: the libucs_kreg module, see ucs_module.c); this
 * records what was found. */
typedef enum {
    KREG_UCP_RCACHE_DISABLED_BY_US = 0,
    KREG_UCP_RCACHE_DISABLED_BY_USER,
    KREG_UCP_RCACHE_ENABLED_BY_USER,
    /* loaded after UCP had read UCX_RCACHE_ENABLE unset (its default "try"):
     * UCX 1.22 loaded the component from its plugin path without
     * libucs_kreg beside it */
    KREG_UCP_RCACHE_ENABLED_TOO_LATE,
    /* left as configured: synchronous delivery tells UCP's cache of every
     * change in time (kreg_query: sync_delivery) */
    KREG_UCP_RCACHE_SERVED_BY_SYNC
} kreg_ucp_rcache_state_t;

extern kreg_ucp_rcache_state_t kreg_ucp_rcache_state;
extern char kreg_ucp_rcache_value[32];
/* kreg_ucp_rcache_state as it stands for UCP now (at md open) */
kreg_ucp_rcache_state_t kreg_ucp_rcache_get_state(void);

#ifdef __cplusplus
}
#endif

#endif
