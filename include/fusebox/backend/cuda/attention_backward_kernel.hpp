// backend/cuda/attention_backward_kernel.hpp: attention's gradient kernels (expr/grad_nodes.hpp,
// node_kind::attention with desc.variant 1, 2, 3) on the CUDA backend: one NVRTC unit per head
// dims, causality and storage type, with the semantics of backend/cpu/attention.hpp's
// attention_backward (FlashAttention-2's backward, the softmax recomputed, nothing T x T stored).
//
// Three kernels, the unit's three entries, each a warp per row with lanes across the head dims
// (values stored as the storage type, computed in float; no atomics, so results do not depend on
// the grid):
//   fusebox_kernel     stats: per query row (b, h, i) L_i, the log-sum-exp of the scaled scores
//                      (an online softmax over its keys), and D_i = g_i . o_i, as two floats in
//                      the call's workspace (the row's index (b * H + h) * Tq + i).
//   fusebox_kernel_w   dq: per query row, over the keys it sees: p = exp(scale q_i.k_j - L_i),
//                      ds = p (g_i.v_j - D_i), dq_i = scale sum_j ds k_j.
//   fusebox_kernel_v1  dk | dv: per key row, over the queries that see it: dk_j = scale sum_i ds q_i,
//                      dv_j = sum_i p g_i.
// Part 1 runs stats then dq; part 2 stats then dk | dv; part 3 all three. The part changes only
// where the gradients go (a base address and four strides each for dq, dk and dv): part 1's out is
// dq [B, Tq, H, E]; part 2's dk | dv [B, Tk, H, E + Ev] (dv from column E); part 3's
// [B, T, 3, H, E] (dq, dk, dv at index 0, 1, 2 of dimension 2).
// Correctness first: no shared-memory tiles or tensor cores; each pair's two dots are warp
// reductions (two per pair per kernel).
// Depends on: backend/cuda/codegen.hpp (rendered_cuda_kernel, the prelude's storage types), backend/cuda/module.hpp.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>

#include "fusebox/backend/cuda/codegen.hpp"
#include "fusebox/backend/cuda/module.hpp"
#include "fusebox/core/errors.hpp"
#include "fusebox/core/linkage.hpp"
#include "fusebox/ir/graph.hpp"

namespace fusebox::jit {

/// The gradient kernels' parameter block, as the source declares it (fbg_args).
struct cuda_attention_backward_args {
  std::uint64_t q = 0, k = 0, v = 0, o = 0, g = 0, dq = 0, dk = 0, dv = 0, stats = 0;
  // element strides of batch, token, head, dim
  long long qs[4] = {}, ks[4] = {}, vs[4] = {}, os[4] = {}, gs[4] = {}, dqs[4] = {}, dks[4] = {}, dvs[4] = {};
  int batch = 0, tq = 0, tk = 0, heads = 0;
  float scale = 0;  // 1 / sqrt(head dim)
  int pad_ = 0;
};

inline constexpr unsigned attention_backward_block_threads = 128;  // 4 warps, a row each

/// Bytes of workspace the gradient kernel of q [B, Tq, H, E] needs: L and D per query row (float).
inline std::size_t attention_backward_scratch_bytes(const dims& q) {
  return 2 * sizeof(float) * q[0] * q[1] * q[2];
}

/// The unit of gradient node n (variant 1, 2 or 3) whose q and v are the given nodes.
FUSEBOX_RUNTIME_API rendered_cuda_kernel render_cuda_attention_backward(const ir::node& n, const ir::node& q,
                                                                        const ir::node& v, dtype storage);

/// The parameter block of gradient node `part` (1, 2, 3) of o = attention(q, k, v) at the gradient g
/// into `out` (its layout per part in the header comment); `stats`: the L and D scratch.
template <class T>
cuda_attention_backward_args attention_backward_args(int part, const strided<T>& q, const strided<T>& k,
                                                     const strided<T>& v, const strided<T>& o, const strided<T>& g,
                                                     const strided<T>& out, std::uint64_t stats) {
  cuda_attention_backward_args a;
  auto address = [](const T* x) { return reinterpret_cast<std::uint64_t>(x); };
  a.q = address(q.data);
  a.k = address(k.data);
  a.v = address(v.data);
  a.o = address(o.data);
  a.g = address(g.data);
  a.stats = stats;
  for (int d = 0; d < 4; ++d) {
    a.qs[d] = q.stride[d];
    a.ks[d] = k.stride[d];
    a.vs[d] = v.stride[d];
    a.os[d] = o.stride[d];
    a.gs[d] = g.stride[d];
  }
  const std::size_t E = q.shape[3];
  if (part == 3) {  // out [B, T, 3, H, E]: dq, dk, dv at index 0, 1, 2 of dimension 2
    const long long s4[4] = {out.stride[0], out.stride[1], out.stride[3], out.stride[4]};
    a.dq = address(out.data);
    a.dk = address(out.data + out.stride[2]);
    a.dv = address(out.data + 2 * out.stride[2]);
    for (int d = 0; d < 4; ++d) a.dqs[d] = a.dks[d] = a.dvs[d] = s4[d];
  } else if (part == 1) {  // out: dq [B, Tq, H, E]
    a.dq = address(out.data);
    for (int d = 0; d < 4; ++d) a.dqs[d] = out.stride[d];
  } else {  // out: dk | dv [B, Tk, H, E + Ev]
    a.dk = address(out.data);
    a.dv = address(out.data + static_cast<std::ptrdiff_t>(E) * out.stride[3]);
    for (int d = 0; d < 4; ++d) a.dks[d] = a.dvs[d] = out.stride[d];
  }
  a.batch = static_cast<int>(q.shape[0]);
  a.tq = static_cast<int>(q.shape[1]);
  a.heads = static_cast<int>(q.shape[2]);
  a.tk = static_cast<int>(k.shape[1]);
  a.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(E)));
  return a;
}

/// Queues gradient node `part` (attention_backward_args) on `on`: the stats kernel, then dq (parts
/// 1, 3) and dk | dv (parts 2, 3), entries `stats`, `dq` and `dkv` of unit `rk`. `scratch`: device
/// memory of attention_backward_scratch_bytes(q.shape) bytes.
template <class T>
void launch_attention_backward(const rendered_cuda_kernel& rk, cuda::CUfunction stats, cuda::CUfunction dq,
                               cuda::CUfunction dkv, int part, const strided<T>& q, const strided<T>& k,
                               const strided<T>& v, const strided<T>& o, const strided<T>& g, const strided<T>& out,
                               cuda::CUdeviceptr scratch, cuda::CUstream on) {
  cuda_attention_backward_args a =
      attention_backward_args(part, q, k, v, o, g, out, static_cast<std::uint64_t>(scratch));
  if (a.batch == 0 || a.heads == 0) return;
  void* args[] = {&a};
  cuda::dim3 block;
  block.x = attention_backward_block_threads;
  auto grid_of = [&](std::size_t rows) {
    cuda::dim3 grid;
    grid.x = static_cast<unsigned>((rows + 3) / 4);
    return grid;
  };
  const std::size_t bh = q.shape[0] * q.shape[2];
  if (a.tq > 0) cuda::launch(stats, grid_of(bh * q.shape[1]), block, 0, on, args, rk.summary + ": L and D");
  if (part != 2 && a.tq > 0) cuda::launch(dq, grid_of(bh * q.shape[1]), block, 0, on, args, rk.summary + ": dq");
  if (part != 1 && a.tk > 0) cuda::launch(dkv, grid_of(bh * k.shape[1]), block, 0, on, args, rk.summary + ": dk, dv");
}

// Definitions: compiled here, or once in the FUSEBOX_IMPLEMENTATION unit (core/linkage.hpp).
#if FUSEBOX_RUNTIME_BODIES
FUSEBOX_RUNTIME_API rendered_cuda_kernel render_cuda_attention_backward(const ir::node& n, const ir::node& q,
                                                                        const ir::node& v, dtype storage) {
  const std::size_t e = q.desc.shape.back(0), ev = v.desc.shape.back(0);
  if (n.desc.variant < 1 || n.desc.variant > 3)
    FUSEBOX_THROW(invalid_argument("fusebox internal: render_cuda_attention_backward: variant " +
                                   std::to_string(n.desc.variant) + " is not a gradient part (1, 2 or 3)"));
  if (!is_known_extent(e) || !is_known_extent(ev))
    FUSEBOX_THROW(invalid_argument(std::string("fusebox: ") + n.desc.name +
                                   " on the CUDA backend needs head dims known when compiling; q is " +
                                   to_string(q.desc.shape) + ", v is " + to_string(v.desc.shape)));
  const bool causal = n.desc.causal;
  rendered_cuda_kernel r;
  r.kind = plan::kernel_kind::attention;
  r.block_threads = attention_backward_block_threads;
  r.summary = std::string(causal ? "causal " : "") + n.desc.name + " (part " + std::to_string(n.desc.variant) +
              ") of q " + to_string(q.desc.shape) + ", head dims " + std::to_string(e) + "/" + std::to_string(ev);
  std::string s;
  s += "constexpr int FBG_E = " + std::to_string(e) + ", FBG_EV = " + std::to_string(ev) +
       ";\nconstexpr bool FBG_CAUSAL = " + (causal ? "true" : "false") + ";\ntypedef " +
       cuda_storage_name(storage) + " fbg_t;\n";
  s += R"(struct fbg_args {
  const fbg_t* q; const fbg_t* k; const fbg_t* v; const fbg_t* o; const fbg_t* g;
  fbg_t* dq; fbg_t* dk; fbg_t* dv; float* stats;
  long long qs[4], ks[4], vs[4], os[4], gs[4], dqs[4], dks[4], dvs[4];
  int batch, tq, tk, heads;
  float scale;
  int pad_;
};
constexpr int FBG_QE = (FBG_E + 31) / 32, FBG_VE = (FBG_EV + 31) / 32;  // head dims per lane

__device__ __forceinline__ float fbg_sum(float x) {  // over the warp; every lane gets it
#pragma unroll
  for (int o = 16; o > 0; o /= 2) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}
// The row at (b, t, h) of a [B, T, H, *] operand with strides s.
template <class P>
__device__ __forceinline__ P* fbg_row(P* x, const long long (&s)[4], int b, int t, int h) {
  return x + b * s[0] + (long long)t * s[1] + h * s[2];
}
template <int N, int W>
__device__ __forceinline__ void fbg_load(float (&r)[N], const fbg_t* x, long long stride, int lane) {
#pragma unroll
  for (int c = 0; c < N; ++c) {
    const int e = lane + 32 * c;
    r[c] = e < W ? fb_to_float(x[e * stride]) : 0.0f;
  }
}
template <int N, int W>
__device__ __forceinline__ float fbg_dot(const float (&r)[N], const fbg_t* x, long long stride, int lane) {
  float d = 0.0f;
#pragma unroll
  for (int c = 0; c < N; ++c) {
    const int e = lane + 32 * c;
    if (e < W) d += r[c] * fb_to_float(x[e * stride]);
  }
  return fbg_sum(d);
}
template <int N, int W>
__device__ __forceinline__ void fbg_axpy(float (&acc)[N], float p, const fbg_t* x, long long stride, int lane) {
#pragma unroll
  for (int c = 0; c < N; ++c) {
    const int e = lane + 32 * c;
    if (e < W) acc[c] += p * fb_to_float(x[e * stride]);
  }
}
template <int N, int W>
__device__ __forceinline__ void fbg_store(fbg_t* x, long long stride, const float (&r)[N], float by, int lane) {
#pragma unroll
  for (int c = 0; c < N; ++c) {
    const int e = lane + 32 * c;
    if (e < W) x[e * stride] = fb_from_float<fbg_t>(r[c] * by);
  }
}

// This warp's row of `rows` = batch * heads * t rows (b, h, t), t fastest; false past the end.
__device__ __forceinline__ bool fbg_this_row(const fbg_args& a, int t_extent, int& b, int& h, int& t, long long& row) {
  row = (long long)blockIdx.x * 4 + threadIdx.x / 32;
  if (row >= (long long)a.batch * a.heads * t_extent) return false;
  t = (int)(row % t_extent);
  h = (int)(row / t_extent % a.heads);
  b = (int)(row / ((long long)t_extent * a.heads));
  return true;
}

// L_i and D_i of a query row.
extern "C" __global__ void __launch_bounds__(128) fusebox_kernel(fbg_args a) {
  int b, h, i;
  long long row;
  if (!fbg_this_row(a, a.tq, b, h, i, row)) return;
  const int lane = threadIdx.x % 32;
  float qv[FBG_QE], gv[FBG_VE];
  fbg_load<FBG_QE, FBG_E>(qv, fbg_row(a.q, a.qs, b, i, h), a.qs[3], lane);
  fbg_load<FBG_VE, FBG_EV>(gv, fbg_row(a.g, a.gs, b, i, h), a.gs[3], lane);
  float m = __int_as_float(0xff800000), l = 0.0f;
  const int keys = FBG_CAUSAL ? min(i + 1, a.tk) : a.tk;
  for (int j = 0; j < keys; ++j) {
    const float s = a.scale * fbg_dot<FBG_QE, FBG_E>(qv, fbg_row(a.k, a.ks, b, j, h), a.ks[3], lane);
    const float mn = fmaxf(m, s);
    l = l * expf(m - mn) + expf(s - mn);
    m = mn;
  }
  const float d = fbg_dot<FBG_VE, FBG_EV>(gv, fbg_row(a.o, a.os, b, i, h), a.os[3], lane);
  if (lane == 0) {
    a.stats[2 * row] = keys > 0 ? m + logf(l) : 0.0f;
    a.stats[2 * row + 1] = d;
  }
}

// dq of a query row.
extern "C" __global__ void __launch_bounds__(128) fusebox_kernel_w(fbg_args a) {
  int b, h, i;
  long long row;
  if (!fbg_this_row(a, a.tq, b, h, i, row)) return;
  const int lane = threadIdx.x % 32;
  float qv[FBG_QE], gv[FBG_VE], acc[FBG_QE];
  fbg_load<FBG_QE, FBG_E>(qv, fbg_row(a.q, a.qs, b, i, h), a.qs[3], lane);
  fbg_load<FBG_VE, FBG_EV>(gv, fbg_row(a.g, a.gs, b, i, h), a.gs[3], lane);
#pragma unroll
  for (int c = 0; c < FBG_QE; ++c) acc[c] = 0.0f;
  const float lse = a.stats[2 * row], dd = a.stats[2 * row + 1];
  const int keys = FBG_CAUSAL ? min(i + 1, a.tk) : a.tk;
  for (int j = 0; j < keys; ++j) {
    const fbg_t* kj = fbg_row(a.k, a.ks, b, j, h);
    const float p = expf(a.scale * fbg_dot<FBG_QE, FBG_E>(qv, kj, a.ks[3], lane) - lse);
    const float dp = fbg_dot<FBG_VE, FBG_EV>(gv, fbg_row(a.v, a.vs, b, j, h), a.vs[3], lane);
    fbg_axpy<FBG_QE, FBG_E>(acc, p * (dp - dd), kj, a.ks[3], lane);
  }
  fbg_store<FBG_QE, FBG_E>(fbg_row(a.dq, a.dqs, b, i, h), a.dqs[3], acc, a.scale, lane);
}

// dk and dv of a key row.
extern "C" __global__ void __launch_bounds__(128) fusebox_kernel_v1(fbg_args a) {
  int b, h, j;
  long long row;
  if (!fbg_this_row(a, a.tk, b, h, j, row)) return;
  const int lane = threadIdx.x % 32;
  float kv[FBG_QE], vv[FBG_VE], dk[FBG_QE], dv[FBG_VE];
  fbg_load<FBG_QE, FBG_E>(kv, fbg_row(a.k, a.ks, b, j, h), a.ks[3], lane);
  fbg_load<FBG_VE, FBG_EV>(vv, fbg_row(a.v, a.vs, b, j, h), a.vs[3], lane);
#pragma unroll
  for (int c = 0; c < FBG_QE; ++c) dk[c] = 0.0f;
#pragma unroll
  for (int c = 0; c < FBG_VE; ++c) dv[c] = 0.0f;
  const float* st = a.stats + 2 * (((long long)b * a.heads + h) * a.tq);
  for (int i = FBG_CAUSAL ? j : 0; i < a.tq; ++i) {
    const fbg_t *qi = fbg_row(a.q, a.qs, b, i, h), *gi = fbg_row(a.g, a.gs, b, i, h);
    const float p = expf(a.scale * fbg_dot<FBG_QE, FBG_E>(kv, qi, a.qs[3], lane) - st[2 * i]);
    const float dp = fbg_dot<FBG_VE, FBG_EV>(vv, gi, a.gs[3], lane);
    fbg_axpy<FBG_QE, FBG_E>(dk, p * (dp - st[2 * i + 1]), qi, a.qs[3], lane);
    fbg_axpy<FBG_VE, FBG_EV>(dv, p, gi, a.gs[3], lane);
  }
  fbg_store<FBG_QE, FBG_E>(fbg_row(a.dk, a.dks, b, j, h), a.dks[3], dk, a.scale, lane);
  fbg_store<FBG_VE, FBG_EV>(fbg_row(a.dv, a.dvs, b, j, h), a.dvs[3], dv, 1.0f, lane);
}
)";
  r.source = std::move(s);
  return r;
}
#endif

}  // namespace fusebox::jit
