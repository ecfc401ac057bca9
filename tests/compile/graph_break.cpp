// tests/compile/graph_break.cpp: the two graph breaks of include/fusebox/graph_break.hpp inside compiled
// models: opaque(fn, x) (a user function on a concrete tensor) and item(x) (a value read on the
// host), each giving the same result as eager and as the formula; explain() lists each break with
// the source line of the call; fullgraph as a run-time option throws fusebox::graph_break naming
// that line (the build-time form is in tests/compile_fail/). FUSEBOX_LOGS=graph_breaks prints each
// break site once, on both paths; an unknown FUSEBOX_LOGS name warns in a static-only program.
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <tuple>
#include <vector>

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>

#include <fusebox/fusebox.hpp>
#include <fusebox/jit/posix.hpp>

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
    // The values are not read: on the run-time path the kernels after an opaque() call get no
    // extents from jit::specialise ("rows over [?, 33]" in explain) and the result is empty (a
    // known defect of the run-time path, reported with issue 20; not this test's subject).
    (void)f(x);
    (void)f(x);
    fb::set_logs("");
    const std::string text = err.text();
    INFO(text);
    CHECK(count(text, "[fusebox:graph_breaks] graph break: " + opaque_site) == 1);
    CHECK(count(text, "[fusebox:graph_breaks]") == 1);
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
  const std::string self = std::filesystem::read_symlink("/proc/self/exe").string();
  std::vector<std::string> args = {self, "[static-logs-child]"};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::string setting = "FUSEBOX_LOGS=graph_breaks,no_such_topic";
  std::vector<char*> envp = {setting.data(), nullptr};
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 1, output.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  posix_spawn_file_actions_adddup2(&actions, 1, 2);
  pid_t pid = -1;
  REQUIRE(posix_spawn(&pid, self.c_str(), &actions, nullptr, argv.data(), envp.data()) == 0);
  posix_spawn_file_actions_destroy(&actions);
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  std::ifstream in(output);
  const std::string text{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  INFO(text);
  CHECK((WIFEXITED(status) && WEXITSTATUS(status) == 0));
  CHECK(text.find("All tests passed") != std::string::npos);
  CHECK(count(text, "[fusebox] warning: FUSEBOX_LOGS: unknown category 'no_such_topic' ignored") == 1);
}
