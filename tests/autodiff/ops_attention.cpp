// tests/autodiff/ops_attention.cpp: the derivatives of attention() (ops/attention.hpp: its two
// gradient kernels, backend/cpu/attention.hpp) and of slice (ops/layout.hpp: a zero-padded gradient),
// through value_and_grad eager and compiled, against central finite differences in double on every
// element (tests/autodiff/check_grad.hpp): causal and not, more keys than queries, a value head dim
// other than the query's (two gradient kernels) and equal (one), strided operands (q, k, v sliced from one packed projection, so one
// gradient [.., 3C] gathers three), slices along every axis, overlapping slices, an unread part.
// Losses weigh the result with a random tensor so every element's gradient differs.
#include <catch2/catch.hpp>

#include <fusebox/fusebox.hpp>

#include "check_grad.hpp"

namespace fb = fusebox;
using fbt::check_grad;
using fbt::signed_tensor;
using fbt::total;

TEST_CASE("autodiff: attention's derivative matches central differences (causal or not, Tk != Tq, Ev != E)") {
  // Scores of O(1): magnitudes up to 1.5 in head dim 3 keep the softmax far from one-hot.
  const auto q = signed_tensor<fb::shape<2, 3, 2, 3>>(7101, 0.1, 1.5);
  const auto k = signed_tensor<fb::shape<2, 5, 2, 3>>(7102, 0.1, 1.5);
  const auto v = signed_tensor<fb::shape<2, 5, 2, 4>>(7103, 0.1, 1.5);
  const auto w = signed_tensor<fb::shape<2, 3, 2, 4>>(7104);
  check_grad("attention, 3 queries, 5 keys",
             [](const auto& a, const auto& b, const auto& c, const auto& r) { return total(fb::attention(a, b, c) * r); },
             fb::wrt<0, 1, 2>, q, k, v, w);

  const auto qc = signed_tensor<fb::shape<2, 4, 2, 3>>(7111, 0.1, 1.5);
  const auto kc = signed_tensor<fb::shape<2, 4, 2, 3>>(7112, 0.1, 1.5);
  const auto vc = signed_tensor<fb::shape<2, 4, 2, 2>>(7113, 0.1, 1.5);
  const auto wc = signed_tensor<fb::shape<2, 4, 2, 2>>(7114);
  check_grad("causal attention",
             [](const auto& a, const auto& b, const auto& c, const auto& r) {
               return total(fb::attention(a, b, c, fb::causal) * r);
             },
             fb::wrt<0, 1, 2>, qc, kc, vc, wc);
  // E == Ev: the three gradients from one kernel ([B, T, 3, H, E]); above, Ev != E: two kernels.
  const auto ve = signed_tensor<fb::shape<2, 4, 2, 3>>(7116, 0.1, 1.5);
  check_grad("causal attention, one gradient kernel",
             [](const auto& a, const auto& b, const auto& c, const auto& r) {
               return total(fb::attention(a, b, c, fb::causal) * r);
             },
             fb::wrt<0, 1, 2>, qc, kc, ve, signed_tensor<fb::shape<2, 4, 2, 3>>(7117));
  check_grad("attention, 4 queries, 4 keys, one gradient kernel",
             [](const auto& a, const auto& b, const auto& c, const auto& r) { return total(fb::attention(a, b, c) * r); },
             fb::wrt<0, 1, 2>, qc, kc, ve, signed_tensor<fb::shape<2, 4, 2, 3>>(7118));
  // A head dim that is a multiple of the vector width, 6 tokens: the register-blocked kernel (four
  // keys at a time: a full block and a block of two; backend/cpu/attention.hpp), causal and not.
  const auto q8 = signed_tensor<fb::shape<1, 6, 2, 8>>(7121, 0.05, 0.6);
  const auto k8 = signed_tensor<fb::shape<1, 6, 2, 8>>(7122, 0.05, 0.6);
  const auto v8 = signed_tensor<fb::shape<1, 6, 2, 8>>(7123, 0.1, 1.5);
  const auto w8 = signed_tensor<fb::shape<1, 6, 2, 8>>(7124);
  check_grad("causal attention, head dim 8",
             [](const auto& a, const auto& b, const auto& c, const auto& r) {
               return total(fb::attention(a, b, c, fb::causal) * r);
             },
             fb::wrt<0, 1, 2>, q8, k8, v8, w8);
  check_grad("attention, head dim 8",
             [](const auto& a, const auto& b, const auto& c, const auto& r) { return total(fb::attention(a, b, c) * r); },
             fb::wrt<0, 1, 2>, q8, k8, v8, w8);
  // The same operand as q, k and v (self-attention of one tensor): three contributions added.
  check_grad("causal attention(x, x, x), squared",
             [](const auto& a, const auto& r) {
               const auto o = fb::attention(a, a, a, fb::causal);
               return total(o * o * r);
             },
             fb::wrt<0>, qc, signed_tensor<fb::shape<2, 4, 2, 3>>(7115));
}

TEST_CASE("autodiff: slice's derivative is the zero-padded gradient (every axis, overlaps, unread parts)") {
  const auto x = signed_tensor<fb::shape<3, 5, 4>>(7201);
  check_grad("slice axis 0",
             [](const auto& a, const auto& r) { return total(fb::slice<0, 1, 3>(a) * r); }, fb::wrt<0>, x,
             signed_tensor<fb::shape<2, 5, 4>>(7202));
  check_grad("slice axis 1, then a square",
             [](const auto& a, const auto& r) {
               const auto s = fb::slice<1, 2, 5>(a);
               return total(s * s * r);
             },
             fb::wrt<0>, x, signed_tensor<fb::shape<3, 3, 4>>(7203));
  check_grad("two overlapping slices of the last axis, a middle element unread by one",
             [](const auto& a, const auto& r, const auto& u) {
               return total(fb::slice<2, 0, 3>(a) * r) + total(fb::exp(fb::slice<2, 1, 2>(a)) * u);
             },
             fb::wrt<0>, x, signed_tensor<fb::shape<3, 5, 3>>(7204), signed_tensor<fb::shape<3, 5, 1>>(7205));
}

TEST_CASE("autodiff: attention over q, k, v sliced from one packed projection: one [d, 3d] weight gradient") {
  // GPT-2's c_attn: qkv = x W + b, q | k | v = split(qkv), each viewed as [B, T, H, E].
  constexpr std::size_t B = 2, T = 3, H = 2, E = 2, C = H * E;
  auto loss = [](const auto& x, const auto& wt, const auto& b, const auto& r) {
    const auto qkv = fb::matmul(x, wt) + b;  // [B*T, 3C]
    using heads = fb::shape<B, T, H, E>;
    const auto q = fb::reshape<heads>(fb::slice<1, 0, C>(qkv));
    const auto k = fb::reshape<heads>(fb::slice<1, C, 2 * C>(qkv));
    const auto v = fb::reshape<heads>(fb::slice<1, 2 * C, 3 * C>(qkv));
    return total(fb::attention(q, k, v, fb::causal) * r);
  };
  check_grad("packed qkv projection, causal", loss, fb::wrt<0, 1, 2>, signed_tensor<fb::shape<B * T, C>>(7301, 0.1, 1.0),
             signed_tensor<fb::shape<C, 3 * C>>(7302, 0.1, 0.8), signed_tensor<fb::shape<3 * C>>(7303, 0.05, 0.3),
             signed_tensor<fb::shape<B, T, H, E>>(7304));
}
