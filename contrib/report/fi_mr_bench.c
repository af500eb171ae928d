/*
 * fi_mr_bench: libfabric's registration cache and its memory monitors
 * (FI_MR_CACHE_MONITOR) through libfabric's public API, for the report
 * (contrib/kreg-report). Needs a verbs device: it runs in the Soft-RoCE VM.
 *
 *   fi_mr_bench [--device rxe0] [--reps N] [--ms MS] [--rounds R]
 *
 * libfabric's cache has no public API of its own: the verbs provider puts
 * it behind fi_mr_reg() when a monitor is set (userfaultfd: a thread reads
 * the kernel's UNMAP/REMOVE/REMAP events; memhooks: libfabric patches
 * mmap/munmap/madvise/... in the process; disabled: no cache). Each monitor
 * runs in a process of its own (the monitor is chosen at library load), the
 * program re-executing itself with FI_MR_CACHE_MONITOR set, in an order that
 * rotates from run to run. Per child, on a 64 KiB buffer (mmap, written):
 *
 *   hit        fi_mr_reg + fi_close of a buffer already registered once, in
 *              batches of 200 for about MS ms: the median ns per operation
 *              (what md_bench's md_hit_64k measures for UCT's mds)
 *   reg/hit    ibv_reg_mr calls per operation in that loop (0: a cache hit;
 *              1: no cache), counted by test/regcache/libcount_reg_mr.so,
 *              which must be preloaded (LD_PRELOAD).
 *   stale_*    R rounds of: register a fresh mapping at X (cached, closed),
 *              unmap X (libc munmap, or a raw syscall(SYS_munmap) that no
 *              hook sees), map new pages at X (MAP_FIXED_NOREPLACE), write
 *              them, fi_mr_reg X again in the same thread. Stale: that
 *              fi_mr_reg called no ibv_reg_mr, so it returned the
 *              registration of the old pages (they stay pinned by it).
 *              1 ms pause between rounds.
 *
 * Parent output:
 *   # fi_mr_bench: ...                                   setup
 *   FI hit_64k.<monitor> <ns> (runs MIN..MAX) reg/hit <x>
 *   FI stale_<libc|raw>_munmap.<monitor> <k> of <n>
 * Exit status: 0; 77 if libfabric has no verbs provider for the device;
 * 1 if a child failed.
 */
#define _GNU_SOURCE
#include <rdma/fabric.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_errno.h>

#include <dlfcn.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define LEN (64 * 1024)
#define NMON 3
static const char *const monitors[NMON] = {"userfaultfd", "memhooks", "disabled"};

/* ---- ibv_reg_mr counter: test/regcache/libcount_reg_mr.so, preloaded ---- */

static unsigned long (*reg_calls)(void);

static int find_counter(void)
{
    reg_calls = (unsigned long (*)(void))dlsym(RTLD_DEFAULT, "count_reg_mr_calls");
    if (reg_calls == NULL) {
        fprintf(stderr, "fi_mr_bench: run it with LD_PRELOAD=BUILD/test/regcache/"
                        ".libs/libcount_reg_mr.so (it counts ibv_reg_mr)\n");
        return 0;
    }
    return 1;
}

/* ---- child --------------------------------------------------------------- */

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, size_t n)
{
    qsort(v, n, sizeof(*v), cmp_double);
    return (n % 2) ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

static struct fid_fabric *fabric;
static struct fid_domain *domain;

/* 0 ok, 77 no verbs provider for the device, 1 error */
static int open_domain(const char *device, int verbose)
{
    struct fi_info *hints = fi_allocinfo(), *info = NULL;
    int ret;

    hints->ep_attr->type          = FI_EP_MSG;
    hints->caps                   = FI_MSG | FI_RMA;
    hints->domain_attr->mr_mode   = FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED |
                                    FI_MR_PROV_KEY;
    hints->fabric_attr->prov_name = strdup("verbs");
    hints->domain_attr->name      = strdup(device);
    ret = fi_getinfo(FI_VERSION(1, 17), NULL, NULL, 0, hints, &info);
    fi_freeinfo(hints);
    if (ret) {
        printf("skip: no libfabric verbs provider for %s (fi_getinfo: %s)\n", device,
               fi_strerror(-ret));
        return 77;
    }
    if (verbose) {
        printf("# provider %s %u.%u, fabric %s, domain %s\n", info->fabric_attr->prov_name,
               FI_MAJOR(info->fabric_attr->prov_version),
               FI_MINOR(info->fabric_attr->prov_version), info->fabric_attr->name,
               info->domain_attr->name);
    }
    if ((ret = fi_fabric(info->fabric_attr, &fabric, NULL)) ||
        (ret = fi_domain(fabric, info, &domain, NULL))) {
        fprintf(stderr, "fi_mr_bench: fi_fabric/fi_domain: %s\n", fi_strerror(-ret));
        fi_freeinfo(info);
        return 1;
    }
    fi_freeinfo(info);
    return 0;
}

static int reg(void *buf, struct fid_mr **mr)
{
    int ret = fi_mr_reg(domain, buf, LEN, FI_SEND | FI_RECV | FI_READ | FI_WRITE |
                        FI_REMOTE_READ | FI_REMOTE_WRITE, 0, 0, 0, mr, NULL);
    if (ret) {
        fprintf(stderr, "fi_mr_bench: fi_mr_reg: %s\n", fi_strerror(-ret));
    }
    return ret;
}

static void *map(void *at)
{
    void *p = mmap(at, LEN, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | (at ? MAP_FIXED_NOREPLACE : 0), -1, 0);
    if (p == MAP_FAILED || (at && p != at)) {
        fprintf(stderr, "fi_mr_bench: mmap(%p): %s\n", at, strerror(errno));
        exit(1);
    }
    return p;
}

static int child_hit(double ms)
{
    char *buf = map(NULL);
    struct fid_mr *mr;
    memset(buf, 1, LEN);
    if (reg(buf, &mr)) {
        return 1;
    }
    fi_close(&mr->fid);
    enum { BATCH = 200, MAXB = 100000 };
    static double per_op[MAXB];
    size_t nb = 0;
    const unsigned long regs0 = reg_calls();
    const uint64_t end = now_ns() + (uint64_t)(ms * 1e6);
    do {
        const uint64_t t0 = now_ns();
        for (int i = 0; i < BATCH; ++i) {
            if (reg(buf, &mr)) {
                return 1;
            }
            fi_close(&mr->fid);
        }
        per_op[nb++] = (double)(now_ns() - t0) / BATCH;
    } while ((now_ns() < end || nb < 5) && nb < MAXB);
    const double regs = (double)(reg_calls() - regs0) / ((double)nb * BATCH);
    printf("R hit_ns %.1f\nR reg_per_hit %.3f\n", median(per_op, nb), regs);
    munmap(buf, LEN);
    return 0;
}

static int child_stale(int raw, int rounds)
{
    int stale = 0;
    for (int r = 0; r < rounds; ++r) {
        struct fid_mr *mr;
        char *x = map(NULL);
        memset(x, 'a', LEN);
        if (reg(x, &mr)) {
            return 1;
        }
        fi_close(&mr->fid); /* stays in the cache */
        if (raw) {
            syscall(SYS_munmap, x, LEN);
        } else {
            munmap(x, LEN);
        }
        map(x);
        memset(x, 'b', LEN);
        const unsigned long regs0 = reg_calls();
        if (reg(x, &mr)) {
            return 1;
        }
        if (reg_calls() == regs0) {
            ++stale;
        }
        fi_close(&mr->fid);
        munmap(x, LEN);
        usleep(1000);
    }
    printf("R stale_%s %d\nR rounds %d\n", raw ? "raw" : "libc", stale, rounds);
    return 0;
}

static int child(const char *device, double ms, int rounds)
{
    int ret = open_domain(device, 0);
    if (ret) {
        return ret;
    }
    ret = child_hit(ms) || child_stale(0, rounds) || child_stale(1, rounds);
    fi_close(&domain->fid);
    fi_close(&fabric->fid);
    return ret ? 1 : 0;
}

/* ---- parent -------------------------------------------------------------- */

struct result {
    double hit[64], regs[64];
    int    n, stale_libc, stale_raw, rounds;
};

static int run_child(const char *self, const char *mon, const char *device,
                     double ms, int rounds, struct result *res)
{
    char ms_s[32], rounds_s[32];
    int fd[2];
    snprintf(ms_s, sizeof(ms_s), "%g", ms);
    snprintf(rounds_s, sizeof(rounds_s), "%d", rounds);
    if (pipe(fd)) {
        return 1;
    }
    const pid_t pid = fork();
    if (pid < 0) {
        return 1;
    }
    if (pid == 0) {
        dup2(fd[1], 1);
        dup2(fd[1], 2);
        close(fd[0]);
        close(fd[1]);
        setenv("FI_MR_CACHE_MONITOR", mon, 1);
        setenv("FI_LOG_LEVEL", "warn", 1);
        alarm(300); /* a hung child is killed, and reported */
        execl(self, self, "--child", "--device", device, "--ms", ms_s, "--rounds",
              rounds_s, (char *)NULL);
        _exit(127);
    }
    close(fd[1]);
    FILE *f = fdopen(fd[0], "r");
    if (f == NULL) {
        return 1;
    }
    char line[1024];
    double v;
    int got = 0;
    while (fgets(line, sizeof(line), f)) {
        if (sscanf(line, "R hit_ns %lf", &v) == 1) {
            res->hit[res->n] = v;
            got |= 1;
        } else if (sscanf(line, "R reg_per_hit %lf", &v) == 1) {
            res->regs[res->n] = v;
            got |= 2;
        } else if (sscanf(line, "R stale_libc %lf", &v) == 1) {
            res->stale_libc += (int)v;
        } else if (sscanf(line, "R stale_raw %lf", &v) == 1) {
            res->stale_raw += (int)v;
        } else if (sscanf(line, "R rounds %lf", &v) == 1) {
            res->rounds += (int)v;
        } else {
            printf("# [%s] %s", mon, line);
        }
    }
    fclose(f);
    int st = 0;
    waitpid(pid, &st, 0);
    if (got == 3 && res->n < 63) {
        ++res->n;
    }
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
        fprintf(stderr, "fi_mr_bench: child %s exited with status %d\n", mon,
                WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st));
        return 1;
    }
    return 0;
}

int main(int argc, char **argv)
{
    const char *device = getenv("KREG_VM_DEV") ? getenv("KREG_VM_DEV") : "rxe0";
    int reps = 5, rounds = 100, is_child = 0;
    double ms = 200;
    for (int i = 1; i < argc; ++i) {
        if (!strcmp(argv[i], "--child")) {
            is_child = 1;
        } else if (!strcmp(argv[i], "--device") && i + 1 < argc) {
            device = argv[++i];
        } else if (!strcmp(argv[i], "--reps") && i + 1 < argc) {
            reps = atoi(argv[++i]);
        } else if (!strcmp(argv[i], "--ms") && i + 1 < argc) {
            ms = atof(argv[++i]);
        } else if (!strcmp(argv[i], "--rounds") && i + 1 < argc) {
            rounds = atoi(argv[++i]);
        } else {
            fprintf(stderr, "usage: %s [--device DEV] [--reps N] [--ms MS] [--rounds R]\n",
                    argv[0]);
            return 2;
        }
    }
    if (reps < 1 || reps > 60 || rounds < 1 || ms <= 0) {
        fprintf(stderr, "fi_mr_bench: bad --reps, --rounds or --ms\n");
        return 2;
    }
    if (!find_counter()) {
        return 2;
    }
    if (is_child) {
        return child(device, ms, rounds);
    }

    printf("# fi_mr_bench: libfabric %u.%u (runtime), fi_mr_reg + fi_close of a cached "
           "64 KiB buffer; %d runs, %g ms per child; %d stale rounds per child and case\n",
           FI_MAJOR(fi_version()), FI_MINOR(fi_version()), reps, ms, rounds);
    int ret = open_domain(device, 1);
    if (ret) {
        return ret;
    }
    fi_close(&domain->fid);
    fi_close(&fabric->fid);
    fflush(stdout);

    char self[4096];
    const ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
    if (n <= 0) {
        return 1;
    }
    self[n] = 0;
    static struct result res[NMON];
    int rc = 0;
    for (int rep = 0; rep < reps; ++rep) {
        for (int i = 0; i < NMON; ++i) {
            const int m = (i + rep) % NMON;
            rc |= run_child(self, monitors[m], device, ms, rounds, &res[m]);
            fflush(stdout);
        }
    }
    for (int m = 0; m < NMON; ++m) {
        struct result *r = &res[m];
        if (r->n == 0) {
            printf("FI hit_64k.%s n/a\n", monitors[m]);
            rc = 1;
            continue;
        }
        double lo = r->hit[0], hi = r->hit[0];
        for (int i = 1; i < r->n; ++i) {
            lo = r->hit[i] < lo ? r->hit[i] : lo;
            hi = r->hit[i] > hi ? r->hit[i] : hi;
        }
        const double h = median(r->hit, r->n), g = median(r->regs, r->n);
        printf("FI hit_64k.%s %.1f (runs %.1f..%.1f) reg/hit %.3f\n", monitors[m], h, lo,
               hi, g);
        printf("FI stale_libc_munmap.%s %d of %d\n", monitors[m], r->stale_libc, r->rounds);
        printf("FI stale_raw_munmap.%s %d of %d\n", monitors[m], r->stale_raw, r->rounds);
    }
    return rc;
}
