/*
 * Load time of libuct_ib_regcache: the checks before the component is
 * registered (the running UCX is the one it was built against; UCP's own
 * registration cache is off), the registration itself (the version layer,
 * handed the md's operations) and the library's entry point for launchers.
 *
 * UCX 1.13 loads only the modules named at its build: this library is
 * loaded with LD_PRELOAD or dlopen before ucp_init (tools/kreg-run). UCX
 * 1.22 also loads it from UCX_PLUGIN_PATH or its module directory, as
 * module "regcache" of framework "uct_ib", after UCP has read its options.
 */
#include "ib_regcache.h"
#include "ucx_layer.h"
#include "kreg_config.h" /* KREG_UCX_BUILD_VERSION, the one UCX built against */

#include <ucp/api/ucp.h>
#include <ucs/debug/log_def.h>
#include <ucs/sys/string.h>

#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define KREG_EXPORT __attribute__((visibility("default")))

#ifndef KREG_UCX_BUILD_VERSION
#error "KREG_UCX_BUILD_VERSION must name the UCX version this is built against"
#endif

kreg_ucp_rcache_state_t kreg_ucp_rcache_state = KREG_UCP_RCACHE_DISABLED_BY_US;
char kreg_ucp_rcache_value[32];

static ucs_status_t kreg_init_status = UCS_ERR_NO_ELEM;
static int kreg_registered;

/* UCX_RCACHE_ENABLE is a ternary: n/no/off/0 disable it. */
static int kreg_value_is_off(const char *v)
{
    return !strcasecmp(v, "n") || !strcasecmp(v, "no") ||
           !strcasecmp(v, "off") || !strcmp(v, "0");
}

/* UCP's own cache (UCX_RCACHE_ENABLE, default "try") keeps memory handles
 * above the md: its hits never reach our lookup check. Must run before UCP
 * reads its configuration: in time when the library is preloaded or
 * dlopen()ed before ucp_init; too late when UCX 1.22 loads it as a plugin,
 * where libucs_kreg (ucs_module.c, loaded with libucs) has set it first. */
static int kreg_sync_delivery_runs(void)
{
    kreg_caps_t caps;

    kreg_query(&caps);
    return caps.sync_delivery;
}

static void kreg_check_ucp_rcache(void)
{
    const char *v = getenv("UCX_RCACHE_ENABLE");

    if (kreg_sync_delivery_runs()) {
        kreg_ucp_rcache_state = KREG_UCP_RCACHE_SERVED_BY_SYNC;
    } else if (v == NULL) {
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

kreg_ucp_rcache_state_t kreg_ucp_rcache_get_state(void)
{
    /* started since the constructor (UCX 1.22: libucs_kreg came first) */
    if (kreg_sync_delivery_runs()) {
        return KREG_UCP_RCACHE_SERVED_BY_SYNC;
    }
    /* the constructor's default came after UCP had read the variable */
    if ((kreg_ucp_rcache_state == KREG_UCP_RCACHE_DISABLED_BY_US) &&
        kreg_ucx_loaded_after_ucp_config()) {
        return KREG_UCP_RCACHE_ENABLED_TOO_LATE;
    }
    return kreg_ucp_rcache_state;
}

/* the md the version layer puts behind the component (open.c, md.c) */
static const kreg_md_ops_t kreg_md_ops_table = {
    .open              = kreg_md_open,
    .close             = kreg_md_close,
    .mem_reg           = kreg_md_mem_reg,
    .mem_dereg         = kreg_md_mem_dereg,
    .memh_sync         = kreg_md_memh_sync,
    .region_register   = kreg_md_region_register,
    .region_deregister = kreg_md_region_deregister,
    .region_dump       = kreg_md_region_dump
};

static void __attribute__((constructor)) kreg_ib_regcache_ctor(void)
{
    const char *running = ucp_get_version_string();

    if (strcmp(running, KREG_UCX_BUILD_VERSION) != 0) {
        ucs_error("ib_regcache: built against UCX " KREG_UCX_BUILD_VERSION
                  " (its internal headers and config.h), but UCX %s is loaded;"
                  " component '" KREG_COMPONENT_NAME "' not registered",
                  running);
        kreg_init_status = UCS_ERR_UNSUPPORTED;
        return;
    }

    kreg_check_ucp_rcache();
    kreg_ucx_register(&kreg_md_ops_table);
    kreg_registered  = 1;
    kreg_init_status = UCS_OK;
    ucs_debug("ib_regcache: registered component '" KREG_COMPONENT_NAME
              "' on UCX %s", running);
}

static void __attribute__((destructor)) kreg_ib_regcache_dtor(void)
{
    /* The library is linked with -z nodelete, so this runs at process exit
     * only; UCX never takes a component off its list. */
    if (kreg_registered) {
        kreg_ucx_unregister();
        kreg_registered = 0;
    }
}

/* Entry point for a launcher that dlopen()s the library before ucp_init():
 * UCS_OK if the component is registered, the reason otherwise. */
KREG_EXPORT ucs_status_t kreg_ib_regcache_status(void)
{
    return kreg_init_status;
}
