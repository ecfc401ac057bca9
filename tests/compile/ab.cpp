// tests/compile/ab.cpp: ab(eager, compiled, inputs...) (include/fusebox/ab.hpp) times both sides,
// measures their peak memory and the largest difference between their outputs, and says whether
// that difference is within tolerance (also when it is not), and what to do about it.
#include <cmath>
#include <limits>
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

// ---- special values (issue 20, item 9) ----------------------------------------------------------

namespace {
auto affine = [](auto x, auto w, auto b) { return x * w + b; };

/// A compiled function whose result is edited afterwards: a compiled side that is wrong in one place.
template <class F, class Edit>
auto edited(F f, Edit edit) {
  return [f = std::move(f), edit](const auto&... in) mutable {
    auto y = f(in...);
    edit(y);
    return y;
  };
}
}  // namespace

TEST_CASE("ab(): NaN and inf agree only where both sides have the same one", "[compile][ab]") {
  const fb::ab_config quick{.warmup = 0, .min_iters = 2, .min_seconds = 0, .tolerance = 1e-4};
  fb::tensor<float, fb::shape<8, 16>> x;
  fb::tensor<float, fb::shape<16>> w, b;
  fbt::fill_signed(x, 81, 0.1, 2.0);
  fbt::fill_uniform(w, 82, 0.5, 1.5);  // positive: x's infinities keep their sign through x * w + b
  fbt::fill_signed(b, 83, 0.1, 1.0);
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();

  SECTION("all NaN on both sides: agree, and said so (not as an error of 0)") {
    for (std::size_t i = 0; i < x.size(); ++i) x.flat(i) = nan;
    const auto r = fb::ab_with(quick, fb::eager(affine), fb::compile(affine), x, w, b);
    INFO(r.verdict);
    CHECK(r.ok);
    CHECK(r.elements == x.size());
    CHECK(r.nonfinite_both == x.size());
    CHECK(r.nonfinite_mismatch == 0);
    CHECK(contains(r.verdict, std::to_string(x.size()) + " non-finite in both"));
    CHECK_FALSE(contains(r.verdict, "max rel error 0.00e+00"));
  }
  SECTION("NaN and +-inf at the same places: counted, and the rest compared against a double reference") {
    x.flat(3) = nan;
    x.flat(17) = inf;
    x.flat(40) = -inf;
    const auto y = fb::compile(affine)(x, w, b);
    for (std::size_t i = 0; i < y.size(); ++i) {  // the compiled side itself, element by element
      const double want = double(x.flat(i)) * double(w.flat(i % 16)) + double(b.flat(i % 16));
      INFO("element " << i);
      if (std::isnan(want)) CHECK(std::isnan(y.flat(i)));
      else CHECK(y.flat(i) == Approx(want).epsilon(1e-6).margin(1e-6));
    }
    const auto r = fb::ab_with(quick, fb::eager(affine), fb::compile(affine), x, w, b);
    INFO(r.verdict);
    CHECK(r.ok);
    CHECK(r.nonfinite_both == 3);
    CHECK(r.max_rel_err <= 1e-6);
    CHECK(contains(r.verdict, "3 non-finite in both"));
  }
  SECTION("NaN on one side only is a mismatch, with where it is") {
    const auto r = fb::ab_with(quick, fb::eager(affine), edited(fb::compile(affine), [&](auto& y) { y.flat(5) = nan; }),
                               x, w, b);
    INFO(r.verdict);
    CHECK_FALSE(r.ok);
    CHECK(std::isinf(r.max_rel_err));
    CHECK(r.nonfinite_mismatch == 1);
    CHECK(contains(r.verdict, "OVER TOLERANCE"));
    CHECK(contains(r.verdict, "output 0 element 5: eager"));
    CHECK(contains(r.verdict, "compiled nan"));
  }
  SECTION("NaN counts that differ, inf against a finite value, +inf against -inf: mismatches") {
    x.flat(9) = nan;
    x.flat(10) = inf;
    x.flat(11) = inf;
    auto wrong = edited(fb::compile(affine), [&](auto& y) {
      y.flat(9) = 1.0f;   // eager NaN, compiled finite
      y.flat(10) = -inf;  // +inf against -inf
      y.flat(12) = inf;   // eager finite, compiled inf
      y.flat(13) = nan;   // one NaN more on the compiled side
    });
    const auto r = fb::ab_with(quick, fb::eager(affine), wrong, x, w, b);
    INFO(r.verdict);
    CHECK_FALSE(r.ok);
    CHECK(r.nonfinite_mismatch == 4);
    CHECK(r.nonfinite_both == 1);  // element 11: inf on both sides
    CHECK(contains(r.verdict, "4 element(s) NaN or inf on one side only"));
  }
  SECTION("an infinity in both does not hide a wrong finite value (the magnitude is over finite values)") {
    x.flat(0) = inf;
    auto wrong = edited(fb::compile(affine), [&](auto& y) { y.flat(20) *= 1.01f; });
    const auto r = fb::ab_with(quick, fb::eager(affine), wrong, x, w, b);
    INFO(r.verdict);
    CHECK_FALSE(r.ok);
    CHECK(r.max_rel_err > 1e-3);
    CHECK(std::isfinite(r.max_rel_err));
    CHECK(r.nonfinite_both == 1);
  }
}

// ---- a verdict to act on, and per-function rollback (issue 20, item 10) ----------------------------

TEST_CASE("ab(): the verdict says which side to run, and apply(f) rolls f back or keeps it", "[compile][ab]") {
  fb::tensor<float, fb::shape<64, 100>> x;
  fb::tensor<float, fb::shape<100>> w, b;
  fbt::fill_signed(x, 91, 0.05, 3.0);
  fbt::fill_signed(w, 92, 0.05, 1.0);
  fbt::fill_signed(b, 93, 0.05, 1.0);
  const fb::ab_config quick{.warmup = 1, .min_iters = 5, .min_seconds = 0, .tolerance = 1e-4};
  auto reference = [&](std::size_t i) {
    const double u = double(x.flat(i)) * w.flat(i % 100) + b.flat(i % 100);
    return 0.5 * u * (1.0 + std::erf(u / std::sqrt(2.0))) / (1.0 + std::exp(-double(x.flat(i))));
  };

  SECTION("compiled is wrong: use eager, apply() disables f, whose calls then give the eager (right) result") {
    auto wrong = [](auto x, auto w, auto b) { return fb::gelu(x * w + b) * fb::sigmoid(x) * 1.001; };
    auto f = fb::compile(wrong);
    const auto r = fb::ab_with(quick, fb::eager(w1c), f, x, w, b);
    INFO(r.verdict);
    CHECK_FALSE(r.ok);
    CHECK_FALSE(r.use_compiled());
    CHECK(r.choice == fb::ab_choice::eager);
    CHECK(contains(r.verdict, "roll back to eager (compiled is wrong)"));
    CHECK(f.enabled());
    CHECK_FALSE(r.apply(f));
    CHECK_FALSE(f.enabled());
    // The model itself is what it is (a 1.001 factor): disabled, f runs it eagerly, op by op.
    const auto before = fb::jit::counters().rollback_calls.load();
    fb::profile::start();
    const auto y = f(x, w, b);
    fb::profile::stop();
    CHECK(fb::jit::counters().rollback_calls.load() == before + 1);
    std::size_t kernels = 0;
    for (const auto& e : fb::profile::events()) kernels += !e.instant && e.category == "kernel";
    CHECK(kernels >= 6);  // mul, add, gelu, sigmoid, mul, mul: one kernel each (compiled: one for all)
    for (std::size_t i = 0; i < y.size(); ++i) {
      INFO("element " << i);
      REQUIRE(y.flat(i) == Approx(reference(i) * 1.001).epsilon(1e-5).margin(1e-6));
    }
  }
  SECTION("compiled is not fast enough: use eager") {
    fb::ab_config demanding = quick;
    demanding.min_speedup = 1e9;
    auto f = fb::compile(w1c);
    const auto r = fb::ab_with(demanding, fb::eager(w1c), f, x, w, b);
    INFO(r.verdict);
    CHECK(r.ok);
    CHECK_FALSE(r.faster);
    CHECK_FALSE(r.use_compiled());
    CHECK(contains(r.verdict, "roll back to eager"));
    r.apply(f);
    CHECK_FALSE(f.enabled());
  }
  SECTION("compiled is right and fast enough: apply() keeps (or re-enables) f; ab() measures a disabled f compiled") {
    fb::ab_config lenient = quick;
    lenient.min_speedup = 0;
    auto f = fb::compile(w1c);
    f.disable();
    const auto before = fb::jit::counters().rollback_calls.load();
    const auto r = fb::ab_with(lenient, fb::eager(w1c), f, x, w, b);
    INFO(r.verdict);
    CHECK(fb::jit::counters().rollback_calls.load() == before);  // every call of f in ab() ran compiled
    CHECK_FALSE(f.enabled());                                     // and ab() left it as it was
    CHECK(r.use_compiled());
    CHECK(contains(r.verdict, "keep compiled"));
    CHECK(r.apply(f));
    CHECK(f.enabled());
    const auto y = f(x, w, b);
    for (std::size_t i = 0; i < y.size(); ++i) {
      INFO("element " << i);
      REQUIRE(y.flat(i) == Approx(reference(i)).epsilon(1e-5).margin(1e-6));
    }
  }
}
