/*
 * Calls into UCX's IB headers that declare their functions without C
 * linkage for C++ (ib_md.h, ib_device.h, uct_iface.h): md.cc reaches them
 * through these.
 */
#include "ib_regcache.h"

#include <uct/base/uct_component.h>
#include <uct/base/uct_iface.h>

#include <string.h>

const char *kreg_md_dev_name(uct_ib_md_t *md)
{
    return uct_ib_device_name(&md->dev);
}

ucs_status_t kreg_ib_md_open(const char *md_name, const uct_md_config_t *config,
                             uct_md_h *md_p)
{
    /* The exported open, not uct_ib_component.md_open (our stock hook). */
    return uct_ib_md_open(&uct_ib_component, md_name, config, md_p);
}

void kreg_invoke_completion(uct_completion_t *comp, ucs_status_t status)
{
    uct_invoke_completion(comp, status);
}

int kreg_component_loaded(const char *name)
{
    uct_component_t *component;

    ucs_list_for_each(component, &uct_components_list, list) {
        if (!strcmp(component->name, name)) {
            return 1;
        }
    }
    return 0;
}
