#include "scenario_oracle.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <sys/mman.h>
#include <thread>
#include <unistd.h>

namespace kreg_tools {

lookup skip(const std::string &why)
{
    lookup l;
    l.skip = why;
    return l;
}

lookup fresh(void *addr, size_t len)
{
    memset(addr, NEW, len);
    lookup l;
    l.addr = addr;
    l.len  = len;
    return l;
}

std::string errstr(const char *what)
{
    return std::string(what) + ":" + strerror(errno);
}

void *map_anon(size_t len, void *hint, int extra)
{
    void *p = mmap(hint, len, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | extra, -1, 0);
    if (p == MAP_FAILED) {
        throw std::runtime_error(errstr("mmap"));
    }
    return p;
}

lookup remap_at(void *addr, size_t len)
{
    void *q = map_anon(len, addr);
    if (q != addr) {
        munmap(q, len);
        return skip("mmap hint not honoured");
    }
    return fresh(addr, len);
}

std::string judge(const std::vector<unsigned char> &got)
{
    size_t n_new = std::count(got.begin(), got.end(), NEW);
    size_t n_old = std::count(got.begin(), got.end(), OLD);
    if (n_new == got.size()) {
        return "ok";
    }
    /* old bytes where new ones were written, all or some (a range part of
     * which was replaced): stale either way */
    if ((n_old > 0) && (n_old + n_new == got.size())) {
        return "STALE";
    }
    return "FAIL:mixed(new=" + std::to_string(n_new) + ",old=" +
           std::to_string(n_old) + ",of=" + std::to_string(got.size()) + ")";
}

lookup run_change(ctx &c, const std::function<lookup()> &change)
{
    if (!c.other) {
        return change();
    }
    lookup l;
    std::string error;
    std::thread t([&] {
        try {
            l = change();
        } catch (const std::exception &e) {
            error = e.what();
        }
    });
    t.join();
    if (!error.empty()) {
        throw std::runtime_error(error);
    }
    return l;
}

std::string first_transfer(ctx &c, void *addr, size_t len)
{
    memset(addr, OLD, len);
    std::vector<unsigned char> got;
    try {
        got = c.rc.transfer(addr, len);
    } catch (const std::exception &e) {
        if (c.rc.last_reg_errno() != 0) {
            return std::string("skip:first registration refused (") +
                   strerror(c.rc.last_reg_errno()) + ")";
        }
        return std::string("FAIL:first transfer: ") + e.what();
    }
    if (judge(got) != "STALE") { /* all OLD is what we want here */
        return "FAIL:first transfer did not see the data";
    }
    c.rc.transfer(addr, len); /* now a hit: the entry is in use */
    return "";
}

std::string cached_change(ctx &c, void *addr, size_t len,
                          const std::function<lookup()> &change)
{
    std::string r = first_transfer(c, addr, len);
    if (!r.empty()) {
        return r;
    }
    lookup l = run_change(c, change);
    if (!l.skip.empty()) {
        return "skip:" + l.skip;
    }
    std::vector<unsigned char> got;
    try {
        got = c.rc.transfer(l.addr, l.len);
    } catch (const std::exception &e) {
        /* the oracle could not pin the new pages (Linux 6.1's io_uring
         * refuses SysV shm): nothing was sent, so nothing can be judged */
        if (c.rc.last_reg_errno() != 0) {
            return std::string("skip:registration after the change refused (") +
                   strerror(c.rc.last_reg_errno()) + ")";
        }
        throw;
    }
    return judge(got);
}

} // namespace kreg_tools
