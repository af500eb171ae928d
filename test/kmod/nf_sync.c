/*
 * What the tests of synchronous delivery share: a descriptor with it on, a
 * handler and a dispatcher that drain as libucm_kernel does, pinned memory.
 */
#include "nf_test.h"

/* ---- synchronous delivery (KREG_NF_IOC_SYNC_*) ---------------------------
 * Pages are pinned the way a NIC's registration pins them: io_uring fixed
 * buffers (pin_user_pages with FOLL_LONGTERM, as ib_umem_get). The
 * handler and the dispatcher thread drain like libucm_kernel does: DRAIN,
 * report (here: note whether the watched range was among them), DRAIN
 * again with the ack. "reported" is set before the ack, so a thread the
 * module let go before it saw the report is a failure of the module. */


struct sy_state g_sy;

void sy_note(const struct kreg_nf_range *r, uint32_t n)
{
	for (uint32_t i = 0; i < n; i++) {
		if (r[i].start < g_sy.want_end && g_sy.want_start < r[i].end)
			g_sy.reported = 1;
		if (r[i].start < g_sy.want2_end && g_sy.want2_start < r[i].end)
			g_sy.reported2 = 1;
	}
}

/* 0, or -errno of the first DRAIN that failed */
int sy_drain(void)
{
	struct kreg_nf_range r[8];
	uint64_t ack = 0;

	for (;;) {
		struct kreg_nf_sync_drain d = {
			.ack = ack, .buf = (uintptr_t)r, .max = 8 };

		if (ioctl(g_sy.fd, KREG_NF_IOC_SYNC_DRAIN, &d))
			return errno == EINTR ? 0 : -errno;
		if (!d.count)
			return 0;
		sy_note(r, d.count);
		if (g_sy.reporting)
			g_sy.reporting();
		ack = d.seq;
	}
}

void sy_handler(int sig)
{
	int e = errno;

	(void)sig;
	g_sy.handler_runs++;
	if (g_sy.delay_ms)
		usleep(g_sy.delay_ms * 1000);
	if (g_sy.exit_in_handler)
		_exit(0);	/* exit_group: every other thread is held */
	if (g_sy.close_in_handler) {
		close(g_sy.fd);
		errno = e;
		return;
	}
	if (g_sy.inner) {
		char *q = g_sy.inner;

		g_sy.inner = NULL;
		munmap(q, LEN);	/* a change made inside a dispatch */
	}
	sy_drain();
	errno = e;
}

void *sy_dispatcher(void *a)
{
	struct pollfd pfd = { .fd = g_sy.fd, .events = POLLIN };

	(void)a;
	if (ioctl(g_sy.fd, KREG_NF_IOC_SYNC_DISPATCHER))
		return (void *)1;
	while (!g_sy.disp_stop)
		if (poll(&pfd, 1, 20) > 0 && (pfd.revents & POLLIN)) {
			usleep(g_sy.disp_delay_ms * 1000);
			sy_drain();
		}
	return NULL;
}

/* the handler SYNC_START names (the bench's own drains and times) */
void (*g_sy_handler)(int sig) = sy_handler;

/* SYNC_START's flags (each test runs in a process of its own) */
uint32_t g_sy_start_flags;

int sy_start_ioctl(uint32_t signo, uint32_t timeout_ms)
{
	struct kreg_nf_sync_start st = { .signo = signo,
					 .gate_timeout_ms = timeout_ms,
					 .flags = g_sy_start_flags,
					 .handler = signo ? (uintptr_t)g_sy_handler : 0 };

	return ioctl(g_sy.fd, KREG_NF_IOC_SYNC_START, &st) ? -errno : 0;
}

/* A descriptor with synchronous delivery on SY_SIGNO (signo 0: none), and
 * the dispatcher thread if asked for. */
int sy_start(int signo, uint32_t timeout_ms, bool dispatcher)
{
	struct sigaction sa = { .sa_handler = sy_handler };

	memset(&g_sy, 0, sizeof(g_sy));
	g_sy.fd = open(KREG_NF_DEVICE, O_RDWR | O_CLOEXEC);
	if (g_sy.fd < 0)
		return -errno;
	sigemptyset(&sa.sa_mask);
	sa.sa_flags = SA_RESTART;
	if (signo && sigaction(signo, &sa, NULL))
		return -errno;
	if (sy_start_ioctl(signo, timeout_ms))
		return -errno;
	if (dispatcher) {
		if (pthread_create(&g_sy.disp, NULL, sy_dispatcher, NULL))
			return -EAGAIN;
		g_sy.disp_running = true;
		usleep(20000);	/* it has called SYNC_DISPATCHER */
	}
	return 0;
}

void sy_stop_dispatcher(void)
{
	if (g_sy.disp_running) {
		g_sy.disp_stop = true;
		pthread_join(g_sy.disp, NULL);
		g_sy.disp_running = false;
	}
}

int sy_stats(struct kreg_nf_sync_stats *st)
{
	memset(st, 0, sizeof(*st));
	return ioctl(g_sy.fd, KREG_NF_IOC_SYNC_STATS, st) ? -errno : 0;
}

/*
 * Every sigaction() on signo of the process fails while delivery runs
 * (0 or a failure): to replace its handler, to reset it, to ignore it,
 * even to read it.
 */
int sy_signal_held(void)
{
	struct sigaction acts[] = { { .sa_handler = SIG_DFL },
				    { .sa_handler = SIG_IGN },
				    { .sa_handler = sy_handler } };
	struct sigaction old;

	for (size_t i = 0; i < sizeof(acts) / sizeof(acts[0]); i++) {
		sigemptyset(&acts[i].sa_mask);
		CHECK(sigaction(SY_SIGNO, &acts[i], NULL) && errno == EINVAL,
		      "sigaction %zu on the held signal", i);
	}
	CHECK(sigaction(SY_SIGNO, NULL, &old) && errno == EINVAL,
	      "reading the held signal's action");
	return 0;
}

/* signo's action can be changed again (0 or a failure) */
int sy_signal_free(void)
{
	struct sigaction dfl = { .sa_handler = SIG_DFL }, ours = {
		.sa_handler = sy_handler, .sa_flags = SA_RESTART };

	sigemptyset(&dfl.sa_mask);
	sigemptyset(&ours.sa_mask);
	CHECK(sigaction(SY_SIGNO, &dfl, NULL) == 0, "sigaction after the hold");
	CHECK(sigaction(SY_SIGNO, &ours, NULL) == 0, "sigaction after the hold");
	return 0;
}

struct io_uring g_ring;	/* the first pin's: io_uring madvise uses it */
bool g_ring_up;

/* Pins [p, p + len) as a NIC registration would (one ring a buffer: a ring
 * takes one REGISTER_BUFFERS); 77 with the reason. */
int pin(char *p, size_t len)
{
	struct iovec iov = { .iov_base = p, .iov_len = len };
	struct io_uring *ring = g_ring_up ? malloc(sizeof(*ring)) : &g_ring;
	int r;

	if (!ring)
		return 1;
	r = io_uring_queue_init(8, ring, 0);
	if (r)
		return skip("io_uring_queue_init: %s", strerror(-r));
	g_ring_up = true;
	r = io_uring_register_buffers(ring, &iov, 1);
	if (r)
		return skip("io_uring_register_buffers (the pin): %s",
			    strerror(-r));
	return 0;
}

/* A populated buffer, pinned, that the test waits to see reported. */
char *sy_buffer(bool pinned, int *rc)
{
	char *p = anon(LEN);

	*rc = p ? 0 : 1;
	if (p && pinned)
		*rc = pin(p, LEN);
	g_sy.want_start = (uintptr_t)p;
	g_sy.want_end = (uintptr_t)p + LEN;
	g_sy.unmapped = false;
	return p;
}

/* sy_start, then a pinned buffer in *p; 0, 77 or a failure */
int sy_setup(int signo, uint32_t timeout_ms, bool dispatcher, char **p)
{
	int rc;

	CHECK(sy_start(signo, timeout_ms, dispatcher) == 0, "SYNC_START");
	*p = sy_buffer(true, &rc);
	return rc;
}

void *sy_unmapper(void *p)
{
	intptr_t r = munmap(p, LEN);

	g_sy.unmapped = true;
	return (void *)r;
}

/*
 * Maps LEN bytes at p again (MAP_FIXED_NOREPLACE) once sy_unmapper has
 * freed them; p, or MAP_FAILED when a try fails after the unmapper was
 * done: another mapping took the hole, and this never succeeds (it spun
 * until the runner's alarm). *tries: the failed tries.
 */
char *sy_map_freed(char *p, int *tries)
{
	bool was_done = false;
	char *q;

	for (;;) {
		q = mmap(p, LEN, PROT_READ | PROT_WRITE,
			 MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
		if (q == p)
			return q;
		if (q != MAP_FAILED) {
			munmap(q, LEN);	/* a kernel that ignores the flag */
			return MAP_FAILED;
		}
		if (errno != EEXIST || was_done)
			return MAP_FAILED;
		was_done = g_sy.unmapped;
		(*tries)++;
	}
}
