// tests/compile/modes.cpp: what options::mode does on the CPU (compile.hpp, backend/cpu/autotune.hpp,
// backend/cpu/winner_store.hpp, pipeline/dynamic_function.hpp's fast path, explain.hpp).
//   max_autotune  gemm and conv2d take timed choices, equal to the double reference (every
//                 element) and to default mode; winners persist in the cache directory, so a
//                 fresh in-memory state times nothing; default mode never tunes.
//   reduce_overhead  an exact repeat of a call signature takes the fast path (a counter); a
//                 change of any guarded fact (extent, inner stride, alignment, which scalars are
//                 equal) does not; results are right in every case.
//   explain()     says what each mode does on the CPU.
// Small shapes: the whole file runs in a few seconds (its JIT kernels compile at -O1 in a
// private cache).
#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include <fusebox/fusebox.hpp>

#include "../support/check.hpp"
#include "../support/private_cache.hpp"

namespace fb = fusebox;

namespace {

void cache() { fbt::use_private_cache("fusebox-modes-"); }

fb::jit::counter_snapshot counts() { return fb::jit::counters().snapshot(); }

/// Every element of `got` within `tol` * scale[i] of the double reference.
template <class Got>
void check_elements(const Got& got, const std::vector<double>& ref, const std::vector<double>& scale, double tol,
                    const std::string& what) {
  INFO(what);
  REQUIRE(got.size() == ref.size());
  for (std::size_t i = 0; i < ref.size(); ++i) {
    INFO("element " << i << ": " << got.flat(i) << " vs " << ref[i]);
    REQUIRE(std::fabs(double(got.flat(i)) - ref[i]) <= tol * scale[i] + 1e-30);
  }
}

/// relu(x w + b) in double, and per element sum |x||w| + |b| (the rounding scale).
template <class X, class W, class B>
void linear_relu_ref(const X& x, const W& w, const B& b, std::vector<double>& ref, std::vector<double>& scale) {
  const std::size_t M = x.extents().extent[0], K = x.extents().extent[1], N = w.extents().extent[1];
  ref.assign(M * N, 0);
  scale.assign(M * N, 0);
  for (std::size_t i = 0; i < M; ++i)
    for (std::size_t j = 0; j < N; ++j) {
      double s = b.flat(j), a = std::fabs(double(b.flat(j)));
      for (std::size_t k = 0; k < K; ++k) {
        s += double(x.flat(i * K + k)) * double(w.flat(k * N + j));
        a += std::fabs(double(x.flat(i * K + k)) * double(w.flat(k * N + j)));
      }
      ref[i * N + j] = s > 0 ? s : 0;
      scale[i * N + j] = a;
    }
}

auto linear_relu = [](const auto& x, const auto& w, const auto& b) { return fb::relu(fb::matmul(x, w) + b); };

/// Autotune log lines while it lives.
struct autotune_log {
  std::vector<std::string> lines;
  autotune_log() {
    fb::jit::set_log_sink([this](std::string_view l) { lines.emplace_back(l); });
    fb::jit::set_logs("autotune");
  }
  ~autotune_log() {
    fb::jit::set_logs("");
    fb::jit::set_log_sink(nullptr);
  }
  int count(const std::string& part) const {
    int n = 0;
    for (const auto& l : lines) n += l.find(part) != std::string::npos;
    return n;
  }
};

template <class M, class K, class N>
void check_linear(std::uint64_t seed) {
  fb::tensor<float, fb::shape<M::value, K::value>> x;
  fb::tensor<float, fb::shape<K::value, N::value>> w;
  fb::tensor<float, fb::shape<N::value>> b;
  fbt::fill_signed(x, seed, 0.1, 1.0);
  fbt::fill_signed(w, seed + 1, 0.1, 1.0);
  fbt::fill_signed(b, seed + 2, 0.1, 1.0);
  std::vector<double> ref, scale;
  linear_relu_ref(x, w, b, ref, scale);
  const std::string what = "relu(x w + b), M " + std::to_string(M::value) + " K " + std::to_string(K::value) + " N " +
                           std::to_string(N::value);
  auto tuned = fb::compile(linear_relu, fb::options{.mode = fb::mode::max_autotune});
  auto plain = fb::compile(linear_relu);
  const auto before = counts();
  const auto y = tuned(x, w, b);
  CHECK(counts().autotune_timed == before.autotune_timed + 1);  // this problem, timed once
  check_elements(y, ref, scale, 4e-7, what + ", max_autotune");
  const auto y2 = tuned(x, w, b);  // the winner from memory
  CHECK(counts().autotune_timed == before.autotune_timed + 1);
  check_elements(y2, ref, scale, 4e-7, what + ", max_autotune again");
  const auto d = plain(x, w, b);
  for (std::size_t i = 0; i < ref.size(); ++i) REQUIRE(std::fabs(double(y.flat(i)) - double(d.flat(i))) <= 8e-7 * scale[i]);
}

template <std::size_t N>
using I = std::integral_constant<std::size_t, N>;

}  // namespace

TEST_CASE("reduce_overhead: a repeated call signature takes the fast path; any guarded change does not",
          "[compile][modes][reduce_overhead]") {
  cache();
  float s1 = 0.5f, s2 = 0.75f;
  auto model = [&](const auto& x) { return x * s1 + fb::exp(x * s2); };
  using X = fb::tensor<float, fb::shape<fb::dyn, fb::dyn>>;
  auto check = [&](const auto& y, const auto& x, const char* what) {
    INFO(what);
    REQUIRE(y.extents() == x.extents());
    const std::size_t R = x.extents().extent[0], C = x.extents().extent[1];
    for (std::size_t r = 0; r < R; ++r)
      for (std::size_t c = 0; c < C; ++c) {
        const double v = x(r, c), want = v * double(s1) + std::exp(v * double(s2));
        REQUIRE(std::fabs(double(y(r, c)) - want) <= 2e-6 * (std::fabs(v * double(s1)) + std::exp(v * double(s2))));
      }
  };
  auto fast = fb::compile(model, fb::options{.mode = fb::mode::reduce_overhead});
  auto plain = fb::compile(model);
  X a(5, 19), b(5, 19), c(7, 19), big(9, 19), base_t(19, 5);
  fbt::fill_signed(a, 301, 0.1, 2.0);
  fbt::fill_signed(b, 302, 0.1, 2.0);
  fbt::fill_signed(c, 303, 0.1, 2.0);
  fbt::fill_signed(big, 304, 0.1, 2.0);
  fbt::fill_signed(base_t, 305, 0.1, 2.0);
  auto taken = [&](auto&& call) {
    const auto before = counts().fast_path_calls;
    call();
    return counts().fast_path_calls - before;
  };

  CHECK(taken([&] { check(fast(a), a, "first call"); }) == 0);
  CHECK(taken([&] { check(fast(b), b, "same signature, other data"); }) == 1);
  CHECK(taken([&] { check(fast(a), a, "same signature again"); }) == 1);
  CHECK(taken([&] { check(fast(c), c, "another extent"); }) == 0);
  CHECK(taken([&] { check(fast(c), c, "that extent again"); }) == 1);
  CHECK(taken([&] { check(fast(a), a, "the first extent (still kept)"); }) == 1);

  const auto view = base_t.transpose();  // [5, 19] with inner stride 5
  CHECK(taken([&] { check(fast(view), view, "inner stride not 1"); }) == 0);
  const auto shifted = big.slice<0>(1, 6);  // [5, 19], 76 bytes past a 64-byte boundary
  REQUIRE(reinterpret_cast<std::uintptr_t>(&shifted(0, 0)) % 64 != 0);
  CHECK(taken([&] { check(fast(shifted), shifted, "not 64-byte aligned"); }) == 0);

  s2 = s1;  // the two scalars are now equal: the program computes x * s once
  CHECK(taken([&] { check(fast(a), a, "scalars equal"); }) == 0);
  CHECK(taken([&] { check(fast(b), b, "scalars equal, again"); }) == 1);
  s1 = 0.25f;
  s2 = 0.625f;  // different again, other values than the first call's: the values are read per call
  CHECK(taken([&] { check(fast(a), a, "scalars differ, new values"); }) == 1);
  s1 = 0.375f;
  s2 = 0.375f;
  CHECK(taken([&] { check(fast(b), b, "scalars equal, new values"); }) == 1);

  // Default mode never takes it.
  CHECK(taken([&] {
          check(plain(a), a, "default mode");
          check(plain(a), a, "default mode, repeated");
        }) == 0);
}

TEST_CASE("max_autotune: gemm and conv2d take timed choices, equal to the double reference and to default mode",
          "[compile][modes][autotune]") {
  cache();
  fb::reset();
  autotune_log log;
  check_linear<I<37>, I<96>, I<80>>(401);  // blocked path: grid and threads
  check_linear<I<4>, I<96>, I<80>>(411);   // gemv rows vs blocked
  CHECK(log.count("chose #") == 2);
  CHECK(log.count("candidates timed") == 2);

  // conv2d 5x5 at unit stride, 8 channels in and out (Winograd's rule): direct vs Winograd, and
  // threads.
  fb::tensor<float, fb::shape<2, 8, 12, 12>> x;
  fb::tensor<float, fb::shape<8, 8, 5, 5>> w;
  fbt::fill_signed(x, 421, 0.1, 1.0);
  fbt::fill_signed(w, 422, 0.1, 1.0);
  auto conv = [](const auto& x, const auto& w) { return fb::conv2d(x, w); };
  std::vector<double> ref(2 * 8 * 8 * 8), scale(ref.size());
  for (std::size_t n = 0; n < 2; ++n)
    for (std::size_t o = 0; o < 8; ++o)
      for (std::size_t i = 0; i < 8; ++i)
        for (std::size_t j = 0; j < 8; ++j) {
          double s = 0, a = 0;
          for (std::size_t c = 0; c < 8; ++c)
            for (std::size_t p = 0; p < 5; ++p)
              for (std::size_t q = 0; q < 5; ++q) {
                const double t = double(x(n, c, i + p, j + q)) * double(w(o, c, p, q));
                s += t;
                a += std::fabs(t);
              }
          const std::size_t at = ((n * 8 + o) * 8 + i) * 8 + j;
          ref[at] = s;
          scale[at] = a;
        }
  const auto before = counts();
  auto tuned = fb::compile(conv, fb::options{.mode = fb::mode::max_autotune});
  const auto y = tuned(x, w);
  CHECK(counts().autotune_timed == before.autotune_timed + 1);
  CHECK(log.count("winograd") >= 1);
  CHECK(log.count("direct") >= 1);
  // Winograd's rounding bound (backend/cpu/winograd.hpp: 64 eps * sum |products|), whichever wins.
  check_elements(y, ref, scale, 64 * 0x1p-23, "conv2d 5x5, max_autotune");
  const auto d = fb::compile(conv)(x, w);
  check_elements(d, ref, scale, 64 * 0x1p-23, "conv2d 5x5, default");
  (void)tuned(x, w);
  CHECK(counts().autotune_timed == before.autotune_timed + 1);
}

TEST_CASE("max_autotune: a static rows kernel takes a timed task split, equal to the double reference",
          "[compile][modes][autotune]") {
  cache();
  fb::reset();
  autotune_log log;
  // 64 rows of 300: softmax is one rows kernel with two passes; 64 tasks of one row at least
  // (min_task_elems / 300), so one thread and larger tasks are both real choices.
  fb::tensor<float, fb::shape<64, 300>> x;
  fbt::fill_signed(x, 431, 0.1, 3.0);
  std::vector<double> ref(x.size()), scale(x.size(), 1.0);
  for (std::size_t r = 0; r < 64; ++r) {
    double m = -INFINITY, sum = 0;
    for (std::size_t c = 0; c < 300; ++c) m = std::max(m, double(x(r, c)));
    for (std::size_t c = 0; c < 300; ++c) sum += std::exp(double(x(r, c)) - m);
    for (std::size_t c = 0; c < 300; ++c) ref[r * 300 + c] = std::exp(double(x(r, c)) - m) / sum;
  }
  auto model = [](const auto& v) { return fb::softmax(v); };
  auto tuned = fb::compile(model, fb::options{.mode = fb::mode::max_autotune, .threads = 2});
  const auto before = counts();
  const auto y = tuned(x);
  CHECK(counts().autotune_timed == before.autotune_timed + 1);
  CHECK(log.count("rows f32 [64, 300]") >= 1);
  CHECK(log.count("1 thread") >= 1);
  check_elements(y, ref, scale, 1e-6, "softmax, max_autotune");
  const auto y2 = tuned(x);  // the winner from memory
  CHECK(counts().autotune_timed == before.autotune_timed + 1);
  check_elements(y2, ref, scale, 1e-6, "softmax, max_autotune again");
  // Default mode times nothing and computes the same bits (each row is one thread's whatever the split).
  const auto d = fb::compile(model, fb::options{.threads = 2})(x);
  CHECK(counts().autotune_timed == before.autotune_timed + 1);
  for (std::size_t i = 0; i < x.size(); ++i) REQUIRE(y.flat(i) == d.flat(i));

  // A kernel that writes what it reads (the result into its own argument) is not timed: each
  // candidate run would apply it again. 3x + 1 in place, once, on a shape not tuned before.
  fb::tensor<float, fb::shape<48, 500>> z;
  fbt::fill_signed(z, 433, 0.1, 3.0);
  std::vector<double> zref(z.size()), zscale(z.size(), 1.0);
  for (std::size_t i = 0; i < z.size(); ++i) zref[i] = 3.0 * double(z.flat(i)) + 1.0;
  auto in_place = fb::compile([](const auto& v) { return v * 3.0f + 1.0f; },
                              fb::options{.mode = fb::mode::max_autotune, .threads = 2});
  in_place.run(z, z);
  CHECK(counts().autotune_timed == before.autotune_timed + 1);
  check_elements(z, zref, zscale, 1e-6, "3x + 1 into its own argument, max_autotune");
}

TEST_CASE("max_autotune winners persist in the cache directory; default mode tunes nothing",
          "[compile][modes][autotune]") {
  cache();
  fb::reset();
  fb::tensor<float, fb::shape<29, 64>> x;
  fb::tensor<float, fb::shape<64, 48>> w;
  fb::tensor<float, fb::shape<48>> b;
  fbt::fill_signed(x, 501, 0.1, 1.0);
  fbt::fill_signed(w, 502, 0.1, 1.0);
  fbt::fill_signed(b, 503, 0.1, 1.0);
  std::vector<double> ref, scale;
  linear_relu_ref(x, w, b, ref, scale);

  // Default mode: no timing, nothing remembered.
  check_elements(fb::compile(linear_relu)(x, w, b), ref, scale, 4e-7, "default");
  CHECK(counts().autotune_timed == 0);
  CHECK(counts().autotune_from_disk == 0);
  CHECK(fb::cpu::autotune::known() == 0);

  const auto first = fb::compile(linear_relu, fb::options{.mode = fb::mode::max_autotune})(x, w, b);
  check_elements(first, ref, scale, 4e-7, "max_autotune, timed");
  CHECK(counts().autotune_timed == 1);
  CHECK(counts().autotune_from_disk == 0);
  const std::filesystem::path blobs = std::filesystem::path(std::getenv("FUSEBOX_CACHE_DIR")) / "v1" / "blobs";
  REQUIRE(std::filesystem::is_directory(blobs));
  CHECK(std::distance(std::filesystem::directory_iterator(blobs), std::filesystem::directory_iterator{}) >= 1);

  // A fresh in-memory state (as a new process has) reads the winner and times nothing.
  fb::reset();
  CHECK(fb::cpu::autotune::known() == 0);
  autotune_log log;
  const auto second = fb::compile(linear_relu, fb::options{.mode = fb::mode::max_autotune})(x, w, b);
  check_elements(second, ref, scale, 4e-7, "max_autotune, winner from disk");
  CHECK(counts().autotune_timed == 0);
  CHECK(counts().autotune_from_disk == 1);
  CHECK(log.count("from the cache") == 1);
  CHECK(log.count("candidates timed") == 0);
}

TEST_CASE("explain() says what each mode does on the CPU", "[compile][modes][explain]") {
  cache();
  fb::tensor<float, fb::shape<6, 8>> x;
  fb::tensor<float, fb::shape<8, 5>> w;
  fb::tensor<float, fb::shape<5>> b;
  fbt::fill_signed(x, 601, 0.1, 1.0);
  fbt::fill_signed(w, 602, 0.1, 1.0);
  fbt::fill_signed(b, 603, 0.1, 1.0);
  const std::string tuned = fb::explain_text(linear_relu, fb::options{.mode = fb::mode::max_autotune}, x, w, b);
  INFO(tuned);
  CHECK(tuned.find("max_autotune (this compile)") != std::string::npos);
  CHECK(tuned.find("direct vs Winograd") != std::string::npos);
  CHECK(tuned.find("1 thread vs all") != std::string::npos);
  CHECK(tuned.find(std::getenv("FUSEBOX_CACHE_DIR")) != std::string::npos);  // where winners persist
  CHECK(tuned.find("skips the guards") != std::string::npos);
  CHECK(tuned.find("static shapes have no guard") != std::string::npos);
  CHECK(tuned.find("not tuned") != std::string::npos);
  const std::string plain = fb::explain_text(linear_relu, fb::options{}, x, w, b);
  CHECK(plain.find("default_ (this compile)") != std::string::npos);
  const std::string short_form = fb::explain_text(linear_relu, x, w, b);  // points at the form with options
  CHECK(short_form.find("mode default_ (explain(model, options, args...) says what every mode does") !=
        std::string::npos);
  const std::string ro = fb::explain_text(linear_relu, fb::options{.mode = fb::mode::reduce_overhead}, x, w, b);
  CHECK(ro.find("reduce_overhead (this compile)") != std::string::npos);
}
