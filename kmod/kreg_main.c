// SPDX-License-Identifier: GPL-2.0
/*
 * kreg_notifier's device: the misc device /dev/kreg_notifier and its sysfs
 * attributes. What the module is and how its parts fit: kreg_priv.h.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/device.h>
#include <linux/miscdevice.h>
#include <linux/module.h>

#include "kreg_priv.h"

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
	return kreg_users_show(buf);
}
static DEVICE_ATTR_ADMIN_RO(users);

/* 1 while the call hooks are on (kreg_probes.c): gates pass at interrupts */
static ssize_t call_hook_show(struct device *dev,
			      struct device_attribute *attr, char *buf)
{
	return sysfs_emit(buf, "%d\n", kreg_call_hook_on());
}
static DEVICE_ATTR_ADMIN_RO(call_hook);

/* 1 while the system call hook is on (kreg_probes.c): gates may park */
static ssize_t syscall_hook_show(struct device *dev,
				 struct device_attribute *attr, char *buf)
{
	return sysfs_emit(buf, "%d\n", kreg_syscall_hook_on());
}
static DEVICE_ATTR_ADMIN_RO(syscall_hook);

/* how many times they went on since the module loaded: once, or never */
static ssize_t call_hook_puts_show(struct device *dev,
				   struct device_attribute *attr, char *buf)
{
	return sysfs_emit(buf, "%lu\n", kreg_call_hook_puts());
}
static DEVICE_ATTR_ADMIN_RO(call_hook_puts);

/* how many times the sched_process_fork probe went on since the module loaded */
static ssize_t fork_probe_puts_show(struct device *dev,
				    struct device_attribute *attr, char *buf)
{
	return sysfs_emit(buf, "%lu\n", kreg_fork_probe_puts());
}
static DEVICE_ATTR_ADMIN_RO(fork_probe_puts);

static struct attribute *kreg_attrs[] = {
	&kreg_attr_contexts.attr.attr,
	&kreg_attr_ranges.attr.attr,
	&kreg_attr_memory.attr.attr,
	&dev_attr_users.attr,
	&dev_attr_call_hook.attr,
	&dev_attr_syscall_hook.attr,
	&dev_attr_call_hook_puts.attr,
	&dev_attr_fork_probe_puts.attr,
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

static int __init kreg_init(void)
{
	return misc_register(&kreg_misc);
}
module_init(kreg_init);

static void __exit kreg_exit(void)
{
	misc_deregister(&kreg_misc);
	/* after the last descriptor: the probes come off */
	kreg_probes_exit();
}
module_exit(kreg_exit);

MODULE_DESCRIPTION("Counters that tell a process when registered memory goes away (mmu_interval_notifier)");
MODULE_AUTHOR("ucx-kreg");
MODULE_LICENSE("GPL");
MODULE_VERSION(KREG_VERSION);
