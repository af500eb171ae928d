/* The address-space budget: watches never cost the application
 * its own mappings, and a watch that fails half-way leaves nothing
 * behind. Each case runs in a child: they fill the address space. */
#include "kreg_test.h"

#include <fcntl.h>
#include <linux/userfaultfd.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

using namespace kreg_test;

namespace {

unsigned long max_map_count()
{
    unsigned long n = 0;
    FILE *f         = fopen("/proc/sys/vm/max_map_count", "r");
    if ((f == nullptr) || (fscanf(f, "%lu", &n) != 1)) {
        n = 0;
    }
    if (f != nullptr) {
        fclose(f);
    }
    return n;
}

unsigned long mappings()
{
    FILE *f = fopen("/proc/self/maps", "r");
    unsigned long n = 0;
    for (int c; f && (c = fgetc(f)) != EOF;) {
        n += (c == '\n');
    }
    if (f != nullptr) {
        fclose(f);
    }
    return n;
}

class Budget : public testing::TestWithParam<source_config> {
protected:
    void SetUp() override
    {
        KREG_SKIP_FORKED_CHILD_UNDER_SANITIZER();
        KREG_START_OR_SKIP(source_, GetParam());
    }
    std::unique_ptr<scoped_source> source_;
};

/* Issue 9, case 5: 4 KiB watches scattered over one mapping split it
 * twice each; past the budget they are refused (uncached), with one
 * warning, and the application can still map memory. */
TEST_P(Budget, ScatteredWatchesStopAtTheBudgetAndTheApplicationCanStillMap)
{
    auto r = run_child([] {
        kreg_caps_t caps;
        kreg_query(&caps);
        const unsigned long budget = caps.max_ranges;
        if ((budget == 0) || (budget > 1000000)) {
            printf("budget %lu makes no sense\n", budget);
            return 2;
        }
        const size_t pages = 2 * budget + 64;
        char *area = static_cast<char *>(mmap(nullptr, pages * page(),
                                              PROT_READ | PROT_WRITE,
                                              MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
        if (area == MAP_FAILED) {
            return child_failure(3, "cannot map the area to watch: %s", strerror(errno));
        }
        std::vector<scoped_watch> watches(pages / 2);
        unsigned long watched = 0, refused = 0;
        kreg_reason_t why     = KREG_REASON_NONE;
        for (size_t i = 0; i < pages / 2; ++i) {
            if (watches[i].watch(area + 2 * i * page(), page(), &why)) {
                ++watched;
            } else {
                ++refused;
                if (why != KREG_REASON_LIMIT) {
                    printf("refused for %s\n", kreg_reason_str(why));
                    return 4;
                }
            }
        }
        const unsigned long maps = mappings();
        printf("budget %lu: %lu watched, %lu refused, %lu mappings of %lu\n",
               budget, watched, refused, maps, max_map_count());
        if ((watched != budget) || (refused == 0)) {
            return child_failure(5, "the watches did not stop at the budget");
        }
        if (maps > max_map_count() / 2) {
            return child_failure(6, "the watches took more than half of vm.max_map_count: "
                                     "the application must keep most of its mappings");
        }
        /* the application's own mmap of three pages still works */
        void *p = mmap(nullptr, 3 * page(), PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED) {
            return child_failure(7, "the application's own mmap failed once the budget "
                                     "was used: %s", strerror(errno));
        }
        /* dropping watches frees the budget again */
        watches[0].unwatch();
        if (!scoped_watch().watch(p, 3 * page())) {
            return child_failure(8, "a watch was refused after another was dropped: "
                                     "dropping did not free the budget");
        }
        return 0;
    }, 120);
    EXPECT_EQ(0, r.status) << r.output;
    /* one warning for all refusals of the same reason */
    size_t warnings = 0;
    for (size_t pos = 0; (pos = r.output.find("watch budget", pos)) != std::string::npos;
         ++pos) {
        ++warnings;
    }
    EXPECT_EQ(1u, warnings) << r.output;
}

TEST_P(Budget, AnExplicitBudgetIsKept)
{
    auto r = run_child([] {
        kreg_stop();
        setenv("UCX_KREG_MAX_RANGES", "10", 1);
        if (kreg_start() != UCS_OK) {
            return child_failure(2, "kreg_start failed with UCX_KREG_MAX_RANGES=10");
        }
        kreg_caps_t caps;
        kreg_query(&caps);
        if (caps.max_ranges != 10) {
            return child_failure(3, "kreg_query says max_ranges %lu, not 10",
                                 caps.max_ranges);
        }
        std::vector<scoped_watch> watches(20);
        char *area = static_cast<char *>(map_anon(40 * page()));
        int watched = 0;
        for (int i = 0; i < 20; ++i) {
            watched += watches[i].watch(area + 2 * i * page(), page());
        }
        printf("%d watched\n", watched);
        return (watched == 10) ? 0 :
               child_failure(4, "%d of 20 disjoint ranges watched, not 10", watched);
    }, 60);
    EXPECT_EQ(0, r.status) << r.output;
}

INSTANTIATE_TEST_SUITE_P(Backends, Budget, testing::Values(kUffd, kNotifier),
                         config_name);

/* Issue 9, case 5: UFFDIO_REGISTER over several mappings can fail half-way
 * (splitting the last one finds the mapping count exhausted); what it
 * registered so far must not stay registered, or a later check would take
 * it for watched. */
TEST(UffdRollback, RegistrationThatFailsHalfwayLeavesNothingRegistered)
{
    KREG_SKIP_FORKED_CHILD_UNDER_SANITIZER();
    scoped_source src(kUffd);
    ASSERT_EQ(UCS_OK, src.status());
    auto r = run_child([] {
        /* [gap][A rw][B ro][C rw, 2 pages][gap]: a watch of A..C's first
         * page registers A and B, then must split C */
        char *base = static_cast<char *>(map_anon(6 * page()));
        char *a    = base + page();
        munmap(base, page());
        munmap(base + 5 * page(), page());
        if (mprotect(a + page(), page(), PROT_READ) != 0) {
            return child_failure(2, "mprotect cannot split the mapping: %s", strerror(errno));
        }
        /* exhaust the mapping count with splits of a big mapping */
        const size_t big = 2 * max_map_count();
        char *filler = static_cast<char *>(mmap(nullptr, big * page(), PROT_READ | PROT_WRITE,
                                                MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                                                -1, 0));
        if (filler == MAP_FAILED) {
            return child_failure(3, "cannot map the filler: %s", strerror(errno));
        }
        size_t i;
        for (i = 1; i < big; i += 2) {
            if (mprotect(filler + i * page(), page(), PROT_READ) != 0) {
                break;
            }
        }
        if (errno != ENOMEM) {
            return child_failure(4, "filling the mapping count ended in %s, not ENOMEM",
                                 strerror(errno));
        }
        scoped_watch w;
        kreg_reason_t why;
        const int watched = w.watch(a, 3 * page(), &why);
        /* give the filler back before anything else needs a mapping */
        munmap(filler, big * page());
        if (watched) {
            printf("the watch did not fail: the test did not exhaust mappings\n");
            return 5;
        }
        printf("refused: %s\n", kreg_reason_str(why));
        /* nothing of A..C may be registered: another userfaultfd can
         * register it (EBUSY otherwise) */
        int other = static_cast<int>(syscall(SYS_userfaultfd, O_CLOEXEC | 1));
        struct uffdio_api api = {UFFD_API, 0, 0};
        if ((other < 0) || (ioctl(other, UFFDIO_API, &api) != 0)) {
            return child_failure(6, "cannot open a second userfaultfd: %s", strerror(errno));
        }
        struct uffdio_register reg = {{reinterpret_cast<uintptr_t>(a), 3 * page()},
                                      UFFDIO_REGISTER_MODE_MISSING, 0};
        if (ioctl(other, UFFDIO_REGISTER, &reg) != 0) {
            printf("left registered: %s\n", strerror(errno));
            return 7;
        }
        return 0;
    }, 120);
    EXPECT_EQ(0, r.status) << r.output;
}

} // namespace
