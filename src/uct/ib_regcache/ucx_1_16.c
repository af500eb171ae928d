/*
 * The version layer for UCX 1.16 to 1.22 (built and tested with 1.16.0,
 * 1.17.0, 1.18.1, 1.19.1, 1.20.1, 1.21.0 and 1.22.0): everything of
 * ib_regcache that depends on UCX's version and is not done the same way
 * for 1.13 (ucx_common.c), in one file, like ucx_1_13.c. Only the version
 * layer is compiled with UCX's config.h and private headers (Makefile.inc);
 * it calls nothing above it but the kreg_md_ops_t handed to
 * kreg_ucx_register.
 *
 * What changed since 1.13-1.15, and how it is met here:
 *  - the IB md has no cache and no REG_METHODS (1.16): our cache always
 *    sits on it when the kernel source runs, and UCX's md registers
 *    directly; there is no stock-md hook to install. The foreign cache is
 *    UCP's own (one rcache per context, over every md that needs a memory
 *    handle, whatever the md's cache_mem_types says): it must be off
 *    (kreg_ucp_rcache_state_t, ucs_module.c);
 *  - memory handles have no fixed size (1 or 2 MRs) and the verbs type is
 *    private to ib_md.c: the handle UCT hands out is our copy of UCX's
 *    uct_ib_mem_t (lkey, rkey, flags), which is all the verbs transports
 *    read (uct_ib_memh_get_lkey); mkey_pack and mem_advise get the original;
 *  - md ops: mem_reg takes uct_md_mem_reg_params_t, query fills
 *    uct_md_attr_v2_t, mkey_pack takes the address and length, mem_attach
 *    and mem_elem_pack take handles of their own (refused here);
 *  - the component: rkey_unpack takes params, rkey_compare is called
 *    unconditionally (NULL would crash), uct_ib_md_open is static (the
 *    component's md_open is the way in);
 *  - rcache settings are UCS's table (UCX_RCACHE_*, as UCP's), read again
 *    under our prefix (UCX_IB_REGCACHE_RCACHE_*);
 *  - from 1.18 the mlx5 transports live in libuct_ib_mlx5.so.0, another
 *    module that UCX may load after this one: only rc_verbs and ud_verbs
 *    are re-exported (rc_kreg, ud_kreg), on 1.16 and 1.17 too (one list
 *    for the layer; rxe, the only device here, is not mlx5);
 *  - UCX 1.22 loads this library from UCX_PLUGIN_PATH or its module
 *    directory, after UCP read its options: UCS_MODULE_INIT below tells
 *    when (1.16-1.21 load no module of ours: it is preloaded).
 *
 * Within 1.16-1.22 (KREG_UCX_AT_LEAST, each #if names its change): the
 * rcache takes its alignment per lookup from 1.17 (before: params) and calls
 * a merge callback from 1.18; md_attr has gva_mem_types from 1.18;
 * mem_alloc takes a sys_dev and rkey_unpack params from 1.19; mem_elem_pack
 * is an md op from 1.21 (its element type renamed in 1.22).
 */
#include "ucx_common.h"

#include <ucp/api/ucp_version.h>
#include <ucm/api/ucm.h>
#include <ucs/config/parser.h>
#include <ucs/debug/log.h>
#include <ucs/sys/module.h>
#include <ucs/sys/string.h>
#include <ucs/sys/sys.h>
#include <ucs/time/time.h>
#include <ucs/vfs/base/vfs_obj.h>

#include <math.h>
#include <string.h>

_Static_assert(KREG_UCX_AT_LEAST(16) && !KREG_UCX_AT_LEAST(23),
               "ucx_1_16.c is written for UCX 1.16 to 1.22: another UCX "
               "needs its own version layer (configure picks it)");

/* UCP's own default, ucp_mm.h: an rcache lookup, when RCACHE_OVERHEAD=auto */
#define KREG_UCX_RCACHE_OVERHEAD_DEFAULT 50.0e-9

/* ---- md configuration ---------------------------------------------------- */

typedef struct kreg_md_config {
    uct_ib_md_config_t  ib;
    ucs_rcache_config_t rcache;
    /* Refuse to open the md when libucm_kernel cannot start. */
    int                 require_kernel;
} kreg_md_config_t;

/* The first entry embeds UCX's IB md table, known at run time only
 * (kreg_ucx_register_component fills it). Under "IB_" the IB options read
 * UCX_IB_<NAME> first (shared with the stock md, e.g. UCX_IB_GID_INDEX),
 * then UCX_IB_REGCACHE_<NAME> overrides them for this component only. The
 * rcache options are UCS's (UCX_RCACHE_*, as UCP's cache reads them). */
static ucs_config_field_t kreg_md_config_table[] = {
    {"IB_", "", NULL,
     ucs_offsetof(kreg_md_config_t, ib), UCS_CONFIG_TYPE_TABLE(NULL)},

    {"", "", NULL,
     ucs_offsetof(kreg_md_config_t, rcache),
     UCS_CONFIG_TYPE_TABLE(ucs_config_rcache_table)},

    {"REQUIRE_KERNEL", "n",
     "Refuse to open the memory domain when the kernel event source\n"
     "cannot start. If 'n', the memory domain runs as UCX's own IB md\n"
     "would: without a registration cache.",
     ucs_offsetof(kreg_md_config_t, require_kernel), UCS_CONFIG_TYPE_BOOL},

    {NULL}
};

/* UCX's own IB md_open (uct_ib_md_open is static since 1.17) */
static uct_component_md_open_func_t kreg_ucx_ib_md_open;

ucs_status_t kreg_ucx_open_ib_md(kreg_md_t *md,
                                 const kreg_md_open_config_t *config,
                                 int our_cache)
{
    const kreg_md_config_t *kc = config->ucx;
    ucs_status_t status;

    /* UCX 1.16+'s IB md registers directly whatever our_cache says */
    status = kreg_ucx_ib_md_open(&uct_ib_component, md->name, &kc->ib.super,
                                 &md->ib_md);
    if (status == UCS_OK) {
        kreg_ucx_of(md)->orig = md->ib_md->ops;
    }
    return status;
}

size_t kreg_ucx_memh_size(kreg_md_t *md)
{
    /* the part of UCX's handle the verbs transports read (its lkey); the
     * rest (the MRs, one or two) stays in the original */
    return sizeof(uct_ib_mem_t);
}

int kreg_ucx_uses_global_odp(kreg_md_t *md)
{
    return 0; /* no implicit ODP method since UCX 1.16 */
}

/* ---- the rcache ---------------------------------------------------------- */

/* UCS merges overlapping regions into one new registration of the union,
 * watched and registered anew. UCP's merge carries the old regions' access
 * flags; ours needs not: UCX's verbs md registers every region with the
 * device's full access, and a later hit that asks for remote atomics marks
 * the handle (kreg_md_mem_reg), as on UCX 1.13, whose rcache has no merge
 * callback. */
#if KREG_UCX_AT_LEAST(18)
static void kreg_ucx_rcache_merge(void *context, ucs_rcache_t *rcache,
                                  void *arg, ucs_rcache_region_t *region)
{
}
#endif

static ucs_rcache_ops_t kreg_ucx_rcache_ops = {
    .mem_reg     = kreg_ucx_rcache_mem_reg,
    .mem_dereg   = kreg_ucx_rcache_mem_dereg,
#if KREG_UCX_AT_LEAST(18) /* UCS calls merge without a NULL check */
    .merge       = kreg_ucx_rcache_merge,
#endif
    .dump_region = kreg_ucx_rcache_dump
};

ucs_status_t kreg_ucx_rcache_create(kreg_md_t *md,
                                    const kreg_md_open_config_t *config,
                                    ucs_rcache_t **rcache_p)
{
    const kreg_md_config_t *kc = config->ucx;
    ucs_rcache_params_t params;

    /* UCS's rcache settings (event priority, limits, purge on fork) */
    ucs_rcache_set_params(&params, &kc->rcache);
#if !KREG_UCX_AT_LEAST(17)
    /* 1.16: the alignment is the cache's, not the lookup's: whole pages,
     * as every watch covers (kreg_ucs_rcache_get passes it from 1.17) */
    params.alignment     = ucs_get_page_size();
    params.max_alignment = ucs_get_page_size();
#endif
    return kreg_ucx_rcache_create_with(md, &params, &kreg_ucx_rcache_ops,
                                       rcache_p);
}

/* ---- our md operations --------------------------------------------------- */

/* UCS's time option in seconds: "auto" is auto_val, "inf" infinite
 * (ucs_time_units_to_sec from 1.17; 1.16 has the same values without it) */
static double kreg_ucx_time_to_sec(ucs_time_t t, double auto_val)
{
#if KREG_UCX_AT_LEAST(17)
    return ucs_time_units_to_sec(t, auto_val);
#else
    if (t == UCS_TIME_AUTO) {
        return auto_val;
    } else if (t == UCS_TIME_INFINITY) {
        return INFINITY;
    }
    return ucs_time_to_sec(t);
#endif
}

static void kreg_ucx_set_md_ops(uct_md_ops_t *ops);

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
        .want_cache      = 1,
        .reg_methods     = "",
        .rcache_overhead = kreg_ucx_time_to_sec(
                config->rcache.overhead, KREG_UCX_RCACHE_OVERHEAD_DEFAULT)
    };

    return kreg_ucx_md_open_with(md_name, &open_config, kreg_ucx_set_md_ops,
                                 md_p);
}

static ucs_status_t kreg_ucx_mkey_pack(uct_md_h md, uct_mem_h memh,
                                       void *address, size_t length,
                                       const uct_md_mkey_pack_params_t *params,
                                       void *rkey_buffer)
{
    kreg_ucx_md_t *umd = kreg_ucx_md(md);
    kreg_memh_t *kmemh = kreg_memh_of(memh);
    ucs_status_t status;

    status = umd->orig->mkey_pack(md, kmemh->inner, address, length, params,
                                  rkey_buffer);
    kreg_md_ops->memh_sync(&umd->md, kmemh);
    return status;
}

static ucs_status_t kreg_ucx_mem_alloc(uct_md_h md, size_t *length_p,
                                       void **address_p,
                                       ucs_memory_type_t mem_type,
#if KREG_UCX_AT_LEAST(19)
                                       ucs_sys_device_t sys_dev,
#endif
                                       unsigned flags, const char *alloc_name,
                                       uct_mem_h *memh_p)
{
    return UCS_ERR_UNSUPPORTED;
}

static ucs_status_t kreg_ucx_mem_free(uct_md_h md, uct_mem_h memh)
{
    return UCS_ERR_UNSUPPORTED;
}

#if KREG_UCX_AT_LEAST(21)
#if KREG_UCX_AT_LEAST(22)
typedef uct_device_mem_elem_t kreg_ucx_mem_elem_t;
#else
typedef uct_device_mem_element_t kreg_ucx_mem_elem_t;
#endif
static ucs_status_t kreg_ucx_mem_elem_pack(uct_md_h md, uct_mem_h memh,
                                           uct_rkey_t rkey,
                                           kreg_ucx_mem_elem_t *mem_elem_p)
{
    return UCS_ERR_UNSUPPORTED;
}
#endif

/* UCX's ops of each md, and ours where the cache is and where a call takes
 * a memory handle */
static void kreg_ucx_set_md_ops(uct_md_ops_t *ops)
{
    ops->close         = kreg_ucx_md_close;
    ops->query         = kreg_ucx_md_query;
    ops->mem_alloc     = kreg_ucx_mem_alloc;
    ops->mem_free      = kreg_ucx_mem_free;
    ops->mem_advise    = kreg_ucx_mem_advise;
    ops->mem_reg       = kreg_ucx_mem_reg;
    ops->mem_dereg     = kreg_ucx_mem_dereg;
    ops->mkey_pack     = kreg_ucx_mkey_pack;
    ops->mem_attach    = kreg_ucx_mem_attach;
#if KREG_UCX_AT_LEAST(21)
    ops->mem_elem_pack = kreg_ucx_mem_elem_pack;
#endif
}

/* ---- the component ------------------------------------------------------- */

#if KREG_UCX_AT_LEAST(19)
static ucs_status_t kreg_ucx_rkey_unpack(uct_component_t *component,
                                         const void *rkey_buffer,
                                         const uct_rkey_unpack_params_t *params,
                                         uct_rkey_t *rkey_p, void **handle_p)
{
    return uct_ib_component.rkey_unpack(&uct_ib_component, rkey_buffer,
                                        params, rkey_p, handle_p);
}
#else
static ucs_status_t kreg_ucx_rkey_unpack(uct_component_t *component,
                                         const void *rkey_buffer,
                                         uct_rkey_t *rkey_p, void **handle_p)
{
    return uct_ib_component.rkey_unpack(&uct_ib_component, rkey_buffer,
                                        rkey_p, handle_p);
}
#endif

static ucs_status_t
kreg_ucx_rkey_compare(uct_component_t *component, uct_rkey_t rkey1,
                      uct_rkey_t rkey2, const uct_rkey_compare_params_t *params,
                      int *result)
{
    return uct_ib_component.rkey_compare(&uct_ib_component, rkey1, rkey2,
                                         params, result);
}

uct_component_t kreg_component = {
    KREG_UCX_COMPONENT_COMMON(kreg_md_config_table, kreg_md_config_t),
    .md_open      = kreg_ucx_md_open,
    .rkey_unpack  = kreg_ucx_rkey_unpack,
    .rkey_compare = kreg_ucx_rkey_compare
};

/* ---- the transports and registration -------------------------------------- *
 * UCX's verbs transports (ucx_common.h); the mlx5 ones (another module of
 * UCX's since 1.18) are not re-exported. */
extern uct_tl_t uct_rc_verbs_tl;
extern uct_tl_t uct_ud_verbs_tl;

static kreg_ucx_tl_t kreg_ucx_tls[] = {
    KREG_UCX_TL(KREG_RC_TL_NAME, "RC_KREG_", &uct_rc_verbs_tl),
    KREG_UCX_TL(KREG_UD_TL_NAME, "UD_KREG_", &uct_ud_verbs_tl),
};

void kreg_ucx_register(const kreg_md_ops_t *ops)
{
    kreg_ucx_ib_md_open = uct_ib_component.md_open;
    kreg_ucx_register_component(ops, kreg_md_config_table, kreg_ucx_tls,
                                ucs_static_array_size(kreg_ucx_tls));
}

void kreg_ucx_unregister(void)
{
    kreg_ucx_unregister_component(kreg_ucx_tls,
                                  ucs_static_array_size(kreg_ucx_tls));
}

/* ---- loaded by UCX ------------------------------------------------------- */

#if KREG_UCX_AT_LEAST(22)
static int kreg_ucx_loaded_as_module;

/* UCX's module loader calls this after dlopen (ucs_module_init), and only
 * it: a preloaded or dlopen()ed library never gets here. When it does, UCP
 * has already read its options (the uct framework loads at the end of
 * ucp_config_read), so the constructor's UCX_RCACHE_ENABLE default was too
 * late for the configuration being read. */
UCS_MODULE_INIT()
{
    kreg_ucx_loaded_as_module = 1;
    return UCS_OK;
}

int kreg_ucx_loaded_after_ucp_config(void)
{
    return kreg_ucx_loaded_as_module;
}
#else
int kreg_ucx_loaded_after_ucp_config(void)
{
    return 0; /* UCX 1.16-1.21 load no module of ours: LD_PRELOAD or dlopen */
}
#endif
