// Tests for include/fusebox/data/idx.hpp, file_reader.hpp and fashion_mnist.hpp.
//
// The files are written here, independently of the reader: big-endian by shifts, gzip through
// zlib linked into this test (the reader loads zlib with dlopen).
#include <fusebox/data/fashion_mnist.hpp>
#include <fusebox/data/idx.hpp>
#include <fusebox/runtime/posix.hpp>  // temp_directory

#include <catch2/catch.hpp>

#include <zlib.h>

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "../support/check.hpp"  // fbt::rng

namespace fs = std::filesystem;
namespace data = fusebox::data;
using Catch::Matchers::Contains;

namespace {

using bytes = std::vector<unsigned char>;

void append_big_endian(bytes& out, std::uint64_t value, std::size_t size) {
  for (std::size_t k = size; k-- > 0;) out.push_back(static_cast<unsigned char>(value >> (8 * k)));
}

bytes idx_header(unsigned type, const std::vector<std::uint32_t>& extents) {
  bytes out{0, 0, static_cast<unsigned char>(type), static_cast<unsigned char>(extents.size())};
  for (auto e : extents) append_big_endian(out, e, 4);
  return out;
}

void write_plain(const fs::path& path, const bytes& content) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(content.data()), static_cast<std::streamsize>(content.size()));
  REQUIRE(out.good());
}

void write_gzip(const fs::path& path, const bytes& content) {
  gzFile out = gzopen(path.c_str(), "wb");
  REQUIRE(out != nullptr);
  REQUIRE(gzwrite(out, content.data(), static_cast<unsigned>(content.size())) ==
          static_cast<int>(content.size()));
  REQUIRE(gzclose(out) == Z_OK);
}

bytes read_all(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return bytes(std::istreambuf_iterator<char>(in), {});
}

// The unsigned integer with T's bits, for bit-exact comparison (NaNs included).
template <class T>
auto bits(T value) {
  if constexpr (sizeof(T) == 1) return std::bit_cast<std::uint8_t>(value);
  else if constexpr (sizeof(T) == 2) return std::bit_cast<std::uint16_t>(value);
  else if constexpr (sizeof(T) == 4) return std::bit_cast<std::uint32_t>(value);
  else return std::bit_cast<std::uint64_t>(value);
}

// Writes random T values with the given extents (plain, or gzip if `gzip`), reads them back with
// read_idx and checks the extents, the type and every element's bits.
template <class T>
void round_trip(const fs::path& dir, unsigned type_byte, const std::vector<std::uint32_t>& extents,
                bool gzip, std::uint64_t seed) {
  std::size_t count = 1;
  for (auto e : extents) count *= e;
  fbt::rng random{seed};
  std::vector<std::uint64_t> raw(count);
  bytes file = idx_header(type_byte, extents);
  for (auto& r : raw) {
    r = random.next() >> (64 - 8 * sizeof(T));
    append_big_endian(file, r, sizeof(T));
  }
  const fs::path path = dir / ("t" + std::to_string(type_byte) + "_" + std::to_string(seed) +
                               (gzip ? ".idx.gz" : ".idx"));
  gzip ? write_gzip(path, file) : write_plain(path, file);

  const data::idx_array a = data::read_idx(path);
  INFO(path << ", " << a.extents_text());
  REQUIRE(static_cast<unsigned>(a.type()) == type_byte);
  REQUIRE(a.extents == std::vector<std::size_t>(extents.begin(), extents.end()));
  const auto& values = a.as<T>();
  REQUIRE(values.size() == count);
  std::size_t mismatches = 0;
  for (std::size_t i = 0; i < count; ++i) mismatches += bits(values[i]) != raw[i];
  CHECK(mismatches == 0);
}

}  // namespace

TEST_CASE("read_idx: every element type, plain and gzip, reads back bit for bit", "[data][idx]") {
  fusebox::jit::temp_directory dir;
  std::uint64_t seed = 1;
  const std::vector<std::vector<std::uint32_t>> shapes = {{17}, {3, 5, 4}, {2, 1, 3, 2}, {0}, {4, 0, 2}, {70000}};
  for (bool gzip : {false, true}) {
    for (const auto& shape : shapes) {
      round_trip<std::uint8_t>(dir.path(), 0x08, shape, gzip, seed++);
      round_trip<std::int8_t>(dir.path(), 0x09, shape, gzip, seed++);
      round_trip<std::int16_t>(dir.path(), 0x0B, shape, gzip, seed++);
      round_trip<std::int32_t>(dir.path(), 0x0C, shape, gzip, seed++);
      round_trip<float>(dir.path(), 0x0D, shape, gzip, seed++);
      round_trip<double>(dir.path(), 0x0E, shape, gzip, seed++);
    }
  }
}

TEST_CASE("read_idx: gzip is recognised by content, not by name", "[data][idx]") {
  fusebox::jit::temp_directory dir;
  bytes file = idx_header(0x08, {3});
  file.insert(file.end(), {7, 8, 9});
  write_gzip(dir.path() / "compressed.idx", file);
  write_plain(dir.path() / "plain.gz", file);
  for (const char* name : {"compressed.idx", "plain.gz"}) {
    const auto a = data::read_idx(dir.path() / name);
    CHECK(a.as<std::uint8_t>() == std::vector<std::uint8_t>{7, 8, 9});
  }
}

TEST_CASE("read_idx: a missing file, bad magic or unknown type byte is an error naming the file",
          "[data][idx]") {
  fusebox::jit::temp_directory dir;
  const fs::path missing = dir.path() / "nothing-here.idx";
  REQUIRE_THROWS_WITH(data::read_idx(missing),
                      Contains(missing.string()) && Contains("cannot open it"));

  const fs::path text = dir.path() / "text.idx";
  write_plain(text, {'h', 'e', 'l', 'l', 'o', '\n'});
  REQUIRE_THROWS_WITH(data::read_idx(text), Contains(text.string()) && Contains("bad magic 0x68656C6C"));

  const fs::path type = dir.path() / "type.idx";
  bytes file = idx_header(0x0A, {1});
  file.push_back(0);
  write_plain(type, file);
  REQUIRE_THROWS_WITH(data::read_idx(type),
                      Contains(type.string()) && Contains("unsupported IDX element type byte 0x0A"));

  const fs::path tiny = dir.path() / "tiny.idx";
  write_plain(tiny, {0, 0});
  REQUIRE_THROWS_WITH(data::read_idx(tiny), Contains(tiny.string()) && Contains("truncated: 2 bytes"));

  // The extents themselves cut short.
  const fs::path header = dir.path() / "header.idx";
  write_plain(header, {0, 0, 0x08, 3, 0, 0, 0, 2, 0, 0});
  REQUIRE_THROWS_WITH(data::read_idx(header),
                      Contains(header.string()) && Contains("promises 3 extents") &&
                          Contains("ends in extent 1"));
}

TEST_CASE("read_idx: fewer or more bytes than the header promises are errors naming both sizes",
          "[data][idx]") {
  fusebox::jit::temp_directory dir;
  for (bool gzip : {false, true}) {
    // 3 x 4 int16: 24 bytes promised.
    bytes file = idx_header(0x0B, {3, 4});
    const std::size_t header_size = file.size();
    file.resize(header_size + 20, 0x5A);
    const fs::path short_file = dir.path() / (gzip ? "short.idx.gz" : "short.idx");
    gzip ? write_gzip(short_file, file) : write_plain(short_file, file);
    REQUIRE_THROWS_WITH(data::read_idx(short_file),
                        Contains(short_file.string()) && Contains("truncated") &&
                            Contains("3 x 4 int16 (0x0B) values (12 x 2 bytes)") &&
                            Contains("ends after 20 bytes"));

    file.resize(header_size + 24 + 5, 0x5A);
    const fs::path long_file = dir.path() / (gzip ? "long.idx.gz" : "long.idx");
    gzip ? write_gzip(long_file, file) : write_plain(long_file, file);
    REQUIRE_THROWS_WITH(data::read_idx(long_file),
                        Contains(long_file.string()) && Contains("5 bytes of trailing data"));
  }

  // A header promising 4 x 2^32-1 x 2^32-1 float64 values: an error, not an allocation failure.
  bytes huge = idx_header(0x0E, {4, 0xFFFFFFFF, 0xFFFFFFFF});
  const fs::path huge_file = dir.path() / "huge.idx";
  write_plain(huge_file, huge);
  REQUIRE_THROWS_WITH(data::read_idx(huge_file), Contains(huge_file.string()) && Contains("overflow"));
  huge = idx_header(0x0E, {0xFFFFFFFF, 0x10});
  huge.resize(huge.size() + 1000);
  write_plain(huge_file, huge);
  REQUIRE_THROWS_WITH(data::read_idx(huge_file),
                      Contains(huge_file.string()) && Contains("ends after 1000 bytes"));
}

TEST_CASE("read_idx: a corrupt or cut gzip stream is an error naming the file", "[data][idx]") {
  fusebox::jit::temp_directory dir;
  // Random bytes (deflate stores them: only the CRC can catch a flipped byte) and a ramp
  // (Huffman-coded: a flipped byte breaks the code or the CRC).
  fbt::rng random{42};
  for (bool compressible : {false, true}) {
    bytes file = idx_header(0x08, {200, 100});
    for (std::size_t i = 0; i < 20000; ++i)
      file.push_back(static_cast<unsigned char>(compressible ? i % 7 : random.next()));
    const fs::path good = dir.path() / "good.idx.gz";
    write_gzip(good, file);
    REQUIRE(data::read_idx(good).size() == 20000);

    bytes gz = read_all(good);
    REQUIRE(gz.size() > 40);
    const fs::path corrupt = dir.path() / "corrupt.idx.gz";
    bytes flipped = gz;
    for (std::size_t k = 0; k < 4; ++k) flipped[gz.size() / 2 + k] ^= 0xA5;
    write_plain(corrupt, flipped);
    INFO((compressible ? "compressible" : "random") << " data");
    REQUIRE_THROWS_WITH(data::read_idx(corrupt), Contains(corrupt.string()));
    // Only the CRC at the end of the stream sees a flipped stored byte.
    if (!compressible)
      REQUIRE_THROWS_WITH(data::read_idx(corrupt), Contains("corrupt gzip stream (zlib: incorrect data check)"));

    const fs::path cut = dir.path() / "cut.idx.gz";
    write_plain(cut, bytes(gz.begin(), gz.begin() + static_cast<std::ptrdiff_t>(gz.size() / 2)));
    REQUIRE_THROWS_WITH(data::read_idx(cut),
                        Contains(cut.string()) && Contains("the gzip stream is truncated"));
  }
}

TEST_CASE("idx_array::as: asking for another type than the file's is an error", "[data][idx]") {
  fusebox::jit::temp_directory dir;
  bytes file = idx_header(0x0C, {1});
  append_big_endian(file, 0xFFFFFFFE, 4);
  write_plain(dir.path() / "int32.idx", file);
  const auto a = data::read_idx(dir.path() / "int32.idx");
  CHECK(a.as<std::int32_t>() == std::vector<std::int32_t>{-2});
  REQUIRE_THROWS_WITH(a.as<float>(), Contains("int32.idx") && Contains("holds int32 (0x0C) elements"));
}

TEST_CASE("load_fashion_mnist: small files in the Fashion-MNIST layout load and are checked",
          "[data][idx][fashion_mnist]") {
  fusebox::jit::temp_directory dir;
  auto write_set = [&](const std::string& prefix, std::uint32_t n, unsigned char label_limit) {
    bytes images = idx_header(0x08, {n, 2, 3});
    for (std::uint32_t i = 0; i < n * 6; ++i) images.push_back(static_cast<unsigned char>(i * 37));
    write_gzip(dir.path() / (prefix + "-images-idx3-ubyte.gz"), images);
    bytes labels = idx_header(0x08, {n});
    for (std::uint32_t i = 0; i < n; ++i) labels.push_back(static_cast<unsigned char>(i % label_limit));
    write_plain(dir.path() / (prefix + "-labels-idx1-ubyte"), labels);  // the unzipped name
  };

  REQUIRE_THROWS_WITH(data::load_fashion_mnist(dir.path()),
                      Contains(dir.path().string()) && Contains("dataset-fashion-mnist") &&
                          Contains("train-images-idx3-ubyte.gz") && Contains("t10k-labels-idx1-ubyte.gz"));

  write_set("train", 5, 10);
  write_set("t10k", 3, 10);
  const auto set = data::load_fashion_mnist(dir.path());
  REQUIRE(set.train.count == 5);
  REQUIRE(set.test.count == 3);
  CHECK(set.train.rows == 2);
  CHECK(set.train.cols == 3);
  for (std::uint32_t i = 0; i < 5 * 6; ++i)
    REQUIRE(set.train.images[i] == static_cast<unsigned char>(i * 37) / 255.0f);
  CHECK(set.train.labels == std::vector<std::int32_t>{0, 1, 2, 3, 4});
  const auto [image, label] = set.train.get(4);
  CHECK(image.size() == 6);
  CHECK(image[0] == set.train.images[24]);
  CHECK(label == 4);

  write_set("t10k", 3, 255);  // labels 0, 1, 2 stay valid
  write_set("train", 12, 255);  // label 10 and 11 are not Fashion-MNIST classes
  REQUIRE_THROWS_WITH(data::load_fashion_mnist(dir.path()),
                      Contains("train-labels-idx1-ubyte") && Contains("label 10 is 10"));

  // Labels for 4 images beside 5 images.
  write_set("train", 5, 10);
  bytes labels = idx_header(0x08, {4});
  labels.insert(labels.end(), {0, 1, 2, 3});
  write_plain(dir.path() / "train-labels-idx1-ubyte", labels);
  REQUIRE_THROWS_WITH(data::load_fashion_mnist(dir.path()),
                      Contains("holds 4 uint8 (0x08) values; expected 5 uint8 labels"));
}

TEST_CASE("load_fashion_mnist: the real data set, where it is installed", "[data][idx][fashion_mnist]") {
  const fs::path dir = data::fashion_mnist_default_dir;
  if (!fs::exists(dir / "train-images-idx3-ubyte.gz")) {
    WARN("Fashion-MNIST is not in " << dir << " (Debian package dataset-fashion-mnist): skipped");
    return;
  }
  const auto set = data::load_fashion_mnist();
  for (const auto* s : {&set.train, &set.test}) {
    const std::size_t count = s == &set.train ? 60000 : 10000;
    REQUIRE(s->count == count);
    REQUIRE(s->rows == 28);
    REQUIRE(s->cols == 28);
    REQUIRE(s->images.size() == count * 28 * 28);
    REQUIRE(s->labels.size() == count);
    // Fashion-MNIST is balanced: exactly a tenth of each set per class.
    std::vector<std::size_t> per_class(10);
    for (auto label : s->labels) {
      REQUIRE((label >= 0 && label <= 9));
      ++per_class[static_cast<std::size_t>(label)];
    }
    for (auto n : per_class) CHECK(n == count / 10);
    float lo = 1, hi = 0;
    for (float p : s->images) lo = std::min(lo, p), hi = std::max(hi, p);
    CHECK(lo == 0.0f);
    CHECK(hi == 1.0f);
  }
}
