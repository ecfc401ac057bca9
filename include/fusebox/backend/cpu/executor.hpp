// backend/cpu/executor.hpp: runs a plan on the CPU. One `program<T, Roots...>` per captured expression type:
// the plan is a constexpr member, and each kernel of it is instantiated from the node types with
// `if constexpr`, so loops see static trip counts where extents are static.
//
// Kernels (plan::kernel_kind):
//   rows         a fusion group over an index space [rows..., W]. Each row: reduction passes in
//                order (the row stays in L1/L2; costly shared nodes are kept in a per-thread row
//                scratch), per-row scalars between passes, then one output pass writing every
//                materialised member. Pure elementwise groups are the zero-pass case. Rows are
//                split over threads; each row is computed by one thread, so results do not depend
//                on the thread count.
//   reduce_cols  a reduction over a non-last axis, its producers fused: accumulates input rows
//                into output rows; threads split the last dimension.
//   matmul       cpu::gemm, with the epilogue group evaluated on each finished row run of C.
//   spatial      conv2d, pooling and their gradients (backend/cpu/spatial.hpp), with an epilogue as matmul's.
//   opaque       the user's function on a tensor view of its input (a graph break).
//   attention    attention() or one of its gradient kernels (backend/cpu/attention.hpp, by desc.variant).
//   pad          a slice's gradient: zeros around its operand (backend/cpu/attention.hpp's pad()).
//   gather       embedding() or its scatter-add gradient (backend/cpu/gather.hpp, by desc.variant).
//   custom       a custom op's own host kernel (expr/custom.hpp), e.g. cumsum.
//   copy         an output that is a leaf or a view.
// The vector body runs on xsimd batches and the tail on scalars through the same evaluator; inputs
// with an inner stride other than 0 or 1 take a scalar strided path.
// Under max_autotune (backend/cpu/autotune.hpp) a rows kernel's task size and thread count are timed
// choices, as gemm's and conv2d's are.
// Depends on: plan/planner.hpp, schedule/schedule.hpp, ir/graph.hpp, backend/cpu/{simd,thread_pool,gemm,autotune}.hpp, core/.
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "fusebox/backend/cpu/addressing.hpp"
#include "fusebox/backend/cpu/attention.hpp"
#include "fusebox/backend/cpu/autotune.hpp"
#include "fusebox/backend/cpu/gather.hpp"
#include "fusebox/backend/cpu/gemm.hpp"
#include "fusebox/backend/cpu/simd.hpp"
#include "fusebox/backend/cpu/spatial.hpp"
#include "fusebox/backend/cpu/spatial_epilogue.hpp"
#include "fusebox/backend/cpu/thread_pool.hpp"
#include "fusebox/core/errors.hpp"
#include "fusebox/core/tensor.hpp"
#include "fusebox/expr/custom.hpp"
#include "fusebox/expr/gather.hpp"
#include "fusebox/expr/spatial.hpp"
#include "fusebox/ir/graph.hpp"
#include "fusebox/ops/fast_math.hpp"
#include "fusebox/plan/planner.hpp"
#include "fusebox/profile.hpp"
#include "fusebox/schedule/schedule.hpp"

namespace fusebox::cpu {

/// The state of one call: where each node's memory is, and what the kernels may use.
template <class T, std::size_t N>
struct frame {
  std::array<strided<T>, N> loc{};
  std::array<storage_ptr, N> keep{};  // opaque results, alive for the call
  std::array<strided<T>, N> copy_to{};  // outputs that are a leaf, a view or an opaque result
  const void* payload[N > 0 ? N : 1]{};
  std::array<int, N> vn{};  // value numbers of this call (ir/value_numbers.hpp), where the plan has twins
  std::byte* arena = nullptr;
  std::byte* workspace = nullptr;  // row scratch for every thread, then the GEMM workspace
  std::size_t workspace_bytes = 0;
  std::byte* frozen = nullptr;  // options::freezing: the program's frozen region (frozen_offset); null: off
  thread_pool* pool = nullptr;
};

/// FastMath: pointwise ops evaluate ops::fast_math_t<Op> (options::fast_math given at build time,
/// ops/fast_math.hpp). `program<T, Roots...>` is the faithful one.
namespace detail {

/// A rows kernel's max_autotune choice: candidate 0 is the default (tasks of at least
/// min_task_elems elements on every thread); then one thread, and tasks four times as large,
/// where they differ from it.
struct rows_choice {
  bool serial = false;
  std::size_t task_scale = 1;
};

/// What tune_rows needs to know of a rows kernel: its program's nodes and groups (to name and
/// hash its fused ops), its group, element size and extents, and its task split.
struct rows_problem {
  const ir::node* nodes;
  const int* group;
  std::size_t n_nodes;
  int g;
  std::size_t elem_bytes, rows, width, col_blocks, per_task;
  int passes;
  bool contig;
};

/// `run_on(pool, rows per task)` of one rows kernel, by reference (two words, as task_ref). A
/// std::function here made every rows kernel of every program instantiate its manager, invoker
/// and the lambda's typeinfo name: ~1.5 KB of object code per kernel, 10% of an -O0 test unit's
/// (issue 22).
class rows_runner_ref {
public:
  template <class F>
  explicit rows_runner_ref(F& f) noexcept
      : obj_(std::addressof(f)), call_([](void* o, thread_pool& pool, std::size_t per_task) { (*static_cast<F*>(o))(pool, per_task); }) {}
  void operator()(thread_pool& pool, std::size_t per_task) const { call_(obj_, pool, per_task); }

private:
  void* obj_;
  void (*call_)(void*, thread_pool&, std::size_t);
};

/// Whether the memory one of `written` spans meets the memory one of `read` spans (each node's
/// [lowest, highest] element through its strides).
template <class T>
bool spans_meet(const strided<T>* loc, const int* written, int n_written, const int* read, int n_read) {
  auto span_of = [&](int id) {
    const strided<T>& v = loc[id];
    std::ptrdiff_t lo = 0, hi = 0;
    for (std::size_t d = 0; d < v.shape.rank; ++d) {
      const std::ptrdiff_t reach = static_cast<std::ptrdiff_t>(v.shape.extent[d] - 1) * v.stride[d];
      (reach < 0 ? lo : hi) += reach;
    }
    return std::pair{v.data + lo, v.data + hi + 1};
  };
  for (int q = 0; q < n_written; ++q)
    for (int e = 0; e < n_read; ++e) {
      const auto [w0, w1] = span_of(written[q]);
      const auto [r0, r1] = span_of(read[e]);
      if (w0 < r1 && r0 < w1) return true;
    }
  return false;
}

/// max_autotune's choice for one rows kernel: `run_on(pool, rows per task)` runs it. One function
/// for every kernel of every program (it was ~8 KB of object code per rows kernel; issue 22).
inline rows_choice tune_rows(const rows_problem& p, thread_pool& pool, rows_runner_ref run_on) {
  std::vector<rows_choice> cands{{}};
  const std::size_t tasks = (p.rows + p.per_task - 1) / p.per_task * p.col_blocks;
  if (pool.size() > 1 && tasks > 1) cands.push_back({true, 1});
  if (tasks > pool.size() && p.rows > p.per_task) cands.push_back({false, 4});
  std::uint64_t ops_hash = 1469598103934665603ull;  // which kernel: its fused ops, by name
  for (std::size_t i = 0; i < p.n_nodes; ++i)
    if (p.group[i] == p.g)
      for (const char* c = p.nodes[i].desc.name; *c; ++c) ops_hash = (ops_hash ^ static_cast<unsigned char>(*c)) * 1099511628211ull;
  autotune::problem_id id;
  id.v = {3, p.elem_bytes, ops_hash, p.rows, p.width, p.col_blocks, static_cast<std::uint64_t>(p.passes), pool.size(), p.contig};
  auto text = [&] {
    std::string ops;
    for (std::size_t i = 0; i < p.n_nodes; ++i)
      if (p.group[i] == p.g) ops += std::string(ops.empty() ? "" : ",") + p.nodes[i].desc.name;
    return std::string("rows ") + (p.elem_bytes == 4 ? "f32" : "f64") + " [" + std::to_string(p.rows) + ", " +
           std::to_string(p.width) + "] " + std::to_string(p.passes) + " passes (" + ops + ") threads " +
           std::to_string(pool.size()) + (p.contig ? "" : " strided");
  };
  const std::size_t pick = autotune::choose(id, cands.size(), text, [&] {
    std::vector<autotune::candidate> out;
    for (const rows_choice& c : cands)
      out.push_back({c.serial ? "1 thread" : c.task_scale > 1 ? "tasks 4x larger" : "default tasks",
                     [&run_on, &pool, c, per_task = p.per_task] {
                       run_on(c.serial ? autotune::serial_pool() : pool, per_task * c.task_scale);
                     }});
    return out;
  });
  return cands[pick];
}

}  // namespace detail

template <bool FastMath, class T, class... Roots>
struct basic_program {
  using graph = ir::graph<Roots...>;
  static constexpr std::size_t N = graph::size;
  static constexpr auto nodes = graph::nodes;
  static constexpr plan::plan_t<N> plan = plan::make_plan(graph::nodes, graph::outputs, sizeof(T), true);
  /// How the host runs each kernel (schedule/schedule.hpp): the same decisions as the run-time path's.
  static constexpr schedule::schedule_t<N> sched = schedule::make_schedule(nodes, plan, std::array<bool, N>{}, schedule::cpu_caps);
  using value_type = T;
  using frame_t = frame<T, N>;
  using V = vec<T>;
  static constexpr std::size_t VS = V::size;

  static constexpr bool all_static = [] {
    for (const auto& n : graph::nodes)
      if (!n.desc.shape.is_static()) return false;
    return true;
  }();

  /// Bytes of the intermediate arena: a constant of the expression type.
  static constexpr std::size_t arena_bytes = plan.arena_bytes;

  /// options::freezing: the bytes kernel k keeps between calls, made from a weight that is a
  /// tensor the model captures (a parameter, not an argument), at static extents. A conv2d forward
  /// by Winograd keeps its transformed weights (cpu::winograd::frozen_bytes); a matmul of one row
  /// whose B comes from the caches keeps B's column blocks packed for its GEMV
  /// (gemv_packed_bytes); nothing else keeps anything.
  static constexpr std::size_t frozen_bytes_of(int k) {
    const plan::kernel& kn = plan.kernels[k];
    if (kn.kind == plan::kernel_kind::matmul) {
      const ir::node& nd = nodes[kn.node];
      const ir::node &a = nodes[nd.inputs[0]], &b = nodes[nd.inputs[1]];
      if (b.desc.kind != node_kind::tensor || !nd.desc.shape.is_static() || !a.desc.shape.is_static() || b.desc.shape.rank != 2)
        return 0;
      const mm_sizes sz = matmul_sizes(kn.node, nd.desc.shape, a.desc.shape);
      if (sz.batch != 1 || sz.m != 1 || sz.k * sz.n * sizeof(T) > cpu::detail::gemm_config<T>::gemv_resident_bytes) return 0;
      return cpu::detail::round64(cpu::detail::gemv_packed_bytes<T>(sz.n, sz.k));
    }
    if (kn.kind != plan::kernel_kind::spatial) return 0;
    const ir::node& nd = nodes[kn.node];
    if (nd.desc.win.op != spatial_op::conv2d || nd.n_inputs != 2) return 0;
    const ir::node &x = nodes[nd.inputs[0]], &w = nodes[nd.inputs[1]];
    if (w.desc.kind != node_kind::tensor || !nd.desc.shape.is_static() || !x.desc.shape.is_static() ||
        !w.desc.shape.is_static())
      return 0;
    const auto g = cpu::detail::conv_geometry_of(nd.desc.win, x.desc.shape, w.desc.shape, nd.desc.shape);
    return cpu::detail::round64(winograd::frozen_bytes<T>(spatial_op::conv2d, g));
  }
  /// The frozen region: for each kernel the address of the weight its kept data was made from
  /// (n_kernels pointers, 64-byte rounded), then the kept data of each kernel that keeps some.
  static constexpr std::size_t frozen_offset(int k) {
    std::size_t at = cpu::detail::round64(static_cast<std::size_t>(plan.n_kernels) * sizeof(const void*));
    for (int q = 0; q < k; ++q) at += frozen_bytes_of(q);
    return at;
  }
  /// Bytes of the frozen region (0: no kernel keeps anything).
  static constexpr std::size_t frozen_bytes = [] {
    std::size_t kept = 0;
    for (int k = 0; k < plan.n_kernels; ++k) kept += frozen_bytes_of(k);
    return kept ? frozen_offset(plan.n_kernels) : 0;
  }();

  /// Bytes of per-call workspace for `threads` threads (row scratch + GEMM packing); `frozen`:
  /// the kernels that keep their weights (frozen_bytes_of) need no room to prepare them per call.
  static constexpr std::size_t workspace_bytes(unsigned threads, bool frozen = false) {
    std::size_t scratch = (plan.row_scratch_elems * sizeof(T) + 63) / 64 * 64 * threads;
    std::size_t g = 0;
    for (int k = 0; k < plan.n_kernels; ++k) {
      const auto& kn = plan.kernels[k];
      if (kn.kind != plan::kernel_kind::matmul || !nodes[kn.node].desc.shape.is_static()) continue;
      const auto [batch, m, n, kk] = matmul_sizes(kn.node, nodes[kn.node].desc.shape,
                                                  nodes[nodes[kn.node].inputs[0]].desc.shape);
      g = std::max(g, gemm_workspace_bytes<T>(batch, m, n, kk, threads));
    }
    for (int k = 0; k < plan.n_kernels; ++k) {
      const auto& kn = plan.kernels[k];
      if (kn.kind == plan::kernel_kind::spatial && nodes[kn.node].desc.shape.is_static())
        g = std::max(g, spatial_workspace_bytes<T>(nodes[kn.node].desc.win, nodes[nodes[kn.node].inputs[0]].desc.shape,
                                                   spatial_operand_b(nodes, kn.node), nodes[kn.node].desc.shape, threads,
                                                   frozen && frozen_bytes_of(k) > 0));
    }
    return scratch + g;
  }

  /// Shape of a spatial node's second operand (rank 0 when it has one).
  static constexpr dims spatial_operand_b(const std::array<ir::node, N>& ns, int i) {
    return ns[i].n_inputs == 2 ? ns[ns[i].inputs[1]].desc.shape : dims{};
  }

  /// Run-time workspace size (for dyn extents the static answer is not known).
  static std::size_t workspace_bytes(unsigned threads, const frame_t& f) {
    std::size_t scratch = 0;
    for (int k = 0; k < plan.n_kernels; ++k)
      if (plan.kernels[k].kind == plan::kernel_kind::rows)
        scratch = std::max(scratch, static_cast<std::size_t>(plan.kernels[k].cached) *
                                        space_of(k, f).back(0) * sizeof(T));
    scratch = (scratch + 63) / 64 * 64 * threads;
    std::size_t g = 0;
    for (int k = 0; k < plan.n_kernels; ++k) {
      const auto& kn = plan.kernels[k];
      if (kn.kind != plan::kernel_kind::matmul) continue;
      const auto [batch, m, n, kk] = matmul_sizes(kn.node, f.loc[kn.node].shape, f.loc[nodes[kn.node].inputs[0]].shape);
      g = std::max(g, gemm_workspace_bytes<T>(batch, m, n, kk, threads));
    }
    for (int k = 0; k < plan.n_kernels; ++k) {
      const auto& kn = plan.kernels[k];
      if (kn.kind != plan::kernel_kind::spatial) continue;
      const int i = kn.node;
      g = std::max(g, spatial_workspace_bytes<T>(nodes[i].desc.win, f.loc[nodes[i].inputs[0]].shape,
                                                 nodes[i].n_inputs == 2 ? f.loc[nodes[i].inputs[1]].shape : dims{},
                                                 f.loc[i].shape, threads));
    }
    return scratch + g;
  }

  // ------------------------------------------------------------------------------------------
  // Set-up: node memory

  /// Points every materialised node at its memory. Inputs and outputs must already be set.
  static void bind_intermediates(frame_t& f) {
    for (std::size_t i = 0; i < N; ++i) {
      if (plan.offset[i] != plan::no_offset) {
        f.loc[i].data = reinterpret_cast<T*>(f.arena + plan.offset[i]);
        f.loc[i].shape = nodes[i].desc.shape;
        f.loc[i].stride = contiguous_strides(nodes[i].desc.shape);
      }
    }
    // A matmul or spatial node fused into an epilogue writes into the epilogue's output.
    for (int k = 0; k < plan.n_kernels; ++k) {
      const auto& kn = plan.kernels[k];
      if ((kn.kind == plan::kernel_kind::matmul || kn.kind == plan::kernel_kind::spatial) && kn.group >= 0)
        f.loc[kn.node] = f.loc[epilogue_output(kn.group)];
    }
    bind_views(f);
  }

  static void bind_views(frame_t& f) {
    [&]<std::size_t... I>(std::index_sequence<I...>) {
      ((nodes[I].desc.kind == node_kind::view ? bind_view<I>(f) : void()), ...);
    }(std::make_index_sequence<N>{});
  }
  template <std::size_t I>
  static void bind_view(frame_t& f) {
    if constexpr (nodes[I].desc.kind == node_kind::view) {
      using E = typename graph::template type_of<I>;
      f.loc[I] = E::view::apply(f.loc[nodes[I].inputs[0]]);
    }
  }

  /// Resolved extents of the intermediate nodes for graphs with dyn extents (eager on dyn tensors).
  static void resolve_shapes(frame_t& f) {
    if constexpr (!all_static) {
      for (std::size_t i = 0; i < N; ++i) {
        const auto& nd = nodes[i];
        if (ir::is_leaf_kind(nd.desc.kind) || f.loc[i].data) continue;
        dims s{};
        switch (nd.desc.kind) {
          case node_kind::pointwise:
            for (int k = 0; k < nd.n_inputs; ++k) s = broadcast(s, shape_at(f, nd.inputs[k])).out;
            break;
          case node_kind::reduce:
            s = fusebox::detail::reduced_shape(shape_at(f, nd.inputs[0]), nd.desc.axis, nd.desc.keepdim);
            break;
          case node_kind::matmul:
            s = fusebox::detail::matmul_shape(shape_at(f, nd.inputs[0]), shape_at(f, nd.inputs[1])).out;
            break;
          case node_kind::attention:
            s = fusebox::detail::attention_shape(shape_at(f, nd.inputs[0]), shape_at(f, nd.inputs[1]),
                                                 shape_at(f, nd.inputs[2]), nd.desc.causal)
                    .out;
            break;
          case node_kind::spatial:
            s = fusebox::detail::spatial_shape(nd.desc.win, shape_at(f, nd.inputs[0]),
                                               nd.n_inputs == 2 ? shape_at(f, nd.inputs[1]) : dims{})
                    .out;
            break;
          case node_kind::gather:
            s = fusebox::detail::gather_shape(nd.desc.variant, nd.desc.vocab, shape_at(f, nd.inputs[0]),
                                              shape_at(f, nd.inputs[1]))
                    .out;
            break;
          case node_kind::custom: {
            dims ins[ir::max_inputs];
            for (int k = 0; k < nd.n_inputs; ++k) ins[k] = shape_at(f, nd.inputs[k]);
            s = nd.desc.custom->shape(ins, nd.n_inputs).out;
            break;
          }
          default:
            s = nd.desc.shape;
        }
        f.loc[i].shape = s;
      }
    }
  }
  static dims shape_at(const frame_t& f, int i) {
    return nodes[i].desc.kind == node_kind::scalar ? dims{} : f.loc[i].shape;
  }

  static constexpr int epilogue_output(int group) {
    for (std::size_t i = 0; i < N; ++i)
      if (plan.group[i] == group && plan.materialised[i]) return static_cast<int>(i);
    return -1;
  }

  static dims space_of(int k, const frame_t& f) {
    if constexpr (all_static) return plan.kernels[k].space;
    const auto& kn = plan.kernels[k];
    switch (kn.kind) {
      case plan::kernel_kind::rows:
        for (std::size_t i = 0; i < N; ++i)
          if (plan.group[i] == kn.group) {
            if (nodes[i].desc.kind == node_kind::reduce) return shape_at(f, nodes[i].inputs[0]);
            if (nodes[i].desc.shape.rank == kn.space.rank && !plan.row_constant[i]) return f.loc[i].shape;
          }
        return kn.space;
      case plan::kernel_kind::reduce_cols: return shape_at(f, nodes[kn.node].inputs[0]);
      default: return f.loc[kn.node].shape;
    }
  }

  // ------------------------------------------------------------------------------------------
  // Value twins: one value computed once (plan step 5)

  static constexpr bool has_twins = [] {
    for (std::size_t i = 0; i < N; ++i)
      if (plan.same_as[i] >= 0) return true;
    return false;
  }();

  /// Numbers this call's values; run after the payloads and inputs are bound.
  static void number_values(frame_t& f) {
    if constexpr (has_twins) ir::number_values(nodes, f.payload, f.loc.data(), f.vn);
  }

  /// Kernel K's twins are their firsts' values in this call (the case its plan is made for).
  template <int K>
  static bool twins_equal(const frame_t& f) {
    static constexpr id_list twins = [] {
      id_list l{};
      for (std::size_t i = 0; i < N; ++i)
        if (plan.kernel_of[i] == K && plan.same_as[i] >= 0) l.id[l.size++] = static_cast<int>(i);
      return l;
    }();
    for (int q = 0; q < twins.size; ++q)
      if (f.vn[twins.id[q]] != f.vn[plan.same_as[twins.id[q]]]) return false;
    return true;
  }

  /// A skippable kernel whose products are earlier values: they point there instead.
  template <int K>
  static void take_twins(frame_t& f) {
    for (std::size_t i = 0; i < N; ++i)
      if (plan.kernel_of[i] == K && plan.same_as[i] >= 0) {
        f.loc[i] = f.loc[plan.same_as[i]];
        f.keep[i] = f.keep[plan.same_as[i]];
      }
    bind_views(f);
  }

  // ------------------------------------------------------------------------------------------
  // Running

  static void run(frame_t& f) {
    [&]<int... K>(std::integer_sequence<int, K...>) {
      (run_kernel<K>(f), ...);
    }(std::make_integer_sequence<int, plan.n_kernels>{});
  }

  template <int K>
  static void run_kernel(frame_t& f) {
    constexpr plan::kernel kn = plan.kernels[K];
    if constexpr (kn.skippable) {  // no span: nothing runs
      if (twins_equal<K>(f)) return take_twins<K>(f);
    }
    profile::scoped_span span(plan::name(kn.kind), "kernel");
    if constexpr (kn.kind == plan::kernel_kind::rows) run_rows<K>(f);
    else if constexpr (kn.kind == plan::kernel_kind::reduce_cols) run_reduce_cols<K>(f);
    else if constexpr (kn.kind == plan::kernel_kind::matmul) run_matmul<K>(f);
    else if constexpr (kn.kind == plan::kernel_kind::opaque) run_opaque<K>(f);
    else if constexpr (kn.kind == plan::kernel_kind::attention) run_attention<K>(f);
    else if constexpr (kn.kind == plan::kernel_kind::spatial) run_spatial<K>(f);
    else if constexpr (kn.kind == plan::kernel_kind::pad) run_pad<K>(f);
    else if constexpr (kn.kind == plan::kernel_kind::gather) {
      constexpr int I = kn.node;
      cpu::run_gather(nodes[I].desc, f.loc[nodes[I].inputs[0]], f.loc[nodes[I].inputs[1]], f.loc[I], *f.pool);
    }
    else if constexpr (kn.kind == plan::kernel_kind::custom) {
      constexpr int I = kn.node;
      strided<T> in[ir::max_inputs];
      for (int q = 0; q < nodes[I].n_inputs; ++q) in[q] = f.loc[nodes[I].inputs[q]];
      run_custom(*nodes[I].desc.custom, in, nodes[I].n_inputs, f.loc[I], *f.pool);
    }
    else run_copy<K>(f);
  }

  // ---- group membership, as constexpr lists ----

  struct id_list {
    std::array<int, N> id{};
    int size = 0;
  };
  /// Nodes a group reads from memory (all but scalars, which come from the payload table).
  static constexpr id_list external_inputs(int group) {
    id_list l{};
    std::array<bool, N> seen{};
    for (std::size_t i = 0; i < N; ++i) {
      if (plan.group[i] != group) continue;
      for (int k = 0; k < nodes[i].n_inputs; ++k) {
        const int in = nodes[i].inputs[k];
        if (plan.group[in] == group || seen[in] || nodes[in].desc.kind == node_kind::scalar) continue;
        seen[in] = true;
        l.id[l.size++] = in;
      }
    }
    return l;
  }
  /// Materialised members: full-width ones are written in the output pass, the others per row.
  static constexpr id_list group_outputs(int group, bool full_width) {
    id_list l{};
    for (std::size_t i = 0; i < N; ++i)
      if (plan.group[i] == group && plan.materialised[i] &&
          full_width == (nodes[i].desc.kind == node_kind::pointwise && !plan.row_constant[i]))
        l.id[l.size++] = static_cast<int>(i);
    return l;
  }
  /// Reductions and per-row scalars, in the order a row computes them.
  static constexpr id_list row_steps(int group) {
    id_list l{};
    for (std::size_t i = 0; i < N; ++i)
      if (plan.group[i] == group && (nodes[i].desc.kind == node_kind::reduce || plan.row_constant[i]))
        l.id[l.size++] = static_cast<int>(i);
    return l;
  }

  // ---- per-row addressing ----

  struct row_addressing {
    const T* base[N]{};
    std::ptrdiff_t stride[N][max_rank]{};
    const T* ptr[N]{};
    std::ptrdiff_t inner[N]{};
    // The coordinates of the row last addressed. Kernels mostly address rows in order (a pooled
    // plane, a convolved image, a row-wise kernel's rows), and the next row's coordinates are
    // then a carry away (or, for another run of the same row, nothing); the divisions by run-time
    // extents (three for a 4-d output, ~25 cycles each) were most of an epilogue call on T2's
    // short convolution rows.
    std::size_t coord[max_rank]{};
    std::size_t last_row = static_cast<std::size_t>(-1);
    void at_row(const dims& space, std::size_t row, const int* ids, int n) {
      if (row == last_row) {
        // another run of the same row: the same coordinates
      } else if (row == last_row + 1 && last_row != static_cast<std::size_t>(-1)) {
        for (std::size_t d = space.rank - 1; d-- > 0;) {
          if (++coord[d] < space.extent[d]) break;
          coord[d] = 0;
        }
      } else {
        std::size_t rest = row;
        for (std::size_t d = space.rank - 1; d-- > 0;) {
          coord[d] = rest % space.extent[d];
          rest /= space.extent[d];
        }
      }
      last_row = row;
      for (int q = 0; q < n; ++q) {
        const int id = ids[q];
        std::ptrdiff_t o = 0;
        for (std::size_t d = 0; d + 1 < space.rank; ++d) o += static_cast<std::ptrdiff_t>(coord[d]) * stride[id][d];
        ptr[id] = base[id] + o;
      }
    }
  };

  /// The addressing an epilogue (matmul's, a spatial node's) works in, one per thread. Copying it
  /// (~90 bytes per node of the whole program) on every call was 10% of T2's training step (up to
  /// 65536 calls a step) and 6% of T1's (a matmul epilogue runs once per row run of C). So each
  /// thread copies `proto` once per kernel call, the first time it runs that call's epilogue, and
  /// at_row then updates it in place. `call` is the kernel call's number (next_kernel_call()).
  static row_addressing& thread_addressing(const row_addressing& proto, std::uint64_t call) {
    thread_local row_addressing ra;
    thread_local std::uint64_t filled_for = 0;
    if (filled_for != call) {
      ra = proto;
      filled_for = call;
    }
    return ra;
  }
  static std::uint64_t next_kernel_call() {
    static std::atomic<std::uint64_t> calls{0};
    return calls.fetch_add(1, std::memory_order_relaxed) + 1;
  }

  /// schedule::merge_dims over the operands `ids` of `a` (schedule/merge_dims.hpp). The evaluator
  /// reads an operand whose static last extent is 1 as constant along the row; its stride there is
  /// 0, so it merges only with dimensions it is also constant along, and stays constant along the
  /// merged row.
  static void merge_dims_from(std::size_t first, dims& space, row_addressing& a, const int* ids, int n) {
    schedule::merge_dims(first, space, n, [&](int q) { return a.stride[ids[q]]; });
  }

  // Kernel K's group and passes as class-scope constants: generic lambdas below name them in
  // template arguments, and GCC 13 crashes (ICE in tsubst_copy) on a function-local constexpr
  // kernel there (seen on the GPU machine's g++ 13.3).
  template <int K>
  static constexpr int group_of = plan.kernels[K].group;
  template <int K>
  static constexpr int passes_of = plan.kernels[K].passes;

  // ---- the evaluator: one node's value at column j of the current row ----

  /// Merged: the group's twins are their firsts' values in this call (a template argument, so
  /// the loops test nothing per element; kernels without twins have only the merged form). When
  /// not (a group with twins only), every member is computed where it is read and the scratch is
  /// not used: the cache was planned for the merged case.
  template <int Group, int Pass, class W, bool Contig, bool Merged = true>
  struct evaluator {
    const row_addressing& a;
    const T* rs;       // per-row scalars by node id
    T* scratch;        // this thread's row scratch
    std::size_t width;
    const void* const* payload;
    std::size_t j;

    template <int Id>
    W get() const {
      constexpr auto nd = nodes[Id];
      if constexpr (nd.desc.kind == node_kind::scalar) {
        return W(static_cast<const scalar_leaf<T>*>(payload[nd.payload_slot])->value);
      } else if constexpr (Group >= 0 && plan.group[Id] == Group) {
        constexpr bool twins = plan.kernels[plan.kernel_of[Id]].twins;
        if constexpr (nd.desc.kind == node_kind::reduce || plan.row_constant[Id]) {
          return W(rs[Id]);  // a twin's step copied its first's
        } else if constexpr (twins && plan.same_as[Id] >= 0) {
          if constexpr (Merged) return get<plan.same_as[Id]>();
          else return compute<Id>();
        } else if constexpr (sched.keep_in[Id] == schedule::keep::scratch && plan.pass[Id] < Pass) {
          if constexpr (twins && !Merged) return compute<Id>();
          else return load_v<W>(scratch + plan.cache_slot[Id] * width + j);
        } else if constexpr (sched.keep_in[Id] == schedule::keep::scratch) {
          static_assert(plan.pass[Id] == Pass, "fusebox internal: a cached node is read before its pass");
          if constexpr (twins && !Merged) return compute<Id>();
          const W v = compute<Id>();
          store_v(scratch + plan.cache_slot[Id] * width + j, v);
          return v;
        } else {
          return compute<Id>();
        }
      } else if constexpr (Contig) {
        const T* p = a.ptr[Id];
        // Broadcast along the row is known from the static shape; a static extent above 1 means
        // the inner stride is 1 here (the caller checked), so the load needs no branch.
        if constexpr (nd.desc.shape.back(0) == 1) return W(*p);
        else if constexpr (nd.desc.shape.back(0) != dyn) return load_v<W>(p + j);
        else return a.inner[Id] == 0 ? W(*p) : load_v<W>(p + j);
      } else {
        return load_strided_v<W>(a.ptr[Id] + static_cast<std::ptrdiff_t>(j) * a.inner[Id], a.inner[Id]);
      }
    }

    template <int Id>
    W compute() const {
      using E = typename graph::template type_of<Id>;
      using Op = ops::math_op_t<FastMath, typename E::op>;
      constexpr auto nd = nodes[Id];
      if constexpr (nd.n_inputs == 1) return Op::apply(get<nd.inputs[0]>());
      else if constexpr (nd.n_inputs == 2) return Op::apply(get<nd.inputs[0]>(), get<nd.inputs[1]>());
      else return Op::apply(get<nd.inputs[0]>(), get<nd.inputs[1]>(), get<nd.inputs[2]>());
    }
  };

  // ---- rows ----

  template <int K>
  static void run_rows(frame_t& f) {
    constexpr plan::kernel kn = plan.kernels[K];
    constexpr int G = kn.group;
    // A rank-0 space (pointwise ops of rank-0 values: two means added, a loss's gradient seed) is
    // one row of one element; the row addressing below needs a last dimension.
    dims space = [&] {
      const dims s = space_of(K, f);
      return s.rank == 0 ? dims{1, {1}} : s;
    }();
    if (space.size() == 0) return;
    static constexpr id_list ext = external_inputs(G);
    static constexpr id_list outs = group_outputs(G, true);
    static constexpr id_list souts = group_outputs(G, false);

    row_addressing proto;
    bool contig = true;
    auto bind = [&](int id, bool written) {
      proto.base[id] = f.loc[id].data;
      space_strides(f.loc[id], space, proto.stride[id]);
      proto.inner[id] = proto.stride[id][space.rank - 1];
      if (written ? proto.inner[id] != 1 && space.back(0) != 1 : proto.inner[id] > 1 || proto.inner[id] < 0)
        contig = false;
    };
    for (int q = 0; q < ext.size; ++q) bind(ext.id[q], false);
    for (int q = 0; q < outs.size; ++q) bind(outs.id[q], true);
    for (int q = 0; q < souts.size; ++q) {
      const int id = souts.id[q];
      if (nodes[id].desc.kind == node_kind::reduce) {
        proto.base[id] = f.loc[id].data;
        reduced_space_strides(f.loc[id], space, space.rank - 1, nodes[id].desc.keepdim, proto.stride[id]);
        proto.inner[id] = 0;
      } else {
        bind(id, false);
      }
    }
    constexpr auto all_ids = [] {
      std::array<int, N> ids{};
      int c = 0;
      for (int q = 0; q < ext.size; ++q) ids[c++] = ext.id[q];
      for (int q = 0; q < outs.size; ++q) ids[c++] = outs.id[q];
      for (int q = 0; q < souts.size; ++q) ids[c++] = souts.id[q];
      return std::pair{ids, c};
    }();
    // A group with nothing per row (no reduction, no row-constant value) is elementwise: its
    // dimensions merge wherever every operand allows, so that short rows ([128, 64, 4, 4] is 32768
    // rows of 4) become a few long ones and the addressing is paid per row, not per 4 elements.
    if constexpr (sched.kernels[K].merge_from >= 0)
      merge_dims_from(sched.kernels[K].merge_from, space, proto, all_ids.first.data(), all_ids.second);

    const std::size_t rows = outer_size(space);
    const std::size_t width = space.back(0);
    // Pure elementwise groups may also split a row; reductions keep a row whole.
    const schedule::row_split split = schedule::split_rows(width, kn.passes > 0, VS);
    const std::size_t col_block = split.col_block, col_blocks = split.col_blocks;
    std::size_t rows_per_task = split.rows_per_task;
    const bool merged = !kn.twins || twins_equal<K>(f);
    const bool stream = contig && schedule::streams_output(rows * width * sizeof(T));
    auto task = [&](std::size_t t, unsigned worker) {
      row_addressing a = proto;
      T* scratch = reinterpret_cast<T*>(f.workspace + worker * workspace_row_scratch_stride(f));
      const std::size_t rt = t / col_blocks, cb = t % col_blocks;
      const std::size_t r0 = rt * rows_per_task, r1 = std::min(rows, r0 + rows_per_task);
      const std::size_t c0 = cb * col_block, c1 = std::min(width, c0 + col_block);
      for (std::size_t r = r0; r < r1; ++r) {
        a.at_row(space, r, all_ids.first.data(), all_ids.second);
        // plan.kernels[K], not the local kn: nvcc refuses a lambda's read of an enclosing
        // constexpr local in a constant expression ("attempt to access run-time storage").
        if constexpr (plan.kernels[K].twins) {
          if (contig && merged) row<K, true, true>(a, f, scratch, c0, c1, width, stream);
          else if (contig) row<K, true, false>(a, f, scratch, c0, c1, width, stream);
          else if (merged) row<K, false, true>(a, f, scratch, c0, c1, width, stream);
          else row<K, false, false>(a, f, scratch, c0, c1, width, stream);
        } else {
          if (contig) row<K, true, true>(a, f, scratch, c0, c1, width, stream);
          else row<K, false, true>(a, f, scratch, c0, c1, width, stream);
        }
      }
    };
    auto run_on = [&](thread_pool& pool, std::size_t per_task) {
      rows_per_task = per_task;
      pool.parallel_for((rows + per_task - 1) / per_task * col_blocks, task);
    };
    if (autotune::active()) [[unlikely]] {
      const rows_choice c = tuned_rows<K>(f, rows, width, col_blocks, rows_per_task, contig, run_on);
      return run_on(c.serial ? autotune::serial_pool() : *f.pool, rows_per_task * c.task_scale);
    }
    run_on(*f.pool, rows_per_task);
  }

  using rows_choice = detail::rows_choice;
  /// max_autotune's choice for a rows kernel (detail::tune_rows). A kernel that writes memory it
  /// also reads (a caller's output that is an input) is not timed: a candidate run would read its
  /// own results. Only the overlap check depends on the program; the rest is compiled once.
  template <int K, class RunOn>
  static rows_choice tuned_rows(const frame_t& f, std::size_t rows, std::size_t width, std::size_t col_blocks,
                                std::size_t per_task, bool contig, RunOn& run_on) {
    constexpr int G = plan.kernels[K].group;
    static constexpr id_list ext = external_inputs(G);
    static constexpr id_list outs = group_outputs(G, true);
    static constexpr id_list souts = group_outputs(G, false);
    if (detail::spans_meet(f.loc.data(), outs.id.data(), outs.size, ext.id.data(), ext.size) ||
        detail::spans_meet(f.loc.data(), souts.id.data(), souts.size, ext.id.data(), ext.size))
      return {};
    const detail::rows_problem p{nodes.data(), plan.group.data(), N,        G,     sizeof(T), rows,
                                 width,        col_blocks,        per_task, plan.kernels[K].passes, contig};
    return detail::tune_rows(p, *f.pool, detail::rows_runner_ref(run_on));
  }

  static std::size_t workspace_row_scratch_stride(const frame_t&) {
    return (plan.row_scratch_elems * sizeof(T) + 63) / 64 * 64;
  }

  /// One row of a rows kernel over columns [c0, c1) (the whole row when it has passes).
  template <int K, bool Contig, bool Merged>
  static void row(const row_addressing& a, const frame_t& f, T* scratch, std::size_t c0, std::size_t c1,
                  std::size_t width, bool stream) {
    constexpr plan::kernel kn = plan.kernels[K];
    constexpr int G = kn.group;
    static constexpr id_list steps = row_steps(G);
    T rs[N > 0 ? N : 1];
    // Reductions and per-row scalars, in order.
    [&]<int... S>(std::integer_sequence<int, S...>) {
      (step<G, steps.id[S], Contig, Merged>(a, f, rs, scratch, width), ...);
    }(std::make_integer_sequence<int, steps.size>{});
    // Output pass.
    static constexpr id_list outs = group_outputs(G, true);
    static constexpr id_list souts = group_outputs(G, false);
    if constexpr (outs.size > 0) {
      auto write = [&]<class W>(std::size_t j) {
        evaluator<group_of<K>, passes_of<K>, W, Contig, Merged> e{a, rs, scratch, width, f.payload, j};
        [&]<int... O>(std::integer_sequence<int, O...>) {
          ((Contig ? store_out_v(stream, const_cast<T*>(a.ptr[outs.id[O]]) + j, e.template get<outs.id[O]>())
                   : store_v(const_cast<T*>(a.ptr[outs.id[O]]) + static_cast<std::ptrdiff_t>(j) * a.inner[outs.id[O]],
                           e.template get<outs.id[O]>())),
           ...);
        }(std::make_integer_sequence<int, outs.size>{});
      };
      std::size_t j = c0;
      if constexpr (Contig)
        for (; j + VS <= c1; j += VS) write.template operator()<V>(j);
      for (; j < c1; ++j) write.template operator()<T>(j);
      if (stream) stream_fence();
    }
    [&]<int... O>(std::integer_sequence<int, O...>) {
      ((*const_cast<T*>(a.ptr[souts.id[O]]) = rs[souts.id[O]]), ...);
    }(std::make_integer_sequence<int, souts.size>{});
  }

  /// A reduction pass over the row, or a per-row scalar.
  template <int G, int Id, bool Contig, bool Merged>
  static void step(const row_addressing& a, const frame_t& f, T* rs, T* scratch, std::size_t width) {
    constexpr auto nd = nodes[Id];
    if constexpr (plan.kernels[plan.kernel_of[Id]].twins && plan.same_as[Id] >= 0) {
      if constexpr (Merged) {  // its first's pass or step came earlier in this row
        rs[Id] = rs[plan.same_as[Id]];
        return;
      }
    }
    if constexpr (nd.desc.kind == node_kind::reduce) {
      using Op = typename graph::template type_of<Id>::op;
      constexpr int in = nd.inputs[0];
      constexpr int P = plan.pass[Id];
      auto at = [&]<class W>(std::size_t j) {
        return evaluator<G, P, W, Contig, Merged>{a, rs, scratch, width, f.payload, j}.template get<in>();
      };
      std::size_t j = 0;
      T total = Op::template identity<T>();
      if constexpr (Contig) {
        // Four accumulators hide the latency of the combine.
        V acc0 = Op::template identity<V>(), acc1 = acc0, acc2 = acc0, acc3 = acc0;
        for (; j + 4 * VS <= width; j += 4 * VS) {
          acc0 = Op::combine(acc0, at.template operator()<V>(j));
          acc1 = Op::combine(acc1, at.template operator()<V>(j + VS));
          acc2 = Op::combine(acc2, at.template operator()<V>(j + 2 * VS));
          acc3 = Op::combine(acc3, at.template operator()<V>(j + 3 * VS));
        }
        for (; j + VS <= width; j += VS) acc0 = Op::combine(acc0, at.template operator()<V>(j));
        total = Op::horizontal(Op::combine(Op::combine(acc0, acc1), Op::combine(acc2, acc3)));
      }
      for (; j < width; ++j) total = Op::combine(total, at.template operator()<T>(j));
      rs[Id] = Op::finalize(total, width);
    } else {
      rs[Id] = evaluator<G, 0, T, Contig, Merged>{a, rs, scratch, width, f.payload, 0}.template compute<Id>();
    }
  }

  // ---- reduce over a non-last axis ----

  template <int K>
  static void run_reduce_cols(frame_t& f) {
    constexpr plan::kernel kn = plan.kernels[K];
    constexpr int G = kn.group, R = kn.node;
    using Op = typename graph::template type_of<R>::op;
    dims space = space_of(K, f);
    if (space.size() == 0) return;
    static constexpr id_list ext = external_inputs(G);
    const std::size_t axis = static_cast<std::size_t>(nodes[R].desc.axis);
    row_addressing proto;
    bool contig = true;
    for (int q = 0; q < ext.size; ++q) {
      const int id = ext.id[q];
      proto.base[id] = f.loc[id].data;
      space_strides(f.loc[id], space, proto.stride[id]);
      proto.inner[id] = proto.stride[id][space.rank - 1];
      if (proto.inner[id] > 1 || proto.inner[id] < 0) contig = false;
    }
    // The output, addressed in the input's space: its reduced axis has stride 0.
    const strided<T>& out = f.loc[R];
    proto.base[R] = out.data;
    reduced_space_strides(out, space, axis, nodes[R].desc.keepdim, proto.stride[R]);
    proto.inner[R] = proto.stride[R][space.rank - 1];
    if (proto.inner[R] != 1) contig = false;
    // Producers fused into the reduction that another kernel also reads are written here, in the
    // accumulation pass over the input rows.
    static constexpr id_list members_out = group_outputs(G, true);
    for (int q = 0; q < members_out.size; ++q) {
      const int id = members_out.id[q];
      proto.base[id] = f.loc[id].data;
      space_strides(f.loc[id], space, proto.stride[id]);
      proto.inner[id] = proto.stride[id][space.rank - 1];
      if (proto.inner[id] != 1) contig = false;
    }
    constexpr auto ids = [] {
      std::array<int, 2 * N + 1> l{};
      for (int q = 0; q < ext.size; ++q) l[q] = ext.id[q];
      l[ext.size] = R;
      for (int q = 0; q < members_out.size; ++q) l[ext.size + 1 + q] = members_out.id[q];
      return l;
    }();
    constexpr int n_ids = ext.size + 1 + members_out.size;
    if constexpr (sched.kernels[K].merge_from >= 0) merge_dims_from(sched.kernels[K].merge_from, space, proto, ids.data(), n_ids);
    const std::size_t rows = outer_size(space), width = space.back(0);
    const std::size_t count = space.extent[axis];
    // Input rows that differ only along the reduced axis share one output row: input row
    // (o, a, i) of [outer, count, inner_rows] adds into output row (o, i).
    std::size_t inner_rows = 1;
    for (std::size_t d = axis + 1; d + 1 < space.rank; ++d) inner_rows *= space.extent[d];
    const std::size_t out_rows = rows / count;
    // Tasks split the columns, and the output rows too when there are too few columns to go
    // round (T2's conv 2: [128, 64, 64] summed over the batch is one block of 64 columns).
    // Every task owns its output elements, so no two tasks add into one.
    const schedule::column_split split = schedule::split_columns(rows, width, out_rows, f.pool->size(), VS);
    const std::size_t block = split.block, blocks = split.blocks, chunk = split.chunk, row_chunks = split.row_chunks;
    auto task = [&](std::size_t t, unsigned) {
      row_addressing a = proto;
      const std::size_t c0 = t % blocks * block, c1 = std::min(width, c0 + block);
      const std::size_t o0 = t / blocks * chunk, o1 = std::min(out_rows, o0 + chunk);
      // The input row of output row o at coordinate k along the axis.
      auto input_row = [&](std::size_t o, std::size_t k) { return ((o / inner_rows) * count + k) * inner_rows + o % inner_rows; };
      // Identity first, over every output row this task owns.
      for (std::size_t o = o0; o < o1; ++o) {
        a.at_row(space, input_row(o, 0), ids.data(), n_ids);
        T* out = const_cast<T*>(a.ptr[R]);
        for (std::size_t j = c0; j < c1; ++j) out[static_cast<std::ptrdiff_t>(j) * a.inner[R]] = Op::template identity<T>();
      }
      // Then along the axis, a slice of output rows at a time: consecutive input rows within a
      // slice, so the addressing mostly carries.
      for (std::size_t k = 0; k < count; ++k) {
        for (std::size_t o = o0; o < o1; ++o) {
          a.at_row(space, input_row(o, k), ids.data(), n_ids);
          T* out = const_cast<T*>(a.ptr[R]);
          auto acc = [&]<class W, bool C>(std::size_t j) {
            const evaluator<group_of<K>, 0, W, C> e{a, nullptr, nullptr, width, f.payload, j};
            const W v = e.template get<nodes[R].inputs[0]>();
            if constexpr (C) store_v(out + j, Op::combine(load_v<W>(out + j), v));
            else out[static_cast<std::ptrdiff_t>(j) * a.inner[R]] = Op::combine(out[static_cast<std::ptrdiff_t>(j) * a.inner[R]], v);
            [&]<int... M>(std::integer_sequence<int, M...>) {
              ((C ? store_v(const_cast<T*>(a.ptr[members_out.id[M]]) + j, e.template get<members_out.id[M]>())
                  : store_v(const_cast<T*>(a.ptr[members_out.id[M]]) + static_cast<std::ptrdiff_t>(j) * a.inner[members_out.id[M]],
                            e.template get<members_out.id[M]>())),
               ...);
            }(std::make_integer_sequence<int, members_out.size>{});
          };
          std::size_t j = c0;
          if (contig) {
            for (; j + VS <= c1; j += VS) acc.template operator()<V, true>(j);
            for (; j < c1; ++j) acc.template operator()<T, true>(j);
          } else {
            for (; j < c1; ++j) acc.template operator()<T, false>(j);
          }
        }
      }
      for (std::size_t o = o0; o < o1; ++o) {
        a.at_row(space, input_row(o, 0), ids.data(), n_ids);
        T* out = const_cast<T*>(a.ptr[R]);
        for (std::size_t j = c0; j < c1; ++j) {
          T& x = out[static_cast<std::ptrdiff_t>(j) * a.inner[R]];
          x = Op::finalize(x, count);
        }
      }
    };
    f.pool->parallel_for(blocks * row_chunks, task);
  }

  // ---- matmul with its epilogue ----

  struct mm_sizes {
    std::size_t batch, m, n, k;
  };
  static constexpr mm_sizes matmul_sizes(int, const dims& out, const dims& a) {
    const bool batched = out.rank == 3;
    return {batched ? out.extent[0] : 1, out.back(1), out.back(0), a.back(0)};
  }

  template <int K>
  static void run_matmul(frame_t& f) {
    constexpr plan::kernel kn = plan.kernels[K];
    constexpr int M = kn.node;
    const strided<T>& A = f.loc[nodes[M].inputs[0]];
    const strided<T>& B = f.loc[nodes[M].inputs[1]];
    const strided<T>& C = f.loc[M];
    const auto sz = matmul_sizes(M, C.shape, A.shape);
    const std::size_t ra = A.shape.rank, rb = B.shape.rank;
    const matrix_view<T> av{A.data, A.stride[ra - 2], A.stride[ra - 1]};
    const matrix_view<T> bv{B.data, B.stride[rb - 2], B.stride[rb - 1]};
    const std::ptrdiff_t a_bs = ra == 3 && A.shape.extent[0] != 1 ? A.stride[0] : 0;
    const std::ptrdiff_t b_bs = rb == 3 && B.shape.extent[0] != 1 ? B.stride[0] : 0;
    const std::ptrdiff_t ldc = C.stride[C.shape.rank - 2];
    const std::ptrdiff_t c_bs = C.shape.rank == 3 ? C.stride[0] : 0;
    const std::size_t scratch = workspace_row_scratch_stride(f) * f.pool->size();
    std::span<std::byte> ws(f.workspace + scratch, f.workspace_bytes - scratch);
    const T* b_packed = nullptr;  // options::freezing: B's blocks packed once (frozen_bytes_of)
    if constexpr (frozen_bytes_of(K) > 0)
      if (f.frozen && bv.col_stride == 1) {
        T* kept = reinterpret_cast<T*>(f.frozen + frozen_offset(K));
        const void*& made_from = reinterpret_cast<const void**>(f.frozen)[K];
        if (made_from != B.data) {
          cpu::detail::pack_gemv_blocks(sz.k, sz.n, bv.data, bv.row_stride, kept);
          made_from = B.data;
        }
        b_packed = kept;
      }
    if constexpr (kn.group < 0) {
      gemm<T>(sz.batch, sz.m, sz.n, sz.k, av, a_bs, bv, b_bs, C.data, ldc, c_bs, no_epilogue{}, *f.pool, ws, b_packed);
    } else {
      constexpr int G = kn.group;
      static constexpr id_list ext = external_inputs(G);
      constexpr int O = epilogue_output(G);
      const dims space = C.shape;
      row_addressing proto;
      bool contig = true;
      auto bind = [&](int id) {
        proto.base[id] = f.loc[id].data;
        space_strides(f.loc[id], space, proto.stride[id]);
        proto.inner[id] = proto.stride[id][space.rank - 1];
        if (proto.inner[id] > 1 || proto.inner[id] < 0) contig = false;
      };
      for (int q = 0; q < ext.size; ++q) bind(ext.id[q]);
      bind(O);
      constexpr auto ids = [] {
        std::array<int, N + 1> l{};
        for (int q = 0; q < ext.size; ++q) l[q] = ext.id[q];
        l[ext.size] = O;
        return l;
      }();
      const std::uint64_t call = next_kernel_call();
      auto epilogue = [&](std::size_t b, std::size_t i, std::size_t j0, std::size_t n, T*) {
        row_addressing& a = thread_addressing(proto, call);
        a.at_row(space, b * sz.m + i, ids.data(), ext.size + 1);
        auto write = [&]<class W, bool C2>(std::size_t j) {
          const W v = evaluator<group_of<K>, 0, W, C2>{a, nullptr, nullptr, sz.n, f.payload, j}.template get<O>();
          if constexpr (C2) store_v(const_cast<T*>(a.ptr[O]) + j, v);
          else const_cast<T*>(a.ptr[O])[static_cast<std::ptrdiff_t>(j) * a.inner[O]] = v;
        };
        std::size_t j = j0;
        if (contig) {
          for (; j + VS <= j0 + n; j += VS) write.template operator()<V, true>(j);
          for (; j < j0 + n; ++j) write.template operator()<T, true>(j);
        } else {
          for (; j < j0 + n; ++j) write.template operator()<T, false>(j);
        }
      };
      gemm<T>(sz.batch, sz.m, sz.n, sz.k, av, a_bs, bv, b_bs, C.data, ldc, c_bs, epilogue, *f.pool, ws, b_packed);
    }
  }

  // ---- graph breaks and copies ----

  template <int K>
  static void run_opaque(frame_t& f) {
    run_opaque_node<plan.kernels[K].node>(f);
  }

  /// Runs the user function of opaque node `id` (the run-time path dispatches by id).
  static void run_opaque_at(int id, frame_t& f) {
    [&]<std::size_t... I>(std::index_sequence<I...>) {
      ((static_cast<int>(I) == id ? run_opaque_node<I>(f) : void()), ...);
    }(std::make_index_sequence<N>{});
  }

  template <std::size_t I>
  static void run_opaque_node(frame_t& f) {
    if constexpr (nodes[I].desc.kind == node_kind::opaque) {
      using E = typename graph::template type_of<I>;
      using Arg = std::remove_cvref_t<decltype(std::declval<const E&>().arg)>;
      const auto* node = static_cast<const E*>(static_cast<const opaque_base*>(f.payload[nodes[I].payload_slot]));
      const strided<T>& in = f.loc[nodes[I].inputs[0]];
      const tensor<T, shape_of_t<Arg>> view(storage_ptr{}, in.data, in.shape, in.stride);
      typename E::result_type out = node->fn(view);
      if (out.extents().rank != nodes[I].desc.shape.rank)
        FUSEBOX_THROW(graph_break("opaque(): the function returned a tensor of a different rank than declared", node->loc));
      f.keep[I] = out.owner();
      f.loc[I] = out.view();
      bind_views(f);
    }
  }

  template <int K>
  static void run_attention(frame_t& f) {
    constexpr int I = plan.kernels[K].node;
    if constexpr (nodes[I].desc.variant == 0)
      cpu::attention(f.loc[nodes[I].inputs[0]], f.loc[nodes[I].inputs[1]], f.loc[nodes[I].inputs[2]], f.loc[I],
                     nodes[I].desc.causal, *f.pool);
    else
      cpu::attention_backward(f.loc[nodes[I].inputs[0]], f.loc[nodes[I].inputs[1]], f.loc[nodes[I].inputs[2]],
                              f.loc[nodes[I].inputs[3]], f.loc[nodes[I].inputs[4]], f.loc[I], nodes[I].desc.variant,
                              nodes[I].desc.causal, *f.pool);
  }

  template <int K>
  static void run_pad(frame_t& f) {
    constexpr int I = plan.kernels[K].node;
    strided<T> in[ir::max_inputs];
    for (int k = 0; k < nodes[I].n_inputs; ++k) in[k] = f.loc[nodes[I].inputs[k]];
    cpu::pad(in, nodes[I].n_inputs, f.loc[I], static_cast<std::size_t>(nodes[I].desc.axis), nodes[I].desc.view_start,
             *f.pool);
  }

  /// A spatial node (backend/cpu/spatial.hpp); its epilogue group, if any, evaluated on each finished row
  /// run of the output, in place, as a matmul's is.
  template <int K>
  static void run_spatial(frame_t& f) {
    constexpr plan::kernel kn = plan.kernels[K];
    constexpr int I = kn.node;
    const strided<T>& a = f.loc[nodes[I].inputs[0]];
    const strided<T>& b = nodes[I].n_inputs == 2 ? f.loc[nodes[I].inputs[1]] : f.loc[nodes[I].inputs[0]];
    const std::size_t scratch = workspace_row_scratch_stride(f) * f.pool->size();
    std::span<std::byte> ws(f.workspace + scratch, f.workspace_bytes - scratch);
    frozen_weights frozen{};
    if constexpr (frozen_bytes_of(K) > 0)
      if (f.frozen) frozen = {f.frozen + frozen_offset(K), reinterpret_cast<const void**>(f.frozen) + K};
    if constexpr (kn.group < 0) {
      cpu::run_spatial(nodes[I].desc.win, a, b, f.loc[I], *f.pool, ws, no_spatial_epilogue{}, frozen);
    } else {
      constexpr int G = kn.group;
      static constexpr id_list ext = external_inputs(G);
      constexpr int O = epilogue_output(G);
      const dims space = f.loc[I].shape;
      row_addressing proto;
      bool contig = true;
      auto bind = [&](int id) {
        proto.base[id] = f.loc[id].data;
        space_strides(f.loc[id], space, proto.stride[id]);
        proto.inner[id] = proto.stride[id][space.rank - 1];
        if (proto.inner[id] > 1 || proto.inner[id] < 0) contig = false;
      };
      for (int q = 0; q < ext.size; ++q) bind(ext.id[q]);
      bind(O);
      constexpr auto ids = [] {
        std::array<int, N + 1> l{};
        for (int q = 0; q < ext.size; ++q) l[q] = ext.id[q];
        l[ext.size] = O;
        return l;
      }();
      const std::size_t width = space.back(0);
      // Kernels hand over runs of whole rows at once (backend/cpu/spatial_epilogue.hpp); in `walk`, the
      // output's dimensions merged where every operand allows (a bias broadcast over H and W lets
      // those two merge), the run is walked in rows as long as the operands allow: T2's conv 2
      // input gradient's relu mask is rows of 144 per channel instead of 12.
      dims walk = space;
      row_addressing walk_proto = proto;
      merge_dims_from(0, walk, walk_proto, ids.data(), ext.size + 1);
      const std::size_t walk_width = walk.back(0);
      // A kernel calls the epilogue from every task (T2's second layer: up to 65536 calls a step
      // before runs of rows): the addressing is the thread's own (thread_addressing).
      const std::uint64_t call = next_kernel_call();
      auto epilogue = [&](std::size_t r, std::size_t j0, std::size_t n) {
        row_addressing& ra = thread_addressing(walk_proto, call);
        auto write = [&]<class W, bool C2>(std::size_t j) {
          const W v = evaluator<group_of<K>, 0, W, C2>{ra, nullptr, nullptr, walk_width, f.payload, j}.template get<O>();
          if constexpr (C2) store_v(const_cast<T*>(ra.ptr[O]) + j, v);
          else const_cast<T*>(ra.ptr[O])[static_cast<std::ptrdiff_t>(j) * ra.inner[O]] = v;
        };
        // [e, end) in the flat element order both spaces share.
        std::size_t e = r * width + j0;
        const std::size_t end = e + n;
        while (e < end) {
          const std::size_t wr = e / walk_width, w0 = e % walk_width;
          const std::size_t w1 = std::min(walk_width, w0 + (end - e));
          ra.at_row(walk, wr, ids.data(), ext.size + 1);
          std::size_t j = w0;
          if (contig) {
            for (; j + VS <= w1; j += VS) write.template operator()<V, true>(j);
            for (; j < w1; ++j) write.template operator()<T, true>(j);
          } else {
            for (; j < w1; ++j) write.template operator()<T, false>(j);
          }
          e += w1 - w0;
        }
      };
      cpu::run_spatial(nodes[I].desc.win, a, b, f.loc[I], *f.pool, ws, row_span_epilogue{epilogue}, frozen);
    }
  }

  template <int K>
  static void run_copy(frame_t& f) {
    constexpr int I = plan.kernels[K].node;
    strided_copy(f.loc[I], f.copy_to[I]);
  }
};

template <class T, class... Roots>
using program = basic_program<false, T, Roots...>;

}  // namespace fusebox::cpu
