// optim/adamw.hpp: AdamW with torch.optim.AdamW's semantics (1.13, and the same numbers in 2.x):
// per element, at step t (counted from 1, per parameter group),
//   p  = p * (1 - lr * weight_decay)                       decoupled weight decay, first
//   m  = beta1 * m + (1 - beta1) * g
//   v  = beta2 * v + (1 - beta2) * g * g
//   vmax = max(vmax, v)                                     amsgrad only; then v below is vmax
//   p  = p - (lr / (1 - beta1^t)) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)
// (g = -gradient with maximize). The bias corrections and the step size are computed in double on
// the host, as torch computes them in Python floats, and enter the loop as scalars; the per-element
// arithmetic is in T. One fused pass over every parameter of every group per step (multi_tensor.hpp).
//
//   fb::optim::adamw opt(model.parameters(), {.lr = 1e-3, .weight_decay = 0.01});
//   auto [loss, grads] = step(x, t, params...);   // compiled value_and_grad
//   opt.step(grads);                              // a tuple of tensors, in the parameters' order
// Depends on: optim/multi_tensor.hpp.
#pragma once

#include <array>
#include <cmath>
#include <source_location>

#include "fusebox/ops/math.hpp"
#include "fusebox/optim/multi_tensor.hpp"

namespace fusebox::optim {

struct adamw_options {
  double lr = 1e-3;
  double beta1 = 0.9, beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 1e-2;
  bool amsgrad = false;
  bool maximize = false;
  unsigned threads = 0;  ///< threads of the update pass; 0: fusebox::default_threads()
};

template <class T>
class adamw : public detail::multi_tensor<T, adamw_options, 3> {
  using base = detail::multi_tensor<T, adamw_options, 3>;

 public:
  adamw(const nn::parameter_list<T>& params, const adamw_options& o = {}) : base("adamw", o.threads) {
    add_param_group(params, o);
  }
  void add_param_group(const nn::parameter_list<T>& params, const adamw_options& o) {
    validate(o);
    base::add_group(params, o);
  }

  /// One update of every parameter from its gradient (same order and shapes as the parameters).
  template <class G>
  void step(const G& grads, std::source_location loc = std::source_location::current()) {
    const auto bound = this->bind(nn::gradient_views<T>(grads), loc);
    struct scalars {
      T decay, b1, one_minus_b1, b2, one_minus_b2, step_size, bc2_sqrt, eps;
      bool amsgrad, maximize;
    };
    std::vector<scalars> s;
    for (const auto& g : this->groups_) validate(g.options);  // all before any state changes
    for (auto& g : this->groups_) {
      const auto& o = g.options;
      const double t = static_cast<double>(++g.step);
      const double bc1 = 1 - std::pow(o.beta1, t), bc2 = 1 - std::pow(o.beta2, t);
      s.push_back({T(1 - o.lr * o.weight_decay), T(o.beta1), T(1 - o.beta1), T(o.beta2), T(1 - o.beta2),
                   T(o.lr / bc1), T(std::sqrt(bc2)), T(o.eps), o.amsgrad, o.maximize});
    }
    this->run(bound, [&](const auto& b, std::uint32_t group, std::size_t begin, std::size_t end) {
      const scalars& c = s[group];
      auto update = [&c]<bool Amsgrad, class V>(std::bool_constant<Amsgrad>, V& p, const V& grad, V* st) {
        const V g = c.maximize ? V(-grad) : grad;
        p = p * V(c.decay);
        st[0] = st[0] * V(c.b1) + g * V(c.one_minus_b1);
        st[1] = st[1] * V(c.b2) + g * g * V(c.one_minus_b2);
        V v = st[1];
        if constexpr (Amsgrad) {
          st[2] = ops::math::maximum(st[2], v);
          v = st[2];
        }
        // torch: denom = sqrt(v) / sqrt(bc2) + eps; p += -step_size * (m / denom)
        const V denom = sqrt_v(v) / V(c.bc2_sqrt) + V(c.eps);
        p = p - V(c.step_size) * (st[0] / denom);
      };
      // Without amsgrad the third moment is neither read nor written.
      if (c.amsgrad)
        base::template for_elements<3>(b, begin, end, [&](auto& p, const auto& g, auto* st) { update(std::true_type{}, p, g, st); });
      else
        base::template for_elements<2>(b, begin, end, [&](auto& p, const auto& g, auto* st) { update(std::false_type{}, p, g, st); });
    });
  }

  /// Adam's moments of parameter i: exp_avg (k = 0), exp_avg_sq (1), max_exp_avg_sq (2).
  using base::state;
  static constexpr std::array<const char*, 3> state_names = {"exp_avg", "exp_avg_sq", "max_exp_avg_sq"};
  /// The state kinds a step reads (the first n of state_names): max_exp_avg_sq only with amsgrad
  /// in some group. What a checkpoint saves.
  std::size_t live_state_kinds() const {
    for (const auto& g : this->groups_)
      if (g.options.amsgrad) return 3;
    return 2;
  }

 private:
  template <class V>
  static V sqrt_v(const V& v) {
    if constexpr (cpu::is_batch_v<V>) return xsimd::sqrt(v);
    else return std::sqrt(v);
  }
  static void validate(const adamw_options& o) {
    detail::require(o.lr >= 0, "adamw", "learning rate", o.lr, "lr >= 0");
    detail::require(o.eps >= 0, "adamw", "epsilon value", o.eps, "eps >= 0");
    detail::require(o.beta1 >= 0 && o.beta1 < 1, "adamw", "beta parameter at index 0", o.beta1, "0 <= beta1 < 1");
    detail::require(o.beta2 >= 0 && o.beta2 < 1, "adamw", "beta parameter at index 1", o.beta2, "0 <= beta2 < 1");
    detail::require(o.weight_decay >= 0, "adamw", "weight_decay value", o.weight_decay, "weight_decay >= 0");
  }
};

template <class T>
adamw(const nn::parameter_list<T>&, const adamw_options& = {}) -> adamw<T>;

}  // namespace fusebox::optim
