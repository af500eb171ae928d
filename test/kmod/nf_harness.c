/*
 * What every test of the module shares: reporting, the device, memory,
 * timing.
 */
#include "nf_test.h"

size_t pg;

/* ---- reporting --------------------------------------------------------- */

char *skip_reason; /* shared with the runner (MAP_SHARED page) */


void failed(int line, const char *cond, const char *fmt, ...)
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

int skip(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(skip_reason, 256, fmt, ap);
	va_end(ap);
	printf("skip: %s\n", skip_reason);
	return 77;
}


/* ---- the device ---------------------------------------------------------- */



int nf_open(struct nf *nf)
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

void nf_close(struct nf *nf)
{
	munmap((void *)nf->ctr, nf->info.counters_size);
	close(nf->fd);
}

/* REGISTER; 0 or -errno */
int nf_reg(int fd, uint64_t start, uint64_t len, uint32_t flags,
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

int nf_unreg(int fd, uint32_t slot)
{
	struct kreg_nf_unregister u = { .slot = slot };

	return ioctl(fd, KREG_NF_IOC_UNREGISTER, &u) ? -errno : 0;
}

int watch(struct nf *nf, struct watch *w, void *p, size_t len)
{
	w->start = (uintptr_t)p;
	w->end = w->start + len;
	return nf_reg(nf->fd, w->start, len, 0, &w->slot, &w->snap);
}

bool moved(struct nf *nf, struct watch *w)
{
	return nf->ctr[w->slot] != w->snap;
}

long sysval(const char *name)
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
bool live_back_to(long ctxs, long ranges, long *got_c, long *got_r)
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

int param_write(const char *name, const char *val)
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

bool param_read(const char *name, char *buf, size_t n)
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

bool am_root(void)
{
	return geteuid() == 0 && access(PARAMDIR "/max_total_ranges", W_OK) == 0;
}


/* ---- memory -------------------------------------------------------------- */

char *anon(size_t len)
{
	char *p = mmap(NULL, len, PROT_READ | PROT_WRITE,
		       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

	if (p == MAP_FAILED)
		return NULL;
	memset(p, 0x5a, len);
	return p;
}

int memfd_of(size_t len)
{
	int fd = memfd_create("kreg_nf_test", MFD_CLOEXEC);

	if (fd >= 0 && ftruncate(fd, len)) {
		close(fd);
		return -1;
	}
	return fd;
}

char *map_shared(int mfd, size_t len)
{
	char *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, mfd, 0);

	if (p == MAP_FAILED)
		return NULL;
	memset(p, 0x3c, len);
	return p;
}

double now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e9 + ts.tv_nsec;
}

int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return x < y ? -1 : x > y;
}

double median(double *v, int n)
{
	qsort(v, n, sizeof(*v), cmp_double);
	return v[n / 2];
}

/* ---- descriptors and waiting threads -------------------------------- */

int set_nonblock(int fd)
{
	return fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
}

void *wait_thread(void *a)
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
