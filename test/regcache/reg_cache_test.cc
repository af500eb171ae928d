/*
 * Registration-cache check for the ib_regcache component, through UCT only.
 * Needs a verbs device (Soft-RoCE in the VM); exits 77 (skipped) without one.
 *
 *   reg_cache_test [DEVICE]
 *
 * 1. the component is registered and its md reports it as its component;
 * 2. an anonymous buffer registered 200 times is watched once (cached);
 * 3. after munmap + mmap at the same address the next registration is new
 *    (the kernel's unmap event reached the cache);
 * 4. a private file mapping: cached by the notifier backend and by
 *    userfaultfd with WP_ASYNC (Linux 6.7+); else registered uncached every
 *    time, and its key still packs;
 * 5. notifier: a miss that UCS merges with a cached neighbour whose unmap
 *    event is still on its way (queued behind one held in UCM) registers
 *    the requested range with one watch and logs no error (md.c, hazard
 *    "merge over an unmap in flight");
 * 6. a range with a hole of the caller's own still fails with UCX's error,
 *    merged or not.
 */
#include "test_buffers.h"
#include "uct_component.h"

#include <ucm/api/ucm.h>
#include <ucm_kernel/ucm_kernel.h>
#include <ucs/debug/log_def.h>
#include <uct/api/uct.h>

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

extern "C" ucs_status_t kreg_ib_regcache_status(void);

namespace {

int g_failures;

void check(bool ok, const char *what)
{
    std::printf("%s: %s\n", ok ? "ok  " : "FAIL", what);
    if (!ok) {
        ++g_failures;
    }
}

kreg_stats_t stats()
{
    kreg_stats_t s;
    kreg_get_stats(&s);
    return s;
}

uint64_t refusals(const kreg_stats_t &s)
{
    uint64_t n = 0;
    for (unsigned i = 0; i < KREG_REASON_LAST; ++i) {
        n += s.fallbacks[i];
    }
    return n;
}

/* Registers [buf, buf+len) n times; returns the watches it took. */
uint64_t reg_n(uct_md_h md, void *buf, size_t len, int n, bool pack,
               bool *all_ok)
{
    uint64_t before = stats().watch_calls;
    std::vector<char> rkey(64);

    *all_ok = true;
    for (int i = 0; i < n; ++i) {
        uct_mem_h memh;
        if (uct_md_mem_reg(md, buf, len, UCT_MD_MEM_ACCESS_ALL, &memh) !=
            UCS_OK) {
            *all_ok = false;
            break;
        }
        if (pack && (uct_md_mkey_pack(md, memh, rkey.data()) != UCS_OK)) {
            *all_ok = false;
        }
        uct_md_mem_dereg(md, memh);
    }
    return stats().watch_calls - before;
}

/* 5: a UCM handler that holds the first unmap event over [start, end)
 * until released, as a slow dispatcher thread would */
struct held_unmap {
    std::atomic<uintptr_t> start{0}, end{0};
    std::atomic<int>       entered{0}, release{0}, left{0};
};
held_unmap g_hold;
std::atomic<int> g_errors;

void hold_unmap(ucm_event_type_t, ucm_event_t *event, void *)
{
    const uintptr_t s = reinterpret_cast<uintptr_t>(event->vm_unmapped.address);
    const uintptr_t e = s + event->vm_unmapped.size;
    if ((s < g_hold.end.load()) && (g_hold.start.load() < e) &&
        !g_hold.entered.exchange(1)) {
        for (int ms = 0; (ms < 20000) && !g_hold.release.load(); ++ms) {
            usleep(1000);
        }
        g_hold.left.store(1);
    }
}

ucs_log_func_rc_t count_errors(const char *, unsigned, const char *,
                               ucs_log_level_t level,
                               const ucs_log_component_config_t *,
                               const char *, va_list)
{
    if (level <= UCS_LOG_LEVEL_ERROR) {
        ++g_errors;
    }
    return UCS_LOG_FUNC_RC_CONTINUE;
}

/* uct_md_mem_reg, counting the errors UCX logs meanwhile */
ucs_status_t reg_counting_errors(uct_md_h md, void *addr, size_t len,
                                 uct_mem_h *memh_p, int *errors)
{
    g_errors = 0;
    ucs_log_push_handler(count_errors);
    const ucs_status_t status = uct_md_mem_reg(md, addr, len,
                                               UCT_MD_MEM_ACCESS_ALL, memh_p);
    ucs_log_pop_handler();
    *errors = g_errors.load();
    return status;
}

bool wait_for(const std::atomic<int> &flag, int ms)
{
    for (; (ms > 0) && !flag.load(); --ms) {
        usleep(1000);
    }
    return flag.load() != 0;
}

void merge_over_unmap_in_flight(uct_md_h md)
{
    const size_t page = sysconf(_SC_PAGESIZE);
    char *buf = static_cast<char*>(mmap(nullptr, 3 * page, PROT_READ | PROT_WRITE,
                                        MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
    /* shared: a VMA of its own, that no munmap of buf splits or merges
     * with (a split inside a 2 MiB block notifies the whole block) */
    char *sentinel = static_cast<char*>(mmap(nullptr, page, PROT_READ | PROT_WRITE,
                                             MAP_SHARED | MAP_ANONYMOUS, -1, 0));
    if ((buf == MAP_FAILED) || (sentinel == MAP_FAILED)) {
        check(false, "mmap of 3 pages and 1");
        return;
    }
    memset(buf, 5, 3 * page);
    memset(sentinel, 6, page);

    /* [0, 2 pages) and the sentinel cached. The events of the cases before
     * are dispatched first: a late one for an address mmap gave out again
     * would drop them. */
    kreg_sync();
    bool reg_ok, sentinel_ok, hit_ok;
    reg_n(md, buf, 2 * page, 1, false, &reg_ok);
    reg_n(md, sentinel, page, 1, false, &sentinel_ok);
    kreg_sync();
    const bool cached = reg_n(md, buf, 2 * page, 1, false, &hit_ok) == 0;
    const bool ok     = reg_ok && sentinel_ok && hit_ok && cached;
    check(ok, "[0, 2 pages) registered and cached");

    /* The one thread that dispatches the kernel's events is held in UCM
     * with the sentinel's unmap; buf's unmap then waits behind it. */
    g_hold.start = reinterpret_cast<uintptr_t>(sentinel);
    g_hold.end   = g_hold.start + page;
    ucm_set_event_handler(UCM_EVENT_VM_UNMAPPED, -1000, hold_unmap, nullptr);
    /* raw syscalls: UCX's mmap hooks (installed for its memory type cache,
     * whatever the kernel source does) would tell the rcache at once, and
     * nothing would be in flight */
    raw_munmap(sentinel, page);
    const bool held = wait_for(g_hold.entered, 10000);
    check(held, "the event dispatcher is held in UCM");
    raw_munmap(buf, page);

    /* [1, 3 pages): UCS merges it with the cached [0, 2), whose first page
     * is gone and whose unmap the rcache has not heard of yet */
    const uint64_t watches = stats().watch_calls;
    uct_mem_h memh;
    int errors;
    const ucs_status_t status = reg_counting_errors(md, buf + page, 2 * page,
                                                    &memh, &errors);
    const uint64_t took = stats().watch_calls - watches;

    g_hold.release = 1;
    wait_for(g_hold.left, 10000);
    ucm_unset_event_handler(UCM_EVENT_VM_UNMAPPED, hold_unmap, nullptr);

    std::printf("info: merge over an unmap in flight: %s, %lu watches, %d "
                "errors logged\n", ucs_status_string(status),
                (unsigned long)took, errors);
    check(ok && held && (status == UCS_OK) && (errors == 0) && (took == 1),
          "a merge over an unmap in flight: registered, one watch, no error");
    if (status == UCS_OK) {
        uct_md_mem_dereg(md, memh);
    }
    munmap(buf + page, 2 * page);
}

/* 6: a range with a hole of the caller's own still fails with UCX's error,
 * also where UCS merges it with a cached region first (md.c's quiet
 * refusal of a merge with a hole must not swallow it) */
void bad_range_still_fails(uct_md_h md)
{
    const size_t page = sysconf(_SC_PAGESIZE);
    char *buf = static_cast<char*>(mmap(nullptr, 3 * page, PROT_READ | PROT_WRITE,
                                        MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
    if (buf == MAP_FAILED) {
        check(false, "mmap of 3 pages");
        return;
    }
    memset(buf, 7, 3 * page);
    kreg_sync();
    bool reg_ok;
    reg_n(md, buf, 2 * page, 1, false, &reg_ok);
    munmap(buf + 2 * page, page);

    uct_mem_h memh;
    int errors;
    const ucs_status_t status = reg_counting_errors(md, buf + page, 2 * page,
                                                    &memh, &errors);
    std::printf("info: a range with a hole of its own: %s, %d errors logged\n",
                ucs_status_string(status), errors);
    check(reg_ok && (status != UCS_OK) && (errors >= 1),
          "a range with a hole of the caller's own fails, with UCX's error");
    if (status == UCS_OK) {
        uct_md_mem_dereg(md, memh);
    }
    munmap(buf, 2 * page);
}

} // namespace

int main(int argc, char **argv)
{
    const char *device = (argc > 1) ? argv[1] : nullptr;
    const size_t len   = 1 << 20;
    std::string md_name;
    uct_md_config_t *config;
    uct_md_h md;
    bool ok;

    check(kreg_ib_regcache_status() == UCS_OK, "component registered");

    uct_component_h component = find_component("ib_regcache", md_name, device);
    if (component == nullptr) {
        std::printf("skip: no ib_regcache md resource (no verbs device)\n");
        return 77;
    }

    if ((uct_md_config_read(component, nullptr, nullptr, &config) != UCS_OK) ||
        (uct_md_open(component, md_name.c_str(), config, &md) != UCS_OK)) {
        std::printf("FAIL: cannot open md %s\n", md_name.c_str());
        return 1;
    }
    uct_config_release(config);

    uct_md_attr_t md_attr;
    uct_md_query(md, &md_attr);
    check(!strcmp(md_attr.component_name, "ib_regcache"),
          "md belongs to ib_regcache, not ib");

    kreg_caps_t caps;
    kreg_query(&caps);
    std::printf("info: md %s, kernel source running=%d external=%d "
                "wp_async=%d mode=%s\n", md_name.c_str(), caps.running,
                caps.external_event, caps.wp_async, kreg_mode_str(caps.mode));
    check(caps.running && caps.external_event,
          "kernel event source running, unmap event external");

    /* 2. cached */
    void *buf = mmap(nullptr, len, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    memset(buf, 1, len);
    uint64_t w = reg_n(md, buf, len, 200, true, &ok);
    std::printf("info: anonymous 1 MiB x200: %lu watches\n",
                (unsigned long)w);
    check(ok && (w == 1), "200 registrations of one buffer take one watch");

    /* 3. unmap + map again at the same address */
    uint64_t unmaps = stats().events[KREG_EV_UNMAP];
    munmap(buf, len);
    void *again = mmap(buf, len, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
    if (again == buf) {
        memset(buf, 2, len);
        w = reg_n(md, buf, len, 10, false, &ok);
        std::printf("info: after munmap+mmap: %lu watches, %lu unmap events\n",
                    (unsigned long)w,
                    (unsigned long)(stats().events[KREG_EV_UNMAP] - unmaps));
        check(ok && (w == 1), "the remapped buffer is registered anew, once");
        munmap(buf, len);
    } else {
        check(false, "could not map the same address again");
    }

    /* 4. private file mapping */
    int fd = open(argv[0], O_RDONLY);
    void *file = mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
    close(fd);
    if (file != MAP_FAILED) {
        uint64_t ref_before = refusals(stats());
        w = reg_n(md, file, 4096, 5, true, &ok);
        uint64_t refused = refusals(stats()) - ref_before;
        std::printf("info: private file mapping x5: %lu watches, %lu refused\n",
                    (unsigned long)w, (unsigned long)refused);
        if ((caps.backend == KREG_BACKEND_NOTIFIER) || caps.wp_async) {
            /* the notifier watches any mapping; userfaultfd needs WP_ASYNC */
            check(ok && (w == 1), (caps.backend == KREG_BACKEND_NOTIFIER) ?
                  "file mapping watched and cached (notifier)" :
                  "file mapping watched and cached (WP_ASYNC)");
        } else {
            check(ok && (refused >= 5),
                  "file mapping registered uncached each time, key packs");
        }
        munmap(file, 4096);
    }

    /* 5. merge over an unmap in flight */
    if (caps.backend == KREG_BACKEND_NOTIFIER) {
        merge_over_unmap_in_flight(md);
    } else {
        /* uffd: a lookup waits for events in flight (kreg_prepare_lookup;
         * test_events.cc), so no miss meets such a neighbour */
        std::printf("skip: merge over an unmap in flight: userfaultfd's lookup "
                    "waits for the events in flight\n");
    }

    /* 6. bad input loses nothing */
    bad_range_still_fails(md);

    uct_md_close(md);
    std::printf("%s\n", g_failures ? "FAILED" : "PASSED");
    return g_failures ? 1 : 0;
}
