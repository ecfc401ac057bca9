// backend/cuda/attention_kernel.hpp: attention() (ops/attention.hpp) on the CUDA backend, as one kernel of
// an NVRTC unit of its own with its head dims, causality and storage type baked in.
//
// Two entry points per kernel:
//   fusebox_kernel     (16-bit storage, head dims multiples of 16 and 8, at most 128) flash
//                      attention on tensor cores: a block of 4 warps takes 64 queries of one
//                      (batch, head); each warp keeps its 16 query rows' q as mma operands in
//                      registers. Tiles of 64 keys of k and v are copied to shared memory with
//                      cp.async (no registers; rows padded so ldmatrix reads are free of bank
//                      conflicts), the next tile while this one is used where two fit. Per step of
//                      32 keys a warp computes the scores with mma.m16n8k16 (float accumulation;
//                      k's operands by ldmatrix), masks them only on the causal diagonal and at
//                      the keys' end, runs an online softmax in registers (one fma and one ex2 a
//                      weight, in log2 units), turns the weights into the A operand of P·V without
//                      leaving registers (the accumulator layout of two 16x8 tiles is the operand
//                      layout of one 16x16; v's operands by ldmatrix.trans) and accumulates the
//                      output in registers. Causal blocks stop at their last query's tile. Scores
//                      never reach memory.
//   fusebox_kernel_v1  any storage and layout: a warp per query row, lanes across the head dim,
//                      the same online softmax in float (the float32 path, and strides that the
//                      tensor-core entry cannot take: odd strides, unaligned data).
// Its gradient nodes (desc.variant 1-3) render as backend/cuda/attention_backward_kernel.hpp's unit.
// Depends on: backend/cuda/codegen.hpp (rendered_cuda_kernel, the prelude's storage types), backend/cuda/module.hpp,
// backend/cuda/attention_backward_kernel.hpp.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>

#include "fusebox/backend/cuda/attention_backward_kernel.hpp"
#include "fusebox/backend/cuda/codegen.hpp"
#include "fusebox/backend/cuda/module.hpp"
#include "fusebox/core/errors.hpp"
#include "fusebox/core/linkage.hpp"
#include "fusebox/ir/graph.hpp"

namespace fusebox::jit {

/// The kernel's parameter block, as the source declares it (fba_args).
struct cuda_attention_args {
  std::uint64_t q = 0, k = 0, v = 0, o = 0;
  long long qs[4] = {}, ks[4] = {}, vs[4] = {}, os[4] = {};  // element strides of batch, token, head, dim
  int batch = 0, tq = 0, tk = 0, heads = 0;
  float scale_log2 = 0;  // log2(e) / sqrt(head dim)
  int pad_ = 0;
};

inline constexpr unsigned attention_block_threads = 128;  // both entries: 4 warps
inline constexpr unsigned attention_block_queries = 64;   // tensor-core entry: queries per block

/// Whether the tensor-core entry exists for these head dims and storage.
inline bool attention_tensor_cores(dtype storage, std::size_t e, std::size_t ev) {
  return (storage == dtype::bf16 || storage == dtype::f16) && e % 16 == 0 && ev % 8 == 0 && e <= 128 && ev <= 128;
}

FUSEBOX_RUNTIME_API rendered_cuda_kernel render_cuda_attention(const ir::node& n, const ir::node& q, const ir::node& v,
                                                               dtype storage);

/// Whether the tensor-core entry may take this operand: unit stride along the head dim, and every
/// row start aligned to `bytes` (q and o move pairs of 16-bit values: 4; k and v are copied to
/// shared memory 16 bytes at a time: 16).
template <class T>
bool attention_rows_aligned(const strided<T>& x, std::size_t bytes) {
  if (x.stride[3] != 1 || reinterpret_cast<std::uintptr_t>(x.data) % bytes != 0) return false;
  for (int d = 0; d < 3; ++d)
    if (static_cast<std::size_t>(x.stride[d]) * sizeof(T) % bytes != 0) return false;
  return true;
}

/// Queues attention kernel `rk` (entries `tc` and `generic`) for q, k, v → o on `on`; true if it
/// took the tensor-core entry.
template <class T>
bool launch_attention(const rendered_cuda_kernel& rk, cuda::CUfunction tc, cuda::CUfunction generic, const strided<T>& q,
                      const strided<T>& k, const strided<T>& v, const strided<T>& o, cuda::CUstream on) {
  cuda_attention_args a;
  a.q = reinterpret_cast<std::uint64_t>(q.data);
  a.k = reinterpret_cast<std::uint64_t>(k.data);
  a.v = reinterpret_cast<std::uint64_t>(v.data);
  a.o = reinterpret_cast<std::uint64_t>(o.data);
  for (int d = 0; d < 4; ++d) {
    a.qs[d] = q.stride[d];
    a.ks[d] = k.stride[d];
    a.vs[d] = v.stride[d];
    a.os[d] = o.stride[d];
  }
  a.batch = static_cast<int>(q.shape[0]);
  a.tq = static_cast<int>(q.shape[1]);
  a.heads = static_cast<int>(q.shape[2]);
  a.tk = static_cast<int>(k.shape[1]);
  a.scale_log2 = static_cast<float>(1.4426950408889634 / std::sqrt(static_cast<double>(q.shape[3])));
  if (a.batch == 0 || a.tq == 0 || a.heads == 0) return false;
  void* args[] = {&a};
  cuda::dim3 grid, block;
  const bool tensor_cores = rk.tensor_cores && attention_rows_aligned(q, 4) && attention_rows_aligned(o, 4) &&
                            attention_rows_aligned(k, 16) && attention_rows_aligned(v, 16);
  block.x = attention_block_threads;
  if (tensor_cores) {
    grid.x = static_cast<unsigned>((q.shape[1] + attention_block_queries - 1) / attention_block_queries);
    grid.y = static_cast<unsigned>(q.shape[0] * q.shape[2]);
  } else {
    grid.x = static_cast<unsigned>((q.shape[0] * q.shape[1] * q.shape[2] + 3) / 4);
  }
  cuda::launch(tensor_cores ? tc : generic, grid, block, 0, on, args, rk.summary);
  return tensor_cores;
}

// Definitions: compiled here, or once in the FUSEBOX_IMPLEMENTATION unit (core/linkage.hpp).
#if FUSEBOX_RUNTIME_BODIES
FUSEBOX_RUNTIME_API rendered_cuda_kernel render_cuda_attention(const ir::node& n, const ir::node& q, const ir::node& v,
                                                               dtype storage) {
  if (n.desc.variant != 0)  // the gradient kernels (expr/grad_nodes.hpp): a unit of their own
    return render_cuda_attention_backward(n, q, v, storage);
  const std::size_t e = q.desc.shape.back(0), ev = v.desc.shape.back(0);
  if (!is_known_extent(e) || !is_known_extent(ev))
    FUSEBOX_THROW(invalid_argument("fusebox: attention on the CUDA backend needs head dims known when compiling; q is " +
                                   to_string(q.desc.shape) + ", v is " + to_string(v.desc.shape)));
  const bool causal = n.desc.causal;
  const bool tc = attention_tensor_cores(storage, e, ev);
  const std::string type = storage == dtype::bf16 ? "fb_bf16" : storage == dtype::f16 ? "fb_f16" : "float";
  rendered_cuda_kernel r;
  r.kind = plan::kernel_kind::attention;
  r.block_threads = attention_block_threads;
  r.tensor_cores = tc;
  r.summary = std::string(causal ? "causal " : "") + "attention " + to_string(q.desc.shape) + ", head dims " +
              std::to_string(e) + "/" + std::to_string(ev) + (tc ? ", tensor cores" : "");
  std::string s;
  s += "constexpr int FBA_E = " + std::to_string(e) + ", FBA_EV = " + std::to_string(ev) +
       ";\nconstexpr bool FBA_CAUSAL = " + (causal ? "true" : "false") + ";\ntypedef " + type + " fba_t;\n";
  s += R"(struct fba_args {
  const fba_t* q; const fba_t* k; const fba_t* v; fba_t* o;
  long long qs[4], ks[4], vs[4], os[4];
  int batch, tq, tk, heads;
  float scale_log2;
  int pad_;
};
__device__ __forceinline__ float fba_neg_inf() { return __int_as_float(0xff800000); }

// Any storage, any strides: a warp per query row, lanes across the head dim.
__device__ __forceinline__ void fba_generic(const fba_args& a) {
  const long long row = (long long)blockIdx.x * 4 + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= (long long)a.batch * a.heads * a.tq) return;
  const int i = (int)(row % a.tq), h = (int)(row / a.tq % a.heads), b = (int)(row / ((long long)a.tq * a.heads));
  constexpr int QE = (FBA_E + 31) / 32, VE = (FBA_EV + 31) / 32;
  const fba_t* q = a.q + b * a.qs[0] + (long long)i * a.qs[1] + h * a.qs[2];
  float qv[QE], acc[VE];
#pragma unroll
  for (int c = 0; c < QE; ++c) {
    const int e = lane + 32 * c;
    qv[c] = e < FBA_E ? fb_to_float(q[e * a.qs[3]]) : 0.0f;
  }
#pragma unroll
  for (int c = 0; c < VE; ++c) acc[c] = 0.0f;
  float m = fba_neg_inf(), l = 0.0f;
  const int keys = FBA_CAUSAL ? min(i + 1, a.tk) : a.tk;
  for (int j = 0; j < keys; ++j) {
    const fba_t* k = a.k + b * a.ks[0] + (long long)j * a.ks[1] + h * a.ks[2];
    float d = 0.0f;
#pragma unroll
    for (int c = 0; c < QE; ++c) {
      const int e = lane + 32 * c;
      if (e < FBA_E) d += qv[c] * fb_to_float(k[e * a.ks[3]]);
    }
#pragma unroll
    for (int o = 16; o > 0; o /= 2) d += __shfl_xor_sync(0xffffffffu, d, o);
    const float s = d * a.scale_log2, mn = fmaxf(m, s), alpha = exp2f(m - mn), p = exp2f(s - mn);
    l = l * alpha + p;
    m = mn;
    const fba_t* v = a.v + b * a.vs[0] + (long long)j * a.vs[1] + h * a.vs[2];
#pragma unroll
    for (int c = 0; c < VE; ++c) {
      const int e = lane + 32 * c;
      if (e < FBA_EV) acc[c] = acc[c] * alpha + p * fb_to_float(v[e * a.vs[3]]);
    }
  }
  const float inv = l > 0.0f ? 1.0f / l : 0.0f;
  fba_t* o = a.o + b * a.os[0] + (long long)i * a.os[1] + h * a.os[2];
#pragma unroll
  for (int c = 0; c < VE; ++c) {
    const int e = lane + 32 * c;
    if (e < FBA_EV) o[e * a.os[3]] = fb_from_float<fba_t>(acc[c] * inv);
  }
}

extern "C" __global__ void __launch_bounds__(128) fusebox_kernel_v1(fba_args a) { fba_generic(a); }
)";
  if (!tc) {
    s += "extern \"C\" __global__ void __launch_bounds__(128) fusebox_kernel(fba_args a) { fba_generic(a); }\n";
    r.source = std::move(s);
    return r;
  }
  const bool bf = storage == dtype::bf16;
  s += "constexpr int FBA_THREADS = " + std::to_string(attention_block_threads) +
       ", FBA_BQ = " + std::to_string(attention_block_queries) + ";\n";
  s += std::string("#define FBA_MMA \"mma.sync.aligned.m16n8k16.row.col.f32.") + (bf ? "bf16.bf16" : "f16.f16") +
       ".f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\"\n";
  s += std::string("#define FBA_PACK \"cvt.rn.") + (bf ? "bf16x2" : "f16x2") + ".f32 %0, %1, %2;\"\n";
  s += R"(__device__ __forceinline__ void fba_mma(float (&c)[4], const unsigned (&x)[4], unsigned b0, unsigned b1) {
  asm(FBA_MMA : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
               : "r"(x[0]), "r"(x[1]), "r"(x[2]), "r"(x[3]), "r"(b0), "r"(b1));
}
// Two floats as one register of two 16-bit values, `lo` in the low half (the lower column).
__device__ __forceinline__ unsigned fba_pack(float lo, float hi) {
  unsigned r;
  asm(FBA_PACK : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}
__device__ __forceinline__ unsigned fba_ld32(const fba_t* p) { return *reinterpret_cast<const unsigned*>(p); }

// Keys per softmax step: 32 for head dim 64 measured best of 16/32/64 on an H200 (W4's attention
// at batch 32: 78.9 / 72.9 / 85.3 µs); 16 keeps head dim 128 within the register budget.
constexpr int FBA_BK = 64, FBA_BN = FBA_E > 64 ? 16 : 32;
constexpr int FBA_KPAD = FBA_E + 8;    // k tile row stride (elements): 16-byte rows, 4 words apart in banks
constexpr int FBA_VPAD = FBA_EV + 8;   // v tile row stride
// Tiles in flight: two (the next one copied while this one is used) where both fit in the 48 KB
// of static shared memory, else one.
constexpr int FBA_NBUF = FBA_E > 64 || FBA_EV > 64 ? 1 : 2;
// A warp per 16 queries. (Measured on an H100, W4's attention at batch 8: two sets of warps
// splitting each tile's keys and merging their softmax states at the end took 18.0 µs against
// 14.5; 128 queries a block 16.0; a register budget for 5 or 6 blocks an SM, 16.5 and 18.6.)
static_assert(FBA_THREADS == FBA_BQ * 2, "a warp per 16 queries");
constexpr int FBA_TILE_HALVES = FBA_NBUF * FBA_BK * (FBA_KPAD + FBA_VPAD);

__device__ __forceinline__ unsigned fba_smem_address(const void* p) {
  unsigned r;
  asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(r) : "l"(p));
  return r;
}
// 16 bytes from global to shared memory without passing through registers; zeros when !valid.
__device__ __forceinline__ void fba_copy16(void* smem, const void* gmem, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(fba_smem_address(smem)), "l"(gmem),
               "r"(valid ? 16 : 0));
}
// 2^x with the multi-function unit alone (ex2.approx: 2 ulp; results below 2^-126 flush to 0,
// which a softmax weight that small is anyway next to the row's largest, 1).
__device__ __forceinline__ float fba_exp2(float x) {
  float r;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
  return r;
}
// Four 8x8 16-bit matrices from shared memory, lanes 8i..8i+7 giving matrix i's row addresses.
__device__ __forceinline__ void fba_ldsm4(unsigned (&r)[4], const void* row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(fba_smem_address(row)));
}
__device__ __forceinline__ void fba_ldsm2(unsigned (&r)[2], const void* row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];"
               : "=r"(r[0]), "=r"(r[1]) : "r"(fba_smem_address(row)));
}
__device__ __forceinline__ void fba_ldsm4t(unsigned (&r)[4], const void* row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(fba_smem_address(row)));
}
__device__ __forceinline__ void fba_ldsm2t(unsigned (&r)[2], const void* row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0, %1}, [%2];"
               : "=r"(r[0]), "=r"(r[1]) : "r"(fba_smem_address(row)));
}

extern "C" __global__ void __launch_bounds__(FBA_THREADS, 2) fusebox_kernel(fba_args a) {
  __shared__ __align__(16) unsigned short smem[FBA_TILE_HALVES];
  unsigned short* const ks = smem;                                  // [FBA_NBUF][FBA_BK][FBA_KPAD]
  unsigned short* const vs = smem + FBA_NBUF * FBA_BK * FBA_KPAD;   // [FBA_NBUF][FBA_BK][FBA_VPAD]
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int qtile = blockIdx.x;
  const int b = blockIdx.y / a.heads, h = blockIdx.y % a.heads;
  const int q0 = qtile * FBA_BQ + warp * 16;  // this warp's first query
  const fba_t* Q = a.q + b * a.qs[0] + h * a.qs[2];
  const fba_t* K = a.k + b * a.ks[0] + h * a.ks[2];
  const fba_t* V = a.v + b * a.vs[0] + h * a.vs[2];
  const int r0 = q0 + g, r1 = q0 + g + 8;  // the two query rows of this thread

  // q as A operands (rows r0, r1; columns 2t, 2t+1 and 2t+8, 2t+9 of each 16-wide step).
  unsigned qf[FBA_E / 16][4];
#pragma unroll
  for (int s = 0; s < FBA_E / 16; ++s) {
    const int c = s * 16 + 2 * t;
    qf[s][0] = r0 < a.tq ? fba_ld32(Q + (long long)r0 * a.qs[1] + c) : 0u;
    qf[s][1] = r1 < a.tq ? fba_ld32(Q + (long long)r1 * a.qs[1] + c) : 0u;
    qf[s][2] = r0 < a.tq ? fba_ld32(Q + (long long)r0 * a.qs[1] + c + 8) : 0u;
    qf[s][3] = r1 < a.tq ? fba_ld32(Q + (long long)r1 * a.qs[1] + c + 8) : 0u;
  }
  float o[FBA_EV / 8][4];
#pragma unroll
  for (int n = 0; n < FBA_EV / 8; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
  // Running maxima in log2 units (score · scale_log2) and this thread's share of the row sums.
  float m0 = fba_neg_inf(), m1 = fba_neg_inf(), l0 = 0.0f, l1 = 0.0f;

  const int block_end = min((qtile + 1) * FBA_BQ, a.tq);
  const int kend = FBA_CAUSAL ? min(a.tk, block_end) : a.tk;
  // Tile copies (k and v rows as they are, 16 bytes a copy), queued asynchronously.
  auto copy_tile = [&](int k0, int buf) {
    for (int w = threadIdx.x; w < FBA_BK * FBA_E / 8; w += FBA_THREADS) {
      const int r = w / (FBA_E / 8), c = w % (FBA_E / 8) * 8;
      const bool in = k0 + r < a.tk;
      fba_copy16(&ks[(buf * FBA_BK + r) * FBA_KPAD + c], in ? K + (long long)(k0 + r) * a.ks[1] + c : K, in);
    }
    for (int w = threadIdx.x; w < FBA_BK * FBA_EV / 8; w += FBA_THREADS) {
      const int r = w / (FBA_EV / 8), c = w % (FBA_EV / 8) * 8;
      const bool in = k0 + r < a.tk;
      fba_copy16(&vs[(buf * FBA_BK + r) * FBA_VPAD + c], in ? V + (long long)(k0 + r) * a.vs[1] + c : V, in);
    }
    asm volatile("cp.async.commit_group;");
  };
  if (kend > 0) copy_tile(0, 0);
  for (int it = 0, k0 = 0; k0 < kend; ++it, k0 += FBA_BK) {
    const int buf = FBA_NBUF == 2 ? it & 1 : 0;
    if (FBA_NBUF == 2 && k0 + FBA_BK < kend) {
      copy_tile(k0 + FBA_BK, buf ^ 1);  // its buffer was last read in the previous iteration
      asm volatile("cp.async.wait_group 1;");
    } else {
      asm volatile("cp.async.wait_group 0;");
    }
    __syncthreads();  // this tile is in shared memory for every thread
    const unsigned short* kt = ks + buf * FBA_BK * FBA_KPAD;
    const unsigned short* vt = vs + buf * FBA_BK * FBA_VPAD;
    // The tile in steps of FBA_BN keys, so a thread holds one step's scores in registers.
#pragma unroll 1
    for (int kb = 0; kb < FBA_BK; kb += FBA_BN) {
      if (FBA_CAUSAL && k0 + kb > q0 + 15) break;  // every key from here on is after this warp's queries

      float sc[FBA_BN / 8][4];  // scores: rows r0 (0, 1) and r1 (2, 3), keys k0 + kb + 8n + 2t (+1)
#pragma unroll
      for (int n = 0; n < FBA_BN / 8; ++n) {
        sc[n][0] = sc[n][1] = sc[n][2] = sc[n][3] = 0.0f;
        // B operands of two 16-wide steps of the head dim from one ldmatrix: lanes 8i..8i+7 give
        // the rows (keys) of matrix i, which holds head dims 8i..8i+7 of the pair.
        const unsigned short* kr = kt + (kb + n * 8 + (lane & 7)) * FBA_KPAD;
#pragma unroll
        for (int s = 0; s + 1 < FBA_E / 16; s += 2) {
          unsigned kf[4];
          fba_ldsm4(kf, kr + s * 16 + (lane >> 3) * 8);
          fba_mma(sc[n], qf[s], kf[0], kf[1]);
          fba_mma(sc[n], qf[s + 1], kf[2], kf[3]);
        }
        if (FBA_E / 16 % 2) {
          unsigned kf[2];
          fba_ldsm2(kf, kr + (FBA_E / 16 - 1) * 16 + (lane >> 3 & 1) * 8);
          fba_mma(sc[n], qf[FBA_E / 16 - 1], kf[0], kf[1]);
        }
      }
      // Masks only where a key can be out of range: the causal diagonal and the keys' end.
      if ((FBA_CAUSAL && k0 + kb + FBA_BN - 1 > q0) || k0 + kb + FBA_BN > a.tk) {
#pragma unroll
        for (int n = 0; n < FBA_BN / 8; ++n)
#pragma unroll
          for (int c = 0; c < 4; ++c) {
            const int key = k0 + kb + n * 8 + 2 * t + (c & 1), row = c < 2 ? r0 : r1;
            if (!(key < a.tk && (!FBA_CAUSAL || key <= row))) sc[n][c] = fba_neg_inf();
          }
      }
      float mx0 = fba_neg_inf(), mx1 = fba_neg_inf();
#pragma unroll
      for (int n = 0; n < FBA_BN / 8; ++n) {
        mx0 = fmaxf(mx0, fmaxf(sc[n][0], sc[n][1]));
        mx1 = fmaxf(mx1, fmaxf(sc[n][2], sc[n][3]));
      }
#pragma unroll
      for (int x = 1; x < 4; x *= 2) {  // the 4 threads of a row hold its scores
        mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, x));
        mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, x));
      }
      // scale_log2 > 0, so the scaled maximum is the maximum scaled.
      const float n0 = fmaxf(m0, mx0 * a.scale_log2), n1 = fmaxf(m1, mx1 * a.scale_log2);
      // A row with no key yet (all masked) keeps maximum -inf: its weights are 0, not NaN.
      const float base0 = n0 == fba_neg_inf() ? 0.0f : n0, base1 = n1 == fba_neg_inf() ? 0.0f : n1;
      const float alpha0 = fba_exp2(m0 - base0), alpha1 = fba_exp2(m1 - base1);
      m0 = n0;
      m1 = n1;
      float sum0 = 0.0f, sum1 = 0.0f;
#pragma unroll
      for (int n = 0; n < FBA_BN / 8; ++n) {  // one fma and one ex2 a weight
        sc[n][0] = fba_exp2(fmaf(sc[n][0], a.scale_log2, -base0));
        sc[n][1] = fba_exp2(fmaf(sc[n][1], a.scale_log2, -base0));
        sc[n][2] = fba_exp2(fmaf(sc[n][2], a.scale_log2, -base1));
        sc[n][3] = fba_exp2(fmaf(sc[n][3], a.scale_log2, -base1));
        sum0 += sc[n][0] + sc[n][1];
        sum1 += sc[n][2] + sc[n][3];
      }
      l0 = l0 * alpha0 + sum0;  // this thread's share; the row's 4 threads are summed at the end
      l1 = l1 * alpha1 + sum1;
#pragma unroll
      for (int n = 0; n < FBA_EV / 8; ++n) {
        o[n][0] *= alpha0;
        o[n][1] *= alpha0;
        o[n][2] *= alpha1;
        o[n][3] *= alpha1;
      }
#pragma unroll
      for (int s = 0; s < FBA_BN / 16; ++s) {
        const unsigned p[4] = {fba_pack(sc[2 * s][0], sc[2 * s][1]), fba_pack(sc[2 * s][2], sc[2 * s][3]),
                               fba_pack(sc[2 * s + 1][0], sc[2 * s + 1][1]), fba_pack(sc[2 * s + 1][2], sc[2 * s + 1][3])};
        // B operands (keys 2t, 2t+1 and 2t+8, 2t+9 of the step; column 8n + g) from row-major v:
        // ldmatrix .trans hands each thread its transposed pairs; lanes 0-15 give the step's 16
        // key rows at columns 8n, lanes 16-31 the same rows at columns 8n + 8.
        const unsigned short* vr = vt + (kb + s * 16 + (lane & 15)) * FBA_VPAD;
#pragma unroll
        for (int n = 0; n + 1 < FBA_EV / 8; n += 2) {
          unsigned vf[4];
          fba_ldsm4t(vf, vr + (n + (lane >> 4)) * 8);
          fba_mma(o[n], p, vf[0], vf[1]);
          fba_mma(o[n + 1], p, vf[2], vf[3]);
        }
        if (FBA_EV / 8 % 2) {
          unsigned vf[2];
          fba_ldsm2t(vf, vr + (FBA_EV / 8 - 1) * 8);
          fba_mma(o[FBA_EV / 8 - 1], p, vf[0], vf[1]);
        }
      }
    }
    __syncthreads();  // every warp is done with this tile's buffer
    if (FBA_NBUF == 1 && k0 + FBA_BK < kend) copy_tile(k0 + FBA_BK, 0);
  }
#pragma unroll
  for (int x = 1; x < 4; x *= 2) {
    l0 += __shfl_xor_sync(0xffffffffu, l0, x);
    l1 += __shfl_xor_sync(0xffffffffu, l1, x);
  }
  const float inv0 = l0 > 0.0f ? 1.0f / l0 : 0.0f, inv1 = l1 > 0.0f ? 1.0f / l1 : 0.0f;
  fba_t* O = a.o + b * a.os[0] + h * a.os[2];
#pragma unroll
  for (int n = 0; n < FBA_EV / 8; ++n) {
    const int c = n * 8 + 2 * t;
    if (r0 < a.tq) *reinterpret_cast<unsigned*>(O + (long long)r0 * a.os[1] + c) = fba_pack(o[n][0] * inv0, o[n][1] * inv0);
    if (r1 < a.tq) *reinterpret_cast<unsigned*>(O + (long long)r1 * a.os[1] + c) = fba_pack(o[n][2] * inv1, o[n][3] * inv1);
  }
}
)";
  r.source = std::move(s);
  return r;
}
#endif

}  // namespace fusebox::jit
