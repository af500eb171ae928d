/*
 * kreg_scenarios: for each way of changing the address space, cache a
 * registration (an io_uring fixed buffer, see uring_rcache.h), change the
 * mapping, put new data at the same address, look it up again and send it
 * with WRITE_FIXED. "ok" if the new bytes come out, "STALE" if the old ones.
 *
 * Every (scenario, thread, source) runs in a fresh child (fork + exec of
 * this program with --one), because UCM hooks and the external event
 * declaration are process-global.
 */
#include "uring_rcache.h"
#include "ucm_kernel/ucm_kernel.h"

#include <liburing.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <dlfcn.h>
#include <fcntl.h>
#include <functional>
#include <malloc.h>
#include <map>
#include <poll.h>
#include <stdexcept>
#include <string>
#include <sys/ipc.h>
#include <sys/mman.h>
#include <sys/shm.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <thread>
#include <unistd.h>
#include <vector>

using namespace kreg_tools;

namespace {

constexpr unsigned char OLD = 0x11;
constexpr unsigned char NEW = 0x22;
constexpr size_t KiB = 1024, MiB = 1024 * KiB;

const char *JEMALLOC_SO = "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2";

/* What a change step hands back: the range to look up, or why it can't. */
struct lookup {
    void *addr = nullptr;
    size_t len = 0;
    std::string skip;
};

lookup skip(const std::string &why)
{
    lookup l;
    l.skip = why;
    return l;
}

lookup fresh(void *addr, size_t len)
{
    memset(addr, NEW, len);
    lookup l;
    l.addr = addr;
    l.len  = len;
    return l;
}

std::string errstr(const char *what)
{
    return std::string(what) + ":" + strerror(errno);
}

void *map_anon(size_t len, void *hint = nullptr, int extra = 0)
{
    void *p = mmap(hint, len, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | extra, -1, 0);
    if (p == MAP_FAILED) {
        throw std::runtime_error(errstr("mmap"));
    }
    return p;
}

/* mmap with a hint, no MAP_FIXED (a MAP_FIXED would tell UCM "unmap"). */
lookup remap_at(void *addr, size_t len)
{
    void *q = map_anon(len, addr);
    if (q != addr) {
        munmap(q, len);
        return skip("mmap hint not honoured");
    }
    return fresh(addr, len);
}

/* Verdict from the bytes the "NIC" saw. */
std::string judge(const std::vector<unsigned char> &got)
{
    size_t n_new = std::count(got.begin(), got.end(), NEW);
    size_t n_old = std::count(got.begin(), got.end(), OLD);
    if (n_new == got.size()) {
        return "ok";
    }
    if (n_old == got.size()) {
        return "STALE";
    }
    return "FAIL:mixed(new=" + std::to_string(n_new) + ",old=" +
           std::to_string(n_old) + ",of=" + std::to_string(got.size()) + ")";
}

struct ctx {
    uring_rcache &rc;
    bool other;
};

/* Run the change in this thread or another one, then look up here. */
lookup run_change(ctx &c, const std::function<lookup()> &change)
{
    if (!c.other) {
        return change();
    }
    lookup l;
    std::string error;
    std::thread t([&] {
        try {
            l = change();
        } catch (const std::exception &e) {
            error = e.what();
        }
    });
    t.join();
    if (!error.empty()) {
        throw std::runtime_error(error);
    }
    return l;
}

std::string first_transfer(ctx &c, void *addr, size_t len)
{
    memset(addr, OLD, len);
    std::vector<unsigned char> got;
    try {
        got = c.rc.transfer(addr, len);
    } catch (const std::exception &e) {
        if (c.rc.last_reg_errno() != 0) {
            return std::string("skip:first registration refused (") +
                   strerror(c.rc.last_reg_errno()) + ")";
        }
        return std::string("FAIL:first transfer: ") + e.what();
    }
    if (judge(got) != "STALE") { /* all OLD is what we want here */
        return "FAIL:first transfer did not see the data";
    }
    c.rc.transfer(addr, len); /* now a hit: the entry is in use */
    return "";
}

/* Cache [addr,len), change, look up what the change returned. */
std::string cached_change(ctx &c, void *addr, size_t len,
                          const std::function<lookup()> &change)
{
    std::string r = first_transfer(c, addr, len);
    if (!r.empty()) {
        return r;
    }
    lookup l = run_change(c, change);
    if (!l.skip.empty()) {
        return "skip:" + l.skip;
    }
    return judge(c.rc.transfer(l.addr, l.len));
}

constexpr size_t N = 256 * KiB;

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

std::string s_madv_remove_shmem(ctx &c)
{
    void *p = mmap(nullptr, N, PROT_READ | PROT_WRITE,
                   MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
        return "FAIL:" + errstr("mmap shared");
    }
    return cached_change(c, p, N, [&] {
        if (madvise(p, N, MADV_REMOVE) != 0) {
            throw std::runtime_error(errstr("madvise(REMOVE)"));
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

std::string s_shmdt(ctx &c)
{
    int id = shmget(IPC_PRIVATE, N, IPC_CREAT | 0600);
    if (id < 0) {
        return "FAIL:" + errstr("shmget");
    }
    void *p = shmat(id, nullptr, 0);
    shmctl(id, IPC_RMID, nullptr);
    if (p == (void*)-1) {
        return "FAIL:" + errstr("shmat");
    }
    return cached_change(c, p, N, [&] {
        shmdt(p);
        int id2 = shmget(IPC_PRIVATE, N, IPC_CREAT | 0600);
        if (id2 < 0) {
            throw std::runtime_error(errstr("shmget"));
        }
        void *q = shmat(id2, p, 0);
        shmctl(id2, IPC_RMID, nullptr);
        if (q != p) {
            return skip("shmat at the old address failed");
        }
        return fresh(p, N);
    });
}

/* shmat(SHM_REMAP) over a cached anonymous mapping. Like shmdt, the kernel
 * unmaps here without telling userfaultfd (ipc/shm.c passes no unmap list),
 * so only an exact check at lookup time can catch it. */
std::string s_shmat_remap(ctx &c)
{
    void *p = map_anon(N);
    return cached_change(c, p, N, [&] {
        int id = shmget(IPC_PRIVATE, N, IPC_CREAT | 0600);
        if (id < 0) {
            throw std::runtime_error(errstr("shmget"));
        }
        void *q = shmat(id, p, SHM_REMAP);
        shmctl(id, IPC_RMID, nullptr);
        if (q != p) {
            return skip("shmat(SHM_REMAP) failed");
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

int tmpfile_fd(size_t len)
{
    /* /var/tmp: a real file system here (ext4), not tmpfs. */
    char name[] = "/var/tmp/kreg-scenXXXXXX";
    int fd = mkstemp(name);
    if (fd < 0) {
        throw std::runtime_error(errstr("mkstemp"));
    }
    unlink(name);
    if (ftruncate(fd, len) != 0) {
        throw std::runtime_error(errstr("ftruncate"));
    }
    return fd;
}

std::string file_scenario(ctx &c, int share)
{
    int fd1 = tmpfile_fd(N), fd2 = tmpfile_fd(N);
    void *p = mmap(nullptr, N, PROT_READ | PROT_WRITE, share, fd1, 0);
    if (p == MAP_FAILED) {
        return "FAIL:" + errstr("mmap file");
    }
    std::string r = cached_change(c, p, N, [&] {
        munmap(p, N);
        void *q = mmap(p, N, PROT_READ | PROT_WRITE, share, fd2, 0);
        if (q == MAP_FAILED) {
            throw std::runtime_error(errstr("mmap file 2"));
        }
        if (q != p) {
            munmap(q, N);
            return skip("mmap hint not honoured");
        }
        return fresh(p, N);
    });
    close(fd1);
    close(fd2);
    return r;
}

/* MAP_PRIVATE file pages: writes make them anonymous copies, which io_uring
 * (like ibv_reg_mr) can pin; the VMA is still file-backed for userfaultfd. */
std::string s_file_private(ctx &c) { return file_scenario(c, MAP_PRIVATE); }

/* MAP_SHARED ext4 pages: io_uring refuses to pin them long-term (EFAULT),
 * as plain ibv_reg_mr without ODP would: reported as skip. */
std::string s_file_shared(ctx &c) { return file_scenario(c, MAP_SHARED); }

/* Cache in the parent, fork, remap and look up in the child. */
std::string s_fork(ctx &c)
{
    void *p = map_anon(N);
    std::string r = first_transfer(c, p, N);
    if (!r.empty()) {
        return r;
    }
    int fds[2];
    if (pipe(fds) != 0) {
        return "FAIL:" + errstr("pipe");
    }
    fflush(stdout);
    pid_t pid = fork();
    if (pid < 0) {
        return "FAIL:" + errstr("fork");
    }
    if (pid == 0) {
        close(fds[0]);
        std::string res;
        try {
            lookup l = run_change(c, [&] {
                munmap(p, N);
                return remap_at(p, N);
            });
            res = l.skip.empty() ? judge(c.rc.transfer(l.addr, l.len)) :
                                   "skip:" + l.skip;
        } catch (const std::exception &e) {
            res = std::string("FAIL:child: ") + e.what();
        }
        if (write(fds[1], res.data(), res.size()) < 0) {
            _exit(2);
        }
        _exit(0);
    }
    close(fds[1]);
    char buf[256];
    std::string res;
    ssize_t n;
    while ((n = read(fds[0], buf, sizeof(buf))) > 0) {
        res.append(buf, n);
    }
    close(fds[0]);
    int wst;
    waitpid(pid, &wst, 0);
    if (res.empty()) {
        return WIFSIGNALED(wst) ?
               "FAIL:child signal " + std::to_string(WTERMSIG(wst)) :
               "FAIL:child gave no result";
    }
    return res;
}

struct scenario {
    const char *name;
    std::string (*run)(ctx &);
    const char *malloc_conf; /* non-null: run with jemalloc preloaded */
    const char *what;
};

const scenario scenarios[] = {
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
};

const scenario *find_scenario(const std::string &name)
{
    for (const auto &s : scenarios) {
        if (name == s.name) {
            return &s;
        }
    }
    return nullptr;
}

/* ---- one case, in this process ---- */
int run_one(const std::string &sname, const std::string &thread,
            const std::string &srcname)
{
    const scenario *s = find_scenario(sname);
    source src;
    if ((s == nullptr) || !source_parse(srcname, &src) ||
        ((thread != "same") && (thread != "other"))) {
        fprintf(stderr, "bad --one arguments\n");
        return 2;
    }
    std::string res;
    try {
        uring_rcache rc(src);
        ctx c{rc, thread == "other"};
        res = s->run(c);
        const auto &k = rc.counters();
        printf("COUNTERS registrations=%lu hits=%lu uncached=%lu "
               "watch_refusals=%lu\n", (unsigned long)k.registrations,
               (unsigned long)k.hits, (unsigned long)k.uncached,
               (unsigned long)k.watch_refusals);
    } catch (const std::exception &e) {
        res = std::string("FAIL:") + e.what();
    }
    for (auto &ch : res) { /* one token per verdict */
        if (ch == ' ') {
            ch = '_';
        }
    }
    printf("RESULT %s\n", res.c_str());
    fflush(stdout);
    return 0;
}

/* ---- the matrix: one child per case ---- */
struct outcome {
    std::string verdict;
    std::string output;
};

outcome run_child(const scenario &s, const char *thread, source src,
                  int timeout_s)
{
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
    if (s.malloc_conf != nullptr) { /* the sanitizer must own malloc */
        return {"skip:jemalloc can't be preloaded under a sanitizer", ""};
    }
#endif
    int fds[2];
    if (pipe2(fds, O_CLOEXEC) != 0) {
        return {"FAIL:pipe", ""};
    }
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        dup2(fds[1], 1);
        dup2(fds[1], 2);
        if (src != source::hooks) {
            setenv("UCX_MEM_MALLOC_HOOKS", "n", 1);
            setenv("UCX_MEM_MMAP_HOOK_MODE", "none", 1);
        }
        if (s.malloc_conf != nullptr) {
            setenv("LD_PRELOAD", JEMALLOC_SO, 1);
            setenv("MALLOC_CONF", s.malloc_conf, 1);
        }
        const char *argv[] = {"kreg_scenarios", "--one", s.name, thread,
                              source_name(src), nullptr};
        execv("/proc/self/exe", (char**)argv);
        _exit(127);
    }
    close(fds[1]);
    if (pid < 0) {
        close(fds[0]);
        return {"FAIL:fork", ""};
    }

    outcome o;
    auto deadline = std::chrono::steady_clock::now() +
                    std::chrono::seconds(timeout_s);
    bool timed_out = false;
    for (;;) {
        auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                deadline - std::chrono::steady_clock::now()).count();
        if (left <= 0) {
            timed_out = true;
            break;
        }
        struct pollfd pfd = {fds[0], POLLIN, 0};
        int r = poll(&pfd, 1, (int)left);
        if (r < 0 && errno == EINTR) {
            continue;
        }
        if (r == 0) {
            timed_out = true;
            break;
        }
        char buf[4096];
        ssize_t n = read(fds[0], buf, sizeof(buf));
        if (n <= 0) {
            break;
        }
        o.output.append(buf, n);
    }
    close(fds[0]);
    if (timed_out) {
        kill(pid, SIGKILL);
    }
    int wst = 0;
    waitpid(pid, &wst, 0);

    auto pos = o.output.rfind("RESULT ");
    if (timed_out) {
        o.verdict = "FAIL:timeout";
    } else if (pos != std::string::npos) {
        auto end  = o.output.find('\n', pos);
        o.verdict = o.output.substr(pos + 7, end == std::string::npos ?
                                             std::string::npos : end - pos - 7);
    } else if (WIFSIGNALED(wst)) {
        o.verdict = "FAIL:signal" + std::to_string(WTERMSIG(wst));
    } else {
        o.verdict = "FAIL:no-result(exit" + std::to_string(WEXITSTATUS(wst)) +
                    ")";
    }
    return o;
}

void usage(FILE *f)
{
    fprintf(f,
            "usage: kreg_scenarios [--source hooks|kernel|none|all] "
            "[--scenario NAME] [--thread same|other] [--mode verify|plain]\n"
            "                      [--timeout SEC] [--verbose] [--list]\n"
            "       kreg_scenarios --one SCENARIO same|other SOURCE\n"
            "Prints '<scenario> <thread> <source> <ok|STALE|skip:why|FAIL:what>'"
            " per case, then a summary.\n"
            "Exits 1 if the kernel source has a STALE or FAIL, or if the 'none'"
            " control shows no STALE.\n");
}

} // namespace

int main(int argc, char **argv)
{
    std::vector<source> sources = {source::hooks, source::kernel,
                                   source::none};
    std::vector<std::string> threads = {"same", "other"};
    std::string only_scenario;
    int timeout_s = 30;
    bool verbose  = false;

    for (int i = 1; i < argc; ++i) {
        std::string a = argv[i];
        auto next = [&]() -> std::string {
            if (i + 1 >= argc) {
                usage(stderr);
                exit(2);
            }
            return argv[++i];
        };
        if (a == "--one" && i + 3 < argc) {
            return run_one(argv[i + 1], argv[i + 2], argv[i + 3]);
        } else if (a == "--source") {
            std::string v = next();
            source s;
            if (v == "all") {
                sources = {source::hooks, source::kernel, source::none};
            } else if (source_parse(v, &s)) {
                sources = {s};
            } else {
                usage(stderr);
                return 2;
            }
        } else if (a == "--scenario") {
            only_scenario = next();
            if (find_scenario(only_scenario) == nullptr) {
                fprintf(stderr, "unknown scenario '%s' (see --list)\n",
                        only_scenario.c_str());
                return 2;
            }
        } else if (a == "--thread") {
            std::string v = next();
            if (v != "same" && v != "other") {
                usage(stderr);
                return 2;
            }
            threads = {v};
        } else if (a == "--mode") {
            setenv("UCX_KREG_MODE", next().c_str(), 1);
        } else if (a == "--timeout") {
            timeout_s = std::max(1, atoi(next().c_str()));
        } else if (a == "--verbose" || a == "-v") {
            verbose = true;
        } else if (a == "--list") {
            for (const auto &s : scenarios) {
                printf("%-18s %s\n", s.name, s.what);
            }
            return 0;
        } else if (a == "--help" || a == "-h") {
            usage(stdout);
            return 0;
        } else {
            usage(stderr);
            return 2;
        }
    }

    const char *mode = getenv("UCX_KREG_MODE");
    printf("# kreg_scenarios: UCX_KREG_MODE=%s; hooks children keep the UCX_MEM_*"
           " environment, kernel/none children run with UCX_MEM_MALLOC_HOOKS=n"
           " UCX_MEM_MMAP_HOOK_MODE=none\n", mode ? mode : "(default)");

    std::map<std::string, std::map<std::string, int>> tally; /* src->kind */
    std::vector<std::string> hooks_stale;
    bool kernel_bad = false;
    for (const auto &s : scenarios) {
        if (!only_scenario.empty() && only_scenario != s.name) {
            continue;
        }
        for (const auto &t : threads) {
            for (source src : sources) {
                outcome o = run_child(s, t.c_str(), src, timeout_s);
                printf("%s %s %s %s\n", s.name, t.c_str(), source_name(src),
                       o.verdict.c_str());
                bool bad = o.verdict.rfind("FAIL", 0) == 0;
                if (verbose || bad) {
                    std::string out = o.output;
                    size_t p = 0;
                    while (p < out.size()) { /* indent the child's output */
                        size_t e = out.find('\n', p);
                        printf("    | %s\n", out.substr(p, e - p).c_str());
                        if (e == std::string::npos) {
                            break;
                        }
                        p = e + 1;
                    }
                }
                fflush(stdout);
                std::string kind = o.verdict.substr(0, o.verdict.find(':'));
                ++tally[source_name(src)][kind];
                if (src == source::kernel &&
                    (kind == "STALE" || kind == "FAIL")) {
                    kernel_bad = true;
                }
                if (src == source::hooks && kind == "STALE") {
                    hooks_stale.push_back(std::string(s.name) + "/" + t);
                }
            }
        }
    }

    printf("# summary:");
    for (source src : sources) {
        auto &k = tally[source_name(src)];
        printf("  %s ok=%d STALE=%d skip=%d FAIL=%d;", source_name(src),
               k["ok"], k["STALE"], k["skip"], k["FAIL"]);
    }
    printf("\n");
    if (!hooks_stale.empty()) {
        printf("# STALE under UCX's hooks:");
        for (const auto &h : hooks_stale) {
            printf(" %s", h.c_str());
        }
        printf("\n");
    }
    int rc = 0;
    if (kernel_bad) {
        printf("# ERROR: the kernel source has STALE or FAIL cases\n");
        rc = 1;
    }
    bool ran_none = std::find(sources.begin(), sources.end(), source::none) !=
                    sources.end();
    if (ran_none && tally["none"]["STALE"] == 0 && only_scenario.empty()) {
        printf("# ERROR: the 'none' control showed no STALE: the oracle "
               "cannot fail\n");
        rc = 1;
    }
    return rc;
}
