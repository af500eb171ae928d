/*
 * The version layer for UCX 1.13 (built and tested with 1.13.1 only):
 * everything of ib_regcache that depends on UCX's version, in one file by
 * design, which is why it is longer than the others. It is the only file
 * compiled with UCX's config.h and private headers (Makefile.inc); the rest
 * sees it through ucx_layer.h and the md operations below.
 *
 * What depends on UCX 1.13 here, and what a port has to redo:
 *  - uct_component_t, uct_tl_t and uct_md_ops_t initialisers and signatures
 *    (uct/base/uct_component.h, uct_iface.h, uct_md.h);
 *  - the md configuration: UCX's IB md table embedded under "IB_"
 *    (uct_ib_md_config_t), REG_METHODS and the rcache settings read from it,
 *    and set in a clone for the md UCX opens (ucs_config_parser_*);
 *  - ucs_rcache_params_t and ucs_rcache_ops_t, uct_md_set_rcache_params();
 *  - casts to UCX's private structs: uct_md_t (its ops and component: our
 *    md is UCX's IB md object with both replaced, see kreg_md_t), uct_ib_md_t
 *    (memh_struct_size, global_odp, reg_mem_types), uct_ib_mem_t (flags,
 *    when a cached handle is asked for atomics);
 *  - the stock IB component's md_open, saved before our hook replaces it.
 * From UCX 1.16 on the IB md has no cache and no reg_key, uct_ib_mem_t is
 * {lkey, rkey, flags}, uct_ib_md_open is static from 1.17 (the component's
 * md_open stays) and UCP caches per md where md_attr.cache_mem_types says
 * so (this md must report 0 there). See README.md, "UCX versions".
 */
#include "ucx_layer.h"
#include "reg_methods.h"

#include <ucp/api/ucp_version.h>
#include <uct/base/uct_iface.h>
#include <uct/base/uct_md.h>
#include <uct/ib/base/ib_md.h>
#include <ucm/api/ucm.h>
#include <ucs/config/parser.h>
#include <ucs/debug/log.h>
#include <ucs/sys/string.h>
#include <ucs/sys/sys.h>
#include <ucs/vfs/base/vfs_obj.h>

#include <string.h>

_Static_assert((UCP_API_MAJOR == 1) && (UCP_API_MINOR == 13),
               "ucx_1_13.c is written for UCX 1.13 (built and tested with "
               "1.13.1): another UCX needs its own version layer");

/* ---- md configuration ---------------------------------------------------- */

typedef struct kreg_md_config {
    uct_ib_md_config_t ib;
    /* Refuse to open the md when libucm_kernel cannot start. */
    int                require_kernel;
} kreg_md_config_t;

/* The first entry embeds UCX's IB md table, known at run time only
 * (kreg_ucx_register fills it). Under "IB_" the IB options read
 * UCX_IB_<NAME> first (shared with the stock md, e.g. UCX_IB_GID_INDEX),
 * then UCX_IB_REGCACHE_<NAME> overrides them for this component only. */
static ucs_config_field_t kreg_md_config_table[] = {
    {"IB_", "", NULL,
     ucs_offsetof(kreg_md_config_t, ib), UCS_CONFIG_TYPE_TABLE(NULL)},

    {"REQUIRE_KERNEL", "n",
     "Refuse to open the memory domain when the kernel event source\n"
     "cannot start. If 'n', the memory domain runs as UCX's own IB md\n"
     "would: with UCM's hooks, or without a registration cache.",
     ucs_offsetof(kreg_md_config_t, require_kernel), UCS_CONFIG_TYPE_BOOL},

    {NULL}
};

/* UCX's own IB md_open, saved before kreg_ucx_register hooks it */
static uct_component_md_open_func_t kreg_ucx_ib_md_open;

/* the md above the layer (kreg_ucx_register) */
static const kreg_md_ops_t *kreg_md_ops;

/* UCX's IB md opened with a clone of config whose REG_METHODS is
 * reg_methods. uct_ib_md_open keeps no pointer into its config (1.13.1:
 * ib_md.c copies md_config->ext, parses device specs and the subnet prefix
 * into memory of its own; ib_mlx5dv_md.c reads devx flags), and UCP itself
 * releases an md's config right after opening it: the clone goes here. */
static ucs_status_t kreg_ucx_open_ib_md_with(const uct_ib_md_config_t *config,
                                             const char *md_name,
                                             const char *reg_methods,
                                             uct_md_h *md_p)
{
    ucs_config_field_t *table = uct_ib_component.md_config.table;
    uct_ib_md_config_t *clone;
    ucs_status_t status;

    clone = ucs_calloc(1, uct_ib_component.md_config.size, "ib md config");
    if (clone == NULL) {
        return UCS_ERR_NO_MEMORY;
    }

    status = ucs_config_parser_clone_opts(config, clone, table);
    if (status != UCS_OK) {
        goto out_free;
    }
    status = ucs_config_parser_set_value(clone, table, "REG_METHODS",
                                         reg_methods);
    if (status == UCS_OK) {
        status = kreg_ucx_ib_md_open(&uct_ib_component, md_name, &clone->super,
                                     md_p);
    }
    ucs_config_parser_release_opts(clone, table);
out_free:
    ucs_free(clone);
    return status;
}

static ucs_status_t kreg_ucx_reg_methods(const uct_ib_md_config_t *config,
                                         char *buf, size_t max)
{
    return ucs_config_parser_get_value((void*)config,
                                       uct_ib_component.md_config.table,
                                       "REG_METHODS", buf, max);
}

/* ---- our md: UCX's IB md object with our ops ----------------------------- *
 * md->ops points to the ops table inside a kreg_ucx_md_t, so our state is
 * found from the md with ucs_container_of, no lookup. UCX's own ops stay in
 * orig: registration, key packing, queries and close are UCX's. */
typedef struct kreg_ucx_md {
    uct_md_ops_t       ops;
    const uct_md_ops_t *orig;
    kreg_md_t          md;
} kreg_ucx_md_t;

static kreg_ucx_md_t *kreg_ucx_of(kreg_md_t *md)
{
    return ucs_container_of(md, kreg_ucx_md_t, md);
}

static kreg_ucx_md_t *kreg_ucx_md(uct_md_h md)
{
    return ucs_container_of(md->ops, kreg_ucx_md_t, ops);
}

ucs_status_t kreg_ucx_open_ib_md(kreg_md_t *md,
                                 const kreg_md_open_config_t *config,
                                 int our_cache)
{
    const kreg_md_config_t *kc = config->ucx;
    char methods[128];
    ucs_status_t status;

    /* our cache takes the place of UCX's "rcache" method: "direct" is what
     * UCX's own cache registers with */
    if (our_cache) {
        kreg_methods_replace(config->reg_methods, "rcache", "direct", methods,
                             sizeof(methods));
    } else {
        ucs_strncpy_zero(methods, config->reg_methods, sizeof(methods));
    }
    status = kreg_ucx_open_ib_md_with(&kc->ib, md->name, methods,
                                      &md->ib_md);
    if (status == UCS_OK) {
        kreg_ucx_of(md)->orig = md->ib_md->ops;
    }
    return status;
}

void kreg_ucx_close_ib_md(kreg_md_t *md)
{
    kreg_ucx_of(md)->orig->close(md->ib_md);
}

ucs_status_t kreg_ucx_ib_md_query(kreg_md_t *md, uct_md_attr_t *md_attr)
{
    return kreg_ucx_of(md)->orig->query(md->ib_md, md_attr);
}

ucs_status_t kreg_ucx_ib_mem_reg(kreg_md_t *md, void *address, size_t length,
                                 unsigned flags, uct_mem_h *memh_p)
{
    return kreg_ucx_of(md)->orig->mem_reg(md->ib_md, address, length, flags,
                                          memh_p);
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

size_t kreg_ucx_memh_size(kreg_md_t *md)
{
    return ucs_derived_of(md->ib_md, uct_ib_md_t)->memh_struct_size;
}

int kreg_ucx_uses_global_odp(kreg_md_t *md)
{
    return ucs_derived_of(md->ib_md, uct_ib_md_t)->global_odp != NULL;
}

void kreg_ucx_memh_want_atomic(uct_mem_h ucx_memh)
{
    /* as uct_ib_mem_rcache_reg does for a cached region (ib_md.c, 1.13.1) */
    ((uct_ib_mem_t*)ucx_memh)->flags |= UCT_IB_MEM_ACCESS_REMOTE_ATOMIC;
}

void kreg_ucx_invalidate_cb(void *uct_completion)
{
    uct_invoke_completion(uct_completion, UCS_OK);
}

/* ---- the rcache ---------------------------------------------------------- */

static ucs_status_t kreg_ucx_rcache_mem_reg(void *context, ucs_rcache_t *rcache,
                                            void *arg,
                                            ucs_rcache_region_t *region,
                                            uint16_t flags)
{
    /* arg: the uct flags of kreg_md_mem_reg's lookup */
    return kreg_md_ops->region_register(context,
                                        ucs_derived_of(region, kreg_region_t),
                                        *(const unsigned*)arg,
                                        flags & UCS_RCACHE_MEM_REG_HIDE_ERRORS);
}

static void kreg_ucx_rcache_mem_dereg(void *context, ucs_rcache_t *rcache,
                                      ucs_rcache_region_t *region)
{
    kreg_md_ops->region_deregister(context,
                                   ucs_derived_of(region, kreg_region_t));
}

static void kreg_ucx_rcache_dump(void *context, ucs_rcache_t *rcache,
                                 ucs_rcache_region_t *region, char *buf,
                                 size_t max)
{
    kreg_md_ops->region_dump(context, ucs_derived_of(region, kreg_region_t),
                             buf, max);
}

static ucs_rcache_ops_t kreg_ucx_rcache_ops = {
    .mem_reg     = kreg_ucx_rcache_mem_reg,
    .mem_dereg   = kreg_ucx_rcache_mem_dereg,
    .dump_region = kreg_ucx_rcache_dump
};

ucs_status_t kreg_ucx_rcache_create(kreg_md_t *md,
                                    const kreg_md_open_config_t *config,
                                    ucs_rcache_t **rcache_p)
{
    const kreg_md_config_t *kc = config->ucx;
    const uct_ib_md_t *ib_md   = ucs_derived_of(md->ib_md, uct_ib_md_t);
    ucs_rcache_params_t params;
    char name[64];

    /* UCX's IB rcache settings (alignment, event priority, limits, purge
     * on fork), as uct_ib_md_parse_reg_methods sets them */
    uct_md_set_rcache_params(&params, &kc->ib.rcache);
    params.region_struct_size = sizeof(kreg_region_t) + md->memh_size;
    params.max_alignment      = ucs_get_page_size();
    params.ucm_events         = UCM_EVENT_VM_UNMAPPED;
    if (ib_md->reg_mem_types & ~UCS_BIT(UCS_MEMORY_TYPE_HOST)) {
        params.ucm_events    |= UCM_EVENT_MEM_TYPE_FREE;
    }
    params.context            = md;
    params.ops                = &kreg_ucx_rcache_ops;

    ucs_snprintf_zero(name, sizeof(name), KREG_COMPONENT_NAME "_%s", md->name);
    return ucs_rcache_create(&params, name, NULL, rcache_p);
}

/* ---- our md operations --------------------------------------------------- */

static uct_md_ops_t kreg_ucx_md_ops;
uct_component_t kreg_component;

static ucs_status_t kreg_ucx_md_open(uct_component_t *component,
                                     const char *md_name,
                                     const uct_md_config_t *uct_config,
                                     uct_md_h *md_p)
{
    const kreg_md_config_t *config = ucs_container_of(uct_config,
                                                      kreg_md_config_t,
                                                      ib.super);
    kreg_md_open_config_t open_config = {
        .ucx             = config,
        .require_kernel  = config->require_kernel,
        .rcache_overhead = uct_md_rcache_overhead(&config->ib.rcache)
    };
    char reg_methods[128];
    kreg_ucx_md_t *umd;
    ucs_status_t status;
    uct_md_h md;

    status = kreg_ucx_reg_methods(&config->ib, reg_methods,
                                  sizeof(reg_methods));
    if (status != UCS_OK) {
        return status;
    }
    open_config.reg_methods = reg_methods;
    open_config.want_cache  = kreg_methods_has(reg_methods, "rcache");

    umd = ucs_calloc(1, sizeof(*umd), "ib_regcache md");
    if (umd == NULL) {
        return UCS_ERR_NO_MEMORY;
    }

    status = kreg_md_ops->open(&umd->md, md_name, &open_config);
    if (status != UCS_OK) {
        ucs_free(umd);
        return status;
    }

    /* UCX's ops, but ours where the cache is; and the md is ours (UCX's
     * open sets the ib component, and UCP would count it as one of ib's) */
    md                   = umd->md.ib_md;
    umd->ops             = *umd->orig;
    umd->ops.close       = kreg_ucx_md_ops.close;
    umd->ops.query       = kreg_ucx_md_ops.query;
    umd->ops.mem_reg     = kreg_ucx_md_ops.mem_reg;
    umd->ops.mem_dereg   = kreg_ucx_md_ops.mem_dereg;
    umd->ops.mem_advise  = kreg_ucx_md_ops.mem_advise;
    umd->ops.mkey_pack   = kreg_ucx_md_ops.mkey_pack;
    if (umd->ops.is_sockaddr_accessible == NULL) {
        /* UCX's direct-registration table has none (its rcache table has) */
        umd->ops.is_sockaddr_accessible = (uct_md_is_sockaddr_accessible_func_t)
                ucs_empty_function_return_zero_int;
    }
    md->ops              = &umd->ops;
    md->component        = &kreg_component;
    *md_p                = md;
    return UCS_OK;
}

static void kreg_ucx_md_close(uct_md_h md)
{
    kreg_ucx_md_t *umd = kreg_ucx_md(md);

    /* UCX's close (through orig) frees md; umd is ours */
    kreg_md_ops->close(&umd->md);
    ucs_free(umd);
}

static ucs_status_t kreg_ucx_md_query(uct_md_h md, uct_md_attr_t *md_attr)
{
    kreg_ucx_md_t *umd = kreg_ucx_md(md);
    ucs_status_t status;

    status = umd->orig->query(md, md_attr);
    if (status != UCS_OK) {
        return status;
    }
    md_attr->reg_cost            = umd->md.reg_cost;
    /* the IB md allocates nothing; if it did, its memh would not be ours */
    md_attr->cap.flags          &= ~UCT_MD_FLAG_ALLOC;
    md_attr->cap.alloc_mem_types = 0;
    return UCS_OK;
}

static ucs_status_t kreg_ucx_mem_reg(uct_md_h md, void *address,
                                     size_t length, unsigned flags,
                                     uct_mem_h *memh_p)
{
    return kreg_md_ops->mem_reg(&kreg_ucx_md(md)->md, address, length, flags,
                                memh_p);
}

static ucs_status_t kreg_ucx_mem_dereg(uct_md_h md,
                                       const uct_md_mem_dereg_params_t *params)
{
    kreg_md_t *kmd = &kreg_ucx_md(md)->md;

    UCT_MD_MEM_DEREG_CHECK_PARAMS(params,
                                  kmd->cap_flags & UCT_MD_FLAG_INVALIDATE);
    return kreg_md_ops->mem_dereg(kmd, params->memh,
                                  (UCT_MD_MEM_DEREG_FIELD_VALUE(params, flags,
                                                                FIELD_FLAGS, 0) &
                                   UCT_MD_MEM_DEREG_FLAG_INVALIDATE) ?
                                  params->comp : NULL);
}

/* UCX's operations on a memh get the original; whatever they change in it
 * (mkey_pack makes atomic and indirect keys on demand and records them in
 * the handle) is copied back to the handle UCP holds. */
static ucs_status_t kreg_ucx_mem_advise(uct_md_h md, uct_mem_h memh,
                                        void *addr, size_t length,
                                        unsigned advice)
{
    kreg_ucx_md_t *umd = kreg_ucx_md(md);
    kreg_memh_t *kmemh = kreg_memh_of(memh);
    ucs_status_t status;

    status = umd->orig->mem_advise(md, kmemh->inner, addr, length, advice);
    kreg_md_ops->memh_sync(&umd->md, kmemh);
    return status;
}

static ucs_status_t
kreg_ucx_mkey_pack(uct_md_h md, uct_mem_h memh,
                   const uct_md_mkey_pack_params_t *params, void *rkey_buffer)
{
    kreg_ucx_md_t *umd = kreg_ucx_md(md);
    kreg_memh_t *kmemh = kreg_memh_of(memh);
    ucs_status_t status;

    status = umd->orig->mkey_pack(md, kmemh->inner, params, rkey_buffer);
    kreg_md_ops->memh_sync(&umd->md, kmemh);
    return status;
}

/* the operations kreg_ucx_md_open puts in each md's table */
static uct_md_ops_t kreg_ucx_md_ops = {
    .close      = kreg_ucx_md_close,
    .query      = kreg_ucx_md_query,
    .mem_advise = kreg_ucx_mem_advise,
    .mem_reg    = kreg_ucx_mem_reg,
    .mem_dereg  = kreg_ucx_mem_dereg,
    .mkey_pack  = kreg_ucx_mkey_pack
};

/* ---- the component ------------------------------------------------------- */

static ucs_status_t
kreg_ucx_query_md_resources(uct_component_t *component,
                            uct_md_resource_desc_t **resources_p,
                            unsigned *num_resources_p)
{
    return uct_ib_component.query_md_resources(&uct_ib_component, resources_p,
                                               num_resources_p);
}

static ucs_status_t kreg_ucx_rkey_unpack(uct_component_t *component,
                                         const void *rkey_buffer,
                                         uct_rkey_t *rkey_p, void **handle_p)
{
    return uct_ib_component.rkey_unpack(&uct_ib_component, rkey_buffer,
                                        rkey_p, handle_p);
}

static ucs_status_t kreg_ucx_rkey_ptr(uct_component_t *component,
                                      uct_rkey_t rkey, void *handle,
                                      uint64_t raddr, void **laddr_p)
{
    return uct_ib_component.rkey_ptr(&uct_ib_component, rkey, handle, raddr,
                                     laddr_p);
}

static ucs_status_t kreg_ucx_rkey_release(uct_component_t *component,
                                          uct_rkey_t rkey, void *handle)
{
    return uct_ib_component.rkey_release(&uct_ib_component, rkey, handle);
}

/* UCX's IB md_vfs_init links the IB md's own rcache (it has none when
 * ours is there); ours is linked the same way. */
static void kreg_ucx_md_vfs_init(uct_md_h md)
{
    kreg_md_t *kmd = &kreg_ucx_md(md)->md;

    uct_ib_component.md_vfs_init(md);
    if (kmd->rcache != NULL) {
        ucs_vfs_obj_add_sym_link(md, kmd->rcache, "rcache");
    }
}

uct_component_t kreg_component = {
    .name               = KREG_COMPONENT_NAME,
    .query_md_resources = kreg_ucx_query_md_resources,
    .md_open            = kreg_ucx_md_open,
    .cm_open            = (uct_component_cm_open_func_t)
                              ucs_empty_function_return_unsupported,
    .rkey_unpack        = kreg_ucx_rkey_unpack,
    .rkey_ptr           = kreg_ucx_rkey_ptr,
    .rkey_release       = kreg_ucx_rkey_release,
    .md_config          = {
        .name           = "IB memory domain with kernel-watched registration cache",
        .prefix         = KREG_MD_CONFIG_PREFIX,
        .table          = kreg_md_config_table,
        .size           = sizeof(kreg_md_config_t),
    },
    .cm_config          = UCS_CONFIG_EMPTY_GLOBAL_LIST_ENTRY,
    .tl_list            = UCT_COMPONENT_TL_LIST_INITIALIZER(&kreg_component),
    .flags              = 0,
    .md_vfs_init        = kreg_ucx_md_vfs_init
};

/* ---- the transports ------------------------------------------------------ *
 * UCX's verbs and mlx5 transports under new names, unchanged: they are
 * opened with our md, which is UCX's IB md object. The configuration prefix
 * is the name in capitals; the option tables are UCX's own (so UCX_RC_*,
 * UCX_IB_* apply as to stock rc_verbs), read again under our prefix, never
 * registered twice. */
extern uct_tl_t uct_rc_verbs_tl;
extern uct_tl_t uct_ud_verbs_tl;
#if HAVE_TL_RC && HAVE_MLX5_DV
extern uct_tl_t uct_rc_mlx5_tl;
#endif
#if HAVE_TL_DC && HAVE_MLX5_DV
extern uct_tl_t uct_dc_mlx5_tl;
#endif
#if HAVE_TL_UD && HAVE_MLX5_HW_UD
extern uct_tl_t uct_ud_mlx5_tl;
#endif

typedef struct {
    uct_tl_t       tl;
    const uct_tl_t *orig;
} kreg_ucx_tl_t;

#define KREG_UCX_TL(_name, _prefix, _orig) \
    {.tl = {.name = _name, .config = {.name = _name " transport", \
                                      .prefix = _prefix}}, \
     .orig = _orig}

_Static_assert(sizeof(KREG_RC_MLX5_TL_NAME) <= UCT_TL_NAME_MAX,
               "transport names have at most UCT_TL_NAME_MAX - 1 characters");

static kreg_ucx_tl_t kreg_ucx_tls[] = {
    KREG_UCX_TL(KREG_RC_TL_NAME, "RC_KREG_", &uct_rc_verbs_tl),
    KREG_UCX_TL(KREG_UD_TL_NAME, "UD_KREG_", &uct_ud_verbs_tl),
#if HAVE_TL_RC && HAVE_MLX5_DV
    KREG_UCX_TL(KREG_RC_MLX5_TL_NAME, "RC_KREG_X_", &uct_rc_mlx5_tl),
#endif
#if HAVE_TL_DC && HAVE_MLX5_DV
    KREG_UCX_TL(KREG_DC_MLX5_TL_NAME, "DC_KREG_X_", &uct_dc_mlx5_tl),
#endif
#if HAVE_TL_UD && HAVE_MLX5_HW_UD
    KREG_UCX_TL(KREG_UD_MLX5_TL_NAME, "UD_KREG_X_", &uct_ud_mlx5_tl),
#endif
};

/* ---- the stock IB md (stock.c's policy) ---------------------------------- */

static ucs_status_t kreg_ucx_stock_md_open(uct_component_t *component,
                                           const char *md_name,
                                           const uct_md_config_t *uct_config,
                                           uct_md_h *md_p)
{
    const uct_ib_md_config_t *config = ucs_derived_of(uct_config,
                                                      uct_ib_md_config_t);
    char configured[128], methods[128];

    if (kreg_ucx_reg_methods(config, configured, sizeof(configured)) !=
        UCS_OK) {
        ucs_error("ib_regcache: cannot read REG_METHODS of stock ib md %s",
                  md_name);
        return UCS_ERR_INVALID_PARAM;
    }
    kreg_stock_reg_methods(md_name, configured, methods, sizeof(methods));
    if (!strcmp(methods, configured)) {
        return kreg_ucx_ib_md_open(component, md_name, uct_config, md_p);
    }
    return kreg_ucx_open_ib_md_with(config, md_name, methods, md_p);
}

/* ---- registration -------------------------------------------------------- */

void kreg_ucx_register(const kreg_md_ops_t *ops)
{
    uct_tl_t *tl;
    size_t i;

    kreg_md_ops = ops;
    kreg_md_config_table[0].parser.arg = uct_ib_component.md_config.table;
    uct_component_register(&kreg_component);
    for (i = 0; i < ucs_static_array_size(kreg_ucx_tls); ++i) {
        tl                = &kreg_ucx_tls[i].tl;
        tl->query_devices = kreg_ucx_tls[i].orig->query_devices;
        tl->iface_open    = kreg_ucx_tls[i].orig->iface_open;
        tl->config.table  = kreg_ucx_tls[i].orig->config.table;
        tl->config.size   = kreg_ucx_tls[i].orig->config.size;
        uct_tl_register(&kreg_component, tl);
    }

    kreg_ucx_ib_md_open      = uct_ib_component.md_open;
    uct_ib_component.md_open = kreg_ucx_stock_md_open;
    ucs_debug("ib_regcache: registered component '" KREG_COMPONENT_NAME
              "' with %zu transports (" KREG_RC_TL_NAME ", " KREG_UD_TL_NAME
              ", ...)", ucs_static_array_size(kreg_ucx_tls));
}

void kreg_ucx_unregister(void)
{
    size_t i;

    if (uct_ib_component.md_open == kreg_ucx_stock_md_open) {
        uct_ib_component.md_open = kreg_ucx_ib_md_open;
    }
    for (i = ucs_static_array_size(kreg_ucx_tls); i-- > 0;) {
        uct_tl_unregister(&kreg_ucx_tls[i].tl);
    }
    uct_component_unregister(&kreg_component);
}

int kreg_ucx_loaded_after_ucp_config(void)
{
    return 0; /* UCX 1.13 loads no external module: LD_PRELOAD or dlopen */
}
