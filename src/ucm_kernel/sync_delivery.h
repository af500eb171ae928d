/* Synchronous delivery through the kreg_notifier module (its uapi header,
 * KREG_NF_IOC_SYNC_*): every change of pinned memory reaches UCM before the
 * changing thread returns to user space, and before any other thread of the
 * process does, so that UCX's own caches (UCP's, the IB md's) are exact on
 * every transport without a per-hit check.
 *
 * The changing thread runs our signal handler, which drains the module's
 * queue into ucm_vm_munmap() and acknowledges it; the module holds every
 * other thread at its next return to user space until then. The notifier
 * backend's reader drains what no handler carries (a thread that blocks the
 * signal, io_uring workers, other processes). */
#ifndef UCX_KREG_SYNC_DELIVERY_H
#define UCX_KREG_SYNC_DELIVERY_H

#include "options.h"

#include <string>

namespace kreg {

/* Arms synchronous delivery on the module's descriptor fd: installs the
 * handler of opts.sync_signal (refused if another handler is installed)
 * and starts the module's side, which holds the signal until sync_stop()
 * (sigaction() on it fails meanwhile). *signo is the signal in use: 0 if
 * the kernel could not use it (the reader reports then). false with the
 * reason in *why. */
bool sync_start(int fd, const kreg_options_t &opts, int *signo, std::string *why);
/* Stops the module's side and waits for handlers under way; the handler
 * stays installed and does nothing. Before fd is closed. */
void sync_stop();
/* The reader thread: never held by the module (call once, in it). */
void sync_attach_dispatcher();
/* Drains the queue into UCM (the reader, when the device polls ready). */
void sync_drain();
/* In a forked child: the parent's descriptor is not ours. */
void sync_forget_after_fork();
bool sync_active();
void sync_add_stats(kreg_stats_t *stats);

} // namespace kreg

#endif
