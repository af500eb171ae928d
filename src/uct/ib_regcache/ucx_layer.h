/*
 * The version layer's interface: what the rest of ib_regcache asks of UCX
 * beyond its public API, in types that do not change with UCX's version.
 * One implementation per UCX version line, chosen by configure from the UCX
 * built against: ucx_1_13.c (UCX 1.13-1.15; 1.13 is Debian 12's) and
 * ucx_1_16.c (UCX 1.16-1.22). It alone includes UCX's private headers
 * (compiled with UCX's config.h and source tree, see Makefile.inc), and it
 * calls nothing above it but the kreg_md_ops_t it is handed.
 */
#ifndef UCX_KREG_UCX_LAYER_H
#define UCX_KREG_UCX_LAYER_H

#include "ib_regcache.h"

#ifdef __cplusplus
extern "C" {
#endif

/* What the layer calls up into: the version-free md (open.c, md.c), handed
 * down at registration so that the layer depends on nothing above it. */
typedef struct kreg_md_ops {
    ucs_status_t (*open)(kreg_md_t *md, const char *md_name,
                         const kreg_md_open_config_t *config);
    void         (*close)(kreg_md_t *md);
    ucs_status_t (*mem_reg)(kreg_md_t *md, void *address, size_t length,
                            unsigned flags, uct_mem_h *memh_p);
    ucs_status_t (*mem_dereg)(kreg_md_t *md, uct_mem_h memh,
                              uct_completion_t *invalidate_comp);
    void         (*memh_sync)(kreg_md_t *md, kreg_memh_t *memh);
    ucs_status_t (*region_register)(kreg_md_t *md, kreg_region_t *region,
                                    unsigned uct_flags, int silent);
    void         (*region_deregister)(kreg_md_t *md, kreg_region_t *region);
    void         (*region_dump)(kreg_md_t *md, kreg_region_t *region,
                                char *buf, size_t max);
} kreg_md_ops_t;

/* Registers the component and its transports with UCT, with ops as the md
 * behind them (1.13: and takes over the stock IB component's md_open, the
 * foreign rcache hazard); the destructor's undo. */
void kreg_ucx_register(const kreg_md_ops_t *ops);
void kreg_ucx_unregister(void);

/* Where UCP's own registration cache stands for this process, as far as the
 * layer can tell (see kreg_ucp_rcache_state_t): on UCX 1.22 a library that
 * UCX loaded from its plugin path came after UCP read UCX_RCACHE_ENABLE. */
int kreg_ucx_loaded_after_ucp_config(void);

/* Opens UCX's IB md for md_name into md->ib_md through the IB component's
 * own md_open (the one UCX built, not a hook of ours), from the component's
 * md config (config->ucx). our_cache: our cache will sit on top, so UCX's
 * md registers directly (1.13: "rcache" in REG_METHODS becomes "direct");
 * else it is opened as configured. Until the layer's md_open takes over its
 * ops it is UCX's md as opened. */
ucs_status_t kreg_ucx_open_ib_md(kreg_md_t *md,
                                 const kreg_md_open_config_t *config,
                                 int our_cache);
/* UCX's md close (frees the IB md). */
void kreg_ucx_close_ib_md(kreg_md_t *md);

/* UCX's md operations on md->ib_md, whatever its ops table is now. */
ucs_status_t kreg_ucx_ib_md_query(kreg_md_t *md, uct_md_attr_t *md_attr);
ucs_status_t kreg_ucx_ib_mem_reg(kreg_md_t *md, void *address, size_t length,
                                 unsigned flags, uct_mem_h *memh_p);
/* with UCT_MD_MEM_DEREG_FLAG_INVALIDATE and its completion when
 * invalidate_comp is not NULL */
ucs_status_t kreg_ucx_ib_mem_dereg(kreg_md_t *md, uct_mem_h memh,
                                   uct_completion_t *invalidate_comp);

/* Facts about the IB md that UCX keeps in its private md struct. */
size_t kreg_ucx_memh_size(kreg_md_t *md);
/* Whether it registers through one implicit ODP key (UCX's "odp" method):
 * then nothing is pinned and there is nothing to cache. */
int kreg_ucx_uses_global_odp(kreg_md_t *md);

/* Creates md's rcache (ucs_rcache_create with UCX's IB rcache settings from
 * the config, regions of kreg_region_t plus the memh copy, invalidated by
 * UCM_EVENT_VM_UNMAPPED). */
ucs_status_t kreg_ucx_rcache_create(kreg_md_t *md,
                                    const kreg_md_open_config_t *config,
                                    ucs_rcache_t **rcache_p);

/* A cached handle that is now asked for remote atomic access: mark UCX's
 * original so that its mkey_pack makes the atomic key, as UCX's own cache
 * does for a region registered without it. */
void kreg_ucx_memh_want_atomic(uct_mem_h ucx_memh);

/* An ucs_rcache invalidation callback that completes a uct_completion_t. */
void kreg_ucx_invalidate_cb(void *uct_completion);

#ifdef __cplusplus
}
#endif

#endif
