// fusebox/backend/cpu/gemm.hpp — batched matrix product for the CPU backend, with a fused epilogue.
//
// What it is for: every matmul / linear layer the CPU executor runs. The planner fuses bias,
// activation and residual into the `epilogue`, which gemm calls on each finished run of C while
// that run is still in cache. Depends on: xsimd 8 (the vector registers of the default
// architecture, i.e. what the translation unit is compiled for: AVX-512, AVX2+FMA, SSE2, NEON),
// the C++20 standard library, fusebox/core/errors.hpp, fusebox/backend/cpu/thread_pool.hpp and fusebox/backend/cpu/vmath.hpp (its
// detail::fma, fused exactly where the architecture fuses, whatever the -O level). No BLAS. (The W x W
// register transposes of AVX-512 and AVX use <immintrin.h> directly; other targets take a portable
// path.)
//
//   C[b][i][j] = sum_k A[b][i][k] * B[b][k][j]        then epilogue(b, i, j0, n, &C[b][i][j0])
//
// Operands are strided views (row_stride, col_stride in elements), so a transposed operand is
// the same data with swapped strides; a batch stride of 0 shares an operand across the batch.
// C is row-major (leading dimension ldc) and must not overlap A or B. No heap allocation: the
// packing buffers come from the caller's `workspace`, sized by gemm_workspace_bytes (constexpr,
// so an arena can be sized at build time; it covers every layout of operands of those sizes).
// The epilogue runs concurrently on several threads, for different runs of C.
//
// Numerical contract. Every output element is one chain of fused multiply-adds in increasing k,
// starting from 0: c = fma(a[k], b[k], c) for k = 0, 1, ..., K-1, whichever operand is
// broadcast (products commute). Only case 3 (M <= 4 with B stored [N, K]) differs: it adds up
// vector partial sums. Threads split M and N, never K; the tile grid is anchored at (0, 0)
// whatever the thread count; so results are bitwise identical for any thread count. Without
// hardware FMA (plain SSE2) every "fma" is a multiply then an add, scalar tails included.
//
// The cases, chosen from shapes and strides only (never from the thread count):
//   1. K == 0: C = 0, then the epilogue.
//   2. M <= 8, B row-major [K, N] ("gemv rows"): y_i += x_i[k] * B[k, :] over a chunk of each y
//      that stays in L1, eight rows of B per pass (eight long contiguous streams), the next
//      pass's rows prefetched into L2. Tasks split N into N / threads columns (at most 2048).
//      B is read once, at memory bandwidth.
//   3. M <= 4, B stored [N, K] ("gemv dots"): blocks of up to 8 (AVX-512: 16) rows of B^T
//      against the rows of A, both contiguous along k, one vector accumulator per output, then a
//      horizontal sum.
//   4. M > 4, B stored [N, K], and the packed A^T (M x K) within 8 MiB ("stream B^T"): computes
//      C^T = B^T A^T so that B is never packed. A^T is packed once into NR-wide panels (shared,
//      L2/L3), K block by K block: one block's panels are contiguous (below run_stream_bt says
//      why); each task takes MR rows of B^T at a time, broadcast in place (each row contiguous
//      along k, so the hardware prefetchers stream it), and accumulates MR x M tiles of C^T in a
//      per-thread scratch, the task's whole column range of them (at most 256 KiB), written to
//      C at the task's end through W x W register transposes, each row of C in one run. For M =
//      32 packing B^T (a transpose) would cost about half as much as the arithmetic it feeds.
//   5. Everything else (B row-major with M > 8, general strides, huge M x K): BLIS-style. Steps
//      jc (NC columns) -> pc (KC) -> ic (MCO rows); each step packs the B panel KC x NC (once
//      per jc, pc; shared by the threads, in L3) and the A block MCO x KC, then runs tasks over
//      (MC x NB) blocks of C: jr (NR) -> ir (MR) -> micro-kernel. The steps are pipelined: one
//      parallel_for computes step s and packs step s + 1 into the other half of a double buffer,
//      the pack tasks spread among the compute tasks, so that with two threads one streams
//      memory while the other computes; one fork-join per step. B row-major is packed row by
//      row (long sequential reads); B^T through W x W register transposes.
//   Epilogue: after a block's last K step, once per row of the block, for the block's columns.
//
// Micro-kernel: an MR x NR tile of C in registers, NR = 2 vectors. MR = 8 with 32 vector
// registers (AVX-512: 16 accumulators + 2 of B + 1 broadcast), MR = 6 with 16 (AVX2 / SSE2: 12
// accumulators, the classic Haswell 6 x 16). Per k: 2 vector loads + MR broadcasts for 2*MR
// FMAs, so it is FMA-bound (FMA latency 4 x 2 pipes needs >= 8 independent accumulators). It
// reaches 113 GFLOP/s float on one core here with its operands in L1 (32 flop/cycle at ~3.5 GHz).
//
// Blocking (this machine: AMD EPYC Zen 4, 32 KiB L1d and 1 MiB L2 per core, 32 MiB L3 shared):
//   The B micro-panel (KC x NR) does not have to fit L1: Zen 4's L2 feeds 64 B/cycle and the
//   kernel needs NR * sizeof(T) = 128 B per 16 cycles. What matters is the number of passes over
//   C: each KC step loads and stores the C block once, and with other processes sharing the L3
//   those passes go to memory.
//   KC = 512 in case 5 with AVX-512: 8 passes over C for K = 4096 (KC = 256: 16 passes, ~7%
//     slower there; the A block MC x KC is 512 KiB, in L2). With AVX2, 256: a B micro-panel of
//     16 KiB, which stays in L1 (Zen 3's L2 feeds 32 B/cycle, and re-streaming a 32 KiB one for
//     every tile was what made W [K, N] slow there; gemm_config::kc_blocked). KC = 1024 in
//     case 4 (kc_stream), where the C^T tiles live in a per-thread scratch anyway: the A^T panel
//     block streams from L2, and a longer K block loads and stores each tile fewer times (run AQ;
//     runs AO and earlier had 256 and 512).
//   MC = 32 * MR (256 rows with AVX-512): one A block for M = 256, reused by every B panel of
//     the task (144 rows measured ~10% slower). M blocks are equalised to a multiple of MR.
//   NC = 2048: the packed B panel (KC x NC, 4 MiB of floats, double-buffered) lives in L3.
//   MCO = 1024: rows of A packed per round in case 5, which bounds the workspace.
//   These were tuned with single-thread CPU-time medians on a loaded machine (load 3-5 on 2
//   cores); differences under ~10% between the candidates were not resolvable there.
// Why not stream B in place (unpacked) when it is row-major? With a power-of-two row stride every
// row of a KC x NR panel is a new page and falls in the same few cache sets: the hardware
// prefetchers do not follow it and L1/L2 cannot hold a panel. Measured (M = 8..64): no faster
// than packing it row by row, so case 5 handles it.
//
// Floors on this machine (measured in bench/gemm.cpp: DRAM read ~21-25 GB/s with 1 or 2
// threads; OpenBLAS sgemm 2048^3 ~100 GFLOP/s per core):
//   M = 1, 4096 x 4096 float: 64 MiB of B, ~2.7 ms at 25 GB/s (memory). The 1024-wide layers
//     (16 MiB) fit the 32 MiB L3, so a warm loop beats the DRAM floor.
//   M = 32, K = 1024, N = 4096: 0.27 GFLOP, 1.3 ms on 2 cores (B: 16 MiB, 0.7 ms): compute.
//   M = 256, K = 4096, N = 4096: 8.6 GFLOP, 43 ms on 2 cores: compute.
#pragma once

#include <fusebox/backend/cpu/autotune.hpp>
#include <fusebox/backend/cpu/cache_sizes.hpp>
#include <fusebox/backend/cpu/thread_pool.hpp>
#include <fusebox/backend/cpu/vmath.hpp>  // detail::fma: fused at every -O level (xsimd 8.1 has no AVX-512 fma)
#include <fusebox/core/errors.hpp>
#include <fusebox/core/linkage.hpp>

#include <fusebox/backend/cpu/vector_isa.hpp>  // xsimd and <immintrin.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <memory>
#include <vector>

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

/// A non-owning reference to an epilogue `void(b, i, j0, n, T* c)`: two words. gemm() hands every
/// epilogue to the product through it, so the GEMM (paths, packing, micro-kernels) is compiled
/// once per element type rather than once per epilogue type: per fused model that was ~30 KB of
/// object code and the largest part of a small model's build (issue 22). The epilogue runs once
/// per finished run of C (a row segment of 16 and more elements), so the indirect call is noise.
template <class T>
class epilogue_ref {
 public:
  template <class E>
  explicit epilogue_ref(E& e) noexcept
      : obj_(const_cast<void*>(static_cast<const void*>(std::addressof(e)))),
        call_([](void* o, std::size_t b, std::size_t i, std::size_t j0, std::size_t n, T* c) {
          (*static_cast<E*>(o))(b, i, j0, n, c);
        }) {}
  void operator()(std::size_t b, std::size_t i, std::size_t j0, std::size_t n, T* c) const {
    call_(obj_, b, i, j0, n, c);
  }

 private:
  void* obj_;
  void (*call_)(void*, std::size_t, std::size_t, std::size_t, std::size_t, T*);
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
  static constexpr std::size_t w = xsimd::batch<T>::size;
  static constexpr std::size_t nv = 2;                               // vectors per tile row
  static constexpr std::size_t nr = nv * w;                          // tile columns
  static constexpr std::size_t mr = vector_registers >= 32 ? 8 : 6;  // tile rows
  // K block of conv's packed product (conv.hpp): its panel block (KC x NR) at 32 KiB, in L1.
  static constexpr std::size_t kc = vector_registers >= 32 ? 256 : 512;
  // K block (case 4). The A^T panel block (KC x NR) streams from L2 at any of these sizes; a
  // longer one means fewer loads and stores of each C^T tile. 1024 against 512 (AVX2) and 256
  // (AVX-512): 1-2% and 2-3% faster on the W3c and T1 shapes (docs/benchmarks.md, run AQ; 2048
  // at AVX2 no faster than 1024). Before, 512 against 256 at AVX2 had taken W3c b256 from
  // 0.98-1.03x to 1.04-1.08x OpenBLAS (run AO). On the Xeon with AVX2 at M = 256, K = 4096
  // (run AZ, K block first): K blocks of 256, 512 and 2048 were not resolvably faster than 1024
  // (medians 0.97-1.10x OpenBLAS's time at one thread, 0.80-1.13x at two, where the same code ran
  // 0.90-1.11x round to round). NEON unmeasured. gemm_choice::stream_kc overrides it (bench/gemm.cpp
  // --stream times the candidates).
  static constexpr std::size_t kc_stream = 1024;
  // K block (case 5). With 16 registers (AVX2) the B micro-panel (KC x NR) is 16 KiB at 256, so
  // it stays in L1 while the MR-row tiles of the block reuse it; at 512 (32 KiB, all of L1) each
  // tile streamed it from L2 again. On a Zen 3 EPYC (L2 to L1 32 B a cycle), W [K, N]
  // (docs/benchmarks.md, run AS): bench/gemm.cpp, 3 alternated pairs, M = 32 on the 4096 x 4096
  // layer 0.74x / 0.67x the time at 1 / 2 threads; M = 256 mixed, 0.82-1.16x by layer and thread
  // count (geometric mean 1.00); cpu_workloads W3c b32 [K, N] 0.94x / 0.71x, b256 0.97-0.99x.
  // AVX-512 keeps 512 (KC = 256 measured ~7% slower at M = 256 on Zen 4).
  static constexpr std::size_t kc_blocked = vector_registers >= 32 ? 512 : 256;
  static constexpr std::size_t mc = 32 * mr;      // rows of the packed A block per task (L2)
  static constexpr std::size_t nc = 2048;         // columns of the packed B panel (L3)
  static constexpr std::size_t mco = 1024;        // rows of A packed per round (case 5)
  // Case 4 while the packed A^T (M x K) is at most this: it is streamed from L2/L3 once per
  // MR rows of B^T.
  static constexpr std::size_t stream_pack_limit = std::size_t(8) << 20;
  static constexpr std::size_t rows_max_m = 8;  // case 2 up to this many rows of A
  static constexpr std::size_t dots_max_m = 4;  // case 3 up to this many rows of A
  static constexpr std::size_t gemv_cols = 2048;   // widest y chunk (case 2): 8 KiB of floats, in L1
  static constexpr std::size_t gemv_rows_per_pass = 8;
  // Case 2 at one row of A, where B is at most this many bytes (it comes from the caches, not
  // DRAM): each column block of gemv_block_vectors vectors stays in registers over all of K.
  // Measured on AVX-512 (docs/benchmarks.md, run AN): 784x512 17.8 against 21.4 us, 1024x1024
  // 52 against 64; from 16 MB on, the passes above (with prefetches) are twice as fast.
  static constexpr std::size_t gemv_resident_bytes = std::size_t(4) << 20;
  static constexpr std::size_t gemv_block_vectors = 8;
  static constexpr std::size_t dot_task_rows = 64;
};

constexpr std::size_t round_up(std::size_t x, std::size_t m) noexcept { return (x + m - 1) / m * m; }
constexpr std::size_t ceil_div(std::size_t x, std::size_t m) noexcept { return (x + m - 1) / m; }

inline void prefetch_l1(const void* p) noexcept {
#if defined(__GNUC__) || defined(__clang__)
  __builtin_prefetch(p, 0, 3);
#else
  (void)p;
#endif
}
// The address may lie past the end of the array (a prefetch never faults), so it is formed as
// an integer rather than by pointer arithmetic.
template <class T>
inline void prefetch_l2(const T* base, std::ptrdiff_t elements_ahead) noexcept {
#if defined(__GNUC__) || defined(__clang__)
  __builtin_prefetch(reinterpret_cast<const void*>(reinterpret_cast<std::uintptr_t>(base) +
                                                   std::uintptr_t(elements_ahead * std::ptrdiff_t(sizeof(T)))),
                     0, 2);
#else
  (void)base;
  (void)elements_ahead;
#endif
}

// Which of the cases in the header comment runs.
enum class gemm_path { zero_k, gemv_rows, gemv_dots, stream_bt, blocked };

template <class T>
constexpr bool stream_fits(std::size_t M, std::size_t K) noexcept {
  using cfg = gemm_config<T>;
  return M > cfg::dots_max_m && round_up(M, cfg::nr) * K * sizeof(T) <= cfg::stream_pack_limit;
}

template <class T>
constexpr gemm_path choose_path(std::size_t M, std::size_t K, std::ptrdiff_t b_rs, std::ptrdiff_t b_cs) noexcept {
  if (K == 0) return gemm_path::zero_k;
  if (M <= gemm_config<T>::rows_max_m && b_cs == 1) return gemm_path::gemv_rows;
  if (M <= gemm_config<T>::dots_max_m && b_rs == 1) return gemm_path::gemv_dots;
  if (stream_fits<T>(M, K) && b_rs == 1 && b_cs != 1) return gemm_path::stream_bt;
  return gemm_path::blocked;
}

// Case 5's packed panels: B is KC x round_up(NC, NR), A is round_up(MCO, MR) x KC.
template <class T>
constexpr std::size_t blocked_b_bytes(std::size_t N, std::size_t K) noexcept {
  using cfg = gemm_config<T>;
  return round_up(std::min(K, cfg::kc_blocked) * round_up(std::min(N, cfg::nc), cfg::nr) * sizeof(T), 64);
}
template <class T>
constexpr std::size_t blocked_a_bytes(std::size_t M, std::size_t K) noexcept {
  using cfg = gemm_config<T>;
  return round_up(round_up(std::min(M, cfg::mco), cfg::mr) * std::min(K, cfg::kc_blocked) * sizeof(T), 64);
}

// Case 2 accumulates M > 4 rows of y in a per-thread scratch whose rows are one cache line
// longer than the chunk: rows of C a power of two apart fall in one L1 set, together with the
// rows of B (measured 1.8x slower at M = 8, N = 4096; no difference up to M = 4).
template <class T>
constexpr std::size_t gemv_scratch_ld() noexcept {
  return gemm_config<T>::gemv_cols + 64 / sizeof(T);
}

// Case 4: slivers (MR rows of B^T) per task: at most 32, and at most what keeps the task's C^T
// tiles within 256 KiB (in L2 beside the A^T panels). Written per task rather than per sliver
// (MR scattered elements in each of M rows), the transposed copy into C measured 1.5-3% faster
// at AVX2 for M = 32-256 (docs/benchmarks.md, run AQ).
template <class T>
constexpr std::size_t stream_slivers_per_task(std::size_t M) noexcept {
  using cfg = gemm_config<T>;
  const std::size_t tile_bytes = cfg::mr * round_up(M, cfg::nr) * sizeof(T);
  return std::clamp<std::size_t>((std::size_t(256) << 10) / tile_bytes, 1, 32);
}

// Case 4's loop order within a task. Sliver first (each MR rows of B^T over all of K, then the
// next) reads B^T's rows as long sequential streams, but all of the packed A^T once per sliver,
// from L3 where it exceeds L2, at the kernel's 4 flops a byte. K block first (every sliver of the
// task over one K block, then the next) reads A^T's K block from L2 for all of them and B^T in
// KC-long pieces. Measured (docs/benchmarks.md, run AV): on the Xeon there (2 MiB of L2 a core),
// sliver first took 1.15-1.83x OpenBLAS's time at M = 256, K = 4096 and K block first 0.99-1.45x
// (alternated; up to 1.6x less time); on the Zen 3 (512 KiB) K block first was 5-22% slower at
// M = 256 and 0-6% at M = 48-64, and on a Zen 4 (1 MiB) no faster at M = 256 (run AQ): their L3
// feeds a core fast enough. So K block first only where that was measured to pay: A^T beyond L2,
// its K block within half of an L2 of at least 2 MiB (the rest for the C^T tiles and B^T's
// pieces). max_autotune times both (tuned_choice).
enum class stream_order { automatic, sliver_first, k_block_first };

template <class T>
constexpr bool stream_k_block_first(std::size_t M, std::size_t K, std::size_t l2_bytes) noexcept {
  using cfg = gemm_config<T>;
  const std::size_t row = round_up(M, cfg::nr) * sizeof(T);  // one k of the packed A^T
  return K > cfg::kc_stream && l2_bytes >= (std::size_t(2) << 20) && row * K > l2_bytes &&
         row * cfg::kc_stream <= l2_bytes / 2;
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
      break;
    case gemm_path::gemv_rows:
      l.shared = round_up(M * K * sizeof(T), 64);  // rows of A gathered to unit stride when needed
      if (M > 4) l.per_thread = round_up(M * gemv_scratch_ld<T>() * sizeof(T), 64);  // the y rows
      break;
    case gemm_path::gemv_dots:
      l.shared = round_up(M * K * sizeof(T), 64);
      break;
    case gemm_path::stream_bt:
      l.shared = round_up(round_up(M, cfg::nr) * K * sizeof(T), 64);
      l.per_thread = round_up(stream_slivers_per_task<T>(M) * cfg::mr * round_up(M, cfg::nr) * sizeof(T), 64);  // C^T
      break;
    case gemm_path::blocked:  // double-buffered (see run_blocked)
      l.shared = 2 * (blocked_b_bytes<T>(N, K) + blocked_a_bytes<T>(M, K));
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
};

template <class T, std::size_t MR_, std::size_t NV, std::size_t APack>
inline void micro_kernel(const kernel_args<T>& p) noexcept {
  using V = xsimd::batch<T>;
  constexpr std::size_t W = V::size;
  V acc[MR_][NV];
  if (p.accumulate) {
#pragma GCC unroll 16
    for (std::size_t r = 0; r < MR_; ++r)
#pragma GCC unroll 4
      for (std::size_t v = 0; v < NV; ++v) acc[r][v] = V::load_unaligned(p.c + std::ptrdiff_t(r) * p.ldc + std::ptrdiff_t(v * W));
  } else {
#pragma GCC unroll 16
    for (std::size_t r = 0; r < MR_; ++r)
#pragma GCC unroll 4
      for (std::size_t v = 0; v < NV; ++v) acc[r][v] = V(T(0));
  }
  const T* a = p.a;
  const T* b = p.b;
  const std::ptrdiff_t ldb = p.ldb, a_rs = p.a_rs;
  const std::ptrdiff_t a_step = APack > 0 ? std::ptrdiff_t(APack) : p.a_cs;
  for (std::size_t k = 0; k < p.kc; ++k) {
    V bv[NV];
#pragma GCC unroll 4
    for (std::size_t v = 0; v < NV; ++v) bv[v] = V::load_unaligned(b + v * W);
#pragma GCC unroll 16
    for (std::size_t r = 0; r < MR_; ++r) {
      const V ar(APack > 0 ? a[r] : a[std::ptrdiff_t(r) * a_rs]);
#pragma GCC unroll 4
      for (std::size_t v = 0; v < NV; ++v) acc[r][v] = vmath::detail::fma(ar, bv[v], acc[r][v]);
    }
    a += a_step;
    b += ldb;
  }
#pragma GCC unroll 16
  for (std::size_t r = 0; r < MR_; ++r)
#pragma GCC unroll 4
    for (std::size_t v = 0; v < NV; ++v) acc[r][v].store_unaligned(p.c + std::ptrdiff_t(r) * p.ldc + std::ptrdiff_t(v * W));
}

// A tile of m <= MR rows and n <= NR columns: m picks the kernel instantiation (so rows past m
// are never read, which matters when A is read in place); n < NR goes through a register-sized
// scratch tile, so B must be readable for NR columns (a zero-padded panel).
template <class T, std::size_t APack, std::size_t... Ms>
inline void tile_rows(std::size_t m, std::size_t n, kernel_args<T> p, std::index_sequence<Ms...>) noexcept {
  using cfg = gemm_config<T>;
  constexpr std::size_t NR = cfg::nr;
  if (n == NR) {
    (void)((m == Ms + 1 ? (micro_kernel<T, Ms + 1, cfg::nv, APack>(p), true) : false) || ...);
    return;
  }
  alignas(64) T tile[cfg::mr * NR];
  if (p.accumulate)
    for (std::size_t r = 0; r < m; ++r) std::memcpy(tile + r * NR, p.c + std::ptrdiff_t(r) * p.ldc, n * sizeof(T));
  T* c = p.c;
  const std::ptrdiff_t ldc = p.ldc;
  p.c = tile;
  p.ldc = NR;
  (void)((m == Ms + 1 ? (micro_kernel<T, Ms + 1, cfg::nv, APack>(p), true) : false) || ...);
  for (std::size_t r = 0; r < m; ++r) std::memcpy(c + std::ptrdiff_t(r) * ldc, tile + r * NR, n * sizeof(T));
}

template <class T, std::size_t APack>
inline void tile(std::size_t m, std::size_t n, const kernel_args<T>& p) noexcept {
  tile_rows<T, APack>(m, n, p, std::make_index_sequence<gemm_config<T>::mr>{});
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
#elif defined(__AVX__)
  if constexpr (std::is_same_v<T, float> && W == 8) {
    // 8 x 8 floats in registers (AVX2 builds): 32-bit interleaves, 64-bit shuffles within 128-bit
    // lanes, then 128-bit lane swaps. 24 shuffles for 64 elements; the portable path below went
    // through memory and an insert per element (7% of a 256 x 512 x 192 product at AVX2, run AQ).
    __m256 r[8], t[8];
    for (int j = 0; j < 8; ++j) r[j] = _mm256_loadu_ps(src + j * lds);
    for (int j = 0; j < 8; j += 2) {
      t[j] = _mm256_unpacklo_ps(r[j], r[j + 1]);  // lanes: (j,0) (j+1,0) (j,1) (j+1,1) | same +4
      t[j + 1] = _mm256_unpackhi_ps(r[j], r[j + 1]);
    }
    for (int g = 0; g < 8; g += 4) {  // r[g + c]: rows g..g+3 of columns c and c + 4
      r[g] = _mm256_shuffle_ps(t[g], t[g + 2], 0x44);
      r[g + 1] = _mm256_shuffle_ps(t[g], t[g + 2], 0xEE);
      r[g + 2] = _mm256_shuffle_ps(t[g + 1], t[g + 3], 0x44);
      r[g + 3] = _mm256_shuffle_ps(t[g + 1], t[g + 3], 0xEE);
    }
    for (int c = 0; c < 4; ++c) {
      _mm256_storeu_ps(dst + c * ldd, _mm256_permute2f128_ps(r[c], r[4 + c], 0x20));
      _mm256_storeu_ps(dst + (4 + c) * ldd, _mm256_permute2f128_ps(r[c], r[4 + c], 0x31));
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

// dst[i * ldd + j] = src[j * lds + i] for i < rows, j < cols: W x W blocks through registers, the
// edges element by element.
template <class T>
inline void transpose_into(std::size_t rows, std::size_t cols, const T* src, std::size_t lds, T* dst,
                           std::ptrdiff_t ldd) noexcept {
  constexpr std::size_t W = xsimd::batch<T>::size;
  std::size_t i0 = 0;
  for (; i0 + W <= rows; i0 += W) {
    std::size_t j0 = 0;
    for (; j0 + W <= cols; j0 += W)
      transpose_block(src + j0 * lds + i0, std::ptrdiff_t(lds), dst + std::ptrdiff_t(i0) * ldd + std::ptrdiff_t(j0),
                      std::size_t(ldd));
    for (std::size_t i = i0; i < i0 + W; ++i)
      for (std::size_t j = j0; j < cols; ++j) dst[std::ptrdiff_t(i) * ldd + std::ptrdiff_t(j)] = src[j * lds + i];
  }
  for (std::size_t i = i0; i < rows; ++i)
    for (std::size_t j = 0; j < cols; ++j) dst[std::ptrdiff_t(i) * ldd + std::ptrdiff_t(j)] = src[j * lds + i];
}

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
    if (k + 8 < kc)  // eight rows ahead, into L2: each row segment starts a new page (~10%)
      for (std::size_t l = 0; l < width; l += 64 / sizeof(T)) prefetch_l2(row, 8 * ldb + std::ptrdiff_t(l));
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
  const T* b_packed = nullptr;  // B's whole column blocks packed (pack_gemv_blocks), or null
};

// B [K, N] (unit column stride) as the one-row GEMV reads it from the caches: each whole block of
// gemv_block_vectors vectors of columns, all K rows of it one after another ([N / block][K][block]),
// so a block's K loop is one sequential stream. For weights prepared once (options::freezing):
// measured 18.7 against 21.0 us on 784x512 (AVX-512). The columns past the last whole block are
// read from B.
template <class T>
constexpr std::size_t gemv_block_columns() noexcept {
  return gemm_config<T>::gemv_block_vectors * xsimd::batch<T>::size;
}
template <class T>
constexpr std::size_t gemv_packed_bytes(std::size_t N, std::size_t K) noexcept {
  return N / gemv_block_columns<T>() * gemv_block_columns<T>() * K * sizeof(T);
}
template <class T>
void pack_gemv_blocks(std::size_t K, std::size_t N, const T* b, std::ptrdiff_t ldb, T* dst) noexcept {
  constexpr std::size_t BC = gemv_block_columns<T>();
  for (std::size_t q = 0; q < N / BC; ++q)
    for (std::size_t k = 0; k < K; ++k) std::memcpy(dst + (q * K + k) * BC, b + std::ptrdiff_t(k) * ldb + std::ptrdiff_t(q * BC), BC * sizeof(T));
}

// Rows 0..MX of A as unit-stride pointers (copied to `xbuf`, MX x K, when A's column stride is
// not 1).
template <class T, std::size_t MX>
inline void narrow_rows(const gemm_problem<T>& p, T* xbuf, const T* (&x)[MX]) noexcept {
  for (std::size_t i = 0; i < MX; ++i) {
    const T* src = p.A.data + std::ptrdiff_t(i) * p.A.row_stride;
    if (p.A.col_stride == 1) {
      x[i] = src;
    } else {
      T* dst = xbuf + i * p.K;
      for (std::size_t k = 0; k < p.K; ++k) dst[k] = src[std::ptrdiff_t(k) * p.A.col_stride];
      x[i] = dst;
    }
  }
}

// Case 2: Y[0..MX, 0..N) = X * B, B row-major. Tasks: chunks of columns; R rows of B per pass
// over the chunk, each row used for all MX outputs.
template <class T, std::size_t MX, class Epilogue>
void run_gemv_rows(std::size_t item, const gemm_problem<T>& p, Epilogue& epilogue, thread_pool& pool, T* xbuf,
                   T* scratch, std::size_t scratch_stride) {
  using cfg = gemm_config<T>;
  using V = xsimd::batch<T>;
  constexpr std::size_t W = V::size;
  constexpr std::size_t R = cfg::gemv_rows_per_pass;
  const T* x[MX];
  narrow_rows<T, MX>(p, xbuf, x);
  // Chunk width: N / threads, so each row of B is read in runs as long as possible (a run that
  // starts a page waits for the prefetchers; half-width chunks measured 10-15% slower), at most
  // gemv_cols so that the y chunk stays in L1.
  const std::size_t cols =
      std::clamp(round_up(ceil_div(p.N, std::size_t(pool.size())), 4 * W), std::size_t(256), cfg::gemv_cols);
  const std::size_t tasks = ceil_div(p.N, cols);
  const std::ptrdiff_t ldb = p.B.row_stride;
  pool.parallel_for(tasks, [&](std::size_t t, unsigned worker) {
    const std::size_t j0 = t * cols, n = std::min(cols, p.N - j0);
    const std::size_t nvec = n / W * W;
    constexpr bool use_scratch = MX > 4;  // see gemv_scratch_ld
    T* y[MX];
    for (std::size_t i = 0; i < MX; ++i) {
      y[i] = use_scratch ? scratch + worker * scratch_stride + i * gemv_scratch_ld<T>()
                         : p.C + std::ptrdiff_t(i) * p.ldc + std::ptrdiff_t(j0);
      std::fill(y[i], y[i] + n, T(0));
    }
    const T* b = p.B.data + j0;
    if constexpr (MX == 1) {
      if (p.K * p.N * sizeof(T) <= cfg::gemv_resident_bytes) {
        // B from the caches: a block of y in registers over all of K, one load per fma (no y
        // reloaded per pass, no prefetch). Each element is still one fma chain in increasing k.
        const T* x0 = x[0];
        // Columns [j, j + NB * W) from bk (row k at bk + k * step).
        auto block = [&](std::size_t j, const T* bk, std::ptrdiff_t step, auto vectors_c) {
          constexpr std::size_t NB = decltype(vectors_c)::value;
          V acc[NB];
          for (std::size_t v = 0; v < NB; ++v) acc[v] = V(T(0));
          for (std::size_t k = 0; k < p.K; ++k, bk += step) {
            const V xv(x0[k]);
#pragma GCC unroll 16
            for (std::size_t v = 0; v < NB; ++v) acc[v] = vmath::detail::fma(xv, V::load_unaligned(bk + v * W), acc[v]);
          }
          for (std::size_t v = 0; v < NB; ++v) acc[v].store_unaligned(y[0] + j + v * W);
        };
        constexpr std::size_t NB = cfg::gemv_block_vectors, BC = NB * W;
        const std::ptrdiff_t bc = std::ptrdiff_t(BC);
        std::size_t j = 0;
        for (; j + BC <= nvec; j += BC) {
          if (p.b_packed && (j0 + j) % BC == 0)  // a whole block of the packed copy
            block(j, p.b_packed + (j0 + j) / BC * p.K * BC, bc, std::integral_constant<std::size_t, NB>{});
          else
            block(j, b + j, ldb, std::integral_constant<std::size_t, NB>{});
        }
        for (; j < nvec; j += W) block(j, b + j, ldb, std::integral_constant<std::size_t, 1>{});
        if (j < n) {  // the last n - j < W columns side by side: independent chains, not one after another
          T acc[W] = {};
          const std::size_t rest = n - j;
          const T* bk = b + j;
          for (std::size_t k = 0; k < p.K; ++k, bk += ldb)
            for (std::size_t t = 0; t < rest; ++t) acc[t] = vmath::detail::fma(x0[k], bk[t], acc[t]);
          for (std::size_t t = 0; t < rest; ++t) y[0][j + t] = acc[t];
        }
        epilogue(item, 0, j0, n, y[0]);
        return;
      }
    }
    auto pass = [&](std::size_t k, auto rows_c) {  // rows k .. k + RR of B into every y
      constexpr std::size_t RR = decltype(rows_c)::value;
      T xs[MX][RR];
      const T* rows[RR];
      for (std::size_t r = 0; r < RR; ++r) {
        rows[r] = b + std::ptrdiff_t(k + r) * ldb;
        for (std::size_t i = 0; i < MX; ++i) xs[i][r] = x[i][k + r];
      }
      for (std::size_t j = 0; j < nvec; j += W) {
        V acc[MX];
        for (std::size_t i = 0; i < MX; ++i) acc[i] = V::load_unaligned(y[i] + j);
#pragma GCC unroll 8
        for (std::size_t r = 0; r < RR; ++r) {
          const V bv = V::load_unaligned(rows[r] + j);
          for (std::size_t i = 0; i < MX; ++i) acc[i] = vmath::detail::fma(V(xs[i][r]), bv, acc[i]);
        }
        for (std::size_t i = 0; i < MX; ++i) acc[i].store_unaligned(y[i] + j);
        // The same columns of the next pass's rows, one pass ahead, into L2. (Into L1 they would
        // evict each other: with a power-of-two row stride they all fall in one set.) Measured
        // 20-25% faster for M = 1; the hardware prefetchers restart at every 4 KiB page.
        if (k + 2 * RR <= p.K && (j * sizeof(T)) % 64 == 0)
#pragma GCC unroll 8
          for (std::size_t r = 0; r < RR; ++r) prefetch_l2(rows[r], std::ptrdiff_t(RR) * ldb + std::ptrdiff_t(j));
      }
      for (std::size_t j = nvec; j < n; ++j)
        for (std::size_t i = 0; i < MX; ++i) {
          T acc = y[i][j];
          for (std::size_t r = 0; r < RR; ++r) acc = vmath::detail::fma(xs[i][r], rows[r][j], acc);
          y[i][j] = acc;
        }
    };
    std::size_t k = 0;
    for (; k + R <= p.K; k += R) pass(k, std::integral_constant<std::size_t, R>{});
    for (; k < p.K; ++k) pass(k, std::integral_constant<std::size_t, 1>{});
    for (std::size_t i = 0; i < MX; ++i) {
      T* c = p.C + std::ptrdiff_t(i) * p.ldc + std::ptrdiff_t(j0);
      if (use_scratch) std::memcpy(c, y[i], n * sizeof(T));
      epilogue(item, i, j0, n, c);
    }
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

// Case 3 helper: out[i * ldo + r] = dot(x[i], row r of B^T) for MX x ROWS outputs. Each output
// has one vector accumulator (a chain of fmas over k in steps of a vector), summed across its
// lanes at the end, so its arithmetic does not depend on MX or ROWS: grouping never changes a
// result. One accumulator each leaves room for twice the rows (concurrent streams) of the two
// per output this had until run AS (docs/benchmarks.md): a scratch of W3c b1's three products,
// old and new alternated, took 0.87-0.96x the time at one thread on a Zen 3 EPYC (AVX2) and 0.96x
// on the H200 host's Xeon (AVX2; 1.00x at AVX-512 with 16 rows); with M = 4, 0.89x (Zen 3) and
// 0.63-0.77x (Xeon). No software prefetch: the ROWS contiguous streams are what the hardware
// prefetchers follow best, and an L2 prefetch 4 KiB ahead of each (here until 571b81d) made the
// same products 1-12% slower on a Zen 3 EPYC and on the H200 host's Xeon, at AVX2 and AVX-512,
// 1 and 2 threads (run AR).
template <class T, std::size_t MX, std::size_t ROWS>
inline void dot_block(std::size_t K, const T* const* x, const T* bt, std::ptrdiff_t ldbt, T* out,
                      std::ptrdiff_t ldo) noexcept {
  using V = xsimd::batch<T>;
  constexpr std::size_t W = V::size;
  V acc[MX][ROWS];
  const T* rows[ROWS];
  for (std::size_t r = 0; r < ROWS; ++r) rows[r] = bt + std::ptrdiff_t(r) * ldbt;
  for (std::size_t i = 0; i < MX; ++i)
    for (std::size_t r = 0; r < ROWS; ++r) acc[i][r] = V(T(0));
  std::size_t k = 0;
  for (; k + W <= K; k += W) {
    V xv[MX];
#pragma GCC unroll 4
    for (std::size_t i = 0; i < MX; ++i) xv[i] = V::load_unaligned(x[i] + k);
#pragma GCC unroll 16
    for (std::size_t r = 0; r < ROWS; ++r) {
      const V b = V::load_unaligned(rows[r] + k);
#pragma GCC unroll 4
      for (std::size_t i = 0; i < MX; ++i) acc[i][r] = vmath::detail::fma(xv[i], b, acc[i][r]);
    }
  }
  for (std::size_t i = 0; i < MX; ++i)
    for (std::size_t r = 0; r < ROWS; ++r) {
      T s = lane_sum(acc[i][r]);
      for (std::size_t kk = k; kk < K; ++kk) s = vmath::detail::fma(x[i][kk], rows[r][kk], s);
      out[std::ptrdiff_t(i) * ldo + std::ptrdiff_t(r)] = s;
    }
}

// Case 3: Y[0..MX, 0..N) = X * B with B stored [N, K] (B(k, j) at data[j * col_stride + k]):
// dot products of rows that are both contiguous. Tasks: chunks of dot_task_rows columns.
template <class T, std::size_t MX, class Epilogue>
void run_gemv_dots(std::size_t item, const gemm_problem<T>& p, Epilogue& epilogue, thread_pool& pool, T* xbuf) {
  using cfg = gemm_config<T>;
  // Rows of B^T per block: as many concurrent streams as keep the MX * ROWS accumulators within
  // half the vector registers (8 rows for M = 1 with AVX2, 16 with AVX-512).
  constexpr std::size_t ROWS = std::max<std::size_t>(1, vector_registers / 2 / MX);
  const T* x[MX];
  narrow_rows<T, MX>(p, xbuf, x);
  const std::ptrdiff_t ldbt = p.B.col_stride;
  const std::size_t tasks = ceil_div(p.N, cfg::dot_task_rows);
  pool.parallel_for(tasks, [&](std::size_t t, unsigned) {
    const std::size_t j0 = t * cfg::dot_task_rows, n = std::min(cfg::dot_task_rows, p.N - j0);
    T* y = p.C + std::ptrdiff_t(j0);
    const T* bt = p.B.data + std::ptrdiff_t(j0) * ldbt;
    std::size_t j = 0;
    for (; j + ROWS <= n; j += ROWS)
      dot_block<T, MX, ROWS>(p.K, x, bt + std::ptrdiff_t(j) * ldbt, ldbt, y + j, p.ldc);
    for (; j < n; ++j) dot_block<T, MX, 1>(p.K, x, bt + std::ptrdiff_t(j) * ldbt, ldbt, y + j, p.ldc);
    for (std::size_t i = 0; i < MX; ++i) epilogue(item, i, j0, n, y + std::ptrdiff_t(i) * p.ldc);
  });
}

// Cases 2 and 3: the row count is a template parameter.
template <class T, class Epilogue, std::size_t... Ms>
void run_rows(std::size_t item, const gemm_problem<T>& p, Epilogue& epilogue, thread_pool& pool, T* xbuf,
              T* scratch, std::size_t scratch_stride, std::index_sequence<Ms...>) {
  (void)((p.M == Ms + 1 ? (run_gemv_rows<T, Ms + 1>(item, p, epilogue, pool, xbuf, scratch, scratch_stride), true)
                        : false) ||
         ...);
}
template <class T, class Epilogue, std::size_t... Ms>
void run_dots(std::size_t item, const gemm_problem<T>& p, Epilogue& epilogue, thread_pool& pool, T* xbuf,
              std::index_sequence<Ms...>) {
  (void)((p.M == Ms + 1 ? (run_gemv_dots<T, Ms + 1>(item, p, epilogue, pool, xbuf), true) : false) || ...);
}

// Case 4: C^T = B^T A^T. A^T packed once (whole K) into NR-wide panels; B^T rows read in place.
template <class T, class Epilogue>
void run_stream_bt(std::size_t item, const gemm_problem<T>& p, Epilogue& epilogue, thread_pool& pool, T* ap,
                   T* scratch, std::size_t scratch_stride, bool pack_a, stream_order order,
                   std::size_t kc_block = 0, bool panel_major = false) {
  using cfg = gemm_config<T>;
  constexpr std::size_t MR = cfg::mr, NR = cfg::nr;
  const std::size_t KC = kc_block ? kc_block : cfg::kc_stream;
  const std::size_t panels = ceil_div(p.M, NR);
  const std::size_t ldt = panels * NR;  // scratch row length
  const std::size_t kchunks = ceil_div(p.K, KC);
  // The packed panel s of the K block at pc (KC x NR, k-major). A K block's panels are one
  // contiguous run (ldt x KC), which K block first reads from L2 for every sliver. Panel by panel
  // over the whole K (`panel_major`, the layout until run BA) put them NR * K elements apart,
  // 256 KiB for float with AVX2 at K = 4096: on 2 MiB pages all 16 panels of M = 256 fell in half
  // of a 2 MiB 16-way L2's sets. On the H200 host's Xeon (AVX2, docs/benchmarks.md, run BA) the
  // contiguous blocks took 0.88-1.01x the time of the panels on 4 KiB pages, and the panels on
  // 2 MiB pages 0.98-1.10x; the suite's compiled [N, K] W3c b256 no longer trailed eager at one
  // thread (compared across runs AZ and BA, not alternated). With AVX-512 (NR = 32: a panel's K
  // block is one whole period of those sets) 1.00-1.03x, level.
  auto panel_at = [&](std::size_t s, std::size_t pc) {
    return panel_major ? ap + s * NR * p.K + pc * NR : ap + pc * ldt + s * NR * std::min(KC, p.K - pc);
  };
  // A^T(k, i) = A(i, k): a "B-like" operand with row stride A.col_stride, column stride A.row_stride.
  pool.parallel_for(pack_a ? panels * kchunks : 0, [&](std::size_t t, unsigned) {
    const std::size_t s = t / kchunks, k0 = (t % kchunks) * KC, kn = std::min(KC, p.K - k0);
    const std::size_t i0 = s * NR, n = std::min(NR, p.M - i0);
    pack_b_panel(n, kn, p.A.data + std::ptrdiff_t(i0) * p.A.row_stride + std::ptrdiff_t(k0) * p.A.col_stride,
                 p.A.col_stride, p.A.row_stride, panel_at(s, k0), NR);
  });

  const std::size_t slivers = ceil_div(p.N, MR);
  const std::size_t per_task =
      std::clamp<std::size_t>(slivers / (4 * pool.size()), 1, stream_slivers_per_task<T>(p.M));
  const std::size_t tasks = ceil_div(slivers, per_task);
  const std::ptrdiff_t bt_rs = p.B.col_stride, bt_cs = p.B.row_stride;  // B^T(j, k)
  const bool k_block_first = order == stream_order::automatic
                                 ? stream_k_block_first<T>(p.M, p.K, l2_cache_bytes())
                                 : order == stream_order::k_block_first;
  pool.parallel_for(tasks, [&](std::size_t t, unsigned worker) {
    const std::size_t jb = t * per_task * MR, je = std::min(p.N, jb + per_task * MR);
    T* ct = scratch + worker * scratch_stride;  // C^T of columns jb..je: ct[(j - jb) * ldt + i]
    // One sliver's tiles over one K block (the same fma chain per element in either order).
    auto block = [&](std::size_t j, std::size_t pc) {
      const std::size_t m = std::min(MR, je - j), kc = std::min(KC, p.K - pc);
      const T* bt = p.B.data + std::ptrdiff_t(j) * bt_rs + std::ptrdiff_t(pc) * bt_cs;
      T* tile_c = ct + (j - jb) * ldt;
      for (std::size_t s = 0; s < panels; ++s)
        tile<T, 0>(m, NR,
                   kernel_args<T>{kc, bt, bt_rs, bt_cs, panel_at(s, pc), std::ptrdiff_t(NR),
                                  tile_c + s * NR, std::ptrdiff_t(ldt), pc > 0});
    };
    if (k_block_first) {
      for (std::size_t pc = 0; pc < p.K; pc += KC)
        for (std::size_t j = jb; j < je; j += MR) block(j, pc);
    } else {
      for (std::size_t j = jb; j < je; j += MR)
        for (std::size_t pc = 0; pc < p.K; pc += KC) block(j, pc);
    }
    transpose_into(p.M, je - jb, ct, ldt, p.C + std::ptrdiff_t(jb), p.ldc);
    for (std::size_t i = 0; i < p.M; ++i) epilogue(item, i, jb, je - jb, p.C + std::ptrdiff_t(i) * p.ldc + std::ptrdiff_t(jb));
  });
}

// Case 5: BLIS-style, both operands packed. The steps (jc, pc, ic0) are software-pipelined:
// parallel_for number s computes step s and packs step s + 1 (double-buffered), its pack tasks
// spread among the compute tasks, so one thread streams memory while the other computes, and
// there is one fork-join per step.
template <class T>
struct blocked_buffers {
  T* b[2];  // packed B panel, KC x round_up(NC, NR)
  T* a[2];  // packed A block, round_up(MCO, MR) x KC
};

template <class T, class Epilogue>
void run_blocked(std::size_t item, const gemm_problem<T>& p, Epilogue& epilogue, thread_pool& pool,
                 const blocked_buffers<T>& buf, std::size_t tasks_per_thread = 4) {
  using cfg = gemm_config<T>;
  constexpr std::size_t MR = cfg::mr, NR = cfg::nr, KC = cfg::kc_blocked, MC = cfg::mc;
  const std::size_t n_jc = ceil_div(p.N, cfg::nc), n_pc = ceil_div(p.K, KC), n_ic = ceil_div(p.M, cfg::mco);
  const std::size_t steps = n_jc * n_pc * n_ic;

  struct step {
    std::size_t jc, nc, npanels, pc, kc, ic0, mco, nslivers;
    std::size_t b_index;  // which (jc, pc) panel: selects the B buffer
    bool new_b;           // first step of its (jc, pc): B must be packed
  };
  auto step_at = [&](std::size_t s) {
    step st;
    const std::size_t jci = s / (n_pc * n_ic), pci = s / n_ic % n_pc, ici = s % n_ic;
    st.jc = jci * cfg::nc;
    st.nc = std::min(cfg::nc, p.N - st.jc);
    st.npanels = ceil_div(st.nc, NR);
    st.pc = pci * KC;
    st.kc = std::min(KC, p.K - st.pc);
    st.ic0 = ici * cfg::mco;
    st.mco = std::min(cfg::mco, p.M - st.ic0);
    st.nslivers = ceil_div(st.mco, MR);
    st.b_index = s / n_ic;
    st.new_b = ici == 0;
    return st;
  };

  // Pack tasks of a step: B panels in groups of 8 (if the step starts a new panel), then A
  // slivers in groups of 8.
  auto pack_tasks = [&](const step& st) {
    return (st.new_b ? ceil_div(st.npanels, 8) : 0) + ceil_div(st.nslivers, 8);
  };
  auto pack = [&](const step& st, std::size_t s, std::size_t t) {
    T* bp = buf.b[st.b_index % 2];
    T* ap = buf.a[s % 2];
    const std::size_t bgroups = st.new_b ? ceil_div(st.npanels, 8) : 0;
    if (t < bgroups) {
      const std::size_t qb = t * 8, qe = std::min(st.npanels, qb + 8);
      const T* src =
          p.B.data + std::ptrdiff_t(st.pc) * p.B.row_stride + std::ptrdiff_t(st.jc + qb * NR) * p.B.col_stride;
      if (p.B.col_stride == 1) {  // row by row: long sequential reads
        pack_b_rows(st.kc, std::min(st.nc, qe * NR) - qb * NR, src, p.B.row_stride, bp + qb * NR * st.kc);
      } else {
        for (std::size_t q = qb; q < qe; ++q)
          pack_b_panel(std::min(NR, st.nc - q * NR), st.kc, src + std::ptrdiff_t((q - qb) * NR) * p.B.col_stride,
                       p.B.row_stride, p.B.col_stride, bp + q * NR * st.kc, NR);
      }
      return;
    }
    t -= bgroups;
    for (std::size_t sl = t * 8; sl < std::min(st.nslivers, t * 8 + 8); ++sl) {
      const std::size_t i = sl * MR;
      pack_a_sliver(std::min(MR, st.mco - i), st.kc,
                    p.A.data + std::ptrdiff_t(st.ic0 + i) * p.A.row_stride + std::ptrdiff_t(st.pc) * p.A.col_stride,
                    p.A.row_stride, p.A.col_stride, ap + sl * MR * st.kc, MR);
    }
  };

  // Compute blocks of a step: (mc x NB) with equal M blocks (a multiple of MR, so no block is a
  // small remainder); NB halves until there are >= tasks_per_thread (4; max_autotune may take 1)
  // tasks per thread.
  struct grid {
    std::size_t mblocks, mc, nb_panels, nblocks;
  };
  auto grid_of = [&](const step& st) {
    grid g;
    g.mblocks = ceil_div(st.mco, MC);
    g.mc = round_up(ceil_div(st.mco, g.mblocks), MR);
    g.nb_panels = st.npanels;
    while (g.nb_panels > 4 && g.mblocks * ceil_div(st.npanels, g.nb_panels) < tasks_per_thread * std::size_t(pool.size()))
      g.nb_panels = ceil_div(g.nb_panels, 2);
    g.nblocks = ceil_div(st.npanels, g.nb_panels);
    return g;
  };
  auto compute = [&](const step& st, const grid& g, std::size_t s, std::size_t t) {
    const T* bp = buf.b[st.b_index % 2];
    const T* ap = buf.a[s % 2];
    const bool last_k = st.pc + st.kc == p.K;
    const std::size_t mbk = t % g.mblocks, nbk = t / g.mblocks;
    const std::size_t ib = mbk * g.mc, ie = std::min(st.mco, ib + g.mc);
    const std::size_t qb = nbk * g.nb_panels, qe = std::min(st.npanels, qb + g.nb_panels);
    // Panels in groups of 4, so that the epilogue reads an (mc x 4 NR) block that is still in L2.
    for (std::size_t g0 = qb; g0 < qe; g0 += 4) {
      const std::size_t g1 = std::min(qe, g0 + 4);
      for (std::size_t q = g0; q < g1; ++q) {
        const std::size_t j = q * NR, n = std::min(NR, st.nc - j);
        for (std::size_t i = ib; i < ie; i += MR) {
          const std::size_t m = std::min(MR, ie - i);
          T* c = p.C + std::ptrdiff_t(st.ic0 + i) * p.ldc + std::ptrdiff_t(st.jc + j);
          if (i + MR < ie)  // the next tile of C, which comes from L3 or memory
            for (std::size_t r = 0; r < MR; ++r)
              for (std::size_t l = 0; l < n; l += 64 / sizeof(T))
                prefetch_l1(c + std::ptrdiff_t(MR + r) * p.ldc + std::ptrdiff_t(l));
          tile<T, MR>(m, n,
                      kernel_args<T>{st.kc, ap + (i / MR) * MR * st.kc, 0, 0, bp + q * NR * st.kc,
                                     std::ptrdiff_t(NR), c, p.ldc, st.pc > 0});
        }
      }
      if (last_k) {
        const std::size_t j0 = st.jc + g0 * NR, jn = std::min(st.nc, g1 * NR) - g0 * NR;
        for (std::size_t i = ib; i < ie; ++i)
          epilogue(item, st.ic0 + i, j0, jn, p.C + std::ptrdiff_t(st.ic0 + i) * p.ldc + std::ptrdiff_t(j0));
      }
    }
  };

  {
    const step first = step_at(0);
    pool.parallel_for(pack_tasks(first), [&](std::size_t t, unsigned) { pack(first, 0, t); });
  }
  for (std::size_t s = 0; s < steps; ++s) {
    const step cur = step_at(s);
    const grid g = grid_of(cur);
    const std::size_t ct = g.mblocks * g.nblocks;
    const bool more = s + 1 < steps;
    const step next = more ? step_at(s + 1) : cur;
    const std::size_t pt = more ? pack_tasks(next) : 0, total = ct + pt;
    pool.parallel_for(total, [&](std::size_t t, unsigned) {
      // Task t is a pack task where the running count t * pt / total steps up.
      const std::size_t before = t * pt / total, after = (t + 1) * pt / total;
      if (after > before)
        pack(next, s + 1, before);
      else
        compute(cur, g, s, t - before);
    });
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
  if (M <= detail::gemm_config<T>::rows_max_m)
    bytes = std::max(bytes, detail::layout_for<T>(gemm_path::gemv_rows, M, N, K).total(threads));
  if (M <= detail::gemm_config<T>::dots_max_m)
    bytes = std::max(bytes, detail::layout_for<T>(gemm_path::gemv_dots, M, N, K).total(threads));
  if (detail::stream_fits<T>(M, K))
    bytes = std::max(bytes, detail::layout_for<T>(gemm_path::stream_bt, M, N, K).total(threads));
  return bytes;
}

namespace detail {

// What a gemm call runs: the default is choose_path's path on the caller's pool with 4 tasks a
// thread in the blocked path; max_autotune may pick another (backend/cpu/autotune.hpp).
struct gemm_choice {
  gemm_path path;
  bool serial = false;                 // on one thread (the caller's)
  std::size_t tasks_per_thread = 4;    // blocked path's grid
  stream_order order = stream_order::automatic;  // stream B^T path's loop order
  std::size_t stream_kc = 0;                     // its K block; 0: gemm_config::kc_stream
  bool stream_panel_major = false;               // A^T packed panel by panel (before run BA; bench only)
};

inline const char* path_name(gemm_path p) noexcept {
  switch (p) {
    case gemm_path::zero_k: return "zero K";
    case gemm_path::gemv_rows: return "gemv rows";
    case gemm_path::gemv_dots: return "gemv dots";
    case gemm_path::stream_bt: return "stream B^T";
    case gemm_path::blocked: return "blocked";
  }
  return "?";
}

// The body of gemm() for one choice; the workspace is checked by the caller.
template <class T, class Epilogue>
void gemm_with(const gemm_choice& choice, std::size_t batch, std::size_t M, std::size_t N, std::size_t K,
               matrix_view<T> A, std::ptrdiff_t a_batch_stride, matrix_view<T> B, std::ptrdiff_t b_batch_stride, T* C,
               std::ptrdiff_t ldc, std::ptrdiff_t c_batch_stride, Epilogue& epilogue, thread_pool& pool,
               std::span<std::byte> workspace, const T* b_packed = nullptr) {
  const gemm_path path = choice.path;
  const gemm_layout layout = layout_for<T>(path, M, N, K);
  std::byte* base = align64(workspace.data());
  T* shared = reinterpret_cast<T*>(base);
  T* per_thread = reinterpret_cast<T*>(base + layout.shared);
  const std::size_t per_thread_elems = layout.per_thread / sizeof(T);

  for (std::size_t b = 0; b < batch; ++b) {
    const gemm_problem<T> p{M,
                            N,
                            K,
                            {A.data + std::ptrdiff_t(b) * a_batch_stride, A.row_stride, A.col_stride},
                            {B.data + std::ptrdiff_t(b) * b_batch_stride, B.row_stride, B.col_stride},
                            C + std::ptrdiff_t(b) * c_batch_stride,
                            ldc,
                            batch == 1 ? b_packed : nullptr};
    switch (path) {
      case gemm_path::gemv_rows:
        run_rows(b, p, epilogue, pool, shared, per_thread, per_thread_elems,
                 std::make_index_sequence<gemm_config<T>::rows_max_m>{});
        break;
      case gemm_path::gemv_dots:
        run_dots(b, p, epilogue, pool, shared, std::make_index_sequence<gemm_config<T>::dots_max_m>{});
        break;
      case gemm_path::stream_bt:  // A shared across the batch: packed once
        run_stream_bt(b, p, epilogue, pool, shared, per_thread, per_thread_elems, b == 0 || a_batch_stride != 0,
                      choice.order, choice.stream_kc, choice.stream_panel_major);
        break;
      case gemm_path::blocked: {
        const std::size_t b_bytes = blocked_b_bytes<T>(N, K), a_bytes = blocked_a_bytes<T>(M, K);
        std::byte* at = base;
        blocked_buffers<T> buf;
        for (int i = 0; i < 2; ++i, at += b_bytes) buf.b[i] = reinterpret_cast<T*>(at);
        for (int i = 0; i < 2; ++i, at += a_bytes) buf.a[i] = reinterpret_cast<T*>(at);
        run_blocked(b, p, epilogue, pool, buf, choice.tasks_per_thread);
        break;
      }
      case gemm_path::zero_k:
        break;
    }
  }
}

// max_autotune's choice for this problem (backend/cpu/autotune.hpp). Candidate 0 is the default;
// then the stream B^T path's other loop order where K has more than one block, the blocked path
// where the default is another (valid for any layout; the same fma chain per element, so bitwise
// equal except against gemv dots), its 1-task-a-thread grid, and each of those on one thread.
// Candidates whose workspace exceeds the caller's are left out. Timed into a private C without
// the epilogue.
template <class T>
gemm_choice tuned_choice(std::size_t batch, std::size_t M, std::size_t N, std::size_t K, matrix_view<T> A,
                         std::ptrdiff_t a_batch_stride, matrix_view<T> B, std::ptrdiff_t b_batch_stride,
                         thread_pool& pool, std::span<std::byte> workspace) {
  const gemm_path first = choose_path<T>(M, K, B.row_stride, B.col_stride);
  std::vector<gemm_choice> cands{gemm_choice{first}};
  if (first == gemm_path::stream_bt && K > gemm_config<T>::kc_stream)  // the loop order the default does not take
    cands.push_back(gemm_choice{first, false, 4,
                                stream_k_block_first<T>(M, K, l2_cache_bytes()) ? stream_order::sliver_first
                                                                                 : stream_order::k_block_first});
  if (first != gemm_path::blocked) cands.push_back(gemm_choice{gemm_path::blocked});
  if (pool.size() > 1) cands.push_back(gemm_choice{gemm_path::blocked, false, 1});
  if (pool.size() > 1) {
    const std::size_t parallel = cands.size();
    for (std::size_t i = 0; i < parallel; ++i)
      if (cands[i].tasks_per_thread == 4) {
        gemm_choice one = cands[i];
        one.serial = true;
        cands.push_back(one);
      }
  }
  std::erase_if(cands, [&](const gemm_choice& c) {
    return layout_for<T>(c.path, M, N, K).total(c.serial ? 1u : pool.size()) > workspace.size();
  });
  if (cands.empty()) return gemm_choice{first};
  auto name = [&](const gemm_choice& c) {
    return std::string(path_name(c.path)) + (c.path == gemm_path::blocked ? ", " + std::to_string(c.tasks_per_thread) + " tasks/thread" : "") +
           (c.order == stream_order::sliver_first    ? ", sliver first"
            : c.order == stream_order::k_block_first ? ", K block first"
                                                      : "") +
           (c.serial ? ", 1 thread" : ", " + std::to_string(pool.size()) + " threads");
  };
  auto layout = [](matrix_view<T> v) { return v.col_stride == 1 ? 0u : v.row_stride == 1 ? 1u : 2u; };
  autotune::problem_id id;
  id.v = {1, sizeof(T), batch, M, N, K, layout(A), a_batch_stride == 0, layout(B), b_batch_stride == 0, pool.size()};
  auto text = [&] {
    const char* names[] = {"rows", "cols", "strided"};
    return std::string("gemm ") + (sizeof(T) == 4 ? "f32" : "f64") + " batch " + std::to_string(batch) + " M " +
           std::to_string(M) + " N " + std::to_string(N) + " K " + std::to_string(K) + " A " + names[layout(A)] +
           (a_batch_stride == 0 ? " shared" : "") + " B " + names[layout(B)] + (b_batch_stride == 0 ? " shared" : "") +
           " threads " + std::to_string(pool.size());
  };
  const std::size_t pick = autotune::choose(id, cands.size(), text, [&] {
    std::vector<autotune::candidate> out;
    auto scratch = std::make_shared<std::vector<T>>(batch * M * N);
    for (const gemm_choice& c : cands)
      out.push_back({name(c), [=, &pool] {
                       no_epilogue none;
                       epilogue_ref<T> none_ref(none);
                       gemm_with<T>(c, batch, M, N, K, A, a_batch_stride, B, b_batch_stride, scratch->data(),
                                    std::ptrdiff_t(N), std::ptrdiff_t(M * N), none_ref,
                                    c.serial ? autotune::serial_pool() : pool, workspace);
                     }});
    return out;
  });
  return cands[pick];
}

#ifdef FUSEBOX_RUNTIME_INSTANCE  // compiled once where a program asks for it (core/linkage.hpp)
FUSEBOX_RUNTIME_INSTANCE void gemm_with<float, epilogue_ref<float>>(const gemm_choice&, std::size_t, std::size_t, std::size_t, std::size_t, matrix_view<float>, std::ptrdiff_t, matrix_view<float>, std::ptrdiff_t, float*, std::ptrdiff_t, std::ptrdiff_t, epilogue_ref<float>&, thread_pool&, std::span<std::byte>, const float*);
FUSEBOX_RUNTIME_INSTANCE gemm_choice tuned_choice<float>(std::size_t, std::size_t, std::size_t, std::size_t, matrix_view<float>, std::ptrdiff_t, matrix_view<float>, std::ptrdiff_t, thread_pool&, std::span<std::byte>);
FUSEBOX_RUNTIME_INSTANCE void gemm_with<double, epilogue_ref<double>>(const gemm_choice&, std::size_t, std::size_t, std::size_t, std::size_t, matrix_view<double>, std::ptrdiff_t, matrix_view<double>, std::ptrdiff_t, double*, std::ptrdiff_t, std::ptrdiff_t, epilogue_ref<double>&, thread_pool&, std::span<std::byte>, const double*);
FUSEBOX_RUNTIME_INSTANCE gemm_choice tuned_choice<double>(std::size_t, std::size_t, std::size_t, std::size_t, matrix_view<double>, std::ptrdiff_t, matrix_view<double>, std::ptrdiff_t, thread_pool&, std::span<std::byte>);
#endif

}  // namespace detail

// C[b] = A[b] * B[b] for b < batch, then epilogue(b, i, j0, n, &C[b][i][j0]) exactly once per row
// i and column run [j0, j0 + n) of each C[b] (the runs of a row partition [0, N)), after those
// values are final, on the thread that computed them; it may rewrite them in place. The
// workspace must hold gemm_workspace_bytes<T>(batch, M, N, K, pool.size()) bytes (any
// alignment) and must not be shared by concurrent calls. Throws std::invalid_argument if it is
// smaller; rethrows the first exception of the epilogue. Inside a max_autotune call
// (backend/cpu/autotune.hpp) the path, grid and thread count are the problem's tuned choice.
template <class T, class Epilogue>
void gemm(std::size_t batch, std::size_t M, std::size_t N, std::size_t K, matrix_view<T> A,
          std::ptrdiff_t a_batch_stride, matrix_view<T> B, std::ptrdiff_t b_batch_stride, T* C, std::ptrdiff_t ldc,
          std::ptrdiff_t c_batch_stride, Epilogue&& epilogue, thread_pool& pool, std::span<std::byte> workspace,
          const T* b_packed = nullptr) {
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
  const std::size_t need = detail::layout_for<T>(path, M, N, K).total(threads);
  if (workspace.size() < need)
    FUSEBOX_THROW(std::invalid_argument("fusebox::cpu::gemm: workspace of " + std::to_string(workspace.size()) +
                                        " bytes is too small for batch " + std::to_string(batch) + ", M " +
                                        std::to_string(M) + ", N " + std::to_string(N) + ", K " + std::to_string(K) +
                                        " on " + std::to_string(threads) + " threads: needs " + std::to_string(need) +
                                        " (gemm_workspace_bytes<T>(...))"));
  epilogue_ref<T> ref(epilogue);
  if (autotune::active()) [[unlikely]] {
    const detail::gemm_choice c =
        detail::tuned_choice<T>(batch, M, N, K, A, a_batch_stride, B, b_batch_stride, pool, workspace);
    detail::gemm_with<T>(c, batch, M, N, K, A, a_batch_stride, B, b_batch_stride, C, ldc, c_batch_stride, ref,
                         c.serial ? autotune::serial_pool() : pool, workspace);
    return;
  }
  detail::gemm_with<T>(detail::gemm_choice{path}, batch, M, N, K, A, a_batch_stride, B, b_batch_stride, C, ldc,
                       c_batch_stride, ref, pool, workspace, b_packed);
}

}  // namespace fusebox::cpu
