/*
 * The tests of the kreg_notifier module (kmod/), one program, kreg_nf_test,
 * in files by concern: nf_harness.c (reporting, the device, memory), one
 * t_*.c per concern, each with its part of the test table, nf_bench.c (the
 * cost figures) and kreg_nf_test.c (the runner). What they share is here.
 */
#ifndef NF_TEST_H
#define NF_TEST_H

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

extern size_t pg;
extern char *skip_reason; /* shared with the runner (MAP_SHARED page) */

#define CHECK(cond, ...)                                                   \
	do {                                                               \
		if (!(cond)) {                                             \
			failed(__LINE__, #cond, __VA_ARGS__);              \
			return 1;                                          \
		}                                                          \
	} while (0)

void failed(int line, const char *cond, const char *fmt, ...);
int skip(const char *fmt, ...);

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

int nf_open(struct nf *nf);
void nf_close(struct nf *nf);
int nf_reg(int fd, uint64_t start, uint64_t len, uint32_t flags,
	   uint32_t *slot, uint64_t *counter);
int nf_unreg(int fd, uint32_t slot);
int watch(struct nf *nf, struct watch *w, void *p, size_t len);
bool moved(struct nf *nf, struct watch *w);
long sysval(const char *name);
bool live_back_to(long ctxs, long ranges, long *got_c, long *got_r);
int param_write(const char *name, const char *val);
bool param_read(const char *name, char *buf, size_t n);
bool am_root(void);
char *anon(size_t len);
int memfd_of(size_t len);
char *map_shared(int mfd, size_t len);
double now_ns(void);
double median(double *v, int n);
int set_nonblock(int fd);

/* a thread waiting in poll() or read() of fd */
struct waiter {
	int fd;
	int mode; /* 0 poll, 1 blocking read */
	volatile int done;
	int result;
	struct kreg_nf_event ev;
};
void *wait_thread(void *a);

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


/* One entry of the test table: a function, or a case of a table-driven kind. */
struct sem;
struct sy_case;
struct nf_test {
	const char *name;
	int (*fn)(void);
	const struct sem *sem;		/* or a semantic test (t_semantics.c) */
	const struct sy_case *sync;	/* or a synchronous delivery case (t_sync.c) */
};
int semantic(const struct sem *s);
int sy_order(const struct sy_case *c);

#define SEM(name, ...) \
	{ name, NULL, &(const struct sem){ __VA_ARGS__ }, NULL }
#define SYNC(name, ...) \
	{ name, NULL, NULL, &(const struct sy_case){ __VA_ARGS__ } }

/* the table, by concern, in the order the runner runs them */
#define NF_TEST_PARTS(X) X(basics) X(semantics) X(queue) X(bad_input) \
	X(limits) X(shared_node) X(sync) X(sync_threads)
#define NF_DECLARE(part) extern const struct nf_test nf_tests_##part[]; \
	extern const size_t nf_n_##part;
NF_TEST_PARTS(NF_DECLARE)

/* nf_sync.c: synchronous delivery's harness */
#define SY_SIGNO (SIGRTMIN + 4)
struct sy_state {
	int fd;
	uint64_t want_start, want_end;	/* the range a test waits for */
	uint64_t want2_start, want2_end;
	volatile int reported, reported2;
	volatile int handler_runs;
	int delay_ms;			/* the handler sleeps first */
	int disp_delay_ms;		/* the dispatcher sleeps first */
	volatile bool unmapped;		/* sy_unmapper's munmap returned */
	bool close_in_handler;		/* the handler closes fd instead */
	bool exit_in_handler;		/* the handler ends the process */
	char *inner;			/* the handler unmaps it (reentry) */
	void (*reporting)(void);	/* runs between a DRAIN that got
					 * ranges and the next (UCX's part) */
	volatile bool disp_stop;
	pthread_t disp;
	bool disp_running;
};
extern struct sy_state g_sy;
extern void (*g_sy_handler)(int sig);
extern uint32_t g_sy_start_flags;
extern struct io_uring g_ring;
extern bool g_ring_up;
void sy_note(const struct kreg_nf_range *r, uint32_t n);
int sy_drain(void);
void sy_handler(int sig);
void *sy_dispatcher(void *a);
int sy_start_ioctl(uint32_t signo, uint32_t timeout_ms);
int sy_start(int signo, uint32_t timeout_ms, bool dispatcher);
void sy_stop_dispatcher(void);
int sy_stats(struct kreg_nf_sync_stats *st);
int sy_signal_held(void);
int sy_signal_free(void);
int pin(char *p, size_t len);
char *sy_buffer(bool pinned, int *rc);
int sy_setup(int signo, uint32_t timeout_ms, bool dispatcher, char **p);
void *sy_unmapper(void *p);
char *sy_map_freed(char *p, int *tries);

/* nf_bench.c */
int bench(void);
int bench_sync(void);

#endif /* NF_TEST_H */
