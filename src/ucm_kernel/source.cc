/* The process's event source: reference count, backend choice, external
 * declaration, fork and exit.
 *
 * Its state is allocated once and never freed: a program may exit while
 * other threads are inside kreg_watch() or the dispatcher is running, and
 * the order of static destructors must not matter (exit with live
 * threads). */
#include "source.h"

#include "dispatch.h"
#include "kreg_config.h"
#include "ucx_version.h"

#include <atomic>
#include <cstring>
#include <mutex>
#include <pthread.h>
#include <string>
#include <unistd.h>

#include <ucm/api/ucm.h>
#include <ucs/debug/log_def.h>

#include "kmod/uapi/kreg_notifier.h"

#ifdef HAVE_VALGRIND_VALGRIND_H
#include <valgrind/valgrind.h>
#endif

namespace kreg {
namespace {

struct source_state {
    std::mutex               life_lock; /* start, stop, fork, restart */
    unsigned                 refs = 0;
    kreg_options_t           opts{};
    bool                     opts_valid = false;
    bool                     external   = false;
    bool                     atfork_installed = false;
    const char               *why_backend = "";
    /* read by lookups without the lock */
    std::atomic<backend *>   running{nullptr};
    std::atomic<int>         mode{KREG_MODE_VERIFY};
    std::atomic<int>         reason{KREG_REASON_NOT_STARTED};
    std::atomic<bool>        forked_child{false};
    bool                     autostarted = false; /* holds one reference */
    std::atomic<bool>        exiting{false};
};

/* Made when the library loads (before anything can call in: libraries that
 * use us are initialised after us) and never destroyed, see above. Not a
 * function-local static: a hit must not pay for its guard. */
source_state *const g_state = new source_state;

inline source_state &state()
{
    return *g_state;
}

} // namespace
} // namespace kreg

/* Written only with life_lock held, read by every lookup (ucm_kernel.h).
 * After a fork the child keeps the parent's value: with uffd its first
 * lookup takes the path that restarts the source; with the notifier the
 * inherited counters read 0, so its first hit does. */
extern "C" {
int kreg_lookup_asks_kernel = 0;
}

namespace kreg {
namespace {

/* 1 until the first stop or fork; watches without a counter of their own
 * compare with it */
std::atomic<uint64_t> g_generation{1};

void bump_generation()
{
    g_generation.fetch_add(1);
}

/* Starts the backend the options ask for (auto: the notifier where its
 * device is, else userfaultfd); life_lock held. */
bool open_backend(source_state &s, start_error *err)
{
    struct candidate {
        backend    *instance;
        const char *why;
    } tries[2];
    int n = 0;

    switch (s.opts.backend) {
    case KREG_BACKEND_CHOICE_UFFD:
        tries[n++] = {&uffd_backend_instance(), "UCX_KREG_BACKEND=uffd"};
        break;
    case KREG_BACKEND_CHOICE_NOTIFIER:
        tries[n++] = {&notifier_backend_instance(), "UCX_KREG_BACKEND=notifier"};
        break;
    default:
        if (access(KREG_NF_DEVICE, F_OK) == 0) {
            tries[n++] = {&notifier_backend_instance(), KREG_NF_DEVICE " is present"};
            tries[n++] = {&uffd_backend_instance(), "the notifier device failed to start"};
        } else {
            tries[n++] = {&uffd_backend_instance(),
                          "no " KREG_NF_DEVICE ": the kreg_notifier module is "
                          "not loaded"};
        }
        break;
    }

    for (int i = 0; i < n; ++i) {
        backend *b = tries[i].instance;
        if (!b->start(s.opts, err)) {
            if (i + 1 < n) {
                ucs_diag("kreg: the %s backend cannot start: %s",
                         kreg_backend_str(b->kind()), err->text.c_str());
            }
            continue;
        }
        s.why_backend = tries[i].why;
        s.mode        = s.opts.mode;
        s.reason      = KREG_REASON_NONE;
        /* before the backend is published: a lookup that sees it must
         * already take the path that asks the kernel, where it needs to */
        __atomic_store_n(&kreg_lookup_asks_kernel, b->checks_at_lookup() ? 1 : 0,
                         __ATOMIC_RELEASE);
        s.running.store(b, std::memory_order_release);
        ucs_info("kreg: watching registered memory through the %s backend "
                 "(%s), mode %s", kreg_backend_str(b->kind()), tries[i].why,
                 kreg_mode_names[s.opts.mode]);
        return true;
    }
    return false;
}

/* "UCX_KREG_A=x UCX_KREG_B=y": what the user set, for the error line */
std::string kreg_env_settings()
{
    std::string out;
    for (char **e = environ; *e != nullptr; ++e) {
        if (strncmp(*e, "UCX_KREG_", 9) == 0) {
            out += (out.empty() ? "" : " ") + std::string(*e);
        }
    }
    return out.empty() ? std::string("UCX_KREG_*") : out;
}

/* Stops the running backend; life_lock held. */
void close_backend(source_state &s)
{
    backend *b = s.running.exchange(nullptr);
    __atomic_store_n(&kreg_lookup_asks_kernel, 0, __ATOMIC_RELEASE);
    if (b != nullptr) {
        b->stop();
        bump_generation();
    }
}

void restart_in_child();

void atfork_prepare()
{
    source_state &s = state();
    s.life_lock.lock();
    if (backend *b = s.running.load()) {
        b->lock_for_fork();
    }
    dispatch_hold();
}

void atfork_parent()
{
    source_state &s = state();
    dispatch_release();
    if (backend *b = s.running.load()) {
        b->unlock_after_fork();
    }
    s.life_lock.unlock();
}

void atfork_child()
{
    source_state &s = state();
    dispatch_reset_after_fork();
    if (backend *b = s.running.exchange(nullptr)) {
        /* The child has no monitor threads, and its descriptor speaks for
         * the parent's memory: forget both; the first call restarts. */
        b->unlock_after_fork();
        b->forget_after_fork();
        s.reason       = KREG_REASON_FORKED;
        s.forked_child = true;
    }
    bump_generation(); /* every watch inherited from the parent is stale */
    s.life_lock.unlock();
    /* Stock transports' caches have no caller of ours whose first call
     * would restart the source, and UCM_EVENT_VM_UNMAPPED stays external:
     * restart at once. glibc has reset its locks before child handlers. */
    if (s.autostarted && s.forked_child.load()) {
        restart_in_child();
    }
}

/* In a forked child, the first call of any kind: the child's own source,
 * if the parent's was running. */
void restart_in_child()
{
    source_state &s = state();
    std::lock_guard<std::mutex> guard(s.life_lock);
    if (!s.forked_child.load()) {
        return; /* another thread restarted it meanwhile */
    }
    start_error err;
    if ((s.refs > 0) && !open_backend(s, &err)) {
        s.reason = KREG_REASON_FORKED;
        ucs_warn("kreg: cannot restart in the forked child: %s; every "
                 "registration is uncached", err.text.c_str());
    }
    /* only now: a thread that finds the flag down finds the backend up */
    s.forked_child.store(false);
}

inline void check_fork()
{
    if (__builtin_expect(state().forked_child.load(std::memory_order_relaxed), 0)) {
        restart_in_child();
    }
}

/* Exit: nothing may dispatch into UCX while its destructors run, and no
 * lookup may wait for a dispatcher that is held. Runs before libucm's and
 * libucs's destructors (they are our dependencies). */
__attribute__((destructor)) void source_at_exit()
{
    state().exiting = true;
    dispatch_hold();
}

/* libucm_kernel named in LD_PRELOAD, or the component that needs it (UCX
 * 1.13-1.21 load it so: kreg-run) */
bool preloaded()
{
    const char *p = getenv("LD_PRELOAD");
    return (p != nullptr) && ((strstr(p, "libucm_kernel") != nullptr) ||
                              (strstr(p, "libuct_ib_regcache") != nullptr));
}

} // namespace

/* Where synchronous delivery can run (the module's device is there), start
 * without a caller of kreg_start: UCX's own caches of stock transports are
 * then exact. Where it cannot, nothing starts and UCM's hooks stay on: an
 * asynchronous source would leave those caches without any timely event.
 * One reference, held until exit. */
bool source_autostart(bool by_plugin)
{
    kreg_options_t opts{};
    if (kreg_options_read(&opts) != UCS_OK) {
        return false; /* UCS said which variable; kreg_start says it again */
    }
    const bool asked = (opts.autostart == KREG_SYNC_YES) ||
                       ((opts.autostart == KREG_SYNC_AUTO) && (by_plugin || preloaded()));
    const bool want  = asked && opts.enable && (opts.sync != KREG_SYNC_NO) &&
                       (opts.backend != KREG_BACKEND_CHOICE_UFFD) &&
                       (access(KREG_NF_DEVICE, F_OK) == 0);
    kreg_options_release(&opts);
#ifdef HAVE_VALGRIND_VALGRIND_H
    if (RUNNING_ON_VALGRIND) {
        return false;
    }
#endif
    source_state &s = state();
    {
        std::lock_guard<std::mutex> guard(s.life_lock);
        if (s.autostarted) {
            return true;
        }
    }
    if (!want) {
        return false;
    }
    if (source_start() == UCS_OK) {
        kreg_caps_t caps;
        source_query(&caps);
        if (caps.sync_delivery) {
            std::lock_guard<std::mutex> guard(s.life_lock);
            s.autostarted = true;
            return true;
        }
    }
    source_stop();
    return false;
}

namespace {

/* At load, after g_state (a C++ object of this file, initialised in order;
 * a constructor function could run before it). */
struct autostart_at_load {
    autostart_at_load() { source_autostart(false); }
} g_autostart_at_load;

} // namespace

const volatile uint64_t *generation_word()
{
    return reinterpret_cast<const volatile uint64_t *>(&g_generation);
}

uint32_t generation()
{
    return static_cast<uint32_t>(g_generation.load(std::memory_order_acquire));
}

ucs_status_t source_start()
{
    check_fork();
    source_state &s = state();
    std::lock_guard<std::mutex> guard(s.life_lock);
    if (s.refs++ > 0) {
        return s.running.load() ? UCS_OK : UCS_ERR_UNSUPPORTED;
    }

    start_error err;
    ucs_status_t status = UCS_ERR_UNSUPPORTED;
    if (kreg_options_read(&s.opts) != UCS_OK) {
        err.reason = KREG_REASON_BAD_CONFIG;
        err.text   = "a bad value among " + kreg_env_settings() +
                     " (see the error above)";
        status     = UCS_ERR_INVALID_PARAM;
    } else if (s.opts_valid = true, !s.opts.enable) {
        err.reason = KREG_REASON_DISABLED;
        err.text   = "UCX_KREG_ENABLE=n";
    } else if (!ucx_version_matches(&err.text)) {
        err.reason = KREG_REASON_OTHER;
#ifdef HAVE_VALGRIND_VALGRIND_H
    } else if (RUNNING_ON_VALGRIND) {
        /* Valgrind runs one thread at a time and doesn't treat munmap as
         * blocking: a munmap waiting for the uffd reader would wait
         * forever. */
        err.reason = KREG_REASON_VALGRIND;
        err.text   = "running under valgrind";
#endif
    } else {
        if (!s.atfork_installed) {
            pthread_atfork(atfork_prepare, atfork_parent, atfork_child);
            s.atfork_installed = true;
        }
        if (open_backend(s, &err)) {
            ucm_set_external_event(UCM_EVENT_VM_UNMAPPED);
            s.external = true;
            return UCS_OK;
        }
    }

    s.reason = err.reason;
    ucs_warn("kreg: kernel memory events unavailable: %s (%s); registrations "
             "are not watched by the kernel", err.text.c_str(),
             kreg_reason_str(err.reason));
    return status;
}

void source_stop()
{
    check_fork();
    source_state &s = state();
    std::lock_guard<std::mutex> guard(s.life_lock);
    if (s.refs == 0) {
        ucs_warn("kreg: kreg_stop() without kreg_start()");
        return;
    }
    if (--s.refs > 0) {
        return;
    }
    close_backend(s);
    if (s.external) {
        ucm_unset_external_event(UCM_EVENT_VM_UNMAPPED);
        s.external = false;
    }
    if (s.opts_valid) {
        kreg_options_release(&s.opts);
        s.opts_valid = false;
    }
    s.reason = KREG_REASON_NOT_STARTED;
}

backend *source_backend()
{
    check_fork();
    source_state &s = state();
    if (__builtin_expect(s.exiting.load(std::memory_order_relaxed), 0)) {
        return nullptr;
    }
    return s.running.load(std::memory_order_acquire);
}

bool source_exiting()
{
    return state().exiting.load(std::memory_order_relaxed);
}

kreg_mode_t source_mode()
{
    return static_cast<kreg_mode_t>(state().mode.load(std::memory_order_relaxed));
}

kreg_reason_t source_reason()
{
    const auto r = static_cast<kreg_reason_t>(state().reason.load());
    return (r == KREG_REASON_NONE) ? KREG_REASON_NOT_STARTED : r;
}

void source_query(kreg_caps_t *caps)
{
    check_fork();
    source_state &s = state();
    std::lock_guard<std::mutex> guard(s.life_lock);
    *caps                = kreg_caps_t{};
    backend *b           = s.running.load();
    caps->running        = b != nullptr;
    caps->backend        = b ? b->kind() : KREG_BACKEND_NONE;
    caps->mode           = static_cast<kreg_mode_t>(s.mode.load());
    caps->reason         = b ? KREG_REASON_NONE : source_reason();
    caps->why_backend    = b ? s.why_backend : "";
    caps->external_event = s.external;
    caps->version        = PACKAGE_VERSION;
    caps->why_no_sync    = b ? "the userfaultfd backend: it needs the kreg_notifier module"
                             : "no backend runs";
    if (b != nullptr) {
        b->query(caps);
    }
}

void source_add_stats(kreg_stats_t *stats)
{
    source_state &s = state();
    std::lock_guard<std::mutex> guard(s.life_lock);
    for (backend *b : {&uffd_backend_instance(), &notifier_backend_instance()}) {
        b->add_stats(stats);
    }
}

} // namespace kreg
