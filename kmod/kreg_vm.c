// SPDX-License-Identifier: GPL-2.0
/*
 * The counter pages: allocated on first use (REGISTER of one of their slots
 * or a fault of the mapping), mapped read-only into the process, never
 * changed until release. Takes no lock of ours: the fault handler runs under
 * mmap_lock or the VMA lock.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/mm.h>
#include <linux/nospec.h>
#include <linux/version.h>

#include "kreg_priv.h"

/*
 * The counter page idx, allocated on first use (REGISTER of one of its
 * slots, or a fault of the mapping) and never changed until release; NULL
 * with *err -EDQUOT or -ENOMEM. No lock needed: a racing second allocation
 * loses the cmpxchg() and is freed.
 */
struct page *kreg_counter_page(struct kreg_ctx *ctx, unsigned int idx,
			       int *err)
{
	/* pairs with cmpxchg() below: a page seen is a zeroed page */
	struct page *page = smp_load_acquire(&ctx->pages[idx]);
	struct page *old;

	if (page)
		return page;
	*err = kreg_charge_mem(ctx, PAGE_SIZE);
	if (*err)
		return NULL;
	page = alloc_page(GFP_KERNEL_ACCOUNT | __GFP_ZERO);
	if (!page) {
		kreg_uncharge_mem(ctx, PAGE_SIZE);
		*err = -ENOMEM;
		return NULL;
	}
	old = cmpxchg(&ctx->pages[idx], NULL, page);
	if (old) {
		__free_page(page);
		kreg_uncharge_mem(ctx, PAGE_SIZE);
		return old;
	}
	return page;
}

/*
 * A counter page comes in at the first access: allocated then if no
 * REGISTER did it yet (charged like the rest; past max_kib_per_user the
 * access gets SIGBUS), and inserted as a raw PFN, so that nothing can take a
 * reference to it (get_user_pages() refuses VM_PFNMAP | VM_IO mappings, and
 * the special PTE stops fast GUP). The pages stay until release, which the
 * mapping's reference to the file keeps away while any PTE points at them.
 */
static vm_fault_t kreg_fault(struct vm_fault *vmf)
{
	struct kreg_ctx *ctx = vmf->vma->vm_file->private_data;
	unsigned long idx = vmf->pgoff;
	struct page *page;
	int err;

	if (idx >= ctx->nr_pages)
		return VM_FAULT_SIGBUS;
	idx = array_index_nospec(idx, ctx->nr_pages);
	page = kreg_counter_page(ctx, idx, &err);
	if (!page)
		return err == -ENOMEM ? VM_FAULT_OOM : VM_FAULT_SIGBUS;
	return vmf_insert_pfn(vmf->vma, vmf->address, page_to_pfn(page));
}

static const struct vm_operations_struct kreg_vm_ops = {
	.fault = kreg_fault,
};

/*
 * The counters, read-only, at offset 0, at most counters_size bytes, pages
 * inserted as they are touched (kreg_fault). Not copied into a forked child
 * (VM_IO makes madvise(MADV_DOFORK) refuse to undo VM_DONTCOPY), never
 * writable (VM_MAYWRITE cleared, so mprotect cannot add PROT_WRITE), never
 * pinned (VM_PFNMAP), not grown by mremap, not dumped. Takes no lock of
 * ours: mmap_lock is held here.
 */
int kreg_mmap(struct file *file, struct vm_area_struct *vma)
{
	struct kreg_ctx *ctx = file->private_data;

	if (current->mm != ctx->mm)
		return -EPERM;
	if (vma->vm_pgoff || vma->vm_end - vma->vm_start > ctx->counters_size)
		return -EINVAL;
	if (vma->vm_flags & VM_WRITE)
		return -EACCES;
/* vm_flags became read-only in 6.3 */
#if KERNEL_VERSION(6, 3, 0) <= LINUX_VERSION_CODE
	vm_flags_set(vma, VM_DONTCOPY | VM_DONTEXPAND | VM_DONTDUMP | VM_IO |
		     VM_PFNMAP);
	vm_flags_clear(vma, VM_MAYWRITE);
#else
	vma->vm_flags |= VM_DONTCOPY | VM_DONTEXPAND | VM_DONTDUMP | VM_IO |
			 VM_PFNMAP;
	vma->vm_flags &= ~VM_MAYWRITE;
#endif
	vma->vm_ops = &kreg_vm_ops;
	return 0;
}
