/* Every way the kernel changes a watched range is seen, by every backend:
 * the uffd backend reports it through UCM by the time the next lookup
 * returns; the notifier backend moves the range's counter before the
 * changing call returns, and reports it through UCM soon after.
 * "Reported by the kernel" is counted apart from what a lookup's own check
 * found (stats.dispatched), so a test cannot pass on the check alone.
 *
 * Over 350 lines: one suite (Events), one case per kernel event,
 * all on one fixture.
 */
#include "kreg_test.h"

#include <fcntl.h>
#include <liburing.h>
#include <sys/ipc.h>
#include <sys/mman.h>
#include <sys/shm.h>
#include <sys/syscall.h>
#include <unistd.h>

#ifndef MREMAP_DONTUNMAP
#define MREMAP_DONTUNMAP 4
#endif

using namespace kreg_test;

namespace {

const size_t len = 16 * 4096;

class Events : public testing::TestWithParam<source_config> {
protected:
    void SetUp() override
    {
        KREG_START_OR_SKIP(source_, GetParam());
        kreg_caps_t caps;
        kreg_query(&caps);
        notifier_ = caps.backend == KREG_BACKEND_NOTIFIER;
        plain_    = caps.mode == KREG_MODE_PLAIN;
        log_      = std::make_unique<event_log>();
        reports_  = kernel_reports();
    }
    void TearDown() override
    {
        log_.reset();
        source_.reset();
    }

    void *watched(scoped_watch &w, size_t n = len)
    {
        void *p = map_anon(n);
        EXPECT_NE(nullptr, p);
        EXPECT_EQ(1, w.watch(p, n)) << "a private anonymous mapping must be watchable";
        return p;
    }

    /* After a change of [addr, addr+n) has returned: the kernel said so,
     * through the backend's own reader, and UCM heard it. */
    void expect_reported(scoped_watch &w, const void *addr, size_t n)
    {
        if (notifier_ && !plain_) {
            EXPECT_FALSE(w.current())
                << "the range's counter did not move before the change returned";
        }
        /* uffd: the lookup waits for the event; notifier: sync waits for
         * the reader */
        kreg_prepare_lookup(const_cast<void *>(addr), n);
        kreg_sync();
        EXPECT_GT(kernel_reports(), reports_) << "no event came from the kernel";
        EXPECT_TRUE(log_->covers(addr, n)) << "UCM never heard of the change";
    }

    /* The pages stayed: no counter moved, nothing reported. */
    void expect_not_reported(scoped_watch &w, const void *addr, size_t n)
    {
        kreg_prepare_lookup(const_cast<void *>(addr), n);
        kreg_sync();
        EXPECT_TRUE(w.current()) << "a change that keeps the pages moved the counter";
        EXPECT_FALSE(log_->covers(addr, n)) << "a change that keeps the pages was reported";
    }

    std::unique_ptr<scoped_source>   source_;
    std::unique_ptr<event_log> log_;
    uint64_t                  reports_  = 0;
    bool                      notifier_ = false, plain_ = false;
};

TEST_P(Events, MunmapIsReported)
{
    scoped_watch w;
    void *p = watched(w);
    ASSERT_EQ(0, munmap(p, len));
    expect_reported(w, p, len);
}

TEST_P(Events, RawSyscallMunmapIsReported)
{
    scoped_watch w;
    void *p = watched(w);
    ASSERT_EQ(0, syscall(SYS_munmap, p, len));
    expect_reported(w, p, len);
}

TEST_P(Events, MunmapOfOnePageInsideIsReported)
{
    scoped_watch w;
    char *p = static_cast<char *>(watched(w));
    ASSERT_EQ(0, munmap(p + 4 * page(), page()));
    expect_reported(w, p + 4 * page(), page());
    munmap(p, len);
}

TEST_P(Events, MapFixedOverIsReported)
{
    scoped_watch w;
    void *p = watched(w);
    void *q = mmap(p, len, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
    ASSERT_EQ(p, q);
    expect_reported(w, p, len);
    munmap(p, len);
}

TEST_P(Events, MremapShrinkReportsTheTailOnly)
{
    scoped_watch w;
    char *p = static_cast<char *>(watched(w));
    ASSERT_EQ(p, mremap(p, len, len / 2, 0));
    expect_reported(w, p + len / 2, len / 2);
    if (!notifier_) {
        /* the notifier reports a registration's whole range (wider is
         * still correct); userfaultfd the part unmapped */
        EXPECT_FALSE(log_->covers(p, len / 2)) << "the part kept was reported too";
    }
    munmap(p, len / 2);
}

TEST_P(Events, MremapMoveReportsTheOldRange)
{
    scoped_watch w;
    void *p      = watched(w);
    void *target = map_anon(len);
    ASSERT_NE(nullptr, target);
    void *q = mremap(p, len, len, MREMAP_MAYMOVE | MREMAP_FIXED, target);
    ASSERT_EQ(target, q);
    expect_reported(w, p, len);
    munmap(q, len);
}

/* glibc 2.36's mremap() mishandles DONTUNMAP: the raw syscall. */
TEST_P(Events, MremapDontunmapReportsTheOldRange)
{
    scoped_watch w;
    char *p = static_cast<char *>(watched(w));
    void *q = reinterpret_cast<void *>(
            syscall(SYS_mremap, p, len, len, MREMAP_MAYMOVE | MREMAP_DONTUNMAP, 0));
    ASSERT_NE(MAP_FAILED, q) << strerror(errno);
    /* the old range stays mapped, on new (empty) pages */
    expect_reported(w, p, len);
    EXPECT_EQ(0, p[0]) << "the old range should read as fresh memory";
    munmap(q, len);
    munmap(p, len);
}

TEST_P(Events, MadviseDontneedIsReported)
{
    scoped_watch w;
    void *p = watched(w);
    ASSERT_EQ(0, madvise(p, len, MADV_DONTNEED));
    expect_reported(w, p, len);
    munmap(p, len);
}

TEST_P(Events, RawSyscallMadviseIsReported)
{
    scoped_watch w;
    void *p = watched(w);
    ASSERT_EQ(0, syscall(SYS_madvise, p, len, MADV_DONTNEED));
    expect_reported(w, p, len);
    munmap(p, len);
}

TEST_P(Events, MadviseRemoveOfSharedMemoryIsReported)
{
    void *p = mmap(nullptr, len, PROT_READ | PROT_WRITE,
                   MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    ASSERT_NE(MAP_FAILED, p);
    memset(p, 1, len);
    scoped_watch w;
    ASSERT_EQ(1, w.watch(p, len)) << "shared anonymous memory must be watchable";
    ASSERT_EQ(0, madvise(p, len, MADV_REMOVE));
    expect_reported(w, p, len);
    munmap(p, len);
}

TEST_P(Events, IoUringMadviseIsReported)
{
    struct io_uring ring;
    if (io_uring_queue_init(4, &ring, 0) != 0) {
        GTEST_SKIP() << "io_uring unavailable";
    }
    scoped_watch w;
    void *p = watched(w);
    struct io_uring_sqe *sqe = io_uring_get_sqe(&ring);
    io_uring_prep_madvise(sqe, p, len, MADV_DONTNEED);
    ASSERT_EQ(1, io_uring_submit(&ring));
    struct io_uring_cqe *cqe;
    ASSERT_EQ(0, io_uring_wait_cqe(&ring, &cqe));
    EXPECT_EQ(0, cqe->res);
    io_uring_cqe_seen(&ring, cqe);
    io_uring_queue_exit(&ring);
    expect_reported(w, p, len);
    munmap(p, len);
}

TEST_P(Events, BrkShrinkIsReported)
{
    KREG_SKIP_FORKED_CHILD_UNDER_SANITIZER();
    const bool notifier = notifier_ && !plain_;
    /* in a child: the heap top must not move under us */
    auto res = run_child([notifier] {
        event_log log;
        /* the child's first call restarts the source, which allocates:
         * before the heap top is taken */
        kreg_caps_t caps;
        kreg_query(&caps);
        char *top = static_cast<char *>(sbrk(0));
        const size_t grow = 64 * 4096;
        char *base = reinterpret_cast<char *>(
            (reinterpret_cast<uintptr_t>(top) + 4095) & ~uintptr_t(4095));
        if (sbrk(static_cast<intptr_t>(base + grow - top)) == reinterpret_cast<void *>(-1)) {
            return child_failure(2, "sbrk cannot grow the heap: %s", strerror(errno));
        }
        memset(base, 1, grow);
        scoped_watch w;
        if (!w.watch(base, grow)) {
            return child_failure(3, "the grown heap could not be watched");
        }
        if (sbrk(-static_cast<intptr_t>(grow)) == reinterpret_cast<void *>(-1)) {
            return child_failure(4, "sbrk cannot shrink the heap: %s", strerror(errno));
        }
        if (notifier && w.current()) {
            return child_failure(5, "the notifier's watch is still current after the "
                                     "heap shrank");
        }
        kreg_prepare_lookup(base, grow);
        kreg_sync();
        return log.covers(base, grow) ?
               0 : child_failure(6, "the heap's shrink was not reported to UCM");
    });
    EXPECT_EQ(0, res.status) << res.output;
}

/* Page-cache memory: watchable by the notifier always, by userfaultfd
 * only with WP_ASYNC (Linux 6.7+). A shared mapping of a real file (not
 * tmpfs), or the reason there is none. */
void *map_real_file(size_t len, std::string *no_file)
{
    const int fd = real_file(len, no_file);
    if (fd < 0) {
        return nullptr;
    }
    void *p = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (p == MAP_FAILED) {
        *no_file = std::string("mmap of the file: ") + strerror(errno);
        return nullptr;
    }
    return p;
}

/* The mapping a FileMapping test watches, or nullptr with the reason to
 * skip in *skip: no real file here, or the backend's case is the other
 * test's (watchable: the test pins a backend that watches files). */
void *file_mapping_for_case(bool notifier, bool watchable, size_t len, std::string *skip)
{
    kreg_caps_t caps;
    kreg_query(&caps);
    if ((notifier || caps.wp_async) != watchable) {
        *skip = watchable ?
                "userfaultfd without WP_ASYNC (Linux < 6.7, or UCX_KREG_WP_ASYNC=n) "
                "cannot watch files; FileMappingIsRefusedWithoutWpAsync covers this case" :
                "this backend watches files here (the notifier, or userfaultfd with "
                "WP_ASYNC); FileMappingUnmapIsReported covers this case";
        return nullptr;
    }
    return map_real_file(len, skip);
}

TEST_P(Events, FileMappingUnmapIsReported)
{
    std::string skip;
    void *p = file_mapping_for_case(notifier_, true, len, &skip);
    if (p == nullptr) {
        GTEST_SKIP() << skip;
    }
    scoped_watch w;
    kreg_reason_t why;
    ASSERT_EQ(1, w.watch(p, len, &why)) << kreg_reason_str(why);
    ASSERT_EQ(0, munmap(p, len));
    expect_reported(w, p, len);
}

TEST_P(Events, FileMappingIsRefusedWithoutWpAsync)
{
    std::string skip;
    void *p = file_mapping_for_case(notifier_, false, len, &skip);
    if (p == nullptr) {
        GTEST_SKIP() << skip;
    }
    scoped_watch w;
    kreg_reason_t why;
    EXPECT_EQ(0, w.watch(p, len, &why)) << "without WP_ASYNC userfaultfd cannot watch files";
    EXPECT_EQ(KREG_REASON_EINVAL, why) << kreg_reason_str(why);
    munmap(p, len);
}

/* hugetlbfs memory is registered with userfaultfd in whole huge pages: a
 * buffer inside one is watched (widened), not refused. */
/* Reserves two more 2 MiB pages for the test where it may (root), and
 * gives them back. */
class huge_page_reserve {
public:
    huge_page_reserve()
    {
        FILE *f = fopen(kPath, "r");
        if ((f != nullptr) && (fscanf(f, "%ld", &old_) == 1)) {
            fclose(f);
            f = fopen(kPath, "w");
            if (f != nullptr) {
                fprintf(f, "%ld\n", old_ + 2);
                raised_ = fclose(f) == 0;
            }
        } else if (f != nullptr) {
            fclose(f);
        }
    }
    ~huge_page_reserve()
    {
        FILE *f = raised_ ? fopen(kPath, "w") : nullptr;
        if (f != nullptr) {
            fprintf(f, "%ld\n", old_);
            fclose(f);
        }
    }

private:
    static constexpr const char *kPath = "/proc/sys/vm/nr_hugepages";
    long old_    = 0;
    bool raised_ = false;
};

TEST_P(Events, HugetlbBufferIsWatchedAndItsUnmapReported)
{
    const size_t huge = 2 << 20;
    huge_page_reserve reserve;
    char *p = static_cast<char *>(mmap(nullptr, huge, PROT_READ | PROT_WRITE,
                                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_HUGETLB, -1, 0));
    if (p == MAP_FAILED) {
        GTEST_SKIP() << "no 2 MiB huge page free and vm.nr_hugepages not writable "
                        "(not root)";
    }
    memset(p, 1, huge);
    scoped_watch w;
    kreg_reason_t why;
    ASSERT_EQ(1, w.watch(p + 64 * 1024, 64 * 1024, &why)) << kreg_reason_str(why);
    ASSERT_EQ(0, munmap(p, huge));
    expect_reported(w, p + 64 * 1024, 64 * 1024);
}

TEST_P(Events, UnmapNextToAWatchIsNotReported)
{
    char *p = static_cast<char *>(map_anon(2 * len));
    ASSERT_NE(nullptr, p);
    scoped_watch w;
    ASSERT_EQ(1, w.watch(p, len));
    ASSERT_EQ(0, munmap(p + len, len)); /* the unwatched neighbour */
    expect_not_reported(w, p + len, len);
    munmap(p, len);
}

TEST_P(Events, MprotectKeepsThePages)
{
    scoped_watch w;
    void *p = watched(w);
    ASSERT_EQ(0, mprotect(p, len, PROT_READ));
    ASSERT_EQ(0, mprotect(p, len, PROT_READ | PROT_WRITE));
    expect_not_reported(w, p, len);
    munmap(p, len);
}

TEST_P(Events, WritesKeepThePages)
{
    scoped_watch w;
    void *p = watched(w);
    memset(p, 7, len);
    expect_not_reported(w, p, len);
    munmap(p, len);
}

/* An unwatched range stays registered for a while (a cache registers the
 * same buffers again and again), but not for ever: once hundreds more were
 * unwatched after it, the kernel no longer reports it. */
TEST_P(Events, LongUnwatchedRangesAreNoLongerReported)
{
    const int n = 600;
    char *area  = static_cast<char *>(map_anon(2 * n * page()));
    ASSERT_NE(nullptr, area);
    for (int i = 0; i < n; ++i) {
        scoped_watch w;
        ASSERT_EQ(1, w.watch(area + 2 * i * page(), page()));
    }
    ASSERT_EQ(0, munmap(area, page())); /* the first one unwatched */
    kreg_prepare_lookup(area, page());
    kreg_sync();
    EXPECT_FALSE(log_->covers(area, page()))
            << "a range unwatched 600 watches ago is still registered";
    munmap(area + page(), (2 * n - 1) * page());
}

TEST_P(Events, WatchersAreCounted)
{
    scoped_watch a, b;
    void *p = watched(a);
    ASSERT_EQ(1, b.watch(p, len)); /* a second watcher */
    a.unwatch();
    /* one watcher left: still watched */
    ASSERT_EQ(0, munmap(p, len));
    expect_reported(b, p, len);
}

TEST_P(Events, OverlappingWatchersKeepTheOverlap)
{
    char *p = static_cast<char *>(map_anon(3 * len));
    ASSERT_NE(nullptr, p);
    scoped_watch a, b;
    ASSERT_EQ(1, a.watch(p, 2 * len));
    ASSERT_EQ(1, b.watch(p + len, 2 * len));
    a.unwatch();
    kreg_stats_t st;
    kreg_get_stats(&st);
    EXPECT_GE(st.watched_bytes, 2 * len);
    ASSERT_EQ(0, munmap(p + len, 2 * len)); /* the part still watched */
    expect_reported(b, p + len, 2 * len);
    munmap(p, len);
}

INSTANTIATE_TEST_SUITE_P(Backends, Events, testing::ValuesIn(all_configs()),
                         config_name);

} // namespace
