/* The io_uring-pinned rcache of the scenario table and the tests (see
 * uring_rcache.h). Just over 350 lines: one class. */
#include "uring_rcache.h"
#include "rcache_params.h"

#include "ucm_kernel/ucm_kernel.h"

extern "C" {
#include <ucs/memory/rcache.h> /* has no C linkage block of its own */
}
#include <ucm/api/ucm.h>

#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <stdexcept>
#include <sys/mman.h>
#include <unistd.h>

namespace kreg_tools {

const char *source_name(source s)
{
    switch (s) {
    case source::hooks:  return "hooks";
    case source::kernel: return "kernel";
    case source::none:   return "none";
    }
    return "?";
}

bool source_parse(const std::string &name, source *s)
{
    for (source c : {source::hooks, source::kernel, source::none}) {
        if (name == source_name(c)) {
            *s = c;
            return true;
        }
    }
    return false;
}

static std::runtime_error sys_error(const std::string &what, int err)
{
    return std::runtime_error(what + ": " + strerror(err));
}

struct uring_rcache::region {
    ucs_rcache_region_t super; /* must be first: rcache allocates us */
    kreg_watch_t        watch; /* source::kernel only */
    int                 slot;
};

/* The rcache ops reach the private members through this friend. */
struct uring_rcache_ops {
    /* what kreg_register_watched pins and unpins */
    struct pin {
        uring_rcache *self;
        uring_rcache::region *r;
        static ucs_status_t reg(void *arg, void *start, size_t len)
        {
            auto *p    = static_cast<pin*>(arg);
            p->r->slot = p->self->buf_register(start, len);
            return (p->r->slot < 0) ? UCS_ERR_IO_ERROR : UCS_OK;
        }
        static void dereg(void *arg)
        {
            auto *p = static_cast<pin*>(arg);
            p->self->buf_unregister(p->r->slot);
            p->r->slot = -1;
        }
    };

    static ucs_status_t mem_reg(void *ctx, ucs_rcache_t *, void *,
                                ucs_rcache_region_t *rregion, uint16_t)
    {
        auto *self   = static_cast<uring_rcache*>(ctx);
        auto *region = reinterpret_cast<uring_rcache::region*>(rregion);
        void *start  = (void*)region->super.super.start;
        size_t len   = region->super.super.end - region->super.super.start;
        pin p{self, region};

        region->slot = -1;
        if (self->m_src != source::kernel) {
            /* hooks and none: what UCX's md does, nothing of ours */
            static const uint64_t always = 1;
            region->watch          = kreg_watch_t{};
            region->watch.counter  = &always;
            region->watch.snapshot = always;
            ucs_status_t st        = pin::reg(&p, start, len);
            self->m_counters.registrations += (st == UCS_OK);
            return st;
        }
        /* Watch before pinning: a remap between the two is then seen. */
        kreg_reason_t reason = KREG_REASON_NONE;
        ucs_status_t st = kreg_register_watched(start, len, &region->watch,
                                                pin::reg, pin::dereg, &p, &reason);
        if (st == UCS_ERR_REJECTED) {
            ++self->m_counters.watch_refusals;
            self->m_last_refusal = reason;
            /* Not cached; transfer() registers uncached instead. */
        } else if (st == UCS_OK) {
            ++self->m_counters.registrations;
        }
        return st;
    }

    static void mem_dereg(void *ctx, ucs_rcache_t *, ucs_rcache_region_t *rregion)
    {
        auto *self   = static_cast<uring_rcache*>(ctx);
        auto *region = reinterpret_cast<uring_rcache::region*>(rregion);
        if (region->slot >= 0) {
            self->buf_unregister(region->slot);
            ++self->m_counters.deregistrations;
            region->slot = -1;
        }
        if (self->m_src == source::kernel) {
            kreg_unwatch(&region->watch);
        }
    }

    static void dump_region(void *, ucs_rcache_t *, ucs_rcache_region_t *rregion,
                            char *buf, size_t max)
    {
        auto *region = reinterpret_cast<uring_rcache::region*>(rregion);
        snprintf(buf, max, "slot %d watch slot %u", region->slot,
                 region->watch.slot);
    }
};

static const ucs_rcache_ops_t rcache_ops = kreg_tools::watched_rcache_ops(
        uring_rcache_ops::mem_reg, uring_rcache_ops::mem_dereg,
        uring_rcache_ops::dump_region);

static bool kernel_source_running();

uring_rcache::uring_rcache(source src, unsigned slots) : m_src(src)
{
    int ret = io_uring_queue_init(8, &m_ring, 0);
    if (ret < 0) {
        throw sys_error("io_uring_queue_init", -ret);
    }
    m_ring_ok = true;
    /* One sparse table, a slot per region: regions come and go one by one. */
    ret = io_uring_register_buffers_sparse(&m_ring, slots);
    if (ret < 0) {
        throw sys_error("io_uring_register_buffers_sparse", -ret);
    }
    for (int i = (int)slots - 1; i >= 0; --i) {
        m_free_slots.push_back(i);
    }

    if (pipe2(m_pipe, O_CLOEXEC) < 0) {
        throw sys_error("pipe2", errno);
    }
    /* A bigger pipe means fewer round trips; 1 MiB is the unprivileged cap. */
    fcntl(m_pipe[1], F_SETPIPE_SZ, 1 << 20);
    int psz = fcntl(m_pipe[1], F_GETPIPE_SZ);
    m_pipe_size = psz > 0 ? (size_t)psz : 4096;

    if (src != source::hooks) {
        /* Before ucs_rcache_create: the external declaration is what keeps
         * UCM from installing its hooks for this rcache. */
        m_kreg_started = true;
        ucs_status_t st = kreg_start();
        if ((st != UCS_OK) && (src == source::none)) {
            throw std::runtime_error(std::string("kreg_start: ") +
                                     ucs_status_string(st));
        }
        /* kernel: a failed start leaves every kreg_watch() at 0, so every
         * transfer goes uncached: slow but correct. */
    }

    const ucs_rcache_params_t params =
            kreg_tools::watched_rcache_params(sizeof(region), &rcache_ops, this);
    ucs_status_t st = ucs_rcache_create(&params, "kreg_uring", nullptr,
                                        &m_rcache);
    if ((st != UCS_OK) && (src == source::kernel) && !kernel_source_running()) {
        /* kreg_start() failed, so nothing declared the event external and
         * (hooks off) UCM can't deliver it: run without a cache, as UCX's
         * md does when it can't create its rcache. Slow, never stale. */
        m_rcache = nullptr;
        return;
    }
    if (st != UCS_OK) {
        m_rcache = nullptr;
        throw std::runtime_error(std::string("ucs_rcache_create: ") +
                                 ucs_status_string(st));
    }
}

static bool kernel_source_running()
{
    kreg_caps_t caps;
    kreg_query(&caps);
    return caps.running;
}

uring_rcache::~uring_rcache()
{
    if (m_rcache != nullptr) {
        ucs_rcache_destroy(m_rcache); /* deregisters (and unwatches) all */
    }
    if (m_kreg_started) {
        kreg_stop();
    }
    if (m_ring_ok) {
        io_uring_queue_exit(&m_ring);
    }
    for (int fd : m_pipe) {
        if (fd >= 0) {
            close(fd);
        }
    }
}

int uring_rcache::slot_get()
{
    if (m_free_slots.empty()) {
        return -ENOSPC;
    }
    int slot = m_free_slots.back();
    m_free_slots.pop_back();
    return slot;
}

void uring_rcache::slot_put(int slot)
{
    m_free_slots.push_back(slot);
}

int uring_rcache::buf_register(void *start, size_t len)
{
    m_last_reg_errno = 0; /* the errno of the last registration only */
    int slot = slot_get();
    if (slot < 0) {
        return slot;
    }
    struct iovec iov = {start, len};
    __u64 tag        = 0;
    int ret = io_uring_register_buffers_update_tag(&m_ring, slot, &iov, &tag, 1);
    if (ret != 1) {
        slot_put(slot);
        m_last_reg_errno = ret < 0 ? -ret : EIO;
        return -m_last_reg_errno;
    }
    return slot;
}

void uring_rcache::buf_unregister(int slot)
{
    /* An empty iovec with tag 0 clears the slot; the kernel unpins the pages
     * once no request uses them. */
    struct iovec iov = {nullptr, 0};
    __u64 tag        = 0;
    io_uring_register_buffers_update_tag(&m_ring, slot, &iov, &tag, 1);
    slot_put(slot);
}

void uring_rcache::write_fixed(int slot, const void *addr, size_t len,
                               std::vector<unsigned char> &out)
{
    out.resize(len);
    size_t done = 0;
    while (done < len) {
        size_t n = std::min(len - done, m_pipe_size);
        struct io_uring_sqe *sqe = io_uring_get_sqe(&m_ring);
        if (sqe == nullptr) {
            throw std::runtime_error("io_uring_get_sqe: ring full");
        }
        io_uring_prep_write_fixed(sqe, m_pipe[1], (const char*)addr + done, n,
                                  0, slot);
        int ret = io_uring_submit_and_wait(&m_ring, 1);
        if (ret < 0) {
            throw sys_error("io_uring_submit_and_wait", -ret);
        }
        struct io_uring_cqe *cqe;
        ret = io_uring_wait_cqe(&m_ring, &cqe);
        if (ret < 0) {
            throw sys_error("io_uring_wait_cqe", -ret);
        }
        int res = cqe->res;
        io_uring_cqe_seen(&m_ring, cqe);
        if (res <= 0) {
            throw sys_error("WRITE_FIXED", res < 0 ? -res : EIO);
        }
        for (size_t got = 0; got < (size_t)res;) {
            ssize_t r = read(m_pipe[0], out.data() + done + got, res - got);
            if (r < 0 && errno == EINTR) {
                continue;
            }
            if (r <= 0) {
                throw sys_error("read pipe", r < 0 ? errno : EIO);
            }
            got += r;
        }
        done += res;
    }
}

std::vector<unsigned char> uring_rcache::transfer(const void *addr, size_t len)
{
    std::vector<unsigned char> out;
    void *vaddr = const_cast<void*>(addr);

    uint64_t regs_before = m_counters.registrations;
    ucs_rcache_region_t *rregion;
    ucs_status_t st = (m_rcache == nullptr) ? UCS_ERR_REJECTED :
                      (m_src == source::kernel) ?
                      kreg_rcache_get(m_rcache, vaddr, len, PROT_READ | PROT_WRITE,
                                      nullptr, offsetof(region, watch), &rregion) :
                      kreg_ucs_rcache_get(m_rcache, vaddr, len,
                                     PROT_READ | PROT_WRITE, nullptr, &rregion);
    if (st == UCS_OK) {
        auto *r = reinterpret_cast<region*>(rregion);
        try {
            write_fixed(r->slot, addr, len, out);
        } catch (...) {
            ucs_rcache_region_put(m_rcache, rregion);
            throw;
        }
        ucs_rcache_region_put(m_rcache, rregion);
        if (m_counters.registrations == regs_before) {
            ++m_counters.hits;
        }
        return out;
    }

    if ((st != UCS_ERR_REJECTED) || (m_src != source::kernel)) {
        throw std::runtime_error(std::string("ucs_rcache_get: ") +
                                 ucs_status_string(st));
    }

    /* The range could not be watched: register it for this transfer only,
     * so nothing stale can ever be used. */
    long page   = sysconf(_SC_PAGESIZE);
    auto start  = (uintptr_t)addr & ~(uintptr_t)(page - 1);
    auto end    = ((uintptr_t)addr + len + page - 1) & ~(uintptr_t)(page - 1);
    int slot    = buf_register((void*)start, end - start);
    if (slot < 0) {
        throw sys_error("uncached fixed buffer registration", -slot);
    }
    ++m_counters.uncached;
    try {
        write_fixed(slot, addr, len, out);
    } catch (...) {
        buf_unregister(slot);
        throw;
    }
    buf_unregister(slot);
    return out;
}

} // namespace kreg_tools
