/*
 * Cost figures: kreg_nf_test --bench and --bench-sync.
 */
#include "nf_test.h"


int bench(void)
{
	enum { RUNS = 7, N = 512, LOADS = 1000000 };
	double sys[RUNS], reg[RUNS], unreg[RUNS], load[RUNS], mm[RUNS];
	struct nf nf;
	uint32_t slots[N] = { 0 };
	char *p = anon(LEN);
	/* distinct ranges: max_overlap caps ranges over one page */
	char *res = mmap(NULL, (size_t)N * LEN, PROT_NONE,
			 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	uint64_t snap = 0;
	double t0;

	if (!p || res == MAP_FAILED || nf_open(&nf))
		return perror("open " KREG_NF_DEVICE), 1;
	if (nf_reg(nf.fd, (uintptr_t)p, LEN, 0, &slots[0], &snap))
		return perror("REGISTER"), 1;
	for (int run = 0; run < RUNS; run++) {
		unsigned long hits = 0;

		t0 = now_ns();
		for (int i = 0; i < N; i++)
			syscall(SYS_getppid);
		sys[run] = (now_ns() - t0) / N;

		t0 = now_ns();
		for (int i = 0; i < LOADS; i++)
			hits += nf.ctr[slots[0]] == snap;
		load[run] = (now_ns() - t0) / LOADS;
		if (hits != LOADS)
			return fprintf(stderr, "counter moved\n"), 1;

		t0 = now_ns();
		for (int i = 1; i < N; i++)
			if (nf_reg(nf.fd, (uintptr_t)res + (size_t)i * LEN, LEN,
				   0, &slots[i], NULL))
				return perror("REGISTER"), 1;
		reg[run] = (now_ns() - t0) / (N - 1);
		t0 = now_ns();
		for (int i = 1; i < N; i++)
			if (nf_unreg(nf.fd, slots[i]))
				return perror("UNREGISTER"), 1;
		unreg[run] = (now_ns() - t0) / (N - 1);

		t0 = now_ns();
		for (int i = 0; i < N / 8; i++) {
			char *q = mmap(NULL, LEN, PROT_READ | PROT_WRITE,
				       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

			q[0] = 1;
			munmap(q, LEN);
		}
		mm[run] = (now_ns() - t0) / (N / 8);
	}
	double s = median(sys, RUNS), l = median(load, RUNS),
	       r = median(reg, RUNS), u = median(unreg, RUNS),
	       m = median(mm, RUNS);
	printf("cost (median of %d runs; ratios to a bare getppid(), timings under TCG are only comparable side by side):\n",
	       RUNS);
	printf("  getppid()                      %9.1f ns   1\n", s);
	printf("  counter load + compare         %9.1f ns   %.4f\n", l, l / s);
	printf("  REGISTER (64 KiB)              %9.1f ns   %.2f\n", r, r / s);
	printf("  UNREGISTER                     %9.1f ns   %.2f\n", u, u / s);
	printf("  mmap + touch + munmap 64 KiB   %9.1f ns   %.2f\n", m, m / s);
	return 0;
}

/*
 * --bench-sync: what synchronous delivery costs, in one process, each
 * figure alternating with its baseline (medians of RUNS batches):
 *  - a signal to oneself whose handler makes two system calls: the
 *    handler's frame and two DRAINs, without the module (also on the host);
 *  - munmap of a touched 1 MiB that was never pinned, while another buffer
 *    is (pinned_vm > 0): the callback's page-table walk (P1);
 *  - munmap of a pinned 1 MiB (an io_uring fixed buffer, pinned again each
 *    time): the signal, the handler's DRAINs and the report (P3).
 */
static volatile int g_bench_sig;
/* the draining handler's times: entered, after one getppid(), left */
static volatile double g_bench_enter, g_bench_first, g_bench_exit;

static void bench_drain_handler(int sig)
{
	int e = errno;

	(void)sig;
	g_bench_enter = now_ns();
	syscall(SYS_getppid);
	g_bench_first = now_ns();
	sy_drain();
	g_bench_exit = now_ns();
	errno = e;
}

static void bench_handler(int sig)
{
	(void)sig;
	syscall(SYS_getppid);
	syscall(SYS_getppid);
	g_bench_sig++;
}

/* ns of one munmap of a fresh, touched 1 MiB (pinned through ring if set;
 * with emulate, raise(SY_SIGNO) after it, whose handler makes two system
 * calls: what the module adds, on a machine without it); parts[4] += the
 * kernel's part before the handler, the handler's first getppid(), its
 * DRAINs, sigreturn and after */
static double bench_munmap_as(struct io_uring *ring, double *parts, bool emulate)
{
	const size_t len = 1 << 20;
	char *p = mmap(NULL, len, PROT_READ | PROT_WRITE,
		       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	struct iovec iov = { .iov_base = p, .iov_len = len };
	double t0, t;

	if (p == MAP_FAILED)
		return -1;
	memset(p, 1, len);
	if (ring && io_uring_register_buffers(ring, &iov, 1))
		return -1;
	g_bench_enter = 0;
	t0 = now_ns();
	munmap(p, len);
	if (emulate)
		raise(SY_SIGNO);
	t = now_ns() - t0;
	if (parts && g_bench_enter) {
		parts[0] += g_bench_enter - t0;
		parts[1] += g_bench_first - g_bench_enter;
		parts[2] += g_bench_exit - g_bench_first;
		parts[3] += t0 + t - g_bench_exit;
	}
	if (ring)
		io_uring_unregister_buffers(ring);
	return t;
}

static double bench_munmap(struct io_uring *ring, double *parts)
{
	return bench_munmap_as(ring, parts, false);
}

int bench_sync(void)
{
	enum { RUNS = 9, N = 64 };
	double sig[RUNS], sys[RUNS], un_off[RUNS], un_on[RUNS], pin_off[RUNS],
	       pin_on[RUNS], parts[4] = { 0 };
	struct io_uring ring, other;
	struct sigaction sa = { .sa_handler = bench_handler };
	bool dev = access(KREG_NF_DEVICE, F_OK) == 0;
	char *keep = anon(LEN);
	struct iovec iov = { .iov_base = keep, .iov_len = LEN };

	sigemptyset(&sa.sa_mask);
	sa.sa_flags = SA_RESTART;
	if (sigaction(SY_SIGNO, &sa, NULL))
		return perror("sigaction"), 1;
	for (int run = 0; run < RUNS; run++) {
		double t0 = now_ns();

		for (int i = 0; i < N; i++)
			syscall(SYS_getppid);
		sys[run] = (now_ns() - t0) / N;
		t0 = now_ns();
		for (int i = 0; i < N; i++)
			raise(SY_SIGNO);
		sig[run] = (now_ns() - t0) / N;
	}
	printf("synchronous delivery's parts (median of %d batches of %d):\n", RUNS, N);
	printf("  getppid()                               %9.1f ns\n", median(sys, RUNS));
	printf("  raise() + handler with 2 system calls   %9.1f ns   %.1f getppid()\n",
	       median(sig, RUNS), median(sig, RUNS) / median(sys, RUNS));
	/* a second buffer keeps pinned_vm above 0, so the module's callback
	 * walks unpinned ranges */
	if (io_uring_queue_init(8, &ring, 0) || io_uring_queue_init(8, &other, 0) ||
	    !keep || io_uring_register_buffers(&other, &iov, 1))
		return fprintf(stderr, "io_uring\n"), 1;
	/*
	 * P3's user-space part anywhere: munmap of a pinned 1 MiB, then a signal
	 * to oneself whose handler makes two system calls (as the module's
	 * handler makes two DRAINs) against the munmap alone; what the module
	 * adds beyond it (its callback's walk and queue) is not in it
	 */
	for (int run = 0; run < RUNS; run++) {
		double a = 0, b = 0;

		for (int i = 0; i < N / 8; i++) {
			a += bench_munmap_as(&ring, NULL, false);
			b += bench_munmap_as(&ring, NULL, true);
		}
		pin_off[run] = a / (N / 8);
		pin_on[run] = b / (N / 8);
	}
	printf("  munmap 1 MiB pinned, then raise() + handler with 2 system calls (no module):\n"
	       "                             off %9.1f ns, on %9.1f ns   on/off %.2f (+%.1f us)\n",
	       median(pin_off, RUNS), median(pin_on, RUNS),
	       median(pin_on, RUNS) / median(pin_off, RUNS),
	       (median(pin_on, RUNS) - median(pin_off, RUNS)) / 1e3);
	if (!dev) {
		printf("  (no %s: the module's figures need the guest)\n", KREG_NF_DEVICE);
		return 0;
	}
	/* the handler drains as libucm_kernel's does */
	memset(&g_sy, 0, sizeof(g_sy));
	g_sy.fd = open(KREG_NF_DEVICE, O_RDWR | O_CLOEXEC);
	sa.sa_handler = bench_drain_handler;
	g_sy_handler = bench_drain_handler;
	if (g_sy.fd < 0 || sigaction(SY_SIGNO, &sa, NULL))
		return perror("open"), 1;
	if (sy_start_ioctl(SY_SIGNO, 10000))
		return perror("SYNC_START"), 1;
	for (int run = 0; run < RUNS; run++) {
		struct kreg_nf_range r[8];
		struct kreg_nf_sync_drain dr = { .buf = (uintptr_t)r, .max = 8 };
		double t0 = now_ns();

		for (int i = 0; i < N; i++)
			ioctl(g_sy.fd, KREG_NF_IOC_SYNC_DRAIN, &dr);
		un_on[run] = (now_ns() - t0) / N;
	}
	ioctl(g_sy.fd, KREG_NF_IOC_SYNC_STOP);
	printf("  DRAIN of an empty queue                 %9.1f ns   %.1f getppid()\n",
	       median(un_on, RUNS), median(un_on, RUNS) / median(sys, RUNS));
	for (int run = 0; run < RUNS; run++) {
		double a = 0, b = 0, c = 0, d = 0;

		for (int i = 0; i < N / 8; i++) {
			a += bench_munmap(NULL, NULL);
			c += bench_munmap(&ring, NULL);
		}
		if (sy_start_ioctl(SY_SIGNO, 10000))
			return perror("SYNC_START"), 1;
		for (int i = 0; i < N / 8; i++) {
			b += bench_munmap(NULL, NULL);
			d += bench_munmap(&ring, parts);
		}
		ioctl(g_sy.fd, KREG_NF_IOC_SYNC_STOP);
		un_off[run] = a / (N / 8);
		un_on[run] = b / (N / 8);
		pin_off[run] = c / (N / 8);
		pin_on[run] = d / (N / 8);
	}
	printf("  munmap 1 MiB never pinned: off %9.1f ns, on %9.1f ns   on/off %.2f\n",
	       median(un_off, RUNS), median(un_on, RUNS),
	       median(un_on, RUNS) / median(un_off, RUNS));
	printf("  munmap 1 MiB pinned:       off %9.1f ns, on %9.1f ns   on/off %.2f (+%.1f us)\n",
	       median(pin_off, RUNS), median(pin_on, RUNS),
	       median(pin_on, RUNS) / median(pin_off, RUNS),
	       (median(pin_on, RUNS) - median(pin_off, RUNS)) / 1e3);
	printf("    its parts (means): the call until the handler %.1f us, the handler's first getppid() %.1f us, its DRAINs %.1f us, sigreturn and back %.1f us\n",
	       parts[0] / (RUNS * (N / 8)) / 1e3, parts[1] / (RUNS * (N / 8)) / 1e3,
	       parts[2] / (RUNS * (N / 8)) / 1e3, parts[3] / (RUNS * (N / 8)) / 1e3);
	return 0;
}

