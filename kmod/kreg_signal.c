// SPDX-License-Identifier: GPL-2.0
/*
 * The signal of synchronous delivery: held for the process while delivery
 * runs, so that nothing the application does with it can kill the process.
 *
 * The kernel decides what a pending signal does when it dequeues it
 * (get_signal()), under the process's siglock, after the gate has run.
 * A signal the module sent to a thread whose handler drained could meet
 * SIG_DFL there, if another thread changed the disposition meanwhile: a
 * real-time signal's default action kills the process. No check before
 * that dequeue can close the race (it is a TOCTOU between the module's
 * look and the kernel's); so the disposition must not change at all.
 * SYNC_START marks signo's action SA_IMMUTABLE, the flag the kernel uses
 * to keep a forced signal's disposition (do_sigaction() returns EINVAL on
 * it, as glibc's sigaction() does for its own reserved signals); STOP
 * takes the mark off again. exec resets it with every handler
 * (flush_signal_handlers()); a fork child inherits it with the handler and
 * keeps it until its own delivery starts and stops, or it execs.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/pid.h>
#include <linux/rcupdate.h>
#include <linux/sched/signal.h>
#include <linux/signal.h>

#include "kreg_priv.h"

/*
 * Runs fn(p, sh, arg) under the siglock sh of owner's process p; false if it is
 * gone. p's sighand changes only at exec and sighand structs are
 * SLAB_TYPESAFE_BY_RCU, so lock, then check the pointer again (as
 * lock_task_sighand(), which is not exported).
 */
bool kreg_owner_siglocked(struct pid *owner,
			  void (*fn)(struct task_struct *p,
				     struct sighand_struct *sh, void *arg),
			  void *arg)
{
	struct sighand_struct *sh;
	struct task_struct *p;
	unsigned long flags;
	bool done = false;

	rcu_read_lock();
	p = pid_task(owner, PIDTYPE_TGID);
	while (p && !done) {
		sh = rcu_dereference(p->sighand);
		if (!sh)
			break;
		spin_lock_irqsave(&sh->siglock, flags);
		if (sh == rcu_access_pointer(p->sighand)) {
			fn(p, sh, arg);
			done = true;
		}
		spin_unlock_irqrestore(&sh->siglock, flags);
	}
	rcu_read_unlock();
	return done;
}

#ifdef SA_IMMUTABLE
/*
 * current's process: signo's handler must be handler, kept across
 * deliveries (no SA_RESETHAND); then its disposition is held. 0 or
 * -EINVAL.
 */
int kreg_signal_hold(int signo, unsigned long handler)
{
	/* current's own: only its exec replaces it */
	struct sighand_struct *sh = rcu_dereference_protected(current->sighand, 1);
	struct k_sigaction *k = &sh->action[signo - 1];
	int ret = 0;

	spin_lock_irq(&sh->siglock);
	if ((unsigned long)k->sa.sa_handler != handler ||
	    (k->sa.sa_flags & SA_RESETHAND))
		ret = -EINVAL;
	else
		k->sa.sa_flags |= SA_IMMUTABLE;
	spin_unlock_irq(&sh->siglock);
	return ret;
}

struct kreg_release {
	int signo;
	unsigned long handler;
};

static void kreg_signal_release_locked(struct task_struct *p,
				       struct sighand_struct *sh, void *arg)
{
	struct kreg_release *r = arg;
	struct k_sigaction *k = &sh->action[r->signo - 1];

	if ((unsigned long)k->sa.sa_handler == r->handler)
		k->sa.sa_flags &= ~SA_IMMUTABLE;
}

/* The hold taken off, if owner's signo is still handler (not after exec). */
void kreg_signal_release(struct pid *owner, int signo, unsigned long handler)
{
	struct kreg_release r = { .signo = signo, .handler = handler };

	kreg_owner_siglocked(owner, kreg_signal_release_locked, &r);
}
#else
/* before 5.16: no way to hold a disposition, so no signal (signo 0 works) */
int kreg_signal_hold(int signo, unsigned long handler)
{
	return -EOPNOTSUPP;
}

void kreg_signal_release(struct pid *owner, int signo, unsigned long handler)
{
}
#endif
