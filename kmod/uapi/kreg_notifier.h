/* SPDX-License-Identifier: (GPL-2.0 WITH Linux-syscall-note) OR MIT */
/*
 * kreg_notifier: the user-space interface of the ucx-kreg notifier module.
 *
 * A process opens KREG_NF_DEVICE (one descriptor per process is enough),
 * maps the counter array read-only (offset 0, KREG_NF_IOC_INFO gives the
 * size) and registers address ranges with KREG_NF_IOC_REGISTER. The module
 * puts an mmu_interval_notifier on each range; whenever the kernel is about
 * to change which pages back any part of it (munmap, mremap in every form,
 * madvise DONTNEED/FREE/REMOVE, truncate or hole punch of shared memory,
 * migration, exit), the notifier bumps the range's counter, in the changing
 * thread, before the change, and queues the range for read(). Changes that
 * leave the pages in place (mprotect of whole pages, soft-dirty clearing)
 * bump nothing; an mprotect that splits a huge page does.
 *
 * A cached registration is current iff its slot's counter still holds the
 * value returned by REGISTER: one load, no system call.
 *
 * The descriptor belongs to the address space (mm) that opened it: after a
 * fork the child gets -EPERM from every call on the inherited descriptor and
 * no copy of the counter mapping; it opens its own. The same holds for a
 * descriptor passed to another process, and after execve() (open it with
 * O_CLOEXEC). poll() from another mm reports EPOLLERR.
 *
 * Registrations live until the descriptor's last reference goes: the last
 * close(), or the munmap() of the counter mapping if that comes later (the
 * mapping holds the file), or the process's exit.
 *
 * Checking a cached registration: REGISTER, keep the returned counter, pin
 * the pages (ibv_reg_mr), then load the counter again: if it moved, the pin
 * may hold old pages (unregister and start over). Afterwards, the entry is
 * current iff the counter still equals the kept value.
 *
 * UNREGISTER bumps the slot's counter first, then removes the notifier
 * (waiting for callbacks running on it), then frees the slot. A caller may
 * rely on this:
 *  - a change of the range's pages that completes before UNREGISTER returns
 *    has moved the counter past every value it held before UNREGISTER was
 *    called, by the time the change completes: its callback did, or
 *    UNREGISTER's bump came first. No change is missed while it runs.
 *  - while UNREGISTER runs the counter may move more than once, and the
 *    range may still be queued for read().
 *  - once it returned: the counter differs from every value it held before
 *    the call, no callback runs on the range any more, and the slot may be
 *    handed to a later REGISTER, whose value is larger still. The counter
 *    then follows that registration; nothing is said about the old range.
 *
 * The counter mapping: pages come in at first access (a REGISTER in their
 * slots or a load), so that open() costs a few KiB; a load of a page that
 * would take its user past max_kib_per_user gets SIGBUS (it never happens
 * for a slot that REGISTER returned). The pages cannot be pinned (VM_PFNMAP:
 * get_user_pages, vmsplice and O_DIRECT fail with EFAULT) and are not
 * readable through /proc/PID/mem or ptrace.
 *
 * Limits (module parameters, /sys/module/kreg_notifier/parameters/, root
 * may change them at any time; they apply to what comes next). The per-user
 * ones count what the opener's real uid holds over all its descriptors; a
 * process with CAP_SYS_RESOURCE or CAP_SYS_ADMIN when it opens is held by
 * the others only:
 *   max_ranges          slots of one descriptor (read at open)    ENOSPC
 *   max_total_ranges    ranges over all descriptors               ENOSPC
 *   max_files_per_user  open descriptors of one uid               EMFILE
 *   max_ranges_per_user ranges of one uid                         EDQUOT
 *   max_kib_per_user    module memory of one uid (KiB)            EDQUOT
 *   max_overlap         ranges of one descriptor that overlap
 *                       any one range being registered            EMLINK
 *
 * Errors (errno), any call: EPERM from another mm; ENOTTY for an unknown
 * ioctl; EFAULT for an argument that cannot be read or written (nothing
 * changes then: a REGISTER whose result cannot be written is undone); EINTR
 * when a fatal signal arrives while the call waits for another one of the
 * same descriptor, or (REGISTER) when any signal is pending while the
 * kernel sets up notifiers for the process's first range: call again.
 *   open()      EMFILE  the uid holds max_files_per_user descriptors (or the
 *                       process's RLIMIT_NOFILE, as for any open)
 *               EDQUOT  the uid's memory would pass max_kib_per_user
 *               ENOMEM
 *   REGISTER    EINVAL  flags not 0, start or len not page aligned, len 0,
 *                       start + len wraps or lies above the top of user
 *                       space (TASK_SIZE)
 *               ENOSPC  every slot of this descriptor is taken (max_ranges),
 *                       or all descriptors together hold max_total_ranges
 *               EDQUOT  the uid holds max_ranges_per_user ranges, or its
 *                       memory would pass max_kib_per_user
 *               EMLINK  max_overlap ranges of this descriptor overlap the
 *                       new one (a page is watched that often already)
 *               ENOMEM
 *   UNREGISTER  EINVAL  flags not 0, slot >= max_ranges
 *               ENOENT  nothing is registered in the slot
 *   read()      EINVAL  count smaller than one record
 *               EAGAIN  O_NONBLOCK and nothing queued (otherwise it blocks)
 *   mmap()      EINVAL  offset not 0, or longer than counters_size
 *               EACCES  PROT_WRITE, now or later (mprotect); the mapping is
 *                       never copied into a child (madvise MADV_DOFORK on
 *                       it fails with EINVAL), grown, pinned or dumped
 *   a load from the mapping  SIGBUS  its page would pass max_kib_per_user
 */
#ifndef _UAPI_KREG_NOTIFIER_H
#define _UAPI_KREG_NOTIFIER_H

#include <linux/ioctl.h>
#include <linux/types.h>

#define KREG_NF_DEVICE       "/dev/kreg_notifier"
#define KREG_NF_ABI_VERSION  1

/* KREG_NF_IOC_INFO (out) */
struct kreg_nf_info {
	__u32 abi_version;   /* KREG_NF_ABI_VERSION */
	__u32 max_ranges;    /* slots of this descriptor: 0 .. max_ranges-1 */
	/* bytes to mmap at offset 0 (page multiple): __u64 counters[max_ranges] */
	__u64 counters_size;
};

/* KREG_NF_IOC_REGISTER (in/out) */
struct kreg_nf_register {
	/*
	 * in: page aligned, start + len must not wrap and must lie below the
	 * top of user space
	 */
	__u64 start;
	__u64 len;     /* in: a non-zero multiple of the page size */
	__u32 flags;   /* in: 0 */
	__u32 slot;    /* out: index into the counter array */
	/*
	 * out: the slot's counter after registration, never 0; any later
	 * change of the range's pages moves it
	 */
	__u64 counter;
};

/*
 * KREG_NF_IOC_UNREGISTER (in). Bumps the slot's counter before it removes
 * the notifier (see the top), so no change is missed while it runs and an
 * old snapshot never matches a later user of the slot.
 */
struct kreg_nf_unregister {
	__u32 slot;
	__u32 flags;   /* 0 */
};

/*
 * read() returns whole records: ranges whose counter moved, each slot at
 * most once until it is read. A record's range is the one registered when
 * the change happened (the slot may have been unregistered since). A new
 * registration takes a slot whose record is unread only when no other slot
 * is free; a change of the new range then widens that record to cover both
 * ranges. A record is dequeued only once it was copied out: a read() that
 * fails with EFAULT loses none.
 */
struct kreg_nf_event {
	__u64 start;
	__u64 end;     /* exclusive: start + len of the registration */
	__u32 slot;
	__u32 flags;   /* 0 */
};

#define KREG_NF_IOC_MAGIC      'K'
#define KREG_NF_IOC_INFO       _IOR(KREG_NF_IOC_MAGIC, 0x40, struct kreg_nf_info)
#define KREG_NF_IOC_REGISTER   _IOWR(KREG_NF_IOC_MAGIC, 0x41, struct kreg_nf_register)
#define KREG_NF_IOC_UNREGISTER _IOW(KREG_NF_IOC_MAGIC, 0x42, struct kreg_nf_unregister)

/*
 * Synchronous delivery (KREG_NF_IOC_SYNC_*): UCX's own registration caches
 * made exact for every transport, without a per-hit check.
 *
 * SYNC_START puts an mmu_notifier on the caller's address space. From then
 * on a change of pages that may be pinned for DMA (folio_maybe_dma_pinned():
 * ibv_reg_mr, io_uring fixed buffers, ...), in a process that has pinned
 * memory, by whoever makes it, is queued as a range, and
 *  - with a signo, the changing thread (a thread of the process that does
 *    not block signo) gets signo; its handler DRAINs before the thread's
 *    next instruction. Otherwise (signo 0, blocked, another process, a
 *    kernel thread, io_uring's workers) the dispatcher is woken (poll:
 *    EPOLLIN);
 *  - every thread of the process waits at its next return to user space
 *    (from a system call, a fault or an interrupt) until every change
 *    queued before has been acknowledged by a DRAIN ("the gate"), at most
 *    gate_timeout_ms from the end of the last of those changes (a change
 *    whose call is still under way, its thread starved of its CPU, say,
 *    needs nothing of a held thread); a change that a DRAIN gave up
 *    waiting for wakes the dispatcher at its end. A thread whose own
 *    handler is about to run passes
 *    (its handler reports everything queued), and so do the dispatcher, a
 *    thread that is reporting (its last DRAIN handed it ranges: what it
 *    runs to report them may make system calls inside locks that other
 *    reporters need) and a thread that has exec'ed. After 2 ms a waiting gate wakes the
 *    dispatcher. A thread at a return from an interrupt or exception
 *    (its tick, the unmap's own TLB shootdown) goes on at once when every
 *    unreported change took its mapping away and left no VMA there (its
 *    changing thread's munmap, brk, shmdt, or mremap that moved or shrank
 *    it, not MAP_FIXED or MREMAP_FIXED over it, not MREMAP_DONTUNMAP:
 *    irq_passes); after any other change it goes on once
 *    a report has waited 50 ms for it (it may hold a user-space lock the
 *    report needs: irq_releases), and so does a thread held at the return
 *    of an mmap or mremap that failed or mapped nothing of an unreported
 *    change (call_releases: such a lock holder obtained nothing stale; one
 *    that mapped a freed address is held, it is the race). Its next
 *    system call that makes a mapping is then held at its end
 *    (irq_next_held, through the module's ftrace hooks where mappings are
 *    made, do_mmap, do_brk_flags and mremap, on from the first SYNC_START
 *    to module exit) if it maps a page of an unreported change (brk: one
 *    in the heap; any call but mmap, mremap and brk: always), 250 ms at
 *    most, for it may be made
 *    inside that lock (irq_next_released: a window, and the thread owes
 *    its next one); a new mapping by any thread ends the passes until the
 *    report (the threads let go are armed again). A
 *    thread that clone() makes while a change is unreported is held at its
 *    first return (born_held, a probe on sched_process_fork from the first
 *    delivery started until module exit). The module interrupts no thread in user space (but the
 *    TLB shootdown of an unmap does, and a gate holds the thread it
 *    interrupted until the report), and a change
 *    costs nothing per thread that did not enter the kernel since the
 *    last one.
 * Pages that are not pinned are not queued: memory that was never
 * registered pays one page-table walk in the changing thread. With the flag
 * KREG_NF_SYNC_UNPINNED the address space's own changes (its threads', a
 * vfork child's, io_uring workers') of any page mapped are queued too, for
 * caches of registrations that pin nothing (xpmem, knem, an mlock): each
 * such change then costs its thread the signal; another process's or a
 * kernel thread's change of pages not pinned still queues nothing.
 *
 * DRAIN hands out every queued range not yet acknowledged whose change has
 * ended (its pages are gone; it waits for the ones being zapped), oldest
 * first, and returns seq (a change that turned out to be a huge page
 * split, every page kept, is acknowledged with the others but never handed
 * out); once the caller has reported them (ucm_vm_munmap()), it passes seq
 * as ack to its next DRAIN: that releases
 * every gate waiting for those ranges. Several threads may DRAIN at once;
 * each gets every range not yet acknowledged, so each acknowledges only
 * what it reported itself. A full queue widens its newest range.
 *
 * Windows left, each counted in the stats: a gate that gave up after
 * gate_timeout_ms (gate_timeouts); a thread that could not get a gate for
 * want of memory (gate_nomem: it is looked for again at the next change);
 * more than 64 changes in flight at once (inflight_full: handed out before
 * their end); a thread let go at an interrupt whose next system call could
 * not be watched (irq_unwatched: the kernel refused the ftrace hooks) or
 * was let go too (irq_next_released).
 *
 * signo is held while delivery runs: SYNC_START needs signo's handler in
 * the process to be handler already (not SA_RESETHAND), and from then on
 * sigaction() on signo fails with EINVAL (the kernel's SA_IMMUTABLE, as for
 * glibc's reserved signals), so no disposition can meet the module's
 * signal and kill the process. SYNC_STOP gives it back; exec resets it; a
 * fork child inherits it until its own delivery starts and stops, or it
 * execs. Threads may still block signo (they are then held until the
 * dispatcher reports).
 *
 * SYNC_STOP (also the owner's close() of the descriptor) removes the
 * notifier and opens every gate; gates still queued on threads free
 * themselves at once (their threads are woken as for a signal with no
 * handler). Errors: EINVAL for a bad argument or an unknown flag, or a signo
 * whose handler is not handler; EOPNOTSUPP for a signo on a kernel before
 * 5.16 (no SA_IMMUTABLE: use signo 0); EBUSY for a second SYNC_START, on
 * this descriptor or another in the same address space;
 * ENOENT for SYNC_* before SYNC_START; ENOMEM.
 */

/* KREG_NF_IOC_SYNC_START (in) */
struct kreg_nf_sync_start {
	/*
	 * 1.._NSIG but SIGKILL and SIGSTOP; 0: no signal, every change is
	 * gated and drained by the dispatcher
	 */
	__u32 signo;
	__u32 gate_timeout_ms; /* 1..60000 */
	__u32 flags;           /* 0 or KREG_NF_SYNC_UNPINNED */
	__u32 reserved;        /* 0 */
	/*
	 * the handler's address (not 0 with a signo): signo's handler in the
	 * process, installed before SYNC_START, held until SYNC_STOP
	 */
	__u64 handler;
};

/* kreg_nf_sync_start.flags: also the process's own changes of pages not pinned */
#define KREG_NF_SYNC_UNPINNED 0x1U

/* A range handed out by DRAIN. */
struct kreg_nf_range {
	__u64 start;
	__u64 end;     /* exclusive */
};

/* KREG_NF_IOC_SYNC_DRAIN (in/out) */
struct kreg_nf_sync_drain {
	__u64 ack;     /* in: a seq of an earlier DRAIN now reported, or 0 */
	__u64 buf;     /* in: struct kreg_nf_range[max] */
	__u32 max;     /* in: 1..KREG_NF_SYNC_QUEUE */
	__u32 count;   /* out: ranges written */
	__u64 seq;     /* out: acknowledge this once they are reported */
};

/* KREG_NF_IOC_SYNC_STATS (out): counts since SYNC_START */
struct kreg_nf_sync_stats {
	__u64 queued;        /* ranges queued (pinned pages changed) */
	__u64 signalled;     /* signals sent to the changing thread */
	/* changing thread held: no signo, or signo blocked */
	__u64 self_gated;
	__u64 gates;         /* gates armed: threads to pass one */
	__u64 gate_waits;    /* gates that had to sleep */
	__u64 gate_timeouts; /* gates that gave up after gate_timeout_ms */
	__u64 gate_nomem;    /* threads that could not be held (no memory) */
	/*
	 * queued from another process, a kernel thread or an io_uring
	 * worker: reported by the dispatcher
	 */
	__u64 late;
	__u64 overflows;     /* ranges merged into the newest (queue full) */
	__u64 unpinned;      /* changes skipped: no pinned page in the range */
	__u64 drains;        /* DRAIN calls that handed out ranges */
	/* gates that let their thread go: its own handler reports first */
	__u64 gate_passes;
	__u64 threads;       /* gates made: threads of the process seen */
	/* DRAINs that waited for a queued change to end (its zap) */
	__u64 drain_waits;
	/* changes by the dispatcher itself, reported by it */
	__u64 own_changes;
	/*
	 * changes handed out without waiting for their end (more than 64 in
	 * flight at once)
	 */
	__u64 inflight_full;
	/*
	 * threads held at a return from an interrupt or exception that went
	 * on while a report was under way for 50 ms without an end (they may
	 * hold a lock the report needs); each one's next system call that can
	 * return an address is held at its end until the report
	 * (irq_next_held), through the module's ftrace hooks on those calls
	 */
	__u64 irq_releases;
	/*
	 * of those and irq_passes, held at the end of their next mmap,
	 * mremap, brk or shmat
	 */
	__u64 irq_next_held;
	/*
	 * of irq_releases, those whose next system call could not be watched
	 * (the kernel refused the module's ftrace hooks): a window
	 */
	__u64 irq_unwatched;
	/*
	 * threads that clone() made while a change was unreported, held at
	 * their first return to user space until it was reported
	 */
	__u64 born_held;
	/*
	 * of irq_next_held, system calls let go after a report waited 250 ms
	 * more for their thread (made inside the lock the report needs): each
	 * returned before the report, a window; the thread owes its next one
	 */
	__u64 irq_next_released;
	/*
	 * threads held at the return of an mmap or mremap that failed or
	 * mapped nothing of an unreported change, let go as irq_releases
	 * (they may hold a lock the report needs; their next call that can
	 * return an address is held): they obtained nothing stale
	 */
	__u64 call_releases;
	/*
	 * threads at a return from an interrupt or exception let go at once:
	 * every unreported change had taken its range's mapping away (their
	 * own munmap, mremap, brk or shmdt, leaving no VMA), so no touch could
	 * map a page of it, and their next mmap, mremap, brk or shmat is held
	 * until the report if it maps a page of one (irq_next_held), through
	 * the module's ftrace hooks on those calls
	 */
	__u64 irq_passes;
	/*
	 * gates parked at a return from an interrupt or exception: a change
	 * that takes its range's mapping away does not arm them again; the
	 * thread's next system call does (parked_held if a change it had not
	 * passed was unreported there: held at that call's end), and so do a
	 * change that keeps its range mapped and any new mapping while a
	 * change is unreported. Without the module's ftrace hook on the
	 * kernel's system call entry work: 0, every change arms them.
	 */
	__u64 gates_parked;
	__u64 parked_held;
};

#define KREG_NF_SYNC_QUEUE 64

#define KREG_NF_IOC_SYNC_START      _IOW(KREG_NF_IOC_MAGIC, 0x43, struct kreg_nf_sync_start)
#define KREG_NF_IOC_SYNC_DRAIN      _IOWR(KREG_NF_IOC_MAGIC, 0x44, struct kreg_nf_sync_drain)
#define KREG_NF_IOC_SYNC_DISPATCHER _IO(KREG_NF_IOC_MAGIC, 0x45)
#define KREG_NF_IOC_SYNC_STOP       _IO(KREG_NF_IOC_MAGIC, 0x46)
#define KREG_NF_IOC_SYNC_STATS      _IOR(KREG_NF_IOC_MAGIC, 0x47, struct kreg_nf_sync_stats)

#endif /* _UAPI_KREG_NOTIFIER_H */
