// SPDX-License-Identifier: GPL-2.0
/*
 * Placement: while a change of pinned memory is unreported, an mmap whose
 * address the kernel chooses is steered off the change's range.
 *
 * The kernel places a new mapping in the highest free gap below mmap_base
 * that fits: after a munmap that is often the range just freed. A thread
 * whose mmap returns an address of an unreported change has obtained it
 * before the report (the address-reuse race) and is held at the call's
 * return until the report (kreg_gate.c). But the thread may have made the
 * call inside a user-space lock that the report needs: UCX 1.13's rcache
 * grows the memory pool of its page directories by an mmap under the
 * spinlock its unmap callback takes, so the reporter spins on the lock the
 * held thread holds until the gate times out (UCP over rc_verbs with 2 and
 * 8 threads: 2 gates in 39 runs timed out so, the module's log showing the
 * holder at mmap's return and both reporters in pthread_spin_lock()). No
 * fuse can let such a thread go without opening the race, so the range
 * is kept out of the placement instead: the call gets a hint the kernel
 * takes as it is (a free range), the highest gap below mmap_base that fits
 * and overlaps no unreported change. Its return is then clean
 * (kreg_gate_call_clean()), and a held caller is let go by the fuse.
 *
 * Only anonymous private mappings (malloc's, UCX's pools and buffers) with
 * no MAP_FIXED, MAP_FIXED_NOREPLACE, MAP_32BIT, MAP_GROWSDOWN or
 * MAP_HUGETLB: a file's or shmem's own placement may align a hint into the
 * range, and a fixed address is the caller's choice (held at its return).
 * A mapping of 2 MiB or more gets 2 MiB of free slack above it, since a
 * kernel that aligns large anonymous mappings to huge pages takes a hint
 * only where the padded length is free (since 6.7, until hints were
 * taken as they are), and one of whole huge pages a hint aligned to them,
 * with 2 MiB more slack: a kernel that chooses the address aligns those
 * itself (6.12), and the hint would otherwise cost them their huge pages
 * whenever a change is unreported.
 * No unreported change may lie anywhere in the slack, where such a kernel
 * may move the mapping. When no such gap is found the call is left alone
 * (held at its return, as before).
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/compat.h>
#include <linux/maple_tree.h>
#include <linux/mm.h>
#include <linux/mman.h>
#include <linux/sched.h>

#include "kreg_priv.h"

#ifdef CONFIG_DEFAULT_MMAP_MIN_ADDR
#define KREG_PLACE_LOW	max_t(unsigned long, PAGE_SIZE, CONFIG_DEFAULT_MMAP_MIN_ADDR)
#else
#define KREG_PLACE_LOW	PAGE_SIZE
#endif
/* gaps looked at before the call is left alone */
#define KREG_PLACE_TRIES	16

/*
 * The lowest start of an unreported change that [start, end) overlaps, or
 * 0 (s->lock held).
 */
static unsigned long kreg_place_overlap(struct kreg_sync *s,
					unsigned long start, unsigned long end)
{
	unsigned long low = 0;
	u32 i;

	for (i = 0; i < s->q_n; i++) {
		struct kreg_sync_ent *e =
			&s->q[(s->q_first + i) % KREG_NF_SYNC_QUEUE];

		if (e->seq > s->done && e->start != e->end &&
		    e->start < end && start < e->end &&
		    (!low || e->start < low))
			low = e->start;
	}
	return low;
}

/*
 * mmap_lock held for write (do_mmap()'s caller took it). Every call gets a
 * hint while a change is unreported, whatever gap the kernel itself would
 * have taken: which one that is depends on its version (a huge-page
 * alignment pads the length on some), and guessing wrong is the race.
 */
static unsigned long kreg_place_off(struct kreg_sync *s, struct mm_struct *mm,
				    unsigned long addr, unsigned long len)
{
	unsigned long size = len, high = mm->mmap_base, hint = 0, over;
	bool huge = IS_ENABLED(CONFIG_TRANSPARENT_HUGEPAGE) &&
		    IS_ALIGNED(len, PMD_SIZE);
	int tries;

	if (len >= PMD_SIZE)
		size += huge ? 2 * PMD_SIZE : PMD_SIZE;
	if (size < len || size > high)
		return 0;
	spin_lock(&s->lock);
	/* the caller's own hint, if the kernel takes it and it is clear */
	if (addr) {
		addr = PAGE_ALIGN(addr);
		if (addr >= KREG_PLACE_LOW && addr <= TASK_SIZE - size &&
		    !find_vma_intersection(mm, addr, addr + size) &&
		    !kreg_place_overlap(s, addr, addr + size))
			goto out;
	}
	for (tries = 0; tries < KREG_PLACE_TRIES; tries++) {
		MA_STATE(mas, &mm->mm_mt, 0, 0);

		if (high < KREG_PLACE_LOW + size ||
		    mas_empty_area_rev(&mas, KREG_PLACE_LOW, high - 1, size))
			break;
		/* the mapping at the bottom of the area, the slack above it */
		over = kreg_place_overlap(s, mas.index, mas.index + size);
		if (!over) {
			hint = huge ? ALIGN(mas.index, PMD_SIZE) : mas.index;
			break;
		}
		high = over;
	}
out:
	spin_unlock(&s->lock);
	return hint;
}

/*
 * Whether do_mmap()'s call is one to steer: an anonymous private mapping
 * whose address the kernel chooses, from a 64-bit call of a user thread.
 */
static bool kreg_place_wanted(struct file *file, unsigned long len,
			      unsigned long flags)
{
	if (file || !len || (flags & MAP_TYPE) != MAP_PRIVATE ||
	    (flags & (MAP_FIXED | MAP_FIXED_NOREPLACE | MAP_GROWSDOWN |
		      MAP_HUGETLB)) ||
	    (current->flags & PF_KTHREAD) || in_compat_syscall())
		return false;
#ifdef MAP_32BIT
	if (flags & MAP_32BIT)
		return false;
#endif
	return true;
}

/*
 * At do_mmap()'s entry, s the delivery of current's mm with a change
 * unreported (kreg_sync_call()), mmap_lock held for write: the hint to
 * pass instead of addr, or 0 to leave the call alone.
 */
unsigned long kreg_place(struct kreg_sync *s, struct file *file,
			 unsigned long addr, unsigned long len,
			 unsigned long flags)
{
	if (!kreg_place_wanted(file, len, flags) || !PAGE_ALIGN(len))
		return 0;
	return kreg_place_off(s, current->mm, addr, PAGE_ALIGN(len));
}
