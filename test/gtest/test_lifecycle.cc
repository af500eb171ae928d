/* Reader deadlock, reader lifetime (the monitor's life), fork, exec,
 * exit with live threads, and bad input to every entry point, per backend.
 *
 * Over 350 lines: one suite (Lifecycle), whose cases share its
 * fixture and instantiation per backend.
 */
#include "kreg_test.h"

#include <csignal>
#include <dirent.h>
#include <fcntl.h>
#include <pthread.h>
#include <sys/ipc.h>
#include <sys/mman.h>
#include <sys/shm.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <thread>
#include <unistd.h>
#ifdef __SANITIZE_ADDRESS__
#include <sanitizer/lsan_interface.h>
#endif

using namespace kreg_test;

namespace {

/* In a forked child whose own source runs: an unmap of memory the child
 * watches reaches UCM. 0, or the child's failure in words. */
int child_sees_its_own_unmap()
{
    event_log log;
    const size_t len = 4 * page();
    void *q = map_anon(len);
    scoped_watch w;
    if (!w.watch(q, len)) {
        return child_failure(4, "the child cannot watch its own memory");
    }
    munmap(q, len);
    kreg_prepare_lookup(q, len);
    kreg_sync();
    return log.covers(q, len) ? 0 :
           child_failure(5, "the child's own unmap was not reported to UCM");
}

class Lifecycle : public testing::TestWithParam<source_config> {
protected:
    void SetUp() override { KREG_START_OR_SKIP(source_, GetParam()); }
    std::unique_ptr<scoped_source> source_;
};

/* Reader deadlock: a dispatch waits on a lock held by a thread that unmaps a
 * watched range while holding it. That unmap must still return. */
TEST_P(Lifecycle, MunmapReturnsWhileDispatchWaitsForItsLock)
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
        scoped_watch wa, wb;
        if (!wa.watch(a, len) || !wb.watch(b, len)) {
            return child_failure(2, "cannot watch the two ranges");
        }
        pthread_mutex_lock(&m);
        munmap(a, len);             /* its dispatch now waits for m ...   */
        while (entered.load() == 0) {
            sched_yield();
        }
        munmap(b, len);             /* ... and this must still return     */
        pthread_mutex_unlock(&m);
        kreg_sync();
        return entered.load() >= 2 ? 0 :
               child_failure(3, "%d of 2 unmaps dispatched", entered.load());
    }, 15);
    EXPECT_EQ(0, r.status) << (r.timed_out() ? "hung: munmap waited for dispatch" :
                                               r.output);
}

/* Reader lifetime: signals never stop the monitor; every munmap
 * returns. */
TEST_P(Lifecycle, SignalStormDoesNotStopTheMonitor)
{
    KREG_SKIP_FORKED_CHILD_UNDER_SANITIZER();
    auto r = run_child([] {
        struct sigaction sa = {};
        sa.sa_handler = [](int) {};
        sigaction(SIGUSR1, &sa, nullptr); /* no SA_RESTART: EINTR everywhere */
        event_log log;
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
            scoped_watch w(p, len);
            munmap(p, len);
            kreg_prepare_lookup(p, len);
            kreg_sync();
            missing += !log.covers(p, len);
        }
        done = true;
        storm.join();
        printf("%d of 2000 unmaps not reported\n", missing);
        return missing == 0 ? 0 : child_failure(4, "unmaps went unreported in the storm");
    }, 60);
    EXPECT_EQ(0, r.status) << r.output;
}

/* Reader lifetime: the last stop closes the kernel side, so watched
 * ranges stop blocking munmap, nothing stays cached unwatched, and every
 * watch still held by a cache is stale. */
TEST_P(Lifecycle, StopReportsWatchedRangesAndLeavesWatchesStale)
{
    KREG_SKIP_FORKED_CHILD_UNDER_SANITIZER();
    auto r = run_child([] {
        event_log log;
        const size_t len = 4 * page();
        void *p = map_anon(len);
        scoped_watch w;
        if (!w.watch(p, len)) {
            return child_failure(2, "cannot watch the range");
        }
        kreg_stop(); /* refs 1 -> 0 in this child */
        if (!log.covers(p, len)) {
            return child_failure(3, "stop did not report the watched range: a cached "
                                    "entry would outlive its watch");
        }
        if (w.current()) {
            return child_failure(4, "the watch is still current after stop");
        }
        return munmap(p, len) == 0 ? 0 :
               child_failure(5, "munmap after stop failed: %s", strerror(errno));
    }, 15);
    EXPECT_EQ(0, r.status) << (r.timed_out() ? "munmap hung after stop" : r.output);
}

/* A dispatch handler that unmaps watched memory while the source stops:
 * its munmap waits for a reader that is stopping. Stop must not hang. */
TEST_P(Lifecycle, StopWhileAHandlerUnmapsWatchedMemory)
{
    KREG_SKIP_FORKED_CHILD_UNDER_SANITIZER();
    auto r = run_child([] {
        const size_t len = 4 * page();
        static void *victim;
        static std::atomic<int> in_handler{0};
        victim = map_anon(len);
        scoped_watch wv(victim, len);
        auto cb = [](ucm_event_type_t, ucm_event_t *, void *) {
            if (in_handler.exchange(1) == 0) {
                usleep(100 * 1000); /* let kreg_stop start meanwhile */
                munmap(victim, 4 * page());
            }
        };
        ucm_set_event_handler(UCM_EVENT_VM_UNMAPPED, 0, cb, nullptr);
        void *p = map_anon(len);
        scoped_watch w(p, len);
        munmap(p, len);
        while (!in_handler.load()) {
            sched_yield();
        }
        kreg_stop();
        return 0;
    }, 20);
    EXPECT_EQ(0, r.status) << (r.timed_out() ? "kreg_stop hung" : r.output);
}

TEST_P(Lifecycle, ForkedChildRestartsAndParentKeepsWorking)
{
    KREG_SKIP_FORKED_CHILD_UNDER_SANITIZER();
    const size_t len = 4 * page();
    void *p = map_anon(len);
    scoped_watch pw;
    ASSERT_EQ(1, pw.watch(p, len));
    auto r = run_child([&pw] {
        /* every watch inherited from the parent is stale in the child */
        if (pw.current()) {
            return child_failure(2, "a watch inherited from the parent is current");
        }
        kreg_caps_t caps;
        kreg_query(&caps); /* the first call restarts the source */
        if (!caps.running) {
            return child_failure(3, "the child's first call did not restart the source");
        }
        return child_sees_its_own_unmap();
    });
    EXPECT_EQ(0, r.status) << r.output;
    event_log log;
    EXPECT_TRUE(pw.current()) << "the parent's watch went stale with the fork";
    ASSERT_EQ(0, munmap(p, len));
    kreg_prepare_lookup(p, len);
    kreg_sync();
    EXPECT_TRUE(log.covers(p, len)) << "parent lost its watch after fork";
}

/* A new UCP context in a forked child: its first call is kreg_start(). */
TEST_P(Lifecycle, ForkedChildWhoseFirstCallIsStartRuns)
{
    KREG_SKIP_FORKED_CHILD_UNDER_SANITIZER();
    auto r = run_child([] {
        if (kreg_start() != UCS_OK) {
            return child_failure(2, "kreg_start failed in the child");
        }
        kreg_caps_t caps;
        kreg_query(&caps);
        if (!caps.running || !caps.external_event) {
            return child_failure(3, "after kreg_start the source is %s, the event %s",
                                 caps.running ? "running" : "not running",
                                 caps.external_event ? "external" : "not external");
        }
        const int rc = child_sees_its_own_unmap();
        kreg_stop();
        return rc;
    });
    EXPECT_EQ(0, r.status) << r.output;
}

/* A fork while a thread is inside UCM's dispatch (holding UCM's event lock)
 * must not hand the child that lock, held by a thread it doesn't have:
 * the dispatcher's thread and a lookup's own dispatch alike. */
TEST_P(Lifecycle, ForkWaitsForTheMonitorsDispatch)
{
    KREG_SKIP_FORKED_CHILD_UNDER_SANITIZER();
    static std::atomic<int> in_handler{0};
    auto slow = [](ucm_event_type_t, ucm_event_t *, void *) {
        if (in_handler.exchange(1) == 0) {
            usleep(200 * 1000);
        }
    };
    in_handler = 0;
    ucm_set_event_handler(UCM_EVENT_VM_UNMAPPED, 0, slow, nullptr);
    const size_t len = 4 * page();
    void *p = map_anon(len);
    scoped_watch w(p, len);
    ASSERT_EQ(0, munmap(p, len));
    while (in_handler.load() == 0) {
        sched_yield(); /* the dispatcher is in the slow handler now */
    }
    auto r = run_child([] {
        event_log log; /* takes UCM's event lock for writing */
        return 0;
    }, 10);
    EXPECT_EQ(0, r.status) << (r.timed_out() ? "child hung on a lock held at fork" :
                                               r.output);
    ucm_unset_event_handler(UCM_EVENT_VM_UNMAPPED, slow, nullptr);
}

TEST_P(Lifecycle, ForkWaitsForALookupsOwnDispatch)
{
    KREG_SKIP_FORKED_CHILD_UNDER_SANITIZER();
    kreg_caps_t caps;
    kreg_query(&caps);
    if (caps.backend != KREG_BACKEND_UFFD) {
        GTEST_SKIP() << "only the uffd backend's lookup check dispatches";
    }
    /* shmat(SHM_REMAP) replaces a watched mapping without any event: only
     * the lookup's check finds it, and dispatches from the caller */
    const size_t len = 4 * page();
    void *p = map_anon(len);
    scoped_watch w(p, len);
    int id = shmget(IPC_PRIVATE, len, IPC_CREAT | 0600);
    ASSERT_GE(id, 0);
    ASSERT_EQ(p, shmat(id, p, SHM_REMAP));
    shmctl(id, IPC_RMID, nullptr);
    static std::atomic<int> in_handler{0};
    in_handler = 0;
    auto slow = [](ucm_event_type_t, ucm_event_t *, void *) {
        if (in_handler.exchange(1) == 0) {
            usleep(200 * 1000);
        }
    };
    ucm_set_event_handler(UCM_EVENT_VM_UNMAPPED, 0, slow, nullptr);
    std::thread lookup([p, len] { kreg_prepare_lookup(p, len); });
    while (in_handler.load() == 0) {
        sched_yield();
    }
    auto r = run_child([] {
        event_log log;
        return 0;
    }, 10);
    lookup.join();
    EXPECT_EQ(0, r.status) << (r.timed_out() ? "child hung on a lock held at fork" :
                                               r.output);
    EXPECT_EQ(1, in_handler.load()) << "the lookup's check did not dispatch";
    ucm_unset_event_handler(UCM_EVENT_VM_UNMAPPED, slow, nullptr);
    shmdt(p);
}

/* A program that exits without cleaning up while other threads watch,
 * unwatch and unmap (or UCS's async thread releases regions): static
 * destruction order must not matter. */
TEST_P(Lifecycle, ExitWhileThreadsWatchAndUnwatch)
{
    KREG_SKIP_FORKED_CHILD_UNDER_SANITIZER();
    int crashed = 0;
    std::string last;
    for (int run = 0; run < 20; ++run) {
        auto r = run_child([] {
            for (int t = 0; t < 3; ++t) {
                std::thread([] {
                    for (;;) {
                        const size_t len = 4 * page();
                        void *p = map_anon(len);
                        scoped_watch w(p, len);
                        kreg_prepare_lookup(p, len);
                        munmap(p, len);
                    }
                }).detach();
            }
            usleep(20 * 1000);
#ifdef __SANITIZE_ADDRESS__
            /* LeakSanitizer cannot stop threads that run on at exit and
             * reports their stacks' memory as leaked ("False leaks are
             * possible"); what this test looks for is a crash */
            __lsan_disable();
#endif
            exit(0); /* static destructors run while the threads go on */
            return 0;
        }, 20);
        if (r.status != 0) {
            ++crashed;
            last = r.timed_out() ? std::string("timed out") :
                                   "status " + std::to_string(r.status) + ": " + r.output;
        }
    }
    EXPECT_EQ(0, crashed) << crashed << " of 20 exits failed; last: " << last;
}

TEST_P(Lifecycle, DescriptorIsCloseOnExec)
{
    int found = 0;
    DIR *d    = opendir("/proc/self/fd");
    ASSERT_NE(nullptr, d);
    while (struct dirent *e = readdir(d)) {
        char path[300], target[256];
        snprintf(path, sizeof(path), "/proc/self/fd/%s", e->d_name);
        ssize_t n = readlink(path, target, sizeof(target) - 1);
        if (n <= 0) {
            continue;
        }
        target[n] = '\0';
        if ((strstr(target, "userfaultfd") != nullptr) ||
            (strstr(target, "kreg_notifier") != nullptr)) {
            ++found;
            int fd = atoi(e->d_name);
            EXPECT_TRUE(fcntl(fd, F_GETFD) & FD_CLOEXEC) << target;
        }
    }
    closedir(d);
    EXPECT_GE(found, 1) << "no userfaultfd or kreg_notifier descriptor found";
    /* and a program exec'ed from here has none */
    FILE *out = popen("ls -l /proc/self/fd/ 2>/dev/null | grep -c -e userfaultfd "
                      "-e kreg_notifier", "r");
    ASSERT_NE(nullptr, out);
    int n = -1;
    EXPECT_EQ(1, fscanf(out, "%d", &n));
    pclose(out);
    EXPECT_EQ(0, n) << "an exec'ed program inherited the descriptor";
}

/* kreg_rcache_get's inline hit skips the kernel only where the backend's
 * hit needs none (the notifier's counter), and after a stop. */
TEST_P(Lifecycle, LookupAsksTheKernelOnlyWhereTheBackendNeedsIt)
{
    KREG_SKIP_FORKED_CHILD_UNDER_SANITIZER();
    auto r = run_child([] {
        kreg_caps_t caps;
        kreg_query(&caps);
        const int uffd = (caps.backend == KREG_BACKEND_UFFD);
        if (kreg_lookup_asks_kernel != uffd) {
            return child_failure(2, "running %s: lookups %s the kernel",
                                 kreg_backend_str(caps.backend),
                                 kreg_lookup_asks_kernel ? "ask" : "skip");
        }
        kreg_stop(); /* refs 1 -> 0 in this child */
        if (kreg_lookup_asks_kernel != 0) {
            return child_failure(3, "stopped, lookups still ask the kernel");
        }
        if (kreg_start() != UCS_OK) {
            return child_failure(4, "restart failed");
        }
        /* the restart reads UCX_KREG_BACKEND again (the fixture's is gone):
         * it may pick the other backend */
        kreg_query(&caps);
        return (kreg_lookup_asks_kernel == (caps.backend == KREG_BACKEND_UFFD)) ? 0 :
               child_failure(5, "restarted on %s: lookups %s the kernel",
                             kreg_backend_str(caps.backend),
                             kreg_lookup_asks_kernel ? "ask" : "skip");
    }, 15);
    EXPECT_EQ(0, r.status) << r.output;
}

TEST_P(Lifecycle, StartIsReferenceCounted)
{
    EXPECT_EQ(UCS_OK, kreg_start());
    kreg_stop();
    kreg_caps_t caps;
    kreg_query(&caps);
    EXPECT_TRUE(caps.running) << "an inner stop must not stop the source";
    EXPECT_TRUE(caps.external_event);
}

TEST_P(Lifecycle, StartStopFromManyThreads)
{
    std::vector<std::thread> threads;
    std::atomic<int> failures{0};
    for (int t = 0; t < 4; ++t) {
        threads.emplace_back([&failures] {
            for (int i = 0; i < 50; ++i) {
                failures += kreg_start() != UCS_OK;
                void *p = map_anon(page());
                {
                    scoped_watch w;
                    failures += w.watch(p, page()) != 1;
                }
                munmap(p, page());
                kreg_stop();
            }
        });
    }
    for (auto &t : threads) {
        t.join();
    }
    EXPECT_EQ(0, failures.load()) << "a start or a watch failed";
    kreg_caps_t caps;
    kreg_query(&caps);
    EXPECT_TRUE(caps.running);
}

TEST_P(Lifecycle, BadInputIsRefusedAndLosesNothing)
{
    kreg_reason_t why = KREG_REASON_NONE;
    scoped_watch w;
    EXPECT_EQ(0, w.watch(nullptr, 4096, &why));
    EXPECT_EQ(KREG_REASON_BAD_INPUT, why);
    EXPECT_FALSE(w.current()) << "a refused watch must never read as current";
    void *p = map_anon(4 * page());
    ASSERT_NE(nullptr, p);
    EXPECT_EQ(0, w.watch(p, 0, &why));
    EXPECT_EQ(KREG_REASON_BAD_INPUT, why);
    EXPECT_EQ(0, w.watch(reinterpret_cast<void *>(UINTPTR_MAX - 100), 4096, &why));
    EXPECT_EQ(KREG_REASON_BAD_INPUT, why);
    /* harmless no-ops */
    kreg_watch_t zero{};
    kreg_unwatch(&zero);
    w.unwatch();
    w.unwatch();
    EXPECT_EQ(0, kreg_prepare_lookup(nullptr, 0));

    /* unaligned: widened to the pages it touches */
    event_log log;
    char *c = static_cast<char *>(p);
    ASSERT_EQ(1, w.watch(c + 100, 10));
    ASSERT_EQ(0, munmap(c, page()));
    kreg_prepare_lookup(c + 100, 10);
    kreg_sync();
    EXPECT_TRUE(log.covers(c, page()));
    w.unwatch();
    munmap(c + page(), 3 * page());
}

/* A PROT_NONE range is watched (then its unmap is reported) or refused
 * with a reason (then it is registered uncached), never silently stale.
 * Which of the two is the kernel's and the backend's choice. */
struct prot_none_watch {
    void         *p       = nullptr;
    int           watched = 0;
    kreg_reason_t why     = KREG_REASON_NONE;
};

prot_none_watch watch_prot_none(scoped_watch *w)
{
    prot_none_watch r;
    r.p = mmap(nullptr, page(), PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (r.p != MAP_FAILED) {
        r.watched = w->watch(r.p, page(), &r.why);
    }
    return r;
}

TEST_P(Lifecycle, ProtNoneWatchedIsReportedOnUnmap)
{
    event_log log;
    scoped_watch w;
    const prot_none_watch pn = watch_prot_none(&w);
    ASSERT_NE(MAP_FAILED, pn.p) << strerror(errno);
    ASSERT_EQ(0, munmap(pn.p, page()));
    if (!pn.watched) {
        GTEST_SKIP() << "this backend refuses PROT_NONE here ("
                     << kreg_reason_str(pn.why)
                     << "); ProtNoneRefusedHasAReason covers this case";
    }
    kreg_prepare_lookup(pn.p, page());
    kreg_sync();
    EXPECT_TRUE(log.covers(pn.p, page())) << "the unmap of a watched PROT_NONE range "
                                             "was not reported";
}

TEST_P(Lifecycle, ProtNoneRefusedHasAReason)
{
    scoped_watch w;
    const prot_none_watch pn = watch_prot_none(&w);
    ASSERT_NE(MAP_FAILED, pn.p) << strerror(errno);
    const bool watched = pn.watched;
    w.unwatch();
    munmap(pn.p, page());
    if (watched) {
        GTEST_SKIP() << "this backend watches PROT_NONE here; "
                        "ProtNoneWatchedIsReportedOnUnmap covers this case";
    }
    EXPECT_NE(KREG_REASON_NONE, pn.why) << "a refused watch must say why";
}

INSTANTIATE_TEST_SUITE_P(Backends, Lifecycle, testing::Values(kUffd, kNotifier),
                         config_name);

/* userfaultfd registers the mappings in a range and skips its holes: a
 * hole mapped later would not be watched, so such a range is refused. */
TEST(UffdHoles, HoleInRangeIsNotWatched)
{
    scoped_source src(kUffd);
    ASSERT_EQ(UCS_OK, src.status());
    token_cache cache; /* first: its pools must not fill the hole */
    for (int attempt = 0;; ++attempt) {
        ASSERT_LT(attempt, 20) << "the hole was always filled by another mapping";
        char *p = static_cast<char *>(map_anon(3 * page()));
        ASSERT_NE(nullptr, p);
        ASSERT_EQ(0, munmap(p + page(), page()));
        kreg_reason_t why;
        scoped_watch w;
        EXPECT_EQ(0, w.watch(p, 3 * page(), &why));
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

} // namespace

/* Pages that change while being pinned (the notifier's counter moved
 * between watch and confirm): kreg_register_watched undoes the pin and
 * tries again, and memory that changes under every try is registered
 * uncached, never cached. */
struct change_while_pinned {
    void    *addr;
    size_t   len;
    int      changes_left; /* tries whose "pin" changes the pages */
    int      regs = 0, deregs = 0;

    static ucs_status_t reg(void *arg, void *, size_t)
    {
        auto *c = static_cast<change_while_pinned *>(arg);
        ++c->regs;
        if (c->changes_left-- > 0) {
            /* replaces the pages, as a migration or a racing madvise would */
            madvise(c->addr, c->len, MADV_DONTNEED);
        }
        return UCS_OK;
    }
    static void dereg(void *arg) { ++static_cast<change_while_pinned *>(arg)->deregs; }
};

TEST_P(Lifecycle, PagesThatChangeWhilePinnedAreRetriedThenRegisteredUncached)
{
    if (std::string(GetParam().backend) != "notifier") {
        GTEST_SKIP() << "userfaultfd's confirm sees no page change (a change while "
                        "pinning reaches the rcache as an event instead); the "
                        "notifier configuration of this test covers the retry";
    }
    const size_t len = 4 * page();
    void *p = map_anon(len);
    ASSERT_NE(nullptr, p);
    memset(p, 1, len);
    kreg_stats_t before, after;
    kreg_get_stats(&before);

    /* changes on every try: given up, uncached, nothing left registered */
    change_while_pinned always{p, len, 1000};
    kreg_watch_t w{};
    kreg_reason_t why = KREG_REASON_NONE;
    EXPECT_EQ(UCS_ERR_REJECTED,
              kreg_register_watched(p, len, &w, change_while_pinned::reg,
                                    change_while_pinned::dereg, &always, &why))
            << "memory that changes under every pin was cached";
    EXPECT_EQ(KREG_REASON_CHANGED, why) << kreg_reason_str(why);
    EXPECT_EQ(always.regs, always.deregs) << "a changed pin was not undone";
    EXPECT_GT(always.regs, 1) << "it gave up without trying again";
    EXPECT_FALSE(kreg_watch_is_current(&w)) << "a refused watch reads as current";
    kreg_get_stats(&after);
    EXPECT_EQ(before.fallbacks[KREG_REASON_CHANGED] + 1,
              after.fallbacks[KREG_REASON_CHANGED]);
    EXPECT_EQ(before.watched_ranges, after.watched_ranges) << "a watch was left behind";

    /* changes on the first try only (a write fault on the zero page): the
     * second try is cached */
    change_while_pinned once{p, len, 1};
    ASSERT_EQ(UCS_OK, kreg_register_watched(p, len, &w, change_while_pinned::reg,
                                            change_while_pinned::dereg, &once, &why))
            << kreg_reason_str(why);
    EXPECT_EQ(2, once.regs) << "one retry expected";
    EXPECT_EQ(1, once.deregs) << "the changed pin was not undone";
    EXPECT_TRUE(kreg_watch_is_current(&w));
    kreg_unwatch(&w);
    munmap(p, len);
}
