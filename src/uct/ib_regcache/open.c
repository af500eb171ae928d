/*
 * The open policy of the ib_regcache md: what has to hold before it opens,
 * which registration methods UCX's IB md underneath gets, whether our cache
 * sits on top, and what the md reports as its registration cost.
 *
 * Our cache sits on UCX's IB md where the configuration asks for a cache
 * (config->want_cache) and the kernel event source runs; UCX's md then
 * registers directly (UCX 1.13: "rcache" in UCX_IB_REG_METHODS becomes
 * "direct", so a user's "odp" before it still wins; 1.16+ has no cache in
 * the IB md). Without the event source (and UCX_IB_REGCACHE_REQUIRE_KERNEL=n)
 * UCX's md is opened as configured: 1.13's own cache fed by UCM's hooks, or
 * no cache.
 */
#include "ib_regcache.h"
#include "ucx_layer.h"

#include <ucs/debug/log_def.h>

#include <stdio.h>
#include <string.h>

/* ---- checks before opening ----------------------------------------------- */

/* Whether a UCT component of that name is registered in this process. */
static int kreg_component_loaded(const char *name)
{
    uct_component_attr_t attr;
    uct_component_h *components;
    unsigned i, count;
    int found = 0;

    if (uct_query_components(&components, &count) != UCS_OK) {
        return 0;
    }
    for (i = 0; (i < count) && !found; ++i) {
        attr.field_mask = UCT_COMPONENT_ATTR_FIELD_NAME;
        found = (uct_component_query(components[i], &attr) == UCS_OK) &&
                !strcmp(attr.name, name);
    }
    uct_release_component_list(components);
    return found;
}

static ucs_status_t kreg_md_check_process(const char *md_name)
{
    switch (kreg_ucp_rcache_get_state()) {
    case KREG_UCP_RCACHE_ENABLED_BY_USER:
        ucs_error("ib_regcache: %s refused: UCX_RCACHE_ENABLE=%s enables "
                  "UCP's own registration cache, whose hits bypass the "
                  "kernel checks and which would cache registrations made "
                  "uncached; unset it or set it to 'n'", md_name,
                  kreg_ucp_rcache_value);
        return UCS_ERR_UNSUPPORTED;
    case KREG_UCP_RCACHE_ENABLED_TOO_LATE:
        ucs_error("ib_regcache: %s refused: UCX loaded this component after "
                  "UCP had read UCX_RCACHE_ENABLE (unset: UCP's own "
                  "registration cache is on, and its hits would bypass the "
                  "kernel checks); put libucs_kreg.so.0 beside "
                  "libuct_ib_regcache.so.0 on UCX_PLUGIN_PATH, or set "
                  "UCX_RCACHE_ENABLE=n", md_name);
        return UCS_ERR_UNSUPPORTED;
    default:
        break;
    }

    if (kreg_component_loaded("knem")) {
        ucs_error("ib_regcache: %s refused: the knem component keeps a "
                  "registration cache of its own that relies on the same "
                  "unmap events and is not watched", md_name);
        return UCS_ERR_UNSUPPORTED;
    }
    return UCS_OK;
}

/* What a lookup adds to UCX's RCACHE_OVERHEAD: the userfaultfd backend asks
 * the kernel at every lookup (one or two system calls, about a microsecond);
 * the notifier backend compares a counter (one load). */
static double kreg_lookup_cost(void)
{
    kreg_caps_t caps;

    kreg_query(&caps);
    return ((caps.backend == KREG_BACKEND_UFFD) &&
            (caps.mode == KREG_MODE_VERIFY)) ? 1e-6 : 0;
}

/* ---- open / close -------------------------------------------------------- */

ucs_status_t kreg_md_open(kreg_md_t *md, const char *md_name,
                          const kreg_md_open_config_t *config)
{
    uct_md_attr_t attr;
    ucs_status_t kst, status;
    int cache;

    snprintf(md->name, sizeof(md->name), "%s", md_name);
    status = kreg_md_check_process(md_name);
    if (status != UCS_OK) {
        return status;
    }

    /* Before any rcache exists: the unmap event is declared external, so
     * UCM installs no hooks for it. */
    kst = kreg_start();
    if (kst != UCS_OK) {
        kreg_stop();
        if (config->require_kernel) {
            ucs_error("ib_regcache: %s refused: the kernel event source "
                      "cannot start (%s) and UCX_" KREG_MD_CONFIG_PREFIX
                      "REQUIRE_KERNEL=y", md_name, ucs_status_string(kst));
            return UCS_ERR_UNSUPPORTED;
        }
    }
    md->kreg_started = (kst == UCS_OK);

    cache  = md->kreg_started && config->want_cache;
    status = kreg_ucx_open_ib_md(md, config, cache);
    if (status != UCS_OK) {
        goto err_stop;
    }

    status = kreg_ucx_ib_md_query(md, &attr);
    if (status != UCS_OK) {
        goto err_close;
    }
    md->cap_flags = attr.cap.flags;
    md->reg_cost  = attr.reg_cost;
    md->memh_size = kreg_ucx_memh_size(md);

    if (cache && kreg_ucx_uses_global_odp(md)) {
        ucs_debug("ib_regcache: %s: REG_METHODS=%s: implicit ODP comes before "
                  "the cache, nothing to cache", md_name, config->reg_methods);
        cache = 0;
    }

    if (cache) {
        status = kreg_ucx_rcache_create(md, config, &md->rcache);
        if (status != UCS_OK) {
            ucs_diag("ib_regcache: %s: failed to create the registration "
                     "cache (%s): registering without it", md_name,
                     ucs_status_string(status));
            md->rcache = NULL;
        } else {
            md->reg_cost = ucs_linear_func_make(config->rcache_overhead +
                                                kreg_lookup_cost(), 0);
        }
    }

    if (md->rcache != NULL) {
        ucs_debug("ib_regcache: %s: registration cache watched by the kernel "
                  "over UCX's IB md, memh %zu bytes, reg_cost %.0f ns",
                  md_name, md->memh_size, md->reg_cost.c * 1e9);
    } else if (md->kreg_started) {
        ucs_debug("ib_regcache: %s: no registration cache (REG_METHODS=%s)",
                  md_name, config->reg_methods);
    } else {
        ucs_diag("ib_regcache: %s: kernel event source unavailable (%s): "
                 "UCX's IB md as configured (REG_METHODS=%s: its own cache "
                 "with UCM's hooks on UCX 1.13, else none)", md_name,
                 ucs_status_string(kst), config->reg_methods);
    }
    return UCS_OK;

err_close:
    kreg_ucx_close_ib_md(md);
err_stop:
    if (md->kreg_started) {
        kreg_stop();
    }
    return status;
}

void kreg_md_close(kreg_md_t *md)
{
    ucs_debug("ib_regcache: closing md %s: %lu registrations for the cache, "
              "%lu uncached", md->name,
              (unsigned long)__atomic_load_n(&md->regions, __ATOMIC_RELAXED),
              (unsigned long)__atomic_load_n(&md->uncached, __ATOMIC_RELAXED));

    /* deregisters every region (UCX's mem_dereg, unwatch) */
    if (md->rcache != NULL) {
        ucs_rcache_destroy(md->rcache);
    }
    kreg_ucx_close_ib_md(md);
    if (md->kreg_started) {
        kreg_stop();
    }
}
