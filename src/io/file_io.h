// Positional file reads with errors that name the file. Internal.
//
// pread only: no shared file offsets, so any thread (or forked process) may
// read any range of a File concurrently.
#pragma once

#include <sys/stat.h>
#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/page_size.h"

namespace leanloader::detail {

class File {
 public:
  // Opens read-only; throws IoError (kNotFound for a missing path).
  explicit File(const std::string& path);
  ~File();
  File(const File&) = delete;
  File& operator=(const File&) = delete;

  size_t size() const noexcept { return size_; }  // at open
  // The file's size now (fstat): it may have shrunk since open. Throws IoError.
  size_t current_size() const;
  const std::string& path() const noexcept { return path_; }
  int fd() const noexcept { return fd_; }

  // Reads exactly dst.size() bytes at `offset`; throws FormatError when the
  // file ends first (it was truncated) and IoError on a failed read.
  void read_exact(size_t offset, std::span<std::byte> dst) const;
  // As read_exact, but first without waiting for storage (preadv2 with
  // RWF_NOWAIT): returns false when part of the range was not in the page
  // cache and had to be read from storage (it is read all the same).
  bool read_exact_noting_misses(size_t offset, std::span<std::byte> dst) const;
  // Starts reading [offset, offset + length) into the page cache in the
  // background (POSIX_FADV_WILLNEED). A hint: errors are ignored.
  void will_need(size_t offset, size_t length) const noexcept;
  // Reads up to `max_bytes` from the start of the file.
  std::vector<std::byte> read_prefix(size_t max_bytes) const;

 private:
  std::string path_;
  int fd_ = -1;
  size_t size_ = 0;
};

std::vector<std::byte> read_file_prefix(const std::string& path, size_t max_bytes);

// Whether a mapping of the first `mapped_bytes` of `file` still reads the
// file's bytes up to `end` (<= mapped_bytes). A page the file has lost since
// it was mapped raises SIGBUS when read (io/guarded_copy.h), but the part of
// the last page past a new, shorter end reads as zeros: a range that ends
// within a page of the mapping's end is checked against the file's size now
// (file_still_reaches: an fstat, for those ranges only).
bool file_still_reaches(const File& file, size_t end);
inline bool mapped_bytes_still_in_file(const File& file, size_t mapped_bytes, size_t end) {
  // Inline and without a division: it runs for every row copied from a mapping.
  return end + page_size() <= mapped_bytes || file_still_reaches(file, end);
}

// What tells one file from another under the same name: a file opened again
// later must have the identity it had when a source first opened it, else it
// was replaced or modified meanwhile.
struct FileIdentity {
  dev_t device = 0;
  ino_t inode = 0;
  int64_t size = 0;
  int64_t modified_ns = 0;
  bool operator==(const FileIdentity&) const = default;

  // stat(2) of `path`; throws IoError.
  static FileIdentity of(const std::string& path);
  // The identity a stat(2) already made gives.
  static FileIdentity of(const struct stat& st);
  // Whether `path` still has this identity (false when it cannot be stat'ed).
  bool unchanged(const std::string& path) const;
  // Throws FormatError naming `path` unless it still has this identity.
  void check_unchanged(const std::string& path) const;
};

// `path` made absolute (symbolic links resolved) while the process's working
// directory is the one it was named against; `path` as given when that fails.
std::string absolute_path(const std::string& path);

// `path` made absolute from the working directory as named: "." components
// dropped, ".." and symbolic links kept (collapsing "link/.." would name
// another file than the one reached); `path` as given when that fails. For
// paths stored to name a file later (a cache's source fingerprints), where
// resolving links would make every path an earlier version stored relative
// look like another file.
std::string absolute_path_as_named(const std::string& path);

// Reads a whole file into a string. Throws IoError.
std::string read_whole_file(const std::string& path);

struct DirectoryEntry {
  std::string name;
  unsigned char type = 0;  // dirent's d_type: DT_REG, DT_DIR, DT_LNK, DT_UNKNOWN, ...
};

// The entries of `directory` in the order readdir gives them, without "." and
// "..". Throws IoError naming the directory when it cannot be opened or when
// reading it fails part-way (readdir's errno is checked, so a listing cut
// short by an I/O error is never taken for the whole directory).
std::vector<DirectoryEntry> list_directory(const std::string& directory);

// The directory part of `path` ("." when it has none).
std::string parent_directory(const std::string& path);

// fsyncs a directory so that renames and unlinks in it are durable.
void fsync_directory(const std::string& directory);

// Writes a file so that a reader (or a crash at any byte) sees either the old
// file or the complete new one, never a part: bytes go to
// "<path>.tmp.<pid>.<12 random hex digits>" beside the target (created with
// O_EXCL), and commit() fsyncs it, renames it over `path` and fsyncs the
// directory. Destroyed without commit(), or when any step fails, the
// temporary file is removed. A file it replaces keeps its permission bits.
// Small writes are buffered; large ones go straight through. Not thread-safe.
class AtomicFileWriter {
 public:
  explicit AtomicFileWriter(std::string path);
  ~AtomicFileWriter();
  AtomicFileWriter(const AtomicFileWriter&) = delete;
  AtomicFileWriter& operator=(const AtomicFileWriter&) = delete;

  void write(const std::byte* data, size_t size);
  void write(std::string_view text) {
    write(reinterpret_cast<const std::byte*>(text.data()), text.size());
  }
  void commit();
  const std::string& temporary_path() const noexcept { return temp_; }

 private:
  void flush();
  void write_through(const std::byte* data, size_t size);
  void discard() noexcept;

  std::string path_;
  std::string temp_;
  int fd_ = -1;
  std::vector<std::byte> buffer_;
};

}  // namespace leanloader::detail
