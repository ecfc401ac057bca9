// fusebox/runtime/cache_key.hpp: the identity of a JIT artifact (a compiled kernel, an autotune
// winner), as one canonical text built from named fields.
//
// DESIGN.md: the key covers everything baked into the code (graph structure, specialised
// extents, dtypes, options, compiler and flags, CPU ISA / GPU architecture, fusebox version).
// Callers add those as fields; this type only makes the text unambiguous and compares it:
//
//   - each field is written `<len>:<name>=<len>:<value>\n`, so no name or value, whatever bytes
//     it holds, can run into the next field ("ab"+"c" and "a"+"bc" give different texts);
//   - equality compares the whole canonical text, never a hash (STYLE.md, ArrayFire: a hash-only
//     hit returns the wrong kernel on a collision);
//   - digest() (SHA-256, hex) names disk entries; hash64() picks in-memory buckets.
//
// The text stays readable, so it is also what `FUSEBOX_LOGS=cache` prints and what a disk entry
// stores beside its artifact; fields() parses it back and difference() says which fields changed
// (the "why" of a miss or a recompile).
//
// Depends on: the C++20 standard library and fusebox/runtime/hash.hpp.
#pragma once

#include <charconv>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <ranges>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include "fusebox/core/errors.hpp"
#include "fusebox/core/linkage.hpp"
#include "fusebox/runtime/hash.hpp"

namespace fusebox::jit {

struct cache_key {
  std::string canonical;

  /// Appends one field. Field order matters (two keys with the same fields in another order
  /// differ): build keys in one place, in a fixed order.
  cache_key& add(std::string_view name, std::string_view value);
  cache_key& add(std::string_view name, const char* value) {
    return add(name, std::string_view(value));
  }
  cache_key& add(std::string_view name, const std::string& value) {
    return add(name, std::string_view(value));
  }
  cache_key& add(std::string_view name, bool value) {
    return add(name, std::string_view(value ? "true" : "false"));
  }
  template <class Number>
    requires((std::integral<Number> && !std::same_as<Number, bool>) ||
             std::floating_point<Number>)
  cache_key& add(std::string_view name, Number value) {
    std::string text;
    append_number(text, value);
    return add(name, std::string_view(text));
  }
  /// A list of numbers (extents, strides, a mask), written `[64,784]`.
  template <std::ranges::input_range Range>
    requires(!std::convertible_to<const Range&, std::string_view> &&
             (std::integral<std::ranges::range_value_t<Range>> ||
              std::floating_point<std::ranges::range_value_t<Range>>))
  cache_key& add(std::string_view name, const Range& values) {
    std::string text = "[";
    bool first = true;
    for (const auto& v : values) {
      if (!first) text.push_back(',');
      first = false;
      append_number(text, v);
    }
    text.push_back(']');
    return add(name, std::string_view(text));
  }

  /// SHA-256 of the canonical text, 64 hex digits: the name of the disk entry.
  std::string digest() const { return sha256_hex(canonical); }

  /// Fast hash for in-memory buckets; a bucket hit must still compare the full key.
  std::uint64_t hash64() const noexcept { return jit::hash64(canonical); }

  bool empty() const noexcept { return canonical.empty(); }

  /// The fields in order, parsed back. Throws std::invalid_argument on text that add() could not
  /// have produced (a corrupt key read from disk).
  std::vector<std::pair<std::string_view, std::string_view>> fields() const;

  friend bool operator==(const cache_key&, const cache_key&) = default;

 private:
  void append_counted(std::string_view text);

  template <class Number>
  static void append_number(std::string& out, Number value) {
    if constexpr (std::same_as<Number, bool>) {
      out += value ? "1" : "0";
    } else {
      char buffer[64];
      // Shortest round-trip form for floating point: equal values give equal text.
      const auto result = std::to_chars(buffer, buffer + sizeof buffer, value);
      out.append(buffer, result.ptr);
    }
  }

  [[noreturn]] static void bad() {
    FUSEBOX_THROW(std::invalid_argument("fusebox: malformed cache key text"));
  }

  static std::string_view take_counted(std::string_view& rest);
};

/// Which fields differ between two keys, one line each (`extents: [64,784] -> [32,784]`), for
/// logging why a lookup missed or a function recompiled. Empty when the keys are equal.
FUSEBOX_RUNTIME_API std::string difference(const cache_key& before, const cache_key& after);

// Definitions: compiled here, or once in the FUSEBOX_IMPLEMENTATION unit (core/linkage.hpp).
#if FUSEBOX_RUNTIME_BODIES
FUSEBOX_RUNTIME_API cache_key& cache_key::add(std::string_view name, std::string_view value) {
  append_counted(name);
  canonical.push_back('=');
  append_counted(value);
  canonical.push_back('\n');
  return *this;
}

FUSEBOX_RUNTIME_API std::vector<std::pair<std::string_view, std::string_view>> cache_key::fields() const {
  std::vector<std::pair<std::string_view, std::string_view>> out;
  std::string_view rest = canonical;
  while (!rest.empty()) {
    const std::string_view name = take_counted(rest);
    if (rest.empty() || rest.front() != '=') bad();
    rest.remove_prefix(1);
    const std::string_view value = take_counted(rest);
    if (rest.empty() || rest.front() != '\n') bad();
    rest.remove_prefix(1);
    out.emplace_back(name, value);
  }
  return out;
}

FUSEBOX_RUNTIME_API void cache_key::append_counted(std::string_view text) {
  canonical += std::to_string(text.size());
  canonical.push_back(':');
  canonical.append(text);
}

FUSEBOX_RUNTIME_API std::string_view cache_key::take_counted(std::string_view& rest) {
  std::size_t size = 0;
  const auto [end, error] = std::from_chars(rest.data(), rest.data() + rest.size(), size);
  if (error != std::errc{} || end == rest.data() || end == rest.data() + rest.size() ||
      *end != ':')
    bad();
  rest.remove_prefix(static_cast<std::size_t>(end - rest.data()) + 1);
  if (size > rest.size()) bad();
  const std::string_view out = rest.substr(0, size);
  rest.remove_prefix(size);
  return out;
}

FUSEBOX_RUNTIME_API std::string difference(const cache_key& before, const cache_key& after) {
  const auto a = before.fields();
  const auto b = after.fields();
  std::string out;
  const auto line = [&](std::string_view name, std::string_view from, std::string_view to) {
    if (!out.empty()) out.push_back('\n');
    out.append(name).append(": ").append(from).append(" -> ").append(to);
  };
  const std::size_t common = a.size() < b.size() ? a.size() : b.size();
  for (std::size_t i = 0; i < common; ++i) {
    if (a[i].first != b[i].first) {
      line("field " + std::to_string(i), a[i].first, b[i].first);
    } else if (a[i].second != b[i].second) {
      line(a[i].first, a[i].second, b[i].second);
    }
  }
  for (std::size_t i = common; i < a.size(); ++i) line(a[i].first, a[i].second, "(absent)");
  for (std::size_t i = common; i < b.size(); ++i) line(b[i].first, "(absent)", b[i].second);
  return out;
}
#endif

}  // namespace fusebox::jit

template <>
struct std::hash<fusebox::jit::cache_key> {
  std::size_t operator()(const fusebox::jit::cache_key& key) const noexcept {
    return static_cast<std::size_t>(key.hash64());
  }
};
