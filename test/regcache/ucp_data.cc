/*
 * UCP-level data test over real RDMA (Soft-RoCE in the VM): two workers of
 * one context in one process, connected by their worker addresses.
 *
 *   ucp_data [--component LIB|plugin|sync] [--rounds N] [--race-rounds N]
 *            [--no-data] [--no-remap]
 *   ucp_data [--component LIB] --churn N [--size S] [--alloc malloc|mmap|thp]
 *            [--warmup W] [--fork-init]
 *
 * --component LIB: dlopen LIB (libuct_ib_regcache.so) before ucp_init and
 * require kreg_ib_regcache_status() == UCS_OK; then remap rounds must never
 * be stale. --component plugin: UCX (1.22) loads the component from
 * UCX_PLUGIN_PATH; after ucp_init the component must be registered, then
 * likewise. Without it UCX runs stock and the stale count is only printed.
 * --component sync: stock transports and UCX's own caches, libucm_kernel
 * preloaded (LD_PRELOAD=libucm_kernel.so) and running synchronous delivery
 * (kreg_query); then remap rounds must never be stale either, and the
 * module's counts are printed (SYNC ...). --component kreg-start, its
 * control: kreg_start() before ucp_init with UCX_KREG_SYNC=n (UCM's hooks
 * off for unmaps, nothing synchronous): stale rounds are printed, not
 * failed.
 * UCX_TLS chooses the transports (rc_kreg,ud_kreg or rc_verbs,ud_verbs).
 *
 * First it prints the endpoint's tag_send thresholds (ucp_ep_print_info):
 * with rc on rxe0 (UCX 1.13.1), eager up to 394325 B: 1 B, 8 KiB and
 * 64 KiB go eager, 1 MiB and 8 MiB rendezvous.
 * 1. data: tag send/recv of 1 B, 8 KiB, 64 KiB, 1 MiB, 8 MiB (eager and
 *    rendezvous), ucp_put_nbx and ucp_get_nbx of 1 MiB through a packed and
 *    unpacked rkey; every byte checked against a pattern.
 * 2. remap: a 1 MiB mmap'd buffer is sent (rendezvous: registered, cached),
 *    unmapped with a raw munmap syscall, mapped again at the same address
 *    with new bytes (by this thread, or by another), and sent again; the
 *    receiver must get the new bytes. --race-rounds N more rounds of the
 *    address-reuse race: another thread unmaps while this one spins mapping
 *    the address, then fills and sends. Prints per case
 *      <kernel|hooks|sync>: ucp remap <same|other|race> thread: S of N rounds stale (C corrupt)
 *
 * 3. --churn N (a benchmark, instead of 1 and 2): N timed rounds, after W
 *    untimed ones (default 5), of: allocate S bytes (default 1 MiB) with
 *    malloc or libc's mmap (both seen by UCX's hooks), fill them with the
 *    round's pattern, tag send them to a receive buffer allocated once,
 *    check every word there, free them. The same address comes back (mmap:
 *    the hole just unmapped; malloc: glibc's dynamic mmap threshold serves
 *    a size mmap'd once from the heap after its first free, so sizes up to
 *    32 MiB stop being unmapped at all; thp: a slice inside 2 MiB blocks of
 *    a mapping of its own, huge pages asked for, a new mapping each round,
 *    see thp_slice_alloc). Prints
 *      churn: <kernel|hooks> alloc=A size=S rounds=N: U us/round (R rounds/s) ...
 *      CHURN alloc=A size=S rounds=N us_round=U us_send=.. med_round=..
 *            med_send=.. us_alloc=.. us_free=.. stale=.. wrong=.. ...
 *    (us_*: means per round; med_*: medians over the rounds; alloc includes
 *    the fill, send the receive and its completion; regs: ibv_reg_mr calls
 *    during the timed rounds, when libcount_reg_mr.so is preloaded, else
 *    -1; changed: registrations the library refused in them because the
 *    kernel changed the pages while they were pinned, each after its
 *    tries, with the component, else -1; dontfork: rounds whose buffer's
 *    VMA was MADV_DONTFORK right after its send, from /proc/self/smaps;
 *    fork: ibv_is_fork_initialized(), unneeded where the kernel copies
 *    pinned pages at fork.)
 *    --fork-init: call ibv_fork_init() before ucp_init, as another library
 *    in the process may (rdma-core's fork protection on, whatever
 *    UCX_IB_FORK_INIT says).
 *    stale: the receiver got the previous round's bytes; wrong: neither.
 *
 * Exit: 0 if every data check passed (and, with --component, no round was
 * stale or corrupt; with --churn: every round ran and, with --component,
 * none was stale or wrong); 1 otherwise; 77 when UCP has no usable
 * transport.
 *
 * Over 350 lines: one program, its three parts (data, remap, churn)
 * on one pair of workers (peers). It runs only in the Soft-RoCE VM; a
 * split by part is left for a change that can run the VM suite to check
 * it.
 */
#include "test_buffers.h"
#include "ucm_kernel/ucm_kernel.h" /* kreg_stats_t; the function by dlsym */

#include <ucp/api/ucp.h>
#include <uct/api/uct.h>

#include <dlfcn.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

/* Every buffer but the remapped one comes from libc's mmap, which UCX's
 * hooks see, so that only the raw syscalls of a remap can leave a stale
 * entry (a receive buffer at a reused address would go stale with stock UCX
 * too). */
namespace {

int g_failures;

void check(bool ok, const std::string &what)
{
    std::printf("%s: %s\n", ok ? "ok  " : "FAIL", what.c_str());
    std::fflush(stdout);
    if (!ok) {
        ++g_failures;
    }
}

struct completion {
    bool         done   = false;
    ucs_status_t status = UCS_OK;
    size_t       length = 0;
};

void send_cb(void *, ucs_status_t status, void *arg)
{
    auto *c   = static_cast<completion*>(arg);
    c->status = status;
    c->done   = true;
}

void recv_cb(void *, ucs_status_t status, const ucp_tag_recv_info_t *info,
             void *arg)
{
    auto *c   = static_cast<completion*>(arg);
    c->status = status;
    c->length = info->length;
    c->done   = true;
}

struct peers {
    ucp_context_h context = nullptr;
    bool          own_context = true; /* false: a context shared by threads */
    ucp_worker_h  w[2]    = {nullptr, nullptr};
    ucp_ep_h      ep[2]   = {nullptr, nullptr}; /* ep[0]: 0 -> 1 */

    void progress()
    {
        ucp_worker_progress(w[0]);
        ucp_worker_progress(w[1]);
    }

    /* Waits for a request of *_nbx; false on error or after 120 s. */
    bool wait(ucs_status_ptr_t req, completion *c, const char *what)
    {
        if (req == nullptr) {
            return true;
        }
        if (UCS_PTR_IS_ERR(req)) {
            std::printf("error: %s: %s\n", what,
                        ucs_status_string(UCS_PTR_STATUS(req)));
            return false;
        }
        auto end = std::chrono::steady_clock::now() + std::chrono::seconds(120);
        while (!c->done && (std::chrono::steady_clock::now() < end)) {
            progress();
        }
        if (!c->done) {
            /* a hung transfer: no way to cancel it safely, give up */
            std::printf("error: %s: timed out after 120 s\nFAILED\n", what);
            std::fflush(stdout);
            std::_Exit(1);
        }
        ucp_request_free(req);
        if (c->status != UCS_OK) {
            std::printf("error: %s: %s\n", what, ucs_status_string(c->status));
        }
        return c->status == UCS_OK;
    }

    /* Tag message of len bytes from worker 0 to worker 1. */
    bool tag(const void *sbuf, void *rbuf, size_t len, ucp_tag_t t)
    {
        completion rc, sc;
        ucp_request_param_t rp = {};
        rp.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
        rp.cb.recv      = recv_cb;
        rp.user_data    = &rc;
        ucs_status_ptr_t rreq = ucp_tag_recv_nbx(w[1], rbuf, len, t,
                                                 (ucp_tag_t)-1, &rp);

        ucp_request_param_t sp = {};
        sp.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
        sp.cb.send      = send_cb;
        sp.user_data    = &sc;
        ucs_status_ptr_t sreq = ucp_tag_send_nbx(ep[0], sbuf, len, t, &sp);

        bool ok = wait(sreq, &sc, "tag send");
        if (rreq == nullptr) {
            rc.length = len; /* completed at once: only with an unexpected hit */
        }
        ok = wait(rreq, &rc, "tag recv") && ok;
        if (ok && (rc.length != len)) {
            std::printf("error: received %zu bytes, sent %zu\n", rc.length, len);
            ok = false;
        }
        return ok;
    }

    bool flush(ucp_ep_h e)
    {
        completion c;
        ucp_request_param_t p = {};
        p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
        p.cb.send      = send_cb;
        p.user_data    = &c;
        return wait(ucp_ep_flush_nbx(e, &p), &c, "flush");
    }

    bool rma(bool put, void *lbuf, size_t len, uint64_t raddr, ucp_rkey_h rkey)
    {
        completion c;
        ucp_request_param_t p = {};
        p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
        p.cb.send      = send_cb;
        p.user_data    = &c;
        ucs_status_ptr_t req = put ? ucp_put_nbx(ep[0], lbuf, len, raddr, rkey, &p)
                                   : ucp_get_nbx(ep[0], lbuf, len, raddr, rkey, &p);
        return wait(req, &c, put ? "put" : "get") && flush(ep[0]);
    }

    void close()
    {
        std::vector<ucs_status_ptr_t> reqs;
        for (auto &e : ep) {
            if (e != nullptr) {
                ucp_request_param_t p = {}; /* flush mode: both progress */
                reqs.push_back(ucp_ep_close_nbx(e, &p));
                e = nullptr;
            }
        }
        for (auto req : reqs) {
            if (UCS_PTR_IS_PTR(req)) {
                auto end = std::chrono::steady_clock::now() +
                           std::chrono::seconds(30);
                while ((ucp_request_check_status(req) == UCS_INPROGRESS) &&
                       (std::chrono::steady_clock::now() < end)) {
                    progress();
                }
                ucp_request_free(req);
            }
        }
        for (auto &worker : w) {
            if (worker != nullptr) {
                ucp_worker_destroy(worker);
                worker = nullptr;
            }
        }
        if ((context != nullptr) && own_context) {
            ucp_cleanup(context);
        }
        context = nullptr;
    }
};

/* A UCP context; mt: its workers are used by several threads at once. */
ucp_context_h open_context(bool mt)
{
    ucp_config_t *config;
    if (ucp_config_read(nullptr, nullptr, &config) != UCS_OK) {
        return nullptr;
    }
    ucp_params_t params      = {};
    params.field_mask        = UCP_PARAM_FIELD_FEATURES;
    params.features          = UCP_FEATURE_TAG | UCP_FEATURE_RMA;
    if (mt) {
        params.field_mask       |= UCP_PARAM_FIELD_MT_WORKERS_SHARED;
        params.mt_workers_shared = 1;
    }
    ucp_context_h context = nullptr;
    ucs_status_t status   = ucp_init(&params, config, &context);
    ucp_config_release(config);
    if (status != UCS_OK) {
        std::printf("error: ucp_init: %s\n", ucs_status_string(status));
        return nullptr;
    }
    return context;
}

/* Two workers connected both ways, in a context of their own or in
 * shared (which p does not clean up). */
bool open_peers(peers &p, ucp_context_h shared = nullptr)
{
    ucs_status_t status;
    p.own_context = (shared == nullptr);
    p.context     = shared ? shared : open_context(false);
    if (p.context == nullptr) {
        return false;
    }

    ucp_worker_params_t wp = {};
    wp.field_mask  = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
    wp.thread_mode = UCS_THREAD_MODE_SINGLE;
    for (auto &worker : p.w) {
        status = ucp_worker_create(p.context, &wp, &worker);
        if (status != UCS_OK) {
            std::printf("error: ucp_worker_create: %s\n",
                        ucs_status_string(status));
            return false;
        }
    }

    for (int i = 0; i < 2; ++i) {
        ucp_address_t *addr;
        size_t addr_len;
        if (ucp_worker_get_address(p.w[1 - i], &addr, &addr_len) != UCS_OK) {
            return false;
        }
        ucp_ep_params_t ep_params = {};
        ep_params.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS;
        ep_params.address    = addr;
        status = ucp_ep_create(p.w[i], &ep_params, &p.ep[i]);
        ucp_worker_release_address(p.w[1 - i], addr);
        if (status != UCS_OK) {
            std::printf("error: ucp_ep_create: %s\n", ucs_status_string(status));
            return false;
        }
    }
    return true;
}

void data_tests(peers &p)
{
    const size_t sizes[] = {1, 8 << 10, 64 << 10, 1 << 20, 8 << 20};
    ucp_tag_t t = 0x100;
    uint32_t seed = 1;

    for (size_t len : sizes) {
        std::vector<uint8_t> sbuf(len), rbuf(len, 0);
        pattern_fill(sbuf.data(), len, seed);
        bool ok = p.tag(sbuf.data(), rbuf.data(), len, t++);
        size_t bad = ok ? pattern_first_bad(rbuf.data(), len, seed) : 0;
        if (ok && (bad != len)) {
            std::printf("error: byte %zu differs\n", bad);
        }
        check(ok && (bad == len), "tag send/recv " + std::to_string(len) +
              " B, every byte");
        ++seed;
    }

    /* RMA: worker 1's memory, mapped by UCP, its rkey packed and unpacked
     * on worker 0's endpoint. */
    const size_t len = 1 << 20;
    void *target = libc_mmap(len);
    std::vector<uint8_t> local(len);
    ucp_mem_map_params_t mp = {};
    mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
    mp.address    = target;
    mp.length     = len;
    ucp_mem_h memh;
    void *rkey_buf;
    size_t rkey_len;
    ucp_rkey_h rkey;
    if ((target == MAP_FAILED) ||
        (ucp_mem_map(p.context, &mp, &memh) != UCS_OK)) {
        check(false, "ucp_mem_map of 1 MiB");
        return;
    }
    bool keys = (ucp_rkey_pack(p.context, memh, &rkey_buf, &rkey_len) == UCS_OK);
    if (keys) {
        keys = (ucp_ep_rkey_unpack(p.ep[0], rkey_buf, &rkey) == UCS_OK);
        ucp_rkey_buffer_release(rkey_buf);
    }
    check(keys, "rkey packed (" + std::to_string(keys ? rkey_len : 0) +
          " B) and unpacked");
    if (keys) {
        uint64_t raddr = reinterpret_cast<uintptr_t>(target);
        memset(target, 0, len);
        pattern_fill(local.data(), len, seed);
        bool ok = p.rma(true, local.data(), len, raddr, rkey);
        check(ok && (pattern_first_bad(target, len, seed) == len),
              "ucp_put_nbx 1 MiB, every byte");
        ++seed;
        pattern_fill(target, len, seed);
        memset(local.data(), 0, len);
        ok = p.rma(false, local.data(), len, raddr, rkey);
        check(ok && (pattern_first_bad(local.data(), len, seed) == len),
              "ucp_get_nbx 1 MiB, every byte");
        ucp_rkey_destroy(rkey);
    }
    ucp_mem_unmap(p.context, memh);
    munmap(target, len);
}

struct remap_result {
    int stale = 0, corrupt = 0, failed = 0, retries = 0;
};

/* Who remaps in a round: this thread; another thread (joined before the
 * send); or the address-reuse race: another thread unmaps while this one
 * spins mapping the same address, then fills and sends at once (the window
 * that a signal to the unmapping thread alone leaves open). */
enum remap_mode { REMAP_SAME, REMAP_OTHER, REMAP_RACE, REMAP_LAST };
const char *const remap_mode_names[] = {"same", "other", "race"};

/* REMAP_RACE: 1 once this thread has mapped buf again after *unmapper
 * unmapped it; 0 if the address went elsewhere (another mapping took the
 * hole: UCX 1.13's rcache maps its memory pool's chunks with mmap, in the
 * unmap callback the unmapper's handler runs). */
int race_remap(void *buf, size_t len, std::thread *unmapper)
{
    /* shared: the unmapper may look at it after this frame is gone */
    struct flags {
        std::atomic<bool> go{false}, done{false};
    };
    auto f     = std::make_shared<flags>();
    *unmapper  = std::thread([f, buf, len] {
        while (!f->go.load()) {
        }
        raw_munmap(buf, len);
        f->done = true;
    });
    f->go = true;
    /* a look that fails after the unmapper is done never succeeds */
    for (bool was_done = false;; was_done = f->done.load()) {
        long r = syscall(SYS_mmap, buf, len, PROT_READ | PROT_WRITE,
                         MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0L);
        if (r == reinterpret_cast<long>(buf)) {
            return 1;
        }
        if (r != -1) {
            syscall(SYS_munmap, reinterpret_cast<void*>(r), len);
            return 0;
        }
        if ((errno != EEXIST) || was_done) {
            return 0;
        }
    }
}

remap_result remap_rounds(peers &p, int rounds, remap_mode mode)
{
    const size_t len = 1 << 20;
    remap_result r;
    void *rbuf = libc_mmap(len);
    uint32_t seed = 1000;

    for (int round = 0; round < rounds; ++round) {
        /* Each round starts and ends through libc's mmap/munmap, which UCX's
         * hooks see too: a round's first send is current for both, and only
         * the raw syscalls in between can leave a stale registration. */
        void *buf = libc_mmap(len);
        if ((buf == MAP_FAILED) || (rbuf == MAP_FAILED)) {
            ++r.failed;
            continue;
        }
        uint32_t old_seed = seed++, new_seed = seed++;
        pattern_fill(buf, len, old_seed);
        if (!p.tag(buf, rbuf, len, 0x1000 + round) ||
            (pattern_first_bad(rbuf, len, old_seed) != len)) {
            std::printf("error: round %d: the first send did not carry its "
                        "bytes (byte %zu: 0x%02x, want 0x%02x; previous round's "
                        "%s)\n", round, pattern_first_bad(rbuf, len, old_seed),
                        static_cast<uint8_t*>(rbuf)[pattern_first_bad(rbuf, len, old_seed)],
                        pattern_byte(old_seed, pattern_first_bad(rbuf, len, old_seed)),
                        (pattern_first_bad(rbuf, len, old_seed - 1) == len) ? "new bytes" :
                        (pattern_first_bad(rbuf, len, old_seed - 2) == len) ? "old bytes" :
                        "neither");
            ++r.failed;
            munmap(buf, len);
            continue;
        }

        bool mapped;
        std::thread unmapper;
        if (mode == REMAP_OTHER) {
            std::thread th([&] { mapped = raw_remap(buf, len); });
            th.join();
        } else if (mode == REMAP_RACE) {
            mapped = race_remap(buf, len, &unmapper);
        } else {
            mapped = raw_remap(buf, len);
        }
        if (!mapped) {
            if (unmapper.joinable()) {
                unmapper.join();
            }
            /* someone else took the address: not a round, try again */
            ++r.retries;
            --round;
            if (r.retries > 100) {
                ++r.failed;
                break;
            }
            continue;
        }
        pattern_fill(buf, len, new_seed);
        memset(rbuf, 0, len);
        if (!p.tag(buf, rbuf, len, 0x2000 + round)) {
            ++r.failed;
        } else if (pattern_first_bad(rbuf, len, new_seed) == len) {
            /* current */
        } else if (pattern_first_bad(rbuf, len, old_seed) == len) {
            ++r.stale;
        } else {
            ++r.corrupt;
        }
        if (unmapper.joinable()) {
            unmapper.join();
        }
        munmap(buf, len);
    }
    if (rbuf != MAP_FAILED) {
        munmap(rbuf, len);
    }
    return r;
}


/* Churn rounds: a cheaper pattern than pattern_fill()'s (one 64-bit store per word),
 * so that a round's time is mostly UCP's. */
void fill_words(void *buf, size_t len, uint64_t seed)
{
    uint64_t *w = static_cast<uint64_t*>(buf);
    for (size_t i = 0; i < len / 8; ++i) {
        w[i] = (seed << 40) ^ (i * 0x9e3779b97f4a7c15ull);
    }
}

bool words_ok(const void *buf, size_t len, uint64_t seed)
{
    const uint64_t *w = static_cast<const uint64_t*>(buf);
    for (size_t i = 0; i < len / 8; ++i) {
        if (w[i] != ((seed << 40) ^ (i * 0x9e3779b97f4a7c15ull))) {
            return false;
        }
    }
    return true;
}

struct churn_result {
    int    rounds = 0, stale = 0, wrong = 0, failed = 0, same_address = 0;
    double us_total = 0, us_alloc = 0, us_send = 0, us_check = 0, us_free = 0;
    std::vector<double> round_us, send_us; /* per timed round */
    long regs = -1; /* ibv_reg_mr calls in the timed rounds, if counted */
    long changed = -1; /* registrations the library refused in them because
                          the kernel changed the pages while they were
                          being pinned (kreg_get_stats), if loaded */
    int dontfork = 0; /* rounds whose buffer was MADV_DONTFORK right after
                         its send (registered, cached) */
};

/* libcount_reg_mr.so's running count, when it is preloaded: counted here,
 * around the timed rounds, so that the setup's registrations (which vary
 * with the pages the kernel migrates while they are pinned) stay out. */
long reg_mr_calls()
{
    using count_fn = unsigned long (*)();
    static auto fn = reinterpret_cast<count_fn>(dlsym(RTLD_DEFAULT, "count_reg_mr_calls"));
    return fn ? static_cast<long>(fn()) : -1;
}

/* kreg_get_stats's refusals for pages that changed while being pinned,
 * when the component (and so libucm_kernel) is loaded; else -1 */
long changed_refusals()
{
    using stats_fn = void (*)(kreg_stats_t *);
    /* a plugin's dependencies are local to it: found by soname then */
    static void *lib = dlopen("libucm_kernel.so.2", RTLD_LAZY | RTLD_NOLOAD);
    static auto fn = reinterpret_cast<stats_fn>(dlsym(lib ? lib : RTLD_DEFAULT,
                                                      "kreg_get_stats"));
    if (fn == nullptr) {
        return -1;
    }
    kreg_stats_t st;
    fn(&st);
    return static_cast<long>(st.fallbacks[KREG_REASON_CHANGED]);
}

/* --fork-init: ibv_fork_init() before UCX runs, as another library of the
 * process may call it: rdma-core's fork protection is then on whatever
 * UCX_IB_FORK_INIT says (libibverbs by dlopen: UCX loads it itself). */
bool rdma_fork_init()
{
    void *lib = dlopen("libibverbs.so.1", RTLD_NOW | RTLD_GLOBAL);
    auto fn = lib ? reinterpret_cast<int (*)(void)>(dlsym(lib, "ibv_fork_init"))
                  : nullptr;
    const int ret = fn ? fn() : -1;
    std::printf("%s: ibv_fork_init() before ucp_init: %d\n",
                (ret == 0) ? "info" : "FAIL", ret);
    return ret == 0;
}

/* rdma-core's fork protection as ibv_is_fork_initialized() reports it
 * (after ucp_init: UCX has loaded libibverbs and run ibv_fork_init or not) */
const char *rdma_fork_state()
{
    void *lib = dlopen("libibverbs.so.1", RTLD_LAZY | RTLD_NOLOAD);
    auto fn = lib ? reinterpret_cast<int (*)(void)>(
                        dlsym(lib, "ibv_is_fork_initialized"))
                  : nullptr;
    switch (fn ? fn() : -1) {
    case 0:  return "disabled";
    case 1:  return "enabled";
    case 2:  return "unneeded"; /* the kernel copies pinned pages at fork */
    default: return "unknown";
    }
}

/* Whether UCT lists a component of that name (after ucp_init: the modules
 * UCX loaded are registered then). */
bool uct_component_registered(const char *name)
{
    uct_component_h *components;
    unsigned count;
    bool found = false;

    if (uct_query_components(&components, &count) != UCS_OK) {
        return false;
    }
    for (unsigned i = 0; (i < count) && !found; ++i) {
        uct_component_attr_t attr = {};
        attr.field_mask = UCT_COMPONENT_ATTR_FIELD_NAME;
        found = (uct_component_query(components[i], &attr) == UCS_OK) &&
                !std::strcmp(attr.name, name);
    }
    uct_release_component_list(components);
    return found;
}

/* Median of v (0 when empty); reorders v. */
double median_of(std::vector<double> &v)
{
    if (v.empty()) {
        return 0;
    }
    std::sort(v.begin(), v.end());
    size_t n = v.size();
    return (n % 2) ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* Whether the VMA holding addr is marked MADV_DONTFORK ("dc" in its
 * VmFlags in /proc/self/smaps): the kernel's own record of what fork
 * protection did to a registered buffer. -1 if not found. */
int vma_dontfork(const void *addr)
{
    FILE *f = std::fopen("/proc/self/smaps", "r");
    if (f == nullptr) {
        return -1;
    }
    const auto a = reinterpret_cast<uintptr_t>(addr);
    char line[512];
    bool in = false;
    int found = -1;
    while ((found < 0) && std::fgets(line, sizeof(line), f)) {
        unsigned long lo, hi;
        if (std::sscanf(line, "%lx-%lx ", &lo, &hi) == 2) {
            in = (a >= lo) && (a < hi);
        } else if (in && !std::strncmp(line, "VmFlags:", 8)) {
            found = (std::strstr(line, " dc") != nullptr);
        }
    }
    std::fclose(f);
    return found;
}

/* --alloc thp: len bytes at 512 KiB into the first of two 2 MiB-aligned
 * blocks of an anonymous mapping of their own, asked for huge pages and
 * touched. The buffer's ends lie inside a block its VMA covers whole: the
 * layout in which splitting the VMA there (rdma-core's MADV_DONTFORK at
 * ibv_reg_mr) makes the kernel send MMU_NOTIFY_CLEAR for the block
 * (__split_huge_pmd), a huge page there or not. map_p, map_len_p: what to
 * unmap. */
constexpr size_t kHugeBlock = 2UL << 20;

void *thp_slice_alloc(size_t len, void **map_p, size_t *map_len_p)
{
    const size_t off = kHugeBlock / 4;
    const size_t blocks = (off + len + kHugeBlock - 1) / kHugeBlock + 1;
    const size_t map_len = (blocks + 1) * kHugeBlock; /* room to align */
    void *map = libc_mmap(map_len);
    if (map == MAP_FAILED) {
        return MAP_FAILED;
    }
    auto base = reinterpret_cast<uintptr_t>(map);
    auto aligned = (base + kHugeBlock - 1) & ~(kHugeBlock - 1);
    (void)madvise(reinterpret_cast<void *>(aligned), blocks * kHugeBlock,
                  MADV_HUGEPAGE);
    memset(reinterpret_cast<void *>(aligned), 1, blocks * kHugeBlock);
    *map_p     = map;
    *map_len_p = map_len;
    return reinterpret_cast<void *>(aligned + off);
}

churn_result churn_rounds(peers &p, int rounds, int warmup, size_t len,
                          const std::string &alloc)
{
    const bool use_malloc = (alloc == "malloc"), thp = (alloc == "thp");
    using clock = std::chrono::steady_clock;
    auto us = [](clock::time_point a, clock::time_point b) {
        return std::chrono::duration<double, std::micro>(b - a).count();
    };
    churn_result r;
    r.round_us.reserve(rounds);
    r.send_us.reserve(rounds);
    void *rbuf = libc_mmap(len);
    if (rbuf == MAP_FAILED) {
        r.failed = rounds;
        return r;
    }
    memset(rbuf, 0, len);
    void *last = nullptr;
    uint64_t seed = 1;

    long regs_before = -1, changed_before = -1;
    for (int round = -warmup; round < rounds; ++round, ++seed) {
        bool timed = (round >= 0);
        if (round == 0) {
            regs_before    = reg_mr_calls();
            changed_before = changed_refusals();
        }
        auto t0 = clock::now();
        void *map = nullptr;
        size_t map_len = 0;
        void *buf = use_malloc ? std::malloc(len) :
                    thp        ? thp_slice_alloc(len, &map, &map_len) :
                                 libc_mmap(len);
        if ((buf == nullptr) || (buf == MAP_FAILED)) {
            r.failed += timed;
            continue;
        }
        fill_words(buf, len, seed);
        auto t1 = clock::now();
        bool sent = p.tag(buf, rbuf, len, 0x3000 + (seed & 0xfff));
        auto t2 = clock::now();
        const int dc = vma_dontfork(buf);
        bool ok   = sent && words_ok(rbuf, len, seed);
        bool old  = !ok && sent && words_ok(rbuf, len, seed - 1);
        auto t3 = clock::now();
        if (use_malloc) {
            std::free(buf);
        } else if (thp) {
            munmap(map, map_len);
        } else {
            munmap(buf, len);
        }
        auto t4 = clock::now();
        if (timed) {
            ++r.rounds;
            r.same_address += (buf == last);
            r.dontfork     += (dc > 0);
            r.failed       += !sent;
            r.stale        += old;
            r.wrong        += sent && !ok && !old;
            r.us_alloc     += us(t0, t1);
            r.us_send      += us(t1, t2);
            r.us_check     += us(t2, t3);
            r.us_free      += us(t3, t4);
            r.us_total     += us(t0, t4);
            r.round_us.push_back(us(t0, t4));
            r.send_us.push_back(us(t1, t2));
        }
        last = buf;
    }
    if ((regs_before >= 0) && (rounds > 0)) {
        r.regs = reg_mr_calls() - regs_before;
    }
    if ((changed_before >= 0) && (rounds > 0)) {
        r.changed = changed_refusals() - changed_before;
    }
    munmap(rbuf, len);
    return r;
}

/* --threads T: T threads, each with its own pair of workers under one
 * context (mt_workers_shared), each sending ROUNDS messages: a buffer whose
 * size (512 KiB, 1 MiB, 2 MiB: rendezvous, so registered and cached) and
 * kind change every round (libc mmap then a raw munmap, libc mmap and
 * munmap, malloc and free; --alloc libc: libc mmap and munmap only, which
 * UCX's hooks see too), filled with a pattern of its own, tag sent to the
 * thread's receive buffer, every word checked there, freed. The threads
 * run at once and their mappings take each other's addresses. */
struct threads_result {
    int    messages = 0, stale = 0, failed = 0;
    double seconds  = 0;
};

/* The last frees of every thread, to say where a stale message's
 * buffer had been before (a ring, written without order: diagnostics). */
struct freed_buffer {
    std::atomic<uintptr_t> addr{0};
    std::atomic<size_t>    len{0};
    std::atomic<int>       thread{0}, round{0}, kind{0};
};
freed_buffer g_freed[1024];
std::atomic<unsigned> g_freed_next{0};

void note_free(void *buf, size_t len, int thread, int round, int kind)
{
    freed_buffer &f = g_freed[g_freed_next.fetch_add(1) % 1024];
    f.addr   = reinterpret_cast<uintptr_t>(buf);
    f.len    = len;
    f.thread = thread;
    f.round  = round;
    f.kind   = kind;
}

/* A stale message, said with what was freed over its buffer lately. */
void say_stale(int thread, int round, int kind, const void *buf, size_t len,
               const void *rbuf, uint32_t seed)
{
    size_t bad = 0, first = pattern_first_bad(rbuf, len, seed);
    for (size_t i = first; i < len; ++i) {
        bad += static_cast<const uint8_t*>(rbuf)[i] != pattern_byte(seed, i);
    }
    std::printf("stale: thread %d round %d kind %d buf %p len %zu: first bad byte "
                "%zu, %zu bad\n", thread, round, kind, buf, len, first, bad);
    const uintptr_t s = reinterpret_cast<uintptr_t>(buf), e = s + len;
    for (const freed_buffer &f : g_freed) {
        if ((f.addr < e) && (s < f.addr + f.len)) {
            std::printf("  freed before: %#lx len %zu by thread %d round %d kind %d\n",
                        (unsigned long)f.addr.load(), f.len.load(), f.thread.load(),
                        f.round.load(), f.kind.load());
        }
    }
}

threads_result thread_rounds(ucp_context_h ctx, int nthreads, int rounds,
                             const std::string &alloc)
{
    const size_t sizes[] = {512 << 10, 1 << 20, 2 << 20};
    const size_t max     = 2 << 20;
    std::vector<peers> pp(static_cast<size_t>(nthreads));
    threads_result total;
    for (peers &p : pp) {
        if (!open_peers(p, ctx)) {
            total.failed = 1;
            return total;
        }
    }
    std::vector<threads_result> res(static_cast<size_t>(nthreads));
    std::vector<std::thread> th;
    std::atomic<int> ready{0};
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < nthreads; ++i) {
        th.emplace_back([&, i] {
            peers &p          = pp[static_cast<size_t>(i)];
            threads_result &r = res[static_cast<size_t>(i)];
            void *rbuf        = libc_mmap(max);
            ready.fetch_add(1);
            while (ready.load() < nthreads) {
            }
            for (int n = 0; n < rounds; ++n) {
                const size_t len = sizes[(n + i) % 3];
                const int kinds  = (alloc == "mix") ? 3 : 2;
                int kind         = (n / 3 + i) % kinds;
                if (alloc == "libc") {
                    kind = 1;
                } else if (alloc == "malloc") {
                    kind = 1 + kind; /* libc munmap and malloc */
                }
                void *buf = (kind == 2) ? std::malloc(len) : libc_mmap(len);
                const uint32_t seed = (static_cast<uint32_t>(i) << 20) +
                                      static_cast<uint32_t>(n) + 1;
                if ((buf == nullptr) || (buf == MAP_FAILED)) {
                    ++r.failed;
                    continue;
                }
                pattern_fill(buf, len, seed);
                const bool sent = p.tag(buf, rbuf, len, 0x1000 + n);
                ++r.messages;
                if (!sent) {
                    ++r.failed;
                } else if (pattern_first_bad(rbuf, len, seed) != len) {
                    ++r.stale; /* another buffer's old pages were sent */
                    say_stale(i, n, kind, buf, len, rbuf, seed);
                }
                note_free(buf, len, i, n, kind);
                if (kind == 0) {
                    raw_munmap(buf, len);
                } else if (kind == 1) {
                    munmap(buf, len);
                } else {
                    std::free(buf);
                }
            }
            munmap(rbuf, max);
        });
    }
    for (std::thread &t : th) {
        t.join();
    }
    total.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() -
                                                  t0).count();
    for (const threads_result &r : res) {
        total.messages += r.messages;
        total.stale    += r.stale;
        total.failed   += r.failed;
    }
    for (peers &p : pp) {
        p.close();
    }
    return total;
}

/* --component sync: libucm_kernel preloaded, found by name (this program
 * does not link it) */
bool sync_delivery_running(kreg_caps_t *caps)
{
    auto query = reinterpret_cast<void (*)(kreg_caps_t*)>(
            dlsym(RTLD_DEFAULT, "kreg_query"));
    *caps = kreg_caps_t{};
    if (query == nullptr) {
        std::printf("error: kreg_query not found: preload libucm_kernel.so\n");
        return false;
    }
    query(caps);
    return caps->running && caps->sync_delivery;
}

/* prints the module's counts; returns held_timeouts (-1: unknown) */
long print_sync_stats()
{
    auto get = reinterpret_cast<void (*)(kreg_stats_t*)>(
            dlsym(RTLD_DEFAULT, "kreg_get_stats"));
    kreg_stats_t st{};
    if (get == nullptr) {
        return -1;
    }
    get(&st);
    std::printf("SYNC queued=%lu signalled=%lu self_held=%lu held=%lu "
                "held_waits=%lu held_timeouts=%lu hold_nomem=%lu late=%lu "
                "unpinned=%lu drained=%lu\n",
                (unsigned long)st.sync.queued, (unsigned long)st.sync.signalled,
                (unsigned long)st.sync.self_held, (unsigned long)st.sync.held,
                (unsigned long)st.sync.held_waits,
                (unsigned long)st.sync.held_timeouts,
                (unsigned long)st.sync.hold_nomem, (unsigned long)st.sync.late,
                (unsigned long)st.sync.unpinned, (unsigned long)st.sync.drained);
    std::printf("SYNC passes=%lu threads=%lu own_changes=%lu drain_waits=%lu "
                "inflight_full=%lu irq_releases=%lu irq_next_held=%lu "
                "irq_unwatched=%lu born_held=%lu irq_next_released=%lu "
                "call_releases=%lu irq_passes=%lu\n",
                (unsigned long)st.sync.passes,
                (unsigned long)st.sync.threads, (unsigned long)st.sync.own_changes,
                (unsigned long)st.sync.drain_waits,
                (unsigned long)st.sync.inflight_full,
                (unsigned long)st.sync.irq_releases,
                (unsigned long)st.sync.irq_next_held,
                (unsigned long)st.sync.irq_unwatched,
                (unsigned long)st.sync.born_held,
                (unsigned long)st.sync.irq_next_released,
                (unsigned long)st.sync.call_releases,
                (unsigned long)st.sync.irq_passes);
    return static_cast<long>(st.sync.held_timeouts);
}

} // namespace

int main(int argc, char **argv)
{
    const char *component = nullptr;
    int rounds = 20;
    int race_rounds = 0;
    bool data = true, remaps = true;
    int churn = -1, warmup = 5, nthreads = 0;
    bool bad = false;
    size_t size = 1 << 20;
    std::string alloc = "mmap";
    bool fork_init = false;

    for (int i = 1; i < argc; ++i) {
        std::string a = argv[i];
        if ((a == "--component") && (i + 1 < argc)) {
            component = argv[++i];
        } else if ((a == "--rounds") && (i + 1 < argc)) {
            rounds = std::atoi(argv[++i]);
        } else if ((a == "--race-rounds") && (i + 1 < argc)) {
            race_rounds = std::atoi(argv[++i]);
        } else if (a == "--no-data") {
            data = false;
        } else if (a == "--no-remap") {
            remaps = false;
        } else if ((a == "--churn") && (i + 1 < argc)) {
            churn = std::atoi(argv[++i]);
        } else if ((a == "--warmup") && (i + 1 < argc)) {
            warmup = std::atoi(argv[++i]);
        } else if ((a == "--size") && (i + 1 < argc)) {
            size = std::strtoull(argv[++i], nullptr, 0);
        } else if ((a == "--alloc") && (i + 1 < argc)) {
            alloc = argv[++i];
        } else if (a == "--fork-init") {
            fork_init = true;
        } else if ((a == "--threads") && (i + 1 < argc)) {
            nthreads = std::atoi(argv[++i]);
        } else {
            bad = true;
        }
    }
    if (bad || (churn < -1) || (warmup < 0) || (size < 8) || (size % 8 != 0) ||
        (nthreads < 0) ||
        ((alloc != "mmap") && (alloc != "malloc") && (alloc != "thp") &&
         (alloc != "libc") && (alloc != "mix") && (alloc != "raw"))) {
        std::fprintf(stderr, "usage: ucp_data [--component LIB|plugin|sync] "
                     "[--rounds N] [--race-rounds N] [--no-data] [--no-remap]\n"
                     "       ucp_data [--component LIB] --churn N [--size S "
                     "(a multiple of 8)] [--alloc malloc|mmap|thp] [--warmup W]\n"
                     "                [--fork-init]\n"
                     "       ucp_data [--component sync|kreg-start] --threads T "
                     "[--rounds N] [--alloc mix|libc]\n");
        return 2;
    }
    if (churn >= 0) {
        data = remaps = false;
    }

    if (fork_init && !rdma_fork_init()) {
        return 1;
    }
    const char *label = "hooks";
    std::string label_what = "ib_regcache";
    const bool plugin = (component != nullptr) && !std::strcmp(component, "plugin");
    const bool sync   = (component != nullptr) && !std::strcmp(component, "sync");
    const bool control = (component != nullptr) && !std::strcmp(component, "kreg-start");
    if (control) {
        /* the control of --component sync: the source runs (UCM's hooks off
         * for unmaps) and UCX_KREG_SYNC=n: nothing tells UCX's own caches */
        auto start = reinterpret_cast<ucs_status_t (*)(void)>(
                dlsym(RTLD_DEFAULT, "kreg_start"));
        kreg_caps_t caps;
        if ((start == nullptr) || (start() != UCS_OK) ||
            sync_delivery_running(&caps) || !caps.running) {
            std::printf("FAIL: --component kreg-start: kreg_start() must run "
                        "without synchronous delivery (preload libucm_kernel.so, "
                        "UCX_KREG_SYNC=n)\n");
            return 1;
        }
        label     = "async";
        component = nullptr; /* stale rounds are what it shows */
    } else if (sync) {
        /* stock transports, UCX's own caches, libucm_kernel preloaded */
        kreg_caps_t caps;
        if (!sync_delivery_running(&caps)) {
            std::printf("FAIL: --component sync: libucm_kernel is not running "
                        "synchronous delivery (running %d, backend %d, reason "
                        "%d)\n", caps.running, caps.backend, caps.reason);
            return 1;
        }
        std::printf("info: synchronous delivery, signal %d\n", caps.sync_signal);
        label      = "sync";
        label_what = "UCX's own cache with synchronous delivery";
    } else if (plugin) {
        const char *path = getenv("UCX_PLUGIN_PATH");
        if ((path == nullptr) || (*path == '\0')) {
            std::printf("FAIL: --component plugin without UCX_PLUGIN_PATH\n");
            return 1;
        }
        label = "kernel";
    } else if (component != nullptr) {
        void *lib = dlopen(component, RTLD_NOW | RTLD_GLOBAL);
        auto status_fn = lib ? reinterpret_cast<ucs_status_t (*)(void)>(
                                   dlsym(lib, "kreg_ib_regcache_status"))
                             : nullptr;
        if ((status_fn == nullptr) || (status_fn() != UCS_OK)) {
            std::printf("FAIL: %s not loaded or not registered: %s\n",
                        component, lib ? "status" : dlerror());
            return 1;
        }
        label = "kernel";
    }
    const char *tls = getenv("UCX_TLS");
    std::printf("info: UCX %s, UCX_TLS=%s, %s\n", ucp_get_version_string(),
                tls ? tls : "(default)",
                component ? "ib_regcache loaded" : "stock UCX");

    if (nthreads > 0) {
        ucp_context_h ctx = open_context(true);
        if (ctx == nullptr) {
            std::printf("skip: no UCP context here\n");
            return 77;
        }
        const std::string how = ((alloc == "libc") || (alloc == "raw") ||
                                 (alloc == "malloc")) ? alloc : "mix";
        threads_result r = thread_rounds(ctx, nthreads, rounds, how);
        ucp_cleanup(ctx);
        std::printf("%s: ucp threads T=%d alloc=%s: %d of %d messages stale "
                    "(%d failed), %.1f messages/s\n", label, nthreads,
                    how.c_str(), r.stale, r.messages, r.failed,
                    r.seconds > 0 ? r.messages / r.seconds : 0.0);
        std::printf("THREADS t=%d alloc=%s messages=%d stale=%d failed=%d "
                    "rate=%.2f\n", nthreads, how.c_str(), r.messages, r.stale,
                    r.failed, r.seconds > 0 ? r.messages / r.seconds : 0.0);
        check((r.failed == 0) && (r.messages == nthreads * rounds),
              "every message of every thread sent");
        if (sync) {
            const long timeouts = print_sync_stats();
            check(r.stale == 0, "no stale message with synchronous delivery (" +
                  std::to_string(nthreads) + " threads)");
            check(timeouts == 0, "no hold timed out (held_timeouts " +
                  std::to_string(timeouts) + ")");
        }
        std::printf("%s\n", g_failures ? "FAILED" : "PASSED");
        return g_failures ? 1 : 0;
    }

    peers p;
    if (!open_peers(p)) {
        std::printf("skip: UCP cannot connect two workers here\n");
        p.close();
        return 77;
    }
    if (plugin && !uct_component_registered("ib_regcache")) {
        std::printf("FAIL: UCX did not load ib_regcache from UCX_PLUGIN_PATH=%s\n",
                    getenv("UCX_PLUGIN_PATH"));
        p.close();
        return 1;
    }

    /* UCP's protocol thresholds of the endpoint: which of the sizes below
     * go eager and which rendezvous */
    char *info = nullptr;
    size_t info_len = 0;
    FILE *stream = open_memstream(&info, &info_len);
    if (stream != nullptr) {
        ucp_ep_print_info(p.ep[0], stream);
        std::fclose(stream);
        for (char *line = std::strtok(info, "\n"); line != nullptr;
             line = std::strtok(nullptr, "\n")) {
            if (std::strstr(line, "tag_send") != nullptr) {
                std::printf("info: ep 0->1 %s\n", line);
            }
        }
        std::free(info);
    }

    if (data) {
        data_tests(p);
    }
    if (remaps) {
        for (int m = 0; m < REMAP_LAST; ++m) {
            const char *mode = remap_mode_names[m];
            const int   n    = (m == REMAP_RACE) ? race_rounds : rounds;
            if (n <= 0) {
                continue;
            }
            remap_result r = remap_rounds(p, n, static_cast<remap_mode>(m));
            std::printf("%s: ucp remap %s thread: %d of %d rounds stale "
                        "(%d corrupt, %d failed, %d retried)\n", label,
                        mode, r.stale, n, r.corrupt, r.failed, r.retries);
            check(r.failed == 0, std::string("remap rounds ran (") + mode +
                  " thread)");
            if (component != nullptr) {
                check((r.stale == 0) && (r.corrupt == 0),
                      std::string("no stale data through ") + label_what +
                      " (" + mode + " thread)");
            }
        }
        if (sync) {
            print_sync_stats();
        }
    }

    if (churn >= 0) {
        churn_result r = churn_rounds(p, churn, warmup, size, alloc);
        double n = r.rounds ? r.rounds : 1;
        double med_round = median_of(r.round_us), med_send = median_of(r.send_us);
        std::printf("churn: %s alloc=%s size=%zu rounds=%d (after %d untimed): "
                    "%.1f us/round (%.1f rounds/s), median round %.1f us; "
                    "mean per round: alloc+fill %.1f us, send %.1f us (median "
                    "%.1f), check %.1f us, free %.1f us\n",
                    label, alloc.c_str(), size, r.rounds, warmup,
                    r.us_total / n, r.us_total ? 1e6 * r.rounds / r.us_total : 0,
                    med_round, r.us_alloc / n, r.us_send / n, med_send,
                    r.us_check / n, r.us_free / n);
        std::printf("%s: churn %s %zu B: %d of %d rounds stale (%d wrong, "
                    "%d failed), same address %d of %d\n", label,
                    alloc.c_str(), size, r.stale, r.rounds, r.wrong, r.failed,
                    r.same_address, r.rounds);
        std::printf("CHURN alloc=%s size=%zu rounds=%d us_round=%.2f "
                    "us_send=%.2f med_round=%.2f med_send=%.2f us_alloc=%.2f "
                    "us_free=%.2f stale=%d wrong=%d failed=%d same_address=%d "
                    "regs=%ld changed=%ld dontfork=%d fork=%s\n",
                    alloc.c_str(), size, r.rounds, r.us_total / n,
                    r.us_send / n, med_round, med_send, r.us_alloc / n,
                    r.us_free / n, r.stale, r.wrong, r.failed, r.same_address,
                    r.regs, r.changed, r.dontfork, rdma_fork_state());
        check((r.failed == 0) && (r.rounds == churn), "churn rounds ran");
        if (component != nullptr) {
            check((r.stale == 0) && (r.wrong == 0),
                  "no stale data through ib_regcache (churn)");
        }
    }

    p.close();
    std::printf("%s\n", g_failures ? "FAILED" : "PASSED");
    return g_failures ? 1 : 0;
}
