// SPDX-License-Identifier: GPL-2.0
/*
 * Gates: how synchronous delivery holds the threads of a process at their
 * return to user space until the changes queued before it are reported.
 *
 * One gate per thread of the owner, made the first time the thread is
 * seen and kept until it exits or delivery stops, so a change allocates
 * nothing per thread. A gate is a task_work in one of four states:
 *   ARMED    queued on its thread (TWA_NONE, plus TIF_NOTIFY_RESUME set
 *            without a kick): the thread runs it at its next return to user
 *            space, from a system call, a fault or an interrupt (its tick).
 *            Nothing interrupts a thread that stays in user space.
 *   RUNNING  its thread waits in it, if a change is unreported.
 *   IDLE     ran since the last change, on sync->idle; or parked, on
 *            sync->parked (below).
 *   EXEMPT   the reader's: never held.
 * A change arms the IDLE gates only, so it costs nothing per thread that
 * has not crossed into the kernel since the last one (asleep, or spinning
 * in user space), and looks for new threads only at the end of the thread
 * list, where clone() adds them.
 *
 * Parked: a gate that ran at a return from an interrupt or exception and
 * let its thread go (nothing unreported, or every unreported change took
 * its mapping away: an irq pass). Such a thread has obtained nothing, and
 * can obtain a page where a change took the mapping away only by a call
 * that makes a mapping, which the call hooks hold (kreg_probes.c). So a
 * change that takes its mapping away does not arm it again; the thread's
 * next system call does, from the system call hook, which a syscall_work
 * bit set on the thread routes there (kreg_gate_park()). A change that
 * keeps its range mapped (a touch would fault a page in) and a new mapping
 * while a change is unreported arm the parked gates as before. Without
 * this, every spinner that the unmap's shootdown (or its tick) interrupted
 * had its gate armed again at every change and ran it there: a walk entry
 * in the changing thread and a lock round trip in each spinner, a change
 * (sync-spinner-parked).
 *
 * task_work cannot be cancelled from a module: an ARMED gate stays queued
 * until its thread runs it. So a queued or running gate holds a reference
 * to sync (not to the context or the file) and to the module, and STOP
 * unhashes every gate, frees the IDLE ones and kicks the threads of ARMED
 * ones (TWA_SIGNAL, as io_uring wakes a task) so that they run and free
 * them at once.
 *
 * Locks: sync->lock for the states, the hash and the idle list; under it
 * the owner's siglock (the thread list) and, through task_work_add(), a
 * task's pi_lock. A gate waits with no lock held.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/compat.h>
#include <linux/mm.h>
#include <linux/module.h>
#include <linux/pid.h>
#include <linux/ptrace.h>
#include <linux/sched/signal.h>
#include <linux/sched/task.h>
#include <linux/sched/task_stack.h>
#include <linux/slab.h>
#include <linux/task_work.h>
#include <linux/uaccess.h>
#include <linux/wait.h>

#include <asm/syscall.h>

#include "kreg_priv.h"

/* a gate's first wait before it also asks the reader */
#define KREG_GATE_NUDGE_MS	2
/*
 * How long a thread held at a return from an interrupt (after a change
 * that is not gone) may block a report before it goes on (its next call
 * that makes a mapping is then held: kreg_probes.c). 10 ms let threads go
 * under TCG in 5 of 16 runs of test_rcache's six threads while the report
 * was merely slow.
 */
#define KREG_GATE_IRQ_FUSE_MS	50
/*
 * The same for the thread's next call that returns an address, which the
 * call hooks hold (kreg_probes.c). It may be made inside the lock
 * (UCX 1.13's rcache grows a memory pool, an mmap, under the spinlock its
 * unmap callback takes), but a report may also just be slow: 50 ms there
 * let an mmap return 100 ms before a report that no lock blocked.
 */
#define KREG_GATE_OWED_FUSE_MS	250

enum kreg_gate_state {
	KREG_GATE_IDLE, KREG_GATE_ARMED, KREG_GATE_RUNNING, KREG_GATE_EXEMPT,
};

struct kreg_gate {
	struct callback_head cb;
	struct hlist_node node;		/* sync->gates; unhashed by STOP */
	struct list_head idle;		/* sync->idle while IDLE, or a reap list */
	struct task_struct *task;	/* a reference: the key */
	struct kreg_sync *s;
	enum kreg_gate_state state;
	bool exempt;			/* the reader's */
	bool reporting;			/* between its DRAINs: see below */
	u64 owed;			/* let go at an interrupt: kreg_probes.c */
	bool owed_hold;			/* armed by the call hook */
	bool parked;			/* on sync->parked */
	bool flagged;			/* its SYSCALL_AUDIT bit is ours */
	u64 parked_at;			/* sync->seq when parked */
};

struct kreg_kick {
	struct callback_head cb;
};

static void kreg_gate_run(struct callback_head *cb);
static bool kreg_gate_changes_gone(struct kreg_sync *s, u64 target);

/*
 * g's thread (current, or a child clone() made that has not run yet) goes
 * to user space with its gate parked (lock held): its next system call
 * reaches the hook (kreg_gate_syscall())
 * through audit's syscall_work bit, which makes syscall_trace_enter() run
 * and does nothing else for a thread with no audit context (audit itself
 * sets it only at fork). A thread that audit, seccomp or a tracer already
 * sends there keeps its bits as they are.
 */
static void kreg_gate_park(struct kreg_sync *s, struct kreg_gate *g)
{
	g->state = KREG_GATE_IDLE;
	g->parked = true;
	g->parked_at = s->seq;
	list_add_tail(&g->idle, &s->parked);
	WRITE_ONCE(s->nr_parked, s->nr_parked + 1);
	if (!test_task_syscall_work(g->task, SYSCALL_AUDIT)) {
		set_task_syscall_work(g->task, SYSCALL_AUDIT);
		g->flagged = true;
	}
	kreg_sync_count(s, KREG_ST_PARKED);
}

/* off sync->parked, its bit cleared (lock held; g->task may be another) */
static void kreg_gate_unpark(struct kreg_sync *s, struct kreg_gate *g)
{
	if (!g->parked)
		return;
	list_del_init(&g->idle);
	g->parked = false;
	WRITE_ONCE(s->nr_parked, s->nr_parked - 1);
	if (g->flagged) {
		clear_task_syscall_work(g->task, SYSCALL_AUDIT);
		g->flagged = false;
	}
}

static struct kreg_gate *kreg_gate_find(struct kreg_sync *s,
					struct task_struct *t)
{
	struct kreg_gate *g;

	hash_for_each_possible(s->gates, g, node, (unsigned long)t)
		if (g->task == t)
			return g;
	return NULL;
}

/*
 * Queues g on its thread (lock held). A thread past exit_task_work() takes
 * no more task_work: its gate goes to reap.
 */
static void kreg_gate_arm(struct kreg_sync *s, struct kreg_gate *g,
			  struct list_head *reap)
{
	kreg_gate_unpark(s, g);
	list_del_init(&g->idle);
	/* before the add: the thread may run the gate at once */
	kref_get(&s->ref);
	__module_get(THIS_MODULE);
	g->state = KREG_GATE_ARMED;
	if (task_work_add(g->task, &g->cb, TWA_NONE)) {
		g->state = KREG_GATE_IDLE;
		module_put(THIS_MODULE);
		/* never the last reference: the context holds one */
		kref_put(&s->ref, kreg_sync_release);
		hash_del(&g->node);
		list_add(&g->idle, reap);
		return;
	}
	/*
	 * No kick (set_notify_resume() would IPI a thread running in user
	 * space): the flag is seen at its next kernel exit, which is all that
	 * is needed, since a thread must enter the kernel to see a change.
	 */
	set_tsk_thread_flag(g->task, TIF_NOTIFY_RESUME);
	kreg_sync_count(s, KREG_ST_GATES);
}

static struct kreg_gate *kreg_gate_new(struct kreg_sync *s,
				       struct task_struct *t)
{
	struct kreg_gate *g = kzalloc(sizeof(*g), GFP_NOWAIT | __GFP_NOWARN |
					      __GFP_ACCOUNT);

	if (!g)
		return NULL;
	init_task_work(&g->cb, kreg_gate_run);
	INIT_LIST_HEAD(&g->idle);
	g->task = get_task_struct(t);
	g->s = s;
	g->state = KREG_GATE_IDLE;
	hash_add(s->gates, &g->node, (unsigned long)t);
	kreg_sync_count(s, KREG_ST_THREADS);
	return g;
}

/*
 * Gives each new thread of the owner a gate, armed (lock held). clone()
 * appends threads to the owner's list under its siglock, so the new ones
 * are at the end: walk back until a known one. After a failed allocation
 * (rescan) the whole list is walked. io_uring workers and kernel threads
 * never return to user space and get none.
 */
struct kreg_discover {
	struct kreg_sync *s;
	struct list_head *reap;
};

static void kreg_gates_discover_locked(struct task_struct *p,
				       struct sighand_struct *sh, void *arg)
{
	struct kreg_discover *d = arg;
	struct kreg_sync *s = d->s;
	bool all = s->rescan;
	struct task_struct *t;
	struct kreg_gate *g;

	s->rescan = false;
	list_for_each_entry_reverse(t, &p->signal->thread_head, thread_node) {
		if (kreg_gate_find(s, t)) {
			if (!all)
				break;
			continue;
		}
		if (t->flags & (PF_EXITING | PF_KTHREAD | PF_IO_WORKER))
			continue;
		g = kreg_gate_new(s, t);
		if (!g) {
			kreg_sync_count(s, KREG_ST_GATE_NOMEM);
			s->rescan = true;
			continue;
		}
		if (task_pid(t) == s->dispatcher) {
			g->exempt = true;
			g->state = KREG_GATE_EXEMPT;
		} else {
			kreg_gate_arm(s, g, d->reap);
		}
	}
}

static void kreg_gates_discover(struct kreg_sync *s, struct list_head *reap)
{
	struct kreg_discover d = { .s = s, .reap = reap };

	kreg_owner_siglocked(s->owner, kreg_gates_discover_locked, &d);
}

/*
 * A change is queued (lock held): every thread that crossed into the
 * kernel since the last change gets its gate again, new threads get one.
 * Gates of exited threads go to reap (kreg_gates_reap() once unlocked).
 */
void kreg_gates_arm(struct kreg_sync *s, struct list_head *reap)
{
	struct kreg_gate *g, *tmp;

	list_for_each_entry_safe(g, tmp, &s->idle, idle)
		kreg_gate_arm(s, g, reap);
	/* parked: only if a touch could now map a page of a change */
	if (s->nr_parked && !kreg_gate_changes_gone(s, s->seq))
		list_for_each_entry_safe(g, tmp, &s->parked, idle)
			kreg_gate_arm(s, g, reap);
	kreg_gates_discover(s, reap);
}

void kreg_gates_reap(struct list_head *reap)
{
	struct kreg_gate *g, *tmp;

	list_for_each_entry_safe(g, tmp, reap, idle) {
		put_task_struct(g->task);
		kfree(g);
	}
}

static void kreg_kick_run(struct callback_head *cb)
{
	kfree(container_of(cb, struct kreg_kick, cb));
	module_put(THIS_MODULE);
}

/*
 * Makes t run its task_work soon: wakes it from an interruptible sleep
 * (the call restarts, as for a signal with no handler) or kicks it out of
 * user space. Best effort: without memory the gate runs at t's next return.
 */
static void kreg_kick(struct task_struct *t)
{
	struct kreg_kick *k = kmalloc(sizeof(*k), GFP_ATOMIC | __GFP_NOWARN);

	if (!k)
		return;
	init_task_work(&k->cb, kreg_kick_run);
	__module_get(THIS_MODULE);
	if (task_work_add(t, &k->cb, TWA_SIGNAL)) {
		kfree(k);
		module_put(THIS_MODULE);
	}
}

/*
 * STOP (lock held): no gate stays known. IDLE and EXEMPT ones go to reap;
 * ARMED ones are kicked and free themselves when they run; RUNNING ones
 * see that they are unhashed.
 */
void kreg_gates_stop(struct kreg_sync *s, struct list_head *reap)
{
	struct hlist_node *tmp;
	struct kreg_gate *g;
	int bkt;

	hash_for_each_safe(s->gates, bkt, tmp, g, node) {
		hash_del(&g->node);
		switch (g->state) {
		case KREG_GATE_IDLE:
		case KREG_GATE_EXEMPT:
			kreg_gate_unpark(s, g);
			list_move(&g->idle, reap);
			break;
		case KREG_GATE_ARMED:
			kreg_kick(g->task);
			break;
		case KREG_GATE_RUNNING:
			break;
		}
	}
}

/* t is the reader (lock held): its gate, if it has one, never holds. */
void kreg_gate_exempt(struct kreg_sync *s, struct task_struct *t)
{
	struct kreg_gate *g = kreg_gate_find(s, t);

	if (!g)
		return;
	g->exempt = true;
	if (g->state == KREG_GATE_IDLE) {
		kreg_gate_unpark(s, g);
		list_del_init(&g->idle);
		g->state = KREG_GATE_EXEMPT;
	}
}

/*
 * t's last DRAIN handed it ranges (on) or none (off), lock held. A thread
 * that is reporting is not held until its next DRAIN: what it runs
 * meanwhile (UCX's invalidation callbacks, through ucm_vm_munmap()) makes
 * system calls of its own (malloc's mmap, a write to UCX's async pipe)
 * while it holds locks that other reporters need; held there, it waited
 * for the very change it was reporting, and the others waited for its
 * locks, until the gate timed out (UCP, 4 and 8 threads: 3 to 5 gates
 * timed out at once, all with the queue ended and unacknowledged).
 */
void kreg_gate_reporting(struct kreg_sync *s, struct task_struct *t, bool on)
{
	struct kreg_gate *g = kreg_gate_find(s, t);

	if (g)
		g->reporting = on;
}

/*
 * g's thread goes on while changes up to target are unreported (lock held):
 * its next call that can return an address is held (kreg_gate_owed()).
 */
static void kreg_gate_owe(struct kreg_gate *g, u64 target)
{
	g->owed = target;
}

/* at rest until the next change arms it (lock held) */
static void kreg_gate_rest(struct kreg_sync *s, struct kreg_gate *g)
{
	g->state = KREG_GATE_IDLE;
	list_add_tail(&g->idle, &s->idle);
}

/* a gate that lets its thread go at an interrupt's return may park */
static bool kreg_gate_parks(void)
{
	return kreg_call_hook_on() && kreg_syscall_hook_on();
}

/*
 * The call hook (kreg_probes.c) at the entry of a call that makes a new
 * mapping (do_mmap, do_brk_flags, mremap, a special mapping) in a thread
 * of s's mm, while a change is unreported, before the mapping exists:
 *  - the pass at interrupts ends: a touch of the new mapping, which may lie
 *    where a change took one away, faults a page in there. Every change
 *    unreported is no longer gone, and the threads let go owing get their
 *    gates again, so their next return holds them (sync-spinner-new-map-
 *    held: without this the spinner ran on for the whole report);
 *  - if this thread was let go at an interrupt while a change it waited
 *    for is still unreported, its gate holds it at the call's return. An
 *    ARMED gate runs there anyway.
 */
void kreg_gate_call(struct kreg_sync *s)
{
	struct kreg_gate *g, *o, *tmp;
	bool gone = false;
	LIST_HEAD(reap);
	u32 i;

	spin_lock(&s->lock);
	/*
	 * first: armed below, its gate would not know the call was owed. A
	 * parked gate owes the call for every change unreported (those queued
	 * since it parked did not arm it).
	 */
	g = kreg_gate_find(s, current);
	if (g && (g->owed > s->done || g->parked) && !s->dead &&
	    s->done < s->seq) {
		/* ARMED: by a change since, or by the system call hook */
		if (g->state == KREG_GATE_IDLE)
			kreg_gate_arm(s, g, &reap);
		g->owed_hold = g->state == KREG_GATE_ARMED;
	}
	if (g)
		g->owed = 0;
	for (i = 0; i < s->q_n; i++) {
		struct kreg_sync_ent *e =
			&s->q[(s->q_first + i) % KREG_NF_SYNC_QUEUE];

		gone |= e->gone && e->seq > s->done;
		e->gone = false;
	}
	/*
	 * Only the threads let go owing: an IDLE gate that is not one ran
	 * its course (waited for the report, or its own handler is about to
	 * make it: armed, that thread waited for what only it could do, in
	 * the system calls its handler makes before its DRAIN)
	 */
	if (gone && !s->dead) {
		list_for_each_entry_safe(o, tmp, &s->idle, idle)
			if (o->owed > s->done)
				kreg_gate_arm(s, o, &reap);
		list_for_each_entry_safe(o, tmp, &s->parked, idle)
			kreg_gate_arm(s, o, &reap);
	}
	spin_unlock(&s->lock);
	kreg_gates_reap(&reap);
}

/*
 * The system call hook (kreg_probes.c), at the entry of a system call of a
 * thread that syscall_work sends to syscall_trace_enter(), in a process
 * with parked gates: if the thread's gate is parked, it is no longer. If a
 * change queued since it parked is unreported, the gate is armed: the
 * thread waits at this call's end, as it would had that change armed it
 * (threads that enter and leave the kernel while a change is unreported
 * wait). Else it is at rest for the next change to arm, and its debt
 * (owed) for the changes it passed stays as it was.
 */
void kreg_gate_syscall(struct kreg_sync *s)
{
	struct kreg_gate *g;
	LIST_HEAD(reap);

	spin_lock(&s->lock);
	g = kreg_gate_find(s, current);
	if (g && g->parked) {
		kreg_gate_unpark(s, g);
		if (!s->dead && s->seq > g->parked_at && s->seq > s->done) {
			kreg_gate_arm(s, g, &reap);
			/*
			 * and if this call makes a mapping, the call hook holds
			 * it as it holds a thread let go at an interrupt: one
			 * that maps nothing of a change returns at once (it may
			 * be made inside a lock the report needs)
			 */
			kreg_gate_owe(g, s->seq);
			kreg_sync_count(s, KREG_ST_PARKED_HELD);
		} else {
			kreg_gate_rest(s, g);
		}
	}
	spin_unlock(&s->lock);
	kreg_gates_reap(&reap);
}

/*
 * child, a thread of a process whose mm is s's, made by clone() (the
 * sched_process_fork probe, in the parent, before the child first runs),
 * gets its gate here, so that no change has to find and allocate it: if a
 * change is unreported, armed (the child's first system call, an mmap that
 * returns the freed address, would go unheld); else parked (it has
 * obtained nothing yet), or at rest where gates do not park. A child whose
 * gate could not be allocated is found by the next change's walk of the
 * whole thread list (rescan): later children have theirs, and a walk from
 * the end would stop at them.
 */
void kreg_gate_born(struct kreg_sync *s, struct task_struct *child)
{
	struct kreg_gate *g;
	LIST_HEAD(reap);

	spin_lock(&s->lock);
	if (!s->dead && task_tgid(child) == s->owner &&
	    !kreg_gate_find(s, child)) {
		g = kreg_gate_new(s, child);
		if (!g) {
			kreg_sync_count(s, KREG_ST_GATE_NOMEM);
			s->rescan = true;
		} else if (s->done < s->seq) {
			kreg_gate_arm(s, g, &reap);
			kreg_sync_count(s, KREG_ST_BORN_HELD);
		} else if (kreg_gate_parks()) {
			kreg_gate_park(s, g);
		} else {
			kreg_gate_rest(s, g);
		}
	}
	spin_unlock(&s->lock);
	kreg_gates_reap(&reap);
}

static bool kreg_gate_open(struct kreg_sync *s, u64 target)
{
	return READ_ONCE(s->done) >= target || READ_ONCE(s->dead);
}

/*
 * The thread's own handler will report every queued change before its
 * next instruction: signo is pending for it, not blocked, and its handler
 * is the one that drains. On the way to user space the kernel runs task
 * work before it dequeues a signal (get_signal()), so a gate that waited
 * here would wait for a handler that can only run after it.
 */
static bool kreg_self_drains(struct kreg_sync *s)
{
	struct sighand_struct *sh;
	bool yes;

	if (!s->signo)
		return false;
	/* current's own: only its exec replaces it */
	sh = rcu_dereference_protected(current->sighand, 1);
	/* the handler's frame is set up already */
	if (instruction_pointer(task_pt_regs(current)) == s->handler)
		return true;
	spin_lock_irq(&sh->siglock);
	yes = sigismember(&current->pending.signal, s->signo) &&
	      !sigismember(&current->blocked, s->signo) &&
	      (unsigned long)sh->action[s->signo - 1].sa.sa_handler ==
	      s->handler;
	spin_unlock_irq(&sh->siglock);
	return yes;
}

/* [start, start + len) holds no page of a change still unreported (lock held) */
static bool kreg_gate_range_clean(struct kreg_sync *s, unsigned long start,
				  unsigned long len)
{
	unsigned long end = start + PAGE_ALIGN(len);
	u32 i;

	if (end <= start)
		return false;
	for (i = 0; i < s->q_n; i++) {
		struct kreg_sync_ent *e =
			&s->q[(s->q_first + i) % KREG_NF_SYNC_QUEUE];

		if (e->seq > s->done && e->start < end && start < e->end)
			return false;
	}
	return true;
}

/*
 * Every change queued up to target and unreported took its mapping away
 * (kreg_change_gone(); a split that kept its pages has nothing to report),
 * lock held: a thread at a return from an interrupt can obtain none of its
 * pages but by a call that the call hooks hold.
 */
static bool kreg_gate_changes_gone(struct kreg_sync *s, u64 target)
{
	u32 i;

	for (i = 0; i < s->q_n; i++) {
		struct kreg_sync_ent *e =
			&s->q[(s->q_first + i) % KREG_NF_SYNC_QUEUE];

		if (e->seq > s->done && e->seq <= target && !e->gone &&
		    e->start != e->end)
			return false;
	}
	return true;
}

/*
 * At the return from an mmap, mremap or brk: the call handed the thread no page
 * of a change still unreported (it failed, or what it mapped lies outside
 * every such change; lock held). Such a thread obtained nothing stale,
 * and may be inside a user-space lock that the report needs: UCX 1.13's
 * rcache takes a page directory from a memory pool, which grows by an
 * mmap, under the spinlock its unmap callback takes (UCP with 2 threads:
 * held there, it timed the gate out while both reporters spun on the
 * lock). Any other call, a compat one, or a handler's frame set up: no.
 */
static bool kreg_gate_call_clean(struct kreg_sync *s)
{
	struct pt_regs *regs = task_pt_regs(current);
	long nr = syscall_get_nr(current, regs);
	unsigned long args[6], heap;
	long ret;

	if ((nr != __NR_mmap && nr != __NR_mremap && nr != __NR_brk) ||
	    in_compat_syscall() || instruction_pointer(regs) == s->handler)
		return false;
	ret = syscall_get_return_value(current, regs);
	/*
	 * brk returns the break, not what it mapped: the heap as a whole,
	 * to the higher of that and the break now (another thread's brk may
	 * have moved it since), holds no page of a change (glibc's malloc
	 * calls brk under its arena lock, which a report may need)
	 */
	if (nr == __NR_brk) {
		heap = current->mm->start_brk;
		return kreg_gate_range_clean(s, heap,
					     max_t(unsigned long, ret,
						   READ_ONCE(current->mm->brk)) -
					     heap);
	}
	if (IS_ERR_VALUE(ret))
		return true;
	syscall_get_arguments(current, regs, args);
	/* what it mapped: mmap's length, mremap's new length */
	if (!kreg_gate_range_clean(s, ret, nr == __NR_mmap ? args[1] : args[2]))
		return false;
	/*
	 * and what mremap left behind: with MREMAP_DONTUNMAP the old range
	 * stays mapped, emptied, and a touch there maps a new page at an
	 * address the report is about
	 */
	return nr == __NR_mmap || kreg_gate_range_clean(s, args[0], args[1]);
}

/*
 * When the changes up to target ended: now while one is still in flight
 * (the thread that makes it is still inside the call, its range's end not
 * reached), which needs nothing of a thread held at its return to user
 * space (such a thread holds no lock of the kernel's), so it ends however
 * long it takes: a munmap whose thread is starved of its CPU
 * (kreg_bench --threads with 1,024 threads starting up at once timed gates
 * out behind one, "1 in flight"). The gate's timeout counts from there:
 * counted from a look that found the change still in flight, a report
 * made just after its end had what was left of one timeout
 * (sync-late-end-asks-reader timed out so in 1 of 9 runs).
 */
static unsigned long kreg_gate_changes_end(struct kreg_sync *s, u64 target)
{
	unsigned long end = jiffies - s->timeout;
	u32 i;

	spin_lock(&s->lock);
	for (i = 0; i < s->q_n; i++) {
		struct kreg_sync_ent *e =
			&s->q[(s->q_first + i) % KREG_NF_SYNC_QUEUE];

		if (e->seq <= s->done || e->seq > target)
			continue;
		if (e->pending) {
			end = jiffies;
			break;
		}
		if (time_after(e->ended, end))
			end = e->ended;
	}
	spin_unlock(&s->lock);
	return end;
}

/* a report is under way: some thread has DRAINed ranges it has not acked */
static bool kreg_gate_report_under_way(struct kreg_sync *s)
{
	struct kreg_gate *g;
	bool yes = false;
	int bkt;

	spin_lock(&s->lock);
	hash_for_each(s->gates, bkt, g, node)
		if (g->reporting) {
			yes = true;
			break;
		}
	spin_unlock(&s->lock);
	return yes;
}

enum kreg_gate_end { KREG_GATE_REPORTED, KREG_GATE_TIMED_OUT, KREG_GATE_LET_GO };

/*
 * Waits until every change queued up to target is reported: first briefly
 * (the changing thread's handler usually reports), then asks the reader,
 * then up to the deadline (counted if it passes), which a change still in
 * flight at it moves on: the timeout counts from the last change's end.
 *
 * A thread stopped at a return from an interrupt (irq) was running in user
 * space: it has obtained nothing since the change, but it may have been
 * stopped inside a user-space lock that the report needs (UCX's rcache
 * spinlock, taken around a few instructions: in CI, UCP with 4 and 8
 * threads, a thread stopped by its tick inside ucs_rcache_check_gc_list()
 * held the lock that both reporters spun on, until the gate timed out).
 * Such a thread goes on once a report has been under way for
 * KREG_GATE_IRQ_FUSE_MS without an end (counted: irq_releases); so does a
 * thread held at the return of an mmap or mremap that mapped nothing of an
 * unreported change (kreg_gate_call_clean(), counted: call_releases). Its gate
 * is spent for this change, so it owes its next call that can return an
 * address (a call that makes a mapping): the call hooks (kreg_probes.c)
 * hold that at its end. That hold has a fuse too
 * (KREG_GATE_OWED_FUSE_MS): the call may be made inside the very lock (UCP
 * with 8 threads had 3 gates time out at once without it). A call let go
 * there returned before the report (irq_next_released, a window), and the
 * thread owes its next one.
 */
static enum kreg_gate_end kreg_gate_wait(struct kreg_sync *s, u64 target,
					 unsigned long *deadline,
					 unsigned int fuse_ms, bool *nudged)
{
	long left, ret;

	for (;;) {
		left = (long)(*deadline - jiffies);
		if (!*nudged)
			left = min_t(long, left,
				     msecs_to_jiffies(KREG_GATE_NUDGE_MS));
		else if (fuse_ms)
			left = min_t(long, left, msecs_to_jiffies(fuse_ms));
		ret = left > 0 ? wait_event_killable_timeout(s->wq,
					kreg_gate_open(s, target), left) : 0;
		if (ret != 0)
			return KREG_GATE_REPORTED;	/* or SIGKILL: the end */
		if (!*nudged) {
			*nudged = true;
			kreg_sync_wake_reader(s);
			continue;
		}
		if ((long)(*deadline - jiffies) <= 0) {
			unsigned long end = kreg_gate_changes_end(s, target);

			if (time_before(jiffies, end + s->timeout)) {
				*deadline = end + s->timeout;
				continue;
			}
			kreg_sync_count(s, KREG_ST_GATE_TIMEOUTS);
			return KREG_GATE_TIMED_OUT;
		}
		if (fuse_ms && kreg_gate_report_under_way(s))
			return KREG_GATE_LET_GO;
	}
}

/*
 * One thread of a timed-out gate's report: where it stands in user space
 * (no kernel stack: a "Call Trace" in the log reads as a kernel bug to
 * whoever watches it). Another thread may exit meanwhile and its stack go
 * (a task reference does not keep it): its registers are read with
 * copy_from_kernel_nofault().
 */
static void kreg_gate_say_thread(const char *role, struct task_struct *t)
{
	struct vm_area_struct *vma;
	struct pt_regs regs;
	unsigned long ip;
	int nr;

	if (copy_from_kernel_nofault(&regs, task_pt_regs(t), sizeof(regs))) {
		pr_warn("  %s %s[%d]: gone\n", role, t->comm, task_pid_nr(t));
		return;
	}
	ip = instruction_pointer(&regs);
	nr = syscall_get_nr(t, &regs);
	/* current's mm is t's: the gate checked that current is the owner's */
	if (mmap_read_lock_killable(current->mm))
		return;
	vma = find_vma(current->mm, ip);
	if (vma && vma->vm_start <= ip && vma->vm_file)
		pr_warn("  %s %s[%d]: %s, %s %d, user ip %pD+%#lx\n", role,
			t->comm, task_pid_nr(t),
			task_is_running(t) ? "running" : "asleep",
			nr < 0 ? "not in a call, last" : "in call", nr,
			vma->vm_file, ip - vma->vm_start +
			(vma->vm_pgoff << PAGE_SHIFT));
	else
		pr_warn("  %s %s[%d]: %s, %s %d, user ip %#lx\n", role,
			t->comm, task_pid_nr(t),
			task_is_running(t) ? "running" : "asleep",
			nr < 0 ? "not in a call, last" : "in call", nr, ip);
	mmap_read_unlock(current->mm);
}

#define KREG_GATE_SAY_MAX	8

/*
 * A gate timed out: a window, counted (and said once by the library).
 * Says, rate-limited, what was unreported and where the threads that were
 * reporting or held stood, so that what the report waited for (a lock a
 * held thread had taken, say) can be found.
 */
static void kreg_gate_say_timeout(struct kreg_sync *s, u64 target, bool irq)
{
	struct task_struct *t[KREG_GATE_SAY_MAX];
	const char *role[KREG_GATE_SAY_MAX];
	struct kreg_sync_ent e[KREG_GATE_SAY_MAX];
	int bkt, n = 0, ne = 0, i;
	struct kreg_gate *g;
	u64 done;

	if (!__ratelimit(&s->say_rs))
		return;
	spin_lock(&s->lock);
	done = s->done;
	for (i = 0; i < s->q_n && ne < KREG_GATE_SAY_MAX; i++) {
		struct kreg_sync_ent *q =
			&s->q[(s->q_first + i) % KREG_NF_SYNC_QUEUE];

		if (q->seq > done)
			e[ne++] = *q;
	}
	hash_for_each(s->gates, bkt, g, node) {
		if (n == KREG_GATE_SAY_MAX)
			break;
		if (g->task == current ||
		    (!g->reporting && !g->exempt &&
		     g->state != KREG_GATE_RUNNING))
			continue;
		role[n] = g->exempt ? "reader" : g->reporting ? "reporting" :
			  "held";
		t[n++] = get_task_struct(g->task);
	}
	spin_unlock(&s->lock);
	pr_warn("gate of %s[%d] timed out at its return from %s %d: changes %llu-%llu unreported\n",
		current->comm, task_pid_nr(current),
		irq ? "an interrupt or fault, last call" : "call",
		syscall_get_nr(current, task_pt_regs(current)), done + 1,
		target);
	for (i = 0; i < ne; i++)
		pr_warn("  change %llu: %#llx-%#llx%s, %u in flight\n",
			e[i].seq, e[i].start, e[i].end,
			e[i].gone ? " (gone)" : "", e[i].pending);
	kreg_gate_say_thread("this", current);
	for (i = 0; i < n; i++) {
		kreg_gate_say_thread(role[i], t[i]);
		put_task_struct(t[i]);
	}
}

/*
 * The gate, run by its thread on the way to user space (or in
 * exit_task_work()), where it may sleep. It lets the thread go only under
 * sync->lock, having seen that nothing queued is unreported (or that the
 * thread need not wait for what is): a change queued between a last look
 * and going IDLE would find the gate neither IDLE (to arm) nor looking.
 */
static void kreg_gate_run(struct callback_head *cb)
{
	struct kreg_gate *g = container_of(cb, struct kreg_gate, cb);
	struct kreg_sync *s = g->s;
	unsigned long deadline = jiffies + s->timeout;
	/* not from a system call: an interrupt or an exception */
	bool irq = syscall_get_nr(current, task_pt_regs(current)) < 0;
	bool gone, nudged = false, waited = false, pass = false, owes = false;
	bool owed_hold = false, clean = false;
	unsigned int fuse_ms;
	enum kreg_gate_end end;
	u64 target = 0, passed = 0;

	for (;;) {
		spin_lock(&s->lock);
		g->state = KREG_GATE_RUNNING;
		owed_hold |= g->owed_hold;
		g->owed_hold = false;
		/* exit; exec (another mm); a stopped or restarted delivery */
		gone = (current->flags & PF_EXITING) ||
		       current->mm != s->mm || task_tgid(current) != s->owner ||
		       hlist_unhashed(&g->node);
		if (gone) {
			hash_del(&g->node);
			break;
		}
		if (g->exempt) {
			g->state = KREG_GATE_EXEMPT;
			break;
		}
		/* a reporter: armed again by the next change, held after */
		if (g->reporting) {
			kreg_gate_rest(s, g);
			pass = true;
			break;
		}
		target = s->seq;
		/* nothing new since a pass: the pass still holds */
		if (s->dead || s->done >= target || (pass && target == passed)) {
			/* at an interrupt, with nothing unreported: parked */
			if (irq && !s->dead && s->done >= target &&
			    kreg_gate_parks())
				kreg_gate_park(s, g);
			else
				kreg_gate_rest(s, g);
			break;
		}
		/*
		 * At an interrupt's return (a spinner stopped by the unmap's
		 * own TLB shootdown, or its tick), after changes that took
		 * their mappings away: it has obtained nothing, and cannot
		 * without a call that the hooks hold. Let go at once, it owes
		 * that call. Held here, every spinner of the process waited
		 * for nearly every report (kreg_bench --threads: 0.72-0.95 of
		 * its rate with UCM's hooks).
		 */
		if (irq && kreg_call_hook_on() &&
		    kreg_gate_changes_gone(s, target)) {
			if (kreg_gate_parks())
				kreg_gate_park(s, g);
			else
				kreg_gate_rest(s, g);
			kreg_gate_owe(g, target);
			kreg_sync_count(s, KREG_ST_IRQ_PASSES);
			break;
		}
		clean = !irq && kreg_gate_call_clean(s);
		/* an owed call that mapped nothing of a change: still owed */
		if (owed_hold && clean) {
			kreg_gate_rest(s, g);
			kreg_gate_owe(g, target);
			break;
		}
		spin_unlock(&s->lock);

		/*
		 * Not at a return from an interrupt either, although such a
		 * thread saw nothing: the gate would be spent there, and the
		 * thread's next system call (an mmap that returns the freed
		 * address) would go unheld.
		 */
		pass = kreg_self_drains(s);
		if (pass) {
			passed = target;
			continue;
		}
		if (!waited) {
			kreg_sync_count(s, KREG_ST_GATE_WAITS);
			if (owed_hold)
				kreg_sync_count(s, KREG_ST_IRQ_NEXT_HELD);
		}
		waited = true;
		if (irq || clean)
			fuse_ms = KREG_GATE_IRQ_FUSE_MS;
		else
			fuse_ms = owed_hold ? KREG_GATE_OWED_FUSE_MS : 0;
		end = kreg_gate_wait(s, target, &deadline, fuse_ms, &nudged);
		if (end == KREG_GATE_TIMED_OUT)
			kreg_gate_say_timeout(s, target, irq);
		if (end != KREG_GATE_REPORTED || fatal_signal_pending(current)) {
			/* let go (counted), or dying */
			spin_lock(&s->lock);
			if (hlist_unhashed(&g->node)) {
				gone = true;
				break;
			}
			/* a change queued meanwhile unmapped what it mapped */
			if (end == KREG_GATE_LET_GO && clean &&
			    !kreg_gate_call_clean(s)) {
				spin_unlock(&s->lock);
				continue;
			}
			kreg_gate_rest(s, g);
			owes = end == KREG_GATE_LET_GO && !s->dead &&
			       s->done < target &&
			       !fatal_signal_pending(current);
			if (end == KREG_GATE_LET_GO)
				kreg_sync_count(s, irq ? KREG_ST_IRQ_RELEASES :
						clean ? KREG_ST_CALL_RELEASES :
						KREG_ST_IRQ_NEXT_RELEASED);
			if (owes)
				kreg_gate_owe(g, target);
			break;
		}
	}
	spin_unlock(&s->lock);
	if (pass)
		kreg_sync_count(s, KREG_ST_GATE_PASSES);
	/* a fuse let it go: its next call is held only if hooked */
	if (owes && !kreg_call_hook_on())
		kreg_sync_count(s, KREG_ST_IRQ_UNWATCHED);
	if (gone) {
		put_task_struct(g->task);
		kfree(g);
	}
	kref_put(&s->ref, kreg_sync_release);
	/*
	 * Last. What follows is this function's return: an rmmod would have
	 * to race those few instructions, as for any work function that drops
	 * its own module's reference.
	 */
	module_put(THIS_MODULE);
}
