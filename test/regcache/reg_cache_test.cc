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
 *    time, and its key still packs.
 */
#include "uct_component.h"

#include <ucm_kernel/ucm_kernel.h>
#include <uct/api/uct.h>

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

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

    uct_md_close(md);
    std::printf("%s\n", g_failures ? "FAILED" : "PASSED");
    return g_failures ? 1 : 0;
}
