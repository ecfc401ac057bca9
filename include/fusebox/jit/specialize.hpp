// jit/specialize.hpp: the graph IR of an expression type, with the extents of one call or of one
// specialisation (some extents symbolic) put in place of `dyn`, every node's shape recomputed by
// the ops' shape rules. The planner then runs on the result, as it does at build time.
// Depends on: ir/graph.hpp, expr/node.hpp, ops/layout.hpp.
#pragma once

#include <array>
#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "fusebox/core/errors.hpp"
#include "fusebox/expr/gather.hpp"
#include "fusebox/expr/spatial.hpp"
#include "fusebox/ir/graph.hpp"
#include "fusebox/ops/layout.hpp"

namespace fusebox::jit {

/// Node shapes for the given extents of each argument (index = input_index); throws shape_error
/// when the extents do not fit the ops (a dyn dimension that turned out to clash).
template <std::size_t N>
std::array<ir::node, N> specialise(const std::array<ir::node, N>& generic, const std::vector<dims>& args) {
  std::array<ir::node, N> out = generic;
  for (std::size_t i = 0; i < N; ++i) {
    ir::node& n = out[i];
    const auto in = [&](int q) -> const dims& { return out[n.inputs[q]].desc.shape; };
    switch (n.desc.kind) {
      case node_kind::input:
        n.desc.shape = args.at(n.desc.input_index);
        break;
      case node_kind::pointwise: {
        dims s = in(0);
        for (int q = 1; q < n.n_inputs; ++q) {
          const auto r = broadcast(s, in(q));
          if (!r.ok)
            throw shape_error(std::string(n.desc.name) + ": shapes " + to_string(s) + " and " + to_string(in(q)) +
                                  " cannot broadcast",
                              std::source_location{});
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
          throw shape_error("matmul: a is " + to_string(in(0)) + ", b is " + to_string(in(1)) +
                                "; the inner extents must match",
                            std::source_location{});
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
          if (!(o == s)) throw shape_error("pad: operands " + to_string(in(0)) + " and " + to_string(in(q)) +
                                               " differ away from axis " + std::to_string(axis), std::source_location{});
        }
        s.extent[axis] = n.desc.shape.extent[axis];
        if (!is_known_extent(s.extent[axis]) || end > s.extent[axis])
          throw shape_error("pad: the operands (" + to_string(in(0)) + ", ...) do not fit in " + to_string(n.desc.shape),
                            std::source_location{});
        n.desc.shape = s;
        break;
      }
      case node_kind::attention: {
        if (n.desc.variant != 0)  // the gradient kernels (expr/grad_nodes.hpp): host only so far
          throw invalid_argument(std::string("fusebox: ") + n.desc.name +
                                 " (attention's gradient) has no run-time-path or CUDA kernel yet: gradients through "
                                 "attention() run on the host backend, with static shapes");
        const auto r = fusebox::detail::attention_shape(in(0), in(1), in(2), n.desc.axis == 1);
        if (!r.rank_ok || !r.extents_ok || !r.causal_ok)
          throw shape_error("attention: q is " + to_string(in(0)) + ", k is " + to_string(in(1)) + ", v is " +
                                to_string(in(2)) + "; need [batch, tokens, heads, head dim] with equal batch and "
                                "heads, k and v the same tokens, q and k the same head dim" +
                                (r.causal_ok ? "" : ", and as many queries as keys for the causal mask"),
                            std::source_location{});
        n.desc.shape = r.out;
        break;
      }
      case node_kind::gather: {
        const auto r = fusebox::detail::gather_shape(n.desc.variant, n.desc.view_start, in(0), in(1));
        if (!r.ok) throw shape_error(fusebox::detail::gather_error_text(n.desc.variant, in(0), in(1)), std::source_location{});
        n.desc.shape = r.out;
        break;
      }
      case node_kind::spatial: {
        const dims b = n.n_inputs == 2 ? in(1) : dims{};
        const auto r = fusebox::detail::spatial_shape(n.desc.win, in(0), b);
        if (r.error != fusebox::detail::spatial_ok)
          throw shape_error(fusebox::detail::spatial_error_text(n.desc.win, in(0), b, r.error), std::source_location{});
        // A symbol names one extent; an output height is another, which the guard knows nothing of.
        for (std::size_t d = 1; d < 4; ++d)
          if (!is_known_extent(r.out.extent[d]))
            throw shape_error(std::string(n.desc.name) + ": operand " + to_string(in(0)) +
                                  (n.n_inputs == 2 ? ", " + to_string(b) : std::string()) +
                                  ": on the run-time path only the batch (dimension 0) of conv2d and pooling may "
                                  "vary; give channels, height and width static extents",
                              std::source_location{});
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
            throw shape_error("flatten<" + std::to_string(start) + ", " + std::to_string(end) + ">: " + to_string(in(0)) +
                                  ": on the run-time path the merged dimensions may not vary (their product would "
                                  "be an extent the guard knows nothing of); keep them static, or flatten only "
                                  "dimensions after the varying one",
                              std::source_location{});
          n.desc.shape = s;
        } else if (std::string_view(n.desc.name) == ops::unflatten_view<0, shape<1>>::name) {
          dims s{};
          if (!ops::unflattened(generic[i].desc.shape, in(0), n.desc.view_start, s))
            ops::throw_flatten("unflatten", in(0), n.desc.view_start, generic[i].desc.shape);
          n.desc.shape = s;
        }  // reshape: a static shape
        break;
      default:
        break;  // tensor leaves, scalars and opaque results have static shapes
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

}  // namespace fusebox::jit
