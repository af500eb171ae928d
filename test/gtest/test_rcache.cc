/* A real UCS rcache fed by libucm_kernel: same-thread remaps in every
 * configuration, and the cross-thread window under stress in the
 * exact ones. The oracle is the token each mapping starts with (see
 * token_cache); tools/uring_rcache's pinned pages are the other oracle
 * (test_address_space.cc).
 *
 * Over 350 lines: the Rcache and Stress suites share the token cache
 * set-up and the stress runner.
 */
#include "kreg_test.h"

#include <cstdlib>
#include <cstring>
#include <functional>
#include <malloc.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <thread>
#include <unistd.h>

using namespace kreg_test;

namespace {

/* glibc's chunk header, just below the pointer: bit 1 is IS_MMAPPED.
 * (Below the object malloc returned, on purpose.) */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Warray-bounds"
bool glibc_chunk_is_mmapped(const void *p)
{
    size_t size;
    const auto *header = static_cast<const volatile char *>(p) - sizeof(size);
    memcpy(&size, const_cast<const char *>(header), sizeof(size));
    return size & 2;
}
#pragma GCC diagnostic pop

uint64_t next_token()
{
    static std::atomic<uint64_t> token{1};
    return token++;
}

void *map_with_token(void *hint, size_t len, int flags = 0)
{
    void *p = map_anon(len, hint, flags);
    if (p != nullptr) {
        *static_cast<volatile uint64_t *>(p) = next_token();
    }
    return p;
}

class Rcache : public testing::TestWithParam<source_config> {
protected:
    void SetUp() override
    {
        KREG_START_OR_SKIP(source_, GetParam());
        cache_ = std::make_unique<token_cache>();
        ASSERT_TRUE(cache_->created());
    }
    void TearDown() override
    {
        cache_.reset();
        source_.reset();
    }
    std::unique_ptr<scoped_source>     source_;
    std::unique_ptr<token_cache> cache_;
};

const size_t len = 64 * 1024;

/* Unmaps p (len bytes) by the raw syscall, which no hook could see, and maps
 * a new token there; nullptr if another thread (an allocator, the
 * dispatcher) took the address first (the caller tries again). */
void *remap_raw(void *p)
{
    if (syscall(SYS_munmap, p, len) != 0) {
        return nullptr;
    }
    void *q = map_with_token(p, len, MAP_FIXED_NOREPLACE);
    if (q != p) {
        if (q != nullptr) {
            munmap(q, len);
        }
        return nullptr;
    }
    return q;
}

TEST_P(Rcache, RemapAfterAHitMissesTheOldEntry)
{
    for (int attempt = 0;; ++attempt) {
        ASSERT_LT(attempt, 20) << "the freed address was always taken first";
        const uint64_t regs = cache_->registrations();
        void *p = map_with_token(nullptr, len);
        ASSERT_NE(nullptr, p);
        auto a = cache_->lookup(p, len);
        auto b = cache_->lookup(p, len);
        ASSERT_TRUE(a.cached && b.cached);
        EXPECT_EQ(regs + 1, cache_->registrations()) << "the second lookup must hit";

        void *q = remap_raw(p);
        if (q == nullptr) {
            continue;
        }
        auto c = cache_->lookup(q, len);
        EXPECT_TRUE(c.cached);
        EXPECT_FALSE(c.stale);
        EXPECT_EQ(regs + 2, cache_->registrations());
        munmap(q, len);
        break;
    }
}

TEST_P(Rcache, MadviseDontneedDropsTheEntry)
{
    void *p = map_with_token(nullptr, len);
    cache_->lookup(p, len);
    ASSERT_EQ(0, madvise(p, len, MADV_DONTNEED));
    *static_cast<volatile uint64_t *>(p) = next_token(); /* new pages, new data */
    auto c = cache_->lookup(p, len);
    EXPECT_FALSE(c.stale);
    EXPECT_EQ(2u, cache_->registrations());
    munmap(p, len);
}

TEST_P(Rcache, FreeThenMallocAtTheSameAddressMisses)
{
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
    GTEST_SKIP() << "this sanitizer's allocator keeps freed chunks in quarantine "
                    "and never hands the address out again; the plain and UBSan "
                    "builds run this test";
#endif
    const size_t big = 1 << 20;
    /* a fixed threshold: glibc serves this with mmap, free unmaps it */
    mallopt(M_MMAP_THRESHOLD, 128 * 1024);
    for (int attempt = 0;; ++attempt) {
        ASSERT_LT(attempt, 20) << "malloc never returned the freed address";
        void *p = malloc(big);
        ASSERT_NE(nullptr, p);
        *static_cast<volatile uint64_t *>(p) = next_token();
        ASSERT_TRUE(cache_->lookup(p, big).cached);
        free(p);
        void *q = malloc(big);
        ASSERT_NE(nullptr, q);
        if (q != p) {
            /* another thread's mapping took the address first: the case
             * this test is about did not happen, try again */
            free(q);
            continue;
        }
        *static_cast<volatile uint64_t *>(q) = next_token();
        auto c = cache_->lookup(q, big);
        EXPECT_TRUE(c.cached);
        EXPECT_FALSE(c.stale) << "the entry of the freed chunk was returned";
        free(q);
        break;
    }
}

/* While other threads unmap unrelated watched memory, events are in
 * flight all the time (the write-protect check then says EAGAIN for any
 * range): lookups of a buffer nobody touched must keep hitting its entry,
 * never drop it. */
TEST_P(Rcache, UnrelatedUnmapsInFlightDoNotDropAnEntry)
{
    void *p = map_with_token(nullptr, len);
    ASSERT_TRUE(cache_->lookup(p, len).cached);
    const uint64_t regs = cache_->registrations();
    std::atomic<bool> stop{false};
    std::atomic<unsigned> unmaps{0};
    std::thread churn([&] {
        while (!stop.load()) {
            void *q = map_anon(len);
            scoped_watch w(q, len);
            syscall(SYS_munmap, q, len);
            ++unmaps;
        }
    });
    unsigned stale = 0, lookups = 0;
    const time_t deadline = time(nullptr) + 20;
    while ((unmaps.load() < 2000) && (time(nullptr) < deadline)) {
        stale += cache_->lookup(p, len).stale;
        ++lookups;
    }
    stop = true;
    churn.join();
    EXPECT_EQ(0u, stale);
    EXPECT_GE(unmaps.load(), 2000u) << "the other thread hardly ran (" << lookups
                                    << " lookups)";
    EXPECT_EQ(regs, cache_->registrations())
            << "an entry was dropped for another range's event ("
            << unmaps.load() << " unmaps meanwhile)";
    munmap(p, len);
}

/* An RDMA operation on a registration the cache let go of while the
 * operation was in flight would complete with an error (WR_FLUSH_ERR) or
 * reach other memory: an entry a transport holds stays registered until it
 * is released, however it went stale meanwhile (unmapped, and the same
 * address looked up again and registered anew), and is deregistered once
 * released. */
TEST_P(Rcache, AnEntryInUseIsDeregisteredOnlyOnceReleased)
{
    for (int attempt = 0;; ++attempt) {
        ASSERT_LT(attempt, 20) << "the freed address was always taken first";
        void *p = map_with_token(nullptr, len);
        ASSERT_NE(nullptr, p);
        ucs_rcache_region_t *held = cache_->hold(p, len);
        ASSERT_NE(nullptr, held);
        const uint64_t deregs = cache_->deregistrations();

        void *q = remap_raw(p);
        if (q == nullptr) {
            cache_->release(held);
            continue;
        }
        /* the new mapping's lookup drops the stale entry from the cache */
        auto c = cache_->lookup(q, len);
        EXPECT_TRUE(c.cached);
        EXPECT_FALSE(c.stale);
        kreg_sync();
        EXPECT_EQ(deregs, cache_->deregistrations())
                << "deregistered while a transport still held it";
        cache_->release(held);
        EXPECT_EQ(deregs + 1, cache_->deregistrations())
                << "not deregistered once released";
        munmap(q, len);
        break;
    }
}

/* The exact configurations, and uffd's plain mode, whose same-thread
 * events are read before the changing call returns. The notifier's plain
 * mode compares nothing and its reader is asynchronous: not here. */
std::vector<source_config> same_thread_configs()
{
    auto v = exact_configs();
    v.push_back(kUffdPlain);
    return v;
}

INSTANTIATE_TEST_SUITE_P(Backends, Rcache, testing::ValuesIn(same_thread_configs()),
                         config_name);

/* The cross-thread window under stress: thread A unmaps with a raw syscall, thread B maps
 * the same address at once and looks it up. Slots change hands between
 * threads all the time. In the default mode no lookup may ever hit the
 * entry of the previous mapping. */
struct stress_result {
    uint64_t rounds = 0, stale = 0, cached = 0, unjudged = 0;
};

stress_result stress(unsigned rounds_per_thread, bool use_malloc)
{
    constexpr int nslots = 4;
    struct stress_slot {
        std::atomic<int> busy{0};
        void            *addr = nullptr;
    } slots[nslots];
    /* before the slots are chosen: its pools must not land on them */
    token_cache cache;
    /* the threads first: their stacks must not land on the slots */
    std::atomic<bool> go{false};
    std::atomic<uint64_t> stale{0}, cached{0}, rounds{0}, unjudged{0};
    std::function<void(unsigned)> work;
    auto start = [&](unsigned seed) {
        while (!go.load()) {
            sched_yield();
        }
        work(seed);
    };
    std::thread a(start, 0), b(start, 1);
    /* fixed addresses so that a freed slot is reused at once */
    char *area = static_cast<char *>(mmap(nullptr, 2 * len * nslots, PROT_NONE,
                                          MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
    munmap(area, 2 * len * nslots);
    for (int i = 0; i < nslots; ++i) {
        slots[i].addr = area + 2 * len * i;
    }

    /* each malloc a fresh mapping and each free an unmap, so the token
     * oracle holds: heap reuse would change data without a remap */
    mallopt(M_MMAP_THRESHOLD, 64 * 1024);
    const size_t big = 1 << 20;
    work = [&](unsigned seed) {
        for (unsigned i = 0; i < rounds_per_thread; ++i) {
            stress_slot &s = slots[(seed + i) % nslots];
            int expected = 0;
            if (!s.busy.compare_exchange_strong(expected, 1)) {
                continue;
            }
            void *p;
            if (use_malloc) {
                p = malloc(big);
                if (!glibc_chunk_is_mmapped(p)) {
                    /* glibc's IS_MMAPPED bit is clear: a heap chunk, whose
                     * reuse is no remap; the oracle doesn't apply */
                    free(p);
                    s.busy = 0;
                    continue;
                }
                *static_cast<volatile uint64_t *>(p) = next_token();
            } else {
                p = map_with_token(s.addr, len, MAP_FIXED_NOREPLACE);
                if (p != s.addr) {
                    /* The slot's last holder unmapped it before it let go,
                     * so a foreign mapping took the address (under ASan its
                     * allocator's, for one) and would fail every round:
                     * move the slot to a hole the kernel picks. */
                    if (p != nullptr) {
                        munmap(p, len);
                    }
                    void *hole = mmap(nullptr, 2 * len, PROT_NONE,
                                      MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
                    if (hole != MAP_FAILED) {
                        munmap(hole, 2 * len);
                        s.addr = hole;
                    }
                    s.busy = 0;
                    continue;
                }
            }
            for (int k = 0; k < 2; ++k) {
                auto hit = cache.lookup(p, use_malloc ? big : len);
                stale += hit.stale;
                cached += hit.cached;
                unjudged += hit.unjudged;
            }
            if (use_malloc) {
                /* glibc grows a large chunk with mremap: in place, or
                 * moved (the old range goes, the pages move along, their
                 * token with them) */
                void *q = realloc(p, 2 * big);
                if (q != nullptr) {
                    p = q;
                    auto hit = cache.lookup(p, 2 * big);
                    stale += hit.stale;
                    cached += hit.cached;
                    unjudged += hit.unjudged;
                }
                free(p);
            } else {
                syscall(SYS_munmap, p, len);
            }
            s.busy = 0;
            ++rounds;
        }
    };
    go = true;
    a.join();
    b.join();
    return stress_result{rounds.load(), stale.load(), cached.load(), unjudged.load()};
}

unsigned stress_rounds()
{
    const char *env = getenv("KREG_STRESS_ROUNDS");
    return env ? static_cast<unsigned>(atoi(env)) : 20000;
}

void report(const stress_result &r)
{
    printf("rounds %lu, cached lookups %lu, stale %lu, not judged (merged "
           "entries) %lu\n",
           static_cast<unsigned long>(r.rounds), static_cast<unsigned long>(r.cached),
           static_cast<unsigned long>(r.stale), static_cast<unsigned long>(r.unjudged));
}

class Stress : public testing::TestWithParam<source_config> {
protected:
    void SetUp() override { KREG_START_OR_SKIP(source_, GetParam()); }
    std::unique_ptr<scoped_source> source_;
};

TEST_P(Stress, TwoThreadsMmapMunmapLoseNothing)
{
    auto r = stress(stress_rounds(), false);
    report(r);
    /* rounds lost to address races vary with load; enough must run, and
     * most lookups must have been cached hits or registrations: an
     * all-uncached run would be 0 stale by construction */
    EXPECT_GT(r.rounds, stress_rounds() / 20);
    EXPECT_GT(r.cached, r.rounds) << "too few lookups were cached to prove anything";
    EXPECT_LT(r.unjudged * 100, r.cached) << "merged entries hid most hits from the oracle";
    EXPECT_EQ(0u, r.stale);
}

TEST_P(Stress, TwoThreadsMallocReallocFreeLoseNothing)
{
#ifdef KREG_SANITIZER
    if (strcmp(KREG_SANITIZER, "undefined") != 0) {
        GTEST_SKIP() << "the oracle reads glibc's chunk header, and the "
                     << KREG_SANITIZER << " sanitizer has its own malloc";
    }
#endif
    auto r = stress(stress_rounds(), true);
    report(r);
    EXPECT_GT(r.rounds, stress_rounds() / 20);
    EXPECT_GT(r.cached, r.rounds) << "too few lookups were cached to prove anything";
    EXPECT_LT(r.unjudged * 100, r.cached) << "merged entries hid most hits from the oracle";
    EXPECT_EQ(0u, r.stale);
}

INSTANTIATE_TEST_SUITE_P(Exact, Stress, testing::ValuesIn(exact_configs()),
                         config_name);

/* The oracle can fail: the same cache whose registrations nothing watches
 * returns the old mapping's entry after a raw remap. */
TEST(Oracle, SeesStaleWhenNothingWatches)
{
    scoped_source src(kUffd);
    ASSERT_EQ(UCS_OK, src.status());
    token_cache cache(false);
    for (int attempt = 0;; ++attempt) {
        ASSERT_LT(attempt, 20) << "the freed address was always taken first";
        void *p = map_with_token(nullptr, len);
        ASSERT_TRUE(cache.lookup(p, len).cached);
        syscall(SYS_munmap, p, len);
        void *q = map_with_token(p, len, MAP_FIXED_NOREPLACE);
        if (q != p) {
            if (q != nullptr) {
                munmap(q, len);
            }
            continue;
        }
        auto hit = cache.lookup(q, len);
        EXPECT_TRUE(hit.cached);
        EXPECT_TRUE(hit.stale) << "the token oracle must catch a stale entry";
        munmap(q, len);
        break;
    }
}

} // namespace
