/* The reader and dispatcher threads of the userfaultfd backend (see
 * monitor.h). Over 350 lines: one class, its two loops sharing the queue
 * and the counters lookups wait on. */
#include "monitor.h"

#include "dispatch.h"
#include "page.h"
#include "thread.h"
#include "uffd.h"

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <ctime>
#include <linux/futex.h>
#include <linux/userfaultfd.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <ucs/debug/log_def.h>

namespace kreg {

namespace {

uint64_t now_ns()
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + ts.tv_nsec;
}

void update_max(std::atomic<uint64_t> &max, uint64_t v)
{
    uint64_t cur = max.load(std::memory_order_relaxed);
    while (v > cur && !max.compare_exchange_weak(cur, v)) {
    }
}

/* std::atomic<uint32_t>::wait has no timeout */
void futex_wait_for(std::atomic<uint32_t> &word, uint32_t seen, unsigned timeout_us)
{
    struct timespec ts = {static_cast<time_t>(timeout_us / 1000000),
                          static_cast<long>(timeout_us % 1000000) * 1000};
    syscall(SYS_futex, reinterpret_cast<uint32_t *>(&word), FUTEX_WAIT_PRIVATE,
            seen, &ts, nullptr, 0);
}

/* a before b, with wrap-around */
bool seq_before(uint32_t a, uint32_t b)
{
    return static_cast<int32_t>(a - b) < 0;
}

} // namespace

monitor::monitor(const uffd &uffd, size_t queue_size, gone_fn gone, void *gone_ctx) :
    uffd_(uffd), gone_(gone), gone_ctx_(gone_ctx), ring_(std::max<size_t>(queue_size, 16))
{
}

monitor::~monitor()
{
    stop_reader();
    stop_dispatcher();
}

bool monitor::start(std::string *error)
{
    wake_fd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (wake_fd_ < 0) {
        *error = std::string("eventfd: ") + strerror(errno);
        return false;
    }
    stopping_ = false;
    int rc = start_thread(&reader_, reader_main, this, "kreg-reader");
    reader_running_ = (rc == 0);
    if (rc == 0) {
        rc = start_thread(&dispatcher_, dispatcher_main, this, "kreg-dispatch");
        dispatcher_running_ = (rc == 0);
    }
    if (rc != 0) {
        *error = std::string("pthread_create: ") + strerror(rc);
        stop_reader();
        ::close(wake_fd_);
        wake_fd_ = -1;
        return false;
    }
    return true;
}

void monitor::stop_reader()
{
    stopping_ = true;
    if (reader_running_) {
        uint64_t one = 1;
        (void)!write(wake_fd_, &one, sizeof(one));
        pthread_join(reader_, nullptr);
        reader_running_ = false;
    }
}

void monitor::stop_dispatcher()
{
    stopping_ = true;
    if (dispatcher_running_) {
        wake_dispatcher(); /* its last round */
        pthread_join(dispatcher_, nullptr);
        dispatcher_running_ = false;
    }
    if (wake_fd_ >= 0) {
        ::close(wake_fd_);
        wake_fd_ = -1;
    }
}

void monitor::forget_after_fork()
{
    /* The threads and their locks belong to the parent; the child only
     * closes its copy of the eventfd. */
    reader_running_ = dispatcher_running_ = false;
    if (wake_fd_ >= 0) {
        ::close(wake_fd_);
        wake_fd_ = -1;
    }
}

void *monitor::reader_main(void *arg)
{
    static_cast<monitor *>(arg)->read_loop();
    return nullptr;
}

void *monitor::dispatcher_main(void *arg)
{
    static_cast<monitor *>(arg)->dispatch_loop();
    return nullptr;
}

void monitor::wake_dispatcher()
{
    wake_dispatcher_.fetch_add(1);
    wake_dispatcher_.notify_all();
}

bool monitor::uffd_has_events() const
{
    struct pollfd pfd = {uffd_.fd(), POLLIN, 0};
    int n;
    do {
        n = poll(&pfd, 1, 0);
    } while (n < 0 && errno == EINTR);
    return n > 0 && (pfd.revents & POLLIN);
}

void monitor::push(uintptr_t start, uintptr_t end, uint32_t count, bool gone)
{
    std::lock_guard<std::mutex> guard(q_lock_);
    if ((used_ == 0) && (overflow_.count == 0)) {
        batch_read_ns_ = now_ns();
    }
    if (used_ < ring_.size()) {
        ring_[(head_ + used_) % ring_.size()] = queue_entry{start, end, count, gone};
        ++used_;
        return;
    }
    /* Full: never block the reader, widen one range instead (not "gone":
     * the wider range was not all unmapped). */
    if ((overflow_.count == 0) || (overflow_.start == overflow_.end)) {
        overflow_.start = start;
        overflow_.end   = end;
    } else if (start != end) {
        overflow_.start = std::min(overflow_.start, start);
        overflow_.end   = std::max(overflow_.end, end);
    }
    overflow_.count += count;
    coalesced_.fetch_add(1, std::memory_order_relaxed);
}

void monitor::handle_msgs(const void *buf, size_t n)
{
    const auto *msgs = static_cast<const struct uffd_msg *>(buf);
    for (size_t i = 0; i < n; ++i) {
        const struct uffd_msg &m = msgs[i];
        switch (m.event) {
        case UFFD_EVENT_UNMAP:
        case UFFD_EVENT_REMOVE:
            events_[m.event == UFFD_EVENT_UNMAP ? KREG_EV_UNMAP : KREG_EV_REMOVE]
                .fetch_add(1, std::memory_order_relaxed);
            push(m.arg.remove.start, m.arg.remove.end, 1, m.event == UFFD_EVENT_UNMAP);
            break;
        case UFFD_EVENT_REMAP:
            events_[KREG_EV_REMAP].fetch_add(1, std::memory_order_relaxed);
            /* The old range moved away (with DONTUNMAP it stays mapped, on
             * new pages); whatever was cached at the new one belonged to
             * the mapping the move replaced. */
            push(m.arg.remap.from, m.arg.remap.from + m.arg.remap.len, 1, true);
            push(m.arg.remap.to, m.arg.remap.to + m.arg.remap.len, 0, false);
            break;
        case UFFD_EVENT_PAGEFAULT: {
            /* Never expected: no page is write-protected. Resolve it so the
             * faulting thread goes on. */
            events_[KREG_EV_UNEXPECTED].fetch_add(1, std::memory_order_relaxed);
            const uintptr_t page = static_cast<uintptr_t>(page_size());
            struct uffdio_writeprotect wp = {};
            wp.range.start = m.arg.pagefault.address & ~(page - 1);
            wp.range.len   = page;
            ioctl(uffd_.fd(), UFFDIO_WRITEPROTECT, &wp);
            push(0, 0, 1, false);
            break;
        }
        default:
            events_[KREG_EV_UNEXPECTED].fetch_add(1, std::memory_order_relaxed);
            push(0, 0, 1, false);
            break;
        }
    }
    read_seq_.fetch_add(static_cast<uint32_t>(n));
}

void monitor::read_loop()
{
    struct uffd_msg msgs[64];
    struct pollfd pfd[2] = {{uffd_.fd(), POLLIN, 0}, {wake_fd_, POLLIN, 0}};
    bool warned = false;

    while (!stopping_.load(std::memory_order_relaxed)) {
        int rc = poll(pfd, 2, -1);
        if (rc < 0) {
            if (errno != EINTR && !warned) {
                warned = true;
                ucs_error("kreg reader: poll failed: %s", strerror(errno));
            }
            continue;
        }
        if (pfd[1].revents) {
            break;
        }
        if (!(pfd[0].revents & POLLIN)) {
            if ((pfd[0].revents & (POLLERR | POLLNVAL)) && !warned) {
                warned = true;
                ucs_error("kreg reader: userfaultfd reports an error (revents 0x%x)",
                          pfd[0].revents);
            }
            if (pfd[0].revents & (POLLERR | POLLNVAL)) {
                poll(&pfd[1], 1, 100); /* don't spin; stay alive */
            }
            continue;
        }

        /* The "pending" mark, from before the read until the events are
         * queued: a lookup that sees it waits for their dispatch. */
        reading_.store(1);
        for (;;) {
            ssize_t len = read(uffd_.fd(), msgs, sizeof(msgs));
            if (len < 0) {
                if (errno == EINTR) {
                    continue;
                }
                if ((errno != EAGAIN) && !warned) {
                    warned = true;
                    ucs_error("kreg reader: read failed: %s", strerror(errno));
                }
                break;
            }
            handle_msgs(msgs, static_cast<size_t>(len) / sizeof(msgs[0]));
            if (static_cast<size_t>(len) < sizeof(msgs)) {
                break;
            }
        }
        reading_.store(0);
        reading_.notify_all();
        read_seq_.notify_all();
        wake_dispatcher();
    }
}

void monitor::dispatch_loop()
{
    std::vector<queue_entry> batch;
    batch.reserve(ring_.size() + 1);
    uint32_t seen = 0;

    for (;;) {
        if (!stopping_.load()) {
            wake_dispatcher_.wait(seen);
        }
        seen = wake_dispatcher_.load();

        uint64_t read_ns;
        batch.clear();
        {
            std::lock_guard<std::mutex> guard(q_lock_);
            for (; used_ > 0; --used_) {
                batch.push_back(ring_[head_]);
                head_ = (head_ + 1) % ring_.size();
            }
            if (overflow_.count > 0) {
                batch.push_back(overflow_);
                overflow_ = queue_entry{0, 0, 0, false};
            }
            read_ns = batch_read_ns_;
        }

        uint32_t count = 0;
        for (const queue_entry &e : batch) {
            if (e.start != e.end) {
                if (e.gone) {
                    gone_(gone_ctx_, e.start, e.end);
                }
                dispatch(e.start, e.end);
                dispatched_.fetch_add(1, std::memory_order_relaxed);
            }
            count += e.count;
        }
        if (count > 0) {
            uint64_t lat = now_ns() - read_ns;
            update_max(lat_max_, lat);
            lat_sum_.fetch_add(lat, std::memory_order_relaxed);
            batches_.fetch_add(1, std::memory_order_relaxed);
            done_seq_.fetch_add(count);
            done_seq_.notify_all();
        }
        if (stopping_.load() && batch.empty()) {
            break;
        }
    }
}

void monitor::wait_read_events()
{
    if (reading_.load()) {
        sync_waits_.fetch_add(1, std::memory_order_relaxed);
        do {
            reading_.wait(1);
        } while (reading_.load());
    }
    const uint32_t target = read_seq_.load();
    uint32_t done;
    while (seq_before(done = done_seq_.load(), target)) {
        sync_waits_.fetch_add(1, std::memory_order_relaxed);
        done_seq_.wait(done);
    }
}

void monitor::sync()
{
    /* Poll first, then the mark: an event read between the two raised the
     * mark before its read (see read_loop). */
    for (;;) {
        const uint32_t seen = read_seq_.load();
        if (!uffd_has_events()) {
            break;
        }
        sync_waits_.fetch_add(1, std::memory_order_relaxed);
        wait_read_after(seen, 1000);
    }
    wait_read_events();
}

void monitor::wait_read_after(uint32_t seen, unsigned timeout_us)
{
    if (read_seq_.load() == seen) {
        futex_wait_for(read_seq_, seen, timeout_us);
    }
}

void monitor::add_stats(kreg_stats_t *stats) const
{
    for (int i = 0; i < KREG_EV_LAST; ++i) {
        stats->events[i] += events_[i].load();
    }
    stats->dispatched += dispatched_.load();
    stats->coalesced += coalesced_.load();
    stats->sync_waits += sync_waits_.load();
    stats->dispatch_latency_max_ns =
        std::max(stats->dispatch_latency_max_ns, lat_max_.load());
    stats->dispatch_latency_sum_ns += lat_sum_.load();
    stats->dispatch_batches += batches_.load();
}

} // namespace kreg
