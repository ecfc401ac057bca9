// tests/autodiff/ops_structural.cpp: the derivatives of the ops that change shapes: reductions
// (ops/reduce.hpp: sum, mean, max, min over each axis, with and without keepdim), matmul
// (ops/matmul.hpp: plain, batched, a shared rank-2 operand, a broadcast batch, transposed
// operands), views (ops/layout.hpp: transpose, reshape, flatten) and the compositions of
// ops/composite.hpp (softmax, log_softmax, layer_norm: their gradients come from their parts'
// rules). Each through value_and_grad eager and compiled, against central finite differences in
// double, every element (tests/autodiff/check_grad.hpp). Losses weigh the result with a random
// tensor so every element's gradient differs; max and min inputs are random, so no row has a tie.
#include <catch2/catch.hpp>

#include <fusebox/fusebox.hpp>

#include "check_grad.hpp"

namespace fb = fusebox;
using fbt::check_grad;
using fbt::positive_tensor;
using fbt::signed_tensor;
using fbt::total;

TEST_CASE("autodiff: reduction derivatives match central differences (every axis, keepdim or not)") {
  const auto x = signed_tensor<fb::shape<3, 4, 5>>(101);
  const auto r0 = signed_tensor<fb::shape<4, 5>>(102);
  const auto r1 = signed_tensor<fb::shape<3, 5>>(103);
  const auto r2 = signed_tensor<fb::shape<3, 4>>(104);
  const auto rk = signed_tensor<fb::shape<3, 4, 1>>(105);
#define FBT_REDUCE(fn)                                                                                              \
  check_grad(#fn " axis 0", [](const auto& u, const auto& w) { return total(fb::fn(u, fb::axis<0>) * w); },        \
             fb::wrt<0>, x, r0);                                                                                    \
  check_grad(#fn " axis 1", [](const auto& u, const auto& w) { return total(fb::fn(u, fb::axis<1>) * w); },        \
             fb::wrt<0>, x, r1);                                                                                    \
  check_grad(#fn " axis -1", [](const auto& u, const auto& w) { return total(fb::fn(u, fb::axis<-1>) * w); },      \
             fb::wrt<0>, x, r2);                                                                                    \
  check_grad(#fn " axis -1 keepdim",                                                                                \
             [](const auto& u, const auto& w) { return total(fb::fn(u, fb::axis<-1>, fb::keepdim) * w); }, fb::wrt<0>, \
             x, rk)
  FBT_REDUCE(sum);
  FBT_REDUCE(mean);
  FBT_REDUCE(max);
  FBT_REDUCE(min);
#undef FBT_REDUCE
  // Reductions of reductions: the incoming gradient reaches the inner one unexpanded.
  check_grad("mean(mean(x))", [](const auto& u) { return fb::mean(fb::mean(fb::mean(u))); }, fb::wrt<0>, x);
  check_grad("max(sum(x, 0))", [](const auto& u) { return fb::max(fb::max(fb::sum(u, fb::axis<0>))); }, fb::wrt<0>, x);
  check_grad("x - mean(x, -1, keepdim)",
             [](const auto& u, const auto& w) { return total((u - fb::mean(u, fb::axis<-1>, fb::keepdim)) * u * w); },
             fb::wrt<0>, x, signed_tensor<fb::shape<3, 4, 5>>(106));
}

TEST_CASE("autodiff: matmul derivatives match central differences (plain, batched, shared, broadcast batch)") {
  const auto a = signed_tensor<fb::shape<3, 4>>(201);
  const auto b = signed_tensor<fb::shape<4, 5>>(202);
  const auto r = signed_tensor<fb::shape<3, 5>>(203);
  const auto a3 = signed_tensor<fb::shape<2, 3, 4>>(204);
  const auto b3 = signed_tensor<fb::shape<2, 4, 5>>(205);
  const auto r3 = signed_tensor<fb::shape<2, 3, 5>>(206);
  const auto a1 = signed_tensor<fb::shape<1, 3, 4>>(207);
  const auto bt = signed_tensor<fb::shape<5, 4>>(208);
  auto mm = [](const auto& u, const auto& v, const auto& w) { return total(fb::matmul(u, v) * w); };
  check_grad("[3,4] x [4,5]", mm, fb::wrt<0, 1>, a, b, r);
  check_grad("[2,3,4] x [2,4,5]", mm, fb::wrt<0, 1>, a3, b3, r3);
  check_grad("[2,3,4] x [4,5] (shared b)", mm, fb::wrt<0, 1>, a3, b, r3);
  check_grad("[3,4] x [2,4,5] (shared a)", mm, fb::wrt<0, 1>, a, b3, r3);
  check_grad("[1,3,4] x [2,4,5] (broadcast batch)", mm, fb::wrt<0, 1>, a1, b3, r3);
  check_grad("x Wt (a Linear weight [5,4])",
             [](const auto& u, const auto& v, const auto& w) { return total(fb::matmul(u, fb::transpose(v)) * w); },
             fb::wrt<0, 1>, a, bt, r);
  check_grad("loss = sum(sum(matmul)) (an unexpanded gradient reaches the product)",
             [](const auto& u, const auto& v) { return total(fb::matmul(u, v)); }, fb::wrt<0, 1>, a, b);
  check_grad("tanh(matmul(matmul))",
             [](const auto& u, const auto& v, const auto& w) { return total(fb::tanh(fb::matmul(fb::matmul(u, v), w))); },
             fb::wrt<0, 1, 2>, a, b, signed_tensor<fb::shape<5, 2>>(209));
}

TEST_CASE("autodiff: view derivatives match central differences (transpose, reshape)") {
  const auto x = signed_tensor<fb::shape<3, 4>>(301);
  const auto r = signed_tensor<fb::shape<4, 3>>(302);
  const auto x3 = signed_tensor<fb::shape<2, 3, 4>>(303);
  const auto r3 = signed_tensor<fb::shape<4, 3, 2>>(304);
  const auto r26 = signed_tensor<fb::shape<2, 6>>(305);
  const auto r12 = signed_tensor<fb::shape<12>>(306);
  check_grad("transpose", [](const auto& u, const auto& w) { return total(fb::transpose(u) * w); }, fb::wrt<0>, x, r);
  check_grad("transpose<0, 2>", [](const auto& u, const auto& w) { return total(fb::transpose<0, 2>(u) * w); },
             fb::wrt<0>, x3, r3);
  check_grad("reshape [3,4] -> [2,6]",
             [](const auto& u, const auto& w) { return total(fb::reshape<fb::shape<2, 6>>(u) * w); }, fb::wrt<0>, x, r26);
  check_grad("reshape of a computed value",
             [](const auto& u, const auto& w) { return total(fb::exp(fb::reshape<fb::shape<12>>(fb::tanh(u))) * w); },
             fb::wrt<0>, x, r12);
  check_grad("reshape of a transposed gradient",
             [](const auto& u, const auto& w) { return total(fb::reshape<fb::shape<12>>(fb::exp(fb::transpose(u))) * w); },
             fb::wrt<0>, x, r12);
  check_grad("a sum of a transposed value (the gradient is a view)",
             [](const auto& u, const auto& w) { return total(fb::sum(fb::transpose(u), fb::axis<-1>) * w); }, fb::wrt<0>, x,
             signed_tensor<fb::shape<4>>(307));
}

TEST_CASE("autodiff: flatten's derivative matches central differences") {
  const auto x = signed_tensor<fb::shape<2, 3, 4>>(351);
  const auto r12 = signed_tensor<fb::shape<2, 12>>(352);
  const auto r6 = signed_tensor<fb::shape<6, 4>>(353);
  check_grad("flatten [2,3,4] -> [2,12]", [](const auto& u, const auto& w) { return total(fb::flatten(u) * w); },
             fb::wrt<0>, x, r12);
  check_grad("flatten<0, 1> of a computed value",
             [](const auto& u, const auto& w) { return total(fb::exp(fb::flatten<0, 1>(fb::tanh(u))) * w); }, fb::wrt<0>,
             x, r6);
  check_grad("flatten of a transposed value",
             [](const auto& u, const auto& w) { return total(fb::flatten(fb::exp(fb::transpose<1, 2>(u))) * w); },
             fb::wrt<0>, x, r12);
}

TEST_CASE("autodiff: compositions get their derivatives from their parts (softmax, log_softmax, layer_norm)") {
  const auto x = signed_tensor<fb::shape<3, 6>>(401);
  const auto r = signed_tensor<fb::shape<3, 6>>(402);
  const auto gamma = signed_tensor<fb::shape<6>>(403), beta = signed_tensor<fb::shape<6>>(404);
  check_grad("softmax", [](const auto& u, const auto& w) { return total(fb::softmax(u) * w); }, fb::wrt<0>, x, r);
  check_grad("softmax axis 0", [](const auto& u, const auto& w) { return total(fb::softmax(u, fb::axis<0>) * w); },
             fb::wrt<0>, x, r);
  check_grad("log_softmax", [](const auto& u, const auto& w) { return total(fb::log_softmax(u) * w); }, fb::wrt<0>, x, r);
  check_grad("layer_norm (x, gamma, beta)",
             [](const auto& u, const auto& g, const auto& b, const auto& w) { return total(fb::layer_norm(u, g, b, 1e-5) * w); },
             fb::wrt<0, 1, 2>, x, gamma, beta, r);
  // After a softmax, layer_norm is rewritten without the division (ops/composite.hpp) where captured;
  // eps 0.1 is of the row's variance, so the rewritten eps s^2 term carries gradient too.
  for (const double eps : {1e-5, 0.1})
    check_grad("layer_norm of a softmax, eps " + std::to_string(eps),
               [eps](const auto& u, const auto& g, const auto& b, const auto& w) {
                 return total(fb::layer_norm(fb::softmax(u), g, b, eps) * w);
               },
               fb::wrt<0, 1, 2>, x, gamma, beta, r);
  // Cross entropy with one-hot targets, the classifier's loss.
  fb::tensor<double, fb::shape<3, 6>> onehot;
  onehot.fill(0);
  onehot(0, 2) = 1;
  onehot(1, 0) = 1;
  onehot(2, 5) = 1;
  check_grad("cross entropy", [](const auto& u, const auto& t) { return -fb::mean(fb::sum(fb::log_softmax(u) * t)); },
             fb::wrt<0>, x, onehot);
}
