/*
 * Inside the version layer: what ucx_common.c (the part every UCX version
 * line does the same way) and ucx_1_13.c (UCX 1.13-1.15) / ucx_1_16.c
 * (1.16-1.22) (what differs) share.
 * Compiled, like them, with the UCX version's own config.h and private
 * headers: the same code here builds against each version's structs.
 */
#ifndef UCX_KREG_UCX_COMMON_H
#define UCX_KREG_UCX_COMMON_H

#include "ucx_layer.h"

#include <ucp/api/ucp_version.h>
#include <uct/base/uct_iface.h>
#include <uct/base/uct_md.h>
#include <uct/ib/base/ib_md.h>

/* The UCX built against is 1.MINOR or later: a layer's #ifs within the
 * minors it covers (configure picks the layer by version). */
#define KREG_UCX_AT_LEAST(_minor) \
    (UCP_API_VERSION >= UCP_VERSION(1, _minor))

/* the md above the layer, handed to kreg_ucx_register */
extern const kreg_md_ops_t *kreg_md_ops;

/* The component; its initialiser is the version's (ucx_1_*.c). */
extern uct_component_t kreg_component;

/* ---- our md: UCX's IB md object with our ops ----------------------------- *
 * md->ops points to the ops table inside a kreg_ucx_md_t, so our state is
 * found from the md with ucs_container_of, no lookup. UCX's own ops stay in
 * orig: registration, key packing, queries and close are UCX's. */
typedef struct kreg_ucx_md {
    uct_md_ops_t       ops;
    const uct_md_ops_t *orig;
    kreg_md_t          md;
} kreg_ucx_md_t;

static inline kreg_ucx_md_t *kreg_ucx_of(kreg_md_t *md)
{
    return ucs_container_of(md, kreg_ucx_md_t, md);
}

static inline kreg_ucx_md_t *kreg_ucx_md(uct_md_h md)
{
    return ucs_container_of(md->ops, kreg_ucx_md_t, ops);
}

/* Opens our md: a kreg_ucx_md_t, the md above opened on it (which opens
 * UCX's IB md through kreg_ucx_open_ib_md), UCX's ops copied and set_ops
 * putting ours in their place (the cache, and every call that takes a
 * memory handle), and the md made ours (UCX's open sets the ib component,
 * and UCP would count it as one of ib's). */
ucs_status_t kreg_ucx_md_open_with(const char *md_name,
                                   const kreg_md_open_config_t *open_config,
                                   void (*set_ops)(uct_md_ops_t *ops),
                                   uct_md_h *md_p);

/* md operations that are the same on every version */
void kreg_ucx_md_close(uct_md_h md);
#if KREG_UCX_AT_LEAST(14)
/* ... and on every version from 1.14, whose md ops take params structs and
 * fill uct_md_attr_v2_t (1.13's are in ucx_1_13.c) */
ucs_status_t kreg_ucx_md_query(uct_md_h md, uct_md_attr_v2_t *md_attr);
ucs_status_t kreg_ucx_mem_reg(uct_md_h md, void *address, size_t length,
                              const uct_md_mem_reg_params_t *params,
                              uct_mem_h *memh_p);
ucs_status_t kreg_ucx_mem_attach(uct_md_h md, const void *mkey_buffer,
                                 uct_md_mem_attach_params_t *params,
                                 uct_mem_h *memh_p);
#endif
ucs_status_t kreg_ucx_mem_dereg(uct_md_h md,
                                const uct_md_mem_dereg_params_t *params);
ucs_status_t kreg_ucx_mem_advise(uct_md_h md, uct_mem_h memh, void *addr,
                                 size_t length, unsigned advice);

/* the rcache's callbacks, for the version's ucs_rcache_ops_t */
ucs_status_t kreg_ucx_rcache_mem_reg(void *context, ucs_rcache_t *rcache,
                                     void *arg, ucs_rcache_region_t *region,
                                     uint16_t flags);
void kreg_ucx_rcache_mem_dereg(void *context, ucs_rcache_t *rcache,
                               ucs_rcache_region_t *region);
void kreg_ucx_rcache_dump(void *context, ucs_rcache_t *rcache,
                          ucs_rcache_region_t *region, char *buf, size_t max);

/* Creates md's rcache from params with the version's settings (limits,
 * priority, alignment) in it: regions of kreg_region_t plus the memh copy,
 * invalidated by UCM_EVENT_VM_UNMAPPED (and MEM_TYPE_FREE where the IB md
 * registers more than host memory), ops with the callbacks above. */
ucs_status_t kreg_ucx_rcache_create_with(kreg_md_t *md,
                                         ucs_rcache_params_t *params,
                                         const ucs_rcache_ops_t *ops,
                                         ucs_rcache_t **rcache_p);

/* the component's operations that forward to UCX's IB component */
ucs_status_t kreg_ucx_query_md_resources(uct_component_t *component,
                                         uct_md_resource_desc_t **resources_p,
                                         unsigned *num_resources_p);
ucs_status_t kreg_ucx_rkey_ptr(uct_component_t *component, uct_rkey_t rkey,
                               void *handle, uint64_t raddr, void **laddr_p);
ucs_status_t kreg_ucx_rkey_release(uct_component_t *component,
                                   uct_rkey_t rkey, void *handle);
void kreg_ucx_md_vfs_init(uct_md_h md);

/* kreg_component's fields that every version fills the same way; the
 * version's initialiser adds md_open, rkey_unpack and whatever its
 * uct_component_t has more. */
#define KREG_UCX_COMPONENT_COMMON(_md_config_table, _md_config_type) \
    .name               = KREG_COMPONENT_NAME, \
    .query_md_resources = kreg_ucx_query_md_resources, \
    .cm_open            = (uct_component_cm_open_func_t) \
                              ucs_empty_function_return_unsupported, \
    .rkey_ptr           = kreg_ucx_rkey_ptr, \
    .rkey_release       = kreg_ucx_rkey_release, \
    .md_config          = { \
        .name           = "IB memory domain with kernel-watched registration cache", \
        .prefix         = KREG_MD_CONFIG_PREFIX, \
        .table          = _md_config_table, \
        .size           = sizeof(_md_config_type), \
    }, \
    .cm_config          = UCS_CONFIG_EMPTY_GLOBAL_LIST_ENTRY, \
    .tl_list            = UCT_COMPONENT_TL_LIST_INITIALIZER(&kreg_component), \
    .flags              = 0, \
    .md_vfs_init        = kreg_ucx_md_vfs_init

/* ---- the transports ------------------------------------------------------ *
 * UCX's transports under new names, unchanged: they are opened with our md,
 * which is UCX's IB md object. The configuration prefix is the name in
 * capitals; the option tables are UCX's own (so UCX_RC_*, UCX_IB_* apply as
 * to stock rc_verbs), read again under our prefix, never registered twice. */
typedef struct {
    uct_tl_t       tl;
    const uct_tl_t *orig;
} kreg_ucx_tl_t;

#define KREG_UCX_TL(_name, _prefix, _orig) \
    {.tl = {.name = _name, .config = {.name = _name " transport", \
                                      .prefix = _prefix}}, \
     .orig = _orig}

/* Registers kreg_component, whose md config table's first entry embeds
 * UCX's IB md table, and the transports; and the undo. */
void kreg_ucx_register_component(const kreg_md_ops_t *ops,
                                 ucs_config_field_t *md_config_table,
                                 kreg_ucx_tl_t *tls, size_t count);
void kreg_ucx_unregister_component(kreg_ucx_tl_t *tls, size_t count);

#endif
