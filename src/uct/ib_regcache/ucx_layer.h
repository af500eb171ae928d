/*
 * The version layer's interface: what the rest of ib_regcache asks of UCX
 * beyond its public API, in types that do not change with UCX's version.
 * One implementation per UCX version line; this tree has ucx_1_13.c (the
 * only one built and tested here). It alone includes UCX's private headers
 * (compiled with UCX's config.h and source tree, see Makefile.inc).
 */
#ifndef UCX_KREG_UCX_LAYER_H
#define UCX_KREG_UCX_LAYER_H

#include "ib_regcache.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Registers the component and its transports with UCT and takes over the
 * stock IB component's md_open (stock.c's policy); the destructor's undo. */
void kreg_ucx_register(void);
void kreg_ucx_unregister(void);

/* Opens UCX's IB md for md_name into md->ib_md through the IB component's
 * own md_open (the one UCX built, not our hook), from the component's md
 * config (config->ucx) with REG_METHODS set to reg_methods. Until the
 * layer's md_open takes over its ops it is UCX's md as opened. */
ucs_status_t kreg_ucx_open_ib_md(kreg_md_t *md,
                                 const kreg_md_open_config_t *config,
                                 const char *reg_methods);
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
