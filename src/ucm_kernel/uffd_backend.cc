/* The userfaultfd backend: the descriptor (uffd.cc), its threads
 * (monitor.cc) and who watches which pages (watch_map.cc).
 *
 * A watch has no counter of its own (it points at the generation word):
 * the lookup's kernel check in prepare_lookup() is what keeps hits exact.
 * In verify mode that check is, where one system call cannot answer it
 * (uffd::quick_check: a hit on one private anonymous mapping, no event
 * in flight; then only step 2 remains)
 *  1. wait while an event is in flight (the cross-thread window: another
 *     thread's munmap has changed the range but its event is not queued
 *     yet; the kernel shows it through mmap_changing, uffd::event_in_flight),
 *  2. wait until every event read is dispatched, so what the kernel told us
 *     is applied,
 *  3. ask whether the range still lies in watched mappings (a mapping put
 *     there without any unmap event, shmat(SHM_REMAP), is new and
 *     unwatched).
 * What userfaultfd never reports at all, truncate and hole punch of
 * page-cache memory, is kept out of the cache by confirm() (policy,
 * UCX_KREG_SHARED_MEMORY).
 *
 * Over 350 lines: one class, the userfaultfd backend; its methods
 * share the watch map and the retained ranges under one lock.
 */
#include "backend.h"
#include "dispatch.h"
#include "monitor.h"
#include "uffd.h"
#include "watch_map.h"

#include <cerrno>
#include <cstdio>
#include <memory>
#include <mutex>
#include <sys/mman.h>
#include <unistd.h>

#include <ucs/debug/log_def.h>
#include <ucs/sys/string.h>

namespace kreg {
namespace {

/* Unwatched ranges kept registered (see retained_ranges): enough for the
 * buffers a busy cache drops and takes again, few mappings each. */
constexpr size_t kMaxRetained = 256;

/* kreg_watch_t.slot of a uffd watch: confirm() found no page-cache page */
constexpr uint32_t kSlotChecked = 1;

/* hugetlbfs mappings are registered in whole huge pages only */
constexpr uintptr_t kHugeAlignments[] = {uintptr_t(2) << 20, uintptr_t(1) << 30};

unsigned long read_max_map_count()
{
    unsigned long n = 65530; /* the kernel's default */
    FILE *f         = fopen("/proc/sys/vm/max_map_count", "r");
    if (f != nullptr) {
        if (fscanf(f, "%lu", &n) != 1) {
            n = 65530;
        }
        fclose(f);
    }
    return n;
}

class uffd_backend final : public backend {
public:
    uffd_backend() : backend(true) {}
    kreg_backend_t kind() const override { return KREG_BACKEND_UFFD; }

    bool start(const kreg_options_t &opts, start_error *err) override
    {
        uffd_options uo;
        uo.try_device   = opts.device != 0;
        uo.try_wp_async = opts.wp_async != 0;
        if (!uffd_.open(uo)) {
            err->reason = uffd_.reason();
            err->text   = uffd_.error();
            return false;
        }
        auto mon = std::make_unique<monitor>(uffd_, opts.queue_size, on_gone, this);
        if (!mon->start(&err->text)) {
            uffd_.close();
            err->reason = KREG_REASON_OTHER;
            return false;
        }
        monitor_ = std::move(mon);
        mode_    = static_cast<kreg_mode_t>(opts.mode);
        shared_  = static_cast<kreg_shared_policy_t>(opts.shared);
        /* Each watch can split two mappings: the default leaves the
         * application three quarters of vm.max_map_count (the
         * address-space budget). */
        max_ranges_ = (opts.max_ranges == UCS_ULUNITS_AUTO) ?
                              read_max_map_count() / 8 : opts.max_ranges;
        running_ = true;
        ucs_debug("kreg: userfaultfd%s, features 0x%lx%s, check by %s, at most "
                  "%lu watched ranges", uffd_.via_device() ? " (/dev/userfaultfd)" : "",
                  static_cast<unsigned long>(uffd_.features()),
                  uffd_.wp_async() ? " (WP_ASYNC)" : "",
                  uffd_.quick_checks() ?
                          (uffd_.scans() ? "UFFDIO_CONTINUE, else PAGEMAP_SCAN" :
                                           "UFFDIO_CONTINUE, else UFFDIO_WRITEPROTECT") :
                          (uffd_.scans() ? "PAGEMAP_SCAN" : "UFFDIO_WRITEPROTECT"),
                  max_ranges_);
        return true;
    }

    void stop() override
    {
        /* Reader first; then the kernel side goes (every watch, and any
         * thread blocked in munmap is woken, a dispatch handler's
         * included); then the dispatcher can finish its last round. */
        monitor_->stop_reader();
        {
            std::lock_guard<std::mutex> guard(map_lock_);
            running_ = false;
            uffd_.release_kernel_side();
        }
        monitor_->stop_dispatcher();
        monitor_->add_stats(&past_);
        monitor_.reset();
        uffd_.close();
        /* no rcache may keep an entry that nothing watches any more */
        page_ranges all;
        {
            std::lock_guard<std::mutex> guard(map_lock_);
            all = watches_.ranges();
            watches_.clear();
            retained_.clear();
        }
        for (const page_range &r : all) {
            dispatch(r.first, r.second);
        }
    }

    kreg_reason_t watch(uintptr_t start, uintptr_t end, kreg_watch_t *w,
                        int *err) override
    {
        /* Every unmap that has happened is applied to the retained ranges
         * (its "gone" is dispatched) before we trust one: a retained range
         * is then still mapped, registered and checked. Not under
         * map_lock_: the dispatcher takes it. */
        if (mode_ != KREG_MODE_PLAIN) {
            wait_no_event_in_flight();
        }
        monitor_->wait_read_events();

        std::lock_guard<std::mutex> guard(map_lock_);
        if (!running_) {
            return KREG_REASON_NOT_STARTED;
        }
        bool checked = false;
        if (retained_.find(start, end, &checked)) {
            /* registered all along: no system call (P4) */
            retained_.drop(start, end);
        } else {
            while ((watches_.segments() + retained_.size() >= max_ranges_) &&
                   evict_oldest_retained()) {
            }
            if (watches_.segments() + retained_.size() >= max_ranges_) {
                return KREG_REASON_LIMIT;
            }
            /* The kernel registers the mappings in a range and skips its
             * holes; a hole mapped later would not be watched. msync
             * (MS_ASYNC) finds holes (ENOMEM) walking mappings, not pages. */
            if ((msync(reinterpret_cast<void *>(start), end - start, MS_ASYNC) != 0) &&
                (errno == ENOMEM)) {
                *err = ENOMEM;
                return KREG_REASON_BAD_INPUT;
            }
            /* A retained part may lie inside: registering a registered
             * range changes no mapping. */
            *err = register_range(&start, &end);
            if (*err != 0) {
                return uffd::reason_of(*err);
            }
            retained_.drop(start, end);
            checked = false;
        }
        watches_.add(start, end);
        w->counter    = generation_word();
        w->snapshot   = *w->counter;
        w->start      = start;
        w->end        = end;
        w->slot       = checked ? kSlotChecked : 0;
        w->generation = generation();
        return KREG_REASON_NONE;
    }

    kreg_reason_t confirm(kreg_watch_t *w) override
    {
        if ((shared_ == KREG_SHARED_UNCACHED) && !(w->slot & kSlotChecked)) {
            if (uffd_.has_page_cache_pages(w->start, w->end - w->start)) {
                return KREG_REASON_SHARED;
            }
            w->slot |= kSlotChecked;
        }
        return KREG_REASON_NONE;
    }

    void unwatch(const kreg_watch_t *w) override
    {
        std::lock_guard<std::mutex> guard(map_lock_);
        if (!running_) {
            return;
        }
        page_ranges gone;
        for (const page_range &r : watches_.remove(w->start, w->end, &gone)) {
            retained_.add(r.first, r.second, w->slot & kSlotChecked);
        }
        /* unmapped since: nothing left to keep (and should a mapping there
         * be registered after all, it goes) */
        for (const page_range &r : gone) {
            (void)uffd_.unwatch(r.first, r.second - r.first);
        }
        while ((retained_.size() > kMaxRetained) && evict_oldest_retained()) {
        }
    }

    int prepare_lookup(uintptr_t start, uintptr_t end) override
    {
        if (mode_ == KREG_MODE_PLAIN) {
            monitor_->wait_read_events();
            return 1;
        }
        verify_calls_.fetch_add(1, std::memory_order_relaxed);
        if (uffd_.quick_checks()) {
            /* The hit in one system call: no event in flight and the range
             * in one watched mapping (a mapping moved there is in flight
             * until read); then, as below, whatever was read is applied
             * before the lookup. Else the whole check. */
            const uint32_t seen = monitor_->read_seq();
            switch (uffd_.quick_check(start, end - start)) {
            case quick_result::watched:
                monitor_->wait_read_events();
                return 1;
            case quick_result::in_flight:
                wait_for_reader(seen);
                break;
            case quick_result::ask:
                break;
            }
        }
        wait_no_event_in_flight();
        monitor_->wait_read_events();
        check_result c;
        for (;;) {
            const uint32_t seen = monitor_->read_seq();
            if ((c = uffd_.check(start, end - start)) != check_result::in_flight) {
                break;
            }
            wait_for_reader(seen);
            monitor_->wait_read_events();
        }
        if (c == check_result::watched) {
            return 1;
        }
        {
            /* never watched (a first registration, an uncached buffer): no
             * rcache holds it, nothing to invalidate */
            std::lock_guard<std::mutex> guard(map_lock_);
            if (!watches_.overlaps(start, end)) {
                return 0;
            }
        }
        verify_invalidations_.fetch_add(1, std::memory_order_relaxed);
        dispatch(start, end);
        return 0;
    }

    void sync() override { monitor_->sync(); }

    void lock_for_fork() override { map_lock_.lock(); }
    void unlock_after_fork() override { map_lock_.unlock(); }

    void forget_after_fork() override
    {
        /* The parent's threads may hold the monitor's queue lock: leave
         * the object as it is. */
        monitor_->forget_after_fork();
        (void)monitor_.release();
        const int fd = uffd_.forget();
        if (fd >= 0) {
            ::close(fd);
        }
        watches_.clear();
        retained_.clear();
        running_ = false;
    }

    void query(kreg_caps_t *caps) const override
    {
        caps->via_device     = uffd_.via_device();
        caps->user_mode_only = uffd_.user_mode_only();
        caps->wp_async       = uffd_.wp_async();
        caps->event_remap    = uffd_.event_remap();
        caps->features       = uffd_.features();
        caps->verify_by_scan = uffd_.scans();
        caps->shared_watched = shared_ == KREG_SHARED_WATCH;
        caps->max_ranges     = max_ranges_;
    }

    void add_stats(kreg_stats_t *stats) const override
    {
        for (int i = 0; i < KREG_EV_LAST; ++i) {
            stats->events[i] += past_.events[i];
        }
        stats->dispatched += past_.dispatched;
        stats->coalesced += past_.coalesced;
        stats->sync_waits += past_.sync_waits;
        stats->dispatch_latency_sum_ns += past_.dispatch_latency_sum_ns;
        stats->dispatch_batches += past_.dispatch_batches;
        if (monitor_) {
            monitor_->add_stats(stats);
        }
        std::lock_guard<std::mutex> guard(map_lock_);
        if (running_) {
            stats->watched_ranges += watches_.ranges().size();
            stats->watched_bytes += watches_.bytes();
        }
        stats->verify_calls += verify_calls_.load();
        stats->verify_invalidations += verify_invalidations_.load();
        stats->inflight_waits += inflight_waits_.load();
    }

private:
    /* UFFDIO_REGISTER of [*start, *end), widened to whole huge pages when
     * the kernel refuses (hugetlbfs). Returns 0 or an errno; on failure the
     * kernel keeps nothing registered that no watcher covers (the kernel
     * can fail half-way, when splitting a mapping finds the mapping count
     * exhausted). map_lock_ held. */
    int register_range(uintptr_t *start, uintptr_t *end)
    {
        int rc = uffd_.watch(*start, *end - *start);
        for (uintptr_t align : kHugeAlignments) {
            if (rc != EINVAL) {
                break;
            }
            const uintptr_t s = *start & ~(align - 1);
            const uintptr_t e = (*end + align - 1) & ~(align - 1);
            if ((s == *start) && (e == *end)) {
                continue;
            }
            rc = uffd_.watch(s, e - s);
            if (rc == 0) {
                *start = s;
                *end   = e;
            }
        }
        /* Only a split can fail after the kernel registered part of the
         * range (ENOMEM: the mapping count is exhausted); other errors come
         * from its checks before it changes anything. Never unregister
         * then: Linux 6.1's UFFDIO_UNREGISTER drops a range another
         * userfaultfd registered (EBUSY) as readily as ours. */
        if (rc == ENOMEM) {
            for (const page_range &r : watches_.gaps(*start, *end)) {
                (void)uffd_.unwatch(r.first, r.second - r.first);
                retained_.drop(r.first, r.second);
            }
        }
        return rc;
    }

    /* Unregisters the oldest retained range; false if there is none.
     * map_lock_ held. */
    bool evict_oldest_retained()
    {
        page_range r;
        if (!retained_.pop_oldest(&r)) {
            return false;
        }
        /* fails where the memory is gone already: nothing to drop */
        (void)uffd_.unwatch(r.first, r.second - r.first);
        return true;
    }

    /* The dispatcher: the kernel unmapped [start, end) (or moved it away),
     * which dropped its registration too. */
    static void on_gone(void *ctx, uintptr_t start, uintptr_t end)
    {
        auto *self = static_cast<uffd_backend *>(ctx);
        std::lock_guard<std::mutex> guard(self->map_lock_);
        self->retained_.drop(start, end);
        self->watches_.mark_gone(start, end);
    }

    void wait_no_event_in_flight()
    {
        for (;;) {
            const uint32_t seen = monitor_->read_seq();
            if (!uffd_.event_in_flight()) {
                return;
            }
            wait_for_reader(seen);
        }
    }

    /* The event is read soon after it is queued; the flag drops once the
     * unmapping thread, woken by that read, runs again: a short wait, then
     * ask again. */
    void wait_for_reader(uint32_t seen)
    {
        inflight_waits_.fetch_add(1, std::memory_order_relaxed);
        monitor_->wait_read_after(seen, 50);
    }

    uffd                     uffd_;
    std::unique_ptr<monitor> monitor_;
    kreg_mode_t              mode_   = KREG_MODE_VERIFY;
    kreg_shared_policy_t     shared_ = KREG_SHARED_UNCACHED;
    unsigned long            max_ranges_ = 0;
    kreg_stats_t             past_{};   /* of monitors already stopped */

    /* never held across anything that can wait for the monitor */
    mutable std::mutex       map_lock_;
    watch_map                 watches_;
    retained_ranges           retained_;
    bool                     running_ = false;

    std::atomic<uint64_t>    verify_calls_{0}, verify_invalidations_{0};
    std::atomic<uint64_t>    inflight_waits_{0};
};

} // namespace

backend &uffd_backend_instance()
{
    static backend *const b = new uffd_backend; /* never destroyed: exit with
                                                   live threads */
    return *b;
}

} // namespace kreg
