/* The two threads behind the descriptor.
 *
 * The reader only reads: a thread in munmap of a watched range waits in the
 * kernel until its event is read, and nothing but read() stands between it
 * and that. The reader takes no lock that anything else holds, allocates
 * nothing and never blocks on dispatch; when its queue is full it merges
 * events into one wider range (wider invalidation is still correct).
 *
 * The dispatcher reports each range through ucm_vm_munmap(). That reaches
 * every rcache, whose callbacks may allocate or spin on rcache locks; were
 * that done by the reader, a thread that holds such a lock while it unmaps
 * a watched range would never be released (hazard 2 of DESIGN.md).
 *
 * Lookups wait on three counters: `reading` is set from before read() until
 * the events are queued, `read_seq` counts events queued, `done_seq` events
 * dispatched. */
#ifndef UCX_KREG_MONITOR_H
#define UCX_KREG_MONITOR_H

#include "ucm_kernel.h"
#include "watch_map.h"

#include <atomic>
#include <mutex>
#include <pthread.h>
#include <string>
#include <vector>

namespace kreg {

class Uffd;

class Monitor {
public:
    using Dispatch = void (*)(uintptr_t start, uintptr_t end);

    Monitor(const Uffd &uffd, size_t queue_size, Dispatch dispatch);
    ~Monitor();

    bool start(std::string *error);
    /* Stops both threads. The descriptor itself is closed by the owner. */
    void stop();
    /* Before fork: lets the dispatch under way finish and holds the next,
     * so that no child inherits UCM's or an rcache's lock taken by the
     * dispatcher (they would stay locked there forever). */
    void hold_for_fork();
    void release_after_fork();
    /* After fork, in the child: the threads do not exist there. */
    void abandon_after_fork();

    /* Every event read so far is dispatched. */
    void wait_read_events();
    /* Every event queued by the kernel so far is dispatched. */
    void sync();

    void add_stats(kreg_stats_t *stats) const;

private:
    struct Entry {
        uintptr_t start, end;
        uint32_t  count; /* events merged in */
    };

    static void *reader_main(void *arg);
    static void *dispatcher_main(void *arg);
    void read_loop();
    void dispatch_loop();
    void handle_msgs(const void *msgs, size_t n);
    /* count: how many kernel events the entry stands for (0 or 1) */
    void push(uintptr_t start, uintptr_t end, uint32_t count);
    bool uffd_has_events() const;

    const Uffd  &uffd_;
    const Dispatch dispatch_;
    int          wake_fd_ = -1; /* eventfd: stop request */

    pthread_t    reader_{}, dispatcher_{};
    bool         threads_ = false;
    std::atomic<bool> stopping_{false};

    /* reader <-> dispatcher only; neither does anything else under it */
    std::mutex         q_lock_;
    std::vector<Entry> ring_;
    size_t             head_ = 0, used_ = 0;
    Entry              overflow_{0, 0, 0};
    uint64_t           batch_read_ns_ = 0;

    std::atomic<int>      reading_{0};
    std::atomic<uint64_t> read_seq_{0};
    std::atomic<uint64_t> done_seq_{0};
    std::atomic<uint64_t> wake_dispatcher_{0};
    std::atomic<bool>     fork_hold_{false};
    std::atomic<bool>     in_dispatch_{false};

    /* statistics */
    std::atomic<uint64_t> events_[KREG_EV_LAST] = {};
    std::atomic<uint64_t> dispatched_{0}, coalesced_{0}, sync_waits_{0};
    std::atomic<uint64_t> lat_max_{0}, lat_sum_{0}, batches_{0};
};

} // namespace kreg

#endif
