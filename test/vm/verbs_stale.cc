/*
 * Stale-registration oracle on a real verbs device (rxe0 in the VM).
 *
 *   verbs_stale hooks|kernel [ROUNDS] [DEVICE]
 *
 * Every round maps 1 MiB, fills it with "old" bytes, looks it up in a UCS
 * rcache (mem_reg = ibv_reg_mr) and RDMA-writes it over an RC QP to a second
 * QP of the same process (the peer, loopback). Then the buffer is unmapped
 * and new memory with "new" bytes is mapped at the same address with raw
 * syscall(SYS_munmap) / syscall(SYS_mmap), which UCM's hooks never see. The
 * buffer is looked up again and written again; the peer's bytes tell whether
 * the registration used was current (new bytes) or stale (old bytes).
 *
 * hooks:  stock UCM hooks. Expected: stale rounds (the known UCX gap); the
 *         run passes when the oracle sees at least one.
 * kernel: libucm_kernel watches the registrations (kreg_start before
 *         ucs_rcache_create, kreg_register_watched in mem_reg, kreg_rcache_get
 *         before every lookup). Pass: zero stale rounds. Run it with
 *         UCX_MEM_MALLOC_HOOKS=n UCX_MEM_MMAP_HOOK_MODE=none.
 *
 * Control, both modes: each round also writes after the remap through the
 * registration held from before it (deliberately stale); the oracle must
 * report old bytes for it, or the run fails. And one last round uses libc's
 * munmap/mmap, which the hooks (or the kernel) must see: current bytes.
 *
 * Exit: 0 pass, 1 fail, 77 skip (no device, or libucm_kernel cannot start).
 *
 * One file over 350 lines on purpose: one experiment (the rcache, the RC
 * queue pairs, the rounds and their oracle) read top to bottom.
 */
#include "ucm_kernel/ucm_kernel.h"
#include "tools/rcache_params.h"

#include <infiniband/verbs.h>
#include <ucm/api/ucm.h>
extern "C" {            /* UCX 1.13's rcache.h has no extern "C" of its own */
#include <ucs/memory/rcache.h>
}

#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <climits>
#include <cstring>
#include <string>

namespace {

constexpr size_t   kLen      = 1 << 20;
constexpr int      kExitSkip = 77;
constexpr unsigned kAccess   = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
                               IBV_ACCESS_REMOTE_READ;

[[noreturn]] void fatal(const char *what, int err = errno)
{
    std::fprintf(stderr, "verbs_stale: %s: %s\n", what, std::strerror(err));
    std::exit(1);
}

struct region {
    ucs_rcache_region_t super;
    kreg_watch_t        watch; /* kernel mode */
    ibv_mr             *mr;
};

struct ctx {
    ibv_pd  *pd;
    bool     kernel;
    unsigned regs;     /* ibv_reg_mr calls made by the cache */
    unsigned refused;  /* watch refusals */
    kreg_reason_t last_reason;
};

/* what kreg_register_watched calls to register and deregister */
struct reg_args {
    ctx    *c;
    region *r;
    static ucs_status_t reg(void *arg, void *start, size_t len)
    {
        auto *a  = static_cast<reg_args*>(arg);
        a->r->mr = ibv_reg_mr(a->c->pd, start, len, kAccess);
        return a->r->mr ? UCS_OK : UCS_ERR_IO_ERROR;
    }
    static void dereg(void *arg)
    {
        auto *a = static_cast<reg_args*>(arg);
        ibv_dereg_mr(a->r->mr);
        a->r->mr = nullptr;
    }
};

ucs_status_t mem_reg(void *context, ucs_rcache_t *, void *,
                     ucs_rcache_region_t *rregion, uint16_t)
{
    auto *c     = static_cast<ctx*>(context);
    auto *r     = reinterpret_cast<region*>(rregion);
    void *start = reinterpret_cast<void*>(rregion->super.start);
    size_t len  = rregion->super.end - rregion->super.start;
    reg_args args{c, r};
    ucs_status_t st;

    if (c->kernel) {
        kreg_reason_t reason = KREG_REASON_NONE;
        st = kreg_register_watched(start, len, &r->watch, reg_args::reg,
                                   reg_args::dereg, &args, &reason);
        if (st == UCS_ERR_REJECTED) {
            ++c->refused;
            c->last_reason = reason;
            return st;  /* not cached: caller goes uncached */
        }
    } else {
        st = reg_args::reg(&args, start, len);
    }
    c->regs += (st == UCS_OK);
    return st;
}

void mem_dereg(void *context, ucs_rcache_t *, ucs_rcache_region_t *rregion)
{
    auto *c = static_cast<ctx*>(context);
    auto *r = reinterpret_cast<region*>(rregion);
    ibv_dereg_mr(r->mr);
    if (c->kernel) {
        kreg_unwatch(&r->watch);
    }
}

void dump_region(void *, ucs_rcache_t *, ucs_rcache_region_t *rregion,
                 char *buf, size_t max)
{
    auto *r = reinterpret_cast<region*>(rregion);
    std::snprintf(buf, max, "lkey 0x%x", r->mr ? r->mr->lkey : 0);
}

const ucs_rcache_ops_t rcache_ops =
        kreg_tools::watched_rcache_ops(mem_reg, mem_dereg, dump_region);

/* Two RC QPs on one port, connected to each other. */
struct loopback {
    ibv_context *dev  = nullptr;
    ibv_pd      *pd   = nullptr;
    ibv_cq      *cq   = nullptr;
    ibv_qp      *a    = nullptr;  /* writer */
    ibv_qp      *b    = nullptr;  /* peer   */
    ibv_gid      gid  = {};
    int          gid_index = -1;
    ibv_mtu      mtu  = IBV_MTU_1024;

    bool open(const char *name)
    {
        int n = 0;
        ibv_device **list = ibv_get_device_list(&n);
        for (int i = 0; list && i < n; ++i) {
            if (!name || !std::strcmp(ibv_get_device_name(list[i]), name)) {
                dev = ibv_open_device(list[i]);
                break;
            }
        }
        if (list) {
            ibv_free_device_list(list);
        }
        if (!dev) {
            return false;
        }
        ibv_port_attr port{};
        if (ibv_query_port(dev, 1, &port)) fatal("ibv_query_port");
        if (port.state != IBV_PORT_ACTIVE) {
            std::fprintf(stderr, "verbs_stale: port 1 not active\n");
            std::exit(1);
        }
        mtu = port.active_mtu;
        /* RoCE: the IPv4-mapped GID (::ffff:a.b.c.d) */
        for (int i = 0; i < port.gid_tbl_len; ++i) {
            ibv_gid g{};
            if (ibv_query_gid(dev, 1, i, &g)) continue;
            static const uint8_t prefix[12] = {0,0,0,0,0,0,0,0,0,0,0xff,0xff};
            if (!std::memcmp(g.raw, prefix, sizeof(prefix))) {
                gid = g;
                gid_index = i;
                break;
            }
        }
        if (gid_index < 0) {
            std::fprintf(stderr, "verbs_stale: no IPv4-mapped GID on port 1\n");
            std::exit(1);
        }
        pd = ibv_alloc_pd(dev);
        cq = ibv_create_cq(dev, 16, nullptr, nullptr, 0);
        if (!pd || !cq) fatal("ibv_alloc_pd/ibv_create_cq");
        a = create_qp();
        b = create_qp();
        connect(a, b->qp_num);
        connect(b, a->qp_num);
        return true;
    }

    ibv_qp *create_qp()
    {
        ibv_qp_init_attr init{};
        init.send_cq = cq;
        init.recv_cq = cq;
        init.qp_type = IBV_QPT_RC;
        init.cap.max_send_wr  = 4;
        init.cap.max_recv_wr  = 4;
        init.cap.max_send_sge = 1;
        init.cap.max_recv_sge = 1;
        ibv_qp *qp = ibv_create_qp(pd, &init);
        if (!qp) fatal("ibv_create_qp");
        return qp;
    }

    void connect(ibv_qp *qp, uint32_t remote_qpn)
    {
        ibv_qp_attr attr{};
        attr.qp_state        = IBV_QPS_INIT;
        attr.pkey_index      = 0;
        attr.port_num        = 1;
        attr.qp_access_flags = kAccess;
        if (ibv_modify_qp(qp, &attr, IBV_QP_STATE | IBV_QP_PKEY_INDEX |
                          IBV_QP_PORT | IBV_QP_ACCESS_FLAGS)) fatal("QP to INIT");

        attr = {};
        attr.qp_state              = IBV_QPS_RTR;
        attr.path_mtu              = mtu;
        attr.dest_qp_num           = remote_qpn;
        attr.rq_psn                = 0;
        attr.max_dest_rd_atomic    = 1;
        attr.min_rnr_timer         = 12;
        attr.ah_attr.is_global     = 1;
        attr.ah_attr.grh.dgid      = gid;
        attr.ah_attr.grh.sgid_index = gid_index;
        attr.ah_attr.grh.hop_limit = 1;
        attr.ah_attr.port_num      = 1;
        if (ibv_modify_qp(qp, &attr, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU |
                          IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                          IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER))
            fatal("QP to RTR");

        attr = {};
        attr.qp_state      = IBV_QPS_RTS;
        attr.timeout       = 14;
        attr.retry_cnt     = 7;
        attr.rnr_retry     = 7;
        attr.sq_psn        = 0;
        attr.max_rd_atomic = 1;
        if (ibv_modify_qp(qp, &attr, IBV_QP_STATE | IBV_QP_TIMEOUT |
                          IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
                          IBV_QP_MAX_QP_RD_ATOMIC)) fatal("QP to RTS");
    }

    /* RDMA write [src, src+len) (lkey) into the peer's buffer, wait for it. */
    void write(const void *src, uint32_t lkey, void *dst, uint32_t rkey,
               size_t len)
    {
        ibv_sge sge{};
        sge.addr   = reinterpret_cast<uintptr_t>(src);
        sge.length = static_cast<uint32_t>(len);
        sge.lkey   = lkey;
        ibv_send_wr wr{}, *bad = nullptr;
        wr.wr_id               = 1;
        wr.sg_list             = &sge;
        wr.num_sge             = 1;
        wr.opcode              = IBV_WR_RDMA_WRITE;
        wr.send_flags          = IBV_SEND_SIGNALED;
        wr.wr.rdma.remote_addr = reinterpret_cast<uintptr_t>(dst);
        wr.wr.rdma.rkey        = rkey;
        if (int err = ibv_post_send(a, &wr, &bad)) fatal("ibv_post_send", err);

        auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
        ibv_wc wc{};
        int n;
        while ((n = ibv_poll_cq(cq, 1, &wc)) == 0) {
            if (std::chrono::steady_clock::now() > deadline) {
                std::fprintf(stderr, "verbs_stale: RDMA write timed out\n");
                std::exit(1);
            }
        }
        if (n < 0) fatal("ibv_poll_cq", EIO);
        if (wc.status != IBV_WC_SUCCESS) {
            std::fprintf(stderr, "verbs_stale: RDMA write failed: %s\n",
                         ibv_wc_status_str(wc.status));
            std::exit(1);
        }
    }
};

/* Round r's old and new contents: distinct in every 64-bit word. */
uint64_t word(unsigned round, bool fresh, size_t i)
{
    return (uint64_t(round) << 40) ^ (fresh ? 0x5a5a000000000000ull : 0) ^
           (i * 0x9e3779b97f4a7c15ull >> 24);
}

void fill(void *buf, unsigned round, bool fresh)
{
    auto *w = static_cast<uint64_t*>(buf);
    for (size_t i = 0; i < kLen / 8; ++i) {
        w[i] = word(round, fresh, i);
    }
}

enum class seen { old_bytes, new_bytes, other };

seen classify(const void *buf, unsigned round)
{
    auto *w = static_cast<const uint64_t*>(buf);
    size_t n_old = 0, n_new = 0;
    for (size_t i = 0; i < kLen / 8; ++i) {
        n_old += (w[i] == word(round, false, i));
        n_new += (w[i] == word(round, true, i));
    }
    if (n_old == kLen / 8) return seen::old_bytes;
    if (n_new == kLen / 8) return seen::new_bytes;
    return seen::other;
}

void *raw_mmap(void *hint, int extra_flags)
{
    long p = syscall(SYS_mmap, hint, kLen, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | extra_flags, -1, 0L);
    if (p == -1) fatal("mmap");
    return reinterpret_cast<void*>(p);
}

} // namespace

int main(int argc, char **argv)
{
    std::setvbuf(stdout, nullptr, _IOLBF, 0);
    if (argc < 2 || (std::strcmp(argv[1], "hooks") && std::strcmp(argv[1], "kernel"))) {
        std::fprintf(stderr, "usage: %s hooks|kernel [ROUNDS] [DEVICE]\n", argv[0]);
        return 2;
    }
    const std::string mode = argv[1];
    const bool kernel      = (mode == "kernel");
    const unsigned rounds  = argc > 2 ? unsigned(std::atoi(argv[2])) : 30;
    const char *devname    = argc > 3 ? argv[3] : std::getenv("KREG_VM_DEV");
    if (rounds == 0) {
        std::fprintf(stderr, "verbs_stale: bad round count\n");
        return 2;
    }

    loopback lb;
    if (!lb.open(devname)) {
        std::printf("verbs_stale %s: skip: no verbs device%s%s\n", mode.c_str(),
                    devname ? " " : "", devname ? devname : "");
        return kExitSkip;
    }
    std::printf("%s: device %s, GID index %d, MTU %d\n", mode.c_str(),
                ibv_get_device_name(lb.dev->device), lb.gid_index,
                128 << lb.mtu);

    if (kernel) {
        /* Before ucs_rcache_create: UCM_EVENT_VM_UNMAPPED becomes external. */
        if (kreg_start() != UCS_OK) {
            kreg_caps_t caps{};
            kreg_query(&caps);
            std::printf("verbs_stale kernel: skip: kreg_start failed: %s\n",
                        kreg_reason_str(caps.reason));
            kreg_stop();
            return kExitSkip;
        }
        kreg_caps_t caps{};
        kreg_query(&caps);
        std::printf("kernel: kreg backend %s, mode %s, external_event %d, wp_async %d\n",
                    kreg_backend_str(caps.backend), kreg_mode_str(caps.mode),
                    caps.external_event, caps.wp_async);
    }

    /* The peer's buffer: registered directly, never remapped. */
    void *peer = raw_mmap(nullptr, 0);
    ibv_mr *peer_mr = ibv_reg_mr(lb.pd, peer, kLen, kAccess);
    if (!peer_mr) fatal("ibv_reg_mr (peer)");

    ctx c{lb.pd, kernel, 0, 0, KREG_REASON_NONE};
    const ucs_rcache_params_t params =
            kreg_tools::watched_rcache_params(sizeof(region), &rcache_ops, &c);
    ucs_rcache_t *rcache = nullptr;
    if (ucs_rcache_create(&params, "verbs_stale", nullptr, &rcache) != UCS_OK) {
        std::fprintf(stderr, "verbs_stale: ucs_rcache_create failed\n");
        return 1;
    }

    auto lookup = [&](void *addr) -> region* {
        ucs_rcache_region_t *r = nullptr;
        ucs_status_t st =
                kernel ? kreg_rcache_get(rcache, addr, kLen, PROT_READ | PROT_WRITE,
                                         nullptr, offsetof(region, watch), &r) :
                         kreg_ucs_rcache_get(rcache, addr, kLen, PROT_READ | PROT_WRITE,
                                        nullptr, &r);
        return (st == UCS_OK) ? reinterpret_cast<region*>(r) : nullptr;
    };
    /* Write through the cache, or uncached when the cache refuses. */
    auto send = [&](void *addr, region *r) {
        std::memset(peer, 0, kLen);
        if (r) {
            lb.write(addr, r->mr->lkey, peer, peer_mr->rkey, kLen);
            return;
        }
        ibv_mr *mr = ibv_reg_mr(lb.pd, addr, kLen, kAccess);
        if (!mr) fatal("ibv_reg_mr (uncached)");
        lb.write(addr, mr->lkey, peer, peer_mr->rkey, kLen);
        ibv_dereg_mr(mr);
    };

    unsigned stale = 0, fresh = 0, other = 0, uncached = 0;
    unsigned ctl_stale = 0, ctl_rounds = 0, first_bad = 0;
    void *bufs[1024];
    const unsigned nbufs = rounds < 1024 ? rounds : 1024;
    for (unsigned round = 0; round < rounds; ++round) {
        /* Every round at a new address; the old ones stay mapped. */
        void *addr = raw_mmap(nullptr, 0);
        if (round < nbufs) bufs[round] = addr;
        fill(addr, round, false);

        region *held = lookup(addr);
        send(addr, held);
        if (classify(peer, round) != seen::old_bytes) {
            ++first_bad;   /* the first write must deliver what is there */
        }

        /* Behind UCM's back: unmap, map new data at the same address. */
        if (syscall(SYS_munmap, addr, kLen) != 0) fatal("munmap");
        void *again = raw_mmap(addr, MAP_FIXED_NOREPLACE);
        if (again != addr) {
            std::fprintf(stderr, "verbs_stale: remap moved %p -> %p\n", addr, again);
            return 1;
        }
        fill(addr, round, true);

        /* Control: the registration from before the remap, on purpose. */
        if (held) {
            ++ctl_rounds;
            send(addr, held);
            ctl_stale += (classify(peer, round) == seen::old_bytes);
            ucs_rcache_region_put(rcache, &held->super);
        }

        /* The real check: look up again, write again. */
        region *r = lookup(addr);
        uncached += (r == nullptr);
        send(addr, r);
        switch (classify(peer, round)) {
        case seen::old_bytes: ++stale; break;
        case seen::new_bytes: ++fresh; break;
        default:              ++other; break;
        }
        if (r) {
            ucs_rcache_region_put(rcache, &r->super);
        }
    }

    /* The same round once more through libc's munmap/mmap, which UCM's
     * hooks (hooks mode) or the kernel (kernel mode) must see: proves that
     * the stale rounds above come from the raw syscalls alone. */
    seen libc_seen;
    {
        const unsigned round = rounds;
        void *addr = mmap(nullptr, kLen, PROT_READ | PROT_WRITE,
                          MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (addr == MAP_FAILED) fatal("mmap (libc)");
        fill(addr, round, false);
        region *r = lookup(addr);
        send(addr, r);
        if (r) ucs_rcache_region_put(rcache, &r->super);
        if (munmap(addr, kLen) != 0) fatal("munmap (libc)");
        void *again = mmap(addr, kLen, PROT_READ | PROT_WRITE,
                           MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
        if (again != addr) fatal("mmap (libc) at the same address");
        fill(addr, round, true);
        r = lookup(addr);
        send(addr, r);
        libc_seen = classify(peer, round);
        if (r) ucs_rcache_region_put(rcache, &r->super);
        munmap(addr, kLen);
    }

    std::printf("%s: %u/%u stale, %u current, %u corrupt, %u uncached, "
                "%u first-write errors, %u cache registrations\n",
                mode.c_str(), stale, rounds, fresh, other, uncached, first_bad,
                c.regs);
    std::printf("%s: control (write through the pre-remap registration): "
                "%u/%u stale\n", mode.c_str(), ctl_stale, ctl_rounds);
    std::printf("%s: libc munmap+mmap instead of raw syscalls: %s\n", mode.c_str(),
                libc_seen == seen::new_bytes ? "current" :
                libc_seen == seen::old_bytes ? "stale" : "corrupt");
    if (kernel) {
        kreg_stats_t st{};
        kreg_get_stats(&st);
        std::printf("kernel: events unmap %llu remove %llu remap %llu, "
                    "dispatched %llu, watch refusals %u (last: %s), "
                    "verify invalidations %llu\n",
                    (unsigned long long)st.events[KREG_EV_UNMAP],
                    (unsigned long long)st.events[KREG_EV_REMOVE],
                    (unsigned long long)st.events[KREG_EV_REMAP],
                    (unsigned long long)st.dispatched, c.refused,
                    kreg_reason_str(c.last_reason),
                    (unsigned long long)st.verify_invalidations);
    }

    ucs_rcache_destroy(rcache);
    if (kernel) {
        kreg_stop();
    }
    ibv_dereg_mr(peer_mr);
    for (unsigned i = 0; i < nbufs; ++i) syscall(SYS_munmap, bufs[i], kLen);
    syscall(SYS_munmap, peer, kLen);

    bool ok = (other == 0) && (first_bad == 0);
    if (libc_seen != seen::new_bytes) {
        std::printf("%s: FAIL: a libc munmap went unnoticed\n", mode.c_str());
        ok = false;
    }
    if (ctl_rounds == 0 || ctl_stale != ctl_rounds) {
        std::printf("%s: FAIL: the oracle missed a deliberately stale write\n",
                    mode.c_str());
        ok = false;
    }
    if (kernel) {
        if (stale != 0) {
            std::printf("kernel: FAIL: %u stale rounds\n", stale);
            ok = false;
        }
        if (uncached == rounds) {
            std::printf("kernel: FAIL: nothing was cached (%s)\n",
                        kreg_reason_str(c.last_reason));
            ok = false;
        }
    } else if (stale == 0) {
        std::printf("hooks: FAIL: expected the stock hooks to miss the raw "
                    "munmap (no stale round seen)\n");
        ok = false;
    }
    std::printf("verbs_stale %s: %s\n", mode.c_str(), ok ? "passed" : "failed");
    return ok ? 0 : 1;
}
