/* Hazards 2 and 5 of DESIGN.md, fork and exec, and bad input to every entry
 * point. */
#include "kreg_test.h"

#include <csignal>
#include <dirent.h>
#include <fcntl.h>
#include <pthread.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <thread>
#include <unistd.h>

using namespace kreg_test;

namespace {

class Lifecycle : public testing::Test {
protected:
    void SetUp() override { ASSERT_EQ(UCS_OK, source_.status()); }
    Source source_{"verify"};
};

/* Hazard 2: dispatch waits on a lock held by a thread that unmaps a watched
 * range while holding it. The reader must still release that thread. */
TEST_F(Lifecycle, DispatchBlockedDoesNotBlockMunmap)
{
    KREG_SKIP_FORKED_CHILD_UNDER_SANITIZER();
    auto r = run_child([] {
        static pthread_mutex_t m = PTHREAD_MUTEX_INITIALIZER;
        static std::atomic<int> entered{0};
        auto cb = [](ucm_event_type_t, ucm_event_t *, void *) {
            if (entered++ == 0) {
                pthread_mutex_lock(&m); /* what an rcache lock would do */
                pthread_mutex_unlock(&m);
            }
        };
        ucm_set_event_handler(UCM_EVENT_VM_UNMAPPED, 0, cb, nullptr);
        const size_t len = 4 * page();
        void *a = map_anon(len), *b = map_anon(len);
        if (!kreg_watch(a, len, nullptr) || !kreg_watch(b, len, nullptr)) {
            return 2;
        }
        pthread_mutex_lock(&m);
        munmap(a, len);             /* its dispatch now waits for m ...   */
        while (entered.load() == 0) {
            sched_yield();
        }
        munmap(b, len);             /* ... and this must still return     */
        pthread_mutex_unlock(&m);
        kreg_sync();
        return entered.load() >= 2 ? 0 : 3;
    }, 15);
    EXPECT_EQ(0, r.status) << (r.status == -1 ? "hung: munmap waited for dispatch" : r.output);
}

/* Hazard 5: signals never stop the monitor; every munmap returns. */
TEST_F(Lifecycle, SignalStormDoesNotStopTheMonitor)
{
    KREG_SKIP_FORKED_CHILD_UNDER_SANITIZER();
    auto r = run_child([] {
        struct sigaction sa = {};
        sa.sa_handler = [](int) {};
        sigaction(SIGUSR1, &sa, nullptr); /* no SA_RESTART: EINTR everywhere */
        EventLog log;
        std::atomic<bool> done{false};
        pid_t self = getpid();
        std::thread storm([&] {
            while (!done) {
                kill(self, SIGUSR1);
                usleep(50);
            }
        });
        const size_t len = 4 * page();
        int missing      = 0;
        for (int i = 0; i < 2000; ++i) {
            void *p = map_anon(len);
            kreg_watch(p, len, nullptr);
            munmap(p, len);
            kreg_prepare_lookup(p, len);
            missing += !log.covers(p, len);
            kreg_unwatch(p, len);
        }
        done = true;
        storm.join();
        return missing == 0 ? 0 : 4;
    }, 60);
    EXPECT_EQ(0, r.status) << r.output;
}

/* Hazard 5: the last stop closes the descriptor, so watched ranges stop
 * blocking munmap (and nothing stays cached unwatched). */
TEST_F(Lifecycle, StopDropsWatchesAndReportsThem)
{
    KREG_SKIP_FORKED_CHILD_UNDER_SANITIZER();
    auto r = run_child([] {
        EventLog log;
        const size_t len = 4 * page();
        void *p = map_anon(len);
        if (!kreg_watch(p, len, nullptr)) {
            return 2;
        }
        kreg_stop(); /* refs 1 -> 0 in this child */
        if (!log.covers(p, len)) {
            return 3; /* a cached entry would outlive its watch */
        }
        return munmap(p, len) == 0 ? 0 : 4; /* and it doesn't hang */
    }, 15);
    EXPECT_EQ(0, r.status) << (r.status == -1 ? "munmap hung after stop" : r.output);
}

TEST_F(Lifecycle, ForkedChildRestartsAndParentKeepsWorking)
{
    KREG_SKIP_FORKED_CHILD_UNDER_SANITIZER();
    const size_t len = 4 * page();
    void *p = map_anon(len);
    ASSERT_EQ(1, kreg_watch(p, len, nullptr));
    auto r = run_child([p, len] {
        EventLog log;
        /* the first call in the child flushes what the parent watched */
        kreg_prepare_lookup(p, len);
        if (!log.covers(p, len)) {
            return 2;
        }
        kreg_caps_t caps;
        kreg_query(&caps);
        if (!caps.running) {
            return 3;
        }
        /* the child's own monitor sees the child's unmaps */
        void *q = map_anon(len);
        if (!kreg_watch(q, len, nullptr)) {
            return 4;
        }
        munmap(q, len);
        kreg_prepare_lookup(q, len);
        return log.covers(q, len) ? 0 : 5;
    });
    EXPECT_EQ(0, r.status) << r.output;
    EventLog log;
    ASSERT_EQ(0, munmap(p, len));
    kreg_prepare_lookup(p, len);
    EXPECT_TRUE(log.covers(p, len)) << "parent lost its watch after fork";
    kreg_unwatch(p, len);
}

/* A fork while the dispatcher is inside UCM's dispatch (holding UCM's event
 * lock) must not hand the child that lock, held by a thread it doesn't have. */
TEST_F(Lifecycle, ForkWaitsForDispatchUnderWay)
{
    KREG_SKIP_FORKED_CHILD_UNDER_SANITIZER();
    static std::atomic<int> in_handler{0};
    auto slow = [](ucm_event_type_t, ucm_event_t *, void *) {
        if (in_handler.exchange(1) == 0) {
            usleep(200 * 1000);
        }
    };
    ucm_set_event_handler(UCM_EVENT_VM_UNMAPPED, 0, slow, nullptr);
    const size_t len = 4 * page();
    void *p = map_anon(len);
    ASSERT_EQ(1, kreg_watch(p, len, nullptr));
    ASSERT_EQ(0, munmap(p, len));
    while (in_handler.load() == 0) {
        sched_yield(); /* the dispatcher is in the slow handler now */
    }
    auto r = run_child([] {
        /* takes UCM's event lock for writing */
        EventLog log;
        return 0;
    }, 10);
    EXPECT_EQ(0, r.status) << (r.status == -1 ? "child hung on a lock held at fork" : r.output);
    ucm_unset_event_handler(UCM_EVENT_VM_UNMAPPED, slow, nullptr);
    kreg_unwatch(p, len);
}

TEST_F(Lifecycle, DescriptorIsCloseOnExec)
{
    int found = 0;
    DIR *d    = opendir("/proc/self/fd");
    ASSERT_NE(nullptr, d);
    while (struct dirent *e = readdir(d)) {
        char path[64], target[256];
        snprintf(path, sizeof(path), "/proc/self/fd/%s", e->d_name);
        ssize_t n = readlink(path, target, sizeof(target) - 1);
        if (n <= 0) {
            continue;
        }
        target[n] = '\0';
        if (strstr(target, "userfaultfd") != nullptr) {
            ++found;
            int fd = atoi(e->d_name);
            EXPECT_TRUE(fcntl(fd, F_GETFD) & FD_CLOEXEC) << target;
        }
    }
    closedir(d);
    EXPECT_GE(found, 1);
    /* and a program exec'ed from here has none */
    FILE *out = popen("ls -l /proc/self/fd/ 2>/dev/null | grep -c userfaultfd", "r");
    ASSERT_NE(nullptr, out);
    int n = -1;
    EXPECT_EQ(1, fscanf(out, "%d", &n));
    pclose(out);
    EXPECT_EQ(0, n);
}

TEST_F(Lifecycle, StartIsReferenceCounted)
{
    EXPECT_EQ(UCS_OK, kreg_start());
    kreg_stop();
    kreg_caps_t caps;
    kreg_query(&caps);
    EXPECT_TRUE(caps.running) << "an inner stop must not stop the source";
    EXPECT_TRUE(caps.external_event);
}

TEST_F(Lifecycle, StartStopFromManyThreads)
{
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; ++t) {
        threads.emplace_back([] {
            for (int i = 0; i < 50; ++i) {
                EXPECT_EQ(UCS_OK, kreg_start());
                void *p = map_anon(page());
                EXPECT_EQ(1, kreg_watch(p, page(), nullptr));
                kreg_unwatch(p, page());
                munmap(p, page());
                kreg_stop();
            }
        });
    }
    for (auto &t : threads) {
        t.join();
    }
    kreg_caps_t caps;
    kreg_query(&caps);
    EXPECT_TRUE(caps.running);
}

TEST_F(Lifecycle, BadInput)
{
    kreg_reason_t why = KREG_REASON_NONE;
    EXPECT_EQ(0, kreg_watch(nullptr, 4096, &why));
    EXPECT_EQ(KREG_REASON_BAD_INPUT, why);
    void *p = map_anon(4 * page());
    ASSERT_NE(nullptr, p);
    EXPECT_EQ(0, kreg_watch(p, 0, &why));
    EXPECT_EQ(KREG_REASON_BAD_INPUT, why);
    EXPECT_EQ(0, kreg_watch(reinterpret_cast<void *>(UINTPTR_MAX - 100), 4096, &why));
    EXPECT_EQ(KREG_REASON_BAD_INPUT, why);
    /* harmless no-ops */
    kreg_unwatch(nullptr, 0);
    kreg_unwatch(p, 0);
    kreg_unwatch(p, page()); /* never watched */
    EXPECT_EQ(0, kreg_prepare_lookup(nullptr, 0));

    /* unaligned: widened to the pages it touches */
    EventLog log;
    char *c = static_cast<char *>(p);
    ASSERT_EQ(1, kreg_watch(c + 100, 10, nullptr));
    ASSERT_EQ(0, munmap(c, page()));
    kreg_prepare_lookup(c + 100, 10);
    EXPECT_TRUE(log.covers(c, page()));
    kreg_unwatch(c + 100, 10);
    munmap(c + page(), 3 * page());
}

TEST_F(Lifecycle, HoleInRangeIsNotWatched)
{
    TokenCache cache; /* first: its pools must not fill the hole */
    for (int attempt = 0;; ++attempt) {
        ASSERT_LT(attempt, 20) << "the hole was always filled by another mapping";
        char *p = static_cast<char *>(map_anon(3 * page()));
        ASSERT_NE(nullptr, p);
        ASSERT_EQ(0, munmap(p + page(), page()));
        kreg_reason_t why;
        EXPECT_EQ(0, kreg_watch(p, 3 * page(), &why));
        EXPECT_EQ(KREG_REASON_BAD_INPUT, why);
        /* a cache never caches it */
        auto hit = cache.lookup(p, 3 * page());
        /* another thread (an allocator, the dispatcher) may have mapped
         * into the hole meanwhile: then it is no hole, try again */
        const bool still_hole = msync(p + page(), page(), MS_ASYNC) != 0;
        /* page by page: whatever was mapped into the hole is not ours */
        munmap(p, page());
        munmap(p + 2 * page(), page());
        if (still_hole) {
            EXPECT_FALSE(hit.cached);
            break;
        }
    }
}

TEST_F(Lifecycle, ProtNoneIsWatchedOrRefusedNeverSilentlyStale)
{
    void *p = mmap(nullptr, page(), PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    ASSERT_NE(MAP_FAILED, p);
    EventLog log;
    kreg_reason_t why;
    int w = kreg_watch(p, page(), &why);
    ASSERT_EQ(0, munmap(p, page()));
    kreg_prepare_lookup(p, page());
    if (w) {
        EXPECT_TRUE(log.covers(p, page()));
        kreg_unwatch(p, page());
    } else {
        EXPECT_NE(KREG_REASON_NONE, why);
    }
}

} // namespace
