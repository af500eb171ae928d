/* Helpers shared by the libucm_kernel GoogleTest suites. */
#ifndef UCX_KREG_TEST_H
#define UCX_KREG_TEST_H

#include "ucm_kernel/ucm_kernel.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

#include <ucm/api/ucm.h>
extern "C" {
#include <ucs/memory/rcache.h> /* has no C++ guards */
}

#include "kreg_config.h"
#include "tools/child_process.h"

/* Forked children of this multi-threaded process that start threads
 * again: TSan cannot follow them ("dup thread with used id"), and GCC 12's
 * ASan hangs them at random: its allocator takes no lock around fork, so a
 * child forked while another thread holds a size class's mutex inherits it
 * held, and the child's next allocation of that class waits for ever (seen
 * here: the child's new kreg threads in pthread_getattr_np's calloc at
 * thread start, in SizeClassAllocator64::GetFromAllocator; compiler-rt
 * locks the allocator around fork only since LLVM 18). Set
 * KREG_TEST_FORK_UNDER_SANITIZER=1 to run them anyway. The plain and UBSan
 * builds run these tests. */
#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
#define KREG_SKIP_FORKED_CHILD_UNDER_SANITIZER() \
    if (getenv("KREG_TEST_FORK_UNDER_SANITIZER") == nullptr) \
        GTEST_SKIP() << "forked children are unreliable under this sanitizer; the " \
                        "plain and UBSan builds run this test"
#else
#define KREG_SKIP_FORKED_CHILD_UNDER_SANITIZER() do {} while (0)
#endif

namespace kreg_test {

using kreg_tools::child_result;
using kreg_tools::run_child;

size_t page();

/* In a child process (run_child): says in words what went wrong, on stdout
 * (the parent shows the child's output with its failure), and returns code,
 * the child's exit status. */
int child_failure(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* The configurations the parameterised suites run in: a backend and a
 * mode, as a user sets them. */
struct source_config {
    const char *name;     /* test-name suffix */
    const char *backend;  /* UCX_KREG_BACKEND */
    const char *mode;     /* UCX_KREG_MODE */
    bool        no_wp_async; /* UCX_KREG_WP_ASYNC=n: the 6.1 kernel's check */
    bool        exact;    /* a lookup never returns a replaced page */
};
/* kAuto: what a user gets with nothing set */
/* gtest prints a parameter that fails with this */
void PrintTo(const source_config &config, std::ostream *os);
extern const source_config kAuto, kUffd, kUffdWp, kUffdPlain, kNotifier, kNotifierPlain;
/* the exact ones, for the suites that assert exactness */
std::vector<source_config> exact_configs();
std::vector<source_config> all_configs();
std::string config_name(const testing::TestParamInfo<source_config> &info);

/* kreg_start() for the test's lifetime in one configuration. skip() says
 * why the configuration cannot run here (no module, ...), or "". */
class scoped_source {
public:
    explicit scoped_source(const source_config &config);
    scoped_source() : scoped_source(kUffd) {}
    ~scoped_source();
    ucs_status_t status() const { return status_; }
    const std::string &skip() const { return skip_; }

private:
    ucs_status_t status_;
    std::string  skip_;
};

/* SetUp of a suite parameterised by source_config: starts the source, or skips
 * with the reason. */
#define KREG_START_OR_SKIP(_source, _config) \
    do { \
        (_source) = std::make_unique<scoped_source>(_config); \
        if (!(_source)->skip().empty()) { \
            GTEST_SKIP() << (_source)->skip(); \
        } \
        ASSERT_EQ(UCS_OK, (_source)->status()) << "kreg_start failed"; \
    } while (0)

/* A kreg_watch_t that unwatches when it goes out of scope. */
class scoped_watch {
public:
    scoped_watch() = default;
    scoped_watch(void *addr, size_t len) { watch(addr, len); }
    ~scoped_watch() { kreg_unwatch(&w_); }
    scoped_watch(const scoped_watch &) = delete;
    scoped_watch &operator=(const scoped_watch &) = delete;
    int watch(void *addr, size_t len, kreg_reason_t *why = nullptr)
    {
        kreg_unwatch(&w_);
        return kreg_watch(addr, len, &w_, why);
    }
    void unwatch() { kreg_unwatch(&w_); }
    bool current() const { return kreg_watch_is_current(&w_); }
    kreg_watch_t *get() { return &w_; }

private:
    kreg_watch_t w_{};
};

/* Records every UCM_EVENT_VM_UNMAPPED range, whatever reports it. */
class event_log {
public:
    event_log();
    ~event_log();
    /* true if one recorded event covers [addr, addr+len) */
    bool covers(const void *addr, size_t len) const;
    size_t count() const;
    void clear();

private:
    static void callback(ucm_event_type_t type, ucm_event_t *event, void *arg);
    mutable std::mutex lock_;
    std::vector<std::pair<uintptr_t, uintptr_t>> ranges_;
};

/* Ranges the kernel reported through the backend's own reader (not found
 * by a lookup's check): stats.dispatched. */
uint64_t kernel_reports();

/* A file of `len` bytes on a file system that is not tmpfs (tmpfs files are
 * shared memory to the kernel), unlinked; -1 with *why set if there is
 * none (the Soft-RoCE guest writes only tmpfs and 9p shares). */
int real_file(size_t len, std::string *why);

/* A fresh anonymous mapping of `len` bytes (optionally at `hint`). */
void *map_anon(size_t len, void *hint = nullptr, int extra_flags = 0);

/* A real ucs_rcache watched by libucm_kernel the way an md watches it
 * (kreg_register_watched, kreg_rcache_get), with an oracle: every mapping
 * starts with a token the test writes; each registration records the token
 * it saw, so a hit whose token differs from the memory's is a stale entry.
 * (The pinned-page oracle is tools/uring_rcache.) */
class token_cache {
public:
    /* watched=false: registrations nothing watches, for showing that the
     * oracle can fail */
    explicit token_cache(bool watched = true);
    ~token_cache();

    struct lookup_result {
        bool     ok;       /* lookup succeeded */
        bool     stale;    /* the entry belonged to another mapping */
        bool     cached;   /* came from the cache (not uncached fallback) */
        /* a cached entry whose token was read at another address: UCS
         * merged the looked-up range with overlapping entries (one
         * registration over several mappings), so this address's token at
         * registration is unknown: not judged, never "stale" */
        bool     unjudged;
    };
    lookup_result lookup(void *addr, size_t len);

    /* A lookup that keeps its reference, as a transport holds a memory
     * handle until its operation completes (nullptr: no cached entry);
     * release() drops it. */
    ucs_rcache_region_t *hold(void *addr, size_t len);
    void release(ucs_rcache_region_t *r);

    bool created() const { return rcache_ != nullptr; }
    uint64_t registrations() const { return regs_; }
    uint64_t uncached() const { return uncached_; }
    uint64_t deregistrations() const { return deregs_; }

private:
    struct token_region {
        ucs_rcache_region_t super;
        kreg_watch_t        watch;
        uint64_t            token;
        uintptr_t           token_addr; /* where it was read (arg) */
    };
    static ucs_status_t mem_reg(void *ctx, ucs_rcache_t *rc, void *arg,
                                ucs_rcache_region_t *r, uint16_t flags);
    static void mem_dereg(void *ctx, ucs_rcache_t *rc, ucs_rcache_region_t *r);
    static void dump(void *ctx, ucs_rcache_t *rc, ucs_rcache_region_t *r,
                     char *buf, size_t max);

    ucs_rcache_t            *rcache_ = nullptr;
    bool                     watched_;
    std::atomic<uint64_t>    regs_{0}, uncached_{0}, deregs_{0};
};

} // namespace kreg_test

#endif
