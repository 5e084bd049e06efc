// Strict JSON (RFC 8259) reading and writing helpers for the headers of
// untrusted files (safetensors).
//
// The reader is a pull parser over a UTF-8 text: the caller walks the
// structure it expects and skips the rest. It accepts exactly the grammar of
// RFC 8259 (no comments, no trailing commas, no NaN, no leading '+' or zeros),
// rejects lone UTF-16 surrogates in escapes and raw control characters in
// strings, and bounds nesting so that hostile input cannot exhaust the stack.
// These are the same rules serde_json applies for the reference safetensors
// reader, so a header we accept is one the reference accepts too.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace leanloader::detail {

// A syntax or type error in a JSON text. `offset` is the byte offset in the
// text where it was found.
class JsonError : public std::runtime_error {
 public:
  JsonError(const std::string& message, size_t offset)
      : std::runtime_error(message), offset_(offset) {}
  size_t offset() const noexcept { return offset_; }

 private:
  size_t offset_;
};

// Byte offset of the first byte that is not part of a well-formed UTF-8
// sequence (RFC 3629: no overlong forms, no surrogates, nothing above
// U+10FFFF), or nullopt when `text` is valid UTF-8.
std::optional<size_t> find_invalid_utf8(std::string_view text) noexcept;

// The same nesting limit serde_json applies (its recursion limit).
inline constexpr int kJsonMaxDepth = 128;

// Pull parser. Contract: `text` is valid UTF-8 (see find_invalid_utf8) and
// outlives the reader. Every method throws JsonError on bad input and leaves
// the reader unusable afterwards. Recursion is bounded by `max_depth`.
class JsonReader {
 public:
  enum class Kind { kObject, kArray, kString, kNumber, kTrue, kFalse, kNull };

  explicit JsonReader(std::string_view text, int max_depth = kJsonMaxDepth)
      : text_(text), max_depth_(max_depth) {}

  // The kind of the next value (after whitespace), from its first byte.
  Kind peek();

  // Consumes '{'. Then call next_key() until it returns false.
  void begin_object();
  // Reads the next member name of the innermost open object into `key` and
  // consumes the ':' after it; returns false after consuming the closing '}'.
  bool next_key(std::string& key);

  // Consumes '['. Then call next_element() until it returns false.
  void begin_array();
  // True when another element of the innermost open array follows (a value
  // must then be read); false after consuming the closing ']'.
  bool next_element();

  std::string read_string();
  // A JSON number that is a non-negative integer fitting in 64 bits: no sign,
  // fraction or exponent (serde's rule for usize).
  uint64_t read_uint64();
  // Consumes one value of any kind, validating it.
  void skip_value();
  // Checks that only whitespace remains.
  void expect_end();

  size_t offset() const noexcept { return pos_; }
  [[noreturn]] void fail(const std::string& message) const;
  [[noreturn]] void fail_at(const std::string& message, size_t offset) const;

 private:
  void skip_whitespace() noexcept;
  void expect(char c, const char* what);
  void consume_literal(std::string_view literal);
  void push_container();
  // Scans a number token; returns it and whether it has a fraction/exponent.
  std::string_view scan_number(bool& is_integer);
  uint32_t read_hex4();

  std::string_view text_;
  size_t pos_ = 0;
  int max_depth_;
  // One entry per open container: true until its first member was read.
  std::vector<bool> first_member_;
};

// Appends `value` as a JSON string literal, escaped exactly like serde_json
// (the reference writer): '"', '\\', \b \f \n \r \t, other bytes below 0x20
// as \u00XX with lowercase hex, everything else (0x7f, non-ASCII) verbatim.
void append_json_string(std::string& out, std::string_view value);

}  // namespace leanloader::detail
