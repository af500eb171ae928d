/*
 * A shared node: memory as it is used, per-user limits, what one user
 * costs another, the counters never pinnable, overlap.
 */
#include "nf_test.h"


static long meminfo_kb(const char *key)
{
	char line[256];
	size_t n = strlen(key);
	long v = -1;
	FILE *f = fopen("/proc/meminfo", "r");

	if (!f)
		return -1;
	while (fgets(line, sizeof(line), f))
		if (!strncmp(line, key, n) && line[n] == ':')
			v = atol(line + n + 1);
	fclose(f);
	return v;
}

/* open() takes no counter memory: it comes as slots are used. */
static int t_open_memory_lazy(void)
{
	enum { N = 200 };
	static int fds[N];
	long free0, free1, mem0 = sysval("memory"), mem1, per;

	free0 = meminfo_kb("MemFree");
	CHECK(free0 > 0, "MemFree in /proc/meminfo");
	for (int i = 0; i < N; i++) {
		fds[i] = open(KREG_NF_DEVICE, O_RDWR | O_CLOEXEC);
		CHECK(fds[i] >= 0, "open %d", i);
	}
	free1 = meminfo_kb("MemFree");
	mem1 = sysval("memory");
	per = (free0 - free1) * 1024 / N;
	printf("  %d opens: MemFree %ld -> %ld kB, %ld bytes an open; module memory %ld -> %ld\n",
	       N, free0, free1, per, mem0, mem1);
	CHECK(per < 24 * 1024, "each open took %ld bytes (MemFree)", per);
	if (mem0 >= 0)
		CHECK((mem1 - mem0) / N < 16 * 1024,
		      "each open charged %ld bytes", (mem1 - mem0) / N);
	for (int i = 0; i < N; i++)
		close(fds[i]);
	return 0;
}

/* Forks a child that runs fn(arg) as uid (and gid) after dropping root. */
static pid_t as_user(uid_t uid, int (*fn)(void *), void *arg)
{
	pid_t pid = fork();

	if (pid == 0) {
		if (setgroups(0, NULL) || setresgid(uid, uid, uid) ||
		    setresuid(uid, uid, uid))
			_exit(100);
		_exit(fn(arg));
	}
	return pid;
}

static int wait_status(pid_t pid)
{
	int status;

	if (pid < 0 || waitpid(pid, &status, 0) != pid)
		return -1;
	return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

/* What a user's child reports back through a shared page. */
struct hog {
	int files, files_errno;	 /* opens that worked, errno of the first refusal */
	int ranges, ranges_errno;
	int go, done;		 /* parent -> child: go on, then exit */
	int ready;
	char *page;		 /* what to register */
	int max_files, max_ranges, per_file;
};

static void hog_wait(volatile int *flag)
{
	while (!*flag)
		usleep(1000);
}

/* Opens up to max_files descriptors, registers up to per_file ranges on each
 * (all over h->page, or distinct pages of a reservation when page is NULL),
 * reports, and holds everything until told. */
static int hog_main(void *a)
{
	struct hog *h = a;
	char *res = h->page ? NULL :
			      mmap(NULL, (size_t)h->max_ranges * pg, PROT_NONE,
				   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
				   -1, 0);
	int fd;

	if (res == MAP_FAILED)
		return 3;
	for (int i = 0; i < h->max_files; i++) {
		fd = open(KREG_NF_DEVICE, O_RDWR | O_CLOEXEC);
		if (fd < 0) {
			h->files_errno = errno;
			break;
		}
		h->files++;
		for (int j = 0; j < h->per_file && h->ranges < h->max_ranges; j++) {
			char *q = h->page ? h->page : res + (size_t)h->ranges * pg;
			int e = nf_reg(fd, (uintptr_t)q, pg, 0, NULL, NULL);

			if (e) {
				if (!h->ranges_errno)
					h->ranges_errno = -e;
				break;
			}
			h->ranges++;
		}
	}
	__atomic_store_n(&h->ready, 1, __ATOMIC_RELEASE);
	hog_wait(&h->done);
	return 0;
}

static struct hog *hog_new(void)
{
	struct hog *h = mmap(NULL, sizeof(*h), PROT_READ | PROT_WRITE,
			     MAP_SHARED | MAP_ANONYMOUS, -1, 0);

	return h == MAP_FAILED ? NULL : h;
}

/* Starts h's user (uid) and waits until it holds what it could take. */
static pid_t hog_start(struct hog *h, uid_t uid)
{
	pid_t pid = as_user(uid, hog_main, h);

	while (pid > 0 && !__atomic_load_n(&h->ready, __ATOMIC_ACQUIRE))
		usleep(1000);
	printf("  uid %u: %d descriptors (then errno %d), %d ranges (then errno %d)\n",
	       uid, h->files, h->files_errno, h->ranges, h->ranges_errno);
	return pid;
}

/* A user's child at its caps leaves another user everything it needs; a
 * process with CAP_SYS_RESOURCE (root here) is held by the global limit
 * only. The global limit is lowered so that, without per-user caps, the
 * first user takes every range. */
static int t_user_limits(void)
{
	long r0 = sysval("ranges");
	struct hog *a = hog_new(), *b = hog_new();
	char val[32];
	pid_t pa, pb;
	int fd, n = 0, e;
	char *p = anon(LEN);

	if (!am_root())
		return skip("needs root to switch users and set the limits");
	CHECK(a && b && p, "mmap");
	/* a module without these parameters fails below, not here */
	param_write("max_files_per_user", "4");
	param_write("max_ranges_per_user", "100");
	snprintf(val, sizeof(val), "%ld", r0 + 150);
	CHECK(param_write("max_total_ranges", val) == 0, "max_total_ranges");

	*a = (struct hog){ .max_files = 8, .max_ranges = 1000, .per_file = 60 };
	pa = hog_start(a, 65534);
	CHECK(pa > 0, "fork");

	*b = (struct hog){ .max_files = 4, .max_ranges = 40, .per_file = 10 };
	pb = hog_start(b, 65533);
	CHECK(pb > 0, "fork");

	/* root: above the per-user caps, up to the global limit */
	fd = open(KREG_NF_DEVICE, O_RDWR | O_CLOEXEC);
	CHECK(fd >= 0, "open as root");
	while (n < 100 && nf_reg(fd, (uintptr_t)p + (n % 16) * pg, pg, 0,
				 NULL, NULL) == 0)
		n++;
	printf("  root: %d ranges\n", n);
	e = nf_reg(fd, (uintptr_t)p, pg, 0, NULL, NULL);
	a->done = b->done = 1;
	CHECK(wait_status(pa) == 0 && wait_status(pb) == 0, "children");

	CHECK(b->files == 4 && b->ranges == 40,
	      "the second user got %d descriptors and %d ranges of 4 and 40 (errno %d, %d) after the first took %d descriptors and %d ranges",
	      b->files, b->ranges, b->files_errno, b->ranges_errno, a->files,
	      a->ranges);
	CHECK(a->files == 4 && a->files_errno == EMFILE,
	      "the first user opened %d descriptors (errno %d), cap 4 (EMFILE)",
	      a->files, a->files_errno);
	CHECK(a->ranges == 100 && a->ranges_errno == EDQUOT,
	      "the first user registered %d ranges (errno %d), cap 100 (EDQUOT)",
	      a->ranges, a->ranges_errno);
	CHECK(n == 150 - 140, "root registered %d, the global limit left 10",
	      n);
	CHECK(e == -ENOSPC, "root past the global limit: %d", e);
	close(fd);
	return 0;
}

/* max_kib_per_user: a user's descriptors and ranges stop at EDQUOT, and
 * another user is not affected. */
static int t_user_memory_limit(void)
{
	struct hog *a = hog_new(), *b = hog_new();
	pid_t pa, pb;

	if (!am_root())
		return skip("needs root to switch users and set the limits");
	CHECK(a && b, "mmap");
	param_write("max_kib_per_user", "64");
	*a = (struct hog){ .max_files = 200, .max_ranges = 100000,
			   .per_file = 1000 };
	pa = hog_start(a, 65534);
	CHECK(pa > 0, "fork");
	*b = (struct hog){ .max_files = 1, .max_ranges = 10, .per_file = 10 };
	pb = hog_start(b, 65533);
	CHECK(pb > 0, "fork");
	a->done = b->done = 1;
	CHECK(wait_status(pa) == 0 && wait_status(pb) == 0, "children");
	CHECK(a->ranges < 1000 && a->ranges_errno == EDQUOT,
	      "64 KiB held %d ranges (errno %d)", a->ranges, a->ranges_errno);
	CHECK(a->files < 200 && a->files_errno == EDQUOT,
	      "64 KiB held %d descriptors (errno %d)", a->files,
	      a->files_errno);
	CHECK(b->files == 1 && b->ranges == 10,
	      "the other user got %d descriptors, %d ranges (errno %d %d)",
	      b->files, b->ranges, b->files_errno, b->ranges_errno);
	return 0;
}

/* ms that fallocate(PUNCH_HOLE) of the first page of mfd takes, median of 5 */
static double punch_ms(int mfd, char *map)
{
	double t[5];

	for (int i = 0; i < 5; i++) {
		double t0;

		map[0] = 1;
		t0 = now_ns();
		if (fallocate(mfd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
			      0, pg))
			return -1;
		t[i] = (now_ns() - t0) / 1e6;
	}
	return median(t, 5);
}

/* Another user maps a page of our memfd read-only and registers as many
 * ranges over it as the module lets it; our hole punch of that page runs
 * its callbacks. Their number is bounded (max_overlap per descriptor, the
 * per-user caps), and so is the time. */
static int t_other_user_cost(void)
{
	struct hog *h = hog_new();
	int mfd = memfd_of(pg);
	char *mine = mfd >= 0 ? map_shared(mfd, pg) : NULL;
	char *theirs = mfd >= 0 ? mmap(NULL, pg, PROT_READ, MAP_SHARED, mfd, 0) :
				  MAP_FAILED;
	/* KREG_COST_FILES=512: the worst case at the default limits */
	int files = getenv("KREG_COST_FILES") ? atoi(getenv("KREG_COST_FILES")) :
						16;
	double base, loaded;
	pid_t pid;

	if (geteuid() != 0)
		return skip("needs root to switch users");
	CHECK(h && mine && theirs != MAP_FAILED, "memfd, mappings");
	base = punch_ms(mfd, mine);
	*h = (struct hog){ .max_files = files, .max_ranges = files * 16384,
			   .per_file = 16384, .page = theirs };
	pid = hog_start(h, 65534);
	CHECK(pid > 0, "fork");
	loaded = punch_ms(mfd, mine);
	h->done = 1;
	CHECK(wait_status(pid) == 0, "child");
	printf("  root's hole punch of that page: %.3f ms alone, %.3f ms with them\n",
	       base, loaded);
	CHECK(base >= 0 && loaded >= 0, "fallocate");
	CHECK(loaded < base + 20,
	      "another user's registrations made a page change take %.1f ms (%.3f alone)",
	      loaded, base);
	return 0;
}

/* While UNREGISTER runs, a change that completes moves the counter: one
 * thread registers and unregisters a page, another changes it and reads
 * the counter before and after. Seen unmoved across a completed change
 * while it still held REGISTER's value: the change was missed. */
struct uo {
	struct nf nf;
	char *p;
	volatile uint64_t iter, done_iter, snap;
	volatile uint32_t slot;
	volatile int stop;
	long changes, missed;
};

static void *uo_changer(void *a)
{
	struct uo *u = a;

	while (!u->stop) {
		uint64_t i = __atomic_load_n(&u->iter, __ATOMIC_ACQUIRE);
		uint64_t snap = u->snap, c0, c1;
		uint32_t slot = u->slot;

		if (__atomic_load_n(&u->iter, __ATOMIC_ACQUIRE) != i ||
		    __atomic_load_n(&u->done_iter, __ATOMIC_ACQUIRE) >= i)
			continue;
		c0 = __atomic_load_n(&u->nf.ctr[slot], __ATOMIC_ACQUIRE);
		madvise(u->p, pg, MADV_DONTNEED);
		c1 = __atomic_load_n(&u->nf.ctr[slot], __ATOMIC_ACQUIRE);
		u->changes++;
		if (c0 == snap && c1 == snap)
			u->missed++;
	}
	return NULL;
}

static int t_unregister_order(void)
{
	static struct uo u;
	double secs = getenv("KREG_UO_SECONDS") ? atof(getenv("KREG_UO_SECONDS")) : 5;
	double t0 = now_ns();
	pthread_t t;
	uint64_t i;

	u.p = anon(LEN);
	CHECK(u.p, "mmap");
	CHECK(nf_open(&u.nf) == 0, "open");
	CHECK(pthread_create(&t, NULL, uo_changer, &u) == 0, "thread");
	for (i = 1; now_ns() - t0 < secs * 1e9; i++) {
		uint32_t slot = 0;
		uint64_t snap = 0;

		CHECK(nf_reg(u.nf.fd, (uintptr_t)u.p, pg, 0, &slot, &snap) == 0,
		      "REGISTER");
		u.slot = slot;
		u.snap = snap;
		__atomic_store_n(&u.iter, i, __ATOMIC_RELEASE);
		CHECK(nf_unreg(u.nf.fd, slot) == 0, "UNREGISTER");
		__atomic_store_n(&u.done_iter, i, __ATOMIC_RELEASE);
	}
	u.stop = 1;
	pthread_join(t, NULL);
	printf("  %llu REGISTER + UNREGISTER, %ld changes among them, %ld completed without moving the counter\n",
	       (unsigned long long)i - 1, u.changes, u.missed);
	CHECK(u.missed == 0,
	      "%ld changes completed during UNREGISTER left REGISTER's value",
	      u.missed);
	CHECK(u.changes > 100, "too few changes (%ld) to tell", u.changes);
	return 0;
}

/* The counter pages cannot be pinned: vmsplice (fast GUP) fails. */
static int t_counters_not_pinnable(void)
{
	struct nf nf;
	struct watch w = { 0 };
	struct iovec iov;
	char *p = anon(LEN);
	int pfd[2];

	CHECK(p, "mmap");
	CHECK(nf_open(&nf) == 0 && watch(&nf, &w, p, LEN) == 0, "open");
	CHECK(nf.ctr[w.slot] == w.snap, "counter");
	CHECK(pipe(pfd) == 0, "pipe");
	iov = (struct iovec){ .iov_base = (void *)nf.ctr, .iov_len = pg };
	errno = 0;
	CHECK(vmsplice(pfd[1], &iov, 1, 0) == -1 && errno == EFAULT,
	      "vmsplice of the counter page into a pipe");
	return 0;
}

/* One descriptor holds at most max_overlap ranges over any page. */
static int t_overlap_cap(void)
{
	struct nf nf;
	char buf[32];
	char *p = anon(4 * LEN);
	int n = 0, e = 0, cap;
	uint32_t slot = 0, first = 0;

	CHECK(p, "mmap");
	CHECK(param_read("max_overlap", buf, sizeof(buf)),
	      "no parameter max_overlap");
	cap = atoi(buf);
	CHECK(cap > 0 && cap < 16384, "max_overlap %d", cap);
	CHECK(nf_open(&nf) == 0, "open");
	/* different ranges, all over page 8 of p */
	while (n <= cap) {
		e = nf_reg(nf.fd, (uintptr_t)p + (8 - n % 8) * pg,
			   (1 + n % 8 + n / 8) * pg, 0, &slot, NULL);
		if (e)
			break;
		if (!n)
			first = slot;
		n++;
	}
	CHECK(n == cap && e == -EMLINK, "%d ranges over one page (%d), cap %d",
	      n, e, cap);
	CHECK(nf_reg(nf.fd, (uintptr_t)p + 2 * LEN, pg, 0, NULL, NULL) == 0,
	      "a range elsewhere");
	CHECK(nf_unreg(nf.fd, first) == 0, "UNREGISTER");
	CHECK(nf_reg(nf.fd, (uintptr_t)p + 8 * pg, pg, 0, NULL, NULL) == 0,
	      "REGISTER over the page again after one went");
	CHECK(nf_reg(nf.fd, (uintptr_t)p + 8 * pg, pg, 0, NULL, NULL) == -EMLINK,
	      "one more");
	return 0;
}


const struct nf_test nf_tests_shared_node[] = {
	{ "open-memory-lazy", t_open_memory_lazy, NULL, NULL },
	{ "user-limits", t_user_limits, NULL, NULL },
	{ "user-memory-limit", t_user_memory_limit, NULL, NULL },
	{ "other-user-cost", t_other_user_cost, NULL, NULL },
	{ "unregister-order", t_unregister_order, NULL, NULL },
	{ "counters-not-pinnable", t_counters_not_pinnable, NULL, NULL },
	{ "overlap-cap", t_overlap_cap, NULL, NULL },
};
const size_t nf_n_shared_node = sizeof(nf_tests_shared_node) / sizeof(nf_tests_shared_node[0]);
