// backend/cuda/spatial_kernels.hpp: hand-written CUDA kernels for the plan kinds that are not generated
// elementwise code: `spatial` (conv2d, max/avg pooling and their gradients, expr/spatial.hpp),
// `gather` (embedding and its scatter-add gradient, expr/gather.hpp) and `pad` (the gradient of
// slice and of concatenation's pieces). Like backend/cuda/attention_kernel.hpp, each node renders to one NVRTC
// unit of its own (the op, the storage type and a few ranks baked in; every extent and stride is an
// argument, so one unit serves every batch) and is launched from backend/cuda/generated_program.hpp with its own
// geometry. The semantics are the host kernels' (backend/cpu/conv.hpp, backend/cpu/pool.hpp, backend/cpu/gather.hpp,
// backend/cpu/attention.hpp's pad()); values are float whatever the storage type.
//
// A unit has the three entry points cuda_store looks up; here they are stages, not widths:
//   `fusebox_kernel`     the op (for the weight gradient, the split-K partial products)
//   `fusebox_kernel_w`   the second stage where there is one (weight gradient: the sum of the
//                        splits; embedding_backward: counting the ids), else the first again
//   `fusebox_kernel_v1`  the first again (never launched)
//
// Convolutions are implicit GEMMs C[M, N] = A[M, K] · B[K, N] over 64x64 output tiles: 256
// threads, 4x4 outputs each, K in steps of 16 through shared memory; A and B are gathered from
// the operands as the tile is loaded (no im2col buffer), padding read as 0:
//   conv2d              M = O, N = images·OH·OW, K = C·KH·KW   A = w, B = col(x)
//   conv2d_input_grad   M = C, N = images·H·W,   K = O·KH·KW   A = wᵀ, B = g at the outputs
//                       whose window covers the input pixel (0 where the stride skips it)
//   conv2d_weight_grad  M = O, N = C·KH·KW,      K = images·OH·OW   A = g, B = col(x)ᵀ: K is
//                       long and the output small, so K is cut into `splits` ranges (a function of
//                       the shapes only) whose float partials go to scratch, then summed in order
// Each output element is one fma chain in increasing k (and the splits in increasing order):
// results are the same bit for bit run to run. A conv's bias and relu are the planner's epilogue
// group, run after the op by the generated elementwise kernel in place, as after a cuBLASLt matmul.
//
// Pooling: a thread per output (forward) or per input pixel (backward, a gather over the outputs
// whose window covers it, in row-major order: the sums the host's scatter makes, in its order).
// Max: the first maximum of a window in row-major order wins, a NaN replaces it; padding is never
// a candidate; the backward recomputes the choice from x.
//
// Embedding: a thread per output element. embedding_backward: a thread per id counts the rows
// (integer atomics: exact), then a block per vocabulary row walks the ids in order, 256 at a time
// (a ballot keeps their order), and adds the gradient rows of its matches in increasing position
// into registers; it stops after the row's count. No float atomics: bit for bit the host's sums.
// Bad ids (not an integer in [0, V)): the forward writes a zero row, the backward skips the id,
// and the kernel records the first such position and its value in a flag word of the call's
// scratch (an atomicMin on position << 32 | value bits); the host reads the flags after the call
// (backend/cuda/generated_program.hpp synchronises once per call of a program with embeddings) and throws the
// host kernel's message.
//
// Pad: a thread per output element: the operand that owns its coordinate along the axis, or 0.
// Depends on: backend/cuda/codegen.hpp (rendered_cuda_kernel, the prelude), backend/cuda/{memory,module}.hpp, ir/graph.hpp.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>

#include "fusebox/backend/cuda/codegen.hpp"
#include "fusebox/backend/cuda/memory.hpp"
#include "fusebox/backend/cuda/module.hpp"
#include "fusebox/core/errors.hpp"
#include "fusebox/core/linkage.hpp"
#include "fusebox/ir/graph.hpp"

namespace fusebox::jit {

namespace detail {
inline unsigned blocks_for(unsigned long long items, unsigned threads) {
  const unsigned long long b = (items + threads - 1) / threads;
  return static_cast<unsigned>(std::clamp<unsigned long long>(b, 1, 1u << 20));  // grid-stride beyond
}
}  // namespace detail

// ---------------------------------------------------------------------------------------------
// spatial
// ---------------------------------------------------------------------------------------------

/// The parameter block of a spatial unit, as its source declares it (fbs_args). The geometry is
/// the forward convolution's: x [n, c, h, w], weight [o, c, kh, kw], y [n, o, oh, ow] (pooling:
/// o = c). a, b, out are the node's operands and result.
struct cuda_spatial_args {
  std::uint64_t a = 0, b = 0, out = 0, scratch = 0;
  long long as[4] = {}, bs[4] = {}, os[4] = {};
  int n = 0, c = 0, h = 0, w = 0, o = 0, kh = 0, kw = 0, oh = 0, ow = 0;
  int sh = 1, sw = 1, ph = 0, pw = 0;
  int splits = 1;
};

inline constexpr unsigned spatial_block_threads = 256;
inline constexpr int spatial_tile = 64;  // BM = BN

inline bool spatial_is_conv(spatial_op op) {
  return op == spatial_op::conv2d || op == spatial_op::conv2d_input_grad || op == spatial_op::conv2d_weight_grad;
}

/// The implicit GEMM's M, N, K of a convolution op for geometry g.
FUSEBOX_RUNTIME_API void spatial_gemm_sizes(spatial_op op, const cuda_spatial_args& g, long long& M, long long& N,
                                            long long& K);

/// How many ranges the weight gradient cuts K into: enough tiles for a few hundred blocks, each
/// range at least 1024 long, at most 128. A function of the shapes only (results do not depend on
/// the device), 1 for the other ops.
FUSEBOX_RUNTIME_API int spatial_splits(spatial_op op, const cuda_spatial_args& g);

/// The geometry of spatial node `win` with operand shapes a, b and result shape out.
FUSEBOX_RUNTIME_API cuda_spatial_args spatial_geometry(const window& win, const dims& a, const dims& b,
                                                       const dims& out);

/// Scratch bytes a spatial node needs on the device (the weight gradient's split partials).
FUSEBOX_RUNTIME_API std::size_t spatial_scratch_bytes(const window& win, const dims& a, const dims& b, const dims& out);

/// The unit of spatial node n (op and storage type baked in).
FUSEBOX_RUNTIME_API rendered_cuda_kernel render_cuda_spatial(const ir::node& n, dtype storage);

/// Queues spatial node `win` (unit `rk`, stages `first` and `second`): a, b (b = a for one
/// operand) into out; `scratch` holds spatial_scratch_bytes.
template <class T>
void launch_spatial(const rendered_cuda_kernel& rk, cuda::CUfunction first, cuda::CUfunction second, const window& win,
                    const strided<T>& a, const strided<T>& b, const strided<T>& out, cuda::CUdeviceptr scratch,
                    cuda::CUstream on) {
  if (out.shape.size() == 0) return;
  cuda_spatial_args g = spatial_geometry(win, a.shape, b.shape, out.shape);
  g.a = reinterpret_cast<std::uint64_t>(a.data);
  g.b = reinterpret_cast<std::uint64_t>(b.data);
  g.out = reinterpret_cast<std::uint64_t>(out.data);
  g.scratch = scratch;
  for (int d = 0; d < 4; ++d) g.as[d] = a.stride[d], g.bs[d] = b.stride[d], g.os[d] = out.stride[d];
  void* args[] = {&g};
  cuda::dim3 grid, block;
  block.x = spatial_block_threads;
  if (spatial_is_conv(win.op)) {
    long long M, N, K;
    spatial_gemm_sizes(win.op, g, M, N, K);
    if (K == 0) FUSEBOX_THROW(invalid_argument("fusebox: " + std::string(name(win.op)) + " with an empty reduction (" +
                                               to_string(a.shape) + ", " + to_string(b.shape) + ") on the CUDA backend"));
    grid.x = static_cast<unsigned>((N + spatial_tile - 1) / spatial_tile);
    grid.y = static_cast<unsigned>((M + spatial_tile - 1) / spatial_tile);
    grid.z = static_cast<unsigned>(g.splits);
    if (grid.y > 65535)
      FUSEBOX_THROW(invalid_argument("fusebox: " + std::string(name(win.op)) + " on the CUDA backend takes at most " +
                                     std::to_string(65535 * spatial_tile) + " channels"));
    cuda::launch(first, grid, block, 0, on, args, rk.summary);
    if (g.splits > 1) {
      cuda::dim3 sum_grid;
      sum_grid.x = detail::blocks_for(static_cast<unsigned long long>(M * N), spatial_block_threads);
      cuda::launch(second, sum_grid, block, 0, on, args, rk.summary + ", sum of splits");
    }
    return;
  }
  grid.x = detail::blocks_for(out.shape.size(), spatial_block_threads);
  cuda::launch(first, grid, block, 0, on, args, rk.summary);
}

// ---------------------------------------------------------------------------------------------
// gather (embedding, embedding_backward)
// ---------------------------------------------------------------------------------------------

/// The parameter block of a gather unit (fbg_args). a: the weight [V, D] (forward) or the
/// gradient [ids..., D] (backward); ids [ids...]; out [ids..., D] or [V, D].
struct cuda_gather_args {
  std::uint64_t a = 0, ids = 0, out = 0, counts = 0, flag = 0;
  long long ids_shape[max_rank] = {}, ids_stride[max_rank] = {};
  long long as[max_rank] = {}, os[max_rank] = {};
  long long n = 0, d = 0, v = 0;
};

inline constexpr unsigned gather_block_threads = 256;

/// The value of a gather kernel's flag word when every id was good.
inline constexpr std::uint64_t gather_flag_clear = ~std::uint64_t{0};

/// Scratch bytes a gather node needs on the device (the backward's row counts).
inline std::size_t gather_scratch_bytes(const ir::node& n, const dims& out) {
  return n.desc.variant == 0 ? 0 : out[0] * sizeof(int);
}

/// The unit of gather node n with ids of rank `ids_rank`.
FUSEBOX_RUNTIME_API rendered_cuda_kernel render_cuda_gather(const ir::node& n, std::size_t ids_rank, dtype storage);

/// Queues gather node n (unit rk, stages `first` and `second`): a and ids into out. `counts`
/// (gather_scratch_bytes) and `flag` (8 bytes, set to gather_flag_clear before the call) are
/// device memory of the call's scratch.
template <class T>
void launch_gather(const rendered_cuda_kernel& rk, cuda::CUfunction first, cuda::CUfunction second, const ir::node& n,
                   const strided<T>& a, const strided<T>& ids, const strided<T>& out, cuda::CUdeviceptr counts,
                   cuda::CUdeviceptr flag, cuda::CUstream on) {
  cuda_gather_args g;
  g.a = reinterpret_cast<std::uint64_t>(a.data);
  g.ids = reinterpret_cast<std::uint64_t>(ids.data);
  g.out = reinterpret_cast<std::uint64_t>(out.data);
  g.counts = counts;
  g.flag = flag;
  const std::size_t r = ids.shape.rank;
  for (std::size_t d = 0; d < r; ++d) g.ids_shape[d] = static_cast<long long>(ids.shape[d]), g.ids_stride[d] = ids.stride[d];
  for (std::size_t d = 0; d < a.shape.rank; ++d) g.as[d] = a.stride[d];
  for (std::size_t d = 0; d < out.shape.rank; ++d) g.os[d] = out.stride[d];
  const bool back = n.desc.variant != 0;
  g.n = static_cast<long long>(ids.shape.size());
  g.d = static_cast<long long>(back ? out.shape[1] : a.shape[1]);
  g.v = static_cast<long long>(back ? out.shape[0] : a.shape[0]);
  if (g.n >= (1ll << 31))
    FUSEBOX_THROW(invalid_argument("fusebox: " + std::string(n.desc.name) + " on the CUDA backend takes fewer than 2^31 ids; ids are " +
                                   to_string(ids.shape)));
  void* args[] = {&g};
  cuda::dim3 grid, block;
  block.x = gather_block_threads;
  if (!back) {
    if (g.n * g.d == 0) return;
    grid.x = detail::blocks_for(static_cast<unsigned long long>(g.n * g.d), gather_block_threads);
    cuda::launch(first, grid, block, 0, on, args, rk.summary);
    return;
  }
  if (g.v * g.d == 0) return;
  cuda::fill_bytes_async(counts, 0, static_cast<std::size_t>(g.v) * sizeof(int), on);
  if (g.n > 0) {
    grid.x = detail::blocks_for(static_cast<unsigned long long>(g.n), gather_block_threads);
    cuda::launch(second, grid, block, 0, on, args, rk.summary + ", counting");
  }
  grid.x = static_cast<unsigned>(std::min<long long>(g.v, 1 << 20));
  cuda::launch(first, grid, block, 0, on, args, rk.summary);
}

// ---------------------------------------------------------------------------------------------
// pad
// ---------------------------------------------------------------------------------------------

/// The parameter block of a pad unit (fbp_args): out [shape] and up to ir::max_inputs operands,
/// operand k covering [begin[k], end[k]) along the axis.
struct cuda_pad_args {
  std::uint64_t out = 0;
  std::uint64_t in[ir::max_inputs] = {};
  long long shape[max_rank] = {}, os[max_rank] = {};
  long long is[ir::max_inputs][max_rank] = {};
  long long begin[ir::max_inputs] = {}, end[ir::max_inputs] = {};
  long long total = 0;
};

/// The unit of pad node n (rank, axis and operand count baked in).
FUSEBOX_RUNTIME_API rendered_cuda_kernel render_cuda_pad(const ir::node& n, dtype storage);

/// Queues pad node n (unit rk, entry fn): operands `in` (n.n_inputs of them) into out.
template <class T>
void launch_pad(const rendered_cuda_kernel& rk, cuda::CUfunction fn, const ir::node& n, const strided<T>* in,
                const strided<T>& out, cuda::CUstream on) {
  cuda_pad_args g;
  g.out = reinterpret_cast<std::uint64_t>(out.data);
  const std::size_t r = out.shape.rank, axis = static_cast<std::size_t>(n.desc.axis);
  for (std::size_t d = 0; d < r; ++d) g.shape[d] = static_cast<long long>(out.shape[d]), g.os[d] = out.stride[d];
  long long at = static_cast<long long>(n.desc.view_start);
  for (int k = 0; k < n.n_inputs; ++k) {
    g.in[k] = reinterpret_cast<std::uint64_t>(in[k].data);
    for (std::size_t d = 0; d < r; ++d) g.is[k][d] = in[k].stride[d];
    g.begin[k] = at;
    at += static_cast<long long>(in[k].shape[axis]);
    g.end[k] = at;
  }
  g.total = static_cast<long long>(out.shape.size());
  if (g.total == 0) return;
  void* args[] = {&g};
  cuda::dim3 grid, block;
  block.x = 256;
  grid.x = detail::blocks_for(static_cast<unsigned long long>(g.total), 256);
  cuda::launch(fn, grid, block, 0, on, args, rk.summary);
}

// Definitions: compiled here, or once in the FUSEBOX_IMPLEMENTATION unit (core/linkage.hpp).
#if FUSEBOX_RUNTIME_BODIES
FUSEBOX_RUNTIME_API void spatial_gemm_sizes(spatial_op op, const cuda_spatial_args& g, long long& M, long long& N,
                                            long long& K) {
  const long long kk = static_cast<long long>(g.kh) * g.kw;
  switch (op) {
    case spatial_op::conv2d: M = g.o, N = static_cast<long long>(g.n) * g.oh * g.ow, K = g.c * kk; break;
    case spatial_op::conv2d_input_grad: M = g.c, N = static_cast<long long>(g.n) * g.h * g.w, K = g.o * kk; break;
    default: M = g.o, N = g.c * kk, K = static_cast<long long>(g.n) * g.oh * g.ow;
  }
}

FUSEBOX_RUNTIME_API int spatial_splits(spatial_op op, const cuda_spatial_args& g) {
  if (op != spatial_op::conv2d_weight_grad) return 1;
  long long M, N, K;
  spatial_gemm_sizes(op, g, M, N, K);
  const long long tiles = ((M + spatial_tile - 1) / spatial_tile) * ((N + spatial_tile - 1) / spatial_tile);
  const long long want = (512 + tiles - 1) / tiles, most = std::max<long long>(1, K / 1024);
  return static_cast<int>(std::clamp<long long>(std::min(want, most), 1, 128));
}

FUSEBOX_RUNTIME_API cuda_spatial_args spatial_geometry(const window& win, const dims& a, const dims& b,
                                                       const dims& out) {
  cuda_spatial_args g;
  auto i = [](std::size_t e) { return static_cast<int>(e); };
  const dims* x = &a;  // the forward input's shape, and the forward output's
  const dims* y = &out;
  switch (win.op) {
    case spatial_op::conv2d: g.o = i(b[0]), g.kh = i(b[2]), g.kw = i(b[3]); break;
    case spatial_op::conv2d_input_grad: x = &out, y = &a, g.o = i(b[0]), g.kh = i(b[2]), g.kw = i(b[3]); break;
    case spatial_op::conv2d_weight_grad: x = &b, y = &a, g.o = i(out[0]), g.kh = i(out[2]), g.kw = i(out[3]); break;
    case spatial_op::max_pool2d:
    case spatial_op::avg_pool2d: g.o = i(a[1]), g.kh = win.kh, g.kw = win.kw; break;
    default: x = &out, y = &a, g.o = i(a[1]), g.kh = win.kh, g.kw = win.kw;  // pooling backward
  }
  g.n = i((*x)[0]), g.c = i((*x)[1]), g.h = i((*x)[2]), g.w = i((*x)[3]);
  g.oh = i((*y)[2]), g.ow = i((*y)[3]);
  g.sh = win.sh, g.sw = win.sw, g.ph = win.ph, g.pw = win.pw;
  g.splits = spatial_splits(win.op, g);
  return g;
}

FUSEBOX_RUNTIME_API std::size_t spatial_scratch_bytes(const window& win, const dims& a, const dims& b,
                                                      const dims& out) {
  if (win.op != spatial_op::conv2d_weight_grad) return 0;
  const cuda_spatial_args g = spatial_geometry(win, a, b, out);
  if (g.splits == 1) return 0;
  long long M, N, K;
  spatial_gemm_sizes(win.op, g, M, N, K);
  return static_cast<std::size_t>(g.splits) * static_cast<std::size_t>(M * N) * sizeof(float);
}

FUSEBOX_RUNTIME_API rendered_cuda_kernel render_cuda_spatial(const ir::node& n, dtype storage) {
  const spatial_op op = n.desc.win.op;
  if (op == spatial_op::none) FUSEBOX_THROW(invalid_argument("fusebox internal: a spatial node without an op"));
  rendered_cuda_kernel r;
  r.kind = plan::kernel_kind::spatial;
  r.block_threads = spatial_block_threads;
  r.summary = std::string(name(op)) + " -> " + to_string(n.desc.shape) +
              (spatial_is_conv(op) ? " (implicit GEMM, 64x64 tiles)" : " (direct)");
  std::string s = "constexpr int FBS_OP = " + std::to_string(static_cast<int>(op)) + ";\ntypedef " +
                  cuda_storage_name(storage) + " fbs_t;\n";
  s += R"(// ops (expr/window.hpp's spatial_op)
constexpr int FBS_CONV = 1, FBS_INPUT_GRAD = 2, FBS_WEIGHT_GRAD = 3, FBS_MAX = 4, FBS_MAX_BACK = 5, FBS_AVG = 6,
              FBS_AVG_BACK = 7;
struct fbs_args {
  const fbs_t* a; const fbs_t* b; fbs_t* out; float* scratch;
  long long as[4], bs[4], os[4];
  int n, c, h, w, o, kh, kw, oh, ow;
  int sh, sw, ph, pw;
  int splits;
};
__device__ __forceinline__ float fbs_neg_inf() { return __int_as_float(0xff800000); }
__device__ __forceinline__ float fbs_ld(const fbs_t* p, long long at) { return fb_to_float(p[at]); }

// ---- convolutions: C[M, N] = A[M, K] . B[K, N], gathered from the operands ----
__device__ __forceinline__ void fbs_sizes(const fbs_args& a, long long& M, long long& N, long long& K) {
  const long long kk = (long long)a.kh * a.kw;
  if (FBS_OP == FBS_CONV) { M = a.o; N = (long long)a.n * a.oh * a.ow; K = a.c * kk; }
  else if (FBS_OP == FBS_INPUT_GRAD) { M = a.c; N = (long long)a.n * a.h * a.w; K = a.o * kk; }
  else { M = a.o; N = a.c * kk; K = (long long)a.n * a.oh * a.ow; }
}
__device__ __forceinline__ float fbs_A(const fbs_args& a, long long m, long long k) {
  if (FBS_OP == FBS_CONV) {  // w [o = m, (c, u, v) = k]
    const int v = (int)(k % a.kw), u = (int)(k / a.kw % a.kh), c = (int)(k / ((long long)a.kw * a.kh));
    return fbs_ld(a.b, m * a.bs[0] + c * a.bs[1] + u * a.bs[2] + v * a.bs[3]);
  } else if (FBS_OP == FBS_INPUT_GRAD) {  // w [(o, u, v) = k, c = m]
    const int v = (int)(k % a.kw), u = (int)(k / a.kw % a.kh), o = (int)(k / ((long long)a.kw * a.kh));
    return fbs_ld(a.b, o * a.bs[0] + m * a.bs[1] + u * a.bs[2] + v * a.bs[3]);
  } else {  // g [(img, y, x) = k, o = m]
    const int x = (int)(k % a.ow), y = (int)(k / a.ow % a.oh);
    const long long img = k / ((long long)a.ow * a.oh);
    return fbs_ld(a.a, img * a.as[0] + m * a.as[1] + y * a.as[2] + x * a.as[3]);
  }
}
__device__ __forceinline__ float fbs_B(const fbs_args& a, long long k, long long n) {
  if (FBS_OP == FBS_CONV) {  // x at (img, c, y*sh - ph + u, x*sw - pw + v), k = (c, u, v), n = (img, y, x)
    const int v = (int)(k % a.kw), u = (int)(k / a.kw % a.kh), c = (int)(k / ((long long)a.kw * a.kh));
    const int x = (int)(n % a.ow), y = (int)(n / a.ow % a.oh);
    const long long img = n / ((long long)a.ow * a.oh);
    const int ih = y * a.sh - a.ph + u, iw = x * a.sw - a.pw + v;
    if (ih < 0 || ih >= a.h || iw < 0 || iw >= a.w) return 0.0f;
    return fbs_ld(a.a, img * a.as[0] + c * a.as[1] + ih * a.as[2] + iw * a.as[3]);
  } else if (FBS_OP == FBS_INPUT_GRAD) {  // g at the output whose window puts (u, v) on pixel n
    const int v = (int)(k % a.kw), u = (int)(k / a.kw % a.kh), o = (int)(k / ((long long)a.kw * a.kh));
    const int iw = (int)(n % a.w), ih = (int)(n / a.w % a.h);
    const long long img = n / ((long long)a.w * a.h);
    const int ty = ih + a.ph - u, tx = iw + a.pw - v;
    if (ty < 0 || tx < 0 || ty % a.sh != 0 || tx % a.sw != 0) return 0.0f;
    const int y = ty / a.sh, x = tx / a.sw;
    if (y >= a.oh || x >= a.ow) return 0.0f;
    return fbs_ld(a.a, img * a.as[0] + o * a.as[1] + y * a.as[2] + x * a.as[3]);
  } else {  // x at (img, c, y*sh - ph + u, x*sw - pw + v), k = (img, y, x), n = (c, u, v)
    const int x = (int)(k % a.ow), y = (int)(k / a.ow % a.oh);
    const long long img = k / ((long long)a.ow * a.oh);
    const int v = (int)(n % a.kw), u = (int)(n / a.kw % a.kh), c = (int)(n / ((long long)a.kw * a.kh));
    const int ih = y * a.sh - a.ph + u, iw = x * a.sw - a.pw + v;
    if (ih < 0 || ih >= a.h || iw < 0 || iw >= a.w) return 0.0f;
    return fbs_ld(a.b, img * a.bs[0] + c * a.bs[1] + ih * a.bs[2] + iw * a.bs[3]);
  }
}
__device__ __forceinline__ long long fbs_C(const fbs_args& a, long long m, long long n) {
  if (FBS_OP == FBS_CONV) {
    const int x = (int)(n % a.ow), y = (int)(n / a.ow % a.oh);
    const long long img = n / ((long long)a.ow * a.oh);
    return img * a.os[0] + m * a.os[1] + y * a.os[2] + x * a.os[3];
  } else if (FBS_OP == FBS_INPUT_GRAD) {
    const int iw = (int)(n % a.w), ih = (int)(n / a.w % a.h);
    const long long img = n / ((long long)a.w * a.h);
    return img * a.os[0] + m * a.os[1] + ih * a.os[2] + iw * a.os[3];
  } else {
    const int v = (int)(n % a.kw), u = (int)(n / a.kw % a.kh), c = (int)(n / ((long long)a.kw * a.kh));
    return m * a.os[0] + c * a.os[1] + u * a.os[2] + v * a.os[3];
  }
}

constexpr int FBS_BM = 64, FBS_BN = 64, FBS_BK = 16;
// Tile (blockIdx.y, blockIdx.x) of C over K range blockIdx.z (of a.splits): each thread's 4x4
// outputs, rows ty + 16 i and columns tx + 16 j, one fma chain each in increasing k.
__device__ __forceinline__ void fbs_gemm(const fbs_args& a) {
  __shared__ float As[FBS_BK][FBS_BM + 1];  // [k][m]: + 1 keeps the k-fastest stores conflict-free
  __shared__ float Bs[FBS_BK][FBS_BN];
  long long M, N, K;
  fbs_sizes(a, M, N, K);
  const int tid = threadIdx.x, tx = tid % 16, ty = tid / 16;
  const long long m0 = (long long)blockIdx.y * FBS_BM, n0 = (long long)blockIdx.x * FBS_BN;
  const long long per = ((K + a.splits - 1) / a.splits + FBS_BK - 1) / FBS_BK * FBS_BK;
  const long long k_begin = blockIdx.z * per, k_end = min(K, k_begin + per);
  float acc[4][4];
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) acc[i][j] = 0.0f;
  for (long long k0 = k_begin; k0 < k_end; k0 += FBS_BK) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int at = tid + 256 * i;
      const int am = at / FBS_BK, ak = at % FBS_BK;  // A: k fastest (contiguous in w and g)
      const long long m = m0 + am, k = k0 + ak;
      As[ak][am] = m < M && k < k_end ? fbs_A(a, m, k) : 0.0f;
      const int bn = at % FBS_BN, bk = at / FBS_BN;  // B: n fastest (pixels)
      const long long n = n0 + bn, kb = k0 + bk;
      Bs[bk][bn] = n < N && kb < k_end ? fbs_B(a, kb, n) : 0.0f;
    }
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < FBS_BK; ++kk) {
      float ar[4], br[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) ar[i] = As[kk][ty + 16 * i];
#pragma unroll
      for (int j = 0; j < 4; ++j) br[j] = Bs[kk][tx + 16 * j];
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[i][j] = fmaf(ar[i], br[j], acc[i][j]);
    }
    __syncthreads();
  }
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const long long m = m0 + ty + 16 * i, n = n0 + tx + 16 * j;
      if (m >= M || n >= N) continue;
      if (a.splits == 1) a.out[fbs_C(a, m, n)] = fb_from_float<fbs_t>(acc[i][j]);
      else a.scratch[(blockIdx.z * M + m) * N + n] = acc[i][j];
    }
}
// The splits' partials summed in increasing order, a thread per output.
__device__ __forceinline__ void fbs_sum_splits(const fbs_args& a) {
  long long M, N, K;
  fbs_sizes(a, M, N, K);
  for (long long t = blockIdx.x * (long long)blockDim.x + threadIdx.x; t < M * N; t += (long long)gridDim.x * blockDim.x) {
    float s = a.scratch[t];
    for (int z = 1; z < a.splits; ++z) s += a.scratch[z * M * N + t];
    a.out[fbs_C(a, t / N, t % N)] = fb_from_float<fbs_t>(s);
  }
}

// ---- pooling ----
// The in-bounds part [lo, hi) of the window of output index o along one axis.
__device__ __forceinline__ void fbs_span(int o, int k, int s, int p, int in, int& lo, int& hi) {
  lo = o * s - p;
  hi = min(lo + k, in);
  lo = max(lo, 0);
}
// The first maximum (NaN wins) of output (y, x)'s window in plane `x0`, as row and column.
__device__ __forceinline__ float fbs_window_max(const fbs_args& a, const fbs_t* x0, const long long* xs, int y, int x,
                                                int& at_r, int& at_c) {
  int r0, r1, c0, c1;
  fbs_span(y, a.kh, a.sh, a.ph, a.h, r0, r1);
  fbs_span(x, a.kw, a.sw, a.pw, a.w, c0, c1);
  float m = fbs_neg_inf();
  at_r = r0, at_c = c0;
  for (int r = r0; r < r1; ++r)
    for (int c = c0; c < c1; ++c) {
      const float v = fbs_ld(x0, r * xs[2] + c * xs[3]);
      if (v > m || v != v) { m = v; at_r = r; at_c = c; }
    }
  return m;
}
__device__ __forceinline__ void fbs_pool(const fbs_args& a) {
  const bool fwd = FBS_OP == FBS_MAX || FBS_OP == FBS_AVG;
  const long long total = (long long)a.n * a.c * (fwd ? (long long)a.oh * a.ow : (long long)a.h * a.w);
  const float inv_area = 1.0f / (float)(a.kh * a.kw);
  for (long long t = blockIdx.x * (long long)blockDim.x + threadIdx.x; t < total; t += (long long)gridDim.x * blockDim.x) {
    if (fwd) {  // a = x [n, c, h, w], out [n, c, oh, ow]
      const int x = (int)(t % a.ow), y = (int)(t / a.ow % a.oh), ch = (int)(t / ((long long)a.ow * a.oh) % a.c);
      const long long img = t / ((long long)a.ow * a.oh * a.c);
      const fbs_t* x0 = a.a + img * a.as[0] + ch * a.as[1];
      float r;
      if (FBS_OP == FBS_MAX) {
        int ar, ac;
        r = fbs_window_max(a, x0, a.as, y, x, ar, ac);
      } else {
        int r0, r1, c0, c1;
        fbs_span(y, a.kh, a.sh, a.ph, a.h, r0, r1);
        fbs_span(x, a.kw, a.sw, a.pw, a.w, c0, c1);
        float s = 0.0f;
        for (int rr = r0; rr < r1; ++rr)
          for (int cc = c0; cc < c1; ++cc) s += fbs_ld(x0, rr * a.as[2] + cc * a.as[3]);
        r = s * inv_area;
      }
      a.out[img * a.os[0] + ch * a.os[1] + y * a.os[2] + x * a.os[3]] = fb_from_float<fbs_t>(r);
    } else {  // a = g [n, c, oh, ow], b = x [n, c, h, w] (max), out = dx [n, c, h, w]
      const int iw = (int)(t % a.w), ih = (int)(t / a.w % a.h), ch = (int)(t / ((long long)a.w * a.h) % a.c);
      const long long img = t / ((long long)a.w * a.h * a.c);
      // Outputs whose window covers row ih: y * sh - ph <= ih < y * sh - ph + kh.
      // The first is the least y with y * sh > ih + ph - kh; the test below keeps the exact rule.
      const int ty = ih + a.ph - a.kh, tx = iw + a.pw - a.kw;
      const int ylo = ty < 0 ? 0 : ty / a.sh + 1, yhi = min(a.oh - 1, (ih + a.ph) / a.sh);
      const int xlo = tx < 0 ? 0 : tx / a.sw + 1, xhi = min(a.ow - 1, (iw + a.pw) / a.sw);
      const fbs_t* g0 = a.a + img * a.as[0] + ch * a.as[1];
      const fbs_t* x0 = FBS_OP == FBS_MAX_BACK ? a.b + img * a.bs[0] + ch * a.bs[1] : nullptr;
      float s = 0.0f;
      for (int y = ylo; y <= yhi; ++y)
        for (int x = xlo; x <= xhi; ++x) {
          const int r0 = y * a.sh - a.ph, c0 = x * a.sw - a.pw;
          if (ih < r0 || ih >= r0 + a.kh || iw < c0 || iw >= c0 + a.kw) continue;
          const float gv = fbs_ld(g0, y * a.as[2] + x * a.as[3]);
          if (FBS_OP == FBS_MAX_BACK) {
            int ar, ac;
            fbs_window_max(a, x0, a.bs, y, x, ar, ac);
            if (ar == ih && ac == iw) s += gv;
          } else {
            s += gv * inv_area;
          }
        }
      a.out[img * a.os[0] + ch * a.os[1] + ih * a.os[2] + iw * a.os[3]] = fb_from_float<fbs_t>(s);
    }
  }
}

__device__ __forceinline__ void fbs_first(const fbs_args& a) {
  if (FBS_OP == FBS_CONV || FBS_OP == FBS_INPUT_GRAD || FBS_OP == FBS_WEIGHT_GRAD) fbs_gemm(a);
  else fbs_pool(a);
}
extern "C" __global__ void __launch_bounds__(256) fusebox_kernel(fbs_args a) { fbs_first(a); }
extern "C" __global__ void __launch_bounds__(256) fusebox_kernel_w(fbs_args a) {
  if (FBS_OP == FBS_WEIGHT_GRAD) fbs_sum_splits(a);
  else fbs_first(a);
}
extern "C" __global__ void __launch_bounds__(256) fusebox_kernel_v1(fbs_args a) { fbs_first(a); }
)";
  r.source = std::move(s);
  return r;
}

FUSEBOX_RUNTIME_API rendered_cuda_kernel render_cuda_gather(const ir::node& n, std::size_t ids_rank, dtype storage) {
  rendered_cuda_kernel r;
  r.kind = plan::kernel_kind::gather;
  r.block_threads = gather_block_threads;
  const bool back = n.desc.variant != 0;
  r.summary = std::string(back ? "embedding_backward" : "embedding") + " -> " + to_string(n.desc.shape) +
              (back ? " (ids counted, a block per row walking them in order)" : "");
  std::string s = "constexpr int FBG_RANK = " + std::to_string(ids_rank) + ";\nconstexpr bool FBG_BACKWARD = " +
                  (back ? "true" : "false") + ";\ntypedef " + cuda_storage_name(storage) + " fbg_t;\n";
  s += "struct fbg_args {\n  const fbg_t* a; const fbg_t* ids; fbg_t* out; int* counts; unsigned long long* flag;\n"
       "  long long ids_shape[" + std::to_string(max_rank) + "], ids_stride[" + std::to_string(max_rank) +
       "];\n  long long as[" + std::to_string(max_rank) + "], os[" + std::to_string(max_rank) +
       "];\n  long long n, d, v;\n};\n";
  s += R"(// Offset of id number i (row-major over the ids' shape) in a tensor with strides st.
__device__ __forceinline__ long long fbg_offset(const fbg_args& a, long long i, const long long* st) {
  long long o = 0;
#pragma unroll
  for (int d = FBG_RANK - 1; d >= 0; --d) {
    o += i % a.ids_shape[d] * st[d];
    i /= a.ids_shape[d];
  }
  return o;
}
// Id number i as a row, or -1 (recorded in the flag) when it is not an integer in [0, V).
__device__ __forceinline__ long long fbg_id(const fbg_args& a, long long i, bool record) {
  const float v = fb_to_float(a.ids[fbg_offset(a, i, a.ids_stride)]);
  if (v >= 0.0f && v < (float)a.v && v == floorf(v)) return (long long)v;
  if (record) atomicMin(a.flag, ((unsigned long long)i << 32) | __float_as_uint(v));
  return -1;
}

// embedding: a thread per output element.
__device__ __forceinline__ void fbg_forward(const fbg_args& a) {
  for (long long t = blockIdx.x * (long long)blockDim.x + threadIdx.x; t < a.n * a.d; t += (long long)gridDim.x * blockDim.x) {
    const long long i = t / a.d, e = t % a.d;
    const long long row = fbg_id(a, i, e == 0);
    const float v = row >= 0 ? fb_to_float(a.a[row * a.as[0] + e * a.as[1]]) : 0.0f;
    a.out[fbg_offset(a, i, a.os) + e * a.os[FBG_RANK]] = fb_from_float<fbg_t>(v);
  }
}
// embedding_backward, stage 1: how many ids name each row (counts zeroed by the host).
__device__ __forceinline__ void fbg_count(const fbg_args& a) {
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < a.n; i += (long long)gridDim.x * blockDim.x) {
    const long long row = fbg_id(a, i, true);
    if (row >= 0) atomicAdd(a.counts + row, 1);
  }
}
// embedding_backward, stage 2: a block per vocabulary row (grid-stride), 1024 columns at a time;
// the ids in order, 256 a step: the matches' positions in order via ballots, then their rows of g
// added in that order. Stops once the row's count is found.
__device__ __forceinline__ void fbg_rows(const fbg_args& a) {
  __shared__ long long at[256];
  __shared__ int warp_matches[8];
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  for (long long row = blockIdx.x; row < a.v; row += gridDim.x) {
    const int count = a.counts[row];
    fbg_t* o = a.out + row * a.os[0];
    for (long long e0 = 0; e0 < a.d; e0 += 1024) {
      float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
      int found = 0;
      for (long long c0 = 0; c0 < a.n && found < count; c0 += 256) {
        const long long i = c0 + tid;
        bool match = false;
        if (i < a.n) {
          const float v = fb_to_float(a.ids[fbg_offset(a, i, a.ids_stride)]);
          match = v == (float)row;
        }
        const unsigned ballot = __ballot_sync(0xffffffffu, match);
        if (lane == 0) warp_matches[warp] = __popc(ballot);
        __syncthreads();
        int before = 0, total = 0;
        for (int w = 0; w < 8; ++w) {
          before += w < warp ? warp_matches[w] : 0;
          total += warp_matches[w];
        }
        if (match) at[before + __popc(ballot & ((1u << lane) - 1u))] = fbg_offset(a, i, a.as);
        __syncthreads();
        for (int q = 0; q < total; ++q) {
          const fbg_t* g = a.a + at[q];
#pragma unroll
          for (int j = 0; j < 4; ++j) {
            const long long e = e0 + tid + 256 * j;
            if (e < a.d) acc[j] += fb_to_float(g[e * a.as[FBG_RANK]]);
          }
        }
        found += total;
        __syncthreads();  // `at` and `warp_matches` are rewritten by the next step
      }
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const long long e = e0 + tid + 256 * j;
        if (e < a.d) o[e * a.os[1]] = fb_from_float<fbg_t>(acc[j]);
      }
    }
  }
}
extern "C" __global__ void __launch_bounds__(256) fusebox_kernel(fbg_args a) {
  if (FBG_BACKWARD) fbg_rows(a);
  else fbg_forward(a);
}
extern "C" __global__ void __launch_bounds__(256) fusebox_kernel_w(fbg_args a) {
  if (FBG_BACKWARD) fbg_count(a);
  else fbg_forward(a);
}
extern "C" __global__ void __launch_bounds__(256) fusebox_kernel_v1(fbg_args a) { fbg_forward(a); }
)";
  r.source = std::move(s);
  return r;
}

FUSEBOX_RUNTIME_API rendered_cuda_kernel render_cuda_pad(const ir::node& n, dtype storage) {
  rendered_cuda_kernel r;
  r.kind = plan::kernel_kind::pad;
  r.block_threads = 256;
  r.summary = "pad -> " + to_string(n.desc.shape) + " along axis " + std::to_string(n.desc.axis);
  const std::string mr = std::to_string(max_rank), mi = std::to_string(ir::max_inputs);
  std::string s = "constexpr int FBP_RANK = " + std::to_string(n.desc.shape.rank) + ", FBP_AXIS = " +
                  std::to_string(n.desc.axis) + ", FBP_N = " + std::to_string(n.n_inputs) + ";\ntypedef " +
                  cuda_storage_name(storage) + " fbp_t;\n";
  s += "struct fbp_args {\n  fbp_t* out; const fbp_t* in[" + mi + "];\n  long long shape[" + mr + "], os[" + mr +
       "];\n  long long is[" + mi + "][" + mr + "];\n  long long begin[" + mi + "], end[" + mi + "];\n  long long total;\n};\n";
  s += R"(__device__ __forceinline__ void fbp_body(const fbp_args& a) {
  for (long long t = blockIdx.x * (long long)blockDim.x + threadIdx.x; t < a.total; t += (long long)gridDim.x * blockDim.x) {
    long long idx[FBP_RANK];
    long long rest = t, o = 0;
#pragma unroll
    for (int d = FBP_RANK - 1; d >= 0; --d) {
      idx[d] = rest % a.shape[d];
      rest /= a.shape[d];
      o += idx[d] * a.os[d];
    }
    float v = 0.0f;
#pragma unroll
    for (int k = 0; k < FBP_N; ++k)
      if (idx[FBP_AXIS] >= a.begin[k] && idx[FBP_AXIS] < a.end[k]) {
        long long src = 0;
#pragma unroll
        for (int d = 0; d < FBP_RANK; ++d) src += (d == FBP_AXIS ? idx[d] - a.begin[k] : idx[d]) * a.is[k][d];
        v = fb_to_float(a.in[k][src]);
      }
    a.out[o] = fb_from_float<fbp_t>(v);
  }
}
extern "C" __global__ void __launch_bounds__(256) fusebox_kernel(fbp_args a) { fbp_body(a); }
extern "C" __global__ void __launch_bounds__(256) fusebox_kernel_w(fbp_args a) { fbp_body(a); }
extern "C" __global__ void __launch_bounds__(256) fusebox_kernel_v1(fbp_args a) { fbp_body(a); }
)";
  r.source = std::move(s);
  return r;
}
#endif

}  // namespace fusebox::jit
