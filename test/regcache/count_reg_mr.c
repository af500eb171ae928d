/*
 * LD_PRELOAD counter of memory registrations, for comparing registration
 * caches (stock ib, ib_regcache, none) on the same run. At exit it prints
 *   count_reg_mr: pid P: R ibv_reg_mr, D ibv_dereg_mr
 * to stderr. UCX 1.13 reaches ibv_reg_mr through ibv_reg_mr_iova2.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <infiniband/verbs.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

static atomic_ulong reg_count, dereg_count;

/* RTLD_NEXT misses libibverbs when UCX dlopen()s it (stock libuct_ib is a
 * module): then look in the loaded libibverbs itself. */
static void *next_symbol(const char *name, const char *version)
{
    void *sym = dlvsym(RTLD_NEXT, name, version);
    void *lib;

    if (sym == NULL) {
        lib = dlopen("libibverbs.so.1", RTLD_LAZY | RTLD_NOLOAD);
        if (lib != NULL) {
            sym = dlvsym(lib, name, version);
        }
    }
    if (sym == NULL) {
        fprintf(stderr, "count_reg_mr: %s@%s not found\n", name, version);
        abort();
    }
    return sym;
}

__attribute__((visibility("default")))
struct ibv_mr *ibv_reg_mr_iova2(struct ibv_pd *pd, void *addr, size_t length,
                                uint64_t iova, unsigned int access)
{
    static struct ibv_mr *(*next)(struct ibv_pd*, void*, size_t, uint64_t,
                                  unsigned int);

    if (next == NULL) {
        next = next_symbol("ibv_reg_mr_iova2", "IBVERBS_1.8");
    }
    atomic_fetch_add(&reg_count, 1);
    return next(pd, addr, length, iova, access);
}

__attribute__((visibility("default")))
int ibv_dereg_mr(struct ibv_mr *mr)
{
    static int (*next)(struct ibv_mr*);

    if (next == NULL) {
        next = next_symbol("ibv_dereg_mr", "IBVERBS_1.1");
    }
    atomic_fetch_add(&dereg_count, 1);
    return next(mr);
}

/* For a program that counts as it goes (contrib/report/fi_mr_bench finds
 * it with dlsym). */
__attribute__((visibility("default")))
unsigned long count_reg_mr_calls(void)
{
    return atomic_load(&reg_count);
}

static void __attribute__((destructor)) count_reg_mr_report(void)
{
    fprintf(stderr, "count_reg_mr: pid %d: %lu ibv_reg_mr, %lu ibv_dereg_mr\n",
            (int)getpid(), (unsigned long)atomic_load(&reg_count),
            (unsigned long)atomic_load(&dereg_count));
}
