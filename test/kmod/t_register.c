/*
 * The device node, INFO and registration basics.
 */
#include "nf_test.h"

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


const struct nf_test nf_tests_basics[] = {
	{ "device-node", t_device_node, NULL, NULL },
	{ "info", t_info, NULL, NULL },
	{ "register-basics", t_register_basics, NULL, NULL },
};
const size_t nf_n_basics = sizeof(nf_tests_basics) / sizeof(nf_tests_basics[0]);
