/*
 * Semantics: which changes of a registered range move its counter before
 * the changing call returns, and which do not.
 */
#include "nf_test.h"

/*
 * One watched range [p + off, p + off + len) in a mapping of map_len bytes
 * (private anonymous and populated, or left unpopulated, or a MAP_SHARED
 * memfd); prep runs before REGISTER, change after it in this thread; then
 * the counter must have moved (or not) by the time change returned. A change
 * returns 0, 77 to skip, or anything else after saying what went wrong. */

static struct nf g_nf;
static struct watch g_w;
static int g_mfd = -1;

struct sem {
	size_t map_len;		/* default LEN */
	size_t off, len;	/* default: the rest of the mapping */
	enum { POPULATED, FRESH, MEMFD } kind;
	int (*prep)(char *p);
	int (*change)(char *p);
	bool moves;
	const char *what;
};

int semantic(const struct sem *s)
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


const struct nf_test nf_tests_semantics[] = {
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
};
const size_t nf_n_semantics = sizeof(nf_tests_semantics) / sizeof(nf_tests_semantics[0]);
