/* md_bench: a registration cache hit as a user meets it, the ib_regcache
 * component against UCX's stock registration cache (issue 10). Needs a
 * verbs device: run it in the Soft-RoCE VM (make bench-vm).
 *
 *   bench/md_bench --lib BUILD/.libs/libuct_ib_regcache.so [--reps N]
 *                  [--ms MS] [--device DEV] [--plugins DIR]
 *
 * Each configuration runs in a process of its own (hooks and UCX's external
 * event are process-global): the program re-executes itself. What one
 * operation is depends on the UCX it is built against (UCP_API_MINOR):
 *
 * UCX 1.13 (the stock IB md has a cache): one operation = uct_md_mem_reg +
 * uct_md_mem_dereg of a 64 KiB buffer that is already in the md's cache
 * (the first registration is made before timing, and every later one must
 * return the same handle: a hit).
 *
 *   default    the library dlopen'ed before UCT is used, md "ib_regcache",
 *              UCM's hooks off (as kreg-run runs it): the kernel source as
 *              a user gets it (the notifier where its module is loaded,
 *              else userfaultfd)
 *   uffd       the same with UCX_KREG_BACKEND=uffd, only where the notifier
 *              module is loaded (then default is the notifier)
 *   stock_md   no library: UCX's stock md "ib" with its own rcache and
 *              UCX's default UCM hooks
 *   sync       the same stock md and cache, fed by the kreg_notifier
 *              module's synchronous delivery (kreg_start() first,
 *              UCX_KREG_SYNC=y): no hook for unmaps; only where the module
 *              is loaded
 *   sync_user  the same stock md and cache, no hook for unmaps and no
 *              module: P3's munmap reported from a signal handler
 *              (bench_util.h): synchronous delivery's signal alone (P3
 *              only; its hit is stock's)
 *
 * UCX 1.16 and later (1.22 here): the stock IB md has no cache; the stock
 * cache is UCP's (one rcache per ucp context, hooks on by default). So both
 * sides are measured at UCP level, one ucp context per child (no worker):
 * one operation = ucp_mem_map (address + length of a buffer mapped once
 * before timing) + ucp_mem_unmap. Both include UCP's own memory handle
 * (ucp_mem_map callocs one, detects the memory type, unmap frees it).
 *
 *   default    UCX_PLUGIN_PATH=DIR (the component and libucs_kreg, which
 *              turns UCP's rcache off), UCX_TLS=rc_kreg, UCM's hooks off:
 *              UCP registers with our md every time, whose cache hits
 *   uffd       the same with UCX_KREG_BACKEND=uffd (notifier module loaded)
 *   stock_md   no plugin path, UCX_TLS=rc_verbs, UCX's defaults: UCP's
 *              rcache over UCX's IB md, UCM's hooks: a UCP rcache hit
 *   sync       the same, fed by synchronous delivery (kreg_start() before
 *              ucp_init, UCX_KREG_SYNC=y): a UCP rcache hit, no unmap hook
 *   With the module, "default" runs synchronous delivery too: libucs_kreg
 *   then leaves UCP's rcache on, above our md, and a hit is UCP's.
 *   uct_default  (a "#" line, not P2) ours alone at UCT level as on 1.13:
 *              uct_md_mem_reg + uct_md_mem_dereg on md "ib_regcache"
 *
 * A hit is checked at no cost to the timed loop (1.22): each child counts
 * ibv_reg_mr calls (this program interposes ibv_reg_mr and
 * ibv_reg_mr_iova2, which UCX's IB md calls through its PLT); the first
 * mapping must have called it (else the count is blind and the child
 * fails) and no later operation may; the rkey packed after timing must
 * equal the first one's (ucp_rkey_pack; the UCT line: the handle must be
 * the first one's, as on 1.13). The component comes from UCX_PLUGIN_PATH,
 * set in the child's environment before exec, never dlopen'ed: DIR
 * (--plugins), default BUILD/plugins for --lib BUILD/.libs/....
 *
 * Then, in the same child, P3 with real registrations (measure_free_cached):
 * a 1 MiB buffer registered (ibv_reg_mr, counted: every round must miss),
 * released into the cache, and its munmap timed, the invalidation included
 * (1.13: uct_md_mem_reg + dereg; 1.22: ucp_mem_map + unmap):
 *
 *   P3 md_munmap_1m.sync/stock_md 1.10    median ratio of the ns
 *
 * A run takes every configuration once, in an order that rotates from run
 * to run; a child times batches of operations for about MS ms, each batch
 * between two runs of a reference loop, and reports the median batch in ns
 * per operation and in reference-loop iterations (bench_util.h, "the speed
 * state"). Printed: for each configuration but stock_md, the median over
 * the runs of the ratio to stock_md measured in the same run, in
 * reference-loop units, and a raw line with the ns and their ratio:
 *
 *   # backend: NAME mode: NAME (...)     what "default" is here
 *   P2 md_hit_64k.default/stock_md 1.23
 *   # raw md_hit_64k.default/stock_md: 61.0 ns vs 49.6 ns (medians); ...
 *
 * Exit status: 0, or 1 if a child failed (no device, not a hit, ...). */
#include "bench_util.h"
#include "test/regcache/uct_component.h"

#include <ucp/api/ucp.h>
#include <uct/api/uct.h>

#include <dlfcn.h>
#include <map>

/* UCX removed the IB md's own cache in 1.16: from then on the stock cache
 * is UCP's, and both configurations are measured through UCP */
#if (UCP_API_MAJOR > 1) || (UCP_API_MINOR >= 16)
#define MD_BENCH_UCP 1
#else
#define MD_BENCH_UCP 0
#endif

/* ---- counting ibv_reg_mr --------------------------------------------------- *
 * UCX's IB md (libuct_ib.so.0, loaded by UCX) calls ibv_reg_mr_iova2
 * (rdma-core's inline ibv_reg_mr with non-constant access flags) or
 * ibv_reg_mr through its PLT; this executable exports both (Makefile.inc:
 * --export-dynamic-symbol), so they resolve here first. A miss of any cache
 * registers, a hit never does. The real functions are looked up in the
 * libibverbs that is loaded (never another copy). */
namespace {
std::atomic<uint64_t> reg_mr_calls{0};

void *real_verbs(const char *name, const char *version)
{
    void *lib = dlopen("libibverbs.so.1", RTLD_NOW | RTLD_NOLOAD);
    void *fn  = (lib == nullptr) ? nullptr : dlvsym(lib, name, version);
    if ((fn == nullptr) && (lib != nullptr)) {
        fn = dlsym(lib, name);
    }
    if (fn == nullptr) {
        fprintf(stderr, "md_bench: %s not found in the loaded libibverbs\n", name);
        abort();
    }
    return fn;
}
} // namespace

extern "C" {
/* struct ibv_mr *, struct ibv_pd *: opaque here (verbs.h makes ibv_reg_mr a
 * macro) */
__attribute__((visibility("default"))) void *
ibv_reg_mr_iova2(void *pd, void *addr, size_t length, uint64_t iova,
                 unsigned int access)
{
    using fn_t = void *(*)(void*, void*, size_t, uint64_t, unsigned int);
    static const fn_t real = reinterpret_cast<fn_t>(real_verbs("ibv_reg_mr_iova2",
                                                               "IBVERBS_1.8"));
    reg_mr_calls.fetch_add(1, std::memory_order_relaxed);
    return real(pd, addr, length, iova, access);
}

__attribute__((visibility("default"))) void *
ibv_reg_mr(void *pd, void *addr, size_t length, int access)
{
    using fn_t = void *(*)(void*, void*, size_t, int);
    static const fn_t real = reinterpret_cast<fn_t>(real_verbs("ibv_reg_mr",
                                                               "IBVERBS_1.1"));
    reg_mr_calls.fetch_add(1, std::memory_order_relaxed);
    return real(pd, addr, length, access);
}
}

using namespace bench;

namespace {

constexpr size_t kLen = 64 * 1024;

/* ---- child ---------------------------------------------------------------- */

/* ns per operation, batches of `batch` operations for about `ms` of wall
 * time, each between two reference loops (bench_util.h, "the speed
 * state"): the median batch in ns and in reference-loop units */
template <class Op> batch_times time_ops(Op &&op, double ms)
{
    constexpr unsigned batch = 2000;
    return time_batches([&]() -> double {
        const uint64_t t0 = now_ns();
        for (unsigned i = 0; i < batch; ++i) {
            if (!op()) {
                return -1;
            }
        }
        return static_cast<double>(now_ns() - t0) / batch;
    }, ms);
}

uint64_t reg_mr_count()
{
    return reg_mr_calls.load(std::memory_order_relaxed);
}

/* ours: prints the "# backend:" line; false if the kernel source does not
 * run */
bool print_backend(const std::string &config)
{
    kreg_caps_t caps;
    kreg_query(&caps);
    if (!caps.running) {
        fprintf(stderr, "md_bench: kernel source not running (%s)\n",
                kreg_reason_str(caps.reason));
        return false;
    }
    printf("# backend: %s mode: %s (config %s: %s)\n",
           kreg_backend_str(caps.backend), kreg_mode_str(caps.mode),
           config.c_str(), caps.why_backend);
    return true;
}

void *map_buffer()
{
    void *buf = mmap(nullptr, kLen, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (buf == MAP_FAILED) {
        die("mmap");
    }
    memset(buf, 1, kLen);
    return buf;
}

/*
 * P3 with real registrations: a 1 MiB buffer mapped, written, registered (a
 * miss: ibv_reg_mr pins it) and released into the cache by reg_put, then
 * its munmap timed: what freeing a cached buffer costs, the invalidation
 * included (UCM's hook runs inside munmap; synchronous delivery's handler
 * before munmap returns). The buffer is mapped at one place every round
 * (bench_util.h, fixed_slot), so every registration must call ibv_reg_mr:
 * a hit would be the last round's registration of the same address, stale.
 */
constexpr size_t kFreeLen = size_t(1) << 20;

template <class RegPut>
int measure_free_cached(const std::string &config, RegPut &&reg_put, double ms)
{
    char *const slot = fixed_slot();
    uint64_t round = 0, stale = 0;
    const batch_times t = time_batches([&]() -> double {
        constexpr unsigned batch = 8;
        uint64_t ns = 0;
        for (unsigned i = 0; i < batch; ++i, ++round) {
            void *p = mmap(slot, kFreeLen, PROT_READ | PROT_WRITE,
                           MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
            if (p == MAP_FAILED) {
                die(errno == EEXIST ? "mmap: another mapping took the measured slot"
                                     : "mmap");
            }
            memset(p, static_cast<int>(round), kFreeLen);
            const uint64_t regs = reg_mr_count();
            if (!reg_put(p, kFreeLen)) {
                return -1;
            }
            stale += reg_mr_count() == regs;
            const uint64_t t0 = now_ns();
            munmap(p, kFreeLen);
            sync_user_report(p, kFreeLen);
            ns += now_ns() - t0;
        }
        return static_cast<double>(ns) / batch;
    }, ms);
    if ((t.ns < 0) || stale) {
        fprintf(stderr, "md_bench: %s: P3: %s\n", config.c_str(), (t.ns < 0) ?
                "a registration failed" : "a registration of a new buffer hit the "
                "cache (stale)");
        return 4;
    }
    printf("R md_munmap_1m %.2f\n", t.ns);
    printf("R md_munmap_1m.ref %.4f\n", t.in_ref);
    return 0;
}

/* UCX's stock cache: no md of ours (stock_md, sync, sync_user) */
bool stock_cache(const std::string &config)
{
    return (config == "stock_md") || (config == "sync") || (config == "sync_user");
}

int report(const std::string &config, const batch_times &t, bool hit)
{
    if ((t.ns < 0) || !hit) {
        fprintf(stderr, "md_bench: %s: %s\n", config.c_str(),
                (t.ns < 0) ? "a registration failed" : "a registration missed the cache");
        return 4;
    }
    printf("R md_hit_64k %.2f\n", t.ns);
    printf("R md_hit_64k.ref %.4f\n", t.in_ref);
    printf("R md_hit_64k.ref_ns %.4f\n", t.ref_ns);
    return 0;
}

/* UCT level: uct_md_mem_reg + uct_md_mem_dereg (UCX 1.13's configurations;
 * on 1.22 "uct_default", ours alone) */
int child_uct(const std::string &config, const std::string &lib,
              const std::string &device, double ms)
{
    const bool ours = !stock_cache(config);
#if !MD_BENCH_UCP
    if (ours && (dlopen(lib.c_str(), RTLD_NOW | RTLD_GLOBAL) == nullptr)) {
        fprintf(stderr, "md_bench: dlopen %s: %s\n", lib.c_str(), dlerror());
        return 3;
    }
#else
    (void)lib; /* the component comes from UCX_PLUGIN_PATH */
#endif

    std::string md_name;
    uct_component_h component = find_component(ours ? "ib_regcache" : "ib",
                                                md_name,
                                                device.empty() ? nullptr :
                                                                 device.c_str());
    if (component == nullptr) {
        fprintf(stderr, "md_bench: no md resource of %s%s%s (no verbs device?)\n",
                ours ? "ib_regcache" : "ib", device.empty() ? "" : " on ",
                device.c_str());
        return 3;
    }
    uct_md_config_t *md_config;
    uct_md_h md;
    if ((uct_md_config_read(component, nullptr, nullptr, &md_config) != UCS_OK) ||
        (uct_md_open(component, md_name.c_str(), md_config, &md) != UCS_OK)) {
        fprintf(stderr, "md_bench: cannot open md %s\n", md_name.c_str());
        return 3;
    }
    uct_config_release(md_config);

    if (ours && !print_backend(config)) {
        uct_md_close(md);
        return 3;
    }

    void *buf = map_buffer();
    const uint64_t regs0 = reg_mr_count();
    uct_mem_h first;
    if (uct_md_mem_reg(md, buf, kLen, UCT_MD_MEM_ACCESS_ALL, &first) != UCS_OK) {
        fprintf(stderr, "md_bench: first registration failed\n");
        return 3;
    }
    uct_md_mem_dereg(md, first);
    const uint64_t regs1 = reg_mr_count();
    if (regs1 == regs0) {
        fprintf(stderr, "md_bench: %s: the first registration called no "
                "ibv_reg_mr: cannot tell hits from misses\n", config.c_str());
        return 4;
    }

    bool hit = true;
    const batch_times t = time_ops([&]() {
        uct_mem_h memh;
        if (uct_md_mem_reg(md, buf, kLen, UCT_MD_MEM_ACCESS_ALL, &memh) != UCS_OK) {
            return false;
        }
        hit = hit && (memh == first);
        uct_md_mem_dereg(md, memh);
        return true;
    }, ms);
    if (reg_mr_count() != regs1) {
        fprintf(stderr, "md_bench: %s: %lu ibv_reg_mr calls while timing\n",
                config.c_str(), (unsigned long)(reg_mr_count() - regs1));
        hit = false;
    }
    int rc = report(config, t, hit);
    if (rc == 0) {
        rc = measure_free_cached(config, [&](void *p, size_t len) {
            uct_mem_h memh;
            if (uct_md_mem_reg(md, p, len, UCT_MD_MEM_ACCESS_ALL, &memh) != UCS_OK) {
                return false;
            }
            uct_md_mem_dereg(md, memh);
            return true;
        }, ms);
    }

    uct_md_close(md);
    munmap(buf, kLen);
    return rc;
}

#if MD_BENCH_UCP
/* the rkey of a mapping of buf, packed */
bool pack_rkey(ucp_context_h ctx, ucp_mem_h memh, std::string *rkey)
{
    void *buffer;
    size_t size;
    if (ucp_rkey_pack(ctx, memh, &buffer, &size) != UCS_OK) {
        return false;
    }
    rkey->assign(static_cast<const char*>(buffer), size);
    ucp_rkey_buffer_release(buffer);
    return true;
}

/* the context uses exactly one md, with transport tl on it */
bool check_context(ucp_context_h ctx, const std::string &config,
                   const std::string &tl)
{
    char *text  = nullptr;
    size_t size = 0;
    FILE *f     = open_memstream(&text, &size);
    if (f == nullptr) {
        die("open_memstream");
    }
    ucp_context_print_info(ctx, f);
    fclose(f);
    const std::string info(text, size);
    free(text);
    size_t mds = 0; /* "#            md 0  :  component ..." lines */
    for (size_t pos = 0; pos < info.size();) {
        size_t eol = info.find('\n', pos);
        eol        = (eol == std::string::npos) ? info.size() : eol;
        const size_t word = info.find_first_not_of("# ", pos);
        mds += (word < eol) && (info.compare(word, 3, "md ") == 0);
        pos  = eol + 1;
    }
    if ((mds != 1) || (info.find(tl + "/") == std::string::npos)) {
        fprintf(stderr, "md_bench: %s: the ucp context has %zu mds, want one "
                "with %s:\n%s", config.c_str(), mds, tl.c_str(), info.c_str());
        return false;
    }
    return true;
}

ucp_mem_map_params_t map_params(void *address, size_t length)
{
    ucp_mem_map_params_t mp = {};
    mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
    mp.address    = address;
    mp.length     = length;
    return mp;
}

/* one ucp_mem_map + ucp_mem_unmap (the operation timed) */
bool map_unmap(ucp_context_h ctx, const ucp_mem_map_params_t &mp)
{
    ucp_mem_h m;
    if (ucp_mem_map(ctx, &mp, &m) != UCS_OK) {
        return false;
    }
    ucp_mem_unmap(ctx, m);
    return true;
}

/* UCP level (UCX 1.16+): ucp_mem_map + ucp_mem_unmap */
int child_ucp(const std::string &config, double ms)
{
    const bool ours = !stock_cache(config);
    ucp_config_t *ucp_config;
    ucp_context_h ctx;
    ucp_params_t params = {};
    params.field_mask   = UCP_PARAM_FIELD_FEATURES;
    params.features     = UCP_FEATURE_RMA;
    if ((ucp_config_read(nullptr, nullptr, &ucp_config) != UCS_OK) ||
        (ucp_init(&params, ucp_config, &ctx) != UCS_OK)) {
        fprintf(stderr, "md_bench: %s: ucp_init failed (UCX_TLS=%s)\n",
                config.c_str(), getenv("UCX_TLS") ? getenv("UCX_TLS") : "");
        return 3;
    }
    ucp_config_release(ucp_config);
    /* ours: libucs_kreg turned UCP's cache off before UCP read it (the md
     * refuses to open otherwise), unless synchronous delivery serves the
     * process; stock: UCX's default, on */
    const char *rcache_env = getenv("UCX_RCACHE_ENABLE");
    const bool rcache_off = (rcache_env != nullptr) && (strcmp(rcache_env, "n") == 0);
    kreg_caps_t caps;
    kreg_query(&caps);
    const bool want_off = ours && !caps.sync_delivery;
    if (!check_context(ctx, config, ours ? "rc_kreg" : "rc_verbs") ||
        (want_off != rcache_off) || (ours && !print_backend(config))) {
        if (want_off != rcache_off) {
            fprintf(stderr, "md_bench: %s: UCX_RCACHE_ENABLE=%s, want %s\n",
                    config.c_str(), rcache_env ? rcache_env : "(unset)",
                    want_off ? "n (libucs_kreg)" : "(unset)");
        }
        ucp_cleanup(ctx);
        return 3;
    }

    void *buf = map_buffer();
    const ucp_mem_map_params_t mp = map_params(buf, kLen);

    /* the first mapping registers (and is cached), the rest must hit */
    const uint64_t regs0 = reg_mr_count();
    ucp_mem_h memh;
    std::string first_rkey, rkey;
    if (ucp_mem_map(ctx, &mp, &memh) != UCS_OK) {
        fprintf(stderr, "md_bench: %s: first ucp_mem_map failed\n", config.c_str());
        return 3;
    }
    const bool packed = pack_rkey(ctx, memh, &first_rkey);
    ucp_mem_unmap(ctx, memh);
    const uint64_t regs1 = reg_mr_count();
    if (!packed || (regs1 == regs0)) {
        fprintf(stderr, "md_bench: %s: %s\n", config.c_str(), !packed ?
                "ucp_rkey_pack failed" : "the first mapping called no ibv_reg_mr: "
                "cannot tell hits from misses");
        return 4;
    }

    const batch_times t = time_ops([&]() { return map_unmap(ctx, mp); }, ms);

    bool hit = (reg_mr_count() == regs1);
    if (!hit) {
        fprintf(stderr, "md_bench: %s: %lu ibv_reg_mr calls while timing\n",
                config.c_str(), (unsigned long)(reg_mr_count() - regs1));
    }
    if (ucp_mem_map(ctx, &mp, &memh) == UCS_OK) {
        if (!pack_rkey(ctx, memh, &rkey) || (rkey != first_rkey)) {
            fprintf(stderr, "md_bench: %s: the rkey after timing is not the "
                    "first mapping's\n", config.c_str());
            hit = false;
        }
        ucp_mem_unmap(ctx, memh);
    } else {
        hit = false;
    }
    if (reg_mr_count() != regs1) {
        hit = false;
    }
    int rc = report(config, t, hit);
    if (rc == 0) {
        rc = measure_free_cached(config, [&](void *p, size_t len) {
            return map_unmap(ctx, map_params(p, len));
        }, ms);
    }

    ucp_cleanup(ctx);
    munmap(buf, kLen);
    return rc;
}
#endif

int child(const std::string &config, const std::string &lib,
          const std::string &device, double ms)
{
    /* before UCX makes its caches: UCM_EVENT_VM_UNMAPPED external */
    if ((config == "sync") && !kernel_start(config)) {
        return 3;
    }
    if ((config == "sync_user") && !sync_user_start()) {
        return 3;
    }
#if MD_BENCH_UCP
    if (config != "uct_default") {
        return child_ucp(config, ms);
    }
#endif
    return child_uct(config, lib, device, ms);
}

/* ---- parent --------------------------------------------------------------- */

std::vector<env_change> child_env(const std::string &config,
                                  const std::string &plugins,
                                  const std::string &device)
{
    /* stock_md: UCX's defaults (hooks); ours: the kernel source, hooks off;
     * sync: UCX's defaults and synchronous delivery (env_for) */
    const bool ours = !stock_cache(config);
    std::vector<env_change> env = env_for(((config == "sync") ||
                                           (config == "sync_user")) ? config :
                                          ours ? ((config == "uct_default") ?
                                                  "default" : config) : "hooks");
#if MD_BENCH_UCP
    /* ours: the component and libucs_kreg from the plugin directory, which
     * libucs reads in its constructor; UCP's cache as libucs_kreg leaves it
     * (off). stock: UCP's cache as UCX's default leaves it (on). */
    env.push_back({"UCX_PLUGIN_PATH", ours ? std::optional<std::string>(plugins) :
                                             std::nullopt});
    env.push_back({"UCX_RCACHE_ENABLE", std::nullopt});
    if (config != "uct_default") {
        env.push_back({"UCX_TLS", ours ? "rc_kreg" : "rc_verbs"});
        if (!device.empty()) {
            env.push_back({"UCX_NET_DEVICES", (device.find(':') == std::string::npos) ?
                                              device + ":1" : device});
        }
    }
#endif
    return env;
}

std::string default_plugins(const std::string &lib)
{
    /* BUILD/.libs/libuct_ib_regcache.so -> BUILD/plugins, else .libs */
    const size_t slash = lib.rfind('/');
    const std::string dir = (slash == std::string::npos) ? "." : lib.substr(0, slash);
    const std::string plugins = dir + "/../plugins";
    return (access((plugins + "/libuct_ib_regcache.so.0").c_str(), R_OK) == 0) ?
           plugins : dir;
}

int parent(int reps, const std::string &lib, const std::string &device,
           const std::string &plugins, double ms)
{
    std::vector<std::string> cfgs = {"default", "stock_md"};
    if (access("/dev/kreg_notifier", R_OK | W_OK) == 0) {
        cfgs.push_back("uffd");
        cfgs.push_back("sync");
    }
    /* synchronous delivery's signal and handler without the module (P3) */
    cfgs.push_back("sync_user");
#if MD_BENCH_UCP
    cfgs.push_back("uct_default");
#endif
    std::map<std::string, std::vector<double>> ns;        /* cfg -> per run */
    std::map<std::string, std::vector<double>> ratios;    /* cfg -> per run */
    std::map<std::string, std::vector<double>> ns_ratios; /* the same in ns */
    std::map<std::string, std::vector<double>> ref_ns;    /* the loop's speed */
    std::map<std::string, std::vector<double>> in_ref;    /* cfg -> per run */
    /* P3: the munmap of a cached 1 MiB buffer, ns and reference-loop units */
    std::map<std::string, std::vector<double>> free_ns, free_ratios, free_ref_ratios;
    std::string backend_line;
    int rc = 0;

#if MD_BENCH_UCP
    printf("# md_bench (UCX %d.%d: the stock IB md has no cache; stock = UCP's "
           "rcache): ucp_mem_map + ucp_mem_unmap (address+length) of a cached "
           "64 KiB buffer, one ucp context per child, both sides including "
           "UCP's memh (calloc, memory-type detection, free); default/uffd: "
           "UCX_TLS=rc_kreg from %s, UCP's rcache off, hooks off; stock_md: "
           "UCX_TLS=rc_verbs, UCP's rcache on, UCX's default hooks; "
           "%d runs, %.0f ms per child\n", UCP_API_MAJOR, UCP_API_MINOR,
           plugins.c_str(), reps, ms);
#else
    printf("# md_bench: uct_md_mem_reg + uct_md_mem_dereg of a cached 64 KiB "
           "buffer; %d runs, %.0f ms per child\n", reps, ms);
#endif
    for (int rep = 0; rep < reps; ++rep) {
        std::map<std::string, double> run, run_ns, run_ref_ns, run_free, run_free_ref;
        for (size_t i = 0; i < cfgs.size(); ++i) {
            const std::string &cfg = cfgs[(i + rep) % cfgs.size()];
            std::vector<std::string> args = {"--child", cfg, "--lib", lib, "--ms",
                                             std::to_string(ms)};
            if (!device.empty()) {
                args.insert(args.end(), {"--device", device});
            }
            child_result res = kreg_tools::run_self("md-bench-child", args,
                                                   child_env(cfg, plugins, device),
                                                   120, true);
            read_child_results(res.output, cfg, &backend_line,
                               [&](const char *key, double v) {
                                   if (strcmp(key, "md_hit_64k.ref") == 0) {
                                       run[cfg] = v;
                                   } else if (strcmp(key, "md_hit_64k") == 0) {
                                       run_ns[cfg] = v;
                                   } else if (strcmp(key, "md_hit_64k.ref_ns") == 0) {
                                       run_ref_ns[cfg] = v;
                                   } else if (strcmp(key, "md_munmap_1m") == 0) {
                                       run_free[cfg] = v;
                                   } else if (strcmp(key, "md_munmap_1m.ref") == 0) {
                                       run_free_ref[cfg] = v;
                                   }
                               });
            if (res.status != 0) {
                fprintf(stderr, "md_bench: child %s exited with %d\n", cfg.c_str(),
                        res.status);
                rc = 1;
            }
        }
        for (const auto &[cfg, v] : run) {
            ns[cfg].push_back(run_ns[cfg]);
            ref_ns[cfg].push_back(run_ref_ns[cfg]);
            in_ref[cfg].push_back(v);
            if ((cfg != "stock_md") && run.count("stock_md") && (run["stock_md"] > 0) &&
                (run_ns["stock_md"] > 0)) {
                ratios[cfg].push_back(v / run["stock_md"]);
                ns_ratios[cfg].push_back(run_ns[cfg] / run_ns["stock_md"]);
            }
        }
        for (const auto &[cfg, v] : run_free) {
            free_ns[cfg].push_back(v);
            if ((cfg != "stock_md") && (run_free["stock_md"] > 0) &&
                (run_free_ref["stock_md"] > 0)) {
                free_ratios[cfg].push_back(v / run_free["stock_md"]);
                free_ref_ratios[cfg].push_back(run_free_ref[cfg] /
                                               run_free_ref["stock_md"]);
            }
        }
    }
    if (!backend_line.empty()) {
        printf("%s\n", backend_line.c_str());
    }
    for (const std::string &cfg : cfgs) {
        if (cfg == "stock_md") {
            continue;
        }
        const std::string label = "md_hit_64k." + cfg + "/stock_md";
        const auto &r = ratios[cfg];
        /* on 1.22 the UCT line is ours alone at another level: not P2 */
        const char *tag = (cfg == "uct_default") ? "# uct" : "P2";
        if (r.empty()) {
            printf("%s %s n/a\n", tag, label.c_str());
            rc = 1;
            continue;
        }
        const auto mm = std::minmax_element(r.begin(), r.end());
        if (cfg == "uct_default") {
            printf("# uct md_hit_64k.uct_default: uct_md_mem_reg + uct_md_mem_dereg "
                   "on md ib_regcache (ours alone, UCT level; UCX 1.22's stock IB md "
                   "has no cache to compare with): %.1f ns, %.1f reference-loop "
                   "iterations (medians); against the UCP-level stock_md %.2f "
                   "(%.2f..%.2f over %zu runs; not a P2 figure: not the same "
                   "operation)\n", median(ns[cfg]), median(in_ref[cfg]), median(r),
                   *mm.first, *mm.second, r.size());
            continue;
        }
        if (cfg == "sync_user") {
            /* UCX's own cache with the unmap event external and no source:
             * what that mode alone does to a hit, without ours */
            printf("# sync_user md_hit_64k.sync_user/stock_md %.2f (%.2f..%.2f over %zu "
                   "runs, reference-loop units; UCM_EVENT_VM_UNMAPPED external, no "
                   "library: not a P2 figure)\n", median(r), *mm.first, *mm.second,
                   r.size());
            continue;
        }
        printf("P2 %s %.2f\n", label.c_str(), median(r));
        printf("# raw %s: %.1f ns vs %.1f ns (medians); ratio over %zu runs %.2f..%.2f; "
               "in reference-loop units (the figure), the ratio of ns %.2f; the loop "
               "%.2f vs %.2f ns an iteration\n",
               label.c_str(), median(ns[cfg]), median(ns["stock_md"]), r.size(),
               *mm.first, *mm.second, median(ns_ratios[cfg]), median(ref_ns[cfg]),
               median(ref_ns["stock_md"]));
    }
    /* P3 at the same level as the hit (on 1.22 UCP's; not uct_default) */
    for (const std::string &cfg : cfgs) {
        if ((cfg == "stock_md") || (cfg == "uct_default")) {
            continue;
        }
        const std::string label = "md_munmap_1m." + cfg + "/stock_md";
        const auto &r = free_ratios[cfg];
        if (r.empty()) {
            printf("P3 %s n/a\n", label.c_str());
            rc = 1;
            continue;
        }
        const auto mm = std::minmax_element(r.begin(), r.end());
        printf("P3 %s %.2f\n", label.c_str(), median(r));
        printf("# raw %s: %.1f ns vs %.1f ns (medians); ratio over %zu runs %.2f..%.2f "
               "(the figure, in ns); the same in iterations of the reference loop %.2f\n",
               label.c_str(),
               median(free_ns[cfg]), median(free_ns["stock_md"]), r.size(), *mm.first,
               *mm.second, median(free_ref_ratios[cfg]));
    }
    return rc;
}

} // namespace

int main(int argc, char **argv)
{
    std::string cfg, lib, device, plugins;
    int reps  = 7;
    double ms = 300;
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        if ((a == "--child") && (i + 1 < argc)) {
            cfg = argv[++i];
        } else if ((a == "--lib") && (i + 1 < argc)) {
            lib = argv[++i];
        } else if ((a == "--device") && (i + 1 < argc)) {
            device = argv[++i];
        } else if ((a == "--plugins") && (i + 1 < argc)) {
            plugins = argv[++i];
        } else if ((a == "--reps") && (i + 1 < argc)) {
            reps = std::max(1, atoi(argv[++i]));
        } else if ((a == "--ms") && (i + 1 < argc)) {
            ms = std::max(1.0, atof(argv[++i]));
        } else {
            fprintf(stderr, "usage: %s --lib LIBUCT_IB_REGCACHE.so [--reps N] "
                    "[--ms MS] [--device DEV] [--plugins DIR]\n", argv[0]);
            return 2;
        }
    }
    if (lib.empty()) {
        fprintf(stderr, "md_bench: --lib is required\n");
        return 2;
    }
    if (!cfg.empty()) {
        return child(cfg, lib, device, ms);
    }
    if (plugins.empty()) {
        plugins = default_plugins(lib);
    }
    return parent(reps, lib, device, plugins, ms);
}
