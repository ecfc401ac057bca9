// nn/step.hpp: a module and a loss as one training step, and a module as an inference function.
//
//   auto step = nn::compile_step(model, nn::cross_entropy_loss{});   // train mode by default
//   auto [loss, grads] = step(x, target);     // forward + backward: one planned program
//   opt.step(grads);                          // gradients in model.parameters() order
//   auto infer = nn::compile_forward(model);  // eval mode: dropout off, its own program
//   auto logits = infer(x);
//
// The step captures `loss(model.forward(mode, x, params, randoms), target)` with x, the target, the
// random inputs (dropout masks, made on the host per call from (seed, call counter)) and every
// parameter as arguments, and differentiates the parameters (value_and_grad with wrt<the
// parameters' positions>). The parameters are read where they live at each call, so an
// optimizer's in-place update is seen by the next call without a copy, and the program is
// planned once per argument type. eager_step / forward() run the same thing op by op (the A/B
// baseline, and the reference the compiled step is tested against). A compiled step over x with a
// `dyn` batch runs on the run-time path (autodiff/grad.hpp), recompiling only as the forward would,
// for models without random inputs in the mode (dropout's masks are made for a static batch).
// On the GPU: nn::to_device(model) (nn/device.hpp) and compile_step / compile_forward over it, with
// cuda::tensor inputs.
// Depends on: nn/module.hpp, nn/device.hpp, autodiff/grad.hpp, compile.hpp, jit.hpp (dyn extents).
#pragma once

#include <cstdint>
#include <tuple>
#include <utility>

#include "fusebox/autodiff/grad.hpp"
#include "fusebox/compile.hpp"
#include "fusebox/jit.hpp"  // the step takes dyn extents (a variable batch or sequence length)
#include "fusebox/nn/device.hpp"
#include "fusebox/nn/loss.hpp"
#include "fusebox/nn/module.hpp"

namespace fusebox::nn {

/// Losses as values a step can hold.
struct cross_entropy_loss {
  template <class L, class T>
  auto operator()(const L& logits, const T& target) const {
    return cross_entropy(logits, target);
  }
};
struct mse_loss_fn {
  template <class P, class T>
  auto operator()(const P& pred, const T& target) const {
    return mse_loss(pred, target);
  }
};

namespace detail {

/// loss(model(x), target) over (x, target, randoms..., params...): what value_and_grad sees.
template <class Model, class Mode, class Loss>
struct objective {
  Loss loss;
  template <class X, class Target, class... Rest>
  auto operator()(const X& x, const Target& target, const Rest&... rest) const {
    constexpr std::size_t r = Model::template random_count<Mode>;
    const std::tuple<const Rest&...> all(rest...);
    return loss(Model::forward(Mode{}, x, sub_tuple<r, Model::param_count>(all), sub_tuple<0, r>(all)), target);
  }
};

/// model(x) over (x, params...): the inference function (no random inputs: eval mode).
template <class Model, class Mode>
struct inference {
  template <class X, class... P>
  auto operator()(const X& x, const P&... params) const {
    return Model::forward(Mode{}, x, std::tuple<const P&...>(params...), std::tuple<>{});
  }
};

template <std::size_t First, std::size_t... I>
constexpr auto wrt_from(std::index_sequence<I...>) {
  return wrt<(First + I)...>;
}

template <class X>
constexpr std::size_t batch_of() {
  static_assert(X::rank >= 1 && X::shape_type::extents[0] != dyn,
                "fusebox::nn step: dropout in this mode makes its masks for a static batch: x must have a static "
                "batch (first) extent, or train in a mode without random inputs");
  return X::shape_type::extents[0];
}

}  // namespace detail

/// A training step over a model (held by reference: it must outlive the step). Holder is the
/// model, or its parameters on the GPU (nn/device.hpp's device_model<Model>).
template <class Model, class Mode, class Loss, bool Compiled, class Holder = Model>
class step_fn {
  using objective = detail::objective<Model, Mode, Loss>;
  static constexpr auto wrt_params =
      detail::wrt_from<2 + Model::template random_count<Mode>>(std::make_index_sequence<Model::param_count>{});
  using grad_t = decltype(value_and_grad(std::declval<objective>(), wrt_params));
  using run_t = std::conditional_t<Compiled, decltype(fusebox::compile(std::declval<grad_t>())), grad_t>;
  static_assert(Model::param_count >= 1, "fusebox::nn step: the model has no parameters to train");

 public:
  step_fn(Holder& model, Loss loss, options opts, std::uint64_t seed)
      : model_(model), run_(make(std::move(loss), opts)), seed_(seed) {}

  /// (loss, gradients): gradients as a std::tuple in the order of model.parameters() (a bare
  /// tensor when the model has one parameter).
  template <class X, class Target>
  auto operator()(const X& x, const Target& target) {
    auto randoms = [&] {
      if constexpr (Model::template random_count<Mode> == 0) return std::tuple<>{};  // any batch, dyn too
      else return model_.template make_randoms<Mode, detail::batch_of<X>()>(seed_, counter_);
    }();
    ++counter_;
    return std::apply(
        [&](const auto&... r) {
          return std::apply([&](const auto&... p) { return run_(x, target, r..., p...); }, model_.param_refs());
        },
        randoms);
  }

  /// Calls so far: the counter the next call's random inputs are made from.
  std::uint64_t counter() const noexcept { return counter_; }
  void set_counter(std::uint64_t c) noexcept { counter_ = c; }
  run_t& function() noexcept { return run_; }

 private:
  static run_t make(Loss loss, options opts) {
    auto g = value_and_grad(objective{std::move(loss)}, wrt_params);
    if constexpr (Compiled) return fusebox::compile(std::move(g), opts);
    else return g;
  }
  Holder& model_;
  run_t run_;
  std::uint64_t seed_;
  std::uint64_t counter_ = 0;
};

/// A compiled training step (forward, loss, backward: one program).
template <class Model, class Loss, class Mode = train_mode>
auto compile_step(Model& model, Loss loss, Mode = {}, options opts = {}, std::uint64_t seed = 0) {
  return step_fn<Model, Mode, Loss, true>(model, std::move(loss), opts, seed);
}
/// A compiled training step on the GPU: x and the target are cuda::tensors (a dyn batch too), the
/// parameters are the device_model's, the gradients device tensors (nn/device.hpp).
template <class Model, class Loss, class Mode = train_mode>
auto compile_step(device_model<Model>& model, Loss loss, Mode = {}, options opts = {}, std::uint64_t seed = 0) {
  return step_fn<Model, Mode, Loss, true, device_model<Model>>(model, std::move(loss), opts, seed);
}
/// The same step run op by op.
template <class Model, class Loss, class Mode = train_mode>
auto eager_step(Model& model, Loss loss, Mode = {}, std::uint64_t seed = 0) {
  return step_fn<Model, Mode, Loss, false>(model, std::move(loss), options{}, seed);
}

/// A compiled inference function, eval mode by default: `infer(x)` reads the model's current
/// parameters at each call (Holder: the model, or its device_model).
template <class Model, class Mode = eval_mode, class Holder = Model>
class forward_fn {
  static_assert(Model::template random_count<Mode> == 0,
                "fusebox::nn::compile_forward: in this mode the model takes random inputs (dropout in train "
                "mode); compile the forward in eval mode, or train through compile_step");
  using run_t = decltype(fusebox::compile(detail::inference<Model, Mode>{}));

 public:
  forward_fn(Holder& model, options opts) : model_(model), run_(fusebox::compile(detail::inference<Model, Mode>{}, opts)) {}
  template <class X>
  auto operator()(const X& x) {
    return std::apply([&](const auto&... p) { return run_(x, p...); }, model_.param_refs());
  }

 private:
  Holder& model_;
  run_t run_;
};

template <class Model, class Mode = eval_mode>
auto compile_forward(Model& model, Mode = {}, options opts = {}) {
  return forward_fn<Model, Mode>(model, opts);
}
/// The compiled forward on the GPU: x a cuda::tensor, the device_model's parameters.
template <class Model, class Mode = eval_mode>
auto compile_forward(device_model<Model>& model, Mode = {}, options opts = {}) {
  return forward_fn<Model, Mode, device_model<Model>>(model, opts);
}

/// The model on x, eagerly (op by op), in eval mode unless told.
template <class Model, class X, class Mode = eval_mode>
auto forward(Model& model, const X& x, Mode = {}) {
  static_assert(Model::template random_count<Mode> == 0, "fusebox::nn::forward: use eval mode (dropout needs masks)");
  return std::apply([&](const auto&... p) { return detail::inference<Model, Mode>{}(x, p...); }, model.param_refs());
}

}  // namespace fusebox::nn
