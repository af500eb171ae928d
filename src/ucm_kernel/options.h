/* UCX-style options of libucm_kernel: UCX_KREG_*, parsed by UCS. */
#ifndef UCX_KREG_OPTIONS_H
#define UCX_KREG_OPTIONS_H

#include "ucm_kernel.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    int      enable;     /* 0: never start, every registration uncached */
    int      mode;       /* kreg_mode_t */
    int      device;     /* fall back to /dev/userfaultfd */
    int      wp_async;   /* use UFFD_FEATURE_WP_ASYNC where the kernel has it */
    unsigned queue_size; /* events the reader queues before it merges them */
} kreg_options_t;

/* Fills *opts from the environment. On a bad value UCS logs the error and
 * this returns it. */
ucs_status_t kreg_options_read(kreg_options_t *opts);
void kreg_options_release(kreg_options_t *opts);

#ifdef __cplusplus
}
#endif

#endif
