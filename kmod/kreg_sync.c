// SPDX-License-Identifier: GPL-2.0
/*
 * Synchronous delivery (uapi: KREG_NF_IOC_SYNC_*): every change of pinned
 * memory reaches user space's registration caches before any thread of the
 * process can act on it.
 *
 * One mmu_notifier on the address space. Its start callback keeps what can
 * matter (a change of pages that may be pinned for DMA) and queues the
 * range; its end callback marks the change complete. Then:
 *  - the changing thread, if signo is set and reaches it, is sent signo;
 *    its handler DRAINs the queue into UCX before the thread's next
 *    instruction. Otherwise (signo 0, blocked, replaced; another process,
 *    a kernel thread, io_uring's workers) the reader is woken to DRAIN;
 *  - every thread of the process passes a gate (kreg_gate.c) at its next
 *    return to user space and waits there until the change is reported:
 *    a thread must enter the kernel to map the freed addresses or to see
 *    new pages, so none acts on them before UCX knows (the cross-thread
 *    window). The changing thread's own gate lets it go when its own
 *    handler is about to report.
 * DRAIN hands out a change only once it has ended: a range reported while
 * its pages are still being zapped could be registered again, by a thread
 * let go meanwhile, over the old pages.
 *
 * Locks: ctx->lock (START, STOP, DISPATCHER's changes of who reads) and
 * sync->lock (all the rest), see kreg_priv.h. DRAIN takes no mutex: it
 * never waits behind a REGISTER that waits for mmap_lock.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/compat.h>
#include <linux/mm.h>
#include <linux/mman.h>
#include <linux/mmu_notifier.h>
#include <linux/pid.h>
#include <linux/poll.h>
#include <linux/rculist.h>
#include <linux/sched/mm.h>
#include <linux/sched/signal.h>
#include <linux/slab.h>
#include <linux/uaccess.h>
#include <linux/wait.h>
#include <linux/sched/task_stack.h>
#include <linux/unistd.h>
#include <asm/syscall.h>

#include "kreg_priv.h"

#define KREG_DRAIN_BATCH	32

/*
 * Every started sync, by mm: one per address space. Two would hold the
 * same signal, and the first STOP would give it back under the second.
 * Taken inside ctx->lock.
 */
static LIST_HEAD(kreg_syncs);
static DEFINE_MUTEX(kreg_syncs_lock);

void kreg_sync_count(struct kreg_sync *s, enum kreg_sync_stat i)
{
	atomic64_inc(&s->stats[i]);
}

void kreg_sync_wake_reader(struct kreg_sync *s)
{
	spin_lock(&s->lock);
	s->need_reader = !s->dead;
	spin_unlock(&s->lock);
	wake_up_interruptible_poll(&s->poll_wq, EPOLLIN | EPOLLRDNORM);
}

/* current's handler of signo (1.._NSIG) */
static unsigned long kreg_handler_of(int signo)
{
	/* current's own: only its exec replaces it */
	struct sighand_struct *sh = rcu_dereference_protected(current->sighand, 1);

	return (unsigned long)READ_ONCE(sh->action[signo - 1].sa.sa_handler);
}

/* signo's handler is the one that drains and current does not block it */
static bool kreg_signal_reaches(struct kreg_sync *s)
{
	return s->signo && !sigismember(&current->blocked, s->signo) &&
	       kreg_handler_of(s->signo) == s->handler;
}

/*
 * Queues [start, end) as a change in flight (lock held). A full queue
 * widens its newest entry, which then takes the new seq: entries stay in
 * seq order.
 */
static void kreg_sync_queue(struct kreg_sync *s,
			    const struct mmu_notifier_range *range,
			    unsigned long split_pfn, bool gone)
{
	struct kreg_sync_ent *e;
	u32 idx;

	if (s->q_n == KREG_NF_SYNC_QUEUE) {
		idx = (s->q_first + s->q_n - 1) % KREG_NF_SYNC_QUEUE;
		e = &s->q[idx];
		e->start = min_t(u64, e->start, range->start);
		e->end = max_t(u64, e->end, range->end);
		e->merged = true;
		e->gone = e->gone && gone;
		kreg_sync_count(s, KREG_ST_OVERFLOWS);
	} else {
		idx = (s->q_first + s->q_n++) % KREG_NF_SYNC_QUEUE;
		e = &s->q[idx];
		e->start = range->start;
		e->end = range->end;
		e->pending = 0;
		e->merged = false;
		e->gone = gone;
	}
	e->seq = ++s->seq;
	e->ended = jiffies;
	kreg_sync_count(s, KREG_ST_QUEUED);
	if (s->nr_inflight < KREG_SYNC_INFLIGHT) {
		s->inflight[s->nr_inflight].range = range;
		s->inflight[s->nr_inflight].idx = idx;
		s->inflight[s->nr_inflight].split_pfn = split_pfn;
		s->nr_inflight++;
		e->pending++;
	} else {
		/* handed out without waiting for its end: counted */
		kreg_sync_count(s, KREG_ST_INFLIGHT_FULL);
	}
}

/*
 * Whether range is current's own unmap, for KREG_NF_SYNC_UNPINNED: made in
 * a system call (not a fault's copy-on-write break), and not one of the
 * calls that only lock or protect pages (where a VMA boundary they make
 * falls inside a huge page they split it: an invalidation of its 2 MiB
 * that keeps every page, and the signal would be paid for nothing). The
 * calls that unmap (munmap, mremap, mmap over, brk, shmdt) take pages
 * away in MMU_NOTIFY_UNMAP; a MMU_NOTIFY_CLEAR in them is such a split
 * at the boundary, which 6.1 invalidates whether the PMD is huge or not
 * (split_huge_pmd_address()): reported, it invalidated the live
 * registrations around it (UCS's test_rcache merge/mt_6, 1 in 8 runs).
 * UCM's hooks report none of these either. A 32-bit caller's numbers are
 * another table: everything counts.
 */
static bool kreg_own_unmap(const struct mmu_notifier_range *range)
{
	int nr = syscall_get_nr(current, task_pt_regs(current));

	if (nr < 0)
		return false;
	if (in_compat_syscall())
		return true;
	switch (nr) {
	case __NR_mlock:
	case __NR_munlock:
	case __NR_mlockall:
	case __NR_munlockall:
#ifdef __NR_mlock2
	case __NR_mlock2:
#endif
	case __NR_mprotect:
#ifdef __NR_pkey_mprotect
	case __NR_pkey_mprotect:
#endif
		return false;
	case __NR_munmap:
	case __NR_mremap:
	case __NR_brk:
#ifdef __NR_mmap
	case __NR_mmap:
#endif
#ifdef __NR_shmdt
	case __NR_shmdt:
#endif
		return range->event == MMU_NOTIFY_UNMAP;
	default:
		return true;
	}
}

/*
 * Whether range, current's own change, takes its mapping away and leaves
 * no VMA there: the pages go in MMU_NOTIFY_UNMAP inside munmap, brk (which
 * shrinks), shmdt, or an mremap that moves or shrinks them. Once such a
 * change is queued, a touch of the range faults on no VMA, and a thread
 * can map a page there only by a call that can return an address (mmap,
 * mremap, brk, shmat), which the call hooks hold (kreg_probes.c). Not an
 * mmap over the range (MAP_FIXED) nor an mremap onto it (MREMAP_FIXED):
 * a new VMA is there at once, and a touch maps a new page at an address
 * the report is about; nor MREMAP_DONTUNMAP, which leaves the old range
 * mapped, empty. A hugetlb madvise zaps in MMU_NOTIFY_UNMAP too, and keeps
 * its VMA: so the call decides, not the event. The MMU_NOTIFY_CLEAR inside
 * those calls is the split of a PMD at a VMA boundary made inside its
 * 2 MiB (6.1 announces one there, huge page or not): every page stays
 * mapped, so a touch finds the same page, and the part the call unmaps
 * goes in its MMU_NOTIFY_UNMAP; gone too (held there, a spinner waited
 * for the 50 ms fuse whenever its neighbour's munmap split one). Not
 * reclaim's or migration's work in the call (PF_MEMALLOC), nor a range
 * below a VM_GROWSDOWN stack (a touch grows the stack over it). A 32-bit
 * caller: no.
 */
static bool kreg_change_gone(const struct mmu_notifier_range *range)
{
	struct pt_regs *regs = task_pt_regs(current);
	struct vm_area_struct *above;
	unsigned long args[6];

	if ((range->event != MMU_NOTIFY_UNMAP &&
	     range->event != MMU_NOTIFY_CLEAR) ||
	    (current->flags & PF_MEMALLOC) || in_compat_syscall())
		return false;
	switch (syscall_get_nr(current, regs)) {
	case __NR_munmap:
	case __NR_brk:
	case __NR_shmdt:
		break;
	case __NR_mremap:
		/* addr, old_len, new_len, flags, new_addr */
		syscall_get_arguments(current, regs, args);
		if (args[3] & MREMAP_DONTUNMAP)
			return false;
		/* the target's old pages, replaced by the moved VMA */
		if ((args[3] & MREMAP_FIXED) && range->end > args[4] &&
		    args[4] + args[2] > range->start)
			return false;
		break;
	default:
		return false;
	}
	/*
	 * Nor below a stack that a touch grows down into the range (these
	 * calls all hold mmap_lock here)
	 */
	above = find_vma(range->mm, range->end);
	return !above || !(above->vm_flags & VM_GROWSDOWN);
}

static int kreg_sync_range_start(struct mmu_notifier *mn,
				 const struct mmu_notifier_range *range)
{
	struct kreg_sync *s = container_of(mn, struct kreg_sync, mn);
	struct mm_struct *mm = range->mm;
	bool wanted, user, own, signal = false, reader = false;
	unsigned long split_pfn;
	LIST_HEAD(reap);

	switch (range->event) {
	case MMU_NOTIFY_PROTECTION_VMA:		/* mprotect, uffd-wp */
	case MMU_NOTIFY_PROTECTION_PAGE:	/* write-protect for writeback */
	case MMU_NOTIFY_SOFT_DIRTY:		/* clear_refs */
	case MMU_NOTIFY_RELEASE:
		/* the same pages stay mapped */
		return 0;
	default:
		break;
	}
	/* exit_mmap(): nothing of the process runs any more */
	if (!atomic_read(&mm->mm_users))
		return 0;
	/*
	 * Only pinned pages matter, whoever changes them: this process must
	 * have pinned something (pinned_vm), and the range must hold a pinned
	 * page. Pages this process never pinned queue nothing, whoever
	 * truncates the file behind them. With KREG_NF_SYNC_UNPINNED the
	 * address space's own changes of any page mapped matter too, made in
	 * a system call (munmap, mremap, madvise, brk, shmdt, MAP_FIXED) by
	 * its threads, a vfork child or an io_uring worker, as UCM's hooks
	 * see them. Not a fault's copy-on-write break (the hooks never
	 * reported one, and after fork every first write would cost the
	 * signal; one in a handler could only wait for the reader), not
	 * reclaim's or compaction's work done in the thread's system call
	 * (PF_MEMALLOC: swap-out, migration, the deferred split of a huge
	 * page partly unmapped earlier; UCM never saw them either), nor
	 * another process's or a kernel thread's change.
	 */
	if (s->unpinned && current->mm == mm &&
	    !(current->flags & (PF_KTHREAD | PF_MEMALLOC)) &&
	    kreg_own_unmap(range))
		wanted = kreg_range_pinned(mm, range->start, range->end, true);
	else
		wanted = atomic64_read(&mm->pinned_vm) &&
			 kreg_range_pinned(mm, range->start, range->end, false);
	if (!wanted) {
		kreg_sync_count(s, KREG_ST_UNPINNED);
		return 0;
	}
	split_pfn = kreg_split_candidate(mm, range->start, range->end);
	/* a thread of the process (not a vfork child sharing its mm) */
	user = current->mm == mm && task_tgid(current) == READ_ONCE(s->owner) &&
	       !(current->flags & (PF_KTHREAD | PF_IO_WORKER | PF_EXITING));

	spin_lock(&s->lock);
	if (s->dead) {
		spin_unlock(&s->lock);
		return 0;
	}
	kreg_sync_queue(s, range, split_pfn, user && kreg_change_gone(range));
	own = user && task_pid(current) == s->dispatcher;
	if (own) {
		/* the reader's own change: it reports it when back in its loop */
		kreg_sync_count(s, KREG_ST_OWN_CHANGES);
		reader = true;
	} else if (user && kreg_signal_reaches(s)) {
		signal = true;
		kreg_sync_count(s, KREG_ST_SIGNALLED);
	} else if (user) {
		/* no handler will run: its gate holds it until the reader's */
		kreg_sync_count(s, KREG_ST_SELF_GATED);
		reader = true;
	} else {
		/* another process, a kernel thread, an io_uring worker */
		kreg_sync_count(s, KREG_ST_LATE);
		reader = true;
	}
	if (reader)
		s->need_reader = true;
	kreg_gates_arm(s, &reap);
	spin_unlock(&s->lock);
	kreg_gates_reap(&reap);

	if (reader)
		wake_up_interruptible_poll(&s->poll_wq, EPOLLIN | EPOLLRDNORM);
	/* one queued signal is enough: its handler drains everything */
	if (signal && !sigismember(&current->pending.signal, s->signo))
		send_sig_info(s->signo, SEND_SIG_PRIV, current);
	return 0;
}

/*
 * The change has ended: its pages are gone from the page tables, or, for a
 * huge page split, all still there (its entry is emptied: nothing to
 * report, still acknowledged in turn).
 */
static void kreg_sync_range_end(struct mmu_notifier *mn,
				const struct mmu_notifier_range *range)
{
	struct kreg_sync *s = container_of(mn, struct kreg_sync, mn);
	struct kreg_sync_inflight *f;
	struct kreg_sync_ent *e;
	bool found = false, ask = false;
	u32 i;

	/* every invalidation of the mm comes here: most are not ours */
	if (!READ_ONCE(s->nr_inflight))
		return;
	spin_lock(&s->lock);
	for (i = 0; i < s->nr_inflight; i++) {
		f = &s->inflight[i];
		if (f->range != range)
			continue;
		/* pending: neither handed out nor dequeued, e is still f's */
		e = &s->q[f->idx];
		e->pending--;
		if (f->split_pfn && !e->pending && !e->merged &&
		    e->start == range->start && e->end == range->end &&
		    kreg_split_kept(range->mm, range->start, f->split_pfn))
			e->end = e->start;
		e->ended = jiffies;
		/*
		 * A DRAIN that waited for it gave up and got nothing: ask the
		 * reader again, or no one may (another process's change: no
		 * thread of this one comes to a gate after it).
		 */
		if (!e->pending && s->ask_at_end) {
			s->ask_at_end = false;
			s->need_reader = !s->dead;
			ask = true;
		}
		*f = s->inflight[--s->nr_inflight];
		found = true;
		break;
	}
	spin_unlock(&s->lock);
	if (found)
		wake_up_all(&s->wq);
	if (ask)
		wake_up_interruptible_poll(&s->poll_wq, EPOLLIN | EPOLLRDNORM);
}

static const struct mmu_notifier_ops kreg_sync_ops = {
	.invalidate_range_start = kreg_sync_range_start,
	.invalidate_range_end = kreg_sync_range_end,
};

void kreg_sync_release(struct kref *ref)
{
	kfree(container_of(ref, struct kreg_sync, ref));
}

/* -EBUSY if another descriptor's delivery runs on mm (kreg_syncs_lock) */
static long kreg_sync_of_mm(struct mm_struct *mm)
{
	struct kreg_sync *o;

	list_for_each_entry(o, &kreg_syncs, live)
		if (o->mm == mm)
			return -EBUSY;
	return 0;
}

long kreg_sync_start(struct kreg_ctx *ctx,
		     struct kreg_nf_sync_start __user *uarg)
{
	struct kreg_nf_sync_start arg;
	struct kreg_sync *s;
	LIST_HEAD(reap);
	long ret;
	int i;

	if (copy_from_user(&arg, uarg, sizeof(arg)))
		return -EFAULT;
	if ((arg.flags & ~KREG_NF_SYNC_UNPINNED) || arg.reserved ||
	    !arg.gate_timeout_ms ||
	    arg.gate_timeout_ms > 60000 || !arg.handler != !arg.signo ||
	    (arg.signo && (!valid_signal(arg.signo) || arg.signo == SIGKILL ||
			   arg.signo == SIGSTOP)))
		return -EINVAL;

	if (mutex_lock_killable(&ctx->lock))
		return -EINTR;
	mutex_lock(&kreg_syncs_lock);
	s = ctx->sync;
	if (s && !s->dead) {
		ret = -EBUSY;
		goto out;
	}
	ret = kreg_sync_of_mm(ctx->mm);
	if (ret)
		goto out;
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
		kref_init(&s->ref);		/* the context's */
		s->mm = ctx->mm;
		init_waitqueue_head(&s->wq);
		init_waitqueue_head(&s->poll_wq);
		spin_lock_init(&s->lock);
		hash_init(s->gates);
		INIT_LIST_HEAD(&s->idle);
		INIT_LIST_HEAD(&s->parked);
		INIT_LIST_HEAD(&s->live);
		s->dead = true;
		ctx->sync = s;	/* nothing reads it before the notifier is in */
	}
	/* nothing the application does with signo can kill it from now on */
	if (arg.signo) {
		ret = kreg_signal_hold(arg.signo, arg.handler);
		if (ret)
			goto out;
	}
	s->signo = arg.signo;
	s->handler = (unsigned long)arg.handler;
	s->timeout = msecs_to_jiffies(arg.gate_timeout_ms);
	s->unpinned = arg.flags & KREG_NF_SYNC_UNPINNED;
	for (i = 0; i < KREG_ST_NR; i++)
		atomic64_set(&s->stats[i], 0);
	/* a few timed-out gates a process said in the log, then quiet */
	ratelimit_state_init(&s->say_rs, 5 * HZ, 3);
	spin_lock(&s->lock);
	WRITE_ONCE(s->owner, get_pid(task_tgid(current)));
	s->dead = false;
	s->need_reader = false;
	s->ask_at_end = false;
	s->dispatcher = NULL;
	s->q_first = 0;
	s->q_n = 0;
	s->nr_inflight = 0;
	spin_unlock(&s->lock);

	/*
	 * Listed, its probes on, before its notifier can queue a change: a
	 * gate may let a thread go at an interrupt from the first change on,
	 * and the call hook must find s for that thread's next mapping.
	 */
	kreg_probes_get();
	list_add_rcu(&s->live, &kreg_syncs);
	/*
	 * Every thread there is now gets its gate; after the listing, since
	 * the fork probe gives threads born from then on theirs (a thread
	 * born between a walk and the listing would have none, and the walks
	 * from the end of the list stop at a known thread)
	 */
	spin_lock(&s->lock);
	s->rescan = true;
	kreg_gates_arm(s, &reap);
	spin_unlock(&s->lock);
	kreg_gates_reap(&reap);
	memset(&s->mn, 0, sizeof(s->mn));
	s->mn.ops = &kreg_sync_ops;
	/* current->mm == ctx->mm (checked by the caller): mm_users > 0 */
	ret = mmu_notifier_register(&s->mn, ctx->mm);
	if (ret) {
		struct pid *owner;

		list_del_rcu(&s->live);
		/* the probes' walks are past s before it is freed */
		synchronize_rcu();
		INIT_LIST_HEAD(&s->live);
		spin_lock(&s->lock);
		s->dead = true;
		kreg_gates_stop(s, &reap);
		owner = s->owner;
		WRITE_ONCE(s->owner, NULL);
		spin_unlock(&s->lock);
		kreg_gates_reap(&reap);
		if (s->signo)
			kreg_signal_release(owner, s->signo, s->handler);
		put_pid(owner);
	}
out:
	mutex_unlock(&kreg_syncs_lock);
	mutex_unlock(&ctx->lock);
	return ret;
}

/* ctx->lock held. Opens every gate; no callback runs afterwards. */
void kreg_sync_stop_locked(struct kreg_sync *s)
{
	struct pid *owner, *dispatcher;
	LIST_HEAD(reap);

	spin_lock(&s->lock);
	s->dead = true;
	s->need_reader = false;
	s->ask_at_end = false;
	s->q_n = 0;
	s->nr_inflight = 0;
	s->done = s->seq;
	kreg_gates_stop(s, &reap);
	owner = s->owner;
	WRITE_ONCE(s->owner, NULL);
	dispatcher = s->dispatcher;
	s->dispatcher = NULL;
	spin_unlock(&s->lock);
	wake_up_all(&s->wq);
	wake_up_interruptible_poll(&s->poll_wq, EPOLLIN | EPOLLRDNORM);
	kreg_gates_reap(&reap);
	/* waits for callbacks in progress */
	mmu_notifier_unregister(&s->mn, s->mm);
	if (s->signo)
		kreg_signal_release(owner, s->signo, s->handler);
	put_pid(owner);
	put_pid(dispatcher);
	mutex_lock(&kreg_syncs_lock);
	list_del_rcu(&s->live);
	/* the fork probe's walk is past s before s is started or freed again */
	synchronize_rcu();
	INIT_LIST_HEAD(&s->live);
	mutex_unlock(&kreg_syncs_lock);
}

/* mm's delivery while it runs (RCU read lock held), or NULL */
static struct kreg_sync *kreg_sync_live(struct mm_struct *mm)
{
	struct kreg_sync *s;

	list_for_each_entry_rcu(s, &kreg_syncs, live)
		if (s->mm == mm)
			return s;
	return NULL;
}

/*
 * The sched_process_fork probe (kreg_probes.c): child is a new thread of a
 * process, in its parent's context, not yet run.
 */
void kreg_sync_born(struct task_struct *child)
{
	struct kreg_sync *s;

	rcu_read_lock();
	s = kreg_sync_live(child->mm);
	if (s)
		kreg_gate_born(s, child);
	rcu_read_unlock();
}

/*
 * The call hooks (kreg_probes.c), at the entry of every call of the
 * machine that makes a new mapping, preemption disabled, maybe under
 * mmap_lock (which the notifier's callbacks nest s->lock in too): in a
 * process whose delivery runs, with a change unreported, kreg_gate_call().
 * do_mmap()'s (mmap_lock held for write) first steers an anonymous mapping
 * off the change's range: the address to pass instead of addr
 * (kreg_place.c), or 0.
 */
unsigned long kreg_sync_call(struct file *file, unsigned long addr,
			     unsigned long len, unsigned long flags, bool place)
{
	struct mm_struct *mm = current->mm;
	unsigned long hint = 0;
	struct kreg_sync *s;

	if (!mm || list_empty(&kreg_syncs))
		return 0;
	rcu_read_lock();
	s = kreg_sync_live(mm);
	/*
	 * mmap_lock orders this look after a change queued before (do_mmap
	 * and do_brk_flags hold it here)
	 */
	if (s && READ_ONCE(s->seq) > READ_ONCE(s->done)) {
		if (place)
			hint = kreg_place(s, file, addr, len, flags);
		kreg_gate_call(s);
	}
	rcu_read_unlock();
	return hint;
}

/*
 * The system call hook (kreg_probes.c), at the entry work of a system call
 * of a thread whose syscall_work asks for it (a parked gate's, kreg_gate.c;
 * also every thread that audit, seccomp or a tracer watches), preemption
 * disabled: in a process whose delivery has parked gates,
 * kreg_gate_syscall().
 */
void kreg_sync_syscall(void)
{
	struct mm_struct *mm = current->mm;
	struct kreg_sync *s;

	if (!mm || list_empty(&kreg_syncs))
		return;
	rcu_read_lock();
	s = kreg_sync_live(mm);
	if (s && READ_ONCE(s->nr_parked))
		kreg_gate_syscall(s);
	rcu_read_unlock();
}

long kreg_sync_stop(struct kreg_ctx *ctx)
{
	struct kreg_sync *s;
	long ret = 0;

	mutex_lock(&ctx->lock);
	s = kreg_sync_of(ctx);
	if (s)
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

/* At release, after kreg_sync_stop_locked(): gates may keep it a while. */
void kreg_sync_put(struct kreg_ctx *ctx)
{
	if (!ctx->sync)
		return;
	kreg_uncharge_mem(ctx, sizeof(*ctx->sync));
	kref_put(&ctx->sync->ref, kreg_sync_release);
}

/* Every change queued up to snap has ended (or delivery stopped); lock. */
static bool kreg_sync_settled_locked(struct kreg_sync *s, u64 snap)
{
	u32 i;

	for (i = 0; i < s->q_n && !s->dead; i++) {
		struct kreg_sync_ent *e =
			&s->q[(s->q_first + i) % KREG_NF_SYNC_QUEUE];

		if (e->seq > snap)
			break;
		if (e->pending)
			return false;
	}
	return true;
}

static bool kreg_sync_settled(struct kreg_sync *s, u64 snap)
{
	bool yes;

	spin_lock(&s->lock);
	yes = kreg_sync_settled_locked(s, snap);
	spin_unlock(&s->lock);
	return yes;
}

long kreg_sync_drain(struct kreg_ctx *ctx,
		     struct kreg_nf_sync_drain __user *uarg)
{
	struct kreg_nf_range out[KREG_DRAIN_BATCH];
	struct kreg_nf_sync_drain arg;
	struct kreg_sync *s;
	bool acked = false;
	u32 n = 0, i, max;
	long ret;
	u64 snap;

	if (copy_from_user(&arg, uarg, sizeof(arg)))
		return -EFAULT;
	if (!arg.max || arg.max > KREG_NF_SYNC_QUEUE)
		return -EINVAL;
	s = kreg_sync_of(ctx);
	if (!s)
		return -ENOENT;
	spin_lock(&s->lock);
	if (s->dead) {
		spin_unlock(&s->lock);
		return -ENOENT;
	}
	if (arg.ack > s->seq) {
		kreg_gate_reporting(s, current, false);
		spin_unlock(&s->lock);
		return -EINVAL;
	}
	if (arg.ack > s->done) {
		s->done = arg.ack;
		while (s->q_n && s->q[s->q_first].seq <= s->done &&
		       !s->q[s->q_first].pending) {
			s->q_first = (s->q_first + 1) % KREG_NF_SYNC_QUEUE;
			s->q_n--;
		}
		acked = true;
	}
	/* this caller takes what is queued; a later change asks again */
	s->need_reader = false;
	snap = s->seq;
	spin_unlock(&s->lock);
	if (acked)
		wake_up_all(&s->wq);

	/* the changes queued so far end soon: they are being zapped now */
	if (!kreg_sync_settled(s, snap)) {
		kreg_sync_count(s, KREG_ST_DRAIN_WAITS);
		wait_event_killable_timeout(s->wq, kreg_sync_settled(s, snap),
					    s->timeout);
	}

	max = min_t(u32, arg.max, KREG_DRAIN_BATCH);
	arg.seq = 0;
	spin_lock(&s->lock);
	/* gave up on one: kreg_sync_range_end() asks the reader at its end */
	if (!kreg_sync_settled_locked(s, snap))
		s->ask_at_end = true;
	/* splits first in line need no report: acknowledged here */
	acked = false;
	while (s->q_n && !s->dead) {
		struct kreg_sync_ent *e = &s->q[s->q_first];

		if (e->seq > snap || e->pending || e->start != e->end)
			break;
		s->done = max(s->done, e->seq);
		s->q_first = (s->q_first + 1) % KREG_NF_SYNC_QUEUE;
		s->q_n--;
		acked = true;
	}
	for (i = 0; i < s->q_n && n < max && !s->dead; i++) {
		struct kreg_sync_ent *e =
			&s->q[(s->q_first + i) % KREG_NF_SYNC_QUEUE];

		/* in order: an acknowledgment covers every entry before it */
		if (e->seq > snap || e->pending)
			break;
		arg.seq = e->seq;
		if (e->start == e->end)
			continue;	/* a split: acknowledged with the rest */
		out[n].start = e->start;
		out[n].end = e->end;
		n++;
	}
	/* the caller reports what it got, until a DRAIN that gets nothing */
	kreg_gate_reporting(s, current, n);
	spin_unlock(&s->lock);
	if (acked)
		wake_up_all(&s->wq);
	arg.count = n;
	if (n)
		kreg_sync_count(s, KREG_ST_DRAINS);
	/* nothing is dequeued before its ack: a bad buffer loses nothing */
	ret = 0;
	if ((n && copy_to_user(u64_to_user_ptr(arg.buf), out,
			       n * sizeof(out[0]))) ||
	    copy_to_user(uarg, &arg, sizeof(arg)))
		ret = -EFAULT;
	if (ret && n) {
		/* it got nothing to report after all */
		spin_lock(&s->lock);
		kreg_gate_reporting(s, current, false);
		spin_unlock(&s->lock);
	}
	return ret;
}

long kreg_sync_dispatcher(struct kreg_ctx *ctx)
{
	struct pid *old = NULL;
	struct kreg_sync *s;
	long ret = 0;

	mutex_lock(&ctx->lock);
	s = kreg_sync_of(ctx);
	if (s) {
		spin_lock(&s->lock);
		old = s->dispatcher;
		s->dispatcher = get_pid(task_pid(current));
		kreg_gate_exempt(s, current);
		spin_unlock(&s->lock);
	} else {
		ret = -ENOENT;
	}
	mutex_unlock(&ctx->lock);
	put_pid(old);
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

__poll_t kreg_sync_poll(struct kreg_sync *s, struct file *file,
			poll_table *wait)
{
	poll_wait(file, &s->poll_wq, wait);
	return READ_ONCE(s->need_reader) ? EPOLLIN | EPOLLRDNORM : 0;
}
