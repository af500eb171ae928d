// SPDX-License-Identifier: GPL-2.0
/*
 * Limits and accounting: the module parameters, the live counts that sysfs
 * shows, and what each uid holds (descriptors, ranges, bytes of module
 * memory). Locks: kreg_users_lock (mutex) for the per-uid table, taken by
 * open, release and sysfs only, never with another lock of ours held;
 * everything else here is atomic.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/cred.h>
#include <linux/hashtable.h>
#include <linux/moduleparam.h>
#include <linux/mutex.h>
#include <linux/slab.h>
#include <linux/sysfs.h>

#include "kreg_priv.h"

unsigned int kreg_max_ranges = 16384;
static unsigned int max_total_ranges = 1U << 20;
static unsigned int max_files_per_user = 512;
static unsigned int max_ranges_per_user = 131072;
static unsigned int max_kib_per_user = 65536;
unsigned int kreg_max_overlap = 32;

static int kreg_set_max_ranges(const char *val, const struct kernel_param *kp)
{
	return param_set_uint_minmax(val, kp, 1, KREG_MAX_RANGES_LIMIT);
}

static const struct kernel_param_ops kreg_max_ranges_ops = {
	.set = kreg_set_max_ranges,
	.get = param_get_uint,
};

module_param_cb(max_ranges, &kreg_max_ranges_ops, &kreg_max_ranges, 0644);
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
module_param_cb(max_overlap, &kreg_positive_ops, &kreg_max_overlap, 0644);
MODULE_PARM_DESC(max_overlap,
		 "ranges of one descriptor over any one page (EMLINK; default 32)");

/* Live objects, shown in sysfs so that tests can see leaks. */
atomic_long_t kreg_nr_contexts = ATOMIC_LONG_INIT(0);
atomic_long_t kreg_nr_ranges = ATOMIC_LONG_INIT(0);
atomic_long_t kreg_nr_bytes = ATOMIC_LONG_INIT(0);

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
int kreg_charge_mem(struct kreg_ctx *ctx, size_t bytes)
{
	long limit = (long)min_t(u64, (u64)READ_ONCE(max_kib_per_user) << 10,
				 LONG_MAX);

	if (!kreg_add_below(&ctx->user->bytes, bytes,
			    ctx->unlimited ? -1 : limit))
		return -EDQUOT;
	atomic_long_add(bytes, &kreg_nr_bytes);
	return 0;
}

void kreg_uncharge_mem(struct kreg_ctx *ctx, size_t bytes)
{
	atomic_long_sub(bytes, &ctx->user->bytes);
	atomic_long_sub(bytes, &kreg_nr_bytes);
}

/*
 * One more range: -EDQUOT past max_ranges_per_user, -ENOSPC past
 * max_total_ranges.
 */
int kreg_charge_range(struct kreg_ctx *ctx)
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

void kreg_uncharge_range(struct kreg_ctx *ctx)
{
	atomic_long_dec(&ctx->user->nr_ranges);
	atomic_long_dec(&kreg_nr_ranges);
}

/*
 * The uid's entry with one more descriptor, or -EMFILE (max_files_per_user)
 * or -ENOMEM.
 */
struct kreg_user *kreg_user_get(kuid_t uid, bool unlimited)
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

void kreg_user_put(struct kreg_user *u)
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

/* "uid descriptors ranges bytes", a line per uid holding a descriptor */
ssize_t kreg_users_show(char *buf)
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
