/*
 * Buffers for the component's data tests (ucp_data, mpi_remap, uct_ops; C
 * and C++; reg_cache_test): a byte pattern in which a stale or shifted copy
 * shows, libc's mmap (which UCX's hooks see) and the unmap and remap no hook
 * sees.
 */
#ifndef TEST_REGCACHE_TEST_BUFFERS_H
#define TEST_REGCACHE_TEST_BUFFERS_H

#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <stddef.h>
#include <stdint.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

/* Byte i of message `seed`. */
static inline uint8_t pattern_byte(uint32_t seed, size_t i)
{
    return (uint8_t)(seed * 0x9e3779b1u + i * 131u + (i >> 12) * 7u);
}

static inline void pattern_fill(void *buf, size_t len, uint32_t seed)
{
    uint8_t *p = (uint8_t*)buf;
    for (size_t i = 0; i < len; ++i) {
        p[i] = pattern_byte(seed, i);
    }
}

/* Index of the first byte that differs from the pattern, or len. */
static inline size_t pattern_first_bad(const void *buf, size_t len, uint32_t seed)
{
    const uint8_t *p = (const uint8_t*)buf;
    for (size_t i = 0; i < len; ++i) {
        if (p[i] != pattern_byte(seed, i)) {
            return i;
        }
    }
    return len;
}

/* libc's mmap, which UCX's (and Open MPI's) hooks see. */
static inline void *libc_mmap(size_t len)
{
    return mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                -1, 0);
}

/* Unmaps by the raw syscall, which no hook sees, only the kernel; 1 if done. */
static inline int raw_munmap(void *buf, size_t len)
{
    return syscall(SYS_munmap, buf, len) == 0;
}

/* Unmaps buf by the raw syscall and maps fresh anonymous memory at the same
 * address (MAP_FIXED_NOREPLACE), which no hook sees, only the kernel; 0 if
 * another mapping took the address meanwhile (buf is gone then). */
static inline int raw_remap(void *buf, size_t len)
{
    long r;

    if (!raw_munmap(buf, len)) {
        return 0;
    }
    r = syscall(SYS_mmap, buf, len, PROT_READ | PROT_WRITE,
                MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0L);
    if ((r < 0) && (r > -4096)) {
        return 0;
    }
    if ((void*)r != buf) {
        syscall(SYS_munmap, (void*)r, len); /* a kernel that ignored the flag */
        return 0;
    }
    return 1;
}

#endif
