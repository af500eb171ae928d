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

/*
 * The PMD entry that maps addr in mm, read as kreg_range_pinned() reads
 * them (same callers, same rules; interrupts off by the caller); false
 * where a level above it is absent or a leaf.
 */
static bool kreg_pmd_of(struct mm_struct *mm, unsigned long addr, pmd_t *out)
{
	pgd_t pgd = READ_ONCE(*pgd_offset(mm, addr));
	p4d_t p4d;
	pud_t pud;

	if (pgd_none(pgd) || pgd_bad(pgd))
		return false;
	p4d = READ_ONCE(*p4d_offset(&pgd, addr));
	if (p4d_none(p4d) || p4d_bad(p4d))
		return false;
	pud = READ_ONCE(*pud_offset(&p4d, addr));
	if (pud_none(pud) || !pud_present(pud) || pud_leaf(pud) ||
	    pud_bad(pud))
		return false;
	*out = READ_ONCE(*pmd_offset(&pud, addr));
	return true;
}

/*
 * The first pfn of a page table whose entries all map pfn, pfn + 1, ... in
 * turn (a huge page mapped by a page table), else 0. Interrupts off.
 */
static unsigned long kreg_table_run(pmd_t pmd, unsigned long start)
{
	unsigned long pfn = 0, i;
	pte_t *ptep;

	if (pmd_none(pmd) || !pmd_present(pmd) || pmd_leaf(pmd) ||
	    pmd_bad(pmd))
		return 0;
	ptep = pte_offset_kernel(&pmd, start);
	for (i = 0; i < PTRS_PER_PTE; i++, ptep++) {
		pte_t pte = READ_ONCE(*ptep);

		if (!pte_present(pte) || pte_special(pte) ||
		    (i && pte_pfn(pte) != pfn + i))
			return 0;
		if (!i)
			pfn = pte_pfn(pte);
	}
	return pfn;
}

/*
 * Huge page splits. Splitting a PMD mapping into a page table (mlock,
 * mprotect, munmap or madvise of part of a transparent huge page) is an
 * invalidation of the whole PMD_SIZE range that keeps every page where it
 * was: reported, it would invalidate every registration around the part
 * that changed (UCS's test_rcache, 6 threads sharing one VMA: 1 of 12
 * runs). So is the same call where the PMD was split already: 6.1 splits
 * at every VMA boundary made inside a PMD range without looking (its
 * split_huge_pmd_address()), an invalidation that changes nothing.
 * kreg_split_candidate() at the start of an invalidation of exactly one
 * PMD range gives the first pfn of a huge page it maps, by a PMD or by a
 * page table in turn (else 0); kreg_split_kept() at its end says whether a
 * page table now maps that pfn, pfn + 1, ... in turn, i.e. nothing
 * changed. A zap leaves the PMD empty, entries empty or other pages.
 */
unsigned long kreg_split_candidate(struct mm_struct *mm, unsigned long start,
				   unsigned long end)
{
	unsigned long flags, pfn = 0;
	pmd_t pmd;

	if (!IS_ENABLED(CONFIG_TRANSPARENT_HUGEPAGE) ||
	    end - start != PMD_SIZE || (start & ~PMD_MASK))
		return 0;
	local_irq_save(flags);
	if (kreg_pmd_of(mm, start, &pmd))
		pfn = pmd_present(pmd) && pmd_leaf(pmd) ? pmd_pfn(pmd) :
			kreg_table_run(pmd, start);
	local_irq_restore(flags);
	return pfn;
}

bool kreg_split_kept(struct mm_struct *mm, unsigned long start,
		     unsigned long pfn)
{
	unsigned long flags;
	bool kept = false;
	pmd_t pmd;

	local_irq_save(flags);
	if (kreg_pmd_of(mm, start, &pmd))
		kept = kreg_table_run(pmd, start) == pfn;
	local_irq_restore(flags);
	return kept;
}
