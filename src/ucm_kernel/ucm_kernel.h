/*
 * libucm_kernel: the kernel tells UCX when registered memory goes away.
 *
 * One userfaultfd per process (UFFD_USER_MODE_ONLY), ranges registered in
 * write-protect mode and never write-protected, so no fault ever blocks.
 * A monitor thread reads UNMAP / REMOVE / REMAP events and a dispatch thread
 * reports each range through UCM's public ucm_vm_munmap(), which every UCS
 * rcache in the process listens to. UCM_EVENT_VM_UNMAPPED is declared
 * external, so UCM installs no malloc or mmap hooks for the rcaches.
 *
 * All symbols are prefixed kreg_ so that none can clash with UCX's own.
 * Every function is thread safe.
 */
#ifndef UCX_KREG_UCM_KERNEL_H
#define UCX_KREG_UCM_KERNEL_H

#include <stddef.h>
#include <stdint.h>
#include <ucs/type/status.h>

#ifdef __cplusplus
extern "C" {
#endif

#define KREG_API __attribute__((visibility("default")))

/* How a lookup makes sure that a cached registration is still current
 * (UCX_KREG_MODE). See README.md, "Modes". */
typedef enum {
    /* Wait only for events the monitor has already read. No syscall. Leaves
     * the cross-thread window: an event queued but not read yet, or not yet
     * queued by the kernel. For measuring. */
    KREG_MODE_PLAIN  = 0,
    /* Also poll the descriptor: every event queued before the call is
     * dispatched. Leaves the "not yet queued" window, and SysV shm detach
     * (shmdt, shmat SHM_REMAP), for which Linux queues no event at all. */
    KREG_MODE_SYNC   = 1,
    /* Default. Also ask the kernel whether the looked-up range is still
     * the watched mapping (UFFDIO_WRITEPROTECT mode 0 is ENOENT otherwise)
     * and invalidate it if not. Loses no data. */
    KREG_MODE_VERIFY = 2
} kreg_mode_t;

/* Why a range or the whole source is not watched. */
typedef enum {
    KREG_REASON_NONE = 0,
    KREG_REASON_NOT_STARTED,  /* kreg_start() not called or it failed */
    KREG_REASON_ENOSYS,       /* no userfaultfd syscall (or valgrind)     */
    KREG_REASON_EPERM,        /* refused: seccomp, vm.unprivileged_userfaultfd */
    KREG_REASON_EBUSY,        /* watched by another userfaultfd already   */
    KREG_REASON_EINVAL,       /* memory type the kernel does not watch    */
    KREG_REASON_BAD_INPUT,    /* zero length, NULL, wrap-around, a hole   */
    KREG_REASON_VALGRIND,     /* running under valgrind: never blocks munmap */
    KREG_REASON_FORKED,       /* child of a fork before it re-opened      */
    KREG_REASON_BAD_CONFIG,   /* a UCX_KREG_* variable has a bad value    */
    KREG_REASON_DISABLED,     /* UCX_KREG_ENABLE=n                        */
    KREG_REASON_OTHER,
    KREG_REASON_LAST
} kreg_reason_t;

typedef enum {
    KREG_EV_UNMAP = 0,  /* munmap, mmap(MAP_FIXED) over, mremap shrink, brk */
    KREG_EV_REMOVE,     /* madvise(DONTNEED / REMOVE / FREE)               */
    KREG_EV_REMAP,      /* mremap move (reported: the old range)           */
    KREG_EV_UNEXPECTED, /* a page fault or unknown event: resolved, counted */
    KREG_EV_LAST
} kreg_event_type_t;

typedef struct {
    int         running;         /* monitor is up in this process         */
    kreg_mode_t mode;
    int         via_device;      /* opened through /dev/userfaultfd       */
    int         user_mode_only;  /* UFFD_USER_MODE_ONLY was accepted      */
    int         wp_async;        /* file mappings can be watched too      */
    int         event_remap;     /* REMAP events requested                */
    int         external_event;  /* UCM_EVENT_VM_UNMAPPED declared external */
    kreg_reason_t reason;        /* why not running, when !running         */
    uint64_t    features;        /* UFFD_FEATURE_* granted by the kernel  */
    int         verify_by_scan;  /* verify asks PAGEMAP_SCAN, per mapping
                                    (else UFFDIO_WRITEPROTECT, per page) */
} kreg_caps_t;

typedef struct {
    uint64_t events[KREG_EV_LAST];     /* events read from the kernel     */
    uint64_t dispatched;               /* ranges passed to ucm_vm_munmap  */
    uint64_t coalesced;                /* events merged on queue overflow */
    uint64_t watched_ranges;           /* disjoint ranges watched now     */
    uint64_t watched_bytes;
    uint64_t watch_calls;
    uint64_t fallbacks[KREG_REASON_LAST]; /* watch() refusals by reason   */
    uint64_t verify_calls;             /* KREG_MODE_VERIFY kernel checks  */
    uint64_t verify_invalidations;     /* ranges found changed by verify  */
    uint64_t sync_waits;               /* lookups that had to wait        */
    uint64_t dispatch_latency_max_ns;  /* read -> dispatched, per batch   */
    uint64_t dispatch_latency_sum_ns;
    uint64_t dispatch_batches;
} kreg_stats_t;

/* Reference counted. The first call opens the userfaultfd, starts the
 * threads and declares UCM_EVENT_VM_UNMAPPED external. On failure returns an
 * error, logs the reason once, and every kreg_watch() returns 0 (callers then
 * register uncached). Each call must be paired with kreg_stop(), even a
 * failed one. */
KREG_API ucs_status_t kreg_start(void);

/* The last stop closes the descriptor (the kernel drops every watch and
 * wakes any thread blocked in munmap), stops the threads and withdraws the
 * external declaration. */
KREG_API void kreg_stop(void);

/* Watch [addr, addr+len), widened to whole pages. Returns 1 if the range is
 * now watched: its unmap, removal or move will be reported before any lookup
 * that follows the kernel's event can see it. Returns 0 otherwise, with the
 * reason in *reason_p if not NULL; the caller must not cache the range. */
KREG_API int kreg_watch(void *addr, size_t len, kreg_reason_t *reason_p);

/* Drop one watcher of [addr, addr+len). Pages stay watched while another
 * watcher still covers them. Unknown ranges are ignored. */
KREG_API void kreg_unwatch(void *addr, size_t len);

/* Returns once every event the kernel had queued when the call started has
 * been dispatched to UCM. */
KREG_API void kreg_sync(void);

/* Call before an rcache lookup of [addr, addr+len). Waits as the mode says
 * (KREG_MODE_PLAIN: already-read events; SYNC: kreg_sync(); VERIFY: read
 * events and an exact kernel check of the range); if the range is found to
 * be no longer the watched mapping, reports it through ucm_vm_munmap() so the
 * lookup misses. Returns 1 if the range is watched now, 0 if not (the caller
 * registers it anew and watches it then). */
KREG_API int kreg_prepare_lookup(void *addr, size_t len);

KREG_API void kreg_query(kreg_caps_t *caps);
KREG_API void kreg_get_stats(kreg_stats_t *stats);
KREG_API const char *kreg_reason_str(kreg_reason_t reason);
KREG_API const char *kreg_mode_str(kreg_mode_t mode);

#ifdef __cplusplus
}
#endif

#endif
