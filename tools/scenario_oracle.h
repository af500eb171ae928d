/*
 * The oracle of the scenario table: cache a buffer holding OLD bytes in an
 * io_uring-backed rcache (uring_rcache.h: pinned pages, like a NIC's),
 * change the mapping, write NEW bytes at the same address, send it through
 * the cache again and judge what came out: "ok" (all NEW), "STALE" (OLD
 * bytes, all or some: the pinned pages of the old mapping) or "FAIL:mixed"
 * (anything else).
 */
#ifndef KREG_TOOLS_SCENARIO_ORACLE_H
#define KREG_TOOLS_SCENARIO_ORACLE_H

#include "uring_rcache.h"

#include <cstddef>
#include <functional>
#include <string>
#include <vector>

namespace kreg_tools {

constexpr unsigned char OLD = 0x11;
constexpr unsigned char NEW = 0x22;
constexpr size_t KiB = 1024, MiB = 1024 * KiB;

/* What a change step hands back: the range to look up, or why it can't. */
struct lookup {
    void *addr = nullptr;
    size_t len = 0;
    std::string skip;
};

lookup skip(const std::string &why);
/* [addr, len) filled with NEW, to be looked up */
lookup fresh(void *addr, size_t len);
/* mmap with a hint, no MAP_FIXED (a MAP_FIXED would tell UCM "unmap") */
lookup remap_at(void *addr, size_t len);

std::string errstr(const char *what);
/* throws std::runtime_error when mmap fails */
void *map_anon(size_t len, void *hint = nullptr, int extra = 0);

/* Verdict from the bytes the "NIC" saw. */
std::string judge(const std::vector<unsigned char> &got);

struct ctx {
    uring_rcache &rc;
    bool other; /* the change runs in another thread */
};

/* Run the change in this thread or another one, then look up here. */
lookup run_change(ctx &c, const std::function<lookup()> &change);
/* Caches [addr, len) holding OLD bytes; "" or a verdict that ends the case. */
std::string first_transfer(ctx &c, void *addr, size_t len);
/* Cache [addr,len), change, look up what the change returned. */
std::string cached_change(ctx &c, void *addr, size_t len,
                          const std::function<lookup()> &change);

} // namespace kreg_tools

#endif
