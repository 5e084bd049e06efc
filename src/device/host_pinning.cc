#include "leanloader/device/host_pinning.h"

namespace leanloader {

void HostPinning::on_create(std::byte* data, size_t bytes) {
  runtime_->register_host(data, bytes);
  const size_t now = pinned_.fetch_add(bytes) + bytes;
  size_t peak = peak_.load();
  while (now > peak && !peak_.compare_exchange_weak(peak, now)) {
  }
}

void HostPinning::on_destroy(std::byte* data, size_t bytes) noexcept {
  runtime_->unregister_host(data);
  pinned_.fetch_sub(bytes);
}

}  // namespace leanloader
