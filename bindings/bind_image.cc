// ImageSource, image decoding and the sample draws, for leanloader.image.
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <tuple>

#include "bindings.h"
#include "leanloader/core/storage.h"
#include "leanloader/image/image_format.h"
#include "leanloader/image/image_source.h"
#include "leanloader/image/philox.h"

namespace nb = nanobind;

namespace leanloader::bindings {

namespace {

// (kind, height, width, max_size, scale_min, scale_max, ratio_min, ratio_max, p)
using StepTuple =
    std::tuple<std::string, int64_t, int64_t, int64_t, double, double, double, double, double>;

TransformStep step_of(const StepTuple& tuple) {
  const auto& [kind, height, width, max_size, scale_min, scale_max, ratio_min, ratio_max, p] =
      tuple;
  if (kind == "resize") return TransformStep::resize(height, width, max_size);
  if (kind == "center_crop") return TransformStep::center_crop(height, width);
  if (kind == "random_resized_crop") {
    return TransformStep::random_resized_crop(height, width, scale_min, scale_max, ratio_min,
                                              ratio_max);
  }
  if (kind == "horizontal_flip") return TransformStep::horizontal_flip(p);
  throw InvalidArgument("unknown transform step '" + kind + "'");
}

ColorMode mode_of(const std::string& mode) {
  if (mode == "RGB") return ColorMode::kRGB;
  if (mode == "L") return ColorMode::kGray;
  if (mode == "RGBA") return ColorMode::kRGBA;
  throw InvalidArgument("mode must be 'RGB', 'L' or 'RGBA', got '" + mode + "'");
}

DecodeOptions decode_options(const std::string& mode, uint64_t max_pixels, bool accept_corrupt_jpeg,
                             bool exif_orientation) {
  DecodeOptions options;
  options.mode = mode_of(mode);
  options.max_pixels = max_pixels;
  options.accept_corrupt_jpeg = accept_corrupt_jpeg;
  options.exif_orientation = exif_orientation;
  return options;
}

nb::dict params_dict(const TransformParams& params) {
  nb::dict out;
  out["image_size"] = nb::make_tuple(params.image_height, params.image_width);
  nb::list crops;
  for (const PixelBox& box : params.crops) {
    crops.append(
        nb::make_tuple(box.y, box.x, box.height, box.width));  // torchvision's (i, j, h, w)
  }
  out["crops"] = crops;
  nb::list resizes;
  for (const auto& [h, w] : params.resizes) resizes.append(nb::make_tuple(h, w));
  out["resizes"] = resizes;
  nb::list flips;
  for (const bool flip : params.flips) flips.append(flip);
  out["flips"] = flips;
  out["flipped"] = params.flipped;
  out["output_size"] = nb::make_tuple(params.output_height, params.output_width);
  return out;
}

}  // namespace

void bind_image(nb::module_& m) {
  nb::class_<ImageSource, Source>(m, "ImageSource")
      .def(
          "__init__",
          [](ImageSource* self, std::vector<std::string> paths, std::vector<int64_t> labels,
             const std::vector<StepTuple>& steps, const std::string& dtype,
             const std::string& layout, std::vector<float> mean, std::vector<float> std,
             const std::string& mode, uint64_t max_pixels, bool accept_corrupt_jpeg,
             bool exif_orientation, bool dct_scaling) {
            ImageSourceOptions options;
            options.decode =
                decode_options(mode, max_pixels, accept_corrupt_jpeg, exif_orientation);
            for (const StepTuple& step : steps) options.transforms.push_back(step_of(step));
            const std::optional<DType> parsed = dtype_from_name(dtype);
            if (!parsed) throw InvalidArgument("unknown dtype '" + dtype + "'");
            options.output.dtype = *parsed;
            if (layout != "CHW" && layout != "HWC") {
              throw InvalidArgument("layout must be 'CHW' or 'HWC', got '" + layout + "'");
            }
            options.output.layout = layout == "CHW" ? ImageLayout::kCHW : ImageLayout::kHWC;
            options.output.mean = std::move(mean);
            options.output.std = std::move(std);
            options.dct_scaling = dct_scaling;
            new (self) ImageSource(std::move(paths), std::move(labels), std::move(options));
          },
          nb::arg("paths"), nb::arg("labels"), nb::arg("steps"), nb::arg("dtype"),
          nb::arg("layout"), nb::arg("mean"), nb::arg("std"), nb::arg("mode"),
          nb::arg("max_pixels"), nb::arg("accept_corrupt_jpeg"), nb::arg("exif_orientation"),
          nb::arg("dct_scaling"))
      .def_prop_ro("paths", &ImageSource::paths)
      .def_prop_ro("labels", &ImageSource::labels)
      .def_prop_ro("transform_description",
                   [](const ImageSource& self) { return self.transform().describe(); })
      .def(
          "sample_params",
          [](const ImageSource& self, int64_t index, uint64_t seed, uint64_t epoch) {
            TransformParams params;
            {
              nb::gil_scoped_release release;
              params = self.sample_params(index, seed, epoch);
            }
            return params_dict(params);
          },
          nb::arg("index"), nb::arg("seed"), nb::arg("epoch"),
          "The parameters sample `index` gets in (seed, epoch): crops as torchvision's (i, j, h, "
          "w), resizes as (h, w), flipped, output_size.");

  m.def(
      "decode_image",
      [](nb::bytes data, const std::string& mode, uint64_t max_pixels, bool accept_corrupt_jpeg,
         bool exif_orientation, const std::string& name) {
        const std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(data.c_str()),
                                               data.size());
        const DecodeOptions options =
            decode_options(mode, max_pixels, accept_corrupt_jpeg, exif_orientation);
        Tensor tensor;
        bool corrupt_data = false;
        bool over_pixel_limit = false;
        ImageInfo info;
        {
          nb::gil_scoped_release release;
          info = read_image_info(bytes, options);
          over_pixel_limit = info.over_pixel_limit;
          const int channels = color_mode_channels(options.mode);
          const size_t size = static_cast<size_t>(info.width) * static_cast<size_t>(info.height) *
                              static_cast<size_t>(channels);
          auto storage = HeapStorage::allocate(size);
          corrupt_data = decode_image_into(bytes, info, options,
                                           {reinterpret_cast<uint8_t*>(storage->data()), size});
          tensor = Tensor(storage, 0, DType::kU8, {info.height, info.width, channels});
        }
        nb::list warnings;  // (category, message)
        if (over_pixel_limit) {
          warnings.append(nb::make_tuple(nb::handle(warning_category(WarningKind::kPixelLimit)),
                                         pixel_limit_warning(name, info, options.max_pixels)));
        }
        if (corrupt_data) {
          warnings.append(nb::make_tuple(nb::handle(warning_category(WarningKind::kGeneral)),
                                         corrupt_jpeg_warning(name)));
        }
        return nb::make_tuple(tensor_to_python(tensor, OutputFramework::kNumpy), warnings);
      },
      nb::arg("data"), nb::arg("mode"), nb::arg("max_pixels"), nb::arg("accept_corrupt_jpeg"),
      nb::arg("exif_orientation"), nb::arg("name"),
      "Decodes image bytes to (an (H, W, C) uint8 array, the (category, message) warnings "
      "naming `name`: over max_pixels, corrupt JPEG data).");

  m.def(
      "image_file_format",
      [](const std::string& path) {
        ImageFormat format;
        {
          nb::gil_scoped_release release;
          format = detect_image_file_format(path);
        }
        return std::string(format == ImageFormat::kUnknown ? "unknown" : image_format_name(format));
      },
      nb::arg("path"),
      "The format of an image file by its first bytes: 'JPEG', 'PNG', 'WebP' or 'unknown'.");

  m.def(
      "sample_uniforms",
      [](uint64_t seed, uint64_t epoch, uint64_t index, size_t count) {
        SampleRandom random(seed, epoch, index);
        std::vector<double> out(count);
        for (double& value : out) value = random.uniform();
        return out;
      },
      nb::arg("seed"), nb::arg("epoch"), nb::arg("index"), nb::arg("count"),
      "The first `count` uniform draws of sample `index` in (seed, epoch), as the image "
      "transforms take them (for checking augmentations against a reference).");
}

}  // namespace leanloader::bindings
