/* The two threads behind the userfaultfd.
 *
 * The reader only reads: a thread in munmap of a watched range waits in the
 * kernel until its event is read, and nothing but read() stands between it
 * and that. The reader takes no lock that anything else holds, allocates
 * nothing and never blocks on dispatch; when its queue is full it merges
 * events into one wider range (wider invalidation is still correct).
 *
 * The dispatcher reports each range through dispatch() (ucm_vm_munmap).
 * That reaches every rcache, whose callbacks may allocate or spin on rcache
 * locks; were that done by the reader, a thread that holds such a lock
 * while it unmaps a watched range would never be released (the reader
 * deadlock hazard of doc/design.md).
 *
 * Lookups wait on three counters: `reading` is set from before read() until
 * the events are queued, `read_seq` counts events queued, `done_seq` events
 * dispatched. 32-bit, so that waiting on them is a plain futex. */
#ifndef UCX_KREG_MONITOR_H
#define UCX_KREG_MONITOR_H

#include "ucm_kernel.h"

#include <atomic>
#include <mutex>
#include <pthread.h>
#include <string>
#include <vector>

namespace kreg {

class uffd;

class monitor {
public:
    /* gone: called by the dispatcher, before reporting it, for a range
     * the kernel unmapped or moved away (its registration is gone too) */
    using gone_fn = void (*)(void *ctx, uintptr_t start, uintptr_t end);
    monitor(const uffd &uffd, size_t queue_size, gone_fn gone, void *gone_ctx);
    ~monitor();

    bool start(std::string *error);
    /* Stopping is in two steps with the owner's release of the descriptor
     * between them: a dispatch handler that unmaps watched memory blocks
     * until its event is read, so the dispatcher can only be joined once
     * the reader is gone and the kernel side released (which wakes it). */
    void stop_reader();
    void stop_dispatcher();
    /* After fork, in the child: the threads do not exist there. */
    void forget_after_fork();

    /* Every event read so far is dispatched. */
    void wait_read_events();
    /* Every event queued by the kernel so far is dispatched. */
    void sync();
    /* Waits (at most timeout_us) for the reader to read anything after
     * `seen` (a read_seq() value). */
    void wait_read_after(uint32_t seen, unsigned timeout_us);
    uint32_t read_seq() const { return read_seq_.load(); }

    void add_stats(kreg_stats_t *stats) const;

private:
    struct queue_entry {
        uintptr_t start, end;
        uint32_t  count; /* events merged in */
        bool      gone;  /* unmapped or moved away, not only emptied */
    };

    static void *reader_main(void *arg);
    static void *dispatcher_main(void *arg);
    void read_loop();
    void dispatch_loop();
    void handle_msgs(const void *msgs, size_t n);
    /* count: how many kernel events the entry stands for (0 or 1) */
    void push(uintptr_t start, uintptr_t end, uint32_t count, bool gone);
    bool uffd_has_events() const;
    void wake_dispatcher();

    const uffd  &uffd_;
    const gone_fn   gone_;
    void * const gone_ctx_;
    int          wake_fd_ = -1; /* eventfd: stop request to the reader */

    pthread_t    reader_{}, dispatcher_{};
    bool         reader_running_ = false, dispatcher_running_ = false;
    std::atomic<bool> stopping_{false};

    /* reader <-> dispatcher only; neither does anything else under it */
    std::mutex         q_lock_;
    std::vector<queue_entry> ring_;
    size_t             head_ = 0, used_ = 0;
    queue_entry              overflow_{0, 0, 0, false};
    uint64_t           batch_read_ns_ = 0;

    std::atomic<uint32_t> reading_{0};
    std::atomic<uint32_t> read_seq_{0};
    std::atomic<uint32_t> done_seq_{0};
    std::atomic<uint32_t> wake_dispatcher_{0};

    /* statistics */
    std::atomic<uint64_t> events_[KREG_EV_LAST] = {};
    std::atomic<uint64_t> dispatched_{0}, coalesced_{0}, sync_waits_{0};
    std::atomic<uint64_t> lat_max_{0}, lat_sum_{0}, batches_{0};
};

} // namespace kreg

#endif
