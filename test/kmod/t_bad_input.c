/*
 * Bad input: arguments, pointers, unknown commands, mappings.
 */
#include "nf_test.h"


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



const struct nf_test nf_tests_bad_input[] = {
	{ "register-bad-args", t_register_bad_args, NULL, NULL },
	{ "unregister-bad-args", t_unregister_bad_args, NULL, NULL },
	{ "bad-pointers", t_bad_pointers, NULL, NULL },
	{ "unknown-ioctl", t_unknown_ioctl, NULL, NULL },
	{ "read-small", t_read_small, NULL, NULL },
	{ "mmap-bad", t_mmap_bad, NULL, NULL },
};
const size_t nf_n_bad_input = sizeof(nf_tests_bad_input) / sizeof(nf_tests_bad_input[0]);
