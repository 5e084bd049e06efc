// Zero-copy export of Tensors to NumPy / PyTorch through DLPack.
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <memory>
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
