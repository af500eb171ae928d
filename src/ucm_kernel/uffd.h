/* The userfaultfd descriptor: opening it, watching ranges, and the kernel
 * checks a lookup makes. No threads and no bookkeeping here. */
#ifndef UCX_KREG_UFFD_H
#define UCX_KREG_UFFD_H

#include "ucm_kernel.h"

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>

namespace kreg {

struct uffd_options {
    bool try_device;   /* /dev/userfaultfd when the syscall is refused */
    bool try_wp_async;
};

/* What the kernel says of a range at a lookup. */
enum class check_result {
    watched,   /* every page lies in a mapping this descriptor watches    */
    changed,   /* some page does not: a new mapping, or none              */
    in_flight  /* an unmap, remap or remove event of this descriptor is on
                  its way: ask again once it has been read                 */
};

/* What one system call says of a range at a hit (uffd::quick_check). */
enum class quick_result {
    watched,   /* one mapping registered with a userfaultfd holds the whole
                  range, and no event is in flight                         */
    in_flight, /* as check_result::in_flight                               */
    ask        /* anything else: a hole, several mappings, a new mapping,
                  a mapping whose first page is present (shared memory,
                  hugetlbfs): ask check()                                  */
};

class uffd {
public:
    uffd() = default;
    ~uffd() { close(); }
    uffd(const uffd &) = delete;
    uffd &operator=(const uffd &) = delete;

    /* Opens and negotiates features. On failure returns false and sets
     * reason() and error(). */
    bool open(const uffd_options &opts);
    /* Drops the kernel side (every watch; threads blocked in munmap are
     * woken) but keeps the descriptor number reserved (pointing at
     * /dev/null), so that a thread still about to use it can never reach
     * a descriptor opened since by someone else. close() frees it. */
    void release_kernel_side();
    void close();
    /* Forgets the descriptors without closing them. Returns the uffd (in a
     * forked child the caller closes the child's copy). */
    int forget();

    /* UFFDIO_REGISTER in write-protect mode. Returns 0 or an errno. On
     * failure nothing stays registered that was not registered before,
     * except where `keep` says a part was (see uffd_backend). */
    int watch(uintptr_t start, size_t len) const;
    /* UFFDIO_UNREGISTER. Returns 0 or an errno. */
    int unwatch(uintptr_t start, size_t len) const;

    /* Cheap: true while any UNMAP, REMAP or REMOVE event of this
     * descriptor is between the kernel raising it (under the mm lock,
     * before the change) and our reader having read it. */
    bool event_in_flight() const;
    /* Exact: whether [start, start+len) still lies in mappings this
     * descriptor watches. PAGEMAP_SCAN per mapping where the kernel has it
     * (6.7+, WP_ASYNC), else UFFDIO_WRITEPROTECT, which walks the pages
     * and also reports in_flight. */
    check_result check(uintptr_t start, size_t len) const;
    /* A hit's check in one system call where the kernel answers as open()
     * found it does (quick_checks()): UFFDIO_CONTINUE, which looks at
     * mmap_changing first (in_flight), then for one mapping that holds
     * the range and is registered with a userfaultfd (else ENOENT); on a
     * private anonymous mapping it stops there with EINVAL (watched),
     * having changed nothing. On shared memory and hugetlbfs it would map
     * page-cache pages that are not mapped yet, as a read fault would;
     * where the range's first page is present it stops at once (EEXIST). */
    quick_result quick_check(uintptr_t start, size_t len) const;
    bool quick_checks() const { return quick_ok_; }
    /* Whether any present page of the range is a page-cache page (file or
     * shared memory), by /proc/self/pagemap. */
    bool has_page_cache_pages(uintptr_t start, size_t len) const;

    int fd() const { return fd_; }
    uint64_t features() const { return features_; }
    bool via_device() const { return via_device_; }
    bool user_mode_only() const { return user_mode_only_; }
    bool wp_async() const;
    bool event_remap() const;
    bool scans() const { return scan_ok_ && scan_works_; }
    kreg_reason_t reason() const { return reason_; }
    const std::string &error() const { return error_; }

    static kreg_reason_t reason_of(int err);

private:
    int open_fd(int flags, bool *via_device);
    check_result wp_check(uintptr_t start, size_t len) const;
    /* 1 watched, 0 not, -1 the kernel has no PAGEMAP_SCAN */
    int scan_check(uintptr_t start, size_t len) const;
    /* Whether UFFDIO_CONTINUE answers as quick_check() reads it, tried on
     * a mapping of our own. */
    bool probe_quick_check() const;

    int         fd_         = -1;
    int         pagemap_fd_ = -1;
    uint64_t    features_   = 0;
    bool        via_device_ = false;
    bool        user_mode_only_ = false;
    bool        try_device_ = true;
    bool        scan_ok_    = false;
    bool        quick_ok_   = false;
    mutable std::atomic<bool> scan_works_{true};
    kreg_reason_t reason_ = KREG_REASON_NONE;
    std::string error_;
};

} // namespace kreg

#endif
