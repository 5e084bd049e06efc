// ImageFormat: which codec an image's bytes need, told by magic bytes (never
// by the file's extension).
#pragma once

#include <cstddef>
#include <span>
#include <string>
#include <string_view>

namespace leanloader {

enum class ImageFormat { kUnknown, kJpeg, kPng, kWebp, kPnm, kTiff, kBmp, kGif };

// The format whose signature starts `bytes`: JPEG FF D8 FF, PNG's 8-byte
// signature, RIFF....WEBP, PBM/PGM/PPM "P1".."P6" (and "Pf", PFM)
// and a whitespace, TIFF "II*\0" / "MM\0*" (BigTIFF "II+\0" / "MM\0+").
// BMP "BM", GIF "GIF87a" / "GIF89a". kUnknown for anything else (including too few bytes).
ImageFormat detect_image_format(std::span<const std::byte> bytes) noexcept;

std::string_view image_format_name(ImageFormat format) noexcept;

// The format of the file at `path`, from its first bytes (a dozen bytes are
// read). Throws IoError when the file cannot be read.
ImageFormat detect_image_file_format(const std::string& path);

}  // namespace leanloader
