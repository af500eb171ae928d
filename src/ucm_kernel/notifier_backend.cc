/* The notifier backend: the kreg_notifier module (kmod/) through
 * /dev/kreg_notifier.
 *
 * Each watch is one mmu_interval_notifier in the kernel with a counter in
 * a page array mapped read-only here; the kernel bumps it in the changing
 * thread before any page of the range changes (munmap, every mremap,
 * madvise, truncate and hole punch, migration), so a hit compares two
 * numbers: no system call, no lock, no window. A reader thread reads the
 * changed ranges from the descriptor and reports them to UCM, so that
 * rcaches drop (and unpin) such registrations eagerly; nothing ever waits
 * for it.
 *
 * The module's limits (kmod/README.md) end in one warning naming the
 * limit, the first time each is met: an open refused (EMFILE, EDQUOT) lets
 * the caller start the userfaultfd backend instead; a REGISTER refused
 * (ENOSPC, EDQUOT, EMLINK) first gives back the notifiers kept for reuse
 * (those over the same pages for EMLINK), then leaves that one
 * registration uncached (KREG_REASON_LIMIT).
 *
 * After a fork the child has no counter mapping (the module maps it
 * VM_DONTCOPY) and its descriptor speaks for the parent: the child maps
 * zero pages where the counters were, so every inherited watch reads 0
 * (a snapshot is never 0) and is stale, and opens its own descriptor.
 *
 * Over 350 lines: one class, the notifier backend; its methods share
 * the slot table and the retained list.
 */
#include "backend.h"
#include "dispatch.h"
#include "sync_delivery.h"
#include "thread.h"

#include "kmod/uapi/kreg_notifier.h"

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <deque>
#include <map>
#include <cstring>
#include <fcntl.h>
#include <mutex>
#include <poll.h>
#include <pthread.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <unistd.h>
#include <vector>

#include <ucs/debug/log_def.h>
#include <ucs/sys/string.h>

namespace kreg {
namespace {

/* Unwatched ranges whose notifier is kept (an interval notifier watches
 * addresses, whatever is mapped there): a cache drops and registers the
 * same buffers again and again, and a kept notifier makes that free. */
constexpr size_t kMaxRetained = 256;

/* The module's ioctls may be interrupted by a signal whose handler has no
 * SA_RESTART (seen: REGISTER under a SIGUSR1 storm): ask again. */
int nf_ioctl(int fd, unsigned long cmd, void *arg)
{
    int rc;
    do {
        rc = ioctl(fd, cmd, arg);
    } while ((rc != 0) && (errno == EINTR));
    return rc;
}

kreg_reason_t reason_of(int err)
{
    switch (err) {
    case ENOENT:
    case ENODEV:
    case ENXIO:  return KREG_REASON_NO_DEVICE;
    case EPERM:
    case EACCES: return KREG_REASON_EPERM;
    case ENOSPC:
    case EDQUOT:
    case EMLINK:
    case EMFILE:
    case ENOMEM: return KREG_REASON_LIMIT;
    case EINVAL:
    case EOVERFLOW:
    case EFAULT: return KREG_REASON_BAD_INPUT;
    default:     return KREG_REASON_OTHER;
    }
}

/* "name=value" of a module parameter, "name" if it cannot be read */
std::string nf_param(const char *name)
{
    std::string text(name);
    char path[128], buf[32] = "";
    snprintf(path, sizeof(path), "/sys/module/kreg_notifier/parameters/%s", name);
    FILE *f = fopen(path, "re");
    if (f != nullptr) {
        if (fgets(buf, sizeof(buf), f) != nullptr) {
            buf[strcspn(buf, "\n")] = '\0';
            text += std::string("=") + buf;
        }
        fclose(f);
    }
    return text;
}

/* Which of the module's limits an errno of open() or REGISTER names;
 * empty for anything else. */
std::string nf_limit(int err, bool at_open)
{
    switch (err) {
    case EMFILE:
        return "the descriptors of this user (" + nf_param("max_files_per_user") +
               ") or of this process (RLIMIT_NOFILE)";
    case EDQUOT:
        return at_open ? "the module memory of this user (" +
                                 nf_param("max_kib_per_user") + " KiB)" :
                         "the ranges or module memory of this user (" +
                                 nf_param("max_ranges_per_user") + ", " +
                                 nf_param("max_kib_per_user") + " KiB)";
    case ENOSPC:
        return "the slots of this descriptor (" + nf_param("max_ranges") +
               ") or the ranges of all users (" + nf_param("max_total_ranges") + ")";
    case EMLINK:
        return "the registrations over the same pages (" + nf_param("max_overlap") +
               " a descriptor)";
    default:
        return std::string();
    }
}

class notifier_backend final : public backend {
public:
    notifier_backend() : backend(false) {}
    kreg_backend_t kind() const override { return KREG_BACKEND_NOTIFIER; }

    bool start(const kreg_options_t &opts, start_error *err) override
    {
        auto fail = [&](kreg_reason_t why, const std::string &text) {
            err->reason = why;
            err->text   = text;
            sync_stop();
            close_all();
            return false;
        };

        fd_ = open(KREG_NF_DEVICE, O_RDWR | O_CLOEXEC | O_NONBLOCK);
        if (fd_ < 0) {
            const int         e     = errno;
            const std::string limit = nf_limit(e, true);
            if (!limit.empty()) {
                /* the one line: the caller goes on with userfaultfd */
                ucs_warn("kreg: " KREG_NF_DEVICE ": %s: the kreg_notifier module's "
                         "limit on %s is reached; watching through another "
                         "backend", strerror(e), limit.c_str());
                return fail(reason_of(e), std::string(KREG_NF_DEVICE ": ") +
                                                  strerror(e) + ": limit on " + limit);
            }
            return fail(reason_of(e), std::string(KREG_NF_DEVICE ": ") + strerror(e));
        }
        struct kreg_nf_info info = {};
        if (nf_ioctl(fd_, KREG_NF_IOC_INFO, &info) != 0) {
            return fail(reason_of(errno),
                        std::string("KREG_NF_IOC_INFO: ") + strerror(errno));
        }
        if (info.abi_version != KREG_NF_ABI_VERSION) {
            return fail(KREG_REASON_OTHER,
                        "the kreg_notifier module speaks ABI " +
                        std::to_string(info.abi_version) + ", this library " +
                        std::to_string(KREG_NF_ABI_VERSION));
        }
        void *map = mmap(nullptr, info.counters_size, PROT_READ, MAP_SHARED, fd_, 0);
        if (map == MAP_FAILED) {
            return fail(reason_of(errno),
                        std::string("mmap of the counters: ") + strerror(errno));
        }
        counters_      = static_cast<const volatile uint64_t *>(map);
        counters_size_ = info.counters_size;
        max_ranges_    = info.max_ranges;
        if ((opts.max_ranges != UCS_ULUNITS_AUTO) && (opts.max_ranges < max_ranges_)) {
            max_ranges_ = opts.max_ranges;
        }
        live_.assign(info.max_ranges, page_range{0, 0});
        live_count_ = 0;
        retained_.clear();
        retained_order_.clear();
        retained_seq_.clear();
        plain_      = opts.mode == KREG_MODE_PLAIN;

        sync_why_ = "UCX_KREG_SYNC=n";
        if (opts.sync != KREG_SYNC_NO) {
            std::string &why = sync_why_;
            why.clear();
            /* sync_signal_: the signal in use, 0 if the reader reports */
            if (!sync_start(fd_, opts, &sync_signal_, &why)) {
                if (opts.sync == KREG_SYNC_YES) {
                    return fail(KREG_REASON_OTHER, "UCX_KREG_SYNC=y: " + why);
                }
                ucs_diag("kreg: no synchronous delivery (%s): UCX's own caches "
                         "keep UCM's hooks", why.c_str());
            }
        }

        wake_fd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
        if (wake_fd_ < 0) {
            return fail(KREG_REASON_OTHER, std::string("eventfd: ") + strerror(errno));
        }
        const int rc = start_thread(&reader_, reader_main, this, "kreg-notifier");
        if (rc != 0) {
            return fail(KREG_REASON_OTHER, std::string("pthread_create: ") + strerror(rc));
        }
        reader_running_ = true;
        ucs_debug("kreg: %s, ABI %u, %lu ranges at most, counters %zu bytes at %p",
                  KREG_NF_DEVICE, info.abi_version, max_ranges_, counters_size_,
                  (const void *)counters_);
        return true;
    }

    void stop() override
    {
        /* before the reader goes: held threads are let go by the module */
        sync_stop();
        stop_reader();
        std::vector<page_range> all;
        {
            std::lock_guard<std::mutex> guard(lock_);
            for (page_range &r : live_) {
                if (r.second != 0) {
                    all.push_back(r);
                    r = page_range{0, 0};
                }
            }
            live_count_ = 0;
            retained_.clear();
            retained_order_.clear();
            retained_seq_.clear();
            close_all(); /* the kernel removes every notifier */
        }
        for (const page_range &r : all) {
            dispatch(r.first, r.second);
        }
    }

    kreg_reason_t watch(uintptr_t start, uintptr_t end, kreg_watch_t *w,
                        int *err) override
    {
        std::lock_guard<std::mutex> guard(lock_);
        if (fd_ < 0) {
            return KREG_REASON_NOT_STARTED;
        }
        uint32_t slot;
        uint64_t counter;
        auto kept = retained_.find(page_range{start, end});
        if (kept != retained_.end()) {
            /* its notifier has watched the range all along: changes from
             * now on move the counter */
            slot    = kept->second;
            counter = counters_[slot];
            retained_.erase(kept);
            retained_seq_[slot] = 0; /* its place in the order is void */
        } else {
            while ((live_count_ >= max_ranges_) && evict_oldest_retained()) {
            }
            if (live_count_ >= max_ranges_) {
                return KREG_REASON_LIMIT;
            }
            struct kreg_nf_register reg = {};
            reg.start = start;
            reg.len   = end - start;
            bool evicted_overlap = false;
            while (nf_ioctl(fd_, KREG_NF_IOC_REGISTER, &reg) != 0) {
                *err = errno;
                /* the module's limits: give back kept notifiers first */
                if ((*err == EMLINK) && !evicted_overlap) {
                    evicted_overlap = true;
                    if (evict_retained_over(start, end)) {
                        continue;
                    }
                } else if (((*err == ENOSPC) || (*err == EDQUOT)) &&
                           evict_oldest_retained()) {
                    continue;
                }
                return reason_of(*err);
            }
            slot    = reg.slot;
            counter = reg.counter;
            live_[slot] = page_range{start, end};
            ++live_count_;
        }
        w->start      = start;
        w->end        = end;
        w->slot       = slot;
        w->generation = generation();
        if (plain_) {
            /* measurements only: the hit compares nothing */
            w->counter  = generation_word();
            w->snapshot = *w->counter;
        } else {
            w->counter  = &counters_[slot];
            w->snapshot = counter;
        }
        return KREG_REASON_NONE;
    }

    kreg_reason_t confirm(kreg_watch_t *w) override
    {
        /* Pinning can change the pages (a write fault on the zero page, a
         * COW break): then the counter moved and what was pinned may not
         * be what a later hit finds. */
        if (plain_ || (counters_[w->slot] == w->snapshot)) {
            return KREG_REASON_NONE;
        }
        return KREG_REASON_CHANGED;
    }

    void unwatch(const kreg_watch_t *w) override
    {
        std::lock_guard<std::mutex> guard(lock_);
        if ((fd_ < 0) || (w->slot >= live_.size())) {
            return;
        }
        retained_.emplace(page_range{w->start, w->end}, w->slot);
        retained_order_.push_back(retained_slot{w->slot, ++retain_seq_});
        retained_seq_[w->slot] = retain_seq_;
        while ((retained_.size() > kMaxRetained) && evict_oldest_retained()) {
        }
    }

    int prepare_lookup(uintptr_t, uintptr_t) override { return 1; }

    void sync() override
    {
        for (;;) {
            const uint32_t seen = read_seq_.load();
            struct pollfd pfd  = {fd_, POLLIN, 0};
            if ((poll(&pfd, 1, 0) <= 0) || !(pfd.revents & POLLIN)) {
                break;
            }
            read_seq_.wait(seen);
        }
        while (reading_.load()) {
            reading_.wait(1);
        }
    }

    void lock_for_fork() override { lock_.lock(); }
    void unlock_after_fork() override { lock_.unlock(); }

    void forget_after_fork() override
    {
        sync_forget_after_fork();
        /* VM_DONTCOPY: the child has nothing mapped there; zero pages make
         * every inherited watch read 0, never a snapshot */
        if (counters_ != nullptr) {
            (void)mmap(const_cast<uint64_t *>(counters_), counters_size_, PROT_READ,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
            counters_ = nullptr;
        }
        if (fd_ >= 0) {
            ::close(fd_); /* the child's reference; the parent's stays */
            fd_ = -1;
        }
        if (wake_fd_ >= 0) {
            ::close(wake_fd_);
            wake_fd_ = -1;
        }
        reader_running_ = false;
        live_.assign(live_.size(), page_range{0, 0});
        live_count_ = 0;
        retained_.clear();
        retained_order_.clear();
        retained_seq_.clear();
    }

    std::string limit_text(int err) const override
    {
        const std::string limit = nf_limit(err, false);
        return limit.empty() ? limit :
               "the kreg_notifier module's limit on " + limit + " is reached";
    }

    void query(kreg_caps_t *caps) const override
    {
        caps->max_ranges    = max_ranges_;
        caps->sync_delivery = sync_active();
        caps->sync_signal   = caps->sync_delivery ? sync_signal_ : 0;
        caps->why_no_sync   = caps->sync_delivery ? "" : sync_why_.c_str();
    }

    void add_stats(kreg_stats_t *stats) const override
    {
        sync_add_stats(stats);
        stats->events[KREG_EV_NOTIFY] += notified_.load();
        stats->dispatched += notified_.load();
        std::lock_guard<std::mutex> guard(lock_);
        if (fd_ >= 0) {
            /* what callers watch now: the retained notifiers (kept for a
             * registration of the same range again) are not, as under uffd */
            stats->watched_ranges += live_count_ - retained_.size();
            for (const page_range &r : live_) {
                stats->watched_bytes += r.second - r.first;
            }
            for (const auto &kept : retained_) {
                stats->watched_bytes -= kept.first.second - kept.first.first;
            }
        }
    }

private:
    using page_range = std::pair<uintptr_t, uintptr_t>;

    static void *reader_main(void *arg)
    {
        static_cast<notifier_backend *>(arg)->read_loop();
        return nullptr;
    }

    void read_loop()
    {
        /* never held by the module: it reports what held threads wait for */
        sync_attach_dispatcher();
        struct kreg_nf_event ev[64];
        struct pollfd pfd[2] = {{fd_, POLLIN, 0}, {wake_fd_, POLLIN, 0}};
        for (;;) {
            if ((poll(pfd, 2, -1) < 0) && (errno != EINTR)) {
                ucs_error("kreg notifier reader: poll failed: %m");
                return;
            }
            if (pfd[1].revents) {
                return;
            }
            reading_.store(1);
            sync_drain();
            ssize_t len;
            while ((len = read(fd_, ev, sizeof(ev))) > 0) {
                const size_t n = static_cast<size_t>(len) / sizeof(ev[0]);
                for (size_t i = 0; i < n; ++i) {
                    dispatch(ev[i].start, ev[i].end);
                }
                notified_.fetch_add(n, std::memory_order_relaxed);
                read_seq_.fetch_add(1);
                read_seq_.notify_all();
            }
            if ((len < 0) && (errno != EAGAIN) && (errno != EINTR)) {
                ucs_error("kreg notifier reader: read failed: %m");
                poll(&pfd[1], 1, 100); /* don't spin; stay alive */
            }
            reading_.store(0);
            reading_.notify_all();
        }
    }

    /* UNREGISTERs the retained notifiers over [start, end); false if none.
     * lock_ held. */
    bool evict_retained_over(uintptr_t start, uintptr_t end)
    {
        bool any = false;
        for (auto it = retained_.begin(); it != retained_.end();) {
            if ((it->first.first < end) && (start < it->first.second)) {
                const uint32_t slot = it->second;
                it = retained_.erase(it);
                retained_seq_[slot] = 0; /* its place in the order is void */
                unregister_slot(slot);
                any = true;
            } else {
                ++it;
            }
        }
        return any;
    }

    /* Gives a slot's notifier back to the module. lock_ held. */
    void unregister_slot(uint32_t slot)
    {
        const page_range        r     = live_[slot];
        struct kreg_nf_unregister unreg = {};
        unreg.slot = slot;
        if (nf_ioctl(fd_, KREG_NF_IOC_UNREGISTER, &unreg) != 0) {
            ucs_warn("kreg: unregistering slot %u (0x%lx..0x%lx) failed: %m",
                     slot, r.first, r.second);
        }
        live_[slot] = page_range{0, 0};
        --live_count_;
    }

    /* UNREGISTERs the oldest retained notifier; false if none. lock_ held. */
    bool evict_oldest_retained()
    {
        while (!retained_order_.empty()) {
            const retained_slot s = retained_order_.front();
            retained_order_.pop_front();
            if (retained_seq_[s.slot] != s.seq) {
                continue; /* watched again since, or evicted */
            }
            const page_range r = live_[s.slot];
            auto range    = retained_.equal_range(r);
            for (auto it = range.first; it != range.second; ++it) {
                if (it->second == s.slot) {
                    retained_.erase(it);
                    break;
                }
            }
            retained_seq_[s.slot] = 0;
            unregister_slot(s.slot);
            return true;
        }
        return false;
    }

    void stop_reader()
    {
        if (reader_running_) {
            uint64_t one = 1;
            (void)!write(wake_fd_, &one, sizeof(one));
            pthread_join(reader_, nullptr);
            reader_running_ = false;
        }
    }

    /* Every watch still out there reads zero pages from now on. */
    void close_all()
    {
        if (counters_ != nullptr) {
            (void)mmap(const_cast<uint64_t *>(counters_), counters_size_, PROT_READ,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
            counters_ = nullptr;
        }
        if (fd_ >= 0) {
            ::close(fd_);
            fd_ = -1;
        }
        if (wake_fd_ >= 0) {
            ::close(wake_fd_);
            wake_fd_ = -1;
        }
    }

    int                      fd_      = -1;
    int                      wake_fd_ = -1;
    const volatile uint64_t  *counters_ = nullptr;
    size_t                   counters_size_ = 0;
    unsigned long            max_ranges_ = 0;
    bool                     plain_ = false;
    int                      sync_signal_ = 0;
    std::string              sync_why_; /* why not synchronous (caps) */
    pthread_t                reader_{};
    bool                     reader_running_ = false;

    struct retained_slot {
        uint32_t slot;
        uint64_t seq; /* which retention of the slot this entry is */
    };

    mutable std::mutex       lock_; /* everything below, fd_ for ioctls */
    std::vector<page_range>       live_; /* slot -> range, retained ones too */
    unsigned long            live_count_ = 0;
    std::multimap<page_range, uint32_t> retained_; /* unwatched, notifier kept */
    std::deque<retained_slot>         retained_order_;
    std::map<uint32_t, uint64_t> retained_seq_; /* slot -> its retention */
    uint64_t                 retain_seq_ = 0;

    std::atomic<uint32_t>    reading_{0}, read_seq_{0};
    std::atomic<uint64_t>    notified_{0};
};

} // namespace

backend &notifier_backend_instance()
{
    static backend *const b = new notifier_backend; /* never destroyed */
    return *b;
}

} // namespace kreg
