// ir/specialize.hpp: the graph IR of an expression type, with the extents of one call or of one
// specialisation (some extents symbolic) put in place of `dyn`, every node's shape recomputed by
// the ops' shape rules. The planner then runs on the result, as it does at build time.
// Depends on: ir/graph.hpp, expr/node.hpp, expr/grad_nodes.hpp, ops/layout.hpp.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "fusebox/core/errors.hpp"
#include "fusebox/core/linkage.hpp"
#include "fusebox/expr/custom.hpp"
#include "fusebox/expr/gather.hpp"
#include "fusebox/expr/grad_nodes.hpp"
#include "fusebox/expr/spatial.hpp"
#include "fusebox/ir/graph.hpp"
#include "fusebox/ops/layout.hpp"

namespace fusebox::jit {

// ---- graph breaks ----
// An opaque() node declares its result type, whose extents may be `dyn`; the real ones are what its
// user function returns, known only once the part of the model before it has run. The run-time
// path therefore runs a call in segments (pipeline/dynamic_function.hpp): segment L computes the operands of the
// opaque() nodes of level L (those with L other opaque() results on their longest path from the
// arguments), then their functions run; the last segment is the rest of the model, with every
// opaque() node cut from its operand (its result is known). A call's extents list, after the
// arguments, one "break entry" per opaque() node in node order: the extents its function returned
// (rank 0 until it has run). A graph numbered by number_breaks holds its entry's index in each
// opaque node's input_index; a model's own graph (input_index 0) finds them by counting from the end.

template <std::size_t N>
constexpr std::size_t count_breaks(const std::array<ir::node, N>& nodes) {
  std::size_t c = 0;
  for (const auto& n : nodes) c += n.desc.kind == node_kind::opaque;
  return c;
}

/// Writes into each opaque node the index of its break entry (n_args + its rank among opaque nodes).
template <std::size_t N>
void number_breaks(std::array<ir::node, N>& nodes, std::size_t n_args) {
  std::size_t j = 0;
  for (auto& n : nodes)
    if (n.desc.kind == node_kind::opaque) n.desc.input_index = n_args + j++;
}

/// Per node: its level, the most opaque() results on a path from the arguments to it (an opaque
/// node's own result not counted: it is computed by the segment of its operand's level).
template <std::size_t N>
std::array<int, N> break_levels(const std::array<ir::node, N>& nodes) {
  std::array<int, N> level{};
  for (std::size_t i = 0; i < N; ++i)
    for (int q = 0; q < nodes[i].n_inputs; ++q) {
      const int p = nodes[i].inputs[q];
      level[i] = std::max(level[i], level[p] + (nodes[p].desc.kind == node_kind::opaque ? 1 : 0));
    }
  return level;
}

/// The graph of one segment: opaque() nodes of a level below `level` cut from their operands
/// (their results are bound before the segment runs), and every node none of `roots` needs turned
/// into an unused leaf, as merge_duplicates does (ids do not move).
template <std::size_t N, std::size_t R>
std::array<ir::node, N> break_segment(std::array<ir::node, N> nodes, const std::array<int, N>& level, int below,
                                      const std::array<int, R>& roots) {
  for (std::size_t i = 0; i < N; ++i)
    if (nodes[i].desc.kind == node_kind::opaque && level[i] < below) nodes[i].n_inputs = 0;
  std::array<bool, N> needed{};
  for (int r : roots) needed[static_cast<std::size_t>(r)] = true;
  for (std::size_t i = N; i-- > 0;)
    if (needed[i])
      for (int q = 0; q < nodes[i].n_inputs; ++q) needed[static_cast<std::size_t>(nodes[i].inputs[q])] = true;
  for (std::size_t i = 0; i < N; ++i)
    if (!needed[i]) {
      nodes[i] = ir::node{};
      nodes[i].desc.kind = node_kind::scalar;
      nodes[i].desc.name = "unused";
    }
  return nodes;
}

/// The break entry of opaque node n (the `j`th opaque node of `generic`) in `args`, or null when the
/// call's extents hold none for it yet (its function has not run).
template <std::size_t N>
const dims* break_entry(const std::array<ir::node, N>& generic, const ir::node& n, std::size_t j,
                        const std::vector<dims>& args) {
  std::size_t at = n.desc.input_index;
  if (at == 0) {  // a model's own graph: the entries are the last count_breaks() of args
    const std::size_t b = count_breaks(generic);
    if (args.size() <= b) return nullptr;
    at = args.size() - b + j;
  }
  if (at >= args.size() || args[at].rank != n.desc.shape.rank || args[at].rank == 0) return nullptr;
  return &args[at];
}

/// Node shapes for the given extents of each argument (index = input_index) and of each graph
/// break (see above); throws shape_error when the extents do not fit the ops (a dyn dimension
/// that turned out to clash).
template <std::size_t N>
std::array<ir::node, N> specialise(const std::array<ir::node, N>& generic, const std::vector<dims>& args) {
  std::array<ir::node, N> out = generic;
  std::size_t breaks = 0;
  for (std::size_t i = 0; i < N; ++i) {
    ir::node& n = out[i];
    const auto in = [&](int q) -> const dims& { return out[n.inputs[q]].desc.shape; };
    switch (n.desc.kind) {
      case node_kind::input:
        n.desc.shape = args.at(n.desc.input_index);
        break;
      case node_kind::opaque:
        if (const dims* got = break_entry(generic, n, breaks++, args)) {
          for (std::size_t d = 0; d < got->rank; ++d)
            if (is_known_extent(n.desc.shape.extent[d]) && got->extent[d] != n.desc.shape.extent[d])
              FUSEBOX_THROW(shape_error("opaque(): its function returned extents " + to_string(*got) +
                                            ", but its declared result type has " + to_string(n.desc.shape),
                                        std::source_location{}));
          n.desc.shape = *got;
        }
        break;
      case node_kind::pointwise: {
        dims s = in(0);
        for (int q = 1; q < n.n_inputs; ++q) {
          const auto r = broadcast(s, in(q));
          if (!r.ok)
            FUSEBOX_THROW(shape_error(std::string(n.desc.name) + ": shapes " + to_string(s) + " and " + to_string(in(q)) +
                                          " cannot broadcast",
                                      std::source_location{}));
          s = r.out;
        }
        n.desc.shape = s;
        break;
      }
      case node_kind::reduce:
        n.desc.shape = fusebox::detail::reduced_shape(in(0), n.desc.axis, n.desc.keepdim);
        break;
      case node_kind::matmul: {
        const auto r = fusebox::detail::matmul_shape(in(0), in(1));
        if (!r.rank_ok || in(0).back(0) != in(1).back(1))
          FUSEBOX_THROW(shape_error("matmul: a is " + to_string(in(0)) + ", b is " + to_string(in(1)) +
                                        "; the inner extents must match",
                                    std::source_location{}));
        n.desc.shape = r.out;
        break;
      }
      case node_kind::pad: {  // the operands side by side from view_start along axis, in a static total
        const std::size_t axis = static_cast<std::size_t>(n.desc.axis);
        dims s = in(0);
        std::size_t end = n.desc.view_start;
        for (int q = 0; q < n.n_inputs; ++q) {
          dims o = in(q);
          end += o.extent[axis];
          o.extent[axis] = s.extent[axis];
          if (!(o == s)) FUSEBOX_THROW(shape_error("pad: operands " + to_string(in(0)) + " and " + to_string(in(q)) +
                                                       " differ away from axis " + std::to_string(axis), std::source_location{}));
        }
        s.extent[axis] = n.desc.shape.extent[axis];
        if (!is_known_extent(s.extent[axis]) || end > s.extent[axis])
          FUSEBOX_THROW(shape_error("pad: the operands (" + to_string(in(0)) + ", ...) do not fit in " + to_string(n.desc.shape),
                                    std::source_location{}));
        n.desc.shape = s;
        break;
      }
      case node_kind::attention: {  // attention(), or one of its gradient kernels (desc.variant 1-3)
        const auto r = fusebox::detail::attention_shape(in(0), in(1), in(2), n.desc.causal);
        if (!r.rank_ok || !r.extents_ok || !r.causal_ok)
          FUSEBOX_THROW(shape_error(std::string(n.desc.name) + ": q is " + to_string(in(0)) + ", k is " + to_string(in(1)) +
                                        ", v is " + to_string(in(2)) + "; need [batch, tokens, heads, head dim] with equal "
                                        "batch and heads, k and v the same tokens, q and k the same head dim" +
                                        (r.causal_ok ? "" : ", and as many queries as keys for the causal mask"),
                                    std::source_location{}));
        if (n.desc.variant == 0) {
          n.desc.shape = r.out;
          break;
        }
        // The gradient kernels read o = attention(q, k, v) and the gradient at o (operands 3, 4).
        // Part 3 (dq, dk, dv in one [B, T, 3, H, E]) was chosen from the types, where two dyn
        // extents look alike: it needs as many queries as keys and E == Ev in this call too.
        const bool fused_ok =
            n.desc.variant != 3 || (in(0).extent[1] == in(1).extent[1] && in(0).extent[3] == in(2).extent[3]);
        if (!(in(3) == r.out) || !(in(4) == r.out) || !fused_ok)
          FUSEBOX_THROW(shape_error(std::string(n.desc.name) + ": q is " + to_string(in(0)) + ", k is " + to_string(in(1)) +
                                        ", v is " + to_string(in(2)) + ", o is " + to_string(in(3)) + ", its gradient " +
                                        to_string(in(4)) + (fused_ok ? "; o and its gradient must be attention's result "
                                                                       "shape " + to_string(r.out)
                                                                     : "; the gradient was built for as many queries as keys "
                                                                       "(and E == Ev), which this call does not have"),
                                    std::source_location{}));
        n.desc.shape = fusebox::detail::attention_backward_shape(n.desc.variant, in(0), in(1), in(2));
        break;
      }
      case node_kind::gather: {
        const auto r = fusebox::detail::gather_shape(n.desc.variant, n.desc.vocab, in(0), in(1));
        if (!r.ok) FUSEBOX_THROW(shape_error(fusebox::detail::gather_error_text(n.desc.variant, in(0), in(1)), std::source_location{}));
        n.desc.shape = r.out;
        break;
      }
      case node_kind::custom: {
        dims ins[ir::max_inputs];
        for (int q = 0; q < n.n_inputs; ++q) ins[q] = in(q);
        const custom_shape_result r = n.desc.custom->shape(ins, n.n_inputs);
        if (!r.ok) FUSEBOX_THROW(shape_error(n.desc.custom->error(ins, n.n_inputs), std::source_location{}));
        n.desc.shape = r.out;
        break;
      }
      case node_kind::spatial: {
        const dims b = n.n_inputs == 2 ? in(1) : dims{};
        const auto r = fusebox::detail::spatial_shape(n.desc.win, in(0), b);
        if (r.error != fusebox::detail::spatial_ok)
          FUSEBOX_THROW(shape_error(fusebox::detail::spatial_error_text(n.desc.win, in(0), b, r.error), std::source_location{}));
        // A symbol names one extent; an output height is another, which the guard knows nothing of.
        for (std::size_t d = 1; d < 4; ++d)
          if (!is_known_extent(r.out.extent[d]))
            FUSEBOX_THROW(shape_error(std::string(n.desc.name) + ": operand " + to_string(in(0)) +
                                          (n.n_inputs == 2 ? ", " + to_string(b) : std::string()) +
                                          ": on the run-time path only the batch (dimension 0) of conv2d and pooling may "
                                          "vary; give channels, height and width static extents",
                                      std::source_location{}));
        n.desc.shape = r.out;
        break;
      }
      case node_kind::view:
        if (n.desc.view_a >= 0) {
          dims s = in(0);
          std::swap(s.extent[n.desc.view_a], s.extent[n.desc.view_b]);
          n.desc.shape = s;
        } else if (n.desc.axis >= 0) {  // slice: the input's extents but the kept range's on `axis`
          dims s = in(0);
          const std::size_t a = static_cast<std::size_t>(n.desc.axis), end = n.desc.view_start + n.desc.shape.extent[a];
          if (end > s.extent[a]) ops::throw_slice_out_of_range(s, a, n.desc.view_start, end);
          s.extent[a] = n.desc.shape.extent[a];
          n.desc.shape = s;
        } else if (std::string_view(n.desc.name) == ops::flatten_view<0, 0>::name) {
          // flatten: dimensions view_start.. merged; the node's rank says how many.
          const std::size_t start = n.desc.view_start, end = start + in(0).rank - n.desc.shape.rank;
          const dims s = ops::flattened(in(0), start, end);
          if (!is_known_extent(s.extent[start]))
            FUSEBOX_THROW(shape_error("flatten<" + std::to_string(start) + ", " + std::to_string(end) + ">: " + to_string(in(0)) +
                                          ": on the run-time path the merged dimensions may not vary (their product would "
                                          "be an extent the guard knows nothing of); keep them static, or flatten only "
                                          "dimensions after the varying one",
                                      std::source_location{}));
          n.desc.shape = s;
        } else if (std::string_view(n.desc.name) == ops::unflatten_view<0, shape<1>>::name) {
          dims s{};
          if (!ops::unflattened(generic[i].desc.shape, in(0), n.desc.view_start, s))
            ops::throw_flatten("unflatten", in(0), n.desc.view_start, generic[i].desc.shape);
          n.desc.shape = s;
        }  // reshape: a static shape
        break;
      default:
        break;  // tensor leaves and scalars have static shapes
    }
  }
  return out;
}

/// Canonical text of a specialised graph: what a cache key and a log line need.
template <std::size_t N>
std::string describe_graph(const std::array<ir::node, N>& nodes) {
  std::string s;
  for (std::size_t i = 0; i < N; ++i) {
    const auto& n = nodes[i];
    s += std::to_string(i) + "=" + n.desc.name + to_string(n.desc.shape);
    for (int q = 0; q < n.n_inputs; ++q) s += (q ? "," : "(") + std::to_string(n.inputs[q]);
    s += n.n_inputs ? ")" : "";
    if (n.desc.kind == node_kind::reduce) s += "@" + std::to_string(n.desc.axis) + (n.desc.keepdim ? "k" : "");
    if (n.desc.kind == node_kind::spatial) {
      const window& w = n.desc.win;
      for (int v : {w.kh, w.kw, w.sh, w.sw, w.ph, w.pw, w.ih, w.iw}) s += "/" + std::to_string(v);
    }
    if (n.desc.kind == node_kind::view && n.desc.view_a >= 0)
      s += "@" + std::to_string(n.desc.view_a) + "," + std::to_string(n.desc.view_b);
    if (n.desc.kind == node_kind::view && n.desc.axis < 0 && n.desc.view_a < 0)  // flatten's start
      s += "@f" + std::to_string(n.desc.view_start);
    if (n.desc.kind == node_kind::view && n.desc.axis >= 0)
      s += "@" + std::to_string(n.desc.axis) + "+" + std::to_string(n.desc.view_start);
    s += ";";
  }
  return s;
}

#ifdef FUSEBOX_RUNTIME_INSTANCE  // compiled once where a program asks for it (core/linkage.hpp)
FUSEBOX_RUNTIME_INSTANCE std::array<ir::node, 16> specialise<16>(const std::array<ir::node, 16>&, const std::vector<dims>&);
FUSEBOX_RUNTIME_INSTANCE std::string describe_graph<16>(const std::array<ir::node, 16>&);
FUSEBOX_RUNTIME_INSTANCE std::array<ir::node, 32> specialise<32>(const std::array<ir::node, 32>&, const std::vector<dims>&);
FUSEBOX_RUNTIME_INSTANCE std::string describe_graph<32>(const std::array<ir::node, 32>&);
FUSEBOX_RUNTIME_INSTANCE std::array<ir::node, 64> specialise<64>(const std::array<ir::node, 64>&, const std::vector<dims>&);
FUSEBOX_RUNTIME_INSTANCE std::string describe_graph<64>(const std::array<ir::node, 64>&);
FUSEBOX_RUNTIME_INSTANCE std::array<ir::node, 128> specialise<128>(const std::array<ir::node, 128>&, const std::vector<dims>&);
FUSEBOX_RUNTIME_INSTANCE std::string describe_graph<128>(const std::array<ir::node, 128>&);
#endif

}  // namespace fusebox::jit
