// Source: where samples come from. Knows how many samples there are and how
// to read sample i into named fields.
//
// Contract:
// - fields() is fixed for the life of the Source: names, dtypes, and the
//   per-sample shape when every sample has the same one (nullopt otherwise).
// - read_sample(i, writer) is called concurrently from many threads for
//   different (or equal) i; it must be thread-safe and must not keep state
//   between calls. For each field it asks `writer` for the destination of
//   that field's bytes (given the sample's actual shape) and writes the
//   sample there: straight into the batch slot's row, no intermediate copy.
// - Errors are thrown as leanloader::Error with the cause; the caller adds the
//   sample index, source and stage "read" (see SampleError). A source that
//   knows the stage better (an image source: "decode") throws the SampleError
//   itself, which the caller passes on unchanged.
// - Random per-sample work (augmentations) must depend only on
//   writer.context() and the index, never on the thread or the call order,
//   so that a run gives the same samples at any thread count.
// - size() never changes under a reader that holds snapshot() (see there).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "leanloader/core/dtype.h"
#include "leanloader/core/tensor.h"
#include "leanloader/core/warning.h"

namespace leanloader {

struct FieldSpec {
  std::string name;
  DType dtype = DType::kU8;
  // Per-sample shape when fixed for all samples; nullopt when it varies.
  std::optional<Shape> shape;
};

// The run a sample is read for: the loader's seed and the epoch. Sources
// with random transforms key their draws by (seed, epoch, sample index).
struct SampleContext {
  uint64_t seed = 0;
  uint64_t epoch = 0;
};

// Receives one sample's fields from a Source.
class SampleWriter {
 public:
  virtual ~SampleWriter() = default;
  // The run this sample is read for; (0, 0) outside a Loader's epoch.
  virtual SampleContext context() const { return {}; }
  // Returns where field `field` (an index into Source::fields()) of this
  // sample goes: exactly checked_nbytes(shape, dtype) bytes, aligned to
  // kBufferAlignment or to the row size. Throws InvalidArgument when the shape
  // does not fit the batch (e.g. differs from the other samples of a stacked
  // batch).
  virtual std::span<std::byte> field_buffer(size_t field, const Shape& shape) = 0;
  // True when the buffers field_buffer returns belong to a batch too large to
  // still be in the CPU cache when it is read (several MiB): a source that
  // copies bytes into them should bypass the cache (streaming stores), which
  // moves fewer bytes over the memory bus. A hint; any copy is correct.
  virtual bool prefers_streaming_stores() const { return false; }
  // The sample was read, but the user should hear about it (an image
  // decoded through corrupt data, as Pillow decodes it): the message, which
  // names the file, reaches the user with the sample's batch, and the
  // loader counts the sample once (stats().samples_warned). Default: dropped.
  virtual void warn(Warning warning) { (void)warning; }
};

class Source {
 public:
  virtual ~Source() = default;

  virtual int64_t size() const = 0;
  virtual const std::vector<FieldSpec>& fields() const = 0;
  virtual void read_sample(int64_t index, SampleWriter& writer) const = 0;

  // A short description for messages, e.g. "NpySource(/data/x.npy)".
  virtual std::string describe() const = 0;
  // Where sample `index` lives, for messages: a file path, or "path row 17".
  virtual std::string sample_location(int64_t index) const = 0;
  // Typical bytes of one sample over all fields, for sizing batch slots when
  // shapes vary. Fixed-shape sources return the exact figure.
  virtual size_t estimated_sample_bytes() const = 0;
  // Bytes the source may keep between reads (a decoded-chunk cache), at
  // most; the loader adds them to its memory bill. 0 for sources that keep
  // nothing.
  virtual size_t cache_budget_bytes() const { return 0; }
  // Bytes one reading thread may hold while it reads a sample, beyond the
  // batch it writes into and the cache above (a compressed chunk, a decoded
  // chunk whose rows go to several samples), at most; the loader bills them
  // per thread. 0 for sources that read straight into the batch.
  virtual size_t per_thread_scratch_bytes() const { return 0; }

  // Reads that had to wait for storage (the data was not in the page cache),
  // counted since construction; sources that cannot tell return 0. While it
  // grows, the loader announces the rows it will read next (will_need), so
  // that the kernel has many reads in flight instead of one per thread.
  virtual uint64_t storage_reads() const { return 0; }
  // Whether sample `index` is in memory now (its bytes in the page cache);
  // true where the source cannot tell. The loader asks once, at a pass's
  // start: when the first sample is not, it announces the pass's first rows
  // before reading any (rows copied out of a mapping would otherwise each
  // wait for a page fault, and for the device's read-ahead around it, one
  // row at a time per thread, until a miss shows). Never throws.
  virtual bool in_memory(int64_t index) const noexcept {
    (void)index;
    return true;
  }
  // A hint that sample `index` will be read soon: start reading it from
  // storage in the background. Never blocks for the data, never throws.
  virtual void will_need(int64_t index) const noexcept { (void)index; }
  // After will_need of the same samples: a hint that the storage around
  // sample `index` is worth reading too, as far as the source judges it (a
  // page fault in a mapping reads the device's read-ahead around it; see
  // src/io/read_around.h). Announced after the samples themselves, so that
  // the first batch waits for its own rows only. Never waits for the data,
  // never throws.
  virtual void will_need_around(int64_t index) const noexcept { (void)index; }
  // A hint that this thread reads sample `index` next: start moving its
  // first bytes from memory toward the CPU cache (prefetch instructions).
  // Called once per sample: it must cost a few nanoseconds (no system call,
  // no lock) and never throw.
  virtual void will_read(int64_t index) const noexcept { (void)index; }

  // The Source as it is now, as an immutable Source: its size(), fields()
  // and samples never change while it is held, whatever happens to this
  // one. A Loader takes one at construction and at the start of each epoch
  // and reads only from it. A Source that never changes returns nullptr (it
  // is its own snapshot); one that can (TensorCache, rebuilt or reloaded)
  // returns its current snapshot.
  virtual std::shared_ptr<const Source> snapshot() const { return nullptr; }
  // Called by a Loader at the start of each pass that keeps the snapshot it
  // has (follow_updates off, or a resumed epoch) instead of taking a new
  // one: throws when the data under this snapshot changed so that it can no
  // longer be read as it was (files written in place). Sources whose
  // snapshots own their bytes never throw.
  virtual void check_unchanged() const {}
  // Called by a Loader when a pass over this source ends (its last batch
  // delivered, or the pass cancelled): a source may close what it keeps
  // open between reads and would reopen on the next (HDF5 files opened
  // through the library, which h5py in this process could not open for
  // writing meanwhile).
  virtual void pass_ended() const noexcept {}
};

// Index of the field called `name`, or nullopt.
std::optional<size_t> find_field(const Source& source, const std::string& name);

}  // namespace leanloader
