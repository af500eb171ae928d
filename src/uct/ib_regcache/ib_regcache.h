/*
 * ib_regcache: UCX's own IB memory domain and verbs transports, re-exported
 * under a component of their own, with every cached registration watched by
 * libucm_kernel. Shared between the C part (component and transport
 * definitions) and the C++ part (memory domain decoration).
 *
 * Nothing here is visible outside the library: the only exported symbols
 * are the constructor and destructor that register the component.
 */
#ifndef UCX_KREG_IB_REGCACHE_H
#define UCX_KREG_IB_REGCACHE_H

#include <uct/ib/base/ib_md.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Names under which the component and its transports are listed. The wire
 * address carries a checksum of the transport name, so both peers need this
 * component to talk over them. */
#define KREG_COMPONENT_NAME     "ib_regcache"
#define KREG_MD_CONFIG_PREFIX   "IB_REGCACHE_"
#define KREG_RC_TL_NAME         "rc_kreg"
#define KREG_RC_CONFIG_PREFIX   "RC_KREG_"
#define KREG_UD_TL_NAME         "ud_kreg"
#define KREG_UD_CONFIG_PREFIX   "UD_KREG_"
/* UCX's mlx5 transports (rc_mlx5, dc_mlx5, ud_mlx5; "_x" as in UCX's
 * aliases rc_x, dc_x, ud_x: a name has at most UCT_TL_NAME_MAX - 1 = 9
 * characters). They list devices only on an mlx5 device (UCX's own query
 * filters by device flags), never on rxe. */
#define KREG_RC_MLX5_TL_NAME    "rc_kreg_x"
#define KREG_DC_MLX5_TL_NAME    "dc_kreg_x"
#define KREG_UD_MLX5_TL_NAME    "ud_kreg_x"

/* Memory domain configuration: UCX's IB md options, then our own. */
typedef struct kreg_md_config {
    uct_ib_md_config_t ib;
    /* Refuse to open the md when libucm_kernel cannot start (instead of
     * running UCX's md undecorated, with UCM's hooks or no cache). */
    int                require_kernel;
} kreg_md_config_t;

extern uct_component_t kreg_component;

/* The component's md_open (md.cc). */
ucs_status_t kreg_md_open(uct_component_t *component, const char *md_name,
                          const uct_md_config_t *md_config, uct_md_h *md_p);

/* ib_shims.c: UCX's IB functions whose headers give them no C linkage. */
const char *kreg_md_dev_name(uct_ib_md_t *md);
ucs_status_t kreg_ib_md_open(const char *md_name, const uct_md_config_t *config,
                             uct_md_h *md_p);
void kreg_invoke_completion(uct_completion_t *comp, ucs_status_t status);
/* Whether a component of that name is registered in this process. */
int kreg_component_loaded(const char *name);

/* Takes over uct_ib_component.md_open so that stock IB mds take the kernel
 * event source and get watched too (hazard 3); and gives it back. */
void kreg_stock_ib_hook_install(void);
void kreg_stock_ib_hook_remove(void);

/* UCP's own registration cache (UCX_RCACHE_ENABLE) caches memory handles
 * above the md: its hits never reach kreg_prepare_lookup(), and it would
 * keep a handle that this md registered uncached. The constructor disables
 * it by default; this records what it found. */
typedef enum {
    KREG_UCP_RCACHE_DISABLED_BY_US = 0,
    KREG_UCP_RCACHE_DISABLED_BY_USER,
    KREG_UCP_RCACHE_ENABLED_BY_USER
} kreg_ucp_rcache_state_t;

extern kreg_ucp_rcache_state_t kreg_ucp_rcache_state;
extern char kreg_ucp_rcache_value[32];

#ifdef __cplusplus
}
#endif

#endif
