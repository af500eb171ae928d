#include "kreg_test.h"

#include <cerrno>
#include <cstdarg>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <linux/magic.h>
#include <sys/mman.h>
#include <sys/vfs.h>
#include <unistd.h>

#include "kmod/uapi/kreg_notifier.h"
#include "tools/rcache_params.h"

namespace kreg_test {

size_t page()
{
    static const size_t size = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    return size;
}

int child_failure(int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    printf("child failed (%d): ", code);
    vprintf(fmt, ap);
    printf("\n");
    va_end(ap);
    fflush(stdout);
    return code;
}

/*                          name             backend     mode      !wp_async exact */
const source_config kAuto          {"auto",         "auto",     "verify", false,    true};
const source_config kUffd          {"uffd",         "uffd",     "verify", false,    true};
const source_config kUffdWp        {"uffd_wp",      "uffd",     "verify", true,     true};
const source_config kUffdPlain     {"uffd_plain",   "uffd",     "plain",  false,    false};
const source_config kNotifier      {"notifier",     "notifier", "verify", false,    true};
const source_config kNotifierPlain {"notifier_plain", "notifier", "plain", false,   false};

void PrintTo(const source_config &config, std::ostream *os)
{
    *os << config.name << " (UCX_KREG_BACKEND=" << config.backend
        << " UCX_KREG_MODE=" << config.mode
        << (config.no_wp_async ? " UCX_KREG_WP_ASYNC=n" : "") << ")";
}

std::vector<source_config> exact_configs()
{
    return {kUffd, kUffdWp, kNotifier};
}

std::vector<source_config> all_configs()
{
    return {kUffd, kUffdWp, kUffdPlain, kNotifier, kNotifierPlain};
}

std::string config_name(const testing::TestParamInfo<source_config> &info)
{
    return info.param.name;
}

scoped_source::scoped_source(const source_config &config)
{
    if ((strcmp(config.backend, "notifier") == 0) &&
        (access(KREG_NF_DEVICE, R_OK | W_OK) != 0)) {
        skip_ = "no " KREG_NF_DEVICE " (the kreg_notifier module is not "
                "loaded here; the Soft-RoCE VM suite runs these with it)";
        status_ = UCS_ERR_UNSUPPORTED;
        return;
    }
    setenv("UCX_KREG_BACKEND", config.backend, 1);
    setenv("UCX_KREG_MODE", config.mode, 1);
    if (config.no_wp_async) {
        setenv("UCX_KREG_WP_ASYNC", "n", 1);
    }
    status_ = kreg_start();
    unsetenv("UCX_KREG_BACKEND");
    unsetenv("UCX_KREG_MODE");
    unsetenv("UCX_KREG_WP_ASYNC");
}

scoped_source::~scoped_source()
{
    if (skip_.empty()) {
        kreg_stop();
    }
}

event_log::event_log()
{
    /* After kreg_start() the event is external: this installs no hook. */
    ucm_set_event_handler(UCM_EVENT_VM_UNMAPPED, 0, callback, this);
}

event_log::~event_log()
{
    ucm_unset_event_handler(UCM_EVENT_VM_UNMAPPED, callback, this);
}

void event_log::callback(ucm_event_type_t, ucm_event_t *ev, void *arg)
{
    auto *self = static_cast<event_log *>(arg);
    uintptr_t start = reinterpret_cast<uintptr_t>(ev->vm_unmapped.address);
    std::lock_guard<std::mutex> guard(self->lock_);
    self->ranges_.emplace_back(start, start + ev->vm_unmapped.size);
}

bool event_log::covers(const void *addr, size_t len) const
{
    uintptr_t s = reinterpret_cast<uintptr_t>(addr), e = s + len;
    std::lock_guard<std::mutex> guard(lock_);
    for (const auto &r : ranges_) {
        if (r.first <= s && e <= r.second) {
            return true;
        }
    }
    return false;
}

size_t event_log::count() const
{
    std::lock_guard<std::mutex> guard(lock_);
    return ranges_.size();
}

void event_log::clear()
{
    std::lock_guard<std::mutex> guard(lock_);
    ranges_.clear();
}

uint64_t kernel_reports()
{
    kreg_stats_t st;
    kreg_get_stats(&st);
    return st.dispatched;
}

int real_file(size_t len, std::string *why)
{
    char exe[4096];
    const ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
    std::string exe_dir = (n > 0) ? std::string(exe, n) : std::string(".");
    exe_dir = exe_dir.substr(0, exe_dir.rfind('/'));
    for (const std::string &dir : {std::string("/var/tmp"), exe_dir}) {
        struct statfs fs;
        if ((statfs(dir.c_str(), &fs) != 0) || (fs.f_type == TMPFS_MAGIC)) {
            continue;
        }
        std::string path = dir + "/kreg-file-XXXXXX";
        int fd = mkstemp(&path[0]);
        if (fd < 0) {
            continue;
        }
        unlink(path.c_str());
        if (ftruncate(fd, static_cast<off_t>(len)) == 0) {
            return fd;
        }
        close(fd);
    }
    *why = "no writable file system here but tmpfs (shared memory to the kernel)";
    return -1;
}

void *map_anon(size_t len, void *hint, int extra_flags)
{
    int flags = MAP_PRIVATE | MAP_ANONYMOUS | extra_flags;
    void *p   = mmap(hint, len, PROT_READ | PROT_WRITE, flags, -1, 0);
    if (p == MAP_FAILED) {
        return nullptr;
    }
    memset(p, 0x5a, len);
    return p;
}

token_cache::token_cache(bool watched) : watched_(watched)
{
    static const ucs_rcache_ops_t ops =
            kreg_tools::watched_rcache_ops(mem_reg, mem_dereg, dump);

    const ucs_rcache_params_t params =
            kreg_tools::watched_rcache_params(sizeof(token_region), &ops, this);
    ucs_status_t st = ucs_rcache_create(&params, "kreg_test", nullptr, &rcache_);
    if (st != UCS_OK) {
        /* as UCX's md does: no cache, every registration uncached */
        rcache_ = nullptr;
    }
}

token_cache::~token_cache()
{
    if (rcache_ != nullptr) {
        ucs_rcache_destroy(rcache_);
    }
}

ucs_status_t token_cache::mem_reg(void *ctx, ucs_rcache_t *, void *arg,
                                 ucs_rcache_region_t *r, uint16_t)
{
    auto *self = static_cast<token_cache *>(ctx);
    /* "registering" reads the token of the mapping looked up (arg) */
    struct token_reg {
        token_region                  *region;
        const volatile uint64_t *token;
        static ucs_status_t reg(void *a, void *, size_t)
        {
            auto *rg          = static_cast<token_reg *>(a);
            rg->region->token      = *rg->token;
            rg->region->token_addr = reinterpret_cast<uintptr_t>(rg->token);
            return UCS_OK;
        }
        static void dereg(void *) {}
    } reg{reinterpret_cast<token_region *>(r), static_cast<volatile uint64_t *>(arg)};
    if (!self->watched_) {
        static const uint64_t always = 1;
        reg.region->watch         = kreg_watch_t{};
        reg.region->watch.counter = &always;
        reg.region->watch.snapshot = always;
        ++self->regs_;
        return token_reg::reg(&reg, nullptr, 0);
    }
    ucs_status_t st = kreg_register_watched(
            reinterpret_cast<void *>(r->super.start), r->super.end - r->super.start,
            &reg.region->watch, token_reg::reg, token_reg::dereg, &reg, nullptr);
    if (st == UCS_OK) {
        ++self->regs_;
    }
    return st; /* never cache what nothing watches */
}

void token_cache::mem_dereg(void *ctx, ucs_rcache_t *, ucs_rcache_region_t *r)
{
    ++static_cast<token_cache *>(ctx)->deregs_;
    if (static_cast<token_cache *>(ctx)->watched_) {
        kreg_unwatch(&reinterpret_cast<token_region *>(r)->watch);
    }
}

void token_cache::dump(void *, ucs_rcache_t *, ucs_rcache_region_t *r, char *buf,
                      size_t max)
{
    snprintf(buf, max, "token %lu",
             static_cast<unsigned long>(reinterpret_cast<token_region *>(r)->token));
}

token_cache::lookup_result token_cache::lookup(void *addr, size_t len)
{
    lookup_result hit{true, false, false, false};
    if (rcache_ == nullptr) {
        ++uncached_;
        return hit;
    }
    ucs_rcache_region_t *r = nullptr;
    ucs_status_t st = kreg_rcache_get(rcache_, addr, len, PROT_READ, addr,
                                      offsetof(token_region, watch), &r);
    if (st != UCS_OK) {
        ++uncached_; /* an uncached registration reads the memory as it is */
        return hit;
    }
    const uint64_t now = *static_cast<volatile uint64_t *>(addr);
    hit.cached = true;
    const auto *tr = reinterpret_cast<token_region *>(r);
    hit.unjudged   = tr->token_addr != reinterpret_cast<uintptr_t>(addr);
    hit.stale      = !hit.unjudged && (tr->token != now);
    if (hit.stale) {
        fprintf(stderr, "stale hit: lookup %p+%zu, entry 0x%lx..0x%lx, token "
                "%lu read at 0x%lx, now %lu, watch slot %u counter %lu snapshot %lu\n",
                addr, len, r->super.start, r->super.end,
                static_cast<unsigned long>(tr->token), tr->token_addr,
                static_cast<unsigned long>(now), tr->watch.slot,
                static_cast<unsigned long>(*tr->watch.counter),
                static_cast<unsigned long>(tr->watch.snapshot));
    }
    ucs_rcache_region_put(rcache_, r);
    return hit;
}

ucs_rcache_region_t *token_cache::hold(void *addr, size_t len)
{
    ucs_rcache_region_t *r = nullptr;
    if ((rcache_ == nullptr) ||
        (kreg_rcache_get(rcache_, addr, len, PROT_READ, addr,
                         offsetof(token_region, watch), &r) != UCS_OK)) {
        return nullptr;
    }
    return r;
}

void token_cache::release(ucs_rcache_region_t *r)
{
    ucs_rcache_region_put(rcache_, r);
}

} // namespace kreg_test

/* UCM reads its hook settings when libucs loads, before main(): make sure
 * no hook can report an event, so every event comes from the kernel. */
int main(int argc, char **argv)
{
    const char *hook_mode = getenv("UCX_MEM_MMAP_HOOK_MODE");
    if ((hook_mode == nullptr) || strcmp(hook_mode, "none") != 0) {
        setenv("UCX_MEM_MMAP_HOOK_MODE", "none", 1);
        setenv("UCX_MEM_MALLOC_HOOKS", "n", 1);
        execv("/proc/self/exe", argv);
        perror("execv /proc/self/exe");
        return 1;
    }
    testing::InitGoogleTest(&argc, argv);
    return RUN_ALL_TESTS();
}
