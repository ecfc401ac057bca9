// tests/compile/graph_break.cpp: the two graph breaks of include/fusebox/graph_break.hpp inside compiled
// models: opaque(fn, x) (a user function on a concrete tensor) and item(x) (a value read on the
// host), each giving the same result as eager and as the formula; explain() lists each break with
// the source line of the call; fullgraph as a run-time option throws fusebox::graph_break naming
// that line (the build-time form is in tests/compile_fail/). FUSEBOX_LOGS=graph_breaks prints each
// break site once, on both paths; an unknown FUSEBOX_LOGS name warns in a static-only program.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <tuple>
#include <vector>

#include <fcntl.h>
#include <unistd.h>

#include <catch2/catch.hpp>

#include <fusebox/fusebox.hpp>
#include <fusebox/runtime/posix.hpp>

#include "../support/check.hpp"
#include "../support/child.hpp"

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

// ---- graph breaks on the run-time path: the extents a user function returns ----------------------
// An opaque()'s result type may have dyn extents; the run-time path learns them by running the part
// of the model before the break, then the function, and specialises the rest for what it returned
// (pipeline/dynamic_function.hpp, run_breaks). Each model runs at two batch sizes in a row, then the first again.

namespace {

using rows19 = fb::tensor<float, fb::shape<fb::dyn, 19>>;
int user_calls = 0;

/// 2 t, same extents.
auto doubled = [](const auto& t) {
  ++user_calls;
  rows19 r(t.extents());
  for (std::size_t i = 0; i < t.size(); ++i) r.flat(i) = 2 * t.flat(i);
  return r;
};
/// t without its first row: [n - 1, 19] from [n, 19].
auto drop_first_row = [](const auto& t) {
  ++user_calls;
  rows19 r(fb::dims{2, {t.extent(0) - 1, 19}});
  for (std::size_t i = 0; i < r.extent(0); ++i)
    for (std::size_t j = 0; j < 19; ++j) r.at(i, j) = t(i + 1, j);
  return r;
};
/// t transposed into another declared type: [19, n] from [n, 19].
auto transposed = [](const auto& t) {
  ++user_calls;
  fb::tensor<float, fb::shape<19, fb::dyn>> r(fb::dims{2, {19, t.extent(0)}});
  for (std::size_t i = 0; i < t.extent(0); ++i)
    for (std::size_t j = 0; j < 19; ++j) r.at(j, i) = t(i, j);
  return r;
};
/// A [n, 20] tensor handed back as the declared [dyn, 19] type: a static extent contradicted.
auto wrong_width = [](const auto& t) {
  fb::tensor<float, fb::shape<fb::dyn, 20>> w(t.extent(0));
  for (std::size_t i = 0; i < w.size(); ++i) w.flat(i) = 1;
  return rows19(w.owner(), w.data(), w.extents(), w.view().stride);
};

/// Its operand itself (a view of memory the call owns, no owner of its own).
auto itself = [](const auto& t) {
  ++user_calls;
  return t;
};

// clang-format off
auto output_model = [](const auto& v) { return fb::opaque(itself, v * 2.0); };
auto same_model = [](const auto& v) { return fb::softmax(fb::opaque(doubled, v * 0.5 + 1.0)); };
auto shrink_model = [](const auto& v) {
  auto o = fb::opaque(drop_first_row, v);
  return fb::softmax(o) + fb::sum(o, fb::axis<0>);
};
auto transpose_model = [](const auto& v) { return fb::softmax(fb::opaque(transposed, v) * 0.5); };
auto chain_model = [](const auto& v) { return fb::softmax(fb::opaque(drop_first_row, fb::opaque(doubled, v) + v)); };
const int wrong_line = __LINE__; auto wrong_model = [](const auto& v) { return fb::exp(fb::opaque(wrong_width, v)); };
// clang-format on

/// Softmax along the rows of a row-major [rows, cols] array of doubles.
std::vector<double> softmax_rows(std::vector<double> a, std::size_t rows, std::size_t cols) {
  for (std::size_t i = 0; i < rows; ++i) {
    double m = -INFINITY, s = 0;
    for (std::size_t j = 0; j < cols; ++j) m = std::max(m, a[i * cols + j]);
    for (std::size_t j = 0; j < cols; ++j) s += std::exp(a[i * cols + j] - m);
    for (std::size_t j = 0; j < cols; ++j) a[i * cols + j] = std::exp(a[i * cols + j] - m) / s;
  }
  return a;
}

rows19 random_rows(std::size_t n, std::uint64_t seed) {
  rows19 x(n);
  fbt::fill_signed(x, seed, 0.05, 2.0);
  return x;
}

/// Checks y's extents and every element against ref (row-major [rows, cols]).
void check_rows(const fb::tensor<float, fb::shape<fb::dyn, 19>>& y, const std::vector<double>& ref, std::size_t rows,
                const std::string& what) {
  INFO(what);
  REQUIRE(y.extents() == (fb::dims{2, {rows, 19}}));
  fbt::check_all(y, [&](const coord& i) { return ref[i[0] * 19 + i[1]]; }, {1e-7, 2e-6}, what);
}

}  // namespace

/// Runs `check` on a fresh random [n, 19] input for n = 6, 11, 6 (one compiled function: a new
/// batch size, then the first again).
template <class F>
void at_batches(F&& check) {
  for (std::size_t n : {6u, 11u, 6u}) {
    const rows19 x = random_rows(n, 70 + n);
    INFO("batch " << n);
    check(x, n, [&](std::size_t i, std::size_t j) { return static_cast<double>(x(i, j)); });
  }
}

TEST_CASE("graph breaks on the run-time path: downstream kernels get the extents the function returned",
          "[compile][graph_break][dyn]") {
  SECTION("same extents: softmax(opaque(2 t, x / 2 + 1))") {
    auto f = fb::compile(same_model);
    at_batches([&](const rows19& x, std::size_t n, auto xd) {
      std::vector<double> ref(n * 19);
      for (std::size_t i = 0; i < n; ++i)
        for (std::size_t j = 0; j < 19; ++j) ref[i * 19 + j] = 2 * (xd(i, j) * 0.5 + 1.0);
      user_calls = 0;
      const auto y = f(x);
      CHECK(user_calls == 1);
      check_rows(y, softmax_rows(ref, n, 19), n, "same extents");
      check_rows(fb::eager(same_model)(x), softmax_rows(ref, n, 19), n, "eager");
    });
  }
  SECTION("changed extents under reduce_overhead (its fast path keys on the returned extents too)") {
    auto f = fb::compile(shrink_model, {.mode = fb::mode::reduce_overhead});
    for (int repeat = 0; repeat < 2; ++repeat)
      at_batches([&](const rows19& x, std::size_t n, auto xd) {
        std::vector<double> o((n - 1) * 19), col(19, 0.0);
        for (std::size_t i = 0; i + 1 < n; ++i)
          for (std::size_t j = 0; j < 19; ++j) col[j] += o[i * 19 + j] = xd(i + 1, j);
        std::vector<double> ref = softmax_rows(o, n - 1, 19);
        for (std::size_t i = 0; i + 1 < n; ++i)
          for (std::size_t j = 0; j < 19; ++j) ref[i * 19 + j] += col[j];
        check_rows(f(x), ref, n - 1, "changed extents, reduce_overhead");
      });
  }
  SECTION("changed extents: [n - 1, 19] from [n, 19], rows and a column sum after it") {
    auto f = fb::compile(shrink_model);
    at_batches([&](const rows19& x, std::size_t n, auto xd) {
      std::vector<double> o((n - 1) * 19), col(19, 0.0);
      for (std::size_t i = 0; i + 1 < n; ++i)
        for (std::size_t j = 0; j < 19; ++j) col[j] += o[i * 19 + j] = xd(i + 1, j);
      std::vector<double> ref = softmax_rows(o, n - 1, 19);
      for (std::size_t i = 0; i + 1 < n; ++i)
        for (std::size_t j = 0; j < 19; ++j) ref[i * 19 + j] += col[j];
      user_calls = 0;
      const auto y = f(x);
      CHECK(user_calls == 1);
      check_rows(y, ref, n - 1, "changed extents");
    });
  }
  SECTION("another declared type: [19, n] from [n, 19], rows of the varying length") {
    auto f = fb::compile(transpose_model);
    at_batches([&](const rows19& x, std::size_t n, auto xd) {
      std::vector<double> o(19 * n);
      for (std::size_t i = 0; i < n; ++i)
        for (std::size_t j = 0; j < 19; ++j) o[j * n + i] = 0.5 * xd(i, j);
      const std::vector<double> ref = softmax_rows(o, 19, n);
      user_calls = 0;
      const auto y = f(x);
      CHECK(user_calls == 1);
      REQUIRE(y.extents() == (fb::dims{2, {19, n}}));
      fbt::check_all(y, [&](const coord& i) { return ref[i[0] * n + i[1]]; }, {1e-7, 2e-6}, "transposed");
    });
  }
  SECTION("a break after a break: softmax(opaque(drop row, opaque(2 t, x) + x))") {
    auto f = fb::compile(chain_model);
    at_batches([&](const rows19& x, std::size_t n, auto xd) {
      std::vector<double> o((n - 1) * 19);
      for (std::size_t i = 0; i + 1 < n; ++i)
        for (std::size_t j = 0; j < 19; ++j) o[i * 19 + j] = 3 * xd(i + 1, j);
      user_calls = 0;
      const auto y = f(x);
      CHECK(user_calls == 2);
      check_rows(y, softmax_rows(o, n - 1, 19), n - 1, "chained");
    });
  }
  SECTION("the result is the output, a view of the function's operand") {
    auto f = fb::compile(output_model);
    at_batches([&](const rows19& x, std::size_t n, auto xd) {
      std::vector<double> ref(n * 19);
      for (std::size_t i = 0; i < n; ++i)
        for (std::size_t j = 0; j < 19; ++j) ref[i * 19 + j] = 2 * xd(i, j);
      user_calls = 0;
      const auto y = f(x);
      CHECK(user_calls == 1);
      check_rows(y, ref, n, "opaque(t -> t, 2 x)");
      const std::string plan = fb::explain_text(output_model, x);
      INFO(plan);
      CHECK(plan.find("?") == std::string::npos);  // every extent known
    });
  }
  SECTION("a static extent the function contradicts: graph_break naming the call and both shapes") {
    auto f = fb::compile(wrong_model);
    at_batches([&](const rows19& x, std::size_t n, auto) {
      REQUIRE_THROWS_AS(f(x), fb::graph_break);
      REQUIRE_THROWS_WITH(f(x), Catch::Contains(std::string(__FILE__) + ":" + std::to_string(wrong_line)) &&
                                    Catch::Contains("[" + std::to_string(n) + ", 20]") && Catch::Contains("[?, 19]"));
    });
  }
}

// item() evaluates its operand during capture as one segment; on the run-time path that segment must
// be one kernel (a multi-kernel one is a build error in backend/cpu/evaluate.hpp), here a row sum.
TEST_CASE("graph breaks on the run-time path: item() reads the value of each call", "[compile][graph_break][dyn]") {
  auto model = [](const auto& x, const auto& s) { return x / fb::item(fb::sum(s, fb::axis<0>)); };
  auto f = fb::compile(model);
  for (std::size_t n : {6u, 11u, 6u}) {
    fb::tensor<float, fb::shape<fb::dyn, 33>> x(n);
    fb::tensor<float, fb::shape<fb::dyn>> s(n + 3);
    fbt::fill_signed(x, 80 + n, 0.05, 1.0);
    fbt::fill_uniform(s, 90 + n, 0.5, 1.0);
    double total = 0;
    for (std::size_t i = 0; i < s.size(); ++i) total += s.flat(i);
    const auto y = f(x, s);
    INFO("batch " << n);
    REQUIRE(y.extents() == (fb::dims{2, {n, 33}}));
    fbt::check_all(y, [&](const coord& i) { return fbt::at(x, i, 2) / total; }, {1e-9, 1e-5}, "x / item(sum(s))");
  }
}

// ---- FUSEBOX_LOGS=graph_breaks (issue 20, item 15) -------------------------------------------------

namespace {

/// Everything written to stderr (fd 2) while it lives.
class stderr_capture {
 public:
  stderr_capture() : dir_(fb::jit::detail::temp_root(), "fusebox-test-stderr-") {
    std::fflush(stderr);
    saved_ = ::dup(2);
    const int fd = ::open((dir_.path() / "stderr.txt").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    REQUIRE(fd >= 0);
    ::dup2(fd, 2);
    ::close(fd);
  }
  ~stderr_capture() { restore(); }
  std::string text() {
    restore();
    std::ifstream in(dir_.path() / "stderr.txt");
    return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  }

 private:
  void restore() {
    if (saved_ < 0) return;
    std::fflush(stderr);
    ::dup2(saved_, 2);
    ::close(saved_);
    saved_ = -1;
  }
  fb::jit::temp_directory dir_;
  int saved_ = -1;
};

std::size_t count(const std::string& s, const std::string& part) {
  std::size_t n = 0;
  for (auto at = s.find(part); at != std::string::npos; at = s.find(part, at + 1)) ++n;
  return n;
}

struct logs_off_after {
  ~logs_off_after() { fb::set_logs(""); }
};

}  // namespace

TEST_CASE("graph breaks: FUSEBOX_LOGS=graph_breaks prints each break site once, static and run-time paths",
          "[compile][graph_break][logs]") {
  logs_off_after restore;
  fb::reset();  // forgets the sites logged so far
  const std::string opaque_site = "opaque() at " + std::string(__FILE__) + ":" + std::to_string(opaque_line);
  const std::string item_site = "item() at " + std::string(__FILE__) + ":" + std::to_string(item_line);

  SECTION("static shapes") {
    fb::tensor<float, fb::shape<17, 33>> x;
    fbt::fill_signed(x, 62, 0.05, 1.0);
    stderr_capture err;
    fb::set_logs("graph_breaks");
    auto f = fb::compile(opaque_model);
    const auto y1 = f(x);
    const auto y2 = f(x);  // the same site again: not logged again
    const auto z = fb::compile(item_model)(x);
    fb::set_logs("");
    const std::string text = err.text();
    INFO(text);
    CHECK(count(text, "[fusebox:graph_breaks] graph break: " + opaque_site) == 1);
    CHECK(count(text, "[fusebox:graph_breaks] graph break: " + item_site) == 1);
    CHECK(count(text, "[fusebox:graph_breaks]") == 2);
    fbt::check_identical(y1, y2, "the logged calls still compute");
    fbt::check_all(y1, [&](const coord& i) { return std::exp(2 * (fbt::at(x, i, 2) - 1)) + 1; }, {1e-7, 1e-6},
                   "exp(opaque(2 (x - 1))) + 1");
    (void)z;
  }
  SECTION("dyn shapes (the run-time path)") {
    fb::tensor<float, fb::shape<fb::dyn, 33>> x(9);
    fbt::fill_signed(x, 63, 0.05, 1.0);
    stderr_capture err;
    fb::set_logs("graph_breaks");
    auto f = fb::compile(opaque_model);
    // The kernels after the break run at the extents the function returned (run_breaks).
    const auto y1 = f(x);
    const auto y2 = f(x);
    fb::set_logs("");
    const std::string text = err.text();
    INFO(text);
    CHECK(count(text, "[fusebox:graph_breaks] graph break: " + opaque_site) == 1);
    CHECK(count(text, "[fusebox:graph_breaks]") == 1);
    REQUIRE(y1.extents() == x.extents());
    fbt::check_all(y1, [&](const coord& i) { return std::exp(2 * (fbt::at(x, i, 2) - 1)) + 1; }, {1e-7, 1e-6},
                   "exp(opaque(2 (x - 1))) + 1, run-time path");
    fbt::check_identical(y1, y2, "the second call");
  }
  SECTION("off: nothing") {
    fb::tensor<float, fb::shape<17, 33>> x;
    fbt::fill_signed(x, 64, 0.05, 1.0);
    stderr_capture err;
    (void)fb::compile(opaque_model)(x);
    CHECK(err.text().find("graph_breaks") == std::string::npos);
  }
}

// Run by the next test in a fresh process with FUSEBOX_LOGS set (hidden: "[.]"): a static-only
// program without graph breaks, which never logs anything.
TEST_CASE("graph breaks: static-only child", "[.][static-logs-child]") {
  fb::tensor<float, fb::shape<8, 16>> x;
  fbt::fill_signed(x, 65, 0.05, 1.0);
  const auto y = fb::compile([](auto x) { return fb::exp(x) + 1.0; })(x);
  fbt::check_all(y, [&](const coord& i) { return std::exp(fbt::at(x, i, 2)) + 1; }, {1e-7, 1e-6}, "exp(x) + 1");
}

TEST_CASE("FUSEBOX_LOGS: an unknown category warns in a static-only program too", "[compile][logs]") {
  fb::jit::temp_directory scratch(fb::jit::detail::temp_root(), "fusebox-test-logs-");
  const auto output = scratch.path() / "child.txt";
  const auto child = fbt::run_self("[static-logs-child]", {"FUSEBOX_LOGS=graph_breaks,no_such_topic"}, output);
  const std::string& text = child.text;
  INFO(text);
  CHECK(child.passed);
  CHECK(text.find("All tests passed") != std::string::npos);
  CHECK(count(text, "[fusebox] warning: FUSEBOX_LOGS: unknown category 'no_such_topic' ignored") == 1);
}
