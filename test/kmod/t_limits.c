/*
 * Limits and leaks: per-descriptor and global limits, what close, exit,
 * fork and a kill midway leave behind, many threads at once.
 */
#include "nf_test.h"


static int t_enospc_per_descriptor(void)
{
	long c0 = sysval("contexts"), r0 = sysval("ranges"), c, r;
	struct nf nf;
	uint32_t slot = 0, n, last = 0;
	char *p = anon(LEN), *res;
	int e;

	CHECK(p, "mmap");
	CHECK(nf_open(&nf) == 0, "open");
	n = nf.info.max_ranges;
	/* a page each: max_overlap caps ranges over one page */
	res = mmap(NULL, (size_t)n * pg, PROT_NONE,
		   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	CHECK(res != MAP_FAILED, "reserve %u pages", n);
	for (uint32_t i = 0; i < n; i++) {
		e = nf_reg(nf.fd, (uintptr_t)res + (size_t)i * pg, pg, 0, &slot,
			   NULL);
		CHECK(e == 0, "REGISTER %u of %u: %d", i, n, e);
		last = slot;
	}
	CHECK(nf_reg(nf.fd, (uintptr_t)p, pg, 0, NULL, NULL) == -ENOSPC,
	      "REGISTER past max_ranges (%u)", n);
	CHECK(sysval("ranges") == r0 + n, "live ranges %ld, expected %ld",
	      sysval("ranges"), r0 + n);
	for (uint32_t i = 0; i < n; i++)
		CHECK(nf.ctr[i] != 0, "slot %u never bumped", i);
	CHECK(nf_unreg(nf.fd, last) == 0, "UNREGISTER");
	CHECK(nf_reg(nf.fd, (uintptr_t)p, pg, 0, &slot, NULL) == 0,
	      "REGISTER after freeing a slot");
	CHECK(slot == last, "slot %u, the free one is %u", slot, last);
	CHECK(munmap(res, (size_t)n * pg) == 0, "munmap"); /* n callbacks */
	nf_close(&nf);
	CHECK(live_back_to(c0, r0, &c, &r),
	      "after close: contexts %ld ranges %ld, baseline %ld %ld", c, r,
	      c0, r0);
	return 0;
}

static int t_enospc_global(void)
{
	long r0 = sysval("ranges");
	struct nf a, b;
	char val[32];
	char *p = anon(LEN);

	if (!am_root())
		return skip("needs root to lower max_total_ranges");
	CHECK(p, "mmap");
	CHECK(nf_open(&a) == 0 && nf_open(&b) == 0, "open");
	snprintf(val, sizeof(val), "%ld", r0 + 10);
	CHECK(param_write("max_total_ranges", val) == 0, "set max_total_ranges");
	for (int i = 0; i < 6; i++)
		CHECK(nf_reg(a.fd, (uintptr_t)p, pg, 0, NULL, NULL) == 0, "a %d", i);
	for (int i = 0; i < 4; i++)
		CHECK(nf_reg(b.fd, (uintptr_t)p, pg, 0, NULL, NULL) == 0, "b %d", i);
	CHECK(nf_reg(b.fd, (uintptr_t)p, pg, 0, NULL, NULL) == -ENOSPC,
	      "b past the global limit");
	CHECK(nf_reg(a.fd, (uintptr_t)p, pg, 0, NULL, NULL) == -ENOSPC,
	      "a past the global limit");
	CHECK(sysval("ranges") == r0 + 10, "live ranges %ld", sysval("ranges"));
	CHECK(nf_unreg(a.fd, 0) == 0, "UNREGISTER");
	CHECK(nf_reg(b.fd, (uintptr_t)p, pg, 0, NULL, NULL) == 0,
	      "REGISTER after one was freed");
	nf_close(&a);
	CHECK(sysval("ranges") == r0 + 5, "after closing a: %ld",
	      sysval("ranges"));
	return 0;
}

static int t_max_ranges_param(void)
{
	struct nf nf;
	char *p = anon(LEN);
	uint32_t slot = 0;

	if (!am_root())
		return skip("needs root to change max_ranges");
	CHECK(p, "mmap");
	CHECK(param_write("max_ranges", "0") == -EINVAL, "max_ranges 0");
	CHECK(param_write("max_ranges", "2097152") == -EINVAL,
	      "max_ranges 2^21");
	CHECK(param_write("max_ranges", "x") == -EINVAL, "max_ranges x");
	CHECK(param_write("max_ranges", "8") == 0, "max_ranges 8");
	CHECK(nf_open(&nf) == 0, "open");
	CHECK(nf.info.max_ranges == 8 && nf.info.counters_size == pg,
	      "INFO: %u slots, %llu bytes", nf.info.max_ranges,
	      (unsigned long long)nf.info.counters_size);
	for (int i = 0; i < 8; i++) {
		CHECK(nf_reg(nf.fd, (uintptr_t)p, pg, 0, &slot, NULL) == 0,
		      "REGISTER %d", i);
		CHECK(slot == (uint32_t)i, "slot %u", slot);
	}
	CHECK(nf_reg(nf.fd, (uintptr_t)p, pg, 0, NULL, NULL) == -ENOSPC, "9th");
	CHECK(nf_unreg(nf.fd, 8) == -EINVAL, "slot 8");
	return 0;
}

static int t_close_frees(void)
{
	long c0 = sysval("contexts"), r0 = sysval("ranges"), c, r;
	uint64_t old;
	struct nf nf;
	char *p = anon(LEN);

	CHECK(p, "mmap");
	CHECK(nf_open(&nf) == 0, "open");
	for (int i = 0; i < 100; i++)
		CHECK(nf_reg(nf.fd, (uintptr_t)p + (i % 16) * pg, pg,
			     0, NULL, NULL) == 0, "REGISTER");
	CHECK(sysval("contexts") == c0 + 1 && sysval("ranges") == r0 + 100,
	      "live counters %ld %ld", sysval("contexts"), sysval("ranges"));
	/* the counter mapping keeps the descriptor open */
	close(nf.fd);
	CHECK(sysval("contexts") == c0 + 1 && sysval("ranges") == r0 + 100,
	      "freed while still mapped");
	old = nf.ctr[0];
	CHECK(munmap(p, pg) == 0, "munmap");
	CHECK(nf.ctr[0] != old, "not watched any more after close()");
	CHECK(munmap((void *)nf.ctr, nf.info.counters_size) == 0, "munmap");
	CHECK(live_back_to(c0, r0, &c, &r),
	      "after the last close: contexts %ld ranges %ld, baseline %ld %ld",
	      c, r, c0, r0);
	/* a plain close, no mapping */
	int fd = open(KREG_NF_DEVICE, O_RDWR);
	CHECK(fd >= 0, "open");
	for (int i = 0; i < 50; i++)
		CHECK(nf_reg(fd, (uintptr_t)p + (i % 16) * pg, pg, 0, NULL,
			     NULL) == 0, "REGISTER");
	close(fd);
	CHECK(sysval("contexts") == c0 && sysval("ranges") == r0,
	      "close did not free at once: %ld %ld", sysval("contexts"),
	      sysval("ranges"));
	return 0;
}

static int t_exit_frees(void)
{
	long c0 = sysval("contexts"), r0 = sysval("ranges"), c, r;
	int status;
	pid_t pid;

	pid = fork();
	CHECK(pid >= 0, "fork");
	if (pid == 0) {
		struct nf nf;
		char *p = anon(LEN);

		if (!p || nf_open(&nf))
			_exit(2);
		for (int i = 0; i < 200; i++)
			if (nf_reg(nf.fd, (uintptr_t)p + (i % 16) * pg, pg, 0,
				   NULL, NULL))
				_exit(3);
		_exit(0);	/* no close, no munmap */
	}
	CHECK(waitpid(pid, &status, 0) == pid && status == 0,
	      "child status %#x", status);
	CHECK(live_back_to(c0, r0, &c, &r),
	      "after exit: contexts %ld ranges %ld, baseline %ld %ld", c, r,
	      c0, r0);
	return 0;
}

static bool maps_has(const char *what)
{
	char line[512];
	bool found = false;
	FILE *f = fopen("/proc/self/maps", "r");

	if (!f)
		return false;
	while (fgets(line, sizeof(line), f))
		if (strstr(line, what))
			found = true;
	fclose(f);
	return found;
}

static int t_fork_child_eperm(void)
{
	long r0 = sysval("ranges");
	struct nf nf;
	struct watch a;
	char *p = anon(LEN);
	int status;
	pid_t pid;
	uint64_t snap = 0;

	CHECK(p, "mmap");
	CHECK(nf_open(&nf) == 0, "open");
	CHECK(watch(&nf, &a, p, LEN) == 0, "REGISTER");
	CHECK(maps_has(KREG_NF_DEVICE), "no counter mapping in the parent");
	CHECK(madvise((void *)nf.ctr, nf.info.counters_size, MADV_DOFORK) == -1 &&
		      errno == EINVAL, "MADV_DOFORK on the counter mapping");
	snap = nf.ctr[a.slot];
	pid = fork();
	CHECK(pid >= 0, "fork");
	if (pid == 0) {
		struct kreg_nf_info info;
		struct kreg_nf_event ev;
		struct pollfd pfd = { .fd = nf.fd, .events = POLLIN };
		unsigned char vec;
		int fails = 0;

#define CHILD_CHECK(cond, what)                                            \
	do {                                                               \
		if (!(cond)) {                                             \
			printf("  child: %s (errno %d)\n", what, errno);   \
			fails++;                                           \
		}                                                          \
	} while (0)
		CHILD_CHECK(!maps_has(KREG_NF_DEVICE),
			    "the counter mapping was copied into the child");
		errno = 0;
		CHILD_CHECK(mincore((void *)nf.ctr, pg, &vec) == -1 &&
				    errno == ENOMEM,
			    "the counter address is mapped in the child");
		CHILD_CHECK(ioctl(nf.fd, KREG_NF_IOC_INFO, &info) == -1 &&
				    errno == EPERM, "INFO");
		CHILD_CHECK(nf_reg(nf.fd, (uintptr_t)p, LEN, 0, NULL, NULL) ==
				    -EPERM, "REGISTER");
		CHILD_CHECK(nf_unreg(nf.fd, a.slot) == -EPERM, "UNREGISTER");
		CHILD_CHECK(ioctl(nf.fd, 0x1234, NULL) == -1 && errno == EPERM,
			    "unknown ioctl");
		CHILD_CHECK(read(nf.fd, &ev, sizeof(ev)) == -1 &&
				    errno == EPERM, "read");
		CHILD_CHECK(poll(&pfd, 1, 0) == 1 && (pfd.revents & POLLERR),
			    "poll");
		CHILD_CHECK(mmap(NULL, pg, PROT_READ, MAP_SHARED, nf.fd, 0) ==
				    MAP_FAILED && errno == EPERM, "mmap");
		/* its own writes and unmaps are its own business */
		memset(p, 1, LEN);
		munmap(p, LEN);
		/* it can open its own */
		struct nf own;
		struct watch w;
		char *q = anon(LEN);

		CHILD_CHECK(nf_open(&own) == 0, "open in the child");
		CHILD_CHECK(watch(&own, &w, q, LEN) == 0, "REGISTER own");
		munmap(q, LEN);
		CHILD_CHECK(moved(&own, &w), "own counter");
		_exit(fails ? 1 : 0);
	}
	CHECK(waitpid(pid, &status, 0) == pid, "waitpid");
	CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0,
	      "child status %#x", status);
	/* the child's COW copy is not the parent's: only the parent's own
	 * write (to a page shared with the child until then) would count */
	CHECK(nf.ctr[a.slot] == snap, "the child moved the parent's counter");
	CHECK(sysval("ranges") == r0 + 1, "live ranges %ld", sysval("ranges"));
	CHECK(nf_unreg(nf.fd, a.slot) == 0, "the parent's slot is intact");
	return 0;
}

static int t_sigkill_mid_register(void)
{
	long c0 = sysval("contexts"), r0 = sysval("ranges"), c, r;
	int status, round;

	srand(getpid());
	for (round = 0; round < 12; round++) {
		int pfd[2];
		char ch;
		pid_t pid;

		CHECK(pipe(pfd) == 0, "pipe");
		pid = fork();
		CHECK(pid >= 0, "fork");
		if (pid == 0) {
			struct nf nf;
			pthread_t t;
			struct waiter wt = { 0 };
			char *p = anon(LEN);
			uint32_t slot = 0;

			if (!p || nf_open(&nf))
				_exit(2);
			wt.fd = nf.fd;
			wt.mode = round % 2;
			pthread_create(&t, NULL, wait_thread, &wt);
			if (write(pfd[1], "r", 1) != 1)
				_exit(3);
			for (unsigned long i = 0;; i++) {
				char *q = p + (i % 16) * pg;

				int e = nf_reg(nf.fd, (uintptr_t)q, pg, 0,
					       &slot, NULL);

				if (e == -ENOSPC || e == -EMLINK) {
					for (uint32_t s = 0; s < 64; s++)
						nf_unreg(nf.fd, s);
				}
				if (i % 3 == 0)
					madvise(q, pg, MADV_DONTNEED);
				if (i % 7 == 0)
					nf_unreg(nf.fd, slot);
			}
		}
		close(pfd[1]);
		CHECK(read(pfd[0], &ch, 1) == 1, "child started");
		close(pfd[0]);
		usleep(20000 + rand() % 200000);
		kill(pid, SIGKILL);
		CHECK(waitpid(pid, &status, 0) == pid, "waitpid");
		CHECK(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL,
		      "round %d: child status %#x", round, status);
		CHECK(live_back_to(c0, r0, &c, &r),
		      "round %d: contexts %ld ranges %ld, baseline %ld %ld",
		      round, c, r, c0, r0);
	}
	return 0;
}

/* Threads register, unregister, remap and unmap in their own arenas while
 * another one changes every arena (DONTNEED, mprotect, fork) and a reader
 * drains the queue. Each change of a thread's own watched range must move
 * its counter before the call returns. */
#define ARENA_SLOTS 32
#define SLOT_PAGES 4

struct stress {
	struct nf nf;
	char *arena[4];
	volatile int stop;
	long ops[4], records, errors;
	char msg[4][160];
};

struct stress_arg {
	struct stress *s;
	int id;
};

static void *stress_worker(void *a)
{
	struct stress_arg *sa = a;
	struct stress *s = sa->s;
	char *base = s->arena[sa->id];
	size_t span = SLOT_PAGES * pg;
	struct watch w[ARENA_SLOTS];
	bool live[ARENA_SLOTS] = { 0 };
	unsigned int seed = sa->id * 7919 + 1;

	while (!s->stop) {
		int k = rand_r(&seed) % ARENA_SLOTS, op = rand_r(&seed) % 5;
		char *q = base + k * span;
		const char *bad = NULL;

		if (!live[k]) {
			if (mmap(q, span, PROT_READ | PROT_WRITE,
				 MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1,
				 0) != q) {
				bad = "mmap";
			} else {
				memset(q, 1, span);
				if (watch(&s->nf, &w[k], q, span))
					bad = "REGISTER";
				else
					live[k] = true;
			}
		} else if (op == 0) {
			uint64_t before = s->nf.ctr[w[k].slot];

			if (nf_unreg(s->nf.fd, w[k].slot))
				bad = "UNREGISTER";
			else if (s->nf.ctr[w[k].slot] == before)
				bad = "UNREGISTER did not bump";
			live[k] = false;
		} else {
			int r;

			if (op == 1)
				r = munmap(q + pg, pg);
			else if (op == 2)
				r = madvise(q, span, MADV_DONTNEED);
			else if (op == 3)
				r = mmap(q, pg, PROT_READ | PROT_WRITE,
					 MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED,
					 -1, 0) == q ? 0 : -1;
			else
				r = mremap(q, span, span / 2, 0) == q ? 0 : -1;
			if (r)
				bad = "change";
			else if (!moved(&s->nf, &w[k]))
				bad = "a change of the own range did not move the counter";
			if (nf_unreg(s->nf.fd, w[k].slot))
				bad = "UNREGISTER";
			live[k] = false;
		}
		if (bad) {
			__atomic_add_fetch(&s->errors, 1, __ATOMIC_RELAXED);
			snprintf(s->msg[sa->id], sizeof(s->msg[0]),
				 "worker %d op %d: %s (errno %d)", sa->id, op,
				 bad, errno);
		}
		s->ops[sa->id]++;
	}
	return NULL;
}

static void *stress_meddler(void *a)
{
	struct stress *s = a;
	unsigned int seed = 4242;

	while (!s->stop) {
		char *base = s->arena[rand_r(&seed) % 3];
		size_t off = (rand_r(&seed) % (ARENA_SLOTS * SLOT_PAGES)) * pg;
		pid_t pid;

		switch (rand_r(&seed) % 4) {
		case 0:
			madvise(base + off, pg, MADV_DONTNEED);
			break;
		case 1: /* a protection change that keeps write access */
			mprotect(base + off, pg,
				 PROT_READ | PROT_WRITE | PROT_EXEC);
			mprotect(base + off, pg, PROT_READ | PROT_WRITE);
			break;
		case 2:
			pid = fork();
			if (pid == 0)
				_exit(0);
			if (pid > 0)
				waitpid(pid, NULL, 0);
			break;
		default:
			madvise(base + off, 2 * pg, MADV_FREE);
			break;
		}
		s->ops[3]++;
	}
	return NULL;
}

static void *stress_reader(void *a)
{
	struct stress *s = a;
	struct kreg_nf_event ev[64];

	while (!s->stop) {
		struct pollfd pfd = { .fd = s->nf.fd, .events = POLLIN };
		ssize_t n;

		if (poll(&pfd, 1, 100) <= 0)
			continue;
		n = read(s->nf.fd, ev, sizeof(ev));
		if (n < 0 && errno != EAGAIN) {
			__atomic_add_fetch(&s->errors, 1, __ATOMIC_RELAXED);
			continue;
		}
		for (ssize_t i = 0; i < n / (ssize_t)sizeof(ev[0]); i++) {
			if (ev[i].end <= ev[i].start || ev[i].flags ||
			    ev[i].slot >= s->nf.info.max_ranges)
				__atomic_add_fetch(&s->errors, 1,
						   __ATOMIC_RELAXED);
			s->records++;
		}
	}
	return NULL;
}

static int t_stress_threads(void)
{
	long c0 = sysval("contexts"), r0 = sysval("ranges"), c, r;
	static struct stress s;
	struct stress_arg args[3];
	pthread_t t[5];
	size_t span = ARENA_SLOTS * SLOT_PAGES * pg;
	double secs = getenv("KREG_STRESS_SECONDS") ?
			      atof(getenv("KREG_STRESS_SECONDS")) : 4;

	CHECK(nf_open(&s.nf) == 0 && set_nonblock(s.nf.fd) == 0, "open");
	for (int i = 0; i < 3; i++) {
		s.arena[i] = mmap(NULL, span, PROT_READ | PROT_WRITE,
				  MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		CHECK(s.arena[i] != MAP_FAILED, "arena");
	}
	for (int i = 0; i < 3; i++) {
		args[i] = (struct stress_arg){ .s = &s, .id = i };
		CHECK(pthread_create(&t[i], NULL, stress_worker, &args[i]) == 0,
		      "thread");
	}
	CHECK(pthread_create(&t[3], NULL, stress_meddler, &s) == 0, "thread");
	CHECK(pthread_create(&t[4], NULL, stress_reader, &s) == 0, "thread");
	usleep(secs * 1e6);
	s.stop = 1;
	for (int i = 0; i < 5; i++)
		pthread_join(t[i], NULL);
	printf("  %.0f s: %ld + %ld + %ld worker ops, %ld meddler ops, %ld records\n",
	       secs, s.ops[0], s.ops[1], s.ops[2], s.ops[3], s.records);
	for (int i = 0; i < 3; i++)
		if (s.msg[i][0])
			printf("  %s\n", s.msg[i]);
	CHECK(s.errors == 0, "%ld errors", s.errors);
	CHECK(s.ops[0] > 10 && s.ops[1] > 10 && s.ops[2] > 10, "too few ops");
	CHECK(s.records > 0, "no records read");
	nf_close(&s.nf);
	CHECK(live_back_to(c0, r0, &c, &r),
	      "after close: contexts %ld ranges %ld, baseline %ld %ld", c, r,
	      c0, r0);
	return 0;
}

static int t_unprivileged(void)
{
	int status;
	pid_t pid;

	if (geteuid() != 0)
		return skip("already unprivileged: the other tests cover it");
	pid = fork();
	CHECK(pid >= 0, "fork");
	if (pid == 0) {
		struct nf nf;
		struct watch w;
		char *p;

		if (setgroups(0, NULL) || setgid(65534) || setuid(65534))
			_exit(2);
		p = anon(LEN);
		if (!p || nf_open(&nf))
			_exit(3);
		if (watch(&nf, &w, p, LEN) || munmap(p, LEN) || !moved(&nf, &w))
			_exit(4);
		if (param_write("max_ranges", "4") != -EACCES)
			_exit(5);
		/* the live counts are root's */
		if (open(SYSDIR "/ranges", O_RDONLY) >= 0 || errno != EACCES)
			_exit(6);
		_exit(0);
	}
	CHECK(waitpid(pid, &status, 0) == pid, "waitpid");
	CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0,
	      "as uid 65534: status %#x (2 setuid, 3 open, 4 watch, 5 param, 6 sysfs readable)",
	      status);
	return 0;
}


const struct nf_test nf_tests_limits[] = {
	{ "enospc-per-descriptor", t_enospc_per_descriptor, NULL, NULL },
	{ "enospc-global", t_enospc_global, NULL, NULL },
	{ "max-ranges-param", t_max_ranges_param, NULL, NULL },
	{ "fork-child-eperm", t_fork_child_eperm, NULL, NULL },
	{ "close-frees", t_close_frees, NULL, NULL },
	{ "exit-frees", t_exit_frees, NULL, NULL },
	{ "sigkill-mid-register", t_sigkill_mid_register, NULL, NULL },
	{ "stress-threads", t_stress_threads, NULL, NULL },
	{ "unprivileged", t_unprivileged, NULL, NULL },
};
const size_t nf_n_limits = sizeof(nf_tests_limits) / sizeof(nf_tests_limits[0]);
