// SPDX-License-Identifier: GPL-2.0
/*
 * Probes on two of the kernel's tracepoints, for what no notifier and no
 * task_work can see: a thread's next system call, and a thread's birth.
 *
 * Debts (sys_exit): the next system call that can return an address
 * (mmap, mremap, brk, shmat) of a thread that a gate let go at a return
 * from an interrupt (the fuse, kreg_gate.c). Such a thread has obtained
 * nothing since the change, but its gate is spent, and that call (an mmap
 * that returns the address another thread freed) must still be held at
 * its end until the change is reported. A task_work
 * queued by the gate itself runs in the same return to user space
 * (task_work_run() loops until the list is empty), and the flag that makes
 * a return run task_work is cleared by every return: nothing a module may
 * queue survives the trip to user space. What does run at the end of a
 * chosen thread's next system call is the sys_exit tracepoint, for every
 * task of the machine once a probe is on it. So the probe is put on by the
 * first debt and taken off a second after no process has one; meanwhile
 * it arms the gate of an indebted thread at the end of its system call,
 * and the gate holds it there (a return from a system call: no fuse). The
 * price, paid only after a report has been blocked for the fuse: putting
 * the probe on walks every thread of the machine (syscall_regfunc()) and
 * patches code, at most about once a second; while it is on, every system
 * call of the machine takes the slow exit path and looks through a list
 * (empty or one process, usually).
 *
 * Births (sched_process_fork): a thread that clone() makes while a change
 * is unreported was not there to be armed, and its first system call could
 * return the freed address. The tracepoint runs in the parent after the
 * child is made and before it first runs (kernel_clone(): before
 * wake_up_new_task()), where its gate can be armed for its first return.
 * On from the first delivery started until module exit (kreg_fork_probe_get()):
 * a call and a short list, empty without a delivery, per clone().
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
static LIST_HEAD(kreg_owed_list);	/* syncs with a debt: RCU for the probe */
static struct tracepoint *kreg_sys_exit;
static bool kreg_probe_on;
static unsigned long kreg_probe_puts;	/* times put on, for monitoring */

/*
 * The probe comes off a second after the last debt is settled, not at
 * once: a process whose reports keep waiting for a lock holder would
 * otherwise have every thread of the machine walked and code patched
 * (with its IPIs) up to 20 times a second.
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
	WRITE_ONCE(kreg_probe_on, !ret);
	if (!ret)
		WRITE_ONCE(kreg_probe_puts, kreg_probe_puts + 1);
	return ret;
}

/*
 * s has a debt (s->owed_until, set under s->lock): called by the gate of
 * the indebted thread before that thread goes on. 0 once its next system
 * call will meet the probe (syscall_regfunc() marked every thread, the
 * caller included, before the probe went on).
 */
int kreg_owed_watch(struct kreg_sync *s)
{
	int ret;

	mutex_lock(&kreg_owed_mutex);
	ret = kreg_probe_get();
	if (!ret && !s->owed_on) {
		kref_get(&s->ref);
		s->owed_on = true;
		list_add_rcu(&s->owed, &kreg_owed_list);
	}
	mutex_unlock(&kreg_owed_mutex);
	/* the report may have ended meanwhile, with no sweep to come */
	kreg_owed_settled(s);
	return ret;
}

/* s's queue moved or s stopped: a debt may be settled (any context). */
void kreg_owed_settled(struct kreg_sync *s)
{
	if (READ_ONCE(s->owed_until))
		schedule_work(&kreg_owed_work);
}

/*
 * Takes the settled syncs off the list (all of them if all), and the probe
 * off once the list is empty. kreg_owed_mutex held: a sync taken off is
 * not put back before the grace period that lets the probe's walk past it.
 */
static void kreg_owed_sweep_locked(bool all)
{
	struct kreg_sync *s, *tmp;
	LIST_HEAD(gone);
	bool settled;

	list_for_each_entry_safe(s, tmp, &kreg_owed_list, owed) {
		spin_lock(&s->lock);
		settled = all || s->dead || s->done >= s->owed_until;
		if (settled)
			s->owed_until = 0;
		spin_unlock(&s->lock);
		if (!settled)
			continue;
		list_del_rcu(&s->owed);
		s->owed_on = false;
		list_add(&s->owed_reap, &gone);
	}
	if (kreg_probe_on && list_empty(&kreg_owed_list)) {
		if (all) {
			tracepoint_probe_unregister(kreg_sys_exit,
						    (void *)kreg_owed_probe,
						    NULL);
			WRITE_ONCE(kreg_probe_on, false);
		} else {
			schedule_delayed_work(&kreg_probe_off_work,
					      KREG_PROBE_LINGER);
		}
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

/* In the parent, at every clone() of the machine while on. */
static void kreg_fork_probe(void *data, struct task_struct *parent,
			    struct task_struct *child)
{
	/* a thread (CLONE_THREAD), not a process or a kernel thread */
	if (child->mm && child->tgid == parent->tgid)
		kreg_sync_born(child);
}

static struct tracepoint *kreg_sched_fork;
static bool kreg_fork_on;
static unsigned long kreg_fork_puts;	/* times put on: sysfs, the tests */

/*
 * kreg_syncs_lock held, at every START: on from the first until module
 * exit, never off in between. Putting a probe on or off patches the
 * kernel's text (its static key), which qemu's multi-threaded TCG, where
 * CI runs the module, can crash or hang on while another vCPU runs that
 * code (doc/design.md, "qemu and the kernel's text patching"): on and off
 * at every first START and last STOP, it was patched about twice a test.
 * The price of staying on: a call and an empty list per clone() of the
 * machine. A failure is said once; births during a report are then not
 * held (counted nowhere: nothing sees them).
 */
void kreg_fork_probe_get(void)
{
	int ret;

	if (kreg_fork_on)
		return;
	if (!kreg_sched_fork)
		kreg_sched_fork = kreg_tracepoint("sched_process_fork");
	if (!kreg_sched_fork) {
		pr_warn_once("no sched_process_fork tracepoint: a thread born while a change is unreported is not held\n");
		return;
	}
	ret = tracepoint_probe_register(kreg_sched_fork,
					(void *)kreg_fork_probe, NULL);
	if (ret)
		pr_warn_once("sched_process_fork probe: error %d: a thread born while a change is unreported is not held\n",
			     ret);
	else
		kreg_fork_on = true;
	WRITE_ONCE(kreg_fork_puts, kreg_fork_puts + kreg_fork_on);
}

unsigned long kreg_fork_probe_puts(void)
{
	return READ_ONCE(kreg_fork_puts);
}

/* No debt for KREG_PROBE_LINGER: the probe comes off. */
static void kreg_probe_off(struct work_struct *work)
{
	mutex_lock(&kreg_owed_mutex);
	if (kreg_probe_on && list_empty(&kreg_owed_list)) {
		tracepoint_probe_unregister(kreg_sys_exit,
					    (void *)kreg_owed_probe, NULL);
		WRITE_ONCE(kreg_probe_on, false);
	}
	mutex_unlock(&kreg_owed_mutex);
}

/* Module exit: no descriptor is open, every sync is stopped. */
void kreg_owed_exit(void)
{
	flush_work(&kreg_owed_work);
	cancel_delayed_work_sync(&kreg_probe_off_work);
	mutex_lock(&kreg_owed_mutex);
	kreg_owed_sweep_locked(true);
	mutex_unlock(&kreg_owed_mutex);
	/* every sync is stopped: nothing calls kreg_fork_probe_get() now */
	if (kreg_fork_on) {
		tracepoint_probe_unregister(kreg_sched_fork,
					    (void *)kreg_fork_probe, NULL);
		kreg_fork_on = false;
	}
	/* no probe call of ours is still running */
	tracepoint_synchronize_unregister();
}
