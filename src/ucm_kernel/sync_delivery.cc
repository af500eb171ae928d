#include "sync_delivery.h"

#include "dispatch.h"
#include "source.h"

#include "kmod/uapi/kreg_notifier.h"

#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstring>
#include <sys/ioctl.h>

#include <ucs/debug/log_def.h>

namespace kreg {
namespace {

/* Read by the handler: -1 while nothing is armed. */
std::atomic<int> g_fd{-1};
/* Handlers between their load of g_fd and their last ioctl: sync_stop()
 * waits for them before the descriptor may be closed (and its number
 * reused). seq_cst with g_fd, a Dekker pair like dispatch.cc's. */
std::atomic<uint32_t> g_in_handler{0};
std::atomic<uint64_t> g_drained{0};
/* what the module counted at the last stop (its counts restart at start) */
kreg_nf_sync_stats g_totals{};
std::atomic<unsigned> g_warned{0};
/* the signal synchronous delivery was started with, 0 for none */
int g_signo = 0;

/* Drains every queued range into UCM, acknowledging each batch once it is
 * reported; returns the ranges dispatched. Async-signal-safe but for
 * UCM's own locks, which UCM's hooks take at the same places. */
uint64_t drain_all(int fd)
{
    struct kreg_nf_range r[32];
    uint64_t ack = 0, n = 0;
    for (;;) {
        struct kreg_nf_sync_drain d = {};
        d.ack = ack;
        d.buf = reinterpret_cast<uintptr_t>(r);
        d.max = sizeof(r) / sizeof(r[0]);
        if (ioctl(fd, KREG_NF_IOC_SYNC_DRAIN, &d) != 0) {
            if (errno == EINTR) {
                continue;
            }
            break; /* ENOENT: stopped meanwhile */
        }
        if (d.count == 0) {
            break;
        }
        /* exit: UCX's destructors run; dispatch is held for good */
        if (!source_exiting()) {
            for (uint32_t i = 0; i < d.count; ++i) {
                dispatch(r[i].start, r[i].end);
            }
        }
        n  += d.count;
        ack = d.seq;
    }
    return n;
}

void handler(int, siginfo_t *, void *)
{
    const int saved = errno;
    g_in_handler.fetch_add(1);
    const int fd = g_fd.load();
    if (fd >= 0) {
        g_drained.fetch_add(drain_all(fd), std::memory_order_relaxed);
    }
    g_in_handler.fetch_sub(1);
    errno = saved;
}

bool is_ours(const struct sigaction &sa)
{
    return (sa.sa_flags & SA_SIGINFO) && (sa.sa_sigaction == handler);
}

/* What the module counted since its start, plus earlier runs. */
kreg_nf_sync_stats module_stats(int fd)
{
    kreg_nf_sync_stats st = {};
    if ((fd < 0) || (ioctl(fd, KREG_NF_IOC_SYNC_STATS, &st) != 0)) {
        st = {};
    }
    const uint64_t *t = reinterpret_cast<const uint64_t *>(&g_totals);
    uint64_t *s = reinterpret_cast<uint64_t *>(&st);
    for (size_t i = 0; i < sizeof(st) / sizeof(uint64_t); ++i) {
        s[i] += t[i];
    }
    return st;
}

} // namespace

namespace {

/* SYNC_START: 0 or errno */
int start_ioctl(int fd, int signo, uint32_t ms, uint32_t flags)
{
    struct kreg_nf_sync_start st = {};
    st.signo           = static_cast<uint32_t>(signo);
    st.gate_timeout_ms = ms;
    st.flags           = flags;
    /* the module holds signo (sigaction() on it fails) until SYNC_STOP */
    st.handler         = (signo != 0) ? reinterpret_cast<uintptr_t>(handler) : 0;
    return (ioctl(fd, KREG_NF_IOC_SYNC_START, &st) == 0) ? 0 : errno;
}

} // namespace

bool sync_start(int fd, const kreg_options_t &opts, int *signo_out, std::string *why)
{
    int signo = opts.sync_signal;
    struct sigaction old = {};
    if ((signo < 0) || (signo >= NSIG) || (signo == SIGKILL) || (signo == SIGSTOP)) {
        *why = "UCX_KREG_SYNC_SIGNAL=" + std::to_string(signo) + " is not a signal";
        return false;
    }
    /* EINVAL for a valid number: held by the module already (a fork child
     * inherits the hold with our handler), or reserved by the C library */
    const bool held = (signo != 0) && (sigaction(signo, nullptr, &old) != 0);
    /* checked before anything is installed: a bad value changes nothing */
    const double ms = opts.sync_timeout * 1e3;
    if (!(ms >= 1) || (ms > 60000)) {
        *why = "UCX_KREG_SYNC_TIMEOUT=" + std::to_string(opts.sync_timeout) +
               "s is not within 1ms..60s";
        return false;
    }
    if ((signo != 0) && !held && !is_ours(old)) {
        if ((old.sa_handler != SIG_DFL) || (old.sa_flags & SA_SIGINFO)) {
            char text[160];
            snprintf(text, sizeof(text), "signal %d (UCX_KREG_SYNC_SIGNAL) already "
                     "has a handler (%p): choose a free signal", signo,
                     (old.sa_flags & SA_SIGINFO) ? (void *)old.sa_sigaction :
                                                   (void *)old.sa_handler);
            *why = text;
            return false;
        }
        struct sigaction sa = {};
        sa.sa_sigaction = handler;
        sa.sa_flags     = SA_SIGINFO | SA_RESTART;
        sigemptyset(&sa.sa_mask);
        if (sigaction(signo, &sa, nullptr) != 0) {
            *why = std::string("sigaction: ") + strerror(errno);
            return false;
        }
    }
    const uint32_t flags = opts.sync_unpinned ? KREG_NF_SYNC_UNPINNED : 0;
    int err = start_ioctl(fd, signo, static_cast<uint32_t>(ms), flags);
    if ((signo != 0) && held && (err == EINVAL)) {
        *why = "signal " + std::to_string(signo) + " (UCX_KREG_SYNC_SIGNAL) "
               "is refused by sigaction(): reserved by the C library, or "
               "held by another synchronous delivery in this process";
        return false;
    }
    if ((signo != 0) && ((err == EINVAL) || (err == EOPNOTSUPP))) {
        /* the kernel's handler is not ours (a tool that emulates signals,
         * such as valgrind), or a kernel before 5.16 cannot hold it: the
         * reader reports every change instead, still before any thread
         * goes on */
        ucs_diag("kreg: synchronous delivery without a signal: %s",
                 (err == EINVAL) ?
                 "the kernel's handler of UCX_KREG_SYNC_SIGNAL is not "
                 "libucm_kernel's (signals emulated, as under valgrind?)" :
                 "this kernel cannot hold UCX_KREG_SYNC_SIGNAL (before 5.16)");
        signo = 0;
        err   = start_ioctl(fd, 0, static_cast<uint32_t>(ms), flags);
    }
    if (err != 0) {
        *why = (err == ENOTTY) ?
               std::string("the loaded kreg_notifier module has no synchronous "
                           "delivery (an older build: load this one's)") :
               std::string("KREG_NF_IOC_SYNC_START: ") + strerror(err);
        return false;
    }
    g_signo    = signo;
    *signo_out = signo;
    g_fd.store(fd);
    return true;
}

void sync_stop()
{
    const int fd = g_fd.exchange(-1);
    if (fd < 0) {
        return;
    }
    /* no handler may use fd once we return: it is closed next */
    while (g_in_handler.load() != 0) {
        sched_yield();
    }
    g_totals = module_stats(fd);
    (void)ioctl(fd, KREG_NF_IOC_SYNC_STOP);
}

void sync_attach_dispatcher()
{
    const int fd = g_fd.load();
    /* ENOENT: sync_stop() ran before this thread got here (a stop right
     * after the start); the descriptor stays open until it is joined */
    if ((fd >= 0) && (ioctl(fd, KREG_NF_IOC_SYNC_DISPATCHER) != 0) &&
        (errno != ENOENT)) {
        ucs_warn("kreg: KREG_NF_IOC_SYNC_DISPATCHER failed: %m");
    }
}

void sync_drain()
{
    const int fd = g_fd.load();
    if (fd < 0) {
        return;
    }
    g_drained.fetch_add(drain_all(fd), std::memory_order_relaxed);
    /* What no handler carried: said once, counted in kreg_get_stats. Once
     * all seven are said, the reader asks the module for no counts. */
    if (g_warned.load(std::memory_order_relaxed) == 127) {
        return;
    }
    const kreg_nf_sync_stats st = module_stats(fd);
    struct once {
        uint64_t    count;
        unsigned    bit;
        bool        warn;
        const char *text;
    } said[] = {
        {st.late, 1, false, "changed by an io_uring worker, another process or "
         "a kernel thread: reported by the reader after the change; the "
         "process's threads were held until then"},
        /* with no signal (the default) that is the normal path */
        {g_signo ? st.self_gated : 0, 2, false, "changed by a thread that "
         "blocks UCX_KREG_SYNC_SIGNAL (or its handler was replaced since): "
         "that thread was held until the reader reported it"},
        {st.gate_timeouts, 4, true, "a thread was held for UCX_KREG_SYNC_TIMEOUT "
         "and let go before the change was reported: a registration cache "
         "could have hit stale pages meanwhile"},
        {st.inflight_full, 8, true, "was reported while more than 64 changes "
         "were in flight at once, before its pages were gone: a registration "
         "made meanwhile could have pinned the old pages"},
        /* its next call that returns an address is held: a stall */
        {st.irq_releases, 16, false, "changed while a thread stopped at an "
         "interrupt held up its report (a lock UCX's report needs): that "
         "thread went on after 50 ms, its next mmap, mremap, brk or shmat "
         "held until the report"},
        /* the same, at the return of an mmap that mapped nothing stale */
        {st.call_releases, 64, false, "changed while a thread whose mmap "
         "returned inside a lock UCX's report needs held up its report: that "
         "thread went on after 50 ms (its mmap mapped nothing of the "
         "change), its next mmap, mremap, brk or shmat held until the "
         "report"},
        {st.irq_unwatched + st.irq_next_released, 32, true, "changed while "
         "a thread stopped at an interrupt or an mmap held up its report (a "
         "lock UCX's report needs): that thread went on after 50 ms, and a "
         "system call it made inside that lock, or one the module could not "
         "watch, returned before the report"},
    };
    for (const once &o : said) {
        if ((o.count != 0) && !(g_warned.fetch_or(o.bit) & o.bit) &&
            !source_exiting()) {
            ucs_log(o.warn ? UCS_LOG_LEVEL_WARN : UCS_LOG_LEVEL_DIAG,
                    "kreg: registered memory %s (said once; kreg_get_stats "
                    "counts each)", o.text);
        }
    }
}

void sync_forget_after_fork()
{
    /* the child's first call arms its own descriptor */
    g_fd.store(-1);
    g_in_handler.store(0);
}

bool sync_active()
{
    return g_fd.load(std::memory_order_relaxed) >= 0;
}

void sync_add_stats(kreg_stats_t *stats)
{
    const kreg_nf_sync_stats st = module_stats(g_fd.load());
    stats->sync.queued        += st.queued;
    stats->sync.signalled     += st.signalled;
    stats->sync.self_held     += st.self_gated;
    stats->sync.held          += st.gates;
    stats->sync.held_waits    += st.gate_waits;
    stats->sync.held_timeouts += st.gate_timeouts;
    stats->sync.hold_nomem    += st.gate_nomem;
    stats->sync.late          += st.late;
    stats->sync.unpinned      += st.unpinned;
    stats->sync.drained       += g_drained.load(std::memory_order_relaxed);
    stats->sync.passes        += st.gate_passes;
    stats->sync.threads       += st.threads;
    stats->sync.own_changes   += st.own_changes;
    stats->sync.drain_waits   += st.drain_waits;
    stats->sync.inflight_full += st.inflight_full;
    stats->sync.irq_releases  += st.irq_releases;
    stats->sync.irq_next_held += st.irq_next_held;
    stats->sync.irq_unwatched += st.irq_unwatched;
    stats->sync.born_held     += st.born_held;
    stats->sync.irq_next_released += st.irq_next_released;
    stats->sync.call_releases += st.call_releases;
    stats->sync.irq_passes    += st.irq_passes;
    stats->sync.gates_parked  += st.gates_parked;
    stats->sync.parked_held   += st.parked_held;
}

} // namespace kreg
