// optim/sgd.hpp: SGD with torch.optim.SGD's semantics (momentum, dampening, nesterov,
// weight_decay, maximize): per element, with d = g (or -g with maximize),
//   d = d + weight_decay * p                      (when weight_decay != 0)
//   b = d                                         on the group's first step (torch clones d)
//   b = momentum * b + (1 - dampening) * d        afterwards              (when momentum != 0)
//   d = nesterov ? d + momentum * b : b           (when momentum != 0)
//   p = p - lr * d
// One fused pass over every parameter of every group per step (multi_tensor.hpp). As in torch,
// nesterov needs momentum > 0 and dampening = 0.
// Depends on: optim/multi_tensor.hpp.
#pragma once

#include <array>
#include <source_location>

#include "fusebox/optim/multi_tensor.hpp"

namespace fusebox::optim {

struct sgd_options {
  double lr = 1e-3;
  double momentum = 0;
  double dampening = 0;
  double weight_decay = 0;
  bool nesterov = false;
  bool maximize = false;
  unsigned threads = 0;  ///< threads of the update pass; 0: fusebox::default_threads()
};

template <class T>
class sgd : public detail::multi_tensor<T, sgd_options, 1> {
  using base = detail::multi_tensor<T, sgd_options, 1>;

 public:
  /// The state kept per parameter (torch's name for it).
  static constexpr std::array<const char*, 1> state_names = {"momentum_buffer"};
  /// The state kinds a step reads: the momentum buffer only with momentum in some group.
  std::size_t live_state_kinds() const {
    for (const auto& g : this->groups_)
      if (g.options.momentum != 0) return 1;
    return 0;
  }

  sgd(const nn::parameter_list<T>& params, const sgd_options& o = {}) : base("sgd", o.threads) {
    add_param_group(params, o);
  }
  void add_param_group(const nn::parameter_list<T>& params, const sgd_options& o) {
    validate(o);
    base::add_group(params, o);
  }

  template <class G>
  void step(const G& grads, std::source_location loc = std::source_location::current()) {
    const auto bound = this->bind(nn::gradient_views<T>(grads), loc);
    struct scalars {
      T lr, momentum, one_minus_dampening, weight_decay;
      bool first, nesterov, maximize;
    };
    std::vector<scalars> s;
    for (const auto& g : this->groups_) validate(g.options);  // all before any state changes
    for (auto& g : this->groups_) {
      const auto& o = g.options;
      s.push_back({T(o.lr), T(o.momentum), T(1 - o.dampening), T(o.weight_decay), g.step++ == 0, o.nesterov,
                   o.maximize});
    }
    this->run(bound, [&](const auto& b, std::uint32_t group, std::size_t begin, std::size_t end) {
      const scalars& c = s[group];
      const bool momentum = c.momentum != T(0), decay = c.weight_decay != T(0);
      auto update = [&]<class V>(V& p, const V& grad, V* st) {
        V d = c.maximize ? V(-grad) : grad;
        if (decay) d = d + V(c.weight_decay) * p;
        if (momentum) {
          st[0] = c.first ? d : V(c.momentum) * st[0] + V(c.one_minus_dampening) * d;
          d = c.nesterov ? d + V(c.momentum) * st[0] : st[0];
        }
        p = p - V(c.lr) * d;
      };
      if (momentum) base::template for_elements<1>(b, begin, end, update);
      else base::template for_elements<0>(b, begin, end, update);
    });
  }

  /// The momentum buffer of parameter i (k = 0).
  using base::state;

 private:
  static void validate(const sgd_options& o) {
    detail::require(o.lr >= 0, "sgd", "learning rate", o.lr, "lr >= 0");
    detail::require(o.momentum >= 0, "sgd", "momentum value", o.momentum, "momentum >= 0");
    detail::require(o.weight_decay >= 0, "sgd", "weight_decay value", o.weight_decay, "weight_decay >= 0");
    detail::require(!o.nesterov || (o.momentum > 0 && o.dampening == 0), "sgd", "nesterov momentum", o.momentum,
                    "nesterov requires a momentum and zero dampening");
  }
};

template <class T>
sgd(const nn::parameter_list<T>&, const sgd_options& = {}) -> sgd<T>;

}  // namespace fusebox::optim
