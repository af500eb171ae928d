/* The per-page watcher counts behind kreg_watch/kreg_unwatch. */
#include "ucm_kernel/watch_map.h"

#include <gtest/gtest.h>

using kreg::page_range;
using kreg::page_ranges;
using kreg::watch_map;

TEST(watch_map, SingleRange)
{
    watch_map m;
    m.add(0x1000, 0x3000);
    EXPECT_EQ(page_ranges({{0x1000, 0x3000}}), m.ranges());
    EXPECT_EQ(page_ranges({{0x1000, 0x3000}}), m.remove(0x1000, 0x3000));
    EXPECT_EQ(0u, m.segments());
}

TEST(watch_map, OverlapKeepsSharedPart)
{
    watch_map m;
    m.add(0x1000, 0x4000);
    m.add(0x2000, 0x6000);
    EXPECT_EQ(page_ranges({{0x1000, 0x6000}}), m.ranges());
    EXPECT_EQ(0x5000u, m.bytes());
    /* dropping the first frees only what the second doesn't cover */
    EXPECT_EQ(page_ranges({{0x1000, 0x2000}}), m.remove(0x1000, 0x4000));
    EXPECT_EQ(page_ranges({{0x2000, 0x6000}}), m.ranges());
    EXPECT_EQ(page_ranges({{0x2000, 0x6000}}), m.remove(0x2000, 0x6000));
    EXPECT_TRUE(m.ranges().empty());
}

TEST(watch_map, SameRangeTwice)
{
    watch_map m;
    m.add(0x1000, 0x2000);
    m.add(0x1000, 0x2000);
    EXPECT_TRUE(m.remove(0x1000, 0x2000).empty());
    EXPECT_EQ(page_ranges({{0x1000, 0x2000}}), m.remove(0x1000, 0x2000));
}

TEST(watch_map, UnknownAndEmptyRangesAreIgnored)
{
    watch_map m;
    EXPECT_TRUE(m.remove(0x1000, 0x2000).empty());
    m.add(0x3000, 0x3000);
    EXPECT_EQ(0u, m.segments());
    m.add(0x1000, 0x2000);
    EXPECT_TRUE(m.remove(0x5000, 0x9000).empty());
    EXPECT_EQ(page_ranges({{0x1000, 0x2000}}), m.ranges());
}

TEST(watch_map, RemovingAPartSplits)
{
    watch_map m;
    m.add(0x1000, 0x5000);
    EXPECT_EQ(page_ranges({{0x2000, 0x3000}}), m.remove(0x2000, 0x3000));
    EXPECT_EQ(page_ranges({{0x1000, 0x2000}, {0x3000, 0x5000}}), m.ranges());
}

TEST(watch_map, GapsAreFilled)
{
    watch_map m;
    m.add(0x1000, 0x2000);
    m.add(0x3000, 0x4000);
    m.add(0x0000, 0x5000);
    EXPECT_EQ(page_ranges({{0x0000, 0x5000}}), m.ranges());
    EXPECT_EQ(page_ranges({{0x0000, 0x1000}, {0x2000, 0x3000}, {0x4000, 0x5000}}),
              m.remove(0x0000, 0x5000));
    EXPECT_EQ(page_ranges({{0x1000, 0x2000}, {0x3000, 0x4000}}), m.ranges());
}

TEST(watch_map, Overlaps)
{
    watch_map m;
    EXPECT_FALSE(m.overlaps(0x1000, 0x2000));
    m.add(0x2000, 0x4000);
    EXPECT_FALSE(m.overlaps(0x1000, 0x2000));
    EXPECT_TRUE(m.overlaps(0x1000, 0x2001));
    EXPECT_TRUE(m.overlaps(0x3000, 0x3001));
    EXPECT_TRUE(m.overlaps(0x3fff, 0x9000));
    EXPECT_FALSE(m.overlaps(0x4000, 0x9000));
}
