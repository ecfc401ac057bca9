// io/json.hpp: a small JSON reader for file headers (safetensors): objects, arrays, strings with
// escapes (\uXXXX to UTF-8, surrogate pairs), numbers, true/false/null. Errors are
// fusebox::invalid_argument naming the byte offset and what was expected. Nesting is limited (64)
// so a hostile header cannot exhaust the stack. Objects keep their members in file order.
// Depends on: core/errors.hpp.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "fusebox/core/errors.hpp"

namespace fusebox::io {

struct json {
  enum class kind { null, boolean, number, string, array, object };
  kind type = kind::null;
  bool b = false;
  double number = 0;
  std::string text;         // the string, or a number's spelling (integers stay exact)
  std::vector<json> items;  // array elements
  std::vector<std::pair<std::string, json>> members;

  const json* find(std::string_view key) const {
    for (const auto& [k, v] : members)
      if (k == key) return &v;
    return nullptr;
  }
  /// A non-negative integer written without fraction or exponent, exactly (uint64).
  bool as_index(std::uint64_t& out) const {
    if (type != kind::number || text.empty() || text[0] == '-') return false;
    std::uint64_t v = 0;
    for (char c : text) {
      if (c < '0' || c > '9') return false;
      if (v > (UINT64_MAX - static_cast<unsigned>(c - '0')) / 10) return false;
      v = v * 10 + static_cast<unsigned>(c - '0');
    }
    out = v;
    return true;
  }
};

namespace detail {

class json_parser {
 public:
  json_parser(std::string_view s, std::string what) : s_(s), what_(std::move(what)) {}

  json parse_document() {
    json v = value(0);
    skip_ws();
    if (pos_ != s_.size()) fail("trailing characters after the JSON value");
    return v;
  }

 private:
  [[noreturn]] void fail(const std::string& why) const {
    FUSEBOX_THROW(invalid_argument(what_ + ": malformed JSON at byte " + std::to_string(pos_) + ": " + why));
  }
  void skip_ws() {
    while (pos_ < s_.size() && (s_[pos_] == ' ' || s_[pos_] == '\t' || s_[pos_] == '\n' || s_[pos_] == '\r')) ++pos_;
  }
  char peek() {
    skip_ws();
    if (pos_ >= s_.size()) fail("unexpected end");
    return s_[pos_];
  }
  void expect(char c) {
    if (peek() != c) fail(std::string("expected '") + c + "'");
    ++pos_;
  }
  json value(int depth) {
    if (depth > 64) fail("nested deeper than 64 levels");
    const char c = peek();
    json v;
    if (c == '{') {
      v.type = json::kind::object;
      ++pos_;
      if (peek() == '}') {
        ++pos_;
        return v;
      }
      for (;;) {
        if (peek() != '"') fail("expected a member name");
        std::string key = string();
        expect(':');
        v.members.emplace_back(std::move(key), value(depth + 1));
        if (peek() == ',') {
          ++pos_;
          continue;
        }
        expect('}');
        return v;
      }
    }
    if (c == '[') {
      v.type = json::kind::array;
      ++pos_;
      if (peek() == ']') {
        ++pos_;
        return v;
      }
      for (;;) {
        v.items.push_back(value(depth + 1));
        if (peek() == ',') {
          ++pos_;
          continue;
        }
        expect(']');
        return v;
      }
    }
    if (c == '"') {
      v.type = json::kind::string;
      v.text = string();
      return v;
    }
    if (literal("true")) return v.type = json::kind::boolean, v.b = true, v;
    if (literal("false")) return v.type = json::kind::boolean, v;
    if (literal("null")) return v;
    if (c == '-' || (c >= '0' && c <= '9')) return number();
    fail(std::string("unexpected character '") + c + "'");
  }
  bool literal(std::string_view w) {
    if (s_.substr(pos_, w.size()) != w) return false;
    pos_ += w.size();
    return true;
  }
  json number() {
    const std::size_t start = pos_;
    if (s_[pos_] == '-') ++pos_;
    auto digits = [&] {
      const std::size_t d = pos_;
      while (pos_ < s_.size() && s_[pos_] >= '0' && s_[pos_] <= '9') ++pos_;
      if (pos_ == d) fail("expected a digit");
    };
    digits();
    if (pos_ < s_.size() && s_[pos_] == '.') ++pos_, digits();
    if (pos_ < s_.size() && (s_[pos_] == 'e' || s_[pos_] == 'E')) {
      ++pos_;
      if (pos_ < s_.size() && (s_[pos_] == '+' || s_[pos_] == '-')) ++pos_;
      digits();
    }
    json v;
    v.type = json::kind::number;
    v.text = std::string(s_.substr(start, pos_ - start));
    v.number = std::stod(v.text);
    return v;
  }
  unsigned hex4() {
    if (pos_ + 4 > s_.size()) fail("short \\u escape");
    unsigned u = 0;
    for (int i = 0; i < 4; ++i) {
      const char h = s_[pos_++];
      u <<= 4;
      if (h >= '0' && h <= '9') u |= static_cast<unsigned>(h - '0');
      else if (h >= 'a' && h <= 'f') u |= static_cast<unsigned>(h - 'a' + 10);
      else if (h >= 'A' && h <= 'F') u |= static_cast<unsigned>(h - 'A' + 10);
      else fail("bad hex digit in \\u escape");
    }
    return u;
  }
  std::string string() {
    ++pos_;  // the opening quote
    std::string out;
    for (;;) {
      if (pos_ >= s_.size()) fail("unterminated string");
      const char c = s_[pos_++];
      if (c == '"') return out;
      if (static_cast<unsigned char>(c) < 0x20) fail("control character in a string");
      if (c != '\\') {
        out += c;
        continue;
      }
      if (pos_ >= s_.size()) fail("unterminated escape");
      const char e = s_[pos_++];
      switch (e) {
        case '"': out += '"'; break;
        case '\\': out += '\\'; break;
        case '/': out += '/'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'n': out += '\n'; break;
        case 'r': out += '\r'; break;
        case 't': out += '\t'; break;
        case 'u': {
          unsigned cp = hex4();
          if (cp >= 0xD800 && cp < 0xDC00) {
            if (!literal("\\u")) fail("unpaired surrogate");
            const unsigned lo = hex4();
            if (lo < 0xDC00 || lo >= 0xE000) fail("unpaired surrogate");
            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
          }
          if (cp < 0x80) out += static_cast<char>(cp);
          else if (cp < 0x800) out += static_cast<char>(0xC0 | (cp >> 6)), out += static_cast<char>(0x80 | (cp & 0x3F));
          else if (cp < 0x10000)
            out += static_cast<char>(0xE0 | (cp >> 12)), out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F)),
                out += static_cast<char>(0x80 | (cp & 0x3F));
          else
            out += static_cast<char>(0xF0 | (cp >> 18)), out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F)),
                out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F)), out += static_cast<char>(0x80 | (cp & 0x3F));
          break;
        }
        default: fail(std::string("bad escape '\\") + e + "'");
      }
    }
  }

  std::string_view s_;
  std::string what_;
  std::size_t pos_ = 0;
};

}  // namespace detail

/// Parses `text`; errors start with `what` (the file, for instance).
inline json parse_json(std::string_view text, const std::string& what) {
  return detail::json_parser(text, what).parse_document();
}

/// `s` as a JSON string literal (quotes and escapes).
inline std::string json_quote(std::string_view s) {
  std::string out = "\"";
  for (const char c : s) {
    if (c == '"' || c == '\\') out += '\\', out += c;
    else if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(static_cast<unsigned char>(c)));
      out += buf;
    } else out += c;
  }
  return out + "\"";
}

}  // namespace fusebox::io
