// SPDX-License-Identifier: GPL-2.0
/*
 * Probes on the kernel's tracepoints, for what no notifier and no
 * task_work can see: a thread's next system call, its faults, its birth.
 *
 * Debts (sys_exit): the next system call that can return an address
 * (mmap, mremap, brk, shmat) of a thread that a gate let go at a return
 * from an interrupt (kreg_gate.c: at once where faults are watched, else
 * after the fuse). Such a thread has obtained nothing since the change,
 * but its gate is spent, and that call (an mmap that returns the address
 * another thread freed) must still be held at its end until the change is
 * reported. A task_work queued by the gate itself runs in the same return
 * to user space (task_work_run() loops until the list is empty), and the
 * flag that makes a return run task_work is cleared by every return:
 * nothing a module may queue survives the trip to user space. What does
 * run at the end of a chosen thread's next system call is the sys_exit
 * tracepoint, for every task of the machine once a probe is on it. So the
 * probe is put on by the first debt and taken off once no process has had
 * one for a second; meanwhile it arms the gate of an indebted thread at
 * the end of such a call if the call mapped a page of an unreported change
 * (or may have: brk, shmat, a compat call), and the gate holds it there.
 * The price: putting the probe on walks every thread of the machine
 * (syscall_regfunc()) and patches code, at most about once a second; while
 * it is on, every system call of the machine takes the slow exit path and
 * looks at its number (and, for the four calls, through a short list).
 * A process whose threads spin while others free pinned memory keeps it on.
 *
 * Faults (x86's page_fault_user and page_fault_kernel): a fault at a page
 * of an unreported change (zapped by MADV_DONTNEED, touched again; or
 * written by a system call's copy) arms the faulting thread's gate to hold
 * it at that return, even if its gate was spent at an interrupt: the fault
 * maps a new page at an address the report is about, and the thread may
 * post a send from it with no system call. Watching faults is what lets a
 * gate pass a thread at an interrupt's return at once (kreg_gate.c); where
 * the tracepoints are missing, gates hold there as before. On while any
 * delivery is started: a call and a short list per fault of the machine.
 *
 * Births (sched_process_fork): a thread that clone() makes while a change
 * is unreported was not there to be armed, and its first system call could
 * return the freed address. The tracepoint runs in the parent after the
 * child is made and before it first runs (kernel_clone(): before
 * wake_up_new_task()), where its gate can be armed for its first return.
 * On while any delivery is started: a call and a short list per clone().
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/compat.h>
#include <linux/mutex.h>
#include <linux/rculist.h>
#include <linux/sched.h>
#include <linux/string.h>
#include <linux/tracepoint.h>
#include <linux/workqueue.h>

#include <asm/syscall.h>

#include "kreg_priv.h"

static DEFINE_MUTEX(kreg_owed_mutex);
/* syncs that had a debt, until they stop: RCU for the probe */
static LIST_HEAD(kreg_owed_list);
static struct tracepoint *kreg_sys_exit;
static bool kreg_probe_on;
static bool kreg_owed_recent;	/* a debt since kreg_probe_off() last looked */
static unsigned long kreg_probe_puts;	/* times put on, for monitoring */

/*
 * The probe comes off once no debt was made for a second, not at once: a
 * process whose spinners are let go at every change would otherwise have
 * every thread of the machine walked and code patched (with its IPIs) at
 * every change.
 */
#define KREG_PROBE_LINGER	HZ

static void kreg_owed_sweep(struct work_struct *work);
static DECLARE_WORK(kreg_owed_work, kreg_owed_sweep);
static void kreg_probe_off(struct work_struct *work);
static DECLARE_DELAYED_WORK(kreg_probe_off_work, kreg_probe_off);

/*
 * A call that can hand the thread an address another thread freed: what a
 * debt is about (a compat call, any). Another call keeps the debt: what it
 * returns came from threads held until the report.
 */
static bool kreg_returns_address(struct pt_regs *regs)
{
	long nr = syscall_get_nr(current, regs);

	/*
	 * None: rt_sigreturn (its orig_ax is -1, which in_compat_syscall()
	 * takes for an x32 call) or a call a tracer skipped. Held there, a
	 * thread whose handler ran inside the lock would wait for the fuse.
	 */
	if (nr < 0)
		return false;
	if (in_compat_syscall())
		return true;
	return nr == __NR_mmap || nr == __NR_mremap || nr == __NR_brk ||
	       nr == __NR_shmat;
}

/* At the end of every system call of the machine while on. */
static void kreg_owed_probe(void *data, struct pt_regs *regs, long ret)
{
	struct mm_struct *mm = current->mm;
	struct kreg_sync *s;

	if (!mm || !kreg_returns_address(regs))
		return;
	rcu_read_lock();
	list_for_each_entry_rcu(s, &kreg_owed_list, owed)
		if (s->mm == mm) {
			kreg_gate_owed(s);
			break;
		}
	rcu_read_unlock();
}

struct kreg_tp_find {
	const char *name;
	struct tracepoint *tp;
};

static void kreg_tp_match(struct tracepoint *tp, void *priv)
{
	struct kreg_tp_find *f = priv;

	if (!strcmp(tp->name, f->name))
		f->tp = tp;
}

/* a tracepoint of the kernel itself (not a module's), NULL if none */
static struct tracepoint *kreg_tracepoint(const char *name)
{
	struct kreg_tp_find f = { .name = name };

	for_each_kernel_tracepoint(kreg_tp_match, &f);
	return f.tp;
}

/* kreg_owed_mutex held */
static int kreg_probe_get(void)
{
	int ret;

	if (kreg_probe_on)
		return 0;
	if (!kreg_sys_exit)
		kreg_sys_exit = kreg_tracepoint("sys_exit");
	if (!kreg_sys_exit)
		return -ENOENT;
	ret = tracepoint_probe_register(kreg_sys_exit, (void *)kreg_owed_probe,
					NULL);
	if (ret)
		return ret;
	WRITE_ONCE(kreg_probe_on, true);
	WRITE_ONCE(kreg_probe_puts, kreg_probe_puts + 1);
	schedule_delayed_work(&kreg_probe_off_work, KREG_PROBE_LINGER);
	return 0;
}

/*
 * s has a debt (s->owed_until, set under s->lock, where listed was read
 * from s->owed_on): called by the gate of the indebted thread before that
 * thread goes on. 0 once its next system call will meet the probe
 * (syscall_regfunc() marked every thread, the caller included, before the
 * probe went on). The usual case takes no lock: s is on the list and the
 * probe is on.
 */
int kreg_owed_watch(struct kreg_sync *s, bool listed)
{
	int ret;

	/* the debt before the look at the probe: kreg_probe_off() */
	smp_mb();
	if (listed && READ_ONCE(kreg_probe_on)) {
		WRITE_ONCE(kreg_owed_recent, true);
		return 0;
	}
	mutex_lock(&kreg_owed_mutex);
	ret = kreg_probe_get();
	if (!ret && !s->owed_on) {
		spin_lock(&s->lock);
		/* a stopped sync is not put back: the sweep takes it off */
		listed = !s->dead;
		s->owed_on = listed;
		spin_unlock(&s->lock);
		if (listed) {
			kref_get(&s->ref);
			list_add_rcu(&s->owed, &kreg_owed_list);
		}
	}
	WRITE_ONCE(kreg_owed_recent, true);
	mutex_unlock(&kreg_owed_mutex);
	return ret;
}

/* s stopped (any context): it comes off the list. */
void kreg_owed_stopped(struct kreg_sync *s)
{
	if (READ_ONCE(s->owed_on))
		schedule_work(&kreg_owed_work);
}

/*
 * Takes the stopped syncs off the list (all of them if all, and the probe
 * off). kreg_owed_mutex held: a sync taken off is not put back before the
 * grace period that lets the probe's walk past it.
 */
static void kreg_owed_sweep_locked(bool all)
{
	struct kreg_sync *s, *tmp;
	LIST_HEAD(gone);
	bool off;

	list_for_each_entry_safe(s, tmp, &kreg_owed_list, owed) {
		spin_lock(&s->lock);
		off = all || s->dead;
		if (off)
			s->owed_on = false;
		spin_unlock(&s->lock);
		if (!off)
			continue;
		list_del_rcu(&s->owed);
		list_add(&s->owed_reap, &gone);
	}
	if (all && kreg_probe_on) {
		tracepoint_probe_unregister(kreg_sys_exit,
					    (void *)kreg_owed_probe, NULL);
		WRITE_ONCE(kreg_probe_on, false);
	}
	if (list_empty(&gone))
		return;
	synchronize_rcu();
	list_for_each_entry_safe(s, tmp, &gone, owed_reap)
		kref_put(&s->ref, kreg_sync_release);
}

static void kreg_owed_sweep(struct work_struct *work)
{
	mutex_lock(&kreg_owed_mutex);
	kreg_owed_sweep_locked(false);
	mutex_unlock(&kreg_owed_mutex);
}

bool kreg_owed_probe_on(void)
{
	return READ_ONCE(kreg_probe_on);
}

unsigned long kreg_owed_probe_puts(void)
{
	return READ_ONCE(kreg_probe_puts);
}

/*
 * Every second while on: off if no debt was made since the last look and
 * none is unsettled. The flag goes down before the look at the debts, and
 * a gate makes its debt before it looks at the flag (kreg_owed_watch()):
 * either this sees the debt or that gate sees the probe off and puts it
 * back on, under the mutex.
 */
static void kreg_probe_off(struct work_struct *work)
{
	struct kreg_sync *s;
	bool owed = false;

	mutex_lock(&kreg_owed_mutex);
	if (!kreg_probe_on)
		goto out;
	if (xchg(&kreg_owed_recent, false))
		goto again;
	WRITE_ONCE(kreg_probe_on, false);
	/* the flag down before the look at the debts: kreg_owed_watch() */
	smp_mb();
	list_for_each_entry(s, &kreg_owed_list, owed) {
		spin_lock(&s->lock);
		owed |= !s->dead && s->owed_until > s->done;
		spin_unlock(&s->lock);
	}
	if (owed) {
		WRITE_ONCE(kreg_probe_on, true);
		goto again;
	}
	tracepoint_probe_unregister(kreg_sys_exit, (void *)kreg_owed_probe,
				    NULL);
	goto out;
again:
	schedule_delayed_work(&kreg_probe_off_work, KREG_PROBE_LINGER);
out:
	mutex_unlock(&kreg_owed_mutex);
}

/* At every page fault of the machine while on (x86). */
static void kreg_fault_probe(void *data, unsigned long address,
			     struct pt_regs *regs, unsigned long error_code)
{
	/*
	 * A kernel thread or io_uring's worker never returns to user space;
	 * a copy with faults disabled maps nothing.
	 */
	if (!current->mm || address >= TASK_SIZE_MAX ||
	    (current->flags & (PF_KTHREAD | PF_IO_WORKER)) ||
	    (!user_mode(regs) && pagefault_disabled()))
		return;
	kreg_sync_fault(address);
}

/* In the parent, at every clone() of the machine while on. */
static void kreg_fork_probe(void *data, struct task_struct *parent,
			    struct task_struct *child)
{
	/* a thread (CLONE_THREAD), not a process or a kernel thread */
	if (child->mm && child->tgid == parent->tgid)
		kreg_sync_born(child);
}

struct kreg_started_probe {
	const char *name;
	void *fn;
	const char *lost;	/* what goes unwatched without it */
	struct tracepoint *tp;
	bool on;
};

static struct kreg_started_probe kreg_started_probes[] = {
	{ "sched_process_fork", kreg_fork_probe,
	  "a thread born while a change is unreported is not held" },
	{ "page_fault_user", kreg_fault_probe,
	  "threads are held at an interrupt's return" },
	{ "page_fault_kernel", kreg_fault_probe,
	  "threads are held at an interrupt's return" },
};

enum { KREG_PROBE_FORK, KREG_PROBE_FAULT_USER, KREG_PROBE_FAULT_KERNEL };

/*
 * Both fault probes are on: a gate may pass a thread at an interrupt's
 * return (read without a lock by gates: a gate that sees it on while it
 * goes off lets its thread go in the instant the last delivery stops,
 * which holds nothing any more).
 */
bool kreg_fault_probe_on(void)
{
	return READ_ONCE(kreg_started_probes[KREG_PROBE_FAULT_USER].on) &&
	       READ_ONCE(kreg_started_probes[KREG_PROBE_FAULT_KERNEL].on);
}

/*
 * kreg_syncs_lock held: on while any delivery is started. A failure is
 * said once; what it watches then goes unwatched (births: not held,
 * counted nowhere; faults: gates hold at interrupts instead).
 */
void kreg_started_probes_set(bool on)
{
	struct kreg_started_probe *p;
	int ret;

	for (p = kreg_started_probes;
	     p < kreg_started_probes + ARRAY_SIZE(kreg_started_probes); p++) {
		if (on == p->on)
			continue;
		if (!p->tp)
			p->tp = kreg_tracepoint(p->name);
		if (!p->tp) {
			pr_warn_once("no %s tracepoint: %s\n", p->name, p->lost);
			continue;
		}
		if (on)
			ret = tracepoint_probe_register(p->tp, p->fn, NULL);
		else
			ret = tracepoint_probe_unregister(p->tp, p->fn, NULL);
		if (ret)
			pr_warn_once("%s probe: error %d: %s\n", p->name, ret,
				     p->lost);
		else
			WRITE_ONCE(p->on, on);
	}
}

/* Module exit: no descriptor is open, every sync is stopped. */
void kreg_owed_exit(void)
{
	flush_work(&kreg_owed_work);
	cancel_delayed_work_sync(&kreg_probe_off_work);
	mutex_lock(&kreg_owed_mutex);
	kreg_owed_sweep_locked(true);
	mutex_unlock(&kreg_owed_mutex);
	/* no probe call of ours is still running */
	tracepoint_synchronize_unregister();
}
