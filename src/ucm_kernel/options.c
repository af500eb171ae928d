#include "options.h"

#include <stddef.h>
#include <string.h>
#include <ucs/sys/preprocessor.h>
#include <ucs/sys/compiler_def.h>
#include <ucs/config/parser.h>

static const char *kreg_mode_names[] = {
    [KREG_MODE_PLAIN]  = "plain",
    [KREG_MODE_SYNC]   = "sync",
    [KREG_MODE_VERIFY] = "verify",
    NULL
};

static ucs_config_field_t kreg_options_table[] = {
    {"ENABLE", "y",
     "Watch registered memory through the kernel. With 'n' the source never\n"
     "starts and components register uncached (for testing fallbacks).",
     offsetof(kreg_options_t, enable), UCS_CONFIG_TYPE_BOOL},

    {"MODE", "verify",
     "How a registration cache lookup makes sure the cached registration is\n"
     "still the memory mapped at that address:\n"
     " plain  - wait for events the monitor has already read (no syscall);\n"
     "          another thread's remap can slip through before the kernel\n"
     "          queues its event: for measurements only.\n"
     " sync   - also poll the descriptor for queued events (one syscall).\n"
     " verify - wait for events read, and ask the kernel whether the range is\n"
     "          still the watched mapping (one syscall); loses no data.",
     offsetof(kreg_options_t, mode), UCS_CONFIG_TYPE_ENUM(kreg_mode_names)},

    {"DEVICE", "y",
     "Open /dev/userfaultfd when the userfaultfd syscall is refused.",
     offsetof(kreg_options_t, device), UCS_CONFIG_TYPE_BOOL},

    {"WP_ASYNC", "y",
     "Use UFFD_FEATURE_WP_ASYNC where the kernel has it (Linux 6.7+), so that\n"
     "file-backed mappings can be watched too. With 'n', only anonymous,\n"
     "shmem and hugetlbfs memory is watched; other memory is registered\n"
     "uncached.",
     offsetof(kreg_options_t, wp_async), UCS_CONFIG_TYPE_BOOL},

    {"QUEUE_SIZE", "4096",
     "Events the reader thread queues for dispatch; past that it merges them\n"
     "into one wider range (never blocking a thread in munmap).",
     offsetof(kreg_options_t, queue_size), UCS_CONFIG_TYPE_UINT},

    {NULL}
};

UCS_CONFIG_REGISTER_TABLE(kreg_options_table, "Kernel memory events (ucx-kreg)",
                          "KREG_", kreg_options_t, &ucs_config_global_list)

ucs_status_t kreg_options_read(kreg_options_t *opts)
{
    /* On a bad value UCS logs which variable is wrong */
    return ucs_config_parser_fill_opts(opts, kreg_options_table,
                                       UCS_DEFAULT_ENV_PREFIX, "KREG_", 0);
}

void kreg_options_release(kreg_options_t *opts)
{
    ucs_config_parser_release_opts(opts, kreg_options_table);
}
