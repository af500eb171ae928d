/* The rows of the scenario table. Each caches a buffer, changes the
 * mapping (in this thread or another, ctx.other), puts new bytes where it
 * was and returns the oracle's verdict (scenario_oracle.h).
 *
 * Over 350 lines: the table in display order and the rows over
 * private memory (short functions, one per row); the shared-memory rows
 * are in scenarios_shared.cc.
 */
#include "scenarios.h"
#include "scenario_rows.h"

#include "child_process.h"

#include <liburing.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <dlfcn.h>
#include <fcntl.h>
#include <malloc.h>
#include <stdexcept>
#include <sys/ipc.h>
#include <sys/mman.h>
#include <sys/shm.h>
#include <sys/syscall.h>
#include <thread>
#include <unistd.h>

#ifndef MREMAP_DONTUNMAP
#define MREMAP_DONTUNMAP 4
#endif

namespace kreg_tools {
namespace {

constexpr size_t N = kRowLen;

std::string s_munmap(ctx &c)
{
    void *p = map_anon(N);
    return cached_change(c, p, N, [&] {
        munmap(p, N);
        return remap_at(p, N);
    });
}

std::string s_mmap_fixed(ctx &c)
{
    void *p = map_anon(N);
    return cached_change(c, p, N, [&] {
        map_anon(N, p, MAP_FIXED);
        return fresh(p, N);
    });
}

/* Grow a mapping that cannot grow in place, so the kernel moves it. */
std::string s_mremap_move(ctx &c)
{
    long page = sysconf(_SC_PAGESIZE);
    char *p   = (char*)map_anon(N + page);
    mprotect(p + N, page, PROT_NONE); /* a neighbour VMA blocks the growth */
    return cached_change(c, p, N, [&] {
        void *q = mremap(p, N, 2 * N, MREMAP_MAYMOVE);
        if (q == MAP_FAILED) {
            throw std::runtime_error(errstr("mremap"));
        }
        if (q == p) {
            return skip("mremap grew in place");
        }
        return remap_at(p, N);
    });
}

/* UCX 1.13's mremap hook takes 4 arguments, so MREMAP_FIXED's new_address
 * is lost under the hooks (seen here: ENOMEM, or a move elsewhere). */
std::string s_mremap_fixed(ctx &c)
{
    void *p      = map_anon(N);
    void *target = map_anon(N);
    return cached_change(c, p, N, [&] {
        void *q = mremap(p, N, N, MREMAP_MAYMOVE | MREMAP_FIXED, target);
        if (q != target) {
            throw std::runtime_error(q == MAP_FAILED ?
                                     errstr("mremap(MREMAP_FIXED)") :
                                     "mremap(MREMAP_FIXED) moved elsewhere");
        }
        return remap_at(p, N);
    });
}

std::string s_mremap_shrink(ctx &c)
{
    char *p = (char*)map_anon(2 * N);
    return cached_change(c, p, 2 * N, [&] {
        if (mremap(p, 2 * N, N, 0) != p) {
            throw std::runtime_error(errstr("mremap"));
        }
        return remap_at(p + N, N);
    });
}

std::string s_madv_dontneed(ctx &c)
{
    void *p = map_anon(N);
    return cached_change(c, p, N, [&] {
        if (madvise(p, N, MADV_DONTNEED) != 0) {
            throw std::runtime_error(errstr("madvise"));
        }
        return fresh(p, N);
    });
}

std::string s_brk(ctx &c)
{
    /* Give malloc's heap a large slack first, so that nothing else moves
     * the break while the scenario owns its top. */
    mallopt(M_TOP_PAD, 64 * MiB);
    free(malloc(64 * KiB));
    long page = sysconf(_SC_PAGESIZE);
    auto cur  = (uintptr_t)sbrk(0);
    sbrk(((cur + page - 1) & ~(uintptr_t)(page - 1)) - cur);
    char *p = (char*)sbrk(N);
    if (p == (char*)-1) {
        return "FAIL:" + errstr("sbrk");
    }
    return cached_change(c, p, N, [&] {
        if ((char*)sbrk(0) != p + N) {
            return skip("the break moved during the scenario");
        }
        sbrk(-(intptr_t)N);
        char *q = (char*)sbrk(N);
        if (q != p) {
            return skip("sbrk up gave another address");
        }
        return fresh(p, N);
    });
}

std::string s_raw_munmap(ctx &c)
{
    void *p = map_anon(N);
    return cached_change(c, p, N, [&] {
        syscall(SYS_munmap, p, N);
        return remap_at(p, N);
    });
}

std::string s_raw_madvise(ctx &c)
{
    void *p = map_anon(N);
    return cached_change(c, p, N, [&] {
        if (syscall(SYS_madvise, p, N, MADV_DONTNEED) != 0) {
            throw std::runtime_error(errstr("madvise syscall"));
        }
        return fresh(p, N);
    });
}

std::string s_uring_madvise(ctx &c)
{
    void *p = map_anon(N);
    return cached_change(c, p, N, [&] {
        struct io_uring ring;
        int ret = io_uring_queue_init(2, &ring, 0);
        if (ret < 0) {
            return skip(std::string("io_uring_queue_init: ") + strerror(-ret));
        }
        io_uring_prep_madvise(io_uring_get_sqe(&ring), p, N, MADV_DONTNEED);
        io_uring_submit(&ring);
        struct io_uring_cqe *cqe;
        io_uring_wait_cqe(&ring, &cqe);
        int res = cqe->res;
        io_uring_cqe_seen(&ring, cqe);
        io_uring_queue_exit(&ring);
        if (res < 0) {
            return skip(std::string("IORING_OP_MADVISE: ") + strerror(-res));
        }
        return fresh(p, N);
    });
}

/* free() a large chunk, allocate it again at the same address. */
std::string free_malloc(ctx &c, size_t len, bool page_aligned)
{
    auto alloc = [=] {
        return page_aligned ? aligned_alloc(sysconf(_SC_PAGESIZE), len) :
                              malloc(len);
    };
    void *p = alloc();
    if (p == nullptr) {
        return "FAIL:malloc";
    }
    return cached_change(c, p, len, [&] {
        /* A thread's first large malloc/free sets up allocator state
         * (jemalloc: a 32 KiB mmap) that would take the hole the free
         * leaves: do one first. */
        free(malloc(64));
        free(alloc());
        free(p);
        void *q = alloc();
        if (q != p) {
            free(q);
            return skip("malloc gave another address");
        }
        return fresh(p, len);
    });
}

std::string s_glibc_free(ctx &c)
{
    if (dlsym(RTLD_DEFAULT, "mallctl") != nullptr) {
        return "skip:jemalloc is preloaded";
    }
    /* A fixed threshold: glibc's dynamic one would put the second malloc on
     * the heap after the first free. */
    mallopt(M_MMAP_THRESHOLD, 1 * MiB);
    return free_malloc(c, 2 * MiB, false);
}

std::string s_jemalloc(ctx &c)
{
    if (dlsym(RTLD_DEFAULT, "mallctl") == nullptr) {
        return "FAIL:jemalloc not loaded";
    }
    /* jemalloc starts every large malloc() at a random cache line of its
     * first page (cache-oblivious; no runtime tunable), so a plain malloc
     * never returns the same pointer twice: page alignment turns it off. */
    return free_malloc(c, 4 * MiB, true);
}

/* Runs fn in a forked child; its verdict, or what went wrong. */
std::string in_child(const std::function<std::string()> &fn)
{
    child_result r = run_child([&] {
        std::string res;
        try {
            res = fn();
        } catch (const std::exception &e) {
            res = std::string("FAIL:child: ") + e.what();
        }
        printf("VERDICT %s\n", res.c_str());
        return 0;
    }, 60, false);
    const size_t pos = r.output.rfind("VERDICT ");
    if (pos == std::string::npos) {
        return r.timed_out() ? std::string("FAIL:child timed out") :
                               "FAIL:child gave no verdict (status " +
                                       std::to_string(r.status) + ")";
    }
    return r.output.substr(pos + 8, r.output.find('\n', pos) - pos - 8);
}

/* Cache in the parent, fork, remap and look up in the child. */
std::string s_fork(ctx &c)
{
    void *p = map_anon(N);
    std::string r = first_transfer(c, p, N);
    if (!r.empty()) {
        return r;
    }
    return in_child([&] {
        lookup l = run_change(c, [&] {
            munmap(p, N);
            return remap_at(p, N);
        });
        return l.skip.empty() ? judge(c.rc.transfer(l.addr, l.len)) : "skip:" + l.skip;
    });
}

/* After a fork the child's first call is a new cache's kreg_start() (a new
 * UCP context in the child). */
std::string s_fork_then_start(ctx &c)
{
    return in_child([&] {
        uring_rcache rc(c.rc.src());
        ctx cc{rc, c.other};
        void *p = map_anon(N);
        return cached_change(cc, p, N, [&] {
            syscall(SYS_munmap, p, N);
            return remap_at(p, N);
        });
    });
}

/* glibc 2.36's mremap() wrapper mishandles MREMAP_DONTUNMAP: the raw
 * syscall. The old range stays mapped, on new pages. */
std::string s_dontunmap(ctx &c)
{
    void *p = map_anon(N);
    return cached_change(c, p, N, [&] {
        void *q = reinterpret_cast<void *>(syscall(SYS_mremap, p, N, N,
                                                   MREMAP_MAYMOVE | MREMAP_DONTUNMAP, 0));
        if (q == MAP_FAILED) {
            return skip(errstr("mremap(MREMAP_DONTUNMAP)"));
        }
        munmap(q, N);
        return fresh(p, N);
    });
}

/* The tail of a cached range is unmapped and the head grows over it in
 * place: the grown part inherits the head's userfaultfd watch. */
std::string s_grow_in_place(ctx &c)
{
    char *p = static_cast<char *>(map_anon(2 * N));
    return cached_change(c, p, 2 * N, [&] {
        syscall(SYS_munmap, p + N, N);
        if (reinterpret_cast<void *>(syscall(SYS_mremap, p, N, 2 * N, 0)) != p) {
            return skip("could not grow in place");
        }
        return fresh(p, 2 * N);
    });
}

/* Two caches on one range: after a mapping replaces part of it, the
 * second cache's lookup merges and registers the new mapping again, and
 * the first cache's entry must still not pass. */
std::string s_two_rcaches(ctx &c)
{
    uring_rcache second(c.rc.src());
    char *p = static_cast<char *>(map_anon(2 * N));
    memset(p, OLD, 2 * N);
    second.transfer(p, 2 * N);
    return cached_change(c, p, N, [&] {
        map_anon(N, p, MAP_FIXED);
        lookup l = fresh(p, N);
        second.transfer(p, 2 * N);
        return l;
    });
}

/* exit() while threads watch, transfer and unmap: no crash in static
 * destructors, whatever their order. */
std::string s_exit_live_threads(ctx &c)
{
    const source src = c.rc.src();
    child_result r = run_child([src] {
        for (int t = 0; t < 3; ++t) {
            std::thread([src] {
                uring_rcache rc(src);
                for (;;) {
                    void *p = map_anon(N);
                    memset(p, OLD, N);
                    rc.transfer(p, N);
                    syscall(SYS_munmap, p, N);
                }
            }).detach();
        }
        usleep(50 * 1000);
        exit(0);
        return 0;
    }, 30);
    if (r.status != 0) {
        fputs(r.output.c_str(), stdout); /* shown under the FAIL line */
    }
    return (r.status == 0) ? std::string("ok") :
           r.timed_out()   ? std::string("FAIL:exit hung") :
                             "FAIL:exit status " + std::to_string(r.status);
}


const scenario kScenarios[] = {
    {"munmap", s_munmap, nullptr, "munmap, then mmap at the same address"},
    {"mmap_fixed", s_mmap_fixed, nullptr, "mmap(MAP_FIXED) over the range"},
    {"mremap_move", s_mremap_move, nullptr,
     "mremap grow that must move, new mapping at the old address"},
    {"mremap_fixed", s_mremap_fixed, nullptr,
     "mremap(MREMAP_FIXED) move, new mapping at the old address"},
    {"mremap_shrink", s_mremap_shrink, nullptr,
     "mremap shrink, new mapping at the freed tail, look up the tail"},
    {"madv_dontneed", s_madv_dontneed, nullptr, "madvise(MADV_DONTNEED)"},
    {"madv_remove_shmem", s_madv_remove_shmem, nullptr,
     "madvise(MADV_REMOVE) on MAP_SHARED|MAP_ANONYMOUS"},
    {"brk", s_brk, nullptr, "sbrk down then up"},
    {"shmdt", s_shmdt, nullptr, "shmdt, then shmat at the same address"},
    {"shmat_remap", s_shmat_remap, nullptr,
     "shmat(SHM_REMAP) over an anonymous mapping"},
    {"raw_munmap", s_raw_munmap, nullptr,
     "syscall(SYS_munmap), then mmap with a hint"},
    {"raw_madvise", s_raw_madvise, nullptr, "syscall(SYS_madvise, DONTNEED)"},
    {"uring_madvise", s_uring_madvise, nullptr,
     "io_uring IORING_OP_MADVISE(DONTNEED)"},
    {"glibc_free", s_glibc_free, nullptr,
     "glibc free of a 2 MiB mmap'd chunk, malloc at the same address"},
    /* jemalloc keeps freed extents (same pages, no remap) unless told to
     * purge at once; one arena so another thread gets the same extent. */
    {"jemalloc_purge", s_jemalloc, "dirty_decay_ms:0,muzzy_decay_ms:0,narenas:1",
     "jemalloc free + aligned_alloc of 4 MiB, purged at once (madvise)"},
    {"jemalloc_unmap", s_jemalloc,
     "retain:false,dirty_decay_ms:0,muzzy_decay_ms:0,narenas:1",
     "jemalloc free + aligned_alloc of 4 MiB, unmapped (retain:false)"},
    {"file_private", s_file_private, nullptr,
     "MAP_PRIVATE ext4 tmpfile, remapped with another file"},
    {"file_shared", s_file_shared, nullptr,
     "MAP_SHARED ext4 tmpfile, remapped with another file"},
    {"fork", s_fork, nullptr, "fork; the child remaps and looks up"},
    {"fork_then_start", s_fork_then_start, nullptr,
     "fork; the child's first call is a new cache's kreg_start"},
    {"dontunmap", s_dontunmap, nullptr,
     "mremap(MREMAP_DONTUNMAP): the old range stays, on new pages"},
    {"shmem_punch_hole", s_shmem_punch_hole, nullptr,
     "memfd MAP_SHARED, fallocate(PUNCH_HOLE) under the registration"},
    {"shmem_truncate", s_shmem_truncate, nullptr,
     "memfd MAP_SHARED, ftruncate(0) then back under the registration"},
    {"grow_in_place", s_grow_in_place, nullptr,
     "unmap the tail, mremap the head over it in place"},
    {"two_rcaches", s_two_rcaches, nullptr,
     "MAP_FIXED over part of a range two caches hold; the other re-registers"},
    {"exit_live_threads", s_exit_live_threads, nullptr,
     "exit() while threads register, send and unmap", true},
};

} // namespace

std::vector<const scenario *> scenarios()
{
    std::vector<const scenario *> out;
    for (const auto &s : kScenarios) {
        out.push_back(&s);
    }
    return out;
}

const scenario *find_scenario(const std::string &name)
{
    for (const auto &s : kScenarios) {
        if (name == s.name) {
            return &s;
        }
    }
    return nullptr;
}
} // namespace kreg_tools
