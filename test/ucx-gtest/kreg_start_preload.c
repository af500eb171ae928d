/* The control of test/ucx-gtest/run-rcache: preloaded with UCX_KREG_SYNC=n,
 * it starts libucm_kernel's event source at load (kreg_start(), which the
 * library's own autostart never does without synchronous delivery). The
 * notifier backend then runs without delivery and UCM_EVENT_VM_UNMAPPED is
 * declared external, so UCM installs no unmap hooks for UCX's caches, and
 * nothing tells them of an unmap of their memory: the tests of those caches
 * must fail there (with UCX_MEM_MMAP_HOOK_MODE=none UCX_MEM_MALLOC_HOOKS=n,
 * as in the run with synchronous delivery). Linked with libucm_kernel, so
 * that its constructors run first. Never reference held: the source runs
 * until exit. */
#include <stdio.h>

/* src/ucm_kernel/ucm_kernel.h: ucs_status_t kreg_start(void) */
extern int kreg_start(void);

__attribute__((constructor)) static void kreg_start_preload(void)
{
    int status = kreg_start();

    fprintf(stderr, "kreg_start_preload: kreg_start() = %d\n", status);
}
