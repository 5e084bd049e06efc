// Python: safetensors load/save (leanloader.safetensors wraps these) and the
// header reader behind `leanloader cache inspect`.
#include <nanobind/ndarray.h>
#include <nanobind/stl/map.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "bindings.h"
#include "leanloader/io/safetensors.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace leanloader::bindings {

namespace {

nb::dict header_to_dict(const SafetensorsHeader& header) {
  nb::dict tensors;
  for (const SafetensorsEntry& entry : header.tensors) {
    nb::dict info;
    info["dtype"] = std::string(dtype_name(entry.dtype));
    nb::list shape;
    for (const int64_t dim : entry.shape) shape.append(dim);
    info["shape"] = nb::tuple(shape);
    info["data_offsets"] = nb::make_tuple(entry.begin, entry.end);
    tensors[nb::str(entry.name.data(), entry.name.size())] = info;
  }
  nb::dict out;
  out["tensors"] = tensors;
  if (header.has_metadata) {
    nb::dict metadata;
    for (const auto& [key, value] : header.metadata) {
      metadata[nb::str(key.data(), key.size())] = nb::str(value.data(), value.size());
    }
    out["metadata"] = metadata;
  } else {
    out["metadata"] = nb::none();
  }
  out["data_offset"] = header.data_offset;
  return out;
}

}  // namespace

void bind_safetensors(nb::module_& m) {
  m.def(
      "load_safetensors",
      [](const std::string& path, const std::string& output) {
        const OutputFramework framework = parse_output_framework(output);
        std::shared_ptr<SafetensorsFile> file;
        std::vector<Tensor> tensors;
        {
          nb::gil_scoped_release release;
          file = SafetensorsFile::open(path);
          tensors.reserve(file->size());
          for (size_t i = 0; i < file->size(); ++i) tensors.push_back(file->tensor(i));
        }
        nb::dict out;
        for (size_t i = 0; i < tensors.size(); ++i) {
          const std::string& name = file->header().tensors[i].name;
          try {
            out[nb::str(name.data(), name.size())] = tensor_to_python(tensors[i], framework);
          } catch (const InvalidArgument& error) {
            throw InvalidArgument("'" + path + "' tensor '" + name + "': " + error.what());
          }
        }
        return out;
      },
      "path"_a, "output"_a = "torch",
      "Loads every tensor of a safetensors file as zero-copy views of the mapped file\n"
      "(tensors whose data is misaligned for their dtype are copied). Validates the\n"
      "file as strictly as the reference reader; raises leanloader.FormatError.");

  m.def(
      "save_safetensors",
      [](const std::string& path, const nb::dict& tensors,
         const std::optional<std::map<std::string, std::string>>& metadata) {
        // The arrays stay referenced here until after the write, and are
        // released with the GIL held.
        std::vector<InputArray> arrays;
        std::vector<std::pair<std::string, Tensor>> views;
        arrays.reserve(tensors.size());
        views.reserve(tensors.size());
        for (const auto& [key, value] : tensors) {
          if (!nb::isinstance<nb::str>(key)) {
            throw nb::type_error("tensor names must be str");
          }
          std::string name = nb::cast<std::string>(key);
          InputArray array;
          if (nb::isinstance<nb::tuple>(value) && nb::len(value) == 3) {
            // A packed tensor: (dtype name, logical shape, uint8 bytes).
            const nb::tuple packed = nb::borrow<nb::tuple>(value);
            const std::string dtype_text = nb::cast<std::string>(packed[0]);
            const std::optional<DType> dtype = dtype_from_name(dtype_text);
            if (!dtype) {
              throw nb::value_error(
                  ("tensor '" + name + "': unknown dtype '" + dtype_text + "'").c_str());
            }
            const Shape shape = nb::cast<Shape>(packed[1]);
            if (!nb::try_cast(packed[2], array)) {
              throw nb::type_error(
                  ("tensor '" + name + "': the packed data is not a CPU array").c_str());
            }
            views.emplace_back(
                name, packed_view_of(array, *dtype, shape, name, ArrayLifetime::kBorrowed));
            arrays.push_back(std::move(array));
            continue;
          }
          if (!nb::try_cast(value, array)) {
            const std::string type = nb::cast<std::string>(nb::str(value.type()));
            throw nb::type_error(("tensor '" + name + "' is a " + type +
                                  ", not a CPU array (NumPy or torch, via DLPack)")
                                     .c_str());
          }
          views.emplace_back(name, tensor_view_of(array, name, ArrayLifetime::kBorrowed));
          arrays.push_back(std::move(array));
        }
        nb::gil_scoped_release release;
        save_safetensors(path, views, metadata);
      },
      "path"_a, "tensors"_a, "metadata"_a = nb::none(),
      "Writes a dict of CPU arrays in the reference safetensors layout, atomically\n"
      "(temporary file, fsync, rename, fsync of the directory).");

  m.def(
      "safetensors_header",
      [](const std::string& path) {
        SafetensorsHeader header;
        {
          nb::gil_scoped_release release;
          header = read_safetensors_header(path);
        }
        return header_to_dict(header);
      },
      "path"_a,
      "Reads and validates only the header of a safetensors file: {'tensors': {name:\n"
      "{'dtype', 'shape', 'data_offsets'}} in file order, 'metadata': dict or None,\n"
      "'data_offset': int}.");
}

}  // namespace leanloader::bindings
