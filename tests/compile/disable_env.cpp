// FUSEBOX_DISABLE=1: the rollback switch. CTest runs this binary with the variable set (it is read
// once per process); every compiled function must then run eagerly: no JIT compile on the
// run-time path (compiles are forbidden here, so one would throw), the static path op by op (one
// kernel per op instead of the fused plan), and results that still match a double reference. Each
// such call is counted (counters().rollback_calls) and the switch logged under FUSEBOX_LOGS=rollback.
#include <cmath>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include <catch2/catch.hpp>

#include <fusebox/fusebox.hpp>

#include "../support/gelu_sigmoid.hpp"

namespace fb = fusebox;

namespace {

const auto model = fbt::gelu_sigmoid;
const auto reference = fbt::gelu_sigmoid_ref;

std::size_t kernel_spans(const std::vector<fb::profile::event>& events) {
  std::size_t n = 0;
  for (const auto& e : events) n += !e.instant && e.category == "kernel";
  return n;
}

template <class X, class W>
void check(const X& x, const W& w, const W& b, const X& y) {
  REQUIRE(y.extents() == x.extents());
  const std::size_t cols = w.size();
  for (std::size_t i = 0; i < y.size(); ++i) {
    const double want = reference(x.flat(i), w.flat(i % cols), b.flat(i % cols));
    INFO("element " << i);
    REQUIRE(y.flat(i) == Approx(want).epsilon(1e-5).margin(1e-6));
  }
}

}  // namespace

TEST_CASE("FUSEBOX_DISABLE=1 runs every compiled function eagerly", "[compile][disable]") {
  const char* v = std::getenv("FUSEBOX_DISABLE");
  REQUIRE(v != nullptr);  // run through CTest, which sets it; alone: FUSEBOX_DISABLE=1 ./this
  REQUIRE(std::string(v) == "1");
  fb::jit::forbid_compiles(true);

  fb::tensor<float, fb::shape<32>> w, b;
  w.fill_random(2, 0.5f, 1.5f);
  b.fill_random(3);

  SECTION("static shapes: op by op, not the fused plan; counted and logged") {
    fb::tensor<float, fb::shape<16, 32>> x;
    x.fill_random(1);
    auto fast = fb::compile(model);
    std::vector<std::string> lines;
    fb::jit::set_log_sink([&](std::string_view line) { lines.emplace_back(line); });
    fb::set_logs("rollback");
    const auto before = fb::jit::counters().rollback_calls.load();
    fb::profile::start();
    const auto y = fast(x, w, b);
    fb::profile::stop();
    (void)fast(x, w, b);
    fb::set_logs("");
    fb::jit::set_log_sink({});
    CHECK(fb::jit::counters().rollback_calls.load() == before + 2);
    REQUIRE(lines.size() == 1);  // once, not per call
    CHECK(lines[0].find("[fusebox:rollback] a compiled function called with [16, 32], [32], [32] runs its model "
                        "eagerly: FUSEBOX_DISABLE=1") == 0);
    CHECK(fb::rollback_active());
    CHECK(fast.enabled());  // the function's own switch is on; the global one rolls it back
    check(x, w, b, y);
    using E = decltype(model(fb::input_leaf<0, float, fb::shape<16, 32>>{}, fb::input_leaf<1, float, fb::shape<32>>{},
                             fb::input_leaf<2, float, fb::shape<32>>{}));
    STATIC_REQUIRE(fb::cpu::program<float, E>::plan.n_kernels == 1);  // compiled, it would be one kernel
    CHECK(kernel_spans(fb::profile::events()) >= 5);                  // mul, add, gelu, sigmoid, mul
  }

  SECTION("dyn shapes: nothing compiled, every shape served") {
    auto fast = fb::compile(model);
    for (std::size_t rows : {3u, 17u, 64u}) {
      fb::tensor<float, fb::shape<fb::dyn, 32>> x(rows);
      x.fill_random(rows);
      const auto y = fast(x, w, b);
      check(x, w, b, y);
    }
    CHECK(fb::jit::counters().compiles.load() == 0);
    CHECK(fast.recompiles() == 0);
  }
}
