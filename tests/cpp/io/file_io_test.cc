#include "io/file_io.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "leanloader/core/error.h"
#include "test_util.h"

namespace leanloader::detail {
namespace {

TEST(ListDirectoryTest, ListsEntriesWithoutDotAndDotDot) {
  testing::TempDir dir;
  for (const char* name : {"b.npy", "a.npy", "c.txt"})
    std::ofstream(dir.path() + "/" + name) << "x";
  std::vector<std::string> names;
  for (const DirectoryEntry& entry : list_directory(dir.path())) names.push_back(entry.name);
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"a.npy", "b.npy", "c.txt"}));
}

TEST(AtomicFileWriterTest, AReplacedFileKeepsItsPermissionBits) {
  testing::TempDir dir;
  const std::string path = dir.path() + "/weights.safetensors";
  std::ofstream(path) << "old";
  ASSERT_EQ(::chmod(path.c_str(), 0640), 0);
  AtomicFileWriter writer(path);
  writer.write("new");
  writer.commit();
  struct stat st {};
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0640u);
  std::string text;
  std::ifstream(path) >> text;
  EXPECT_EQ(text, "new");
}

// A path kept to name a file later: "." dropped, but ".." after a symbolic
// link names the link target's parent, so it stays (collapsing it named
// another file).
TEST(AbsolutePathAsNamedTest, DropsDotsButKeepsLinksAndDotDot) {
  testing::TempDir dir;
  std::filesystem::create_directories(dir.file("real/sub"));
  std::filesystem::create_symlink(dir.file("real/sub"), dir.file("link"));
  std::ofstream(dir.file("real/x")) << "reached through link/..";
  const std::filesystem::path was = std::filesystem::current_path();
  std::filesystem::current_path(dir.path());
  const std::string dotted = absolute_path_as_named("./link/./../x");
  std::filesystem::current_path(was);
  EXPECT_EQ(dotted, dir.file("link/../x"));
  EXPECT_TRUE(std::filesystem::exists(dotted));  // the file reached: real/x
  EXPECT_FALSE(std::filesystem::exists(dir.file("x")));
  EXPECT_EQ(absolute_path_as_named("/a/./b/"), "/a/b");
}

TEST(ListDirectoryTest, AMissingOrUnreadableDirectoryIsAnIoErrorNamingIt) {
  testing::TempDir dir;
  const std::string missing = dir.path() + "/missing";
  try {
    list_directory(missing);
    FAIL() << "expected an IoError";
  } catch (const IoError& error) {
    EXPECT_NE(std::string(error.what()).find(missing), std::string::npos) << error.what();
  }
  // A file is not a directory: opendir fails with ENOTDIR.
  const std::string file = dir.path() + "/file";
  std::ofstream(file) << "x";
  EXPECT_THROW(list_directory(file), IoError);
}

}  // namespace
}  // namespace leanloader::detail
