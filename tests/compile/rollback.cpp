// tests/compile/rollback.cpp: a compiled function's own rollback switch (compiled::disable / enable /
// enabled, include/fusebox/compile.hpp). Disabled, the function runs its model eagerly, op by op, on
// the static path and on the run-time path (nothing compiled), exactly like the global switch
// (stance force_eager, FUSEBOX_DISABLE=1): every such call counted in counters().rollback_calls and
// logged once per switch under FUSEBOX_LOGS=rollback. Other compiled functions are not affected.
#include <cmath>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include <fusebox/fusebox.hpp>

#include "../support/gelu_sigmoid.hpp"

namespace fb = fusebox;

namespace {

const auto model = fbt::gelu_sigmoid;
const auto reference = fbt::gelu_sigmoid_ref;

template <class X, class W>
void check(const X& x, const W& w, const W& b, const X& y) {
  REQUIRE(y.extents() == x.extents());
  const std::size_t cols = w.size();
  for (std::size_t i = 0; i < y.size(); ++i) {
    INFO("element " << i);
    REQUIRE(y.flat(i) == Approx(reference(x.flat(i), w.flat(i % cols), b.flat(i % cols))).epsilon(1e-5).margin(1e-6));
  }
}

/// Kernel spans of one call: 1 for the fused program, one per op when run eagerly.
template <class F>
std::size_t kernel_spans_of(F&& call) {
  fb::profile::start();
  call();
  fb::profile::stop();
  std::size_t n = 0;
  for (const auto& e : fb::profile::events()) n += !e.instant && e.category == "kernel";
  return n;
}

struct captured_logs {
  explicit captured_logs(const char* list) {
    fb::jit::set_log_sink([this](std::string_view line) { lines.emplace_back(line); });
    fb::set_logs(list);
  }
  ~captured_logs() {
    fb::set_logs("");
    fb::jit::set_log_sink({});
  }
  std::vector<std::string> lines;
};

}  // namespace

TEST_CASE("compiled::disable runs one function eagerly, counted and logged; enable() compiles again",
          "[compile][rollback]") {
  fb::tensor<float, fb::shape<32>> w, b;
  w.fill_random(2, 0.5f, 1.5f);
  b.fill_random(3, -1.0f, 1.0f);
  fb::tensor<float, fb::shape<16, 32>> x;
  x.fill_random(1, -2.0f, 2.0f);

  auto f = fb::compile(model);
  auto other = fb::compile(model);
  REQUIRE(f.enabled());
  CHECK(kernel_spans_of([&] { check(x, w, b, f(x, w, b)); }) == 1);

  captured_logs logs("rollback");
  f.disable();
  CHECK_FALSE(f.enabled());
  const auto before = fb::jit::counters().rollback_calls.load();
  CHECK(kernel_spans_of([&] { check(x, w, b, f(x, w, b)); }) >= 5);  // mul, add, gelu, sigmoid, mul
  fb::tensor<float, fb::shape<16, 32>> out;
  f.run(out, x, w, b);  // the allocation-free entry point too
  check(x, w, b, out);
  CHECK(fb::jit::counters().rollback_calls.load() == before + 2);
  CHECK(kernel_spans_of([&] { check(x, w, b, other(x, w, b)); }) == 1);  // the other function is compiled
  CHECK(fb::jit::counters().rollback_calls.load() == before + 2);          // and not counted
  REQUIRE(logs.lines.size() == 1);  // once per switch, not once per call
  CHECK(logs.lines[0].find("[fusebox:rollback] a compiled function called with [16, 32], [32], [32] runs its model "
                           "eagerly: f.disable()") == 0);

  f.enable();
  CHECK(f.enabled());
  CHECK(kernel_spans_of([&] { check(x, w, b, f(x, w, b)); }) == 1);
  f.disable();  // a new switch is logged again
  check(x, w, b, f(x, w, b));
  CHECK(logs.lines.size() == 2);
}

TEST_CASE("compiled::disable on the run-time path compiles nothing", "[compile][rollback]") {
  fb::tensor<float, fb::shape<32>> w, b;
  w.fill_random(5, 0.5f, 1.5f);
  b.fill_random(6, -1.0f, 1.0f);
  auto f = fb::compile(model);
  f.disable();
  fb::jit::forbid_compiles(true);
  struct allow_again {
    ~allow_again() { fb::jit::forbid_compiles(false); }
  } restore;
  for (std::size_t rows : {3u, 17u}) {
    fb::tensor<float, fb::shape<fb::dyn, 32>> x(rows);
    x.fill_random(rows, -2.0f, 2.0f);
    check(x, w, b, f(x, w, b));  // a compile would throw compile_forbidden
  }
  CHECK(f.recompiles() == 0);
}
