// tests/autodiff/attention_block.cpp: the gradients of a pre-norm attention block (layer_norm, q k v
// of one normed input, softmax of scaled scores, two residuals, a gelu MLP, MSE) against central
// finite differences in double, every element of every argument, eager and compiled
// (tests/autodiff/check_grad.hpp). Every value is read several times and the loss holds numbers
// (eps, the scale): the case that lifting by slot (autodiff/lift.hpp) and the storage-free gradient
// types (autodiff/sym.hpp) exist for. Its own file: it is the costliest build of the autodiff tests.
#include <catch2/catch.hpp>

#include <fusebox/fusebox.hpp>

#include "check_grad.hpp"

namespace fb = fusebox;
using fbt::check_grad;
using fbt::signed_tensor;

TEST_CASE("autodiff: a pre-norm attention block's gradients match central differences, every parameter element") {
  auto block_loss = [](const auto& x, const auto& g, const auto& b, const auto& wq, const auto& wk, const auto& wv,
                       const auto& w1, const auto& w2, const auto& t) {
    const auto n = fb::layer_norm(x, g, b, 1e-5);
    const auto a = fb::softmax(fb::matmul(fb::matmul(n, wq), fb::transpose(fb::matmul(n, wk))) * 0.35);
    const auto h = x + fb::matmul(a, fb::matmul(n, wv));
    const auto y = h + fb::matmul(fb::gelu(fb::matmul(fb::layer_norm(h, g, b, 1e-5), w1)), w2);
    const auto e = y - t;
    return fb::mean(fb::mean(e * e));
  };
  using X = fb::shape<4, 8>;
  check_grad("attention block", block_loss, fb::wrt<0, 1, 2, 3, 4, 5, 6, 7>, signed_tensor<X>(5001, 0.1, 1.0),
             signed_tensor<fb::shape<8>>(5002, 0.5, 1.5), signed_tensor<fb::shape<8>>(5003, 0.05, 0.5),
             signed_tensor<fb::shape<8, 8>>(5004, 0.05, 0.6), signed_tensor<fb::shape<8, 8>>(5005, 0.05, 0.6),
             signed_tensor<fb::shape<8, 8>>(5006, 0.05, 0.6), signed_tensor<fb::shape<8, 16>>(5007, 0.05, 0.5),
             signed_tensor<fb::shape<16, 8>>(5008, 0.05, 0.5), signed_tensor<X>(5009, 0.1, 1.0));
}
