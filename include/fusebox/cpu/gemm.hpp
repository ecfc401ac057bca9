// fusebox/cpu/gemm.hpp — batched matrix product for the CPU backend, with a fused epilogue.
//
// What it is for: every matmul / linear layer the CPU executor runs. The planner fuses bias,
// activation and residual into the `epilogue`, which gemm calls on each finished run of C while
// that run is still in cache. Depends on: xsimd 8 (vector registers of the default architecture,
// i.e. what the translation unit is compiled for: AVX-512, AVX2+FMA, SSE2, NEON), the C++20
// standard library, and fusebox/cpu/thread_pool.hpp. No BLAS.
//
//   C[b][i][j] = sum_k A[b][i][k] * B[b][k][j]        (then epilogue(b, i, j0, n, &C[b][i][j0]))
//
// Operands are strided views (row_stride, col_stride in elements), so a transposed operand is
// the same data with swapped strides; a batch stride of 0 shares an operand across the batch.
// No heap allocation: packing buffers come from the caller's `workspace` (sized by
// gemm_workspace_bytes, a constexpr function so an arena can be sized at build time).
//
// Numerical contract. Every output element is one chain of fused multiply-adds in increasing k,
// starting from 0: c = fma(a[k], b[k], c) for k = 0, 1, ..., K-1 (products commute, so it does
// not matter which operand is broadcast). Only the M == 1 "dot" path (B stored [N, K]) differs:
// it sums vector partial sums. Threads split M and N, never K, and the tile grid is anchored
// at (0, 0) whatever the thread count, so the result is bitwise identical for any thread count.
// Without hardware FMA (plain SSE2) every "fma" is a multiply then an add, scalar tails included.
//
// The cases (chosen from shapes and strides only, never from the thread count):
//   1. K == 0: C = 0, then the epilogue.
//   2. M == 1, B row-major [K, N] (col_stride 1): "gemv rows". y += x[k] * B[k, :] over a chunk
//      of y that stays in L1, eight rows of B per pass so each pass reads eight contiguous
//      streams. Tasks split N. B is read exactly once, at memory bandwidth.
//   3. M == 1, B stored [N, K] (row_stride 1): "gemv dots". Four rows of B^T at a time against x
//      (in L1), two vector accumulators per row, then a horizontal sum. Tasks split N.
//   4. 2 <= M <= stream_max_m, B row-major: "stream B". A (small) is packed once, whole K,
//      into MR-row slivers; B is never packed: the micro-kernel reads its rows in place (unit
//      column stride), prefetching the next NR-column panel while it works on this one. For
//      M = 32 packing B would cost about as much as the arithmetic it feeds.
//   5. 2 <= M <= stream_max_m, B stored [N, K]: "stream B^T". The same with the roles swapped,
//      computing C^T = B^T A^T: A^T is packed (whole K) into NR-wide panels, B^T's rows are
//      broadcast in place (each row contiguous along k), and each MR x M tile of C^T goes
//      through a small per-thread scratch before it is written to C transposed.
//   6. Everything else (large M, general strides): BLIS-style. Loops jc (NC columns) -> pc (KC)
//      -> [pack B panel KC x NC, shared] -> ic (MCO rows) -> [pack A block, shared] -> tasks
//      over (MC x NB) blocks of C -> jr (NR) -> ir (MR) -> micro-kernel. Packing runs as its own
//      parallel_for, then the compute; no barrier inside a task.
//   Epilogue: called once per row and column run of a task's block, after the block's last K
//   step, by the thread that computed it.
//
// Micro-kernel: MR x NR tile of C in registers, NR = 2 vectors (so a row of the tile is two
// loads of B per k), MR = 8 with 32 vector registers (AVX-512: 16 accumulators + 2 B + 1
// broadcast; FMA latency 4 x throughput 1-2/cycle needs >= 8 independent accumulators), MR = 6
// with 16 registers (AVX2 / SSE2: 12 accumulators, the classic Haswell 6x16). Per k the kernel
// issues MR*2 FMAs against 2 vector loads + MR broadcasts, so it is FMA-bound, not load-bound.
//
// Blocking (this machine: AMD EPYC Zen 4, 32 KiB L1d, 1 MiB L2 per core, 32 MiB L3 shared):
//   KC: the B micro-panel KC x NR must stay in L1 while the MR-row slivers of A stream past it:
//       KC * NR * sizeof(T) = 16 KiB (half of L1) -> KC = 128 with AVX-512, 256 with AVX2.
//   MC: the packed A block MC x KC lives in L2 and is reused by every NR panel: MC = 144 rows
//       (a multiple of MR) is 72 KiB at KC = 128 floats.
//   NC: the packed B panel KC x NC lives in L3 (shared): NC = 4096 -> 2 MiB of floats.
//   MCO: rows of A packed per round in case 6 (bounds the workspace): 1024.
//
// Floors on this machine (measured: DRAM read ~25 GB/s with 1 or 2 threads; peak ~100 GFLOP/s
// float per core, 32 flop/cycle):
//   M = 1, 4096 x 4096 float: 64 MiB of B -> ~2.7 ms at 25 GB/s; 1024-wide layers: 16 MiB,
//   which fits the 32 MiB L3, so a warm loop runs at L3 speed.
//   M = 32, K = 1024, N = 4096: 0.27 GFLOP -> 1.3 ms on 2 cores (B: 16 MiB, 0.7 ms): compute.
//   M = 256, K = 4096, N = 4096: 8.6 GFLOP -> 43 ms on 2 cores: compute.
#pragma once

#include <fusebox/cpu/thread_pool.hpp>

#include <xsimd/xsimd.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>

namespace fusebox::cpu {

template <class T>
struct matrix_view {
  const T* data;
  std::ptrdiff_t row_stride, col_stride;  // in elements; either may be 1
};

struct no_epilogue {
  template <class T>
  void operator()(std::size_t, std::size_t, std::size_t, std::size_t, T*) const noexcept {}
};

namespace detail {

// 32 architectural vector registers (AVX-512, AArch64) or 16 (SSE, AVX).
inline constexpr std::size_t vector_registers =
#if defined(__AVX512F__) || defined(__aarch64__)
    32;
#else
    16;
#endif

template <class T>
struct gemm_config {
  using vec = xsimd::batch<T>;
  static constexpr std::size_t w = vec::size;
  static constexpr std::size_t nv = 2;            // vectors per tile row
  static constexpr std::size_t nr = nv * w;       // tile columns
  static constexpr std::size_t mr = vector_registers >= 32 ? 8 : 6;  // tile rows
  #ifndef TUNE_KCB
#define TUNE_KCB 16
#endif
  static constexpr std::size_t kc = (TUNE_KCB * 1024) / (nr * sizeof(T));  // B micro-panel: 16 KiB
#ifndef TUNE_KCL
#define TUNE_KCL 256
#endif
#ifndef TUNE_MC
#define TUNE_MC 18
#endif
  static constexpr std::size_t kc_blocked = TUNE_KCL;
  static constexpr std::size_t mc = TUNE_MC * mr;      // packed A block rows (L2)
  static constexpr std::size_t nc = 4096;         // packed B panel columns (L3)
  static constexpr std::size_t mco = 1024;        // rows of A packed per round (case 6)
  // Case 4/5 ("stream") limits: the packed small operand (M x K) must fit comfortably in L2.
#ifndef TUNE_SMAX
#define TUNE_SMAX 64
#endif
  static constexpr std::size_t stream_max_m = TUNE_SMAX;
  static constexpr std::size_t stream_pack_limit = 2u << 20;
  // Case 2/3 task widths.
  static constexpr std::size_t gemv_cols = 2048;  // widest y chunk: 8 KiB of floats, in L1
  static constexpr std::size_t gemv_rows_per_pass = 8;
  static constexpr std::size_t dot_rows = 4;
  static constexpr std::size_t dot_task_rows = 64;
};

constexpr std::size_t round_up(std::size_t x, std::size_t m) noexcept { return (x + m - 1) / m * m; }
constexpr std::size_t ceil_div(std::size_t x, std::size_t m) noexcept { return (x + m - 1) / m; }

// Scalar multiply-add with the same rounding as xsimd::fma on this target.
template <class T>
inline T madd(T a, T b, T c) noexcept {
#if defined(__FMA__) || defined(__AVX512F__) || defined(__aarch64__) || defined(__FMA4__)
  return std::fma(a, b, c);
#else
  return a * b + c;
#endif
}

#ifndef TUNE_HINT
#define TUNE_HINT 3
#endif
inline void prefetch_l1(const void* p) noexcept {
#if defined(__GNUC__) || defined(__clang__)
  __builtin_prefetch(p, 0, TUNE_HINT);
#else
  (void)p;
#endif
}

// Which of the cases in the header comment runs.
enum class gemm_path { zero_k, gemv_rows, gemv_dots, stream_b, stream_bt, blocked };

template <class T>
constexpr bool stream_fits(std::size_t M, std::size_t K) noexcept {
  using cfg = gemm_config<T>;
  return M >= 2 && M <= cfg::stream_max_m &&
         round_up(M, std::max(cfg::mr, cfg::nr)) * K * sizeof(T) <= cfg::stream_pack_limit;
}

template <class T>
constexpr gemm_path choose_path(std::size_t M, std::size_t K, std::ptrdiff_t b_rs, std::ptrdiff_t b_cs) noexcept {
  if (K == 0) return gemm_path::zero_k;
  if (M == 1 && b_cs == 1) return gemm_path::gemv_rows;
  if (M == 1 && b_rs == 1) return gemm_path::gemv_dots;
  if (stream_fits<T>(M, K) && b_cs == 1) return gemm_path::stream_b;
  if (stream_fits<T>(M, K) && b_rs == 1) return gemm_path::stream_bt;
  return gemm_path::blocked;
}

// Workspace layout per path; every region is rounded to 64 bytes.
struct gemm_layout {
  std::size_t shared = 0;      // bytes shared by all threads
  std::size_t per_thread = 0;  // bytes per worker
  constexpr std::size_t total(unsigned threads) const noexcept { return shared + per_thread * threads + 64; }
};

template <class T>
constexpr gemm_layout layout_for(gemm_path p, std::size_t M, std::size_t N, std::size_t K) noexcept {
  using cfg = gemm_config<T>;
  gemm_layout l;
  switch (p) {
    case gemm_path::zero_k:
    case gemm_path::gemv_rows:
      break;
    case gemm_path::gemv_dots:
      l.shared = round_up(K * sizeof(T), 64);  // x gathered to unit stride when needed
      break;
    case gemm_path::stream_b:
      l.shared = round_up(round_up(M, cfg::mr) * K * sizeof(T), 64);
      l.per_thread = round_up(cfg::kc * cfg::nr * 16 * sizeof(T), 64);  // a packed chunk of B
      break;
    case gemm_path::stream_bt:
      l.shared = round_up(round_up(M, cfg::nr) * K * sizeof(T), 64);
      l.per_thread = round_up(cfg::mr * round_up(M, cfg::nr) * sizeof(T), 64);  // C^T scratch
      break;
    case gemm_path::blocked:
      l.shared = round_up(std::min(K, cfg::kc_blocked) * round_up(std::min(N, cfg::nc), cfg::nr) * sizeof(T), 64) +
                 round_up(round_up(std::min(M, cfg::mco), cfg::mr) * std::min(K, cfg::kc_blocked) * sizeof(T), 64);
      break;
  }
  return l;
}

inline std::byte* align64(std::byte* p) noexcept {
  const auto u = reinterpret_cast<std::uintptr_t>(p);
  return p + ((64 - (u & 63)) & 63);
}

// ---------------------------------------------------------------------------------------------
// Micro-kernel: C[0..MR_, 0..NR) (+)= A[0..MR_, 0..kc) * B[0..kc, 0..NR), NR = NV vectors.
//   A: if APack > 0, a packed sliver: element (r, k) at a[k * APack + r];
//      else in place: element (r, k) at a[r * a_rs + k * a_cs].
//   B: element (k, j) at b[k * ldb + j] (a packed panel, or B itself when its col stride is 1).
//   C: element (r, j) at c[r * ldc + j]; loaded first when `accumulate`, else the chain starts at 0.
template <class T>
struct kernel_args {
  std::size_t kc;
  const T* a;
  std::ptrdiff_t a_rs, a_cs;
  const T* b;
  std::ptrdiff_t ldb;
  T* c;
  std::ptrdiff_t ldc;
  bool accumulate;
  // Streaming (Stream == true), when B is read in place from memory: every row of B is also
  // stored to b_copy (row stride NR), so the following slivers read a packed, L1-resident copy,
  // and row k + stream_prefetch_rows is prefetched (continuing into `b_next`, the panel the
  // task reads next, near the end). Large power-of-two row strides defeat both the hardware
  // prefetchers (every row is a new page) and the caches (the rows of a panel fall in a few
  // sets), hence the copy and the software prefetch.
  T* b_copy = nullptr;
  const T* b_next = nullptr;
};

#ifndef TUNE_GPF
#define TUNE_GPF 0
#endif
#ifndef TUNE_SB
#define TUNE_SB 1
#endif
#ifndef TUNE_PD
#define TUNE_PD 24
#endif
inline constexpr std::size_t stream_prefetch_rows = TUNE_PD;

template <class T, std::size_t MR_, std::size_t NV, std::size_t APack, bool Stream>
inline void micro_kernel(const kernel_args<T>& p) noexcept {
  using V = xsimd::batch<T>;
  constexpr std::size_t W = V::size;
  constexpr std::size_t NR = NV * W;
  V acc[MR_][NV];
  if (p.accumulate) {
#pragma GCC unroll 16
    for (std::size_t r = 0; r < MR_; ++r)
#pragma GCC unroll 4
      for (std::size_t v = 0; v < NV; ++v) acc[r][v] = V::load_unaligned(p.c + r * p.ldc + v * W);
  } else {
#pragma GCC unroll 16
    for (std::size_t r = 0; r < MR_; ++r)
#pragma GCC unroll 4
      for (std::size_t v = 0; v < NV; ++v) acc[r][v] = V(T(0));
  }
  const T* a = p.a;
  const T* b = p.b;
  const std::ptrdiff_t ldb = p.ldb;
  const std::ptrdiff_t a_step = APack > 0 ? std::ptrdiff_t(APack) : p.a_cs;
  const std::ptrdiff_t a_rs = p.a_rs;
  auto step = [&](T* copy, const T* pf) __attribute__((always_inline)) {
    V bv[NV];
#pragma GCC unroll 4
    for (std::size_t v = 0; v < NV; ++v) bv[v] = V::load_unaligned(b + v * W);
    if constexpr (Stream) {
#pragma GCC unroll 4
      for (std::size_t v = 0; v < NV; ++v) bv[v].store_aligned(copy + v * W);
#pragma GCC unroll 4
      for (std::size_t l = 0; l < NR; l += 64 / sizeof(T)) prefetch_l1(pf + l);
    }
#pragma GCC unroll 16
    for (std::size_t r = 0; r < MR_; ++r) {
      const V ar(APack > 0 ? a[r] : a[std::ptrdiff_t(r) * a_rs]);
#pragma GCC unroll 4
      for (std::size_t v = 0; v < NV; ++v) acc[r][v] = xsimd::fma(ar, bv[v], acc[r][v]);
    }
    a += a_step;
    b += ldb;
  };
  if constexpr (Stream) {
    constexpr std::size_t PD = stream_prefetch_rows;
    T* copy = p.b_copy;
    const std::size_t split = p.kc > PD ? p.kc - PD : 0;
    if (split > 0) {
      const T* pf = b + std::ptrdiff_t(PD) * ldb;
      for (std::size_t k = 0; k < split; ++k, copy += NR, pf += ldb) step(copy, pf);
    }
    const T* pf = p.b_next;  // rows 0, 1, ... of the next panel
    for (std::size_t k = split; k < p.kc; ++k, copy += NR, pf += ldb) step(copy, pf);
  } else {
    for (std::size_t k = 0; k < p.kc; ++k) step(nullptr, nullptr);
  }
#pragma GCC unroll 16
  for (std::size_t r = 0; r < MR_; ++r)
#pragma GCC unroll 4
    for (std::size_t v = 0; v < NV; ++v) acc[r][v].store_unaligned(p.c + r * p.ldc + v * W);
}

// A tile of m <= MR rows and n <= NR columns: m picks the kernel instantiation (so rows past m
// are never read, which matters when A is read in place); n < NR goes through a register-sized
// scratch tile, so B must be readable for NR columns (a zero-padded panel).
template <class T, std::size_t APack, bool Stream, std::size_t... Ms>
inline void tile_rows(std::size_t m, std::size_t n, kernel_args<T> p, std::index_sequence<Ms...>) noexcept {
  using cfg = gemm_config<T>;
  constexpr std::size_t NR = cfg::nr;
  if (n == NR) {
    (void)((m == Ms + 1 ? (micro_kernel<T, Ms + 1, cfg::nv, APack, Stream>(p), true) : false) || ...);
    return;
  }
  alignas(64) T tile[cfg::mr * NR];
  if (p.accumulate)
    for (std::size_t r = 0; r < m; ++r) std::memcpy(tile + r * NR, p.c + r * p.ldc, n * sizeof(T));
  T* c = p.c;
  const std::ptrdiff_t ldc = p.ldc;
  p.c = tile;
  p.ldc = NR;
  (void)((m == Ms + 1 ? (micro_kernel<T, Ms + 1, cfg::nv, APack, Stream>(p), true) : false) || ...);
  for (std::size_t r = 0; r < m; ++r) std::memcpy(c + r * ldc, tile + r * NR, n * sizeof(T));
}

template <class T, std::size_t APack, bool Stream = false>
inline void tile(std::size_t m, std::size_t n, const kernel_args<T>& p) noexcept {
  tile_rows<T, APack, Stream>(m, n, p, std::make_index_sequence<gemm_config<T>::mr>{});
}

// ---------------------------------------------------------------------------------------------
// Packing.

// Sliver of m <= mr rows of A for kc columns: dst[k * mr + r] = A(r, k); rows m..mr zero.
template <class T>
inline void pack_a_sliver(std::size_t m, std::size_t kc, const T* a, std::ptrdiff_t rs, std::ptrdiff_t cs, T* dst,
                          std::size_t mr) noexcept {
  if (m < mr)
    for (std::size_t k = 0; k < kc; ++k)
      for (std::size_t r = m; r < mr; ++r) dst[k * mr + r] = T(0);
  if (rs == 1) {
    for (std::size_t k = 0; k < kc; ++k)
      for (std::size_t r = 0; r < m; ++r) dst[k * mr + r] = a[std::ptrdiff_t(k) * cs + std::ptrdiff_t(r)];
  } else {
    for (std::size_t r = 0; r < m; ++r) {
      const T* row = a + std::ptrdiff_t(r) * rs;
      for (std::size_t k = 0; k < kc; ++k) dst[k * mr + r] = row[std::ptrdiff_t(k) * cs];
    }
  }
}

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
// GCC 12's AVX-512 shuffle intrinsics use _mm512_undefined_ps(), which -Wuninitialized flags
// (GCC PR 105593, fixed in GCC 13).
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
// W x W block transpose (W = vector width): dst[k * ldd + j] = src[j * lds + k]. Each source
// row is read as one vector, so rows that alias in the cache (power-of-two strides) are each
// touched once.
template <class T>
inline void transpose_block(const T* src, std::ptrdiff_t lds, T* dst, std::size_t ldd) noexcept {
  using V = xsimd::batch<T>;
  constexpr std::size_t W = V::size;
#if defined(__AVX512F__)
  if constexpr (std::is_same_v<T, float> && W == 16) {
    // 16 x 16 floats in registers: 32-bit and 64-bit interleaves within 128-bit lanes, then two
    // rounds of 128-bit lane shuffles. 64 shuffles for 256 elements.
    __m512 r[16], t[16];
    for (int j = 0; j < 16; ++j) r[j] = _mm512_loadu_ps(src + j * lds);
    for (int j = 0; j < 16; j += 2) {
      t[j] = _mm512_unpacklo_ps(r[j], r[j + 1]);
      t[j + 1] = _mm512_unpackhi_ps(r[j], r[j + 1]);
    }
    for (int g = 0; g < 16; g += 4) {  // u[g + c]: lane L holds column 4L + c of rows g..g+3
      const __m512d a = _mm512_castps_pd(t[g]), b = _mm512_castps_pd(t[g + 1]), c = _mm512_castps_pd(t[g + 2]),
                    d = _mm512_castps_pd(t[g + 3]);
      r[g] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, c));
      r[g + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, c));
      r[g + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(b, d));
      r[g + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(b, d));
    }
    for (int c = 0; c < 4; ++c) {
      const __m512 w0 = _mm512_shuffle_f32x4(r[c], r[4 + c], 0x44), w1 = _mm512_shuffle_f32x4(r[c], r[4 + c], 0xEE);
      const __m512 w2 = _mm512_shuffle_f32x4(r[8 + c], r[12 + c], 0x44),
                   w3 = _mm512_shuffle_f32x4(r[8 + c], r[12 + c], 0xEE);
      _mm512_storeu_ps(dst + (0 + c) * ldd, _mm512_shuffle_f32x4(w0, w2, 0x88));
      _mm512_storeu_ps(dst + (4 + c) * ldd, _mm512_shuffle_f32x4(w0, w2, 0xDD));
      _mm512_storeu_ps(dst + (8 + c) * ldd, _mm512_shuffle_f32x4(w1, w3, 0x88));
      _mm512_storeu_ps(dst + (12 + c) * ldd, _mm512_shuffle_f32x4(w1, w3, 0xDD));
    }
    return;
  }
#endif
  alignas(64) T tmp[W * W];
  for (std::size_t j = 0; j < W; ++j) V::load_unaligned(src + std::ptrdiff_t(j) * lds).store_aligned(tmp + j * W);
  for (std::size_t k = 0; k < W; ++k)
    for (std::size_t j = 0; j < W; ++j) dst[k * ldd + j] = tmp[j * W + k];
}
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

// Panel of n <= nr columns of B for kc rows: dst[k * nr + j] = B(k, j); columns n..nr zero.
template <class T>
inline void pack_b_panel(std::size_t n, std::size_t kc, const T* b, std::ptrdiff_t rs, std::ptrdiff_t cs, T* dst,
                         std::size_t nr) noexcept {
  if (cs == 1) {
    for (std::size_t k = 0; k < kc; ++k) {
      std::memcpy(dst + k * nr, b + std::ptrdiff_t(k) * rs, n * sizeof(T));
      for (std::size_t j = n; j < nr; ++j) dst[k * nr + j] = T(0);
    }
    return;
  }
  if (n < nr)
    for (std::size_t k = 0; k < kc; ++k)
      for (std::size_t j = n; j < nr; ++j) dst[k * nr + j] = T(0);
  constexpr std::size_t W = xsimd::batch<T>::size;
  std::size_t k0 = 0, j0 = 0;
  if (rs == 1) {  // B stored transposed: vector-width blocks go through registers
    for (; k0 + W <= kc; k0 += W)
      for (std::size_t j = 0; j + W <= n; j += W)
        transpose_block(b + std::ptrdiff_t(j) * cs + std::ptrdiff_t(k0), cs, dst + k0 * nr + j, nr);
    j0 = n / W * W;
  }
  // What is left (or a general strided B): element by element, a 16-row strip at a time.
  auto scalar = [&](std::size_t kb, std::size_t ke, std::size_t jb, std::size_t je) {
    for (std::size_t s = kb; s < ke; s += 16)
      for (std::size_t j = jb; j < je; ++j) {
        const T* col = b + std::ptrdiff_t(j) * cs;
        for (std::size_t k = s; k < std::min(ke, s + 16); ++k) dst[k * nr + j] = col[std::ptrdiff_t(k) * rs];
      }
  };
  scalar(0, k0, j0, n);   // columns past the last full block, in the rows done by blocks
  scalar(k0, kc, 0, n);   // rows past the last full block
}

// A chunk of `width` columns of a row-major B (unit column stride), kc rows, into panels of NR
// columns: dst[q * kc * NR + k * NR + j] = B(k, q * NR + j), the last panel zero-padded. Rows
// are read front to back, so the hardware prefetchers see long sequential runs.
template <class T>
inline void pack_b_rows(std::size_t kc, std::size_t width, const T* b, std::ptrdiff_t ldb, T* dst) noexcept {
  using V = xsimd::batch<T>;
  constexpr std::size_t W = V::size, NR = gemm_config<T>::nr;
  const std::size_t full = width / NR, rest = width - full * NR;
  for (std::size_t k = 0; k < kc; ++k) {
    const T* row = b + std::ptrdiff_t(k) * ldb;
    T* d = dst + k * NR;
    for (std::size_t q = 0; q < full; ++q, row += NR, d += kc * NR)
#pragma GCC unroll 4
      for (std::size_t v = 0; v < NR; v += W) V::load_unaligned(row + v).store_aligned(d + v);
    if (rest) {
      std::memcpy(d, row, rest * sizeof(T));
      std::fill(d + rest, d + NR, T(0));
    }
  }
}

// ---------------------------------------------------------------------------------------------
// One batch item's problem, with the operands already offset to the item.
template <class T>
struct gemm_problem {
  std::size_t M, N, K;
  matrix_view<T> A, B;
  T* C;
  std::ptrdiff_t ldc;
};

// Case 2: y[0, N) = x * B, B row-major. Tasks: chunks of gemv_cols columns.
template <class T, class Epilogue>
void run_gemv_rows(std::size_t item, const gemm_problem<T>& p, Epilogue& epilogue, thread_pool& pool) {
  using cfg = gemm_config<T>;
  using V = xsimd::batch<T>;
  constexpr std::size_t W = V::size;
  constexpr std::size_t R = cfg::gemv_rows_per_pass;
  // Chunk width: two tasks per thread where N allows, each a long contiguous run per row.
  const std::size_t cols =
      std::clamp(round_up(ceil_div(p.N, 2 * std::size_t(pool.size())), 4 * W), std::size_t(256), cfg::gemv_cols);
  const std::size_t tasks = ceil_div(p.N, cols);
  pool.parallel_for(tasks, [&](std::size_t t, unsigned) {
    const std::size_t j0 = t * cols, n = std::min(cols, p.N - j0);
    const std::size_t nvec = n / W * W;
    T* y = p.C + j0;
    const T* x = p.A.data;
    const std::ptrdiff_t xs = p.A.col_stride, ldb = p.B.row_stride;
    const T* b = p.B.data + j0;
    std::fill(y, y + n, T(0));
    std::size_t k = 0;
    for (; k + R <= p.K; k += R) {
      V xv[R];
      T xsc[R];
      const T* rows[R];
#pragma GCC unroll 8
      for (std::size_t r = 0; r < R; ++r) {
        xsc[r] = x[std::ptrdiff_t(k + r) * xs];
        xv[r] = V(xsc[r]);
        rows[r] = b + std::ptrdiff_t(k + r) * ldb;
      }
#if TUNE_GPF
      // The next pass's rows, one pass ahead, into L2 (they alias in L1: same column, 2^n stride).
      const bool ahead = k + 2 * R <= p.K;
      for (std::size_t j = 0; j < nvec; j += W) {
        V acc = V::load_unaligned(y + j);
#pragma GCC unroll 8
        for (std::size_t r = 0; r < R; ++r) acc = xsimd::fma(xv[r], V::load_unaligned(rows[r] + j), acc);
        acc.store_unaligned(y + j);
        if (ahead && (j * sizeof(T)) % 64 == 0)
#pragma GCC unroll 8
          for (std::size_t r = 0; r < R; ++r) __builtin_prefetch(rows[r] + std::ptrdiff_t(R) * ldb + j, 0, TUNE_GPF);
      }
#else
      for (std::size_t j = 0; j < nvec; j += W) {
        V acc = V::load_unaligned(y + j);
#pragma GCC unroll 8
        for (std::size_t r = 0; r < R; ++r) acc = xsimd::fma(xv[r], V::load_unaligned(rows[r] + j), acc);
        acc.store_unaligned(y + j);
      }
#endif
      for (std::size_t j = nvec; j < n; ++j) {
        T acc = y[j];
        for (std::size_t r = 0; r < R; ++r) acc = madd(xsc[r], rows[r][j], acc);
        y[j] = acc;
      }
    }
    for (; k < p.K; ++k) {
      const T xk = x[std::ptrdiff_t(k) * xs];
      const V xv(xk);
      const T* row = b + std::ptrdiff_t(k) * ldb;
      for (std::size_t j = 0; j < nvec; j += W)
        xsimd::fma(xv, V::load_unaligned(row + j), V::load_unaligned(y + j)).store_unaligned(y + j);
      for (std::size_t j = nvec; j < n; ++j) y[j] = madd(xk, row[j], y[j]);
    }
    epilogue(item, std::size_t(0), j0, n, y);
  });
}

// Sum of a vector's lanes in a fixed order (pairwise halving).
template <class T>
inline T lane_sum(const xsimd::batch<T>& v) noexcept {
  constexpr std::size_t W = xsimd::batch<T>::size;
  alignas(64) T buf[W];
  v.store_aligned(buf);
  for (std::size_t half = W / 2; half > 0; half /= 2)
    for (std::size_t l = 0; l < half; ++l) buf[l] += buf[l + half];
  return buf[0];
}

// Case 3 helper: out[r] = dot(x, bt row r) for ROWS rows. The per-row arithmetic does not
// depend on ROWS, so grouping never changes a result.
template <class T, std::size_t ROWS>
inline void dot_rows(std::size_t K, const T* x, const T* bt, std::ptrdiff_t ldbt, T* out) noexcept {
  using V = xsimd::batch<T>;
  constexpr std::size_t W = V::size;
  V acc[ROWS][2];
  const T* rows[ROWS];
#pragma GCC unroll 8
  for (std::size_t r = 0; r < ROWS; ++r) {
    acc[r][0] = acc[r][1] = V(T(0));
    rows[r] = bt + std::ptrdiff_t(r) * ldbt;
  }
  std::size_t k = 0;
  for (; k + 2 * W <= K; k += 2 * W) {
    const V x0 = V::load_unaligned(x + k), x1 = V::load_unaligned(x + k + W);
#pragma GCC unroll 8
    for (std::size_t r = 0; r < ROWS; ++r) {
      acc[r][0] = xsimd::fma(x0, V::load_unaligned(rows[r] + k), acc[r][0]);
      acc[r][1] = xsimd::fma(x1, V::load_unaligned(rows[r] + k + W), acc[r][1]);
    }
  }
  if (k + W <= K) {
    const V x0 = V::load_unaligned(x + k);
#pragma GCC unroll 8
    for (std::size_t r = 0; r < ROWS; ++r) acc[r][0] = xsimd::fma(x0, V::load_unaligned(rows[r] + k), acc[r][0]);
    k += W;
  }
#pragma GCC unroll 8
  for (std::size_t r = 0; r < ROWS; ++r) {
    T s = lane_sum(acc[r][0] + acc[r][1]);
    for (std::size_t kk = k; kk < K; ++kk) s = madd(x[kk], rows[r][kk], s);
    out[r] = s;
  }
}

// Case 3: y[0, N) = x * B with B stored [N, K] (B(k, j) at data[j * col_stride + k]).
template <class T, class Epilogue>
void run_gemv_dots(std::size_t item, const gemm_problem<T>& p, Epilogue& epilogue, thread_pool& pool, T* xbuf) {
  using cfg = gemm_config<T>;
  const T* x = p.A.data;
  if (p.A.col_stride != 1) {
    for (std::size_t k = 0; k < p.K; ++k) xbuf[k] = x[std::ptrdiff_t(k) * p.A.col_stride];
    x = xbuf;
  }
  const std::ptrdiff_t ldbt = p.B.col_stride;
  const std::size_t tasks = ceil_div(p.N, cfg::dot_task_rows);
  pool.parallel_for(tasks, [&](std::size_t t, unsigned) {
    const std::size_t j0 = t * cfg::dot_task_rows, n = std::min(cfg::dot_task_rows, p.N - j0);
    T* y = p.C + j0;
    const T* bt = p.B.data + std::ptrdiff_t(j0) * ldbt;
    std::size_t j = 0;
    for (; j + cfg::dot_rows <= n; j += cfg::dot_rows)
      dot_rows<T, cfg::dot_rows>(p.K, x, bt + std::ptrdiff_t(j) * ldbt, ldbt, y + j);
    for (; j < n; ++j) dot_rows<T, 1>(p.K, x, bt + std::ptrdiff_t(j) * ldbt, ldbt, y + j);
    epilogue(item, std::size_t(0), j0, n, y);
  });
}

// Case 4: A packed once (whole K), B read in place.
template <class T, class Epilogue>
void run_stream_b(std::size_t item, const gemm_problem<T>& p, Epilogue& epilogue, thread_pool& pool, T* ap,
                  T* tails, std::size_t tail_stride) {
  using cfg = gemm_config<T>;
  constexpr std::size_t MR = cfg::mr, NR = cfg::nr, KC = cfg::kc;
  const std::size_t slivers = ceil_div(p.M, MR);
  const std::size_t kchunks = ceil_div(p.K, 1024);
  pool.parallel_for(slivers * kchunks, [&](std::size_t t, unsigned) {
    const std::size_t s = t / kchunks, k0 = (t % kchunks) * 1024, kn = std::min<std::size_t>(1024, p.K - k0);
    const std::size_t i0 = s * MR, m = std::min(MR, p.M - i0);
    pack_a_sliver(m, kn, p.A.data + std::ptrdiff_t(i0) * p.A.row_stride + std::ptrdiff_t(k0) * p.A.col_stride,
                  p.A.row_stride, p.A.col_stride, ap + s * MR * p.K + k0 * MR, MR);
  });

  // Columns per task: enough panels to amortise the task, at least 4 tasks per thread.
  const std::size_t panels = ceil_div(p.N, NR);
  const std::size_t per_task = std::clamp<std::size_t>(panels / (4 * pool.size()), 1, 16);
  const std::size_t tasks = ceil_div(panels, per_task);
#if TUNE_SB == 2
  {const std::ptrdiff_t ldb = p.B.row_stride;
  pool.parallel_for(tasks, [&](std::size_t t, unsigned worker) {
    const std::size_t jb = t * per_task * NR, je = std::min(p.N, jb + per_task * NR);
    T* chunk = tails + worker * tail_stride;  // kc x (je - jb), packed in NR panels
    for (std::size_t pc = 0; pc < p.K; pc += KC) {
      const std::size_t kc = std::min(KC, p.K - pc);
      pack_b_rows(kc, je - jb, p.B.data + std::ptrdiff_t(pc) * ldb + std::ptrdiff_t(jb), ldb, chunk);
      for (std::size_t j = jb; j < je; j += NR) {
        const std::size_t n = std::min(NR, je - j);
        kernel_args<T> args{kc, nullptr, 0, 0, chunk + (j - jb) * kc, std::ptrdiff_t(NR), nullptr, p.ldc, pc > 0};
        for (std::size_t i = 0; i < p.M; i += MR) {
          args.a = ap + (i / MR) * MR * p.K + pc * MR;
          args.c = p.C + std::ptrdiff_t(i) * p.ldc + std::ptrdiff_t(j);
          tile<T, MR>(std::min(MR, p.M - i), n, args);
        }
      }
    }
    for (std::size_t i = 0; i < p.M; ++i) epilogue(item, i, jb, je - jb, p.C + std::ptrdiff_t(i) * p.ldc + std::ptrdiff_t(jb));
  });
  return;}
#endif
  const std::ptrdiff_t ldb = p.B.row_stride;
  pool.parallel_for(tasks, [&](std::size_t t, unsigned worker) {
    const std::size_t jb = t * per_task * NR, je = std::min(p.N, jb + per_task * NR);
    T* panel = tails + worker * tail_stride;  // kc x NR: this panel, packed
    for (std::size_t pc = 0; pc < p.K; pc += KC) {
      const std::size_t kc = std::min(KC, p.K - pc);
      const T* brow = p.B.data + std::ptrdiff_t(pc) * ldb;
      for (std::size_t j = jb; j < je; j += NR) {
        const std::size_t n = std::min(NR, je - j);
        kernel_args<T> args{kc, nullptr, 0, 0, brow + std::ptrdiff_t(j), ldb, nullptr, p.ldc, pc > 0};
        std::size_t i = 0;
        if (n < NR) {
          pack_b_panel(n, kc, args.b, ldb, std::ptrdiff_t(1), panel, NR);
        } else {
          // First sliver: B in place, copied to `panel` on the way, prefetching ahead.
          args.b_copy = panel;
          args.b_next = j + 2 * NR <= je ? args.b + NR
                        : pc + KC < p.K  ? p.B.data + std::ptrdiff_t(pc + KC) * ldb + std::ptrdiff_t(jb)
                                         : args.b;
          args.a = ap + pc * MR;
          args.c = p.C + std::ptrdiff_t(j);
          tile<T, MR, true>(std::min(MR, p.M), NR, args);
          i = MR;
        }
        args.b = panel;
        args.ldb = NR;
        for (; i < p.M; i += MR) {
          args.a = ap + (i / MR) * MR * p.K + pc * MR;
          args.c = p.C + std::ptrdiff_t(i) * p.ldc + std::ptrdiff_t(j);
          tile<T, MR>(std::min(MR, p.M - i), n, args);
        }
      }
    }
    for (std::size_t i = 0; i < p.M; ++i) epilogue(item, i, jb, je - jb, p.C + std::ptrdiff_t(i) * p.ldc + std::ptrdiff_t(jb));
  });
}

// Case 5: C^T = B^T A^T. A^T packed once (whole K) into NR-wide panels; B^T rows read in place.
template <class T, class Epilogue>
void run_stream_bt(std::size_t item, const gemm_problem<T>& p, Epilogue& epilogue, thread_pool& pool, T* ap,
                   T* scratch, std::size_t scratch_stride) {
  using cfg = gemm_config<T>;
  constexpr std::size_t MR = cfg::mr, NR = cfg::nr, KC = cfg::kc;
  const std::size_t panels = ceil_div(p.M, NR);
  const std::size_t ldt = panels * NR;  // scratch row length
  const std::size_t kchunks = ceil_div(p.K, 1024);
  // A^T(k, i) = A(i, k): a "B-like" operand with row stride A.col_stride, column stride A.row_stride.
  pool.parallel_for(panels * kchunks, [&](std::size_t t, unsigned) {
    const std::size_t s = t / kchunks, k0 = (t % kchunks) * 1024, kn = std::min<std::size_t>(1024, p.K - k0);
    const std::size_t i0 = s * NR, n = std::min(NR, p.M - i0);
    pack_b_panel(n, kn, p.A.data + std::ptrdiff_t(i0) * p.A.row_stride + std::ptrdiff_t(k0) * p.A.col_stride,
                 p.A.col_stride, p.A.row_stride, ap + s * NR * p.K + k0 * NR, NR);
  });

  const std::size_t slivers = ceil_div(p.N, MR);
  const std::size_t per_task = std::clamp<std::size_t>(slivers / (4 * pool.size()), 1, 32);
  const std::size_t tasks = ceil_div(slivers, per_task);
  const std::ptrdiff_t bt_rs = p.B.col_stride, bt_cs = p.B.row_stride;  // B^T(j, k)
  pool.parallel_for(tasks, [&](std::size_t t, unsigned worker) {
    const std::size_t jb = t * per_task * MR, je = std::min(p.N, jb + per_task * MR);
    T* tile_c = scratch + worker * scratch_stride;
    for (std::size_t j = jb; j < je; j += MR) {
      const std::size_t m = std::min(MR, je - j);
      const T* bt = p.B.data + std::ptrdiff_t(j) * bt_rs;
      for (std::size_t pc = 0; pc < p.K; pc += KC) {
        const std::size_t kc = std::min(KC, p.K - pc);
        for (std::size_t s = 0; s < panels; ++s)
          tile<T, 0>(m, NR,
                     kernel_args<T>{kc, bt + std::ptrdiff_t(pc) * bt_cs, bt_rs, bt_cs, ap + s * NR * p.K + pc * NR,
                                    std::ptrdiff_t(NR), tile_c + s * NR, std::ptrdiff_t(ldt), pc > 0});
      }
      for (std::size_t i = 0; i < p.M; ++i) {
        T* crow = p.C + std::ptrdiff_t(i) * p.ldc + std::ptrdiff_t(j);
        for (std::size_t r = 0; r < m; ++r) crow[r] = tile_c[r * ldt + i];
      }
    }
    for (std::size_t i = 0; i < p.M; ++i) epilogue(item, i, jb, je - jb, p.C + std::ptrdiff_t(i) * p.ldc + std::ptrdiff_t(jb));
  });
}

// Case 6: BLIS-style, both operands packed.
template <class T, class Epilogue>
void run_blocked(std::size_t item, const gemm_problem<T>& p, Epilogue& epilogue, thread_pool& pool, T* bp, T* ap) {
  using cfg = gemm_config<T>;
  constexpr std::size_t MR = cfg::mr, NR = cfg::nr, KC = cfg::kc_blocked, MC = cfg::mc;
  const unsigned threads = pool.size();
  for (std::size_t jc = 0; jc < p.N; jc += cfg::nc) {
    const std::size_t nc = std::min(cfg::nc, p.N - jc);
    const std::size_t npanels = ceil_div(nc, NR);
    for (std::size_t pc = 0; pc < p.K; pc += KC) {
      const std::size_t kc = std::min(KC, p.K - pc);
      const bool last_k = pc + kc == p.K;
      for (std::size_t ic0 = 0; ic0 < p.M; ic0 += cfg::mco) {
        const std::size_t mco = std::min(cfg::mco, p.M - ic0);
        const std::size_t nslivers = ceil_div(mco, MR);
        // Pack: B panels (once per jc, pc) and A slivers, in groups of 8.
        const std::size_t bgroups = ic0 == 0 ? ceil_div(npanels, 8) : 0, agroups = ceil_div(nslivers, 8);
        pool.parallel_for(bgroups + agroups, [&](std::size_t t, unsigned) {
          if (t < bgroups) {
            const std::size_t qb = t * 8, qe = std::min(npanels, qb + 8);
            const T* src = p.B.data + std::ptrdiff_t(pc) * p.B.row_stride + std::ptrdiff_t(jc + qb * NR) * p.B.col_stride;
            if (p.B.col_stride == 1) {  // row by row: long sequential reads
              pack_b_rows(kc, std::min(nc, qe * NR) - qb * NR, src, p.B.row_stride, bp + qb * NR * kc);
            } else {
              for (std::size_t q = qb; q < qe; ++q)
                pack_b_panel(std::min(NR, nc - q * NR), kc, src + std::ptrdiff_t((q - qb) * NR) * p.B.col_stride,
                             p.B.row_stride, p.B.col_stride, bp + q * NR * kc, NR);
            }
          } else {
            t -= bgroups;
            for (std::size_t s = t * 8; s < std::min(nslivers, t * 8 + 8); ++s) {
              const std::size_t i = s * MR;
              pack_a_sliver(std::min(MR, mco - i), kc,
                            p.A.data + std::ptrdiff_t(ic0 + i) * p.A.row_stride + std::ptrdiff_t(pc) * p.A.col_stride,
                            p.A.row_stride, p.A.col_stride, ap + s * MR * kc, MR);
            }
          }
        });
        // Compute: (MC x NB) blocks; NB shrinks until there are >= 4 tasks per thread. The M
        // blocks are equal (to a multiple of MR), so no block is a small remainder.
        const std::size_t mblocks = ceil_div(mco, MC);
        const std::size_t mc = round_up(ceil_div(mco, mblocks), MR);
        std::size_t nb_panels = npanels;
        while (nb_panels > 4 && mblocks * ceil_div(npanels, nb_panels) < 4 * threads) nb_panels = ceil_div(nb_panels, 2);
        const std::size_t nblocks = ceil_div(npanels, nb_panels);
        pool.parallel_for(mblocks * nblocks, [&](std::size_t t, unsigned) {
          const std::size_t mbk = t % mblocks, nbk = t / mblocks;
          const std::size_t ib = mbk * mc, ie = std::min(mco, ib + mc);
          const std::size_t qb = nbk * nb_panels, qe = std::min(npanels, qb + nb_panels);
          for (std::size_t q = qb; q < qe; ++q) {
            const std::size_t j = q * NR, n = std::min(NR, nc - j);
            for (std::size_t i = ib; i < ie; i += MR) {
              const std::size_t m = std::min(MR, ie - i);
              if (i + MR < ie)  // the next tile of C, which comes from L3 or memory
                for (std::size_t r = 0; r < MR; ++r)
                  for (std::size_t l = 0; l < n; l += 64 / sizeof(T))
                    prefetch_l1(p.C + std::ptrdiff_t(ic0 + i + MR + r) * p.ldc + std::ptrdiff_t(jc + j + l));
              tile<T, MR>(m, n,
                          kernel_args<T>{kc, ap + (i / MR) * MR * kc, 0, 0, bp + q * NR * kc, std::ptrdiff_t(NR),
                                         p.C + std::ptrdiff_t(ic0 + i) * p.ldc + std::ptrdiff_t(jc + j), p.ldc,
                                         pc > 0});
            }
          }
          if (last_k) {
            const std::size_t j0 = jc + qb * NR, jn = std::min(nc, qe * NR) - qb * NR;
            for (std::size_t i = ib; i < ie; ++i)
              epilogue(item, ic0 + i, j0, jn, p.C + std::ptrdiff_t(ic0 + i) * p.ldc + std::ptrdiff_t(j0));
          }
        });
      }
    }
  }
}

}  // namespace detail

// Bytes of workspace gemm needs for these sizes and thread count, whatever the operands'
// layouts (the largest of the paths these sizes can take).
template <class T>
constexpr std::size_t gemm_workspace_bytes(std::size_t batch, std::size_t M, std::size_t N, std::size_t K,
                                           unsigned threads) {
  using detail::gemm_path;
  if (batch == 0 || M == 0 || N == 0 || K == 0) return 0;
  if (threads == 0) threads = 1;
  std::size_t bytes = detail::layout_for<T>(gemm_path::blocked, M, N, K).total(threads);
  if (M == 1) bytes = std::max(bytes, detail::layout_for<T>(gemm_path::gemv_dots, M, N, K).total(threads));
  if (detail::stream_fits<T>(M, K)) {
    bytes = std::max(bytes, detail::layout_for<T>(gemm_path::stream_b, M, N, K).total(threads));
    bytes = std::max(bytes, detail::layout_for<T>(gemm_path::stream_bt, M, N, K).total(threads));
  }
  return bytes;
}

template <class T, class Epilogue>
void gemm(std::size_t batch, std::size_t M, std::size_t N, std::size_t K, matrix_view<T> A,
          std::ptrdiff_t a_batch_stride, matrix_view<T> B, std::ptrdiff_t b_batch_stride, T* C, std::ptrdiff_t ldc,
          std::ptrdiff_t c_batch_stride, Epilogue&& epilogue, thread_pool& pool, std::span<std::byte> workspace) {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>, "gemm<T>: T must be float or double");
  using detail::gemm_path;
  if (batch == 0 || M == 0 || N == 0) return;

  const gemm_path path = detail::choose_path<T>(M, K, B.row_stride, B.col_stride);
  if (path == gemm_path::zero_k) {
    for (std::size_t b = 0; b < batch; ++b)
      for (std::size_t i = 0; i < M; ++i) {
        T* row = C + std::ptrdiff_t(b) * c_batch_stride + std::ptrdiff_t(i) * ldc;
        std::fill(row, row + N, T(0));
        epilogue(b, i, std::size_t(0), N, row);
      }
    return;
  }

  const unsigned threads = pool.size();
  const detail::gemm_layout layout = detail::layout_for<T>(path, M, N, K);
  const std::size_t need = layout.total(threads);
  if (workspace.size() < need)
    throw std::invalid_argument("fusebox::cpu::gemm: workspace of " + std::to_string(workspace.size()) +
                                " bytes is too small for batch " + std::to_string(batch) + ", M " +
                                std::to_string(M) + ", N " + std::to_string(N) + ", K " + std::to_string(K) +
                                " on " + std::to_string(threads) + " threads: needs " + std::to_string(need) +
                                " (gemm_workspace_bytes<T>(...))");
  std::byte* base = detail::align64(workspace.data());
  T* shared = reinterpret_cast<T*>(base);
  T* per_thread = reinterpret_cast<T*>(base + layout.shared);
  const std::size_t per_thread_elems = layout.per_thread / sizeof(T);

  for (std::size_t b = 0; b < batch; ++b) {
    const detail::gemm_problem<T> p{
        M,
        N,
        K,
        {A.data + std::ptrdiff_t(b) * a_batch_stride, A.row_stride, A.col_stride},
        {B.data + std::ptrdiff_t(b) * b_batch_stride, B.row_stride, B.col_stride},
        C + std::ptrdiff_t(b) * c_batch_stride,
        ldc};
    switch (path) {
      case gemm_path::gemv_rows:
        detail::run_gemv_rows(b, p, epilogue, pool);
        break;
      case gemm_path::gemv_dots:
        detail::run_gemv_dots(b, p, epilogue, pool, shared);
        break;
      case gemm_path::stream_b:
        detail::run_stream_b(b, p, epilogue, pool, shared, per_thread, per_thread_elems);
        break;
      case gemm_path::stream_bt:
        detail::run_stream_bt(b, p, epilogue, pool, shared, per_thread, per_thread_elems);
        break;
      case gemm_path::blocked: {
        using cfg = detail::gemm_config<T>;
        T* bp = shared;
        T* ap = reinterpret_cast<T*>(reinterpret_cast<std::byte*>(shared) +
                                     detail::round_up(std::min(K, cfg::kc_blocked) *
                                                          detail::round_up(std::min(N, cfg::nc), cfg::nr) * sizeof(T),
                                                      64));
        detail::run_blocked(b, p, epilogue, pool, bp, ap);
        break;
      }
      case gemm_path::zero_k:
        break;
    }
  }
}

}  // namespace fusebox::cpu
