// SPDX-License-Identifier: GPL-2.0
/*
 * Probes for what no notifier and no task_work can see: a thread's next
 * system call that can return an address, and a thread's birth.
 *
 * Debts (ftrace, at the entry of the kernel functions that make a new
 * mapping, kreg_call_fns[]): a thread that a gate let go at a
 * return from an interrupt (kreg_gate.c) has obtained nothing since the
 * change, but its gate is spent, and its next call that can hand it an
 * address (an mmap that returns the address another thread freed) must
 * still be held at its end until the change is reported. A task_work
 * queued by the gate itself runs in the same return to user space
 * (task_work_run() loops until the list is empty), and the flag that makes
 * a return run task_work is cleared by every return: nothing a module may
 * queue survives the trip to user space. What does run in a chosen
 * thread's next such call is a hook at that call's entry: it arms the
 * thread's gate there, and the gate holds it at the call's return. The
 * same hook in any thread ends the pass (kreg_sync_call()): once a new
 * mapping may be made, a touch may fault a page in where a change was.
 *
 * The hooks, not the sys_exit tracepoint (what the module used before):
 * that tracepoint puts every system call of the machine on the slow exit
 * path while a probe is on it (getppid 1.30x under TCG), and going on and
 * off it patches the kernel's text each time, which qemu's multi-threaded
 * TCG, where CI runs the module, can crash on (doc/design.md, "qemu and
 * the kernel's text patching"). The hooks go on at the first START and
 * stay on until module exit (one patch per module load); their price is a
 * call and an empty-list check per new mapping of the machine, and a short
 * list walk in a process whose delivery runs.
 *
 * System calls of parked threads (ftrace, at syscall_trace_enter(), the
 * entry work the kernel runs only for a thread whose syscall_work asks for
 * it): a gate parked at an interrupt's return (kreg_gate.c) is armed again
 * by its thread's next system call, not by every change. Only threads
 * that audit, seccomp, a tracer or a parked gate mark reach it: a thread
 * with none of these pays nothing.
 *
 * Births (sched_process_fork): a thread that clone() makes while a change
 * is unreported was not there to be armed, and its first system call could
 * return the freed address. The tracepoint runs in the parent after the
 * child is made and before it first runs (kernel_clone(): before
 * wake_up_new_task()), where its gate can be armed for its first return.
 * Also on from the first START until module exit: a call and a short
 * list, empty without a delivery, per clone().
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/ftrace.h>
#include <linux/sched.h>
#include <linux/string.h>
#include <linux/tracepoint.h>

#include "kreg_priv.h"

/*
 * Where every new mapping of a process is made (6.1 to 6.12), before it is
 * made: do_mmap() for mmap, shmat, io_setup's ring, uselib, remap and
 * every driver's vm_mmap(); do_brk_flags() for brk and vm_brk_flags();
 * _install_special_mapping() for the vDSO (arch_prctl) and uprobes' page;
 * mremap, which moves or grows a VMA with none of these, at its entries.
 * At the syscall entries instead (mmap, shmat, brk), io_setup and uselib
 * mapped the freed address unheld (found in review).
 */
static const char *const kreg_call_fns[] = {
	"do_brk_flags", "_install_special_mapping",
	"__x64_sys_mremap",
#ifdef CONFIG_IA32_EMULATION
	"__ia32_sys_mremap",
#endif
};

static void notrace kreg_call_hook(unsigned long ip, unsigned long parent_ip,
				   struct ftrace_ops *op,
				   struct ftrace_regs *fregs)
{
	kreg_sync_call(NULL, 0, 0, 0, false);
}

static struct ftrace_ops kreg_call_ops = {
	.func = kreg_call_hook,
	/*
	 * ftrace keeps the hook from recursing and disables preemption.
	 * PERMANENT: with kernel.ftrace_enabled = 0 registration fails (else it
	 * succeeds and patches nothing), and the sysctl cannot turn the hook
	 * off under a delivery that counts on it.
	 */
	.flags = FTRACE_OPS_FL_RECURSION | FTRACE_OPS_FL_PERMANENT,
};

/*
 * The argument registers that ftrace saved at the call's entry and puts
 * back before the call goes on (x86-64's ftrace_caller with
 * DYNAMIC_FTRACE_WITH_ARGS, 6.1 to 6.12), NULL without them.
 */
static struct pt_regs *kreg_call_args(struct ftrace_regs *fregs)
{
#if defined(arch_ftrace_regs)
	return &arch_ftrace_regs(fregs)->regs;
#elif defined(CONFIG_HAVE_DYNAMIC_FTRACE_WITH_ARGS)
	return &fregs->regs;
#else
	return NULL;
#endif
}

/*
 * do_mmap() has a hook of its own: while a change is unreported it may
 * steer the call off the change's range by its address argument
 * (kreg_place.c), then ends the pass as the others do.
 * do_mmap(file, addr, len, prot, flags, ...) on 6.1 to 6.12: file in rdi,
 * addr in rsi, len in rdx, flags in r8.
 */
static void notrace kreg_mmap_hook(unsigned long ip, unsigned long parent_ip,
				   struct ftrace_ops *op,
				   struct ftrace_regs *fregs)
{
	struct pt_regs *args = kreg_call_args(fregs);
	unsigned long hint;

	if (!args) {
		kreg_sync_call(NULL, 0, 0, 0, false);
		return;
	}
	hint = kreg_sync_call((struct file *)args->di, args->si, args->dx,
			      args->r8, true);
	if (hint)
		args->si = hint;
}

static struct ftrace_ops kreg_mmap_ops = {
	.func = kreg_mmap_hook,
	/* as kreg_call_ops */
	.flags = FTRACE_OPS_FL_RECURSION | FTRACE_OPS_FL_PERMANENT,
};

static void notrace kreg_syscall_hook(unsigned long ip,
				      unsigned long parent_ip,
				      struct ftrace_ops *op,
				      struct ftrace_regs *fregs)
{
	kreg_sync_syscall();
}

static struct ftrace_ops kreg_syscall_ops = {
	.func = kreg_syscall_hook,
	/* as kreg_call_ops */
	.flags = FTRACE_OPS_FL_RECURSION | FTRACE_OPS_FL_PERMANENT,
};

static bool kreg_call_on, kreg_syscall_on;
static unsigned long kreg_call_puts;	/* times put on: sysfs, the tests */

static int kreg_call_hook_register(void)
{
	size_t i;
	int ret = 0;

	if (!IS_ENABLED(CONFIG_X86_64) || !IS_ENABLED(CONFIG_DYNAMIC_FTRACE))
		return -EOPNOTSUPP;
	for (i = 0; i < ARRAY_SIZE(kreg_call_fns) && !ret; i++)
		ret = ftrace_set_filter(&kreg_call_ops,
					(unsigned char *)kreg_call_fns[i],
					strlen(kreg_call_fns[i]), 0);
	if (!ret)
		ret = ftrace_set_filter(&kreg_mmap_ops, (unsigned char *)"do_mmap",
					strlen("do_mmap"), 0);
	if (!ret)
		ret = register_ftrace_function(&kreg_call_ops);
	if (!ret) {
		ret = register_ftrace_function(&kreg_mmap_ops);
		if (ret)
			unregister_ftrace_function(&kreg_call_ops);
	}
	if (ret) {
		ftrace_free_filter(&kreg_call_ops);
		ftrace_free_filter(&kreg_mmap_ops);
	}
	return ret;
}

/* gates may let a thread go at an interrupt: its next call is watched */
bool kreg_call_hook_on(void)
{
	return READ_ONCE(kreg_call_on);
}

static int kreg_syscall_hook_register(void)
{
	/*
	 * 6.1 builds it as syscall_trace_enter.constprop.0. On the stack:
	 * ftrace's glob parser cuts the pattern at its '*' in place (a string
	 * literal there oopsed in filter_parse_regex()).
	 */
	char fn[] = "syscall_trace_enter*";
	int ret = ftrace_set_filter(&kreg_syscall_ops, (unsigned char *)fn,
				    strlen(fn), 0);

	if (!ret)
		ret = register_ftrace_function(&kreg_syscall_ops);
	if (ret)
		ftrace_free_filter(&kreg_syscall_ops);
	return ret;
}

/* gates may park: a parked thread's next system call is watched */
bool kreg_syscall_hook_on(void)
{
	return READ_ONCE(kreg_syscall_on);
}

unsigned long kreg_call_hook_puts(void)
{
	return READ_ONCE(kreg_call_puts);
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
 * kreg_syncs_lock held, at every START: both on from the first until
 * module exit, never off in between. Putting a probe on or off patches the
 * kernel's text (its static key, or ftrace's call site), which qemu's
 * multi-threaded TCG, where CI runs the module, can crash or hang on while
 * another vCPU runs that code (doc/design.md, "qemu and the kernel's text
 * patching"): on and off at every first START and last STOP, the fork
 * probe was patched about twice a test. A failure is said once. Without
 * the fork probe births during a report are not held (counted nowhere:
 * nothing sees them); without the call hooks gates hold a thread at an
 * interrupt's return as they would at a system call's.
 */
void kreg_probes_get(void)
{
	int ret;

	if (!kreg_call_on) {
		ret = kreg_call_hook_register();
		if (ret)
			pr_warn_once("no ftrace hook on do_mmap, do_brk_flags, mremap (error %d): threads are held at interrupts\n",
				     ret);
		else
			WRITE_ONCE(kreg_call_on, true);
		WRITE_ONCE(kreg_call_puts, kreg_call_puts + kreg_call_on);
		/* tried once, with the call hooks, which parking needs */
		ret = kreg_call_on ? kreg_syscall_hook_register() : -ENOENT;
		if (ret)
			pr_warn_once("no ftrace hook on syscall_trace_enter (error %d): every change arms the gates of threads let go at interrupts\n",
				     ret);
		else
			WRITE_ONCE(kreg_syscall_on, true);
	}
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

/* Module exit: no descriptor is open, every sync is stopped. */
void kreg_probes_exit(void)
{
	/* waits until no CPU runs the hook */
	if (kreg_syscall_on) {
		unregister_ftrace_function(&kreg_syscall_ops);
		ftrace_free_filter(&kreg_syscall_ops);
		kreg_syscall_on = false;
	}
	if (kreg_call_on) {
		unregister_ftrace_function(&kreg_mmap_ops);
		unregister_ftrace_function(&kreg_call_ops);
		ftrace_free_filter(&kreg_mmap_ops);
		ftrace_free_filter(&kreg_call_ops);
		kreg_call_on = false;
	}
	/* every sync is stopped: nothing calls kreg_probes_get() now */
	if (kreg_fork_on) {
		tracepoint_probe_unregister(kreg_sched_fork,
					    (void *)kreg_fork_probe, NULL);
		kreg_fork_on = false;
	}
	/* no probe call of ours is still running */
	tracepoint_synchronize_unregister();
}
