/*
 * libucs_kreg.so.0: module "kreg" of UCX's framework "ucs", for UCX 1.22.
 *
 * UCX 1.22 loads libuct_ib_regcache.so.0 from UCX_PLUGIN_PATH (or its
 * module directory) only when UCP reads its options, after it has read
 * UCX_RCACHE_ENABLE: too late for the component to turn UCP's own
 * registration cache off (the foreign rcache hazard: UCP's cache would hit
 * without the kernel check, see kreg_ucp_rcache_state_t). The "ucs"
 * framework loads from the same directories at the end of libucs's
 * constructor, before anything can read UCP's options: this library sets
 * UCX_RCACHE_ENABLE=n there, unless the environment sets it (then the
 * component's md refuses a value that enables UCP's cache).
 *
 * Where the kreg_notifier module's synchronous delivery can run, it starts
 * libucm_kernel's source first (kreg_autostart): every change of registered
 * memory then reaches UCP's cache in time, so UCP's cache is left as
 * configured (a UCX_RCACHE_ENABLE of ucx.conf included) and stock
 * transports are exact too. Its dependencies: libucs, libucm_kernel.
 */
#include <ucm_kernel/ucm_kernel.h>

#include <ucs/debug/log_def.h>

#include <stdlib.h>

static void __attribute__((constructor)) kreg_ucs_module_ctor(void)
{
    if (kreg_autostart()) {
        ucs_debug("ib_regcache: libucs_kreg started synchronous delivery; "
                  "UCP's registration cache is left as configured");
        return;
    }
    if (getenv("UCX_RCACHE_ENABLE") != NULL) {
        return;
    }
    setenv("UCX_RCACHE_ENABLE", "n", 0);
    ucs_debug("ib_regcache: libucs_kreg set UCX_RCACHE_ENABLE=n: UCP's own "
              "registration cache would bypass the kernel checks of "
              "ib_regcache");
}
