#include "watch_map.h"

#include <algorithm>
#include <iterator>

namespace kreg {

void WatchMap::split_at(uintptr_t addr)
{
    auto it = segs_.upper_bound(addr);
    if (it == segs_.begin()) {
        return;
    }
    --it;
    if (it->first < addr && addr < it->second.end) {
        Seg tail{it->second.end, it->second.count};
        it->second.end = addr;
        segs_.emplace(addr, tail);
    }
}

void WatchMap::add(uintptr_t start, uintptr_t end)
{
    if (start >= end) {
        return;
    }
    split_at(start);
    split_at(end);
    uintptr_t pos = start;
    auto it       = segs_.lower_bound(start);
    while (pos < end) {
        if (it != segs_.end() && it->first == pos) {
            ++it->second.count;
            pos = it->second.end;
            ++it;
        } else {
            /* a gap up to the next segment or the end */
            uintptr_t gap_end = (it != segs_.end() && it->first < end) ?
                                it->first : end;
            segs_.emplace_hint(it, pos, Seg{gap_end, 1});
            pos = gap_end;
        }
    }
}

Ranges WatchMap::remove(uintptr_t start, uintptr_t end)
{
    Ranges freed;
    if (start >= end) {
        return freed;
    }
    split_at(start);
    split_at(end);
    for (auto it = segs_.lower_bound(start);
         it != segs_.end() && it->first < end;) {
        if (--it->second.count == 0) {
            if (!freed.empty() && freed.back().second == it->first) {
                freed.back().second = it->second.end;
            } else {
                freed.emplace_back(it->first, it->second.end);
            }
            it = segs_.erase(it);
        } else {
            ++it;
        }
    }
    return freed;
}

Ranges WatchMap::ranges() const
{
    Ranges out;
    for (const auto &[start, seg] : segs_) {
        if (!out.empty() && out.back().second == start) {
            out.back().second = seg.end;
        } else {
            out.emplace_back(start, seg.end);
        }
    }
    return out;
}

bool WatchMap::overlaps(uintptr_t start, uintptr_t end) const
{
    auto it = segs_.upper_bound(start);
    if (it != segs_.begin() && std::prev(it)->second.end > start) {
        return true;
    }
    return (it != segs_.end()) && (it->first < end);
}

Ranges WatchMap::gaps(uintptr_t start, uintptr_t end) const
{
    Ranges out;
    uintptr_t pos = start;
    auto it       = segs_.upper_bound(start);
    if (it != segs_.begin() && std::prev(it)->second.end > start) {
        --it;
    }
    for (; (it != segs_.end()) && (it->first < end) && (pos < end); ++it) {
        if (it->first > pos) {
            out.emplace_back(pos, it->first);
        }
        pos = std::max(pos, it->second.end);
    }
    if (pos < end) {
        out.emplace_back(pos, end);
    }
    return out;
}

size_t WatchMap::bytes() const
{
    size_t total = 0;
    for (const auto &[start, seg] : segs_) {
        total += seg.end - start;
    }
    return total;
}

} // namespace kreg
