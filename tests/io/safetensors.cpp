// tests/io/safetensors.cpp: include/fusebox/io/safetensors.hpp: a save/load round trip of a model's
// parameters (every element, bit for bit, float and double); a file laid out as
// safetensors.torch.save_file writes it, written here byte by byte (length word, header JSON with
// __metadata__ first and tensors in data order, space padding to 8, little-endian F32 and BF16
// data), loads into the right tensors with the right values; and malformed files and mismatches
// give errors that name the file, the tensor and the numbers, without touching the parameters.
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include <fusebox/fusebox.hpp>
#include <fusebox/io/safetensors.hpp>
#include <fusebox/nn/linear.hpp>
#include <fusebox/nn/parameters.hpp>

#include "../support/check.hpp"

namespace fb = fusebox;

namespace {

/// One directory per process, removed with what is left in it when the test program exits.
std::filesystem::path temp_file(const std::string& name) {
  struct owned_dir {
    std::filesystem::path path;
    ~owned_dir() {
      std::error_code ignored;
      std::filesystem::remove_all(path, ignored);
    }
  };
  static const owned_dir dir{std::filesystem::temp_directory_path() /
                             ("fusebox_safetensors_test_" + std::to_string(::getpid()))};
  std::filesystem::create_directories(dir.path);
  return dir.path / name;
}

void write_bytes(const std::filesystem::path& p, const std::vector<std::uint8_t>& bytes) {
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

/// 8-byte little-endian length, the header, then the data.
std::vector<std::uint8_t> file_of(const std::string& header, const std::vector<std::uint8_t>& data) {
  std::vector<std::uint8_t> out;
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<std::uint8_t>((header.size() >> (8 * i)) & 0xFF));
  out.insert(out.end(), header.begin(), header.end());
  out.insert(out.end(), data.begin(), data.end());
  return out;
}

template <class T>
struct small_model {
  fb::tensor<T, fb::shape<3, 5>> weight;
  fb::tensor<T, fb::shape<3>> bias;
  fb::nn::parameter_list<T> params() {
    fb::nn::parameter_list<T> l;
    l.add("0.weight", weight);
    l.add("0.bias", bias);
    return l;
  }
};

}  // namespace

TEMPLATE_TEST_CASE("safetensors: save then load gives the parameters back bit for bit", "", float, double) {
  using T = TestType;
  small_model<T> a, b;
  fbt::fill_signed(a.weight, 1, 0.1, 10.0);
  fbt::fill_signed(a.bias, 2, 0.1, 10.0);
  fbt::fill_signed(b.weight, 3, 0.1, 10.0);
  fbt::fill_signed(b.bias, 4, 0.1, 10.0);
  const auto path = temp_file(std::string("round_trip_") + (sizeof(T) == 4 ? "f32" : "f64") + ".safetensors");
  fb::io::save_safetensors(path, a.params());
  // The header length word plus the header is a multiple of 8, as the reference writer pads it.
  const auto f = fb::io::read_safetensors(path);
  REQUIRE(f.entries.size() == 2);
  CHECK(f.entries[0].name == "0.weight");
  CHECK(f.entries[0].dtype == (sizeof(T) == 4 ? "F32" : "F64"));
  CHECK(f.entries[0].shape == std::vector<std::uint64_t>{3, 5});
  CHECK(f.metadata == std::vector<std::pair<std::string, std::string>>{{"format", "pt"}});
  CHECK((std::filesystem::file_size(path) - f.data.size()) % 8 == 0);
  fb::io::load_safetensors(path, b.params());
  fbt::check_identical(b.weight, a.weight, "weight after the round trip");
  fbt::check_identical(b.bias, a.bias, "bias after the round trip");
}

TEST_CASE("safetensors: a file in torch's layout, written byte by byte, loads") {
  // safetensors.torch.save_file({"weight": [[1, 2, -3, 0.5, 4], ...3 rows], "bias": [0.25, -2, 8] as bf16},
  // metadata={"format": "pt"}): __metadata__ first, then the tensors in data order.
  std::string header =
      R"({"__metadata__":{"format":"pt"},"bias":{"dtype":"BF16","shape":[3],"data_offsets":[0,6]},)"
      R"("0.weight":{"dtype":"F32","shape":[3,5],"data_offsets":[6,66]}})";
  header.append((8 - header.size() % 8) % 8, ' ');
  std::vector<std::uint8_t> data = {
      0x80, 0x3E,  // bf16 0.25
      0x00, 0xC0,  // bf16 -2
      0x00, 0x41,  // bf16 8
  };
  // F32, little-endian: 1, 2, -3, 0.5, 4 repeated with the row index added to the first value.
  const std::uint8_t f32[5][4] = {{0x00, 0x00, 0x80, 0x3F}, {0x00, 0x00, 0x00, 0x40}, {0x00, 0x00, 0x40, 0xC0},
                                  {0x00, 0x00, 0x00, 0x3F}, {0x00, 0x00, 0x80, 0x40}};
  const float values[5] = {1, 2, -3, 0.5f, 4};
  for (int r = 0; r < 3; ++r)
    for (int c = 0; c < 5; ++c) data.insert(data.end(), f32[c], f32[c] + 4);
  // Rename "bias" to the model's name: torch's Sequential would call it "0.bias".
  std::string h2 = header;
  h2.replace(h2.find("\"bias\""), 6, "\"0.bias\"");
  h2.erase(h2.find_last_not_of(' ') + 1);
  h2.append((8 - h2.size() % 8) % 8, ' ');
  const auto path = temp_file("torch_layout.safetensors");
  write_bytes(path, file_of(h2, data));
  small_model<float> m;
  m.weight.fill(99), m.bias.fill(99);
  fb::io::load_safetensors(path, m.params());
  for (std::size_t r = 0; r < 3; ++r)
    for (std::size_t c = 0; c < 5; ++c) CHECK(m.weight(r, c) == values[c]);
  CHECK(m.bias(0) == 0.25f);
  CHECK(m.bias(1) == -2.0f);
  CHECK(m.bias(2) == 8.0f);
  // Into double parameters too (F32 and BF16 widen exactly).
  small_model<double> d;
  fb::io::load_safetensors(path, d.params());
  CHECK(d.weight(2, 3) == 0.5);
  CHECK(d.bias(1) == -2.0);
}

TEST_CASE("safetensors: malformed files and mismatches are clear errors, and load nothing") {
  small_model<float> m;
  fbt::fill_signed(m.weight, 5, 0.1, 1.0);
  fbt::fill_signed(m.bias, 6, 0.1, 1.0);
  const auto saved = m.weight.clone();
  const auto good = temp_file("good.safetensors");
  fb::io::save_safetensors(good, m.params());
  std::vector<std::uint8_t> bytes(std::filesystem::file_size(good));
  std::ifstream(good, std::ios::binary).read(reinterpret_cast<char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  const auto bad = temp_file("bad.safetensors");
  auto expect = [&](const std::vector<std::uint8_t>& b, const std::string& message) {
    write_bytes(bad, b);
    INFO("expecting: " << message);
    CHECK_THROWS_AS(fb::io::load_safetensors(bad, m.params()), fb::invalid_argument);
    CHECK_THROWS_WITH(fb::io::load_safetensors(bad, m.params()), Catch::Contains(message) && Catch::Contains("bad.safetensors"));
    fbt::check_identical(m.weight, saved, "parameters untouched after a refused load");
  };
  expect(std::vector<std::uint8_t>(bytes.begin(), bytes.begin() + 5), "too short for the 8-byte header length");
  expect(std::vector<std::uint8_t>(bytes.begin(), bytes.end() - 4), "run past the");  // truncated data
  expect(std::vector<std::uint8_t>(bytes.begin(), bytes.begin() + 40), "only 32 follow it");  // truncated header
  auto huge = bytes;
  huge[7] = 0x7F;
  expect(huge, "100000000-byte cap");
  auto sloppy = bytes;
  sloppy[8 + 1] = ',';  // '{,' : broken JSON
  expect(sloppy, "malformed JSON at byte");
  expect(file_of(R"(["not an object"])", {}), "does not start with '{'");
  expect(file_of(R"({"0.weight":{"dtype":"F32","shape":[3,5],"data_offsets":[0,64]}})", std::vector<std::uint8_t>(64)),
         "F32 [3, 5] needs 60 bytes, data_offsets give 64");
  expect(file_of(R"({"0.weight":{"dtype":"Q4","shape":[3,5],"data_offsets":[0,60]}})", std::vector<std::uint8_t>(60)),
         "unknown dtype 'Q4'");
  expect(file_of(R"({"0.weight":{"dtype":"F32","shape":[3,5],"data_offsets":[4,64]}})", std::vector<std::uint8_t>(64)),
         "a hole before it");
  expect(file_of(R"({"0.weight":{"dtype":"F32","shape":[3,5],"data_offsets":[0,60]}})", std::vector<std::uint8_t>(60)),
         "missing '0.bias'");
  expect(file_of(R"({"0.weight":{"dtype":"F32","shape":[5,3],"data_offsets":[0,60]},)"
                 R"("0.bias":{"dtype":"F32","shape":[3],"data_offsets":[60,72]}})",
                 std::vector<std::uint8_t>(72)),
         "tensor '0.weight' is F32 [5, 3] in the file but [3, 5] in the model");
  expect(file_of(R"({"0.weight":{"dtype":"I32","shape":[3,5],"data_offsets":[0,60]},)"
                 R"("0.bias":{"dtype":"F32","shape":[3],"data_offsets":[60,72]}})",
                 std::vector<std::uint8_t>(72)),
         "has dtype I32");
  // A name the model does not have: refused with strict (torch's default), ignored without.
  const std::vector<std::uint8_t> extra =
      file_of(R"({"0.weight":{"dtype":"F32","shape":[3,5],"data_offsets":[0,60]},)"
              R"("0.bias":{"dtype":"F32","shape":[3],"data_offsets":[60,72]},"1.weight":{"dtype":"F32","shape":[1],"data_offsets":[72,76]}})",
              std::vector<std::uint8_t>(76));
  expect(extra, "unexpected '1.weight'");
  write_bytes(bad, extra);
  fb::io::load_safetensors(bad, m.params(), /*strict=*/false);
  CHECK(m.weight(1, 1) == 0.0f);  // the file's zeros
  CHECK_THROWS_WITH(fb::io::load_safetensors(temp_file("absent.safetensors"), m.params()), Catch::Contains("cannot be opened"));
  std::filesystem::remove_all(good.parent_path());
}

// Issue 20, item 19: a checkpoint as PyTorch writes it for `fc1 = nn.Linear(5, 3)`: fc1.weight
// [out, in] = [3, 5], fc1.bias [3], F32, written here byte by byte. It loads into nn::linear and
// into plain tensors without a transpose, and fb::linear(x, w, b) computes x Wᵀ + b: eager,
// compiled (the transposed view feeding the GEMM, the bias its epilogue), on a dyn batch, and
// through the nn module, every element against a double reference.
TEST_CASE("safetensors: a PyTorch Linear checkpoint (fc1.weight [out, in], fc1.bias) loads and runs as linear()") {
  constexpr std::size_t In = 5, Out = 3, N = 4;
  fb::tensor<float, fb::shape<Out, In>> w_src;
  fb::tensor<float, fb::shape<Out>> b_src;
  fbt::fill_signed(w_src, 71, 0.1, 1.0);
  fbt::fill_signed(b_src, 72, 0.1, 1.0);
  std::vector<std::uint8_t> data;
  auto put = [&](float v) {
    const auto u = std::bit_cast<std::uint32_t>(v);
    for (int i = 0; i < 4; ++i) data.push_back(static_cast<std::uint8_t>((u >> (8 * i)) & 0xFF));
  };
  for (std::size_t i = 0; i < Out * In; ++i) put(w_src.flat(i));
  for (std::size_t i = 0; i < Out; ++i) put(b_src.flat(i));
  std::string header = R"({"fc1.weight":{"dtype":"F32","shape":[3,5],"data_offsets":[0,60]},)"
                       R"("fc1.bias":{"dtype":"F32","shape":[3],"data_offsets":[60,72]}})";
  while (header.size() % 8) header += ' ';
  const auto path = temp_file("torch_linear.safetensors");
  write_bytes(path, file_of(header, data));

  fb::nn::linear<In, Out> fc1;
  fb::nn::parameter_list<float> params;
  fc1.collect(params, "fc1.");
  fb::io::load_safetensors(path, params);
  fbt::check_identical(fc1.weight, w_src, "fc1.weight as written");
  fbt::check_identical(fc1.bias, b_src, "fc1.bias as written");

  fb::tensor<float, fb::shape<N, In>> x;
  fbt::fill_signed(x, 73, 0.1, 1.0);
  auto check = [&](const auto& y, const std::string& what) {
    INFO(what);
    REQUIRE(y.extents() == fb::dims{2, {N, Out}});
    std::size_t bad = 0;
    for (std::size_t n = 0; n < N; ++n)
      for (std::size_t o = 0; o < Out; ++o) {
        double ref = b_src(o), mag = std::fabs(ref);
        for (std::size_t k = 0; k < In; ++k) {
          ref += static_cast<double>(x(n, k)) * w_src(o, k);
          mag += std::fabs(static_cast<double>(x(n, k)) * w_src(o, k));
        }
        bad += !(std::fabs(static_cast<double>(y(n, o)) - ref) <= (In + 2) * 1.2e-7 * mag);
      }
    CHECK(bad == 0);
  };
  auto model = [](const auto& xx, const auto& ww, const auto& bb) { return fb::linear(xx, ww, bb); };
  check(fb::linear(x, fc1.weight, fc1.bias), "eager linear(x, w, b)");
  check(fb::compile(model)(x, fc1.weight, fc1.bias), "compiled, static shapes");
  fb::tensor<float, fb::shape<fb::dyn, In>> xd(N);
  for (std::size_t i = 0; i < x.size(); ++i) xd.flat(i) = x.flat(i);
  check(fb::compile(model)(xd, fc1.weight, fc1.bias), "compiled, dyn batch (run-time path)");
  auto captured = [&](const auto& xx) { return fb::linear(xx, fc1.weight, fc1.bias); };
  check(fb::compile(captured)(x), "compiled, weights captured");
  std::filesystem::remove(path);
}
