// SPDX-License-Identifier: GPL-2.0
/*
 * Whether a range may hold pages pinned for DMA (or, for
 * KREG_NF_SYNC_UNPINNED, any page at all): the filter that keeps
 * synchronous delivery to changes of registered memory. No lock of ours.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/mm.h>
#include <linux/pgtable.h>

#include "kreg_priv.h"

static bool kreg_pfn_pinned(unsigned long pfn, bool any)
{
	return any || (pfn_valid(pfn) &&
		       folio_maybe_dma_pinned(page_folio(pfn_to_page(pfn))));
}

/*
 * Whether a page in [addr, end) of mm may be pinned for DMA. Called only
 * from an invalidate callback for exactly that range, whoever runs it (a
 * thread of mm, another process truncating a shared file, ksmd, kswapd): the
 * caller is about to zap these page tables itself and holds what keeps them
 * from being freed meanwhile (mmap_lock, or the file's i_mmap_rwsem or the
 * anon_vma lock, which free_pgtables() needs after unlinking the VMA), so a
 * lockless read of them, as GUP-fast does it, is safe here and only here.
 * Interrupts are off as GUP-fast has them. A huge entry is one folio. No
 * reference is taken: a page still mapped here cannot be freed. With any,
 * the first page mapped counts, pinned or not.
 */
bool kreg_range_pinned(struct mm_struct *mm, unsigned long addr,
		       unsigned long end, bool any)
{
	unsigned long flags, next;
	bool pinned = false;

	local_irq_save(flags);
	for (; addr < end && !pinned; addr = next) {
		pgd_t pgd = READ_ONCE(*pgd_offset(mm, addr));
		p4d_t p4d;
		pud_t pud;
		pmd_t pmd;
		pte_t *ptep;

		next = pgd_addr_end(addr, end);
		if (pgd_none(pgd) || pgd_bad(pgd))
			continue;
		p4d = READ_ONCE(*p4d_offset(&pgd, addr));
		next = p4d_addr_end(addr, end);
		if (p4d_none(p4d) || p4d_bad(p4d))
			continue;
		pud = READ_ONCE(*pud_offset(&p4d, addr));
		next = pud_addr_end(addr, end);
		if (pud_none(pud) || !pud_present(pud))
			continue;
		if (pud_leaf(pud)) {
			pinned = kreg_pfn_pinned(pud_pfn(pud), any);
			continue;
		}
		if (pud_bad(pud))
			continue;
		pmd = READ_ONCE(*pmd_offset(&pud, addr));
		next = pmd_addr_end(addr, end);
		if (pmd_none(pmd) || !pmd_present(pmd))
			continue;
		if (pmd_leaf(pmd)) {
			pinned = kreg_pfn_pinned(pmd_pfn(pmd), any);
			continue;
		}
		if (pmd_bad(pmd))
			continue;
		/* the page table's entries in turn, not a walk from pgd each */
		ptep = pte_offset_kernel(&pmd, addr);
		for (; addr < next && !pinned; addr += PAGE_SIZE, ptep++) {
			pte_t pte = READ_ONCE(*ptep);

			if (pte_present(pte) && !pte_special(pte))
				pinned = kreg_pfn_pinned(pte_pfn(pte), any);
		}
	}
	local_irq_restore(flags);
	return pinned;
}
