/*
 * libucm_kernel: the kernel tells UCX when registered memory goes away.
 *
 * Two backends behind one interface, chosen at kreg_start():
 *  - notifier: the kreg_notifier kernel module (kmod/). One
 *    mmu_interval_notifier per watched range, a counter per range mapped
 *    read-only into the process; the kernel bumps it in the changing thread
 *    before any page of the range changes. A cache hit is one load.
 *  - uffd: one userfaultfd per process (UFFD_USER_MODE_ONLY, unprivileged),
 *    ranges registered in write-protect mode and never write-protected.
 *    Reader and dispatcher threads report UNMAP / REMOVE / REMAP events; a
 *    lookup asks the kernel (one or two system calls) whether an event is
 *    still in flight and whether the range is still the watched mapping.
 * Either way every invalidated range is reported through UCM's public
 * ucm_vm_munmap(), which every UCS rcache in the process listens to, and
 * UCM_EVENT_VM_UNMAPPED is declared external, so UCM installs no hooks.
 *
 * A cache built on this does, per lookup (kreg_rcache_get, inline here,
 * does it all):
 *   kreg_prepare_lookup(addr, len);        uffd: the kernel's word on the range
 *   ucs_rcache_get(...) -> region;
 *   kreg_watch_is_current(&region->watch)  notifier: the counter; else 1
 * and per miss (kreg_register_watched does it all):
 *   kreg_watch(range, &w); register (pin); kreg_watch_confirm(&w)
 *
 * All symbols are prefixed kreg_. Every function is thread safe.
 */
#ifndef UCX_KREG_UCM_KERNEL_H
#define UCX_KREG_UCM_KERNEL_H

#include <stddef.h>
#include <stdint.h>
#include <ucs/type/status.h>

#ifdef __cplusplus
extern "C" {
#endif

#include <ucs/memory/rcache.h> /* has no C++ guards of its own */
#include <ucp/api/ucp_version.h> /* UCS has no version macro of its own */

#define KREG_API __attribute__((visibility("default")))

struct ucs_rcache;
struct ucs_rcache_region;

/* Page size, set when the library loads: the alignment of every watched
 * cache's regions (a watch covers whole pages). */
KREG_API extern size_t kreg_page_size;

/* UCS's rcache API across the UCX versions this builds against (1.13.1 and
 * every release from 1.14.1 to 1.22.0 are built and tested): ucs_rcache_get
 * takes the region alignment since UCX 1.17 (before, ucs_rcache_params_t's
 * alignment fields set it);
 * since 1.18 ucs_rcache_ops_t has a merge callback that UCS calls without
 * checking it for NULL. */
#define KREG_UCS_RCACHE_GET_ALIGNS (UCP_API_VERSION >= UCP_VERSION(1, 17))
#define KREG_UCS_RCACHE_OPS_MERGE  (UCP_API_VERSION >= UCP_VERSION(1, 18))

static inline ucs_status_t kreg_ucs_rcache_get(struct ucs_rcache *rcache,
                                               void *addr, size_t len,
                                               int prot, void *arg,
                                               struct ucs_rcache_region **region_p)
{
#if KREG_UCS_RCACHE_GET_ALIGNS
    return ucs_rcache_get(rcache, addr, len, kreg_page_size, prot, arg,
                          region_p);
#else
    return ucs_rcache_get(rcache, addr, len, prot, arg, region_p);
#endif
}

/* Which kernel mechanism watches (UCX_KREG_BACKEND). */
typedef enum {
    KREG_BACKEND_NONE = 0, /* not started, or it failed                  */
    KREG_BACKEND_UFFD,     /* userfaultfd: every Linux, unprivileged      */
    KREG_BACKEND_NOTIFIER, /* the kreg_notifier module: /dev/kreg_notifier */
    KREG_BACKEND_LAST
} kreg_backend_t;

/* What a lookup checks (UCX_KREG_MODE). */
typedef enum {
    /* Default. Exact: a lookup never returns a registration of pages that
     * were replaced before it started. notifier: the range's counter.
     * uffd: waits for events in flight and read, then asks the kernel
     * whether the range is still in the watched mappings. */
    KREG_MODE_VERIFY = 0,
    /* For measurements only: uffd waits for events already read; notifier
     * compares nothing. Another thread's remap can slip through. */
    KREG_MODE_PLAIN,
    KREG_MODE_LAST
} kreg_mode_t;

/* Why a range or the whole source is not watched. */
typedef enum {
    KREG_REASON_NONE = 0,
    KREG_REASON_NOT_STARTED,  /* kreg_start() not called or it failed       */
    KREG_REASON_ENOSYS,       /* no userfaultfd syscall (or valgrind)       */
    KREG_REASON_EPERM,        /* refused: seccomp, vm.unprivileged_userfaultfd */
    KREG_REASON_EBUSY,        /* watched by another userfaultfd already     */
    KREG_REASON_EINVAL,       /* memory type the kernel does not watch      */
    KREG_REASON_BAD_INPUT,    /* zero length, NULL, wrap-around, a hole     */
    KREG_REASON_VALGRIND,     /* running under valgrind: never blocks munmap */
    KREG_REASON_FORKED,       /* child of a fork that could not restart     */
    KREG_REASON_BAD_CONFIG,   /* a UCX_KREG_* variable has a bad value      */
    KREG_REASON_DISABLED,     /* UCX_KREG_ENABLE=n                          */
    KREG_REASON_LIMIT,        /* the process's watch budget is used up      */
    KREG_REASON_SHARED,       /* page-cache memory (shared, file) under the
                                 uffd backend: changes without any event    */
    KREG_REASON_CHANGED,      /* the pages changed while being registered   */
    KREG_REASON_NO_DEVICE,    /* UCX_KREG_BACKEND=notifier, no module       */
    KREG_REASON_OTHER,
    KREG_REASON_LAST
} kreg_reason_t;

typedef enum {
    KREG_EV_UNMAP = 0,  /* munmap, mmap(MAP_FIXED) over, mremap shrink, brk */
    KREG_EV_REMOVE,     /* madvise(DONTNEED / REMOVE / FREE)               */
    KREG_EV_REMAP,      /* mremap move or DONTUNMAP (both ends reported)   */
    KREG_EV_NOTIFY,     /* notifier: a range's pages changed               */
    KREG_EV_UNEXPECTED, /* a page fault or unknown event: resolved, counted */
    KREG_EV_LAST
} kreg_event_type_t;

/* One watched range, kept by the cache entry that registered it. */
typedef struct kreg_watch {
    const volatile uint64_t *counter;  /* compared with snapshot at each hit */
    uint64_t                 snapshot;
    uintptr_t                start;    /* the watched pages                   */
    uintptr_t                end;
    uint32_t                 slot;     /* the backend's handle                */
    uint32_t                 generation; /* source generation that made it */
} kreg_watch_t;

typedef struct {
    int            running;         /* a backend watches in this process    */
    kreg_backend_t backend;
    kreg_mode_t    mode;
    kreg_reason_t  reason;          /* why not running, when !running       */
    const char    *why_backend;     /* why this backend was chosen (static) */
    int            external_event;  /* UCM_EVENT_VM_UNMAPPED declared external */
    unsigned long  max_ranges;      /* watch budget: disjoint ranges        */
    /* uffd only */
    int            via_device;      /* opened through /dev/userfaultfd      */
    int            user_mode_only;  /* UFFD_USER_MODE_ONLY was accepted     */
    int            wp_async;        /* file mappings can be watched too     */
    int            event_remap;     /* REMAP events requested               */
    uint64_t       features;        /* UFFD_FEATURE_* granted by the kernel */
    int            verify_by_scan;  /* the check asks PAGEMAP_SCAN, per
                                       mapping (else UFFDIO_WRITEPROTECT)   */
    int            shared_watched;  /* UCX_KREG_SHARED_MEMORY=watch         */
    /* notifier only */
    int            sync_delivery;   /* synchronous delivery runs: UCX's own
                                       caches are exact (UCX_KREG_SYNC)     */
    int            sync_signal;     /* its signal, 0 for none               */
    /* why synchronous delivery does not run ("" when it does; valid until
     * the backend stops) */
    const char    *why_no_sync;
    const char    *version;         /* this library's (configure.ac's)      */
} kreg_caps_t;

typedef struct {
    uint64_t events[KREG_EV_LAST];     /* events read from the kernel       */
    uint64_t dispatched;               /* ranges passed to ucm_vm_munmap    */
    uint64_t coalesced;                /* events merged on queue overflow   */
    uint64_t watched_ranges;           /* disjoint ranges watched now       */
    uint64_t watched_bytes;
    uint64_t watch_calls;              /* kreg_watch() that watched          */
    uint64_t fallbacks[KREG_REASON_LAST]; /* refusals, by reason            */
    uint64_t verify_calls;             /* uffd: kernel checks at lookup      */
    uint64_t verify_invalidations;     /* uffd: ranges found changed by them */
    uint64_t inflight_waits;           /* uffd: lookups that waited for an
                                          event the kernel had in flight    */
    uint64_t stale_hits;               /* kreg_rcache_get: entries found
                                          stale by their counter            */
    uint64_t sync_waits;               /* lookups that waited for dispatch   */
    uint64_t dispatch_latency_max_ns;  /* read -> dispatched, per batch     */
    uint64_t dispatch_latency_sum_ns;
    uint64_t dispatch_batches;
    struct {                           /* notifier: synchronous delivery     */
        uint64_t queued;               /* changes of pinned pages queued     */
        uint64_t signalled;            /* the changing thread signalled      */
        uint64_t self_held;            /* the changing thread held instead
                                          (it blocks the signal)            */
        uint64_t held;                 /* other threads held                 */
        uint64_t held_waits;           /* holds that had to sleep            */
        uint64_t held_timeouts;        /* holds that gave up: a window       */
        uint64_t hold_nomem;           /* threads not held (no memory)       */
        uint64_t late;                 /* changed by no thread of ours (io_uring
                                          worker, another process, kernel
                                          thread): reported by the reader   */
        uint64_t unpinned;             /* changes of memory never pinned     */
        uint64_t drained;              /* ranges reported to UCM             */
        uint64_t passes;               /* holds that let their thread go at
                                          once: its own handler reports, or
                                          it is reporting                   */
        uint64_t threads;              /* threads given a hold (once each)   */
        uint64_t own_changes;          /* changes by the library's reader   */
        uint64_t drain_waits;          /* reports that waited for a change
                                          to end (its pages being zapped)   */
        uint64_t inflight_full;        /* changes reported before their end
                                          (over 64 in flight): a window     */
        uint64_t irq_releases;         /* threads held at an interrupt's
                                          return let go while a report was
                                          blocked (they may hold its lock)  */
        uint64_t irq_next_held;        /* of those, held at the end of their
                                          next system call until the report */
        uint64_t irq_unwatched;        /* of those, next system call not
                                          held (no call hooks): a window    */
        uint64_t born_held;            /* threads made while a change was
                                          unreported, held at their first
                                          return until it was reported     */
        uint64_t irq_next_released;    /* of irq_next_held, let go after
                                          250 ms more (made inside the lock
                                          the report needs): a window       */
        uint64_t call_releases;        /* threads held at the return of an
                                          mmap or mremap that mapped nothing
                                          of the change, let go as
                                          irq_releases (a lock the report
                                          needs); next call held the same   */
        uint64_t irq_passes;           /* threads at an interrupt's return
                                          let go at once after a munmap
                                          (nothing mapped there any more);
                                          next call held as irq_releases'   */
        uint64_t gates_parked;         /* gates parked at an interrupt's
                                          return: armed by the thread's next
                                          system call, not by every munmap */
        uint64_t parked_held;          /* of those, held at the end of that
                                          call for a change made since      */
    } sync;
} kreg_stats_t;

/* Reference counted. The first call chooses and starts a backend and
 * declares UCM_EVENT_VM_UNMAPPED external. On failure returns an error,
 * logs the reason once, and every kreg_watch() returns 0 (callers then
 * register uncached). Each call must be paired with kreg_stop(), even a
 * failed one. In a forked child the first call of any kind starts the
 * child's own backend. */
KREG_API ucs_status_t kreg_start(void);

/* The last stop stops the backend (the kernel drops every watch and wakes
 * any thread blocked in munmap), reports every watched range as unmapped,
 * makes every outstanding kreg_watch_t stale and withdraws the external
 * declaration. */
KREG_API void kreg_stop(void);

/* Watch [addr, addr+len), widened to whole pages, into *w. Returns 1 if
 * the range is watched now: any change of its pages from now on makes
 * kreg_watch_is_current(w) false or is reported through ucm_vm_munmap()
 * before a lookup that starts after the change returns. Returns 0
 * otherwise, with the reason in *reason_p if not NULL; the caller must
 * not cache the range. */
KREG_API int kreg_watch(void *addr, size_t len, kreg_watch_t *w,
                        kreg_reason_t *reason_p);

/* Call once the watched range is registered (pinned). Returns 1 if the
 * registration may be cached; 0 with KREG_REASON_CHANGED if the pages
 * changed while being pinned (deregister, kreg_unwatch, try again), or
 * another reason if policy keeps it out of the cache (KREG_REASON_SHARED:
 * page-cache memory under the uffd backend, see UCX_KREG_SHARED_MEMORY). */
KREG_API int kreg_watch_confirm(kreg_watch_t *w, kreg_reason_t *reason_p);

/* Drops a watch made by kreg_watch() (any other watch of the same pages
 * stays). A watch of an earlier backend (before a stop or a fork) only
 * clears *w. */
KREG_API void kreg_unwatch(kreg_watch_t *w);

/* Whether the pages registered with *w are still the ones mapped there.
 * One load; exact with the notifier backend. With the uffd backend the
 * lookup's kernel check (kreg_prepare_lookup) does the work and this only
 * turns false after a fork or a stop. */
static inline int kreg_watch_is_current(const kreg_watch_t *w)
{
    /* atomic loads of *w too (plain moves on x86): the entry may be
     * released by another thread right after this, ordered by the rcache's
     * reference count, which sanitizers do not see */
    const volatile uint64_t *counter = __atomic_load_n(&w->counter, __ATOMIC_RELAXED);
    return __atomic_load_n(counter, __ATOMIC_ACQUIRE) ==
           __atomic_load_n(&w->snapshot, __ATOMIC_RELAXED);
}

/* Call before an rcache lookup of [addr, addr+len). uffd: waits for
 * events in flight and read and, in verify mode, asks the kernel whether
 * the range is still the watched mapping, reporting it through
 * ucm_vm_munmap() if not. notifier: returns at once. Returns 0 if the range
 * was found changed or is not watched, 1 otherwise. */
KREG_API int kreg_prepare_lookup(void *addr, size_t len);

/* Registers a cache entry's range the way a watched cache must: watch,
 * reg(arg), confirm; on KREG_REASON_CHANGED dereg, unwatch and try again
 * (a few times). UCS_OK: registered and watched. UCS_ERR_REJECTED: not
 * watched (reason in *reason_p): register it uncached. Any other status
 * is reg's own failure. */
typedef ucs_status_t (*kreg_reg_func_t)(void *arg, void *addr, size_t len);
typedef void (*kreg_dereg_func_t)(void *arg);
KREG_API ucs_status_t kreg_register_watched(void *addr, size_t len,
                                            kreg_watch_t *w,
                                            kreg_reg_func_t reg,
                                            kreg_dereg_func_t dereg, void *arg,
                                            kreg_reason_t *reason_p);

/* Nonzero while the running backend asks the kernel at every lookup
 * (uffd: kreg_prepare_lookup); 0 with the notifier, whose hit is its
 * counter alone, and while nothing runs. Read by kreg_rcache_get. */
KREG_API extern int kreg_lookup_asks_kernel;

/* kreg_rcache_get's out-of-line path: kreg_prepare_lookup, get, and a
 * region whose watch is no longer current invalidated and looked up again
 * (a few times). */
KREG_API ucs_status_t kreg_rcache_get_checked(struct ucs_rcache *rcache,
                                              void *addr, size_t len, int prot,
                                              void *arg, size_t watch_offset,
                                              struct ucs_rcache_region **region_p);

/* Drops a region kreg_rcache_get found stale (invalidates it, releases the
 * reference the lookup took), then kreg_rcache_get_checked. */
KREG_API ucs_status_t kreg_rcache_get_again(struct ucs_rcache *rcache,
                                            struct ucs_rcache_region *stale,
                                            void *addr, size_t len, int prot,
                                            void *arg, size_t watch_offset,
                                            struct ucs_rcache_region **region_p);

/* ucs_rcache_get() the way a watched cache must: kreg_prepare_lookup where
 * the backend needs it, get, and a region whose watch (at watch_offset in
 * the region structure) is no longer current is invalidated and looked up
 * again. Inline: on the notifier a hit is UCS's own lookup and one compare,
 * with no call into this library. */
static inline ucs_status_t kreg_rcache_get(struct ucs_rcache *rcache,
                                           void *addr, size_t len, int prot,
                                           void *arg, size_t watch_offset,
                                           struct ucs_rcache_region **region_p)
{
    struct ucs_rcache_region *region;
    ucs_status_t status;

    if (__atomic_load_n(&kreg_lookup_asks_kernel, __ATOMIC_ACQUIRE)) {
        return kreg_rcache_get_checked(rcache, addr, len, prot, arg,
                                       watch_offset, region_p);
    }
    status = kreg_ucs_rcache_get(rcache, addr, len, prot, arg, &region);
    if (status != UCS_OK) {
        return status;
    }
    if (!kreg_watch_is_current((const kreg_watch_t *)((const char *)region +
                                                      watch_offset))) {
        return kreg_rcache_get_again(rcache, region, addr, len, prot, arg,
                                     watch_offset, region_p);
    }
    *region_p = region;
    return UCS_OK;
}

/* Returns once every event the kernel had queued when the call started has
 * been dispatched to UCM. */
KREG_API void kreg_sync(void);

/* Starts the source now, without kreg_start(), where the kreg_notifier
 * module's synchronous delivery can run and UCX_KREG_AUTOSTART allows it
 * (auto: this call counts as a plugin's load); it then runs until exit.
 * Returns 1 if synchronous delivery serves the process: every UCS rcache
 * is told of every change of registered memory in time, UCP's included.
 * 0 otherwise (nothing started; UCM's hooks as UCX configures them). */
KREG_API int kreg_autostart(void);

/* 1 while synchronous delivery serves the process (kreg_query's
 * sync_delivery, for callers without this header: dlsym). */
KREG_API int kreg_sync_active(void);

KREG_API void kreg_query(kreg_caps_t *caps);
KREG_API void kreg_get_stats(kreg_stats_t *stats);
KREG_API const char *kreg_reason_str(kreg_reason_t reason);
KREG_API const char *kreg_mode_str(kreg_mode_t mode);
KREG_API const char *kreg_backend_str(kreg_backend_t backend);

#ifdef __cplusplus
}
#endif

#endif
