#include "options.h"

#include <stddef.h>
#include <string.h>
#include <ucs/sys/preprocessor.h>
#include <ucs/sys/compiler_def.h>
#include <ucs/config/parser.h>
#include <ucp/api/ucp_version.h> /* UCS has no version macro of its own */

const char *kreg_backend_choice_names[] = {
    [KREG_BACKEND_CHOICE_AUTO]     = "auto",
    [KREG_BACKEND_CHOICE_NOTIFIER] = "notifier",
    [KREG_BACKEND_CHOICE_UFFD]     = "uffd",
    [KREG_BACKEND_CHOICE_LAST]     = NULL
};

const char *kreg_mode_names[] = {
    [KREG_MODE_VERIFY] = "verify",
    [KREG_MODE_PLAIN]  = "plain",
    [KREG_MODE_LAST]   = NULL
};

const char *kreg_shared_names[] = {
    [KREG_SHARED_UNCACHED] = "uncached",
    [KREG_SHARED_WATCH]    = "watch",
    [KREG_SHARED_LAST]     = NULL
};

const char *kreg_sync_names[] = {
    [KREG_SYNC_AUTO] = "auto",
    [KREG_SYNC_YES]  = "y",
    [KREG_SYNC_NO]   = "n",
    [KREG_SYNC_LAST] = NULL
};

static ucs_config_field_t kreg_options_table[] = {
    {"ENABLE", "y",
     "Watch registered memory through the kernel. With 'n' the source never\n"
     "starts and components register uncached (for testing fallbacks).",
     offsetof(kreg_options_t, enable), UCS_CONFIG_TYPE_BOOL},

    {"BACKEND", "auto",
     "Which kernel mechanism watches registered memory:\n"
     " auto     - the notifier module where /dev/kreg_notifier exists, else\n"
     "            userfaultfd.\n"
     " notifier - the kreg_notifier module only (a hit is one load); without\n"
     "            the module nothing is watched and registrations are uncached.\n"
     " uffd     - userfaultfd only (a hit costs one or two system calls).",
     offsetof(kreg_options_t, backend),
     UCS_CONFIG_TYPE_ENUM(kreg_backend_choice_names)},

    {"MODE", "verify",
     "What a registration cache lookup checks:\n"
     " verify - exact: a lookup never returns the registration of pages that\n"
     "          were replaced before it started.\n"
     " plain  - for measurements only: uffd waits for events already read,\n"
     "          the notifier checks nothing; another thread's remap can slip\n"
     "          through.",
     offsetof(kreg_options_t, mode), UCS_CONFIG_TYPE_ENUM(kreg_mode_names)},

    {"SHARED_MEMORY", "uncached",
     "Page-cache memory (MAP_SHARED, memfd, SysV shm, files) under the\n"
     "userfaultfd backend, whose pages truncate and hole punch replace without\n"
     "any userfaultfd event:\n"
     " uncached - registered without the cache (never stale).\n"
     " watch    - cached like private memory: such changes go unseen.\n"
     "The notifier backend sees these changes and always caches.",
     offsetof(kreg_options_t, shared), UCS_CONFIG_TYPE_ENUM(kreg_shared_names)},

    {"MAX_RANGES", "auto",
     "Disjoint ranges the process may watch at once; past it registrations\n"
     "are uncached, with one warning. Each userfaultfd watch can split two\n"
     "mappings, so 'auto' is vm.max_map_count/8 for userfaultfd (the\n"
     "application keeps three quarters of its mappings) and the module's\n"
     "own limit for the notifier.",
     offsetof(kreg_options_t, max_ranges), UCS_CONFIG_TYPE_ULUNITS},

    {"DEVICE", "y",
     "Open /dev/userfaultfd when the userfaultfd syscall is refused.",
     offsetof(kreg_options_t, device), UCS_CONFIG_TYPE_BOOL},

    {"WP_ASYNC", "y",
     "Use UFFD_FEATURE_WP_ASYNC where the kernel has it (Linux 6.7+), so that\n"
     "file-backed mappings can be watched and the lookup check asks\n"
     "PAGEMAP_SCAN. With 'n', only anonymous, shmem and hugetlbfs memory is\n"
     "watched and the check is UFFDIO_WRITEPROTECT.",
     offsetof(kreg_options_t, wp_async), UCS_CONFIG_TYPE_BOOL},

    {"QUEUE_SIZE", "4096",
     "Events the userfaultfd reader queues for dispatch; past that it merges\n"
     "them into one wider range (never blocking a thread in munmap).",
     offsetof(kreg_options_t, queue_size), UCS_CONFIG_TYPE_UINT},

    {"SYNC", "auto",
     "Synchronous delivery (notifier backend only): every change of pinned\n"
     "memory reaches UCM before the changing thread returns to user space and\n"
     "before any other thread of the process does, so that UCX's own caches\n"
     "(UCP's, the IB md's) are exact on every transport, UCM's hooks off.\n"
     " auto - where the loaded module has it.\n"
     " y    - required: without it the notifier backend does not start.\n"
     " n    - off: only caches that check their watch (ib_regcache) are exact.",
     offsetof(kreg_options_t, sync), UCS_CONFIG_TYPE_ENUM(kreg_sync_names)},

    {"SYNC_SIGNAL", "38",
     "The signal (a number) whose handler reports a change of pinned memory in\n"
     "the thread that made it, before its next instruction. A handler already\n"
     "installed for it is refused (synchronous delivery then stays off, with\n"
     "the reason); a handler replaced later, or the signal blocked, holds the\n"
     "changing thread until the reader reports. 0: no signal, the reader\n"
     "always reports (immune to what the application does with signals, but\n"
     "see the windows in doc/design.md).",
     offsetof(kreg_options_t, sync_signal), UCS_CONFIG_TYPE_INT},

    {"SYNC_TIMEOUT", "1s",
     "The longest a thread is held at its return to user space waiting for a\n"
     "change of pinned memory to be reported, counted from the change's end\n"
     "(1ms..60s). Past it the thread goes on, counted in kreg_get_stats and\n"
     "warned of once.",
     offsetof(kreg_options_t, sync_timeout), UCS_CONFIG_TYPE_TIME},

    {"SYNC_UNPINNED", "n",
     "Synchronous delivery of the process's own unmaps (munmap, mremap,\n"
     "madvise) of memory that is not pinned too, for UCX caches of\n"
     "registrations that pin nothing (xpmem, knem, UCX's test_rcache). Each\n"
     "such unmap of memory with a page present then costs the unmapping\n"
     "thread the signal. With 'n' only pinned memory (every verbs\n"
     "registration) is reported.",
     offsetof(kreg_options_t, sync_unpinned), UCS_CONFIG_TYPE_BOOL},

    {"AUTOSTART", "auto",
     "Start when the library is loaded, so that stock UCX transports need no\n"
     "caller of kreg_start(), where synchronous delivery can run (else nothing\n"
     "starts and UCM's hooks stay on):\n"
     " auto - when the library is preloaded (named in LD_PRELOAD) or loaded as\n"
     "        UCX's plugin (libucs_kreg).\n"
     " y    - whenever it is loaded.\n"
     " n    - never: only kreg_start() starts it.",
     offsetof(kreg_options_t, autostart), UCS_CONFIG_TYPE_ENUM(kreg_sync_names)},

    {NULL}
};

UCS_CONFIG_REGISTER_TABLE(kreg_options_table, "Kernel memory events (ucx-kreg)",
                          "KREG_", kreg_options_t, &ucs_config_global_list)

ucs_status_t kreg_options_read(kreg_options_t *opts)
{
    /* On a bad value UCS logs which variable is wrong. Since UCX 1.15 UCS
     * takes the table's entry (with its "KREG_" prefix) instead of the
     * table and the prefix. */
#if UCP_API_VERSION >= UCP_VERSION(1, 15)
    return ucs_config_parser_fill_opts(opts,
                                       UCS_CONFIG_GET_TABLE(kreg_options_table),
                                       UCS_DEFAULT_ENV_PREFIX, 0);
#else
    return ucs_config_parser_fill_opts(opts, kreg_options_table,
                                       UCS_DEFAULT_ENV_PREFIX, "KREG_", 0);
#endif
}

void kreg_options_release(kreg_options_t *opts)
{
    ucs_config_parser_release_opts(opts, kreg_options_table);
}
