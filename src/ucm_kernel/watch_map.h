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

using Range  = std::pair<uintptr_t, uintptr_t>; /* [first, second) */
using Ranges = std::vector<Range>;

class WatchMap {
public:
    /* Adds one watcher over [start, end). */
    void add(uintptr_t start, uintptr_t end);
    /* Removes one watcher over [start, end) where there is one; returns
     * the ranges nobody watches any more. */
    Ranges remove(uintptr_t start, uintptr_t end);
    /* Every watched range, adjacent ones merged. */
    Ranges ranges() const;
    /* The parts of [start, end) no watcher covers. */
    Ranges gaps(uintptr_t start, uintptr_t end) const;
    /* true if any watcher covers part of [start, end) */
    bool overlaps(uintptr_t start, uintptr_t end) const;
    void clear() { segs_.clear(); }

    size_t segments() const { return segs_.size(); }
    size_t bytes() const;

private:
    struct Seg {
        uintptr_t end;
        unsigned  count;
    };
    /* Splits the segment that contains addr so that one starts at addr. */
    void split_at(uintptr_t addr);

    std::map<uintptr_t, Seg> segs_; /* start -> segment; disjoint */
};

} // namespace kreg

#endif
