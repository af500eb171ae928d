// SPDX-License-Identifier: GPL-2.0
/*
 * Registered ranges: one mmu_interval_notifier each, a slot in the counter
 * array, the range tree that bounds overlap, and the queue of changed
 * ranges that read() hands out. REGISTER and UNREGISTER run under
 * ctx->lock; the invalidate callback takes ctx->ev_lock only (see
 * kreg_priv.h for the order).
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/bitmap.h>
#include <linux/interval_tree.h>
#include <linux/minmax.h>
#include <linux/mm.h>
#include <linux/mmu_notifier.h>
#include <linux/nospec.h>
#include <linux/overflow.h>
#include <linux/poll.h>
#include <linux/slab.h>
#include <linux/uaccess.h>
#include <linux/wait.h>

#include "kreg_priv.h"

struct kreg_ev *kreg_ev_of(struct kreg_ctx *ctx, u32 slot)
{
	return &ctx->chunks[slot / KREG_CHUNK_SLOTS]->ev[slot % KREG_CHUNK_SLOTS];
}

struct kreg_range **kreg_range_ptr(struct kreg_ctx *ctx, u32 slot)
{
	struct kreg_chunk *c = ctx->chunks[slot / KREG_CHUNK_SLOTS];

	return c ? &c->range[slot % KREG_CHUNK_SLOTS] : NULL;
}

/* Counters only grow; 0 never names a registration. */
u64 kreg_bump(atomic64_t *counter)
{
	u64 v = atomic64_inc_return(counter);

	return v ? v : atomic64_inc_return(counter);
}

/*
 * The invalidate callback. Runs before the kernel changes the page tables of
 * [range->start, range->end) where it overlaps r, in the changing thread,
 * maybe non-blockable: atomics and ev_lock only, and it never fails.
 */
static bool kreg_invalidate(struct mmu_interval_notifier *mni,
			    const struct mmu_notifier_range *range,
			    unsigned long cur_seq)
{
	struct kreg_range *r = container_of(mni, struct kreg_range, mni);
	struct kreg_ctx *ctx = r->ctx;
	struct kreg_ev *ev = r->ev;
	bool wake = false;

	/* Lets mmu_interval_read_begin() in REGISTER see us in flight. */
	mmu_interval_set_seq(mni, cur_seq);

	switch (range->event) {
	case MMU_NOTIFY_PROTECTION_VMA:		/* mprotect, uffd-wp */
	case MMU_NOTIFY_PROTECTION_PAGE:	/* write-protect for writeback */
	case MMU_NOTIFY_SOFT_DIRTY:		/* clear_refs */
		/* The same pages stay mapped: a registration stays valid. */
		return true;
	default:
		break;
	}

	spin_lock(&ctx->ev_lock);
	kreg_bump(r->counter);
	if (!ev->queued) {
		ev->queued = 1;
		ev->start = r->start;
		ev->end = r->end;
		ev->next = KREG_NO_SLOT;
		if (ctx->q_tail == KREG_NO_SLOT)
			ctx->q_head = r->slot;
		else
			kreg_ev_of(ctx, ctx->q_tail)->next = r->slot;
		ctx->q_tail = r->slot;
		WRITE_ONCE(ctx->q_len, ctx->q_len + 1);
		wake = true;
	} else if (ev->start != r->start || ev->end != r->end) {
		/* the slot's unread record is from its previous range */
		ev->start = min(ev->start, r->start);
		ev->end = max(ev->end, r->end);
	}
	spin_unlock(&ctx->ev_lock);

	if (wake)
		wake_up_interruptible_poll(&ctx->wq, EPOLLIN | EPOLLRDNORM);
	return true;
}

static const struct mmu_interval_notifier_ops kreg_mni_ops = {
	.invalidate = kreg_invalidate,
};

/* Whether max_overlap live ranges of ctx overlap [start, last] (ctx->lock). */
static bool kreg_overlap_full(struct kreg_ctx *ctx, u64 start, u64 last)
{
	unsigned int cap = READ_ONCE(kreg_max_overlap), n = 0;
	struct interval_tree_node *it;

	for (it = interval_tree_iter_first(&ctx->tree, start, last); it;
	     it = interval_tree_iter_next(it, start, last))
		if (++n >= cap)
			return true;
	return false;
}

/*
 * Picks a slot for r and makes it live (ctx->lock held). Prefers a slot with
 * no unread record, so that records keep their own range.
 */
static int kreg_claim_slot(struct kreg_ctx *ctx, struct kreg_range *r)
{
	struct kreg_chunk *chunk = NULL;
	struct page *page;
	unsigned int ci;
	u32 slot;
	int ret;

	if (ctx->nr_live >= ctx->nslots)
		return -ENOSPC;
	ret = kreg_charge_range(ctx);
	if (ret)
		return ret;

	spin_lock(&ctx->ev_lock);
	slot = find_first_zero_bit(ctx->taken, ctx->nslots);
	if (slot >= ctx->nslots)
		slot = find_first_zero_bit(ctx->live, ctx->nslots);
	spin_unlock(&ctx->ev_lock);

	page = kreg_counter_page(ctx, slot / KREG_PAGE_SLOTS, &ret);
	if (!page)
		goto fail;
	ci = slot / KREG_CHUNK_SLOTS;
	if (!ctx->chunks[ci]) {
		ret = kreg_charge_mem(ctx, sizeof(*chunk));
		if (ret)
			goto fail;
		chunk = kzalloc(sizeof(*chunk), GFP_KERNEL_ACCOUNT);
		if (!chunk) {
			kreg_uncharge_mem(ctx, sizeof(*chunk));
			ret = -ENOMEM;
			goto fail;
		}
	}

	r->slot = slot;
	r->gen = ++ctx->gen;
	r->counter = (atomic64_t *)page_address(page) + slot % KREG_PAGE_SLOTS;

	spin_lock(&ctx->ev_lock);
	if (chunk)
		ctx->chunks[ci] = chunk;
	__set_bit(slot, ctx->live);
	__set_bit(slot, ctx->taken);
	spin_unlock(&ctx->ev_lock);

	r->ev = kreg_ev_of(ctx, slot);
	*kreg_range_ptr(ctx, slot) = r;
	ctx->nr_live++;
	r->itn.start = r->start;
	r->itn.last = r->end - 1;
	interval_tree_insert(&r->itn, &ctx->tree);
	return 0;

fail:
	kreg_uncharge_range(ctx);
	return ret;
}

/* Undoes kreg_claim_slot() (ctx->lock held, r's notifier not inserted). */
static void kreg_free_slot(struct kreg_ctx *ctx, struct kreg_range *r)
{
	interval_tree_remove(&r->itn, &ctx->tree);
	*kreg_range_ptr(ctx, r->slot) = NULL;
	spin_lock(&ctx->ev_lock);
	__clear_bit(r->slot, ctx->live);
	if (!r->ev->queued)
		__clear_bit(r->slot, ctx->taken);
	spin_unlock(&ctx->ev_lock);
	ctx->nr_live--;
	kreg_uncharge_range(ctx);
}

static void kreg_range_free(struct kreg_ctx *ctx, struct kreg_range *r)
{
	kfree(r);
	kreg_uncharge_mem(ctx, sizeof(*r));
}

/*
 * Ends a registration (ctx->lock held, or release). The bump comes first:
 * from then on a reader of the slot sees "not current", and until the
 * notifier is gone every change still bumps. Removing first would leave a
 * window in which a change completes, moves nothing, and UNREGISTER has
 * not returned yet.
 */
void kreg_drop(struct kreg_ctx *ctx, struct kreg_range *r)
{
	/* An old snapshot of this slot must never match again. */
	kreg_bump(r->counter);
	/* Waits for callbacks on other CPUs; none run on r afterwards. */
	mmu_interval_notifier_remove(&r->mni);
	kreg_free_slot(ctx, r);
	kreg_range_free(ctx, r);
}

long kreg_register(struct kreg_ctx *ctx,
		   struct kreg_nf_register __user *uarg)
{
	struct kreg_nf_register arg;
	struct kreg_range *r, **rp;
	u64 end, gen;
	int ret;

	if (copy_from_user(&arg, uarg, sizeof(arg)))
		return -EFAULT;
	if (arg.flags || !arg.len || !PAGE_ALIGNED(arg.start) ||
	    !PAGE_ALIGNED(arg.len) ||
	    check_add_overflow(arg.start, arg.len, &end) || end > TASK_SIZE)
		return -EINVAL;

	ret = kreg_charge_mem(ctx, sizeof(*r));
	if (ret)
		return ret;
	r = kzalloc(sizeof(*r), GFP_KERNEL_ACCOUNT);
	if (!r) {
		kreg_uncharge_mem(ctx, sizeof(*r));
		return -ENOMEM;
	}
	r->ctx = ctx;
	r->start = arg.start;
	r->end = end;

	if (mutex_lock_killable(&ctx->lock)) {
		kreg_range_free(ctx, r);
		return -EINTR;
	}
	if (kreg_overlap_full(ctx, r->start, r->end - 1)) {
		ret = -EMLINK;
		goto out_free;
	}
	ret = kreg_claim_slot(ctx, r);
	if (ret)
		goto out_free;
	/* current->mm == ctx->mm (checked by the caller): mm_users > 0 */
	ret = mmu_interval_notifier_insert(&r->mni, ctx->mm, r->start,
					   arg.len, &kreg_mni_ops);
	if (ret) {
		kreg_free_slot(ctx, r);
		goto out_free;
	}
	/*
	 * Bump, then wait for invalidations in flight. One that began before
	 * the insert never calls r; one that called r before the bump is
	 * included in it. read_begin() returns once both kinds have finished
	 * changing the page tables, so pages the caller pins after we return
	 * are the new ones; any later change calls r and moves the counter
	 * past arg.counter. (Bumping after read_begin() would let a callback
	 * run between the two, be hidden in the value returned, and zap what
	 * the caller pins next.)
	 */
	arg.counter = kreg_bump(r->counter);
	mmu_interval_read_begin(&r->mni);
	arg.slot = r->slot;
	gen = r->gen;
	mutex_unlock(&ctx->lock);

	/* Not under ctx->lock: this may fault, even into userfaultfd. */
	if (copy_to_user(uarg, &arg, sizeof(arg))) {
		/* the caller cannot know the slot: take it back if still ours */
		mutex_lock(&ctx->lock);
		rp = kreg_range_ptr(ctx, arg.slot);
		if (*rp && (*rp)->gen == gen)
			kreg_drop(ctx, *rp);
		mutex_unlock(&ctx->lock);
		return -EFAULT;
	}
	return 0;

out_free:
	mutex_unlock(&ctx->lock);
	kreg_range_free(ctx, r);
	return ret;
}

long kreg_unregister(struct kreg_ctx *ctx,
		     struct kreg_nf_unregister __user *uarg)
{
	struct kreg_nf_unregister arg;
	struct kreg_range **rp;
	long ret = 0;
	u32 slot;

	if (copy_from_user(&arg, uarg, sizeof(arg)))
		return -EFAULT;
	if (arg.flags || arg.slot >= ctx->nslots)
		return -EINVAL;
	/* no speculative chunks[] access past the bound either */
	slot = array_index_nospec(arg.slot, ctx->nslots);

	if (mutex_lock_killable(&ctx->lock))
		return -EINTR;
	rp = kreg_range_ptr(ctx, slot);
	if (rp && *rp)
		kreg_drop(ctx, *rp);
	else
		ret = -ENOENT;
	mutex_unlock(&ctx->lock);
	return ret;
}

/* Copies up to max queued records, leaving them queued (ev_lock). */
unsigned int kreg_peek(struct kreg_ctx *ctx, struct kreg_nf_event *out,
		       unsigned int max)
{
	unsigned int n = 0;
	u32 slot;

	spin_lock(&ctx->ev_lock);
	for (slot = ctx->q_head; slot != KREG_NO_SLOT && n < max; n++) {
		struct kreg_ev *ev = kreg_ev_of(ctx, slot);

		out[n] = (struct kreg_nf_event){
			.start = ev->start, .end = ev->end, .slot = slot,
		};
		slot = ev->next;
	}
	spin_unlock(&ctx->ev_lock);
	return n;
}

/*
 * Dequeues the leading records that still equal seen[] (another reader may
 * have taken them, or a change may have widened one); returns how many.
 */
unsigned int kreg_pop(struct kreg_ctx *ctx,
		      const struct kreg_nf_event *seen, unsigned int n)
{
	unsigned int i;

	spin_lock(&ctx->ev_lock);
	for (i = 0; i < n; i++) {
		u32 slot = ctx->q_head;
		struct kreg_ev *ev;

		if (slot != seen[i].slot)
			break;
		ev = kreg_ev_of(ctx, slot);
		if (ev->start != seen[i].start || ev->end != seen[i].end)
			break;
		ctx->q_head = ev->next;
		if (ctx->q_head == KREG_NO_SLOT)
			ctx->q_tail = KREG_NO_SLOT;
		WRITE_ONCE(ctx->q_len, ctx->q_len - 1);
		ev->queued = 0;
		if (!test_bit(slot, ctx->live))
			__clear_bit(slot, ctx->taken);
	}
	spin_unlock(&ctx->ev_lock);
	return i;
}
