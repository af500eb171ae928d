#include "dispatch.h"

#include <atomic>

#include <ucm/api/ucm.h>
#include <ucs/debug/log_def.h>

namespace kreg {
namespace {

/* g_hold and g_inside are a Dekker pair: a dispatcher raises g_inside then
 * reads g_hold, a holder raises g_hold then reads g_inside (seq_cst), so
 * one of the two sees the other. 32-bit so that wait() is a plain futex. */
std::atomic<uint32_t> g_hold{0};
std::atomic<uint32_t> g_inside{0};
/* dispatches this thread is inside. initial-exec: no __tls_get_addr call
 * per dispatch (GCC 12's ASan crashes in its interceptor of it,
 * DTLS_on_tls_get_addr, while other threads come and go); 4 bytes fit the
 * static TLS glibc keeps for libraries loaded later with dlopen. */
__attribute__((tls_model("initial-exec"))) thread_local unsigned t_depth;

void enter()
{
    for (;;) {
        g_inside.fetch_add(1);
        if (!g_hold.load()) {
            return;
        }
        if (g_inside.fetch_sub(1) == 1) {
            g_inside.notify_all();
        }
        g_hold.wait(1);
    }
}

void leave()
{
    if (g_inside.fetch_sub(1) == 1) {
        g_inside.notify_all();
    }
}

} // namespace

void dispatch(uintptr_t start, uintptr_t end)
{
    /* A handler that unmaps watched memory may dispatch again from inside
     * (the uffd check in its lookup): it is already counted. */
    if (t_depth++ == 0) {
        enter();
    }
    ucs_trace("kreg: dispatch 0x%lx..0x%lx", start, end);
    ucm_vm_munmap(reinterpret_cast<void *>(start), end - start);
    if (--t_depth == 0) {
        leave();
    }
}

void dispatch_hold()
{
    g_hold.store(1);
    /* fork from inside a handler: do not wait for ourselves */
    const uint32_t own = (t_depth > 0) ? 1 : 0;
    uint32_t inside;
    while ((inside = g_inside.load()) > own) {
        g_inside.wait(inside);
    }
}

void dispatch_release()
{
    g_hold.store(0);
    g_hold.notify_all();
}

void dispatch_reset_after_fork()
{
    g_inside.store(t_depth > 0 ? 1 : 0);
    g_hold.store(0);
}

} // namespace kreg
