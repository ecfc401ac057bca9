// plan/report.hpp: a plan in words, the same on every path: each kernel with its fused ops, loop,
// bytes moved and flops, from the nodes' shapes (the build-time ones, or a call's). The back end
// adds how it runs each kernel (vector width and threads, a generated kernel, a library call).
// Read by explain() through the back ends (backend/cpu.hpp, backend/cuda.hpp) and by the
// profiler, whose spans are named by kernel_ops().
// Depends on: plan/plan.hpp, ir/graph.hpp, expr/custom.hpp (a custom op's summary).
#pragma once

#include <array>
#include <cstdio>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "fusebox/core/linkage.hpp"
#include "fusebox/expr/custom.hpp"
#include "fusebox/ir/graph.hpp"
#include "fusebox/plan/plan.hpp"

namespace fusebox::plan {

/// A plan's per-node and per-kernel facts, whatever its node count: what the reports read. The
/// reports take this instead of plan_t<N> so that they are compiled once, not once per program
/// (explain's text was ~30 KB of object code per program; issue 22).
struct plan_ref {
  const int* group;
  const bool* materialised;
  const int* kernel_of;
  const int* same_as;
  const kernel* kernels;
  int n_kernels;
  template <std::size_t N>
  constexpr plan_ref(const plan_t<N>& p)  // NOLINT(google-explicit-constructor): a view
      : group(p.group.data()),
        materialised(p.materialised.data()),
        kernel_of(p.kernel_of.data()),
        same_as(p.same_as.data()),
        kernels(p.kernels.data()),
        n_kernels(p.n_kernels) {}
};

namespace detail {
FUSEBOX_RUNTIME_API std::string human_bytes(double b);
FUSEBOX_RUNTIME_API std::string number(double v);
/// Node i reads an earlier member of its row group when the call's values agree (plan step 5):
/// reports list the value once.
template <class Plan>
constexpr bool group_twin(const Plan& plan, std::size_t i) {
  const int f = plan.same_as[i];
  return f >= 0 && plan.group[f] >= 0 && plan.group[f] == plan.group[i];
}
}  // namespace detail

/// The fused ops of kernel k of program P, as explain() lists them and the profiler names the
/// kernel's span: "mul, add, gelu", "matmul + epilogue(add, relu)", "conv2d + epilogue(add)".
FUSEBOX_RUNTIME_API std::string kernel_ops(std::span<const ir::node> nodes, const plan_ref& plan, int k);

/// Kernel-by-kernel description of a plan over `nodes` (the call's shapes), elements of
/// `elem_bytes`: each kernel's fused ops, loop, bytes moved and flops. `how(k)` is the back end's
/// part of kernel k's loop line (vector width and threads, the generated kernel, the library
/// call), so every path reports the same costs of the same plan.
FUSEBOX_RUNTIME_API std::string describe_kernels(std::span<const ir::node> nodes, const plan_ref& plan,
                                                 std::size_t elem_bytes, const std::function<std::string(int)>& how);


template <std::size_t N>
std::string kernel_ops(const std::array<ir::node, N>& nodes, const plan_t<N>& plan, int k) {
  return kernel_ops(std::span<const ir::node>(nodes), plan_ref(plan), k);
}
template <std::size_t N, class How>
std::string describe_kernels(const std::array<ir::node, N>& nodes, const plan_t<N>& plan, std::size_t elem_bytes,
                             How&& how) {
  return describe_kernels(std::span<const ir::node>(nodes), plan_ref(plan), elem_bytes,
                          std::function<std::string(int)>(std::forward<How>(how)));
}

// Definitions: compiled here, or once in the FUSEBOX_IMPLEMENTATION unit (core/linkage.hpp).
#if FUSEBOX_RUNTIME_BODIES
namespace detail {
FUSEBOX_RUNTIME_API std::string human_bytes(double b) {
  char buf[32];
  if (b >= 1 << 20) std::snprintf(buf, sizeof buf, "%.1f MiB", b / (1 << 20));
  else if (b >= 1 << 10) std::snprintf(buf, sizeof buf, "%.1f KiB", b / (1 << 10));
  else std::snprintf(buf, sizeof buf, "%.0f B", b);
  return buf;
}

FUSEBOX_RUNTIME_API std::string number(double v) {
  char buf[32];
  if (v >= 1e9) std::snprintf(buf, sizeof buf, "%.2f G", v / 1e9);
  else if (v >= 1e6) std::snprintf(buf, sizeof buf, "%.2f M", v / 1e6);
  else if (v >= 1e3) std::snprintf(buf, sizeof buf, "%.1f k", v / 1e3);
  else std::snprintf(buf, sizeof buf, "%.0f ", v);
  return buf;
}
}  // namespace detail

FUSEBOX_RUNTIME_API std::string kernel_ops(std::span<const ir::node> nodes, const plan_ref& plan, int k) {
  const std::size_t N = nodes.size();
  const auto& kn = plan.kernels[k];
  auto members = [&](int group) {
    std::string s;
    for (std::size_t i = 0; i < N; ++i)
      if (plan.group[i] == group && !detail::group_twin(plan, i)) s += std::string(s.empty() ? "" : ", ") + nodes[i].desc.name;
    return s;
  };
  switch (kn.kind) {
    case plan::kernel_kind::rows:
    case plan::kernel_kind::reduce_cols: return members(kn.group);
    case plan::kernel_kind::matmul:
      return kn.group >= 0 ? "matmul + epilogue(" + members(kn.group) + ")" : std::string("matmul");
    case plan::kernel_kind::spatial:
      return std::string(nodes[kn.node].desc.name) +
             (kn.group >= 0 ? " + epilogue(" + members(kn.group) + ")" : std::string());
    case plan::kernel_kind::opaque: return "opaque (user function: graph break)";
    case plan::kernel_kind::attention:
      return std::string(nodes[kn.node].desc.name) + (nodes[kn.node].desc.causal ? " (causal)" : "");
    case plan::kernel_kind::gather:
    case plan::kernel_kind::custom: return nodes[kn.node].desc.name;
    case plan::kernel_kind::pad:
      return nodes[kn.node].n_inputs == 1 ? "pad (a slice's gradient)"
                                          : "pad (the gradients of adjacent slices, side by side)";
    default: return "copy";
  }
}

FUSEBOX_RUNTIME_API std::string describe_kernels(std::span<const ir::node> nodes, const plan_ref& plan,
                                                 std::size_t elem_bytes, const std::function<std::string(int)>& how) {
  const std::size_t N = nodes.size();
  std::string s;
  const double eb = static_cast<double>(elem_bytes);
  for (int k = 0; k < plan.n_kernels; ++k) {
    const auto& kn = plan.kernels[k];
    double bytes = 0, flops = 0;
    const std::string ops = kernel_ops(nodes, plan, k);
    auto add_member = [&](std::size_t i) {
      const double elems = nodes[i].desc.kind == node_kind::reduce
                               ? static_cast<double>(nodes[nodes[i].inputs[0]].desc.shape.size())
                               : static_cast<double>(nodes[i].desc.shape.size());
      flops += nodes[i].desc.flops * elems;
    };
    auto add_reads = [&](int group) {
      std::vector<char> seen(N, 0);
      for (std::size_t i = 0; i < N; ++i) {
        if (plan.group[i] != group) continue;
        for (int q = 0; q < nodes[i].n_inputs; ++q) {
          const int in = nodes[i].inputs[q];
          if (plan.group[in] == group || seen[in] || nodes[in].desc.kind == node_kind::scalar) continue;
          if (nodes[in].desc.kind == node_kind::matmul && kn.kind == plan::kernel_kind::matmul) continue;
          seen[in] = true;
          bytes += nodes[in].desc.shape.size() * eb;
        }
        if (plan.materialised[i]) bytes += nodes[i].desc.shape.size() * eb;
      }
    };
    std::string loop;
    if (kn.skippable) {
      // Every value it writes is an earlier kernel's when the call's payloads agree (value
      // numbering, plan step 5): listed once, there.
      int first = -1;
      for (std::size_t i = 0; i < N && first < 0; ++i)
        if (plan.kernel_of[i] == k && plan.same_as[i] >= 0) first = plan.kernel_of[plan.same_as[i]];
      char line[160];
      std::snprintf(line, sizeof line,
                    "  kernel %d [%s] = kernel %d where the payloads it holds are the same (checked per call: then skipped)\n", k,
                    plan::name(kn.kind), first);
      s += line;
      continue;
    }
    if (kn.kind == plan::kernel_kind::rows || kn.kind == plan::kernel_kind::reduce_cols) {
      int passes = 0;
      for (std::size_t i = 0; i < N; ++i)
        if (plan.group[i] == kn.group && !detail::group_twin(plan, i)) {
          add_member(i);
          passes += nodes[i].desc.kind == node_kind::reduce;
        }
      add_reads(kn.group);
      loop = (kn.kind == plan::kernel_kind::rows ? "rows over " : "column reduction over ") + to_string(kn.space);
      if (kn.kind == plan::kernel_kind::rows && passes)
        loop += ", " + std::to_string(passes) + " reduction pass(es) + output pass per row";
      if (kn.cached) loop += ", " + std::to_string(kn.cached) + " row(s) kept in scratch";
    } else if (kn.kind == plan::kernel_kind::matmul) {
      const int m = kn.node;
      const auto& a = nodes[nodes[m].inputs[0]].desc.shape;
      const auto& o = nodes[m].desc.shape;
      flops = 2.0 * static_cast<double>(o.size()) * static_cast<double>(a.back(0));
      bytes = (nodes[nodes[m].inputs[0]].desc.shape.size() + nodes[nodes[m].inputs[1]].desc.shape.size()) * eb;
      if (kn.group >= 0) {
        for (std::size_t i = 0; i < N; ++i)
          if (plan.group[i] == kn.group) flops += nodes[i].desc.flops * static_cast<double>(nodes[i].desc.shape.size());
        add_reads(kn.group);
      } else {
        bytes += o.size() * eb;
      }
      loop = "gemm " + to_string(a) + " x " + to_string(nodes[nodes[m].inputs[1]].desc.shape) + " -> " + to_string(o);
    } else if (kn.kind == plan::kernel_kind::spatial) {
      const ir::node& n = nodes[kn.node];
      const window& w = n.desc.win;
      flops = static_cast<double>(n.desc.flops) * static_cast<double>(n.desc.shape.size());
      for (int in = 0; in < n.n_inputs; ++in) bytes += nodes[n.inputs[in]].desc.shape.size() * eb;
      if (kn.group >= 0) {
        for (std::size_t i = 0; i < N; ++i)
          if (plan.group[i] == kn.group) flops += nodes[i].desc.flops * static_cast<double>(nodes[i].desc.shape.size());
        add_reads(kn.group);
      } else {
        bytes += n.desc.shape.size() * eb;
      }
      loop = std::string(n.desc.name) + " " + to_string(nodes[n.inputs[0]].desc.shape) +
             (n.n_inputs == 2 ? ", " + to_string(nodes[n.inputs[1]].desc.shape) : std::string()) + " -> " +
             to_string(n.desc.shape) + ", stride " + std::to_string(w.sh) + "x" + std::to_string(w.sw) + ", padding " +
             std::to_string(w.ph) + "x" + std::to_string(w.pw);  // the algorithm is the back end's to say
    } else if (kn.kind == plan::kernel_kind::opaque) {
      loop = "host call";
    } else if (kn.kind == plan::kernel_kind::attention) {
      const ir::node& n = nodes[kn.node];
      const dims &q = nodes[n.inputs[0]].desc.shape, &kk = nodes[n.inputs[1]].desc.shape, &o = n.desc.shape;
      const double pairs = static_cast<double>(q[0] * q[1] * q[2] * kk[1]) * (n.desc.causal ? 0.5 : 1.0);
      const double e = static_cast<double>(q[3]), ev = static_cast<double>(nodes[n.inputs[2]].desc.shape[3]);
      // Forward: scores and the weighted sum. Gradients (backend/cpu/attention.hpp): the scores twice (the
      // row statistics, then the pairs), dp, and the dq, dk, dv sums.
      flops = n.desc.variant == 0 ? 2.0 * pairs * (e + ev) : 2.0 * pairs * (4 * e + 2 * ev);
      for (int in = 0; in < n.n_inputs; ++in) bytes += nodes[n.inputs[in]].desc.shape.size() * eb;
      bytes += o.size() * eb;
      loop = std::string(n.desc.variant == 0 ? "scores, max, exp, weighted value rows per (batch, head, query rows)"
                                             : "softmax recomputed, gradients per (batch, head) or row") +
             " over " + to_string(q) + " x " + to_string(kk) + " -> " + to_string(o);
    } else if (kn.kind == plan::kernel_kind::gather) {
      const ir::node& n = nodes[kn.node];
      const dims &a = nodes[n.inputs[0]].desc.shape, &ids = nodes[n.inputs[1]].desc.shape;
      loop = n.desc.variant == 0 ? "rows of " + to_string(a) + " picked by ids " + to_string(ids) + " -> " + to_string(kn.space)
                                 : "rows of " + to_string(a) + " added into " + to_string(kn.space) +
                                       " by ids (counting sort, a task per block of rows)";
      // Forward: ids, the picked rows, the output; gradient: g, ids, the zeroed and summed rows.
      bytes = static_cast<double>(n.desc.variant == 0 ? ids.size() + 2 * kn.space.size()
                                                      : a.size() + ids.size() + kn.space.size()) *
              static_cast<double>(eb);
      flops = n.desc.variant == 0 ? 0.0 : static_cast<double>(a.size());
    } else if (kn.kind == plan::kernel_kind::custom) {
      const ir::node& n = nodes[kn.node];
      dims ins[ir::max_inputs];
      for (int in = 0; in < n.n_inputs; ++in) {
        ins[in] = nodes[n.inputs[in]].desc.shape;
        bytes += ins[in].size() * eb;
      }
      bytes += n.desc.shape.size() * eb;
      flops = n.desc.flops * static_cast<double>(n.desc.shape.size());
      loop = n.desc.custom->summary(ins, n.n_inputs, n.desc.shape) + ", the op's own kernel";
    } else if (kn.kind == plan::kernel_kind::pad) {
      const ir::node& n = nodes[kn.node];
      loop.clear();
      for (int in = 0; in < n.n_inputs; ++in) {
        loop += (in ? " | " : "") + to_string(nodes[n.inputs[in]].desc.shape);
        bytes += nodes[n.inputs[in]].desc.shape.size() * eb;
      }
      loop += " into " + to_string(kn.space) + " along dimension " + std::to_string(n.desc.axis);
      bytes += kn.space.size() * eb;
    } else {
      loop = "strided copy of " + to_string(kn.space);
      bytes = 2 * kn.space.size() * eb;
    }
    char head[64];
    std::snprintf(head, sizeof head, "  kernel %d [%s] ", k, plan::name(kn.kind));
    s += head + ops + "\n";
    s += "      loop: " + loop + "; " + how(k) + "\n";
    s += "      moves " + detail::human_bytes(bytes) + ", " + detail::number(flops) + "flop\n";
  }
  return s;
}
#endif

}  // namespace fusebox::plan
