/* The C entry points of libucm_kernel: lifetime, watches, lookups, fork. */
#include "kreg_config.h"
#include "monitor.h"
#include "options.h"
#include "uffd.h"
#include "watch_map.h"

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <dlfcn.h>
#include <memory>
#include <mutex>
#include <pthread.h>
#include <sys/mman.h>
#include <unistd.h>

#include <ucm/api/ucm.h>
#include <ucs/debug/log_def.h>

#ifdef HAVE_VALGRIND_VALGRIND_H
#include <valgrind/valgrind.h>
#endif

namespace kreg {
namespace {

struct Counters {
    std::atomic<uint64_t> watch_calls{0};
    std::atomic<uint64_t> fallbacks[KREG_REASON_LAST] = {};
    std::atomic<uint64_t> verify_calls{0};
    std::atomic<uint64_t> verify_invalidations{0};
};

/* Everything below is guarded by life_lock, except what lookups read:
 * `running`, `mode` and the monitor, which only change while no lookup may
 * run (start/stop are paired with the user's rcache lifetime). */
std::mutex               life_lock;
unsigned                 refs;
kreg_options_t           opts;
bool                     opts_valid;
Uffd                     uffd;
std::unique_ptr<Monitor> monitor;
std::atomic<bool>        running{false};
std::atomic<int>         mode{KREG_MODE_VERIFY};
std::atomic<kreg_reason_t> reason{KREG_REASON_NOT_STARTED};
bool                     external;
bool                     atfork_installed;
std::atomic<bool>        forked_child{false};

std::mutex               map_lock; /* never held across anything that can
                                      wait for the monitor */
WatchMap                 watches;
Counters                 counters;
std::atomic<unsigned>    warned_reasons{0};

size_t page_size()
{
    static const size_t size = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    return size;
}

/* [addr, addr+len) widened to pages; false on NULL, 0 or wrap-around */
bool page_range(void *addr, size_t len, uintptr_t *start, uintptr_t *end)
{
    const uintptr_t a = reinterpret_cast<uintptr_t>(addr);
    if ((addr == nullptr) || (len == 0) || (a + len < a)) {
        return false;
    }
    const uintptr_t mask = page_size() - 1;
    *start = a & ~mask;
    *end   = (a + len + mask) & ~mask;
    return *end > *start;
}

void dispatch(uintptr_t start, uintptr_t end)
{
    ucm_vm_munmap(reinterpret_cast<void *>(start), end - start);
}

/* One warning per reason, then debug lines: a file mapping refused on
 * every registration must not flood the log. */
void log_refusal(kreg_reason_t why, uintptr_t start, uintptr_t end, int err)
{
    const unsigned bit = 1u << why;
    if (!(warned_reasons.fetch_or(bit) & bit)) {
        ucs_warn("kreg: cannot watch 0x%lx..0x%lx: %s (%s); registering it "
                 "uncached", start, end, kreg_reason_str(why),
                 err ? strerror(err) : "no error code");
    } else {
        ucs_debug("kreg: cannot watch 0x%lx..0x%lx: %s", start, end,
                  kreg_reason_str(why));
    }
}

bool ucx_version_matches(std::string *error)
{
    void *ucp = dlopen("libucp.so.0", RTLD_LAZY | RTLD_NOLOAD);
    if (ucp == nullptr) {
        ucp = dlopen("libucp.so.0", RTLD_LAZY | RTLD_LOCAL);
    }
    using get_version_t = void (*)(unsigned *, unsigned *, unsigned *);
    auto get = ucp ? reinterpret_cast<get_version_t>(dlsym(ucp, "ucp_get_version")) :
                     nullptr;
    if (get == nullptr) {
        *error = "cannot find ucp_get_version() to check the UCX version";
        return false;
    }
    unsigned major = 0, minor = 0, release = 0;
    get(&major, &minor, &release);
    char running_ver[64];
    snprintf(running_ver, sizeof(running_ver), "%u.%u.%u", major, minor, release);
    if (strcmp(running_ver, KREG_UCX_BUILD_VERSION) != 0) {
        *error = std::string("built for UCX " KREG_UCX_BUILD_VERSION ", running with ") +
                 running_ver;
        return false;
    }
    return true;
}

void atfork_prepare()
{
    life_lock.lock();
    if (running && monitor) {
        monitor->hold_for_fork();
    }
    map_lock.lock();
}

void atfork_parent()
{
    map_lock.unlock();
    if (running && monitor) {
        monitor->release_after_fork();
    }
    life_lock.unlock();
}

void atfork_child()
{
    map_lock.unlock();
    life_lock.unlock();
    if (running.load()) {
        /* The child has no monitor threads, and its mappings lost the
         * watch (no UFFD_FEATURE_EVENT_FORK). Its copy of the descriptor
         * still speaks for the parent's address space: close it now, and
         * re-open lazily on the first call (restart_in_child). */
        running = false;
        reason  = KREG_REASON_FORKED;
        monitor->abandon_after_fork();
        ::close(uffd.release_fd());
        forked_child = true;
    }
}

/* Opens the descriptor and starts the threads; life_lock held. */
bool open_source(std::string *error)
{
    UffdOptions uo;
    uo.try_device   = opts.device != 0;
    uo.try_wp_async = opts.wp_async != 0;
    /* In verify mode a moved mapping must not carry the watch to its new
     * address, where the check would take it for the one registered
     * there: without the REMAP feature the kernel drops it on mremap. */
    uo.want_remap = opts.mode != KREG_MODE_VERIFY;
    if (!uffd.open(uo)) {
        reason = uffd.reason();
        *error = uffd.error();
        return false;
    }
    auto mon = std::make_unique<Monitor>(uffd, opts.queue_size, dispatch);
    if (!mon->start(error)) {
        uffd.close();
        reason = KREG_REASON_OTHER;
        return false;
    }
    monitor = std::move(mon);
    mode    = opts.mode;
    reason  = KREG_REASON_NONE;
    running = true;
    return true;
}

/* Reports every watched range as unmapped, so no rcache keeps an entry
 * that nothing will watch any more. */
void flush_watches()
{
    Ranges all;
    {
        std::lock_guard<std::mutex> guard(map_lock);
        all = watches.ranges();
        watches.clear();
    }
    for (const Range &r : all) {
        dispatch(r.first, r.second);
    }
}

/* In a forked child, drops what belonged to the parent; life_lock held.
 * Returns false if there was nothing to drop. */
bool forget_parent()
{
    if (!forked_child.exchange(false)) {
        return false;
    }
    /* The parent's monitor object may hold locks taken by threads that
     * don't exist here: leave it. */
    (void)monitor.release();
    flush_watches();
    return true;
}

void restart_in_child()
{
    std::lock_guard<std::mutex> guard(life_lock);
    if (!forget_parent() || (refs == 0)) {
        return;
    }
    std::string error;
    if (!open_source(&error)) {
        ucs_warn("kreg: cannot restart in the forked child: %s; every "
                 "registration is uncached", error.c_str());
    }
}

inline void check_fork()
{
    if (__builtin_expect(forked_child.load(std::memory_order_relaxed), 0)) {
        restart_in_child();
    }
}

} // namespace
} // namespace kreg

using namespace kreg;

extern "C" {

ucs_status_t kreg_start(void)
{
    std::lock_guard<std::mutex> guard(life_lock);
    forget_parent();
    if (refs++ > 0) {
        return running ? UCS_OK : UCS_ERR_UNSUPPORTED;
    }

    std::string error;
    ucs_status_t status = UCS_ERR_UNSUPPORTED;
    if (kreg_options_read(&opts) != UCS_OK) {
        reason = KREG_REASON_BAD_CONFIG;
        error  = "a bad value in UCX_KREG_MODE, _DEVICE, _WP_ASYNC or _QUEUE_SIZE "
                 "(see the error above)";
        status = UCS_ERR_INVALID_PARAM;
        goto fail;
    }
    opts_valid = true;
    if (!opts.enable) {
        reason = KREG_REASON_DISABLED;
        error  = "UCX_KREG_ENABLE=n";
        goto fail;
    }
    if (!ucx_version_matches(&error)) {
        reason = KREG_REASON_OTHER;
        goto fail;
    }
#ifdef HAVE_VALGRIND_VALGRIND_H
    /* Valgrind runs one thread at a time and doesn't treat munmap as
     * blocking: a munmap waiting for the reader would wait forever. */
    if (RUNNING_ON_VALGRIND) {
        reason = KREG_REASON_VALGRIND;
        error  = "running under valgrind";
        goto fail;
    }
#endif
    if (!atfork_installed) {
        pthread_atfork(atfork_prepare, atfork_parent, atfork_child);
        atfork_installed = true;
    }
    if (!open_source(&error)) {
        goto fail;
    }
    ucm_set_external_event(UCM_EVENT_VM_UNMAPPED);
    external = true;
    ucs_debug("kreg: watching through userfaultfd%s, mode %s%s%s",
              uffd.via_device() ? " (/dev/userfaultfd)" : "",
              kreg_mode_str(static_cast<kreg_mode_t>(mode.load())),
              uffd.wp_async() ? ", WP_ASYNC" : "",
              uffd.event_remap() ? ", REMAP" : "");
    return UCS_OK;

fail:
    ucs_warn("kreg: kernel memory events unavailable: %s (%s); registrations "
             "are not watched by the kernel", error.c_str(),
             kreg_reason_str(reason.load()));
    return status;
}

void kreg_stop(void)
{
    std::unique_lock<std::mutex> guard(life_lock);
    forget_parent();
    if (refs == 0) {
        ucs_warn("kreg: kreg_stop() without kreg_start()");
        return;
    }
    if (--refs > 0) {
        return;
    }
    if (running) {
        running = false;
        /* Close first: the kernel drops every watch and wakes any thread
         * still blocked in munmap, then the threads can be stopped. */
        monitor->stop();
        uffd.close();
        monitor.reset();
        flush_watches();
    }
    if (external) {
        ucm_unset_external_event(UCM_EVENT_VM_UNMAPPED);
        external = false;
    }
    if (opts_valid) {
        kreg_options_release(&opts);
        opts_valid = false;
    }
    reason = KREG_REASON_NOT_STARTED;
}

int kreg_watch(void *addr, size_t len, kreg_reason_t *reason_p)
{
    uintptr_t start, end;
    kreg_reason_t why = KREG_REASON_NONE;
    int err           = 0;

    check_fork();
    if (!page_range(addr, len, &start, &end)) {
        why   = KREG_REASON_BAD_INPUT;
        start = reinterpret_cast<uintptr_t>(addr);
        end   = start + len;
    } else if (!running.load()) {
        const kreg_reason_t r = reason.load();
        why = (r == KREG_REASON_NONE) ? KREG_REASON_NOT_STARTED : r;
    } else {
        /* The kernel registers the mappings in a range and skips its holes;
         * a hole mapped later would not be watched. msync(MS_ASYNC) finds
         * holes (ENOMEM) walking mappings, not pages. */
        std::lock_guard<std::mutex> guard(map_lock);
        if ((msync(reinterpret_cast<void *>(start), end - start, MS_ASYNC) != 0) &&
            (errno == ENOMEM)) {
            why = KREG_REASON_BAD_INPUT;
            err = ENOMEM;
        } else if ((err = uffd.watch(start, end - start)) != 0) {
            why = Uffd::reason_of(err);
        } else {
            watches.add(start, end);
            counters.watch_calls.fetch_add(1, std::memory_order_relaxed);
        }
    }
    if (reason_p != nullptr) {
        *reason_p = why;
    }
    if (why == KREG_REASON_NONE) {
        return 1;
    }
    counters.fallbacks[why].fetch_add(1, std::memory_order_relaxed);
    log_refusal(why, start, end, err);
    return 0;
}

void kreg_unwatch(void *addr, size_t len)
{
    uintptr_t start, end;
    check_fork();
    if (!page_range(addr, len, &start, &end)) {
        return;
    }
    std::lock_guard<std::mutex> guard(map_lock);
    for (const Range &r : watches.remove(start, end)) {
        if (running.load()) {
            /* may fail where the memory is gone already: nothing to drop */
            (void)uffd.unwatch(r.first, r.second - r.first);
        }
    }
}

void kreg_sync(void)
{
    check_fork();
    if (running.load()) {
        monitor->sync();
    }
}

int kreg_prepare_lookup(void *addr, size_t len)
{
    check_fork();
    if (!running.load(std::memory_order_acquire)) {
        return 0;
    }
    switch (mode.load(std::memory_order_relaxed)) {
    case KREG_MODE_PLAIN:
        monitor->wait_read_events();
        return 1;
    case KREG_MODE_SYNC:
        monitor->sync();
        return 1;
    default:
        break;
    }

    /* verify: events already read are dispatched first, so what the kernel
     * told us is applied; then the kernel's word on this very range covers
     * an event it has not queued yet. */
    monitor->wait_read_events();
    uintptr_t start, end;
    if (!page_range(addr, len, &start, &end)) {
        return 0;
    }
    counters.verify_calls.fetch_add(1, std::memory_order_relaxed);
    if (uffd.is_watched(start, end - start)) {
        return 1;
    }
    {
        /* never watched (a first registration, an uncached buffer): no
         * rcache holds it, nothing to invalidate */
        std::lock_guard<std::mutex> guard(map_lock);
        if (!watches.overlaps(start, end)) {
            return 0;
        }
    }
    counters.verify_invalidations.fetch_add(1, std::memory_order_relaxed);
    dispatch(start, end);
    return 0;
}

void kreg_query(kreg_caps_t *caps)
{
    check_fork();
    std::lock_guard<std::mutex> guard(life_lock);
    *caps                = kreg_caps_t{};
    caps->running        = running.load();
    caps->mode           = static_cast<kreg_mode_t>(mode.load());
    caps->reason         = running ? KREG_REASON_NONE : reason.load();
    caps->external_event = external;
    if (running) {
        caps->via_device     = uffd.via_device();
        caps->user_mode_only = uffd.user_mode_only();
        caps->wp_async       = uffd.wp_async();
        caps->event_remap    = uffd.event_remap();
        caps->features       = uffd.features();
        caps->verify_by_scan = uffd.scans();
    }
}

void kreg_get_stats(kreg_stats_t *stats)
{
    *stats = kreg_stats_t{};
    {
        std::lock_guard<std::mutex> guard(life_lock);
        if (monitor) {
            monitor->add_stats(stats);
        }
    }
    {
        std::lock_guard<std::mutex> guard(map_lock);
        stats->watched_ranges = watches.ranges().size();
        stats->watched_bytes  = watches.bytes();
    }
    stats->watch_calls = counters.watch_calls.load();
    for (int i = 0; i < KREG_REASON_LAST; ++i) {
        stats->fallbacks[i] = counters.fallbacks[i].load();
    }
    stats->verify_calls         = counters.verify_calls.load();
    stats->verify_invalidations = counters.verify_invalidations.load();
}

const char *kreg_reason_str(kreg_reason_t r)
{
    switch (r) {
    case KREG_REASON_NONE:        return "watched";
    case KREG_REASON_NOT_STARTED: return "kernel events not started";
    case KREG_REASON_ENOSYS:      return "no userfaultfd in this kernel or sandbox";
    case KREG_REASON_EPERM:       return "userfaultfd not permitted";
    case KREG_REASON_EBUSY:       return "watched by another userfaultfd";
    case KREG_REASON_EINVAL:      return "memory type the kernel cannot watch";
    case KREG_REASON_BAD_INPUT:   return "bad address range";
    case KREG_REASON_VALGRIND:    return "running under valgrind";
    case KREG_REASON_FORKED:      return "forked child, not restarted";
    case KREG_REASON_BAD_CONFIG:  return "bad UCX_KREG_* setting";
    case KREG_REASON_DISABLED:    return "disabled by UCX_KREG_ENABLE=n";
    case KREG_REASON_OTHER:       return "other error";
    default:                      return "unknown";
    }
}

const char *kreg_mode_str(kreg_mode_t m)
{
    switch (m) {
    case KREG_MODE_PLAIN:  return "plain";
    case KREG_MODE_SYNC:   return "sync";
    case KREG_MODE_VERIFY: return "verify";
    default:               return "unknown";
    }
}

} /* extern "C" */
