/*
 * The part of the version layer that every UCX version line does the same
 * way (ucx_common.h), compiled against the version's own headers with
 * ucx_1_13.c or ucx_1_16.c, which hold what differs.
 */
#include "ucx_common.h"

#include <ucm/api/ucm.h>
#include <ucs/debug/log.h>
#include <ucs/sys/string.h>
#include <ucs/vfs/base/vfs_obj.h>

#include <string.h>

const kreg_md_ops_t *kreg_md_ops;

/* ---- UCX's IB md under ours ---------------------------------------------- */

void kreg_ucx_close_ib_md(kreg_md_t *md)
{
    kreg_ucx_of(md)->orig->close(md->ib_md);
}

ucs_status_t kreg_ucx_ib_mem_dereg(kreg_md_t *md, uct_mem_h memh,
                                   uct_completion_t *invalidate_comp)
{
    uct_md_mem_dereg_params_t params = {
        .field_mask = UCT_MD_MEM_DEREG_FIELD_MEMH,
        .memh       = memh
    };

    if (invalidate_comp != NULL) {
        params.field_mask |= UCT_MD_MEM_DEREG_FIELD_FLAGS |
                             UCT_MD_MEM_DEREG_FIELD_COMPLETION;
        params.flags       = UCT_MD_MEM_DEREG_FLAG_INVALIDATE;
        params.comp        = invalidate_comp;
    }
    return kreg_ucx_of(md)->orig->mem_dereg(md->ib_md, &params);
}

void kreg_ucx_memh_want_atomic(uct_mem_h ucx_memh)
{
    /* as UCX 1.13's cache did for a region registered without it, and 1.22's
     * uct_ib_memh_alloc does for a registration that asks for it */
    ((uct_ib_mem_t*)ucx_memh)->flags |= UCT_IB_MEM_ACCESS_REMOTE_ATOMIC;
}

void kreg_ucx_invalidate_cb(void *uct_completion)
{
    uct_invoke_completion(uct_completion, UCS_OK);
}

/* ---- the rcache's callbacks ---------------------------------------------- */

ucs_status_t kreg_ucx_rcache_mem_reg(void *context, ucs_rcache_t *rcache,
                                     void *arg, ucs_rcache_region_t *region,
                                     uint16_t flags)
{
    /* arg: the uct flags of kreg_md_mem_reg's lookup */
    return kreg_md_ops->region_register(context,
                                        ucs_derived_of(region, kreg_region_t),
                                        *(const unsigned*)arg,
                                        flags & UCS_RCACHE_MEM_REG_HIDE_ERRORS);
}

void kreg_ucx_rcache_mem_dereg(void *context, ucs_rcache_t *rcache,
                               ucs_rcache_region_t *region)
{
    kreg_md_ops->region_deregister(context,
                                   ucs_derived_of(region, kreg_region_t));
}

void kreg_ucx_rcache_dump(void *context, ucs_rcache_t *rcache,
                          ucs_rcache_region_t *region, char *buf, size_t max)
{
    kreg_md_ops->region_dump(context, ucs_derived_of(region, kreg_region_t),
                             buf, max);
}

ucs_status_t kreg_ucx_rcache_create_with(kreg_md_t *md,
                                         ucs_rcache_params_t *params,
                                         const ucs_rcache_ops_t *ops,
                                         ucs_rcache_t **rcache_p)
{
    const uct_ib_md_t *ib_md = ucs_derived_of(md->ib_md, uct_ib_md_t);
    char name[64];

    params->region_struct_size = sizeof(kreg_region_t) + md->memh_size;
    params->ucm_events         = UCM_EVENT_VM_UNMAPPED;
    if (ib_md->reg_mem_types & ~UCS_BIT(UCS_MEMORY_TYPE_HOST)) {
        params->ucm_events    |= UCM_EVENT_MEM_TYPE_FREE;
    }
    params->context            = md;
    params->ops                = ops;

    ucs_snprintf_zero(name, sizeof(name), KREG_COMPONENT_NAME "_%s", md->name);
    return ucs_rcache_create(params, name, NULL, rcache_p);
}

/* ---- our md -------------------------------------------------------------- */

ucs_status_t kreg_ucx_md_open_with(const char *md_name,
                                   const kreg_md_open_config_t *open_config,
                                   void (*set_ops)(uct_md_ops_t *ops),
                                   uct_md_h *md_p)
{
    kreg_ucx_md_t *umd;
    ucs_status_t status;
    uct_md_h md;

    umd = ucs_calloc(1, sizeof(*umd), "ib_regcache md");
    if (umd == NULL) {
        return UCS_ERR_NO_MEMORY;
    }

    status = kreg_md_ops->open(&umd->md, md_name, open_config);
    if (status != UCS_OK) {
        ucs_free(umd);
        return status;
    }

    umd->ops      = *umd->orig;
    set_ops(&umd->ops);
    md            = umd->md.ib_md;
    md->ops       = &umd->ops;
    md->component = &kreg_component;
    *md_p         = md;
    return UCS_OK;
}

void kreg_ucx_md_close(uct_md_h md)
{
    kreg_ucx_md_t *umd = kreg_ucx_md(md);

    /* UCX's close (through orig) frees md; umd is ours */
    kreg_md_ops->close(&umd->md);
    ucs_free(umd);
}

/* What makes an invalidating dereg valid: from 1.15 UCX's IB md accepts it
 * with invalidation of either RMA or atomics (ib_md.h's param check) */
#if KREG_UCX_AT_LEAST(15)
#define KREG_UCX_MD_FLAGS_INVALIDATE \
    (UCT_MD_FLAG_INVALIDATE | UCT_MD_FLAG_INVALIDATE_RMA | \
     UCT_MD_FLAG_INVALIDATE_AMO)
#else
#define KREG_UCX_MD_FLAGS_INVALIDATE UCT_MD_FLAG_INVALIDATE
#endif

ucs_status_t kreg_ucx_mem_dereg(uct_md_h md,
                                const uct_md_mem_dereg_params_t *params)
{
    kreg_md_t *kmd         = &kreg_ucx_md(md)->md;
    const uint64_t inv_cap = kmd->cap_flags & KREG_UCX_MD_FLAGS_INVALIDATE;

    UCT_MD_MEM_DEREG_CHECK_PARAMS(params, inv_cap);
    return kreg_md_ops->mem_dereg(kmd, params->memh,
                                  (UCT_MD_MEM_DEREG_FIELD_VALUE(params, flags,
                                                                FIELD_FLAGS, 0) &
                                   UCT_MD_MEM_DEREG_FLAG_INVALIDATE) ?
                                  params->comp : NULL);
}

#if KREG_UCX_AT_LEAST(14)
/* ---- md operations with UCX 1.14's signatures (1.14-1.22) ---------------- */

ucs_status_t kreg_ucx_ib_md_query(kreg_md_t *md, uct_md_attr_t *md_attr)
{
    uct_md_attr_v2_t attr = {};
    ucs_status_t status;

    status = kreg_ucx_of(md)->orig->query(md->ib_md, &attr);
    if (status != UCS_OK) {
        return status;
    }
    /* what open.c reads: the capabilities and the registration cost */
    memset(md_attr, 0, sizeof(*md_attr));
    md_attr->cap.flags = attr.flags;
    md_attr->reg_cost  = attr.reg_cost;
    return UCS_OK;
}

ucs_status_t kreg_ucx_ib_mem_reg(kreg_md_t *md, void *address, size_t length,
                                 unsigned flags, uct_mem_h *memh_p)
{
    uct_md_mem_reg_params_t params = {
        .field_mask = UCT_MD_MEM_REG_FIELD_FLAGS,
        .flags      = flags
    };

    return kreg_ucx_of(md)->orig->mem_reg(md->ib_md, address, length, &params,
                                          memh_p);
}

ucs_status_t kreg_ucx_md_query(uct_md_h md, uct_md_attr_v2_t *md_attr)
{
    kreg_ucx_md_t *umd = kreg_ucx_md(md);
    ucs_status_t status;

    status = umd->orig->query(md, md_attr);
    if (status != UCS_OK) {
        return status;
    }
    md_attr->reg_cost          = umd->md.reg_cost;
    /* Host memory only, registered through our cache: no allocation (its
     * memh would not be ours), no dmabuf or GVA registration (their handles
     * bypass the cache), no exported or imported keys (mem_attach). */
    md_attr->flags            &= ~(UCT_MD_FLAG_ALLOC | UCT_MD_FLAG_REG_DMABUF |
                                   UCT_MD_FLAG_EXPORTED_MKEY);
    md_attr->alloc_mem_types   = 0;
    md_attr->reg_mem_types    &= UCS_BIT(UCS_MEMORY_TYPE_HOST);
#if KREG_UCX_AT_LEAST(15)
    md_attr->reg_nonblock_mem_types &= UCS_BIT(UCS_MEMORY_TYPE_HOST);
#endif
    md_attr->dmabuf_mem_types  = 0;
#if KREG_UCX_AT_LEAST(18)
    md_attr->gva_mem_types     = 0;
#endif
    /* Nothing may cache above this md: UCP's cache would hit without our
     * check (the cross-thread window the counter closes). UCP 1.16+ does
     * not honour this for every path (one rcache for all mds), which is why
     * its cache is turned off altogether (kreg_ucp_rcache_state_t). */
    md_attr->cache_mem_types   = 0;
    return UCS_OK;
}

ucs_status_t kreg_ucx_mem_reg(uct_md_h md, void *address, size_t length,
                              const uct_md_mem_reg_params_t *params,
                              uct_mem_h *memh_p)
{
    return kreg_md_ops->mem_reg(&kreg_ucx_md(md)->md, address, length,
                                UCT_MD_MEM_REG_FIELD_VALUE(params, flags,
                                                           FIELD_FLAGS, 0),
                                memh_p);
}

ucs_status_t kreg_ucx_mem_attach(uct_md_h md, const void *mkey_buffer,
                                 uct_md_mem_attach_params_t *params,
                                 uct_mem_h *memh_p)
{
    return UCS_ERR_UNSUPPORTED;
}
#endif

/* UCX's operations on a memh get the original; whatever they change in it
 * is copied back to the handle UCP holds. */
ucs_status_t kreg_ucx_mem_advise(uct_md_h md, uct_mem_h memh, void *addr,
                                 size_t length, unsigned advice)
{
    kreg_ucx_md_t *umd = kreg_ucx_md(md);
    kreg_memh_t *kmemh = kreg_memh_of(memh);
    ucs_status_t status;

    status = umd->orig->mem_advise(md, kmemh->inner, addr, length, advice);
    kreg_md_ops->memh_sync(&umd->md, kmemh);
    return status;
}

/* ---- the component ------------------------------------------------------- */

ucs_status_t kreg_ucx_query_md_resources(uct_component_t *component,
                                         uct_md_resource_desc_t **resources_p,
                                         unsigned *num_resources_p)
{
    return uct_ib_component.query_md_resources(&uct_ib_component, resources_p,
                                               num_resources_p);
}

ucs_status_t kreg_ucx_rkey_ptr(uct_component_t *component, uct_rkey_t rkey,
                               void *handle, uint64_t raddr, void **laddr_p)
{
    return uct_ib_component.rkey_ptr(&uct_ib_component, rkey, handle, raddr,
                                     laddr_p);
}

ucs_status_t kreg_ucx_rkey_release(uct_component_t *component,
                                   uct_rkey_t rkey, void *handle)
{
    return uct_ib_component.rkey_release(&uct_ib_component, rkey, handle);
}

/* UCX's IB md_vfs_init, and our rcache linked as UCX links an md's own */
void kreg_ucx_md_vfs_init(uct_md_h md)
{
    kreg_md_t *kmd = &kreg_ucx_md(md)->md;

    uct_ib_component.md_vfs_init(md);
    if (kmd->rcache != NULL) {
        ucs_vfs_obj_add_sym_link(md, kmd->rcache, "rcache");
    }
}

/* ---- registration -------------------------------------------------------- */

void kreg_ucx_register_component(const kreg_md_ops_t *ops,
                                 ucs_config_field_t *md_config_table,
                                 kreg_ucx_tl_t *tls, size_t count)
{
    uct_tl_t *tl;
    size_t i;

    kreg_md_ops                   = ops;
    /* UCX's IB md table, known at run time only */
    md_config_table[0].parser.arg = uct_ib_component.md_config.table;
    uct_component_register(&kreg_component);
    for (i = 0; i < count; ++i) {
        tl                = &tls[i].tl;
        tl->query_devices = tls[i].orig->query_devices;
        tl->iface_open    = tls[i].orig->iface_open;
        tl->config.table  = tls[i].orig->config.table;
        tl->config.size   = tls[i].orig->config.size;
        uct_tl_register(&kreg_component, tl);
    }
    ucs_debug("ib_regcache: registered component '" KREG_COMPONENT_NAME
              "' with %zu transports (" KREG_RC_TL_NAME ", " KREG_UD_TL_NAME
              ", ...)", count);
}

void kreg_ucx_unregister_component(kreg_ucx_tl_t *tls, size_t count)
{
    size_t i;

    for (i = count; i-- > 0;) {
        uct_tl_unregister(&tls[i].tl);
    }
    uct_component_unregister(&kreg_component);
}
