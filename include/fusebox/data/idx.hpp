// fusebox/data/idx.hpp: reads IDX files, the format of MNIST and Fashion-MNIST, plain or gzipped.
//
// The format (big-endian throughout): two zero bytes, a type byte (0x08 uint8, 0x09 int8,
// 0x0B int16, 0x0C int32, 0x0D float32, 0x0E float64), the number of dimensions, one uint32
// extent per dimension, then the elements in row-major order. read_idx returns the extents and
// the elements in host byte order, in a vector of the file's element type.
//
// Every way a file can disagree with its header is an error naming the file and both sizes:
// missing file, bad magic, unknown type byte, fewer elements than the extents promise, bytes
// after them, a corrupt gzip stream. Memory grows with the data actually read, so a header that
// promises terabytes fails as "truncated" rather than as an allocation failure.
//
// Depends on: the C++20 standard library, fusebox/core/errors.hpp, fusebox/data/file_reader.hpp.
#pragma once

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <string>
#include <type_traits>
#include <variant>
#include <vector>

#include "fusebox/core/errors.hpp"
#include "fusebox/data/file_reader.hpp"

namespace fusebox::data {

enum class idx_type : std::uint8_t {
  uint8 = 0x08, int8 = 0x09, int16 = 0x0B, int32 = 0x0C, float32 = 0x0D, float64 = 0x0E
};

/// The elements of an IDX file, as the type its header names.
using idx_values = std::variant<std::vector<std::uint8_t>, std::vector<std::int8_t>,
                                std::vector<std::int16_t>, std::vector<std::int32_t>,
                                std::vector<float>, std::vector<double>>;

/// "uint8 (0x08)", for messages.
inline std::string idx_type_name(idx_type type) {
  char code[8];
  std::snprintf(code, sizeof code, "0x%02X", static_cast<unsigned>(type));
  const char* name = "unknown";
  switch (type) {
    case idx_type::uint8: name = "uint8"; break;
    case idx_type::int8: name = "int8"; break;
    case idx_type::int16: name = "int16"; break;
    case idx_type::int32: name = "int32"; break;
    case idx_type::float32: name = "float32"; break;
    case idx_type::float64: name = "float64"; break;
  }
  return std::string(name) + " (" + code + ")";
}

struct idx_array {
  std::filesystem::path path;        // where it was read from, for messages
  std::vector<std::size_t> extents;  // as in the header; the first is the number of samples
  idx_values values;

  idx_type type() const {
    constexpr idx_type by_index[] = {idx_type::uint8, idx_type::int8, idx_type::int16,
                                     idx_type::int32, idx_type::float32, idx_type::float64};
    return by_index[values.index()];
  }

  std::size_t size() const {
    return std::visit([](const auto& v) { return v.size(); }, values);
  }

  /// The elements as `T`, which must be the file's own type (no silent conversion).
  template <class T>
  const std::vector<T>& as() const {
    if (const auto* v = std::get_if<std::vector<T>>(&values)) return *v;
    FUSEBOX_THROW(invalid_argument("fusebox: '" + path.string() + "' holds " + idx_type_name(type()) +
                                   " elements; they were asked for as another type"));
  }

  /// "60000 x 28 x 28", for messages.
  std::string extents_text() const {
    std::string text;
    for (std::size_t e : extents) text += (text.empty() ? "" : " x ") + std::to_string(e);
    return text.empty() ? "a scalar" : text;
  }
};

namespace detail {

template <class T>
void from_big_endian(std::vector<T>& v) {
  if constexpr (sizeof(T) > 1 && std::endian::native == std::endian::little) {
    for (T& x : v) {
      auto* b = reinterpret_cast<unsigned char*>(&x);
      std::reverse(b, b + sizeof(T));
    }
  }
}

// Reads `count` elements of T after the header, then checks that nothing follows them.
template <class T>
idx_values read_idx_values(file_reader& in, std::size_t count, const idx_array& header) {
  const std::size_t header_bytes = 4 + 4 * header.extents.size();
  auto promise = [&] {
    return header.extents_text() + " " + idx_type_name(header.type()) + " values (" +
           std::to_string(count) + " x " + std::to_string(sizeof(T)) + " bytes) after the " +
           std::to_string(header_bytes) + "-byte header" +
           (in.compressed() ? ", once decompressed" : "");
  };
  std::vector<T> v;
  constexpr std::size_t chunk = (std::size_t{16} << 20) / sizeof(T);  // 16 MiB per read
  while (v.size() < count) {
    const std::size_t have = v.size();
    v.resize(std::min(count, have + std::max(chunk, have)));  // at most twice what was read
    const std::size_t want = (v.size() - have) * sizeof(T);
    const std::size_t got = in.read(v.data() + have, want);
    if (got < want)
      in.fail("truncated: the header promises " + promise() + ", but the data ends after " +
              std::to_string(have * sizeof(T) + got) + " bytes");
  }
  std::size_t trailing = 0;
  unsigned char scratch[4096];
  while (const std::size_t got = in.read(scratch, sizeof scratch)) trailing += got;
  if (trailing)
    in.fail(std::to_string(trailing) + " bytes of trailing data after the " + promise() +
            " that the header promises");
  from_big_endian(v);
  return v;
}

}  // namespace detail

/// Reads the IDX file at `path` (gzip-compressed or not, see file_reader.hpp).
inline idx_array read_idx(const std::filesystem::path& path) {
  file_reader in(path);
  unsigned char magic[4] = {};
  if (const std::size_t got = in.read(magic, 4); got < 4)
    in.fail("truncated: " + std::to_string(got) + " bytes, fewer than the 4-byte IDX magic");
  char magic_text[16];
  std::snprintf(magic_text, sizeof magic_text, "0x%02X%02X%02X%02X", magic[0], magic[1], magic[2],
                magic[3]);
  if (magic[0] != 0 || magic[1] != 0)
    in.fail(std::string("bad magic ") + magic_text +
            ": not an IDX file (an IDX file starts with 0x0000, a type byte and the number of "
            "dimensions)");

  idx_array result;
  result.path = path;
  const std::size_t count = [&] {
    const std::size_t rank = magic[3];
    result.extents.resize(rank);
    std::size_t n = 1;
    for (std::size_t d = 0; d < rank; ++d) {
      unsigned char e[4] = {};
      if (in.read(e, 4) < 4)
        in.fail("truncated header: the magic " + std::string(magic_text) + " promises " +
                std::to_string(rank) + " extents, and the file ends in extent " +
                std::to_string(d));
      const std::size_t extent = std::size_t{e[0]} << 24 | std::size_t{e[1]} << 16 |
                                 std::size_t{e[2]} << 8 | std::size_t{e[3]};
      result.extents[d] = extent;
      if (extent != 0 && n > SIZE_MAX / 16 / extent)  // 16: room for the byte count too
        in.fail("the extents " + result.extents_text() + " overflow a size");
      n *= extent;
    }
    return n;
  }();

  switch (magic[2]) {
    case 0x08: result.values = std::vector<std::uint8_t>{}; break;
    case 0x09: result.values = std::vector<std::int8_t>{}; break;
    case 0x0B: result.values = std::vector<std::int16_t>{}; break;
    case 0x0C: result.values = std::vector<std::int32_t>{}; break;
    case 0x0D: result.values = std::vector<float>{}; break;
    case 0x0E: result.values = std::vector<double>{}; break;
    default: {
      char type[8];
      std::snprintf(type, sizeof type, "0x%02X", magic[2]);
      in.fail(std::string("unsupported IDX element type byte ") + type + " in magic " +
              magic_text +
              " (expected 0x08 uint8, 0x09 int8, 0x0B int16, 0x0C int32, 0x0D float32 or "
              "0x0E float64)");
    }
  }
  result.values = std::visit(
      [&](const auto& empty) {
        using T = typename std::decay_t<decltype(empty)>::value_type;
        return detail::read_idx_values<T>(in, count, result);
      },
      result.values);
  return result;
}

}  // namespace fusebox::data
