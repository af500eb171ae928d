/* The userfaultfd descriptor (see uffd.h). About 400 lines: one
 * class, its opening and its kernel checks. */
#include "uffd.h"
#include "page.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <linux/userfaultfd.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

/* Debian 12's kernel headers are 6.1; these came later. */
#ifndef UFFD_FEATURE_WP_ASYNC
#define UFFD_FEATURE_WP_ASYNC (1ULL << 15)
#endif
#ifndef UFFD_FEATURE_WP_UNPOPULATED
#define UFFD_FEATURE_WP_UNPOPULATED (1ULL << 13)
#endif
#ifndef PAGEMAP_SCAN
/* linux/fs.h of 6.7+ */
struct pm_scan_arg {
    uint64_t size, flags, start, end, walk_end, vec, vec_len, max_pages;
    uint64_t category_inverted, category_mask, category_anyof_mask, return_mask;
};
struct page_region {
    uint64_t start, end, categories;
};
#define PAGEMAP_SCAN          _IOWR('f', 16, struct pm_scan_arg)
#define PAGE_IS_WPALLOWED     (1 << 0)
#define PM_SCAN_CHECK_WPASYNC (1 << 1)
#endif
#ifndef UFFD_USER_MODE_ONLY
#define UFFD_USER_MODE_ONLY 1
#endif

namespace kreg {

namespace {

constexpr uint64_t required_features =
    UFFD_FEATURE_EVENT_UNMAP | UFFD_FEATURE_EVENT_REMOVE |
    UFFD_FEATURE_EVENT_REMAP | UFFD_FEATURE_PAGEFAULT_FLAG_WP;

/* /proc/self/pagemap: bit 63 present, bit 61 file page or shared anon */
constexpr uint64_t kPmPresent   = 1ull << 63;
constexpr uint64_t kPmPageCache = 1ull << 61;

/* UFFDIO_API asking for `want`; *kernel_features (if given): what the
 * kernel answered. Returns 0 or an errno. */
int api_handshake(int fd, uint64_t want, uint64_t *kernel_features)
{
    struct uffdio_api api = {};
    api.api      = UFFD_API;
    api.features = want;
    if (ioctl(fd, UFFDIO_API, &api) != 0) {
        return errno;
    }
    if (kernel_features != nullptr) {
        *kernel_features = api.features;
    }
    return 0;
}

/* UFFDIO_CONTINUE of [start, start+len): 0 or the errno (uffd.h,
 * quick_check) */
int continue_errno(int fd, uintptr_t start, size_t len)
{
    struct uffdio_continue c = {};
    c.range.start = start;
    c.range.len   = len;
    c.mode        = UFFDIO_CONTINUE_MODE_DONTWAKE;
    return (ioctl(fd, UFFDIO_CONTINUE, &c) == 0) ? 0 : errno;
}

} // namespace

kreg_reason_t uffd::reason_of(int err)
{
    switch (err) {
    case ENOSYS: return KREG_REASON_ENOSYS;
    case EPERM:
    case EACCES: return KREG_REASON_EPERM;
    case EBUSY:  return KREG_REASON_EBUSY;
    case EINVAL: return KREG_REASON_EINVAL;
    case ENOMEM: return KREG_REASON_LIMIT; /* no mapping left to split */
    default:     return KREG_REASON_OTHER;
    }
}

int uffd::open_fd(int flags, bool *via_device)
{
    *via_device = false;
    int fd = static_cast<int>(syscall(SYS_userfaultfd, flags));
    if (fd >= 0) {
        return fd;
    }
    int sys_err = errno;
    /* The syscall is refused (seccomp, vm.unprivileged_userfaultfd=0 with
     * a kernel that ignores UFFD_USER_MODE_ONLY) but the device may be
     * open to us. */
    if ((sys_err == EPERM || sys_err == ENOSYS) && try_device_) {
        int dev = ::open("/dev/userfaultfd", O_RDWR | O_CLOEXEC);
        if (dev >= 0) {
            fd = ioctl(dev, USERFAULTFD_IOC_NEW, flags);
            int dev_err = errno;
            ::close(dev);
            if (fd >= 0) {
                *via_device = true;
                return fd;
            }
            errno = dev_err;
            return -1;
        }
    }
    errno = sys_err;
    return -1;
}

bool uffd::open(const uffd_options &opts)
{
    close();
    try_device_ = opts.try_device;
    reason_     = KREG_REASON_NONE;
    error_.clear();

    auto fail = [this](kreg_reason_t why, const std::string &text) {
        reason_ = why;
        error_  = text;
        return false;
    };

    /* UFFD_USER_MODE_ONLY lets an unprivileged process open it while
     * vm.unprivileged_userfaultfd=0; kernels before 5.11 reject the flag. */
    int flags = O_CLOEXEC | O_NONBLOCK | UFFD_USER_MODE_ONLY;
    bool dev  = false;
    int probe = open_fd(flags, &dev);
    if (probe < 0 && errno == EINVAL) {
        flags &= ~UFFD_USER_MODE_ONLY;
        probe = open_fd(flags, &dev);
    }
    if (probe < 0) {
        const int err = errno;
        return fail(reason_of(err), std::string("userfaultfd: ") + strerror(err));
    }

    /* UFFDIO_API can be called once per descriptor: ask what the kernel
     * has on a probe descriptor, then open the real one with our choice. */
    uint64_t avail = 0;
    int err        = api_handshake(probe, 0, &avail);
    ::close(probe);
    if (err != 0) {
        return fail(reason_of(err), std::string("UFFDIO_API: ") + strerror(err));
    }
    if ((avail & required_features) != required_features) {
        return fail(KREG_REASON_EINVAL,
                    "the kernel lacks userfaultfd unmap/remove/remap events "
                    "or write-protect mode (needs Linux 5.7)");
    }

    /* REMAP: a moved mapping, and the old range of MREMAP_DONTUNMAP, are
     * reported (without it DONTUNMAP leaves the old range watched, with
     * new pages and no event). The moved mapping carries the watch along;
     * lookups of it are still exact because the event is in flight until
     * read (see event_in_flight). */
    uint64_t want = UFFD_FEATURE_EVENT_UNMAP | UFFD_FEATURE_EVENT_REMOVE |
                    UFFD_FEATURE_EVENT_REMAP;
    if (opts.try_wp_async && (avail & UFFD_FEATURE_WP_ASYNC)) {
        /* WP_UNPOPULATED changes only how pages get write-protected, which
         * never happens here; with it PAGEMAP_SCAN tells watched anonymous
         * mappings apart (PAGE_IS_WPALLOWED) */
        want |= UFFD_FEATURE_WP_ASYNC | (UFFD_FEATURE_WP_UNPOPULATED & avail);
    }

    int fd = open_fd(flags, &dev);
    if (fd < 0) {
        err = errno;
        return fail(reason_of(err), std::string("userfaultfd: ") + strerror(err));
    }
    err = api_handshake(fd, want, nullptr); /* success: `want` is enabled */
    if (err != 0) {
        ::close(fd);
        return fail(reason_of(err), std::string("UFFDIO_API: ") + strerror(err));
    }
    fd_             = fd;
    features_       = want;
    pagemap_fd_     = ::open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
    scan_ok_        = (pagemap_fd_ >= 0) && (want & UFFD_FEATURE_WP_ASYNC) &&
                      (want & UFFD_FEATURE_WP_UNPOPULATED);
    scan_works_     = true;
    via_device_     = dev;
    user_mode_only_ = (flags & UFFD_USER_MODE_ONLY) != 0;
    quick_ok_       = probe_quick_check();
    return true;
}

bool uffd::probe_quick_check() const
{
    /* Two private anonymous pages, the first watched: the kernel must say
     * EINVAL for it, ENOENT for the second and for both (two mappings).
     * Unwatched again before the unmap, which then raises no event (there
     * is no reader yet). */
    const size_t page = page_size();
    void *mem = mmap(nullptr, 2 * page, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (mem == MAP_FAILED) {
        return false;
    }
    const auto base = reinterpret_cast<uintptr_t>(mem);
    bool ok = false;
    if (watch(base, page) == 0) {
        ok = (continue_errno(fd_, base, page) == EINVAL) &&
             (continue_errno(fd_, base + page, page) == ENOENT) &&
             (continue_errno(fd_, base, 2 * page) == ENOENT);
        if (unwatch(base, page) != 0) {
            ok = false;
        }
    }
    munmap(mem, 2 * page);
    return ok;
}

void uffd::release_kernel_side()
{
    if (fd_ < 0) {
        return;
    }
    int null = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
    if ((null < 0) || (dup3(null, fd_, O_CLOEXEC) < 0)) {
        /* cannot keep the number: close it, the kernel side goes all the same */
        ::close(fd_);
        fd_ = -1;
    }
    if (null >= 0) {
        ::close(null);
    }
}

void uffd::close()
{
    int fd = forget();
    if (fd >= 0) {
        ::close(fd);
    }
}

int uffd::forget()
{
    /* the pagemap descriptor speaks for the process that opened it */
    if (pagemap_fd_ >= 0) {
        ::close(pagemap_fd_);
        pagemap_fd_ = -1;
    }
    scan_ok_  = false;
    quick_ok_ = false;
    int fd    = fd_;
    fd_      = -1;
    return fd;
}

bool uffd::wp_async() const
{
    return (features_ & UFFD_FEATURE_WP_ASYNC) != 0;
}

bool uffd::event_remap() const
{
    return (features_ & UFFD_FEATURE_EVENT_REMAP) != 0;
}

int uffd::watch(uintptr_t start, size_t len) const
{
    struct uffdio_register reg = {};
    reg.range.start = start;
    reg.range.len   = len;
    /* Write-protect mode, and no page is ever write-protected: faults
     * behave as before, only the unmap/remove/remap events come to us. */
    reg.mode = UFFDIO_REGISTER_MODE_WP;
    return ioctl(fd_, UFFDIO_REGISTER, &reg) == 0 ? 0 : errno;
}

int uffd::unwatch(uintptr_t start, size_t len) const
{
    struct uffdio_range range = {start, len};
    return ioctl(fd_, UFFDIO_UNREGISTER, &range) == 0 ? 0 : errno;
}

bool uffd::event_in_flight() const
{
    /* The kernel raises the descriptor's mmap_changing under the mm lock
     * before an unmap, remap or remove, and lowers it once our reader has
     * read the event; UFFDIO_COPY looks at it before anything else and
     * says EAGAIN while it is up. A zero length makes it fail (EINVAL)
     * without touching memory otherwise. This is the one thing user space
     * can see of the cross-thread window: the event not yet queued. */
    struct uffdio_copy copy = {};
    return (ioctl(fd_, UFFDIO_COPY, &copy) < 0) && (errno == EAGAIN);
}

check_result uffd::wp_check(uintptr_t start, size_t len) const
{
    /* Removing write protection that was never set changes nothing, and
     * the kernel refuses it with ENOENT unless the range lies in mappings
     * registered with this descriptor in WP mode; with EAGAIN while an
     * event is in flight. */
    struct uffdio_writeprotect wp = {};
    wp.range.start = start;
    wp.range.len   = len;
    wp.mode        = UFFDIO_WRITEPROTECT_MODE_DONTWAKE;
    if (ioctl(fd_, UFFDIO_WRITEPROTECT, &wp) == 0) {
        return check_result::watched;
    }
    return (errno == EAGAIN) ? check_result::in_flight : check_result::changed;
}

int uffd::scan_check(uintptr_t start, size_t len) const
{
    /* Asks for pages that are NOT in a mapping watched with WP_ASYNC:
     * watched mappings are skipped whole, without a page walk, and any
     * other mapping fails the scan with EPERM (PM_SCAN_CHECK_WPASYNC).
     * Holes are skipped too: a range unmapped altogether looks watched,
     * but its unmap was an event, which the caller waits for. */
    struct page_region region;
    struct pm_scan_arg arg = {};
    arg.size              = sizeof(arg);
    arg.flags             = PM_SCAN_CHECK_WPASYNC;
    arg.start             = start;
    arg.end               = start + len;
    arg.vec               = reinterpret_cast<uintptr_t>(&region);
    arg.vec_len           = 1;
    arg.max_pages         = 1;
    arg.category_inverted = PAGE_IS_WPALLOWED;
    arg.category_mask     = PAGE_IS_WPALLOWED;
    arg.return_mask       = PAGE_IS_WPALLOWED;
    long rc = ioctl(pagemap_fd_, PAGEMAP_SCAN, &arg);
    if (rc == 0) {
        return 1;
    }
    return ((rc > 0) || (errno == EPERM)) ? 0 : -1;
}

check_result uffd::check(uintptr_t start, size_t len) const
{
    if (scan_ok_ && scan_works_) {
        int watched = scan_check(start, len);
        if (watched >= 0) {
            return watched ? check_result::watched : check_result::changed;
        }
        scan_works_ = false; /* not this kernel: the write-protect check */
    }
    check_result c = wp_check(start, len);
    if (c != check_result::changed) {
        return c;
    }
    /* Before Linux 6.3 the check needs the range to lie in one mapping: a
     * watched range split into several mappings (an mprotect of a part)
     * also fails. Halve it down to single pages before calling it
     * changed. */
    if (len <= page_size()) {
        return c;
    }
    size_t half = (len / 2 + page_size() - 1) & ~(page_size() - 1);
    c = check(start, half);
    return (c == check_result::watched) ? check(start + half, len - half) : c;
}

quick_result uffd::quick_check(uintptr_t start, size_t len) const
{
    switch (continue_errno(fd_, start, len)) {
    case EINVAL: return quick_result::watched;
    case EAGAIN: return quick_result::in_flight;
    default:     return quick_result::ask;
    }
}

bool uffd::has_page_cache_pages(uintptr_t start, size_t len) const
{
    if (pagemap_fd_ < 0) {
        return false;
    }
    uint64_t entries[512];
    const size_t pages = len / page_size();
    for (size_t done = 0; done < pages;) {
        const size_t n   = std::min<size_t>(pages - done, 512);
        const off_t  off = static_cast<off_t>((start / page_size() + done) * 8);
        const ssize_t rd = pread(pagemap_fd_, entries, n * 8, off);
        if (rd <= 0) {
            return false;
        }
        for (size_t i = 0; i < static_cast<size_t>(rd) / 8; ++i) {
            if ((entries[i] & (kPmPresent | kPmPageCache)) ==
                (kPmPresent | kPmPageCache)) {
                return true;
            }
        }
        done += static_cast<size_t>(rd) / 8;
    }
    return false;
}

} // namespace kreg
