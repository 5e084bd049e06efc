// LoaderMemoryPlan: host RAM, pinned memory and VRAM of one loader
// configuration, per component, for leanloader and for torch's DataLoader
// with the same arguments (seed 004's hand calculation, done by the tool).
//
// leanloader, native threads (ll.Loader, workers = 0):
//   batch slots          (prefetch + 2) x batch   host; all pinned with a device
//   device blocks        (prefetch_to_device + 2) x batch   VRAM, with a device
// leanloader, process workers (ll.DataLoader, workers = w):
//   batch segments       (prefetch x w + 2 + w) x batch   host (shared memory) for
//                        batches up to kKeptBatchSegmentMaxBytes (kept for reuse);
//                        (prefetch x w + 1) x batch above (freed as torch frees
//                        them); with pin_memory page-locked in place
//   worker processes     w x worker_process_bytes     host
//   batch on the device  2 x batch                    VRAM (the new one, the old one)
// torch DataLoader (w >= 1 workers, prefetch_factor p; w = 0: one batch):
//   worker batches       p x w x batch                host (shared memory)
//   batch held by loop   1 x batch                    host
//   pin_memory copies    (p x w + 1) x batch          pinned (each batch copied once more)
//   worker processes     w x worker_process_bytes     host
//   batch on the device  2 x batch                    VRAM (.to(device): the new, the old)
// "pinned" bytes are part of "host" where the memory is the same (leanloader's
// slots and segments) and extra where they are copies (torch's pin_memory).
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace leanloader {

// ll.DataLoader keeps batch segments up to this size for reuse by later
// batches (dataloader/batch_segments.py); larger ones are freed when the
// consumer drops their batch, as torch frees its shared batches. At this size
// making a new segment costs little next to producing the batch's samples in
// Python (reserving 300 MB of /dev/shm: ~0.1 s, against ~1 s of h5py reads
// in seed 004's batches).
inline constexpr size_t kKeptBatchSegmentMaxBytes = size_t{64} << 20;

struct LoaderMemoryInput {
  size_t batch_bytes = 0;   // one batch, all fields
  int workers = 0;          // process workers; 0 = leanloader's native threads
  int prefetch = 2;         // ll.Loader prefetch / DataLoader prefetch_factor
  bool pin_memory = false;  // page-locked host batches
  bool device = false;      // batches go to a GPU
  int prefetch_to_device = 1;
  size_t worker_process_bytes = 500000000;  // a worker's own Python + torch (seed 004: ~500 MB)
};

struct MemoryComponent {
  std::string name;
  size_t host_bytes = 0;    // host RAM, pinned or not
  size_t pinned_bytes = 0;  // of which (or in addition: torch's copies) page-locked
  size_t device_bytes = 0;  // VRAM
};

struct LoaderMemoryPlan {
  std::vector<MemoryComponent> leanloader;
  std::vector<MemoryComponent> torch;
};

// Throws InvalidArgument for negative counts or a size that overflows.
LoaderMemoryPlan plan_loader_memory(const LoaderMemoryInput& input);

// Sum of the components (checked).
MemoryComponent total_of(const std::vector<MemoryComponent>& components);

}  // namespace leanloader
