/* The process's event source: which backend runs, its reference count, the
 * external declaration, and what fork and exit do to them. */
#ifndef UCX_KREG_SOURCE_H
#define UCX_KREG_SOURCE_H

#include "backend.h"

namespace kreg {

ucs_status_t source_start();
/* Starts without a caller where synchronous delivery runs and the options
 * ask for it (UCX_KREG_AUTOSTART); true if it runs so. */
bool source_autostart(bool by_plugin);
void source_stop();

/* The running backend, or nullptr. In a forked child the first call
 * restarts the source (the child's own descriptor and threads). */
backend *source_backend();
kreg_mode_t source_mode();
/* The process is exiting: our destructor ran, UCX's run next. Nothing
 * may log or dispatch any more. */
bool source_exiting();
/* Why nothing runs, when source_backend() is nullptr. */
kreg_reason_t source_reason();

void source_query(kreg_caps_t *caps);
void source_add_stats(kreg_stats_t *stats);

} // namespace kreg

#endif
