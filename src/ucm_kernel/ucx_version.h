/* The UCX this library runs with must be the one it was built against. */
#ifndef UCX_KREG_UCX_VERSION_H
#define UCX_KREG_UCX_VERSION_H

#include <string>

namespace kreg {

/* false, with the two versions in *error, on a mismatch */
bool ucx_version_matches(std::string *error);

} // namespace kreg

#endif
