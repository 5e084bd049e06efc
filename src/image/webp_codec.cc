// WebP through libwebp: still images through its decoding API (cropped
// while decoding); an animated WebP gives its first frame, composited on
// its canvas by libwebpdemux's WebPAnimDecoder, as Pillow gives it.
#include <webp/decode.h>
#include <webp/demux.h>

#include <memory>
#include <string>
#include <vector>

#include "image/codecs.h"
#include "leanloader/core/error.h"

namespace leanloader::detail {

namespace {

const char* status_name(VP8StatusCode status) {
  switch (status) {
    case VP8_STATUS_OK:
      return "ok";
    case VP8_STATUS_OUT_OF_MEMORY:
      return "out of memory";
    case VP8_STATUS_INVALID_PARAM:
      return "invalid parameter";
    case VP8_STATUS_BITSTREAM_ERROR:
      return "bitstream error";
    case VP8_STATUS_UNSUPPORTED_FEATURE:
      return "unsupported feature (animation?)";
    case VP8_STATUS_SUSPENDED:
      return "suspended";
    case VP8_STATUS_USER_ABORT:
      return "aborted";
    case VP8_STATUS_NOT_ENOUGH_DATA:
      return "not enough data (truncated file)";
  }
  return "unknown error";
}

WebPBitstreamFeatures features_of(std::span<const std::byte> bytes) {
  WebPBitstreamFeatures features{};
  const VP8StatusCode status =
      WebPGetFeatures(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), &features);
  if (status != VP8_STATUS_OK) {
    throw FormatError(std::string("WebP: header: ") + status_name(status));
  }
  return features;
}

// The first frame of an animation on the whole canvas, RGBA (what Pillow's
// WebPImagePlugin reads), cut to `box` and converted to `channels` as
// Pillow's convert() does (alpha dropped; luma from RGB).
void decode_first_frame(std::span<const std::byte> bytes, StoredSize size, const PixelBox& box,
                        int channels, std::span<uint8_t> dst) {
  WebPAnimDecoderOptions options;
  if (!WebPAnimDecoderOptionsInit(&options)) throw Error("WebP: library version mismatch");
  options.color_mode = MODE_RGBA;
  options.use_threads = 0;
  const WebPData data{reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()};
  const std::unique_ptr<WebPAnimDecoder, void (*)(WebPAnimDecoder*)> decoder(
      WebPAnimDecoderNew(&data, &options), WebPAnimDecoderDelete);
  if (!decoder) throw FormatError("WebP: animation: cannot parse the frames (truncated file?)");
  WebPAnimInfo info;
  if (!WebPAnimDecoderGetInfo(decoder.get(), &info)) {
    throw FormatError("WebP: animation: no frame information");
  }
  if (static_cast<int64_t>(info.canvas_width) != size.width ||
      static_cast<int64_t>(info.canvas_height) != size.height) {
    throw FormatError("WebP: the canvas size differs from the header's");
  }
  uint8_t* canvas = nullptr;
  int timestamp = 0;
  if (!WebPAnimDecoderGetNext(decoder.get(), &canvas, &timestamp) || canvas == nullptr) {
    throw FormatError("WebP: animation: the first frame does not decode");
  }
  const auto stride = static_cast<size_t>(size.width) * 4;
  for (int64_t y = 0; y < box.height; ++y) {
    const uint8_t* in =
        canvas + static_cast<size_t>(box.y + y) * stride + static_cast<size_t>(box.x) * 4;
    uint8_t* out = dst.data() + static_cast<size_t>(y) * static_cast<size_t>(box.width) *
                                    static_cast<size_t>(channels);
    for (int64_t x = 0; x < box.width; ++x, in += 4, out += channels) {
      if (channels == 1) {
        out[0] =
            static_cast<uint8_t>((in[0] * 19595 + in[1] * 38470 + in[2] * 7471 + 0x8000) >> 16);
      } else {
        for (int c = 0; c < channels; ++c) out[c] = in[c];
      }
    }
  }
}

}  // namespace

StoredSize webp_size(std::span<const std::byte> bytes) {
  const WebPBitstreamFeatures features = features_of(bytes);
  return {features.width, features.height};  // (an animation's canvas)
}

void webp_decode(std::span<const std::byte> bytes, const DecodeOptions& options, StoredSize size,
                 const PixelBox& box, std::span<uint8_t> dst) {
  const int channels = color_mode_channels(options.mode);
  const size_t pixels = static_cast<size_t>(box.width) * static_cast<size_t>(box.height);
  if (dst.size() != pixels * static_cast<size_t>(channels)) {
    throw InvalidArgument("WebP: destination has the wrong size");
  }
  if (features_of(bytes).has_animation) {
    decode_first_frame(bytes, size, box, channels, dst);
    return;
  }
  WebPDecoderConfig config;
  if (!WebPInitDecoderConfig(&config)) throw Error("WebP: library version mismatch");
  std::vector<uint8_t> rgb;
  uint8_t* out = dst.data();
  if (channels == 1) {
    rgb.resize(pixels * 3);
    out = rgb.data();
  }
  // libwebp crops while decoding (exact for RGB output: only YUV output
  // rounds the offsets to even).
  if (box.x != 0 || box.y != 0 || box.width != size.width || box.height != size.height) {
    config.options.use_cropping = 1;
    config.options.crop_left = static_cast<int>(box.x);
    config.options.crop_top = static_cast<int>(box.y);
    config.options.crop_width = static_cast<int>(box.width);
    config.options.crop_height = static_cast<int>(box.height);
  }
  config.output.colorspace = channels == 4 ? MODE_RGBA : MODE_RGB;
  config.output.is_external_memory = 1;
  config.output.u.RGBA.rgba = out;
  config.output.u.RGBA.stride = static_cast<int>(box.width) * (channels == 4 ? 4 : 3);
  config.output.u.RGBA.size = pixels * (channels == 4 ? 4 : 3);
  const VP8StatusCode status =
      WebPDecode(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), &config);
  WebPFreeDecBuffer(&config.output);
  if (status != VP8_STATUS_OK) {
    throw FormatError(std::string("WebP: decoding: ") + status_name(status));
  }
  if (config.input.width != size.width || config.input.height != size.height) {
    throw FormatError("WebP: the frame size differs from the header's");
  }
  if (channels == 1) {
    rgb_to_gray_in_place(rgb.data(), pixels);
    std::copy(rgb.begin(), rgb.begin() + static_cast<std::ptrdiff_t>(pixels), dst.begin());
  }
}

}  // namespace leanloader::detail
