/*
 * LD_PRELOAD counter of memory registrations, for comparing registration
 * caches (stock ib, ib_regcache, none) on the same run. At exit it prints
 *   count_reg_mr: pid P: R ibv_reg_mr, D ibv_dereg_mr, U uct_md_mem_reg
 * to stderr. UCX 1.13 reaches ibv_reg_mr through ibv_reg_mr_iova2.
 * U counts UCP's registration requests to UCT's mds (uct_md_mem_reg, since
 * UCX 1.15 uct_md_mem_reg_v2): what reaches an md's own cache. A cache of
 * UCP's above an md keeps U far below the number of zero-copy sends of one
 * buffer (the VM suite's regcache-ucp-rcache check reads it).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <infiniband/verbs.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

static atomic_ulong reg_count, dereg_count, uct_reg_count;

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

/* UCP -> UCT (libucp calls libuct through its PLT): the next definition is
 * libuct's. Declared with opaque types: the same file builds against every
 * UCX; UCX 1.13's libuct has no _v2, 1.22's UCP calls only _v2. */
static void *next_uct_symbol(const char *name)
{
    void *sym = dlsym(RTLD_NEXT, name);

    if (sym == NULL) {
        fprintf(stderr, "count_reg_mr: %s not found\n", name);
        abort();
    }
    return sym;
}

__attribute__((visibility("default")))
int uct_md_mem_reg(void *md, void *address, size_t length, unsigned flags,
                   void **memh_p)
{
    static int (*next)(void*, void*, size_t, unsigned, void**);

    if (next == NULL) {
        next = next_uct_symbol("uct_md_mem_reg");
    }
    atomic_fetch_add(&uct_reg_count, 1);
    return next(md, address, length, flags, memh_p);
}

__attribute__((visibility("default")))
int uct_md_mem_reg_v2(void *md, void *address, size_t length,
                      const void *params, void **memh_p)
{
    static int (*next)(void*, void*, size_t, const void*, void**);

    if (next == NULL) {
        next = next_uct_symbol("uct_md_mem_reg_v2");
    }
    atomic_fetch_add(&uct_reg_count, 1);
    return next(md, address, length, params, memh_p);
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
    fprintf(stderr, "count_reg_mr: pid %d: %lu ibv_reg_mr, %lu ibv_dereg_mr, "
            "%lu uct_md_mem_reg\n", (int)getpid(),
            (unsigned long)atomic_load(&reg_count),
            (unsigned long)atomic_load(&dereg_count),
            (unsigned long)atomic_load(&uct_reg_count));
}
