// examples/fashion_cnn.hpp: BENCHMARKS.md's T2 network for examples/train_fashion_mnist.cpp, as
// nn modules (nn/module.hpp's protocol) around the conv2d and max_pool2d ops:
//
//   [B,1,28,28] -> conv 5x5 32 -> relu -> max-pool 2 -> [B,32,12,12]
//               -> conv 5x5 64 -> relu -> max-pool 2 -> [B,64,4,4] -> flatten 1024 -> linear 10
//
// Padding 0, so the flattened features are exactly the "linear 1024 -> 10" of BENCHMARKS.md
// ("same" padding 2 would give 7*7*64 = 3136). Each conv's bias and relu run as the convolution's
// epilogue. Parameter names follow torch.nn.Sequential ("0.weight", "0.bias", "3.weight", ...), so
// a state dict moves to and from the same nn.Sequential in PyTorch.
// train_fashion_mnist.cpp includes it and selects `fashion_cnn_model` for `--model cnn` (same
// members as its models::mlp: network, input_shape, name); the loader's [B, 784] batch reshaped to
// [B, 1, 28, 28] is a view.
// Depends on: fusebox/fusebox.hpp, fusebox/nn/nn.hpp.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <tuple>

#include <fusebox/fusebox.hpp>
#include <fusebox/nn/nn.hpp>

namespace fusebox::examples {

/// torch.nn.Conv2d(In, Out, K, stride=Stride, padding=Padding), torch's default initialisation
/// (uniform in +-1/sqrt(In*K*K) for weight and bias).
template <std::size_t In, std::size_t Out, std::size_t K, int Stride = 1, int Padding = 0, class T = float>
struct conv2d_layer {
  using value_type = T;
  static constexpr std::size_t param_count = 2;
  template <class Mode>
  static constexpr std::size_t random_count = 0;

  tensor<T, shape<Out, In, K, K>> weight;
  tensor<T, shape<Out>> bias;

  explicit conv2d_layer(nn::seeded s = {}) { reset_parameters(s.seed); }
  void reset_parameters(std::uint64_t seed) {
    const T bound = static_cast<T>(1 / std::sqrt(static_cast<double>(In * K * K)));
    weight.fill_random(seed * 2 + 1, -bound, bound);
    bias.fill_random(seed * 2 + 2, -bound, bound);
  }
  auto param_refs() { return std::tie(weight, bias); }
  void collect(nn::parameter_list<T>& out, const std::string& prefix) {
    out.add(prefix + "weight", weight);
    out.add(prefix + "bias", bias);
  }
  template <class Mode, std::size_t Batch>
  std::tuple<> make_randoms(std::uint64_t, std::uint64_t, std::uint64_t) const {
    return {};
  }
  template <class Mode, class X, class P, class R>
  static auto forward(Mode, const X& x, const P& p, const R&) {
    return conv2d<stride<Stride>, padding<Padding>>(x, std::get<0>(p), std::get<1>(p));
  }
};

/// torch.nn.MaxPool2d(Kernel).
template <int Kernel>
struct max_pool2d_layer : nn::detail::stateless<max_pool2d_layer<Kernel>> {
  template <class Mode, class X, class P, class R>
  static auto forward(Mode, const X& x, const P&, const R&) {
    return max_pool2d<Kernel>(x);
  }
};

/// torch.nn.Flatten(): [B, C, H, W] -> [B, C*H*W] (a view of the contiguous result before it).
struct flatten_layer : nn::detail::stateless<flatten_layer> {
  template <class Mode, class X, class P, class R>
  static auto forward(Mode, const X& x, const P&, const R&) {
    constexpr dims d = [] {
      if constexpr (is_expr_v<X>) return X::desc.shape;
      else return dims_of(typename X::shape_type{});
    }();
    static_assert(d.rank == 4 && d.is_static(), "flatten_layer: needs a static [B, C, H, W] operand");
    return reshape<shape<d.extent[0], d.extent[1] * d.extent[2] * d.extent[3]>>(x);
  }
};

/// T2, with the members train_fashion_mnist.cpp's models::mlp has.
struct fashion_cnn_model {
  using network = nn::sequential<conv2d_layer<1, 32, 5>, nn::relu_layer, max_pool2d_layer<2>, conv2d_layer<32, 64, 5>,
                                 nn::relu_layer, max_pool2d_layer<2>, flatten_layer, nn::linear<1024, 10>>;
  template <std::size_t B>
  using input_shape = shape<B, 1, 28, 28>;
  static constexpr const char* name = "cnn";
};

}  // namespace fusebox::examples
