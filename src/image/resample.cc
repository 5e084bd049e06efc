#include "image/resample.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "image/scratch.h"

namespace leanloader::detail {

namespace {

constexpr int kPrecisionBits = 32 - 8 - 2;

// A pass's coefficients: for each output pixel, the first input pixel and
// how many follow, and `taps` fixed-point weights (the unused ones 0).
struct Coefficients {
  int taps = 0;
  std::vector<int64_t> first;
  std::vector<int64_t> count;
  std::vector<int32_t> weights;
};

double triangle(double x) {
  x = std::abs(x);
  return x < 1.0 ? 1.0 - x : 0.0;
}

// precompute_coeffs + normalize_coeffs_8bpc of Resample.c.
Coefficients coefficients(int64_t in_size, float in0, float in1, int64_t out_size) {
  const double scale = static_cast<double>(in1 - in0) / static_cast<double>(out_size);
  const double filter_scale = std::max(scale, 1.0);
  const double support = 1.0 * filter_scale;  // the triangle's support is 1
  Coefficients c;
  c.taps = static_cast<int>(std::ceil(support)) * 2 + 1;
  c.first.resize(static_cast<size_t>(out_size));
  c.count.resize(static_cast<size_t>(out_size));
  c.weights.assign(static_cast<size_t>(out_size) * static_cast<size_t>(c.taps), 0);
  std::vector<double> k(static_cast<size_t>(c.taps));
  for (int64_t xx = 0; xx < out_size; ++xx) {
    const double center = static_cast<double>(in0) + (static_cast<double>(xx) + 0.5) * scale;
    const double ss = 1.0 / filter_scale;
    int64_t xmin = static_cast<int64_t>(center - support + 0.5);
    xmin = std::max<int64_t>(xmin, 0);
    int64_t xmax = static_cast<int64_t>(center + support + 0.5);
    xmax = std::min(xmax, in_size);
    xmax -= xmin;
    xmax = std::clamp<int64_t>(xmax, 0, c.taps);
    double sum = 0.0;
    for (int64_t x = 0; x < xmax; ++x) {
      const double w = triangle((static_cast<double>(x + xmin) - center + 0.5) * ss);
      k[static_cast<size_t>(x)] = w;
      sum += w;
    }
    int32_t* weights = c.weights.data() + static_cast<size_t>(xx) * static_cast<size_t>(c.taps);
    for (int64_t x = 0; x < xmax; ++x) {
      const double w = sum != 0.0 ? k[static_cast<size_t>(x)] / sum : k[static_cast<size_t>(x)];
      const double fixed = w * static_cast<double>(1 << kPrecisionBits);
      weights[x] = static_cast<int32_t>(w < 0 ? -0.5 + fixed : 0.5 + fixed);
    }
    c.first[static_cast<size_t>(xx)] = xmin;
    c.count[static_cast<size_t>(xx)] = xmax;
  }
  return c;
}

inline uint8_t fixed_point_to_u8(int32_t value) {
  return static_cast<uint8_t>(std::clamp(value >> kPrecisionBits, 0, 255));
}

// Pixels of `rows` x `columns` (C bytes each) to columns x rows, in
// blocks that stay in cache.
template <int kChannels>
void transpose_pixels(const uint8_t* in, size_t in_stride, int64_t rows, int64_t columns,
                      uint8_t* out, size_t out_stride) {
  constexpr int64_t kBlock = 16;
  for (int64_t r0 = 0; r0 < rows; r0 += kBlock) {
    const int64_t r1 = std::min(rows, r0 + kBlock);
    for (int64_t c0 = 0; c0 < columns; c0 += kBlock) {
      const int64_t c1 = std::min(columns, c0 + kBlock);
      for (int64_t r = r0; r < r1; ++r) {
        const uint8_t* from = in + static_cast<size_t>(r) * in_stride;
        for (int64_t c = c0; c < c1; ++c) {
          uint8_t* to =
              out + static_cast<size_t>(c) * out_stride + static_cast<size_t>(r) * kChannels;
          for (int k = 0; k < kChannels; ++k) to[k] = from[c * kChannels + k];
        }
      }
    }
  }
}

void transpose(const uint8_t* in, size_t in_stride, int64_t rows, int64_t columns, int channels,
               uint8_t* out, size_t out_stride) {
  switch (channels) {
    case 1:
      return transpose_pixels<1>(in, in_stride, rows, columns, out, out_stride);
    case 2:
      return transpose_pixels<2>(in, in_stride, rows, columns, out, out_stride);
    case 3:
      return transpose_pixels<3>(in, in_stride, rows, columns, out, out_stride);
    default:
      return transpose_pixels<4>(in, in_stride, rows, columns, out, out_stride);
  }
}

// One output row of a vertical pass: `count` input rows from `first` (row
// stride in_stride) weighted by `k` into `target`, through the 32-bit sums
// at `sum`; `values` bytes per row. Every pass spends its time here, so it
// is compiled twice, for AVX2 and for the baseline, and chosen once at run
// time (a plain branch: the ifunc that target_clones makes runs before
// ThreadSanitizer's runtime is up, and crashes it).
[[gnu::always_inline]] inline void vertical_row(const uint8_t* first, size_t in_stride,
                                                int64_t count, const int32_t* k, int32_t* sum,
                                                uint8_t* target, size_t values) {
  for (size_t i = 0; i < values; ++i) sum[i] = int32_t{1} << (kPrecisionBits - 1);
  for (int64_t y = 0; y < count; ++y) {
    const uint8_t* row = first + static_cast<size_t>(y) * in_stride;
    const int32_t weight = k[y];
    for (size_t i = 0; i < values; ++i) sum[i] += int32_t{row[i]} * weight;
  }
  for (size_t i = 0; i < values; ++i) target[i] = fixed_point_to_u8(sum[i]);
}

[[gnu::target("avx2")]] void vertical_row_avx2(const uint8_t* first, size_t in_stride,
                                               int64_t count, const int32_t* k, int32_t* sum,
                                               uint8_t* target, size_t values) {
  vertical_row(first, in_stride, count, k, sum, target, values);
}

void vertical_row_baseline(const uint8_t* first, size_t in_stride, int64_t count, const int32_t* k,
                           int32_t* sum, uint8_t* target, size_t values) {
  vertical_row(first, in_stride, count, k, sum, target, values);
}

using VerticalRow = void (*)(const uint8_t*, size_t, int64_t, const int32_t*, int32_t*, uint8_t*,
                             size_t);

VerticalRow vertical_row_for_this_cpu() {
  static const VerticalRow chosen =
      __builtin_cpu_supports("avx2") ? vertical_row_avx2 : vertical_row_baseline;
  return chosen;
}

// One vertical pass: `columns` pixels of each output row through `down`
// from the rows of `in` (stride in_stride; input row indices are less
// `row_offset`, the first row `in` holds). Row by row over the taps, so that
// the inner loop runs along a row (vectorised); the same sums as Pillow's.
void vertical_pass(const uint8_t* in, size_t in_stride, int64_t row_offset, int64_t columns,
                   const Coefficients& down, int channels, uint8_t* out, size_t out_stride) {
  const VerticalRow row = vertical_row_for_this_cpu();
  const auto height = static_cast<int64_t>(down.first.size());
  const auto values = static_cast<size_t>(columns) * static_cast<size_t>(channels);
  thread_local std::vector<int32_t> sums;
  const ScratchTrim<int32_t, 1> trim({&sums});  // (released after a huge image)
  sums.resize(values);
  for (int64_t yy = 0; yy < height; ++yy) {
    const int64_t ymin = down.first[static_cast<size_t>(yy)] - row_offset;
    row(in + static_cast<size_t>(ymin) * in_stride, in_stride, down.count[static_cast<size_t>(yy)],
        down.weights.data() + static_cast<size_t>(yy) * static_cast<size_t>(down.taps), sums.data(),
        out + static_cast<size_t>(yy) * out_stride, values);
  }
}

// One horizontal pass: `rows` rows of `columns` pixels at `in` (row stride
// in_stride; its first column is input column `column_offset`) through
// `across` into rows of `out` (stride out_stride). Done as the vertical
// pass of the transposed pixels (whose inner loop runs along memory and
// vectorises): the same sums, so the same bytes as Pillow's.
void horizontal_pass(const uint8_t* in, size_t in_stride, int64_t rows, int64_t columns,
                     int64_t column_offset, const Coefficients& across, int channels, uint8_t* out,
                     size_t out_stride) {
  thread_local std::vector<uint8_t> turned, resampled;
  const ScratchTrim<uint8_t, 2> trim({&turned, &resampled});  // (released after a huge image)
  const size_t turned_row = static_cast<size_t>(rows) * static_cast<size_t>(channels);
  const auto width = static_cast<int64_t>(across.first.size());
  resize_scratch(turned, static_cast<size_t>(columns) * turned_row);
  resize_scratch(resampled, static_cast<size_t>(width) * turned_row);
  transpose(in, in_stride, rows, columns, channels, turned.data(), turned_row);
  vertical_pass(turned.data(), turned_row, column_offset, rows, across, channels, resampled.data(),
                turned_row);
  transpose(resampled.data(), turned_row, width, rows, channels, out, out_stride);
}

}  // namespace

void resample_bilinear(const PixelPlane& from, float x0, float y0, float x1, float y1,
                       int64_t width, int64_t height, uint8_t* to, std::vector<uint8_t>& scratch) {
  const int channels = from.channels;
  const size_t out_row = static_cast<size_t>(width) * static_cast<size_t>(channels);
  const bool horizontal = width != from.width || x0 != 0.0f || x1 != static_cast<float>(width);
  const bool vertical = height != from.height || y0 != 0.0f || y1 != static_cast<float>(height);
  if (!horizontal && !vertical) {
    for (int64_t y = 0; y < height; ++y) {
      std::copy_n(from.data + static_cast<size_t>(y) * from.stride, out_row,
                  to + static_cast<size_t>(y) * out_row);
    }
    return;
  }
  const Coefficients across = coefficients(from.width, x0, x1, width);
  const Coefficients down = coefficients(from.height, y0, y1, height);
  if (!vertical) {
    horizontal_pass(from.data, from.stride, height, from.width, 0, across, channels, to, out_row);
    return;
  }
  if (!horizontal) {
    vertical_pass(from.data, from.stride, 0, width, down, channels, to, out_row);
    return;
  }
  // Pillow (13, python-pillow/Pillow#9549) resamples vertically first when
  // the height loses more than twice the pixels the width loses; else
  // horizontally first. The first pass covers only the rows (columns) the
  // second one reads; its 8-bit results are what the second pass reads.
  const double lost_rows = static_cast<double>(y1 - y0) - static_cast<double>(height);
  const double lost_columns = static_cast<double>(x1 - x0) - static_cast<double>(width);
  if (lost_rows > 0 && lost_rows > 2 * lost_columns) {
    const int64_t first = across.first.front();
    const int64_t used = across.first.back() + across.count.back() - first;
    const size_t middle_row = static_cast<size_t>(used) * static_cast<size_t>(channels);
    resize_scratch(scratch, static_cast<size_t>(height) * middle_row);
    vertical_pass(from.data + static_cast<size_t>(first) * channels, from.stride, 0, used, down,
                  channels, scratch.data(), middle_row);
    horizontal_pass(scratch.data(), middle_row, height, used, first, across, channels, to, out_row);
    return;
  }
  const int64_t first = down.first.front();
  const int64_t used = down.first.back() + down.count.back() - first;
  resize_scratch(scratch, static_cast<size_t>(used) * out_row);
  horizontal_pass(from.data + static_cast<size_t>(first) * from.stride, from.stride, used,
                  from.width, 0, across, channels, scratch.data(), out_row);
  vertical_pass(scratch.data(), out_row, first, width, down, channels, to, out_row);
}

}  // namespace leanloader::detail
