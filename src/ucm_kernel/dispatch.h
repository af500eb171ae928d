/* Reporting invalidated ranges to UCM, and holding that off while the
 * process forks or exits.
 *
 * ucm_vm_munmap() takes UCM's event lock and every rcache's locks. A child
 * forked while another thread is inside it inherits those locks taken and
 * hangs on its first registration; a process exiting while the dispatcher
 * is inside it runs UCX's destructors under its feet. fork (atfork) and our
 * library destructor therefore hold dispatch: they wait until no thread is
 * inside and keep new ones out. */
#ifndef UCX_KREG_DISPATCH_H
#define UCX_KREG_DISPATCH_H

#include <cstdint>

namespace kreg {

void dispatch(uintptr_t start, uintptr_t end);
/* Waits for dispatches under way (but the caller's own) to return, and
 * makes new ones wait until dispatch_release(). */
void dispatch_hold();
void dispatch_release();
/* In a forked child: the holder was the parent's thread. */
void dispatch_reset_after_fork();

} // namespace kreg

#endif
