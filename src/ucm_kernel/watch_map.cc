#include "watch_map.h"

#include <algorithm>
#include <iterator>

namespace kreg {

void watch_map::split_at(uintptr_t addr)
{
    auto it = segs_.upper_bound(addr);
    if (it == segs_.begin()) {
        return;
    }
    --it;
    if (it->first < addr && addr < it->second.end) {
        segment tail{it->second.end, it->second.count, it->second.gone};
        it->second.end = addr;
        segs_.emplace(addr, tail);
    }
}

void watch_map::add(uintptr_t start, uintptr_t end)
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
            it->second.gone = false; /* registered again just now */
            pos = it->second.end;
            ++it;
        } else {
            /* a gap up to the next segment or the end */
            uintptr_t gap_end = (it != segs_.end() && it->first < end) ?
                                it->first : end;
            segs_.emplace_hint(it, pos, segment{gap_end, 1, false});
            pos = gap_end;
        }
    }
}

page_ranges watch_map::remove(uintptr_t start, uintptr_t end, page_ranges *gone)
{
    page_ranges freed;
    if (start >= end) {
        return freed;
    }
    split_at(start);
    split_at(end);
    for (auto it = segs_.lower_bound(start);
         it != segs_.end() && it->first < end;) {
        if (--it->second.count == 0) {
            page_ranges &out = (it->second.gone && gone) ? *gone : freed;
            if (!out.empty() && out.back().second == it->first) {
                out.back().second = it->second.end;
            } else {
                out.emplace_back(it->first, it->second.end);
            }
            it = segs_.erase(it);
        } else {
            ++it;
        }
    }
    return freed;
}

void watch_map::mark_gone(uintptr_t start, uintptr_t end)
{
    if (start >= end) {
        return;
    }
    split_at(start);
    split_at(end);
    for (auto it = segs_.lower_bound(start); it != segs_.end() && it->first < end;
         ++it) {
        it->second.gone = true;
    }
}

page_ranges watch_map::ranges() const
{
    page_ranges out;
    for (const auto &[start, seg] : segs_) {
        if (!out.empty() && out.back().second == start) {
            out.back().second = seg.end;
        } else {
            out.emplace_back(start, seg.end);
        }
    }
    return out;
}

bool watch_map::overlaps(uintptr_t start, uintptr_t end) const
{
    auto it = segs_.upper_bound(start);
    if (it != segs_.begin() && std::prev(it)->second.end > start) {
        return true;
    }
    return (it != segs_.end()) && (it->first < end);
}

page_ranges watch_map::gaps(uintptr_t start, uintptr_t end) const
{
    page_ranges out;
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

size_t watch_map::bytes() const
{
    size_t total = 0;
    for (const auto &[start, seg] : segs_) {
        total += seg.end - start;
    }
    return total;
}

void retained_ranges::add(uintptr_t start, uintptr_t end, bool checked)
{
    drop(start, end);
    ranges_.emplace(start, kept_range{end, checked});
    if (order_.size() - head_ > 4 * ranges_.size() + 64) {
        /* mostly stale entries: start the order afresh */
        order_.clear();
        for (const auto &[s, k] : ranges_) {
            order_.emplace_back(s, k.end);
        }
        head_ = 0;
    }
    order_.emplace_back(start, end);
}

void retained_ranges::drop(uintptr_t start, uintptr_t end)
{
    auto it = ranges_.upper_bound(start);
    if ((it != ranges_.begin()) && (std::prev(it)->second.end > start)) {
        --it;
    }
    while ((it != ranges_.end()) && (it->first < end)) {
        const uintptr_t s = it->first;
        const kept_range k      = it->second;
        it                = ranges_.erase(it);
        /* keep the parts outside [start, end) */
        if (s < start) {
            ranges_.emplace(s, kept_range{start, k.checked});
        }
        if (k.end > end) {
            it = ranges_.emplace(end, kept_range{k.end, k.checked}).first;
            ++it;
        }
    }
}

bool retained_ranges::find(uintptr_t start, uintptr_t end, bool *checked) const
{
    auto it = ranges_.find(start);
    if ((it == ranges_.end()) || (it->second.end != end)) {
        return false;
    }
    *checked = it->second.checked;
    return true;
}

bool retained_ranges::pop_oldest(page_range *r)
{
    while (head_ < order_.size()) {
        const page_range cand = order_[head_++];
        /* what is left of it, if anything */
        auto it = ranges_.upper_bound(cand.first);
        if ((it != ranges_.begin()) && (std::prev(it)->second.end > cand.first)) {
            --it;
        }
        if ((it != ranges_.end()) && (it->first < cand.second)) {
            *r = page_range{it->first, it->second.end};
            ranges_.erase(it);
            return true;
        }
    }
    order_.clear();
    head_ = 0;
    if (ranges_.empty()) {
        return false;
    }
    /* parts split off earlier are not in the order list */
    *r = page_range{ranges_.begin()->first, ranges_.begin()->second.end};
    ranges_.erase(ranges_.begin());
    return true;
}

void retained_ranges::clear()
{
    ranges_.clear();
    order_.clear();
    head_ = 0;
}

} // namespace kreg
