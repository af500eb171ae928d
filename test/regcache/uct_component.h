/*
 * Finds a UCT component by name and one of its md resources (the first, or
 * the one named `device`). Shared by the test programs in test/regcache.
 */
#ifndef KREG_TEST_UCT_COMPONENT_H
#define KREG_TEST_UCT_COMPONENT_H

#include <uct/api/uct.h>

#include <cstring>
#include <string>
#include <vector>

inline uct_component_h find_component(const char *name, std::string &md_name,
                                      const char *device)
{
    uct_component_h *components;
    unsigned count;

    if (uct_query_components(&components, &count) != UCS_OK) {
        return nullptr;
    }

    uct_component_h found = nullptr;
    for (unsigned i = 0; (i < count) && (found == nullptr); ++i) {
        uct_component_attr_t attr = {};
        attr.field_mask = UCT_COMPONENT_ATTR_FIELD_NAME |
                          UCT_COMPONENT_ATTR_FIELD_MD_RESOURCE_COUNT;
        if ((uct_component_query(components[i], &attr) != UCS_OK) ||
            strcmp(attr.name, name)) {
            continue;
        }

        std::vector<uct_md_resource_desc_t> res(attr.md_resource_count);
        attr.field_mask   = UCT_COMPONENT_ATTR_FIELD_MD_RESOURCES;
        attr.md_resources = res.data();
        if (uct_component_query(components[i], &attr) != UCS_OK) {
            continue;
        }
        for (auto &r : res) {
            if ((device == nullptr) || !strcmp(r.md_name, device)) {
                md_name = r.md_name;
                found   = components[i];
                break;
            }
        }
    }

    uct_release_component_list(components);
    return found;
}

#endif
