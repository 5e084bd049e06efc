// JPEG through libjpeg-turbo's libjpeg API (Debian 12 ships libjpeg-turbo
// 2.1.5, whose TurboJPEG API has no cropping: tj3SetCroppingRegion arrived in
// 3.0). The libjpeg API gives what partial decoding needs: DCT scaling
// (scale_num/8), jpeg_crop_scanline (columns, widened to iMCU boundaries)
// and jpeg_skip_scanlines (rows above the region are skipped without
// color conversion or upsampling; rows below are never read).
//
// libjpeg reports errors through a callback that must not return; it
// longjmps back to jpeg_decode, which then throws. No C++ object is created
// between setjmp and the calls that may longjmp, so no destructor is skipped.
#include <csetjmp>
#include <cstdio>
// jpeglib.h needs size_t and FILE declared first.
#include <jerror.h>
#include <jpeglib.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <utility>

#include "image/codecs.h"
#include "image/pillow_pixels.h"
#include "image/scratch.h"
#include "leanloader/core/checked_size.h"
#include "leanloader/core/error.h"

namespace leanloader::detail {

namespace {

struct JpegErrors {
  jpeg_error_mgr manager;
  std::jmp_buf jump;
  bool strict = true;
  bool corrupt_data = false;  // stopped at a warning libjpeg could work around
  char message[JMSG_LENGTH_MAX] = {};
};

[[noreturn]] void on_error(j_common_ptr cinfo) {
  auto* errors = reinterpret_cast<JpegErrors*>(cinfo->err);
  (*cinfo->err->format_message)(cinfo, errors->message);
  std::longjmp(errors->jump, 1);
}

// level < 0: a warning (corrupt data libjpeg can work around); >= 0: traces.
// A file that ends early is an error in both modes, as in Pillow ("image
// file is truncated").
void on_message(j_common_ptr cinfo, int level) {
  auto* errors = reinterpret_cast<JpegErrors*>(cinfo->err);
  if (level >= 0) return;
  if (errors->strict || cinfo->err->msg_code == JWRN_JPEG_EOF) {
    (*cinfo->err->format_message)(cinfo, errors->message);
    errors->corrupt_data = cinfo->err->msg_code != JWRN_JPEG_EOF;
    std::longjmp(errors->jump, 1);
  }
  ++cinfo->err->num_warnings;
}

// Pixels decoded beyond each side of a region (see jpeg_crop_scanline).
constexpr int64_t kCropMargin = 4;

// Converts `count` pixels of `in` (`in_channels` per pixel: 1 gray, 3 RGB, 4
// CMYK; never RGBA, which is only copied) to `out_channels` per pixel as Pillow's convert() does.
void convert_pixels(const uint8_t* in, int in_channels, bool inverted_cmyk, uint8_t* out,
                    int out_channels, size_t count) {
  for (size_t i = 0; i < count; ++i, in += in_channels, out += out_channels) {
    Rgb rgb{in[0], in[0], in[0]};
    if (in_channels == 4) {
      int c = in[0], m = in[1], y = in[2], k = in[3];
      if (inverted_cmyk) c = 255 - c, m = 255 - m, y = 255 - y, k = 255 - k;
      rgb = pillow_cmyk_to_rgb(c, m, y, k);
    } else if (in_channels == 3) {
      rgb = {in[0], in[1], in[2]};
    }
    put_pixel(out, out_channels, rgb.r, rgb.g, rgb.b);
  }
}

[[noreturn]] void throw_jpeg(const JpegErrors& errors) {
  std::string message = std::string("JPEG: ") + errors.message;
  if (errors.corrupt_data) {
    message +=
        " (corrupt data that libjpeg, and Pillow, decode with a warning; "
        "accept_corrupt_jpeg=True, the default, decodes it)";
  }
  throw FormatError(message);
}

}  // namespace

StoredSize jpeg_size(std::span<const std::byte> bytes) {
  jpeg_decompress_struct cinfo;
  JpegErrors errors;
  cinfo.err = jpeg_std_error(&errors.manager);
  errors.manager.error_exit = on_error;
  errors.manager.emit_message = on_message;
  errors.strict = false;  // the header only: data warnings come with the pixels
  if (setjmp(errors.jump)) {
    jpeg_destroy_decompress(&cinfo);
    throw_jpeg(errors);
  }
  jpeg_create_decompress(&cinfo);
  jpeg_mem_src(&cinfo, reinterpret_cast<const unsigned char*>(bytes.data()),
               static_cast<unsigned long>(bytes.size()));
  jpeg_read_header(&cinfo, TRUE);
  const StoredSize size{cinfo.image_width, cinfo.image_height};
  jpeg_destroy_decompress(&cinfo);
  return size;
}

// The DCT sizes libjpeg chose for a component at the scale set in `cinfo`
// (after jpeg_calc_output_dimensions).
std::pair<int64_t, int64_t> scaled_dct_size(const jpeg_component_info& component) {
#if JPEG_LIB_VERSION >= 70
  return {component.DCT_h_scaled_size, component.DCT_v_scaled_size};
#else
  return {component.DCT_scaled_size, component.DCT_scaled_size};
#endif
}

// Whether every component, decoded at the scale set in `cinfo`, still has
// the detail the target needs. libjpeg decodes a subsampled component at a
// larger DCT size, instead of upsampling it, only where the factors allow it
// in both directions (4:2:0 yes; 4:2:2, 4:4:0, 4:1:1 no). Elsewhere the
// plane at a small scale had fewer columns than the output and its
// upsampling at that scale blurred the rest: chroma 24-34 dB off Pillow's
// full decode and resize where luma was 49 dB. A component libjpeg upsamples
// must keep twice the target's columns (rows), or all it has at full size;
// one it does not, the target's, as luma.
bool components_keep_resolution(const jpeg_decompress_struct& cinfo, const PixelBox& box,
                                int64_t min_width, int64_t min_height) {
  int64_t output_h = 0, output_v = 0;  // the full output's units: max over components
  for (int c = 0; c < cinfo.num_components; ++c) {
    const auto [h_size, v_size] = scaled_dct_size(cinfo.comp_info[c]);
    output_h = std::max<int64_t>(output_h, cinfo.comp_info[c].h_samp_factor * h_size);
    output_v = std::max<int64_t>(output_v, cinfo.comp_info[c].v_samp_factor * v_size);
  }
  for (int c = 0; c < cinfo.num_components; ++c) {
    const jpeg_component_info& component = cinfo.comp_info[c];
    const auto [h_size, v_size] = scaled_dct_size(component);
    const int64_t h = component.h_samp_factor, v = component.v_samp_factor;
    // Columns (rows) of the box this component has at this scale, and at
    // full size, both x max_samp_factor x 8: exact integers.
    const int64_t columns = box.width * h * h_size, full_columns = box.width * h * 8;
    const int64_t rows = box.height * v * v_size, full_rows = box.height * v * 8;
    const int64_t wanted_columns =
        min_width * cinfo.max_h_samp_factor * 8 * (h * h_size < output_h ? 2 : 1);
    const int64_t wanted_rows =
        min_height * cinfo.max_v_samp_factor * 8 * (v * v_size < output_v ? 2 : 1);
    if (columns < std::min(wanted_columns, full_columns) ||
        rows < std::min(wanted_rows, full_rows)) {
      return false;
    }
  }
  return true;
}

void jpeg_decode(std::span<const std::byte> bytes, const DecodeOptions& options,
                 const PixelBox& box, int64_t min_width, int64_t min_height, DecodedImage& out,
                 std::span<uint8_t> dst) {
  const int channels = color_mode_channels(options.mode);
  out.corrupt_data = false;
  std::vector<uint8_t> row;  // one scanline when it needs converting or cutting
  jpeg_decompress_struct cinfo;
  JpegErrors errors;
  cinfo.err = jpeg_std_error(&errors.manager);
  errors.manager.error_exit = on_error;
  errors.manager.emit_message = on_message;
  errors.strict = !options.accept_corrupt_jpeg;
  if (setjmp(errors.jump)) {
    jpeg_destroy_decompress(&cinfo);
    throw_jpeg(errors);
  }
  jpeg_create_decompress(&cinfo);
  jpeg_mem_src(&cinfo, reinterpret_cast<const unsigned char*>(bytes.data()),
               static_cast<unsigned long>(bytes.size()));
  jpeg_read_header(&cinfo, TRUE);

  const bool cmyk = cinfo.jpeg_color_space == JCS_CMYK || cinfo.jpeg_color_space == JCS_YCCK;
  const bool gray_source = cinfo.jpeg_color_space == JCS_GRAYSCALE;
  // Pillow reads every CMYK JPEG as inverted ("CMYK;I", "assume adobe
  // conventions"), with an Adobe marker or without.
  const bool inverted_cmyk = cmyk;
  if (cmyk) {
    cinfo.out_color_space = JCS_CMYK;
  } else if (channels == 1) {
    cinfo.out_color_space = gray_source ? JCS_GRAYSCALE : JCS_RGB;
  } else {
    cinfo.out_color_space = channels == 4 ? JCS_EXT_RGBA : JCS_RGB;
  }

  int scale = 8;  // numerator over 8
  if (dst.empty() && (min_width > 0 || min_height > 0)) {
    for (int n = 1; n < 8; ++n) {
      if (box.width * n < min_width * 8 || box.height * n < min_height * 8) continue;
      cinfo.scale_num = static_cast<unsigned>(n);
      cinfo.scale_denom = 8;
      jpeg_calc_output_dimensions(&cinfo);
      if (components_keep_resolution(cinfo, box, min_width, min_height)) {
        scale = n;
        break;
      }
    }
  }
  cinfo.scale_num = static_cast<unsigned>(scale);
  cinfo.scale_denom = 8;
  jpeg_start_decompress(&cinfo);

  const auto scaled_width = static_cast<int64_t>(cinfo.output_width);
  const auto scaled_height = static_cast<int64_t>(cinfo.output_height);
  const int components = cinfo.output_components;
  // The box at this scale, widened to whole pixels.
  const int64_t x0 = std::min(box.x * scale / 8, scaled_width - 1);
  const int64_t y0 = std::min(box.y * scale / 8, scaled_height - 1);
  const int64_t x1 =
      std::clamp<int64_t>(((box.x + box.width) * scale + 7) / 8, x0 + 1, scaled_width);
  const int64_t y1 =
      std::clamp<int64_t>(((box.y + box.height) * scale + 7) / 8, y0 + 1, scaled_height);
  const int64_t width = x1 - x0, height = y1 - y0;

  // Columns at the edge of a cropped scanline are upsampled as if they were
  // the image's edge; a margin keeps the region's own columns exact.
  const int64_t margin_x0 = std::max<int64_t>(0, x0 - kCropMargin);
  const int64_t margin_x1 = std::min(scaled_width, x1 + kCropMargin);
  JDIMENSION crop_x = static_cast<JDIMENSION>(margin_x0);
  JDIMENSION crop_width = static_cast<JDIMENSION>(margin_x1 - margin_x0);
  if (margin_x1 - margin_x0 < scaled_width) jpeg_crop_scanline(&cinfo, &crop_x, &crop_width);
  if (y0 > 0) jpeg_skip_scanlines(&cinfo, static_cast<JDIMENSION>(y0));

  const size_t out_row = static_cast<size_t>(width) * static_cast<size_t>(channels);
  uint8_t* target = nullptr;
  if (!dst.empty()) {
    if (dst.size() != out_row * static_cast<size_t>(height)) {
      jpeg_destroy_decompress(&cinfo);
      throw InvalidArgument("JPEG: destination has the wrong size");
    }
    target = dst.data();
  } else {
    try {
      resize_scratch(out.pixels, out_row * static_cast<size_t>(height));
    } catch (...) {
      jpeg_destroy_decompress(&cinfo);
      throw;
    }
    target = out.pixels.data();
  }
  const bool direct = components == channels && !cmyk && static_cast<int64_t>(crop_x) == x0 &&
                      static_cast<int64_t>(crop_width) == width;
  if (!direct) {
    try {
      row.resize(static_cast<size_t>(crop_width) * static_cast<size_t>(components));
    } catch (...) {
      jpeg_destroy_decompress(&cinfo);
      throw;
    }
  }
  const size_t skip = static_cast<size_t>(x0 - crop_x) * static_cast<size_t>(components);
  for (int64_t y = 0; y < height; ++y) {
    uint8_t* line = target + static_cast<size_t>(y) * out_row;
    JSAMPROW rows[1] = {direct ? line : row.data()};
    if (jpeg_read_scanlines(&cinfo, rows, 1) != 1) {
      std::strcpy(errors.message, "no scanline read (truncated data)");
      jpeg_destroy_decompress(&cinfo);
      throw_jpeg(errors);
    }
    if (direct) continue;
    if (components == channels && !cmyk) {
      // A region cut out of the scanline (RGB, RGBA or gray as asked): a copy.
      // (convert_pixels reads 4 components as CMYK, and costs ~15% of a
      // region decode's time per pixel.)
      std::memcpy(line, row.data() + skip, out_row);
    } else {
      convert_pixels(row.data() + skip, components, inverted_cmyk, line, channels,
                     static_cast<size_t>(width));
    }
  }
  // The rows below the region are read too, entropy-decoded only (no IDCT,
  // upsampling or colour conversion: jpeg_skip_scanlines, short of the end,
  // where it would stop reading), then the last row and the end marker:
  // whether a file decodes, and the corrupt data it holds, are the whole
  // file's, as in Pillow's full decode, whatever region a random crop asks
  // for. (A progressive file is read whole by jpeg_start_decompress.)
  if (y1 < scaled_height) {
    const auto below = static_cast<JDIMENSION>(scaled_height - y1);
    if (below > 1) jpeg_skip_scanlines(&cinfo, below - 1);
    if (cinfo.output_scanline < cinfo.output_height) {
      if (row.empty()) {
        try {
          row.resize(static_cast<size_t>(crop_width) * static_cast<size_t>(components));
        } catch (...) {
          jpeg_destroy_decompress(&cinfo);
          throw;
        }
      }
      JSAMPROW rows[1] = {row.data()};
      if (jpeg_read_scanlines(&cinfo, rows, 1) != 1) {
        std::strcpy(errors.message, "no scanline read (truncated data)");
        jpeg_destroy_decompress(&cinfo);
        throw_jpeg(errors);
      }
    }
  }
  jpeg_finish_decompress(&cinfo);
  out.corrupt_data = cinfo.err->num_warnings > 0;
  jpeg_destroy_decompress(&cinfo);
  out.width = width;
  out.height = height;
  out.channels = channels;
  out.scale = scale / 8.0;
  // The exact box at this scale, relative to the whole pixels decoded.
  out.region_x = static_cast<double>(box.x) * out.scale - static_cast<double>(x0);
  out.region_y = static_cast<double>(box.y) * out.scale - static_cast<double>(y0);
  out.region_width = static_cast<double>(box.width) * out.scale;
  out.region_height = static_cast<double>(box.height) * out.scale;
}

}  // namespace leanloader::detail
