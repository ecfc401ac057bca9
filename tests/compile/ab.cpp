// tests/compile/ab.cpp: ab(eager, compiled, inputs...) (include/fusebox/ab.hpp) times both sides,
// measures their peak memory and the largest difference between their outputs, and says whether
// that difference is within tolerance (also when it is not).
#include <string>

#include <catch2/catch.hpp>

#include <fusebox/fusebox.hpp>

#include "../support/check.hpp"

namespace fb = fusebox;

namespace {
bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

auto w1c = [](auto x, auto w, auto b) { return fb::gelu(x * w + b) * fb::sigmoid(x); };

}  // namespace

TEST_CASE("ab() measures both sides and reports the error", "[compile][ab]") {
  fb::tensor<float, fb::shape<64, 100>> x;
  fb::tensor<float, fb::shape<100>> w, b;
  fbt::fill_signed(x, 71, 0.05, 3.0);
  fbt::fill_signed(w, 72, 0.05, 1.0);
  fbt::fill_signed(b, 73, 0.05, 1.0);
  const fb::ab_config quick{.warmup = 1, .min_iters = 5, .min_seconds = 0, .tolerance = 1e-4};
  const auto r = fb::ab_with(quick, fb::eager(w1c), fb::compile(w1c), x, w, b);
  INFO(r.table());
  CHECK(r.ok);
  CHECK(r.max_rel_err <= 1e-6);
  CHECK(r.eager.iters >= 5);
  CHECK(r.compiled.iters >= 5);
  CHECK(r.eager.median_us > 0);
  CHECK(r.compiled.median_us > 0);
  CHECK(r.speedup > 0);
  CHECK(contains(r.verdict, "within tolerance"));
  CHECK(contains(r.table(), "eager"));
  // Eager materialises the intermediates; the fused kernel holds none.
  CHECK(r.eager.peak_bytes > r.compiled.peak_bytes);

  SECTION("a wrong compiled side is reported") {
    auto wrong = [](auto x, auto w, auto b) { return fb::gelu(x * w + b) * fb::sigmoid(x) * 1.001; };
    const auto bad = fb::ab_with(quick, fb::eager(w1c), fb::compile(wrong), x, w, b);
    CHECK_FALSE(bad.ok);
    CHECK(bad.max_rel_err > 5e-4);
    CHECK(contains(bad.verdict, "OVER TOLERANCE"));
  }
}
