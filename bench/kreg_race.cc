/* kreg_race: the cross-thread window (doc/design.md), measured. Can a thread that maps an
 * address again hit the registration cached for the mapping another thread
 * has just unmapped there?
 *
 *   build/bench/kreg_race --rounds 1000000       # plain and default
 *   build/bench/kreg_race --rounds 2000          # a quick check (a test)
 *   build/bench/kreg_race --rounds 100000 --modes default,uffd,notifier
 *
 * One child process per configuration (bench_util.h, env_for: default,
 * plain, uffd, uffd-plain, notifier, notifier-plain; UCM's hooks off), each
 * running N rounds of:
 *   1. the 64 KiB mapping at X is looked up and registered (cached): kreg
 *      watches it, an io_uring fixed buffer pins it (as ibv_reg_mr would);
 *      the region's generation and the PFN of its first page are kept;
 *   2. thread A unmaps X with a raw syscall(SYS_munmap) while thread B spins
 *      mmap(X, MAP_FIXED_NOREPLACE) until it gets X, writes a new pattern
 *      over all of it, notes how far the kernel's event has come (see
 *      below), then does what an md does: kreg_prepare_lookup + ucs_rcache_get;
 *   3. the lookup is a stale hit if it registered nothing and returned the
 *      region of step 1 (same generation). Second oracle (as root): the
 *      region's PFN against the PFN now mapped at X (the old pages are still
 *      pinned, so a new mapping always has other frames).
 * Where the event was when B looked up (the most advanced stage seen):
 *   dispatched  - UCM had already delivered it to the rcache
 *   read        - A's munmap had returned (the reader had read the event)
 *   queued      - the userfaultfd had it unread (POLLIN)
 *   not_queued  - none of these: the kernel had not queued it yet
 *
 * Prints per mode `race <mode> rounds=<N> stale=<k> per_million=<x>` and a
 * line with the stages and the second oracle. Exit status 1 if an exact
 * configuration (all but the plain ones) had a stale hit by either oracle,
 * or a child failed.
 *
 * One file over 350 lines on purpose: the round, its two oracles and the
 * stage table the parent prints are one experiment, read top to bottom. */
#include "bench_cache.h"

#include <dirent.h>
#include <map>
#include <poll.h>
#include <sstream>
#include <sys/syscall.h>
#include <thread>

using namespace bench;

namespace {

const size_t kLen = 64u << 10;

enum race_stage { NOT_QUEUED = 0, QUEUED, READ, DISPATCHED, STAGES };
const char *const kStageName[STAGES] = {"not_queued", "queued", "read", "dispatched"};

uintptr_t g_x;                         /* the address raced on */
int g_a_spin = 4000; /* KREG_RACE_A_SPIN: pauses before A sleeps */
thread_local bool t_in_lookup = false; /* B inside prepare_lookup/get */
std::atomic<uint64_t> g_kernel_seen{0}; /* events on X from the monitor */
std::atomic<uint64_t> g_lookup_seen{0}; /* X invalidated by a lookup itself */

void probe_cb(ucm_event_type_t type, ucm_event_t *ev, void *arg)
{
    const uintptr_t s = reinterpret_cast<uintptr_t>(ev->vm_unmapped.address);
    const uintptr_t e = s + ev->vm_unmapped.size;
    if ((s < g_x + kLen) && (e > g_x)) {
        if (t_in_lookup) {
            g_lookup_seen.fetch_add(1);
        } else {
            g_kernel_seen.fetch_add(1);
            g_kernel_seen.notify_all();
        }
    }
}

int find_uffd()
{
    DIR *d = opendir("/proc/self/fd");
    if (!d) {
        return -1;
    }
    int found = -1;
    while (struct dirent *de = readdir(d)) {
        char path[300], link[128];
        snprintf(path, sizeof(path), "/proc/self/fd/%s", de->d_name);
        ssize_t n = readlink(path, link, sizeof(link) - 1);
        if (n > 0) {
            link[n] = '\0';
            if (strstr(link, "userfaultfd") || strstr(link, "kreg_notifier")) {
                found = atoi(de->d_name);
            }
        }
    }
    closedir(d);
    return found;
}

bool has_pollin(int fd)
{
    struct pollfd p = {fd, POLLIN, 0};
    return (fd >= 0) && (poll(&p, 1, 0) > 0) && (p.revents & POLLIN);
}

inline void cpu_relax()
{
    asm volatile("pause" ::: "memory");
}

/* Waits for v > old, spinning a little, then sleeping on the futex. */
bool wait_above(std::atomic<uint64_t> &v, uint64_t old, uint64_t timeout_ns)
{
    for (int i = 0; i < 200; ++i) {
        if (v.load() > old) {
            return true;
        }
        cpu_relax();
    }
    const uint64_t t0 = now_ns();
    while (v.load() <= old) {
        if (now_ns() - t0 > timeout_ns) {
            return false;
        }
        sched_yield();
    }
    return true;
}

struct race_thread {
    std::atomic<uint64_t> round{0}, ready{0}, go{0}, done{0};
    std::atomic<bool>     stop{false};

    void main()
    {
        uint64_t seen = 0;
        for (;;) {
            uint64_t r;
            /* spin a while (the next round comes within tens of us), then
             * sleep: the monitor threads need the CPU more than we do */
            for (int i = 0; (r = round.load()) == seen && i < g_a_spin; ++i) {
                cpu_relax();
            }
            while ((r = round.load()) == seen) {
                round.wait(seen);
            }
            seen = r;
            if (stop.load()) {
                return;
            }
            ready.store(r);
            while (go.load() != r) {
                cpu_relax();
            }
            syscall(SYS_munmap, reinterpret_cast<void *>(g_x), kLen);
            done.store(r);
        }
    }
};

int child(const std::string &mode, uint64_t rounds)
{
    if (getenv("KREG_RACE_A_SPIN")) {
        g_a_spin = atoi(getenv("KREG_RACE_A_SPIN"));
    }
    if (!kernel_start(mode)) {
        return 3;
    }
    const int uffd = find_uffd();
    if (uffd < 0) {
        fprintf(stderr, "race: no userfaultfd among the descriptors; the queued "
                "stage is not told apart\n");
    }
    page_pinner pinner;
    if (!pinner.open(64)) {
        fprintf(stderr, "race: no io_uring fixed buffers\n");
        kreg_stop();
        return 3;
    }
    bench_cache c;
    c.pinner  = &pinner;
    c.pagemap = (geteuid() == 0) ? open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC) : -1;
    if (!cache_create(&c, true, "kreg_race")) {
        kreg_stop();
        return 3;
    }
    ucm_set_event_handler(UCM_EVENT_VM_UNMAPPED | UCM_EVENT_FLAG_NO_INSTALL, 2000,
                          probe_cb, nullptr);

    void *x = mmap(nullptr, kLen, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                   -1, 0);
    if (x == MAP_FAILED) {
        die("mmap");
    }
    g_x = reinterpret_cast<uintptr_t>(x);
    memset(x, 0xee, kLen);
    const bool pfn_oracle = pfn_of(c.pagemap, x) != 0;

    race_thread a;
    std::thread ta([&a] { a.main(); });

    uint64_t stale = 0, pfn_stale = 0, disagree = 0, leftover = 0, other = 0;
    uint64_t lost = 0, failed = 0, spins = 0, prev_gen = 0;
    uint64_t stage[STAGES] = {}, stale_at[STAGES] = {};
    /* register, A ready + mmap spin, write, lookup, wait for the event */
    uint64_t phase_ns[5] = {};
    const uint64_t t0 = now_ns();
    uint64_t r;
    for (r = 1; r <= rounds; ++r) {
        /* 1. cache the fresh mapping */
        uint64_t tp = now_ns();
        bench_region *reg;
        uint64_t regs = c.regs.load();
        if (cache_get(&c, x, kLen, &reg) != UCS_OK) {
            ++failed;
            break;
        }
        if ((c.regs.load() == regs) && (r > 1) && (reg->gen == prev_gen)) {
            ++leftover; /* the previous round's region survived its event */
        }
        const uint64_t old_gen = reg->gen;
        prev_gen               = old_gen;
        cache_put(&c, reg);
        const uint64_t kseen = g_kernel_seen.load();

        /* 2. race */
        phase_ns[0] += now_ns() - tp;
        tp = now_ns();
        a.round.store(r);
        a.round.notify_one();
        while (a.ready.load() != r) {
            cpu_relax();
        }
        a.go.store(r);
        void *p;
        /* until x is free again; once the unmapper is done, one more try
         * that fails means another mapping took the hole (this process's
         * monitor or UCX's pools map too): say so, never spin for good */
        bool was_done = false;
        for (;;) {
            p = mmap(x, kLen, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
            if (p == x) {
                break;
            }
            if (p != MAP_FAILED) {
                fprintf(stderr, "race: MAP_FIXED_NOREPLACE gave %p for %p\n", p, x);
                return 3;
            }
            if (errno != EEXIST) {
                die("mmap(MAP_FIXED_NOREPLACE)");
            }
            if (was_done) {
                fprintf(stderr, "race: round %lu: another mapping took the freed %p\n",
                        static_cast<unsigned long>(r), x);
                return 3;
            }
            was_done = a.done.load() == r;
            ++spins;
        }
        phase_ns[1] += now_ns() - tp;
        tp = now_ns();
        memset(x, static_cast<int>(r & 0xff), kLen);
        phase_ns[2] += now_ns() - tp;
        tp = now_ns();
        /* how far the event has come, most advanced stage wins */
        const bool q = has_pollin(uffd);
        const bool rd = a.done.load() == r;
        const bool d = g_kernel_seen.load() > kseen;
        const race_stage st = d ? DISPATCHED : rd ? READ : q ? QUEUED : NOT_QUEUED;
        ++stage[st];

        /* the md's lookup */
        regs        = c.regs.load();
        t_in_lookup = true;
        ucs_status_t s = cache_get(&c, x, kLen, &reg);
        t_in_lookup = false;
        if (s != UCS_OK) {
            ++failed;
            break;
        }
        const bool fresh   = c.regs.load() > regs;
        const bool is_old  = !fresh && (reg->gen == old_gen);
        const bool pfn_bad = pfn_oracle && (reg->pfn != pfn_of(c.pagemap, x));
        if (is_old) {
            ++stale;
            ++stale_at[st];
        } else if (!fresh) {
            ++other; /* a hit on some other region: should not happen */
        }
        if (pfn_bad) {
            ++pfn_stale;
        }
        if (pfn_oracle && (pfn_bad != is_old)) {
            ++disagree;
        }
        cache_put(&c, reg);

        phase_ns[3] += now_ns() - tp;
        tp = now_ns();
        /* 3. let A's munmap and its event finish before the next round */
        while (a.done.load() != r) {
            sched_yield();
        }
        if (!wait_above(g_kernel_seen, kseen, 10000000000ull)) {
            fprintf(stderr, "race: round %lu: the unmap event of 0x%lx never reached "
                    "UCM (10 s)\n", static_cast<unsigned long>(r),
                    static_cast<unsigned long>(g_x));
            ++lost;
            break;
        }
        phase_ns[4] += now_ns() - tp;
    }
    const double secs = (now_ns() - t0) / 1e9;
    const uint64_t done_rounds = std::min(r, rounds + 1) - 1;
    a.stop.store(true);
    a.round.store(rounds + 2);
    a.round.notify_one();
    ta.join();

    kreg_stats_t ks;
    kreg_get_stats(&ks);
    ucm_unset_event_handler(UCM_EVENT_VM_UNMAPPED, probe_cb, nullptr);
    munmap(x, kLen);
    cache_destroy(&c);
    pinner.close();
    if (c.pagemap >= 0) {
        close(c.pagemap);
    }
    kreg_stop();

    printf("R rounds %lu\nR stale %lu\nR pfn_stale %lu\nR disagree %lu\nR other %lu\n"
           "R leftover %lu\nR lost %lu\nR failed %lu\nR seconds %.3f\nR spins %lu\n"
           "R pfn_oracle %d\nR verify_invalidations %lu\nR inflight_waits %lu\n"
           "R stale_hits %lu\n",
           (unsigned long)done_rounds, (unsigned long)stale, (unsigned long)pfn_stale,
           (unsigned long)disagree, (unsigned long)other, (unsigned long)leftover,
           (unsigned long)lost, (unsigned long)failed, secs, (unsigned long)spins,
           pfn_oracle ? 1 : 0, (unsigned long)ks.verify_invalidations,
           (unsigned long)ks.inflight_waits, (unsigned long)ks.stale_hits);
    const char *const phase_name[5] = {"register", "remap", "write", "lookup", "event"};
    for (int i = 0; i < 5; ++i) {
        printf("R phase_%s %.2f\n", phase_name[i],
               done_rounds ? phase_ns[i] / 1e3 / done_rounds : 0.0);
    }
    for (int i = 0; i < STAGES; ++i) {
        printf("R stage_%s %lu\nR stale_at_%s %lu\n", kStageName[i],
               (unsigned long)stage[i], kStageName[i], (unsigned long)stale_at[i]);
    }
    return (lost || failed || done_rounds != rounds) ? 4 : 0;
}

int parent(uint64_t rounds, const std::vector<std::string> &modes)
{
    int rc = 0;
    for (const std::string &mode : modes) {
        const uint64_t t0 = now_ns();
        child_result res = run_self({"--child", mode, "--rounds", std::to_string(rounds)},
                                   env_for(mode));
        const double wall = (now_ns() - t0) / 1e9;
        std::map<std::string, double> v;
        std::istringstream in(res.output);
        std::string line;
        while (std::getline(in, line)) {
            char key[64];
            double val;
            if (sscanf(line.c_str(), "R %63s %lf", key, &val) == 2) {
                v[key] = val;
            } else if (line.rfind("# backend:", 0) == 0) {
                printf("# %s: %s\n", mode.c_str(), line.c_str() + 2);
            } else if (!line.empty()) {
                fprintf(stderr, "[%s] %s\n", mode.c_str(), line.c_str());
            }
        }
        if (res.status != 0 || v.count("rounds") == 0) {
            fprintf(stderr, "race: child %s exited with %d\n", mode.c_str(), res.status);
            rc = 1;
            if (v.count("rounds") == 0) {
                continue;
            }
        }
        const double n = v["rounds"];
        printf("race %s rounds=%.0f stale=%.0f per_million=%.1f\n", mode.c_str(), n,
               v["stale"], n > 0 ? v["stale"] * 1e6 / n : 0.0);
        printf("# %s: stage at lookup:", mode.c_str());
        for (const char *s : kStageName) {
            printf(" %s=%.0f(stale %.0f)", s, v[std::string("stage_") + s],
                   v[std::string("stale_at_") + s]);
        }
        printf("\n# %s: pfn oracle %s stale=%.0f disagree=%.0f; other_hits=%.0f "
               "leftover=%.0f verify_invalidations=%.0f inflight_waits=%.0f "
               "stale_by_counter=%.0f "
               "mmap_spins/round=%.1f; %.1f s (%.1f us/round)\n",
               mode.c_str(), v["pfn_oracle"] ? "on" : "off (not root)", v["pfn_stale"],
               v["disagree"], v["other"], v["leftover"], v["verify_invalidations"],
               v["inflight_waits"], v["stale_hits"], n > 0 ? v["spins"] / n : 0.0, wall,
               n > 0 ? v["seconds"] * 1e6 / n : 0.0);
        printf("# %s: us per round in: register %.1f, A ready + remap %.1f, write %.1f, "
               "lookup %.1f, rest of the event %.1f\n", mode.c_str(), v["phase_register"],
               v["phase_remap"], v["phase_write"], v["phase_lookup"], v["phase_event"]);
        fflush(stdout);
        const bool exact = mode.find("plain") == std::string::npos;
        if (exact && (v["stale"] > 0 || v["pfn_stale"] > 0)) {
            rc = 1;
        }
        if (v["other"] > 0 || v["leftover"] > 0 || v["disagree"] > 0) {
            rc = 1;
        }
    }
    return rc;
}

} // namespace

int main(int argc, char **argv)
{
    std::string child_mode;
    uint64_t rounds = 1000000;
    std::vector<std::string> modes = {"plain", "default"};
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        if (a == "--child" && i + 1 < argc) {
            child_mode = argv[++i];
        } else if (a == "--rounds" && i + 1 < argc) {
            rounds = std::max<uint64_t>(1, strtoull(argv[++i], nullptr, 10));
        } else if (a == "--modes" && i + 1 < argc) {
            modes.clear();
            std::istringstream in(argv[++i]);
            std::string m;
            while (std::getline(in, m, ',')) {
                modes.push_back(m);
            }
        } else {
            fprintf(stderr, "usage: %s [--rounds N] [--modes CONFIG,...]\n"
                    "  CONFIG: default, plain, uffd, uffd-plain, notifier, "
                    "notifier-plain (see bench_util.h)\n", argv[0]);
            return 2;
        }
    }
    if (!child_mode.empty()) {
        return child(child_mode, rounds);
    }
    return parent(rounds, modes);
}
