/*
 * UCX's stock "ib" md next to this library (the foreign rcache
 * hazard of doc/design.md).
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
 * The version layer (ucx_1_13.c) applies this in its hook on the IB
 * component's md_open. test/regcache/vm-suite checks it (regcache-foreign-rcache:
 * the stock md registers every send; ucp-data-foreign-rcache: no stale round).
 */
#include "ib_regcache.h"

#include <ucs/debug/log_def.h>

#include <stdio.h>

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
