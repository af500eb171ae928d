/* The interface every kernel event source implements (uffd_backend.cc,
 * notifier_backend.cc). source.cc picks one at start and calls it; nothing
 * here is visible outside the library.
 *
 * Every backend reports invalidated ranges through dispatch.h, so that fork
 * and exit can hold dispatch while no thread is inside UCM. */
#ifndef UCX_KREG_BACKEND_H
#define UCX_KREG_BACKEND_H

#include "options.h"
#include "ucm_kernel.h"

#include <cstdint>
#include <string>

namespace kreg {

/* Watch budget left to the backend's own limit (options: MAX_RANGES=auto). */
constexpr unsigned long kAutoMaxRanges = static_cast<unsigned long>(-2);

struct start_error {
    kreg_reason_t reason = KREG_REASON_OTHER;
    std::string   text;
};

class backend {
public:
    virtual ~backend() = default;

    virtual kreg_backend_t kind() const = 0;
    /* Opens the kernel side and starts the threads. On failure nothing is
     * left open. */
    virtual bool start(const kreg_options_t &opts, start_error *err) = 0;
    /* The kernel side is closed (every watch dropped, every thread blocked
     * in munmap woken), the threads are joined, every watched range is
     * reported as unmapped. */
    virtual void stop() = 0;

    /* [start, end) are whole pages. Fills *w (counter, snapshot, slot) and
     * returns KREG_REASON_NONE, or the reason and the errno behind it. */
    virtual kreg_reason_t watch(uintptr_t start, uintptr_t end, kreg_watch_t *w,
                                int *err) = 0;
    /* After the range was registered: may it be cached? */
    virtual kreg_reason_t confirm(kreg_watch_t *w) = 0;
    virtual void unwatch(const kreg_watch_t *w) = 0;
    /* Before a lookup; 0 if the range was found changed (and reported).
     * Called only where checks_at_lookup(): the notifier's hit needs
     * nothing but its counter, and a hit must not pay for a call. */
    virtual int prepare_lookup(uintptr_t start, uintptr_t end) = 0;
    bool checks_at_lookup() const { return checks_at_lookup_; }
    /* Every event queued by the kernel so far is dispatched. */
    virtual void sync() = 0;

    /* fork: the backend's own locks are taken before and given back after,
     * in the parent and the child alike (a child must not inherit them
     * taken by a thread that does not exist there). */
    virtual void lock_for_fork() = 0;
    virtual void unlock_after_fork() = 0;
    /* In the child of a fork, before it runs anything else: forget the
     * parent's kernel state without touching the parent's (the threads do
     * not exist here, the descriptor speaks for the parent's memory), and
     * leave every watch the child inherited stale. */
    virtual void forget_after_fork() = 0;

    virtual void query(kreg_caps_t *caps) const = 0;
    virtual void add_stats(kreg_stats_t *stats) const = 0;
    /* What a watch refused with KREG_REASON_LIMIT and errno err ran into,
     * in words for the one warning ("the ... limit on ..."); empty: the
     * reason's own words say it. */
    virtual std::string limit_text(int err) const
    {
        (void)err;
        return std::string();
    }

protected:
    explicit backend(bool checks_at_lookup) : checks_at_lookup_(checks_at_lookup) {}

private:
    const bool checks_at_lookup_;
};

backend &uffd_backend_instance();
backend &notifier_backend_instance();

/* The word every watch that has no counter of its own points at; it moves
 * when the source stops or the process forks, so such watches go stale. */
const volatile uint64_t *generation_word();
uint32_t generation();

} // namespace kreg

#endif
