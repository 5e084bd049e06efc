// Zero-copy export of Tensors to NumPy / PyTorch through DLPack.
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "bindings.h"
#include "leanloader/core/checked_size.h"

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

// DLPack 1.1's float4 code, as torch exchanges float4_e2m1fn_x2.
constexpr uint8_t kDLFloat4Code = 17;

template <typename Framework>
nb::object make_array(const Tensor& tensor, const std::vector<size_t>& shape,
                      const int64_t* strides, nb::dlpack::dtype dtype) {
  const nb::capsule owner = storage_owner(tensor.storage());
  nb::ndarray<Framework> array(tensor.data(), shape.size(), shape.data(), owner, strides, dtype);
  return array.cast();
}

nb::object array_in(OutputFramework framework, const Tensor& tensor,
                    const std::vector<size_t>& shape, const int64_t* strides,
                    nb::dlpack::dtype dtype) {
  switch (framework) {
    case OutputFramework::kNumpy:
      return make_array<nb::numpy>(tensor, shape, strides, dtype);
    case OutputFramework::kTorch:
      return make_array<nb::pytorch>(tensor, shape, strides, dtype);
    case OutputFramework::kDLPack:
      break;
  }
  nb::capsule owner = storage_owner(tensor.storage());
  nb::ndarray<> array(tensor.data(), shape.size(), shape.data(), owner, strides, dtype);
  return array.cast();
}

// See tensor_to_python in bindings.h.
nb::object subbyte_to_python(const Tensor& tensor, OutputFramework framework) {
  const Shape& logical = tensor.shape();
  if (tensor.dtype() == DType::kF4 && framework != OutputFramework::kNumpy && !logical.empty() &&
      logical.back() % 2 == 0) {
    Shape pairs = logical;
    pairs.back() /= 2;
    const Shape strides = contiguous_strides(pairs);
    const std::vector<size_t> shape(pairs.begin(), pairs.end());
    return array_in(framework, tensor, shape, strides.data(),
                    nb::dlpack::dtype{kDLFloat4Code, 4, 2});
  }
  const std::vector<size_t> shape{tensor.nbytes()};
  const int64_t stride = 1;
  nb::object bytes =
      array_in(framework, tensor, shape, &stride,
               nb::dlpack::dtype{static_cast<uint8_t>(nb::dlpack::dtype_code::UInt), 8, 1});
  nb::list dims;
  for (const int64_t dim : logical) dims.append(dim);
  return nb::module_::import_("leanloader.packed")
      .attr("PackedTensor")(std::string(dtype_name(tensor.dtype())), nb::tuple(dims), bytes);
}

// A tensor in device memory (DLPack's device type and index), for torch or
// DLPack consumers; NumPy holds host memory only.
nb::object device_tensor_to_python(const Tensor& tensor, OutputFramework framework,
                                   DeviceLocation device) {
  if (framework == OutputFramework::kNumpy) {
    throw nb::type_error("NumPy arrays live in host memory: use output='torch' with a device");
  }
  if (dtype_is_subbyte(tensor.dtype())) {
    throw nb::type_error("sub-byte dtypes are not moved to a device");
  }
  const DLPackType type = dlpack_type(tensor.dtype());
  const nb::dlpack::dtype dtype{type.code, type.bits, 1};
  std::vector<size_t> shape(tensor.shape().begin(), tensor.shape().end());
  const nb::capsule owner = storage_owner(tensor.storage());
  const int device_type = static_cast<int>(device.type);
  if (framework == OutputFramework::kTorch) {
    nb::ndarray<nb::pytorch> array(tensor.data(), shape.size(), shape.data(), owner,
                                   tensor.strides().data(), dtype, device_type, device.index);
    return array.cast();
  }
  nb::ndarray<> array(tensor.data(), shape.size(), shape.data(), owner, tensor.strides().data(),
                      dtype, device_type, device.index);
  return array.cast();
}

}  // namespace

nb::object tensor_to_python(const Tensor& tensor, OutputFramework framework) {
  // nanobind hands at most 128 dimensions to Python (more ends the process)
  // and NumPy holds at most 64 (more came back as a 0-d object array).
  const size_t dimensions = tensor.shape().size();
  const bool numpy = framework == OutputFramework::kNumpy;
  if (dimensions > (numpy ? 64u : 128u)) {
    throw InvalidArgument(std::to_string(dimensions) + " dimensions: " +
                          (numpy ? "NumPy holds at most 64 (output='torch' takes up to 128)"
                                 : "at most 128 can be handed to Python"));
  }
  const DeviceLocation device = tensor.storage()->device();
  if (!device.is_cpu()) return device_tensor_to_python(tensor, framework, device);
  if (dtype_is_subbyte(tensor.dtype())) return subbyte_to_python(tensor, framework);
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

namespace {

std::function<void()> releaser(const InputArray& array, ArrayLifetime lifetime) {
  if (lifetime != ArrayLifetime::kShared) return {};
  // Dropped with the GIL held, from whichever thread releases the last
  // view; at interpreter exit the reference is left to the OS.
  auto* keep_alive = new InputArray(array);
  return [keep_alive] {
    if (!Py_IsInitialized() || interpreter_is_finalizing()) return;
    nb::gil_scoped_acquire gil;
    delete keep_alive;
  };
}

bool is_dense(const InputArray& array) {
  int64_t expected = 1;
  for (size_t i = array.ndim(); i-- > 0;) {
    if (array.shape(i) != 1 && array.stride(i) != expected) return false;
    expected *= static_cast<int64_t>(array.shape(i));
  }
  return true;
}

}  // namespace

Tensor packed_view_of(const InputArray& bytes, DType dtype, Shape shape, const std::string& name,
                      ArrayLifetime lifetime) {
  const nb::dlpack::dtype type = bytes.dtype();
  if (type.code != static_cast<uint8_t>(nb::dlpack::dtype_code::UInt) || type.bits != 8 ||
      type.lanes != 1 || !is_dense(bytes)) {
    throw InvalidArgument("tensor '" + name + "': the bytes of a packed " +
                          std::string(dtype_name(dtype)) +
                          " tensor must be a contiguous uint8 array");
  }
  const std::optional<size_t> nbytes = checked_nbytes(shape, dtype);
  if (!nbytes) {
    throw InvalidArgument("tensor '" + name + "': " + std::string(dtype_name(dtype)) + " " +
                          shape_to_string(shape) + ": " + kSubbyteMisalignedMessage);
  }
  if (*nbytes != bytes.nbytes()) {
    throw InvalidArgument("tensor '" + name + "': " + std::string(dtype_name(dtype)) + " " +
                          shape_to_string(shape) + " is " + std::to_string(*nbytes) +
                          " bytes, but its data has " + std::to_string(bytes.nbytes()));
  }
  auto* data = static_cast<std::byte*>(const_cast<void*>(static_cast<const void*>(bytes.data())));
  auto storage = std::make_shared<ExternalStorage>(data, *nbytes, releaser(bytes, lifetime));
  return Tensor(std::move(storage), 0, dtype, std::move(shape));
}

Tensor tensor_view_of(const InputArray& array, const std::string& name, ArrayLifetime lifetime) {
  const nb::dlpack::dtype type = array.dtype();
  if (type.code == kDLFloat4Code && type.bits == 4 && type.lanes == 2) {
    // torch.float4_e2m1fn_x2: one byte holds two F4 values of the last
    // dimension.
    if (!is_dense(array)) {
      throw InvalidArgument("array '" + name +
                            "' (float4_e2m1fn_x2) is not contiguous; pass a contiguous copy");
    }
    Shape shape(array.ndim());
    for (size_t i = 0; i < array.ndim(); ++i) shape[i] = static_cast<int64_t>(array.shape(i));
    if (shape.empty()) shape.push_back(1);
    shape.back() *= 2;
    auto* data = static_cast<std::byte*>(const_cast<void*>(static_cast<const void*>(array.data())));
    auto storage = std::make_shared<ExternalStorage>(data, array.size(), releaser(array, lifetime));
    return Tensor(std::move(storage), 0, DType::kF4, std::move(shape));
  }
  const std::optional<DType> dtype =
      type.lanes == 1 ? dtype_from_dlpack(DLPackType{type.code, type.bits}) : std::nullopt;
  if (dtype && dtype_is_subbyte(*dtype)) {
    throw InvalidArgument("array '" + name + "' has " + std::string(dtype_name(*dtype)) +
                          " elements one per lane; pass a leanloader.PackedTensor instead");
  }
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
  auto storage = std::make_shared<ExternalStorage>(data, extent, releaser(array, lifetime));
  return Tensor(std::move(storage), 0, *dtype, std::move(shape), std::move(strides));
}

void bind_tensor(nb::module_& m) {
  m.def(
      "dtype_names",
      [] {
        std::vector<std::string> names;
        for (const DType dtype : kAllDTypes) {
          if (dtype_in_safetensors(dtype)) names.emplace_back(dtype_name(dtype));
        }
        return names;
      },
      "The safetensors spellings of every dtype leanloader reads and writes in safetensors "
      "files (all it handles but complex128, which safetensors lacks).");
}

}  // namespace leanloader::bindings
