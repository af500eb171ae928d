#include "kreg_test.h"

#include <atomic>
#include <cerrno>
#include <climits>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <poll.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <ucm/api/ucm.h>

namespace kreg_test {

size_t page()
{
    static const size_t size = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    return size;
}

EventLog::EventLog()
{
    /* After kreg_start() the event is external: this installs no hook. */
    ucm_set_event_handler(UCM_EVENT_VM_UNMAPPED, 0, callback, this);
}

EventLog::~EventLog()
{
    ucm_unset_event_handler(UCM_EVENT_VM_UNMAPPED, callback, this);
}

void EventLog::callback(ucm_event_type_t, ucm_event_t *ev, void *arg)
{
    auto *self = static_cast<EventLog *>(arg);
    uintptr_t start = reinterpret_cast<uintptr_t>(ev->vm_unmapped.address);
    std::lock_guard<std::mutex> guard(self->lock_);
    self->ranges_.emplace_back(start, start + ev->vm_unmapped.size);
}

bool EventLog::covers(const void *addr, size_t len) const
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

size_t EventLog::count() const
{
    std::lock_guard<std::mutex> guard(lock_);
    return ranges_.size();
}

void EventLog::clear()
{
    std::lock_guard<std::mutex> guard(lock_);
    ranges_.clear();
}

Source::Source(const char *mode)
{
    /* "verify-wp": verify through UFFDIO_WRITEPROTECT, as on kernels
     * without WP_ASYNC */
    const bool wp = (mode != nullptr) && (strcmp(mode, "verify-wp") == 0);
    if (mode != nullptr) {
        setenv("UCX_KREG_MODE", wp ? "verify" : mode, 1);
    }
    if (wp) {
        setenv("UCX_KREG_WP_ASYNC", "n", 1);
    }
    status_ = kreg_start();
    unsetenv("UCX_KREG_MODE");
    unsetenv("UCX_KREG_WP_ASYNC");
}

bool is_verify(const char *mode)
{
    return strncmp(mode, "verify", 6) == 0;
}

Source::~Source()
{
    kreg_stop();
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

ChildResult run_child(const std::function<int()> &fn, int timeout_s)
{
    ChildResult res;
    int pipefd[2];
    if (pipe(pipefd) != 0) {
        res.output = "pipe failed";
        return res;
    }
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid == 0) {
        dup2(pipefd[1], 1);
        dup2(pipefd[1], 2);
        close(pipefd[0]);
        close(pipefd[1]);
        int rc = fn();
        fflush(stdout);
        fflush(stderr);
        _exit(rc);
    }
    close(pipefd[1]);
    const auto deadline = time(nullptr) + timeout_s;
    char buf[4096];
    for (;;) {
        struct pollfd pfd = {pipefd[0], POLLIN, 0};
        int left = static_cast<int>(deadline - time(nullptr));
        if (left <= 0) {
            kill(pid, SIGKILL);
            waitpid(pid, nullptr, 0);
            close(pipefd[0]);
            res.status = -1;
            return res;
        }
        if (poll(&pfd, 1, left * 1000) <= 0) {
            continue;
        }
        ssize_t n = read(pipefd[0], buf, sizeof(buf));
        if (n <= 0) {
            break;
        }
        res.output.append(buf, static_cast<size_t>(n));
    }
    close(pipefd[0]);
    int st = 0;
    /* the child closed its output; give it the rest of the time to exit */
    for (;;) {
        pid_t w = waitpid(pid, &st, WNOHANG);
        if (w == pid) {
            break;
        }
        if (time(nullptr) >= deadline) {
            kill(pid, SIGKILL);
            waitpid(pid, nullptr, 0);
            res.status = -1;
            return res;
        }
        usleep(1000);
    }
    res.status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    return res;
}

namespace {
const ucs_rcache_ops_t token_ops = {
    .mem_reg     = nullptr,
    .mem_dereg   = nullptr,
    .dump_region = nullptr,
};
} // namespace

TokenCache::TokenCache()
{
    static ucs_rcache_ops_t ops = token_ops;
    ops.mem_reg     = mem_reg;
    ops.mem_dereg   = mem_dereg;
    ops.dump_region = dump;

    ucs_rcache_params_t params = {};
    params.region_struct_size = sizeof(Region);
    params.alignment          = page();
    params.max_alignment      = page();
    params.ucm_events         = UCM_EVENT_VM_UNMAPPED;
    params.ucm_event_priority = 1000;
    params.ops                = &ops;
    params.context            = this;
    params.flags              = 0;
    params.max_regions        = ULONG_MAX;
    params.max_size           = SIZE_MAX;
    params.max_unreleased     = SIZE_MAX;
    ucs_status_t st = ucs_rcache_create(&params, "kreg_test", nullptr, &rcache_);
    if (st != UCS_OK) {
        /* as UCX's md does: no cache, every registration uncached */
        rcache_ = nullptr;
    }
}

TokenCache::~TokenCache()
{
    if (rcache_ != nullptr) {
        ucs_rcache_destroy(rcache_);
    }
}

ucs_status_t TokenCache::mem_reg(void *ctx, ucs_rcache_t *, void *arg,
                                 ucs_rcache_region_t *r, uint16_t)
{
    auto *self   = static_cast<TokenCache *>(ctx);
    auto *region = reinterpret_cast<Region *>(r);
    if (!kreg_watch(reinterpret_cast<void *>(r->super.start),
                    r->super.end - r->super.start, nullptr)) {
        return UCS_ERR_UNSUPPORTED; /* never cache what nothing watches */
    }
    /* arg: the looked-up address, where the mapping's token is */
    region->token   = *static_cast<volatile uint64_t *>(arg);
    region->watched = true;
    ++self->regs_;
    return UCS_OK;
}

void TokenCache::mem_dereg(void *, ucs_rcache_t *, ucs_rcache_region_t *r)
{
    kreg_unwatch(reinterpret_cast<void *>(r->super.start),
                 r->super.end - r->super.start);
}

void TokenCache::dump(void *, ucs_rcache_t *, ucs_rcache_region_t *r, char *buf,
                      size_t max)
{
    snprintf(buf, max, "token %lu",
             static_cast<unsigned long>(reinterpret_cast<Region *>(r)->token));
}

TokenCache::Hit TokenCache::lookup(void *addr, size_t len)
{
    Hit hit{true, false, false};
    if (rcache_ == nullptr) {
        ++uncached_;
        return hit;
    }
    kreg_prepare_lookup(addr, len);
    ucs_rcache_region_t *r = nullptr;
    ucs_status_t st = ucs_rcache_get(rcache_, addr, len, PROT_READ, addr, &r);
    const uint64_t now = *static_cast<volatile uint64_t *>(addr);
    if (st != UCS_OK) {
        ++uncached_; /* an uncached registration reads the memory as it is */
        hit.ok = true;
        return hit;
    }
    hit.ok     = true;
    hit.cached = true;
    hit.stale  = reinterpret_cast<Region *>(r)->token != now;
    ucs_rcache_region_put(rcache_, r);
    return hit;
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
