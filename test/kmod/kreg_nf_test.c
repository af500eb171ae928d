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
 * The tests live in files by concern (nf_test.h says which); this file is
 * the runner: the table they make together, one child a test, main().
 */
#include "nf_test.h"

/* ---- the table: each concern's part, in order ---------------------------- */

static const struct {
	const struct nf_test *tests;
	const size_t *n;
} parts[] = {
#define NF_PART(part) { nf_tests_##part, &nf_n_##part },
	NF_TEST_PARTS(NF_PART)
};

static size_t tests_n(void)
{
	size_t n = 0;

	for (size_t p = 0; p < sizeof(parts) / sizeof(parts[0]); p++)
		n += *parts[p].n;
	return n;
}

static const struct nf_test *test_at(size_t i)
{
	for (size_t p = 0; p < sizeof(parts) / sizeof(parts[0]); p++) {
		if (i < *parts[p].n)
			return &parts[p].tests[i];
		i -= *parts[p].n;
	}
	return NULL;
}

/* Runs one test in a child; restores the module parameters it may change. */
static const char *const params[] = {
	"max_ranges", "max_total_ranges", "max_files_per_user",
	"max_ranges_per_user", "max_kib_per_user", "max_overlap",
};
#define NPARAMS (sizeof(params) / sizeof(params[0]))

static int run_one(const struct nf_test *t)
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


int main(int argc, char **argv)
{
	int failed_n = 0, skipped = 0, ran = 0;

	pg = sysconf(_SC_PAGESIZE);
	setvbuf(stdout, NULL, _IOLBF, 0);
	skip_reason = mmap(NULL, 4096, PROT_READ | PROT_WRITE,
			   MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	if (skip_reason == MAP_FAILED)
		return 1;
	/* the new image of sync-exec-inherited: how long after execve? */
	if (argc > 2 && !strcmp(argv[1], "--exec-probe")) {
		double ms = (now_ns() - atof(argv[2])) / 1e6;

		printf("the new image ran %.0f ms after execve\n", ms);
		return ms < 2000 ? 0 : 3;
	}
	if (argc > 1 && !strcmp(argv[1], "--bench-sync"))
		return bench_sync();
	if (argc > 1 && !strcmp(argv[1], "--list")) {
		for (size_t i = 0; i < tests_n(); i++)
			printf("%s\n", test_at(i)->name);
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
	for (size_t i = 0; i < tests_n(); i++) {
		bool want = argc == 1;

		for (int a = 1; a < argc; a++)
			want |= !strcmp(argv[a], test_at(i)->name);
		if (!want)
			continue;
		ran++;
		switch (run_one(test_at(i))) {
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

