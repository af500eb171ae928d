/*
 * Tests of the kreg_notifier module (kmod/) through /dev/kreg_notifier.
 *
 *   kreg_nf_test              every test; exits 77 when the device is absent
 *   kreg_nf_test NAME...      the named tests
 *   kreg_nf_test --list       the test names, one a line
 *   kreg_nf_test --bench      cost figures (ratios to a bare getppid())
 *   kreg_nf_test --bench-sync synchronous delivery's costs, part by part (the
 *                             signal's part also without the module)
 *
 * Each test runs in a forked child with an alarm. A semantic test checks
 * the counter right after the changing call returned in the changing thread
 * ("moved before the call returned"), or that it did not move. The leak
 * checks read the module's live counters in /sys/class/misc/kreg_notifier/.
 * test/kmod/run-kmod-tests runs this in the Soft-RoCE VM with the module.
 *
 * One file over 350 lines on purpose: one program a test suite of the
 * module's user-space ABI, its tests listed in one table at the bottom
 * (the semantic ones as data: a change, whether it moves the counter);
 * split, each part would need the same harness and device helpers.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <kreg_notifier.h>
#include <liburing.h>

#define SYSDIR "/sys/class/misc/kreg_notifier"
#define PARAMDIR "/sys/module/kreg_notifier/parameters"
#define LEN (64 * 1024)

static size_t pg;

/* ---- reporting --------------------------------------------------------- */

static char *skip_reason; /* shared with the runner (MAP_SHARED page) */

#define CHECK(cond, ...)                                                   \
	do {                                                               \
		if (!(cond)) {                                             \
			failed(__LINE__, #cond, __VA_ARGS__);              \
			return 1;                                          \
		}                                                          \
	} while (0)

static void failed(int line, const char *cond, const char *fmt, ...)
{
	va_list ap;
	int e = errno;

	printf("  line %d: %s: ", line, cond);
	va_start(ap, fmt);
	vprintf(fmt, ap);
	va_end(ap);
	printf(" (errno %d %s)\n", e, strerror(e));
	fflush(stdout);
}

static int skip(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(skip_reason, 256, fmt, ap);
	va_end(ap);
	printf("skip: %s\n", skip_reason);
	return 77;
}

/* ---- the device ---------------------------------------------------------- */

struct nf {
	int fd;
	struct kreg_nf_info info;
	volatile const uint64_t *ctr;
};

struct watch {
	uint32_t slot;
	uint64_t snap;
	uint64_t start, end;
};

static int nf_open(struct nf *nf)
{
	memset(nf, 0, sizeof(*nf));
	nf->fd = open(KREG_NF_DEVICE, O_RDWR | O_CLOEXEC);
	if (nf->fd < 0)
		return -1;
	if (ioctl(nf->fd, KREG_NF_IOC_INFO, &nf->info))
		return -1;
	nf->ctr = mmap(NULL, nf->info.counters_size, PROT_READ, MAP_SHARED,
		       nf->fd, 0);
	if (nf->ctr == MAP_FAILED)
		return -1;
	return 0;
}

static void nf_close(struct nf *nf)
{
	munmap((void *)nf->ctr, nf->info.counters_size);
	close(nf->fd);
}

/* REGISTER; 0 or -errno */
static int nf_reg(int fd, uint64_t start, uint64_t len, uint32_t flags,
		  uint32_t *slot, uint64_t *counter)
{
	struct kreg_nf_register r = { .start = start, .len = len,
				      .flags = flags };

	if (ioctl(fd, KREG_NF_IOC_REGISTER, &r))
		return -errno;
	if (slot)
		*slot = r.slot;
	if (counter)
		*counter = r.counter;
	return 0;
}

static int nf_unreg(int fd, uint32_t slot)
{
	struct kreg_nf_unregister u = { .slot = slot };

	return ioctl(fd, KREG_NF_IOC_UNREGISTER, &u) ? -errno : 0;
}

static int watch(struct nf *nf, struct watch *w, void *p, size_t len)
{
	w->start = (uintptr_t)p;
	w->end = w->start + len;
	return nf_reg(nf->fd, w->start, len, 0, &w->slot, &w->snap);
}

static bool moved(struct nf *nf, struct watch *w)
{
	return nf->ctr[w->slot] != w->snap;
}

static long sysval(const char *name)
{
	char path[256], buf[64] = "";
	FILE *f;

	snprintf(path, sizeof(path), SYSDIR "/%s", name);
	f = fopen(path, "r");
	if (!f)
		return -1;
	if (!fgets(buf, sizeof(buf), f))
		buf[0] = 0;
	fclose(f);
	return buf[0] ? atol(buf) : -1;
}

/* Waits until the live counters are back at (ctxs, ranges); release runs
 * on the last close, which a dying process reaches a little later. */
static bool live_back_to(long ctxs, long ranges, long *got_c, long *got_r)
{
	for (int i = 0; i < 500; i++) {
		*got_c = sysval("contexts");
		*got_r = sysval("ranges");
		if (*got_c == ctxs && *got_r == ranges)
			return true;
		usleep(10000);
	}
	return false;
}

static int param_write(const char *name, const char *val)
{
	char path[256];
	int fd, ok;

	snprintf(path, sizeof(path), PARAMDIR "/%s", name);
	fd = open(path, O_WRONLY);
	if (fd < 0)
		return -errno;
	ok = write(fd, val, strlen(val)) == (ssize_t)strlen(val);
	ok = ok ? 0 : -errno;
	close(fd);
	return ok;
}

static bool param_read(const char *name, char *buf, size_t n)
{
	char path[256];
	FILE *f;
	bool ok;

	snprintf(path, sizeof(path), PARAMDIR "/%s", name);
	f = fopen(path, "r");
	if (!f)
		return false;
	ok = fgets(buf, n, f) != NULL;
	fclose(f);
	buf[strcspn(buf, "\n")] = 0;
	return ok;
}

static bool am_root(void)
{
	return geteuid() == 0 && access(PARAMDIR "/max_total_ranges", W_OK) == 0;
}

/* ---- memory -------------------------------------------------------------- */

static char *anon(size_t len)
{
	char *p = mmap(NULL, len, PROT_READ | PROT_WRITE,
		       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

	if (p == MAP_FAILED)
		return NULL;
	memset(p, 0x5a, len);
	return p;
}

static int memfd_of(size_t len)
{
	int fd = memfd_create("kreg_nf_test", MFD_CLOEXEC);

	if (fd >= 0 && ftruncate(fd, len)) {
		close(fd);
		return -1;
	}
	return fd;
}

static char *map_shared(int mfd, size_t len)
{
	char *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, mfd, 0);

	if (p == MAP_FAILED)
		return NULL;
	memset(p, 0x3c, len);
	return p;
}

static double now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e9 + ts.tv_nsec;
}

/* Common start of a semantic test: a descriptor and one watched range. */
#define SETUP(nf, w, p, len)                                               \
	do {                                                               \
		CHECK(nf_open(nf) == 0, "open/map " KREG_NF_DEVICE);       \
		CHECK(watch(nf, w, p, len) == 0, "REGISTER");              \
		CHECK((w)->snap != 0, "REGISTER returned counter 0");      \
		CHECK((nf)->ctr[(w)->slot] == (w)->snap,                   \
		      "mapped counter %llu != returned %llu",              \
		      (unsigned long long)(nf)->ctr[(w)->slot],            \
		      (unsigned long long)(w)->snap);                      \
	} while (0)

#define EXPECT_MOVED(nf, w, what)                                          \
	CHECK(moved(nf, w), "%s did not move the counter", what)
#define EXPECT_STILL(nf, w, what)                                          \
	CHECK(!moved(nf, w), "%s moved the counter (%llu -> %llu)", what,  \
	      (unsigned long long)(w)->snap,                               \
	      (unsigned long long)(nf)->ctr[(w)->slot])

/* ---- semantics ------------------------------------------------------------
 * One watched range [p + off, p + off + len) in a mapping of map_len bytes
 * (private anonymous and populated, or left unpopulated, or a MAP_SHARED
 * memfd); prep runs before REGISTER, change after it in this thread; then
 * the counter must have moved (or not) by the time change returned. A change
 * returns 0, 77 to skip, or anything else after saying what went wrong. */
struct sem {
	size_t map_len;		/* default LEN */
	size_t off, len;	/* default: the rest of the mapping */
	enum { POPULATED, FRESH, MEMFD } kind;
	int (*prep)(char *p);
	int (*change)(char *p);
	bool moves;
	const char *what;
};

static struct nf g_nf;
static struct watch g_w;
static int g_mfd = -1;

static int semantic(const struct sem *s)
{
	size_t map_len = s->map_len ? s->map_len : LEN;
	size_t len = s->len ? s->len : map_len - s->off;
	char *p = NULL;
	int r;

	if (s->kind == MEMFD) {
		g_mfd = memfd_of(map_len);
		CHECK(g_mfd >= 0, "memfd");
		p = map_shared(g_mfd, map_len);
	} else if (s->kind == FRESH) {
		p = mmap(NULL, map_len, PROT_READ | PROT_WRITE,
			 MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		p = p == MAP_FAILED ? NULL : p;
	} else {
		p = anon(map_len);
	}
	CHECK(p, "mmap");
	if (s->prep)
		CHECK(s->prep(p) == 0, "preparing: %s", s->what);
	SETUP(&g_nf, &g_w, p + s->off, len);
	r = s->change(p);
	if (r == 77)
		return 77;
	CHECK(r == 0, "%s", s->what);
	if (s->moves)
		EXPECT_MOVED(&g_nf, &g_w, s->what);
	else
		EXPECT_STILL(&g_nf, &g_w, s->what);
	return 0;
}

static int ok(bool cond, const char *what)
{
	if (!cond)
		printf("  %s (errno %d %s)\n", what, errno, strerror(errno));
	return cond ? 0 : 1;
}

static int ch_munmap_whole(char *p)
{
	return munmap(p, LEN);
}

static int ch_munmap_page(char *p)
{
	return munmap(p + 5 * pg, pg);
}

static int ch_map_fixed(char *p)
{
	return ok(mmap(p + pg, 2 * pg, PROT_READ | PROT_WRITE,
		       MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0) == p + pg,
		  "mmap MAP_FIXED");
}

static int ch_mremap_move(char *p)
{
	char *q = mmap(NULL, LEN, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

	return ok(q != MAP_FAILED &&
		  mremap(p, LEN, LEN, MREMAP_MAYMOVE | MREMAP_FIXED, q) == q,
		  "mremap to a new place");
}

static int ch_mremap_dontunmap(char *p)
{
	/* raw syscall: glibc 2.36's mremap() mishandles MREMAP_DONTUNMAP */
	long r = syscall(SYS_mremap, p, LEN, LEN,
			 MREMAP_MAYMOVE | MREMAP_DONTUNMAP, NULL);

	return ok(r != -1 && (char *)r != p, "mremap MREMAP_DONTUNMAP");
}

static int ch_mremap_shrink(char *p)
{
	return ok(mremap(p, LEN, LEN / 2, 0) == p, "mremap shrink");
}

static int ch_madv_dontneed(char *p)
{
	return madvise(p + pg, 3 * pg, MADV_DONTNEED);
}

static int ch_madv_free(char *p)
{
	return madvise(p + pg, 3 * pg, MADV_FREE);
}

static int punch(void)
{
	return fallocate(g_mfd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
			 2 * pg, pg);
}

static int truncate0(void)
{
	return ftruncate(g_mfd, 0);
}

static int ch_punch(char *p)
{
	return punch();
}

static int ch_truncate(char *p)
{
	return truncate0();
}

/* op in a forked child that has the memfd but no mapping of it; the
 * counter must have moved once the child says op returned */
static int in_other_process(char *p, int (*op)(void))
{
	int pfd[2], status;
	char c = 0;
	pid_t pid;

	if (ok(pipe(pfd) == 0, "pipe") || ok((pid = fork()) >= 0, "fork"))
		return 1;
	if (pid == 0) {
		munmap(p, LEN);
		c = op() == 0 ? 'y' : 'n';
		_exit(write(pfd[1], &c, 1) != 1);
	}
	if (ok(read(pfd[0], &c, 1) == 1 && c == 'y', "the child's change") ||
	    ok(moved(&g_nf, &g_w),
	       "the counter had not moved when the child's call returned"))
		return 1;
	return ok(waitpid(pid, &status, 0) == pid && status == 0, "child");
}

static int ch_punch_other(char *p)
{
	return in_other_process(p, punch);
}

static int ch_truncate_other(char *p)
{
	return in_other_process(p, truncate0);
}

struct remap_arg {
	char *p;
	int munmap_ok, moved_after_munmap, mmap_ok;
};

static void *remap_thread(void *a)
{
	struct remap_arg *ra = a;
	char *q;

	ra->munmap_ok = munmap(ra->p, LEN) == 0;
	ra->moved_after_munmap = moved(&g_nf, &g_w);
	q = mmap(ra->p, LEN, PROT_READ | PROT_WRITE,
		 MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
	ra->mmap_ok = q == ra->p;
	if (ra->mmap_ok)
		memset(q, 0x77, LEN);
	return NULL;
}

static int ch_thread_remap(char *p)
{
	struct remap_arg ra = { .p = p };
	pthread_t t;

	if (ok(pthread_create(&t, NULL, remap_thread, &ra) == 0, "thread"))
		return 1;
	pthread_join(t, NULL);
	return ok(ra.munmap_ok, "munmap in the other thread") ||
	       ok(ra.moved_after_munmap,
		  "the counter had not moved when the other thread's munmap returned") ||
	       ok(ra.mmap_ok && p[0] == 0x77,
		  "mmap at the same address in the other thread");
}

static int prep_read_zero(char *p)
{
	volatile char *v = p;
	int sum = 0;

	for (size_t i = 0; i < LEN; i += pg)
		sum += v[i];	/* maps the shared zero page */
	return sum;
}

static int ch_write_zero_page(char *p)
{
	p[3 * pg] = 1;
	return 0;
}

static int ch_fork_then_write(char *p)
{
	int pfd[2], status, r;
	char c;
	pid_t pid;

	if (ok(pipe(pfd) == 0, "pipe") || ok((pid = fork()) >= 0, "fork"))
		return 1;
	if (pid == 0) {
		close(pfd[1]);
		_exit(read(pfd[0], &c, 1) < 0);	/* lives until told */
	}
	/* fork write-protects the parent's pages: they stay the same */
	r = ok(!moved(&g_nf, &g_w), "fork moved the counter");
	p[pg] = 1;	/* the parent gets a copy of the page it shares */
	close(pfd[1]);
	waitpid(pid, &status, 0);
	return r;
}

static int ch_write(char *p)
{
	for (int i = 0; i < 10; i++)
		memset(p, i, LEN);
	return 0;
}

static int ch_mprotect(char *p)
{
	if (ok(mprotect(p, LEN, PROT_READ) == 0, "mprotect RO") ||
	    ok(mprotect(p + 2 * pg, pg, PROT_NONE) == 0, "mprotect one page") ||
	    ok(mprotect(p, LEN, PROT_READ | PROT_WRITE) == 0, "mprotect RW"))
		return 1;
	memset(p, 1, LEN);
	return 0;
}

static int prep_unmap_upper_half(char *p)
{
	return munmap(p + LEN, LEN);
}

static int ch_grow_in_place(char *p)
{
	return ok(mremap(p, LEN, 2 * LEN, 0) == p, "mremap grow in place");
}

/* the watched range is [p + LEN, p + 2 * LEN) */
static int ch_outside(char *p)
{
	return madvise(p + LEN - pg, pg, MADV_DONTNEED) ||
	       madvise(p + 2 * LEN, pg, MADV_DONTNEED) ||
	       munmap(p + LEN - pg, pg) || munmap(p + 2 * LEN, pg);
}

static int ch_clear_refs(char *p)
{
	int fd = open("/proc/self/clear_refs", O_WRONLY);

	if (fd < 0)
		return skip("/proc/self/clear_refs: %s", strerror(errno));
	if (write(fd, "4", 1) != 1)
		return skip("clear_refs 4 (soft-dirty) refused: %s",
			    strerror(errno));
	close(fd);
	memset(p, 2, LEN);	/* soft-dirty write faults keep the pages */
	return 0;
}

/* ---- registration basics --------------------------------------------------- */

static int t_info(void)
{
	struct nf nf;
	char buf[32];

	CHECK(nf_open(&nf) == 0, "open/map");
	CHECK(nf.info.abi_version == KREG_NF_ABI_VERSION, "abi_version %u",
	      nf.info.abi_version);
	CHECK(nf.info.max_ranges > 0, "max_ranges 0");
	CHECK(nf.info.counters_size ==
		      ((nf.info.max_ranges * 8ULL + pg - 1) & ~(pg - 1)),
	      "counters_size %llu for %u slots",
	      (unsigned long long)nf.info.counters_size, nf.info.max_ranges);
	if (param_read("max_ranges", buf, sizeof(buf)))
		CHECK(strtoul(buf, NULL, 10) == nf.info.max_ranges,
		      "max_ranges %u, parameter %s", nf.info.max_ranges, buf);
	for (uint32_t i = 0; i < nf.info.max_ranges; i++)
		CHECK(nf.ctr[i] == 0, "fresh counter %u is %llu", i,
		      (unsigned long long)nf.ctr[i]);
	return 0;
}

static int t_register_basics(void)
{
	struct nf nf, nf2;
	struct watch a, b, c, d;
	char *p = anon(LEN);
	char *hole = mmap(NULL, LEN, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS,
			  -1, 0);
	uint64_t old;

	CHECK(p && hole != MAP_FAILED, "mmap");
	CHECK(munmap(hole, LEN) == 0, "munmap");
	CHECK(nf_open(&nf) == 0 && nf_open(&nf2) == 0, "open two descriptors");
	CHECK(watch(&nf, &a, p, LEN) == 0, "REGISTER");
	CHECK(watch(&nf, &b, p + pg, pg) == 0, "REGISTER an overlapping range");
	CHECK(watch(&nf, &c, hole, LEN) == 0, "REGISTER an unmapped range");
	CHECK(watch(&nf2, &d, p, LEN) == 0, "REGISTER on a second descriptor");
	CHECK(a.slot != b.slot && b.slot != c.slot && a.slot != c.slot,
	      "slots %u %u %u", a.slot, b.slot, c.slot);
	CHECK(a.snap && b.snap && c.snap && d.snap, "a zero counter");
	CHECK(a.slot < nf.info.max_ranges && b.slot < nf.info.max_ranges,
	      "slot out of range");

	CHECK(munmap(p + pg, pg) == 0, "munmap");
	EXPECT_MOVED(&nf, &a, "munmap (range a)");
	EXPECT_MOVED(&nf, &b, "munmap (range b, overlapping)");
	EXPECT_MOVED(&nf2, &d, "munmap (second descriptor)");
	EXPECT_STILL(&nf, &c, "munmap of another range");

	old = nf.ctr[c.slot];
	CHECK(nf_unreg(nf.fd, c.slot) == 0, "UNREGISTER");
	CHECK(nf.ctr[c.slot] > old, "UNREGISTER did not bump the counter");
	old = nf.ctr[c.slot];
	CHECK(watch(&nf, &c, hole, LEN) == 0, "REGISTER again");
	CHECK(c.snap > 0 && (nf.ctr[c.slot] == c.snap), "counter mismatch");
	CHECK(!(c.slot == a.slot || c.slot == b.slot), "slot of a live range");
	return 0;
}

/* ---- the read() queue and poll() ---------------------------------------- */

static int read_all(int fd, struct kreg_nf_event *ev, int max)
{
	ssize_t n = read(fd, ev, max * sizeof(*ev));

	if (n < 0)
		return -errno;
	if (n % sizeof(*ev))
		return -1000;
	return n / sizeof(*ev);
}

static int set_nonblock(int fd)
{
	return fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
}

static int t_read_queue(void)
{
	struct nf nf;
	struct watch a, b, c;
	struct kreg_nf_event ev[8];
	char *pa = anon(LEN), *pb = anon(LEN), *pc = anon(LEN);
	int n;

	CHECK(pa && pb && pc, "mmap");
	CHECK(nf_open(&nf) == 0, "open/map");
	CHECK(set_nonblock(nf.fd) == 0, "O_NONBLOCK");
	CHECK(read_all(nf.fd, ev, 8) == -EAGAIN, "empty queue");
	CHECK(watch(&nf, &a, pa, LEN) == 0 && watch(&nf, &b, pb, LEN) == 0 &&
	      watch(&nf, &c, pc, LEN) == 0, "REGISTER");
	CHECK(munmap(pa, LEN) == 0, "munmap a");
	CHECK(madvise(pb, pg, MADV_DONTNEED) == 0, "madvise b");
	CHECK(madvise(pb + 4 * pg, pg, MADV_DONTNEED) == 0, "madvise b again");
	CHECK(munmap(pb + 2 * pg, pg) == 0, "munmap in b");
	n = read_all(nf.fd, ev, 8);
	CHECK(n == 2, "read %d records, expected 2 (a once, b once)", n);
	CHECK(ev[0].slot == a.slot && ev[0].start == a.start &&
	      ev[0].end == a.end && ev[0].flags == 0,
	      "record 0: slot %u [%llx, %llx) flags %u", ev[0].slot,
	      (unsigned long long)ev[0].start, (unsigned long long)ev[0].end,
	      ev[0].flags);
	CHECK(ev[1].slot == b.slot && ev[1].start == b.start &&
	      ev[1].end == b.end && ev[1].flags == 0,
	      "record 1: slot %u [%llx, %llx)", ev[1].slot,
	      (unsigned long long)ev[1].start, (unsigned long long)ev[1].end);
	CHECK(read_all(nf.fd, ev, 8) == -EAGAIN, "queue not empty after read");
	EXPECT_STILL(&nf, &c, "changes elsewhere");
	/* read again after being read: queued again */
	CHECK(madvise(pb, pg, MADV_DONTNEED) == 0, "madvise b");
	n = read_all(nf.fd, ev, 1);
	CHECK(n == 1 && ev[0].slot == b.slot, "b not queued again (%d)", n);
	/* one record per read when the buffer holds one */
	CHECK(munmap(pc, LEN) == 0 && madvise(pb, pg, MADV_DONTNEED) == 0,
	      "munmap c, madvise b");
	CHECK(read_all(nf.fd, ev, 1) == 1 && ev[0].slot == c.slot, "first");
	CHECK(read_all(nf.fd, ev, 1) == 1 && ev[0].slot == b.slot, "second");
	return 0;
}

/* A record keeps its range after UNREGISTER; a new registration does not
 * take over a slot whose record is unread while another slot is free. */
static int t_read_after_unregister(void)
{
	struct nf nf;
	struct watch a, b;
	struct kreg_nf_event ev[4];
	char *pa = anon(LEN), *pb = anon(2 * LEN);
	int n;

	CHECK(pa && pb, "mmap");
	CHECK(nf_open(&nf) == 0 && set_nonblock(nf.fd) == 0, "open");
	CHECK(watch(&nf, &a, pa, LEN) == 0, "REGISTER a");
	CHECK(munmap(pa, LEN) == 0, "munmap a");
	CHECK(nf_unreg(nf.fd, a.slot) == 0, "UNREGISTER a");
	CHECK(watch(&nf, &b, pb, 2 * LEN) == 0, "REGISTER b");
	CHECK(b.slot != a.slot, "b took a's slot while its record is unread");
	CHECK(munmap(pb, pg) == 0, "munmap in b");
	n = read_all(nf.fd, ev, 4);
	CHECK(n == 2, "%d records", n);
	CHECK(ev[0].slot == a.slot && ev[0].start == a.start &&
	      ev[0].end == a.end, "a's record: slot %u [%llx, %llx)",
	      ev[0].slot, (unsigned long long)ev[0].start,
	      (unsigned long long)ev[0].end);
	CHECK(ev[1].slot == b.slot && ev[1].start == b.start &&
	      ev[1].end == b.end, "b's record");
	return 0;
}

/* With every free slot holding an unread record, REGISTER reuses one; a
 * change of the new range widens that record to cover both ranges. */
static int t_read_slot_reuse_widens(void)
{
	struct nf nf;
	struct watch a, b, c;
	struct kreg_nf_event ev[4];
	char *pa = anon(LEN), *pb = anon(LEN), *pc = anon(LEN);
	uint64_t lo, hi;
	int n;

	if (!am_root())
		return skip("needs root to set max_ranges to 2");
	CHECK(pa && pb && pc, "mmap");
	CHECK(param_write("max_ranges", "2") == 0, "max_ranges 2");
	CHECK(nf_open(&nf) == 0 && set_nonblock(nf.fd) == 0, "open");
	CHECK(watch(&nf, &a, pa, LEN) == 0 && munmap(pa, LEN) == 0, "a");
	CHECK(nf_unreg(nf.fd, a.slot) == 0, "UNREGISTER a");
	CHECK(watch(&nf, &b, pb, LEN) == 0 && b.slot != a.slot, "b");
	CHECK(watch(&nf, &c, pc, LEN) == 0, "REGISTER c with no clean slot");
	CHECK(c.slot == a.slot, "c in slot %u, a's was %u", c.slot, a.slot);
	CHECK(madvise(pc, pg, MADV_DONTNEED) == 0, "madvise c");
	EXPECT_MOVED(&nf, &c, "MADV_DONTNEED of c");
	n = read_all(nf.fd, ev, 4);
	lo = a.start < c.start ? a.start : c.start;
	hi = a.end > c.end ? a.end : c.end;
	CHECK(n == 1 && ev[0].slot == a.slot && ev[0].start == lo &&
	      ev[0].end == hi,
	      "%d records; slot %u [%llx, %llx), expected [%llx, %llx)", n,
	      ev[0].slot, (unsigned long long)ev[0].start,
	      (unsigned long long)ev[0].end, (unsigned long long)lo,
	      (unsigned long long)hi);
	return 0;
}

static int t_read_bad_buffer_keeps_record(void)
{
	struct nf nf;
	struct watch a;
	struct kreg_nf_event ev[2];
	char *pa = anon(LEN);
	void *none = mmap(NULL, pg, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS,
			  -1, 0);
	char *ro = mmap(NULL, pg, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

	CHECK(pa && none != MAP_FAILED && ro != MAP_FAILED, "mmap");
	CHECK(nf_open(&nf) == 0 && set_nonblock(nf.fd) == 0, "open");
	CHECK(watch(&nf, &a, pa, LEN) == 0, "REGISTER");
	CHECK(munmap(pa, LEN) == 0, "munmap");
	errno = 0;
	CHECK(read(nf.fd, none, sizeof(ev)) == -1 && errno == EFAULT,
	      "read into a PROT_NONE page");
	CHECK(read(nf.fd, ro, sizeof(ev)) == -1 && errno == EFAULT,
	      "read into a read-only page");
	CHECK(read_all(nf.fd, ev, 2) == 1 && ev[0].slot == a.slot,
	      "the record was lost by the failed reads");
	return 0;
}

struct waiter {
	int fd;
	int mode; /* 0 poll, 1 blocking read */
	volatile int done;
	int result;
	struct kreg_nf_event ev;
};

static void *wait_thread(void *a)
{
	struct waiter *wt = a;

	if (wt->mode == 0) {
		struct pollfd pfd = { .fd = wt->fd, .events = POLLIN };

		wt->result = poll(&pfd, 1, 20000) == 1 ? pfd.revents : -1;
	} else {
		wt->result = read(wt->fd, &wt->ev, sizeof(wt->ev));
	}
	wt->done = 1;
	return NULL;
}

static int wake_test(int mode)
{
	struct nf nf;
	struct watch a;
	struct waiter wt = { 0 };
	struct pollfd pfd;
	pthread_t t;
	char *pa = anon(LEN);

	CHECK(pa, "mmap");
	CHECK(nf_open(&nf) == 0, "open");
	CHECK(watch(&nf, &a, pa, LEN) == 0, "REGISTER");
	pfd = (struct pollfd){ .fd = nf.fd, .events = POLLIN };
	CHECK(poll(&pfd, 1, 0) == 0, "poll says ready on an empty queue");
	wt.fd = nf.fd;
	wt.mode = mode;
	CHECK(pthread_create(&t, NULL, wait_thread, &wt) == 0, "thread");
	usleep(300000);
	CHECK(!wt.done, "the waiter returned before any event (%d)",
	      wt.result);
	CHECK(munmap(pa, LEN) == 0, "munmap");
	pthread_join(t, NULL);
	if (mode == 0) {
		CHECK(wt.result == (POLLIN | POLLRDNORM) ||
			      wt.result == POLLIN,
		      "poll revents %#x", wt.result);
		CHECK(poll(&pfd, 1, 0) == 1, "still ready before the read");
	} else {
		CHECK(wt.result == (int)sizeof(wt.ev), "read %d", wt.result);
		CHECK(wt.ev.slot == a.slot && wt.ev.start == a.start,
		      "record");
		CHECK(poll(&pfd, 1, 0) == 0, "ready after the queue was read");
	}
	return 0;
}

static int t_poll_wakes(void)
{
	return wake_test(0);
}

static int t_read_blocks_until_event(void)
{
	return wake_test(1);
}

/* ---- bad input ----------------------------------------------------------- */

static int t_register_bad_args(void)
{
	struct nf nf;
	char *p = anon(LEN);
	long r0 = sysval("ranges");
	const uint64_t top = 1ULL << 63;
	struct {
		uint64_t start, len;
		uint32_t flags;
		const char *what;
	} bad[] = {
		{ (uintptr_t)p, 0, 0, "zero length" },
		{ (uintptr_t)p + 1, LEN, 0, "unaligned start" },
		{ (uintptr_t)p + 8, LEN, 0, "unaligned start (8)" },
		{ (uintptr_t)p, LEN - 1, 0, "unaligned length" },
		{ (uintptr_t)p, pg / 2, 0, "half a page" },
		{ (uintptr_t)p, LEN, 1, "flags 1" },
		{ (uintptr_t)p, LEN, 0x80000000u, "flags high bit" },
		{ -(uint64_t)pg, 2 * pg, 0, "wrap-around" },
		{ pg, -(uint64_t)pg, 0, "wrap-around (huge length)" },
		{ -(uint64_t)pg, pg, 0, "last page of the address space" },
		{ 0xffff800000000000ULL, pg, 0, "kernel address" },
		{ top, pg, 0, "above TASK_SIZE (2^63)" },
		{ pg, top, 0, "ending above TASK_SIZE" },
		{ 0x7ffffffff000ULL, 1ULL << 57, 0, "across TASK_SIZE" },
	};

	CHECK(p, "mmap");
	CHECK(nf_open(&nf) == 0, "open");
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		int r = nf_reg(nf.fd, bad[i].start, bad[i].len, bad[i].flags,
			       NULL, NULL);

		CHECK(r == -EINVAL, "%s: got %d, expected -EINVAL", bad[i].what,
		      r);
	}
	CHECK(sysval("ranges") == r0, "a refused REGISTER left a range");
	/* the limits themselves are fine: page 0 .. just below the top */
	CHECK(nf_reg(nf.fd, 0, pg, 0, NULL, NULL) == 0, "REGISTER page 0");
	CHECK(nf_reg(nf.fd, 0x7ffffffff000ULL - pg, pg, 0, NULL, NULL) == 0,
	      "REGISTER the last user page below 47 bits");
	return 0;
}

static int t_unregister_bad_args(void)
{
	struct nf nf;
	struct watch a;
	char *p = anon(LEN);
	struct kreg_nf_unregister u;

	CHECK(p, "mmap");
	CHECK(nf_open(&nf) == 0, "open");
	CHECK(watch(&nf, &a, p, LEN) == 0, "REGISTER");
	CHECK(nf_unreg(nf.fd, nf.info.max_ranges) == -EINVAL,
	      "slot max_ranges");
	CHECK(nf_unreg(nf.fd, UINT32_MAX) == -EINVAL, "slot UINT32_MAX");
	CHECK(nf_unreg(nf.fd, nf.info.max_ranges - 1) == -ENOENT,
	      "last slot, never used");
	CHECK(nf_unreg(nf.fd, a.slot + 1) == -ENOENT, "a free slot");
	u = (struct kreg_nf_unregister){ .slot = a.slot, .flags = 1 };
	CHECK(ioctl(nf.fd, KREG_NF_IOC_UNREGISTER, &u) == -1 &&
		      errno == EINVAL,
	      "flags 1");
	EXPECT_STILL(&nf, &a, "refused UNREGISTERs");
	CHECK(nf_unreg(nf.fd, a.slot) == 0, "UNREGISTER");
	CHECK(nf_unreg(nf.fd, a.slot) == -ENOENT, "double UNREGISTER");
	return 0;
}

static int t_bad_pointers(void)
{
	struct nf nf;
	char *p = anon(LEN);
	long r0 = sysval("ranges");
	void *bad[] = { NULL, (void *)8, (void *)-4096L,
			(void *)0xffff888000000000ULL };
	struct kreg_nf_register *ro;
	void *none;

	CHECK(p, "mmap");
	CHECK(nf_open(&nf) == 0, "open");
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		CHECK(ioctl(nf.fd, KREG_NF_IOC_INFO, bad[i]) == -1 &&
			      errno == EFAULT, "INFO %p", bad[i]);
		CHECK(ioctl(nf.fd, KREG_NF_IOC_REGISTER, bad[i]) == -1 &&
			      errno == EFAULT, "REGISTER %p", bad[i]);
		CHECK(ioctl(nf.fd, KREG_NF_IOC_UNREGISTER, bad[i]) == -1 &&
			      errno == EFAULT, "UNREGISTER %p", bad[i]);
	}
	none = mmap(NULL, pg, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	CHECK(none != MAP_FAILED, "mmap");
	CHECK(ioctl(nf.fd, KREG_NF_IOC_REGISTER, none) == -1 &&
		      errno == EFAULT, "REGISTER from a PROT_NONE page");
	/* readable but not writable: the range is taken back */
	ro = mmap(NULL, pg, PROT_READ | PROT_WRITE,
		  MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	CHECK(ro != MAP_FAILED, "mmap");
	*ro = (struct kreg_nf_register){ .start = (uintptr_t)p, .len = LEN };
	CHECK(mprotect(ro, pg, PROT_READ) == 0, "mprotect");
	CHECK(ioctl(nf.fd, KREG_NF_IOC_REGISTER, ro) == -1 && errno == EFAULT,
	      "REGISTER with a read-only argument");
	CHECK(sysval("ranges") == r0,
	      "REGISTER that could not return its slot kept the range (%ld, was %ld)",
	      sysval("ranges"), r0);
	/* and every slot is free again */
	for (uint32_t s = 0; s < 4; s++)
		CHECK(nf_unreg(nf.fd, s) == -ENOENT, "slot %u is registered", s);
	return 0;
}

static int t_unknown_ioctl(void)
{
	struct nf nf;
	char buf[256] = { 0 };
	unsigned long cmds[] = {
		0, _IO('K', 0x40), _IO(KREG_NF_IOC_MAGIC, 0x43),
		_IOR(KREG_NF_IOC_MAGIC, 0x40, uint64_t),
		_IOWR(KREG_NF_IOC_MAGIC, 0x41, struct kreg_nf_event),
		_IOW(KREG_NF_IOC_MAGIC, 0x42, uint32_t),
		_IOR('X', 0x40, struct kreg_nf_info), FIONREAD, 0xffffffffUL,
	};

	CHECK(nf_open(&nf) == 0, "open");
	for (size_t i = 0; i < sizeof(cmds) / sizeof(cmds[0]); i++)
		CHECK(ioctl(nf.fd, cmds[i], buf) == -1 && errno == ENOTTY,
		      "ioctl %#lx", cmds[i]);
	return 0;
}

static int t_read_small(void)
{
	struct nf nf;
	struct watch a;
	char *p = anon(LEN);
	char buf[64];

	CHECK(p, "mmap");
	CHECK(nf_open(&nf) == 0 && set_nonblock(nf.fd) == 0, "open");
	CHECK(read(nf.fd, buf, 0) == -1 && errno == EINVAL, "read 0 bytes");
	CHECK(read(nf.fd, buf, 1) == -1 && errno == EINVAL, "read 1 byte");
	CHECK(read(nf.fd, buf, sizeof(struct kreg_nf_event) - 1) == -1 &&
		      errno == EINVAL, "read one byte less than a record");
	CHECK(watch(&nf, &a, p, LEN) == 0 && munmap(p, LEN) == 0, "event");
	CHECK(read(nf.fd, buf, sizeof(struct kreg_nf_event) - 1) == -1 &&
		      errno == EINVAL, "read one byte less, a record queued");
	/* a record and a half: one whole record */
	CHECK(read(nf.fd, buf, sizeof(struct kreg_nf_event) * 3 / 2) ==
		      sizeof(struct kreg_nf_event), "read 1.5 records");
	CHECK(lseek(nf.fd, 0, SEEK_SET) == -1 && errno == ESPIPE, "lseek");
	return 0;
}

static int t_mmap_bad(void)
{
	struct nf nf;
	size_t sz;
	char *m;
	int status;
	pid_t pid;

	CHECK(nf_open(&nf) == 0, "open");
	sz = nf.info.counters_size;
	CHECK(mmap(NULL, sz, PROT_READ | PROT_WRITE, MAP_SHARED, nf.fd, 0) ==
		      MAP_FAILED && errno == EACCES, "writable shared mapping");
	CHECK(mmap(NULL, sz, PROT_READ | PROT_WRITE, MAP_PRIVATE, nf.fd, 0) ==
		      MAP_FAILED && errno == EACCES, "writable private mapping");
	CHECK(mmap(NULL, pg, PROT_READ, MAP_SHARED, nf.fd, pg) == MAP_FAILED &&
		      errno == EINVAL, "offset one page");
	CHECK(mmap(NULL, pg, PROT_READ, MAP_SHARED, nf.fd, sz) == MAP_FAILED &&
		      errno == EINVAL, "offset counters_size");
	CHECK(mmap(NULL, sz + pg, PROT_READ, MAP_SHARED, nf.fd, 0) ==
		      MAP_FAILED && errno == EINVAL, "one page too large");
	CHECK(mmap(NULL, 1UL << 40, PROT_READ, MAP_SHARED, nf.fd, 0) ==
		      MAP_FAILED, "1 TiB");
	/* a good one cannot become writable or grow */
	m = mmap(NULL, sz, PROT_READ, MAP_SHARED, nf.fd, 0);
	CHECK(m != MAP_FAILED, "read-only mapping");
	CHECK(mprotect(m, sz, PROT_READ | PROT_WRITE) == -1 && errno == EACCES,
	      "mprotect to writable");
	CHECK(mremap(m, sz, sz + pg, 0) == MAP_FAILED, "mremap grow");
	CHECK(mremap(m, sz, sz + pg, MREMAP_MAYMOVE) == MAP_FAILED,
	      "mremap grow and move");
	m = mmap(NULL, pg, PROT_READ, MAP_PRIVATE, nf.fd, 0);
	CHECK(m != MAP_FAILED, "a smaller private read-only mapping");
	CHECK(mprotect(m, pg, PROT_READ | PROT_WRITE) == -1,
	      "mprotect private mapping to writable");
	pid = fork();
	CHECK(pid >= 0, "fork");
	if (pid == 0) {
		/* keep the parent's mapping address: re-map it here */
		char *c;
		int fd = open(KREG_NF_DEVICE, O_RDWR);

		c = mmap(NULL, pg, PROT_READ, MAP_SHARED, fd, 0);
		if (c == MAP_FAILED)
			_exit(3);
		signal(SIGSEGV, SIG_DFL);
		*(volatile char *)c = 1;	/* must die here */
		_exit(0);
	}
	CHECK(waitpid(pid, &status, 0) == pid, "waitpid");
	CHECK(WIFSIGNALED(status) && WTERMSIG(status) == SIGSEGV,
	      "a write to the counters did not fault (status %#x)", status);
	return 0;
}

static int t_device_node(void)
{
	struct stat st;
	int fd;

	CHECK(stat(KREG_NF_DEVICE, &st) == 0, "stat");
	CHECK(S_ISCHR(st.st_mode), "not a character device");
	CHECK((st.st_mode & 07777) == 0666, "mode %o", st.st_mode & 07777);
	CHECK(sysval("contexts") >= 0 && sysval("ranges") >= 0,
	      "no live counters in " SYSDIR);
	fd = open(KREG_NF_DEVICE, O_RDONLY | O_CLOEXEC);
	CHECK(fd >= 0, "open read-only");
	CHECK(nf_reg(fd, 0, pg, 0, NULL, NULL) == 0,
	      "REGISTER on a read-only descriptor");
	return 0;
}

/* ---- limits and leaks ------------------------------------------------------ */

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

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return x < y ? -1 : x > y;
}

static double median(double *v, int n)
{
	qsort(v, n, sizeof(*v), cmp_double);
	return v[n / 2];
}

/* ---- a shared node: memory, per-user limits, other users' cost ----------- */

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

/* ---- synchronous delivery (KREG_NF_IOC_SYNC_*) ---------------------------
 * Pages are pinned the way a NIC's registration pins them: io_uring fixed
 * buffers (pin_user_pages with FOLL_LONGTERM, as ib_umem_get). The
 * handler and the dispatcher thread drain like libucm_kernel does: DRAIN,
 * report (here: note whether the watched range was among them), DRAIN
 * again with the ack. "reported" is set before the ack, so a thread the
 * module let go before it saw the report is a failure of the module. */

#define SY_SIGNO (SIGRTMIN + 4)

static struct {
	int fd;
	uint64_t want_start, want_end;	/* the range a test waits for */
	uint64_t want2_start, want2_end;
	volatile int reported, reported2;
	volatile int handler_runs;
	int delay_ms;			/* the handler sleeps first */
	int disp_delay_ms;		/* the dispatcher sleeps first */
	bool close_in_handler;		/* the handler closes fd instead */
	bool exit_in_handler;		/* the handler ends the process */
	char *inner;			/* the handler unmaps it (reentry) */
	volatile bool disp_stop;
	pthread_t disp;
	bool disp_running;
} g_sy;

static void sy_note(const struct kreg_nf_range *r, uint32_t n)
{
	for (uint32_t i = 0; i < n; i++) {
		if (r[i].start < g_sy.want_end && g_sy.want_start < r[i].end)
			g_sy.reported = 1;
		if (r[i].start < g_sy.want2_end && g_sy.want2_start < r[i].end)
			g_sy.reported2 = 1;
	}
}

/* 0, or -errno of the first DRAIN that failed */
static int sy_drain(void)
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
		ack = d.seq;
	}
}

static void sy_handler(int sig)
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

static void *sy_dispatcher(void *a)
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

static void sy_handler(int sig);
/* the handler SYNC_START names (the bench's own drains and times) */
static void (*g_sy_handler)(int sig) = sy_handler;

static int sy_start_ioctl(uint32_t signo, uint32_t timeout_ms)
{
	struct kreg_nf_sync_start st = { .signo = signo,
					 .gate_timeout_ms = timeout_ms,
					 .handler = signo ? (uintptr_t)g_sy_handler : 0 };

	return ioctl(g_sy.fd, KREG_NF_IOC_SYNC_START, &st) ? -errno : 0;
}

/* A descriptor with synchronous delivery on SY_SIGNO (signo 0: none), and
 * the dispatcher thread if asked for. */
static int sy_start(int signo, uint32_t timeout_ms, bool dispatcher)
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

static void sy_stop_dispatcher(void)
{
	if (g_sy.disp_running) {
		g_sy.disp_stop = true;
		pthread_join(g_sy.disp, NULL);
		g_sy.disp_running = false;
	}
}

static int sy_stats(struct kreg_nf_sync_stats *st)
{
	memset(st, 0, sizeof(*st));
	return ioctl(g_sy.fd, KREG_NF_IOC_SYNC_STATS, st) ? -errno : 0;
}

static struct io_uring g_ring;	/* the first pin's: io_uring madvise uses it */
static bool g_ring_up;

/* Pins [p, p + len) as a NIC registration would (one ring a buffer: a ring
 * takes one REGISTER_BUFFERS); 77 with the reason. */
static int pin(char *p, size_t len)
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
static char *sy_buffer(bool pinned, int *rc)
{
	char *p = anon(LEN);

	*rc = p ? 0 : 1;
	if (p && pinned)
		*rc = pin(p, LEN);
	g_sy.want_start = (uintptr_t)p;
	g_sy.want_end = (uintptr_t)p + LEN;
	return p;
}

/* sy_start, then a pinned buffer in *p; 0, 77 or a failure */
static int sy_setup(int signo, uint32_t timeout_ms, bool dispatcher, char **p)
{
	int rc;

	CHECK(sy_start(signo, timeout_ms, dispatcher) == 0, "SYNC_START");
	*p = sy_buffer(true, &rc);
	return rc;
}

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

/*
 * One change in this thread: with pinned pages it is reported by this
 * thread's handler before the call returns; mprotect and memory never
 * pinned are not reported at all.
 */
struct sy_case {
	int (*change)(char *p);
	bool pinned, reported;
	const char *what;
};

static int sy_order(const struct sy_case *c)
{
	bool pinned = c->pinned, reported = c->reported;
	const char *what = c->what;
	struct kreg_nf_sync_stats st;
	int rc;
	char *p;

	CHECK(sy_start(SY_SIGNO, 10000, false) == 0, "SYNC_START");
	p = sy_buffer(pinned, &rc);
	if (rc)
		return rc;
	CHECK(c->change(p) == 0, "%s", what);
	CHECK(g_sy.reported == reported, "%s: reported %d before it returned, want %d (handler ran %d times)",
	      what, g_sy.reported, reported, g_sy.handler_runs);
	CHECK(sy_stats(&st) == 0, "SYNC_STATS");
	if (reported)
		CHECK(st.signalled >= 1 && st.queued >= 1,
		      "signalled %llu queued %llu", (unsigned long long)st.signalled,
		      (unsigned long long)st.queued);
	else if (!pinned)
		CHECK(st.queued == 0 && st.unpinned >= 1,
		      "memory never pinned: queued %llu unpinned %llu",
		      (unsigned long long)st.queued,
		      (unsigned long long)st.unpinned);
	else
		CHECK(st.queued == 0, "%s queued %llu", what,
		      (unsigned long long)st.queued);
	return 0;
}

static void *sy_unmapper(void *p)
{
	return (void *)(intptr_t)munmap(p, LEN);
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
	for (;;) {
		q = mmap(p, LEN, PROT_READ | PROT_WRITE,
			 MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
		if (q == p)
			break;
		CHECK(q == MAP_FAILED && errno == EEXIST, "mmap NOREPLACE");
		tries++;
	}
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
	CHECK(sy_stats(&st) == 0 && st.self_gated == 1 && st.signalled == 0,
	      "self_gated %llu signalled %llu",
	      (unsigned long long)st.self_gated, (unsigned long long)st.signalled);
	CHECK(g_sy.handler_runs == 0, "the handler ran in a thread that blocks it");
	sy_stop_dispatcher();
	return 0;
}

static void sy_other_handler(int sig)
{
	(void)sig;
}

/* Another handler installed over the draining one after SYNC_START: the
 * changing thread is held, as if it blocked the signal, until the
 * dispatcher reported. */
static int t_sync_replaced_handler(void)
{
	struct sigaction sa = { .sa_handler = sy_other_handler };
	struct kreg_nf_sync_stats st;
	int rc;
	char *p;

	rc = sy_setup(SY_SIGNO, 10000, true, &p);
	if (rc)
		return rc;
	sigemptyset(&sa.sa_mask);
	CHECK(sigaction(SY_SIGNO, &sa, NULL) == 0, "sigaction");
	CHECK(munmap(p, LEN) == 0, "munmap");
	CHECK(g_sy.reported, "munmap returned before the report");
	CHECK(sy_stats(&st) == 0 && st.self_gated == 1 && st.signalled == 0,
	      "self_gated %llu signalled %llu",
	      (unsigned long long)st.self_gated, (unsigned long long)st.signalled);
	sy_stop_dispatcher();
	return 0;
}

/* No signal, no dispatcher: the changing thread is let go after the gate
 * timeout, and that is counted. */
static int t_sync_gate_timeout(void)
{
	struct kreg_nf_sync_stats st;
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
	CHECK(sy_stats(&st) == 0 && st.gate_timeouts == 1 && st.self_gated == 1,
	      "gate_timeouts %llu self_gated %llu",
	      (unsigned long long)st.gate_timeouts,
	      (unsigned long long)st.self_gated);
	CHECK(ms >= 40 && ms < 5000, "held %.1f ms, timeout 50 ms", ms);
	CHECK(!g_sy.reported, "reported with nobody draining");
	/* what it was held for is still queued: a late DRAIN reports it */
	CHECK(sy_drain() == 0 && g_sy.reported, "queued range lost after the timeout");
	return 0;
}

/* io_uring's madvise runs in an io-wq worker: no signal can reach the
 * change; it is counted late, and the submitter, held at its return from
 * io_uring_enter, sees the completion only after the dispatcher's report. */
static int t_sync_io_uring_madvise(void)
{
	struct kreg_nf_sync_stats st;
	struct io_uring_cqe *cqe;
	struct io_uring_sqe *sqe;
	int rc;
	char *p;

	rc = sy_setup(SY_SIGNO, 10000, true, &p);
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
 * to it (its own changes). */
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
		_exit(munmap(p, LEN) ? 3 : 0);
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
	int rc;
	char *p, *q;

	rc = sy_setup(SY_SIGNO, 20000, false, &p);
	if (rc)
		return rc;
	g_sy.delay_ms = 100;
	g_sy.close_in_handler = true;
	t0 = now_ns();
	CHECK(pthread_create(&b, NULL, sy_unmapper, p) == 0, "pthread_create");
	do {
		q = mmap(p, LEN, PROT_READ | PROT_WRITE,
			 MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
	} while (q == MAP_FAILED && errno == EEXIST);
	CHECK(q == p, "mmap NOREPLACE");
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
	struct kreg_nf_sync_stats st;
	struct kreg_nf_sync_start bad[] = {
		/* each bad in one field only: .handler is set with a signo */
		{ .signo = SIGKILL, .gate_timeout_ms = 10, .handler = 1 },
		{ .signo = SIGSTOP, .gate_timeout_ms = 10, .handler = 1 },
		{ .signo = 65, .gate_timeout_ms = 10, .handler = 1 },
		{ .signo = SY_SIGNO, .gate_timeout_ms = 0, .handler = 1 },
		{ .signo = SY_SIGNO, .gate_timeout_ms = 60001, .handler = 1 },
		{ .signo = SY_SIGNO, .gate_timeout_ms = 10, .flags = 1, .handler = 1 },
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
	close(g_sy.fd);
	/* signo 0: nothing is signalled, so a DRAIN sees the range queued */
	CHECK(sy_start(0, 10, false) == 0, "SYNC_START");
	CHECK(sy_start_ioctl(0, 10) == -EBUSY, "a second START");
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
	CHECK(sy_start_ioctl(SY_SIGNO, 10) == 0, "START after STOP");
	return 0;
}

/* ---- the table ----------------------------------------------------------- */

#define SEM(name, ...) \
	{ name, NULL, &(const struct sem){ __VA_ARGS__ }, NULL }
#define SYNC(name, ...) \
	{ name, NULL, NULL, &(const struct sy_case){ __VA_ARGS__ } }

static const struct test {
	const char *name;
	int (*fn)(void);
	const struct sem *sem;		/* or a semantic test */
	const struct sy_case *sync;	/* or a synchronous delivery case */
} tests[] = {
	{ "device-node", t_device_node, NULL, NULL },
	{ "info", t_info, NULL, NULL },
	{ "register-basics", t_register_basics, NULL, NULL },
	SEM("munmap-whole", .change = ch_munmap_whole, .moves = true,
	    .what = "munmap of the whole range"),
	SEM("munmap-page-inside", .change = ch_munmap_page, .moves = true,
	    .what = "munmap of one page inside"),
	SEM("map-fixed-over", .change = ch_map_fixed, .moves = true,
	    .what = "mmap MAP_FIXED over the range"),
	SEM("mremap-move", .change = ch_mremap_move, .moves = true,
	    .what = "mremap move"),
	SEM("mremap-dontunmap", .change = ch_mremap_dontunmap, .moves = true,
	    .what = "mremap MREMAP_DONTUNMAP"),
	SEM("mremap-shrink", .change = ch_mremap_shrink, .moves = true,
	    .what = "mremap shrink"),
	SEM("madvise-dontneed", .change = ch_madv_dontneed, .moves = true,
	    .what = "MADV_DONTNEED"),
	SEM("madvise-free", .change = ch_madv_free, .moves = true,
	    .what = "MADV_FREE"),
	SEM("memfd-punch-hole", .kind = MEMFD, .change = ch_punch,
	    .moves = true, .what = "fallocate(PUNCH_HOLE)"),
	SEM("memfd-ftruncate", .kind = MEMFD, .change = ch_truncate,
	    .moves = true, .what = "ftruncate(0)"),
	SEM("memfd-punch-hole-other-process", .kind = MEMFD,
	    .change = ch_punch_other, .moves = true,
	    .what = "fallocate(PUNCH_HOLE) in another process"),
	SEM("memfd-ftruncate-other-process", .kind = MEMFD,
	    .change = ch_truncate_other, .moves = true,
	    .what = "ftruncate(0) in another process"),
	SEM("thread-munmap-mmap", .change = ch_thread_remap, .moves = true,
	    .what = "another thread's munmap + mmap"),
	SEM("zero-page-cow", .kind = FRESH, .prep = prep_read_zero,
	    .change = ch_write_zero_page, .moves = true,
	    .what = "a write to a zero-page mapping (COW)"),
	SEM("fork-cow-write", .change = ch_fork_then_write, .moves = true,
	    .what = "a parent write while a forked child lives"),
	SEM("no-bump-write-populated", .change = ch_write,
	    .what = "writes to populated pages"),
	SEM("no-bump-mprotect", .change = ch_mprotect,
	    .what = "mprotect, then writes"),
	SEM("no-bump-mremap-grow-in-place", .map_len = 2 * LEN, .len = LEN,
	    .prep = prep_unmap_upper_half, .change = ch_grow_in_place,
	    .what = "mremap grow in place"),
	SEM("no-bump-unmap-outside", .map_len = 3 * LEN, .off = LEN,
	    .len = LEN, .change = ch_outside,
	    .what = "changes of the pages just outside"),
	SEM("no-bump-clear-refs-soft-dirty", .change = ch_clear_refs,
	    .what = "clear_refs soft-dirty, then writes"),
	{ "read-queue", t_read_queue, NULL, NULL },
	{ "read-after-unregister", t_read_after_unregister, NULL, NULL },
	{ "read-slot-reuse-widens", t_read_slot_reuse_widens, NULL, NULL },
	{ "read-bad-buffer-keeps-record", t_read_bad_buffer_keeps_record, NULL, NULL },
	{ "poll-wakes", t_poll_wakes, NULL, NULL },
	{ "read-blocks-until-event", t_read_blocks_until_event, NULL, NULL },
	{ "register-bad-args", t_register_bad_args, NULL, NULL },
	{ "unregister-bad-args", t_unregister_bad_args, NULL, NULL },
	{ "bad-pointers", t_bad_pointers, NULL, NULL },
	{ "unknown-ioctl", t_unknown_ioctl, NULL, NULL },
	{ "read-small", t_read_small, NULL, NULL },
	{ "mmap-bad", t_mmap_bad, NULL, NULL },
	{ "enospc-per-descriptor", t_enospc_per_descriptor, NULL, NULL },
	{ "enospc-global", t_enospc_global, NULL, NULL },
	{ "max-ranges-param", t_max_ranges_param, NULL, NULL },
	{ "fork-child-eperm", t_fork_child_eperm, NULL, NULL },
	{ "close-frees", t_close_frees, NULL, NULL },
	{ "exit-frees", t_exit_frees, NULL, NULL },
	{ "sigkill-mid-register", t_sigkill_mid_register, NULL, NULL },
	{ "stress-threads", t_stress_threads, NULL, NULL },
	{ "unprivileged", t_unprivileged, NULL, NULL },
	{ "open-memory-lazy", t_open_memory_lazy, NULL, NULL },
	{ "user-limits", t_user_limits, NULL, NULL },
	{ "user-memory-limit", t_user_memory_limit, NULL, NULL },
	{ "other-user-cost", t_other_user_cost, NULL, NULL },
	{ "unregister-order", t_unregister_order, NULL, NULL },
	{ "counters-not-pinnable", t_counters_not_pinnable, NULL, NULL },
	{ "overlap-cap", t_overlap_cap, NULL, NULL },
	SYNC("sync-munmap", sy_ch_munmap, true, true, "munmap"),
	SYNC("sync-raw-munmap", sy_ch_raw_munmap, true, true,
	     "syscall(SYS_munmap)"),
	SYNC("sync-madvise-dontneed", sy_ch_dontneed, true, true,
	     "MADV_DONTNEED"),
	SYNC("sync-map-fixed-over", sy_ch_map_fixed, true, true,
	     "mmap MAP_FIXED over"),
	SYNC("sync-mremap-fixed", sy_ch_mremap, true, true,
	     "mremap MREMAP_FIXED"),
	SYNC("sync-no-report-mprotect", sy_ch_mprotect, true, false,
	     "mprotect"),
	SYNC("sync-no-report-unpinned", sy_ch_munmap, false, false,
	     "munmap of memory never pinned"),
	{ "sync-other-thread-held", t_sync_other_thread_held, NULL, NULL },
	{ "sync-blocked-signal", t_sync_blocked_signal, NULL, NULL },
	{ "sync-replaced-handler", t_sync_replaced_handler, NULL, NULL },
	{ "sync-gate-timeout", t_sync_gate_timeout, NULL, NULL },
	{ "sync-io-uring-madvise", t_sync_io_uring_madvise, NULL, NULL },
	{ "sync-handler-reentered", t_sync_handler_reentered, NULL, NULL },
	{ "sync-fork-child", t_sync_fork_child, NULL, NULL },
	{ "sync-exit-while-held", t_sync_exit_while_held, NULL, NULL },
	{ "sync-sigkill-while-held", t_sync_sigkill_while_held, NULL, NULL },
	{ "sync-close-lets-go", t_sync_close_lets_go, NULL, NULL },
	{ "sync-bad-args", t_sync_bad_args, NULL, NULL },
};

#define NTESTS (sizeof(tests) / sizeof(tests[0]))

/* Runs one test in a child; restores the module parameters it may change. */
static const char *const params[] = {
	"max_ranges", "max_total_ranges", "max_files_per_user",
	"max_ranges_per_user", "max_kib_per_user", "max_overlap",
};
#define NPARAMS (sizeof(params) / sizeof(params[0]))

static int run_one(const struct test *t)
{
	char saved[NPARAMS][32] = { "" };
	int status, rc;
	pid_t pid;

	for (size_t i = 0; i < NPARAMS; i++)
		param_read(params[i], saved[i], sizeof(saved[i]));
	skip_reason[0] = 0;
	fflush(stdout);
	pid = fork();
	if (pid == 0) {
		alarm(300);
		_exit(t->sem ? semantic(t->sem) :
		      t->sync ? sy_order(t->sync) : t->fn());
	}
	if (pid < 0 || waitpid(pid, &status, 0) != pid)
		rc = 1;
	else if (WIFEXITED(status))
		rc = WEXITSTATUS(status);
	else {
		printf("  killed by signal %d\n", WTERMSIG(status));
		rc = 1;
	}
	if (am_root()) {
		char now[32] = "";

		for (size_t i = 0; i < NPARAMS; i++)
			if (saved[i][0] &&
			    param_read(params[i], now, sizeof(now)) &&
			    strcmp(now, saved[i]))
				param_write(params[i], saved[i]);
	}
	if (rc == 0)
		printf("PASS %s\n", t->name);
	else if (rc == 77)
		printf("SKIP %s: %s\n", t->name, skip_reason);
	else
		printf("FAIL %s\n", t->name);
	fflush(stdout);
	return rc;
}

/* ---- cost figures ------------------------------------------------------- */

static int bench(void)
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

static int bench_sync(void)
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

int main(int argc, char **argv)
{
	int failed_n = 0, skipped = 0, ran = 0;

	pg = sysconf(_SC_PAGESIZE);
	setvbuf(stdout, NULL, _IOLBF, 0);
	skip_reason = mmap(NULL, 4096, PROT_READ | PROT_WRITE,
			   MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	if (skip_reason == MAP_FAILED)
		return 1;
	if (argc > 1 && !strcmp(argv[1], "--bench-sync"))
		return bench_sync();
	if (argc > 1 && !strcmp(argv[1], "--list")) {
		for (size_t i = 0; i < NTESTS; i++)
			printf("%s\n", tests[i].name);
		return 0;
	}
	if (access(KREG_NF_DEVICE, F_OK) != 0) {
		printf("skip: %s absent: the kreg_notifier module is not loaded "
		       "(make check-kmod runs these tests in the Soft-RoCE VM "
		       "with it)\n", KREG_NF_DEVICE);
		return 77;
	}
	if (argc > 1 && !strcmp(argv[1], "--bench"))
		return bench();
	for (size_t i = 0; i < NTESTS; i++) {
		bool want = argc == 1;

		for (int a = 1; a < argc; a++)
			want |= !strcmp(argv[a], tests[i].name);
		if (!want)
			continue;
		ran++;
		switch (run_one(&tests[i])) {
		case 0: break;
		case 77: skipped++; break;
		default: failed_n++; break;
		}
	}
	if (!ran) {
		fprintf(stderr, "no such test (--list names them)\n");
		return 2;
	}
	if (failed_n)
		return 1;
	return skipped == ran ? 77 : 0;
}
