/* uffd_handoff: what userfaultfd's unmap handoff costs on this machine,
 * without libucm_kernel. The kernel makes a thread that unmaps a watched
 * range wait until a reader has read the UFFD_EVENT_UNMAP (design.md,
 * "P3 on userfaultfd"); this times munmap of a touched 1 MiB mapping
 *
 *   none        not registered with the userfaultfd: no event
 *   same_cpu    registered, the reader thread on the unmapping thread's CPU
 *   other_cpu   registered, the reader on another CPU (what an unbound
 *               process gets: the scheduler wakes the reader where it is
 *               idle, then the unmapping thread where it went idle)
 *
 * in rounds that rotate the three, and prints the median us of each and
 * its ratio to none. Where waking an idle CPU is dear (a VM whose idle
 * vCPUs halt), other_cpu is several times none; kreg_bench's P3 on
 * userfaultfd follows it. Runs on the first CPU it may use; other_cpu
 * needs a second (else it says so and measures the rest).
 *
 *   build/bench/uffd_handoff [--rounds N]
 */
#include "bench_util.h"

#include <linux/userfaultfd.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <sys/ioctl.h>
#include <sys/syscall.h>

using namespace bench;

namespace {

constexpr size_t kLen = 1 << 20;

int g_uffd = -1;

void pin_thread(pthread_t t, int cpu)
{
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    int rc = pthread_setaffinity_np(t, sizeof(set), &set);
    if (rc != 0) {
        errno = rc;
        die("pthread_setaffinity_np");
    }
}

void *read_events(void *)
{
    struct uffd_msg msgs[16];
    struct pollfd pfd = {g_uffd, POLLIN, 0};
    for (;;) {
        if (poll(&pfd, 1, -1) < 0) {
            continue;
        }
        while (read(g_uffd, msgs, sizeof(msgs)) > 0) {
        }
    }
    return nullptr;
}

/* us for one munmap of a fresh, touched, optionally registered mapping */
double one_munmap(bool watched)
{
    char *p = static_cast<char *>(mmap(nullptr, kLen, PROT_READ | PROT_WRITE,
                                       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
    if (p == MAP_FAILED) {
        die("mmap");
    }
    memset(p, 1, kLen);
    if (watched) {
        struct uffdio_register reg = {};
        reg.range.start = reinterpret_cast<uintptr_t>(p);
        reg.range.len   = kLen;
        reg.mode        = UFFDIO_REGISTER_MODE_MISSING;
        if (ioctl(g_uffd, UFFDIO_REGISTER, &reg) != 0) {
            die("UFFDIO_REGISTER");
        }
    }
    usleep(200); /* let the reader go idle, as between a program's frees */
    const uint64_t t0 = now_ns();
    munmap(p, kLen);
    return static_cast<double>(now_ns() - t0) / 1e3;
}

} // namespace

int main(int argc, char **argv)
{
    int rounds = 300;
    for (int i = 1; i < argc; ++i) {
        if ((strcmp(argv[i], "--rounds") == 0) && (i + 1 < argc)) {
            rounds = std::max(1, atoi(argv[++i]));
        } else {
            fprintf(stderr, "usage: %s [--rounds N]\n", argv[0]);
            return 2;
        }
    }
    g_uffd = static_cast<int>(syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK));
    if (g_uffd < 0) {
        die("userfaultfd (vm.unprivileged_userfaultfd?)");
    }
    struct uffdio_api api = {};
    api.api      = UFFD_API;
    api.features = UFFD_FEATURE_EVENT_UNMAP;
    if (ioctl(g_uffd, UFFDIO_API, &api) != 0) {
        die("UFFDIO_API");
    }

    /* the first two CPUs this process may run on (taskset, cgroups) */
    cpu_set_t allowed;
    if (sched_getaffinity(0, sizeof(allowed), &allowed) != 0) {
        die("sched_getaffinity");
    }
    std::vector<int> cpus;
    for (int cpu = 0; (cpu < CPU_SETSIZE) && (cpus.size() < 2); ++cpu) {
        if (CPU_ISSET(cpu, &allowed)) {
            cpus.push_back(cpu);
        }
    }
    const int ncpu = CPU_COUNT(&allowed);
    pthread_t reader;
    if (pthread_create(&reader, nullptr, read_events, nullptr) != 0) {
        die("pthread_create");
    }
    pin_thread(pthread_self(), cpus[0]);

    std::vector<std::string> cfgs = {"none", "same_cpu"};
    if (cpus.size() >= 2) {
        cfgs.push_back("other_cpu");
    }
    std::vector<std::vector<double>> us(cfgs.size());
    for (int r = 0; r < rounds; ++r) {
        for (size_t i = 0; i < cfgs.size(); ++i) {
            const size_t c = (i + r) % cfgs.size();
            pin_thread(reader, cfgs[c] == "other_cpu" ? cpus[1] : cpus[0]);
            us[c].push_back(one_munmap(cfgs[c] != "none"));
        }
    }

    printf("# uffd_handoff: munmap of a touched 1 MiB mapping, %d rounds, %d CPUs allowed\n",
           rounds, ncpu);
    const double base = median(us[0]);
    for (size_t c = 0; c < cfgs.size(); ++c) {
        std::vector<double> v = us[c];
        std::sort(v.begin(), v.end());
        printf("%-10s %8.1f us (p10 %.1f, p90 %.1f)  %.2f x none\n", cfgs[c].c_str(),
               median(v), v[v.size() / 10], v[v.size() * 9 / 10], median(v) / base);
    }
    if (cpus.size() < 2) {
        printf("# other_cpu not measured: this process may use one CPU only\n");
    }
    char driver[64] = "?";
    FILE *f = fopen("/sys/devices/system/cpu/cpuidle/current_driver", "r");
    if (f) {
        if (fscanf(f, "%63s", driver) != 1) {
            strcpy(driver, "?");
        }
        fclose(f);
    }
    printf("# cpuidle driver: %s\n", driver);
    return 0;
}
