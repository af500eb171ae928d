/* kreg_bench's children: the measurements P1 to P4, one configuration per
 * process (see kreg_bench.cc for what they print, bench/README.md for what
 * each measures). */
#include "kreg_bench.h"

#include "bench_cache.h"

#include <functional>
#include <new>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>

namespace bench {

double g_target_ms = 60; /* wall time of one measurement */
int    g_inner     = 3;  /* measurements per child, median printed */
bool   g_p2p4_only = false;
std::string g_bg_kind;
int         g_bg_n = -1;

namespace {

bool g_failed = false; /* a check inside a measurement went wrong */

void result(const std::string &key, double ns)
{
    printf("R %s %.2f\n", key.c_str(), ns);
    fflush(stdout);
}

/* How many operations f(n) (runs n, returns the ns they took) needs for
 * about ms of wall time. */
template <class F> uint64_t calibrate(F &&f, double ms)
{
    uint64_t n = 1;
    for (;;) {
        const uint64_t t0 = now_ns();
        f(n);
        const double wall = static_cast<double>(now_ns() - t0);
        if (wall > 5e6 || n > (1ull << 30)) {
            return std::max<uint64_t>(1, static_cast<uint64_t>(n * ms * 1e6 / wall));
        }
        n *= 4;
    }
}

/* f(n) runs n operations and returns the ns they took (may time only a part
 * of each). Calibrated on wall time to ~g_target_ms; median of g_inner. */
template <class F> double per_op(F &&f)
{
    const uint64_t n = calibrate(f, g_target_ms);
    std::vector<double> v;
    for (int i = 0; i < g_inner; ++i) {
        v.push_back(static_cast<double>(f(n)) / static_cast<double>(n));
    }
    return median(v);
}

/* The same for a pure-CPU operation, as much time in batches of ~4 ms, each
 * between two reference loops (bench_util.h, "the speed state"). */
template <class F> batch_times per_op_in_ref(F &&f)
{
    const uint64_t n = calibrate(f, 4);
    return time_batches([&] { return static_cast<double>(f(n)) / static_cast<double>(n); },
                        g_target_ms * g_inner, 2 * static_cast<size_t>(g_inner));
}

/* ---- P1: unregistered memory ------------------------------------------ */

void measure_unregistered()
{
    result("P1.malloc_free_300k", per_op([](uint64_t n) {
        const uint64_t t0 = now_ns();
        for (uint64_t i = 0; i < n; ++i) {
            char *p = static_cast<char *>(malloc(300 * 1024));
            p[0] = 1;
            escape(p);
            free(p);
        }
        return now_ns() - t0;
    }));
    /* the same, with the whole buffer written each time */
    result("P1.malloc_touch_free_300k", per_op([](uint64_t n) {
        const uint64_t t0 = now_ns();
        for (uint64_t i = 0; i < n; ++i) {
            char *p = static_cast<char *>(malloc(300 * 1024));
            for (size_t off = 0; off < 300 * 1024; off += page_size()) {
                p[off] = 1;
            }
            escape(p);
            free(p);
        }
        return now_ns() - t0;
    }));
    char *const slot = fixed_slot(); /* bench_util.h: where it lands */
    for (size_t size : {page_size(), size_t(1) << 20}) {
        const std::string key = size == page_size() ? "P1.mmap_munmap_4k" :
                                                      "P1.mmap_munmap_1m";
        /* also in reference-loop units, printed beside the figure: one
         * thread's system calls, as much CPU work as a hit */
        const batch_times t = per_op_in_ref([size, slot](uint64_t n) {
            const uint64_t t0 = now_ns();
            for (uint64_t i = 0; i < n; ++i) {
                char *p = static_cast<char *>(mmap(slot, size, PROT_READ | PROT_WRITE,
                                                   MAP_PRIVATE | MAP_ANONYMOUS |
                                                           MAP_FIXED_NOREPLACE,
                                                   -1, 0));
                if (p == MAP_FAILED) {
                    die(errno == EEXIST ? "mmap: another mapping took the measured slot"
                                         : "mmap");
                }
                p[0] = 1;
                munmap(p, size);
            }
            return now_ns() - t0;
        });
        result(key, t.ns);
        result(key + ".ref", t.in_ref);
        result(key + ".ref_ns", t.ref_ns);
    }
}

/* ---- P2: cache hits ---------------------------------------------------- */

void measure_hits(bench_cache *c)
{
    for (size_t size : {size_t(64) << 10, size_t(1) << 20}) {
        const std::string key = size == (64u << 10) ? "P2.hit_64k" : "P2.hit_1m";
        char *buf = static_cast<char *>(mmap(nullptr, size, PROT_READ | PROT_WRITE,
                                             MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
        if (buf == MAP_FAILED) {
            die("mmap");
        }
        memset(buf, 1, size);
        bench_region *r;
        if (cache_get(c, buf, size, &r) != UCS_OK) {
            fprintf(stderr, "bench: %s: first registration failed\n", key.c_str());
            g_failed = true;
            munmap(buf, size);
            continue;
        }
        cache_put(c, r);
        const uint64_t regs = c->regs.load();
        auto hits = [c, buf, size](uint64_t n) {
            const uint64_t t0 = now_ns();
            for (uint64_t i = 0; i < n; ++i) {
                bench_region *h;
                if (cache_get(c, buf, size, &h) == UCS_OK) {
                    cache_put(c, h);
                }
            }
            return now_ns() - t0;
        };
        kreg_stats_t before{}, after{};
        kreg_get_stats(&before);
        const batch_times t = per_op_in_ref(hits);
        kreg_get_stats(&after);
        /* how often a hit waited for the library's threads (an event in
         * flight, or read and not yet dispatched): with no event there is
         * nothing to wait for */
        result(key + ".waits", static_cast<double>(after.inflight_waits - before.inflight_waits +
                                                   after.sync_waits - before.sync_waits));
        result(key, t.ns);
        result(key + ".ref", t.in_ref);
        result(key + ".ref_ns", t.ref_ns);
        if (c->kernel) {
            /* The same hits beside ucs_rcache_get alone on the same rcache
             * and buffer, batches alternating: what our check adds, with
             * no second process whose speed could differ. */
            auto ucs_hits = [c, buf, size](uint64_t n) {
                const uint64_t t0 = now_ns();
                for (uint64_t i = 0; i < n; ++i) {
                    ucs_rcache_region_t *h;
                    if (kreg_ucs_rcache_get(c->rc, buf, size, PROT_READ | PROT_WRITE, nullptr,
                                       &h) == UCS_OK) {
                        ucs_rcache_region_put(c->rc, h);
                    }
                }
                return now_ns() - t0;
            };
            const uint64_t n = calibrate(hits, 4);
            std::vector<double> ratios;
            for (int i = 0; i < 2 * g_inner; ++i) {
                /* which goes first alternates too */
                const double a = static_cast<double>((i % 2) ? ucs_hits(n) : hits(n));
                const double b = static_cast<double>((i % 2) ? hits(n) : ucs_hits(n));
                ratios.push_back((i % 2) ? b / a : a / b);
            }
            result(key + ".inproc", median(ratios));
        }
        if (c->regs.load() != regs) {
            fprintf(stderr, "bench: %s: %lu of the hits were misses\n", key.c_str(),
                    static_cast<unsigned long>(c->regs.load() - regs));
            g_failed = true;
        }
        munmap(buf, size);
    }
}

/* ---- P3: freeing a cached buffer --------------------------------------- */

struct probe {
    std::atomic<uintptr_t> start{0}, end{0};
    std::atomic<uint64_t>  seen{0};
};
probe g_probe;

/* Runs after the rcache's own handler (priority 1000 < 2000). */
void probe_cb(ucm_event_type_t type, ucm_event_t *ev, void *arg)
{
    const uintptr_t s = reinterpret_cast<uintptr_t>(ev->vm_unmapped.address);
    const uintptr_t e = s + ev->vm_unmapped.size;
    if ((s < g_probe.end.load()) && (e > g_probe.start.load())) {
        g_probe.seen.fetch_add(1);
    }
}

bool wait_probe(uint64_t target)
{
    const uint64_t t0 = now_ns();
    for (unsigned i = 0; g_probe.seen.load() < target; ++i) {
        if (i > 2000) {
            sched_yield();
            if (now_ns() - t0 > 5000000000ull) {
                return false;
            }
        }
    }
    return true;
}

/* P3; edge(true) and edge(false) around each batch of frees (the
 * calibration's and the g_inner measured ones), for what runs beside it */
void measure_free_cached(bench_cache *c, const std::function<void(bool)> &edge = nullptr)
{
    const size_t size = 1u << 20;
    if (ucm_set_event_handler(UCM_EVENT_VM_UNMAPPED | UCM_EVENT_FLAG_NO_INSTALL, 2000,
                              probe_cb, nullptr) != UCS_OK) {
        fprintf(stderr, "bench: cannot add the UCM probe handler\n");
        g_failed = true;
        return;
    }
    uint64_t misses_missing = 0;
    uint64_t lost           = 0;
    std::vector<double> only, full;
    auto run = [&](uint64_t n, uint64_t *acc_only, uint64_t *acc_full) {
        for (uint64_t i = 0; i < n; ++i) {
            char *p = static_cast<char *>(mmap(nullptr, size, PROT_READ | PROT_WRITE,
                                               MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
            if (p == MAP_FAILED) {
                die("mmap");
            }
            memset(p, static_cast<int>(i), size);
            const uint64_t regs = c->regs.load();
            bench_region *r;
            if (cache_get(c, p, size, &r) != UCS_OK) {
                die("P3 registration");
            }
            cache_put(c, r);
            if (c->regs.load() == regs) {
                ++misses_missing; /* a stale hit on the last buffer */
            }
            g_probe.start = reinterpret_cast<uintptr_t>(p);
            g_probe.end   = reinterpret_cast<uintptr_t>(p) + size;
            const uint64_t target = g_probe.seen.load() + 1;
            const uint64_t t0     = now_ns();
            munmap(p, size);
            sync_user_report(p, size);
            const uint64_t t1 = now_ns();
            if (!wait_probe(target)) {
                ++lost;
            }
            const uint64_t t2 = now_ns();
            *acc_only += t1 - t0;
            *acc_full += t2 - t0;
        }
    };
    /* calibrate on the full loop, then g_inner measurements; each also
     * in units of the reference loop run around it (bench_util.h: TCG's
     * speed state moves a process's ns by up to 1.7x for seconds, and P3
     * is one thread's CPU work, the signal's handler included) */
    std::vector<double> only_ref;
    const double full_ns = per_op([&](uint64_t n) {
        uint64_t a = 0, b = 0;
        const double ref0 = reference_ns();
        if (edge) {
            edge(true);
        }
        run(n, &a, &b);
        if (edge) {
            edge(false);
        }
        const double ref1 = reference_ns();
        const double op   = static_cast<double>(a) / static_cast<double>(n);
        only.push_back(op);
        only_ref.push_back(op / ((ref0 + ref1) / 2));
        return b;
    });
    /* both hold the calibration runs too; keep the last g_inner */
    only.erase(only.begin(), only.end() - std::min<size_t>(only.size(), g_inner));
    only_ref.erase(only_ref.begin(),
                   only_ref.end() - std::min<size_t>(only_ref.size(), g_inner));
    result("P3.munmap_1m", median(only));
    result("P3.munmap_1m.ref", median(only_ref));
    result("P3.munmap_1m_to_rcache", full_ns);
    ucm_unset_event_handler(UCM_EVENT_VM_UNMAPPED, probe_cb, nullptr);
    if (misses_missing || lost) {
        fprintf(stderr, "bench: P3: %lu registrations hit a stale region, %lu "
                "invalidations never reached the rcache (5 s)\n",
                static_cast<unsigned long>(misses_missing),
                static_cast<unsigned long>(lost));
        g_failed = true;
    }
}

/* ---- --threads: other threads in the process during P3 ------------------ */

/* The other threads: asleep in poll() of a pipe nobody writes until the
 * end, spinning in user space, or making system calls (getppid) in a loop;
 * the last two at SCHED_IDLE on every CPU but the measured thread's (CPU
 * 0, with 2 CPUs or more), so that P3 measures the mechanism, not the
 * scheduler's share of a CPU. Each counts its iterations in a cache line
 * of its own. "apart", the control of "spinning": the same spinners in
 * another process (forked), which no mechanism of this one watches: what
 * T spinners on the other CPUs cost P3 through the machine alone. */
/* A spinning or calling thread: at SCHED_IDLE on every CPU but 0, counting
 * its iterations in *n until *stop. */
void spin_elsewhere(bool calls, std::atomic<uint64_t> *n, const std::atomic<bool> *stop)
{
    struct sched_param sp = {};
    pthread_setschedparam(pthread_self(), SCHED_IDLE, &sp);
    const long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    if (ncpu >= 2) {
        cpu_set_t set;
        CPU_ZERO(&set);
        for (long c = 1; c < ncpu; ++c) {
            CPU_SET(c, &set);
        }
        pthread_setaffinity_np(pthread_self(), sizeof(set), &set);
    }
    while (!stop->load(std::memory_order_relaxed)) {
        if (calls) {
            syscall(SYS_getppid);
        }
        n->fetch_add(1, std::memory_order_relaxed);
    }
}

class background {
public:
    bool start(const std::string &kind, int n)
    {
        if ((pipe(pipe_) != 0) || (n < 0)) {
            return false;
        }
        if ((kind == "stacks") && !map_stacks(n)) {
            return false;
        }
        /* shared, so that the counts of "apart" reach this process */
        count_n_ = static_cast<size_t>(std::max(1, n));
        void *c = mmap(nullptr, count_n_ * sizeof(line), PROT_READ | PROT_WRITE,
                       MAP_SHARED | MAP_ANONYMOUS, -1, 0);
        if (c == MAP_FAILED) {
            return false;
        }
        count_ = static_cast<line *>(c);
        for (size_t i = 0; i < count_n_; ++i) {
            new (&count_[i]) line();
        }
        if (kind == "apart") {
            apart_ = fork();
            if (apart_ < 0) {
                return false;
            }
            if (apart_ == 0) {
                /* never outlive the measurement */
                prctl(PR_SET_PDEATHSIG, SIGKILL);
                _exit(make_threads(n, "spinning") ? (pause(), 0) : 1);
            }
        } else if ((kind != "stacks") && !make_threads(n, kind)) {
            return false;
        }
        /* the measured thread on CPU 0, the others on the rest */
        const long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
        if (ncpu >= 2) {
            cpu_set_t set;
            CPU_ZERO(&set);
            CPU_SET(0, &set);
            pthread_setaffinity_np(pthread_self(), sizeof(set), &set);
        }
        usleep(100000); /* all started, the sleepers asleep */
        return true;
    }

    /* iterations of all threads so far */
    uint64_t iterations() const
    {
        uint64_t s = 0;
        for (size_t i = 0; (apart_ > 0 || i < threads_.size()) && i < count_n_; ++i) {
            s += count_[i].v.load(std::memory_order_relaxed);
        }
        return s;
    }

    /* CPU time of all threads so far, ns: what they ran, as against what
     * they did (a thread held, or its CPU taken, runs less) */
    uint64_t cpu_ns() const
    {
        uint64_t s = 0;
        clockid_t pid_clock;
        struct timespec pt;
        if ((apart_ > 0) && (clock_getcpuclockid(apart_, &pid_clock) == 0) &&
            (clock_gettime(pid_clock, &pt) == 0)) {
            s = static_cast<uint64_t>(pt.tv_sec) * 1000000000u +
                static_cast<uint64_t>(pt.tv_nsec);
        }
        for (pthread_t t : threads_) {
            clockid_t id;
            struct timespec ts;
            if ((pthread_getcpuclockid(t, &id) == 0) && (clock_gettime(id, &ts) == 0)) {
                s += static_cast<uint64_t>(ts.tv_sec) * 1000000000u +
                     static_cast<uint64_t>(ts.tv_nsec);
            }
        }
        return s;
    }

    void stop()
    {
        for (void *p : stacks_) {
            munmap(p, stack_span);
        }
        stacks_.clear();
        stop_.store(true);
        if (!threads_.empty() && (write(pipe_[1], "x", 1) < 0)) {
            perror("bench: write");
        }
        for (pthread_t t : threads_) {
            pthread_join(t, nullptr);
        }
        threads_.clear();
        if (apart_ > 0) {
            kill(apart_, SIGKILL);
            waitpid(apart_, nullptr, 0);
            apart_ = 0;
        }
        if (count_ != nullptr) {
            munmap(count_, count_n_ * sizeof(line));
            count_ = nullptr;
        }
    }

private:
    bool make_threads(int n, const std::string &kind)
    {
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setstacksize(&attr, 64 << 10);
        for (int i = 0; i < n; ++i) {
            arg_.push_back({this, i, kind});
        }
        for (int i = 0; i < n; ++i) {
            pthread_t t;
            if (pthread_create(&t, &attr, main_of, &arg_[static_cast<size_t>(i)]) != 0) {
                fprintf(stderr, "bench: %d of %d threads created\n", i, n);
                pthread_attr_destroy(&attr);
                return false;
            }
            threads_.push_back(t);
        }
        pthread_attr_destroy(&attr);
        return true;
    }

    /* a thread's stack as start() asks glibc for it: 64 KiB under a guard page */
    static constexpr size_t stack_span = (64 << 10) + 4096;

    /* "stacks", the control of "asleep": the n stacks that n threads would
     * add to the address space (glibc 2.36's allocate_stack(): mapped
     * PROT_NONE, all but the guard made writable, the top touched where
     * the thread's descriptor and TLS lie), and no thread: what a larger
     * address space costs P3, whatever watches it, apart from what the
     * threads cost. */
    bool map_stacks(int n)
    {
        for (int i = 0; i < n; ++i) {
            char *p = static_cast<char *>(mmap(nullptr, stack_span, PROT_NONE,
                                               MAP_PRIVATE | MAP_ANONYMOUS | MAP_STACK, -1,
                                               0));
            if (p == MAP_FAILED) {
                perror("bench: stacks: mmap");
                return false;
            }
            stacks_.push_back(p);
            if (mprotect(p + 4096, stack_span - 4096, PROT_READ | PROT_WRITE) != 0) {
                perror("bench: stacks: mprotect");
                return false;
            }
            memset(p + stack_span - 4096, 1, 4096);
        }
        return true;
    }

    struct alignas(64) line {
        std::atomic<uint64_t> v{0};
    };
    struct arg {
        background *self;
        int         i;
        std::string kind;
    };

    static void *main_of(void *a)
    {
        arg *x = static_cast<arg *>(a);
        x->self->run(x->i, x->kind);
        return nullptr;
    }

    void run(int i, const std::string &kind)
    {
        if (kind == "asleep") {
            /* all wake on the one byte written at stop (poll reads none) */
            struct pollfd p = {pipe_[0], POLLIN, 0};
            while ((poll(&p, 1, -1) != 1) && !stop_.load()) {
            }
            return;
        }
        spin_elsewhere(kind == "syscalls", &count_[static_cast<size_t>(i)].v, &stop_);
    }

    int                      pipe_[2] = {-1, -1};
    std::atomic<bool>        stop_{false};
    line                    *count_   = nullptr; /* MAP_SHARED */
    size_t                   count_n_ = 0;
    pid_t                    apart_   = 0; /* the spinners' process ("apart") */
    std::vector<arg>         arg_;
    std::vector<pthread_t>   threads_;
    std::vector<void *>      stacks_;
};

/* P3 with the other threads running; their iterations per second during
 * it (spinning and system-call threads) as "P3.bg_rate", the CPUs they
 * had as "P3.bg_cpu" (1 = one CPU throughout), and synchronous delivery's
 * holds (gates armed: the measured thread's own and the others' that ran
 * since the last change) and those that slept, a second, as "P3.held" and
 * "P3.held_waits"; gates let go at an interrupt's return ("P3.passes"),
 * parked there ("P3.parked") and armed by a parked thread's next system
 * call ("P3.parked_held"), a second.
 *
 * All over the batches P3's own time is taken from (the last g_inner), so
 * that they describe the churn P3 measures. The calibration's batches
 * before them hold each new thread's first change (a thread that entered
 * the kernel since its birth is armed once by it: its startup's own
 * calls), a cost a thread pays once in its life and a measurement pays
 * again in every child; "P3.bg_rate_all", "P3.bg_cpu_all" and
 * "P3.held_all" are the same from the threads' start to P3's end. */
void measure_free_cached_with(bench_cache *c)
{
    struct mark {
        uint64_t     it, cpu, t, cpu_t;
        kreg_stats_t st;
    };
    background bg;
    if (!bg.start(g_bg_kind, g_bg_n)) {
        die("background threads");
    }
    /* the iterations and the clock closest to the batch; the CPU clocks of
     * T threads (T calls, milliseconds at T = 1024 under TCG) and the
     * stats outside it, the CPU time against its own wall time (cpu_t:
     * the reading's outer end) */
    auto before = [&bg](mark *m) {
        kreg_get_stats(&m->st);
        m->cpu_t = now_ns();
        m->cpu   = bg.cpu_ns();
        m->it    = bg.iterations();
        m->t     = now_ns();
    };
    auto after = [&bg](mark *m) {
        m->t     = now_ns();
        m->it    = bg.iterations();
        m->cpu   = bg.cpu_ns();
        m->cpu_t = now_ns();
        kreg_get_stats(&m->st);
    };
    std::vector<std::pair<mark, mark>> batches;
    mark m0{}, m1{};
    before(&m0);
    measure_free_cached(c, [&](bool begin) {
        if (begin) {
            batches.emplace_back();
            before(&batches.back().first);
        } else {
            after(&batches.back().second);
        }
    });
    after(&m1);
    bg.stop();
    if (g_bg_n <= 0) {
        return;
    }
    /* sums over the last g_inner batches */
    const size_t from = batches.size() - std::min<size_t>(batches.size(), g_inner);
    double wall = 0, it = 0, cpu = 0, cpu_wall = 0;
    uint64_t held = 0, queued = 0, waits = 0, passes = 0, parked = 0, parked_held = 0;
    for (size_t i = from; i < batches.size(); ++i) {
        const mark &x = batches[i].first, &y = batches[i].second;
        wall += static_cast<double>(y.t - x.t);
        it += static_cast<double>(y.it - x.it);
        cpu += static_cast<double>(y.cpu - x.cpu);
        cpu_wall += static_cast<double>(y.cpu_t - x.cpu_t);
        held += y.st.sync.held - x.st.sync.held;
        queued += y.st.sync.queued - x.st.sync.queued;
        waits += y.st.sync.held_waits - x.st.sync.held_waits;
        passes += y.st.sync.irq_passes - x.st.sync.irq_passes;
        parked += y.st.sync.gates_parked - x.st.sync.gates_parked;
        parked_held += y.st.sync.parked_held - x.st.sync.parked_held;
    }
    if (wall <= 0) {
        die("P3 ran no batch");
    }
    auto rate = [wall](uint64_t n) { return static_cast<double>(n) * 1e9 / wall; };
    result("P3.bg_rate", it * 1e9 / wall);
    result("P3.bg_cpu", cpu / cpu_wall);
    result("P3.held", rate(held));
    result("P3.queued", rate(queued));
    result("P3.held_waits", rate(waits));
    result("P3.passes", rate(passes));
    result("P3.parked", rate(parked));
    result("P3.parked_held", rate(parked_held));
    const double all = static_cast<double>(m1.t - m0.t);
    result("P3.bg_rate_all", static_cast<double>(m1.it - m0.it) * 1e9 / all);
    result("P3.bg_cpu_all",
           static_cast<double>(m1.cpu - m0.cpu) / static_cast<double>(m1.cpu_t - m0.cpu_t));
    result("P3.held_all", static_cast<double>(m1.st.sync.held - m0.st.sync.held) * 1e9 / all);
}

/* ---- P4: the watch in a registration miss ------------------------------ */

void noop_comp(void *) {}

void measure_miss_watch()
{
    const size_t size = 64u << 10;
    page_pinner pin_w, pin_n;
    if (!pin_w.open(16) || !pin_n.open(16)) {
        fprintf(stderr, "bench: P4 needs io_uring fixed buffers\n");
        g_failed = true;
        return;
    }
    bench_cache cw, cn;
    cw.pinner = &pin_w;
    cn.pinner = &pin_n;
    cn.watch  = false;
    if (!cache_create(&cw, true, "kreg_bench_p4w") ||
        !cache_create(&cn, true, "kreg_bench_p4n")) {
        g_failed = true;
        return;
    }
    char *buf = static_cast<char *>(mmap(nullptr, size, PROT_READ | PROT_WRITE,
                                         MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
    if (buf == MAP_FAILED) {
        die("mmap");
    }
    memset(buf, 1, size);
    auto loop = [buf, size](bench_cache *c, uint64_t n) {
        const uint64_t regs = c->regs.load();
        const uint64_t t0   = now_ns();
        for (uint64_t i = 0; i < n; ++i) {
            ucs_rcache_region_t *r;
            if (kreg_ucs_rcache_get(c->rc, buf, size, PROT_READ | PROT_WRITE, nullptr,
                               &r) != UCS_OK) {
                die("P4 registration");
            }
            ucs_rcache_region_invalidate(c->rc, r, noop_comp, nullptr);
            ucs_rcache_region_put(c->rc, r);
        }
        const uint64_t dt = now_ns() - t0;
        if (c->regs.load() - regs != n) {
            fprintf(stderr, "bench: P4: %lu misses for %lu gets\n",
                    static_cast<unsigned long>(c->regs.load() - regs),
                    static_cast<unsigned long>(n));
            g_failed = true;
        }
        return dt;
    };
    /* alternate the two, g_inner times each */
    std::vector<double> w, nw;
    const int inner = g_inner;
    g_inner         = 1;
    for (int i = 0; i < inner; ++i) {
        w.push_back(per_op([&](uint64_t n) { return loop(&cw, n); }));
        nw.push_back(per_op([&](uint64_t n) { return loop(&cn, n); }));
    }
    g_inner = inner;
    result("P4.miss_64k_watch", median(w));
    result("P4.miss_64k_nowatch", median(nw));
    if (cw.deregs.load() != cw.regs.load() || cn.deregs.load() != cn.regs.load()) {
        fprintf(stderr, "bench: P4: registrations left over\n");
        g_failed = true;
    }
    cache_destroy(&cw);
    cache_destroy(&cn);
    munmap(buf, size);
    pin_w.close();
    pin_n.close();
}

} // namespace

int child(const std::string &config)
{
    if (config == "no_ucx") {
        measure_unregistered();
        return 0;
    }
    const bool kernel = is_kernel_config(config);
    if (kernel && !kernel_start(config)) {
        return 3;
    }
    if ((config == "sync_user") && !sync_user_start()) {
        return 3;
    }
    /* sync: UCX's own cache, no watch of ours, no check at its hits */
    const bool stock_cache = (config == "sync") || (config == "sync_unpinned") ||
                             (config == "sync_user");
    bench_cache c;
    if (!cache_create(&c, kernel && !stock_cache, "kreg_bench")) {
        if (kernel) {
            kreg_stop();
        }
        return 3;
    }
    const bool full = (config == "hooks") || (config == "default") || (config == "uffd") ||
                      stock_cache;
    if (((config == "hooks") || (config == "default") || (config == "sync") ||
         (config == "sync_unpinned")) &&
        !g_p2p4_only) {
        measure_unregistered();
    }
    /* P3's buffers are pinned (io_uring fixed buffers), as a registration
     * pins: synchronous delivery queues and reports only changes of
     * pinned pages, so without the pin its P3 measured UCM's hooks */
    page_pinner p3_pin;
    if (!p3_pin.open(16)) {
        fprintf(stderr, "bench: P3 needs io_uring fixed buffers\n");
        cache_destroy(&c);
        if (kernel) {
            kreg_stop();
        }
        return 3;
    }
    if (g_bg_n >= 0) {
        c.pinner = &p3_pin;
        measure_free_cached_with(&c);
        cache_destroy(&c);
        p3_pin.close();
        if (kernel) {
            kreg_stop();
        }
        return g_failed ? 4 : 0;
    }
    measure_hits(&c);
    if (full) {
        c.pinner = &p3_pin;
        measure_free_cached(&c);
    }
    if (kernel && full && !stock_cache) {
        measure_miss_watch();
    }
    cache_destroy(&c);
    p3_pin.close();
    if (kernel) {
        if (c.refusals.load()) {
            fprintf(stderr, "bench: %lu watches refused\n",
                    static_cast<unsigned long>(c.refusals.load()));
            g_failed = true;
        }
        kreg_stop();
    }
    return g_failed ? 4 : 0;
}

} // namespace bench
