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
 * component's md refuses a value that enables UCP's cache). It does nothing
 * else; its only dependency is libucs.
 */
#include <ucs/debug/log_def.h>

#include <stdlib.h>

static void __attribute__((constructor)) kreg_ucs_module_ctor(void)
{
    if (getenv("UCX_RCACHE_ENABLE") != NULL) {
        return;
    }
    setenv("UCX_RCACHE_ENABLE", "n", 0);
    ucs_debug("ib_regcache: libucs_kreg set UCX_RCACHE_ENABLE=n: UCP's own "
              "registration cache would bypass the kernel checks of "
              "ib_regcache");
}
