/* Who watches which pages: a count per page range, so that a range stays
 * registered with the kernel while any watcher still covers it. */
#ifndef UCX_KREG_WATCH_MAP_H
#define UCX_KREG_WATCH_MAP_H

#include <cstddef>
#include <cstdint>
#include <map>
#include <utility>
#include <vector>

namespace kreg {

using page_range  = std::pair<uintptr_t, uintptr_t>; /* [first, second) */
using page_ranges = std::vector<page_range>;

class watch_map {
public:
    /* Adds one watcher over [start, end), freshly registered. */
    void add(uintptr_t start, uintptr_t end);
    /* Removes one watcher over [start, end) where there is one; returns
     * the ranges nobody watches any more. Those the kernel unmapped since
     * their registration (mark_gone) go to *gone, if given. */
    page_ranges remove(uintptr_t start, uintptr_t end, page_ranges *gone = nullptr);
    /* The kernel unmapped [start, end): watched parts of it are no longer
     * registered, whatever their watchers still think. */
    void mark_gone(uintptr_t start, uintptr_t end);
    /* Every watched range, adjacent ones merged. */
    page_ranges ranges() const;
    /* The parts of [start, end) no watcher covers. */
    page_ranges gaps(uintptr_t start, uintptr_t end) const;
    /* true if any watcher covers part of [start, end) */
    bool overlaps(uintptr_t start, uintptr_t end) const;
    void clear() { segs_.clear(); }

    size_t segments() const { return segs_.size(); }
    size_t bytes() const;

private:
    struct segment {
        uintptr_t end;
        unsigned  count;
        bool      gone;
    };
    /* Splits the segment that contains addr so that one starts at addr. */
    void split_at(uintptr_t addr);

    std::map<uintptr_t, segment> segs_; /* start -> segment; disjoint */
};

/* Ranges the kernel still has registered though nobody watches them any
 * more: unregistering costs a mapping split and merge under the mm write
 * lock (~5 us), and a cache drops and registers the same buffers again
 * and again. Kept in arrival order, the oldest unregistered first when
 * there are too many. */
class retained_ranges {
public:
    /* checked: the caller had found no page-cache page in it */
    void add(uintptr_t start, uintptr_t end, bool checked);
    /* Forgets whatever lies in [start, end) (watched again, or gone). */
    void drop(uintptr_t start, uintptr_t end);
    /* true if [start, end) is one retained range, with its `checked` */
    bool find(uintptr_t start, uintptr_t end, bool *checked) const;
    /* The oldest range, forgotten; false if none. */
    bool pop_oldest(page_range *r);
    void clear();
    size_t size() const { return ranges_.size(); }

private:
    struct kept_range {
        uintptr_t end;
        bool      checked;
    };
    std::map<uintptr_t, kept_range>      ranges_; /* start -> range; disjoint */
    std::vector<page_range>             order_;  /* arrival order, may hold stale */
    size_t                         head_ = 0;
};

} // namespace kreg

#endif
