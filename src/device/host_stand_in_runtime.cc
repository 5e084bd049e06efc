#include "leanloader/device/host_stand_in_runtime.h"

#include <cstdlib>
#include <cstring>
#include <deque>
#include <thread>

#include "leanloader/core/error.h"

namespace leanloader {

// One stream: a thread that runs queued operations in order.
class HostStandInRuntime::StreamThread {
 public:
  StreamThread() : thread_([this] { run(); }) {}
  ~StreamThread() {
    {
      std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    changed_.notify_all();
    thread_.join();  // runs what is queued first
  }

  void push(std::function<void()> work) {
    {
      std::lock_guard lock(mutex_);
      queue_.push_back(std::move(work));
      ++pushed_;
    }
    changed_.notify_all();
  }

  void drain() {
    std::unique_lock lock(mutex_);
    const uint64_t target = pushed_;
    changed_.wait(lock, [&] { return finished_ >= target; });
  }

 private:
  void run() {
    std::unique_lock lock(mutex_);
    while (true) {
      changed_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, nothing left
      std::function<void()> work = std::move(queue_.front());
      queue_.pop_front();
      lock.unlock();
      work();
      lock.lock();
      ++finished_;
      changed_.notify_all();
    }
  }

  std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<std::function<void()>> queue_;
  uint64_t pushed_ = 0;
  uint64_t finished_ = 0;
  bool stopping_ = false;
  std::thread thread_;  // last: starts after the state above exists
};

// An event: how many times it was recorded, and up to which record the
// streams have reached it.
struct HostStandInRuntime::EventState {
  std::mutex mutex;
  std::condition_variable reached;
  uint64_t recorded = 0;
  uint64_t completed = 0;
};

namespace {

// An event handle owns a reference to the state; queued operations hold
// their own, so destroying the handle never frees state they still use.
using EventHandle = std::shared_ptr<HostStandInRuntime::EventState>;

const EventHandle& event_of(DeviceRuntime::Event event) {
  if (event == 0) throw InvalidArgument("host stand-in: null event");
  return *reinterpret_cast<EventHandle*>(event);
}

}  // namespace

HostStandInRuntime::HostStandInRuntime() : default_stream_(std::make_unique<StreamThread>()) {}

HostStandInRuntime::~HostStandInRuntime() = default;

HostStandInRuntime::StreamThread& HostStandInRuntime::stream_of(Stream stream) {
  return stream == 0 ? *default_stream_ : *reinterpret_cast<StreamThread*>(stream);
}

void HostStandInRuntime::register_host(std::byte* data, size_t bytes) {
  std::lock_guard lock(mutex_);
  if (!registered_.emplace(data, bytes).second) {
    throw InvalidArgument("host stand-in: memory registered twice");
  }
  ++registrations_;
}

void HostStandInRuntime::unregister_host(std::byte* data) noexcept {
  std::lock_guard lock(mutex_);
  registered_.erase(data);
}

std::byte* HostStandInRuntime::allocate(size_t bytes) {
  // malloc/free, not operator new: a test binary may replace the global
  // operator new/delete pair (job_failure_test.cc), not its nothrow form.
  auto* data = static_cast<std::byte*>(std::malloc(bytes == 0 ? 1 : bytes));
  if (data == nullptr) {
    throw OutOfMemory("host stand-in: cannot allocate " + std::to_string(bytes) + " bytes");
  }
  std::lock_guard lock(mutex_);
  allocated_.emplace(data, bytes);
  return data;
}

void HostStandInRuntime::free(std::byte* data) noexcept {
  {
    std::lock_guard lock(mutex_);
    allocated_.erase(data);
  }
  std::free(data);
}

DeviceRuntime::Stream HostStandInRuntime::create_stream() {
  return reinterpret_cast<Stream>(new StreamThread());
}

void HostStandInRuntime::destroy_stream(Stream stream) noexcept {
  if (stream != 0) delete reinterpret_cast<StreamThread*>(stream);
}

DeviceRuntime::Event HostStandInRuntime::create_event() {
  return reinterpret_cast<Event>(new EventHandle(std::make_shared<EventState>()));
}

void HostStandInRuntime::destroy_event(Event event) noexcept {
  delete reinterpret_cast<EventHandle*>(event);
}

void HostStandInRuntime::copy_to_device(std::byte* device, const std::byte* host, size_t bytes,
                                        Stream stream) {
  std::chrono::milliseconds delay;
  {
    std::lock_guard lock(mutex_);
    delay = copy_delay_;
  }
  stream_of(stream).push([device, host, bytes, delay] {
    if (delay.count() > 0) std::this_thread::sleep_for(delay);
    std::memcpy(device, host, bytes);
  });
}

void HostStandInRuntime::record(Event event, Stream stream) {
  EventHandle state = event_of(event);
  uint64_t generation = 0;
  {
    std::lock_guard lock(state->mutex);
    generation = ++state->recorded;
  }
  stream_of(stream).push([state, generation] {
    {
      std::lock_guard lock(state->mutex);
      if (state->completed < generation) state->completed = generation;
    }
    state->reached.notify_all();
  });
}

void HostStandInRuntime::wait(Stream stream, Event event) {
  EventHandle state = event_of(event);
  uint64_t generation = 0;
  {
    std::lock_guard lock(state->mutex);
    generation = state->recorded;
  }
  if (generation == 0) return;  // never recorded: nothing to wait for (as CUDA)
  stream_of(stream).push([state, generation] {
    std::unique_lock lock(state->mutex);
    state->reached.wait(lock, [&] { return state->completed >= generation; });
  });
}

bool HostStandInRuntime::done(Event event) {
  const EventHandle& state = event_of(event);
  std::lock_guard lock(state->mutex);
  return state->completed >= state->recorded;
}

void HostStandInRuntime::synchronize(Event event) {
  const EventHandle& handle = event_of(event);
  EventState& state = *handle;
  std::unique_lock lock(state.mutex);
  const uint64_t generation = state.recorded;
  state.reached.wait(lock, [&] { return state.completed >= generation; });
}

void HostStandInRuntime::enqueue(Stream stream, std::function<void()> work) {
  stream_of(stream).push(std::move(work));
}

void HostStandInRuntime::delay(Stream stream, std::chrono::milliseconds duration) {
  stream_of(stream).push([duration] { std::this_thread::sleep_for(duration); });
}

void HostStandInRuntime::delay_copies(std::chrono::milliseconds duration) {
  std::lock_guard lock(mutex_);
  copy_delay_ = duration;
}

void HostStandInRuntime::drain(Stream stream) { stream_of(stream).drain(); }

size_t HostStandInRuntime::registered_bytes() const {
  std::lock_guard lock(mutex_);
  size_t total = 0;
  for (const auto& [data, bytes] : registered_) total += bytes;
  return total;
}

uint64_t HostStandInRuntime::registrations() const {
  std::lock_guard lock(mutex_);
  return registrations_;
}

size_t HostStandInRuntime::allocated_bytes() const {
  std::lock_guard lock(mutex_);
  size_t total = 0;
  for (const auto& [data, bytes] : allocated_) total += bytes;
  return total;
}

}  // namespace leanloader
