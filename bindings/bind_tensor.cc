// Zero-copy export of Tensors to NumPy / PyTorch through DLPack.
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "bindings.h"

namespace nb = nanobind;

namespace leanloader::bindings {

OutputFramework parse_output_framework(const std::string& name) {
  if (name == "numpy") return OutputFramework::kNumpy;
  if (name == "torch") return OutputFramework::kTorch;
  if (name == "dlpack") return OutputFramework::kDLPack;
  throw InvalidArgument("output must be 'torch', 'numpy' or 'dlpack', got '" + name + "'");
}

namespace {

// The capsule that owns one reference to the Storage; nanobind keeps it as
// the array's owner and drops it (with the GIL held) when the array dies.
nb::capsule storage_owner(const std::shared_ptr<Storage>& storage) {
  auto* reference = new std::shared_ptr<Storage>(storage);
  return nb::capsule(reference,
                     [](void* p) noexcept { delete static_cast<std::shared_ptr<Storage>*>(p); });
}

bool numpy_supports(DType dtype) {
  switch (dtype) {
    case DType::kBF16:
    case DType::kF8E4M3:
    case DType::kF8E5M2:
    case DType::kF8E4M3Fnuz:
    case DType::kF8E5M2Fnuz:
    case DType::kF8E8M0:
      return false;
    default:
      return true;
  }
}

}  // namespace

nb::object tensor_to_python(const Tensor& tensor, OutputFramework framework) {
  const DLPackType type = dlpack_type(tensor.dtype());
  const nb::dlpack::dtype dtype{type.code, type.bits, 1};
  std::vector<size_t> shape(tensor.shape().begin(), tensor.shape().end());
  const nb::capsule owner = storage_owner(tensor.storage());
  switch (framework) {
    case OutputFramework::kNumpy: {
      if (!numpy_supports(tensor.dtype())) {
        throw nb::type_error(("NumPy has no " + std::string(dtype_name(tensor.dtype())) +
                              " dtype; use output='torch' for this data")
                                 .c_str());
      }
      nb::ndarray<nb::numpy> array(tensor.data(), shape.size(), shape.data(), owner,
                                   tensor.strides().data(), dtype);
      return array.cast();
    }
    case OutputFramework::kTorch: {
      nb::ndarray<nb::pytorch> array(tensor.data(), shape.size(), shape.data(), owner,
                                     tensor.strides().data(), dtype);
      return array.cast();
    }
    case OutputFramework::kDLPack:
      break;
  }
  nb::ndarray<> array(tensor.data(), shape.size(), shape.data(), owner, tensor.strides().data(),
                      dtype);
  return array.cast();
}

namespace {

bool interpreter_is_finalizing() {
#if PY_VERSION_HEX >= 0x030D0000
  return Py_IsFinalizing() != 0;
#else
  return _Py_IsFinalizing() != 0;
#endif
}

}  // namespace

Tensor tensor_view_of(const InputArray& array, const std::string& name, ArrayLifetime lifetime) {
  const nb::dlpack::dtype type = array.dtype();
  const std::optional<DType> dtype =
      type.lanes == 1 ? dtype_from_dlpack(DLPackType{type.code, type.bits}) : std::nullopt;
  if (!dtype) {
    throw InvalidArgument("array '" + name + "' has a dtype (DLPack code " +
                          std::to_string(type.code) + ", " + std::to_string(type.bits) + " bits, " +
                          std::to_string(type.lanes) + " lanes) that leanloader does not handle");
  }
  Shape shape(array.ndim());
  Shape strides(array.ndim());
  size_t last = 0;
  bool empty = false;
  for (size_t i = 0; i < array.ndim(); ++i) {
    shape[i] = static_cast<int64_t>(array.shape(i));
    strides[i] = array.stride(i);
    if (strides[i] < 0) {
      throw InvalidArgument("array '" + name + "' has a negative stride; pass a contiguous copy");
    }
    if (shape[i] == 0) empty = true;
    if (shape[i] > 0) last += static_cast<size_t>(shape[i] - 1) * static_cast<size_t>(strides[i]);
  }
  const size_t extent = empty ? 0 : (last + 1) * dtype_size(*dtype);
  auto* data = static_cast<std::byte*>(const_cast<void*>(static_cast<const void*>(array.data())));
  std::function<void()> release;
  if (lifetime == ArrayLifetime::kShared) {
    // Dropped with the GIL held, from whichever thread releases the last
    // view; at interpreter exit the reference is left to the OS.
    auto* keep_alive = new InputArray(array);
    release = [keep_alive] {
      if (!Py_IsInitialized() || interpreter_is_finalizing()) return;
      nb::gil_scoped_acquire gil;
      delete keep_alive;
    };
  }
  auto storage = std::make_shared<ExternalStorage>(data, extent, std::move(release));
  return Tensor(std::move(storage), 0, *dtype, std::move(shape), std::move(strides));
}

void bind_tensor(nb::module_& m) {
  m.def(
      "dtype_names",
      [] {
        std::vector<std::string> names;
        for (const DType dtype : kAllDTypes) names.emplace_back(dtype_name(dtype));
        return names;
      },
      "The safetensors spellings of every dtype leanloader handles.");
}

}  // namespace leanloader::bindings
