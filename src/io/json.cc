#include "io/json.h"

#include <algorithm>
#include <charconv>
#include <system_error>

namespace leanloader::detail {

namespace {

bool is_digit(char c) noexcept { return c >= '0' && c <= '9'; }

// Printable form of a token for messages, bounded in length.
std::string excerpt(std::string_view token) {
  constexpr size_t kMax = 40;
  if (token.size() <= kMax) return std::string(token);
  return std::string(token.substr(0, kMax)) + "...";
}

void append_utf8(std::string& out, uint32_t code_point) {
  if (code_point < 0x80) {
    out.push_back(static_cast<char>(code_point));
  } else if (code_point < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (code_point >> 6)));
    out.push_back(static_cast<char>(0x80 | (code_point & 0x3F)));
  } else if (code_point < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (code_point >> 12)));
    out.push_back(static_cast<char>(0x80 | ((code_point >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (code_point & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (code_point >> 18)));
    out.push_back(static_cast<char>(0x80 | ((code_point >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((code_point >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (code_point & 0x3F)));
  }
}

}  // namespace

std::optional<size_t> find_invalid_utf8(std::string_view text) noexcept {
  const auto* bytes = reinterpret_cast<const unsigned char*>(text.data());
  const size_t size = text.size();
  size_t i = 0;
  while (i < size) {
    const unsigned char lead = bytes[i];
    if (lead < 0x80) {
      ++i;
      continue;
    }
    size_t length = 0;
    // The valid range of the second byte depends on the lead byte; this is
    // what excludes overlong forms, surrogates and code points > U+10FFFF.
    unsigned char low = 0x80;
    unsigned char high = 0xBF;
    if (lead >= 0xC2 && lead <= 0xDF) {
      length = 2;
    } else if (lead >= 0xE0 && lead <= 0xEF) {
      length = 3;
      if (lead == 0xE0) low = 0xA0;
      if (lead == 0xED) high = 0x9F;
    } else if (lead >= 0xF0 && lead <= 0xF4) {
      length = 4;
      if (lead == 0xF0) low = 0x90;
      if (lead == 0xF4) high = 0x8F;
    } else {
      return i;
    }
    if (size - i < length) return i;
    if (bytes[i + 1] < low || bytes[i + 1] > high) return i;
    for (size_t k = 2; k < length; ++k) {
      if (bytes[i + k] < 0x80 || bytes[i + k] > 0xBF) return i;
    }
    i += length;
  }
  return std::nullopt;
}

void JsonReader::fail(const std::string& message) const { fail_at(message, pos_); }

void JsonReader::fail_at(const std::string& message, size_t offset) const {
  throw JsonError(message + " at byte " + std::to_string(offset) + " of the header", offset);
}

void JsonReader::skip_whitespace() noexcept {
  while (pos_ < text_.size()) {
    const char c = text_[pos_];
    if (c != ' ' && c != '\t' && c != '\n' && c != '\r') break;
    ++pos_;
  }
}

JsonReader::Kind JsonReader::peek() {
  skip_whitespace();
  if (pos_ >= text_.size()) fail("unexpected end of JSON, expected a value");
  const char c = text_[pos_];
  switch (c) {
    case '{':
      return Kind::kObject;
    case '[':
      return Kind::kArray;
    case '"':
      return Kind::kString;
    case 't':
      return Kind::kTrue;
    case 'f':
      return Kind::kFalse;
    case 'n':
      return Kind::kNull;
    default:
      if (c == '-' || is_digit(c)) return Kind::kNumber;
  }
  fail("expected a JSON value");
}

void JsonReader::expect(char c, const char* what) {
  skip_whitespace();
  if (pos_ >= text_.size() || text_[pos_] != c) {
    fail(std::string("expected ") + what);
  }
  ++pos_;
}

void JsonReader::push_container() {
  if (static_cast<int>(first_member_.size()) >= max_depth_) {
    fail("JSON nested deeper than " + std::to_string(max_depth_) + " levels");
  }
  first_member_.push_back(true);
}

void JsonReader::begin_object() {
  expect('{', "'{'");
  push_container();
}

bool JsonReader::next_key(std::string& key) {
  skip_whitespace();
  if (pos_ >= text_.size()) fail("unexpected end of JSON inside an object");
  if (text_[pos_] == '}') {
    ++pos_;
    first_member_.pop_back();
    return false;
  }
  if (!first_member_.back()) {
    expect(',', "',' or '}' after an object member");
    skip_whitespace();
    if (pos_ < text_.size() && text_[pos_] == '}') fail("trailing comma in an object");
  }
  first_member_.back() = false;
  skip_whitespace();
  if (pos_ >= text_.size() || text_[pos_] != '"') fail("expected a string as object key");
  key = read_string();
  expect(':', "':' after an object key");
  return true;
}

void JsonReader::begin_array() {
  expect('[', "'['");
  push_container();
}

bool JsonReader::next_element() {
  skip_whitespace();
  if (pos_ >= text_.size()) fail("unexpected end of JSON inside an array");
  if (text_[pos_] == ']') {
    ++pos_;
    first_member_.pop_back();
    return false;
  }
  if (!first_member_.back()) {
    expect(',', "',' or ']' after an array element");
    skip_whitespace();
    if (pos_ < text_.size() && text_[pos_] == ']') fail("trailing comma in an array");
  }
  first_member_.back() = false;
  return true;
}

uint32_t JsonReader::read_hex4() {
  if (text_.size() - pos_ < 4) fail("unexpected end of a \\u escape");
  uint32_t value = 0;
  for (int i = 0; i < 4; ++i) {
    const char c = text_[pos_];
    uint32_t digit = 0;
    if (c >= '0' && c <= '9') {
      digit = static_cast<uint32_t>(c - '0');
    } else if (c >= 'a' && c <= 'f') {
      digit = static_cast<uint32_t>(c - 'a' + 10);
    } else if (c >= 'A' && c <= 'F') {
      digit = static_cast<uint32_t>(c - 'A' + 10);
    } else {
      fail("invalid hex digit in a \\u escape");
    }
    value = value * 16 + digit;
    ++pos_;
  }
  return value;
}

std::string JsonReader::read_string() {
  expect('"', "a string");
  std::string out;
  while (true) {
    if (pos_ >= text_.size()) fail("unterminated string");
    const char c = text_[pos_];
    if (c == '"') {
      ++pos_;
      return out;
    }
    if (static_cast<unsigned char>(c) < 0x20) fail("control character in a string");
    if (c != '\\') {
      out.push_back(c);
      ++pos_;
      continue;
    }
    ++pos_;
    if (pos_ >= text_.size()) fail("unterminated escape in a string");
    const char e = text_[pos_++];
    switch (e) {
      case '"':
        out.push_back('"');
        break;
      case '\\':
        out.push_back('\\');
        break;
      case '/':
        out.push_back('/');
        break;
      case 'b':
        out.push_back('\b');
        break;
      case 'f':
        out.push_back('\f');
        break;
      case 'n':
        out.push_back('\n');
        break;
      case 'r':
        out.push_back('\r');
        break;
      case 't':
        out.push_back('\t');
        break;
      case 'u': {
        const size_t start = pos_ - 2;
        uint32_t code_point = read_hex4();
        if (code_point >= 0xDC00 && code_point <= 0xDFFF) {
          fail_at("lone low surrogate in a \\u escape", start);
        }
        if (code_point >= 0xD800 && code_point <= 0xDBFF) {
          if (text_.size() - pos_ < 2 || text_[pos_] != '\\' || text_[pos_ + 1] != 'u') {
            fail_at("lone high surrogate in a \\u escape", start);
          }
          pos_ += 2;
          const uint32_t low = read_hex4();
          if (low < 0xDC00 || low > 0xDFFF) {
            fail_at("high surrogate not followed by a low surrogate", start);
          }
          code_point = 0x10000 + ((code_point - 0xD800) << 10) + (low - 0xDC00);
        }
        append_utf8(out, code_point);
        break;
      }
      default:
        fail_at("invalid escape in a string", pos_ - 2);
    }
  }
}

std::string_view JsonReader::scan_number(bool& is_integer) {
  skip_whitespace();
  const size_t start = pos_;
  is_integer = true;
  if (pos_ < text_.size() && text_[pos_] == '-') ++pos_;
  if (pos_ >= text_.size() || !is_digit(text_[pos_])) fail_at("invalid number", start);
  if (text_[pos_] == '0') {
    ++pos_;
    if (pos_ < text_.size() && is_digit(text_[pos_]))
      fail_at("invalid number (leading zero)", start);
  } else {
    while (pos_ < text_.size() && is_digit(text_[pos_])) ++pos_;
  }
  if (pos_ < text_.size() && text_[pos_] == '.') {
    is_integer = false;
    ++pos_;
    if (pos_ >= text_.size() || !is_digit(text_[pos_])) fail_at("invalid number", start);
    while (pos_ < text_.size() && is_digit(text_[pos_])) ++pos_;
  }
  if (pos_ < text_.size() && (text_[pos_] == 'e' || text_[pos_] == 'E')) {
    is_integer = false;
    ++pos_;
    if (pos_ < text_.size() && (text_[pos_] == '+' || text_[pos_] == '-')) ++pos_;
    if (pos_ >= text_.size() || !is_digit(text_[pos_])) fail_at("invalid number", start);
    while (pos_ < text_.size() && is_digit(text_[pos_])) ++pos_;
  }
  return text_.substr(start, pos_ - start);
}

uint64_t JsonReader::read_uint64() {
  skip_whitespace();
  const size_t start = pos_;
  if (pos_ >= text_.size() || (text_[pos_] != '-' && !is_digit(text_[pos_]))) {
    fail("expected a non-negative integer");
  }
  bool is_integer = false;
  const std::string_view token = scan_number(is_integer);
  if (token.front() == '-') {
    fail_at("expected a non-negative integer, got " + excerpt(token), start);
  }
  if (!is_integer) fail_at("expected an integer, got " + excerpt(token), start);
  uint64_t value = 0;
  const auto [end, ec] = std::from_chars(token.data(), token.data() + token.size(), value);
  if (ec != std::errc() || end != token.data() + token.size()) {
    fail_at("integer " + excerpt(token) + " does not fit in 64 bits", start);
  }
  return value;
}

void JsonReader::consume_literal(std::string_view literal) {
  if (text_.substr(pos_, literal.size()) != literal) fail("invalid literal");
  pos_ += literal.size();
}

void JsonReader::skip_value() {
  switch (peek()) {
    case Kind::kObject: {
      begin_object();
      std::string key;
      while (next_key(key)) skip_value();
      return;
    }
    case Kind::kArray:
      begin_array();
      while (next_element()) skip_value();
      return;
    case Kind::kString:
      read_string();
      return;
    case Kind::kTrue:
      consume_literal("true");
      return;
    case Kind::kFalse:
      consume_literal("false");
      return;
    case Kind::kNull:
      consume_literal("null");
      return;
    case Kind::kNumber: {
      const size_t start = pos_;
      bool is_integer = false;
      const std::string_view token = scan_number(is_integer);
      // serde_json rejects numbers whose magnitude overflows a double
      // ("number out of range"), even in fields it ignores; underflow to 0
      // is fine. from_chars reports both as out of range, so tell them apart
      // by the decimal exponent of the first significant digit.
      double value = 0;
      const auto [end, ec] = std::from_chars(token.data(), token.data() + token.size(), value);
      (void)end;
      if (ec == std::errc::result_out_of_range) {
        int64_t exponent = 0;  // position of the first significant digit
        size_t i = token.front() == '-' ? 1 : 0;
        int64_t integer_digits = 0;
        bool significant = false;
        while (i < token.size() && is_digit(token[i])) {
          if (token[i] != '0') significant = true;
          if (significant) ++integer_digits;
          ++i;
        }
        exponent = integer_digits;
        if (!significant && i < token.size() && token[i] == '.') {
          ++i;
          while (i < token.size() && token[i] == '0') {
            --exponent;
            ++i;
          }
        }
        while (i < token.size() && token[i] != 'e' && token[i] != 'E') ++i;
        if (i < token.size()) {
          ++i;
          bool negative = false;
          if (token[i] == '+' || token[i] == '-') negative = token[i++] == '-';
          int64_t e = 0;
          for (; i < token.size(); ++i) {
            e = std::min<int64_t>(e * 10 + (token[i] - '0'), int64_t{1} << 40);
          }
          exponent += negative ? -e : e;
        }
        if (exponent > 0) fail_at("number " + excerpt(token) + " out of range", start);
      } else if (ec != std::errc()) {
        fail_at("invalid number", start);
      }
      return;
    }
  }
}

void JsonReader::expect_end() {
  skip_whitespace();
  if (pos_ != text_.size()) fail("trailing characters after the JSON value");
}

void append_json_string(std::string& out, std::string_view value) {
  static constexpr char kHex[] = "0123456789abcdef";
  out.push_back('"');
  for (const char c : value) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      default: {
        const auto byte = static_cast<unsigned char>(c);
        if (byte < 0x20) {
          out += "\\u00";
          out.push_back(kHex[byte >> 4]);
          out.push_back(kHex[byte & 0xF]);
        } else {
          out.push_back(c);
        }
      }
    }
  }
  out.push_back('"');
}

}  // namespace leanloader::detail
