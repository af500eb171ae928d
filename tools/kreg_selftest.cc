/*
 * kreg-selftest: what a site runs after installing ucx-kreg, on a node with
 * RDMA devices or none. It says which backend runs and why, whether
 * synchronous delivery runs and why not, then runs the scenario table's
 * kernel column (kreg_scenarios: io_uring fixed buffers, pinned pages, as
 * the oracle) and one row with nothing watching, to show that the oracle
 * sees stale pages where they are.
 *
 * Exit status: 0 no STALE; 1 a STALE or FAIL case, or the table could not
 * run or cannot fail; 2 bad arguments. Each thing missing is one line
 * starting "missing:" that says what to do; it does not fail the check by
 * itself (the node still works, with less).
 */
#include "kreg_config.h"
#include "kmod/uapi/kreg_notifier.h"
#include "src/ucm_kernel/ucm_kernel.h"

#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fcntl.h>
#include <fstream>
#include <infiniband/verbs.h>
#include <string>
#include <sys/stat.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <ucp/api/ucp.h>
#include <unistd.h>
#include <vector>

namespace {

int g_missing = 0;

void missing(const std::string &what)
{
    printf("missing: %s\n", what.c_str());
    ++g_missing;
}

std::string read_line(const char *path)
{
    std::ifstream f(path);
    std::string line;
    std::getline(f, line);
    return line;
}

std::string kernel_release()
{
    struct utsname u;
    return uname(&u) == 0 ? u.release : "?";
}

/* The module: loaded, its version, the device and its mode. */
void check_module()
{
    const std::string kver = kernel_release();
    const std::string ver  = read_line("/sys/module/kreg_notifier/version");
    if (ver.empty()) {
        missing("the kreg_notifier module is not loaded: `sudo modprobe kreg_notifier` "
                "(package kreg-notifier-dkms; `dkms status kreg-notifier` says whether "
                "it is built for " + kver + ", which needs linux-headers-" + kver + ")");
        return;
    }
    printf("module: kreg_notifier %s loaded (kernel %s)\n", ver.c_str(), kver.c_str());
    if (ver != PACKAGE_VERSION) {
        missing("the module is " + ver + ", this library " PACKAGE_VERSION
                ": install the same version of kreg-notifier-dkms and reload it "
                "(`sudo modprobe -r kreg_notifier && sudo modprobe kreg_notifier`)");
    }
    struct stat st;
    if (stat(KREG_NF_DEVICE, &st) != 0) {
        missing(std::string(KREG_NF_DEVICE) + " does not exist although the module is "
                "loaded: is devtmpfs mounted on /dev?");
        return;
    }
    const int fd = open(KREG_NF_DEVICE, O_RDWR | O_CLOEXEC);
    if (fd < 0) {
        char mode[16];
        snprintf(mode, sizeof(mode), "%04o", st.st_mode & 07777);
        missing(std::string(KREG_NF_DEVICE) + " (mode " + mode + ") cannot be opened: " +
                strerror(errno) + ": a udev rule or device policy changed its mode; "
                "the package's rule sets 0666 (/lib/udev/rules.d/60-kreg-notifier-dkms.rules)");
        return;
    }
    close(fd);
}

void check_devices()
{
    int n = 0;
    struct ibv_device **list = ibv_get_device_list(&n);
    std::string names;
    for (int i = 0; i < n; ++i) {
        names += std::string(i ? ", " : "") + ibv_get_device_name(list[i]);
    }
    if (list != nullptr) {
        ibv_free_device_list(list);
    }
    if (n > 0) {
        printf("RDMA devices: %s\n", names.c_str());
    } else {
        printf("RDMA devices: none (the check below needs none: its oracle is "
               "io_uring fixed buffers)\n");
    }
}

/* Starts the source as a UCX process gets it (synchronous delivery where it
 * can run, else a backend for the component) and says what runs. */
void check_source()
{
    unsigned major, minor, release;
    ucp_get_version(&major, &minor, &release);
    kreg_caps_t lib;
    kreg_query(&lib);
    printf("library: libucm_kernel %s, built for UCX %s, running with UCX %u.%u.%u\n",
           lib.version, KREG_UCX_BUILD_VERSION, major, minor, release);
    if (strcmp(lib.version, PACKAGE_VERSION) != 0) {
        missing(std::string("libucm_kernel is ") + lib.version + ", kreg-selftest "
                PACKAGE_VERSION ": install ucx-kreg and ucx-kreg-tests of one version "
                "(the meta package ucx-kreg-all pins them)");
    }

    const bool sync = kreg_autostart() == 1;
    if (!sync && kreg_start() != UCS_OK) {
        kreg_caps_t caps;
        kreg_query(&caps);
        missing(std::string("no kernel backend runs: ") + kreg_reason_str(caps.reason) +
                " (UCX_LOG_LEVEL=diag kreg-selftest shows the details; without the "
                "module, userfaultfd must be allowed: sysctl vm.unprivileged_userfaultfd=1 "
                "or /dev/userfaultfd readable)");
        return;
    }
    kreg_caps_t caps;
    kreg_query(&caps);
    printf("backend: %s (%s)\n", kreg_backend_str(caps.backend), caps.why_backend);
    if (caps.sync_delivery) {
        printf("synchronous delivery: yes, %s: UCX's own caches on stock transports "
               "are exact\n", caps.sync_signal ?
               ("signal " + std::to_string(caps.sync_signal)).c_str() :
               "without a signal (the reader reports)");
    } else {
        printf("synchronous delivery: no (%s): stock transports keep UCM's hooks; "
               "the component (rc_kreg, ud_kreg) is exact\n", caps.why_no_sync);
    }
    if (!sync) {
        kreg_stop(); /* autostarted delivery runs until exit, as in a job */
    }
}

/* kreg_scenarios beside this program (a build tree), else the installed one. */
std::string scenarios_program()
{
    if (const char *env = getenv("KREG_SCENARIOS")) {
        return env;
    }
    char self[PATH_MAX];
    const ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
    if (n > 0) {
        self[n] = '\0';
        std::string dir(self);
        dir.erase(dir.rfind('/'));
        for (const char *rel : {"/kreg_scenarios", "/../kreg_scenarios"}) {
            if (access((dir + rel).c_str(), X_OK) == 0) {
                return dir + rel;
            }
        }
    }
    return KREG_TESTS_DIR "/kreg_scenarios";
}

/* Runs the table; counts its lines by verdict. */
struct tally {
    int ok = 0, stale = 0, skip = 0, fail = 0;
};

int run_table(const std::string &prog, const std::vector<std::string> &args, tally *t,
              bool echo)
{
    std::string cmd = "'" + prog + "'";
    for (const auto &a : args) {
        cmd += " " + a;
    }
    cmd += " 2>&1";
    FILE *p = popen(cmd.c_str(), "r");
    if (p == nullptr) {
        return -1;
    }
    char line[4096];
    while (fgets(line, sizeof(line), p) != nullptr) {
        char scen[128], thread[16], src[16], verdict[512];
        /* "<scenario> <same|other> <column> <verdict>"; the rest is comment
         * or a failed case's output */
        if (sscanf(line, "%127s %15s %15s %511s", scen, thread, src, verdict) == 4 &&
            (strcmp(thread, "same") == 0 || strcmp(thread, "other") == 0)) {
            if (strcmp(verdict, "ok") == 0) {
                ++t->ok;
            } else if (strcmp(verdict, "STALE") == 0) {
                ++t->stale;
            } else if (strncmp(verdict, "skip", 4) == 0) {
                ++t->skip;
            } else {
                ++t->fail;
            }
        }
        if (echo) {
            fputs("  ", stdout);
            fputs(line, stdout);
        }
    }
    const int st = pclose(p);
    return (st >= 0 && WIFEXITED(st)) ? WEXITSTATUS(st) : 128;
}

void usage(FILE *f)
{
    fprintf(f, "usage: kreg-selftest [--quiet]\n"
               "  Says which kernel backend runs and whether synchronous delivery\n"
               "  does, runs the scenario table's kernel column against pinned\n"
               "  pages, exits non-zero on any STALE. --quiet: the table's summary only.\n");
}

} // namespace

int main(int argc, char **argv)
{
    bool quiet = false;
    for (int i = 1; i < argc; ++i) {
        if (strcmp(argv[i], "--quiet") == 0 || strcmp(argv[i], "-q") == 0) {
            quiet = true;
        } else if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            usage(stdout);
            return 0;
        } else {
            fprintf(stderr, "kreg-selftest: unknown argument '%s'\n", argv[i]);
            usage(stderr);
            return 2;
        }
    }
    setvbuf(stdout, nullptr, _IOLBF, 0);
    printf("kreg-selftest %s\n", PACKAGE_VERSION);
    check_module();
    check_devices();
    check_source();

    const std::string prog = scenarios_program();
    if (access(prog.c_str(), X_OK) != 0) {
        printf("FAILED: the scenario table %s is missing (package ucx-kreg-tests)\n",
               prog.c_str());
        return 1;
    }
    printf("the scenario table, kernel column (%s):\n", prog.c_str());
    tally kernel;
    const int rc = run_table(prog, {"--source", "kernel"}, &kernel, !quiet);
    printf("kernel column: ok %d, STALE %d, skip %d, FAIL %d\n", kernel.ok, kernel.stale,
           kernel.skip, kernel.fail);
    /* The control: nothing watches, the oracle must see the old pages. */
    tally none;
    run_table(prog, {"--source", "none", "--scenario", "munmap", "--thread", "same"}, &none,
              false);

    int status = 0;
    if (kernel.stale > 0 || kernel.fail > 0 || rc != 0) {
        printf("FAILED: %d STALE, %d FAIL in the kernel column (exit %d): a cached "
               "registration outlived its pages; report it with this output\n",
               kernel.stale, kernel.fail, rc);
        status = 1;
    } else if (kernel.ok == 0) {
        printf("FAILED: no case of the table ran (io_uring fixed buffers: is io_uring "
               "disabled, sysctl kernel.io_uring_disabled?)\n");
        status = 1;
    }
    if (none.stale != 1) {
        printf("FAILED: with nothing watching, the oracle did not see the stale pages "
               "(STALE %d, ok %d, skip %d, FAIL %d): this check cannot fail here\n",
               none.stale, none.ok, none.skip, none.fail);
        status = 1;
    }
    if (status == 0) {
        printf("PASSED: no stale registration%s\n",
               g_missing ? " (see the missing lines: what this node runs without)" : "");
    }
    return status;
}
