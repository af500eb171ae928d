/*
 * The scenario matrix as a test: run tools/kreg_scenarios (one child per
 * case) and check what must hold; plus unit tests of the io_uring rcache.
 */
#include "../../tools/uring_rcache.h"
#include "ucm_kernel/ucm_kernel.h"

#include <ucm/api/ucm.h>

#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <map>
#include <sstream>
#include <string>
#include <sys/mman.h>
#include <sys/wait.h>

#ifndef KREG_SCENARIOS_BIN
#error "KREG_SCENARIOS_BIN must name the kreg_scenarios program"
#endif

namespace {

/* Under TSan nothing here can run: UCX's bistro hooks (installed by libucs's
 * constructor in this program and in the matrix's hooks children) patch
 * mmap, which TSan intercepts, and the process dies of SIGSEGV; TSan's own
 * mappings take the address hints, and its fork support stops the fork
 * scenario.
 * The plain, ASan and UBSan builds run the matrix; TSan runs the threads of
 * libucm_kernel through test/gtest. */
#if defined(__SANITIZE_THREAD__)
#define SKIP_MATRIX_UNDER_TSAN() \
    GTEST_SKIP() << "the scenario matrix cannot run under TSan (UCX's hooks " \
                    "patch mmap, which TSan intercepts); the other builds run it"
#else
#define SKIP_MATRIX_UNDER_TSAN() do {} while (0)
#endif

struct matrix {
    int exit_code = -1;
    std::string output;
    /* "scenario thread source" -> verdict */
    std::map<std::string, std::string> verdict;
};

matrix run_tool(const std::string &args)
{
    matrix m;
    std::string cmd = std::string(KREG_SCENARIOS_BIN " --timeout 30 ") + args;
    FILE *f = popen(cmd.c_str(), "r");
    if (f == nullptr) {
        return m;
    }
    char line[1024];
    while (fgets(line, sizeof(line), f) != nullptr) {
        m.output += line;
        std::istringstream in(line);
        std::string scen, thread, src, v;
        if ((line[0] == '#') || (line[0] == ' ') ||
            !(in >> scen >> thread >> src >> v)) {
            continue;
        }
        m.verdict[scen + " " + thread + " " + src] = v;
    }
    int st     = pclose(f);
    m.exit_code = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    return m;
}

const matrix &run_matrix()
{
    static const matrix m = run_tool("--source all");
    return m;
}

std::string kind(const std::string &verdict)
{
    return verdict.substr(0, verdict.find(':'));
}

TEST(scenarios, matrix_ran)
{
    SKIP_MATRIX_UNDER_TSAN();
    const matrix &m = run_matrix();
    ASSERT_FALSE(m.verdict.empty()) << m.output;
    printf("%s", m.output.c_str()); /* the hooks column, for information */
    EXPECT_EQ(0, m.exit_code) << m.output;
}

bool ends_with(const std::string &s, const std::string &end)
{
    return (s.size() >= end.size()) && (s.compare(s.size() - end.size(), end.size(), end) == 0);
}

TEST(scenarios, kernel_never_stale)
{
    SKIP_MATRIX_UNDER_TSAN();
    const matrix &m = run_matrix();
    int kernel_cases = 0, kernel_ok = 0;
    for (const auto &[key, v] : m.verdict) {
        /* "uffd" is the userfaultfd column beside the notifier's */
        if (!ends_with(key, " kernel") && !ends_with(key, " uffd")) {
            continue;
        }
        ++kernel_cases;
        kernel_ok += (v == "ok");
        EXPECT_TRUE(v == "ok" || kind(v) == "skip") << key << " " << v;
    }
    EXPECT_GT(kernel_cases, 0);
    /* skips are for what the machine can't do, not for the common cases */
    EXPECT_GE(kernel_ok, 20) << m.output;
}

TEST(scenarios, none_control_goes_stale)
{
    SKIP_MATRIX_UNDER_TSAN();
    /* Nothing watches under 'none': if these come out ok, the oracle is
     * blind and every "ok" above means nothing. */
    const matrix &m = run_matrix();
    for (const char *scen : {"munmap", "mmap_fixed", "mremap_move",
                             "mremap_shrink", "madv_dontneed", "raw_munmap",
                             "brk", "shmdt", "shmat_remap", "dontunmap",
                             "shmem_punch_hole", "shmem_truncate", "grow_in_place",
                             "two_rcaches", "fork_then_start"}) {
        for (const char *thread : {"same", "other"}) {
            std::string key = std::string(scen) + " " + thread + " none";
            auto it         = m.verdict.find(key);
            ASSERT_NE(m.verdict.end(), it) << key;
            EXPECT_EQ("STALE", it->second) << key;
        }
    }
}

TEST(scenarios, hooks_ran_and_miss_raw_munmap)
{
    SKIP_MATRIX_UNDER_TSAN();
    const matrix &m = run_matrix();
    int hooks_cases = 0;
    for (const auto &[key, v] : m.verdict) {
        if (key.size() > 6 && key.compare(key.size() - 6, 6, " hooks") == 0) {
            ++hooks_cases;
            EXPECT_NE("FAIL:timeout", v) << key;
        }
    }
    EXPECT_GT(hooks_cases, 0);
    /* The documented gap: UCM never sees a raw syscall. */
    for (const char *thread : {"same", "other"}) {
        std::string key = std::string("raw_munmap ") + thread + " hooks";
        EXPECT_EQ("STALE", m.verdict.at(key)) << key;
    }
}

/* The rows issue 9 added must run, not skip, in the kernel column. */
TEST(scenarios, kernel_runs_the_reliability_rows)
{
    SKIP_MATRIX_UNDER_TSAN();
    const matrix &m = run_matrix();
    for (const char *scen : {"dontunmap", "shmem_punch_hole", "shmem_truncate",
                             "grow_in_place", "two_rcaches", "fork_then_start",
                             "exit_live_threads"}) {
        for (const char *thread : {"same", "other"}) {
            const std::string key = std::string(scen) + " " + thread + " kernel";
            auto it               = m.verdict.find(key);
            ASSERT_NE(m.verdict.end(), it) << key << " missing:\n" << m.output;
            EXPECT_EQ("ok", it->second) << key;
        }
    }
}

TEST(scenarios, plain_mode_misses_only_what_the_kernel_never_reports)
{
    SKIP_MATRIX_UNDER_TSAN();
    /* Without the lookup's check the kernel source relies on events alone
     * (the same thread's events are read before its call returns);
     * shmat(SHM_REMAP) unmaps without one (ipc/shm.c passes no userfaultfd
     * unmap list). Nothing else may go stale. */
    matrix m = run_tool("--source kernel --mode plain");
    ASSERT_FALSE(m.verdict.empty()) << m.output;
    for (const auto &[key, v] : m.verdict) {
        if (v == "ok" || kind(v) == "skip") {
            continue;
        }
        std::string scen = key.substr(0, key.find(' '));
        EXPECT_TRUE(v == "STALE" && (scen == "shmdt" || scen == "shmat_remap"))
                << key << " " << v;
        printf("plain mode: %s %s (known: no kernel event)\n", key.c_str(),
               v.c_str());
    }
}

/* ---- the rcache itself, in this process, on the kernel source ---- */

using kreg_tools::source;
using kreg_tools::uring_rcache;

constexpr size_t len = 64 * 1024;

void *map_filled(unsigned char byte, void *hint = nullptr)
{
    void *p = mmap(hint, len, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    EXPECT_NE(MAP_FAILED, p);
    memset(p, byte, len);
    return p;
}

bool all_are(const std::vector<unsigned char> &v, unsigned char byte)
{
    for (auto b : v) {
        if (b != byte) {
            return false;
        }
    }
    return !v.empty();
}

TEST(uring_rcache, hit_after_first_transfer)
{
    SKIP_MATRIX_UNDER_TSAN();
    uring_rcache rc(source::kernel);
    void *p = map_filled(0x5a);
    EXPECT_TRUE(all_are(rc.transfer(p, len), 0x5a));
    auto regs = rc.counters().registrations;
    auto hits = rc.counters().hits;
    EXPECT_TRUE(all_are(rc.transfer(p, len), 0x5a));
    EXPECT_EQ(regs, rc.counters().registrations);
    EXPECT_EQ(hits + 1, rc.counters().hits);
    munmap(p, len);
}

TEST(uring_rcache, new_registration_after_remap)
{
    SKIP_MATRIX_UNDER_TSAN();
    uring_rcache rc(source::kernel);
    void *p = map_filled(0x11);
    ASSERT_TRUE(all_are(rc.transfer(p, len), 0x11));
    auto regs = rc.counters().registrations;
    munmap(p, len);
    void *q = map_filled(0x22, p);
    if (q != p) {
        munmap(q, len);
        GTEST_SKIP() << "mmap did not reuse the address";
    }
    EXPECT_TRUE(all_are(rc.transfer(p, len), 0x22));
    if (rc.counters().uncached == 0) {
        EXPECT_EQ(regs + 1, rc.counters().registrations);
    }
    munmap(p, len);
}

TEST(uring_rcache, new_registration_after_explicit_invalidation)
{
    SKIP_MATRIX_UNDER_TSAN();
    /* 'none' watches nothing, so only this ucm_vm_munmap() invalidates. */
    uring_rcache rc(source::none);
    void *p = map_filled(0x33);
    ASSERT_TRUE(all_are(rc.transfer(p, len), 0x33));
    ASSERT_TRUE(all_are(rc.transfer(p, len), 0x33));
    auto regs = rc.counters().registrations;
    EXPECT_EQ(1u, rc.counters().hits);
    ucm_vm_munmap(p, len);
    EXPECT_TRUE(all_are(rc.transfer(p, len), 0x33));
    EXPECT_EQ(regs + 1, rc.counters().registrations);
    EXPECT_EQ(1u, rc.counters().deregistrations);
    munmap(p, len);
}

} // namespace

namespace {

TEST(uring_rcache, kernel_source_unavailable_runs_uncached)
{
    SKIP_MATRIX_UNDER_TSAN();
    /* If libucm_kernel can't start, nothing may be cached, and every
     * transfer still sees the current data. */
    setenv("UCX_KREG_ENABLE", "n", 1);
    {
        uring_rcache rc(source::kernel);
        void *p = map_filled(0x44);
        EXPECT_TRUE(all_are(rc.transfer(p, len), 0x44));
        memset(p, 0x55, len);
        EXPECT_TRUE(all_are(rc.transfer(p, len), 0x55));
        munmap(p, len);
        void *q = map_filled(0x66, p);
        EXPECT_TRUE(all_are(rc.transfer(q, len), 0x66));
        EXPECT_EQ(0u, rc.counters().registrations);
        EXPECT_EQ(3u, rc.counters().uncached);
        munmap(q, len);
    }
    unsetenv("UCX_KREG_ENABLE");
}

} // namespace
