// nn/device.hpp: a model's parameters on the GPU (torch's model.to("cuda")), so the nn step and
// the compiled forward run on device tensors.
//
//   auto gpu = nn::to_device(model);                          // float32 cuda::tensors, uploaded once
//   auto step = nn::compile_step(gpu, nn::mse_loss_fn{}, nn::eval);   // x, target: cuda::tensors
//   fb::optim::cuda_adamw opt(gpu.parameters(), {.lr = 1e-3});
//   auto [loss, grads] = step(dx, dt);                        // a dyn batch too
//   opt.step(grads);                                          // in place, on the device
//   gpu.to_host(model);                                       // the trained values, back in the model
//
// A device_model stands in for its Model wherever a step or a forward holds one: the same
// param_count, random_count and param_refs() (device tensors here, in the model's order), and
// make_randoms (the model's host masks, uploaded: one per call, as dropout makes them). The
// model itself is only read again by to_host(); it must outlive the device_model.
// Depends on: nn/module.hpp, nn/parameters.hpp, backend/cuda/tensor.hpp.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "fusebox/backend/cuda/tensor.hpp"
#include "fusebox/nn/module.hpp"
#include "fusebox/nn/parameters.hpp"

namespace fusebox::nn {

template <class Model>
class device_model {
  template <class Refs>
  struct device_tuple;
  template <class... P>
  struct device_tuple<std::tuple<P&...>> {
    static_assert((std::is_same_v<typename P::value_type, float> && ...),
                  "fusebox::nn::to_device: the model's parameters must be float32 (the CUDA backend computes in "
                  "float32)");
    using type = std::tuple<cuda::tensor<float, typename P::shape_type>...>;
  };
  using params_t = typename device_tuple<decltype(std::declval<Model&>().param_refs())>::type;

 public:
  using model_type = Model;
  static constexpr std::size_t param_count = Model::param_count;
  template <class Mode>
  static constexpr std::size_t random_count = Model::template random_count<Mode>;

  explicit device_model(Model& model)
      : model_(model), params_(std::apply([](auto&... p) { return params_t(p...); }, model.param_refs())) {}

  /// The device parameters, in the model's order (what a step or a forward passes).
  auto param_refs() {
    return std::apply([](auto&... p) { return std::tie(p...); }, params_);
  }

  /// The model's random inputs of one step, made on the host as the model makes them, uploaded.
  template <class Mode, std::size_t Batch>
  auto make_randoms(std::uint64_t seed, std::uint64_t counter, std::uint64_t stream = 0) const {
    const auto host = model_.template make_randoms<Mode, Batch>(seed, counter, stream);
    return std::apply(
        [](const auto&... r) {
          return std::make_tuple(cuda::tensor<float, typename std::remove_cvref_t<decltype(r)>::shape_type>(r)...);
        },
        host);
  }

  /// The parameters under the model's names, for a device optimizer (optim::cuda_adamw).
  std::vector<named_parameter<float>> parameters() {
    const parameter_list<float> names = model_.template parameters<float>();
    std::vector<named_parameter<float>> out;
    std::size_t k = 0;
    std::apply([&](auto&... p) { (out.push_back({names[k++].name, p.data(), p.extents()}), ...); }, params_);
    return out;
  }

  /// Copies the device values into the model's own tensors (which it must still own).
  void to_host(Model& model) const {
    auto host = model.param_refs();
    [&]<std::size_t... I>(std::index_sequence<I...>) {
      (([&] {
         const auto h = std::get<I>(params_).to_host();
         std::memcpy(std::get<I>(host).data(), h.data(), h.size() * sizeof(float));
       }()),
       ...);
    }(std::make_index_sequence<param_count>{});
  }

 private:
  Model& model_;
  params_t params_;
};

/// The model's parameters uploaded to the current CUDA device.
template <class Model>
device_model<Model> to_device(Model& model) {
  return device_model<Model>(model);
}

template <class T>
inline constexpr bool is_device_model_v = false;
template <class Model>
inline constexpr bool is_device_model_v<device_model<Model>> = true;

}  // namespace fusebox::nn
