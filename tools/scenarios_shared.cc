/* The scenario table's rows over shared memory: SysV segments, shmem
 * and file mappings (see scenarios.cc for the table and the other rows). */
#include "scenario_rows.h"

#include <cerrno>
#include <cstdlib>
#include <fcntl.h>
#include <stdexcept>
#include <sys/ipc.h>
#include <sys/mman.h>
#include <sys/shm.h>
#include <unistd.h>

namespace kreg_tools {

static constexpr size_t N = kRowLen;

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

static int tmpfile_fd(size_t len)
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

static std::string file_scenario(ctx &c, int share)
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

/* The pages of a shared mapping change under it without any unmap. */
static std::string shmem_scenario(ctx &c, bool punch)
{
    int fd = memfd_create("kreg-scenario", MFD_CLOEXEC);
    if ((fd < 0) || (ftruncate(fd, N) != 0)) {
        return "FAIL:" + errstr("memfd");
    }
    void *p = mmap(nullptr, N, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
        close(fd);
        return "FAIL:" + errstr("mmap memfd");
    }
    std::string r = cached_change(c, p, N, [&] {
        const int rc = punch ? fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
                                         0, N) :
                               (ftruncate(fd, 0) || ftruncate(fd, N));
        if (rc != 0) {
            throw std::runtime_error(errstr(punch ? "fallocate" : "ftruncate"));
        }
        return fresh(p, N);
    });
    munmap(p, N);
    close(fd);
    return r;
}

std::string s_shmem_punch_hole(ctx &c) { return shmem_scenario(c, true); }
std::string s_shmem_truncate(ctx &c) { return shmem_scenario(c, false); }


} // namespace kreg_tools
