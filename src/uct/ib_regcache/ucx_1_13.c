/*
 * The version layer for UCX 1.13 to 1.15 (built and tested with 1.13.1,
 * 1.14.1 and 1.15.0): what of ib_regcache depends on those UCX versions,
 * whose IB md keeps its own cache, and is not done the same way for
 * 1.16-1.22 (ucx_common.c holds that part). Only the version layer is
 * compiled with UCX's config.h and private headers (Makefile.inc); the rest
 * sees it through ucx_layer.h.
 *
 * What depends on UCX 1.13 here:
 *  - uct_component_t and uct_md_ops_t signatures (mem_reg with flags,
 *    query with uct_md_attr_t, mkey_pack without the address, rkey_unpack
 *    without params);
 *  - the md configuration: UCX's IB md table embedded under "IB_"
 *    (uct_ib_md_config_t), REG_METHODS and the rcache settings read from it,
 *    and set in a clone for the md UCX opens (ucs_config_parser_*);
 *  - ucs_rcache_params_t's alignment, uct_md_set_rcache_params();
 *  - uct_ib_md_t's memh_struct_size and global_odp;
 *  - the stock IB component's md_open, saved before our hook replaces it
 *    (the stock md's own cache, reg_methods.c).
 * Within 1.13-1.15 (KREG_UCX_AT_LEAST): 1.14's md ops take params structs
 * (mem_reg), fill uct_md_attr_v2_t (query) and have mem_attach; 1.15 drops
 * the implicit ODP method (global_odp) and adds reg_nonblock_mem_types.
 * ucx_1_16.c says what changed by 1.16.
 */
#include "ucx_common.h"
#include "reg_methods.h"

#include <ucp/api/ucp_version.h>
#include <ucm/api/ucm.h>
#include <ucs/config/parser.h>
#include <ucs/debug/log.h>
#include <ucs/sys/string.h>
#include <ucs/sys/sys.h>
#include <ucs/vfs/base/vfs_obj.h>

#include <pthread.h>
#include <string.h>

_Static_assert(KREG_UCX_AT_LEAST(13) && !KREG_UCX_AT_LEAST(16),
               "ucx_1_13.c is written for UCX 1.13 to 1.15: another UCX "
               "needs its own version layer (configure picks it)");

/* ---- md configuration ---------------------------------------------------- */

typedef struct kreg_md_config {
    uct_ib_md_config_t ib;
    /* Refuse to open the md when libucm_kernel cannot start. */
    int                require_kernel;
} kreg_md_config_t;

/* The first entry embeds UCX's IB md table, known at run time only
 * (kreg_ucx_register_component fills it). Under "IB_" the IB options read
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

/*
 * Hazard "DONTFORK split after the watch" (md.c), at its source: UCX 1.13's
 * IB md calls ibv_fork_init() unless FORK_INIT=n, and rdma-core 44 then
 * marks every registered range MADV_DONTFORK and unmarks it at dereg, even
 * where the kernel copies pinned pages at fork and rdma-core itself says
 * fork protection is unneeded. Each mark splits a VMA, each unmark merges
 * it again, and either, inside a 2 MiB block the VMA covers, invalidates
 * every watch in that block (__split_huge_pmd): neighbouring cached
 * registrations invalidate each other in turn. UCX 1.22 skips
 * ibv_fork_init() there (openucx/ucx#11573); so does this layer, by
 * opening UCX's md with FORK_INIT=n. UCX 1.13 then warns at every fork()
 * that "data corruption might occur", which on such a kernel is false and
 * which 1.22 does not print: kreg_ucx_quiet_fork_warning() keeps exactly
 * that warning out of UCX's log.
 */
static int kreg_ucx_fork_init_needed(void)
{
    static int logged;

    if (ibv_is_fork_initialized() != IBV_FORK_UNNEEDED) {
        return 1;
    }
    if (!__atomic_exchange_n(&logged, 1, __ATOMIC_RELAXED)) {
        ucs_debug("ib_regcache: the kernel copies pinned pages at fork: "
                  "UCX's IB md opens with FORK_INIT=n, as UCX 1.22 does");
    }
    return 0;
}

/* UCX's two lines from its fork handler (ib_md.c, uct_ib_fork_warn) */
static ucs_log_func_rc_t
kreg_ucx_fork_warning_filter(const char *file, unsigned line,
                             const char *function, ucs_log_level_t level,
                             const ucs_log_component_config_t *comp_conf,
                             const char *message, va_list ap)
{
    return ((level == UCS_LOG_LEVEL_WARN) && (strstr(file, "ib_md.c") != NULL) &&
            !strncmp(message, "IB: ", 4)) ? UCS_LOG_FUNC_RC_STOP :
                                            UCS_LOG_FUNC_RC_CONTINUE;
}

static void kreg_ucx_fork_prepare(void)
{
    ucs_log_push_handler(kreg_ucx_fork_warning_filter);
}

static void kreg_ucx_fork_done(void)
{
    ucs_log_pop_handler();
}

/* After UCX's md opened with FORK_INIT=n: fork handlers of ours, registered
 * after UCX's (prepare handlers run in reverse order of registration, so
 * ours first), that hold a log filter for the time of UCX's warning. */
static void kreg_ucx_quiet_fork_warning(void)
{
    static int done;

    if (!__atomic_exchange_n(&done, 1, __ATOMIC_ACQ_REL) &&
        (pthread_atfork(kreg_ucx_fork_prepare, kreg_ucx_fork_done,
                        kreg_ucx_fork_done) != 0)) {
        ucs_debug("ib_regcache: pthread_atfork failed: UCX's fork warning "
                  "stays");
    }
}

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
    int quiet = 0;

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
    if ((status == UCS_OK) && !kreg_ucx_fork_init_needed()) {
        status = ucs_config_parser_set_value(clone, table, "FORK_INIT", "n");
        quiet   = 1;
    }
    if (status == UCS_OK) {
        status = kreg_ucx_ib_md_open(&uct_ib_component, md_name, &clone->super,
                                     md_p);
    }
    if ((status == UCS_OK) && quiet) {
        kreg_ucx_quiet_fork_warning();
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

#if !KREG_UCX_AT_LEAST(14) /* 1.14+: ucx_common.c */
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
#endif

size_t kreg_ucx_memh_size(kreg_md_t *md)
{
    return ucs_derived_of(md->ib_md, uct_ib_md_t)->memh_struct_size;
}

int kreg_ucx_uses_global_odp(kreg_md_t *md)
{
#if KREG_UCX_AT_LEAST(15)
    return 0; /* no implicit ODP method since UCX 1.15 */
#else
    return ucs_derived_of(md->ib_md, uct_ib_md_t)->global_odp != NULL;
#endif
}

/* ---- the rcache ---------------------------------------------------------- */

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
    ucs_rcache_params_t params;

    /* UCX's IB rcache settings (alignment, event priority, limits, purge
     * on fork), as uct_ib_md_parse_reg_methods sets them */
    uct_md_set_rcache_params(&params, &kc->ib.rcache);
    params.max_alignment = ucs_get_page_size();
    return kreg_ucx_rcache_create_with(md, &params, &kreg_ucx_rcache_ops,
                                       rcache_p);
}

/* ---- our md operations --------------------------------------------------- */

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
        .rcache_overhead = uct_md_rcache_overhead(&config->ib.rcache)
    };
    char reg_methods[128];
    ucs_status_t status;

    status = kreg_ucx_reg_methods(&config->ib, reg_methods,
                                  sizeof(reg_methods));
    if (status != UCS_OK) {
        return status;
    }
    open_config.reg_methods = reg_methods;
    open_config.want_cache  = kreg_methods_has(reg_methods, "rcache");
    return kreg_ucx_md_open_with(md_name, &open_config, kreg_ucx_set_md_ops,
                                 md_p);
}

#if !KREG_UCX_AT_LEAST(14) /* 1.14+: ucx_common.c */
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
#endif

/* mkey_pack makes atomic and indirect keys on demand and records them in
 * the original handle: copied back to the handle UCP holds */
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

/* UCX's ops of each md, and ours where the cache is and where a call takes
 * a memory handle */
static void kreg_ucx_set_md_ops(uct_md_ops_t *ops)
{
    ops->close      = kreg_ucx_md_close;
    ops->query      = kreg_ucx_md_query;
    ops->mem_advise = kreg_ucx_mem_advise;
    ops->mem_reg    = kreg_ucx_mem_reg;
    ops->mem_dereg  = kreg_ucx_mem_dereg;
    ops->mkey_pack  = kreg_ucx_mkey_pack;
#if KREG_UCX_AT_LEAST(14)
    ops->mem_attach = kreg_ucx_mem_attach;
#endif
    if (ops->is_sockaddr_accessible == NULL) {
        /* UCX's direct-registration table has none (its rcache table has) */
        ops->is_sockaddr_accessible = (uct_md_is_sockaddr_accessible_func_t)
                ucs_empty_function_return_zero_int;
    }
}

/* ---- the component ------------------------------------------------------- */

static ucs_status_t kreg_ucx_rkey_unpack(uct_component_t *component,
                                         const void *rkey_buffer,
                                         uct_rkey_t *rkey_p, void **handle_p)
{
    return uct_ib_component.rkey_unpack(&uct_ib_component, rkey_buffer,
                                        rkey_p, handle_p);
}

uct_component_t kreg_component = {
    KREG_UCX_COMPONENT_COMMON(kreg_md_config_table, kreg_md_config_t),
    .md_open      = kreg_ucx_md_open,
    .rkey_unpack  = kreg_ucx_rkey_unpack
};

/* ---- the transports -------------------------------------------------------
 * UCX's verbs and mlx5 transports (ucx_common.h). */
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

/* ---- the stock IB md (reg_methods.c's policy) ---------------------------------- */

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
    kreg_ucx_register_component(ops, kreg_md_config_table, kreg_ucx_tls,
                                ucs_static_array_size(kreg_ucx_tls));
    kreg_ucx_ib_md_open      = uct_ib_component.md_open;
    uct_ib_component.md_open = kreg_ucx_stock_md_open;
}

void kreg_ucx_unregister(void)
{
    if (uct_ib_component.md_open == kreg_ucx_stock_md_open) {
        uct_ib_component.md_open = kreg_ucx_ib_md_open;
    }
    kreg_ucx_unregister_component(kreg_ucx_tls,
                                  ucs_static_array_size(kreg_ucx_tls));
}

int kreg_ucx_loaded_after_ucp_config(void)
{
    return 0; /* UCX 1.13 loads no external module: LD_PRELOAD or dlopen */
}
