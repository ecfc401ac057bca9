// Tests for include/fusebox/backend/cpu/gemm.hpp: gemm against a double-precision reference, every
// output element checked; batches, strides, epilogue, thread-count invariance, workspace errors.
#include <fusebox/backend/cpu/gemm.hpp>

#include <catch2/catch.hpp>

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <stdexcept>
#include <vector>

namespace {

using fusebox::cpu::gemm;
using fusebox::cpu::gemm_workspace_bytes;
using fusebox::cpu::matrix_view;
using fusebox::cpu::no_epilogue;
using fusebox::cpu::thread_pool;

// Random values in +-[0.25, 1]: never zero, mixed signs (so cancellations are exercised).
template <class T>
std::vector<T> random_values(std::size_t n, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> mag(0.25, 1.0);
  std::vector<T> v(n);
  for (auto& x : v) x = T(rng() & 1 ? mag(rng) : -mag(rng));
  return v;
}

// One operand in memory: `rows x cols` logical, stored row-major or transposed, with padding in
// the leading dimension, and `batch` copies `batch_stride` apart (0: one shared copy).
template <class T>
struct operand {
  std::vector<T> storage;
  matrix_view<T> view;
  std::ptrdiff_t batch_stride;
  T at(std::size_t b, std::size_t r, std::size_t c) const {
    return view.data[std::ptrdiff_t(b) * batch_stride + std::ptrdiff_t(r) * view.row_stride +
                     std::ptrdiff_t(c) * view.col_stride];
  }
};

template <class T>
operand<T> make_operand(std::size_t batch, std::size_t rows, std::size_t cols, bool transposed, std::size_t pad,
                        bool shared, std::uint64_t seed) {
  operand<T> op;
  const std::size_t ld = (transposed ? rows : cols) + pad;
  const std::size_t one = (transposed ? cols : rows) * ld;
  const std::size_t copies = shared ? 1 : batch;
  op.storage = random_values<T>(std::max<std::size_t>(1, one * copies), seed);
  op.batch_stride = shared ? 0 : std::ptrdiff_t(one);
  op.view = transposed ? matrix_view<T>{op.storage.data(), 1, std::ptrdiff_t(ld)}
                       : matrix_view<T>{op.storage.data(), std::ptrdiff_t(ld), 1};
  return op;
}

struct case_desc {
  std::size_t batch = 1, M = 1, N = 1, K = 1;
  bool a_t = false, b_t = false;     // stored transposed
  std::size_t a_pad = 0, b_pad = 0, c_pad = 0;
  bool a_shared = false, b_shared = false;
};

template <class T>
struct run_result {
  std::vector<T> C;
  std::size_t ldc, c_batch_stride;
};

template <class T>
run_result<T> run(const case_desc& d, const operand<T>& A, const operand<T>& B, thread_pool& pool) {
  run_result<T> r;
  r.ldc = d.N + d.c_pad;
  r.c_batch_stride = d.M * r.ldc;
  // Sentinel-filled so that writes outside the logical C (into the padding) are caught.
  r.C.assign(std::max<std::size_t>(1, d.batch * r.c_batch_stride), std::numeric_limits<T>::quiet_NaN());
  std::vector<std::byte> ws(gemm_workspace_bytes<T>(d.batch, d.M, d.N, d.K, pool.size()));
  gemm<T>(d.batch, d.M, d.N, d.K, A.view, A.batch_stride, B.view, B.batch_stride, r.C.data(), std::ptrdiff_t(r.ldc),
          std::ptrdiff_t(r.c_batch_stride), no_epilogue{}, pool, ws);
  return r;
}

template <class T>
void check_against_reference(const case_desc& d, const operand<T>& A, const operand<T>& B, const run_result<T>& r) {
  const double eps = std::numeric_limits<T>::epsilon();
  std::size_t bad = 0;
  std::vector<double> ref(d.N), mag(d.N);
  for (std::size_t b = 0; b < d.batch; ++b)
    for (std::size_t i = 0; i < d.M; ++i) {
      // Row i of the double-precision product, and of |A| |B| for the error bound.
      std::fill(ref.begin(), ref.end(), 0.0);
      std::fill(mag.begin(), mag.end(), 0.0);
      for (std::size_t k = 0; k < d.K; ++k) {
        const double a = A.at(b, i, k);
        for (std::size_t j = 0; j < d.N; ++j) {
          const double p = a * double(B.at(b, k, j));
          ref[j] += p;
          mag[j] += std::abs(p);
        }
      }
      for (std::size_t j = 0; j < d.N; ++j) {
        const double got = r.C[b * r.c_batch_stride + i * r.ldc + j];
        const double tol = 4.0 * double(std::max<std::size_t>(d.K, 1)) * eps * mag[j] + 1e-30;
        if (!(std::abs(got - ref[j]) <= tol)) {
          if (bad < 5)
            UNSCOPED_INFO("b " << b << " i " << i << " j " << j << ": got " << got << ", reference " << ref[j]
                               << ", tolerance " << tol);
          ++bad;
        }
      }
      for (std::size_t j = d.N; j < r.ldc; ++j)
        if (!std::isnan(r.C[b * r.c_batch_stride + i * r.ldc + j])) ++bad;  // padding untouched
    }
  INFO("batch " << d.batch << " M " << d.M << " N " << d.N << " K " << d.K << " A" << (d.a_t ? "^T" : "")
                << " B" << (d.b_t ? "^T" : "") << " pads " << d.a_pad << "/" << d.b_pad << "/" << d.c_pad
                << " shared " << d.a_shared << d.b_shared);
  CHECK(bad == 0);
}

template <class T>
void check_case(const case_desc& d, thread_pool& pool, std::uint64_t seed) {
  const auto A = make_operand<T>(d.batch, d.M, d.K, d.a_t, d.a_pad, d.a_shared, seed);
  const auto B = make_operand<T>(d.batch, d.K, d.N, d.b_t, d.b_pad, d.b_shared, seed * 7 + 1);
  check_against_reference(d, A, B, run(d, A, B, pool));
}

}  // namespace

TEMPLATE_TEST_CASE("gemm matches a double reference on every element for sizes 1..1000", "[cpu][gemm]", float,
                   double) {
  thread_pool pool(2);
  const std::size_t sizes[] = {1, 3, 17, 64, 100, 1000};
  std::uint64_t seed = 1;
  for (std::size_t M : sizes)
    for (std::size_t N : sizes)
      for (std::size_t K : sizes) {
        if (M * N * K > 11'000'000) continue;  // keep the double reference quick (skips 1000 x 1000 x >=17)
        for (int layout = 0; layout < 4; ++layout) {
          case_desc d;
          d.M = M, d.N = N, d.K = K;
          d.a_t = layout & 1;
          d.b_t = layout & 2;
          check_case<TestType>(d, pool, seed++);
        }
      }
}

TEMPLATE_TEST_CASE("gemm covers every path: gemv, stream, blocked, with tails", "[cpu][gemm]", float, double) {
  thread_pool pool(2);
  std::uint64_t seed = 100;
  // Shapes chosen to land on each path (M == 1; 2 <= M <= 64 with small K; large M or K) and on
  // the tails of every blocking parameter (MR, NR, KC, vector width).
  const std::size_t shapes[][3] = {{1, 4096, 300}, {1, 33, 1025},  {1, 1, 1},     {2, 50, 7},     {5, 129, 257},
                                   {7, 31, 129},   {8, 64, 128},   {9, 65, 513},  {31, 97, 200},  {32, 256, 1024},
                                   {33, 40, 50},   {64, 33, 300},  {65, 70, 130}, {200, 300, 260}, {16, 20, 20000},
                                   {150, 17, 9},   {2, 4100, 3},   {4, 3000, 129}, {5, 64, 64},
                                   // M x K too large for the A^T pack of the B^T path: blocked,
                                   // with B^T packed through the register transpose.
                                   {100, 40, 25000},
                                   // Several NC column panels and several MCO row rounds, each
                                   // with several KC steps (the pipelined packing).
                                   {5, 2100, 1100}, {1030, 20, 600}};
  for (auto& s : shapes)
    for (int layout = 0; layout < 4; ++layout) {
      case_desc d;
      d.M = s[0], d.N = s[1], d.K = s[2];
      d.a_t = layout & 1;
      d.b_t = layout & 2;
      check_case<TestType>(d, pool, seed++);
    }
}

TEMPLATE_TEST_CASE("gemm with batches, shared operands and padded leading dimensions", "[cpu][gemm]", float, double) {
  thread_pool pool(2);
  std::uint64_t seed = 500;
  const std::size_t shapes[][3] = {{1, 70, 40}, {3, 17, 64}, {17, 33, 100}, {100, 64, 17}};
  for (auto& s : shapes)
    for (int variant = 0; variant < 8; ++variant) {
      case_desc d;
      d.batch = 3;
      d.M = s[0], d.N = s[1], d.K = s[2];
      d.a_t = variant & 1;
      d.b_t = variant & 2;
      d.a_shared = variant & 4;
      d.b_shared = !(variant & 4) && (variant & 1);
      d.a_pad = 3, d.b_pad = 5, d.c_pad = 7;
      check_case<TestType>(d, pool, seed++);
    }
}

TEMPLATE_TEST_CASE("one-row gemm with B's column blocks packed (options::freezing) gives the same bits", "[cpu][gemm]",
                   float, double) {
  // Whole blocks and a tail of vectors and of scalars; one and two threads (the second task's
  // columns start off a block boundary where N / 2 is not a multiple of the block); a padded B.
  const std::size_t shapes[][2] = {{512, 784}, {300, 100}, {1000, 33}, {129, 7}};
  std::uint64_t seed = 900;
  for (unsigned threads : {1u, 2u}) {
    thread_pool pool(threads);
    for (auto& s : shapes) {
      case_desc d;
      d.M = 1, d.N = s[0], d.K = s[1], d.b_pad = 3;
      const auto A = make_operand<TestType>(1, d.M, d.K, false, 0, false, seed++);
      const auto B = make_operand<TestType>(1, d.K, d.N, false, d.b_pad, false, seed++);
      const run_result<TestType> plain = run(d, A, B, pool);
      std::vector<TestType> packed(std::max<std::size_t>(1, fusebox::cpu::detail::gemv_packed_bytes<TestType>(d.N, d.K) / sizeof(TestType)));
      fusebox::cpu::detail::pack_gemv_blocks(d.K, d.N, B.view.data, B.view.row_stride, packed.data());
      std::vector<TestType> C(d.N, std::numeric_limits<TestType>::quiet_NaN());
      std::vector<std::byte> ws(gemm_workspace_bytes<TestType>(1, d.M, d.N, d.K, pool.size()));
      gemm<TestType>(1, d.M, d.N, d.K, A.view, 0, B.view, 0, C.data(), std::ptrdiff_t(d.N), 0, no_epilogue{}, pool, ws,
                     packed.data());
      INFO("N " << d.N << " K " << d.K << " threads " << threads);
      check_against_reference(d, A, B, plain);
      CHECK(std::memcmp(C.data(), plain.C.data(), d.N * sizeof(TestType)) == 0);
    }
  }
}

TEMPLATE_TEST_CASE("gemm with general strides (neither stride 1)", "[cpu][gemm]", float, double) {
  thread_pool pool(2);
  // A and B sampled every other element of a bigger matrix: row and column strides both > 1.
  for (auto [M, N, K] : {std::array<std::size_t, 3>{1, 19, 23}, {5, 40, 33}, {70, 20, 150}}) {
    auto Abig = random_values<TestType>(2 * M * 2 * K, M + N);
    auto Bbig = random_values<TestType>(2 * K * 2 * N, K + N);
    operand<TestType> A{{}, {Abig.data(), std::ptrdiff_t(4 * K), 2}, 0};
    operand<TestType> B{{}, {Bbig.data(), 2, std::ptrdiff_t(4 * K)}, 0};  // transposed and strided
    case_desc d;
    d.M = M, d.N = N, d.K = K;
    check_against_reference(d, A, B, run(d, A, B, pool));
  }
}

TEMPLATE_TEST_CASE("gemm results are bitwise identical for 1, 2 and 4 threads", "[cpu][gemm]", float, double) {
  thread_pool p1(1), p2(2), p4(4);
  std::uint64_t seed = 900;
  const std::size_t shapes[][3] = {{1, 3000, 300}, {3, 1000, 400}, {32, 700, 300}, {64, 129, 1000},
                                   {100, 300, 300}, {300, 100, 70}, {1100, 40, 20}, {70, 50, 30000},
                                   {8, 3000, 100}};
  for (auto& s : shapes)
    for (int layout = 0; layout < 4; ++layout) {
      case_desc d;
      d.batch = 2;
      d.M = s[0], d.N = s[1], d.K = s[2];
      d.a_t = layout & 1;
      d.b_t = layout & 2;
      const auto A = make_operand<TestType>(d.batch, d.M, d.K, d.a_t, 0, false, seed);
      const auto B = make_operand<TestType>(d.batch, d.K, d.N, d.b_t, 0, false, seed + 1);
      seed += 2;
      const auto r1 = run(d, A, B, p1), r2 = run(d, A, B, p2), r4 = run(d, A, B, p4);
      INFO("M " << d.M << " N " << d.N << " K " << d.K << " layout " << layout);
      CHECK(std::memcmp(r1.C.data(), r2.C.data(), r1.C.size() * sizeof(TestType)) == 0);
      CHECK(std::memcmp(r1.C.data(), r4.C.data(), r1.C.size() * sizeof(TestType)) == 0);
    }
}

TEMPLATE_TEST_CASE("the stream B^T path gives the same bits in both loop orders, any K block and both A^T layouts",
                   "[cpu][gemm]", float, double) {
  namespace fd = fusebox::cpu::detail;
  using T = TestType;
  thread_pool p1(1), p2(2);
  std::uint64_t seed = 1300;
  // More than one K block (kc_stream = 1024), B stored [N, K]; M past the gemv paths, tails of MR
  // and NR, several slivers a task.
  const std::size_t shapes[][3] = {{40, 50, 2500}, {64, 17, 3000}, {256, 40, 2100}, {9, 200, 1030}};
  for (auto& s : shapes)
    for (int a_t = 0; a_t < 2; ++a_t) {
      case_desc d;
      d.M = s[0], d.N = s[1], d.K = s[2];
      d.a_t = a_t, d.b_t = true;
      const auto A = make_operand<T>(1, d.M, d.K, d.a_t, 0, false, seed);
      const auto B = make_operand<T>(1, d.K, d.N, d.b_t, 0, false, seed + 1);
      seed += 2;
      REQUIRE(fd::choose_path<T>(d.M, d.K, B.view.row_stride, B.view.col_stride) == fd::gemm_path::stream_bt);
      std::vector<std::vector<T>> results;
      for (thread_pool* pool : {&p1, &p2})
        for (auto order : {fd::stream_order::sliver_first, fd::stream_order::k_block_first})
          for (std::size_t kc : {std::size_t(0), std::size_t(384), std::size_t(2048)})  // 0: kc_stream
            for (bool panel_major : {false, true}) {
              run_result<T> r;
              r.ldc = d.N, r.c_batch_stride = d.M * d.N;
              r.C.assign(d.M * d.N, std::numeric_limits<T>::quiet_NaN());
              std::vector<std::byte> ws(gemm_workspace_bytes<T>(1, d.M, d.N, d.K, pool->size()));
              no_epilogue none;
              fd::gemm_choice choice{fd::gemm_path::stream_bt, false, 4, order, kc};
              choice.stream_panel_major = panel_major;
              fd::gemm_with<T>(choice, 1, d.M, d.N, d.K, A.view, 0, B.view, 0, r.C.data(), std::ptrdiff_t(d.N), 0,
                               none, *pool, ws);
              if (results.empty()) check_against_reference(d, A, B, r);
              results.push_back(std::move(r.C));
            }
      INFO("M " << d.M << " N " << d.N << " K " << d.K << " A" << (d.a_t ? "^T" : ""));
      for (std::size_t i = 1; i < results.size(); ++i)
        CHECK(std::memcmp(results[0].data(), results[i].data(), results[0].size() * sizeof(T)) == 0);
    }
}

TEST_CASE("the stream B^T path takes K block first only where it was measured to pay", "[cpu][gemm]") {
  namespace fd = fusebox::cpu::detail;
  constexpr std::size_t KiB = 1024, MiB = 1024 * KiB;
  // W3c's widest layer at batch 256: A^T is 4 MiB, a K block 1 MiB (float).
  STATIC_REQUIRE(fd::stream_k_block_first<float>(256, 4096, 2 * MiB));    // the Xeon of run AV
  STATIC_REQUIRE(!fd::stream_k_block_first<float>(256, 4096, 1 * MiB));   // Zen 4
  STATIC_REQUIRE(!fd::stream_k_block_first<float>(256, 4096, 512 * KiB)); // Zen 3
  STATIC_REQUIRE(!fd::stream_k_block_first<float>(64, 4096, 512 * KiB));  // Zen 3, 0-6% slower
  STATIC_REQUIRE(!fd::stream_k_block_first<float>(128, 4096, 1 * MiB));   // Zen 4, not measured
  STATIC_REQUIRE(!fd::stream_k_block_first<float>(256, 4096, 0));         // L2 not known
  STATIC_REQUIRE(!fd::stream_k_block_first<float>(256, 1024, 2 * MiB));   // one K block
  STATIC_REQUIRE(!fd::stream_k_block_first<float>(32, 4096, 2 * MiB));    // A^T (512 KiB) in L2
  STATIC_REQUIRE(!fd::stream_k_block_first<double>(256, 4096, 2 * MiB));  // its K block is 2 MiB
}

TEMPLATE_TEST_CASE("gemm calls the epilogue exactly once per element, with final values", "[cpu][gemm]", float,
                   double) {
  thread_pool pool(2);
  std::uint64_t seed = 1300;
  const std::size_t shapes[][3] = {{1, 2000, 100}, {1, 70, 3}, {5, 300, 700}, {40, 100, 64},
                                   {130, 150, 300}, {3, 17, 0}};
  for (auto& s : shapes)
    for (int layout = 0; layout < 4; ++layout) {
      case_desc d;
      d.batch = 2;
      d.M = s[0], d.N = s[1], d.K = s[2];
      d.b_t = layout & 1;
      d.a_t = layout & 2;
      d.c_pad = 3;
      const auto A = make_operand<TestType>(d.batch, d.M, d.K, d.a_t, 0, false, seed);
      const auto B = make_operand<TestType>(d.batch, d.K, d.N, d.b_t, 0, false, seed + 1);
      seed += 2;
      const auto plain = run(d, A, B, pool);

      const std::size_t ldc = d.N + d.c_pad, cbs = d.M * ldc;
      std::vector<TestType> C(d.batch * cbs, std::numeric_limits<TestType>::quiet_NaN());
      std::vector<TestType> seen(C.size(), std::numeric_limits<TestType>::quiet_NaN());
      std::vector<std::atomic<int>> calls(C.size());
      std::atomic<bool> bad_pointer{false};
      std::vector<std::byte> ws(gemm_workspace_bytes<TestType>(d.batch, d.M, d.N, d.K, pool.size()));
      auto epilogue = [&](std::size_t b, std::size_t i, std::size_t j0, std::size_t n, TestType* row) {
        if (row != C.data() + b * cbs + i * ldc + j0 || b >= d.batch || i >= d.M || j0 + n > d.N) {
          bad_pointer = true;
          return;
        }
        for (std::size_t j = 0; j < n; ++j) {
          const std::size_t at = b * cbs + i * ldc + j0 + j;
          calls[at].fetch_add(1);
          seen[at] = row[j];
          row[j] = row[j] * TestType(2) + TestType(1);  // the fused "bias + activation"
        }
      };
      gemm<TestType>(d.batch, d.M, d.N, d.K, A.view, A.batch_stride, B.view, B.batch_stride, C.data(),
                     std::ptrdiff_t(ldc), std::ptrdiff_t(cbs), epilogue, pool, ws);
      INFO("M " << d.M << " N " << d.N << " K " << d.K << " layout " << layout);
      REQUIRE_FALSE(bad_pointer.load());
      std::size_t wrong_calls = 0, not_final = 0, not_applied = 0;
      for (std::size_t b = 0; b < d.batch; ++b)
        for (std::size_t i = 0; i < d.M; ++i)
          for (std::size_t j = 0; j < d.N; ++j) {
            const std::size_t at = b * cbs + i * ldc + j;
            if (calls[at].load() != 1) ++wrong_calls;
            // The values the epilogue saw are the final product, bit for bit.
            if (std::memcmp(&seen[at], &plain.C[at], sizeof(TestType)) != 0) ++not_final;
            if (!(C[at] == seen[at] * TestType(2) + TestType(1))) ++not_applied;
          }
      CHECK(wrong_calls == 0);
      CHECK(not_final == 0);
      CHECK(not_applied == 0);
    }
}

TEMPLATE_TEST_CASE("gemm with K == 0 writes zeros and still runs the epilogue", "[cpu][gemm]", float, double) {
  thread_pool pool(2);
  std::vector<TestType> C(4 * 6, TestType(7));
  int calls = 0;
  gemm<TestType>(1, 4, 6, 0, matrix_view<TestType>{nullptr, 0, 1}, 0, matrix_view<TestType>{nullptr, 6, 1}, 0,
                 C.data(), 6, 0,
                 [&](std::size_t, std::size_t, std::size_t j0, std::size_t n, TestType*) {
                   CHECK(j0 == 0);
                   CHECK(n == 6);
                   ++calls;
                 },
                 pool, {});
  CHECK(calls == 4);
  for (auto c : C) CHECK(c == TestType(0));
}

TEMPLATE_TEST_CASE("gemm refuses a workspace that is too small, naming the sizes", "[cpu][gemm]", float, double) {
  thread_pool pool(2);
  const std::size_t M = 100, N = 200, K = 300;
  auto A = random_values<TestType>(M * K, 1), B = random_values<TestType>(K * N, 2);
  std::vector<TestType> C(M * N);
  const std::size_t need = gemm_workspace_bytes<TestType>(1, M, N, K, pool.size());
  REQUIRE(need > 0);
  std::vector<std::byte> ws(need - 1);
  auto call = [&] {
    gemm<TestType>(1, M, N, K, matrix_view<TestType>{A.data(), std::ptrdiff_t(K), 1}, 0,
                   matrix_view<TestType>{B.data(), std::ptrdiff_t(N), 1}, 0, C.data(), std::ptrdiff_t(N), 0,
                   no_epilogue{}, pool, ws);
  };
  CHECK_THROWS_AS(call(), std::invalid_argument);
  CHECK_THROWS_WITH(call(), Catch::Contains("M 100, N 200, K 300"));
  // Small-M and gemv paths need workspace too.
  const std::size_t need_small = gemm_workspace_bytes<TestType>(1, 8, N, K, pool.size());
  std::vector<std::byte> none;
  CHECK_THROWS_AS(gemm<TestType>(1, 8, N, K, matrix_view<TestType>{A.data(), std::ptrdiff_t(K), 1}, 0,
                                 matrix_view<TestType>{B.data(), std::ptrdiff_t(N), 1}, 0, C.data(),
                                 std::ptrdiff_t(N), 0, no_epilogue{}, pool, none),
                  std::invalid_argument);
  CHECK(need_small > 0);
}

TEST_CASE("gemm_workspace_bytes is usable in constant expressions", "[cpu][gemm]") {
  constexpr std::size_t bytes = gemm_workspace_bytes<float>(1, 256, 4096, 1024, 2);
  static_assert(bytes > 0);
  static_assert(gemm_workspace_bytes<float>(1, 0, 4096, 1024, 2) == 0);
  CHECK(bytes % 64 == 0);
}
