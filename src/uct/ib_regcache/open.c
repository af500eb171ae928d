/*
 * The open policy of the ib_regcache md: what has to hold before it opens,
 * which registration methods UCX's IB md underneath gets, whether our cache
 * sits on top, and what the md reports as its registration cost.
 *
 * UCX's IB md takes a list of registration methods (UCX_IB_REG_METHODS,
 * default "rcache,odp,direct") and uses the first that works. Here our cache
 * takes the place of "rcache": UCX's md is opened with the list with
 * "rcache" replaced by "direct" (what UCX's own cache registers with), so a
 * user's "odp" before it still wins, and the cache is ours. Without the
 * kernel event source (and UCX_IB_REGCACHE_REQUIRE_KERNEL=n) UCX's md gets
 * the list as configured: its own cache fed by UCM's hooks, or what follows.
 */
#include "ib_regcache.h"
#include "ucx_layer.h"

#include <ucs/debug/log_def.h>

#include <stdio.h>
#include <string.h>

/* ---- registration method lists ------------------------------------------ */

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
    if (kreg_ucp_rcache_state == KREG_UCP_RCACHE_ENABLED_BY_USER) {
        ucs_error("ib_regcache: %s refused: UCX_RCACHE_ENABLE=%s enables "
                  "UCP's own registration cache, whose hits bypass the "
                  "kernel checks and which would cache registrations made "
                  "uncached; unset it or set it to 'n'", md_name,
                  kreg_ucp_rcache_value);
        return UCS_ERR_UNSUPPORTED;
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
    char methods[sizeof(config->reg_methods)];
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

    cache = md->kreg_started && kreg_methods_has(config->reg_methods, "rcache");
    if (cache) {
        kreg_methods_replace(config->reg_methods, "rcache", "direct", methods,
                             sizeof(methods));
    } else {
        snprintf(methods, sizeof(methods), "%s", config->reg_methods);
    }

    status = kreg_ucx_open_ib_md(md, config, methods);
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
                  "over UCX's IB md (REG_METHODS=%s), memh %zu bytes, "
                  "reg_cost %.0f ns", md_name, methods, md->memh_size,
                  md->reg_cost.c * 1e9);
    } else if (md->kreg_started) {
        ucs_debug("ib_regcache: %s: no registration cache (REG_METHODS=%s)",
                  md_name, methods);
    } else {
        ucs_diag("ib_regcache: %s: kernel event source unavailable (%s): "
                 "UCX's IB md as configured (REG_METHODS=%s: its own cache "
                 "with UCM's hooks, or none)", md_name, ucs_status_string(kst),
                 methods);
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
