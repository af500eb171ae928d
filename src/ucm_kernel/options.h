/* UCX-style options of libucm_kernel: UCX_KREG_*, parsed by UCS. */
#ifndef UCX_KREG_OPTIONS_H
#define UCX_KREG_OPTIONS_H

#include "ucm_kernel.h"

#ifdef __cplusplus
extern "C" {
#endif

/* UCX_KREG_BACKEND */
typedef enum {
    KREG_BACKEND_CHOICE_AUTO = 0, /* the notifier where its device is, else uffd */
    KREG_BACKEND_CHOICE_NOTIFIER,
    KREG_BACKEND_CHOICE_UFFD,
    KREG_BACKEND_CHOICE_LAST
} kreg_backend_choice_t;

/* UCX_KREG_SYNC and UCX_KREG_AUTOSTART */
typedef enum {
    KREG_SYNC_AUTO = 0, /* with the notifier backend, where the module has it */
    KREG_SYNC_YES,      /* required: the notifier backend does not start without */
    KREG_SYNC_NO,
    KREG_SYNC_LAST
} kreg_sync_choice_t;

/* UCX_KREG_SHARED_MEMORY */
typedef enum {
    KREG_SHARED_UNCACHED = 0, /* uffd: page-cache memory registered uncached */
    KREG_SHARED_WATCH,        /* uffd: watched like any other (truncate and
                                 hole punch go unseen)                      */
    KREG_SHARED_LAST
} kreg_shared_policy_t;

typedef struct {
    int           enable;     /* 0: never start, every registration uncached */
    int           backend;    /* kreg_backend_choice_t */
    int           mode;       /* kreg_mode_t */
    int           device;     /* fall back to /dev/userfaultfd */
    int           wp_async;   /* use UFFD_FEATURE_WP_ASYNC where the kernel has it */
    int           shared;     /* kreg_shared_policy_t */
    unsigned long max_ranges; /* disjoint watched ranges; UCS_ULUNITS_AUTO */
    unsigned      queue_size; /* events the reader queues before it merges them */
    int           sync;       /* kreg_sync_choice_t */
    int           sync_signal; /* the changing thread's signal (synchronous delivery) */
    double        sync_timeout; /* seconds a held thread waits at most */
    int           sync_unpinned; /* also the process's own changes of pages
                                    not pinned (KREG_NF_SYNC_UNPINNED) */
    int           autostart;  /* kreg_sync_choice_t: start at load where
                                 synchronous delivery runs */
} kreg_options_t;

/* The names of the enum values above, as UCX_KREG_* takes and logs them:
 * one table for the parser, the log lines and the tests. */
extern const char *kreg_backend_choice_names[];
extern const char *kreg_mode_names[];
extern const char *kreg_shared_names[];
extern const char *kreg_sync_names[];

/* Fills *opts from the environment. On a bad value UCS logs the error and
 * this returns it. */
ucs_status_t kreg_options_read(kreg_options_t *opts);
void kreg_options_release(kreg_options_t *opts);

#ifdef __cplusplus
}
#endif

#endif
