/* No kernel support: where the kernel won't watch, a clear log line and an uncached
 * registration, never a cached one. Each case runs in a child process.
 *
 * Over 350 lines: one suite, every refusal a user can meet, on
 * shared child helpers.
 */
#include "kreg_config.h"
#include "kreg_test.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <signal.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <linux/userfaultfd.h>
#include <stddef.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

using namespace kreg_test;

namespace {

/* Makes the userfaultfd syscall fail with err, as a sandbox would. */
bool refuse_userfaultfd(int err)
{
    struct sock_filter filter[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_userfaultfd, 0, 1),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | (err & SECCOMP_RET_DATA)),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
    };
    struct sock_fprog prog = {sizeof(filter) / sizeof(filter[0]), filter};
    return prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0 &&
           prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog) == 0;
}

/* What a user gets from kreg_start in a child: its status, kreg_query,
 * and a watch of fresh memory. */
struct start_outcome {
    ucs_status_t  status;
    kreg_caps_t   caps;
    int           watched;
    kreg_reason_t why; /* the watch's reason */
    void         *memory;
};

using env_settings = std::initializer_list<std::pair<const char *, const char *>>;

/* In a child whose source is stopped: sets UCX_KREG_<name>=value for each
 * pair and starts it; the caller stops it. */
start_outcome start_with(env_settings env)
{
    for (const auto &[name, value] : env) {
        setenv((std::string("UCX_KREG_") + name).c_str(), value, 1);
    }
    start_outcome o{};
    o.status = kreg_start();
    kreg_query(&o.caps);
    o.memory  = map_anon(4096);
    o.watched = scoped_watch().watch(o.memory, 4096, &o.why);
    return o;
}

/* In a child: stops the source the fixture started (refs 0 there), starts
 * it with env, and stops it again. */
start_outcome restart_with(env_settings env)
{
    kreg_stop(); /* the fixture's start, inherited */
    const start_outcome o = start_with(env);
    kreg_stop();
    return o;
}

/* In a child: the source did not start, for `reason`, and the watch was
 * refused for it too. 0, or the child's failure in words. */
int expect_refused(const start_outcome &o, kreg_reason_t reason)
{
    if (o.status == UCS_OK) {
        return child_failure(10, "kreg_start succeeded");
    }
    if (o.caps.running) {
        return child_failure(11, "kreg_query says the source runs");
    }
    if (o.caps.reason != reason) {
        return child_failure(12, "kreg_query gives the reason '%s', not '%s'",
                             kreg_reason_str(o.caps.reason), kreg_reason_str(reason));
    }
    if (o.watched != 0) {
        return child_failure(13, "a watch succeeded with the source off");
    }
    if (o.why != reason) {
        return child_failure(14, "a watch was refused for '%s', not '%s'",
                             kreg_reason_str(o.why), kreg_reason_str(reason));
    }
    return 0;
}

/* In a child: start under a refusal of the userfaultfd syscall and check
 * what a user sees. */
int refused_start(int err, bool allow_device, kreg_reason_t expect)
{
    kreg_stop(); /* the fixture's start, inherited */
    if (!refuse_userfaultfd(err)) {
        return child_failure(20, "cannot install the seccomp filter: %s", strerror(errno));
    }
    if (allow_device && access("/dev/userfaultfd", R_OK | W_OK) == 0) {
        /* the device stands in for the refused syscall */
        setenv("UCX_KREG_BACKEND", "uffd", 1);
        setenv("UCX_KREG_DEVICE", "y", 1);
        const ucs_status_t st = kreg_start();
        kreg_caps_t caps;
        kreg_query(&caps);
        kreg_stop();
        if (st != UCS_OK || !caps.running || !caps.via_device) {
            return child_failure(21, "with the syscall refused the source is %s, %s "
                                 "/dev/userfaultfd", caps.running ? "running" : "off",
                                 caps.via_device ? "via" : "not via");
        }
        printf("running via /dev/userfaultfd\n");
        return 0;
    }
    const start_outcome o = start_with({{"BACKEND", "uffd"},
                                        {"DEVICE", allow_device ? "y" : "n"}});
    int rc = expect_refused(o, expect);
    /* a cache in this state caches nothing */
    token_cache cache;
    for (int i = 0; (i < 3) && (rc == 0); ++i) {
        auto hit = cache.lookup(o.memory, 4096);
        if (!hit.ok || hit.cached) {
            rc = child_failure(22, "lookup %d of a refused source's cache %s", i,
                               hit.ok ? "was cached" : "failed");
        }
    }
    kreg_stop();
    return rc;
}

class Fallbacks : public testing::Test {
protected:
    void SetUp() override
    {
        if (getenv("KREG_TEST_IN_VALGRIND") == nullptr) {
            ASSERT_EQ(UCS_OK, source_.status());
        }
    }
    /* the userfaultfd backend's fallbacks, whichever backend is the default */
    scoped_source source_{kUffd};
};

TEST_F(Fallbacks, EnosysWithoutDevice)
{
    KREG_SKIP_FORKED_CHILD_UNDER_SANITIZER();
    auto r = run_child([] { return refused_start(ENOSYS, false, KREG_REASON_ENOSYS); });
    EXPECT_EQ(0, r.status) << r.output;
    EXPECT_NE(std::string::npos, r.output.find("kernel memory events unavailable"))
        << r.output;
    EXPECT_NE(std::string::npos, r.output.find("no userfaultfd")) << r.output;
}

TEST_F(Fallbacks, EpermWithoutDevice)
{
    KREG_SKIP_FORKED_CHILD_UNDER_SANITIZER();
    auto r = run_child([] { return refused_start(EPERM, false, KREG_REASON_EPERM); });
    EXPECT_EQ(0, r.status) << r.output;
    EXPECT_NE(std::string::npos, r.output.find("not permitted")) << r.output;
}

TEST_F(Fallbacks, EpermFallsBackToDevice)
{
    KREG_SKIP_FORKED_CHILD_UNDER_SANITIZER();
    if (access("/dev/userfaultfd", R_OK | W_OK) != 0) {
        GTEST_SKIP() << "/dev/userfaultfd not usable here (needs root or the "
                        "device's group); EpermWithoutDevice covers the refusal";
    }
    auto r = run_child([] { return refused_start(EPERM, true, KREG_REASON_EPERM); });
    EXPECT_EQ(0, r.status) << r.output;
    EXPECT_NE(std::string::npos, r.output.find("via /dev/userfaultfd")) << r.output;
}

TEST_F(Fallbacks, EbusyWhenAnotherUserfaultfdWatches)
{
    const size_t len = 8 * page();
    void *p = map_anon(len);
    ASSERT_NE(nullptr, p);
    int other = static_cast<int>(syscall(SYS_userfaultfd, O_CLOEXEC | 1 /* user mode only */));
    ASSERT_GE(other, 0);
    struct uffdio_api api = {UFFD_API, 0, 0};
    ASSERT_EQ(0, ioctl(other, UFFDIO_API, &api));
    struct uffdio_register reg = {{reinterpret_cast<uintptr_t>(p), len},
                                  UFFDIO_REGISTER_MODE_MISSING, 0};
    ASSERT_EQ(0, ioctl(other, UFFDIO_REGISTER, &reg));

    kreg_stats_t before, after;
    kreg_get_stats(&before);
    kreg_reason_t why;
    scoped_watch w;
    EXPECT_EQ(0, w.watch(p, len, &why));
    EXPECT_EQ(KREG_REASON_EBUSY, why);
    kreg_get_stats(&after);
    EXPECT_EQ(before.fallbacks[KREG_REASON_EBUSY] + 1, after.fallbacks[KREG_REASON_EBUSY]);

    /* and a cache registers it uncached, every time */
    token_cache cache;
    for (int i = 0; i < 3; ++i) {
        auto hit = cache.lookup(p, len);
        EXPECT_TRUE(hit.ok);
        EXPECT_FALSE(hit.cached);
    }
    close(other); /* the kernel drops its registration */
    munmap(p, len);
}

TEST_F(Fallbacks, EinvalForFileMappingWithoutWpAsync)
{
    KREG_SKIP_FORKED_CHILD_UNDER_SANITIZER();
    auto r = run_child([] {
        kreg_stop();
        setenv("UCX_KREG_BACKEND", "uffd", 1);
        setenv("UCX_KREG_WP_ASYNC", "n", 1);
        if (kreg_start() != UCS_OK) {
            return child_failure(20, "kreg_start failed with UCX_KREG_WP_ASYNC=n");
        }
        std::string no_file;
        const int fd = real_file(4096, &no_file);
        if (fd < 0) {
            printf("skip: %s\n", no_file.c_str());
            return 77;
        }
        void *p = mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        if (p == MAP_FAILED) {
            return child_failure(22, "cannot map the file: %s", strerror(errno));
        }
        kreg_reason_t why;
        scoped_watch w;
        if (w.watch(p, 4096, &why) != 0) {
            return child_failure(23, "a file mapping was watched without WP_ASYNC");
        }
        if (why != KREG_REASON_EINVAL) {
            return child_failure(24, "the file mapping was refused for '%s', not EINVAL",
                                 kreg_reason_str(why));
        }
        /* anonymous memory is still watched */
        void *a = map_anon(4096);
        if (w.watch(a, 4096) != 1) {
            return child_failure(25, "anonymous memory is no longer watched");
        }
        w.unwatch();
        kreg_stop();
        return 0;
    });
    if (r.status == 77) {
        GTEST_SKIP() << r.output;
    }
    EXPECT_EQ(0, r.status) << r.output;
    EXPECT_NE(std::string::npos, r.output.find("cannot watch")) << r.output;
    EXPECT_NE(std::string::npos, r.output.find("memory type the kernel cannot watch"))
        << r.output;
}

/* A bad value of UCX_KREG_<name>: kreg_start refuses it as an invalid
 * parameter, nothing runs, and UCS's error names the variable. */
void expect_bad_value_refused(const char *name, const char *value)
{
    auto r = run_child([name, value] {
        const start_outcome o = restart_with({{name, value}});
        if (o.status != UCS_ERR_INVALID_PARAM) {
            return child_failure(30, "kreg_start with UCX_KREG_%s=%s returned '%s', "
                                 "not an invalid parameter", name, value,
                                 ucs_status_string(o.status));
        }
        return expect_refused(o, KREG_REASON_BAD_CONFIG);
    });
    EXPECT_EQ(0, r.status) << r.output;
    EXPECT_NE(std::string::npos, r.output.find(std::string("KREG_") + name)) << r.output;
}

TEST_F(Fallbacks, BadOptionValueIsRefusedClearly)
{
    KREG_SKIP_FORKED_CHILD_UNDER_SANITIZER();
    expect_bad_value_refused("MODE", "fastest");
}

TEST_F(Fallbacks, DisabledByOption)
{
    KREG_SKIP_FORKED_CHILD_UNDER_SANITIZER();
    auto r = run_child([] {
        const start_outcome o = restart_with({{"ENABLE", "n"}});
        if (o.caps.external_event) {
            return child_failure(40, "the event is declared external with the source off");
        }
        return expect_refused(o, KREG_REASON_DISABLED);
    });
    EXPECT_EQ(0, r.status) << r.output;
    EXPECT_NE(std::string::npos, r.output.find("UCX_KREG_ENABLE=n")) << r.output;
}

TEST_F(Fallbacks, NotifierAskedForWithoutTheModuleIsRefusedClearly)
{
    KREG_SKIP_FORKED_CHILD_UNDER_SANITIZER();
    if (access("/dev/kreg_notifier", F_OK) == 0) {
        GTEST_SKIP() << "the kreg_notifier module is loaded here; the host (no "
                        "module support) runs this test";
    }
    auto r = run_child([] {
        return expect_refused(restart_with({{"BACKEND", "notifier"}}),
                              KREG_REASON_NO_DEVICE);
    });
    EXPECT_EQ(0, r.status) << r.output;
    EXPECT_NE(std::string::npos, r.output.find("no kreg_notifier module")) << r.output;
}

/* What a user gets with nothing set, and the reason it is told. */
bool notifier_module_loaded()
{
    return access("/dev/kreg_notifier", R_OK | W_OK) == 0;
}

/* kreg_query of a source started with nothing set (why_backend is a
 * string of the library's, valid after the stop) */
kreg_caps_t auto_caps()
{
    scoped_source src(kAuto);
    EXPECT_EQ(UCS_OK, src.status()) << "kreg_start with nothing set failed";
    kreg_caps_t caps;
    kreg_query(&caps);
    return caps;
}

TEST(Auto, ChoosesTheNotifierWhereItsModuleIsLoaded)
{
    if (!notifier_module_loaded()) {
        GTEST_SKIP() << "no /dev/kreg_notifier here (the VM suite loads the module); "
                        "ChoosesUffdWithoutTheModule covers this case";
    }
    const kreg_caps_t caps = auto_caps();
    EXPECT_EQ(KREG_BACKEND_NOTIFIER, caps.backend) << kreg_backend_str(caps.backend);
    EXPECT_NE(nullptr, strstr(caps.why_backend, "present")) << caps.why_backend;
}

TEST(Auto, ChoosesUffdWithoutTheModule)
{
    if (notifier_module_loaded()) {
        GTEST_SKIP() << "the kreg_notifier module is loaded here; "
                        "ChoosesTheNotifierWhereItsModuleIsLoaded covers this case";
    }
    const kreg_caps_t caps = auto_caps();
    EXPECT_EQ(KREG_BACKEND_UFFD, caps.backend) << kreg_backend_str(caps.backend);
    EXPECT_NE(nullptr, strstr(caps.why_backend, "not loaded")) << caps.why_backend;
}

TEST_F(Fallbacks, BadBackendValueIsRefusedClearly)
{
    KREG_SKIP_FORKED_CHILD_UNDER_SANITIZER();
    expect_bad_value_refused("BACKEND", "ebpf");
}

TEST_F(Fallbacks, VerifyAsksPagemapScanWhereTheKernelHasIt)
{
    kreg_caps_t caps;
    kreg_query(&caps);
    if (!caps.wp_async) {
        GTEST_SKIP() << "no WP_ASYNC in this kernel: the check uses "
                        "UFFDIO_WRITEPROTECT, covered by the uffd_wp instances";
    }
    EXPECT_TRUE(caps.verify_by_scan);
}

TEST_F(Fallbacks, UnderValgrindFallsBack)
{
    if (getenv("KREG_TEST_IN_VALGRIND") != nullptr) {
        /* we are the program valgrind runs */
        kreg_caps_t caps;
        kreg_query(&caps);
        EXPECT_FALSE(caps.running);
        EXPECT_EQ(KREG_REASON_VALGRIND, caps.reason);
        void *p = map_anon(4096);
        EXPECT_EQ(0, scoped_watch().watch(p, 4096));
        /* an unwatched munmap must not block under valgrind */
        EXPECT_EQ(0, munmap(p, 4096));
        return;
    }
#ifdef KREG_SANITIZER
    GTEST_SKIP() << "built with the " KREG_SANITIZER " sanitizer, which valgrind "
                    "cannot run; the plain build runs this test";
#endif
    if (getenv("KREG_VM") != nullptr) {
        GTEST_SKIP() << "valgrind under qemu TCG takes many minutes; the host runs "
                        "this test";
    }
    if (system("valgrind --version >/dev/null 2>&1") != 0) {
        GTEST_SKIP() << "valgrind not installed";
    }
    char exe[4096];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
    ASSERT_GT(n, 0);
    exe[n] = '\0';
    std::string cmd = std::string("KREG_TEST_IN_VALGRIND=1 timeout 300 valgrind -q "
                                  "--error-exitcode=0 ") +
                      exe + " --gtest_filter=Fallbacks.UnderValgrindFallsBack 2>&1";
    FILE *out = popen(cmd.c_str(), "r");
    ASSERT_NE(nullptr, out);
    std::string text;
    char buf[512];
    while (fgets(buf, sizeof(buf), out) != nullptr) {
        text += buf;
    }
    int st = pclose(out);
    EXPECT_EQ(0, st) << text;
    EXPECT_NE(std::string::npos, text.find("running under valgrind")) << text;
    EXPECT_NE(std::string::npos, text.find("[  PASSED  ] 1 test")) << text;
}

} // namespace

/* ---- synchronous delivery (the notifier) and the start at load ----------- */

namespace {

TEST_F(Fallbacks, BadSyncValuesAreRefusedClearly)
{
    KREG_SKIP_FORKED_CHILD_UNDER_SANITIZER();
    expect_bad_value_refused("SYNC", "always");
    expect_bad_value_refused("AUTOSTART", "sometimes");
}

TEST(Sync, RunsWithTheNotifierUnlessTurnedOff)
{
    if (!notifier_module_loaded()) {
        GTEST_SKIP() << "no /dev/kreg_notifier here: synchronous delivery needs "
                        "the module (the VM suite loads it); "
                        "Autostart.NothingStartsWithoutTheModule covers the host";
    }
    KREG_SKIP_FORKED_CHILD_UNDER_SANITIZER();
    auto r = run_child([] {
        kreg_caps_t caps;
        if (kreg_start() != UCS_OK) {
            return child_failure(50, "kreg_start failed");
        }
        kreg_query(&caps);
        kreg_stop();
        if (!caps.sync_delivery || (caps.sync_signal != 38)) {
            return child_failure(51, "sync_delivery %d, signal %d: want 1, 38",
                                 caps.sync_delivery, caps.sync_signal);
        }
        const start_outcome o = start_with({{"SYNC", "n"}});
        kreg_stop();
        if ((o.status != UCS_OK) || o.caps.sync_delivery) {
            return child_failure(52, "UCX_KREG_SYNC=n: status %s, sync_delivery %d",
                                 ucs_status_string(o.status), o.caps.sync_delivery);
        }
        return 0;
    });
    EXPECT_EQ(0, r.status) << r.output;
}

void other_handler(int) {}

/* A handler of someone else's on the signal chosen is never replaced: with
 * UCX_KREG_SYNC=auto the notifier runs without synchronous delivery, with
 * =y it does not start; both say which signal and why (UCX_KREG_SYNC_SIGNAL
 * stays 40 in the environment for the second start). */
TEST(Sync, SignalWithAnotherHandlerIsRefusedClearly)
{
    if (!notifier_module_loaded()) {
        GTEST_SKIP() << "no /dev/kreg_notifier here (the VM suite loads the "
                        "module); kreg_nf_test's sync-* tests cover the "
                        "module's side";
    }
    KREG_SKIP_FORKED_CHILD_UNDER_SANITIZER();
    auto r = run_child([] {
        struct sigaction sa = {};
        sa.sa_handler = other_handler;
        sigaction(40, &sa, nullptr);
        setenv("UCX_LOG_LEVEL", "diag", 1);
        start_outcome o = start_with({{"SYNC_SIGNAL", "40"}, {"SYNC", "auto"}});
        kreg_stop();
        if ((o.status != UCS_OK) || o.caps.sync_delivery) {
            return child_failure(60, "SYNC=auto with a foreign handler: status %s, "
                                 "sync_delivery %d", ucs_status_string(o.status),
                                 o.caps.sync_delivery);
        }
        o = start_with({{"BACKEND", "notifier"}, {"SYNC", "y"}});
        kreg_stop();
        if (o.status == UCS_OK) {
            return child_failure(61, "SYNC=y started with a foreign handler");
        }
        struct sigaction now = {};
        sigaction(40, nullptr, &now);
        if (now.sa_handler != other_handler) {
            return child_failure(62, "the foreign handler was replaced");
        }
        return 0;
    });
    EXPECT_EQ(0, r.status) << r.output;
    EXPECT_NE(std::string::npos, r.output.find("signal 40 (UCX_KREG_SYNC_SIGNAL) "
                                               "already has a handler")) << r.output;
}

/* UCX_KREG_AUTOSTART: this binary again, with libucm_kernel preloaded; it
 * prints what kreg_query says before anything called kreg_start. */
TEST(Autostart, Child)
{
    if (getenv("KREG_TEST_AUTOSTART_CHILD") == nullptr) {
        GTEST_SKIP() << "run by Autostart.* in a process of its own";
    }
    kreg_caps_t caps;
    kreg_query(&caps);
    printf("AUTOSTART running=%d sync=%d external=%d\n", caps.running,
           caps.sync_delivery, caps.external_event);
}

std::string autostart_child(const char *env)
{
    Dl_info info = {};
    char exe[4096];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
    if ((n <= 0) || !dladdr(reinterpret_cast<void *>(&kreg_query), &info)) {
        return "cannot find the test binary or libucm_kernel";
    }
    exe[n] = '\0';
    std::string cmd = std::string("KREG_TEST_AUTOSTART_CHILD=1 LD_PRELOAD=") +
                      info.dli_fname + " " + env + " " + exe +
                      " --gtest_filter=Autostart.Child 2>&1";
    FILE *out = popen(cmd.c_str(), "r");
    std::string text;
    char buf[512];
    while ((out != nullptr) && (fgets(buf, sizeof(buf), out) != nullptr)) {
        text += buf;
    }
    if (out != nullptr) {
        pclose(out);
    }
    return text;
}

TEST(Autostart, NothingStartsWithoutTheModule)
{
    if (notifier_module_loaded()) {
        GTEST_SKIP() << "the kreg_notifier module is loaded here; "
                        "Autostart.PreloadedStartsWithTheModule covers this";
    }
#ifdef KREG_SANITIZER
    GTEST_SKIP() << "a preloaded library under the " KREG_SANITIZER " sanitizer "
                    "must come after its runtime; the plain build runs this test";
#endif
    /* an asynchronous source would leave stock caches with no hooks and no
     * timely event: UCM's hooks must stay */
    const std::string out = autostart_child("UCX_KREG_AUTOSTART=y");
    EXPECT_NE(std::string::npos, out.find("AUTOSTART running=0 sync=0 external=0"))
        << out;
}

TEST(Autostart, PreloadedStartsWithTheModule)
{
    if (!notifier_module_loaded()) {
        GTEST_SKIP() << "no /dev/kreg_notifier here (the VM suite loads the "
                        "module); Autostart.NothingStartsWithoutTheModule covers "
                        "the host";
    }
#ifdef KREG_SANITIZER
    GTEST_SKIP() << "a preloaded library under the " KREG_SANITIZER " sanitizer "
                    "must come after its runtime; the plain build runs this test";
#endif
    std::string out = autostart_child("");
    EXPECT_NE(std::string::npos, out.find("AUTOSTART running=1 sync=1 external=1"))
        << out;
    out = autostart_child("UCX_KREG_AUTOSTART=n");
    EXPECT_NE(std::string::npos, out.find("AUTOSTART running=0 sync=0 external=0"))
        << out;
    out = autostart_child("UCX_KREG_SYNC=n");
    EXPECT_NE(std::string::npos, out.find("AUTOSTART running=0 sync=0 external=0"))
        << out;
}

} // namespace
