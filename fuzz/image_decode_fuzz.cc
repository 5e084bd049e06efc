// libFuzzer target: every image decoder entry (JPEG, PNG, WebP, PBM/PGM/PPM, TIFF, told by magic
// bytes; EXIF orientation) on arbitrary bytes, and the fused transform path
// (region + DCT-scaled decode, resize, flip, normalize). The first two bytes
// choose the options (color mode, EXIF, lenient JPEG, entry) and the decode
// region or the draws; the rest is the file. A FormatError is the only acceptable failure; anything
// else (a crash, a sanitizer report, another exception) is a bug.
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "leanloader/core/error.h"
#include "leanloader/image/image_decoder.h"
#include "leanloader/image/image_transform.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  const uint8_t flags = data[0], region = data[1];
  const std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(data + 2), size - 2);
  leanloader::DecodeOptions options;
  options.mode = static_cast<leanloader::ColorMode>(flags % 3);
  options.exif_orientation = (flags & 4) != 0;
  options.accept_corrupt_jpeg = (flags & 8) != 0;
  options.max_pixels = 1 << 22;  // keeps each run small; the limit path is exercised too
  try {
    const leanloader::ImageInfo info = leanloader::read_image_info(bytes, options);
    leanloader::DecodedImage out;
    if (flags & 32) {
      // Small outputs (17x23) from any image: flips around crops, padding of
      // images under 40x40, shrinking and enlarging.
      leanloader::ImageOutput output;
      output.dtype = leanloader::DType::kF32;
      const leanloader::ImageTransform transform(
          {leanloader::TransformStep::horizontal_flip(),
           leanloader::TransformStep::center_crop(40, 40),
           leanloader::TransformStep::random_resized_crop(17, 23),
           leanloader::TransformStep::horizontal_flip()},
          output, leanloader::color_mode_channels(options.mode));
      leanloader::SampleRandom random(region, 0, flags);
      leanloader::TransformParams params = transform.plan(info.width, info.height, random);
      std::vector<float> pixels(static_cast<size_t>(17 * 23 * transform.channels()));
      transform.run(bytes, info, options, params, (flags & 64) != 0,
                    {reinterpret_cast<std::byte*>(pixels.data()), pixels.size() * sizeof(float)});
      return 0;
    }
    if (flags & 16) {
      out.pixels.resize(static_cast<size_t>(info.width * info.height) *
                        static_cast<size_t>(leanloader::color_mode_channels(options.mode)));
      leanloader::decode_image_into(bytes, info, options, out.pixels);
      return 0;
    }
    // A region inside the image, and a minimum size for DCT scaling.
    leanloader::DecodeRequest request;
    const int64_t x = info.width * (region & 3) / 4, y = info.height * ((region >> 2) & 3) / 4;
    request.region = {x, y, info.width - x, info.height - y};
    request.min_width = (region >> 4) & 1 ? request.region.width / 3 : 0;
    request.min_height = (region >> 4) & 1 ? request.region.height / 5 : 0;
    leanloader::decode_image(bytes, info, options, request, out);
    if (out.width < 1 || out.height < 1 ||
        out.pixels.size() != static_cast<size_t>(out.width * out.height * out.channels)) {
      __builtin_trap();
    }
  } catch (const leanloader::FormatError&) {
  }
  return 0;
}
