/* Helpers shared by the libucm_kernel GoogleTest suites. */
#ifndef UCX_KREG_TEST_H
#define UCX_KREG_TEST_H

#include "ucm_kernel/ucm_kernel.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

#include <ucm/api/ucm.h>
extern "C" {
#include <ucs/memory/rcache.h> /* has no C++ guards */
}
#include <atomic>

#include "kreg_config.h"

/* Forked children of this multi-threaded process: TSan cannot follow a
 * child that starts threads again ("dup thread with used id"), and under
 * GCC 12's ASan such children hung at random in CI (three different tests;
 * consistent with its allocator taking no lock around fork, not proven).
 * The plain and UBSan builds run these tests. */
#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
#define KREG_SKIP_FORKED_CHILD_UNDER_SANITIZER() \
    GTEST_SKIP() << "forked children are unreliable under this sanitizer; the " \
                    "plain and UBSan builds run this test"
#else
#define KREG_SKIP_FORKED_CHILD_UNDER_SANITIZER() do {} while (0)
#endif

namespace kreg_test {

size_t page();

/* Records every UCM_EVENT_VM_UNMAPPED range, whatever reports it. */
class EventLog {
public:
    EventLog();
    ~EventLog();
    /* true if one recorded event covers [addr, addr+len) */
    bool covers(const void *addr, size_t len) const;
    size_t count() const;
    void clear();

private:
    static void callback(ucm_event_type_t type, ucm_event_t *event, void *arg);
    mutable std::mutex lock_;
    std::vector<std::pair<uintptr_t, uintptr_t>> ranges_;
};

/* kreg_start() for the test's lifetime, in the mode given (or the env's);
 * "verify-wp" is verify mode with WP_ASYNC off. */
class Source {
public:
    explicit Source(const char *mode = nullptr);
    ~Source();
    ucs_status_t status() const { return status_; }

private:
    ucs_status_t status_;
};

/* verify or verify-wp */
bool is_verify(const char *mode);

/* A fresh anonymous mapping of `len` bytes (optionally at `hint`). */
void *map_anon(size_t len, void *hint = nullptr, int extra_flags = 0);

struct ChildResult {
    int         status = -1;  /* exit code, or 128+signal, or -1 timeout */
    std::string output;       /* stdout and stderr */
};

/* Runs fn in a forked child with a timeout; fn's return value is the exit
 * code. Output of the child is captured. */
ChildResult run_child(const std::function<int()> &fn, int timeout_s = 20);

/* A real ucs_rcache watched by libucm_kernel, with an oracle: every mapping
 * starts with a token the test writes; each registration records the token
 * it saw, so a hit whose token differs from the memory's is a stale entry. */
class TokenCache {
public:
    TokenCache();
    ~TokenCache();

    struct Hit {
        bool     ok;       /* lookup succeeded */
        bool     stale;    /* the entry belonged to another mapping */
        bool     cached;   /* came from the cache (not uncached fallback) */
    };
    /* Lookup as a transport would: prepare, get, check, put. */
    Hit lookup(void *addr, size_t len);

    bool created() const { return rcache_ != nullptr; }
    uint64_t registrations() const { return regs_; }
    uint64_t uncached() const { return uncached_; }

private:
    struct Region {
        ucs_rcache_region_t super;
        uint64_t            token;
        bool                watched;
    };
    static ucs_status_t mem_reg(void *ctx, ucs_rcache_t *rc, void *arg,
                                ucs_rcache_region_t *r, uint16_t flags);
    static void mem_dereg(void *ctx, ucs_rcache_t *rc, ucs_rcache_region_t *r);
    static void dump(void *ctx, ucs_rcache_t *rc, ucs_rcache_region_t *r,
                     char *buf, size_t max);

    ucs_rcache_t            *rcache_ = nullptr;
    std::atomic<uint64_t>    regs_{0}, uncached_{0};
};

} // namespace kreg_test

#endif
