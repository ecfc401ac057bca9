// backend/cuda/static_kernels.cuh: the static CUDA path. In a translation unit compiled by nvcc, a compiled
// call on device tensors whose every extent is static runs kernels that nvcc instantiated from the
// plan at build time: no NVRTC, no host compiler, no guard. compile.hpp includes this header when
// __CUDACC__ is defined and routes a call here when `supported<Prog>` holds; otherwise the call
// takes the run-time path (NVRTC), as in a g++ unit.
//
// The plan reaches the kernels as it reaches the CPU executor: `Prog` is `cpu::program<float,
// Roots...>`, whose `plan` and `nodes` are constexpr members; each kernel template takes Prog and
// the kernel's index K and reads its group, index space, passes and members with `if constexpr`,
// so extents are literals and the fused chain is inlined. The op math is each op's `on_device`
// (ops/elementwise.hpp, ops/reduce.hpp): the same tokens the NVRTC generator pastes as text.
//
// Cases (plan::kernel_kind):
//   rows, no passes  `elementwise<Prog, K, L>`: grid-stride over the space, L = 4 (16-byte loads
//                    and stores) when every operand allows it at this call, else L = 1.
//   rows, passes     `row_reduce<Prog, K, L, B>`: a block of B threads per row (B from the row
//                    length: about four chunks a thread, 32 to 256); each pass accumulates in
//                    registers, then warp shuffles and one shared word per warp, in a fixed order.
//   matmul           cuBLASLt (float32, CUBLAS_COMPUTE_32F, the default choice of jit::lt_choices),
//                    taking the epilogue where the schedule says it can (device_schedule: bias row,
//                    residual, relu / gelu_tanh, as on the run-time path), else the epilogue group
//                    as `elementwise<Prog, K, L>` over the product, in place.
//   copy             a device copy.
// Anything else (column reductions, attention, gather, conv/pooling, pad, graph breaks), an op
// without `on_device`, a storage type other than float, or a dyn extent: `supported` is false and
// the whole call takes the run-time path.
//
// Needs nvcc with --expt-relaxed-constexpr (kernels call the constexpr shape helpers) and C++20.
// Depends on: backend/cpu/executor.hpp (program, lists of a group's members), backend/cuda/generated_program.hpp
// (cuda_runtime: stream and arena; lt_choices), backend/cuda/cublaslt.hpp.
#pragma once

#if !defined(__CUDACC__)
#error "fusebox/backend/cuda/static_kernels.cuh holds __global__ templates: include it only from a .cu compiled by nvcc"
#endif
#if !defined(__CUDACC_RELAXED_CONSTEXPR__)
#error "fusebox: the static CUDA path needs nvcc's --expt-relaxed-constexpr (its kernels read the constexpr plan)"
#endif

#include <cuda_runtime.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>
#include <utility>

#include "fusebox/backend/cpu/executor.hpp"
#include "fusebox/backend/cuda/generated_program.hpp"
#include "fusebox/profile.hpp"

namespace fusebox::cuda::static_path {

/// Every node's device address, strides in the kernel's index space and scalar value: one
/// parameter block per launch (N * 60 bytes; sm_90 takes up to 32 KB).
template <std::size_t N>
struct params {
  float* ptr[N];
  long long stride[N][max_rank];
  float scalar[N];
};

template <int L>
struct lanes {
  float v[L];
};

// ---- what the plan says, as constants ----

template <class Prog, int K>
inline constexpr plan::kernel kernel_of = Prog::plan.kernels[K];

/// Kernel K's index space (a rank-0 space is one row of one element, as on the CPU).
template <class Prog, int K>
inline constexpr dims space_of = [] {
  const plan::kernel& kn = Prog::plan.kernels[K];
  const dims s = kn.kind == plan::kernel_kind::matmul ? Prog::nodes[kn.node].desc.shape : kn.space;
  return s.rank == 0 ? dims{1, {1}} : s;
}();

/// The schedule for the GPU (schedule/schedule.hpp), made at build time: here, what cuBLASLt takes
/// of each matmul's epilogue, as on the run-time path. Operands are taken to have unit inner
/// stride (a bias row's is checked per call).
template <class Prog>
inline constexpr schedule::schedule_t<Prog::N> device_schedule = [] {
  std::array<bool, Prog::N> unit{};
  unit.fill(true);
  return schedule::make_schedule(Prog::nodes, Prog::plan, unit, schedule::cuda_caps);
}();

template <class Prog, int G>
inline constexpr auto outputs_of = Prog::group_outputs(G, true);  // written in the output pass
template <class Prog, int G>
inline constexpr auto row_outputs_of = Prog::group_outputs(G, false);  // per-row results
template <class Prog, int G>
inline constexpr auto steps_of = Prog::row_steps(G);  // reductions and per-row scalars, in order
template <class Prog, int G>
inline constexpr auto inputs_of = Prog::external_inputs(G);

template <class Op>
concept has_device_op = requires { &Op::on_device; };
template <class Op>
concept has_device_reduce = requires { Op::on_device::identity(); };

/// Whether every node of group G has device math.
template <class Prog, int G>
constexpr bool group_on_device() {
  return []<std::size_t... I>(std::index_sequence<I...>) {
    return ([] {
      if constexpr (Prog::plan.group[I] != G) return true;
      else if constexpr (Prog::nodes[I].desc.kind == node_kind::pointwise)
        return has_device_op<typename Prog::graph::template type_of<I>::op>;
      else if constexpr (Prog::nodes[I].desc.kind == node_kind::reduce)
        return has_device_reduce<typename Prog::graph::template type_of<I>::op>;
      else return false;
    }() && ...);
  }(std::make_index_sequence<Prog::N>{});
}

template <class Prog, int K>
constexpr bool kernel_supported() {
  constexpr plan::kernel kn = Prog::plan.kernels[K];
  if constexpr (kn.kind == plan::kernel_kind::copy) return true;
  else if constexpr (kn.kind == plan::kernel_kind::rows) return group_on_device<Prog, kn.group>();
  else if constexpr (kn.kind == plan::kernel_kind::matmul)
    return Prog::nodes[kn.node].desc.shape.rank >= 2 && Prog::nodes[kn.node].desc.shape.rank <= 3 &&
           (kn.group < 0 || group_on_device<Prog, kn.group>());
  else return false;
}

/// Whether this program runs on the static path (else the run-time path serves the call).
template <class Prog>
constexpr bool supported() {
  if constexpr (!std::is_same_v<typename Prog::value_type, float> || !Prog::all_static || Prog::N > 256) {
    return false;
  } else {
    return []<int... K>(std::integer_sequence<int, K...>) {
      return (kernel_supported<Prog, K>() && ...);
    }(std::make_integer_sequence<int, Prog::plan.n_kernels>{});
  }
}

// ---- device side ----

/// One node's value at the current position: L consecutive elements along the last axis.
/// Members of group G are computed (per-row values come from `rs`), others are loaded.
template <class Prog, int G, int L>
struct evaluator {
  static constexpr std::size_t R = Prog::N;
  const params<R>& p;
  const float* rs;
  const std::size_t* coord;  // the position's coordinates in the kernel's space
  int rank;

  template <int Id>
  __device__ long long offset() const {
    long long o = 0;
    for (int d = 0; d < rank; ++d) o += static_cast<long long>(coord[d]) * p.stride[Id][d];
    return o;
  }

  template <int Id>
  __device__ lanes<L> get() const {
    lanes<L> r;
    if constexpr (Prog::nodes[Id].desc.kind == node_kind::scalar) {
      for (int l = 0; l < L; ++l) r.v[l] = p.scalar[Id];
    } else if constexpr (G >= 0 && Prog::plan.group[Id] == G) {
      if constexpr (Prog::nodes[Id].desc.kind == node_kind::reduce || Prog::plan.row_constant[Id]) {
        for (int l = 0; l < L; ++l) r.v[l] = rs[Id];
      } else {
        r = compute<Id>();
      }
    } else {
      const float* at = p.ptr[Id] + offset<Id>();
      constexpr dims s = Prog::nodes[Id].desc.shape;
      if constexpr (L == 1) {
        r.v[0] = *at;
      } else if constexpr (s.rank == 0 || s.back(0) == 1) {  // broadcast along the row
        for (int l = 0; l < L; ++l) r.v[l] = *at;
      } else {
        const float4 q = *reinterpret_cast<const float4*>(at);
        r.v[0] = q.x, r.v[1] = q.y, r.v[2] = q.z, r.v[3] = q.w;
      }
    }
    return r;
  }

  template <int Id>
  __device__ lanes<L> compute() const {
    // Fields of the node one by one: a copy of the whole node would hold its type tag, a host
    // address that device code cannot name.
    using Op = typename Prog::graph::template type_of<Id>::op;
    constexpr int n = Prog::nodes[Id].n_inputs;
    constexpr int i0 = Prog::nodes[Id].inputs[0], i1 = Prog::nodes[Id].inputs[1], i2 = Prog::nodes[Id].inputs[2];
    lanes<L> r;
    if constexpr (n == 1) {
      const lanes<L> a = get<i0>();
      for (int l = 0; l < L; ++l) r.v[l] = Op::on_device(a.v[l]);
    } else if constexpr (n == 2) {
      const lanes<L> a = get<i0>(), b = get<i1>();
      for (int l = 0; l < L; ++l) r.v[l] = Op::on_device(a.v[l], b.v[l]);
    } else {
      const lanes<L> a = get<i0>(), b = get<i1>(), c = get<i2>();
      for (int l = 0; l < L; ++l) r.v[l] = Op::on_device(a.v[l], b.v[l], c.v[l]);
    }
    return r;
  }

  /// Writes output Id's value here.
  template <int Id>
  __device__ void store() const {
    const lanes<L> v = get<Id>();
    float* at = p.ptr[Id] + offset<Id>();
    if constexpr (L == 1) *at = v.v[0];
    else *reinterpret_cast<float4*>(at) = make_float4(v.v[0], v.v[1], v.v[2], v.v[3]);
  }
};

template <class Prog, int G, int L, int... Q>
__device__ void store_outputs(const evaluator<Prog, G, L>& e, std::integer_sequence<int, Q...>) {
  (e.template store<outputs_of<Prog, G>.id[Q]>(), ...);
}

/// Coordinates of flat element e of a static space.
template <class Prog, int K>
__device__ void coordinates(std::size_t e, std::size_t* coord) {
  constexpr dims s = space_of<Prog, K>;
  for (int d = static_cast<int>(s.rank) - 1; d >= 0; --d) {
    coord[d] = e % s.extent[d];
    e /= s.extent[d];
  }
}

/// A fused elementwise chain (a rows kernel without passes, or a matmul's epilogue).
template <class Prog, int K, int L>
__global__ void elementwise(const __grid_constant__ params<Prog::N> p) {
  constexpr int G = kernel_of<Prog, K>.group;
  constexpr dims s = space_of<Prog, K>;
  constexpr std::size_t total = s.size();
  std::size_t coord[max_rank];
  const evaluator<Prog, G, L> e{p, nullptr, coord, static_cast<int>(s.rank)};
  const std::size_t step = static_cast<std::size_t>(gridDim.x) * blockDim.x * L;
  for (std::size_t i = (static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x) * L; i < total; i += step) {
    coordinates<Prog, K>(i, coord);
    store_outputs(e, std::make_integer_sequence<int, outputs_of<Prog, G>.size>{});
  }
}

/// combine over the block, in a fixed order; every thread gets the result.
template <class Op, int B>
__device__ float block_combine(float v, float* shared) {
  for (int o = 16; o > 0; o >>= 1) v = Op::on_device::combine(v, __shfl_xor_sync(0xffffffffu, v, o));
  if constexpr (B > 32) {
    if (threadIdx.x % 32 == 0) shared[threadIdx.x / 32] = v;
    __syncthreads();
    v = shared[0];
    for (int w = 1; w < B / 32; ++w) v = Op::on_device::combine(v, shared[w]);
    __syncthreads();  // the next reduction reuses `shared`
  }
  return v;
}

/// One step of a row: a reduction pass over the row, or a per-row scalar.
template <class Prog, int K, int L, int B, int Id>
__device__ void row_step(const params<Prog::N>& p, float* rs, std::size_t* coord, float* shared) {
  constexpr int G = kernel_of<Prog, K>.group;
  constexpr dims s = space_of<Prog, K>;
  constexpr std::size_t width = s.back(0);
  if constexpr (Prog::nodes[Id].desc.kind == node_kind::reduce) {
    using R = typename Prog::graph::template type_of<Id>::op::on_device;
    const evaluator<Prog, G, L> e{p, rs, coord, static_cast<int>(s.rank)};
    float acc = R::identity();
    for (std::size_t j = threadIdx.x * L; j < width; j += B * L) {
      coord[s.rank - 1] = j;
      const lanes<L> v = e.template get<Prog::nodes[Id].inputs[0]>();
      for (int l = 0; l < L; ++l) acc = R::combine(acc, v.v[l]);
    }
    rs[Id] = R::finalize(block_combine<typename Prog::graph::template type_of<Id>::op, B>(acc, shared), width);
  } else {  // a per-row scalar: every thread computes it
    coord[s.rank - 1] = 0;
    rs[Id] = evaluator<Prog, G, 1>{p, rs, coord, static_cast<int>(s.rank)}.template compute<Id>().v[0];
  }
}

template <class Prog, int K, int L, int B, int... S>
__device__ void row_steps(const params<Prog::N>& p, float* rs, std::size_t* coord, float* shared,
                          std::integer_sequence<int, S...>) {
  (row_step<Prog, K, L, B, steps_of<Prog, kernel_of<Prog, K>.group>.id[S]>(p, rs, coord, shared), ...);
}

template <class Prog, int G, int... Q>
__device__ void store_row_outputs(const params<Prog::N>& p, const float* rs, const std::size_t* coord, int rank,
                                  std::integer_sequence<int, Q...>) {
  auto one = [&](auto id) {
    constexpr int Id = decltype(id)::value;
    long long o = 0;
    for (int d = 0; d < rank; ++d) o += static_cast<long long>(coord[d]) * p.stride[Id][d];
    p.ptr[Id][o] = rs[Id];
  };
  (one(std::integral_constant<int, row_outputs_of<Prog, G>.id[Q]>{}), ...);
}

/// A row group: a block per row (grid-stride over rows); passes, then the output pass.
template <class Prog, int K, int L, int B>
__global__ void __launch_bounds__(B) row_reduce(const __grid_constant__ params<Prog::N> p) {
  constexpr int G = kernel_of<Prog, K>.group;
  constexpr dims s = space_of<Prog, K>;
  constexpr std::size_t width = s.back(0), rows = s.size() / width;
  __shared__ float shared[B / 32 > 0 ? B / 32 : 1];
  std::size_t coord[max_rank];
  float rs[Prog::N];
  for (std::size_t r = blockIdx.x; r < rows; r += gridDim.x) {
    coordinates<Prog, K>(r * width, coord);
    row_steps<Prog, K, L, B>(p, rs, coord, shared, std::make_integer_sequence<int, steps_of<Prog, G>.size>{});
    const evaluator<Prog, G, L> e{p, rs, coord, static_cast<int>(s.rank)};
    for (std::size_t j = threadIdx.x * L; j < width; j += B * L) {
      coord[s.rank - 1] = j;
      store_outputs(e, std::make_integer_sequence<int, outputs_of<Prog, G>.size>{});
    }
    if (threadIdx.x == 0) {
      coord[s.rank - 1] = 0;
      store_row_outputs<Prog, G>(p, rs, coord, static_cast<int>(s.rank),
                                 std::make_integer_sequence<int, row_outputs_of<Prog, G>.size>{});
    }
  }
}

// ---- host side ----

/// Threads per block of a row kernel: about four L-chunks a thread, 32 to 256.
template <std::size_t Width, int L>
inline constexpr int row_threads = [] {
  int b = 32;
  while (b < 256 && static_cast<std::size_t>(b) * 4 * L < Width) b *= 2;
  return b;
}();

template <class Prog>
struct runner {
  static constexpr std::size_t N = Prog::N;
  using frame_t = typename Prog::frame_t;

  /// Kernel K's parameter block, and whether its 16-byte entry may run (every operand it loads
  /// or stores contiguous along the row, 16-byte aligned, row strides in whole vectors).
  template <int K>
  static bool pack(const frame_t& f, params<N>& p) {
    constexpr plan::kernel kn = kernel_of<Prog, K>;
    constexpr int G = kn.group;
    constexpr dims s = space_of<Prog, K>;
    bool vec = s.back(0) % 4 == 0;
    for (std::size_t i = 0; i < N; ++i) {
      p.ptr[i] = nullptr;
      p.scalar[i] = 0;
      for (std::size_t d = 0; d < max_rank; ++d) p.stride[i][d] = 0;
      if (Prog::nodes[i].desc.kind == node_kind::scalar && Prog::nodes[i].payload_slot >= 0)
        p.scalar[i] = static_cast<const scalar_leaf<float>*>(f.payload[Prog::nodes[i].payload_slot])->value;
    }
    auto bind = [&](int id, bool per_row) {
      const strided<float>& m = f.loc[id];
      std::ptrdiff_t st[max_rank] = {};
      const ir::node& n = Prog::nodes[id];
      if (per_row && n.desc.kind == node_kind::reduce)
        cpu::reduced_space_strides(m, s, static_cast<std::size_t>(n.desc.axis), n.desc.keepdim, st);
      else
        cpu::space_strides(m, s, st);
      p.ptr[id] = m.data;
      for (std::size_t d = 0; d < s.rank; ++d) p.stride[id][d] = st[d];
      const bool along_row = !(n.desc.shape.rank == 0 || n.desc.shape.back(0) == 1);
      if (!per_row && along_row) {
        if (st[s.rank - 1] != 1 || reinterpret_cast<std::uintptr_t>(m.data) % 16 != 0) vec = false;
        for (std::size_t d = 0; d + 1 < s.rank; ++d)
          if (st[d] % 4 != 0) vec = false;
      }
    };
    constexpr auto ins = inputs_of<Prog, G>;
    constexpr auto outs = outputs_of<Prog, G>;
    constexpr auto routs = row_outputs_of<Prog, G>;
    for (int q = 0; q < ins.size; ++q) bind(ins.id[q], false);
    for (int q = 0; q < outs.size; ++q) bind(outs.id[q], false);
    for (int q = 0; q < routs.size; ++q) bind(routs.id[q], true);
    return vec;
  }

  static void check(cudaError_t e, const char* what) {
    if (e != cudaSuccess)
      throw invalid_argument(std::string("fusebox: the static CUDA path could not launch ") + what + ": " +
                             cudaGetErrorString(e));
  }

  template <int K>
  static void launch_group(const frame_t& f, cudaStream_t on, int sms) {
    constexpr plan::kernel kn = kernel_of<Prog, K>;
    constexpr dims s = space_of<Prog, K>;
    if constexpr (s.size() == 0) {
      return;
    } else {
      params<N> p;
      const bool vec = pack<K>(f, p);
      const unsigned cap = static_cast<unsigned>(sms) * 32;
      const bool row_group = kn.kind == plan::kernel_kind::rows && kn.passes > 0;
      if constexpr (kn.kind == plan::kernel_kind::rows && kn.passes > 0) {
        constexpr std::size_t rows = s.size() / s.back(0);
        const unsigned grid = static_cast<unsigned>(rows < cap ? rows : cap);
        profile::scoped_span span("static CUDA row kernel", "kernel");
        if (vec) {
          constexpr int B = row_threads<s.back(0), 4>;
          row_reduce<Prog, K, 4, B><<<grid, B, 0, on>>>(p);
        } else {
          constexpr int B = row_threads<s.back(0), 1>;
          row_reduce<Prog, K, 1, B><<<grid, B, 0, on>>>(p);
        }
      } else {
        (void)row_group;
        const int L = vec ? 4 : 1;
        const std::size_t blocks = (s.size() / L + 255) / 256;
        const unsigned grid = static_cast<unsigned>(blocks < cap ? blocks : cap);
        profile::scoped_span span("static CUDA elementwise kernel", "kernel");
        if (vec) elementwise<Prog, K, 4><<<grid, 256, 0, on>>>(p);
        else elementwise<Prog, K, 1><<<grid, 256, 0, on>>>(p);
      }
      check(cudaGetLastError(), "a kernel");
    }
  }

  /// C = A·B through cuBLASLt, written where the plan put the product (the epilogue's output
  /// when it has one), then the epilogue in place.
  template <int K>
  static void run_matmul(const frame_t& f, cudaStream_t on, int sms) {
    constexpr plan::kernel kn = kernel_of<Prog, K>;
    constexpr int M = kn.node;
    const strided<float>& A = f.loc[Prog::nodes[M].inputs[0]];
    const strided<float>& B = f.loc[Prog::nodes[M].inputs[1]];
    const strided<float>& C = f.loc[M];
    constexpr auto sz = Prog::matmul_sizes(M, Prog::nodes[M].desc.shape,
                                           Prog::nodes[Prog::nodes[M].inputs[0]].desc.shape);
    auto transposed = [](const strided<float>& x, const char* which) {
      const std::size_t r = x.shape.rank;
      const auto rows = static_cast<std::ptrdiff_t>(x.shape.back(1)), cols = static_cast<std::ptrdiff_t>(x.shape.back(0));
      if (x.stride[r - 1] == 1 && (x.stride[r - 2] == cols || rows == 1)) return false;
      if (x.stride[r - 2] == 1 && x.stride[r - 1] == rows) return true;
      throw invalid_argument(std::string("fusebox: matmul on the CUDA backend needs each operand row-major or a "
                                         "transposed row-major matrix; the ") +
                             which + " " + to_string(x.shape) + " is neither");
    };
    cuda::lt_problem prob;
    prob.batch = sz.batch;
    prob.m = sz.m;
    prob.n = sz.n;
    prob.k = sz.k;
    prob.type = cuda::lt_type::f32;
    prob.trans_a = transposed(A, "left operand");
    prob.trans_b = transposed(B, "right operand");
    prob.stride_a = A.shape.rank == 3 && A.shape.extent[0] != 1 ? A.stride[0] : 0;
    prob.stride_b = B.shape.rank == 3 && B.shape.extent[0] != 1 ? B.stride[0] : 0;
    if (prob.batch == 1) prob.stride_a = prob.stride_b = cuda::lt_problem::packed;
    // The schedule's share of the epilogue for cuBLASLt (bias row, residual, relu / gelu_tanh), where
    // this call's residual is contiguous and its bias row has unit stride; else the epilogue kernel.
    constexpr schedule::library_epilogue lib = device_schedule<Prog>.kernels[K].library;
    bool fused = lib.usable(f.loc.data());
    if constexpr (lib.bias >= 0) {
      const strided<float>& bias = f.loc[lib.bias];
      fused = fused && (bias.shape.rank == 0 || bias.stride[bias.shape.rank - 1] == 1 || bias.shape.back(0) == 1);
    }
    const void* bias_data = fused && lib.bias >= 0 ? static_cast<const void*>(f.loc[lib.bias].data) : nullptr;
    const void* residual_data = fused && lib.residual >= 0 ? static_cast<const void*>(f.loc[lib.residual].data) : nullptr;
    if (fused) {
      prob.bias = lib.bias >= 0;
      prob.residual = lib.residual >= 0;
      prob.epilogue = lib.act == schedule::activation::relu        ? cuda::lt_epilogue::relu
                      : lib.act == schedule::activation::gelu_tanh ? cuda::lt_epilogue::gelu_tanh
                                                                   : cuda::lt_epilogue::none;
    }
    std::uint32_t align = 256;
    for (const void* ptr : {static_cast<const void*>(A.data), static_cast<const void*>(B.data),
                            static_cast<const void*>(C.data), bias_data, residual_data})
      while (ptr && align > sizeof(float) && reinterpret_cast<std::uintptr_t>(ptr) % align != 0) align /= 2;
    prob.alignment = align;
    {
      profile::scoped_span span(fused ? "cuBLASLt matmul + epilogue (static path)" : "cuBLASLt matmul (static path)",
                                "kernel");
      jit::lt_choices::instance().matmul(prob, reinterpret_cast<cuda::CUdeviceptr>(A.data),
                                         reinterpret_cast<cuda::CUdeviceptr>(B.data),
                                         reinterpret_cast<cuda::CUdeviceptr>(C.data),
                                         reinterpret_cast<cuda::CUdeviceptr>(bias_data),
                                         reinterpret_cast<cuda::CUstream>(on),
                                         reinterpret_cast<cuda::CUdeviceptr>(residual_data));
    }
    if constexpr (kn.group >= 0)
      if (!fused) launch_group<K>(f, on, sms);
  }

  template <int K>
  static void run_kernel(const frame_t& f, cudaStream_t on, int sms) {
    constexpr plan::kernel kn = kernel_of<Prog, K>;
    if constexpr (kn.kind == plan::kernel_kind::rows) {
      launch_group<K>(f, on, sms);
    } else if constexpr (kn.kind == plan::kernel_kind::matmul) {
      run_matmul<K>(f, on, sms);
    } else {
      static_assert(kn.kind == plan::kernel_kind::copy, "fusebox internal: supported<> let an unknown kernel through");
      const strided<float>& from = f.loc[kn.node];
      const strided<float>& to = f.copy_to[kn.node];
      if (from.contiguous() && to.contiguous())
        cuda::copy_on_device_async(reinterpret_cast<cuda::CUdeviceptr>(to.data),
                                   reinterpret_cast<cuda::CUdeviceptr>(from.data), from.shape.size() * sizeof(float),
                                   reinterpret_cast<cuda::CUstream>(on));
      else
        cuda::strided_copy_async(reinterpret_cast<cuda::CUdeviceptr>(to.data), to.stride,
                                 reinterpret_cast<cuda::CUdeviceptr>(from.data), from.stride, from.shape, sizeof(float),
                                 reinterpret_cast<cuda::CUstream>(on));
    }
  }

  /// Runs a call whose inputs and outputs are bound in `f` (device memory), on rt's stream.
  static void run(frame_t& f, jit::cuda_runtime& rt) {
    const cuda::device_info& dev = cuda::current_device();  // the primary context, current here
    if constexpr (Prog::arena_bytes > 0) {
      if (Prog::arena_bytes + 256 > rt.arena.size()) rt.stream.sync();  // growing frees what queued calls use
      rt.arena.ensure(Prog::arena_bytes + 256);
      f.arena = reinterpret_cast<std::byte*>((rt.arena.get() + 255) / 256 * 256);
    }
    Prog::bind_intermediates(f);
    const auto on = reinterpret_cast<cudaStream_t>(rt.stream.get());
    [&]<int... K>(std::integer_sequence<int, K...>) {
      (run_kernel<K>(f, on, dev.sm_count), ...);
    }(std::make_integer_sequence<int, Prog::plan.n_kernels>{});
  }
};

/// Static-path calls so far in this process (for tests and reports: a call counted here compiled
/// nothing).
inline std::atomic<std::uint64_t>& calls() {
  static std::atomic<std::uint64_t> n{0};
  return n;
}

}  // namespace fusebox::cuda::static_path
