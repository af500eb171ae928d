#include "ucx_version.h"

#include "kreg_config.h"

#include <cstdio>
#include <cstring>
#include <dlfcn.h>

namespace kreg {

bool ucx_version_matches(std::string *error)
{
    /* libucm_kernel links only libucs and libucm, which export no version;
     * libucp does, and comes from the same UCX build. */
    void *ucp = dlopen("libucp.so.0", RTLD_LAZY | RTLD_NOLOAD);
    if (ucp == nullptr) {
        ucp = dlopen("libucp.so.0", RTLD_LAZY | RTLD_LOCAL);
    }
    using get_version_t = void (*)(unsigned *, unsigned *, unsigned *);
    auto get = ucp ? reinterpret_cast<get_version_t>(dlsym(ucp, "ucp_get_version")) :
                     nullptr;
    if (get == nullptr) {
        *error = "cannot find ucp_get_version() to check the UCX version";
        return false;
    }
    unsigned major = 0, minor = 0, release = 0;
    get(&major, &minor, &release);
    char running[64];
    snprintf(running, sizeof(running), "%u.%u.%u", major, minor, release);
    if (strcmp(running, KREG_UCX_BUILD_VERSION) != 0) {
        *error = std::string("built for UCX " KREG_UCX_BUILD_VERSION
                             ", running with ") + running;
        return false;
    }
    return true;
}

} // namespace kreg
