// tests/nn/gpt2_reference.hpp: what the GPT-2 block's tests (nn/gpt2*.cpp) share: the sizes, the
// block and attention types at them, random parameters, and a naive double reference of the
// block's forward (attention with a causal mask, layer norms, GELU(tanh) MLP) on token rows.
// And, for gpt2_block<d, heads, dyn>: one call checked against the eager step of a static block
// and the reference (check_dyn_call). The nn.gpt2 test is four units of one program, so that the
// build compiles them side by side.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <catch2/catch.hpp>

#include <fusebox/fusebox.hpp>
#include <fusebox/nn/nn.hpp>

#include "../autodiff/check_grad.hpp"

namespace fb = fusebox;
namespace nn = fusebox::nn;

namespace {


constexpr std::size_t B = 2, T = 3, D = 4, H = 2, E = D / H, N = B * T;
using block_t = nn::gpt2_block<D, H, T, double>;
using attn_t = nn::causal_self_attention<D, H, T, double>;
using rows = std::vector<double>;  // [n, width] row-major

/// Every parameter random (layer norms away from 1 and 0), so every one is used and tested.
template <class M>
void randomise(M& m, std::uint64_t seed) {
  std::apply([&](auto&... p) { (fbt::fill_signed(p, seed++, 0.1, 0.9), ...); }, m.param_refs());
}

template <class W, class Bias>
rows linear_ref(const rows& x, std::size_t in, const W& w, const Bias& b) {
  const std::size_t n = x.size() / in, out = w.extent(0);
  rows y(n * out);
  for (std::size_t i = 0; i < n; ++i)
    for (std::size_t o = 0; o < out; ++o) {
      double s = b(o);
      for (std::size_t k = 0; k < in; ++k) s += x[i * in + k] * w(o, k);
      y[i * out + o] = s;
    }
  return y;
}
template <class L>
rows layer_norm_ref(const rows& x, const L& ln) {
  rows y(x.size());
  for (std::size_t i = 0; i < x.size() / D; ++i) {
    double mean = 0, var = 0;
    for (std::size_t j = 0; j < D; ++j) mean += x[i * D + j] / D;
    for (std::size_t j = 0; j < D; ++j) var += (x[i * D + j] - mean) * (x[i * D + j] - mean) / D;
    for (std::size_t j = 0; j < D; ++j)
      y[i * D + j] = (x[i * D + j] - mean) / std::sqrt(var + 1e-5) * ln.weight(j) + ln.bias(j);
  }
  return y;
}
/// GPT-2's attention on token rows: q | k | v columns of c_attn's output, heads of E columns;
/// sequences of T tokens (a module's own T, or a call's when the module's is dyn).
template <class A>
rows attention_ref(A& a, const rows& x, std::size_t T = ::T) {
  const rows qkv = linear_ref(x, D, a.c_attn.weight, a.c_attn.bias);
  rows y(x.size(), 0.0);
  for (std::size_t b = 0; b < x.size() / D / T; ++b)
    for (std::size_t h = 0; h < H; ++h)
      for (std::size_t i = 0; i < T; ++i) {
        auto at = [&](std::size_t t, std::size_t part, std::size_t e) { return qkv[(b * T + t) * 3 * D + part * D + h * E + e]; };
        std::vector<double> s(i + 1);
        double m = -INFINITY, z = 0;
        for (std::size_t j = 0; j <= i; ++j) {
          s[j] = 0;
          for (std::size_t e = 0; e < E; ++e) s[j] += at(i, 0, e) * at(j, 1, e);
          s[j] /= std::sqrt(static_cast<double>(E));
          m = std::max(m, s[j]);
        }
        for (std::size_t j = 0; j <= i; ++j) z += std::exp(s[j] - m);
        for (std::size_t j = 0; j <= i; ++j)
          for (std::size_t e = 0; e < E; ++e) y[(b * T + i) * D + h * E + e] += std::exp(s[j] - m) / z * at(j, 2, e);
      }
  return linear_ref(y, D, a.c_proj.weight, a.c_proj.bias);
}
template <class M>
rows block_ref(M& m, const rows& x, std::size_t T = ::T) {
  rows h = attention_ref(m.attn, layer_norm_ref(x, m.ln_1), T);
  for (std::size_t i = 0; i < h.size(); ++i) h[i] += x[i];
  rows f = linear_ref(layer_norm_ref(h, m.ln_2), D, m.mlp.c_fc.weight, m.mlp.c_fc.bias);
  for (double& u : f) u = 0.5 * u * (1 + std::tanh(std::sqrt(2 / M_PI) * (u + 0.044715 * u * u * u)));
  rows y = linear_ref(f, 4 * D, m.mlp.c_proj.weight, m.mlp.c_proj.bias);
  for (std::size_t i = 0; i < y.size(); ++i) y[i] += h[i];
  return y;
}

template <class Y>
void check_rows(const Y& y, const rows& ref, const std::string& what) {
  REQUIRE(y.size() == ref.size());
  std::size_t bad = 0;
  double worst = 0;
  for (std::size_t i = 0; i < ref.size(); ++i) {
    const double d = std::fabs(static_cast<double>(y.flat(i)) - ref[i]);
    worst = std::max(worst, d);
    bad += !(d <= 1e-12 * (1 + std::fabs(ref[i])));
  }
  INFO(what << ": " << bad << " of " << ref.size() << " elements off the double reference; worst " << worst);
  CHECK(bad == 0);
}

template <class X>
rows to_rows(const X& x) {
  rows r(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) r[i] = x.flat(i);
  return r;
}

// ---- a dyn sequence length (issue 21): gpt2_block<d, heads, fb::dyn> ----
using dyn_block_t = nn::gpt2_block<D, H, fb::dyn, double>;
using dyn_objective = nn::detail::objective<dyn_block_t, nn::train_mode, nn::mse_loss_fn>;

/// Every element of each gradient in `got` against `want` (same order, same shapes).
template <class Got, class Want>
void check_grads_equal(const Got& got, const Want& want, const std::string& what) {
  [&]<std::size_t... P>(std::index_sequence<P...>) {
    (([&] {
       const auto& g = std::get<P>(got);
       const auto& w = std::get<P>(want);
       REQUIRE(g.size() == w.size());
       std::size_t bad = 0;
       double worst = 0;
       for (std::size_t k = 0; k < w.size(); ++k) {
         const double d = std::fabs(g.flat(k) - w.flat(k));
         worst = std::max(worst, d);
         bad += !(d <= 1e-12 * (1 + std::fabs(w.flat(k))));
       }
       INFO(what << ", parameter " << P << ": " << bad << " of " << w.size() << " elements differ; worst " << worst);
       CHECK(bad == 0);
     }()),
     ...);
  }(std::make_index_sequence<std::tuple_size_v<Want>>{});
}

/// One call with Bn sequences of L tokens, x and the target of type X (dyn extents): each of
/// `runs` (a name and a function of (x, t) returning {loss, gradients}) against the eager step of
/// a static gpt2_block<d, heads, L> holding m's parameters on static copies of the same rows
/// (nn/gpt2.cpp checks such a block's gradients against central differences), and its loss
/// against the double reference.
template <class X, std::size_t Bn, std::size_t L, class... Run>
void check_dyn_call(dyn_block_t& m, const std::pair<const char*, Run>&... runs) {
  INFO(Bn << " sequences of " << L << " tokens");
  nn::gpt2_block<D, H, L, double> s(0);
  std::apply([&](auto&... to) { std::apply([&](const auto&... from) { ((to = from.clone()), ...); }, m.param_refs()); },
             s.param_refs());
  const auto xs = fbt::signed_tensor<fb::shape<Bn, L, D>>(90 + 20 * Bn + L);
  const auto ts = fbt::signed_tensor<fb::shape<Bn, L, D>>(190 + 20 * Bn + L);
  auto dyn_copy = [](const auto& from) {
    X to = [] {
      if constexpr (X::shape_type::extents[0] == fb::dyn) return X(Bn, L);
      else return X(L);
    }();
    REQUIRE(to.size() == from.size());
    for (std::size_t i = 0; i < from.size(); ++i) to.flat(i) = from.flat(i);
    return to;
  };
  const X x = dyn_copy(xs), t = dyn_copy(ts);
  const rows y = block_ref(m, to_rows(x), L);
  double ref = 0;
  for (std::size_t i = 0; i < y.size(); ++i) ref += (y[i] - t.flat(i)) * (y[i] - t.flat(i)) / static_cast<double>(y.size());
  auto eager = nn::eager_step(s, nn::mse_loss_fn{});
  const auto [le, ge] = eager(xs, ts);
  CHECK(std::fabs(le.flat(0) - ref) <= 1e-12 * (1 + ref));
  // The dyn-T block's own forward, eager on the static rows: heads split by unflatten on tensors.
  check_rows(nn::forward(m, xs), y, "gpt2_block<d, heads, dyn>, eager");
  (([&] {
     const auto [l, g] = runs.second(x, t);
     INFO(runs.first);
     CHECK(std::fabs(l.flat(0) - ref) <= 1e-12 * (1 + ref));
     check_grads_equal(g, ge, std::string(runs.first) + ", B " + std::to_string(Bn) + ", T " + std::to_string(L));
   }()),
   ...);
}

}  // namespace
