// tests/compile/graph_break.cpp: the two graph breaks of include/fusebox/graph_break.hpp inside compiled
// models: opaque(fn, x) (a user function on a concrete tensor) and item(x) (a value read on the
// host), each giving the same result as eager and as the formula; explain() lists each break with
// the source line of the call; fullgraph as a run-time option throws fusebox::graph_break naming
// that line (the build-time form is in tests/compile_fail/).
#include <cmath>
#include <string>
#include <tuple>

#include <catch2/catch.hpp>

#include <fusebox/fusebox.hpp>

#include "../support/check.hpp"

namespace fb = fusebox;
using fbt::coord;
using fbt::rel_diff;

namespace {
bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// The line of each break is recorded on the same line as the call.
auto twice = [](const auto& t) {
  auto out = t.clone();
  for (std::size_t i = 0; i < out.size(); ++i) out.flat(i) = 2 * t.flat(i);
  return out;
};
// clang-format off
const int opaque_line = __LINE__; auto opaque_model = [](auto x) { return fb::exp(fb::opaque(twice, x - 1.0)) + 1.0; };
const int item_line = __LINE__; auto item_model = [](auto x) { return x / fb::item(fb::sum(fb::sum(x, fb::axis<1>), fb::axis<0>)); };
// clang-format on

}  // namespace

TEST_CASE("graph breaks: opaque() and item() give correct results", "[compile][graph_break]") {
  fb::tensor<float, fb::shape<17, 33>> x;
  fbt::fill_signed(x, 61, 0.05, 1.0);

  SECTION("opaque()") {
    const auto c = fb::compile(opaque_model)(x);
    fbt::check_all(c, [&](const coord& i) { return std::exp(2 * (fbt::at(x, i, 2) - 1)) + 1; }, {1e-7, 1e-6},
                   "exp(opaque(2 (x - 1))) + 1");
    fbt::check_identical(c, fb::eager(opaque_model)(x), "eager == compiled");
    const std::string plan = fb::explain_text(opaque_model, x);
    INFO(plan);
    CHECK(contains(plan, "1 graph break(s)"));
    CHECK(contains(plan, "graph break: opaque() at " + std::string(__FILE__) + ":" + std::to_string(opaque_line)));
    CHECK(contains(plan, "opaque (user function: graph break)"));
  }
  SECTION("item()") {
    double total = 0;
    for (std::size_t i = 0; i < x.size(); ++i) total += x.flat(i);
    const auto c = fb::compile(item_model)(x);
    fbt::check_all(c, [&](const coord& i) { return fbt::at(x, i, 2) / total; }, {1e-9, 1e-4}, "x / item(sum(x))");
    CHECK(rel_diff(c, fb::eager(item_model)(x)) <= 1e-6);
    const std::string plan = fb::explain_text(item_model, x);
    INFO(plan);
    CHECK(contains(plan, "2 segment(s), 1 graph break(s)"));
    CHECK(contains(plan, "graph break: item() at " + std::string(__FILE__) + ":" + std::to_string(item_line)));
    CHECK(contains(plan, "segment 1 (runs at the break"));
  }
  SECTION("fullgraph as a run-time option throws fusebox::graph_break naming the line") {
    auto c = fb::compile(opaque_model, {.fullgraph = true});
    REQUIRE_THROWS_AS(c(x), fb::graph_break);
    REQUIRE_THROWS_WITH(c(x), Catch::Contains("opaque() under fullgraph") &&
                                  Catch::Contains(std::string(__FILE__) + ":" + std::to_string(opaque_line)));
    auto ci = fb::compile(item_model, {.fullgraph = true});
    REQUIRE_THROWS_WITH(ci(x), Catch::Contains("item() under fullgraph") &&
                                   Catch::Contains(std::string(__FILE__) + ":" + std::to_string(item_line)));
    // Without breaks, fullgraph changes nothing.
    auto plain = [](auto x) { return fb::exp(x) + 1.0; };
    fbt::check_identical(fb::compile(plain, {.fullgraph = true})(x), fb::compile(plain)(x), "fullgraph, no break");
  }
}
