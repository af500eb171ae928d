/*
 * The ib_regcache UCT component: its configuration table, its component
 * and transport definitions, and the load-time checks that register them.
 *
 * C, because UCX's component and configuration structures are initialized
 * the C way. The memory domain logic is in md.cc.
 */
#include "ib_regcache.h"

#include <ucp/api/ucp.h>
#include <ucs/config/parser.h>
#include <ucs/debug/log.h>
#include <ucs/sys/string.h>
#include <ucs/sys/stubs.h>

#include <stdlib.h>
#include <string.h>

#define KREG_EXPORT __attribute__((visibility("default")))

#ifndef KREG_UCX_BUILD_VERSION
#error "KREG_UCX_BUILD_VERSION must name the UCX version this is built against"
#endif

/* UCX's own transports, exported by libuct_ib. */
extern uct_tl_t uct_rc_verbs_tl;
extern uct_tl_t uct_ud_verbs_tl;
#if HAVE_TL_RC && HAVE_MLX5_DV
#define KREG_HAVE_RC_MLX5 1
extern uct_tl_t uct_rc_mlx5_tl;
#endif
#if HAVE_TL_DC && HAVE_MLX5_DV
#define KREG_HAVE_DC_MLX5 1
extern uct_tl_t uct_dc_mlx5_tl;
#endif
#if HAVE_TL_UD && HAVE_MLX5_HW_UD
#define KREG_HAVE_UD_MLX5 1
extern uct_tl_t uct_ud_mlx5_tl;
#endif

kreg_ucp_rcache_state_t kreg_ucp_rcache_state = KREG_UCP_RCACHE_DISABLED_BY_US;
char kreg_ucp_rcache_value[32];

/* The first entry embeds UCX's IB md table; its address is only known at
 * run time (uct_ib_component.md_config.table), so the constructor fills it.
 * Under "IB_" the IB options read UCX_IB_<NAME> first (shared with the stock
 * md, e.g. UCX_IB_GID_INDEX), then UCX_IB_REGCACHE_<NAME> overrides them for
 * this component only. */
static ucs_config_field_t kreg_md_config_table[] = {
    {"IB_", "", NULL,
     ucs_offsetof(kreg_md_config_t, ib), UCS_CONFIG_TYPE_TABLE(NULL)},

    {"REQUIRE_KERNEL", "n",
     "Refuse to open the memory domain when the kernel event source\n"
     "(userfaultfd) cannot start. If 'n', the memory domain runs as UCX's\n"
     "own IB md would: with UCM's hooks, or without a registration cache.",
     ucs_offsetof(kreg_md_config_t, require_kernel), UCS_CONFIG_TYPE_BOOL},

    {NULL}
};

static ucs_status_t
kreg_query_md_resources(uct_component_t *component,
                        uct_md_resource_desc_t **resources_p,
                        unsigned *num_resources_p)
{
    return uct_ib_component.query_md_resources(&uct_ib_component, resources_p,
                                               num_resources_p);
}

static ucs_status_t kreg_rkey_unpack(uct_component_t *component,
                                     const void *rkey_buffer,
                                     uct_rkey_t *rkey_p, void **handle_p)
{
    return uct_ib_component.rkey_unpack(&uct_ib_component, rkey_buffer,
                                        rkey_p, handle_p);
}

static ucs_status_t kreg_rkey_ptr(uct_component_t *component, uct_rkey_t rkey,
                                  void *handle, uint64_t raddr, void **laddr_p)
{
    return uct_ib_component.rkey_ptr(&uct_ib_component, rkey, handle, raddr,
                                     laddr_p);
}

static ucs_status_t kreg_rkey_release(uct_component_t *component,
                                      uct_rkey_t rkey, void *handle)
{
    return uct_ib_component.rkey_release(&uct_ib_component, rkey, handle);
}

static void kreg_md_vfs_init(uct_md_h md)
{
    if (uct_ib_component.md_vfs_init != NULL) {
        uct_ib_component.md_vfs_init(md);
    }
}

uct_component_t kreg_component = {
    .name               = KREG_COMPONENT_NAME,
    .query_md_resources = kreg_query_md_resources,
    .md_open            = kreg_md_open,
    .cm_open            = (uct_component_cm_open_func_t)
                              ucs_empty_function_return_unsupported,
    .rkey_unpack        = kreg_rkey_unpack,
    .rkey_ptr           = kreg_rkey_ptr,
    .rkey_release       = kreg_rkey_release,
    .md_config          = {
        .name           = "IB memory domain with kernel-watched registration cache",
        .prefix         = KREG_MD_CONFIG_PREFIX,
        .table          = kreg_md_config_table,
        .size           = sizeof(kreg_md_config_t),
    },
    .cm_config          = UCS_CONFIG_EMPTY_GLOBAL_LIST_ENTRY,
    .tl_list            = UCT_COMPONENT_TL_LIST_INITIALIZER(&kreg_component),
    .flags              = 0,
    .md_vfs_init        = kreg_md_vfs_init
};

/* UCX's verbs and mlx5 transports under new names; the configuration
 * prefix is the name in capitals (rc_kreg: RC_KREG_, rc_kreg_x: RC_KREG_X_).
 * The option tables are UCX's own (so UCX_RC_*, UCX_IB_* apply as to stock
 * rc_verbs), read a second time under our prefix, never registered twice. */
typedef struct {
    uct_tl_t       tl;
    const uct_tl_t *orig;
    const char     *config_name;
} kreg_tl_t;

#define KREG_TL(_name, _prefix, _orig) \
    {.tl = {.name = _name, .config = {.prefix = _prefix}}, .orig = _orig, \
     .config_name = _name " transport"}

_Static_assert(sizeof(KREG_RC_MLX5_TL_NAME) <= UCT_TL_NAME_MAX,
               "transport names have at most UCT_TL_NAME_MAX - 1 characters");

static kreg_tl_t kreg_tls[] = {
    KREG_TL(KREG_RC_TL_NAME, KREG_RC_CONFIG_PREFIX, &uct_rc_verbs_tl),
    KREG_TL(KREG_UD_TL_NAME, KREG_UD_CONFIG_PREFIX, &uct_ud_verbs_tl),
#ifdef KREG_HAVE_RC_MLX5
    KREG_TL(KREG_RC_MLX5_TL_NAME, "RC_KREG_X_", &uct_rc_mlx5_tl),
#endif
#ifdef KREG_HAVE_DC_MLX5
    KREG_TL(KREG_DC_MLX5_TL_NAME, "DC_KREG_X_", &uct_dc_mlx5_tl),
#endif
#ifdef KREG_HAVE_UD_MLX5
    KREG_TL(KREG_UD_MLX5_TL_NAME, "UD_KREG_X_", &uct_ud_mlx5_tl),
#endif
};

static void kreg_tl_init(kreg_tl_t *t)
{
    t->tl.query_devices = t->orig->query_devices;
    t->tl.iface_open    = t->orig->iface_open;
    t->tl.config.name   = t->config_name;
    t->tl.config.table  = t->orig->config.table;
    t->tl.config.size   = t->orig->config.size;
}

static ucs_status_t kreg_init_status = UCS_ERR_NO_ELEM;
static int kreg_registered;

/* UCX_RCACHE_ENABLE is a ternary: n/no/off/0 disable it. */
static int kreg_value_is_off(const char *v)
{
    return !strcasecmp(v, "n") || !strcasecmp(v, "no") ||
           !strcasecmp(v, "off") || !strcmp(v, "0");
}

static void kreg_check_ucp_rcache(void)
{
    const char *v = getenv("UCX_RCACHE_ENABLE");

    if (v == NULL) {
        /* Must run before ucp_init() reads its configuration: this library
         * is loaded by LD_PRELOAD or dlopen before ucp_init. */
        setenv("UCX_RCACHE_ENABLE", "n", 0);
        kreg_ucp_rcache_state = KREG_UCP_RCACHE_DISABLED_BY_US;
    } else if (kreg_value_is_off(v)) {
        kreg_ucp_rcache_state = KREG_UCP_RCACHE_DISABLED_BY_USER;
    } else {
        kreg_ucp_rcache_state = KREG_UCP_RCACHE_ENABLED_BY_USER;
    }
    ucs_strncpy_zero(kreg_ucp_rcache_value, v ? v : "n",
                     sizeof(kreg_ucp_rcache_value));
}

static void __attribute__((constructor)) kreg_ib_regcache_ctor(void)
{
    const char *running = ucp_get_version_string();
    size_t i;

    if (strcmp(running, KREG_UCX_BUILD_VERSION) != 0) {
        ucs_error("ib_regcache: built against UCX " KREG_UCX_BUILD_VERSION
                  " (its internal headers and config.h), but UCX %s is loaded;"
                  " component '" KREG_COMPONENT_NAME "' not registered",
                  running);
        kreg_init_status = UCS_ERR_UNSUPPORTED;
        return;
    }

    kreg_md_config_table[0].parser.arg = uct_ib_component.md_config.table;

    kreg_check_ucp_rcache();

    uct_component_register(&kreg_component);
    for (i = 0; i < ucs_static_array_size(kreg_tls); ++i) {
        kreg_tl_init(&kreg_tls[i]);
        uct_tl_register(&kreg_component, &kreg_tls[i].tl);
    }
    kreg_stock_ib_hook_install();
    kreg_registered  = 1;
    kreg_init_status = UCS_OK;
    ucs_debug("ib_regcache: registered component '" KREG_COMPONENT_NAME
              "' with %zu transports (" KREG_RC_TL_NAME ", " KREG_UD_TL_NAME
              ", ...) on UCX %s", ucs_static_array_size(kreg_tls), running);
}

static void __attribute__((destructor)) kreg_ib_regcache_dtor(void)
{
    size_t i;

    if (!kreg_registered) {
        return;
    }

    /* The library is linked with -z nodelete, so this runs at process exit
     * only; UCX 1.13 never takes a component off uct_components_list. */
    kreg_stock_ib_hook_remove();
    for (i = ucs_static_array_size(kreg_tls); i-- > 0;) {
        uct_tl_unregister(&kreg_tls[i].tl);
    }
    uct_component_unregister(&kreg_component);
    kreg_registered = 0;
}

/* Entry point for a launcher that dlopen()s the library before ucp_init():
 * UCS_OK if the component is registered, the reason otherwise. */
KREG_EXPORT ucs_status_t kreg_ib_regcache_status(void)
{
    return kreg_init_status;
}
