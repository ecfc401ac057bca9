// The run-time path's recompilation policy, stances and caches, through the public compile().
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <string_view>
#include <vector>

#include <catch2/catch.hpp>

#include <fusebox/fusebox.hpp>

#include "../support/private_cache.hpp"

namespace fb = fusebox;

namespace {

void cache() { fbt::use_private_cache("fusebox-policy-"); }

}  // namespace

// Not a check: the CTest fixture jit.prelude_seed runs this case alone, with FUSEBOX_CACHE_DIR set
// to the seed directory and FUSEBOX_CXXFLAGS=-O1, to build the precompiled prelude once for the
// tests that start from fresh caches (support/prelude_seed.hpp). Hidden from the default run.
// The seed keeps only the current prelude: a build tree's earlier runs (other headers) left theirs,
// which every user would otherwise copy too.
TEST_CASE("the kernel prelude the tests' fresh caches start with", "[.prelude_seed]") {
  namespace fs = std::filesystem;
  const fs::path file = fb::jit::kernel_store::instance().prelude_file();
  INFO("FUSEBOX_CACHE_DIR=" << (std::getenv("FUSEBOX_CACHE_DIR") ? std::getenv("FUSEBOX_CACHE_DIR") : "(unset)"));
  REQUIRE(!file.empty());
  REQUIRE(fs::is_regular_file(file));
  const fs::path entry = fs::canonical(file).parent_path();
  REQUIRE(entry.parent_path().filename() == "artifacts");  // published in the seed cache, not private
  for (const auto& other : fs::directory_iterator(entry.parent_path()))
    if (other.path() != entry) fs::remove_all(other.path());
  CHECK(std::distance(fs::directory_iterator(entry.parent_path()), fs::directory_iterator()) == 1);
}

// First of the cases that run, so that the prelude is not prepared yet in this process: with the
// fixture's seed in its private cache, the kernel store finds it there and builds none of its own
// (the log line is the only trace of a build). Without the seed (run outside CTest) nothing to check.
TEST_CASE("with the fixture's seed, a fresh private cache builds no kernel prelude of its own", "[jit][policy]") {
  cache();
  if (std::getenv("FUSEBOX_TEST_PRELUDE_SEED") == nullptr) {
    WARN("FUSEBOX_TEST_PRELUDE_SEED unset (not run by CTest): nothing to check");
    return;
  }
  std::vector<std::string> lines;
  fb::jit::set_log(fb::jit::log_category::kernels, true);
  fb::jit::set_log_sink([&lines](std::string_view line) { lines.emplace_back(line); });
  const std::filesystem::path file = fb::jit::kernel_store::instance().prelude_file();
  fb::jit::set_log_sink({});
  fb::jit::set_log(fb::jit::log_category::kernels, false);
  CHECK(file.string().find(std::getenv("FUSEBOX_CACHE_DIR")) == 0);  // the private cache's copy
  for (const auto& line : lines) {
    INFO(line);
    CHECK(line.find("precompiled the kernel prelude") == std::string::npos);
  }
}

namespace {

auto model = [](auto x, auto w, auto b) { return fb::softmax(fb::gelu(fb::matmul(x, w) + b)); };
using X = fb::tensor<float, fb::shape<fb::dyn, 24>>;
fb::tensor<float, fb::shape<24, 10>> weights() {
  fb::tensor<float, fb::shape<24, 10>> w;
  w.fill_random(2, -0.2f, 0.2f);
  return w;
}
fb::tensor<float, fb::shape<10>> bias() {
  fb::tensor<float, fb::shape<10>> b;
  b.fill_random(3);
  return b;
}

void check_against_eager(const X& x, const fb::tensor<float, fb::shape<fb::dyn, 10>>& y) {
  const auto w = weights();
  const auto b = bias();
  const auto e = fb::eager(model)(x, w, b);
  REQUIRE(e.extents() == y.extents());
  for (std::size_t i = 0; i < e.size(); ++i) REQUIRE(y.flat(i) == Approx(e.flat(i)).margin(1e-6));
}

}  // namespace

TEST_CASE("automatic: a batch dimension taking 20 values compiles at most twice", "[jit][policy]") {
  cache();
  auto fast = fb::compile(model);
  const auto w = weights();
  const auto b = bias();
  const auto before = fb::jit::counters().snapshot();
  for (std::size_t batch = 2; batch < 22; ++batch) {
    X x(batch);
    x.fill_random(batch);
    const auto y = fast(x, w, b);
    check_against_eager(x, y);
  }
  const auto after = fb::jit::counters().snapshot();
  CHECK(fast.recompiles() == 1);  // the first specialisation, then one with the batch symbolic
  CHECK(after.compiles - before.compiles <= 2);
  REQUIRE(!after.recompile_reasons.empty());
  CHECK(after.recompile_reasons.back().find("argument 0 dimension 0") != std::string::npos);
}

TEST_CASE("never: every new extent recompiles until the limit, then eager with one warning", "[jit][policy]") {
  cache();
  std::vector<std::string> warnings;
  fb::jit::set_log_sink([&](std::string_view line) { warnings.emplace_back(line); });
  auto fast = fb::compile(model, {.dynamic = fb::dynamic::never, .recompile_limit = 3});
  const auto w = weights();
  const auto b = bias();
  for (std::size_t batch = 2; batch < 10; ++batch) {
    X x(batch);
    x.fill_random(batch + 100);
    const auto y = fast(x, w, b);
    check_against_eager(x, y);  // still right past the limit: eager
  }
  fb::jit::set_log_sink(nullptr);
  CHECK(fast.recompiles() == 3);
  int limit_warnings = 0;
  for (const auto& line : warnings) limit_warnings += line.find("recompile_limit (3)") != std::string::npos;
  CHECK(limit_warnings == 1);
}

TEST_CASE("error_on_recompile throws recompile_error naming the guard and both values", "[jit][policy]") {
  cache();
  auto fast = fb::compile(model, {.error_on_recompile = true});
  const auto w = weights();
  const auto b = bias();
  X x4(4), x5(5);
  x4.fill_random(4);
  x5.fill_random(5);
  (void)fast(x4, w, b);
  try {
    (void)fast(x5, w, b);
    FAIL("a recompile was allowed");
  } catch (const fb::recompile_error& e) {
    const std::string what = e.what();
    CHECK(what.find("argument 0 dimension 0") != std::string::npos);
    CHECK(what.find("4") != std::string::npos);
    CHECK(what.find("5") != std::string::npos);
  }
}

TEST_CASE("stances: force_eager runs eagerly, fail_on_recompile refuses", "[jit][policy]") {
  cache();
  const auto w = weights();
  const auto b = bias();
  X x(6);
  x.fill_random(6);
  {
    fb::set_stance(fb::stance::force_eager);
    auto fast = fb::compile(model);
    const auto compiles = fb::jit::counters().compiles.load();
    X fresh(61);
    fresh.fill_random(61);
    check_against_eager(fresh, fast(fresh, w, b));
    CHECK(fb::jit::counters().compiles.load() == compiles);
    fb::set_stance(fb::stance::default_);
  }
  {
    auto fast = fb::compile(model);
    (void)fast(x, w, b);
    fb::set_stance(fb::stance::fail_on_recompile);
    X other(7);
    other.fill_random(7);
    CHECK_THROWS_AS(fast(other, w, b), fb::recompile_error);
    fb::set_stance(fb::stance::default_);
  }
}

TEST_CASE("a hinted range: symbolic guards keep to it, and an extent outside is a shape_error", "[jit][policy]") {
  cache();
  const auto w = weights();
  const auto b = bias();
  auto fast = fb::compile(model, {.dynamic = fb::dynamic::always});
  fast.hint(0, 0, 2, 64, 16);
  X ok(40), too_big(65);
  ok.fill_random(40);
  too_big.fill_random(65);
  check_against_eager(ok, fast(ok, w, b));
  CHECK_THROWS_AS(fast(too_big, w, b), fb::shape_error);
}

TEST_CASE("a warm process compiles nothing: a child with compiles forbidden runs from the disk cache",
          "[jit][cache]") {
  cache();
  const auto w = weights();
  const auto b = bias();
  {
    auto fast = fb::compile(model);
    X x(9);
    x.fill_random(9);
    (void)fast(x, w, b);  // fills the disk cache
  }
  fb::jit::kernel_store::instance().clear_memory();
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    // A fresh in-memory state: only the disk cache can serve the kernels.
    fb::jit::forbid_compiles(true);
    int status = 0;
    try {
      auto fast = fb::compile(model);
      X x(9);
      x.fill_random(9);
      const auto y = fast(x, w, b);
      const auto e = fb::eager(model)(x, w, b);
      for (std::size_t i = 0; i < e.size(); ++i)
        if (std::abs(y.flat(i) - e.flat(i)) > 1e-5f) status = 2;
    } catch (...) {
      status = 3;
    }
    std::_Exit(status);
  }
  int status = -1;
  ::waitpid(child, &status, 0);
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
}

TEST_CASE("FUSEBOX_LOGS=recompiles,guards: one line per event", "[jit][logs]") {
  cache();
  std::vector<std::string> lines;
  fb::jit::set_log_sink([&](std::string_view line) { lines.emplace_back(line); });
  fb::jit::set_logs("recompiles,guards");
  auto fast = fb::compile(model);
  const auto w = weights();
  const auto b = bias();
  X x3(3), x8(8);
  x3.fill_random(3);
  x8.fill_random(8);
  (void)fast(x3, w, b);
  (void)fast(x8, w, b);
  fb::jit::set_logs("");
  fb::jit::set_log_sink(nullptr);
  int guards = 0, recompiles = 0;
  for (const auto& l : lines) {
    guards += l.find("[fusebox:guards]") != std::string::npos;
    recompiles += l.find("[fusebox:recompiles]") != std::string::npos;
  }
  CHECK(guards == 2);
  CHECK(recompiles == 1);
}

TEST_CASE("a non-contiguous argument fails the stride guard and gets code that reads its strides", "[jit][guards]") {
  cache();
  auto t_model = [](auto x, auto w, auto b) { return fb::relu(x * 2.0f) + fb::sum(x, fb::axis<-1>, fb::keepdim) + b + w; };
  auto fast = fb::compile(t_model);
  fb::tensor<float, fb::shape<fb::dyn, fb::dyn>> base(13, 9), base_t(9, 13);
  base.fill_random(21);
  base_t.fill_random(22);
  const auto view = base_t.transpose();  // [13, 9] with inner stride 13
  fb::tensor<float, fb::shape<9>> w;
  fb::tensor<float, fb::shape<fb::dyn, 1>> b(13);
  w.fill_random(23);
  b.fill_random(24);
  const auto y1 = fast(base, w, b);
  const auto y2 = fast(view, w, b);
  CHECK(fast.recompiles() == 1);
  const auto e1 = fb::eager(t_model)(base, w, b);
  const auto e2 = fb::eager(t_model)(view, w, b);
  for (std::size_t i = 0; i < e1.size(); ++i) REQUIRE(y1.flat(i) == Approx(e1.flat(i)).margin(1e-5));
  for (std::size_t i = 0; i < e2.size(); ++i) REQUIRE(y2.flat(i) == Approx(e2.flat(i)).margin(1e-5));
}

TEST_CASE("a generated kernel that fails to compile: the call runs eagerly and the warning keeps the log",
          "[jit][fallback]") {
  cache();
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    // A compiler flag that does not exist: every compile fails.
    fb::jit::host_compiler_options broken;
    broken.extra_flags = {"--no-such-flag-for-fusebox"};
    fb::jit::kernel_store::instance().use_compiler(broken);
    std::string warning;
    fb::jit::set_log_sink([&](std::string_view line) { warning += line; });
    int status = 0;
    try {
      auto fast = fb::compile(model);
      X x(11);
      x.fill_random(11);
      const auto y = fast(x, weights(), bias());
      const auto e = fb::eager(model)(x, weights(), bias());
      for (std::size_t i = 0; i < e.size(); ++i)
        if (y.flat(i) != e.flat(i)) status = 2;
      if (warning.find("failed to compile") == std::string::npos || warning.find("no-such-flag") == std::string::npos)
        status = 3;
      auto strict = fb::compile(model, {.fullgraph = true});
      try {
        (void)strict(x, weights(), bias());
        status = 4;  // under fullgraph a failed compile must throw
      } catch (const fb::jit::compile_failure&) {
      }
    } catch (...) {
      status = 5;
    }
    std::_Exit(status);
  }
  int status = -1;
  ::waitpid(child, &status, 0);
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
}

TEST_CASE("profile: a compiled call records compile spans, cache events and kernel runs as a Chrome trace",
          "[jit][profile]") {
  cache();
  fb::reset();
  fb::profile::start();
  auto fast = fb::compile(model);
  X x(12);
  x.fill_random(12);
  (void)fast(x, weights(), bias());
  (void)fast(x, weights(), bias());
  fb::profile::stop();
  const auto events = fb::profile::events();
  int kernels = 0, compiles_or_hits = 0;
  for (const auto& e : events) {
    kernels += e.category == "kernel";
    compiles_or_hits += e.category == "compile" || e.category == "cache";
  }
  CHECK(kernels >= 2);
  CHECK(compiles_or_hits >= 1);
  fb::jit::temp_directory out(fb::jit::detail::temp_root(), "fusebox-trace-");
  const auto path = out.path() / "trace.json";
  fb::profile::write_chrome_trace(path);
  std::ifstream in(path);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  CHECK(text.find("\"traceEvents\"") != std::string::npos);
}

namespace {

/// A residual block x + gelu(layer_norm(x) @ w + b) with its own weights.
template <std::size_t D>
struct block {
  fb::tensor<float, fb::shape<D>> gamma, beta, bias;
  fb::tensor<float, fb::shape<D, D>> w;
  explicit block(std::uint64_t seed) {
    gamma.fill_random(seed, 0.5f, 1.5f);
    beta.fill_random(seed + 1);
    bias.fill_random(seed + 2);
    w.fill_random(seed + 3, -0.1f, 0.1f);
  }
};

auto block_fn = [](auto x, auto gamma, auto beta, auto w, auto bias) {
  return x + fb::gelu(fb::matmul(fb::layer_norm(x, gamma, beta, 1e-5f), w) + bias);
};

/// L blocks written as one expression. Every use of `h` copies its expression, so the tree (not
/// the type) grows as 4^L: this form is for small L; deep stacks compile the block (below).
template <std::size_t L, class X, class Blocks>
auto stack(const X& x, const Blocks& blocks) {
  if constexpr (L == 0) {
    return x;
  } else {
    const auto h = stack<L - 1>(x, blocks);
    const auto& p = blocks[L - 1];
    return block_fn(h, p.gamma, p.beta, p.w, p.bias);
  }
}

template <std::size_t D>
std::vector<block<D>> make_blocks(std::size_t layers) {
  std::vector<block<D>> blocks;
  for (std::size_t l = 0; l < layers; ++l) blocks.emplace_back(100 + 10 * l);
  return blocks;
}

template <std::size_t D>
void require_close(const fb::tensor<float, fb::shape<fb::dyn, D>>& y, const fb::tensor<float, fb::shape<fb::dyn, D>>& e) {
  REQUIRE(e.extents() == y.extents());
  for (std::size_t i = 0; i < e.size(); ++i) REQUIRE(y.flat(i) == Approx(e.flat(i)).epsilon(1e-4).margin(1e-5));
}

/// Distinct kernels compiled by the first call of an L-block stack written as one expression, and
/// its result against the same stack run eagerly.
template <std::size_t L, std::size_t D>
std::uint64_t stack_kernels_compiled() {
  const auto blocks = make_blocks<D>(L);
  auto f = [&blocks](auto in) { return stack<L>(in, blocks); };
  fb::tensor<float, fb::shape<fb::dyn, D>> x(5);
  x.fill_random(9);
  auto fast = fb::compile(f);
  const auto before = fb::jit::counters().kernels_compiled.load();
  const auto y = fast(x);
  const auto compiled = fb::jit::counters().kernels_compiled.load() - before;
  require_close(y, fb::tensor<float, fb::shape<fb::dyn, D>>(fb::eager(f)(x)));
  return compiled;
}

}  // namespace

TEST_CASE("identical blocks in one graph share their kernels (structural key)", "[jit][cache]") {
  cache();
  // Different widths, so neither stack finds the other's kernels in the cache.
  const auto one = stack_kernels_compiled<1, 24>();
  const auto two = stack_kernels_compiled<2, 40>();
  CHECK(one >= 2);  // the layer_norm rows kernel and the matmul epilogue at least
  // Block 1 reads the caller's input and later blocks read fusebox's buffers, which can give the
  // first block's kernel different alignment facts; nothing grows with the depth.
  CHECK(two <= one + 2);
}

TEST_CASE("regional compilation: 12 layers of one compiled block compile the block once", "[jit][cache]") {
  cache();
  // As torch.compile's regional compilation: the repeated layer is the compiled function, its
  // weights are arguments, and every layer after the first is a cache hit.
  constexpr std::size_t D = 56;
  const auto blocks = make_blocks<D>(12);
  auto layer = fb::compile(block_fn);
  fb::tensor<float, fb::shape<fb::dyn, D>> x(7);
  x.fill_random(11);
  const auto before = fb::jit::counters().kernels_compiled.load();
  fb::tensor<float, fb::shape<fb::dyn, D>> h = layer(x, blocks[0].gamma, blocks[0].beta, blocks[0].w, blocks[0].bias);
  const auto first = fb::jit::counters().kernels_compiled.load() - before;
  fb::tensor<float, fb::shape<fb::dyn, D>> e = fb::eager(block_fn)(x, blocks[0].gamma, blocks[0].beta, blocks[0].w, blocks[0].bias);
  for (std::size_t l = 1; l < blocks.size(); ++l) {
    const auto& p = blocks[l];
    h = layer(h, p.gamma, p.beta, p.w, p.bias);
    e = fb::eager(block_fn)(e, p.gamma, p.beta, p.w, p.bias);
  }
  CHECK(first >= 2);
  CHECK(fb::jit::counters().kernels_compiled.load() - before == first);
  require_close(h, e);
}

// ---- options::fast_math on the host ----------------------------------------------------------------
// Both host paths evaluate vmath::fast when asked: the static path when fast_math is a build-time
// option (the program type carries it), the run-time path when it is a run-time one (the generated
// kernels spell ops::fast_math_t<...>, and the kernel cache key has a fast_math field). Each result
// is checked, every element, against a double reference within the documented bound, and against
// the faithful result: they must differ somewhere, or the fast path was not taken.
namespace {

auto activations = [](auto x) { return fb::gelu(x) + fb::tanh(x) * fb::sigmoid(x) + fb::exp(x * 0.5f); };
double activations_ref(double x) {
  return 0.5 * x * std::erfc(-x / std::sqrt(2.0)) + std::tanh(x) / (1 + std::exp(-x)) + std::exp(0.5 * x);
}

/// Max abs error against the double reference, and max |a - b| between two results.
template <class A, class B, class X>
std::pair<double, double> fast_errors(const A& fast, const B& faithful, const X& x) {
  double worst = 0, apart = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    worst = std::max(worst, std::fabs(double(fast.flat(i)) - activations_ref(x.flat(i))));
    apart = std::max(apart, std::fabs(double(fast.flat(i)) - double(faithful.flat(i))));
  }
  return {worst, apart};
}

// x in [-3, 3]: fast math changes gelu only (vmath::fast: 0.5 |x| 3.6e-7 absolute, 5.4e-7 here); tanh,
// sigmoid and exp are the faithful ones (exp(1.5) = 4.5 within 1e-7 relative), plus the adds' rounding.
constexpr double fast_bound = 4e-6;
constexpr double faithful_bound = 3e-6;

}  // namespace

TEST_CASE("fast_math, static path: compile<options{.fast_math = true}> evaluates vmath::fast", "[jit][fast_math]") {
  fb::tensor<float, fb::shape<33, 70>> x;  // a tail after the vector body in every row
  x.fill_random(21, -3.0f, 3.0f);
  auto faithful = fb::compile(activations);
  auto fast = fb::compile<fb::options{.fast_math = true}>(activations);
  const auto yf = faithful(x);
  const auto y = fast(x);
  const auto [fast_err, apart] = fast_errors(y, yf, x);
  const auto [faithful_err, same] = fast_errors(yf, yf, x);
  INFO("fast max abs error " << fast_err << ", faithful " << faithful_err << ", apart " << apart);
  CHECK(fast_err <= fast_bound);
  CHECK(faithful_err <= faithful_bound);
  CHECK(apart > 1e-7);  // the fast path was taken
  CHECK(same == 0);
}

TEST_CASE("fast_math, run-time path: its own kernels (cache key), vmath::fast, within bound", "[jit][fast_math]") {
  cache();
  fb::tensor<float, fb::shape<fb::dyn, 70>> x(13);
  x.fill_random(22, -3.0f, 3.0f);
  auto faithful = fb::compile(activations);
  auto fast = fb::compile(activations, fb::options{.fast_math = true});
  const auto c0 = fb::jit::counters().kernels_compiled.load();
  const fb::tensor<float, fb::shape<fb::dyn, 70>> yf = faithful(x);
  const auto c1 = fb::jit::counters().kernels_compiled.load();
  const fb::tensor<float, fb::shape<fb::dyn, 70>> y = fast(x);
  const auto c2 = fb::jit::counters().kernels_compiled.load();
  // Same graph, same extents: had the keys been equal, the fast call would have hit the faithful
  // kernel in the memory cache and compiled nothing.
  CHECK(c1 - c0 >= 1);
  CHECK(c2 - c1 == c1 - c0);
  const auto [fast_err, apart] = fast_errors(y, yf, x);
  const auto [faithful_err, same] = fast_errors(yf, yf, x);
  INFO("fast max abs error " << fast_err << ", faithful " << faithful_err << ", apart " << apart);
  CHECK(fast_err <= fast_bound);
  CHECK(faithful_err <= faithful_bound);
  CHECK(apart > 1e-7);
  // and the same function with static shapes gives the same bits as the generated kernels
  fb::tensor<float, fb::shape<13, 70>> xs;
  for (std::size_t i = 0; i < xs.size(); ++i) xs.flat(i) = x.flat(i);
  const auto ys = fb::compile<fb::options{.fast_math = true}>(activations)(xs);
  for (std::size_t i = 0; i < xs.size(); ++i) REQUIRE(ys.flat(i) == y.flat(i));
}

TEST_CASE("fast_math as a run-time option on static host shapes is an error that names the fix", "[jit][fast_math]") {
  fb::tensor<float, fb::shape<4, 8>> x;
  x.fill_random(23);
  auto fast = fb::compile(activations, fb::options{.fast_math = true});
  CHECK_THROWS_WITH(fast(x), Catch::Contains("compile<options{.fast_math = true}>(model)") &&
                                 Catch::Contains("static shapes"));
}
