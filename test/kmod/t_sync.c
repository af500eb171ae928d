/*
 * Synchronous delivery (KREG_NF_IOC_SYNC_*): each change reported before
 * the changing call returns, the other threads held, the fallbacks.
 */
#include "nf_test.h"

#include <sys/klog.h>
#include <sys/prctl.h>


static int sy_ch_munmap(char *p) { return munmap(p, LEN); }
static int sy_ch_raw_munmap(char *p) { return syscall(SYS_munmap, p, LEN); }
static int sy_ch_dontneed(char *p) { return madvise(p, LEN, MADV_DONTNEED); }
static int sy_ch_map_fixed(char *p)
{
	return mmap(p, LEN, PROT_READ | PROT_WRITE,
		    MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0) == p ? 0 : -1;
}

static int sy_ch_mremap(char *p)
{
	char *to = mmap(NULL, LEN, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS,
			-1, 0);

	return to != MAP_FAILED &&
	       mremap(p, LEN, LEN, MREMAP_MAYMOVE | MREMAP_FIXED, to) == to ?
	       0 : -1;
}

static int sy_ch_mprotect(char *p) { return mprotect(p, LEN, PROT_READ); }

/* raw syscall: glibc 2.36's mremap() mishandles MREMAP_DONTUNMAP */
static int sy_ch_mremap_dontunmap(char *p)
{
	long r = syscall(SYS_mremap, p, LEN, LEN,
			 MREMAP_MAYMOVE | MREMAP_DONTUNMAP, NULL);

	return r != -1 && (char *)r != p ? 0 : -1;
}

/*
 * One change in this thread: with pinned pages it is reported by this
 * thread's handler before the call returns; mprotect and memory never
 * pinned are not reported at all, but with KREG_NF_SYNC_UNPINNED (flags)
 * the process's own changes of any page are.
 */
struct sy_case {
	int (*change)(char *p);
	bool pinned, reported;
	const char *what;
	uint32_t flags;
};

int sy_order(const struct sy_case *c)
{
	bool pinned = c->pinned, reported = c->reported;
	const char *what = c->what;
	struct kreg_nf_sync_stats st;
	int rc;
	char *p;

	/*
	 * With KREG_NF_SYNC_UNPINNED a system call's write to a page this
	 * forked test process still shares with its parent is the process's
	 * own change too: the handler's DRAIN is one, which only the
	 * dispatcher reports (the signal is blocked in the handler); the
	 * STATS before the change leaves no such page where STATS writes.
	 */
	g_sy_start_flags = c->flags;
	CHECK(sy_start(SY_SIGNO, 10000, c->flags != 0) == 0, "SYNC_START");
	p = sy_buffer(pinned, &rc);
	if (rc)
		return rc;
	CHECK(sy_stats(&st) == 0, "SYNC_STATS");
	CHECK(c->change(p) == 0, "%s", what);
	CHECK(g_sy.reported == reported, "%s: reported %d before it returned, want %d (handler ran %d times)",
	      what, g_sy.reported, reported, g_sy.handler_runs);
	CHECK(sy_stats(&st) == 0, "SYNC_STATS");
	if (reported)
		CHECK(st.signalled >= 1 && st.queued >= 1,
		      "signalled %llu queued %llu", (unsigned long long)st.signalled,
		      (unsigned long long)st.queued);
	else if (!pinned && c->change != sy_ch_mprotect)
		CHECK(st.queued == 0 && st.unpinned >= 1,
		      "memory never pinned: queued %llu unpinned %llu",
		      (unsigned long long)st.queued,
		      (unsigned long long)st.unpinned);
	else
		CHECK(st.queued == 0, "%s queued %llu", what,
		      (unsigned long long)st.queued);
	sy_stop_dispatcher();
	return 0;
}


/*
 * The cross-thread window: another thread unmaps; this one spins mapping
 * the same address. The unmapping thread's handler takes 100 ms: this
 * thread's mmap must not return with the address before the report.
 */
static int t_sync_other_thread_held(void)
{
	struct kreg_nf_sync_stats st;
	pthread_t b;
	int rc, tries = 0;
	char *p, *q;

	rc = sy_setup(SY_SIGNO, 10000, false, &p);
	if (rc)
		return rc;
	g_sy.delay_ms = 100;
	CHECK(pthread_create(&b, NULL, sy_unmapper, p) == 0, "pthread_create");
	q = sy_map_freed(p, &tries);
	CHECK(q == p, "the freed address could not be mapped again (%d tries): taken by another mapping?",
	      tries);
	CHECK(g_sy.reported, "this thread mapped the freed address before the unmapping thread's report (after %d tries)",
	      tries);
	pthread_join(b, NULL);
	CHECK(sy_stats(&st) == 0 && st.gates >= 1 && st.gate_waits >= 1,
	      "gates %llu waits %llu", (unsigned long long)st.gates,
	      (unsigned long long)st.gate_waits);
	return 0;
}

static void *sy_blocked_unmapper(void *p)
{
	sigset_t set;

	sigemptyset(&set);
	sigaddset(&set, SY_SIGNO);
	pthread_sigmask(SIG_BLOCK, &set, NULL);
	if (munmap(p, LEN))
		return (void *)1;
	return (void *)(intptr_t)(g_sy.reported ? 0 : 2);
}

/* A thread that blocks the signal is held until the dispatcher reported. */
static int t_sync_blocked_signal(void)
{
	struct kreg_nf_sync_stats st;
	void *ret;
	pthread_t b;
	int rc;
	char *p;

	rc = sy_setup(SY_SIGNO, 10000, true, &p);
	if (rc)
		return rc;
	CHECK(pthread_create(&b, NULL, sy_blocked_unmapper, p) == 0, "pthread_create");
	pthread_join(b, &ret);
	CHECK(ret == NULL, "the blocking thread's munmap returned %s",
	      ret == (void *)2 ? "before the dispatcher's report" : "an error");
	CHECK(sy_stats(&st) == 0 && st.self_gated >= 1 && st.signalled == 0,
	      "self_gated %llu signalled %llu",
	      (unsigned long long)st.self_gated, (unsigned long long)st.signalled);
	CHECK(g_sy.handler_runs == 0, "the handler ran in a thread that blocks it");
	sy_stop_dispatcher();
	return 0;
}

/*
 * The application cannot replace, reset or ignore the draining handler
 * while delivery runs (the module of a37c080 let it, and its signal then
 * killed the process or went unreported): sigaction() fails with EINVAL,
 * the change is still reported by the changing thread's own handler, and
 * STOP, then close, give the signal back.
 */
static int t_sync_handler_held(void)
{
	struct kreg_nf_sync_stats st;
	int rc;
	char *p;

	rc = sy_setup(SY_SIGNO, 10000, false, &p);
	if (rc)
		return rc;
	rc = sy_signal_held();
	if (rc)
		return rc;
	CHECK(munmap(p, LEN) == 0, "munmap");
	CHECK(g_sy.reported, "munmap returned before the report");
	CHECK(sy_stats(&st) == 0 && st.signalled == 1 && st.self_gated == 0,
	      "signalled %llu self_gated %llu",
	      (unsigned long long)st.signalled, (unsigned long long)st.self_gated);
	CHECK(ioctl(g_sy.fd, KREG_NF_IOC_SYNC_STOP) == 0, "STOP");
	rc = sy_signal_free();
	if (rc)
		return rc;
	/* again, given back by close() */
	CHECK(sy_start_ioctl(SY_SIGNO, 10000) == 0, "START again");
	rc = sy_signal_held();
	if (rc)
		return rc;
	close(g_sy.fd);
	return sy_signal_free();
}

/*
 * The sched_process_fork probe and the call hooks go on at the first START
 * since the module loaded and stay on through every STOP and close:
 * putting a probe on or
 * off patches the kernel's text, which qemu's multi-threaded TCG (where CI
 * runs this) can crash or hang on (doc/design.md, "qemu and the kernel's
 * text patching"). The module of 1e957bd put it on at every first START.
 */
static int t_sync_fork_probe_once(void)
{
	long puts;

	for (int i = 0; i < 3; i++) {
		CHECK(sy_start(0, 50, false) == 0, "SYNC_START");
		CHECK(ioctl(g_sy.fd, KREG_NF_IOC_SYNC_STOP) == 0, "STOP");
		CHECK(sy_start_ioctl(0, 50) == 0, "START again");
		close(g_sy.fd);
	}
	puts = sysval("fork_probe_puts");
	if (puts < 0)
		return skip("the module has no fork_probe_puts in sysfs");
	CHECK(puts == 1, "the sched_process_fork probe was put on %ld times since the module loaded",
	      puts);
	/* the call hooks: the same rule (x86-64 with ftrace: on once) */
	puts = sysval("call_hook_puts");
	CHECK(puts == 1, "the call hooks were put on %ld times since the module loaded",
	      puts);
	return 0;
}

/*
 * Whether the kernel's log holds needle (SYSLOG_ACTION_READ_ALL: root);
 * if not, prints the module's last lines there.
 */
static bool klog_has(const char *needle)
{
	static char log[1 << 20];
	int n = klogctl(3, log, sizeof(log) - 1);
	char *line, *save = NULL;
	int shown = 0;

	if (n < 0)
		return false;
	log[n] = 0;
	if (strstr(log, needle))
		return true;
	for (line = strtok_r(log, "\n", &save); line;
	     line = strtok_r(NULL, "\n", &save))
		if (strstr(line, "kreg_notifier: ") && shown++ < 40)
			printf("  log: %s\n", line);
	return false;
}

/* No signal, no dispatcher: the changing thread is let go after the gate
 * timeout, and that is counted, and said in the kernel's log with what was
 * unreported and where the thread stood. */
static int t_sync_gate_timeout(void)
{
	struct kreg_nf_sync_stats st;
	char comm[16] = "", said[128], range[64];
	double t0, ms;
	int rc;
	char *p;

	CHECK(sy_start(0, 50, false) == 0, "SYNC_START signo 0");
	p = sy_buffer(true, &rc);
	if (rc)
		return rc;
	t0 = now_ns();
	CHECK(munmap(p, LEN) == 0, "munmap");
	ms = (now_ns() - t0) / 1e6;
	CHECK(sy_stats(&st) == 0 && st.gate_timeouts == 1 && st.self_gated >= 1,
	      "gate_timeouts %llu self_gated %llu",
	      (unsigned long long)st.gate_timeouts,
	      (unsigned long long)st.self_gated);
	CHECK(ms >= 40 && ms < 5000, "held %.1f ms, timeout 50 ms", ms);
	CHECK(!g_sy.reported, "reported with nobody draining");
	CHECK(prctl(PR_GET_NAME, comm) == 0, "PR_GET_NAME");
	snprintf(said, sizeof(said),
		 "gate of %s[%d] timed out at its return from call %d: ", comm,
		 (int)syscall(SYS_gettid), SYS_munmap);
	snprintf(range, sizeof(range), ": %#lx-%#lx", (unsigned long)p,
		 (unsigned long)p + LEN);
	CHECK(klog_has(said) && klog_has(range),
	      "the kernel's log does not say '%s' with the change '%s'", said,
	      range);
	/* what it was held for is still queued: a late DRAIN reports it */
	CHECK(sy_drain() == 0 && g_sy.reported, "queued range lost after the timeout");
	return 0;
}

/* io_uring's madvise runs in an io-wq worker: no signal can reach the
 * change; it is counted late, and the submitter, held at its return from
 * io_uring_enter, sees the completion only after the dispatcher's report. */
static int sy_io_uring_madvise(bool pinned)
{
	struct kreg_nf_sync_stats st;
	struct io_uring_cqe *cqe;
	struct io_uring_sqe *sqe;
	int rc;
	char *p;

	if (pinned) {
		rc = sy_setup(SY_SIGNO, 10000, true, &p);
	} else {
		/* an io_uring worker shares the address space: its change is
		 * the process's own */
		g_sy_start_flags = KREG_NF_SYNC_UNPINNED;
		CHECK(sy_start(SY_SIGNO, 10000, true) == 0, "SYNC_START");
		rc = io_uring_queue_init(4, &g_ring, 0);
		if (rc)
			return skip("io_uring_queue_init: %s", strerror(-rc));
		g_ring_up = true;
		p = sy_buffer(false, &rc);
	}
	if (rc)
		return rc;
	g_sy.disp_delay_ms = 100;	/* the submitter would see its CQE first */
	sqe = io_uring_get_sqe(&g_ring);
	CHECK(sqe, "io_uring_get_sqe");
	io_uring_prep_madvise(sqe, p, LEN, MADV_DONTNEED);
	CHECK(io_uring_submit_and_wait(&g_ring, 1) == 1, "submit");
	CHECK(io_uring_peek_cqe(&g_ring, &cqe) == 0, "cqe");
	if (cqe->res == -EINVAL || cqe->res == -EOPNOTSUPP)
		return skip("IORING_OP_MADVISE: %s", strerror(-cqe->res));
	CHECK(cqe->res == 0, "madvise through io_uring: %d", cqe->res);
	CHECK(g_sy.reported, "io_uring_enter returned before the report");
	CHECK(sy_stats(&st) == 0 && st.late >= 1,
	      "late %llu (the worker's change)", (unsigned long long)st.late);
	sy_stop_dispatcher();
	return 0;
}

static int t_sync_io_uring_madvise(void) { return sy_io_uring_madvise(true); }
static int t_sync_unpinned_io_uring_madvise(void)
{
	return sy_io_uring_madvise(false);
}

/*
 * KREG_NF_SYNC_UNPINNED: the process's own ftruncate of a memfd it maps
 * (shared memory between ranks) takes the pages: reported before it
 * returns.
 */
static int t_sync_unpinned_own_truncate(void)
{
	int mfd;
	char *p;

	g_sy_start_flags = KREG_NF_SYNC_UNPINNED;
	CHECK(sy_start(SY_SIGNO, 10000, true) == 0, "SYNC_START");
	mfd = memfd_of(LEN);
	CHECK(mfd >= 0 && (p = map_shared(mfd, LEN)), "memfd");
	memset(p, 1, LEN);
	g_sy.want_start = (uintptr_t)p;
	g_sy.want_end = (uintptr_t)p + LEN;
	CHECK(ftruncate(mfd, 0) == 0, "ftruncate");
	CHECK(g_sy.reported, "ftruncate returned before its report");
	sy_stop_dispatcher();
	return 0;
}

/*
 * KREG_NF_SYNC_UNPINNED: a mapping with no page present (never touched, or
 * already given back) queues nothing when it goes; one page touched in it
 * queues the change.
 */
static int t_sync_unpinned_untouched(void)
{
	struct kreg_nf_sync_stats st0, st;
	char *p;

	g_sy_start_flags = KREG_NF_SYNC_UNPINNED;
	CHECK(sy_start(SY_SIGNO, 10000, true) == 0, "SYNC_START");
	/* twice: the first round's STATS may copy a page shared since fork */
	for (int round = 0; round < 2; round++) {
		CHECK(sy_stats(&st0) == 0, "SYNC_STATS");
		p = mmap(NULL, LEN, PROT_READ | PROT_WRITE,
			 MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		CHECK(p != MAP_FAILED, "mmap");
		g_sy.want_start = (uintptr_t)p;
		g_sy.want_end = (uintptr_t)p + LEN;
		CHECK(munmap(p, LEN) == 0, "munmap");
		CHECK(sy_stats(&st) == 0, "SYNC_STATS");
	}
	CHECK(!g_sy.reported && st.queued == st0.queued &&
	      st.unpinned > st0.unpinned,
	      "a mapping with no page: reported %d queued %llu unpinned +%llu",
	      g_sy.reported, (unsigned long long)(st.queued - st0.queued),
	      (unsigned long long)(st.unpinned - st0.unpinned));
	p = mmap(NULL, LEN, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
		 -1, 0);
	CHECK(p != MAP_FAILED, "mmap");
	p[LEN - 1] = 1;		/* the last page only: the walk finds it */
	g_sy.want_start = (uintptr_t)p;
	g_sy.want_end = (uintptr_t)p + LEN;
	CHECK(sy_stats(&st0) == 0, "SYNC_STATS");
	CHECK(munmap(p, LEN) == 0, "munmap");
	CHECK(g_sy.reported, "a mapping with one page touched: not reported");
	CHECK(sy_stats(&st) == 0 && st.queued == st0.queued + 1 &&
	      st.signalled == st0.signalled + 1,
	      "queued +%llu signalled +%llu",
	      (unsigned long long)(st.queued - st0.queued),
	      (unsigned long long)(st.signalled - st0.signalled));
	sy_stop_dispatcher();
	return 0;
}

/*
 * KREG_NF_SYNC_UNPINNED: a write fault that breaks copy-on-write (a page
 * still shared with a fork child) replaces the page but is no unmap: UCM's
 * hooks never reported one, and it queues nothing.
 */
static int t_sync_unpinned_no_report_cow(void)
{
	struct kreg_nf_sync_stats st0, st;
	int go[2], status;
	char *p;
	pid_t pid;

	g_sy_start_flags = KREG_NF_SYNC_UNPINNED;
	CHECK(sy_start(SY_SIGNO, 10000, true) == 0, "SYNC_START");
	p = anon(LEN);
	CHECK(p && pipe(go) == 0, "anon, pipe");
	pid = fork();
	if (pid == 0) {
		char c;

		_exit(read(go[0], &c, 1) == 1 ? 0 : 3);
	}
	CHECK(pid > 0, "fork");
	/* the STATS' own writes to pages shared since fork, before */
	for (int i = 0; i < 2; i++)
		CHECK(sy_stats(&st0) == 0 && sy_stats(&st) == 0, "SYNC_STATS");
	CHECK(sy_stats(&st0) == 0, "SYNC_STATS");
	for (size_t off = 0; off < LEN; off += 4096)
		p[off] = 1;	/* every page copied from the child's */
	CHECK(sy_stats(&st) == 0, "SYNC_STATS");
	CHECK(write(go[1], "x", 1) == 1 && waitpid(pid, &status, 0) == pid &&
	      WIFEXITED(status) && WEXITSTATUS(status) == 0, "the child");
	CHECK(st.queued == st0.queued,
	      "copy-on-write faults queued %llu changes",
	      (unsigned long long)(st.queued - st0.queued));
	g_sy.want_start = (uintptr_t)p;
	g_sy.want_end = (uintptr_t)p + LEN;
	CHECK(munmap(p, LEN) == 0 && g_sy.reported,
	      "the munmap after them: not reported");
	sy_stop_dispatcher();
	return 0;
}

#define SY_HUGE (2UL << 20)

/* A transparent huge page, 2 MiB aligned, populated; NULL: skip (printed) */
static char *sy_huge_page(void)
{
	char line[256], *raw, *q;
	long anon_huge = 0;
	FILE *f;

	raw = mmap(NULL, 2 * SY_HUGE, PROT_READ | PROT_WRITE,
		   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (raw == MAP_FAILED)
		return NULL;
	q = (char *)(((uintptr_t)raw + SY_HUGE - 1) & ~(SY_HUGE - 1));
	madvise(q, SY_HUGE, MADV_HUGEPAGE);
	memset(q, 1, SY_HUGE);
	f = fopen("/proc/self/smaps_rollup", "r");
	while (f && fgets(line, sizeof(line), f))
		sscanf(line, "AnonHugePages: %ld", &anon_huge);
	if (f)
		fclose(f);
	if (anon_huge < 2048) {
		skip("no transparent huge page (AnonHugePages %ld kB)", anon_huge);
		return NULL;
	}
	return q;
}

/*
 * A munmap of one page of a huge page splits it first (an invalidation of
 * the whole 2 MiB that keeps every page): only the page unmapped is
 * reported, not its neighbours, whose registrations stay valid. Pinned (the
 * huge page is a registration's), or not with KREG_NF_SYNC_UNPINNED.
 */
static int sy_split_keeps_neighbours(bool pinned)
{
	char *q;
	int rc;

	g_sy_start_flags = pinned ? 0 : KREG_NF_SYNC_UNPINNED;
	CHECK(sy_start(SY_SIGNO, 10000, true) == 0, "SYNC_START");
	q = sy_huge_page();
	if (!q)
		return 77;
	if (pinned) {
		rc = pin(q, SY_HUGE);
		if (rc)
			return rc;
	}
	g_sy.want_start = (uintptr_t)q;		/* the first page: kept */
	g_sy.want_end = (uintptr_t)q + 4096;
	g_sy.want2_start = (uintptr_t)q + SY_HUGE / 2;	/* unmapped */
	g_sy.want2_end = (uintptr_t)q + SY_HUGE / 2 + 4096;
	CHECK(munmap(q + SY_HUGE / 2, 4096) == 0, "munmap of one page");
	CHECK(g_sy.reported2, "the page unmapped: not reported");
	CHECK(!g_sy.reported,
	      "the split reported the huge page's other pages too");
	sy_stop_dispatcher();
	return 0;
}

/*
 * KREG_NF_SYNC_UNPINNED, small pages: a munmap of one page inside a 2 MiB
 * range of a larger mapping splits the VMA there, which 6.1 announces as
 * an invalidation of the whole 2 MiB (a huge page split that finds none):
 * only the page unmapped is reported, not a neighbour.
 */
static int t_sync_unpinned_munmap_keeps_neighbours(void)
{
	char *raw, *q;

	g_sy_start_flags = KREG_NF_SYNC_UNPINNED;
	CHECK(sy_start(SY_SIGNO, 10000, true) == 0, "SYNC_START");
	raw = mmap(NULL, 3 * SY_HUGE, PROT_READ | PROT_WRITE,
		   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	CHECK(raw != MAP_FAILED, "mmap");
	CHECK(madvise(raw, 3 * SY_HUGE, MADV_NOHUGEPAGE) == 0, "MADV_NOHUGEPAGE");
	q = (char *)(((uintptr_t)raw + SY_HUGE - 1) & ~(SY_HUGE - 1));
	q[0] = 1;			/* a neighbour: kept */
	q[SY_HUGE / 2] = 1;		/* the page unmapped */
	g_sy.want_start = (uintptr_t)q;
	g_sy.want_end = (uintptr_t)q + 4096;
	g_sy.want2_start = (uintptr_t)q + SY_HUGE / 2;
	g_sy.want2_end = (uintptr_t)q + SY_HUGE / 2 + 4096;
	CHECK(munmap(q + SY_HUGE / 2, 4096) == 0, "munmap of one page");
	CHECK(g_sy.reported2, "the page unmapped: not reported");
	CHECK(!g_sy.reported, "a neighbour in the same 2 MiB was reported too");
	sy_stop_dispatcher();
	return 0;
}

static int t_sync_split_keeps_neighbours(void)
{
	return sy_split_keeps_neighbours(true);
}

static int t_sync_unpinned_split_keeps_neighbours(void)
{
	return sy_split_keeps_neighbours(false);
}

/*
 * KREG_NF_SYNC_UNPINNED: mlock and munlock of one page inside a huge page
 * split it (an invalidation of its 2 MiB, every page kept): not an unmap,
 * nothing queued. A munmap of a page of it afterwards is reported.
 */
static int t_sync_unpinned_no_report_mlock_split(void)
{
	struct kreg_nf_sync_stats st0, st;
	char *q;

	g_sy_start_flags = KREG_NF_SYNC_UNPINNED;
	CHECK(sy_start(SY_SIGNO, 10000, true) == 0, "SYNC_START");
	q = sy_huge_page();
	if (!q)
		return 77;
	for (int i = 0; i < 2; i++)
		CHECK(sy_stats(&st0) == 0 && sy_stats(&st) == 0, "SYNC_STATS");
	CHECK(sy_stats(&st0) == 0, "SYNC_STATS");
	CHECK(mlock(q + 4096, 4096) == 0 && munlock(q + 4096, 4096) == 0,
	      "mlock, munlock");
	CHECK(sy_stats(&st) == 0, "SYNC_STATS");
	CHECK(st.queued == st0.queued, "mlock's huge page split queued %llu",
	      (unsigned long long)(st.queued - st0.queued));
	g_sy.want_start = (uintptr_t)q + 8192;
	g_sy.want_end = (uintptr_t)q + 3 * 4096;
	CHECK(munmap(q + 8192, 4096) == 0 && g_sy.reported,
	      "a munmap of one of its pages: not reported");
	sy_stop_dispatcher();
	return 0;
}

/* A change made inside the handler (the signal is blocked there) is held
 * until the dispatcher reports it; the outer call returns after both. */
static int t_sync_handler_reentered(void)
{
	struct kreg_nf_sync_stats st;
	int rc;
	char *p, *q;

	rc = sy_setup(SY_SIGNO, 10000, true, &p);
	if (rc)
		return rc;
	q = anon(LEN);
	CHECK(q && pin(q, LEN) == 0, "second pinned buffer");
	g_sy.want2_start = (uintptr_t)q;
	g_sy.want2_end = (uintptr_t)q + LEN;
	g_sy.inner = q;
	CHECK(munmap(p, LEN) == 0, "munmap");
	CHECK(g_sy.reported && g_sy.reported2,
	      "after the outer munmap: outer reported %d, inner %d",
	      g_sy.reported, g_sy.reported2);
	CHECK(sy_stats(&st) == 0 && st.self_gated >= 1,
	      "self_gated %llu", (unsigned long long)st.self_gated);
	sy_stop_dispatcher();
	return 0;
}

/* A forked child neither stops the parent's delivery (its close) nor adds
 * to it (its own changes). It inherits the held signal with the handler,
 * and its own delivery (libucm_kernel restarts in a child) starts over it
 * and gives it back at its STOP. */
static int t_sync_fork_child(void)
{
	struct kreg_nf_sync_stats st;
	int rc, status;
	pid_t pid;
	char *p;

	rc = sy_setup(SY_SIGNO, 10000, false, &p);
	if (rc)
		return rc;
	pid = fork();
	CHECK(pid >= 0, "fork");
	if (pid == 0) {
		close(g_sy.fd);
		if (munmap(p, LEN))
			_exit(3);
		if (sy_signal_held())
			_exit(4);
		g_sy.fd = open(KREG_NF_DEVICE, O_RDWR | O_CLOEXEC);
		if (g_sy.fd < 0 || sy_start_ioctl(SY_SIGNO, 1000))
			_exit(5);
		if (ioctl(g_sy.fd, KREG_NF_IOC_SYNC_STOP))
			_exit(6);
		_exit(sy_signal_free() ? 7 : 0);
	}
	CHECK(waitpid(pid, &status, 0) == pid && status == 0, "child %#x", status);
	CHECK(sy_stats(&st) == 0 && st.queued == 0,
	      "the child's changes were queued: %llu",
	      (unsigned long long)st.queued);
	CHECK(munmap(p, LEN) == 0 && g_sy.reported,
	      "after the child's close: reported %d", g_sy.reported);
	return 0;
}

static void *sy_spinner(void *a)
{
	(void)a;
	for (;;)
		syscall(SYS_getppid);
	return NULL;
}

/*
 * A process ends while its threads are held: by exit_group from the
 * handler, or by SIGKILL while the handler sleeps. Held threads die with
 * it (the hold is killable) and nothing of it stays in the module.
 */
static int sy_end_while_held(bool by_kill)
{
	long c0 = sysval("contexts"), r0 = sysval("ranges"), c, r;
	double t0 = now_ns();
	int status;
	pid_t pid;

	pid = fork();
	CHECK(pid >= 0, "fork");
	if (pid == 0) {
		pthread_t b, s;
		int rc;
		char *p;

		if (sy_start(SY_SIGNO, 60000, false))
			_exit(2);
		p = sy_buffer(true, &rc);
		if (rc)
			_exit(rc);
		g_sy.delay_ms = by_kill ? 60000 : 300;
		g_sy.exit_in_handler = !by_kill;
		pthread_create(&s, NULL, sy_spinner, NULL);
		pthread_create(&b, NULL, sy_unmapper, p);
		for (;;)
			usleep(1000);	/* held at a return from here */
	}
	if (by_kill) {
		usleep(500000);
		kill(pid, SIGKILL);
	}
	CHECK(waitpid(pid, &status, 0) == pid, "waitpid");
	if (WIFEXITED(status) && WEXITSTATUS(status) == 77)
		return skip("no pinned memory in the child");
	if (by_kill)
		CHECK(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL,
		      "child %#x", status);
	else
		CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0,
		      "child %#x", status);
	CHECK((now_ns() - t0) / 1e9 < 10, "the end took %.1f s (held threads "
	      "waited for their timeout?)", (now_ns() - t0) / 1e9);
	CHECK(live_back_to(c0, r0, &c, &r),
	      "after exit: contexts %ld ranges %ld, baseline %ld %ld", c, r,
	      c0, r0);
	return 0;
}

static int t_sync_exit_while_held(void)
{
	return sy_end_while_held(false);
}

static int t_sync_sigkill_while_held(void)
{
	return sy_end_while_held(true);
}

/* The owner's close lets every held thread go at once. */
static int t_sync_close_lets_go(void)
{
	long c0 = sysval("contexts"), r0 = sysval("ranges"), c, r;
	double t0;
	pthread_t b;
	int rc, tries = 0;
	char *p, *q;

	rc = sy_setup(SY_SIGNO, 20000, false, &p);
	if (rc)
		return rc;
	g_sy.delay_ms = 100;
	g_sy.close_in_handler = true;
	t0 = now_ns();
	CHECK(pthread_create(&b, NULL, sy_unmapper, p) == 0, "pthread_create");
	q = sy_map_freed(p, &tries);
	CHECK(q == p, "the freed address could not be mapped again (%d tries): taken by another mapping?",
	      tries);
	CHECK((now_ns() - t0) / 1e6 < 5000, "held %.0f ms after the close",
	      (now_ns() - t0) / 1e6);
	pthread_join(b, NULL);
	io_uring_queue_exit(&g_ring);
	g_ring_up = false;
	CHECK(live_back_to(c0, r0, &c, &r),
	      "after close: contexts %ld ranges %ld, baseline %ld %ld", c, r,
	      c0, r0);
	return 0;
}

static int t_sync_bad_args(void)
{
	struct kreg_nf_range r[2];
	struct kreg_nf_sync_drain d = { .buf = (uintptr_t)r, .max = 2 };
	struct sigaction resethand = { .sa_handler = sy_handler };
	struct kreg_nf_sync_start second = { .gate_timeout_ms = 10 };
	int other;
	struct kreg_nf_sync_stats st;
	struct kreg_nf_sync_start bad[] = {
		/* each bad in one field only: .handler is set with a signo */
		{ .signo = SIGKILL, .gate_timeout_ms = 10, .handler = 1 },
		{ .signo = SIGSTOP, .gate_timeout_ms = 10, .handler = 1 },
		{ .signo = 65, .gate_timeout_ms = 10, .handler = 1 },
		{ .signo = SY_SIGNO, .gate_timeout_ms = 0, .handler = 1 },
		{ .signo = SY_SIGNO, .gate_timeout_ms = 60001, .handler = 1 },
		{ .signo = SY_SIGNO, .gate_timeout_ms = 10, .flags = 2, .handler = 1 },
		{ .signo = SY_SIGNO, .gate_timeout_ms = 10, .flags = 1U << 31, .handler = 1 },
		{ .signo = SY_SIGNO, .gate_timeout_ms = 10, .reserved = 1, .handler = 1 },
		{ .signo = SY_SIGNO, .gate_timeout_ms = 10 },	/* no handler */
		{ .signo = 0, .gate_timeout_ms = 10, .handler = 1 },
	};
	int rc;
	char *p;

	memset(&g_sy, 0, sizeof(g_sy));
	g_sy.fd = open(KREG_NF_DEVICE, O_RDWR | O_CLOEXEC);
	CHECK(g_sy.fd >= 0, "open");
	CHECK(ioctl(g_sy.fd, KREG_NF_IOC_SYNC_DRAIN, &d) && errno == ENOENT,
	      "DRAIN before START");
	CHECK(ioctl(g_sy.fd, KREG_NF_IOC_SYNC_STOP) && errno == ENOENT,
	      "STOP before START");
	CHECK(ioctl(g_sy.fd, KREG_NF_IOC_SYNC_STATS, &st) && errno == ENOENT,
	      "STATS before START");
	CHECK(ioctl(g_sy.fd, KREG_NF_IOC_SYNC_DISPATCHER) && errno == ENOENT,
	      "DISPATCHER before START");
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
		CHECK(ioctl(g_sy.fd, KREG_NF_IOC_SYNC_START, &bad[i]) &&
		      errno == EINVAL, "bad START %zu accepted", i);
	CHECK(ioctl(g_sy.fd, KREG_NF_IOC_SYNC_START, (void *)1) && errno == EFAULT,
	      "START from a bad pointer");
	/* a signo whose handler is not the one named, or is reset at delivery */
	CHECK(sy_start_ioctl(SY_SIGNO, 10) == -EINVAL,
	      "START with signo's handler not installed");
	resethand.sa_flags = SA_RESETHAND;
	sigemptyset(&resethand.sa_mask);
	CHECK(sigaction(SY_SIGNO, &resethand, NULL) == 0, "sigaction");
	CHECK(sy_start_ioctl(SY_SIGNO, 10) == -EINVAL,
	      "START with an SA_RESETHAND handler");
	resethand.sa_flags = 0;
	CHECK(sigaction(SY_SIGNO, &resethand, NULL) == 0,
	      "sigaction after the refused STARTs");
	close(g_sy.fd);
	/* signo 0: nothing is signalled, so a DRAIN sees the range queued */
	CHECK(sy_start(0, 10, false) == 0, "SYNC_START");
	CHECK(sy_start_ioctl(0, 10) == -EBUSY, "a second START");
	/* one delivery per address space: another descriptor is refused */
	other = open(KREG_NF_DEVICE, O_RDWR | O_CLOEXEC);
	CHECK(other >= 0, "open");
	CHECK(ioctl(other, KREG_NF_IOC_SYNC_START, &second) && errno == EBUSY,
	      "a START on a second descriptor of the same process");
	p = sy_buffer(true, &rc);
	if (rc)
		return rc;
	CHECK(munmap(p, LEN) == 0, "munmap");
	d.max = 0;
	CHECK(ioctl(g_sy.fd, KREG_NF_IOC_SYNC_DRAIN, &d) && errno == EINVAL, "max 0");
	d.max = KREG_NF_SYNC_QUEUE + 1;
	CHECK(ioctl(g_sy.fd, KREG_NF_IOC_SYNC_DRAIN, &d) && errno == EINVAL,
	      "max over the queue");
	d.max = 2;
	d.ack = 1000;
	CHECK(ioctl(g_sy.fd, KREG_NF_IOC_SYNC_DRAIN, &d) && errno == EINVAL,
	      "ack of a seq never handed out");
	d.ack = 0;
	d.buf = 8;
	CHECK(ioctl(g_sy.fd, KREG_NF_IOC_SYNC_DRAIN, &d) && errno == EFAULT,
	      "DRAIN into a bad buffer");
	CHECK(ioctl(g_sy.fd, KREG_NF_IOC_SYNC_DRAIN, (void *)8) && errno == EFAULT,
	      "DRAIN from a bad pointer");
	CHECK(ioctl(g_sy.fd, KREG_NF_IOC_SYNC_STATS, (void *)8) && errno == EFAULT,
	      "STATS to a bad pointer");
	/* nothing was lost: the range is still there */
	CHECK(sy_drain() == 0 && g_sy.reported, "the range after bad DRAINs");
	CHECK(ioctl(g_sy.fd, KREG_NF_IOC_SYNC_STOP) == 0, "STOP");
	CHECK(ioctl(g_sy.fd, KREG_NF_IOC_SYNC_STOP) && errno == ENOENT, "STOP twice");
	CHECK(ioctl(other, KREG_NF_IOC_SYNC_START, &second) == 0,
	      "the second descriptor's START after the first's STOP");
	CHECK(ioctl(g_sy.fd, KREG_NF_IOC_SYNC_START, &second) && errno == EBUSY,
	      "the first descriptor's START again");
	close(other);
	CHECK(sy_start_ioctl(SY_SIGNO, 10) == 0, "START after STOP");
	return 0;
}


const struct nf_test nf_tests_sync[] = {
	SYNC("sync-munmap", sy_ch_munmap, true, true, "munmap", 0),
	SYNC("sync-raw-munmap", sy_ch_raw_munmap, true, true,
	     "syscall(SYS_munmap)", 0),
	SYNC("sync-madvise-dontneed", sy_ch_dontneed, true, true,
	     "MADV_DONTNEED", 0),
	SYNC("sync-map-fixed-over", sy_ch_map_fixed, true, true,
	     "mmap MAP_FIXED over", 0),
	SYNC("sync-mremap-fixed", sy_ch_mremap, true, true,
	     "mremap MREMAP_FIXED", 0),
	SYNC("sync-no-report-mprotect", sy_ch_mprotect, true, false,
	     "mprotect", 0),
	SYNC("sync-no-report-unpinned", sy_ch_munmap, false, false,
	     "munmap of memory never pinned", 0),
	SYNC("sync-unpinned-munmap", sy_ch_munmap, false, true, "munmap",
	     KREG_NF_SYNC_UNPINNED),
	SYNC("sync-unpinned-raw-munmap", sy_ch_raw_munmap, false, true,
	     "syscall(SYS_munmap)", KREG_NF_SYNC_UNPINNED),
	SYNC("sync-unpinned-madvise-dontneed", sy_ch_dontneed, false, true,
	     "MADV_DONTNEED", KREG_NF_SYNC_UNPINNED),
	SYNC("sync-unpinned-map-fixed-over", sy_ch_map_fixed, false, true,
	     "mmap MAP_FIXED over", KREG_NF_SYNC_UNPINNED),
	SYNC("sync-unpinned-mremap-fixed", sy_ch_mremap, false, true,
	     "mremap MREMAP_FIXED", KREG_NF_SYNC_UNPINNED),
	SYNC("sync-unpinned-no-report-mprotect", sy_ch_mprotect, false, false,
	     "mprotect", KREG_NF_SYNC_UNPINNED),
	SYNC("sync-unpinned-mremap-dontunmap", sy_ch_mremap_dontunmap, false,
	     true, "mremap MREMAP_DONTUNMAP", KREG_NF_SYNC_UNPINNED),
	{ "sync-unpinned-own-truncate", t_sync_unpinned_own_truncate, NULL,
	  NULL },
	{ "sync-unpinned-untouched", t_sync_unpinned_untouched, NULL, NULL },
	{ "sync-unpinned-no-report-cow", t_sync_unpinned_no_report_cow, NULL,
	  NULL },
	{ "sync-unpinned-no-report-mlock-split",
	  t_sync_unpinned_no_report_mlock_split, NULL, NULL },
	{ "sync-split-keeps-neighbours", t_sync_split_keeps_neighbours, NULL,
	  NULL },
	{ "sync-unpinned-split-keeps-neighbours",
	  t_sync_unpinned_split_keeps_neighbours, NULL, NULL },
	{ "sync-unpinned-munmap-keeps-neighbours",
	  t_sync_unpinned_munmap_keeps_neighbours, NULL, NULL },
	{ "sync-unpinned-io-uring-madvise", t_sync_unpinned_io_uring_madvise,
	  NULL, NULL },
	{ "sync-other-thread-held", t_sync_other_thread_held, NULL, NULL },
	{ "sync-blocked-signal", t_sync_blocked_signal, NULL, NULL },
	{ "sync-handler-held", t_sync_handler_held, NULL, NULL },
	{ "sync-gate-timeout", t_sync_gate_timeout, NULL, NULL },
	{ "sync-fork-probe-once", t_sync_fork_probe_once, NULL, NULL },
	{ "sync-io-uring-madvise", t_sync_io_uring_madvise, NULL, NULL },
	{ "sync-handler-reentered", t_sync_handler_reentered, NULL, NULL },
	{ "sync-fork-child", t_sync_fork_child, NULL, NULL },
	{ "sync-exit-while-held", t_sync_exit_while_held, NULL, NULL },
	{ "sync-sigkill-while-held", t_sync_sigkill_while_held, NULL, NULL },
	{ "sync-close-lets-go", t_sync_close_lets_go, NULL, NULL },
	{ "sync-bad-args", t_sync_bad_args, NULL, NULL },
};
const size_t nf_n_sync = sizeof(nf_tests_sync) / sizeof(nf_tests_sync[0]);
