/*
 * Synchronous delivery in a process of many threads: what the application
 * does with signals, threads changing pinned memory at once, threads that
 * never enter the kernel, the reader thread, other processes, exec.
 */
#include "nf_test.h"

#include <linux/aio_abi.h>
#include <linux/userfaultfd.h>
#include <sched.h>

#define fmax(a, b) ((a) > (b) ? (a) : (b))

/* A pinned buffer of its own ring, so that it can be unpinned again. */
struct pinned {
	struct io_uring ring;
	char *p;
	size_t len;
};

/* len bytes at p pinned (io_uring fixed buffers): 0, 77 with the reason */
static int pinned_at(struct pinned *b, char *p, size_t len)
{
	struct iovec iov;
	int r;

	b->len = len;
	b->p = p;
	iov.iov_base = b->p;
	iov.iov_len = len;
	r = io_uring_queue_init(2, &b->ring, 0);
	if (r)
		return skip("io_uring_queue_init: %s", strerror(-r));
	r = io_uring_register_buffers(&b->ring, &iov, 1);
	if (r) {
		io_uring_queue_exit(&b->ring);
		return skip("io_uring_register_buffers (the pin): %s",
			    strerror(-r));
	}
	return 0;
}

/* 0, 77 with the reason, or a failure */
static int pinned_new(struct pinned *b, size_t len)
{
	char *p = anon(len);

	return p ? pinned_at(b, p, len) : 1;
}

/* sy_start, then a pinned buffer in *b whose report the test waits for */
static int pinned_watched(struct pinned *b, bool dispatcher)
{
	int rc;

	CHECK(sy_start(SY_SIGNO, 5000, dispatcher) == 0, "SYNC_START");
	rc = pinned_new(b, LEN);
	g_sy.want_start = (uintptr_t)b->p;
	g_sy.want_end = (uintptr_t)b->p + LEN;
	return rc;
}

/* unmaps it (the change), then drops the pin */
static int pinned_free(struct pinned *b)
{
	int r = munmap(b->p, b->len);

	io_uring_queue_exit(&b->ring);
	return r;
}

/*
 * n times: a pinned buffer freed, whose change must be reported before its
 * munmap returns. 0, 77 with the reason, or a failure.
 */
static int frees_reported(int n)
{
	for (int i = 0; i < n; i++) {
		struct pinned b;
		int rc = pinned_new(&b, LEN);

		if (rc)
			return rc;
		g_sy.want_start = (uintptr_t)b.p;
		g_sy.want_end = (uintptr_t)b.p + LEN;
		g_sy.reported = 0;
		CHECK(pinned_free(&b) == 0, "munmap");
		CHECK(g_sy.reported, "free %d returned before its report", i);
	}
	return 0;
}

static double ms_since(double t0)
{
	return (now_ns() - t0) / 1e6;
}

/* the calling thread on CPU cpu only */
static void pin_to_cpu(int cpu)
{
	cpu_set_t set;

	CPU_ZERO(&set);
	CPU_SET(cpu, &set);
	pthread_setaffinity_np(pthread_self(), sizeof(set), &set);
}

/* ---- 1: nothing the application does with signals kills or opens a window */

static volatile bool g_stop;
/* the toggler's sigaction() calls on SY_SIGNO: refused (EINVAL), done */
static unsigned long g_refused, g_changed;

/*
 * Cycles every real-time signal's disposition (the draining handler, then
 * SIG_DFL, SIG_IGN) and its own mask, so that a delivery can meet any.
 */
static void *toggler(void *a)
{
	struct sigaction dfl = { .sa_handler = SIG_DFL };
	struct sigaction ign = { .sa_handler = SIG_IGN };
	struct sigaction ours = { .sa_handler = sy_handler,
				  .sa_flags = SA_RESTART };
	sigset_t all;

	(void)a;
	sigfillset(&all);
	sigemptyset(&ours.sa_mask);
	while (!g_stop) {
		for (int s = SIGRTMIN; s <= SIGRTMAX && !g_stop; s++) {
			int r = sigaction(s, &ours, NULL) +
				sigaction(s, &dfl, NULL) +
				sigaction(s, &ours, NULL) +
				sigaction(s, &ign, NULL);

			if (s == SY_SIGNO && r == -4 && errno == EINVAL)
				g_refused++;
			else if (s == SY_SIGNO && r == 0)
				g_changed++;
			pthread_sigmask(SIG_BLOCK, &all, NULL);
			pthread_sigmask(SIG_UNBLOCK, &all, NULL);
		}
	}
	return NULL;
}

/*
 * A thread cycling every real-time signal through the draining handler,
 * SIG_DFL and SIG_IGN, and changing its mask, while another frees
 * registered memory: the process is not killed and no free returns before
 * its report. With a signo, every sigaction() on it is refused while
 * delivery runs (the signal is held); with signo 0 it is the
 * application's, and changes.
 */
static int sy_dispositions(int signo)
{
	enum { ROUNDS = 300 };
	struct kreg_nf_sync_stats st;
	pthread_t tog;
	int rc;

	CHECK(sy_start(signo, 5000, true) == 0, "SYNC_START signo %d", signo);
	CHECK(pthread_create(&tog, NULL, toggler, NULL) == 0, "pthread_create");
	rc = frees_reported(ROUNDS);
	g_stop = true;
	pthread_join(tog, NULL);
	if (rc)
		return rc;
	CHECK(sy_stats(&st) == 0 && st.gate_timeouts == 0 && st.queued >= ROUNDS,
	      "gate_timeouts %llu queued %llu",
	      (unsigned long long)st.gate_timeouts,
	      (unsigned long long)st.queued);
	CHECK(signo ? g_refused && !g_changed : g_changed && !g_refused,
	      "signal %d's sigaction() while delivery ran: %lu refused, %lu done",
	      SY_SIGNO, g_refused, g_changed);
	sy_stop_dispatcher();
	return 0;
}

static int t_sync_signal_dispositions(void)
{
	return sy_dispositions(0);
}

/*
 * The same with the signal (libucm_kernel's default). The module of
 * a37c080, which looked at the disposition when it sent, was killed in
 * round 18; that of cd6b037, which looked again in the gate, was killed
 * once in CI on 6.12 (the kernel looks once more when it dequeues: no look
 * before that can close the race). Now the disposition is held.
 */
static int t_sync_signal_dispositions_signal(void)
{
	return sy_dispositions(SY_SIGNO);
}

/* ---- 2: threads that free pinned memory at once -------------------------- */

struct freer {
	pthread_barrier_t *bar;
	int rounds;
	double worst_ms;
	int rc;
};

static void *freer_main(void *a)
{
	struct freer *f = a;

	for (int i = 0; i < f->rounds; i++) {
		struct pinned b;
		double t0;

		f->rc = pinned_new(&b, LEN);
		if (f->rc)
			return NULL;
		pthread_barrier_wait(f->bar);
		t0 = now_ns();
		if (pinned_free(&b)) {
			f->rc = 1;
			return NULL;
		}
		f->worst_ms = fmax(f->worst_ms, ms_since(t0));
		pthread_barrier_wait(f->bar);
	}
	return NULL;
}

/* holds and drops mmap_lock for writing, over and over */
static void *lock_holder(void *a)
{
	(void)a;
	while (!g_stop) {
		char *q = mmap(NULL, 8 << 20, PROT_READ | PROT_WRITE,
			       MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);

		if (q != MAP_FAILED)
			munmap(q, 8 << 20);
	}
	return NULL;
}

/*
 * Two threads free their own pinned buffers at the same instant, 100
 * times, with a third thread taking mmap_lock for writing in a loop: no
 * free waits for the other's gate (the worst is far below the timeout), no
 * gate times out. With the signal, no reader runs: each thread's own
 * handler must report; with signo 0, the reader does.
 */
static int sy_concurrent(int signo)
{
	enum { ROUNDS = 100 };
	struct kreg_nf_sync_stats st;
	pthread_barrier_t bar;
	struct freer f[2] = { { .bar = &bar, .rounds = ROUNDS },
			      { .bar = &bar, .rounds = ROUNDS } };
	pthread_t t[2], lk;

	CHECK(sy_start(signo, 3000, !signo) == 0, "SYNC_START");
	pthread_barrier_init(&bar, NULL, 2);
	g_stop = false;
	CHECK(pthread_create(&lk, NULL, lock_holder, NULL) == 0, "lock holder");
	for (int i = 0; i < 2; i++)
		CHECK(pthread_create(&t[i], NULL, freer_main, &f[i]) == 0,
		      "pthread_create");
	for (int i = 0; i < 2; i++)
		pthread_join(t[i], NULL);
	g_stop = true;
	pthread_join(lk, NULL);
	for (int i = 0; i < 2; i++) {
		if (f[i].rc == 77)
			return 77;
		CHECK(f[i].rc == 0, "freer %d failed", i);
		printf("freer %d: worst free %.1f ms\n", i, f[i].worst_ms);
		CHECK(f[i].worst_ms < 1500, "freer %d: a free took %.0f ms (the gate timeout is 3000)",
		      i, f[i].worst_ms);
	}
	CHECK(sy_stats(&st) == 0, "SYNC_STATS");
	printf("queued %llu signalled %llu gates %llu waits %llu passes %llu drain_waits %llu\n",
	       (unsigned long long)st.queued, (unsigned long long)st.signalled,
	       (unsigned long long)st.gates, (unsigned long long)st.gate_waits,
	       (unsigned long long)st.gate_passes,
	       (unsigned long long)st.drain_waits);
	CHECK(st.gate_timeouts == 0, "gate_timeouts %llu",
	      (unsigned long long)st.gate_timeouts);
	CHECK(st.queued >= 2 * ROUNDS, "queued %llu", (unsigned long long)st.queued);
	sy_stop_dispatcher();
	return 0;
}

static int t_sync_concurrent_frees(void)
{
	return sy_concurrent(SY_SIGNO);
}

static int t_sync_concurrent_frees_reader(void)
{
	return sy_concurrent(0);
}

/*
 * A change whose thread is starved of its CPU inside the munmap: the
 * threads held meanwhile wait for its end, and the gate's timeout counts
 * from there. The changing thread, at SCHED_IDLE, shares CPU 0 with a
 * thread that spins for IF_HOG_MS once woken, so its munmap of a large
 * pinned buffer stays in flight (range started, not ended) for most of
 * that; a thread on CPU 1 makes system calls meanwhile and is held at
 * their return; the reader (no signal) reports once the change ends. The
 * module of 254dcc2 timed that thread's gate out after IF_TIMEOUT_MS,
 * though nothing held could block the munmap (kreg_bench --threads timed
 * gates out so behind a munmap starved by 1,024 threads starting up).
 */
enum { IF_TIMEOUT_MS = 100, IF_HOG_MS = 800 };
static int g_if_pipe[2];
static volatile bool g_if_stop;
static volatile unsigned long g_if_calls;

static void *if_hog(void *a)
{
	double t0;
	char c;

	(void)a;
	pin_to_cpu(0);
	if (read(g_if_pipe[0], &c, 1) != 1)
		return NULL;
	t0 = now_ns();
	while (ms_since(t0) < IF_HOG_MS)
		;
	return NULL;
}

static void *if_caller(void *a)
{
	(void)a;
	pin_to_cpu(1);
	while (!g_if_stop) {
		syscall(SYS_getppid);
		g_if_calls++;
	}
	return NULL;
}

static int t_sync_inflight_not_timed_out(void)
{
	const size_t len = 128ul << 20;
	struct sched_param idle = { 0 }, other = { 0 };
	struct kreg_nf_sync_stats st;
	pthread_t hog, caller;
	struct pinned b;
	double t0, ms;
	char *p;
	int rc;

	if (sysconf(_SC_NPROCESSORS_ONLN) < 2)
		return skip("one CPU: no thread runs beside the changing one");
	/* the reader and the caller on CPU 1, the changer and the hog on 0 */
	pin_to_cpu(1);
	CHECK(sy_start(0, IF_TIMEOUT_MS, true) == 0, "SYNC_START");
	/* 4 KiB pages (THP would make the unmap a few PMDs: over at once) */
	p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
		 -1, 0);
	CHECK(p != MAP_FAILED, "mmap");
	CHECK(madvise(p, len, MADV_NOHUGEPAGE) == 0, "MADV_NOHUGEPAGE");
	memset(p, 0x5a, len);
	rc = pinned_at(&b, p, len);
	if (rc)
		return rc;
	g_sy.want_start = (uintptr_t)p;
	g_sy.want_end = (uintptr_t)p + len;
	CHECK(pipe(g_if_pipe) == 0, "pipe");
	CHECK(pthread_create(&caller, NULL, if_caller, NULL) == 0, "caller");
	pin_to_cpu(0);
	CHECK(pthread_create(&hog, NULL, if_hog, NULL) == 0, "hog");
	usleep(50000);
	CHECK(pthread_setschedparam(pthread_self(), SCHED_IDLE, &idle) == 0,
	      "SCHED_IDLE");
	t0 = now_ns();
	CHECK(write(g_if_pipe[1], "x", 1) == 1, "write");
	CHECK(munmap(b.p, b.len) == 0, "munmap");
	ms = ms_since(t0);
	CHECK(pthread_setschedparam(pthread_self(), SCHED_OTHER, &other) == 0,
	      "SCHED_OTHER");
	pthread_join(hog, NULL);
	g_if_stop = true;
	pthread_join(caller, NULL);
	io_uring_queue_exit(&b.ring);
	for (int i = 0; i < 100 && !g_sy.reported; i++)
		usleep(10000);
	sy_stop_dispatcher();
	CHECK(sy_stats(&st) == 0, "SYNC_STATS");
	printf("munmap of %zu MiB took %.0f ms beside the hog; the caller made %lu calls; gates %llu waits %llu timeouts %llu\n",
	       len >> 20, ms, g_if_calls, (unsigned long long)st.gates,
	       (unsigned long long)st.gate_waits,
	       (unsigned long long)st.gate_timeouts);
	if (ms < 3 * IF_TIMEOUT_MS)
		return skip("the munmap took %.0f ms: not starved past the gate timeout (%d ms)",
			    ms, IF_TIMEOUT_MS);
	CHECK(g_sy.reported, "the munmap was not reported");
	CHECK(st.gate_waits > 0, "the caller was never held");
	CHECK(st.gate_timeouts == 0,
	      "%llu gates timed out behind a change still in flight",
	      (unsigned long long)st.gate_timeouts);
	return 0;
}

/*
 * A reporter is not held while it reports. What UCX runs for a report
 * (ucm_vm_munmap()) makes system calls (malloc's mmap or trim, a write to
 * its async pipe) inside locks that other reporters need. Here the
 * changing thread's report takes lock L and frees more pinned memory (its
 * signal is blocked in its handler: the reader must report that one); the
 * reader's report waits for L. The module of cd6b037 held the reporter at
 * that munmap until both changes were reported, which the reader could
 * not do without L: the gate timed out (UCP with 4 and 8 threads timed out
 * so in CI, 3 to 5 gates at once, the queue ended and unacknowledged).
 */
static pthread_mutex_t g_rp_lock = PTHREAD_MUTEX_INITIALIZER;
static struct pinned g_rp_inner;
static __thread bool t_rp_changer;

static void rp_reporting(void)
{
	pthread_mutex_lock(&g_rp_lock);
	if (t_rp_changer) {
		t_rp_changer = false;	/* once: inside its first report */
		g_sy.want2_start = (uintptr_t)g_rp_inner.p;
		g_sy.want2_end = (uintptr_t)g_rp_inner.p + LEN;
		pinned_free(&g_rp_inner);
	}
	pthread_mutex_unlock(&g_rp_lock);
}

static int t_sync_reporter_not_held(void)
{
	struct kreg_nf_sync_stats st;
	struct pinned pa;
	double t0;
	int rc;

	CHECK(sy_start(SY_SIGNO, 2000, true) == 0, "SYNC_START");
	rc = pinned_new(&pa, LEN);
	if (!rc)
		rc = pinned_new(&g_rp_inner, LEN);
	if (rc)
		return rc;
	g_sy.want_start = (uintptr_t)pa.p;
	g_sy.want_end = (uintptr_t)pa.p + LEN;
	g_sy.reporting = rp_reporting;
	t0 = now_ns();
	t_rp_changer = true;
	CHECK(pinned_free(&pa) == 0, "munmap");
	CHECK(g_sy.reported && g_sy.reported2, "reported: %d, inside it %d",
	      g_sy.reported, g_sy.reported2);
	CHECK(sy_stats(&st) == 0 && st.gate_timeouts == 0 && st.queued == 2,
	      "gate_timeouts %llu queued %llu after %.0f ms",
	      (unsigned long long)st.gate_timeouts,
	      (unsigned long long)st.queued, ms_since(t0));
	CHECK(ms_since(t0) < 1000, "the two reports took %.0f ms", ms_since(t0));
	sy_stop_dispatcher();
	return 0;
}

/*
 * A holder stopped by its tick inside a user-space lock that the report
 * needs: it spins 300 ms holding the lock (or for ever), leaves it and at
 * once makes a system call; the reporter, once past the lock, takes
 * 150 ms more to ack.
 */
static pthread_spinlock_t g_il_lock;
static volatile bool g_il_go, g_il_holding;
static volatile bool g_in_after_lock, g_in_acked, g_in_forever, g_in_inside;
static volatile double g_in_getppid_ms, g_in_signal_ms;
static char *volatile g_in_freed;	/* the changed buffer's address */

static void in_sigusr1(int sig)
{
	(void)sig;
}

static void in_reporting(void)
{
	pthread_spin_lock(&g_il_lock);
	pthread_spin_unlock(&g_il_lock);
	usleep(150000);		/* a reporter is not held meanwhile */
	g_in_acked = true;	/* just before the ack: a stricter check */
}

/*
 * An mmap of the freed address itself (the race the gates close; an mmap
 * elsewhere goes on: it mapped nothing of the change). The munmap was done
 * long before (the holder spins 300 ms first).
 */
static void in_mmap(void)
{
	void *p = mmap(g_in_freed, 4096, PROT_READ,
		       MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);

	if (p != MAP_FAILED)
		munmap(p, 4096);
}

static void *in_holder(void *a)
{
	double t0;

	(void)a;
	while (!g_il_go)
		;
	pthread_spin_lock(&g_il_lock);
	g_il_holding = true;
	t0 = now_ns();
	while (g_in_forever || ms_since(t0) < 300)
		;	/* its tick stops it; the fuse lets it go */
	if (g_in_inside)
		in_mmap();	/* inside the lock */
	pthread_spin_unlock(&g_il_lock);
	t0 = now_ns();
	syscall(SYS_getppid);	/* returns no address: not held */
	g_in_getppid_ms = ms_since(t0);
	t0 = now_ns();
	raise(SIGUSR1);		/* nor do tgkill and rt_sigreturn */
	g_in_signal_ms = ms_since(t0);
	in_mmap();
	g_in_after_lock = g_in_acked;
	return NULL;
}

/*
 * The holder's scenario up to the change, which returns once reported: a
 * munmap, or with dontneed an MADV_DONTNEED, whose range stays mapped (a
 * touch there maps a new page), so a thread at an interrupt is held.
 */
static int in_change(bool forever, bool inside, bool dontneed)
{
	struct pinned pa;
	pthread_t h;
	int rc;

	g_il_go = g_il_holding = g_in_after_lock = g_in_acked = false;
	g_in_getppid_ms = g_in_signal_ms = -1;
	CHECK(signal(SIGUSR1, in_sigusr1) != SIG_ERR, "signal");
	g_in_forever = forever;
	g_in_inside = inside;
	CHECK(pthread_spin_init(&g_il_lock, PTHREAD_PROCESS_PRIVATE) == 0,
	      "pthread_spin_init");
	rc = pinned_watched(&pa, false);
	if (rc)
		return rc;
	g_in_freed = pa.p;
	CHECK(pthread_create(&h, NULL, in_holder, NULL) == 0, "pthread_create");
	g_il_go = true;
	while (!g_il_holding)
		;
	g_sy.reporting = in_reporting;
	if (dontneed) {
		CHECK(madvise(pa.p, LEN, MADV_DONTNEED) == 0, "madvise");
		CHECK(g_sy.reported, "madvise returned before its report");
		pthread_join(h, NULL);
		CHECK(pinned_free(&pa) == 0, "munmap");
		return 0;
	}
	CHECK(pinned_free(&pa) == 0, "munmap");
	CHECK(g_sy.reported, "munmap returned before its report");
	pthread_join(h, NULL);
	return 0;
}

/* the call hooks are on: gates pass a thread at an interrupt */
static bool irq_passes_on(void)
{
	return sysval("call_hook") == 1;
}

/*
 * A thread stopped at a return from an interrupt (its tick) inside a
 * user-space lock that the report needs: in CI, UCP with 4 and 8 threads
 * had a thread stopped by its tick inside UCX's rcache spinlock while both
 * reporters spun on it, until the gate timed out (the module of cd6b037
 * holds it here for the whole timeout, 5 s). After a munmap it goes on at
 * once where the call hooks are on (irq_passes), else once the report has
 * waited for it for the fuse (irq_releases); after an MADV_DONTNEED (the
 * range stays mapped) by the fuse.
 */
static int irq_lock_holder(bool dontneed)
{
	struct kreg_nf_sync_stats st;
	double t0 = now_ns();
	int rc = in_change(false, false, dontneed);
	bool passes = irq_passes_on() && !dontneed;

	if (rc)
		return rc;
	CHECK(sy_stats(&st) == 0, "SYNC_STATS");
	printf("irq_passes %llu irq_releases %llu gate_timeouts %llu, %.0f ms\n",
	       (unsigned long long)st.irq_passes,
	       (unsigned long long)st.irq_releases,
	       (unsigned long long)st.gate_timeouts, ms_since(t0));
	CHECK(st.gate_timeouts == 0 &&
	      (passes ? st.irq_passes >= 1 && !st.irq_releases :
			st.irq_releases >= 1 && !st.irq_passes),
	      "gate_timeouts %llu irq_passes %llu irq_releases %llu (call hooks %s, %s)",
	      (unsigned long long)st.gate_timeouts,
	      (unsigned long long)st.irq_passes,
	      (unsigned long long)st.irq_releases,
	      irq_passes_on() ? "on" : "off", dontneed ? "madvise" : "munmap");
	CHECK(ms_since(t0) < 2000, "the report took %.0f ms", ms_since(t0));
	return 0;
}

static int t_sync_irq_lock_holder(void)
{
	return irq_lock_holder(false);
}

static int t_sync_irq_lock_holder_dontneed(void)
{
	return irq_lock_holder(true);
}

/*
 * The holder's scenario, its counts printed: 0, 77 when no tick stopped
 * the holder in its gate, or a failure.
 */
static int in_run(bool inside, struct kreg_nf_sync_stats *st, double *ms)
{
	double t0;
	int rc;

	t0 = now_ns();
	rc = in_change(false, inside, false);
	if (rc)
		return rc;
	CHECK(sy_stats(st) == 0, "SYNC_STATS");
	*ms = ms_since(t0);
	printf("irq_passes %llu irq_releases %llu irq_next_held %llu irq_next_released %llu irq_unwatched %llu gate_timeouts %llu, %.0f ms\n",
	       (unsigned long long)st->irq_passes,
	       (unsigned long long)st->irq_releases,
	       (unsigned long long)st->irq_next_held,
	       (unsigned long long)st->irq_next_released,
	       (unsigned long long)st->irq_unwatched,
	       (unsigned long long)st->gate_timeouts, *ms);
	if (!st->irq_releases && !st->irq_passes)
		return skip("the holder's tick never stopped it in its gate");
	return 0;
}

/*
 * The thread let go at its tick owes its next call that can return an
 * address: its mmap of the freed address is held at its end until the
 * report (the module of 1a2e22b let it return at once, 150 ms before the
 * ack: a window); its getppid before it is not held.
 */
static int t_sync_irq_release_next_call_held(void)
{
	struct kreg_nf_sync_stats st;
	double ms;
	int rc = in_run(false, &st, &ms);

	if (rc)
		return rc;
	CHECK(g_in_after_lock, "the holder's next mmap returned before the report");
	CHECK(g_in_getppid_ms >= 0 && g_in_getppid_ms < 20,
	      "the holder's getppid, which returns no address, took %.1f ms",
	      g_in_getppid_ms);
	CHECK(g_in_signal_ms >= 0 && g_in_signal_ms < 20,
	      "the holder's signal to itself (tgkill, its handler, rt_sigreturn) took %.1f ms",
	      g_in_signal_ms);
	CHECK(st.irq_next_held >= 1 && !st.irq_unwatched && !st.gate_timeouts,
	      "irq_next_held %llu irq_unwatched %llu gate_timeouts %llu",
	      (unsigned long long)st.irq_next_held,
	      (unsigned long long)st.irq_unwatched,
	      (unsigned long long)st.gate_timeouts);
	return 0;
}

/*
 * The holder makes its next mmap inside the lock the report needs: held
 * there too, it would wait for a report that waits for it (UCX 1.13's
 * rcache grows a memory pool, an mmap, under the spinlock its unmap
 * callback takes; the VM suite's UCP run with 8 threads had 3 gates time
 * out at once with the module of 5402a3b, whose hold there had no fuse).
 * Let go after the fuse again (a window, counted), the report ends.
 */
static int t_sync_irq_next_call_inside_lock(void)
{
	struct kreg_nf_sync_stats st;
	double ms;
	int rc = in_run(true, &st, &ms);

	if (rc)
		return rc;
	CHECK(!st.gate_timeouts && ms < 2000, "gate_timeouts %llu after %.0f ms",
	      (unsigned long long)st.gate_timeouts, ms);
	CHECK(st.irq_next_released >= 1, "irq_next_released %llu",
	      (unsigned long long)st.irq_next_released);
	return 0;
}

/*
 * A thread inside a user-space lock that the report needs returns from an
 * mmap or mremap after the change (UCX 1.13's rcache grows the memory pool
 * of its page directories, an mmap, under the spinlock its unmap callback
 * takes: UCP with 2 threads had a gate time out at that mmap's return
 * while both reporters spun on the lock). The reporter, once past the
 * lock, takes 150 ms more to ack.
 *
 * The holder's call: an mremap of a userfaultfd-registered page to a page
 * chosen before (MREMAP_FIXED: nothing of the change), which waits in the
 * kernel until the REMAP event is read, and the reporter reads it (a
 * reporter is not held): so it returns while the change is unreported,
 * whatever the timing. With at_freed, an mmap of the freed address itself
 * (MAP_FIXED_NOREPLACE, until the munmap has freed it): the race the
 * gates close.
 */
static pthread_spinlock_t g_cl_lock;
static volatile bool g_cl_go, g_cl_reporting, g_cl_holding, g_cl_acked;
static volatile bool g_cl_at_freed, g_cl_mapped_acked, g_cl_after;
static void *volatile g_cl_freed, *volatile g_cl_page, *volatile g_cl_to;
static int g_cl_uffd = -1;
static volatile double g_cl_held_ms;

static void cl_reporting(void)
{
	struct uffd_msg m;

	g_cl_reporting = true;
	/* the holder's REMAP event: its mremap returns into the report */
	if (g_cl_uffd >= 0 && (read(g_cl_uffd, &m, sizeof(m)) != sizeof(m) ||
			       m.event != UFFD_EVENT_REMAP))
		fprintf(stderr, "the REMAP event: %s\n", strerror(errno));
	pthread_spin_lock(&g_cl_lock);
	pthread_spin_unlock(&g_cl_lock);
	usleep(150000);
	g_cl_acked = true;	/* just before the ack: a stricter check */
}

static void *cl_holder(void *a)
{
	void *p;
	double t0;

	(void)a;
	pthread_spin_lock(&g_cl_lock);
	g_cl_holding = true;
	while (!g_cl_go)
		;
	t0 = now_ns();
	if (g_cl_at_freed) {
		/*
		 * bounded: a hole another mapping took never frees, and the
		 * reporter waits for this lock (the gate holds 1 s at most)
		 */
		do
			p = mmap(g_cl_freed, 4096, PROT_READ, MAP_PRIVATE |
				 MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
		while (p == MAP_FAILED && errno == EEXIST &&
		       ms_since(t0) < 10000);
	} else {
		p = mremap(g_cl_page, 4096, 4096,
			   MREMAP_MAYMOVE | MREMAP_FIXED, g_cl_to);
	}
	g_cl_mapped_acked = g_cl_acked;
	g_cl_held_ms = ms_since(t0);
	pthread_spin_unlock(&g_cl_lock);
	if (p != (g_cl_at_freed ? g_cl_freed : g_cl_to))
		g_cl_held_ms = -1;	/* it did not map what it asked for */
	if (p != MAP_FAILED)
		munmap(p, 4096);
	in_mmap();	/* its next call that returns an address */
	g_cl_after = g_cl_acked;
	return NULL;
}

/* a userfaultfd with a page registered, whose mremap waits for its event */
static int cl_uffd_page(void)
{
	struct uffdio_api api = { .api = UFFD_API,
				  .features = UFFD_FEATURE_EVENT_REMAP };
	struct uffdio_register reg = { .mode = UFFDIO_REGISTER_MODE_MISSING };

	g_cl_uffd = syscall(SYS_userfaultfd, O_CLOEXEC);
	if (g_cl_uffd < 0)
		return skip("userfaultfd: %s", strerror(errno));
	if (ioctl(g_cl_uffd, UFFDIO_API, &api))
		return skip("UFFDIO_API with EVENT_REMAP: %s", strerror(errno));
	g_cl_page = anon(4096);
	/*
	 * the page it moves onto stays mapped (MREMAP_FIXED replaces it at
	 * once): freed, another mapping could take it, and be replaced
	 */
	g_cl_to = anon(4096);
	CHECK(g_cl_page && g_cl_to, "pages");
	reg.range.start = (uintptr_t)g_cl_page;
	reg.range.len = 4096;
	CHECK(ioctl(g_cl_uffd, UFFDIO_REGISTER, &reg) == 0, "UFFDIO_REGISTER");
	return 0;
}

/* the scenario, with a gate timeout of timeout_ms; *ms: in all */
static int cl_run(bool at_freed, int timeout_ms,
		  struct kreg_nf_sync_stats *st, double *ms)
{
	struct pinned pa;
	pthread_t h;
	double t0;
	int rc;

	g_cl_go = g_cl_reporting = g_cl_holding = g_cl_acked = false;
	g_cl_mapped_acked = g_cl_after = false;
	g_cl_held_ms = -1;
	g_cl_at_freed = at_freed;
	CHECK(pthread_spin_init(&g_cl_lock, PTHREAD_PROCESS_PRIVATE) == 0,
	      "pthread_spin_init");
	CHECK(sy_start(SY_SIGNO, timeout_ms, false) == 0, "SYNC_START");
	rc = pinned_new(&pa, LEN);
	if (rc)
		return rc;
	g_sy.want_start = (uintptr_t)pa.p;
	g_sy.want_end = (uintptr_t)pa.p + LEN;
	g_cl_freed = pa.p;
	g_in_freed = pa.p;
	g_cl_uffd = -1;
	if (!at_freed) {
		rc = cl_uffd_page();
		if (rc)
			return rc;
	}
	CHECK(pthread_create(&h, NULL, cl_holder, NULL) == 0, "pthread_create");
	while (!g_cl_holding)
		;
	g_sy.reporting = cl_reporting;
	t0 = now_ns();
	g_cl_go = true;
	CHECK(pinned_free(&pa) == 0, "munmap");
	CHECK(g_sy.reported, "munmap returned before its report");
	pthread_join(h, NULL);
	*ms = ms_since(t0);
	if (g_cl_uffd >= 0)
		close(g_cl_uffd);
	g_cl_uffd = -1;
	CHECK(sy_stats(st) == 0, "SYNC_STATS");
	printf("the holder's %s returned after %.0f ms (%s the ack); call_releases %llu irq_passes %llu irq_releases %llu irq_next_held %llu irq_next_released %llu irq_unwatched %llu gate_timeouts %llu, %.0f ms in all\n",
	       at_freed ? "mmap" : "mremap", g_cl_held_ms,
	       g_cl_mapped_acked ? "after" : "before",
	       (unsigned long long)st->call_releases,
	       (unsigned long long)st->irq_passes,
	       (unsigned long long)st->irq_releases,
	       (unsigned long long)st->irq_next_held,
	       (unsigned long long)st->irq_next_released,
	       (unsigned long long)st->irq_unwatched,
	       (unsigned long long)st->gate_timeouts, *ms);
	return 0;
}

/*
 * Its call maps nothing of the change: let go after the fuse (counted
 * call_releases; the module of 0dd8951 held it for the whole timeout, 5 s),
 * and its next mmap, after the lock, is held until the ack. If an
 * interrupt reached the holder first while the change was unreported (its
 * tick, the shootdown: seen with the host loaded), its gate let it go
 * there (irq_passes) and the mremap, which mapped nothing of the change,
 * goes on at its end: the report ends all the same.
 */
static int t_sync_call_inside_lock(void)
{
	struct kreg_nf_sync_stats st;
	double ms;
	int rc = cl_run(false, 5000, &st, &ms);

	if (rc)
		return rc;
	CHECK(g_cl_held_ms >= 0, "the holder's mremap failed");
	CHECK(!st.gate_timeouts && (st.call_releases >= 1 || st.irq_passes >= 1) &&
	      ms < 2000,
	      "gate_timeouts %llu call_releases %llu irq_passes %llu after %.0f ms",
	      (unsigned long long)st.gate_timeouts,
	      (unsigned long long)st.call_releases,
	      (unsigned long long)st.irq_passes, ms);
	CHECK(g_cl_after, "the holder's next mmap returned before the report");
	return 0;
}

/*
 * Its mmap maps the freed address itself: no fuse lets that return before
 * the report uncounted. Only the gate timeout, 1 s, lets it go (or, if a
 * failed try was let go first, the owed call's fuse), counted as the
 * window it is.
 */
static int t_sync_call_freed_address_held(void)
{
	struct kreg_nf_sync_stats st;
	double ms;
	int rc = cl_run(true, 1000, &st, &ms);

	if (rc)
		return rc;
	CHECK(g_cl_held_ms >= 0, "the holder never mapped the freed address");
	CHECK(g_cl_mapped_acked || st.gate_timeouts || st.irq_next_released,
	      "the freed address was mapped again before the report, with no window counted");
	return 0;
}

/*
 * A process killed while it owes (its holder never leaves the lock, its
 * report never ends): nothing stays live.
 */
static int t_sync_irq_debt_killed(void)
{
	long c0 = sysval("contexts"), r0 = sysval("ranges"), c, r;
	int status;
	pid_t pid;

	pid = fork();
	CHECK(pid >= 0, "fork");
	if (pid == 0)
		_exit(in_change(true, false, false) ? 1 : 0);
	/* the change and the holder's ticks, passes or fuses, while it spins */
	usleep(700000);
	kill(pid, SIGKILL);
	CHECK(waitpid(pid, &status, 0) == pid, "waitpid");
	CHECK(WIFSIGNALED(status), "child status %#x", status);
	CHECK(live_back_to(c0, r0, &c, &r), "live contexts %ld ranges %ld", c, r);
	return 0;
}

/*
 * A thread that clone() makes while a change is unreported is held at its
 * first return to user space until the report: its first system call could
 * return the freed address (the module of 1a2e22b made its gate only at
 * the next change). The reporter makes it, as any thread that enters
 * clone() while the change is queued could; the report then takes 150 ms
 * more.
 */
static volatile bool g_born_acked, g_born_saw_ack, g_born_ran;
static pthread_t g_born;
static int g_born_pipe[2];

static void *born_thread(void *a)
{
	char c;

	(void)a;
	g_born_saw_ack = g_born_acked;
	g_born_ran = true;
	return (void *)(intptr_t)read(g_born_pipe[0], &c, 1);
}


static void born_reporting(void)
{
	static bool once;

	if (once)
		return;
	once = true;
	if (pthread_create(&g_born, NULL, born_thread, NULL))
		return;
	usleep(150000);
	g_born_acked = true;	/* just before the ack */
}

static int t_sync_born_held(void)
{
	struct kreg_nf_sync_stats st;
	struct pinned pa;
	int rc;

	CHECK(pipe(g_born_pipe) == 0, "pipe");
	rc = pinned_watched(&pa, false);
	if (rc)
		return rc;
	g_sy.reporting = born_reporting;
	CHECK(pinned_free(&pa) == 0, "munmap");
	CHECK(g_sy.reported, "munmap returned before its report");
	CHECK(g_born, "no thread was made inside the report");
	CHECK(sy_stats(&st) == 0, "SYNC_STATS");
	for (int i = 0; i < 2000 && !g_born_ran; i++)
		usleep(1000);
	CHECK(g_born_ran, "the thread made inside the report never ran");
	CHECK(g_born_saw_ack, "the thread made while the change was unreported ran before the report (born_held %llu)",
	      (unsigned long long)st.born_held);
	CHECK(st.born_held >= 1 && !st.gate_timeouts,
	      "born_held %llu gate_timeouts %llu",
	      (unsigned long long)st.born_held,
	      (unsigned long long)st.gate_timeouts);
	CHECK(write(g_born_pipe[1], "x", 1) == 1, "write");
	pthread_join(g_born, NULL);
	return 0;
}

/* ---- 3: threads that do not cross into the kernel cost nothing ----------- */

static int g_sleep_pipe[2];

static void *sleeper(void *a)
{
	char c;

	(void)a;
	return (void *)(intptr_t)read(g_sleep_pipe[0], &c, 1);
}

/*
 * 1000 threads asleep in read(): once each has its gate, a change of
 * pinned memory arms none of them again (the count of gates armed grows by
 * what the changing thread and the reader need, not by 1000 a change).
 * Born after the delivery started (born), each gets its gate when clone()
 * makes it, before any change (the module of d6d54f7 made all 1000 in the
 * first change's callback, an allocation each). Born parked, each made
 * system calls since (glibc's thread start, then read()), so the first
 * change arms each once, as it must: a thread asleep in the kernel waits
 * at its return.
 */
static int sleepers_not_walked(bool born)
{
	enum { SLEEPERS = 1000, CHANGES = 20 };
	struct kreg_nf_sync_stats a, b, a0;
	static pthread_t t[SLEEPERS];
	pthread_attr_t attr;
	int rc, n = 0;

	CHECK(pipe(g_sleep_pipe) == 0, "pipe");
	if (born)
		CHECK(sy_start(SY_SIGNO, 5000, true) == 0, "SYNC_START");
	pthread_attr_init(&attr);
	pthread_attr_setstacksize(&attr, 64 << 10);
	for (; n < SLEEPERS; n++)
		if (pthread_create(&t[n], &attr, sleeper, NULL))
			break;
	if (n < SLEEPERS / 2)
		return skip("only %d threads could be created", n);
	usleep(200000);		/* all asleep */
	if (!born)
		CHECK(sy_start(SY_SIGNO, 5000, true) == 0, "SYNC_START");
	/* made before any change: at their birth, or at the start */
	CHECK(sy_stats(&a0) == 0, "SYNC_STATS");
	for (int i = 0; i < 2 + CHANGES; i++) {
		struct pinned p;

		if (i == 2) {
			CHECK(sy_stats(&a) == 0, "SYNC_STATS");
			printf("the first two changes armed %llu gates\n",
			       (unsigned long long)(a.gates - a0.gates));
		}
		rc = pinned_new(&p, LEN);
		if (rc)
			return rc;
		CHECK(pinned_free(&p) == 0, "munmap");
	}
	CHECK(sy_stats(&b) == 0, "SYNC_STATS");
	printf("%d sleepers%s: threads seen %llu (%llu before the first change measured), over %d changes: queued %llu, gates armed %llu\n",
	       n, born ? " born after the start" : "",
	       (unsigned long long)b.threads, (unsigned long long)a0.threads,
	       CHANGES, (unsigned long long)(b.queued - a.queued),
	       (unsigned long long)(b.gates - a.gates));
	CHECK(b.queued - a.queued >= CHANGES, "queued %llu of %d changes",
	      (unsigned long long)(b.queued - a.queued), CHANGES);
	CHECK(a0.threads >= (uint64_t)n, "threads seen %llu of %d before the changes",
	      (unsigned long long)a0.threads, n);
	CHECK(b.gates - a.gates <= 10 * CHANGES,
	      "%llu gates armed for %d changes with %d threads asleep",
	      (unsigned long long)(b.gates - a.gates), CHANGES, n);
	sy_stop_dispatcher();
	return 0;
}

static int t_sync_sleepers_not_walked(void)
{
	return sleepers_not_walked(false);
}

static int t_sync_born_not_walked(void)
{
	return sleepers_not_walked(true);
}

/* Rescheduling interrupts CPU cpu has taken (RES in /proc/interrupts). */
static long res_irqs(int cpu)
{
	char line[4096];
	long v = -1;
	FILE *f = fopen("/proc/interrupts", "r");

	while (f && fgets(line, sizeof(line), f)) {
		char *s = line;

		while (*s == ' ')
			s++;
		if (strncmp(s, "RES:", 4))
			continue;
		s += 4;
		for (int i = 0; i <= cpu; i++)
			v = strtol(s, &s, 10);
		break;
	}
	if (f)
		fclose(f);
	return v;
}

static volatile unsigned long g_spins;

static void *user_spinner(void *a)
{
	cpu_set_t set;

	CPU_ZERO(&set);
	CPU_SET((int)(intptr_t)a, &set);
	pthread_setaffinity_np(pthread_self(), sizeof(set), &set);
	while (!g_stop)
		g_spins++;
	return NULL;
}

/*
 * changes pinned frees, 20 ms apart (five ticks: each is reported long
 * before the next tick); the rescheduling interrupts CPU 1 took meanwhile
 */
static long res_during_changes(int changes, long *res)
{
	long r0 = res_irqs(1);
	int rc;

	for (int i = 0; i < changes; i++) {
		struct pinned p;

		rc = pinned_new(&p, LEN);
		if (rc)
			return rc;
		CHECK(pinned_free(&p) == 0, "munmap");
		usleep(20000);
	}
	*res = res_irqs(1) - r0;
	return r0 < 0 ? 1 : 0;
}

/*
 * ---- a thread in user space during a change: the shootdown's return ----
 *
 * A thread spinning in user space on CPU 1 while the main thread, on CPU 0,
 * changes a pinned buffer: the change's TLB shootdown interrupts it. After
 * a munmap it has obtained nothing there and cannot but by a call that
 * returns an address, so it goes on at once (irq_passes; the module of
 * aaa88bf held it until the report, and every spinner of a process paid
 * that at nearly every change). Its mmap of the freed address, while the
 * report (200 ms) is under way, is held until the ack; an mmap elsewhere
 * and a getppid are not. After an MADV_DONTNEED the range stays mapped
 * and a touch maps a new page there: it is held at the shootdown (a report
 * of 30 ms, inside the 50 ms fuse), and its touch comes after the ack. So
 * after an mremap with MREMAP_DONTUNMAP, which moves the pages and leaves
 * the old range mapped, empty, and after an mmap (MAP_FIXED) or an mremap
 * (MREMAP_FIXED) over the range, which put a new VMA there at once.
 */
enum sp_act {
	SP_TOUCH, SP_TOUCH_DONTUNMAP, SP_TOUCH_MAP_FIXED, SP_TOUCH_REMAP_ONTO,
	SP_TOUCH_GROWSDOWN,
	SP_MMAP_FREED, SP_MMAP_ELSEWHERE, SP_MMAP_SPLIT, SP_IO_SETUP, SP_NEW_MAP,
	SP_BRK_FREED, SP_BRK_ELSEWHERE
};

static volatile bool g_sp_go, g_sp_in_report, g_sp_acking;
static volatile bool g_sp_saw_window, g_sp_after;
static volatile double g_sp_act_ms, g_sp_getppid_ms;
static volatile double g_sp_report_t0, g_sp_seen_ms;
static char *volatile g_sp_buf, *volatile g_sp_spare;
static volatile enum sp_act g_sp_act;
static volatile int g_sp_report_ms;
static volatile double g_sp_last, g_sp_map_t, g_sp_gap_ms;
#define SP_NB	(4 << 20)	/* a neighbour of the buffer */

static void sp_reporting(void)
{
	void *p;

	g_sp_report_t0 = now_ns();
	g_sp_in_report = true;
	if (g_sp_act == SP_NEW_MAP) {
		/* a new mapping while the spinner runs, let go */
		usleep(50000);
		g_sp_map_t = now_ns();
		p = mmap(NULL, 4096, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS,
			 -1, 0);
		if (p != MAP_FAILED)
			munmap(p, 4096);
		usleep((g_sp_report_ms - 50) * 1000);
	} else {
		usleep(g_sp_report_ms * 1000);
	}
	g_sp_acking = true;	/* just before the ack: a stricter check */
}

static void *sp_spinner(void *a)
{
	double t0;
	void *p;

	(void)a;
	pin_to_cpu(1);
	while (!g_sp_go)
		;
	while (!g_sp_in_report)
		;	/* in user space through the change and its shootdown */
	g_sp_seen_ms = ms_since(g_sp_report_t0);
	g_sp_saw_window = !g_sp_acking;
	t0 = now_ns();
	g_sp_act_ms = 0;
	switch (g_sp_act) {
	case SP_NEW_MAP:
		/* until the ack; its longest stop once the mapping is made */
		g_sp_last = now_ns();
		while (!g_sp_acking) {
			double t = now_ns();

			if (g_sp_map_t && (t - g_sp_last) / 1e6 > g_sp_gap_ms)
				g_sp_gap_ms = (t - g_sp_last) / 1e6;
			g_sp_last = t;
		}
		break;
	case SP_BRK_FREED:
	case SP_BRK_ELSEWHERE:
		/* the heap back over the freed buffer, or a new page of it */
		if (sbrk(g_sp_act == SP_BRK_FREED ? LEN : 4096) == (void *)-1)
			g_sp_act_ms = -5;
		break;
	case SP_IO_SETUP: {
		aio_context_t ctx = 0;

		if (syscall(SYS_io_setup, 1, &ctx))
			g_sp_act_ms = -4;
		else
			syscall(SYS_io_destroy, ctx);
		break;
	}
	case SP_TOUCH:
	case SP_TOUCH_DONTUNMAP:
	case SP_TOUCH_MAP_FIXED:
	case SP_TOUCH_REMAP_ONTO:
	case SP_TOUCH_GROWSDOWN:
		g_sp_buf[4096] = 1;
		break;
	case SP_MMAP_FREED:
	case SP_MMAP_ELSEWHERE:
	case SP_MMAP_SPLIT:
		p = g_sp_act == SP_MMAP_FREED ? g_sp_buf : g_sp_spare;
		if (mmap(p, 4096, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS |
			 MAP_FIXED_NOREPLACE, -1, 0) != p)
			g_sp_act_ms = -3;
		break;
	}
	g_sp_after = g_sp_acking;
	if (g_sp_act_ms == 0)
		g_sp_act_ms = ms_since(t0);
	t0 = now_ns();
	syscall(SYS_getppid);
	g_sp_getppid_ms = ms_since(t0);
	return NULL;
}

static int sp_run(enum sp_act act, struct kreg_nf_sync_stats *st)
{
	bool freed = act == SP_MMAP_FREED || act == SP_MMAP_ELSEWHERE ||
		     act == SP_MMAP_SPLIT || act == SP_IO_SETUP ||
		     act == SP_NEW_MAP || act == SP_BRK_FREED ||
		     act == SP_BRK_ELSEWHERE;
	char *big = NULL;
	struct pinned pa;
	void *moved = NULL;
	pthread_t sp;
	int rc;

	if (sysconf(_SC_NPROCESSORS_ONLN) < 2)
		return skip("one CPU: no thread runs beside the changing one");
	pin_to_cpu(0);
	g_sp_go = g_sp_in_report = g_sp_acking = false;
	g_sp_saw_window = g_sp_after = false;
	g_sp_act_ms = g_sp_getppid_ms = g_sp_seen_ms = -1;
	g_sp_act = act;
	g_sp_report_ms = freed ? 200 : 30;
	g_sp_last = g_sp_map_t = g_sp_gap_ms = 0;
	if (act == SP_MMAP_SPLIT) {
		/*
		 * The buffer inside a mapping of 4 MiB on each side: one VMA,
		 * which the munmap splits, and where the 2 MiB around a new
		 * boundary lie inside the VMA 6.1 splits their PMD first,
		 * huge or not (MMU_NOTIFY_CLEAR, every page kept;
		 * split_huge_pmd_if_needed())
		 */
		CHECK(sy_start(SY_SIGNO, 5000, false) == 0, "SYNC_START");
		/*
		 * Small pages: a huge one's split is acknowledged empty at
		 * its end (sync-split-keeps-neighbours); a page table's is
		 * announced all the same and stays a change
		 */
		big = mmap(NULL, 2 * SP_NB + LEN, PROT_READ | PROT_WRITE,
			   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		CHECK(big != MAP_FAILED &&
		      madvise(big, 2 * SP_NB + LEN, MADV_NOHUGEPAGE) == 0,
		      "a mapping around the buffer");
		/* backwards: no run of pfns in turn, as a huge page split
		 * leaves, which the module would take for a split kept */
		for (long off = 2 * SP_NB + LEN - 4096; off >= 0; off -= 4096)
			big[off] = 0x5a;
		rc = pinned_at(&pa, big + SP_NB, LEN);
		g_sy.want_start = (uintptr_t)pa.p;
		g_sy.want_end = (uintptr_t)pa.p + LEN;
	} else if (act == SP_BRK_FREED) {
		/* the buffer at the top of the heap, given back by brk */
		char *top = sbrk(0);

		CHECK(sy_start(SY_SIGNO, 5000, false) == 0, "SYNC_START");
		CHECK(sbrk((4096 - (uintptr_t)top % 4096) % 4096) != (void *)-1,
		      "sbrk to a page");
		top = sbrk(LEN);
		CHECK(top != (void *)-1, "sbrk");
		memset(top, 0x5a, LEN);
		rc = pinned_at(&pa, top, LEN);
		g_sy.want_start = (uintptr_t)pa.p;
		g_sy.want_end = (uintptr_t)pa.p + LEN;
	} else if (act == SP_TOUCH_GROWSDOWN) {
		/*
		 * the buffer just below a stack that grows down, with 4 MiB
		 * reserved below it (PROT_NONE: nothing is placed there, and
		 * the kernel keeps its stack_guard_gap from accessible
		 * mappings only)
		 */
		CHECK(sy_start(SY_SIGNO, 5000, false) == 0, "SYNC_START");
		big = mmap(NULL, SP_NB + 2 * LEN, PROT_NONE,
			   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		CHECK(big != MAP_FAILED, "a place");
		CHECK(mmap(big + SP_NB, LEN, PROT_READ | PROT_WRITE,
			   MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0) ==
		      big + SP_NB &&
		      mmap(big + SP_NB + LEN, LEN, PROT_READ | PROT_WRITE,
			   MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED |
			   MAP_GROWSDOWN, -1, 0) == big + SP_NB + LEN,
		      "a buffer below a MAP_GROWSDOWN mapping");
		memset(big + SP_NB, 0x5a, LEN);
		rc = pinned_at(&pa, big + SP_NB, LEN);
		g_sy.want_start = (uintptr_t)pa.p;
		g_sy.want_end = (uintptr_t)pa.p + LEN;
	} else {
		rc = pinned_watched(&pa, false);
	}
	if (rc)
		return rc;
	/* after the START: the hooks go on at the first since module load */
	if (freed && !irq_passes_on())
		return skip("no call hooks (call_hook %ld): gates hold at interrupts",
			    sysval("call_hook"));
	g_sp_buf = pa.p;
	CHECK(pthread_create(&sp, NULL, sp_spinner, NULL) == 0, "spinner");
	g_sy.reporting = sp_reporting;
	usleep(50000);	/* the spinner runs on CPU 1 */
	/* last: nothing else is mapped there before the spinner's mmap */
	g_sp_spare = anon(4096);
	CHECK(g_sp_spare && munmap(g_sp_spare, 4096) == 0, "a spare page");
	g_sp_go = true;
	if (act == SP_BRK_FREED) {
		/* malloc may have moved the break meanwhile: then not ours */
		if (sbrk(0) != pa.p + LEN) {
			g_sp_act = SP_BRK_ELSEWHERE;
			g_sp_in_report = true;
			pthread_join(sp, NULL);
			return skip("the break moved past the buffer (malloc)");
		}
		CHECK(sbrk(-LEN) != (void *)-1, "sbrk back");
	} else if (freed) {
		CHECK(munmap(pa.p, LEN) == 0, "munmap");
	} else if (act == SP_TOUCH_DONTUNMAP) {
		/* a free place to move to: the kernel reads a new address */
		moved = anon(LEN);
		CHECK(moved && munmap(moved, LEN) == 0, "a free place");
		moved = (void *)syscall(SYS_mremap, pa.p, LEN, LEN,
					MREMAP_MAYMOVE | MREMAP_DONTUNMAP,
					moved);
		if (moved == MAP_FAILED) {
			moved = NULL;
			g_sp_act = SP_MMAP_ELSEWHERE;	/* the spinner goes on */
			g_sp_in_report = true;
			pthread_join(sp, NULL);
			return skip("mremap MREMAP_DONTUNMAP: %s", strerror(errno));
		}
	} else if (act == SP_TOUCH_GROWSDOWN) {
		CHECK(munmap(pa.p, LEN) == 0, "munmap");
	} else if (act == SP_TOUCH_MAP_FIXED) {
		CHECK(mmap(pa.p, LEN, PROT_READ | PROT_WRITE, MAP_PRIVATE |
			   MAP_ANONYMOUS | MAP_FIXED, -1, 0) == pa.p, "MAP_FIXED");
	} else if (act == SP_TOUCH_REMAP_ONTO) {
		moved = anon(LEN);
		CHECK(moved, "a mapping to move");
		CHECK(mremap(moved, LEN, LEN, MREMAP_MAYMOVE | MREMAP_FIXED,
			     pa.p) == pa.p, "MREMAP_FIXED");
		moved = NULL;
	} else {
		CHECK(madvise(pa.p, LEN, MADV_DONTNEED) == 0, "madvise");
	}
	CHECK(g_sy.reported, "the change returned before its report");
	pthread_join(sp, NULL);
	g_sy.reporting = NULL;
	io_uring_queue_exit(&pa.ring);
	if (!freed)
		munmap(pa.p, LEN);
	if (moved)
		munmap(moved, LEN);
	if (big && act == SP_TOUCH_GROWSDOWN) {
		munmap(big, SP_NB + 2 * LEN);
	} else if (big) {
		munmap(big, SP_NB);
		munmap(big + SP_NB + LEN, SP_NB);
	}
	CHECK(sy_stats(st) == 0, "SYNC_STATS");
	printf("the spinner %s the report, %.1f ms after it began; its act took %.1f ms, %s the ack; getppid %.1f ms; queued %llu irq_passes %llu irq_releases %llu irq_next_held %llu gate_waits %llu gate_timeouts %llu\n",
	       g_sp_saw_window ? "ran during" : "was held until",
	       g_sp_seen_ms, g_sp_act_ms,
	       g_sp_after ? "ended after" : "returned before",
	       g_sp_getppid_ms, (unsigned long long)st->queued,
	       (unsigned long long)st->irq_passes,
	       (unsigned long long)st->irq_releases,
	       (unsigned long long)st->irq_next_held,
	       (unsigned long long)st->gate_waits,
	       (unsigned long long)st->gate_timeouts);
	CHECK(g_sp_act_ms >= 0, "the spinner's act failed (%.0f)", g_sp_act_ms);
	CHECK(!st->gate_timeouts, "gate_timeouts %llu",
	      (unsigned long long)st->gate_timeouts);
	CHECK(g_sp_getppid_ms >= 0 && g_sp_getppid_ms < 20,
	      "the spinner's getppid took %.1f ms", g_sp_getppid_ms);
	if (!freed)
		return 0;
	CHECK(g_sp_saw_window, "the spinner was held at the change's shootdown until the report");
	/* held there, it was let go only by the 50 ms fuse (irq_releases) */
	CHECK(g_sp_seen_ms >= 0 && g_sp_seen_ms < 20 && st->irq_passes >= 1 &&
	      (!st->irq_releases || act == SP_NEW_MAP),
	      "the spinner saw the report %.1f ms after it began; irq_passes %llu irq_releases %llu",
	      g_sp_seen_ms, (unsigned long long)st->irq_passes,
	      (unsigned long long)st->irq_releases);
	return 0;
}

/* the spinner's act (a call that makes a mapping) waits for the report */
static int sp_call_held(enum sp_act act, const char *what)
{
	struct kreg_nf_sync_stats st;
	int rc = sp_run(act, &st);

	if (rc)
		return rc;
	CHECK(g_sp_after && st.irq_next_held >= 1,
	      "the spinner's %s %s the report (irq_next_held %llu)", what,
	      g_sp_after ? "ended after" : "returned before",
	      (unsigned long long)st.irq_next_held);
	return 0;
}

/* its mmap of the freed address */
static int t_sync_spinner_mmap_freed_held(void)
{
	return sp_call_held(SP_MMAP_FREED, "mmap of the freed address");
}

/*
 * its mmap elsewhere does not; nor does a munmap that splits the buffer's
 * VMA (the module of 2413a28 held the spinner there for the fuse, 50 ms,
 * whenever a neighbour had merged into the buffer's VMA: a flake in CI's
 * rehearsal of it)
 */
static int spinner_mmap_elsewhere(enum sp_act act)
{
	struct kreg_nf_sync_stats st;
	int rc = sp_run(act, &st);

	if (rc)
		return rc;
	CHECK(!g_sp_after && g_sp_act_ms < 20,
	      "the spinner's mmap elsewhere %s the report, after %.1f ms",
	      g_sp_after ? "ended after" : "returned before", g_sp_act_ms);
	return 0;
}

static int t_sync_spinner_mmap_elsewhere(void)
{
	return spinner_mmap_elsewhere(SP_MMAP_ELSEWHERE);
}

static int t_sync_spinner_munmap_split(void)
{
	return spinner_mmap_elsewhere(SP_MMAP_SPLIT);
}

/*
 * While a change is unreported, an mmap whose address the kernel chooses
 * lands off the change's range (kreg_place.c). UCX 1.13's rcache grows a
 * pool by such an mmap inside the spinlock its unmap callback takes: one
 * placed in the freed range was held until the gate timed out, the
 * reporters spinning on that lock. Nobody reports here (no signal, no
 * reader), so the change stays unreported; without the steering the new
 * mapping takes the freed range, the highest gap that fits.
 */
#define HUGE_LEN (2 << 20)	/* a PMD's huge page on x86-64 */

static volatile int g_pl_go;
static char *volatile g_pl_p;

static void *pl_unmapper(void *a)
{
	(void)a;
	while (!g_pl_go)
		usleep(1000);
	return (void *)(intptr_t)munmap(g_pl_p, LEN);
}

static int mmap_placed_off_freed(size_t len)
{
	struct kreg_nf_sync_stats st = { 0 };
	bool overlap;
	pthread_t t;
	char *p, *q;
	void *ret;
	int rc, i;

	CHECK(sy_start(0, 300, false) == 0, "SYNC_START signo 0");
	/* the thread's stack first: the buffer is then the last mapping made */
	CHECK(pthread_create(&t, NULL, pl_unmapper, NULL) == 0, "thread");
	p = sy_buffer(true, &rc);
	g_pl_p = p;
	g_pl_go = 1;
	if (rc) {
		pthread_join(t, NULL);
		return rc;
	}
	/* queued: this thread's next return is held until its timeout once */
	for (i = 0; i < 5000 && !st.queued; i++)
		if (sy_stats(&st) || !st.queued)
			usleep(1000);
	q = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
		 -1, 0);
	pthread_join(t, &ret);
	overlap = q != MAP_FAILED && q < p + LEN && p < q + len;
	if (q != MAP_FAILED)
		munmap(q, len);
	CHECK(st.queued >= 1, "the change was never queued");
	CHECK(q != MAP_FAILED && ret == NULL, "mmap, or the thread's munmap");
	CHECK(sy_stats(&st) == 0 && st.gate_timeouts >= 1,
	      "the change was reported (gate_timeouts %llu): nothing tested",
	      (unsigned long long)st.gate_timeouts);
	CHECK(!overlap, "an mmap while the change was unreported got %p, in the freed %p-%p",
	      (void *)q, (void *)p, (void *)(p + LEN));
	CHECK(sy_drain() == 0 && g_sy.reported, "the change was lost");
	CHECK(len % HUGE_LEN || !((uintptr_t)q % HUGE_LEN),
	      "a mapping of %zu MiB placed while a change was unreported lies at %p, off a %d MiB boundary",
	      len >> 20, (void *)q, HUGE_LEN >> 20);
	return 0;
}

static int t_sync_mmap_placed_off_freed(void)
{
	return mmap_placed_off_freed(LEN);
}

/*
 * A mapping of whole huge pages steered off the change keeps its huge
 * pages: the kernel aligns it when it chooses the address itself (6.12),
 * and the steering's hint, taken as it is, must be aligned too (the
 * module of ea4e7cc passed the bottom of the gap, off the boundary unless
 * the freed buffer happened to lie on one).
 */
static int t_sync_mmap_placed_huge_aligned(void)
{
	const size_t len = 2 * HUGE_LEN;
	char *q;

	if (access("/sys/kernel/mm/transparent_hugepage/enabled", F_OK))
		return skip("no transparent huge pages in this kernel");
	/* what the kernel itself does with no change unreported: said, not asserted */
	q = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
		 -1, 0);
	CHECK(q != MAP_FAILED, "mmap");
	printf("the kernel alone placed %zu MiB at %p (%s)\n", len >> 20, (void *)q,
	       (uintptr_t)q % HUGE_LEN ? "unaligned" : "aligned");
	munmap(q, len);
	return mmap_placed_off_freed(len);
}

/* a brk whose heap holds nothing of the change goes on (glibc's malloc
 * calls it under its arena lock) */
static int t_sync_spinner_brk_elsewhere(void)
{
	return spinner_mmap_elsewhere(SP_BRK_ELSEWHERE);
}

/* a brk that maps the heap back over a buffer brk gave back: held */
static int t_sync_spinner_brk_freed_held(void)
{
	return sp_call_held(SP_BRK_FREED, "brk over the freed buffer");
}

/*
 * io_setup maps its ring with do_mmap() and returns its address: held
 * (the module of 2413a28 hooked the system calls mmap, mremap, brk and
 * shmat, and let io_setup return before the report)
 */
static int t_sync_spinner_io_setup_held(void)
{
	return sp_call_held(SP_IO_SETUP, "io_setup");
}

/*
 * Once another thread makes a new mapping (the reporter's mmap, 50 ms into
 * a report of 200), the spinner let go at the shootdown is held again at
 * its next return (its tick): the new mapping may lie where the change
 * was, and a touch there would fault a page in at an address the report
 * is about. It stops for the 50 ms fuse, at least 30 ms; without the
 * module's end of the pass it ran on to the ack.
 */
static int t_sync_spinner_new_map_held(void)
{
	struct kreg_nf_sync_stats st;
	int rc = sp_run(SP_NEW_MAP, &st);

	if (rc)
		return rc;
	printf("after the new mapping the spinner stopped for %.1f ms at most\n",
	       g_sp_gap_ms);
	CHECK(g_sp_map_t > 0 && g_sp_gap_ms >= 30,
	      "the spinner ran on after another thread's new mapping (longest stop %.1f ms)",
	      g_sp_gap_ms);
	return 0;
}

/* the range stays mapped: held at the shootdown, its touch after the ack */
static int sp_touch_held(enum sp_act act, const char *change)
{
	struct kreg_nf_sync_stats st;
	int rc = sp_run(act, &st);

	if (rc)
		return rc;
	CHECK(!g_sp_saw_window && g_sp_after && !st.irq_passes,
	      "the spinner %s the report after %s, its touch %s the ack; irq_passes %llu",
	      g_sp_saw_window ? "ran during" : "was held until", change,
	      g_sp_after ? "ended after" : "returned before",
	      (unsigned long long)st.irq_passes);
	return 0;
}

static int t_sync_spinner_touch_held(void)
{
	return sp_touch_held(SP_TOUCH, "an MADV_DONTNEED");
}

static int t_sync_spinner_touch_dontunmap_held(void)
{
	return sp_touch_held(SP_TOUCH_DONTUNMAP, "an mremap with MREMAP_DONTUNMAP");
}

static int t_sync_spinner_touch_map_fixed_held(void)
{
	return sp_touch_held(SP_TOUCH_MAP_FIXED, "an mmap with MAP_FIXED over it");
}

static int t_sync_spinner_touch_remap_onto_held(void)
{
	return sp_touch_held(SP_TOUCH_REMAP_ONTO, "an mremap with MREMAP_FIXED onto it");
}

/* a munmap below a MAP_GROWSDOWN mapping: a touch grows the stack there */
static int t_sync_spinner_touch_growsdown_held(void)
{
	return sp_touch_held(SP_TOUCH_GROWSDOWN, "a munmap below a stack that grows down");
}

/* this thread on CPU 0, user_spinner on CPU 1 until g_stop */
static int spinner_start(pthread_t *sp)
{
	cpu_set_t set;

	CPU_ZERO(&set);
	CPU_SET(0, &set);
	CHECK(sched_setaffinity(0, sizeof(set), &set) == 0, "affinity");
	g_stop = false;
	CHECK(pthread_create(sp, NULL, user_spinner, (void *)1) == 0, "spinner");
	usleep(100000);
	return 0;
}

/* what a spinner's run gives back: rc, or the first failure */
static int spinner_stop(pthread_t sp, int rc)
{
	g_stop = true;
	pthread_join(sp, NULL);
	return rc;
}

/*
 * A thread spinning in user space on another CPU is never kicked by a
 * change (the gate is armed without one): its CPU takes no more
 * rescheduling interrupts with synchronous delivery than without it.
 */
static int t_sync_spinner_not_kicked(void)
{
	enum { CHANGES = 50 };
	long base, with;
	pthread_t sp;
	int rc;

	if (sysconf(_SC_NPROCESSORS_ONLN) < 2)
		return skip("one CPU: no thread runs beside the changing one");
	rc = spinner_start(&sp);
	if (rc)
		return rc;
	rc = res_during_changes(CHANGES, &base);
	if (!rc && sy_start(SY_SIGNO, 5000, false)) {
		failed(__LINE__, "sy_start", "SYNC_START");
		rc = 1;
	}
	if (!rc)
		rc = res_during_changes(CHANGES, &with);
	if (spinner_stop(sp, rc))
		return rc;
	printf("CPU 1 (the spinner's) took %ld rescheduling interrupts during %d changes without synchronous delivery, %ld with it\n",
	       base, CHANGES, with);
	{
		struct kreg_nf_sync_stats st;

		CHECK(sy_stats(&st) == 0, "SYNC_STATS");
		printf("gates %llu waits %llu passes %llu irq_passes %llu parked %llu timeouts %llu\n",
		       (unsigned long long)st.gates,
		       (unsigned long long)st.gate_waits,
		       (unsigned long long)st.gate_passes,
		       (unsigned long long)st.irq_passes,
		       (unsigned long long)st.gates_parked,
		       (unsigned long long)st.gate_timeouts);
		/*
		 * The spinner comes back from the TLB shootdown the munmap
		 * sends to its CPU (the kernel's IPI, which it takes with
		 * UCM's hooks too) while the change is unreported: it goes on
		 * at once where the call hooks are on (the module of aaa88bf
		 * held it there, a wait at nearly every change), else it
		 * waits there. Where gates park, its gate parked at its first
		 * return and no munmap armed it again (sync-spinner-parked).
		 */
		if (irq_passes_on())
			CHECK(st.gate_waits <= CHANGES / 10 &&
			      (st.irq_passes || st.gates_parked),
			      "%llu waits, %llu passes at an interrupt, %llu gates parked for %d changes",
			      (unsigned long long)st.gate_waits,
			      (unsigned long long)st.irq_passes,
			      (unsigned long long)st.gates_parked, CHANGES);
	}
	/*
	 * A kick a change (the module of a37c080: TWA_RESUME) is a
	 * rescheduling interrupt a change on the spinner's CPU: 50 here. The
	 * waits above end in a wake-up, which reaches an idle CPU by a
	 * rescheduling interrupt too: 12 of 50 once in a full run under
	 * load (bound CHANGES / 5 then failed), 0-3 alone. Half the changes
	 * still tells a kick a change from those.
	 */
	CHECK(with - base < CHANGES / 2,
	      "the spinner's CPU took %ld rescheduling interrupts more for %d changes",
	      with - base, CHANGES);
	return 0;
}

/* the system call hook is on: gates park at interrupts (kreg_gate.c) */
static bool parking_on(void)
{
	return irq_passes_on() && sysval("syscall_hook") == 1;
}

/*
 * A thread spinning in user space beside 50 munmaps of pinned memory: its
 * gate runs at the first one's shootdown and parks (gates_parked), and the
 * others, which leave no mapping where they were, arm it no more. The
 * module of 1853cdd armed it at every change and ran it at every
 * shootdown's return (irq_passes 50): at T = 1024 spinners, 150 gates a
 * change.
 */
static int t_sync_spinner_parked(void)
{
	enum { CHANGES = 50 };
	struct kreg_nf_sync_stats a, b;
	long res;
	pthread_t sp;
	int rc;

	if (sysconf(_SC_NPROCESSORS_ONLN) < 2)
		return skip("one CPU: no thread runs beside the changing one");
	CHECK(sy_start(SY_SIGNO, 5000, false) == 0, "SYNC_START");
	if (!parking_on())
		return skip("no system call hook (call_hook %ld, syscall_hook %ld): gates do not park",
			    sysval("call_hook"), sysval("syscall_hook"));
	rc = spinner_start(&sp);
	if (rc)
		return rc;
	/* the spinner's gate is made at the first change, and parks */
	rc = res_during_changes(2, &res);
	if (!rc && sy_stats(&a)) {
		failed(__LINE__, "sy_stats", "SYNC_STATS");
		rc = 1;
	}
	if (!rc)
		rc = res_during_changes(CHANGES, &res);
	if (spinner_stop(sp, rc))
		return rc;
	CHECK(sy_stats(&b) == 0, "SYNC_STATS");
	printf("over %d munmaps: gates armed %llu, irq_passes %llu, gates_parked %llu (in all), gate_waits %llu\n",
	       CHANGES, (unsigned long long)(b.gates - a.gates),
	       (unsigned long long)(b.irq_passes - a.irq_passes),
	       (unsigned long long)b.gates_parked,
	       (unsigned long long)(b.gate_waits - a.gate_waits));
	CHECK(b.gates_parked >= 1, "no gate parked");
	/* the changing thread's own gate is armed at each: CHANGES */
	CHECK(b.irq_passes - a.irq_passes <= CHANGES / 10 &&
	      b.gates - a.gates <= CHANGES + CHANGES / 10,
	      "the spinner's gate was armed again: %llu gates, %llu irq_passes for %d munmaps",
	      (unsigned long long)(b.gates - a.gates),
	      (unsigned long long)(b.irq_passes - a.irq_passes), CHANGES);
	return 0;
}

/*
 * A parked thread still waits at the end of its next system call for a
 * change made since it parked (threads that enter and leave the kernel
 * while a change is unreported wait): a getppid during a report of 100 ms
 * returns after the ack (parked_held). The module with the hook doing
 * nothing let it return at once; the module of 1853cdd let it go at the
 * shootdown's return (an irq pass) and did not hold the getppid either.
 */
static volatile bool g_pk_in_report, g_pk_acking;

static void pk_reporting(void)
{
	g_pk_in_report = true;
	usleep(100000);
	g_pk_acking = true;
}

static volatile bool g_pk_go, g_pk_after;
static volatile double g_pk_ms;

static void *pk_spinner(void *a)
{
	double t0;

	(void)a;
	pin_to_cpu(1);
	while (!g_pk_go)
		;
	while (!g_pk_in_report)
		;
	t0 = now_ns();
	syscall(SYS_getppid);
	g_pk_ms = ms_since(t0);
	g_pk_after = g_pk_acking;
	return NULL;
}

/*
 * The parked-thread cases' start: this thread on CPU 0, a pinned buffer
 * watched in *pa, the flags cleared. 0, 77 with the reason, or a failure.
 */
static int pk_start(struct pinned *pa)
{
	int rc;

	if (sysconf(_SC_NPROCESSORS_ONLN) < 2)
		return skip("one CPU: no thread runs beside the changing one");
	pin_to_cpu(0);
	rc = pinned_watched(pa, false);
	if (rc)
		return rc;
	if (!parking_on())
		return skip("no system call hook (call_hook %ld, syscall_hook %ld): gates do not park",
			    sysval("call_hook"), sysval("syscall_hook"));
	g_pk_go = g_pk_in_report = g_pk_acking = g_pk_after = false;
	return 0;
}

static int t_sync_parked_syscall_held(void)
{
	struct kreg_nf_sync_stats a, b;
	struct pinned pa;
	pthread_t sp;
	long res;
	int rc;

	rc = pk_start(&pa);
	if (rc)
		return rc;
	g_pk_ms = -1;
	CHECK(pthread_create(&sp, NULL, pk_spinner, NULL) == 0, "spinner");
	usleep(50000);
	/* another change first: the spinner's gate is made, and parks */
	rc = res_during_changes(2, &res);
	if (rc)
		return rc;
	CHECK(sy_stats(&a) == 0, "SYNC_STATS");
	g_sy.want_start = (uintptr_t)pa.p;
	g_sy.want_end = (uintptr_t)pa.p + LEN;
	g_sy.reported = 0;
	g_sy.reporting = pk_reporting;
	g_pk_go = true;
	CHECK(pinned_free(&pa) == 0, "munmap");
	CHECK(g_sy.reported, "the change returned before its report");
	pthread_join(sp, NULL);
	g_sy.reporting = NULL;
	CHECK(sy_stats(&b) == 0, "SYNC_STATS");
	printf("the parked spinner's getppid took %.1f ms, %s the ack; gates_parked %llu parked_held %llu irq_passes %llu\n",
	       g_pk_ms, g_pk_after ? "ended after" : "returned before",
	       (unsigned long long)a.gates_parked,
	       (unsigned long long)(b.parked_held - a.parked_held),
	       (unsigned long long)(b.irq_passes - a.irq_passes));
	CHECK(a.gates_parked >= 1, "the spinner's gate did not park");
	CHECK(g_pk_after && b.parked_held - a.parked_held >= 1,
	      "the parked spinner's getppid %s the ack (parked_held %llu)",
	      g_pk_after ? "ended after" : "returned before",
	      (unsigned long long)(b.parked_held - a.parked_held));
	return 0;
}

/*
 * A parked thread that then blocks in a system call (read() of a pipe)
 * while a munmap of pinned memory is made: it was in the kernel during the
 * change, so it waits at that call's end until the report. Its read's
 * entry took its gate off the parked list, where the change arms it. With
 * the system call hook doing nothing the read returned before the ack.
 */
static int g_pr_pipe[2];

static void pr_reporting(void)
{
	g_pk_in_report = true;
	usleep(20000);
	if (write(g_pr_pipe[1], "x", 1) != 1)
		perror("write");
	usleep(80000);
	g_pk_acking = true;
}

static void *pr_reader(void *a)
{
	char c;

	(void)a;
	pin_to_cpu(1);
	while (!g_pk_go)
		;		/* in user space: parks at the warm-up changes */
	g_pk_after = read(g_pr_pipe[0], &c, 1) == 1 && g_pk_acking;
	return NULL;
}

static int t_sync_parked_sleeper_held(void)
{
	struct kreg_nf_sync_stats a;
	struct pinned pa;
	pthread_t rd;
	long res;
	int rc;

	CHECK(pipe(g_pr_pipe) == 0, "pipe");
	rc = pk_start(&pa);
	if (rc)
		return rc;
	CHECK(pthread_create(&rd, NULL, pr_reader, NULL) == 0, "reader");
	usleep(50000);
	rc = res_during_changes(2, &res);
	if (rc)
		return rc;
	CHECK(sy_stats(&a) == 0, "SYNC_STATS");
	g_pk_go = true;
	usleep(50000);		/* asleep in read() */
	g_sy.want_start = (uintptr_t)pa.p;
	g_sy.want_end = (uintptr_t)pa.p + LEN;
	g_sy.reported = 0;
	g_sy.reporting = pr_reporting;
	CHECK(pinned_free(&pa) == 0, "munmap");
	CHECK(g_sy.reported, "the change returned before its report");
	pthread_join(rd, NULL);
	g_sy.reporting = NULL;
	printf("gates_parked %llu before; the sleeper's read %s the ack\n",
	       (unsigned long long)a.gates_parked,
	       g_pk_after ? "ended after" : "returned before");
	CHECK(a.gates_parked >= 1, "the thread's gate did not park");
	CHECK(g_pk_after, "the parked thread's read, made before the change, returned before the ack");
	return 0;
}

static void *short_lived(void *a)
{
	return a;
}

/* makes and joins threads until g_stop */
static void *thread_maker(void *a)
{
	(void)a;
	while (!g_stop) {
		pthread_t t;

		if (pthread_create(&t, NULL, short_lived, NULL) == 0)
			pthread_join(t, NULL);
	}
	return NULL;
}

/*
 * Threads made and ending all the time (two makers) while this one frees
 * pinned memory 200 times: every change is reported before its free
 * returns, no hold times out, and gates of ended threads go (the kernel
 * log stays clean; with KFENCE on 6.12 a use after free would show).
 */
static int t_sync_thread_churn(void)
{
	enum { CHANGES = 200 };
	struct kreg_nf_sync_stats st;
	pthread_t mk[2];
	int rc;

	CHECK(sy_start(SY_SIGNO, 5000, true) == 0, "SYNC_START");
	g_stop = false;
	for (int i = 0; i < 2; i++)
		CHECK(pthread_create(&mk[i], NULL, thread_maker, NULL) == 0, "maker");
	rc = frees_reported(CHANGES);
	g_stop = true;
	for (int i = 0; i < 2; i++)
		pthread_join(mk[i], NULL);
	if (rc)
		return rc;
	CHECK(sy_stats(&st) == 0, "SYNC_STATS");
	printf("threads seen %llu, gates armed %llu, waits %llu, timeouts %llu\n",
	       (unsigned long long)st.threads, (unsigned long long)st.gates,
	       (unsigned long long)st.gate_waits,
	       (unsigned long long)st.gate_timeouts);
	CHECK(st.gate_timeouts == 0, "gate_timeouts %llu",
	      (unsigned long long)st.gate_timeouts);
	sy_stop_dispatcher();
	return 0;
}

/* ---- 4: close leaves nothing behind, sleepers included ------------------ */

static long module_refcnt(void)
{
	char buf[32] = "";
	FILE *f = fopen("/sys/module/kreg_notifier/refcnt", "r");
	long v = -1;

	if (f && fgets(buf, sizeof(buf), f))
		v = atol(buf);
	if (f)
		fclose(f);
	return v;
}

/*
 * A thread asleep in read() with its gate queued: the owner's close frees
 * the context at once and the module's references within a second, and
 * the sleeper's read() goes on and returns what is written later.
 */
static int t_sync_close_sleeper(void)
{
	long c0 = sysval("contexts"), m0 = module_refcnt(), c, m = -1;
	pthread_t s;
	void *ret;
	double t0;

	CHECK(pipe(g_sleep_pipe) == 0, "pipe");
	CHECK(pthread_create(&s, NULL, sleeper, NULL) == 0, "sleeper");
	usleep(100000);
	CHECK(sy_start(SY_SIGNO, 5000, false) == 0, "SYNC_START");
	CHECK(sysval("contexts") == c0 + 1, "contexts %ld, baseline %ld",
	      sysval("contexts"), c0);
	{
		/* a change: every thread's gate is queued */
		struct pinned b;
		int rc = pinned_new(&b, LEN);

		if (rc)
			return rc;
		CHECK(pinned_free(&b) == 0, "munmap");
	}
	close(g_sy.fd);
	t0 = now_ns();
	do {
		c = sysval("contexts");
		m = module_refcnt();
		if (c == c0 && m == m0)
			break;
		usleep(10000);
	} while (ms_since(t0) < 1000);
	CHECK(c == c0, "contexts %ld a second after close, baseline %ld", c, c0);
	CHECK(m == m0, "module references %ld a second after close, baseline %ld",
	      m, m0);
	CHECK(write(g_sleep_pipe[1], "x", 1) == 1, "write");
	pthread_join(s, &ret);
	CHECK((intptr_t)ret == 1, "the sleeper's read() returned %ld",
	      (long)(intptr_t)ret);
	return 0;
}

/* ---- 5: the reader --------------------------------------------------------- */

static void *reader_then_exit(void *a)
{
	(void)a;
	return (void *)(intptr_t)ioctl(g_sy.fd, KREG_NF_IOC_SYNC_DISPATCHER);
}

struct mapper {
	char *p;
	int tries;
	int reported_at_map;
	bool mapped;
};

static void *mapper_main(void *a)
{
	struct mapper *m = a;

	m->mapped = sy_map_freed(m->p, &m->tries) == m->p;
	m->reported_at_map = g_sy.reported;
	return NULL;
}

/*
 * A thread that was the reader exits; threads made afterwards (one may
 * reuse its task_struct) are held like any other: each must not map the
 * address another thread freed before that free is reported.
 */
static int t_sync_reader_exit(void)
{
	enum { ROUNDS = 20 };
	pthread_t r, u, mt;
	void *ret;
	int rc;

	CHECK(sy_start(SY_SIGNO, 10000, false) == 0, "SYNC_START");
	CHECK(pthread_create(&r, NULL, reader_then_exit, NULL) == 0, "reader");
	pthread_join(r, &ret);
	CHECK(ret == NULL, "SYNC_DISPATCHER");
	g_sy.delay_ms = 50;
	for (int i = 0; i < ROUNDS; i++) {
		struct mapper m = { 0 };
		char *p = sy_buffer(true, &rc);

		if (rc)
			return rc;
		g_sy.reported = 0;
		m.p = p;
		CHECK(pthread_create(&mt, NULL, mapper_main, &m) == 0, "mapper");
		CHECK(pthread_create(&u, NULL, sy_unmapper, p) == 0,
		      "unmapper");
		pthread_join(u, NULL);
		pthread_join(mt, NULL);
		CHECK(m.mapped, "round %d: the freed address could not be mapped again (%d tries): taken by another mapping?",
		      i, m.tries);
		CHECK(m.reported_at_map, "round %d: a thread made after the reader exited mapped the freed address before the report (%d tries)",
		      i, m.tries);
		munmap(p, LEN);
	}
	return 0;
}

static volatile double g_own_ms = -1;

static void *reader_frees(void *a)
{
	struct pinned *b = a;
	struct pollfd pfd = { .fd = g_sy.fd, .events = POLLIN };
	double t0;

	if (ioctl(g_sy.fd, KREG_NF_IOC_SYNC_DISPATCHER))
		return (void *)1;
	t0 = now_ns();
	if (pinned_free(b))
		return (void *)2;
	g_own_ms = ms_since(t0);
	/* back in its loop, it reports its own change */
	for (int i = 0; i < 100 && !g_sy.reported; i++)
		if (poll(&pfd, 1, 20) > 0)
			sy_drain();
	return NULL;
}

/*
 * The reader frees pinned memory itself: it is not held (nobody else
 * would report its change) and reports the change itself right after.
 */
static int t_sync_reader_own_change(void)
{
	struct kreg_nf_sync_stats st;
	struct pinned b;
	pthread_t r;
	void *ret;
	int rc;

	CHECK(sy_start(0, 5000, false) == 0, "SYNC_START");
	rc = pinned_new(&b, LEN);
	if (rc)
		return rc;
	g_sy.want_start = (uintptr_t)b.p;
	g_sy.want_end = (uintptr_t)b.p + LEN;
	CHECK(pthread_create(&r, NULL, reader_frees, &b) == 0, "reader");
	pthread_join(r, &ret);
	CHECK(ret == NULL, "reader failed: %ld", (long)(intptr_t)ret);
	printf("the reader's own free took %.1f ms\n", g_own_ms);
	CHECK(g_own_ms < 1000, "the reader was held %.0f ms by its own change",
	      g_own_ms);
	CHECK(g_sy.reported, "the reader's own change was never reported");
	CHECK(sy_stats(&st) == 0 && st.own_changes >= 1 && st.gate_timeouts == 0,
	      "own_changes %llu gate_timeouts %llu",
	      (unsigned long long)st.own_changes,
	      (unsigned long long)st.gate_timeouts);
	return 0;
}

/* ---- 6: another process's change of pages this process never pinned ---- */

static volatile double g_worst_ms;

static void *syscaller(void *a)
{
	(void)a;
	while (!g_stop) {
		double t0 = now_ns();

		syscall(SYS_getppid);
		g_worst_ms = fmax(g_worst_ms, ms_since(t0));
	}
	return NULL;
}

/* a child punches the whole of mfd out */
static int punch_from_child(int mfd, size_t len)
{
	int status;
	pid_t pid = fork();

	if (pid == 0)
		_exit(fallocate(mfd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
				0, len) ? 3 : 0);
	if (pid < 0 || waitpid(pid, &status, 0) != pid)
		return -1;
	return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

/*
 * Another process's change of pages this process pinned that stays in
 * flight longer than the reader's DRAINs wait for it (one gate timeout
 * each): they hand out nothing, and no thread of this process makes the
 * change, so none comes to a gate after its end to ask the reader again.
 * The module of 2ab8e35 asked nobody at that end: every thread held
 * meanwhile waited out its gate's timeout and went on unreported (CI
 * timed sync-inflight-not-timed-out's caller out so once, its changing
 * thread starved between its change's end and its own gate).
 */
enum { LE_TIMEOUT_MS = 30 };

static int t_sync_late_end_asks_reader(void)
{
	/*
	 * 1 GiB (io_uring's most for one buffer): 100-170 ms in flight
	 * under TCG, past the reader's two waits, and a report has the
	 * timeout's 30 ms after the end (TCG stalls a vCPU for a few ms)
	 */
	const size_t len = 1ul << 30;
	struct kreg_nf_sync_stats st;
	struct pinned b;
	pthread_t sc;
	int mfd, rc;
	char *p;

	CHECK(sy_start(0, LE_TIMEOUT_MS, true) == 0, "SYNC_START");
	mfd = memfd_of(len);
	CHECK(mfd >= 0 && (p = map_shared(mfd, len)), "memfd");
	rc = pinned_at(&b, p, len);
	if (rc)
		return rc;
	g_sy.want_start = (uintptr_t)p;
	g_sy.want_end = (uintptr_t)p + len;
	g_stop = false;
	g_worst_ms = 0;
	CHECK(pthread_create(&sc, NULL, syscaller, NULL) == 0, "pthread_create");
	usleep(20000);
	CHECK(punch_from_child(mfd, len) == 0, "hole punch by another process");
	for (int i = 0; i < 100 && !g_sy.reported; i++)
		usleep(10000);
	g_stop = true;
	pthread_join(sc, NULL);
	io_uring_queue_exit(&b.ring);
	sy_stop_dispatcher();
	CHECK(sy_stats(&st) == 0, "SYNC_STATS");
	printf("another process's punch of %zu MiB: the caller held %.0f ms at most; late %llu gate waits %llu timeouts %llu\n",
	       len >> 20, g_worst_ms, (unsigned long long)st.late,
	       (unsigned long long)st.gate_waits,
	       (unsigned long long)st.gate_timeouts);
	CHECK(st.late >= 1 && g_sy.reported,
	      "the punch was not reported (late %llu)",
	      (unsigned long long)st.late);
	if (!st.gate_timeouts && g_worst_ms < 3 * LE_TIMEOUT_MS)
		return skip("the punch's change ended within the reader's first waits (%.0f ms)",
			    g_worst_ms);
	CHECK(st.gate_timeouts == 0,
	      "%llu gates timed out after the change ended unreported",
	      (unsigned long long)st.gate_timeouts);
	return 0;
}

/*
 * SIGKILL of a process whose threads are held behind another process's
 * change still in flight (a punch of 1 GiB it pinned): the gate's timeout
 * does not run while the change is in flight, so only the wait's being
 * killable ends it; the process dies within the punch's own time, and the
 * punch's end, after the process and its descriptor are gone, finds
 * nothing of it (dmesg-clean and KFENCE after it).
 */
static void *beater(void *a)
{
	volatile uint64_t *beat = a;

	for (;;) {
		syscall(SYS_getppid);
		beat[0] = (uint64_t)now_ns();
	}
	return NULL;
}

static int t_sync_sigkill_behind_inflight(void)
{
	const size_t len = 1ul << 30;
	long c0 = sysval("contexts"), r0 = sysval("ranges"), c, r;
	volatile uint64_t *beat;
	double kill_ms, gap_ms = 0;
	bool in_flight;
	pid_t child, puncher;
	int mfd, status, pst, i;

	beat = mmap(NULL, 4096, PROT_READ | PROT_WRITE,
		    MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	CHECK(beat != MAP_FAILED, "mmap");
	mfd = memfd_of(len);
	CHECK(mfd >= 0, "memfd");
	child = fork();
	CHECK(child >= 0, "fork");
	if (child == 0) {
		struct pinned b;
		pthread_t sc;
		char *p;
		int rc;

		if (sy_start(0, 5000, true))
			_exit(2);
		p = map_shared(mfd, len);
		if (!p)
			_exit(3);
		rc = pinned_at(&b, p, len);
		if (rc)
			_exit(rc);
		if (pthread_create(&sc, NULL, beater, (void *)beat))
			_exit(4);
		beat[1] = 1;
		for (;;)
			usleep(1000);
	}
	for (i = 0; i < 60000 && !beat[1]; i++) {
		if (waitpid(child, &status, WNOHANG) == child) {
			if (WIFEXITED(status) && WEXITSTATUS(status) == 77)
				return skip("no pinned memory in the child");
			CHECK(0, "the child ended before its pin: %#x", status);
		}
		usleep(1000);
	}
	CHECK(beat[1], "the child never pinned its memfd");
	usleep(20000);
	puncher = fork();
	CHECK(puncher >= 0, "fork");
	if (puncher == 0)
		_exit(fallocate(mfd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
				0, len) ? 3 : 0);
	/* held: the beat, every few us otherwise, stops for 20 ms */
	for (i = 0; i < 5000 && gap_ms < 20; i++) {
		usleep(1000);
		gap_ms = (now_ns() - (double)beat[0]) / 1e6;
	}
	in_flight = waitpid(puncher, &pst, WNOHANG) == 0;
	kill_ms = now_ns();
	kill(child, SIGKILL);
	CHECK(waitpid(child, &status, 0) == child, "waitpid");
	kill_ms = ms_since(kill_ms);
	if (in_flight)
		CHECK(waitpid(puncher, &pst, 0) == puncher, "waitpid");
	printf("killed after the beat stopped for %.0f ms, with the punch %s: dead in %.0f ms\n",
	       gap_ms, in_flight ? "in flight" : "over", kill_ms);
	CHECK(WIFEXITED(pst) && !WEXITSTATUS(pst), "the punch: %#x", pst);
	CHECK(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL,
	      "child %#x", status);
	CHECK(live_back_to(c0, r0, &c, &r),
	      "after the kill: contexts %ld ranges %ld, baseline %ld %ld", c,
	      r, c0, r0);
	close(mfd);
	munmap((void *)beat, 4096);
	if (gap_ms < 20 || !in_flight)
		return skip("%s: nothing held behind a change in flight to kill",
			    gap_ms < 20 ? "the beat never stopped" :
					  "the punch ended first");
	CHECK(kill_ms < 2000, "the kill took %.0f ms: a held wait not killable?",
	      kill_ms);
	return 0;
}

/*
 * This process has pinned memory (pinned_vm > 0) and maps a shared memfd
 * it never pinned; another process punches a hole in that memfd: nothing
 * is queued and no thread of this process is held. Then the control: the
 * same with the memfd's pages pinned is queued and reported.
 */
static int sy_other_process_unpinned(uint32_t flags)
{
	struct kreg_nf_sync_stats st;
	struct pinned other;
	pthread_t sc;
	int mfd, rc;
	char *p;

	/* with flags, the dispatcher reports the handler's own changes */
	g_sy_start_flags = flags;
	CHECK(sy_start(SY_SIGNO, 2000, flags != 0) == 0, "SYNC_START");
	rc = pinned_new(&other, LEN);
	if (rc)
		return rc;
	mfd = memfd_of(LEN);
	CHECK(mfd >= 0 && (p = map_shared(mfd, LEN)), "memfd");
	g_stop = false;
	g_worst_ms = 0;
	CHECK(pthread_create(&sc, NULL, syscaller, NULL) == 0, "pthread_create");
	usleep(50000);
	CHECK(punch_from_child(mfd, LEN) == 0, "hole punch by another process");
	usleep(50000);
	g_stop = true;
	pthread_join(sc, NULL);
	CHECK(sy_stats(&st) == 0, "SYNC_STATS");
	printf("unpinned: queued %llu late %llu, worst getppid() %.1f ms\n",
	       (unsigned long long)st.queued, (unsigned long long)st.late,
	       g_worst_ms);
	/*
	 * With KREG_NF_SYNC_UNPINNED the process's own changes are queued
	 * (after the fork, a write to a private page copies it): none of them
	 * is the memfd's, and nothing is late.
	 */
	CHECK((flags || st.queued == 0) && st.late == 0,
	      "pages never pinned: queued %llu late %llu",
	      (unsigned long long)st.queued, (unsigned long long)st.late);
	CHECK(g_worst_ms < 500, "a thread was held %.0f ms", g_worst_ms);
	g_sy.want_start = (uintptr_t)p;
	g_sy.want_end = (uintptr_t)p + LEN;
	CHECK(sy_drain() == 0 && !g_sy.reported,
	      "another process's punch of pages never pinned was queued");

	/* the control: the memfd's pages pinned, the reader reports */
	sy_stop_dispatcher();
	close(g_sy.fd);
	CHECK(sy_start(SY_SIGNO, 2000, true) == 0, "SYNC_START again");
	memset(p, 1, LEN);
	{
		struct iovec iov = { .iov_base = p, .iov_len = LEN };
		struct io_uring ring;

		CHECK(io_uring_queue_init(2, &ring, 0) == 0, "ring");
		if (io_uring_register_buffers(&ring, &iov, 1))
			return skip("io_uring cannot pin shared memory here");
		g_sy.want_start = (uintptr_t)p;
		g_sy.want_end = (uintptr_t)p + LEN;
		CHECK(punch_from_child(mfd, LEN) == 0, "hole punch");
		for (int i = 0; i < 100 && !g_sy.reported; i++)
			usleep(10000);
		CHECK(g_sy.reported, "a pinned page punched by another process was not reported");
		CHECK(sy_stats(&st) == 0 && st.late >= 1, "late %llu",
		      (unsigned long long)st.late);
		io_uring_queue_exit(&ring);
	}
	sy_stop_dispatcher();
	return 0;
}

static int t_sync_other_process_unpinned(void)
{
	return sy_other_process_unpinned(0);
}

/* the same where the process's own changes of pages not pinned are wanted */
static int t_sync_unpinned_other_process(void)
{
	return sy_other_process_unpinned(KREG_NF_SYNC_UNPINNED);
}

/* ---- 7: exec with the descriptor inherited --------------------------------- */

/*
 * A process whose descriptor is inherited across exec (no O_CLOEXEC) execs
 * while another thread's change of pinned memory is unreported: the new
 * image starts at once after execve, not after the gate timeout (10 s).
 * (The old image's thread may rightly be held at a tick before it gets to
 * execve; the time is taken from the call.)
 */
static int t_sync_exec_inherited(void)
{
	double t0 = now_ns();
	int status;
	pid_t pid;

	pid = fork();
	CHECK(pid >= 0, "fork");
	if (pid == 0) {
		pthread_t u;
		char *p;
		int rc;

		if (sy_start(SY_SIGNO, 10000, false))
			_exit(2);
		fcntl(g_sy.fd, F_SETFD, 0);	/* inherited by the new image */
		p = sy_buffer(true, &rc);
		if (rc)
			_exit(rc);
		g_sy.delay_ms = 3000;		/* the change stays unreported */
		pthread_create(&u, NULL, sy_unmapper, p);
		/*
		 * No system call until execve (a return to user space now
		 * would rightly be held): spin until the handler runs.
		 */
		while (!g_sy.handler_runs)
			;
		/* the new image says how long after this it ran */
		char t0s[32];

		snprintf(t0s, sizeof(t0s), "%.0f", now_ns());
		execl("/proc/self/exe", "kreg_nf_test", "--exec-probe", t0s,
		      NULL);
		_exit(3);
	}
	CHECK(waitpid(pid, &status, 0) == pid, "waitpid");
	if (WIFEXITED(status) && WEXITSTATUS(status) == 77)
		return skip("no pinned memory in the child");
	printf("fork to the new image's exit: %.0f ms\n", ms_since(t0));
	CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0,
	      "child %#x (exit 3: the new image ran 2 s or more after execve, held by a gate of the old one)",
	      status);
	return 0;
}

const struct nf_test nf_tests_sync_threads[] = {
	{ "sync-signal-dispositions", t_sync_signal_dispositions, NULL, NULL },
	{ "sync-signal-dispositions-signal", t_sync_signal_dispositions_signal, NULL, NULL },
	{ "sync-concurrent-frees", t_sync_concurrent_frees, NULL, NULL },
	{ "sync-concurrent-frees-reader", t_sync_concurrent_frees_reader, NULL, NULL },
	{ "sync-reporter-not-held", t_sync_reporter_not_held, NULL, NULL },
	{ "sync-irq-lock-holder", t_sync_irq_lock_holder, NULL, NULL },
	{ "sync-irq-lock-holder-dontneed", t_sync_irq_lock_holder_dontneed,
	  NULL, NULL },
	{ "sync-irq-release-next-call-held", t_sync_irq_release_next_call_held,
	  NULL, NULL },
	{ "sync-irq-debt-killed", t_sync_irq_debt_killed, NULL, NULL },
	{ "sync-irq-next-call-inside-lock", t_sync_irq_next_call_inside_lock,
	  NULL, NULL },
	{ "sync-call-inside-lock", t_sync_call_inside_lock, NULL, NULL },
	{ "sync-call-freed-address-held", t_sync_call_freed_address_held,
	  NULL, NULL },
	{ "sync-mmap-placed-off-freed", t_sync_mmap_placed_off_freed, NULL,
	  NULL },
	{ "sync-mmap-placed-huge-aligned", t_sync_mmap_placed_huge_aligned,
	  NULL, NULL },
	{ "sync-inflight-not-timed-out", t_sync_inflight_not_timed_out, NULL,
	  NULL },
	{ "sync-born-held", t_sync_born_held, NULL, NULL },
	{ "sync-sleepers-not-walked", t_sync_sleepers_not_walked, NULL, NULL },
	{ "sync-born-not-walked", t_sync_born_not_walked, NULL, NULL },
	{ "sync-spinner-not-kicked", t_sync_spinner_not_kicked, NULL, NULL },
	{ "sync-spinner-parked", t_sync_spinner_parked, NULL, NULL },
	{ "sync-parked-syscall-held", t_sync_parked_syscall_held, NULL, NULL },
	{ "sync-parked-sleeper-held", t_sync_parked_sleeper_held, NULL, NULL },
	{ "sync-spinner-mmap-freed-held", t_sync_spinner_mmap_freed_held,
	  NULL, NULL },
	{ "sync-spinner-mmap-elsewhere", t_sync_spinner_mmap_elsewhere,
	  NULL, NULL },
	{ "sync-spinner-munmap-split", t_sync_spinner_munmap_split, NULL, NULL },
	{ "sync-spinner-brk-elsewhere", t_sync_spinner_brk_elsewhere, NULL,
	  NULL },
	{ "sync-spinner-brk-freed-held", t_sync_spinner_brk_freed_held, NULL,
	  NULL },
	{ "sync-spinner-io-setup-held", t_sync_spinner_io_setup_held, NULL,
	  NULL },
	{ "sync-spinner-new-map-held", t_sync_spinner_new_map_held, NULL, NULL },
	{ "sync-spinner-touch-held", t_sync_spinner_touch_held, NULL, NULL },
	{ "sync-spinner-touch-dontunmap-held",
	  t_sync_spinner_touch_dontunmap_held, NULL, NULL },
	{ "sync-spinner-touch-map-fixed-held",
	  t_sync_spinner_touch_map_fixed_held, NULL, NULL },
	{ "sync-spinner-touch-remap-onto-held",
	  t_sync_spinner_touch_remap_onto_held, NULL, NULL },
	{ "sync-spinner-touch-growsdown-held",
	  t_sync_spinner_touch_growsdown_held, NULL, NULL },
	{ "sync-thread-churn", t_sync_thread_churn, NULL, NULL },
	{ "sync-close-sleeper", t_sync_close_sleeper, NULL, NULL },
	{ "sync-reader-exit", t_sync_reader_exit, NULL, NULL },
	{ "sync-reader-own-change", t_sync_reader_own_change, NULL, NULL },
	{ "sync-other-process-unpinned", t_sync_other_process_unpinned, NULL, NULL },
	{ "sync-unpinned-other-process", t_sync_unpinned_other_process, NULL, NULL },
	{ "sync-late-end-asks-reader", t_sync_late_end_asks_reader, NULL, NULL },
	{ "sync-sigkill-behind-inflight", t_sync_sigkill_behind_inflight, NULL,
	  NULL },
	{ "sync-exec-inherited", t_sync_exec_inherited, NULL, NULL },
};
const size_t nf_n_sync_threads = sizeof(nf_tests_sync_threads) / sizeof(nf_tests_sync_threads[0]);
