/* The page size, read once: the one place libucm_kernel asks for it
 * (UCS's ucs_get_page_size is not in UCX's public headers). */
#ifndef UCX_KREG_PAGE_H
#define UCX_KREG_PAGE_H

#include <cstddef>
#include <unistd.h>

namespace kreg {

inline size_t page_size()
{
    static const size_t size = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    return size;
}

} // namespace kreg

#endif
