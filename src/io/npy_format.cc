#include "leanloader/io/npy_format.h"

#include <cctype>
#include <cstring>
#include <limits>
#include <string_view>

#include "leanloader/core/error.h"

namespace leanloader {

namespace {

// A parser for the one Python literal NumPy writes:
//   {'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), }
// Keys may come in any order; nothing else is accepted.
class HeaderDictParser {
 public:
  HeaderDictParser(std::string_view text, const std::string& path) : text_(text), path_(path) {}

  NpyHeader parse() {
    NpyHeader header;
    bool has_descr = false, has_order = false, has_shape = false;
    expect('{');
    while (true) {
      skip_space();
      if (peek() == '}') {
        ++pos_;
        break;
      }
      const std::string key = parse_string();
      expect(':');
      if (key == "descr") {
        if (has_descr) fail("duplicate key 'descr'");
        // A structured dtype's descr is a list of (name, dtype) fields.
        skip_space();
        if (peek() == '[') {
          throw FormatError("'" + path_ +
                            "': a structured dtype (a list of named fields) is not a tensor "
                            "dtype; save each field as an array of its own "
                            "(np.save(path, array['name']))");
        }
        header.dtype = parse_descr(parse_string());
        has_descr = true;
      } else if (key == "fortran_order") {
        if (has_order) fail("duplicate key 'fortran_order'");
        header.fortran_order = parse_bool();
        has_order = true;
      } else if (key == "shape") {
        if (has_shape) fail("duplicate key 'shape'");
        header.shape = parse_shape();
        has_shape = true;
      } else {
        fail("unexpected key '" + key + "'");
      }
      skip_space();
      if (peek() == ',') {
        ++pos_;
      } else if (peek() != '}') {
        fail("expected ',' or '}' after a value");
      }
    }
    if (!has_descr || !has_order || !has_shape) {
      fail("the header must give 'descr', 'fortran_order' and 'shape'");
    }
    skip_space();
    if (pos_ != text_.size()) fail("unexpected text after the header dict");
    return header;
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    throw FormatError("'" + path_ + "': not a valid .npy header: " + what);
  }
  // A valid header describing data leanloader does not read.
  [[noreturn]] void unsupported(const std::string& what) const {
    throw FormatError("'" + path_ + "': " + what);
  }
  [[noreturn]] void unsupported_descr(const std::string& descr) const {
    unsupported("dtype '" + descr +
                "' is not one leanloader reads: it reads the codes np.save writes for "
                "bool, integers, float16/32/64 and complex64/128 ('<f4', '|u1', '<c16', ...)");
  }

  char peek() const { return pos_ < text_.size() ? text_[pos_] : '\0'; }

  void skip_space() {
    while (pos_ < text_.size() && (text_[pos_] == ' ' || text_[pos_] == '\n' ||
                                   text_[pos_] == '\t' || text_[pos_] == '\r')) {
      ++pos_;
    }
  }

  void expect(char c) {
    skip_space();
    if (peek() != c) fail(std::string("expected '") + c + "'");
    ++pos_;
  }

  std::string parse_string() {
    skip_space();
    const char quote = peek();
    if (quote != '\'' && quote != '"') fail("expected a quoted string");
    ++pos_;
    const size_t start = pos_;
    while (pos_ < text_.size() && text_[pos_] != quote) {
      if (text_[pos_] == '\\') fail("escapes are not expected in a .npy header");
      ++pos_;
    }
    if (pos_ >= text_.size()) fail("unterminated string");
    return std::string(text_.substr(start, pos_++ - start));
  }

  bool parse_bool() {
    skip_space();
    if (text_.substr(pos_, 4) == "True") {
      pos_ += 4;
      return true;
    }
    if (text_.substr(pos_, 5) == "False") {
      pos_ += 5;
      return false;
    }
    fail("'fortran_order' must be True or False");
  }

  Shape parse_shape() {
    expect('(');
    Shape shape;
    bool comma_after_last = false;
    while (true) {
      skip_space();
      if (peek() == ')') {
        // Python's "(6)" is the number 6, not a tuple: numpy refuses it
        // ("shape is not valid"); a one-element tuple is "(6,)".
        if (shape.size() == 1 && !comma_after_last) fail("a one-dimension shape is '(n,)'");
        ++pos_;
        return shape;
      }
      if (!std::isdigit(static_cast<unsigned char>(peek())))
        fail("a shape holds non-negative integers");
      int64_t dim = 0;
      while (std::isdigit(static_cast<unsigned char>(peek()))) {
        const int digit = peek() - '0';
        if (dim > (std::numeric_limits<int64_t>::max() - digit) / 10) fail("a dimension overflows");
        dim = dim * 10 + digit;
        ++pos_;
      }
      if (peek() == 'L') ++pos_;  // Python 2 long literals
      shape.push_back(dim);
      if (shape.size() > 32) fail("more than 32 dimensions");
      skip_space();
      comma_after_last = peek() == ',';
      if (comma_after_last) {
        ++pos_;
      } else if (peek() != ')') {
        fail("expected ',' or ')' in the shape");
      }
    }
  }

  DType parse_descr(const std::string& descr) const {
    if (descr.size() < 3) unsupported_descr(descr);
    const char order = descr[0];
    const std::string_view code = std::string_view(descr).substr(1);
    if (order == '>' && code != "u1" && code != "i1" && code != "b1") {
      unsupported("big-endian dtype '" + descr +
                  "' is not supported; convert with arr.astype(arr.dtype.newbyteorder('<'))");
    }
    if (order != '<' && order != '|' && order != '=' && order != '>') unsupported_descr(descr);
    struct Entry {
      std::string_view code;
      DType dtype;
    };
    static constexpr Entry kCodes[] = {
        {"b1", DType::kBool}, {"u1", DType::kU8},    {"i1", DType::kI8},  {"u2", DType::kU16},
        {"i2", DType::kI16},  {"u4", DType::kU32},   {"i4", DType::kI32}, {"u8", DType::kU64},
        {"i8", DType::kI64},  {"f2", DType::kF16},   {"f4", DType::kF32}, {"f8", DType::kF64},
        {"c8", DType::kC64},  {"c16", DType::kC128},
    };
    for (const auto& entry : kCodes) {
      if (entry.code == code) return entry.dtype;
    }
    unsupported_descr(descr);
  }

  std::string_view text_;
  const std::string& path_;
  size_t pos_ = 0;
};

uint32_t read_le(const std::byte* p, size_t n) {
  uint32_t value = 0;
  for (size_t i = 0; i < n; ++i) value |= static_cast<uint32_t>(p[i]) << (8 * i);
  return value;
}

}  // namespace

NpyHeader parse_npy_header(std::span<const std::byte> bytes, const std::string& path) {
  static constexpr unsigned char kMagic[] = {0x93, 'N', 'U', 'M', 'P', 'Y'};
  if (bytes.size() < 10 || std::memcmp(bytes.data(), kMagic, sizeof(kMagic)) != 0) {
    throw FormatError("'" + path + "': not a .npy file (missing the \\x93NUMPY magic)");
  }
  const auto major = static_cast<unsigned>(bytes[6]);
  size_t length_bytes = 0;
  if (major == 1) {
    length_bytes = 2;
  } else if (major == 2 || major == 3) {
    length_bytes = 4;
  } else {
    throw FormatError("'" + path + "': unsupported .npy version " + std::to_string(major));
  }
  if (bytes.size() < 8 + length_bytes) throw FormatError("'" + path + "': truncated .npy header");
  const size_t header_length = read_le(bytes.data() + 8, length_bytes);
  const size_t data_offset = 8 + length_bytes + header_length;
  if (header_length > kNpyMaxHeaderBytes) {
    // numpy refuses headers over 10,000 bytes unless np.load is given
    // max_header_size=; ours reads up to 64 KiB.
    throw FormatError("'" + path + "': .npy header of " + std::to_string(header_length) +
                      " bytes is longer than the 64 KiB leanloader reads (np.load reads it "
                      "only with max_header_size=); save the array again with np.save");
  }
  if (bytes.size() < data_offset) {
    throw FormatError("'" + path + "': .npy header of " + std::to_string(header_length) +
                      " bytes runs past the end of the file");
  }
  const std::string_view text(reinterpret_cast<const char*>(bytes.data()) + 8 + length_bytes,
                              header_length);
  NpyHeader header = HeaderDictParser(text, path).parse();
  header.data_offset = data_offset;
  return header;
}

}  // namespace leanloader
