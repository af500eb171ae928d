// SPDX-License-Identifier: GPL-2.0
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/file.h>
#include <linux/hashtable.h>
#include <linux/mm.h>
#include <linux/mmu_notifier.h>
#include <linux/pgtable.h>
#include <linux/pid.h>
#include <linux/poll.h>
#include <linux/sched/mm.h>
#include <linux/sched/signal.h>
#include <linux/sched/task_stack.h>
#include <linux/slab.h>
#include <linux/task_work.h>
#include <linux/uaccess.h>
#include <linux/wait.h>

#include "kreg_priv.h"

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

long kreg_sync_start(struct kreg_ctx *ctx,
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
void kreg_sync_stop_locked(struct kreg_sync *s)
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

long kreg_sync_stop(struct kreg_ctx *ctx)
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
struct kreg_sync *kreg_sync_of(struct kreg_ctx *ctx)
{
	struct kreg_sync *s = READ_ONCE(ctx->sync);

	return s && !READ_ONCE(s->dead) ? s : NULL;
}

long kreg_sync_drain(struct kreg_ctx *ctx,
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

long kreg_sync_dispatcher(struct kreg_ctx *ctx)
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

long kreg_sync_stats(struct kreg_ctx *ctx,
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

bool kreg_sync_need_reader(struct kreg_sync *s)
{
	return READ_ONCE(s->need_reader);
}

/* At release, after kreg_sync_stop_locked(): the context's sync, if any. */
void kreg_sync_free(struct kreg_ctx *ctx)
{
	if (ctx->sync)
		kreg_uncharge_mem(ctx, sizeof(*ctx->sync));
	kfree(ctx->sync);
}
