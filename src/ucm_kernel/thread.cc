#include "thread.h"

#include <atomic>
#include <csignal>
#include <cstdint>

namespace kreg {
namespace {

struct thread_start {
    void *(*fn)(void *);
    void *arg;
    std::atomic<uint32_t> up{0};
};

void *trampoline(void *p)
{
    auto *s        = static_cast<thread_start *>(p);
    void *(*fn)(void *) = s->fn;
    void *arg      = s->arg;
    s->up.store(1);
    s->up.notify_all(); /* s is the starter's: not touched after this */
    return fn(arg);
}

} // namespace

int start_thread(pthread_t *thread, void *(*fn)(void *), void *arg,
                 const char *name)
{
    thread_start s;
    s.fn  = fn;
    s.arg = arg;
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    const int rc = pthread_create(thread, nullptr, trampoline, &s);
    pthread_sigmask(SIG_SETMASK, &old, nullptr);
    if (rc != 0) {
        return rc;
    }
    pthread_setname_np(*thread, name);
    /* Fork during thread start: return only once the thread runs its own
     * code, so that a fork right after kreg_start() copies no thread still
     * inside its runtime's setup (GCC 12's ASan allocates there and does
     * not lock its allocator across fork(); see tools/child_process.cc). */
    while (s.up.load() == 0) {
        s.up.wait(0);
    }
    return 0;
}

} // namespace kreg
