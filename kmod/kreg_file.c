// SPDX-License-Identifier: GPL-2.0
/*
 * The descriptor: open and release (a context per open file), flush, one
 * handler per ioctl command, read() and poll() of the range queue.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/capability.h>
#include <linux/cred.h>
#include <linux/fs.h>
#include <linux/mm.h>
#include <linux/poll.h>
#include <linux/sched/mm.h>
#include <linux/slab.h>
#include <linux/uaccess.h>
#include <linux/wait.h>

#include "kreg_priv.h"

static long kreg_info(struct kreg_ctx *ctx, struct kreg_nf_info __user *uarg)
{
	struct kreg_nf_info info = {
		.abi_version = KREG_NF_ABI_VERSION,
		.max_ranges = ctx->nslots,
		.counters_size = ctx->counters_size,
	};

	return copy_to_user(uarg, &info, sizeof(info)) ? -EFAULT : 0;
}

static long kreg_ioctl(struct file *file, unsigned int cmd, unsigned long arg)
{
	struct kreg_ctx *ctx = file->private_data;
	void __user *uarg = (void __user *)arg;

	/* a forked child or another process holding the descriptor */
	if (current->mm != ctx->mm)
		return -EPERM;

	switch (cmd) {
	case KREG_NF_IOC_INFO:
		return kreg_info(ctx, uarg);
	case KREG_NF_IOC_REGISTER:
		return kreg_register(ctx, uarg);
	case KREG_NF_IOC_UNREGISTER:
		return kreg_unregister(ctx, uarg);
	case KREG_NF_IOC_SYNC_START:
		return kreg_sync_start(ctx, uarg);
	case KREG_NF_IOC_SYNC_DRAIN:
		return kreg_sync_drain(ctx, uarg);
	case KREG_NF_IOC_SYNC_DISPATCHER:
		return kreg_sync_dispatcher(ctx);
	case KREG_NF_IOC_SYNC_STOP:
		return kreg_sync_stop(ctx);
	case KREG_NF_IOC_SYNC_STATS:
		return kreg_sync_stats(ctx, uarg);
	default:
		return -ENOTTY;
	}
}

/*
 * Whole records only. A record is dequeued only once it has been copied to
 * the caller, so a bad buffer loses nothing. No lock is held while copying.
 */
static ssize_t kreg_read(struct file *file, char __user *buf, size_t count,
			 loff_t *ppos)
{
	struct kreg_ctx *ctx = file->private_data;
	struct kreg_nf_event evs[KREG_READ_BATCH];
	size_t max = count / sizeof(evs[0]), done = 0;
	unsigned int n, got;
	int ret;

	if (current->mm != ctx->mm)
		return -EPERM;
	if (!max)
		return -EINVAL;

	while (done < max) {
		n = kreg_peek(ctx, evs, min_t(size_t, max - done,
					      KREG_READ_BATCH));
		if (!n) {
			if (done)
				break;
			if (file->f_flags & O_NONBLOCK)
				return -EAGAIN;
			ret = wait_event_interruptible(ctx->wq,
						       READ_ONCE(ctx->q_len));
			if (ret)
				return ret;
			continue;
		}
		if (copy_to_user(buf + done * sizeof(evs[0]), evs,
				 n * sizeof(evs[0])))
			return done ? done * sizeof(evs[0]) : -EFAULT;
		got = kreg_pop(ctx, evs, n);
		done += got;
		/* taken by a concurrent reader or widened: look again */
		if (got < n && done)
			break;
	}
	return done * sizeof(evs[0]);
}

static __poll_t kreg_poll(struct file *file, poll_table *wait)
{
	struct kreg_ctx *ctx = file->private_data;
	__poll_t mask = 0;

	if (current->mm != ctx->mm)
		return EPOLLERR;
	poll_wait(file, &ctx->wq, wait);
	if (READ_ONCE(ctx->q_len))
		mask = EPOLLIN | EPOLLRDNORM;
	/* set once under ctx->lock, kept until release */
	if (READ_ONCE(ctx->sync))
		mask |= kreg_sync_poll(ctx->sync, file, wait);
	return mask;
}

static void kreg_ctx_free(struct kreg_ctx *ctx)
{
	unsigned int i;
	unsigned int nchunks = DIV_ROUND_UP(ctx->nslots, KREG_CHUNK_SLOTS);

	for (i = 0; ctx->chunks && i < nchunks; i++) {
		if (!ctx->chunks[i])
			continue;
		kfree(ctx->chunks[i]);
		kreg_uncharge_mem(ctx, sizeof(struct kreg_chunk));
	}
	kvfree(ctx->chunks);
	kvfree(ctx->live);
	kvfree(ctx->taken);
	if (ctx->pages)
		for (i = 0; i < ctx->nr_pages; i++)
			if (ctx->pages[i]) {
				__free_page(ctx->pages[i]);
				kreg_uncharge_mem(ctx, PAGE_SIZE);
			}
	kvfree(ctx->pages);
	kreg_sync_put(ctx);
	put_pid(ctx->tgid);
	kreg_uncharge_mem(ctx, ctx->base_bytes);
	kfree(ctx);
}

/*
 * A context with its arrays; counter pages and per-slot state come later.
 * Charged to the opener's cgroup (GFP_KERNEL_ACCOUNT) and to user: -EDQUOT
 * past max_kib_per_user, or -ENOMEM.
 */
static struct kreg_ctx *kreg_ctx_alloc(u32 nslots, struct kreg_user *user,
				       bool unlimited)
{
	size_t nlongs = BITS_TO_LONGS(nslots);
	size_t nchunks = DIV_ROUND_UP(nslots, KREG_CHUNK_SLOTS);
	size_t counters_size = PAGE_ALIGN((size_t)nslots * sizeof(u64));
	size_t nr_pages = counters_size >> PAGE_SHIFT;
	struct kreg_ctx tmp = { .user = user, .unlimited = unlimited };
	struct kreg_ctx *ctx;
	size_t bytes;

	bytes = sizeof(*ctx) + 2 * nlongs * sizeof(long) +
		(nchunks + nr_pages) * sizeof(void *);
	if (kreg_charge_mem(&tmp, bytes))
		return ERR_PTR(-EDQUOT);
	ctx = kzalloc(sizeof(*ctx), GFP_KERNEL_ACCOUNT);
	if (!ctx) {
		kreg_uncharge_mem(&tmp, bytes);
		return ERR_PTR(-ENOMEM);
	}
	ctx->user = user;
	ctx->unlimited = unlimited;
	ctx->base_bytes = bytes;
	ctx->nslots = nslots;
	ctx->counters_size = counters_size;
	ctx->nr_pages = nr_pages;
	ctx->tree = RB_ROOT_CACHED;
	mutex_init(&ctx->lock);
	spin_lock_init(&ctx->ev_lock);
	init_waitqueue_head(&ctx->wq);
	ctx->q_head = KREG_NO_SLOT;
	ctx->q_tail = KREG_NO_SLOT;

	ctx->pages = kvcalloc(nr_pages, sizeof(*ctx->pages),
			      GFP_KERNEL_ACCOUNT);
	ctx->chunks = kvcalloc(nchunks, sizeof(*ctx->chunks),
			       GFP_KERNEL_ACCOUNT);
	ctx->live = kvcalloc(nlongs, sizeof(long), GFP_KERNEL_ACCOUNT);
	ctx->taken = kvcalloc(nlongs, sizeof(long), GFP_KERNEL_ACCOUNT);
	if (!ctx->pages || !ctx->chunks || !ctx->live || !ctx->taken) {
		kreg_ctx_free(ctx);
		return ERR_PTR(-ENOMEM);
	}
	return ctx;
}

static int kreg_open(struct inode *inode, struct file *file)
{
	struct kreg_user *user;
	struct kreg_ctx *ctx;
	bool unlimited;

	if (!current->mm)
		return -EPERM;
	unlimited = ns_capable_noaudit(&init_user_ns, CAP_SYS_RESOURCE) ||
		    ns_capable_noaudit(&init_user_ns, CAP_SYS_ADMIN);
	user = kreg_user_get(current_uid(), unlimited);
	if (IS_ERR(user))
		return PTR_ERR(user);
	ctx = kreg_ctx_alloc(READ_ONCE(kreg_max_ranges), user, unlimited);
	if (IS_ERR(ctx)) {
		kreg_user_put(user);
		return PTR_ERR(ctx);
	}
	mmgrab(current->mm);
	ctx->mm = current->mm;
	ctx->file = file;
	ctx->tgid = get_pid(task_tgid(current));
	file->private_data = ctx;
	atomic_long_inc(&kreg_nr_contexts);
	return stream_open(inode, file);
}

/*
 * Last close: at close(), at exit (after exit_mm(): the address space may be
 * gone already, the mm_struct itself is still ours), in whatever process
 * held the last reference. No ioctl, read, mmap or fault can run any more.
 */
static int kreg_release(struct inode *inode, struct file *file)
{
	struct kreg_ctx *ctx = file->private_data;
	struct kreg_user *user = ctx->user;
	struct kreg_range **rp;
	u32 slot;

	/* gates still queued on threads keep only the sync (kreg_gate.c) */
	if (kreg_sync_of(ctx))
		kreg_sync_stop_locked(ctx->sync);
	for (slot = 0; slot < ctx->nslots; slot++) {
		rp = kreg_range_ptr(ctx, slot);
		if (!rp) {
			slot = round_up(slot + 1, KREG_CHUNK_SLOTS) - 1;
			continue;
		}
		if (*rp) {
			kreg_drop(ctx, *rp);
			cond_resched();
		}
	}
	mmdrop(ctx->mm);
	kreg_ctx_free(ctx);
	kreg_user_put(user);
	atomic_long_dec(&kreg_nr_contexts);
	return 0;
}

/*
 * Every close() of a descriptor of the file: the owner's close (or its
 * exit) stops synchronous delivery at once, even while a forked child
 * still holds the file open.
 */
static int kreg_flush(struct file *file, fl_owner_t id)
{
	struct kreg_ctx *ctx = file->private_data;

	if (task_tgid(current) == ctx->tgid && kreg_sync_of(ctx))
		kreg_sync_stop(ctx);
	return 0;
}

const struct file_operations kreg_fops = {
	.owner = THIS_MODULE,
	.open = kreg_open,
	.flush = kreg_flush,
	.release = kreg_release,
	.unlocked_ioctl = kreg_ioctl,
	.compat_ioctl = compat_ptr_ioctl,
	.read = kreg_read,
	.poll = kreg_poll,
	.mmap = kreg_mmap,
};
