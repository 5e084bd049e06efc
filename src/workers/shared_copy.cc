#include "leanloader/workers/shared_copy.h"

#include <dlfcn.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <sstream>
#include <vector>

#include "leanloader/core/checked_size.h"
#include "leanloader/core/error.h"

namespace leanloader {

namespace {

// The copy is made, and the source's pages mapped from it, this much at a
// time: the source and its copy coexist for one chunk only.
constexpr size_t kChunkBytes = size_t{64} << 20;
// glibc's chunk header: prev_size then size, each a size_t, before the
// pointer malloc returns. In the size, bit 1 is IS_MMAPPED, bit 0 PREV_INUSE
// and bit 2 NON_MAIN_ARENA (both clear for a mmapped chunk).
constexpr size_t kChunkHeaderBytes = 2 * sizeof(size_t);
constexpr size_t kChunkFlagBits = 7;
constexpr size_t kMmappedChunkFlags = 2;
// Mappings a remap may add (the source's anonymous mapping split around the
// file mapping); refused when /proc/self/maps is this close to the limit.
constexpr size_t kMappingsMargin = 16;

size_t page_size() {
  static const size_t size = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  return size;
}

// True when this process's allocation functions are the C library's own:
// no preloaded allocator and no sanitizer runtime intercepts them.
bool glibc_allocates() {
  void* libc = ::dlopen("libc.so.6", RTLD_NOW | RTLD_NOLOAD);
  if (libc == nullptr) return false;
  bool same = true;
  for (const char* name : {"malloc", "free", "realloc", "posix_memalign", "memalign"}) {
    void* own = ::dlsym(libc, name);
    same = same && own != nullptr && ::dlsym(RTLD_DEFAULT, name) == own;
  }
  ::dlclose(libc);
  return same;
}

struct Mapping {
  uintptr_t start = 0;
  uintptr_t end = 0;
  std::string perms;
  uint64_t inode = 0;
  std::string path;
};

std::vector<Mapping> read_mappings() {
  std::ifstream maps("/proc/self/maps");
  std::vector<Mapping> mappings;
  std::string line;
  while (std::getline(maps, line)) {
    std::istringstream fields(line);
    Mapping mapping;
    std::string range, offset, device;
    if (!(fields >> range >> mapping.perms >> offset >> device >> mapping.inode)) continue;
    const size_t dash = range.find('-');
    if (dash == std::string::npos) continue;
    mapping.start = std::stoull(range.substr(0, dash), nullptr, 16);
    mapping.end = std::stoull(range.substr(dash + 1), nullptr, 16);
    std::getline(fields >> std::ws, mapping.path);
    mappings.push_back(std::move(mapping));
  }
  return mappings;
}

// Private read-write memory whose pages may be replaced: anonymous (possibly
// named by the allocator), or the file of an earlier shared copy.
bool replaceable(const Mapping& mapping) {
  if (mapping.perms != "rw-p") return false;
  if (mapping.path.empty() || mapping.path.rfind("[anon:", 0) == 0) return mapping.inode == 0;
  const std::string deleted = " (deleted)";
  return mapping.path.find("/leanloader-") != std::string::npos &&
         mapping.path.size() > deleted.size() &&
         mapping.path.compare(mapping.path.size() - deleted.size(), deleted.size(), deleted) == 0;
}

// "" when [start, end) is covered, without a gap, by replaceable mappings.
std::string coverage_refusal(const std::vector<Mapping>& mappings, uintptr_t start, uintptr_t end) {
  uintptr_t covered = start;
  for (const Mapping& mapping : mappings) {
    if (mapping.end <= covered) continue;
    if (mapping.start > covered) break;
    if (!replaceable(mapping)) {
      return "its memory is not private anonymous memory (" + mapping.perms + " " +
             (mapping.path.empty() ? std::string("anonymous") : mapping.path) + ")";
    }
    covered = mapping.end;
    if (covered >= end) return "";
  }
  return "its memory is not mapped as one block";
}

struct Chunk {
  uintptr_t block = 0;  // the mapping malloc made (page-aligned)
  size_t total = 0;     // its length
};

std::string refusal(const void* source, size_t bytes, const std::vector<Mapping>& mappings,
                    Chunk* chunk) {
  if (!glibc_allocates()) {
    return "this process's allocator is not glibc's malloc (a preloaded allocator or a "
           "sanitizer)";
  }
  const auto address = reinterpret_cast<uintptr_t>(source);
  const auto end = checked_add(address, bytes);
  if (bytes == 0 || !end || address < kChunkHeaderBytes) return "the block is empty or wraps";
  if (address % alignof(size_t) != 0) return "the block is not where malloc puts a block";
  // The header is read only once its bytes are known to be mapped.
  std::string why = coverage_refusal(mappings, address - kChunkHeaderBytes, *end);
  if (!why.empty()) return why;
  size_t header[2];
  std::memcpy(header, reinterpret_cast<const std::byte*>(source) - kChunkHeaderBytes,
              sizeof(header));
  const size_t prev_size = header[0];
  const size_t chunk_size = header[1] & ~kChunkFlagBits;
  if ((header[1] & kChunkFlagBits) != kMmappedChunkFlags) {
    return "it is not a block that malloc mapped on its own (a mmapped chunk)";
  }
  const size_t page = page_size();
  const uintptr_t chunk_start = address - kChunkHeaderBytes;
  const auto total = checked_add(prev_size, chunk_size);
  const auto chunk_end = checked_add(chunk_start, chunk_size);
  if (prev_size > chunk_start || !total || !chunk_end || (chunk_start - prev_size) % page != 0 ||
      *total % page != 0 || *chunk_end < *end) {
    return "its malloc header does not describe a mmapped chunk that holds it";
  }
  chunk->block = chunk_start - prev_size;
  chunk->total = *total;
  why = coverage_refusal(mappings, chunk->block, chunk->block + chunk->total);
  if (!why.empty()) return why;
  // A MAP_FIXED that fails may leave the range unmapped on older kernels:
  // refuse rather than come near the one limit a small mmap meets.
  std::ifstream limit_file("/proc/sys/vm/max_map_count");
  size_t limit = 65530;  // the kernel's default
  limit_file >> limit;
  if (mappings.size() + kMappingsMargin > limit) {
    return "this process is close to its limit of mappings (vm.max_map_count)";
  }
  return "";
}

}  // namespace

std::string page_sharing_refusal(const void* source, size_t bytes) {
  Chunk chunk;
  return refusal(source, bytes, read_mappings(), &chunk);
}

SharedCopy make_shared_copy(void* source, size_t bytes, const std::string& dir,
                            PageSharing sharing) {
  if (bytes == 0) throw InvalidArgument("a shared copy needs at least one byte");
  const size_t page = page_size();
  const auto address = reinterpret_cast<uintptr_t>(source);
  SharedCopy copy;
  copy.offset = address % page;
  const auto segment_bytes = checked_add(copy.offset, bytes);
  if (!segment_bytes || !checked_add(address, bytes)) {
    throw InvalidArgument("a shared copy of " + std::to_string(bytes) + " bytes wraps");
  }
  Chunk chunk;
  bool share =
      sharing == PageSharing::kWhereSafe && refusal(source, bytes, read_mappings(), &chunk).empty();
  copy.segment = SharedSegment::create(*segment_bytes, dir, SharedSegment::Reserve::kLater);
  SharedSegment& segment = *copy.segment;
  // Segment offset x holds the byte at address `base + x`; both are
  // page-aligned together, so a page of the source is a page of the file.
  const uintptr_t base = address - copy.offset;
  const size_t shared_from = (copy.offset + page - 1) / page * page;
  const size_t shared_to = *segment_bytes / page * page;
  for (size_t from = copy.offset; from < *segment_bytes;) {
    const size_t to = std::min(*segment_bytes, (from / kChunkBytes + 1) * kChunkBytes);
    segment.reserve(from, to - from);
    std::memcpy(segment.data() + from, reinterpret_cast<const std::byte*>(base + from), to - from);
    const size_t map_from = std::max(from, shared_from);
    const size_t map_to = std::min(to, shared_to);
    if (share && map_from < map_to) {
      void* mapped = ::mmap(reinterpret_cast<void*>(base + map_from), map_to - map_from,
                            PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_FIXED, segment.fd(),
                            static_cast<off_t>(map_from));
      if (mapped == MAP_FAILED) {
        share = false;  // (the mapping limit was checked) the rest keeps its own pages
      } else {
        copy.shared_bytes += map_to - map_from;
      }
    }
    from = to;
  }
  return copy;
}

}  // namespace leanloader
