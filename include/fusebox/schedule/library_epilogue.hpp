// schedule/library_epilogue.hpp: how much of a matmul's epilogue the library call that computes
// the product takes as it writes it (cuBLASLt's epilogues: add a residual laid out as C (beta·C),
// add a bias row, then relu or gelu_tanh). Decided once per plan from the epilogue group's ops and
// the backend's capabilities, instead of matching op names on every call; the one fact only the
// call knows, whether the residual is contiguous, the runner checks (`usable`).
// Depends on: plan/plan.hpp, ir/graph.hpp.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "fusebox/core/tensor.hpp"
#include "fusebox/ir/graph.hpp"
#include "fusebox/plan/plan.hpp"

namespace fusebox::schedule {

enum class activation : std::uint8_t { none, relu, gelu_tanh };

/// What a back end's matmul library can apply as it writes the product.
struct library_epilogue_caps {
  bool bias = false;       ///< add a contiguous row of the product's width
  bool residual = false;   ///< add a matrix laid out as the product
  bool relu = false;       ///< relu(product [+ bias]) (after the bias, before nothing else)
  bool gelu_tanh = false;  ///< gelu_tanh(product [+ bias])
};

struct library_epilogue {
  bool whole = false;   ///< the library call runs the whole epilogue: no epilogue kernel runs
  int bias = -1;        ///< the bias node, or -1
  int residual = -1;    ///< the residual node, or -1
  activation act = activation::none;

  /// Whether the call can use it: the residual, if any, must be contiguous in this call.
  template <class T>
  bool usable(const strided<T>* loc) const {
    return whole && (residual < 0 || (loc[residual].data && loc[residual].contiguous()));
  }
};

/// The library's share of matmul kernel `kn`'s epilogue: all of it or nothing. It takes a sum of
/// the product, at most one bias row (an argument or captured tensor with unit inner stride) and
/// at most one residual matrix, in any order and nesting of adds; or an activation of the product
/// or of product + bias (the library adds beta·C before its activation, so never with a residual).
template <std::size_t N>
constexpr library_epilogue library_epilogue_of(const std::array<ir::node, N>& nodes, const plan::plan_t<N>& p,
                                               const plan::kernel& kn, const std::array<bool, N>& unit_inner,
                                               const library_epilogue_caps& caps) {
  library_epilogue none;
  if (kn.kind != plan::kernel_kind::matmul || kn.group < 0) return none;
  const int m = kn.node;
  int act = -1, adds = 0;
  std::array<bool, N> member{};
  for (std::size_t g = 0; g < N; ++g) {
    if (p.group[g] != kn.group || static_cast<int>(g) == m) continue;
    const ir::node& n = nodes[g];
    const std::string_view op = n.desc.kind == node_kind::pointwise ? n.desc.name : "";
    if (op == "add" && n.n_inputs == 2) ++adds;
    else if (((op == "relu" && caps.relu) || (op == "gelu_tanh" && caps.gelu_tanh)) && n.n_inputs == 1 && act < 0)
      act = static_cast<int>(g);
    else return none;  // another op, or a second activation
    member[g] = true;
  }
  const dims& cs = nodes[m].desc.shape;
  int product_uses = 0;
  library_epilogue out;
  for (std::size_t g = 0; g < N; ++g) {
    if (!member[g] || static_cast<int>(g) == act) continue;
    for (int q = 0; q < 2; ++q) {
      const int in = nodes[g].inputs[q];
      if (in == m) {
        ++product_uses;
        continue;
      }
      if (member[in]) continue;
      const ir::node& x = nodes[in];
      const dims& xs = x.desc.shape;
      bool row = caps.bias && xs.rank >= 1 && xs.back(0) == cs.back(0) && unit_inner[in] &&
                 (x.desc.kind == node_kind::input || x.desc.kind == node_kind::tensor);
      for (std::size_t d = 0; row && d + 1 < xs.rank; ++d) row = xs.extent[d] == 1;
      if (row && out.bias < 0) out.bias = in;
      else if (caps.residual && xs == cs && out.residual < 0) out.residual = in;
      else return none;
    }
  }
  if (product_uses != (adds > 0 ? 1 : 0)) return none;
  if (act >= 0) {
    if (out.residual >= 0 || adds > 1) return none;
    const int in = nodes[act].inputs[0];
    if (in != m && !(adds == 1 && member[in])) return none;
    if (in == m && adds > 0) return none;
    out.act = std::string_view(nodes[act].desc.name) == "relu" ? activation::relu : activation::gelu_tanh;
  }
  out.whole = adds > 0 || act >= 0;
  return out.whole ? out : none;
}

}  // namespace fusebox::schedule
