/* The userfaultfd descriptor: opening it, watching ranges, asking the kernel
 * whether a range is still the watched mapping. No threads here. */
#ifndef UCX_KREG_UFFD_H
#define UCX_KREG_UFFD_H

#include "ucm_kernel.h"

#include <cstddef>
#include <atomic>
#include <cstdint>
#include <string>

namespace kreg {

struct UffdOptions {
    bool try_device;  /* /dev/userfaultfd when the syscall is refused   */
    bool try_wp_async;
    bool want_remap;  /* request UFFD_FEATURE_EVENT_REMAP               */
};

class Uffd {
public:
    Uffd() = default;
    ~Uffd() { close(); }
    Uffd(const Uffd &) = delete;
    Uffd &operator=(const Uffd &) = delete;

    /* Opens and negotiates features. On failure returns false and sets
     * reason() and error(). */
    bool open(const UffdOptions &opts);
    void close();
    /* Forgets the descriptor without closing it (after fork, the child's
     * copy is closed by the caller). */
    int release_fd();

    /* UFFDIO_REGISTER in write-protect mode. Returns 0 or an errno. */
    int watch(uintptr_t start, size_t len) const;
    /* UFFDIO_UNREGISTER. Returns 0 or an errno. */
    int unwatch(uintptr_t start, size_t len) const;
    /* true if every page of the range lies in a mapping this descriptor
     * watches (so it is the mapping that was registered: a new mapping at
     * the same address is never watched). Exact; one syscall: PAGEMAP_SCAN
     * per mapping where the kernel has it (6.7+ with WP_ASYNC), else
     * UFFDIO_WRITEPROTECT, which walks the range's pages. */
    bool is_watched(uintptr_t start, size_t len) const;

    int fd() const { return fd_; }
    uint64_t features() const { return features_; }
    bool via_device() const { return via_device_; }
    bool user_mode_only() const { return user_mode_only_; }
    bool wp_async() const;
    bool event_remap() const;
    bool scans() const { return pagemap_fd_ >= 0 && scan_works_; }
    kreg_reason_t reason() const { return reason_; }
    const std::string &error() const { return error_; }

    static kreg_reason_t reason_of(int err);

private:
    int open_fd(int flags, bool *via_device);
    bool wp_check(uintptr_t start, size_t len) const;
    /* 1 watched, 0 not, -1 the kernel has no PAGEMAP_SCAN */
    int scan_check(uintptr_t start, size_t len) const;

    int         fd_ = -1;
    uint64_t    features_ = 0;
    bool        via_device_ = false;
    bool        user_mode_only_ = false;
    bool        try_device_ = true;
    int         pagemap_fd_ = -1;
    mutable std::atomic<bool> scan_works_{true};
    kreg_reason_t reason_ = KREG_REASON_NONE;
    std::string error_;
};

} // namespace kreg

#endif
