/*
 * The read() queue of changed ranges and poll().
 */
#include "nf_test.h"


static int read_all(int fd, struct kreg_nf_event *ev, int max)
{
	ssize_t n = read(fd, ev, max * sizeof(*ev));

	if (n < 0)
		return -errno;
	if (n % sizeof(*ev))
		return -1000;
	return n / sizeof(*ev);
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


const struct nf_test nf_tests_queue[] = {
	{ "read-queue", t_read_queue, NULL, NULL },
	{ "read-after-unregister", t_read_after_unregister, NULL, NULL },
	{ "read-slot-reuse-widens", t_read_slot_reuse_widens, NULL, NULL },
	{ "read-bad-buffer-keeps-record", t_read_bad_buffer_keeps_record, NULL, NULL },
	{ "poll-wakes", t_poll_wakes, NULL, NULL },
	{ "read-blocks-until-event", t_read_blocks_until_event, NULL, NULL },
};
const size_t nf_n_queue = sizeof(nf_tests_queue) / sizeof(nf_tests_queue[0]);
