/* kreg_bench: the parent (kreg_bench.cc) and the children that measure
 * (kreg_bench_measure.cc). */
#ifndef UCX_KREG_BENCH_KREG_BENCH_H
#define UCX_KREG_BENCH_KREG_BENCH_H

#include <string>

namespace bench {

extern double g_target_ms; /* wall time of one measurement */
extern int    g_inner;     /* measurements per child, median printed */
extern bool   g_p2p4_only; /* --busy: the children measure P2, P3, P4 only */
/* --threads: the children measure P3 only, with g_bg_n other threads of
 * kind g_bg_kind ("asleep", "spinning", "syscalls") in the process, "apart"
 * (spinners in a forked process), or
 * ("stacks") the stacks of g_bg_n threads without the threads */
extern std::string g_bg_kind;
extern int         g_bg_n;

/* Runs the measurements of one configuration and prints them as "R KEY
 * NS" lines; the exit code for the parent (non-zero: a check inside a
 * measurement failed). */
int child(const std::string &config);

} // namespace bench

#endif
