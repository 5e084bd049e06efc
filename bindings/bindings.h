// Declarations shared by the binding files: one bind_<area> per file, all
// called from module.cc. Bindings are glue only; logic lives in src/.
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <string>

#include "leanloader/core/error.h"
#include "leanloader/core/tensor.h"
#include "leanloader/core/warning.h"

namespace leanloader::bindings {

void bind_errors(nanobind::module_& m);
void bind_tensor(nanobind::module_& m);
void bind_sources(nanobind::module_& m);
void bind_loader(nanobind::module_& m);
void bind_memory(nanobind::module_& m);
void bind_planner(nanobind::module_& m);
void bind_safetensors(nanobind::module_& m);
void bind_bandwidth(nanobind::module_& m);
void bind_python_tasks(nanobind::module_& m);
void bind_process(nanobind::module_& m);
void bind_cache(nanobind::module_& m);
void bind_hdf5(nanobind::module_& m);
void bind_image(nanobind::module_& m);
void bind_device(nanobind::module_& m);

// Which array type Python receives. Both are zero-copy views through DLPack.
enum class OutputFramework { kNumpy, kTorch, kDLPack };

OutputFramework parse_output_framework(const std::string& name);

// Wraps a Tensor for Python without copying. The returned object keeps the
// Tensor's Storage alive until Python drops it (a pool slot then returns to
// its pool). Raises TypeError for a dtype the framework cannot represent
// (NumPy has no bfloat16 or float8).
// Sub-byte dtypes: F4 whose last dimension is even goes to torch (and
// "dlpack") as DLPack (17, 4 bits, 2 lanes) = torch.float4_e2m1fn_x2 with
// the last dimension halved; every other sub-byte tensor (F6_*, which torch
// and NumPy lack; F4 with an odd last dimension; F4 for NumPy) becomes a
// leanloader.PackedTensor: its bytes as a 1-D uint8 array, the dtype named,
// the logical shape kept.
nanobind::object tensor_to_python(const Tensor& tensor, OutputFramework framework);

// Any CPU array that speaks DLPack or the buffer protocol (NumPy, torch).
using InputArray = nanobind::ndarray<nanobind::ro, nanobind::device::cpu>;

// How a Tensor made from a caller's array relates to the array.
enum class ArrayLifetime {
  kBorrowed,  // the caller keeps the array alive while the Tensor is used
  kShared,    // the Tensor's Storage holds a reference (dropped with the GIL)
};

// A Tensor viewing `array`'s memory without copying. Throws InvalidArgument
// naming `name` for a dtype leanloader does not handle or negative strides.
// A torch.float4_e2m1fn_x2 array (DLPack 17, 4 bits, 2 lanes) becomes F4
// with the last dimension doubled; it must be contiguous.
Tensor tensor_view_of(const InputArray& array, const std::string& name, ArrayLifetime lifetime);

// A Tensor of `dtype` and logical `shape` viewing the bytes of a contiguous
// uint8 array (a PackedTensor's data). Throws InvalidArgument naming `name`
// when the array is not contiguous uint8 or its size is not the tensor's.
Tensor packed_view_of(const InputArray& bytes, DType dtype, Shape shape, const std::string& name,
                      ArrayLifetime lifetime);

// Raises the Python exception that corresponds to a leanloader::Error
// (used by the exception translator and by code that stores errors).
[[noreturn]] void raise_python_error(const Error& error);
// The Python warning class for a warning of `kind` (a borrowed reference).
PyObject* warning_category(WarningKind kind);

}  // namespace leanloader::bindings
