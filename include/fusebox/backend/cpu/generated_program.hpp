// backend/cpu/generated_program.hpp: the host side of a generated program. It holds one specialisation (the IR with
// its extents, known or symbolic, and the plan the one planner made for it) and the compiled
// kernels, and runs a call: lays out the arena for the call's concrete extents, binds every node's
// memory, and runs the kernels in plan order — generated code for rows, column reductions and
// matmul epilogues; cpu::gemm, user functions (graph breaks) and copies on the host.
// Depends on: plan/planner.hpp, schedule/schedule.hpp, backend/cpu/{addressing,gemm,thread_pool,invoke}.hpp,
// jit/kernel_abi.hpp, ops/layout.hpp.
#pragma once

#include <algorithm>
#include <array>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "fusebox/backend/cpu/addressing.hpp"
#include "fusebox/backend/cpu/attention.hpp"
#include "fusebox/backend/cpu/gemm.hpp"
#include "fusebox/backend/cpu/invoke.hpp"
#include "fusebox/backend/cpu/spatial.hpp"
#include "fusebox/core/errors.hpp"
#include "fusebox/core/linkage.hpp"
#include "fusebox/expr/custom.hpp"
#include "fusebox/jit/kernel_abi.hpp"
#include "fusebox/ops/layout.hpp"
#include "fusebox/plan/at_extents.hpp"
#include "fusebox/plan/planner.hpp"
#include "fusebox/profile.hpp"
#include "fusebox/schedule/schedule.hpp"

namespace fusebox::jit {

/// A compiled kernel: its entry point, its local-to-graph node map, and what keeps its code loaded.
struct kernel_binary {
  void* fn = nullptr;
  std::vector<int> locals;
  std::shared_ptr<const void> owner;
  std::string summary;
};

template <class T, std::size_t N>
struct program {
  std::array<ir::node, N> graph{};  ///< the model's graph, duplicates merged (jit/merge.hpp), generic extents
  std::array<ir::node, N> nodes{};  ///< the specialisation (symbolic extents where the guard allows any)
  plan::plan_t<N> plan{};
  std::array<bool, N> unit_inner{};
  /// How each kernel runs on this back end (schedule/schedule.hpp), made with `caps` once the plan
  /// and unit_inner are known (pipeline/dynamic_function.hpp's specialise_into).
  schedule::schedule_t<N> sched{};
  static constexpr schedule::backend_caps caps = schedule::cpu_caps;
  std::array<kernel_binary, N + 1> kernels{};
  /// Each kernel's fused ops, as explain() lists them: its profile span's name (the generated
  /// kernel's summary is the span's detail).
  std::array<std::string, N + 1> kernel_names{};
  std::string key;  ///< canonical text of the specialisation, for logs

  /// One call. `f` has inputs, payloads and outputs bound (cpu::bind_inputs / outputs), `concrete`
  /// the call's node shapes (specialise() with the call's extents). `opaque(node, f)` runs a graph
  /// break's user function.
  void run(cpu::frame<T, N>& f, const std::array<ir::node, N>& concrete, cpu::runtime& rt,
           const std::function<void(int, cpu::frame<T, N>&)>& opaque) const {
    f.pool = rt.pool;
    plan::plan_t<N> p = plan;
    plan::assign_arena(p, concrete, sizeof(T));
    std::byte* arena = rt.arena.ensure(p.arena_bytes);
    for (std::size_t i = 0; i < N; ++i)
      if (p.offset[i] != plan::no_offset)
        f.loc[i] = strided<T>{reinterpret_cast<T*>(arena + p.offset[i]), concrete[i].desc.shape,
                              contiguous_strides(concrete[i].desc.shape)};
    for (int k = 0; k < p.n_kernels; ++k)
      if ((p.kernels[k].kind == plan::kernel_kind::matmul || p.kernels[k].kind == plan::kernel_kind::spatial) &&
          p.kernels[k].group >= 0)
        f.loc[p.kernels[k].node] = f.loc[epilogue_output(p.kernels[k].group)];
    bind_views(nodes, f, concrete);
    const unsigned threads = rt.pool->size();
    const std::size_t scratch_stride = (p.row_scratch_elems * sizeof(T) + 63) / 64 * 64;
    std::size_t gemm_ws = 0;
    for (int k = 0; k < p.n_kernels; ++k)
      if (p.kernels[k].kind == plan::kernel_kind::matmul) {
        const auto s = mm_sizes(concrete, p.kernels[k].node);
        gemm_ws = std::max(gemm_ws, cpu::gemm_workspace_bytes<T>(s[0], s[1], s[2], s[3], threads));
      } else if (p.kernels[k].kind == plan::kernel_kind::spatial) {
        const ir::node& n = concrete[p.kernels[k].node];
        gemm_ws = std::max(gemm_ws, cpu::spatial_workspace_bytes<T>(
                                        n.desc.win, concrete[n.inputs[0]].desc.shape,
                                        n.n_inputs == 2 ? concrete[n.inputs[1]].desc.shape : dims{}, n.desc.shape, threads));
      }
    std::byte* ws = rt.workspace.ensure(scratch_stride * threads + gemm_ws);
    f.workspace = ws;
    f.workspace_bytes = rt.workspace.size();
    for (int k = 0; k < p.n_kernels; ++k) {
      const plan::kernel& kn = p.kernels[k];
      profile::scoped_span span(kernel_names[k], "kernel", kernels[k].summary);
      switch (kn.kind) {
        case plan::kernel_kind::rows: run_rows(f, concrete, k, kn, scratch_stride, *rt.pool); break;
        case plan::kernel_kind::reduce_cols: run_cols(f, concrete, k, kn, *rt.pool); break;
        case plan::kernel_kind::matmul:
          run_matmul(f, concrete, k, kn, *rt.pool,
                     std::span<std::byte>(ws + scratch_stride * threads, f.workspace_bytes - scratch_stride * threads));
          break;
        case plan::kernel_kind::opaque:
          opaque(kn.node, f);
          bind_views(nodes, f, concrete);
          break;
        case plan::kernel_kind::copy:  // none for a segment's root that is a leaf or a view (jit/dynamic.hpp)
          if (f.copy_to[kn.node].data) cpu::strided_copy(f.loc[kn.node], f.copy_to[kn.node]);
          break;
        case plan::kernel_kind::spatial:
          run_spatial(f, concrete, k, kn, *rt.pool,
                      std::span<std::byte>(ws + scratch_stride * threads, f.workspace_bytes - scratch_stride * threads));
          break;
        case plan::kernel_kind::attention: {
          const ir::node& n = nodes[kn.node];
          if (n.desc.variant == 0)
            cpu::attention(f.loc[n.inputs[0]], f.loc[n.inputs[1]], f.loc[n.inputs[2]], f.loc[kn.node], n.desc.causal,
                           *rt.pool);
          else
            cpu::attention_backward(f.loc[n.inputs[0]], f.loc[n.inputs[1]], f.loc[n.inputs[2]], f.loc[n.inputs[3]],
                                    f.loc[n.inputs[4]], f.loc[kn.node], n.desc.variant, n.desc.causal, *rt.pool);
          break;
        }
        case plan::kernel_kind::gather: {
          const ir::node& n = nodes[kn.node];
          cpu::run_gather(n.desc, f.loc[n.inputs[0]], f.loc[n.inputs[1]], f.loc[kn.node], *rt.pool);
          break;
        }
        case plan::kernel_kind::pad: {
          const ir::node& n = nodes[kn.node];
          strided<T> in[ir::max_inputs];
          for (int k = 0; k < n.n_inputs; ++k) in[k] = f.loc[n.inputs[k]];
          cpu::pad(in, n.n_inputs, f.loc[kn.node], static_cast<std::size_t>(n.desc.axis), n.desc.view_start, *rt.pool);
          break;
        }
        case plan::kernel_kind::custom: {
          const ir::node& n = nodes[kn.node];
          strided<T> in[ir::max_inputs];
          for (int q = 0; q < n.n_inputs; ++q) in[q] = f.loc[n.inputs[q]];
          run_custom(*n.desc.custom, in, n.n_inputs, f.loc[kn.node], *rt.pool);
          break;
        }
      }
    }
  }

  int epilogue_output(int group) const { return epilogue_output_of(plan, group); }

  // ---- steps shared with the CUDA host side (backend/cuda/generated_program.hpp) ----

  /// The materialised member of a matmul epilogue group (where the product is written in place).
  static int epilogue_output_of(const plan::plan_t<N>& p, int group) {
    for (std::size_t i = 0; i < N; ++i)
      if (p.group[i] == group && p.materialised[i]) return static_cast<int>(i);
    return -1;
  }

  /// Views (transpose, slice, reshape) take their input's memory with their own shape and strides,
  /// as ops/layout.hpp's apply() gives them on the static path.
  static void bind_views(const std::array<ir::node, N>& nodes, cpu::frame<T, N>& f,
                         const std::array<ir::node, N>& concrete) {
    for (std::size_t i = 0; i < N; ++i) {
      const ir::node& n = nodes[i];
      if (n.desc.kind != node_kind::view) continue;
      strided<T> s = f.loc[n.inputs[0]];
      if (n.desc.view_a >= 0) {
        std::swap(s.shape.extent[n.desc.view_a], s.shape.extent[n.desc.view_b]);
        std::swap(s.stride[n.desc.view_a], s.stride[n.desc.view_b]);
      } else if (n.desc.axis >= 0) {  // slice
        if (s.data) s.data += static_cast<std::ptrdiff_t>(n.desc.view_start) * s.stride[n.desc.axis];
        s.shape = concrete[i].desc.shape;
      } else {
        const dims to = concrete[i].desc.shape;
        strides_t st{};
        if (!view_strides(s.shape, s.stride, to, st)) ops::throw_not_a_view(s.shape, to);
        s.shape = to;
        s.stride = st;
      }
      f.loc[i] = s;
    }
  }

  /// {batch, M, N, K} of matmul node m at the call's extents.
  /// batch, M, N, K of matmul node m for the call's extents; a K that differs between the
  /// operands (possible only through views of `dyn` inputs, unchecked at capture) is an error.
  static std::array<std::size_t, 4> mm_sizes(const std::array<ir::node, N>& concrete, int m) {
    const dims& o = concrete[m].desc.shape;
    const dims& a = concrete[concrete[m].inputs[0]].desc.shape;
    const dims& b = concrete[concrete[m].inputs[1]].desc.shape;
    if (a.back(0) != b.back(1))
      FUSEBOX_THROW(shape_error("matmul: a is " + to_string(a) + ", b is " + to_string(b) + " for this call; need [.., M, K] x [.., K, N]",
                                std::source_location::current()));
    return {o.rank == 3 ? o.extent[0] : 1, o.back(1), o.back(0), a.back(0)};
  }

 private:
  /// The call's arguments for one generated kernel, in its local numbering.
  struct args_block {
    std::vector<void*> ptr;
    std::vector<std::ptrdiff_t> stride;
    std::vector<double> scalar;
    dims space{};
    kernel_args a{};
    void finish() {
      if (space.rank == 0) space = dims{1, {1}};  // as the generators render a rank-0 kernel (plan::at_least_rank1)
      a.ptr = ptr.data();
      a.stride = stride.data();
      a.space = space.extent.data();
      a.scalar = scalar.data();
      a.rank = space.rank;
    }
  };

  args_block make_args(const cpu::frame<T, N>& f, const plan::plan_t<N>& p, const std::array<ir::node, N>& concrete,
                       int k, const plan::kernel& kn) const {
    args_block b;
    const kernel_binary& bin = kernels[k];
    const std::size_t m = bin.locals.size();
    b.ptr.assign(m, nullptr);
    b.stride.assign(m * abi_max_rank, 0);
    b.scalar.assign(m, 0.0);
    b.space = plan::kernel_space(p, concrete, kn);
    for (std::size_t l = 0; l < m; ++l) {
      const int g = bin.locals[l];
      const ir::node& n = nodes[g];
      if (n.desc.kind == node_kind::scalar) {
        b.scalar[l] = static_cast<const scalar_leaf<T>*>(f.payload[n.payload_slot])->value;
        continue;
      }
      if (!f.loc[g].data) continue;  // a member computed in registers
      b.ptr[l] = f.loc[g].data;
      std::ptrdiff_t* st = &b.stride[l * abi_max_rank];
      // Reduced in this kernel: a column kernel's own node, or a row group's reductions. Another
      // kernel's reduction read here is an ordinary operand (a column sum of a column sum read
      // the first sum with its reduced axis' stride zeroed: only its first row).
      const bool reduced_here =
          n.desc.kind == node_kind::reduce &&
          (kn.kind == plan::kernel_kind::reduce_cols ? g == kn.node : (p.group[g] == kn.group && kn.group >= 0));
      if (reduced_here)
        cpu::reduced_space_strides(f.loc[g], b.space, static_cast<std::size_t>(n.desc.axis), n.desc.keepdim, st);
      else
        cpu::space_strides(f.loc[g], b.space, st);
    }
    // Dimensions every operand walks as one become one (locals without memory have stride 0 and
    // never stand in the way); the kernel reads the merged rank and extents.
    if (const int from = sched.kernels[k].merge_from; from >= 0)
      schedule::merge_dims(static_cast<std::size_t>(from), b.space, static_cast<int>(m),
                           [&](int l) { return &b.stride[static_cast<std::size_t>(l) * abi_max_rank]; });
    b.finish();
    return b;
  }

  void run_rows(cpu::frame<T, N>& f, const std::array<ir::node, N>& concrete, int k, const plan::kernel& kn,
                std::size_t scratch_stride, cpu::thread_pool& pool) const {
    args_block b = make_args(f, plan, concrete, k, kn);
    b.a.scratch = f.workspace;
    b.a.scratch_stride = scratch_stride;
    const dims space = b.space;
    if (space.size() == 0) return;
    const std::size_t rows = cpu::outer_size(space), width = space.back(0);
    const schedule::row_split rs = schedule::split_rows(width, kn.passes > 0, xsimd::batch<T>::size);
    b.a.stream = schedule::streams_output(rows * width * sizeof(T));
    const auto fn = reinterpret_cast<rows_fn>(kernels[k].fn);
    pool.parallel_for(rs.tasks(rows), [&](std::size_t t, unsigned worker) {
      const std::size_t rt = t / rs.col_blocks, cb = t % rs.col_blocks;
      const std::size_t r0 = rt * rs.rows_per_task, r1 = std::min(rows, r0 + rs.rows_per_task);
      fn(&b.a, r0, r1, cb * rs.col_block, std::min(width, (cb + 1) * rs.col_block), worker);
    });
  }

  void run_cols(cpu::frame<T, N>& f, const std::array<ir::node, N>& concrete, int k, const plan::kernel& kn,
                cpu::thread_pool& pool) const {
    args_block b = make_args(f, plan, concrete, k, kn);
    if (b.space.size() == 0) return;
    const std::size_t width = b.space.back(0), rows = cpu::outer_size(b.space);
    const std::size_t out_rows = rows / b.space.extent[nodes[kn.node].desc.axis];
    const schedule::column_split cs = schedule::split_columns(rows, width, out_rows, pool.size(), xsimd::batch<T>::size);
    const auto fn = reinterpret_cast<cols_fn>(kernels[k].fn);
    pool.parallel_for(cs.tasks(), [&](std::size_t t, unsigned) {
      const std::size_t c0 = t % cs.blocks * cs.block, o0 = t / cs.blocks * cs.chunk;
      fn(&b.a, o0, std::min(out_rows, o0 + cs.chunk), c0, std::min(width, c0 + cs.block));
    });
  }

  /// A spatial node on the host (backend/cpu/spatial.hpp), its epilogue generated like a matmul's.
  void run_spatial(cpu::frame<T, N>& f, const std::array<ir::node, N>& concrete, int k, const plan::kernel& kn,
                   cpu::thread_pool& pool, std::span<std::byte> ws) const {
    const ir::node& n = nodes[kn.node];
    const strided<T>& a = f.loc[n.inputs[0]];
    const strided<T>& b = n.n_inputs == 2 ? f.loc[n.inputs[1]] : a;
    if (kn.group < 0) {
      cpu::run_spatial(n.desc.win, a, b, f.loc[kn.node], pool, ws, cpu::no_spatial_epilogue{});
      return;
    }
    args_block args = make_args(f, plan, concrete, k, kn);
    const auto fn = reinterpret_cast<epilogue_fn>(kernels[k].fn);
    cpu::run_spatial(n.desc.win, a, b, f.loc[kn.node], pool, ws,
                     [&](std::size_t row, std::size_t j0, std::size_t cnt) { fn(&args.a, row, j0, cnt); });
  }

  void run_matmul(cpu::frame<T, N>& f, const std::array<ir::node, N>& concrete, int k, const plan::kernel& kn,
                  cpu::thread_pool& pool, std::span<std::byte> ws) const {
    const int m = kn.node;
    const strided<T>& A = f.loc[nodes[m].inputs[0]];
    const strided<T>& B = f.loc[nodes[m].inputs[1]];
    const strided<T>& C = f.loc[m];
    const auto s = mm_sizes(concrete, m);
    const std::size_t ra = A.shape.rank, rb = B.shape.rank;
    const cpu::matrix_view<T> av{A.data, A.stride[ra - 2], A.stride[ra - 1]};
    const cpu::matrix_view<T> bv{B.data, B.stride[rb - 2], B.stride[rb - 1]};
    const std::ptrdiff_t a_bs = ra == 3 && A.shape.extent[0] != 1 ? A.stride[0] : 0;
    const std::ptrdiff_t b_bs = rb == 3 && B.shape.extent[0] != 1 ? B.stride[0] : 0;
    const std::ptrdiff_t ldc = C.stride[C.shape.rank - 2];
    const std::ptrdiff_t c_bs = C.shape.rank == 3 ? C.stride[0] : 0;
    if (kn.group < 0) {
      cpu::gemm<T>(s[0], s[1], s[2], s[3], av, a_bs, bv, b_bs, C.data, ldc, c_bs, cpu::no_epilogue{}, pool, ws);
      return;
    }
    args_block b = make_args(f, plan, concrete, k, kn);
    const auto fn = reinterpret_cast<epilogue_fn>(kernels[k].fn);
    const std::size_t rows_per_batch = s[1];
    cpu::gemm<T>(s[0], s[1], s[2], s[3], av, a_bs, bv, b_bs, C.data, ldc, c_bs,
                 [&](std::size_t bi, std::size_t i, std::size_t j0, std::size_t n, T*) {
                   fn(&b.a, bi * rows_per_batch + i, j0, n);
                 },
                 pool, ws);
  }
};

#ifdef FUSEBOX_RUNTIME_INSTANCE  // compiled once where a program asks for it (core/linkage.hpp)
FUSEBOX_RUNTIME_INSTANCE struct program<float, 16>;
FUSEBOX_RUNTIME_INSTANCE struct program<float, 32>;
FUSEBOX_RUNTIME_INSTANCE struct program<float, 64>;
FUSEBOX_RUNTIME_INSTANCE struct program<float, 128>;
FUSEBOX_RUNTIME_INSTANCE struct program<double, 16>;
FUSEBOX_RUNTIME_INSTANCE struct program<double, 32>;
FUSEBOX_RUNTIME_INSTANCE struct program<double, 64>;
FUSEBOX_RUNTIME_INSTANCE struct program<double, 128>;
#endif

}  // namespace fusebox::jit
