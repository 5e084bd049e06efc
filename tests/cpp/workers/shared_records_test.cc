// SharedRecords: packing, decoding across processes, validation.
#include "leanloader/workers/shared_records.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <string>
#include <vector>

#include "leanloader/core/error.h"

namespace leanloader {
namespace {

std::string as_string(std::span<const std::byte> bytes) {
  return {reinterpret_cast<const char*>(bytes.data()), bytes.size()};
}

TEST(SharedRecordsTest, PackedRecordsReadBack) {
  std::vector<std::string> owned = {"alpha", "", "a longer record\0with a zero", "z"};
  owned[2].push_back('\0');
  std::vector<std::string_view> views(owned.begin(), owned.end());
  auto records = SharedRecords::pack(views);
  ASSERT_EQ(records->size(), 4u);
  for (size_t i = 0; i < owned.size(); ++i) EXPECT_EQ(as_string(records->record(i)), owned[i]);
  EXPECT_EQ(records->data_bytes(), owned[0].size() + owned[2].size() + owned[3].size());
  EXPECT_THROW(records->record(4), InvalidArgument);
}

TEST(SharedRecordsTest, EmptyListPacks) {
  auto records = SharedRecords::pack({});
  EXPECT_EQ(records->size(), 0u);
  EXPECT_EQ(SharedRecords::attach(records->segment())->size(), 0u);
}

TEST(SharedRecordsTest, AnotherProcessReadsTheSamePages) {
  std::vector<std::string> owned;
  for (int i = 0; i < 10000; ++i) owned.push_back("record-" + std::to_string(i));
  std::vector<std::string_view> views(owned.begin(), owned.end());
  auto records = SharedRecords::pack(views);
  const std::string path = records->segment()->attach_path();
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    try {
      auto attached = SharedRecords::attach(SharedSegment::attach(path, false));
      const bool ok =
          attached->size() == 10000 && as_string(attached->record(9876)) == "record-9876";
      ::_exit(ok ? 0 : 2);
    } catch (...) {
      ::_exit(3);
    }
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

TEST(SharedRecordsTest, ForeignOrCorruptSegmentsAreFormatErrors) {
  auto foreign = SharedSegment::create(4096);
  EXPECT_THROW(SharedRecords::attach(foreign), FormatError);

  std::vector<std::string_view> views = {"abc", "defg"};
  auto records = SharedRecords::pack(views);
  auto segment = records->segment();
  uint64_t huge = uint64_t{1} << 60;
  segment->write(8, &huge, 8);  // count
  EXPECT_THROW(SharedRecords::attach(segment), FormatError);
  uint64_t two = 2;
  segment->write(8, &two, 8);
  uint64_t backwards = 5;
  segment->write(16 + 8, &backwards, 8);  // offsets[1] = 5 > offsets[2] = 1: decreasing
  uint64_t small = 1;
  segment->write(16 + 16, &small, 8);
  EXPECT_THROW(SharedRecords::attach(segment), FormatError);
  uint64_t past_end = 1 << 20;
  segment->write(16 + 8, &two, 8);
  segment->write(16 + 16, &past_end, 8);
  EXPECT_THROW(SharedRecords::attach(segment), FormatError);
}

}  // namespace
}  // namespace leanloader
