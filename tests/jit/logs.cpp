// Tests for include/fusebox/runtime/logs.hpp: categories parsed from a list (and from FUSEBOX_LOGS
// in a fresh process), unknown names warned once, one prefixed line per event on stderr, lines
// from many threads never interleaved.
#include <catch2/catch.hpp>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <thread>
#include <vector>

#include <fcntl.h>
#include <unistd.h>

#include "fusebox/runtime/logs.hpp"
#include "fusebox/runtime/posix.hpp"

#include "../support/child.hpp"

namespace jit = fusebox::jit;
using jit::log_category;

namespace {

struct captured_logs {
  captured_logs() {
    jit::set_log_sink([this](std::string_view line) {
      lines.emplace_back(line);
    });
  }
  ~captured_logs() { jit::set_log_sink({}); }
  std::vector<std::string> lines;
};

/// Restores the enabled set at the end of a test.
struct logs_off_after {
  ~logs_off_after() { jit::set_logs(""); }
};

}  // namespace

TEST_CASE("logs: a list enables exactly its categories", "[jit][logs]") {
  logs_off_after restore;
  fusebox::set_logs("recompiles,cache");
  CHECK(jit::enabled(log_category::recompiles));
  CHECK(jit::enabled(log_category::cache));
  CHECK_FALSE(jit::enabled(log_category::kernels));
  CHECK_FALSE(jit::enabled(log_category::output_code));
  jit::set_logs(" guards , autotune,,");
  CHECK(jit::enabled(log_category::guards));
  CHECK(jit::enabled(log_category::autotune));
  CHECK_FALSE(jit::enabled(log_category::cache));
  jit::set_logs("all");
  for (const auto c : {log_category::recompiles, log_category::guards, log_category::graph_breaks,
                       log_category::kernels, log_category::cache, log_category::output_code,
                       log_category::autotune})
    CHECK(jit::enabled(c));
  jit::set_log(log_category::kernels, false);
  CHECK_FALSE(jit::enabled(log_category::kernels));
  CHECK(jit::enabled(log_category::cache));
  jit::set_logs("");
  CHECK_FALSE(jit::enabled(log_category::cache));
  CHECK(jit::category_name(log_category::graph_breaks) == "graph_breaks");
}

TEST_CASE("logs: one prefixed line per event; disabled categories print nothing",
          "[jit][logs]") {
  logs_off_after restore;
  captured_logs logs;
  jit::set_logs("cache,output_code");
  jit::log(log_category::cache, "disk hit: artifact 0123");
  jit::log(log_category::kernels, "not shown");
  jit::log(log_category::output_code, "int f() {\n  return 1;\n}\n");
  REQUIRE(logs.lines.size() == 4);
  CHECK(logs.lines[0] == "[fusebox:cache] disk hit: artifact 0123\n");
  CHECK(logs.lines[1] == "[fusebox:output_code] int f() {\n");
  CHECK(logs.lines[2] == "[fusebox:output_code]   return 1;\n");
  CHECK(logs.lines[3] == "[fusebox:output_code] }\n");
}

TEST_CASE("logs: an unknown name warns once and is ignored", "[jit][logs]") {
  logs_off_after restore;
  captured_logs logs;
  jit::set_logs("cache,no_such_category");
  jit::set_logs("no_such_category,cache");
  CHECK(jit::enabled(log_category::cache));
  REQUIRE(logs.lines.size() == 1);
  CHECK(logs.lines[0].rfind("[fusebox] warning: FUSEBOX_LOGS: unknown category "
                            "'no_such_category'", 0) == 0);
}

TEST_CASE("logs: lines from many threads arrive whole", "[jit][logs]") {
  logs_off_after restore;
  captured_logs logs;
  jit::set_logs("kernels");
  constexpr int threads = 4, each = 300;
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t)
    pool.emplace_back([t] {
      for (int i = 0; i < each; ++i)
        jit::log(log_category::kernels,
                 "thread " + std::to_string(t) + " line " + std::to_string(i) + " " +
                     std::string(50, static_cast<char>('a' + t)));
    });
  for (auto& t : pool) t.join();
  REQUIRE(logs.lines.size() == threads * each);
  std::vector<int> next(threads, 0);
  for (const auto& line : logs.lines) {
    int t = -1, i = -1;
    REQUIRE(std::sscanf(line.c_str(), "[fusebox:kernels] thread %d line %d", &t, &i) == 2);
    REQUIRE((t >= 0 && t < threads));
    CHECK(i == next[t]++);  // each thread's lines in its own order
    CHECK(line.size() == line.find(' ', line.find("line ") + 5) + 1 + 50 + 1);
    CHECK(line.back() == '\n');
  }
}

TEST_CASE("logs: the default sink is stderr", "[jit][logs]") {
  logs_off_after restore;
  jit::temp_directory scratch(jit::detail::temp_root(), "fusebox-test-logs-");
  const auto file = scratch.path() / "stderr.txt";
  std::fflush(stderr);
  const int saved = ::dup(2);
  const int fd = ::open(file.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  REQUIRE(fd >= 0);
  ::dup2(fd, 2);
  ::close(fd);
  jit::set_logs("recompiles");
  jit::log(log_category::recompiles, "f: batch 64 -> 32");
  jit::warn("something to know");
  std::fflush(stderr);
  ::dup2(saved, 2);
  ::close(saved);
  std::ifstream in(file);
  const std::string text{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  CHECK(text ==
        "[fusebox:recompiles] f: batch 64 -> 32\n[fusebox] warning: something to know\n");
}

// Run by the next test in a fresh process with FUSEBOX_LOGS set (hidden: "[.]").
TEST_CASE("logs: environment child", "[.][logs-env-child]") {
  CHECK(jit::enabled(log_category::kernels));
  CHECK(jit::enabled(log_category::guards));
  CHECK_FALSE(jit::enabled(log_category::cache));
}

TEST_CASE("logs: FUSEBOX_LOGS is read at start-up", "[jit][logs]") {
  jit::temp_directory scratch(jit::detail::temp_root(), "fusebox-test-logs-");
  const auto output = scratch.path() / "child.txt";
  const auto child = fbt::run_self("[logs-env-child]", {"FUSEBOX_LOGS=kernels,not_a_category,guards"}, output);
  const std::string& text = child.text;
  INFO(text);
  CHECK(child.passed);
  CHECK(text.find("unknown category 'not_a_category'") != std::string::npos);
  CHECK(text.find("All tests passed") != std::string::npos);
}
