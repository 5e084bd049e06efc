// parse_maps_line: lines as the kernel writes them in /proc/PID/maps and smaps.
#include "io/proc_maps.h"

#include <gtest/gtest.h>

#include <cstdint>

namespace leanloader::detail {
namespace {

TEST(ProcMapsTest, AFileMappingLineGivesEveryField) {
  const auto line = parse_maps_line(
      "7f484aa00000-7f485a9ff000 rw-p 00001000 00:1b 143885                     "
      "/dev/shm/leanloader-8455-0-782707526 (deleted)");
  ASSERT_TRUE(line);
  EXPECT_EQ(line->start, uintptr_t{0x7f484aa00000});
  EXPECT_EQ(line->end, uintptr_t{0x7f485a9ff000});
  EXPECT_EQ(line->perms, "rw-p");
  EXPECT_EQ(line->offset, 0x1000u);
  EXPECT_EQ(line->major, 0u);
  EXPECT_EQ(line->minor, 0x1bu);
  EXPECT_EQ(line->inode, 143885u);
  EXPECT_EQ(line->path, "/dev/shm/leanloader-8455-0-782707526 (deleted)");
}

TEST(ProcMapsTest, AnonymousAndNamedMappingsHaveNoInode) {
  const auto anonymous = parse_maps_line("7ffd1000-7ffd3000 rw-p 00000000 00:00 0 ");
  ASSERT_TRUE(anonymous);
  EXPECT_EQ(anonymous->inode, 0u);
  EXPECT_EQ(anonymous->path, "");
  const auto heap = parse_maps_line("55d0c000-55d2d000 rw-p 00000000 00:00 0          [heap]");
  ASSERT_TRUE(heap);
  EXPECT_EQ(heap->path, "[heap]");
  const auto device = parse_maps_line("7f00-7f10 r--s 00000000 fd:01 42 /lib/x");
  ASSERT_TRUE(device);
  EXPECT_EQ(device->major, 0xfdu);
  EXPECT_EQ(device->minor, 1u);
}

TEST(ProcMapsTest, OtherSmapsLinesAreNotMappings) {
  EXPECT_FALSE(parse_maps_line("Rss:                   4 kB"));
  EXPECT_FALSE(parse_maps_line("VmFlags: rd wr mr mw me ac sd"));
  EXPECT_FALSE(parse_maps_line("THPeligible:           0"));
  EXPECT_FALSE(parse_maps_line(""));
  EXPECT_FALSE(parse_maps_line("7f00-7f10 rw-p 00000000 00:00"));      // no inode
  EXPECT_FALSE(parse_maps_line("7f00-zz10 rw-p 00000000 00:00 0"));    // not hex
  EXPECT_FALSE(parse_maps_line("7f00-7f10 rw-p 00000000 0000 0 /x"));  // no major:minor
}

TEST(ProcMapsTest, ThisProcessHasMappingsInAddressOrder) {
  const auto mappings = read_process_mappings();
  ASSERT_FALSE(mappings.empty());
  for (size_t i = 1; i < mappings.size(); ++i) EXPECT_LE(mappings[i - 1].end, mappings[i].start);
  int local = 0;
  const auto address = reinterpret_cast<uintptr_t>(&local);
  bool found = false;
  for (const auto& mapping : mappings) found |= mapping.start <= address && address < mapping.end;
  EXPECT_TRUE(found);  // the stack
}

}  // namespace
}  // namespace leanloader::detail
