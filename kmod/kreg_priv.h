/* SPDX-License-Identifier: GPL-2.0 */
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
 *                      SYNC_START and SYNC_STOP too (mmu_notifier_register
 *                      takes mmap_lock; _unregister waits for callbacks).
 *   kreg_syncs_lock (mutex) the started syncs, one per mm: START and STOP,
 *                      inside ctx->lock.
 *   ctx->ev_lock (spin) the event queue, the per-slot event state and the
 *                      live/taken bitmaps. Taken by the invalidate callback;
 *                      nothing that sleeps runs under it.
 *   sync->lock (spin)  synchronous delivery: its queue, the changes in
 *                      flight, the gates. Taken by its notifier's callbacks
 *                      (under mmap_lock or not, maybe non-blockable), by
 *                      gates and DRAIN; never together with ctx->ev_lock.
 *                      Under it: the owner's siglock (to walk its threads)
 *                      and a task's pi_lock and runqueue lock (task_work_add
 *                      with TWA_SIGNAL wakes); never the reverse.
 *   The probes (kreg_probes.c) read the started syncs under RCU and take
 *                      sync->lock, in the thread that calls mmap, brk,
 *                      mremap or shmat, or that clone()s.
 * kreg_users_lock (mutex) the per-uid table: open, release and sysfs only,
 * never with another lock of ours held. Counter pages are published with
 * cmpxchg() and never change until release: the fault handler (under
 * mmap_lock or the VMA lock) takes no lock of ours.
 */
#ifndef KREG_PRIV_H
#define KREG_PRIV_H

#include <linux/atomic.h>
#include <linux/fs.h>
#include <linux/hashtable.h>
#include <linux/interval_tree.h>
#include <linux/kref.h>
#include <linux/list.h>
#include <linux/mm_types.h>
#include <linux/mmu_notifier.h>
#include <linux/mutex.h>
#include <linux/poll.h>
#include <linux/ratelimit.h>
#include <linux/spinlock.h>
#include <linux/types.h>
#include <linux/uidgid.h>
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
	struct file *file;		/* ours */
	struct pid *tgid;		/* the opener's process */
	struct kreg_sync *sync;		/* set once (ctx->lock), put at release */
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

struct kreg_user;

/* kreg_limits.c */
extern unsigned int kreg_max_ranges;
extern unsigned int kreg_max_overlap;
extern atomic_long_t kreg_nr_contexts;
extern atomic_long_t kreg_nr_ranges;
extern atomic_long_t kreg_nr_bytes;
int kreg_charge_mem(struct kreg_ctx *ctx, size_t bytes);
void kreg_uncharge_mem(struct kreg_ctx *ctx, size_t bytes);
int kreg_charge_range(struct kreg_ctx *ctx);
void kreg_uncharge_range(struct kreg_ctx *ctx);
struct kreg_user *kreg_user_get(kuid_t uid, bool unlimited);
void kreg_user_put(struct kreg_user *u);
ssize_t kreg_users_show(char *buf);

/* kreg_range.c */
struct kreg_ev *kreg_ev_of(struct kreg_ctx *ctx, u32 slot);
struct kreg_range **kreg_range_ptr(struct kreg_ctx *ctx, u32 slot);
u64 kreg_bump(atomic64_t *counter);
void kreg_drop(struct kreg_ctx *ctx, struct kreg_range *r);
long kreg_register(struct kreg_ctx *ctx, struct kreg_nf_register __user *uarg);
long kreg_unregister(struct kreg_ctx *ctx,
		     struct kreg_nf_unregister __user *uarg);
unsigned int kreg_peek(struct kreg_ctx *ctx, struct kreg_nf_event *out,
		       unsigned int max);
unsigned int kreg_pop(struct kreg_ctx *ctx, const struct kreg_nf_event *seen,
		      unsigned int n);

/* kreg_vm.c */
struct page *kreg_counter_page(struct kreg_ctx *ctx, unsigned int idx,
			       int *err);
int kreg_mmap(struct file *file, struct vm_area_struct *vma);

/*
 * Synchronous delivery (kreg_sync.c, kreg_gate.c, kreg_probes.c, kreg_pinned.c).
 * What sync->lock guards is marked; the rest is set at SYNC_START, before
 * the notifier is registered, and read without it.
 */
#define KREG_SYNC_INFLIGHT	64	/* changes tracked to their end at once */
#define KREG_GATE_BITS		8

enum kreg_sync_stat {		/* the fields of struct kreg_nf_sync_stats */
	KREG_ST_QUEUED, KREG_ST_SIGNALLED, KREG_ST_SELF_GATED, KREG_ST_GATES,
	KREG_ST_GATE_WAITS, KREG_ST_GATE_TIMEOUTS, KREG_ST_GATE_NOMEM,
	KREG_ST_LATE, KREG_ST_OVERFLOWS, KREG_ST_UNPINNED, KREG_ST_DRAINS,
	KREG_ST_GATE_PASSES, KREG_ST_THREADS, KREG_ST_DRAIN_WAITS,
	KREG_ST_OWN_CHANGES, KREG_ST_INFLIGHT_FULL, KREG_ST_IRQ_RELEASES,
	KREG_ST_IRQ_NEXT_HELD, KREG_ST_IRQ_UNWATCHED, KREG_ST_BORN_HELD,
	KREG_ST_IRQ_NEXT_RELEASED, KREG_ST_CALL_RELEASES, KREG_ST_IRQ_PASSES,
	KREG_ST_PARKED, KREG_ST_PARKED_HELD,
	KREG_ST_NR = sizeof(struct kreg_nf_sync_stats) / sizeof(__u64)
};

/* A queued change: its range and what acknowledges it. */
struct kreg_sync_ent {
	u64 start;
	u64 end;	/* == start: a huge page split, nothing to report */
	u64 seq;
	u32 pending;	/* invalidations merged in that have not ended yet */
	unsigned long ended;	/* jiffies: its (last) end, or when queued */
	bool merged;	/* a full queue widened it */
	bool gone;	/* its range has no VMA left: kreg_change_gone() */
};

/* An invalidation in flight, from its start callback to its end. */
struct kreg_sync_inflight {
	const struct mmu_notifier_range *range;	/* compared only */
	u32 idx;				/* its entry in q[] */
	unsigned long split_pfn;	/* kreg_split_candidate() */
};

/*
 * Outlives the context while gates that point at it are queued on threads
 * (task_work cannot be cancelled from a module): ref counts the context's
 * reference and one per queued or running gate.
 */
struct kreg_sync {
	struct mmu_notifier mn;		/* on mm while live */
	struct kref ref;
	struct mm_struct *mm;		/* the context's; compared only */
	struct pid *owner;		/* whose threads are held */
	int signo;			/* 0: no signal, the reader reports */
	unsigned long handler;		/* signo's handler that drains */
	unsigned long timeout;		/* jiffies */
	bool unpinned;			/* KREG_NF_SYNC_UNPINNED */
	wait_queue_head_t wq;		/* gates and DRAINs */
	wait_queue_head_t poll_wq;	/* the reader's poll() */
	spinlock_t lock;
	/* under lock: */
	bool dead;			/* stopped: nothing queued, no gate holds */
	bool need_reader;		/* poll() says EPOLLIN */
	/* a DRAIN gave up waiting for a change: ask again at an end */
	bool ask_at_end;
	bool rescan;			/* a thread got no gate: walk all again */
	struct pid *dispatcher;		/* the reader: never held */
	u64 seq;			/* last queued */
	u64 done;			/* acknowledged up to */
	u32 q_first;
	u32 q_n;
	u32 nr_inflight;
	struct kreg_sync_ent q[KREG_NF_SYNC_QUEUE];
	struct kreg_sync_inflight inflight[KREG_SYNC_INFLIGHT];
	DECLARE_HASHTABLE(gates, KREG_GATE_BITS);	/* by task */
	struct list_head idle;		/* gates to arm at the next change */
	/* gates armed only by a change that keeps its mapping (kreg_gate.c) */
	struct list_head parked;
	u32 nr_parked;			/* lock; read without it by the hook */
	struct list_head live;		/* on kreg_syncs (RCU) while started */
	struct ratelimit_state say_rs;	/* a timed-out gate's log lines */
	atomic64_t stats[KREG_ST_NR];
};

/* kreg_sync.c */
long kreg_sync_start(struct kreg_ctx *ctx,
		     struct kreg_nf_sync_start __user *uarg);
void kreg_sync_stop_locked(struct kreg_sync *s);
long kreg_sync_stop(struct kreg_ctx *ctx);
struct kreg_sync *kreg_sync_of(struct kreg_ctx *ctx);
long kreg_sync_drain(struct kreg_ctx *ctx,
		     struct kreg_nf_sync_drain __user *uarg);
long kreg_sync_dispatcher(struct kreg_ctx *ctx);
long kreg_sync_stats(struct kreg_ctx *ctx,
		     struct kreg_nf_sync_stats __user *uarg);
__poll_t kreg_sync_poll(struct kreg_sync *s, struct file *file,
			poll_table *wait);
void kreg_sync_put(struct kreg_ctx *ctx);
void kreg_sync_release(struct kref *ref);
void kreg_sync_count(struct kreg_sync *s, enum kreg_sync_stat i);
void kreg_sync_wake_reader(struct kreg_sync *s);
void kreg_sync_born(struct task_struct *child);
unsigned long kreg_sync_call(struct file *file, unsigned long addr,
			     unsigned long len, unsigned long flags, bool place);
void kreg_sync_syscall(void);

/* kreg_place.c */
unsigned long kreg_place(struct kreg_sync *s, struct file *file,
			 unsigned long addr, unsigned long len,
			 unsigned long flags);

/* kreg_gate.c */
void kreg_gates_arm(struct kreg_sync *s, struct list_head *reap);
void kreg_gates_stop(struct kreg_sync *s, struct list_head *reap);
void kreg_gates_reap(struct list_head *reap);
void kreg_gate_exempt(struct kreg_sync *s, struct task_struct *t);
void kreg_gate_reporting(struct kreg_sync *s, struct task_struct *t, bool on);
void kreg_gate_call(struct kreg_sync *s);
void kreg_gate_syscall(struct kreg_sync *s);
void kreg_gate_born(struct kreg_sync *s, struct task_struct *child);

/* kreg_probes.c */
void kreg_probes_get(void);
bool kreg_call_hook_on(void);
bool kreg_syscall_hook_on(void);
unsigned long kreg_call_hook_puts(void);
unsigned long kreg_fork_probe_puts(void);
void kreg_probes_exit(void);

/* kreg_signal.c */
bool kreg_owner_siglocked(struct pid *owner,
			  void (*fn)(struct task_struct *p,
				     struct sighand_struct *sh, void *arg),
			  void *arg);
int kreg_signal_hold(int signo, unsigned long handler);
void kreg_signal_release(struct pid *owner, int signo, unsigned long handler);

/* kreg_pinned.c */
bool kreg_range_pinned(struct mm_struct *mm, unsigned long addr,
		       unsigned long end, bool any);
unsigned long kreg_split_candidate(struct mm_struct *mm, unsigned long start,
				   unsigned long end);
bool kreg_split_kept(struct mm_struct *mm, unsigned long start,
		     unsigned long pfn);

/* kreg_file.c */
extern const struct file_operations kreg_fops;

#endif /* KREG_PRIV_H */
