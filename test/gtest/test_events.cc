/* Every way the kernel reports a watched range going away reaches UCM's
 * VM_UNMAPPED handlers, in each mode, by the time the next lookup returns. */
#include "kreg_test.h"

#include <fcntl.h>
#include <liburing.h>
#include <sys/ipc.h>
#include <sys/mman.h>
#include <sys/shm.h>
#include <sys/syscall.h>
#include <unistd.h>

using namespace kreg_test;

namespace {

class Events : public testing::TestWithParam<const char *> {
protected:
    void SetUp() override
    {
        source_ = std::make_unique<Source>(GetParam());
        ASSERT_EQ(UCS_OK, source_->status()) << "kreg_start failed";
        log_ = std::make_unique<EventLog>();
    }
    void TearDown() override
    {
        log_.reset();
        source_.reset();
    }
    /* What a lookup in the same thread does first: after it, every event
     * of a munmap that has returned is dispatched. */
    void lookup_barrier(void *addr, size_t len) { kreg_prepare_lookup(addr, len); }
    void *watched(size_t len)
    {
        void *p = map_anon(len);
        EXPECT_NE(nullptr, p);
        EXPECT_EQ(1, kreg_watch(p, len, nullptr));
        return p;
    }

    std::unique_ptr<Source>   source_;
    std::unique_ptr<EventLog> log_;
};

const size_t len = 16 * 4096;

TEST_P(Events, Munmap)
{
    void *p = watched(len);
    ASSERT_EQ(0, munmap(p, len));
    lookup_barrier(p, len);
    EXPECT_TRUE(log_->covers(p, len));
    kreg_unwatch(p, len);
}

TEST_P(Events, RawSyscallMunmap)
{
    void *p = watched(len);
    ASSERT_EQ(0, syscall(SYS_munmap, p, len));
    lookup_barrier(p, len);
    EXPECT_TRUE(log_->covers(p, len));
    kreg_unwatch(p, len);
}

TEST_P(Events, MapFixedOver)
{
    void *p = watched(len);
    void *q = mmap(p, len, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
    ASSERT_EQ(p, q);
    lookup_barrier(p, len);
    EXPECT_TRUE(log_->covers(p, len));
    kreg_unwatch(p, len);
    munmap(p, len);
}

TEST_P(Events, MremapShrinkReportsTail)
{
    char *p = static_cast<char *>(watched(len));
    ASSERT_EQ(p, mremap(p, len, len / 2, 0));
    lookup_barrier(p + len / 2, len / 2);
    EXPECT_TRUE(log_->covers(p + len / 2, len / 2));
    EXPECT_FALSE(log_->covers(p, len / 2));
    kreg_unwatch(p, len);
    munmap(p, len / 2);
}

TEST_P(Events, MremapMove)
{
    void *p, *q, *n;
    for (int attempt = 0;; ++attempt) {
        ASSERT_LT(attempt, 20) << "the freed address was always taken first";
        p            = watched(len);
        void *target = map_anon(len);
        ASSERT_NE(nullptr, target);
        q = mremap(p, len, len, MREMAP_MAYMOVE | MREMAP_FIXED, target);
        ASSERT_EQ(target, q);
        /* new memory where the buffer was, as an allocator would hand out;
         * another thread (an allocator, the dispatcher) may take it first */
        n = map_anon(len, p, MAP_FIXED_NOREPLACE);
        if (n == p) {
            break;
        }
        kreg_unwatch(p, len);
        munmap(q, len);
        if (n != nullptr) {
            munmap(n, len);
        }
    }
    kreg_caps_t caps;
    kreg_query(&caps);
    const int watched_now = kreg_prepare_lookup(p, len);
    if (caps.event_remap) {
        /* sync/plain: the kernel reported the move */
        EXPECT_TRUE(log_->covers(p, len));
    } else {
        /* verify: no REMAP feature; the lookup found the range changed
         * and reported it itself */
        EXPECT_EQ(0, watched_now);
        EXPECT_TRUE(log_->covers(p, len));
        /* and the moved mapping did not carry the watch along */
        EXPECT_EQ(0, kreg_prepare_lookup(q, len));
    }
    kreg_unwatch(p, len);
    munmap(n, len);
    munmap(q, len);
}

TEST_P(Events, MadviseDontneed)
{
    void *p = watched(len);
    ASSERT_EQ(0, madvise(p, len, MADV_DONTNEED));
    lookup_barrier(p, len);
    EXPECT_TRUE(log_->covers(p, len));
    kreg_unwatch(p, len);
    munmap(p, len);
}

TEST_P(Events, RawSyscallMadvise)
{
    void *p = watched(len);
    ASSERT_EQ(0, syscall(SYS_madvise, p, len, MADV_DONTNEED));
    lookup_barrier(p, len);
    EXPECT_TRUE(log_->covers(p, len));
    kreg_unwatch(p, len);
    munmap(p, len);
}

TEST_P(Events, MadviseRemoveShmem)
{
    void *p = mmap(nullptr, len, PROT_READ | PROT_WRITE,
                   MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    ASSERT_NE(MAP_FAILED, p);
    memset(p, 1, len);
    ASSERT_EQ(1, kreg_watch(p, len, nullptr));
    ASSERT_EQ(0, madvise(p, len, MADV_REMOVE));
    lookup_barrier(p, len);
    EXPECT_TRUE(log_->covers(p, len));
    kreg_unwatch(p, len);
    munmap(p, len);
}

TEST_P(Events, IoUringMadvise)
{
    struct io_uring ring;
    if (io_uring_queue_init(4, &ring, 0) != 0) {
        GTEST_SKIP() << "io_uring unavailable";
    }
    void *p = watched(len);
    struct io_uring_sqe *sqe = io_uring_get_sqe(&ring);
    io_uring_prep_madvise(sqe, p, len, MADV_DONTNEED);
    ASSERT_EQ(1, io_uring_submit(&ring));
    struct io_uring_cqe *cqe;
    ASSERT_EQ(0, io_uring_wait_cqe(&ring, &cqe));
    EXPECT_EQ(0, cqe->res);
    io_uring_cqe_seen(&ring, cqe);
    io_uring_queue_exit(&ring);
    lookup_barrier(p, len);
    EXPECT_TRUE(log_->covers(p, len));
    kreg_unwatch(p, len);
    munmap(p, len);
}

TEST_P(Events, Shmdt)
{
    int id = shmget(IPC_PRIVATE, len, IPC_CREAT | 0600);
    ASSERT_GE(id, 0);
    void *p = shmat(id, nullptr, 0);
    shmctl(id, IPC_RMID, nullptr);
    ASSERT_NE(reinterpret_cast<void *>(-1), p);
    memset(p, 1, len);
    kreg_caps_t caps;
    kreg_query(&caps);
    kreg_reason_t why;
    const int w = kreg_watch(p, len, &why);
    if (!caps.wp_async) {
        /* SysV segments are not shmem to the write-protect code (their
         * vm_ops are ipc's): without WP_ASYNC they are registered uncached */
        EXPECT_EQ(0, w);
        EXPECT_EQ(KREG_REASON_EINVAL, why);
        shmdt(p);
        return;
    }
    ASSERT_EQ(1, w);
    ASSERT_EQ(0, shmdt(p));
    kreg_sync();
    /* Linux pins this: shmdt unmaps without a userfaultfd UNMAP event
     * (ipc/shm.c passes no unmap list to do_vmi_align_munmap) */
    EXPECT_FALSE(log_->covers(p, len));
    /* new memory there: only an exact check at lookup can see it */
    void *q = map_anon(len, p, MAP_FIXED_NOREPLACE);
    if (q != p) {
        /* another thread (an allocator, the dispatcher) took it first */
        kreg_unwatch(p, len);
        if (q != nullptr) {
            munmap(q, len);
        }
        GTEST_SKIP() << "the detached address was taken by another mapping";
    }
    int watched_now = kreg_prepare_lookup(p, len);
    if (is_verify(GetParam())) {
        EXPECT_EQ(0, watched_now);
        EXPECT_TRUE(log_->covers(p, len));
    }
    kreg_unwatch(p, len);
    munmap(q, len);
}

TEST_P(Events, BrkShrink)
{
    KREG_SKIP_FORKED_CHILD_UNDER_SANITIZER();
    /* in a child: the heap top must not move under us */
    auto res = run_child([] {
        EventLog log;
        char *top = static_cast<char *>(sbrk(0));
        const size_t grow = 64 * 4096;
        char *base = reinterpret_cast<char *>(
            (reinterpret_cast<uintptr_t>(top) + 4095) & ~uintptr_t(4095));
        if (sbrk(static_cast<intptr_t>(base + grow - top)) == reinterpret_cast<void *>(-1)) {
            return 2;
        }
        memset(base, 1, grow);
        if (!kreg_watch(base, grow, nullptr)) {
            return 3;
        }
        if (sbrk(-static_cast<intptr_t>(grow)) == reinterpret_cast<void *>(-1)) {
            return 4;
        }
        kreg_prepare_lookup(base, grow);
        return log.covers(base, grow) ? 0 : 5;
    });
    EXPECT_EQ(0, res.status) << res.output;
}

TEST_P(Events, FileMapping)
{
    kreg_caps_t caps;
    kreg_query(&caps);
    char path[] = "/var/tmp/kreg-file-XXXXXX";
    int fd = mkstemp(path);
    ASSERT_GE(fd, 0);
    unlink(path);
    ASSERT_EQ(0, ftruncate(fd, len));
    void *p = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    ASSERT_NE(MAP_FAILED, p);
    kreg_reason_t why;
    int w = kreg_watch(p, len, &why);
    if (!caps.wp_async) {
        /* without WP_ASYNC the kernel refuses file mappings: uncached */
        EXPECT_EQ(0, w);
        EXPECT_EQ(KREG_REASON_EINVAL, why);
        munmap(p, len);
        return;
    }
    ASSERT_EQ(1, w);
    ASSERT_EQ(0, munmap(p, len));
    lookup_barrier(p, len);
    EXPECT_TRUE(log_->covers(p, len));
    kreg_unwatch(p, len);
}

TEST_P(Events, UnwatchedRangeReportsNothing)
{
    void *p = map_anon(len);
    ASSERT_NE(nullptr, p);
    ASSERT_EQ(0, munmap(p, len));
    kreg_sync();
    EXPECT_FALSE(log_->covers(p, len));
}

TEST_P(Events, WatchersAreCounted)
{
    void *p = watched(len);
    ASSERT_EQ(1, kreg_watch(p, len, nullptr)); /* a second watcher */
    kreg_unwatch(p, len);
    /* one watcher left: still watched */
    if (is_verify(GetParam())) {
        EXPECT_EQ(1, kreg_prepare_lookup(p, len));
    }
    kreg_unwatch(p, len);
    /* none left: the kernel no longer reports it */
    ASSERT_EQ(0, munmap(p, len));
    kreg_sync();
    EXPECT_FALSE(log_->covers(p, len));
}

TEST_P(Events, OverlappingWatchersKeepTheOverlap)
{
    char *p = static_cast<char *>(map_anon(3 * len));
    ASSERT_NE(nullptr, p);
    ASSERT_EQ(1, kreg_watch(p, 2 * len, nullptr));
    ASSERT_EQ(1, kreg_watch(p + len, 2 * len, nullptr));
    kreg_unwatch(p, 2 * len);
    kreg_stats_t st;
    kreg_get_stats(&st);
    EXPECT_GE(st.watched_bytes, 2 * len);
    ASSERT_EQ(0, munmap(p + len, 2 * len)); /* the part still watched */
    kreg_prepare_lookup(p + len, 2 * len);
    EXPECT_TRUE(log_->covers(p + len, 2 * len));
    kreg_unwatch(p + len, 2 * len);
    munmap(p, len);
}

INSTANTIATE_TEST_SUITE_P(Modes, Events, testing::Values("plain", "sync", "verify", "verify-wp"),
                         [](const auto &info) {
                             std::string n(info.param);
                             return n == "verify-wp" ? std::string("verify_wp") : n;
                         });

} // namespace
