/* The per-page watcher counts behind kreg_watch/kreg_unwatch. */
#include "ucm_kernel/watch_map.h"

#include <gtest/gtest.h>

using kreg::Range;
using kreg::Ranges;
using kreg::WatchMap;

TEST(WatchMap, SingleRange)
{
    WatchMap m;
    m.add(0x1000, 0x3000);
    EXPECT_EQ(Ranges({{0x1000, 0x3000}}), m.ranges());
    EXPECT_EQ(Ranges({{0x1000, 0x3000}}), m.remove(0x1000, 0x3000));
    EXPECT_EQ(0u, m.segments());
}

TEST(WatchMap, OverlapKeepsSharedPart)
{
    WatchMap m;
    m.add(0x1000, 0x4000);
    m.add(0x2000, 0x6000);
    EXPECT_EQ(Ranges({{0x1000, 0x6000}}), m.ranges());
    EXPECT_EQ(0x5000u, m.bytes());
    /* dropping the first frees only what the second doesn't cover */
    EXPECT_EQ(Ranges({{0x1000, 0x2000}}), m.remove(0x1000, 0x4000));
    EXPECT_EQ(Ranges({{0x2000, 0x6000}}), m.ranges());
    EXPECT_EQ(Ranges({{0x2000, 0x6000}}), m.remove(0x2000, 0x6000));
    EXPECT_TRUE(m.ranges().empty());
}

TEST(WatchMap, SameRangeTwice)
{
    WatchMap m;
    m.add(0x1000, 0x2000);
    m.add(0x1000, 0x2000);
    EXPECT_TRUE(m.remove(0x1000, 0x2000).empty());
    EXPECT_EQ(Ranges({{0x1000, 0x2000}}), m.remove(0x1000, 0x2000));
}

TEST(WatchMap, UnknownAndEmptyRangesAreIgnored)
{
    WatchMap m;
    EXPECT_TRUE(m.remove(0x1000, 0x2000).empty());
    m.add(0x3000, 0x3000);
    EXPECT_EQ(0u, m.segments());
    m.add(0x1000, 0x2000);
    EXPECT_TRUE(m.remove(0x5000, 0x9000).empty());
    EXPECT_EQ(Ranges({{0x1000, 0x2000}}), m.ranges());
}

TEST(WatchMap, RemovingAPartSplits)
{
    WatchMap m;
    m.add(0x1000, 0x5000);
    EXPECT_EQ(Ranges({{0x2000, 0x3000}}), m.remove(0x2000, 0x3000));
    EXPECT_EQ(Ranges({{0x1000, 0x2000}, {0x3000, 0x5000}}), m.ranges());
}

TEST(WatchMap, GapsAreFilled)
{
    WatchMap m;
    m.add(0x1000, 0x2000);
    m.add(0x3000, 0x4000);
    m.add(0x0000, 0x5000);
    EXPECT_EQ(Ranges({{0x0000, 0x5000}}), m.ranges());
    EXPECT_EQ(Ranges({{0x0000, 0x1000}, {0x2000, 0x3000}, {0x4000, 0x5000}}),
              m.remove(0x0000, 0x5000));
    EXPECT_EQ(Ranges({{0x1000, 0x2000}, {0x3000, 0x4000}}), m.ranges());
}

TEST(WatchMap, Overlaps)
{
    WatchMap m;
    EXPECT_FALSE(m.overlaps(0x1000, 0x2000));
    m.add(0x2000, 0x4000);
    EXPECT_FALSE(m.overlaps(0x1000, 0x2000));
    EXPECT_TRUE(m.overlaps(0x1000, 0x2001));
    EXPECT_TRUE(m.overlaps(0x3000, 0x3001));
    EXPECT_TRUE(m.overlaps(0x3fff, 0x9000));
    EXPECT_FALSE(m.overlaps(0x4000, 0x9000));
}
