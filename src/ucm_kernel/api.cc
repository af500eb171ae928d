/* The C entry points of libucm_kernel (ucm_kernel.h). The work is done by
 * the running backend (source.cc picks it); here: argument checks, the
 * refusal log, the counters, and the two protocols a watched cache
 * follows (kreg_register_watched on a miss, kreg_rcache_get on a lookup). */
#include "backend.h"
#include "options.h"
#include "page.h"
#include "source.h"

#include <atomic>
#include <cerrno>
#include <cstring>
#include <unistd.h>

#include <ucs/debug/log_def.h>
extern "C" {
#include <ucs/memory/rcache.h> /* has no C++ guards */
}

/* ucm_kernel.h: the alignment kreg_ucs_rcache_get passes on UCX 1.17+ */
size_t kreg_page_size = kreg::page_size();

namespace kreg {
namespace {

struct library_counters {
    std::atomic<uint64_t> watch_calls{0};
    std::atomic<uint64_t> fallbacks[KREG_REASON_LAST] = {};
    std::atomic<uint64_t> stale_hits{0};
    std::atomic<unsigned> warned{0}; /* a bit per reason */
};

library_counters &counters()
{
    static library_counters *const c = new library_counters; /* never destroyed */
    return *c;
}

/* [addr, addr+len) widened to pages; false on NULL, 0 or wrap-around */
bool page_range(const void *addr, size_t len, uintptr_t *start, uintptr_t *end)
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

/* One warning per reason, then debug lines: a file mapping refused on
 * every registration must not flood the log. A limit is named by the
 * backend that set it (the module's parameter and its value). */
void log_refusal(kreg_reason_t why, uintptr_t start, uintptr_t end, int err)
{
    counters().fallbacks[why].fetch_add(1, std::memory_order_relaxed);
    if (source_exiting()) {
        return; /* UCX's logger is being torn down: a refusal then is normal */
    }
    const unsigned bit = 1u << why;
    if (!(counters().warned.fetch_or(bit) & bit)) {
        /* Pages that keep changing while pinned (the kernel migrating or
         * compacting them, seen in the guest under memory pressure) are a
         * passing state of the machine, not a setting to fix: diag level. */
        const ucs_log_level_t level = (why == KREG_REASON_CHANGED) ?
                                      UCS_LOG_LEVEL_DIAG : UCS_LOG_LEVEL_WARN;
        backend *b = (why == KREG_REASON_LIMIT) ? source_backend() : nullptr;
        const std::string limit = b ? b->limit_text(err) : std::string();
        ucs_log(level, "kreg: cannot watch 0x%lx..0x%lx: %s (%s); registering "
                "it uncached", start, end,
                limit.empty() ? kreg_reason_str(why) : limit.c_str(),
                err ? strerror(err) : "no error code");
    } else {
        ucs_debug("kreg: cannot watch 0x%lx..0x%lx: %s", start, end,
                  kreg_reason_str(why));
    }
}

/* A watch that is never current: what kreg_watch leaves on refusal. */
void clear_watch(kreg_watch_t *w)
{
    /* atomic stores for the two fields a concurrent hit reads (see
     * kreg_watch_is_current) */
    __atomic_store_n(&w->counter, generation_word(), __ATOMIC_RELAXED);
    __atomic_store_n(&w->snapshot, 0, __ATOMIC_RELAXED); /* never a generation */
    w->start = w->end = 0;
    w->slot = w->generation = 0;
}

void noop_completion(void *) {}

/* The pages behind the registration changed (or the source stopped or the
 * process forked since): drop it, and the next lookup registers the pages
 * mapped now. */
void drop_stale(ucs_rcache_t *rcache, ucs_rcache_region_t *region)
{
    counters().stale_hits.fetch_add(1, std::memory_order_relaxed);
    ucs_debug("kreg: stale entry 0x%lx..0x%lx dropped at lookup",
              region->super.start, region->super.end);
    ucs_rcache_region_invalidate(rcache, region, noop_completion, nullptr);
    ucs_rcache_region_put(rcache, region);
}

} // namespace
} // namespace kreg

using namespace kreg;

extern "C" {

ucs_status_t kreg_start(void)
{
    return source_start();
}

void kreg_stop(void)
{
    source_stop();
}

int kreg_watch(void *addr, size_t len, kreg_watch_t *w, kreg_reason_t *reason_p)
{
    uintptr_t start = reinterpret_cast<uintptr_t>(addr), end = start + len;
    kreg_reason_t why = KREG_REASON_NONE;
    int err           = 0;

    clear_watch(w);
    if (!page_range(addr, len, &start, &end)) {
        why = KREG_REASON_BAD_INPUT;
    } else if (backend *b = source_backend()) {
        why = b->watch(start, end, w, &err);
    } else {
        why = source_reason();
    }
    if (reason_p != nullptr) {
        *reason_p = why;
    }
    if (why != KREG_REASON_NONE) {
        log_refusal(why, start, end, err);
        clear_watch(w);
        return 0;
    }
    counters().watch_calls.fetch_add(1, std::memory_order_relaxed);
    ucs_trace("kreg: watch 0x%lx..0x%lx slot %u", w->start, w->end, w->slot);
    return 1;
}

int kreg_watch_confirm(kreg_watch_t *w, kreg_reason_t *reason_p)
{
    kreg_reason_t why = KREG_REASON_CHANGED;
    if (w->generation == generation()) {
        if (backend *b = source_backend()) {
            why = b->confirm(w);
        }
    }
    if (reason_p != nullptr) {
        *reason_p = why;
    }
    return why == KREG_REASON_NONE;
}

void kreg_unwatch(kreg_watch_t *w)
{
    if ((w->end != 0) && (w->generation == generation())) {
        ucs_trace("kreg: unwatch 0x%lx..0x%lx slot %u", w->start, w->end, w->slot);
        if (backend *b = source_backend()) {
            b->unwatch(w);
        }
    }
    clear_watch(w);
}

int kreg_prepare_lookup(void *addr, size_t len)
{
    uintptr_t start, end;
    backend *b = source_backend();
    if ((b == nullptr) || !page_range(addr, len, &start, &end)) {
        return 0;
    }
    return b->checks_at_lookup() ? b->prepare_lookup(start, end) : 1;
}

ucs_status_t kreg_register_watched(void *addr, size_t len, kreg_watch_t *w,
                                   kreg_reg_func_t reg, kreg_dereg_func_t dereg,
                                   void *arg, kreg_reason_t *reason_p)
{
    /* A few tries: the pin itself can change the pages once (a write fault
     * on the zero page); memory changing every time is not cacheable. */
    constexpr int kTries = 3;
    kreg_reason_t why    = KREG_REASON_NONE;

    for (int i = 0; i < kTries; ++i) {
        if (!kreg_watch(addr, len, w, &why)) {
            break;
        }
        ucs_status_t status = reg(arg, addr, len);
        if (status != UCS_OK) {
            kreg_unwatch(w);
            return status;
        }
        if (kreg_watch_confirm(w, &why)) {
            return UCS_OK;
        }
        dereg(arg);
        const uintptr_t start = w->start, end = w->end;
        kreg_unwatch(w);
        if ((why != KREG_REASON_CHANGED) || (i + 1 == kTries)) {
            log_refusal(why, start, end, 0);
            break;
        }
    }
    if (reason_p != nullptr) {
        *reason_p = why;
    }
    return UCS_ERR_REJECTED;
}

ucs_status_t kreg_rcache_get_checked(struct ucs_rcache *rcache, void *addr,
                                     size_t len, int prot, void *arg,
                                     size_t watch_offset,
                                     struct ucs_rcache_region **region_p)
{
    /* bounded: memory that changes under every registration is not
     * cacheable (kreg_register_watched gives up on it as well) */
    for (int stale = 0; stale < 8; ++stale) {
        backend *b = source_backend();
        if ((b != nullptr) && b->checks_at_lookup()) {
            kreg_prepare_lookup(addr, len);
        }
        ucs_rcache_region_t *region;
        ucs_status_t status = kreg_ucs_rcache_get(rcache, addr, len, prot, arg, &region);
        if (status != UCS_OK) {
            return status;
        }
        auto *w = reinterpret_cast<const kreg_watch_t *>(
                reinterpret_cast<const char *>(region) + watch_offset);
        if (__builtin_expect(kreg_watch_is_current(w), 1)) {
            *region_p = region;
            return UCS_OK;
        }
        drop_stale(rcache, region);
    }
    return UCS_ERR_REJECTED;
}

ucs_status_t kreg_rcache_get_again(struct ucs_rcache *rcache,
                                   struct ucs_rcache_region *stale, void *addr,
                                   size_t len, int prot, void *arg,
                                   size_t watch_offset,
                                   struct ucs_rcache_region **region_p)
{
    drop_stale(rcache, stale);
    return kreg_rcache_get_checked(rcache, addr, len, prot, arg, watch_offset,
                                   region_p);
}

int kreg_autostart(void)
{
    return kreg::source_autostart(true) ? 1 : 0;
}

int kreg_sync_active(void)
{
    kreg_caps_t caps;
    kreg_query(&caps);
    return caps.sync_delivery;
}

void kreg_sync(void)
{
    if (backend *b = source_backend()) {
        b->sync();
    }
}

void kreg_query(kreg_caps_t *caps)
{
    source_query(caps);
}

void kreg_get_stats(kreg_stats_t *stats)
{
    *stats = kreg_stats_t{};
    source_add_stats(stats);
    stats->watch_calls = counters().watch_calls.load();
    for (int i = 0; i < KREG_REASON_LAST; ++i) {
        stats->fallbacks[i] = counters().fallbacks[i].load();
    }
    stats->stale_hits = counters().stale_hits.load();
}

const char *kreg_reason_str(kreg_reason_t r)
{
    switch (r) {
    case KREG_REASON_NONE:        return "watched";
    case KREG_REASON_NOT_STARTED: return "kernel events not started";
    case KREG_REASON_ENOSYS:      return "no userfaultfd in this kernel or sandbox";
    case KREG_REASON_EPERM:       return "not permitted";
    case KREG_REASON_EBUSY:       return "watched by another userfaultfd";
    case KREG_REASON_EINVAL:      return "memory type the kernel cannot watch";
    case KREG_REASON_BAD_INPUT:   return "bad address range";
    case KREG_REASON_VALGRIND:    return "running under valgrind";
    case KREG_REASON_FORKED:      return "forked child, not restarted";
    case KREG_REASON_BAD_CONFIG:  return "bad UCX_KREG_* setting";
    case KREG_REASON_DISABLED:    return "disabled by UCX_KREG_ENABLE=n";
    case KREG_REASON_LIMIT:       return "watch budget of the process used up";
    case KREG_REASON_SHARED:      return "page-cache memory (shared or file), which "
                                         "userfaultfd cannot watch for truncation";
    case KREG_REASON_CHANGED:     return "the pages changed while being registered";
    case KREG_REASON_NO_DEVICE:   return "no kreg_notifier module";
    case KREG_REASON_OTHER:       return "other error";
    default:                      return "unknown";
    }
}

const char *kreg_mode_str(kreg_mode_t m)
{
    return ((unsigned)m < KREG_MODE_LAST) ? kreg_mode_names[m] : "unknown";
}

const char *kreg_backend_str(kreg_backend_t b)
{
    /* the names UCX_KREG_BACKEND takes (options.c), one table */
    switch (b) {
    case KREG_BACKEND_NONE:     return "none";
    case KREG_BACKEND_UFFD:     return kreg_backend_choice_names[KREG_BACKEND_CHOICE_UFFD];
    case KREG_BACKEND_NOTIFIER: return kreg_backend_choice_names[KREG_BACKEND_CHOICE_NOTIFIER];
    default:                    return "unknown";
    }
}

} /* extern "C" */
