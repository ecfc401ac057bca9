// Tests for include/fusebox/runtime/hash.hpp: SHA-256 against the FIPS 180-4 / NIST example
// vectors and padding boundaries, incremental updates, hex, and the fast 64-bit hash.
#include <catch2/catch.hpp>

#include <cstddef>
#include <set>
#include <string>

#include "fusebox/runtime/hash.hpp"

namespace jit = fusebox::jit;

TEST_CASE("sha256: the standard test vectors", "[jit][hash]") {
  CHECK(jit::sha256_hex("") ==
        "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  CHECK(jit::sha256_hex("abc") ==
        "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  // 448 bits: the padding needs a second block.
  CHECK(jit::sha256_hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq") ==
        "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  // 896 bits.
  CHECK(jit::sha256_hex("abcdefghbcdefghicdefghijdefghijkefghijklfghijklmghijklmnhijklmno"
                        "ijklmnopjklmnopqklmnopqrlmnopqrsmnopqrstnopqrstu") ==
        "cf5b16a778af8380036ce59e7b0492370b249b11e8f07a51afac45037afee9d1");
  CHECK(jit::sha256_hex(std::string(1000000, 'a')) ==
        "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

TEST_CASE("sha256: lengths around the padding boundaries", "[jit][hash]") {
  // Reference values from coreutils sha256sum.
  const std::pair<std::size_t, const char*> cases[] = {
      {55, "9f4390f8d30c2dd92ec9f095b65e2b9ae9b0a925a5258e241c9f1e910f734318"},
      {56, "b35439a4ac6f0948b6d6f9e3c6af0f5f590ce20f1bde7090ef7970686ec6738a"},
      {63, "7d3e74a05d7db15bce4ad9ec0658ea98e3f06eeecf16b4c6fff2da457ddc2f34"},
      {64, "ffe054fe7ae0cb6dc65c3af9b61d5209f439851db43d0ba5997337df154668eb"},
      {65, "635361c48bb9eab14198e76ea8ab7f1a41685d6ad62aa9146d301d4f17eb0ae0"},
      {119, "31eba51c313a5c08226adf18d4a359cfdfd8d2e816b13f4af952f7ea6584dcfb"},
      {120, "2f3d335432c70b580af0e8e1b3674a7c020d683aa5f73aaaedfdc55af904c21c"},
      {128, "6836cf13bac400e9105071cd6af47084dfacad4e5e302c94bfed24e013afb73e"},
  };
  for (const auto& [n, expected] : cases) {
    INFO("length " << n);
    CHECK(jit::sha256_hex(std::string(n, 'a')) == expected);
  }
}

TEST_CASE("sha256: any split of the input into updates gives the same digest", "[jit][hash]") {
  std::string text;
  for (int i = 0; i < 1000; ++i) text.push_back(static_cast<char>(i * 37 + (i >> 3)));
  const auto whole = jit::sha256{}.update(text).finish();
  for (const std::size_t chunk : {1, 3, 63, 64, 65, 127, 500}) {
    jit::sha256 h;
    for (std::size_t at = 0; at < text.size(); at += chunk)
      h.update(std::string_view(text).substr(at, chunk));
    INFO("chunk " << chunk);
    CHECK(h.finish() == whole);
  }
  jit::sha256 reused;
  reused.update("garbage").finish();
  reused.reset();
  CHECK(jit::hex(reused.update("abc").finish()) == jit::sha256_hex("abc"));
}

TEST_CASE("hex: lower case, two digits per byte", "[jit][hash]") {
  const std::uint8_t bytes[] = {0x00, 0x0f, 0xa0, 0xff};
  CHECK(jit::hex(bytes) == "000fa0ff");
  CHECK(jit::hex(std::span<const std::uint8_t>{}).empty());
}

TEST_CASE("hash64: deterministic, constexpr, length-sensitive, well spread", "[jit][hash]") {
  static_assert(jit::hash64("abc") == jit::hash64("abc"));
  constexpr auto at_compile_time = jit::hash64("fusebox");
  CHECK(jit::hash64(std::string("fusebox")) == at_compile_time);
  CHECK(jit::hash64("a") != jit::hash64(std::string_view("a\0", 2)));
  CHECK(jit::hash64("") != jit::hash64(std::string_view("\0", 1)));
  CHECK(jit::hash64("abc", 1) != jit::hash64("abc", 2));
  // Near-identical keys (one extent apart) land in distinct 64-bit values and spread over the
  // low bits that bucket tables use.
  std::set<std::uint64_t> full, low;
  for (int i = 0; i < 4096; ++i) {
    const std::string key = "graph=add(x,y);extents=[" + std::to_string(i) + ",784]";
    full.insert(jit::hash64(key));
    low.insert(jit::hash64(key) & 0xfff);
  }
  CHECK(full.size() == 4096);
  CHECK(low.size() > 2400);  // a uniform hash fills ~63% of 4096 buckets with 4096 keys
}
