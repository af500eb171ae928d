/*
 * UCX 1.13's registration method lists (UCX_IB_REG_METHODS, default
 * "rcache,odp,direct": the IB md uses the first that works; UCX 1.16 dropped
 * them with the IB md's own cache), and the stock "ib" md next to this
 * library (the foreign rcache hazard of doc/design.md). Built for UCX
 * 1.13-1.15 only (ucx_1_13.c's layer), which applies both.
 *
 * The stock md:
 *
 * Once libucm_kernel declares UCM_EVENT_VM_UNMAPPED external, UCM installs
 * no hooks for a new rcache: the unmap events reach every rcache in the
 * process only for the ranges libucm_kernel watches, i.e. the ones our md
 * registered. A registration cache in UCX's stock IB md (created after the
 * declaration, or with UCM's hooks off as kreg-run sets them) would hear of
 * none of its own ranges and go stale. So while this library is loaded, the
 * stock IB md is opened without its cache: "rcache" is taken out of its
 * REG_METHODS (the next method in the list, "odp" or "direct", applies, as
 * when UCX cannot create its cache). Slower for a program that uses the
 * stock transport names next to ours, never stale.
 *
 * ucx_1_13.c applies this in its hook on the IB component's md_open.
 * test/regcache/vm-suite checks it (regcache-foreign-rcache: the stock md
 * registers every send; ucp-data-foreign-rcache: no stale round). On UCX
 * 1.22 the foreign cache is UCP's (see kreg_ucp_rcache_state_t).
 */
#include "reg_methods.h"

#include <ucs/debug/log_def.h>

#include <stdio.h>
#include <string.h>

int kreg_methods_has(const char *methods, const char *name)
{
    size_t len = strlen(name);
    const char *p;

    if (len == 0) {
        return 0;
    }
    for (p = methods; (p = strstr(p, name)) != NULL; p += len) {
        if (((p == methods) || (p[-1] == ',')) &&
            ((p[len] == '\0') || (p[len] == ','))) {
            return 1;
        }
    }
    return 0;
}

void kreg_methods_append(char *out, size_t max, const char *name)
{
    size_t used = strlen(out);

    if ((name[0] != '\0') && !kreg_methods_has(out, name)) {
        snprintf(out + used, max - used, "%s%s", used ? "," : "", name);
    }
}

int kreg_methods_replace(const char *methods, const char *drop,
                         const char *with, char *out, size_t max)
{
    const char *p = methods;
    int found     = 0;
    char name[64];
    size_t len;

    out[0] = '\0';
    while (*p != '\0') {
        len = strcspn(p, ",");
        snprintf(name, sizeof(name), "%.*s", (int)len, p);
        if (strcmp(name, drop)) {
            kreg_methods_append(out, max, name);
        } else {
            found = 1;
            if (with != NULL) {
                kreg_methods_append(out, max, with);
            }
        }
        p += len + (p[len] == ',');
    }
    return found;
}

/* ---- the stock IB md ------------------------------------------------------ */


void kreg_stock_reg_methods(const char *md_name, const char *configured,
                            char *out, size_t max)
{
    static int logged;

    if (!kreg_methods_replace(configured, "rcache", NULL, out, max)) {
        return; /* no cache asked for: nothing to change */
    }
    /* a list of only "rcache" (or "rcache,odp" without implicit ODP) would
     * leave the md no method that works */
    kreg_methods_append(out, max, "direct");

    if (!__atomic_exchange_n(&logged, 1, __ATOMIC_RELAXED)) {
        ucs_diag("ib_regcache: UCX's stock ib md %s opens without its "
                 "registration cache (REG_METHODS=%s instead of %s) while "
                 "libuct_ib_regcache is loaded: unmap events reach it only "
                 "for the ranges the kernel watches for ib_regcache, so its "
                 "cache could go stale; use rc_kreg/ud_kreg for a cached "
                 "and watched md", md_name, out, configured);
    } else {
        ucs_debug("ib_regcache: stock ib md %s: REG_METHODS=%s instead of %s",
                  md_name, out, configured);
    }
}
