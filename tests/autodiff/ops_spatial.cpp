// tests/autodiff/ops_spatial.cpp: the derivatives of conv2d, max_pool2d and avg_pool2d
// (ops/conv.hpp, ops/pool.hpp: conv2d_input_grad, conv2d_weight_grad, max_pool2d_backward,
// avg_pool2d_backward, and the bias's gradient as the reverse pass's sum over N, H, W), eager and
// compiled, against central differences in double on every element (check_grad.hpp): stride 1 and
// 2, padding, overlapping pooling windows (gradients add), and a small CNN end to end. Losses weigh
// the result with a random tensor so every element's gradient differs. Inputs are random, so no
// pooling window has a tie (a finite difference across a tie is one-sided); the tie rule (the
// first maximum in row-major order takes the gradient, as torch's CPU kernel) is checked exactly.
#include <catch2/catch.hpp>

#include <fusebox/fusebox.hpp>

#include "check_grad.hpp"

namespace fb = fusebox;
using fbt::check_grad;
using fbt::signed_tensor;
using fbt::total;

TEST_CASE("autodiff: conv2d's gradients w.r.t. input, weight and bias match central differences") {
  {
    const auto x = signed_tensor<fb::shape<2, 2, 5, 6>>(301);
    const auto w = signed_tensor<fb::shape<3, 2, 3, 3>>(302);
    const auto b = signed_tensor<fb::shape<3>>(303);
    const auto r = signed_tensor<fb::shape<2, 3, 5, 6>>(304);
    auto loss = [](const auto& u, const auto& v, const auto& c, const auto& q) { return total(fb::conv2d<fb::padding<1>>(u, v, c) * q); };
    check_grad("conv2d<padding<1>> + bias", loss, fb::wrt<0, 1, 2>, x, w, b, r);
  }
  {
    const auto x = signed_tensor<fb::shape<2, 2, 7, 6>>(311);
    const auto w = signed_tensor<fb::shape<3, 2, 3, 2>>(312);  // a non-square kernel
    const auto r = signed_tensor<fb::shape<2, 3, 4, 4>>(314);
    auto loss = [](const auto& u, const auto& v, const auto& q) { return total(fb::tanh(fb::conv2d<fb::stride<2>, fb::padding<1>>(u, v)) * q); };
    check_grad("tanh(conv2d<stride<2>, padding<1>>)", loss, fb::wrt<0, 1>, x, w, r);
  }
}

TEST_CASE("autodiff: max_pool2d and avg_pool2d gradients match central differences") {
  const auto x = signed_tensor<fb::shape<2, 3, 6, 5>>(401);
  const auto r2 = signed_tensor<fb::shape<2, 3, 3, 2>>(402);
  const auto r3 = signed_tensor<fb::shape<2, 3, 3, 3>>(403);
  check_grad("max_pool2d<2>", [](const auto& u, const auto& q) { return total(fb::max_pool2d<2>(u) * q); }, fb::wrt<0>, x,
             r2);
  check_grad("max_pool2d<3, stride<2>, padding<1>> (overlapping)",
             [](const auto& u, const auto& q) { return total(fb::max_pool2d<3, fb::stride<2>, fb::padding<1>>(u) * q); }, fb::wrt<0>, x, r3);
  check_grad("avg_pool2d<2>", [](const auto& u, const auto& q) { return total(fb::avg_pool2d<2>(u) * q); }, fb::wrt<0>, x,
             r2);
  check_grad("avg_pool2d<3, stride<2>, padding<1>> (overlapping)",
             [](const auto& u, const auto& q) { return total(fb::avg_pool2d<3, fb::stride<2>, fb::padding<1>>(u) * q); }, fb::wrt<0>, x, r3);
}

TEST_CASE("autodiff: max_pool2d gives a tied window's gradient to its first maximum (row-major)") {
  // One 4x4 plane, 2x2 windows: window 0 all equal, window 1 ties at its last two elements,
  // window 2 ties on its second row, window 3 has a single maximum.
  fb::tensor<double, fb::shape<1, 1, 4, 4>> x;
  const double plane[16] = {5, 5, 1, 2,   //
                            5, 5, 3, 3,   //
                            0, -1, 4, 9,  //
                            7, 7, 8, 2};
  for (int i = 0; i < 16; ++i) x.flat(i) = plane[i];
  fb::tensor<double, fb::shape<1, 1, 2, 2>> q;
  const double weights[4] = {1.5, -2.0, 3.0, 0.25};
  for (int i = 0; i < 4; ++i) q.flat(i) = weights[i];
  auto loss = [](const auto& u, const auto& c) { return total(fb::max_pool2d<2>(u) * c); };
  const double want[16] = {1.5, 0, 0, 0,     //
                           0, 0, -2.0, 0,    //
                           0, 0, 0, 0.25,    //
                           3.0, 0, 0, 0};
  const auto eager = fb::grad(loss, fb::wrt<0>)(x, q);
  const auto compiled = fb::compile(fb::grad(loss, fb::wrt<0>))(x, q);
  for (int i = 0; i < 16; ++i) {
    INFO("element " << i);
    CHECK(eager.flat(i) == want[i]);
    CHECK(compiled.flat(i) == want[i]);
  }
}

// relu then max pooling: relu's rule moves its mask before the pooling's scatter (it reads the
// pooled values), and a bias summed over whole planes is summed from the pooled gradient
// (autodiff::restate_for_sum). Both are checked against central differences, with 2x2 windows,
// overlapping padded ones, and an operand broadcast over W only, whose sum must not be restated.
TEST_CASE("autodiff: conv, bias, relu, max_pool2d: the mask before the scatter, the bias from the pooled gradient") {
  const auto x = signed_tensor<fb::shape<2, 2, 7, 6>>(601);
  const auto w = signed_tensor<fb::shape<3, 2, 3, 3>>(602);
  const auto b = signed_tensor<fb::shape<3>>(603);
  const auto r2 = signed_tensor<fb::shape<2, 3, 3, 3>>(604);
  const auto r3 = signed_tensor<fb::shape<2, 3, 4, 3>>(605);
  check_grad("max_pool2d<2>(relu(conv2d<padding<1>> + bias))",
             [](const auto& u, const auto& v, const auto& c, const auto& q) {
               return total(fb::max_pool2d<2>(fb::relu(fb::conv2d<fb::padding<1>>(u, v, c))) * q);
             },
             fb::wrt<0, 1, 2>, x, w, b, r2);
  check_grad("max_pool2d<3, stride<2>, padding<1>>(relu(conv2d<padding<1>> + bias)) (overlapping, padded)",
             [](const auto& u, const auto& v, const auto& c, const auto& q) {
               return total(fb::max_pool2d<3, fb::stride<2>, fb::padding<1>>(fb::relu(fb::conv2d<fb::padding<1>>(u, v, c))) * q);
             },
             fb::wrt<0, 1, 2>, x, w, b, r3);
  const auto z = signed_tensor<fb::shape<2, 3, 6, 4>>(606);
  const auto per_h = signed_tensor<fb::shape<6, 1>>(607);    // broadcast over N, C and W: not whole planes
  const auto per_c = signed_tensor<fb::shape<3, 1, 1>>(608);  // over N, H and W: whole planes
  const auto q = signed_tensor<fb::shape<2, 3, 3, 2>>(609);
  check_grad("max_pool2d<2>(relu(z + [6, 1] + [3, 1, 1]))",
             [](const auto& u, const auto& h, const auto& c, const auto& r) {
               return total(fb::max_pool2d<2>(fb::relu(u + h + c)) * r);
             },
             fb::wrt<0, 1, 2>, z, per_h, per_c, q);
}

// The same gradient to the bit as relu's mask applied after the scatter, where it is exactly
// known: windows all below zero (relu's output ties at 0: the gradient's first maximum is masked),
// ties among positive values, single maxima.
TEST_CASE("autodiff: relu then max_pool2d: the gradient is the masked scatter, exactly") {
  fb::tensor<double, fb::shape<1, 1, 4, 6>> z;
  const double plane[24] = {-1, -2, 3, 3, 0.5, -4,    //
                            -3, -1, 1, 2, -0.5, 2,    //
                            -2, -5, 4, 4, 7, 1,       //
                            -1, -0.5, 4, 4, -7, 6.5};
  for (int i = 0; i < 24; ++i) z.flat(i) = plane[i];
  fb::tensor<double, fb::shape<1, 1, 2, 3>> q;
  const double weights[6] = {1.5, -2.0, 3.0, 0.25, -0.75, 5.0};
  for (int i = 0; i < 6; ++i) q.flat(i) = weights[i];
  auto loss = [](const auto& u, const auto& c) { return total(fb::max_pool2d<2>(fb::relu(u)) * c); };
  // Window (0, 0) is all negative: relu gives four zeros, the first takes the gradient, the mask
  // zeroes it. (0, 1): 3, 3 tie, the first wins. (0, 2): 2 at (1, 5). (1, 0): all negative.
  // (1, 1): 4 four times, the first. (1, 2): 7 at (2, 4).
  const double want[24] = {0, 0, -2.0, 0, 0, 0,  //
                           0, 0, 0, 0, 0, 3.0,   //
                           0, 0, -0.75, 0, 5.0, 0,  //
                           0, 0, 0, 0, 0, 0};
  const auto eager = fb::grad(loss, fb::wrt<0>)(z, q);
  const auto compiled = fb::compile(fb::grad(loss, fb::wrt<0>))(z, q);
  for (int i = 0; i < 24; ++i) {
    INFO("element " << i);
    CHECK(eager.flat(i) == want[i]);
    CHECK(compiled.flat(i) == want[i]);
  }
}

TEST_CASE("autodiff: a small CNN (conv, tanh, pool, conv, pool, linear) matches central differences") {
  const auto x = signed_tensor<fb::shape<2, 1, 8, 8>>(501);
  const auto w1 = signed_tensor<fb::shape<3, 1, 3, 3>>(502, 0.1, 0.6);
  const auto b1 = signed_tensor<fb::shape<3>>(503);
  const auto w2 = signed_tensor<fb::shape<4, 3, 3, 3>>(504, 0.05, 0.3);
  const auto b2 = signed_tensor<fb::shape<4>>(505);
  const auto wl = signed_tensor<fb::shape<16, 5>>(506);
  const auto t = signed_tensor<fb::shape<2, 5>>(507);
  auto loss = [](const auto& u, const auto& a, const auto& ab, const auto& c, const auto& cb, const auto& l,
                 const auto& target) {
    const auto h = fb::max_pool2d<2>(fb::tanh(fb::conv2d<fb::padding<1>>(u, a, ab)));    // [2, 3, 4, 4]
    const auto g = fb::avg_pool2d<2>(fb::tanh(fb::conv2d<fb::padding<1>>(h, c, cb)));    // [2, 4, 2, 2]
    const auto e = fb::matmul(fb::reshape<fb::shape<2, 16>>(g), l) - target;  // [2, 5]
    return fb::mean(fb::mean(e * e));
  };
  check_grad("CNN", loss, fb::wrt<0, 1, 2, 3, 4, 5>, x, w1, b1, w2, b2, wl, t);
}
