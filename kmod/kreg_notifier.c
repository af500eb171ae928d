// SPDX-License-Identifier: GPL-2.0
/*
 * kreg_notifier: tells a process when the pages behind a registered range of
 * its own address space change, through a counter per range that the
 * process maps read-only (one load per check) and a queue of changed ranges
 * that it read()s. User-space interface: uapi/kreg_notifier.h. Build, load
 * and the test hooks: README.md.
 *
 * Each registered range gets an mmu_interval_notifier. Its invalidate
 * callback runs in whatever thread changes the mapping (munmap, mremap,
 * madvise, truncate, migration, ksmd, oom_reaper, exit), with or without
 * mmap_lock, possibly where it must not sleep, possibly on several CPUs at
 * once for one range: it only bumps an atomic counter and queues the slot
 * under a spinlock.
 *
 * Memory comes as it is used: open() allocates the per-descriptor arrays
 * (a few KiB), a counter page comes with the first slot of it that is
 * registered or read through the mapping (a fault), per-slot state with the
 * first slot of its chunk. Everything is charged to the opener's memory
 * cgroup (GFP_KERNEL_ACCOUNT) and to the opener's uid, which the per-user
 * limits below bound; a process with CAP_SYS_RESOURCE or CAP_SYS_ADMIN at
 * open is held by the global and per-descriptor limits only.
 *
 * Locks, in the only order they nest:
 *   ctx->lock (mutex)  REGISTER and UNREGISTER: slots, chunks, the range
 *                      tree, limits.
 *                      Held across mmu_interval_notifier_insert() (which may
 *                      take mmap_lock for writing) and _remove() (which may
 *                      wait for invalidations). Never taken with mmap_lock
 *                      held: mmap() does not take it.
 *   ctx->ev_lock (spin) the event queue, the per-slot event state and the
 *                      live/taken bitmaps. Taken by the invalidate callback;
 *                      nothing that sleeps runs under it.
 * kreg_users_lock (mutex) the per-uid table: open, release and sysfs only,
 * never with another lock of ours held. Counter pages are published with
 * cmpxchg() and never change until release: the fault handler (under
 * mmap_lock or the VMA lock) takes no lock of ours.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/atomic.h>
#include <linux/bitmap.h>
#include <linux/capability.h>
#include <linux/cred.h>
#include <linux/device.h>
#include <linux/file.h>
#include <linux/fs.h>
#include <linux/hashtable.h>
#include <linux/interval_tree.h>
#include <linux/miscdevice.h>
#include <linux/minmax.h>
#include <linux/mm.h>
#include <linux/mmu_notifier.h>
#include <linux/module.h>
#include <linux/moduleparam.h>
#include <linux/mutex.h>
#include <linux/nospec.h>
#include <linux/overflow.h>
#include <linux/pgtable.h>
#include <linux/pid.h>
#include <linux/poll.h>
#include <linux/sched/mm.h>
#include <linux/sched/signal.h>
#include <linux/sched/task_stack.h>
#include <linux/slab.h>
#include <linux/spinlock.h>
#include <linux/task_work.h>
#include <linux/uaccess.h>
#include <linux/version.h>
#include <linux/wait.h>

#include "uapi/kreg_notifier.h"

/* Upper bound of max_ranges: 8 MiB of counters per descriptor. */
#define KREG_MAX_RANGES_LIMIT	1048576
/* Per-slot state is allocated in chunks of this many slots (4 KiB each). */
#define KREG_CHUNK_SLOTS	128
#define KREG_PAGE_SLOTS		(PAGE_SIZE / sizeof(u64))
#define KREG_NO_SLOT		U32_MAX
/* Records copied to user space per step of read(). */
#define KREG_READ_BATCH		16

static unsigned int max_ranges = 16384;
static unsigned int max_total_ranges = 1U << 20;
static unsigned int max_files_per_user = 512;
static unsigned int max_ranges_per_user = 131072;
static unsigned int max_kib_per_user = 65536;
static unsigned int max_overlap = 32;

static int kreg_set_max_ranges(const char *val, const struct kernel_param *kp)
{
	return param_set_uint_minmax(val, kp, 1, KREG_MAX_RANGES_LIMIT);
}

static const struct kernel_param_ops kreg_max_ranges_ops = {
	.set = kreg_set_max_ranges,
	.get = param_get_uint,
};

module_param_cb(max_ranges, &kreg_max_ranges_ops, &max_ranges, 0644);
MODULE_PARM_DESC(max_ranges,
		 "ranges one descriptor can register (slots; read at open, 1.."
		 __stringify(KREG_MAX_RANGES_LIMIT) ", default 16384)");
module_param(max_total_ranges, uint, 0644);
MODULE_PARM_DESC(max_total_ranges,
		 "ranges registered over all descriptors (default 1048576)");

static int kreg_set_positive(const char *val, const struct kernel_param *kp)
{
	return param_set_uint_minmax(val, kp, 1, UINT_MAX);
}

static const struct kernel_param_ops kreg_positive_ops = {
	.set = kreg_set_positive,
	.get = param_get_uint,
};

module_param_cb(max_files_per_user, &kreg_positive_ops, &max_files_per_user,
		0644);
MODULE_PARM_DESC(max_files_per_user,
		 "open descriptors of one uid (EMFILE; default 512)");
module_param_cb(max_ranges_per_user, &kreg_positive_ops, &max_ranges_per_user,
		0644);
MODULE_PARM_DESC(max_ranges_per_user,
		 "ranges registered by one uid (EDQUOT; default 131072)");
module_param_cb(max_kib_per_user, &kreg_positive_ops, &max_kib_per_user, 0644);
MODULE_PARM_DESC(max_kib_per_user,
		 "KiB of module memory of one uid (EDQUOT; default 65536)");
module_param_cb(max_overlap, &kreg_positive_ops, &max_overlap, 0644);
MODULE_PARM_DESC(max_overlap,
		 "ranges of one descriptor over any one page (EMLINK; default 32)");

/* Live objects, shown in sysfs so that tests can see leaks. */
static atomic_long_t kreg_nr_contexts = ATOMIC_LONG_INIT(0);
static atomic_long_t kreg_nr_ranges = ATOMIC_LONG_INIT(0);
static atomic_long_t kreg_nr_bytes = ATOMIC_LONG_INIT(0);

/*
 * What one uid holds. nr_files counts its contexts and keeps the entry;
 * the others are charged and uncharged by its contexts.
 */
struct kreg_user {
	struct hlist_node node;		/* kreg_users */
	kuid_t uid;
	unsigned int nr_files;		/* kreg_users_lock */
	atomic_long_t nr_ranges;
	atomic_long_t bytes;
};

static DEFINE_HASHTABLE(kreg_users, 6);
static DEFINE_MUTEX(kreg_users_lock);

/*
 * What the next read() record of a slot reports. A slot's record stays
 * queued after UNREGISTER; slot allocation avoids such slots while others
 * are free. If a slot had to be reused before its record was read, a change
 * of the new range widens the record to cover both ranges.
 */
struct kreg_ev {
	u64 start;
	u64 end;
	u32 next;	/* next queued slot, KREG_NO_SLOT at the tail */
	u32 queued;
};

struct kreg_range;

struct kreg_chunk {
	struct kreg_range *range[KREG_CHUNK_SLOTS];	/* ctx->lock */
	struct kreg_ev ev[KREG_CHUNK_SLOTS];		/* ctx->ev_lock */
};

struct kreg_sync;

struct kreg_ctx {
	struct mm_struct *mm;		/* mmgrab()ed at open */
	struct file *file;		/* ours; gates hold references to it */
	struct pid *tgid;		/* the opener's process */
	struct kreg_sync *sync;		/* set once (ctx->lock), freed at release */
	struct kreg_user *user;		/* the opener's uid, charged for all */
	bool unlimited;			/* no per-user limits (capable at open) */
	u32 nslots;
	size_t counters_size;
	size_t base_bytes;		/* charged at open */
	struct page **pages;		/* counter pages, cmpxchg()ed in once */
	unsigned int nr_pages;

	struct mutex lock;		/* REGISTER, UNREGISTER (see the top) */
	struct kreg_chunk **chunks;	/* set under both locks, freed at release */
	struct rb_root_cached tree;	/* live ranges by address */
	u32 nr_live;
	u64 gen;			/* tells registrations of one slot apart */

	spinlock_t ev_lock;		/* the queue and what follows */
	unsigned long *live;		/* slot has a registration */
	unsigned long *taken;		/* live, or its record is still queued */
	u32 q_head;
	u32 q_tail;
	u32 q_len;
	wait_queue_head_t wq;
};

struct kreg_range {
	struct mmu_interval_notifier mni;
	struct interval_tree_node itn;	/* in ctx->tree while live */
	struct kreg_ctx *ctx;
	struct kreg_ev *ev;
	atomic64_t *counter;
	u64 start;
	u64 end;
	u64 gen;
	u32 slot;
};

static struct kreg_ev *kreg_ev_of(struct kreg_ctx *ctx, u32 slot)
{
	return &ctx->chunks[slot / KREG_CHUNK_SLOTS]->ev[slot % KREG_CHUNK_SLOTS];
}

static struct kreg_range **kreg_range_ptr(struct kreg_ctx *ctx, u32 slot)
{
	struct kreg_chunk *c = ctx->chunks[slot / KREG_CHUNK_SLOTS];

	return c ? &c->range[slot % KREG_CHUNK_SLOTS] : NULL;
}

/* Counters only grow; 0 never names a registration. */
static u64 kreg_bump(atomic64_t *counter)
{
	u64 v = atomic64_inc_return(counter);

	return v ? v : atomic64_inc_return(counter);
}

/*
 * The invalidate callback. Runs before the kernel changes the page tables of
 * [range->start, range->end) where it overlaps r, in the changing thread,
 * maybe non-blockable: atomics and ev_lock only, and it never fails.
 */
static bool kreg_invalidate(struct mmu_interval_notifier *mni,
			    const struct mmu_notifier_range *range,
			    unsigned long cur_seq)
{
	struct kreg_range *r = container_of(mni, struct kreg_range, mni);
	struct kreg_ctx *ctx = r->ctx;
	struct kreg_ev *ev = r->ev;
	bool wake = false;

	/* Lets mmu_interval_read_begin() in REGISTER see us in flight. */
	mmu_interval_set_seq(mni, cur_seq);

	switch (range->event) {
	case MMU_NOTIFY_PROTECTION_VMA:		/* mprotect, uffd-wp */
	case MMU_NOTIFY_PROTECTION_PAGE:	/* write-protect for writeback */
	case MMU_NOTIFY_SOFT_DIRTY:		/* clear_refs */
		/* The same pages stay mapped: a registration stays valid. */
		return true;
	default:
		break;
	}

	spin_lock(&ctx->ev_lock);
	kreg_bump(r->counter);
	if (!ev->queued) {
		ev->queued = 1;
		ev->start = r->start;
		ev->end = r->end;
		ev->next = KREG_NO_SLOT;
		if (ctx->q_tail == KREG_NO_SLOT)
			ctx->q_head = r->slot;
		else
			kreg_ev_of(ctx, ctx->q_tail)->next = r->slot;
		ctx->q_tail = r->slot;
		WRITE_ONCE(ctx->q_len, ctx->q_len + 1);
		wake = true;
	} else if (ev->start != r->start || ev->end != r->end) {
		/* the slot's unread record is from its previous range */
		ev->start = min(ev->start, r->start);
		ev->end = max(ev->end, r->end);
	}
	spin_unlock(&ctx->ev_lock);

	if (wake)
		wake_up_interruptible_poll(&ctx->wq, EPOLLIN | EPOLLRDNORM);
	return true;
}

static const struct mmu_interval_notifier_ops kreg_mni_ops = {
	.invalidate = kreg_invalidate,
};

/* Adds n to *v unless that passes limit (limit < 0: no limit). */
static bool kreg_add_below(atomic_long_t *v, long n, long limit)
{
	long cur = atomic_long_read(v);

	do {
		if (limit >= 0 && cur + n > limit)
			return false;
	} while (!atomic_long_try_cmpxchg(v, &cur, cur + n));
	return true;
}

/* bytes of module memory for ctx's uid: 0 or -EDQUOT (max_kib_per_user) */
static int kreg_charge_mem(struct kreg_ctx *ctx, size_t bytes)
{
	long limit = (long)min_t(u64, (u64)READ_ONCE(max_kib_per_user) << 10,
				 LONG_MAX);

	if (!kreg_add_below(&ctx->user->bytes, bytes,
			    ctx->unlimited ? -1 : limit))
		return -EDQUOT;
	atomic_long_add(bytes, &kreg_nr_bytes);
	return 0;
}

static void kreg_uncharge_mem(struct kreg_ctx *ctx, size_t bytes)
{
	atomic_long_sub(bytes, &ctx->user->bytes);
	atomic_long_sub(bytes, &kreg_nr_bytes);
}

/*
 * One more range: -EDQUOT past max_ranges_per_user, -ENOSPC past
 * max_total_ranges.
 */
static int kreg_charge_range(struct kreg_ctx *ctx)
{
	if (!kreg_add_below(&ctx->user->nr_ranges, 1,
			    ctx->unlimited ? -1 :
					     (long)READ_ONCE(max_ranges_per_user)))
		return -EDQUOT;
	if (!kreg_add_below(&kreg_nr_ranges, 1,
			    (long)READ_ONCE(max_total_ranges))) {
		atomic_long_dec(&ctx->user->nr_ranges);
		return -ENOSPC;
	}
	return 0;
}

static void kreg_uncharge_range(struct kreg_ctx *ctx)
{
	atomic_long_dec(&ctx->user->nr_ranges);
	atomic_long_dec(&kreg_nr_ranges);
}

/*
 * The counter page idx, allocated on first use (REGISTER of one of its
 * slots, or a fault of the mapping) and never changed until release; NULL
 * with *err -EDQUOT or -ENOMEM. No lock needed: a racing second allocation
 * loses the cmpxchg() and is freed.
 */
static struct page *kreg_counter_page(struct kreg_ctx *ctx, unsigned int idx,
				      int *err)
{
	/* pairs with cmpxchg() below: a page seen is a zeroed page */
	struct page *page = smp_load_acquire(&ctx->pages[idx]);
	struct page *old;

	if (page)
		return page;
	*err = kreg_charge_mem(ctx, PAGE_SIZE);
	if (*err)
		return NULL;
	page = alloc_page(GFP_KERNEL_ACCOUNT | __GFP_ZERO);
	if (!page) {
		kreg_uncharge_mem(ctx, PAGE_SIZE);
		*err = -ENOMEM;
		return NULL;
	}
	old = cmpxchg(&ctx->pages[idx], NULL, page);
	if (old) {
		__free_page(page);
		kreg_uncharge_mem(ctx, PAGE_SIZE);
		return old;
	}
	return page;
}

/* Whether max_overlap live ranges of ctx overlap [start, last] (ctx->lock). */
static bool kreg_overlap_full(struct kreg_ctx *ctx, u64 start, u64 last)
{
	unsigned int cap = READ_ONCE(max_overlap), n = 0;
	struct interval_tree_node *it;

	for (it = interval_tree_iter_first(&ctx->tree, start, last); it;
	     it = interval_tree_iter_next(it, start, last))
		if (++n >= cap)
			return true;
	return false;
}

/*
 * Picks a slot for r and makes it live (ctx->lock held). Prefers a slot with
 * no unread record, so that records keep their own range.
 */
static int kreg_claim_slot(struct kreg_ctx *ctx, struct kreg_range *r)
{
	struct kreg_chunk *chunk = NULL;
	struct page *page;
	unsigned int ci;
	u32 slot;
	int ret;

	if (ctx->nr_live >= ctx->nslots)
		return -ENOSPC;
	ret = kreg_charge_range(ctx);
	if (ret)
		return ret;

	spin_lock(&ctx->ev_lock);
	slot = find_first_zero_bit(ctx->taken, ctx->nslots);
	if (slot >= ctx->nslots)
		slot = find_first_zero_bit(ctx->live, ctx->nslots);
	spin_unlock(&ctx->ev_lock);

	page = kreg_counter_page(ctx, slot / KREG_PAGE_SLOTS, &ret);
	if (!page)
		goto fail;
	ci = slot / KREG_CHUNK_SLOTS;
	if (!ctx->chunks[ci]) {
		ret = kreg_charge_mem(ctx, sizeof(*chunk));
		if (ret)
			goto fail;
		chunk = kzalloc(sizeof(*chunk), GFP_KERNEL_ACCOUNT);
		if (!chunk) {
			kreg_uncharge_mem(ctx, sizeof(*chunk));
			ret = -ENOMEM;
			goto fail;
		}
	}

	r->slot = slot;
	r->gen = ++ctx->gen;
	r->counter = (atomic64_t *)page_address(page) + slot % KREG_PAGE_SLOTS;

	spin_lock(&ctx->ev_lock);
	if (chunk)
		ctx->chunks[ci] = chunk;
	__set_bit(slot, ctx->live);
	__set_bit(slot, ctx->taken);
	spin_unlock(&ctx->ev_lock);

	r->ev = kreg_ev_of(ctx, slot);
	*kreg_range_ptr(ctx, slot) = r;
	ctx->nr_live++;
	r->itn.start = r->start;
	r->itn.last = r->end - 1;
	interval_tree_insert(&r->itn, &ctx->tree);
	return 0;

fail:
	kreg_uncharge_range(ctx);
	return ret;
}

/* Undoes kreg_claim_slot() (ctx->lock held, r's notifier not inserted). */
static void kreg_free_slot(struct kreg_ctx *ctx, struct kreg_range *r)
{
	interval_tree_remove(&r->itn, &ctx->tree);
	*kreg_range_ptr(ctx, r->slot) = NULL;
	spin_lock(&ctx->ev_lock);
	__clear_bit(r->slot, ctx->live);
	if (!r->ev->queued)
		__clear_bit(r->slot, ctx->taken);
	spin_unlock(&ctx->ev_lock);
	ctx->nr_live--;
	kreg_uncharge_range(ctx);
}

static void kreg_range_free(struct kreg_ctx *ctx, struct kreg_range *r)
{
	kfree(r);
	kreg_uncharge_mem(ctx, sizeof(*r));
}

/*
 * Ends a registration (ctx->lock held, or release). The bump comes first:
 * from then on a reader of the slot sees "not current", and until the
 * notifier is gone every change still bumps. Removing first would leave a
 * window in which a change completes, moves nothing, and UNREGISTER has
 * not returned yet.
 */
static void kreg_drop(struct kreg_ctx *ctx, struct kreg_range *r)
{
	/* An old snapshot of this slot must never match again. */
	kreg_bump(r->counter);
	/* Waits for callbacks on other CPUs; none run on r afterwards. */
	mmu_interval_notifier_remove(&r->mni);
	kreg_free_slot(ctx, r);
	kreg_range_free(ctx, r);
}

static long kreg_register(struct kreg_ctx *ctx,
			  struct kreg_nf_register __user *uarg)
{
	struct kreg_nf_register arg;
	struct kreg_range *r, **rp;
	u64 end, gen;
	int ret;

	if (copy_from_user(&arg, uarg, sizeof(arg)))
		return -EFAULT;
	if (arg.flags || !arg.len || !PAGE_ALIGNED(arg.start) ||
	    !PAGE_ALIGNED(arg.len) ||
	    check_add_overflow(arg.start, arg.len, &end) || end > TASK_SIZE)
		return -EINVAL;

	ret = kreg_charge_mem(ctx, sizeof(*r));
	if (ret)
		return ret;
	r = kzalloc(sizeof(*r), GFP_KERNEL_ACCOUNT);
	if (!r) {
		kreg_uncharge_mem(ctx, sizeof(*r));
		return -ENOMEM;
	}
	r->ctx = ctx;
	r->start = arg.start;
	r->end = end;

	if (mutex_lock_killable(&ctx->lock)) {
		kreg_range_free(ctx, r);
		return -EINTR;
	}
	if (kreg_overlap_full(ctx, r->start, r->end - 1)) {
		ret = -EMLINK;
		goto out_free;
	}
	ret = kreg_claim_slot(ctx, r);
	if (ret)
		goto out_free;
	/* current->mm == ctx->mm (checked by the caller): mm_users > 0 */
	ret = mmu_interval_notifier_insert(&r->mni, ctx->mm, r->start,
					   arg.len, &kreg_mni_ops);
	if (ret) {
		kreg_free_slot(ctx, r);
		goto out_free;
	}
	/*
	 * Bump, then wait for invalidations in flight. One that began before
	 * the insert never calls r; one that called r before the bump is
	 * included in it. read_begin() returns once both kinds have finished
	 * changing the page tables, so pages the caller pins after we return
	 * are the new ones; any later change calls r and moves the counter
	 * past arg.counter. (Bumping after read_begin() would let a callback
	 * run between the two, be hidden in the value returned, and zap what
	 * the caller pins next.)
	 */
	arg.counter = kreg_bump(r->counter);
	mmu_interval_read_begin(&r->mni);
	arg.slot = r->slot;
	gen = r->gen;
	mutex_unlock(&ctx->lock);

	/* Not under ctx->lock: this may fault, even into userfaultfd. */
	if (copy_to_user(uarg, &arg, sizeof(arg))) {
		/* the caller cannot know the slot: take it back if still ours */
		mutex_lock(&ctx->lock);
		rp = kreg_range_ptr(ctx, arg.slot);
		if (*rp && (*rp)->gen == gen)
			kreg_drop(ctx, *rp);
		mutex_unlock(&ctx->lock);
		return -EFAULT;
	}
	return 0;

out_free:
	mutex_unlock(&ctx->lock);
	kreg_range_free(ctx, r);
	return ret;
}

static long kreg_unregister(struct kreg_ctx *ctx,
			    struct kreg_nf_unregister __user *uarg)
{
	struct kreg_nf_unregister arg;
	struct kreg_range **rp;
	long ret = 0;
	u32 slot;

	if (copy_from_user(&arg, uarg, sizeof(arg)))
		return -EFAULT;
	if (arg.flags || arg.slot >= ctx->nslots)
		return -EINVAL;
	/* no speculative chunks[] access past the bound either */
	slot = array_index_nospec(arg.slot, ctx->nslots);

	if (mutex_lock_killable(&ctx->lock))
		return -EINTR;
	rp = kreg_range_ptr(ctx, slot);
	if (rp && *rp)
		kreg_drop(ctx, *rp);
	else
		ret = -ENOENT;
	mutex_unlock(&ctx->lock);
	return ret;
}

static long kreg_info(struct kreg_ctx *ctx, struct kreg_nf_info __user *uarg)
{
	struct kreg_nf_info info = {
		.abi_version = KREG_NF_ABI_VERSION,
		.max_ranges = ctx->nslots,
		.counters_size = ctx->counters_size,
	};

	return copy_to_user(uarg, &info, sizeof(info)) ? -EFAULT : 0;
}

/*
 * Synchronous delivery (uapi: KREG_NF_IOC_SYNC_*): one more notifier, on
 * the whole address space. A change of pinned pages is queued; the
 * changing thread is sent a signal whose handler drains the queue into
 * UCX before it returns to user space, and every other thread of the
 * process is held at its next return to user space ("the gate", a
 * task_work) until a DRAIN has acknowledged the change: a thread must
 * enter the kernel to see the new pages (a fault) or to map the freed
 * addresses, so none acts on them before UCX knows (the cross-thread
 * window). The dispatcher thread drains what no signal can carry.
 */
#define KREG_SYNC_NUDGE_MS	2	/* a gate's wait before it wakes the dispatcher */
#define KREG_GATE_BITS		6
#define KREG_DRAIN_BATCH	32

enum kreg_sync_stat {		/* the fields of struct kreg_nf_sync_stats */
	KREG_ST_QUEUED, KREG_ST_SIGNALLED, KREG_ST_SELF_GATED, KREG_ST_GATES,
	KREG_ST_GATE_WAITS, KREG_ST_GATE_TIMEOUTS, KREG_ST_GATE_NOMEM,
	KREG_ST_LATE, KREG_ST_OVERFLOWS, KREG_ST_UNPINNED, KREG_ST_DRAINS,
	KREG_ST_NR = sizeof(struct kreg_nf_sync_stats) / sizeof(__u64)
};

struct kreg_sync_ent {
	u64 start;
	u64 end;
	u64 seq;
};

/* A thread held at its next return to user space until done >= target. */
struct kreg_gate {
	struct callback_head cb;
	struct hlist_node node;		/* sync->gates while queued (ev_lock) */
	struct task_struct *task;	/* the key: compared, never dereferenced */
	struct kreg_ctx *ctx;
	u64 target;			/* ev_lock */
};

struct kreg_sync {
	struct mmu_interval_notifier mni;	/* [0, TASK_SIZE) while live */
	struct kreg_ctx *ctx;
	struct pid *owner;		/* whose threads are held */
	int signo;			/* 0: gate only */
	unsigned long handler;		/* signo's handler that drains */
	unsigned long timeout;		/* jiffies */
	wait_queue_head_t wq;		/* gates wait here for done */
	/* under ctx->ev_lock: */
	bool dead;			/* stopped: nothing queued, no gate holds */
	bool need_reader;		/* poll() says EPOLLIN */
	struct task_struct *dispatcher;	/* never held; compared only */
	u64 seq;			/* last queued */
	u64 done;			/* acknowledged up to */
	u32 q_first;
	u32 q_n;
	struct kreg_sync_ent q[KREG_NF_SYNC_QUEUE];
	DECLARE_HASHTABLE(gates, KREG_GATE_BITS);
	atomic64_t stats[KREG_ST_NR];
};

static void kreg_sync_count(struct kreg_sync *s, enum kreg_sync_stat i)
{
	atomic64_inc(&s->stats[i]);
}

static bool kreg_pfn_pinned(unsigned long pfn)
{
	return pfn_valid(pfn) && folio_maybe_dma_pinned(page_folio(pfn_to_page(pfn)));
}

/*
 * Whether a page in [addr, end) of mm may be pinned for DMA. Only for
 * current->mm: a lockless walk as GUP-fast does it, interrupts off so that
 * no page table is freed under us (x86 frees them after an IPI or an RCU
 * grace period). A huge entry is one folio. No reference is taken: a page
 * still mapped here cannot be freed, and a wrong answer about one being
 * unmapped by another thread is corrected by that thread's own callback,
 * which runs before its zap.
 */
static bool kreg_range_pinned(struct mm_struct *mm, unsigned long addr,
			      unsigned long end)
{
	unsigned long flags, next;
	bool pinned = false;

	local_irq_save(flags);
	for (; addr < end && !pinned; addr = next) {
		pgd_t pgd = READ_ONCE(*pgd_offset(mm, addr));
		p4d_t p4d;
		pud_t pud;
		pmd_t pmd;
		pte_t *ptep;

		next = pgd_addr_end(addr, end);
		if (pgd_none(pgd) || pgd_bad(pgd))
			continue;
		p4d = READ_ONCE(*p4d_offset(&pgd, addr));
		next = p4d_addr_end(addr, end);
		if (p4d_none(p4d) || p4d_bad(p4d))
			continue;
		pud = READ_ONCE(*pud_offset(&p4d, addr));
		next = pud_addr_end(addr, end);
		if (pud_none(pud) || !pud_present(pud))
			continue;
		if (pud_leaf(pud)) {
			pinned = kreg_pfn_pinned(pud_pfn(pud));
			continue;
		}
		if (pud_bad(pud))
			continue;
		pmd = READ_ONCE(*pmd_offset(&pud, addr));
		next = pmd_addr_end(addr, end);
		if (pmd_none(pmd) || !pmd_present(pmd))
			continue;
		if (pmd_leaf(pmd)) {
			pinned = kreg_pfn_pinned(pmd_pfn(pmd));
			continue;
		}
		if (pmd_bad(pmd))
			continue;
		/* the page table's entries in turn, not a walk from pgd each */
		ptep = pte_offset_kernel(&pmd, addr);
		for (; addr < next && !pinned; addr += PAGE_SIZE, ptep++) {
			pte_t pte = READ_ONCE(*ptep);

			if (pte_present(pte) && !pte_special(pte))
				pinned = kreg_pfn_pinned(pte_pfn(pte));
		}
	}
	local_irq_restore(flags);
	return pinned;
}

/* Queues [start, end) (ev_lock); a full queue widens its newest entry. */
static u64 kreg_sync_queue(struct kreg_sync *s, u64 start, u64 end)
{
	struct kreg_sync_ent *e;

	if (s->q_n == KREG_NF_SYNC_QUEUE) {
		e = &s->q[(s->q_first + s->q_n - 1) % KREG_NF_SYNC_QUEUE];
		e->start = min(e->start, start);
		e->end = max(e->end, end);
		kreg_sync_count(s, KREG_ST_OVERFLOWS);
	} else {
		e = &s->q[(s->q_first + s->q_n++) % KREG_NF_SYNC_QUEUE];
		e->start = start;
		e->end = end;
	}
	e->seq = ++s->seq;
	kreg_sync_count(s, KREG_ST_QUEUED);
	return e->seq;
}

static bool kreg_gate_open(struct kreg_sync *s, u64 target)
{
	return READ_ONCE(s->done) >= target || READ_ONCE(s->dead);
}

/* current's handler of signo (1.._NSIG) */
static void __user *kreg_handler_of(int signo)
{
	/* current's own: only its exec replaces it */
	struct sighand_struct *sh = rcu_dereference_protected(current->sighand, 1);

	return READ_ONCE(sh->action[signo - 1].sa.sa_handler);
}

/* The thread is about to run signo's handler, which drains. */
static bool kreg_runs_handler(struct kreg_sync *s)
{
	if (!s->signo)
		return false;
	return instruction_pointer(task_pt_regs(current)) == s->handler &&
	       (unsigned long)kreg_handler_of(s->signo) == s->handler;
}

/*
 * signo's handler is still the one that drains (not replaced since) and
 * current does not block it
 */
static bool kreg_signal_reaches(struct kreg_sync *s)
{
	if (!s->signo || sigismember(&current->blocked, s->signo))
		return false;
	return (unsigned long)kreg_handler_of(s->signo) == s->handler;
}

/*
 * The gate, a task_work run by the held thread as it returns to user space
 * (from a system call, a fault or an interrupt), where it may sleep. It
 * holds a reference to the file, dropped last: the module is pinned while
 * it runs, and the context lives until every gate is done.
 */
static void kreg_gate_run(struct callback_head *cb)
{
	struct kreg_gate *g = container_of(cb, struct kreg_gate, cb);
	struct kreg_ctx *ctx = g->ctx;
	struct kreg_sync *s = ctx->sync;
	struct file *file = ctx->file;
	bool hold;
	u64 target;

	spin_lock(&ctx->ev_lock);
	hash_del(&g->node);
	target = g->target;
	spin_unlock(&ctx->ev_lock);
	kfree(g);

	hold = !kreg_gate_open(s, target) && !(current->flags & PF_EXITING) &&
	       !kreg_runs_handler(s);
	if (hold) {
		kreg_sync_count(s, KREG_ST_GATE_WAITS);
		if (!wait_event_killable_timeout(s->wq, kreg_gate_open(s, target),
						 msecs_to_jiffies(KREG_SYNC_NUDGE_MS))) {
			/* the changing thread has not drained: ask the dispatcher */
			spin_lock(&ctx->ev_lock);
			s->need_reader = true;
			spin_unlock(&ctx->ev_lock);
			wake_up_interruptible_poll(&ctx->wq, EPOLLIN | EPOLLRDNORM);
			if (!wait_event_killable_timeout(s->wq,
							 kreg_gate_open(s, target),
							 s->timeout))
				kreg_sync_count(s, KREG_ST_GATE_TIMEOUTS);
		}
	}
	fput(file);
}

/* Holds t until seq is acknowledged (ev_lock): one queued gate per thread. */
static void kreg_gate_add(struct kreg_sync *s, struct task_struct *t, u64 seq)
{
	struct kreg_ctx *ctx = s->ctx;
	struct kreg_gate *g;

	hash_for_each_possible(s->gates, g, node, (unsigned long)t) {
		if (g->task == t) {
			g->target = max(g->target, seq);
			return;
		}
	}
	g = kmalloc(sizeof(*g), GFP_NOWAIT | __GFP_NOWARN | __GFP_ACCOUNT);
	if (!g) {
		kreg_sync_count(s, KREG_ST_GATE_NOMEM);
		return;
	}
	g->task = t;
	g->ctx = ctx;
	g->target = seq;
	init_task_work(&g->cb, kreg_gate_run);
	/* not the last reference: the owner's descriptor is open (not dead) */
	get_file(ctx->file);
	if (task_work_add(t, &g->cb, TWA_RESUME)) {
		/* t is past exit_task_work() and never returns to user space */
		fput(ctx->file);
		kfree(g);
		return;
	}
	hash_add(s->gates, &g->node, (unsigned long)t);
	kreg_sync_count(s, KREG_ST_GATES);
}

/* Holds the owner's threads but self (ev_lock). */
static void kreg_gate_others(struct kreg_sync *s, struct task_struct *self,
			     u64 seq)
{
	struct task_struct *p, *t;

	rcu_read_lock();
	p = pid_task(s->owner, PIDTYPE_TGID);
	if (p) {
		for_each_thread(p, t) {
			if (t == self || t == s->dispatcher ||
			    (t->flags & (PF_EXITING | PF_KTHREAD | PF_IO_WORKER)))
				continue;
			kreg_gate_add(s, t, seq);
		}
	}
	rcu_read_unlock();
}

static bool kreg_sync_invalidate(struct mmu_interval_notifier *mni,
				 const struct mmu_notifier_range *range,
				 unsigned long cur_seq)
{
	struct kreg_sync *s = container_of(mni, struct kreg_sync, mni);
	struct kreg_ctx *ctx = s->ctx;
	bool mine = current->mm == range->mm, user, signal = false;
	bool wake = false;
	u64 seq;

	/* Lets DRAIN's mmu_interval_read_begin() wait for us to finish. */
	mmu_interval_set_seq(mni, cur_seq);

	switch (range->event) {
	case MMU_NOTIFY_PROTECTION_VMA:
	case MMU_NOTIFY_PROTECTION_PAGE:
	case MMU_NOTIFY_SOFT_DIRTY:
	case MMU_NOTIFY_RELEASE:
		return true;
	default:
		break;
	}
	/* exit_mmap(): nothing of the process runs any more */
	if (!atomic_read(&range->mm->mm_users))
		return true;
	if (mine && (!atomic64_read(&range->mm->pinned_vm) ||
		     !kreg_range_pinned(range->mm, range->start, range->end))) {
		kreg_sync_count(s, KREG_ST_UNPINNED);
		return true;
	}
	/* a thread of the process (not a vfork child sharing its mm) */
	user = mine && task_tgid(current) == s->owner &&
	       !(current->flags & (PF_KTHREAD | PF_IO_WORKER | PF_EXITING));

	spin_lock(&ctx->ev_lock);
	if (s->dead) {
		spin_unlock(&ctx->ev_lock);
		return true;
	}
	seq = kreg_sync_queue(s, range->start, range->end);
	if (user && kreg_signal_reaches(s)) {
		signal = true;
		kreg_sync_count(s, KREG_ST_SIGNALLED);
	} else if (user) {
		/* no handler will run before it returns: held like the others */
		kreg_gate_add(s, current, seq);
		kreg_sync_count(s, KREG_ST_SELF_GATED);
		s->need_reader = true;
		wake = true;
	} else {
		/* another process, a kernel thread, an io_uring worker */
		kreg_sync_count(s, KREG_ST_LATE);
		s->need_reader = true;
		wake = true;
	}
	kreg_gate_others(s, user ? current : NULL, seq);
	spin_unlock(&ctx->ev_lock);

	if (wake)
		wake_up_interruptible_poll(&ctx->wq, EPOLLIN | EPOLLRDNORM);
	/* one queued signal is enough: its handler drains everything */
	if (signal && !sigismember(&current->pending.signal, s->signo))
		send_sig_info(s->signo, SEND_SIG_PRIV, current);
	return true;
}

static const struct mmu_interval_notifier_ops kreg_sync_ops = {
	.invalidate = kreg_sync_invalidate,
};

static long kreg_sync_start(struct kreg_ctx *ctx,
			    struct kreg_nf_sync_start __user *uarg)
{
	struct kreg_nf_sync_start arg;
	struct kreg_sync *s;
	long ret;
	int i;

	if (copy_from_user(&arg, uarg, sizeof(arg)))
		return -EFAULT;
	if (arg.flags || arg.reserved || !arg.gate_timeout_ms ||
	    arg.gate_timeout_ms > 60000 || !arg.handler != !arg.signo ||
	    (arg.signo && (!valid_signal(arg.signo) || arg.signo == SIGKILL ||
			   arg.signo == SIGSTOP)))
		return -EINVAL;

	if (mutex_lock_killable(&ctx->lock))
		return -EINTR;
	s = ctx->sync;
	if (s && !s->dead) {
		ret = -EBUSY;
		goto out;
	}
	if (!s) {
		ret = kreg_charge_mem(ctx, sizeof(*s));
		if (ret)
			goto out;
		s = kzalloc(sizeof(*s), GFP_KERNEL_ACCOUNT);
		if (!s) {
			kreg_uncharge_mem(ctx, sizeof(*s));
			ret = -ENOMEM;
			goto out;
		}
		s->ctx = ctx;
		init_waitqueue_head(&s->wq);
		hash_init(s->gates);
		s->dead = true;
		ctx->sync = s;	/* nothing reads it before the notifier is in */
	}
	s->signo = arg.signo;
	s->handler = (unsigned long)arg.handler;
	s->timeout = msecs_to_jiffies(arg.gate_timeout_ms);
	s->owner = get_pid(task_tgid(current));
	for (i = 0; i < KREG_ST_NR; i++)
		atomic64_set(&s->stats[i], 0);
	spin_lock(&ctx->ev_lock);
	s->dead = false;
	s->need_reader = false;
	s->dispatcher = NULL;
	s->q_first = 0;
	s->q_n = 0;
	spin_unlock(&ctx->ev_lock);
	memset(&s->mni, 0, sizeof(s->mni));
	/* current->mm == ctx->mm (checked by the caller): mm_users > 0 */
	ret = mmu_interval_notifier_insert(&s->mni, ctx->mm, 0, TASK_SIZE,
					   &kreg_sync_ops);
	if (ret) {
		spin_lock(&ctx->ev_lock);
		s->dead = true;
		spin_unlock(&ctx->ev_lock);
		put_pid(s->owner);
		s->owner = NULL;
	}
out:
	mutex_unlock(&ctx->lock);
	return ret;
}

/* ctx->lock held. Opens every gate; no callback runs afterwards. */
static void kreg_sync_stop_locked(struct kreg_sync *s)
{
	struct kreg_ctx *ctx = s->ctx;

	spin_lock(&ctx->ev_lock);
	s->dead = true;
	s->need_reader = false;
	s->q_n = 0;
	s->done = s->seq;	/* gates still queued open, after a restart too */
	s->dispatcher = NULL;
	spin_unlock(&ctx->ev_lock);
	wake_up_all(&s->wq);
	mmu_interval_notifier_remove(&s->mni);
	put_pid(s->owner);
	s->owner = NULL;
}

static long kreg_sync_stop(struct kreg_ctx *ctx)
{
	struct kreg_sync *s;
	long ret = 0;

	mutex_lock(&ctx->lock);
	s = ctx->sync;
	if (s && !s->dead)
		kreg_sync_stop_locked(s);
	else
		ret = -ENOENT;
	mutex_unlock(&ctx->lock);
	return ret;
}

/* The live sync of ctx or NULL: set once under ctx->lock, never cleared. */
static struct kreg_sync *kreg_sync_of(struct kreg_ctx *ctx)
{
	struct kreg_sync *s = READ_ONCE(ctx->sync);

	return s && !READ_ONCE(s->dead) ? s : NULL;
}

static long kreg_sync_drain(struct kreg_ctx *ctx,
			    struct kreg_nf_sync_drain __user *uarg)
{
	struct kreg_nf_range out[KREG_DRAIN_BATCH];
	struct kreg_nf_sync_drain arg;
	struct kreg_sync *s;
	bool acked = false;
	u32 n = 0, i;
	u64 snap;
	long ret = 0;

	if (copy_from_user(&arg, uarg, sizeof(arg)))
		return -EFAULT;
	if (!arg.max || arg.max > KREG_NF_SYNC_QUEUE)
		return -EINVAL;
	if (mutex_lock_killable(&ctx->lock))
		return -EINTR;
	s = kreg_sync_of(ctx);
	if (!s) {
		ret = -ENOENT;
		goto out;
	}
	spin_lock(&ctx->ev_lock);
	if (arg.ack > s->seq) {
		spin_unlock(&ctx->ev_lock);
		ret = -EINVAL;
		goto out;
	}
	if (arg.ack > s->done) {
		s->done = arg.ack;
		while (s->q_n && s->q[s->q_first].seq <= s->done) {
			s->q_first = (s->q_first + 1) % KREG_NF_SYNC_QUEUE;
			s->q_n--;
		}
		acked = true;
	}
	if (!s->q_n)
		s->need_reader = false;
	snap = s->seq;
	spin_unlock(&ctx->ev_lock);
	if (acked)
		wake_up_all(&s->wq);

	/*
	 * Hand out only changes that are complete: a range given out while
	 * its pages are still being zapped could be registered again, by a
	 * thread we let go, over the old pages.
	 */
	if (READ_ONCE(s->q_n))
		mmu_interval_read_begin(&s->mni);

	spin_lock(&ctx->ev_lock);
	arg.seq = 0;
	for (i = 0; i < s->q_n && n < min_t(u32, arg.max, KREG_DRAIN_BATCH); i++) {
		struct kreg_sync_ent *e =
			&s->q[(s->q_first + i) % KREG_NF_SYNC_QUEUE];

		if (e->seq > snap)
			break;
		out[n].start = e->start;
		out[n].end = e->end;
		arg.seq = e->seq;
		n++;
	}
	spin_unlock(&ctx->ev_lock);
	arg.count = n;
	if (n)
		kreg_sync_count(s, KREG_ST_DRAINS);
out:
	mutex_unlock(&ctx->lock);
	if (ret)
		return ret;
	/* nothing is dequeued before its ack: a bad buffer loses nothing */
	if (n && copy_to_user(u64_to_user_ptr(arg.buf), out, n * sizeof(out[0])))
		return -EFAULT;
	return copy_to_user(uarg, &arg, sizeof(arg)) ? -EFAULT : 0;
}

static long kreg_sync_dispatcher(struct kreg_ctx *ctx)
{
	struct kreg_sync *s;
	long ret = 0;

	mutex_lock(&ctx->lock);
	s = kreg_sync_of(ctx);
	if (s) {
		spin_lock(&ctx->ev_lock);
		s->dispatcher = current;
		spin_unlock(&ctx->ev_lock);
	} else {
		ret = -ENOENT;
	}
	mutex_unlock(&ctx->lock);
	return ret;
}

static long kreg_sync_stats(struct kreg_ctx *ctx,
			    struct kreg_nf_sync_stats __user *uarg)
{
	struct kreg_nf_sync_stats st;
	__u64 *f = (__u64 *)&st;
	struct kreg_sync *s;
	int i;

	s = kreg_sync_of(ctx);
	if (!s)
		return -ENOENT;
	for (i = 0; i < KREG_ST_NR; i++)
		f[i] = atomic64_read(&s->stats[i]);
	return copy_to_user(uarg, &st, sizeof(st)) ? -EFAULT : 0;
}

static long kreg_ioctl(struct file *file, unsigned int cmd, unsigned long arg)
{
	struct kreg_ctx *ctx = file->private_data;
	void __user *uarg = (void __user *)arg;

	/* a forked child or another process holding the descriptor */
	if (current->mm != ctx->mm)
		return -EPERM;

	switch (cmd) {
	case KREG_NF_IOC_INFO:
		return kreg_info(ctx, uarg);
	case KREG_NF_IOC_REGISTER:
		return kreg_register(ctx, uarg);
	case KREG_NF_IOC_UNREGISTER:
		return kreg_unregister(ctx, uarg);
	case KREG_NF_IOC_SYNC_START:
		return kreg_sync_start(ctx, uarg);
	case KREG_NF_IOC_SYNC_DRAIN:
		return kreg_sync_drain(ctx, uarg);
	case KREG_NF_IOC_SYNC_DISPATCHER:
		return kreg_sync_dispatcher(ctx);
	case KREG_NF_IOC_SYNC_STOP:
		return kreg_sync_stop(ctx);
	case KREG_NF_IOC_SYNC_STATS:
		return kreg_sync_stats(ctx, uarg);
	default:
		return -ENOTTY;
	}
}

/* Copies up to max queued records, leaving them queued (ev_lock). */
static unsigned int kreg_peek(struct kreg_ctx *ctx, struct kreg_nf_event *out,
			      unsigned int max)
{
	unsigned int n = 0;
	u32 slot;

	spin_lock(&ctx->ev_lock);
	for (slot = ctx->q_head; slot != KREG_NO_SLOT && n < max; n++) {
		struct kreg_ev *ev = kreg_ev_of(ctx, slot);

		out[n] = (struct kreg_nf_event){
			.start = ev->start, .end = ev->end, .slot = slot,
		};
		slot = ev->next;
	}
	spin_unlock(&ctx->ev_lock);
	return n;
}

/*
 * Dequeues the leading records that still equal seen[] (another reader may
 * have taken them, or a change may have widened one); returns how many.
 */
static unsigned int kreg_pop(struct kreg_ctx *ctx,
			     const struct kreg_nf_event *seen, unsigned int n)
{
	unsigned int i;

	spin_lock(&ctx->ev_lock);
	for (i = 0; i < n; i++) {
		u32 slot = ctx->q_head;
		struct kreg_ev *ev;

		if (slot != seen[i].slot)
			break;
		ev = kreg_ev_of(ctx, slot);
		if (ev->start != seen[i].start || ev->end != seen[i].end)
			break;
		ctx->q_head = ev->next;
		if (ctx->q_head == KREG_NO_SLOT)
			ctx->q_tail = KREG_NO_SLOT;
		WRITE_ONCE(ctx->q_len, ctx->q_len - 1);
		ev->queued = 0;
		if (!test_bit(slot, ctx->live))
			__clear_bit(slot, ctx->taken);
	}
	spin_unlock(&ctx->ev_lock);
	return i;
}

/*
 * Whole records only. A record is dequeued only once it has been copied to
 * the caller, so a bad buffer loses nothing. No lock is held while copying.
 */
static ssize_t kreg_read(struct file *file, char __user *buf, size_t count,
			 loff_t *ppos)
{
	struct kreg_ctx *ctx = file->private_data;
	struct kreg_nf_event evs[KREG_READ_BATCH];
	size_t max = count / sizeof(evs[0]), done = 0;
	unsigned int n, got;
	int ret;

	if (current->mm != ctx->mm)
		return -EPERM;
	if (!max)
		return -EINVAL;

	while (done < max) {
		n = kreg_peek(ctx, evs, min_t(size_t, max - done,
					      KREG_READ_BATCH));
		if (!n) {
			if (done)
				break;
			if (file->f_flags & O_NONBLOCK)
				return -EAGAIN;
			ret = wait_event_interruptible(ctx->wq,
						       READ_ONCE(ctx->q_len));
			if (ret)
				return ret;
			continue;
		}
		if (copy_to_user(buf + done * sizeof(evs[0]), evs,
				 n * sizeof(evs[0])))
			return done ? done * sizeof(evs[0]) : -EFAULT;
		got = kreg_pop(ctx, evs, n);
		done += got;
		/* taken by a concurrent reader or widened: look again */
		if (got < n && done)
			break;
	}
	return done * sizeof(evs[0]);
}

static __poll_t kreg_poll(struct file *file, poll_table *wait)
{
	struct kreg_ctx *ctx = file->private_data;
	struct kreg_sync *s;

	if (current->mm != ctx->mm)
		return EPOLLERR;
	poll_wait(file, &ctx->wq, wait);
	s = kreg_sync_of(ctx);
	if (READ_ONCE(ctx->q_len) || (s && READ_ONCE(s->need_reader)))
		return EPOLLIN | EPOLLRDNORM;
	return 0;
}

/*
 * A counter page comes in at the first access: allocated then if no
 * REGISTER did it yet (charged like the rest; past max_kib_per_user the
 * access gets SIGBUS), and inserted as a raw PFN, so that nothing can take a
 * reference to it (get_user_pages() refuses VM_PFNMAP | VM_IO mappings, and
 * the special PTE stops fast GUP). The pages stay until release, which the
 * mapping's reference to the file keeps away while any PTE points at them.
 */
static vm_fault_t kreg_fault(struct vm_fault *vmf)
{
	struct kreg_ctx *ctx = vmf->vma->vm_file->private_data;
	unsigned long idx = vmf->pgoff;
	struct page *page;
	int err;

	if (idx >= ctx->nr_pages)
		return VM_FAULT_SIGBUS;
	idx = array_index_nospec(idx, ctx->nr_pages);
	page = kreg_counter_page(ctx, idx, &err);
	if (!page)
		return err == -ENOMEM ? VM_FAULT_OOM : VM_FAULT_SIGBUS;
	return vmf_insert_pfn(vmf->vma, vmf->address, page_to_pfn(page));
}

static const struct vm_operations_struct kreg_vm_ops = {
	.fault = kreg_fault,
};

/*
 * The counters, read-only, at offset 0, at most counters_size bytes, pages
 * inserted as they are touched (kreg_fault). Not copied into a forked child
 * (VM_IO makes madvise(MADV_DOFORK) refuse to undo VM_DONTCOPY), never
 * writable (VM_MAYWRITE cleared, so mprotect cannot add PROT_WRITE), never
 * pinned (VM_PFNMAP), not grown by mremap, not dumped. Takes no lock of
 * ours: mmap_lock is held here.
 */
static int kreg_mmap(struct file *file, struct vm_area_struct *vma)
{
	struct kreg_ctx *ctx = file->private_data;

	if (current->mm != ctx->mm)
		return -EPERM;
	if (vma->vm_pgoff || vma->vm_end - vma->vm_start > ctx->counters_size)
		return -EINVAL;
	if (vma->vm_flags & VM_WRITE)
		return -EACCES;
/* vm_flags became read-only in 6.3 */
#if KERNEL_VERSION(6, 3, 0) <= LINUX_VERSION_CODE
	vm_flags_set(vma, VM_DONTCOPY | VM_DONTEXPAND | VM_DONTDUMP | VM_IO |
		     VM_PFNMAP);
	vm_flags_clear(vma, VM_MAYWRITE);
#else
	vma->vm_flags |= VM_DONTCOPY | VM_DONTEXPAND | VM_DONTDUMP | VM_IO |
			 VM_PFNMAP;
	vma->vm_flags &= ~VM_MAYWRITE;
#endif
	vma->vm_ops = &kreg_vm_ops;
	return 0;
}

/*
 * The uid's entry with one more descriptor, or -EMFILE (max_files_per_user)
 * or -ENOMEM.
 */
static struct kreg_user *kreg_user_get(kuid_t uid, bool unlimited)
{
	struct kreg_user *u;

	mutex_lock(&kreg_users_lock);
	hash_for_each_possible(kreg_users, u, node, __kuid_val(uid))
		if (uid_eq(u->uid, uid))
			goto found;
	u = kzalloc(sizeof(*u), GFP_KERNEL);
	if (!u) {
		mutex_unlock(&kreg_users_lock);
		return ERR_PTR(-ENOMEM);
	}
	u->uid = uid;
	hash_add(kreg_users, &u->node, __kuid_val(uid));
found:
	if (!unlimited && u->nr_files >= READ_ONCE(max_files_per_user)) {
		/* a new entry has nr_files 0 < max_files_per_user */
		mutex_unlock(&kreg_users_lock);
		return ERR_PTR(-EMFILE);
	}
	u->nr_files++;
	mutex_unlock(&kreg_users_lock);
	return u;
}

static void kreg_user_put(struct kreg_user *u)
{
	mutex_lock(&kreg_users_lock);
	if (!--u->nr_files) {
		WARN_ON_ONCE(atomic_long_read(&u->nr_ranges) ||
			     atomic_long_read(&u->bytes));
		hash_del(&u->node);
		kfree(u);
	}
	mutex_unlock(&kreg_users_lock);
}

static void kreg_ctx_free(struct kreg_ctx *ctx)
{
	unsigned int i;
	unsigned int nchunks = DIV_ROUND_UP(ctx->nslots, KREG_CHUNK_SLOTS);

	for (i = 0; ctx->chunks && i < nchunks; i++) {
		if (!ctx->chunks[i])
			continue;
		kfree(ctx->chunks[i]);
		kreg_uncharge_mem(ctx, sizeof(struct kreg_chunk));
	}
	kvfree(ctx->chunks);
	kvfree(ctx->live);
	kvfree(ctx->taken);
	if (ctx->pages)
		for (i = 0; i < ctx->nr_pages; i++)
			if (ctx->pages[i]) {
				__free_page(ctx->pages[i]);
				kreg_uncharge_mem(ctx, PAGE_SIZE);
			}
	kvfree(ctx->pages);
	if (ctx->sync)
		kreg_uncharge_mem(ctx, sizeof(*ctx->sync));
	kfree(ctx->sync);
	put_pid(ctx->tgid);
	kreg_uncharge_mem(ctx, ctx->base_bytes);
	kfree(ctx);
}

/*
 * A context with its arrays; counter pages and per-slot state come later.
 * Charged to the opener's cgroup (GFP_KERNEL_ACCOUNT) and to user: -EDQUOT
 * past max_kib_per_user, or -ENOMEM.
 */
static struct kreg_ctx *kreg_ctx_alloc(u32 nslots, struct kreg_user *user,
				       bool unlimited)
{
	size_t nlongs = BITS_TO_LONGS(nslots);
	size_t nchunks = DIV_ROUND_UP(nslots, KREG_CHUNK_SLOTS);
	size_t counters_size = PAGE_ALIGN((size_t)nslots * sizeof(u64));
	size_t nr_pages = counters_size >> PAGE_SHIFT;
	struct kreg_ctx tmp = { .user = user, .unlimited = unlimited };
	struct kreg_ctx *ctx;
	size_t bytes;

	bytes = sizeof(*ctx) + 2 * nlongs * sizeof(long) +
		(nchunks + nr_pages) * sizeof(void *);
	if (kreg_charge_mem(&tmp, bytes))
		return ERR_PTR(-EDQUOT);
	ctx = kzalloc(sizeof(*ctx), GFP_KERNEL_ACCOUNT);
	if (!ctx) {
		kreg_uncharge_mem(&tmp, bytes);
		return ERR_PTR(-ENOMEM);
	}
	ctx->user = user;
	ctx->unlimited = unlimited;
	ctx->base_bytes = bytes;
	ctx->nslots = nslots;
	ctx->counters_size = counters_size;
	ctx->nr_pages = nr_pages;
	ctx->tree = RB_ROOT_CACHED;
	mutex_init(&ctx->lock);
	spin_lock_init(&ctx->ev_lock);
	init_waitqueue_head(&ctx->wq);
	ctx->q_head = KREG_NO_SLOT;
	ctx->q_tail = KREG_NO_SLOT;

	ctx->pages = kvcalloc(nr_pages, sizeof(*ctx->pages),
			      GFP_KERNEL_ACCOUNT);
	ctx->chunks = kvcalloc(nchunks, sizeof(*ctx->chunks),
			       GFP_KERNEL_ACCOUNT);
	ctx->live = kvcalloc(nlongs, sizeof(long), GFP_KERNEL_ACCOUNT);
	ctx->taken = kvcalloc(nlongs, sizeof(long), GFP_KERNEL_ACCOUNT);
	if (!ctx->pages || !ctx->chunks || !ctx->live || !ctx->taken) {
		kreg_ctx_free(ctx);
		return ERR_PTR(-ENOMEM);
	}
	return ctx;
}

static int kreg_open(struct inode *inode, struct file *file)
{
	struct kreg_user *user;
	struct kreg_ctx *ctx;
	bool unlimited;

	if (!current->mm)
		return -EPERM;
	unlimited = ns_capable_noaudit(&init_user_ns, CAP_SYS_RESOURCE) ||
		    ns_capable_noaudit(&init_user_ns, CAP_SYS_ADMIN);
	user = kreg_user_get(current_uid(), unlimited);
	if (IS_ERR(user))
		return PTR_ERR(user);
	ctx = kreg_ctx_alloc(READ_ONCE(max_ranges), user, unlimited);
	if (IS_ERR(ctx)) {
		kreg_user_put(user);
		return PTR_ERR(ctx);
	}
	mmgrab(current->mm);
	ctx->mm = current->mm;
	ctx->file = file;
	ctx->tgid = get_pid(task_tgid(current));
	file->private_data = ctx;
	atomic_long_inc(&kreg_nr_contexts);
	return stream_open(inode, file);
}

/*
 * Last close: at close(), at exit (after exit_mm(): the address space may be
 * gone already, the mm_struct itself is still ours), in whatever process
 * held the last reference. No ioctl, read, mmap or fault can run any more.
 */
static int kreg_release(struct inode *inode, struct file *file)
{
	struct kreg_ctx *ctx = file->private_data;
	struct kreg_user *user = ctx->user;
	struct kreg_range **rp;
	u32 slot;

	/* no gate is queued any more: each holds a reference to the file */
	if (ctx->sync && !ctx->sync->dead)
		kreg_sync_stop_locked(ctx->sync);
	for (slot = 0; slot < ctx->nslots; slot++) {
		rp = kreg_range_ptr(ctx, slot);
		if (!rp) {
			slot = round_up(slot + 1, KREG_CHUNK_SLOTS) - 1;
			continue;
		}
		if (*rp) {
			kreg_drop(ctx, *rp);
			cond_resched();
		}
	}
	mmdrop(ctx->mm);
	kreg_ctx_free(ctx);
	kreg_user_put(user);
	atomic_long_dec(&kreg_nr_contexts);
	return 0;
}

/*
 * Every close() of a descriptor of the file: the owner's close (or its
 * exit) stops synchronous delivery, which queued gates would otherwise keep
 * alive with their references to the file.
 */
static int kreg_flush(struct file *file, fl_owner_t id)
{
	struct kreg_ctx *ctx = file->private_data;

	if (task_tgid(current) == ctx->tgid && kreg_sync_of(ctx))
		kreg_sync_stop(ctx);
	return 0;
}

static const struct file_operations kreg_fops = {
	.owner = THIS_MODULE,
	.open = kreg_open,
	.flush = kreg_flush,
	.release = kreg_release,
	.unlocked_ioctl = kreg_ioctl,
	.compat_ioctl = compat_ptr_ioctl,
	.read = kreg_read,
	.poll = kreg_poll,
	.mmap = kreg_mmap,
};

/* The live counts tell what other users do: root only (0400). */
struct kreg_count_attr {
	struct device_attribute attr;
	atomic_long_t *count;
};

static ssize_t kreg_count_show(struct device *dev,
			       struct device_attribute *attr, char *buf)
{
	struct kreg_count_attr *ca =
		container_of(attr, struct kreg_count_attr, attr);

	return sysfs_emit(buf, "%ld\n", atomic_long_read(ca->count));
}

#define KREG_COUNT_ATTR(_name, _count)					\
	struct kreg_count_attr kreg_attr_##_name = {			\
		.attr = __ATTR(_name, 0400, kreg_count_show, NULL),	\
		.count = &(_count),					\
	}

static KREG_COUNT_ATTR(contexts, kreg_nr_contexts);
static KREG_COUNT_ATTR(ranges, kreg_nr_ranges);
static KREG_COUNT_ATTR(memory, kreg_nr_bytes);

/* "uid descriptors ranges bytes", a line per uid holding a descriptor */
static ssize_t users_show(struct device *dev, struct device_attribute *attr,
			  char *buf)
{
	struct kreg_user *u;
	int len = 0, bkt;

	mutex_lock(&kreg_users_lock);
	hash_for_each(kreg_users, bkt, u, node)
		len += sysfs_emit_at(buf, len, "%u %u %ld %ld\n",
				     from_kuid(&init_user_ns, u->uid),
				     u->nr_files,
				     atomic_long_read(&u->nr_ranges),
				     atomic_long_read(&u->bytes));
	mutex_unlock(&kreg_users_lock);
	return len;
}
static DEVICE_ATTR_ADMIN_RO(users);

static struct attribute *kreg_attrs[] = {
	&kreg_attr_contexts.attr.attr,
	&kreg_attr_ranges.attr.attr,
	&kreg_attr_memory.attr.attr,
	&dev_attr_users.attr,
	NULL,
};
ATTRIBUTE_GROUPS(kreg);

static struct miscdevice kreg_misc = {
	.minor = MISC_DYNAMIC_MINOR,
	.name = "kreg_notifier",
	.fops = &kreg_fops,
	.groups = kreg_groups,
	/* every call acts on the caller's own address space only */
	.mode = 0666,
};
module_misc_device(kreg_misc);

MODULE_DESCRIPTION("Counters that tell a process when registered memory goes away (mmu_interval_notifier)");
MODULE_AUTHOR("ucx-kreg");
MODULE_LICENSE("GPL");
MODULE_VERSION("0.1.0");
