// tests/nn/nn.cpp: the training front end (include/fusebox/nn/): cross_entropy and mse_loss
// against naive double references and their gradients against central differences (every
// element, eager and compiled: tests/autodiff/check_grad.hpp); a sequential model's forward
// (linear, relu, layer_norm, dropout) against a naive double reference in train and eval mode and
// its parameter gradients against central differences; dropout masks (deterministic, counter-based,
// the right values and rate); compiled training steps with AdamW against the eager ones; torch's
// parameter names; bad input.
#include <cmath>
#include <cstdio>
#include <string>
#include <tuple>
#include <vector>

#include <catch2/catch.hpp>

#include <fusebox/fusebox.hpp>
#include <fusebox/nn/nn.hpp>

#include "../autodiff/check_grad.hpp"

namespace fb = fusebox;
namespace nn = fusebox::nn;

namespace {

// Rows of positive weights that sum to 1 (a soft target), from a seed.
template <std::size_t N, std::size_t C>
fb::tensor<double, fb::shape<N, C>> soft_target(std::uint64_t seed) {
  auto t = fbt::positive_tensor<fb::shape<N, C>>(seed, 0.1, 1.0);
  for (std::size_t i = 0; i < N; ++i) {
    double s = 0;
    for (std::size_t c = 0; c < C; ++c) s += t(i, c);
    for (std::size_t c = 0; c < C; ++c) t(i, c) /= s;
  }
  return t;
}

template <class A>
double ce_reference(const A& logits, const A& target) {
  const std::size_t n = logits.extent(0), c = logits.extent(1);
  double total = 0;
  for (std::size_t i = 0; i < n; ++i) {
    double m = -INFINITY, s = 0;
    for (std::size_t k = 0; k < c; ++k) m = std::max(m, static_cast<double>(logits(i, k)));
    for (std::size_t k = 0; k < c; ++k) s += std::exp(logits(i, k) - m);
    for (std::size_t k = 0; k < c; ++k) total -= target(i, k) * (logits(i, k) - m - std::log(s));
  }
  return total / static_cast<double>(n);
}

using model_t = nn::sequential<nn::linear<6, 8, double>, nn::relu_layer, nn::layer_norm<8, double>,
                               nn::dropout<8, double>, nn::linear<8, 4, double>>;

model_t make_model() {
  model_t m(nn::linear<6, 8, double>(nn::seeded{1}), nn::relu_layer{}, nn::layer_norm<8, double>(),
            nn::dropout<8, double>(0.25), nn::linear<8, 4, double>(nn::seeded{2}));
  // layer_norm's weight and bias away from 1 and 0, so their gradients and their use are tested.
  fbt::fill_signed(m.layer<2>().weight, 3, 0.5, 1.5);
  fbt::fill_signed(m.layer<2>().bias, 4, 0.1, 0.5);
  return m;
}

/// The model in double by hand: x W1^T + b1, relu, layer norm (biased variance, eps 1e-5), times
/// the mask (train) or not (eval), x W2^T + b2.
template <class X, class M>
std::vector<double> model_reference(model_t& m, const X& x, const M* mask) {
  const std::size_t n = x.extent(0);
  std::vector<double> out(n * 4);
  auto& l1 = m.layer<0>();
  auto& ln = m.layer<2>();
  auto& l2 = m.layer<4>();
  for (std::size_t i = 0; i < n; ++i) {
    double h[8], mean = 0, var = 0;
    for (std::size_t j = 0; j < 8; ++j) {
      double s = l1.bias(j);
      for (std::size_t k = 0; k < 6; ++k) s += x(i, k) * l1.weight(j, k);
      h[j] = std::max(s, 0.0);
      mean += h[j] / 8;
    }
    for (std::size_t j = 0; j < 8; ++j) var += (h[j] - mean) * (h[j] - mean) / 8;
    for (std::size_t j = 0; j < 8; ++j) {
      h[j] = (h[j] - mean) / std::sqrt(var + 1e-5) * ln.weight(j) + ln.bias(j);
      if (mask) h[j] *= (*mask)(i, j);
    }
    for (std::size_t o = 0; o < 4; ++o) {
      double s = l2.bias(o);
      for (std::size_t j = 0; j < 8; ++j) s += h[j] * l2.weight(o, j);
      out[i * 4 + o] = s;
    }
  }
  return out;
}

template <class T>
void check_values(const std::string& what, const T& got, const std::vector<double>& ref, double tol) {
  REQUIRE(got.size() == ref.size());
  std::size_t bad = 0;
  std::string first;
  for (std::size_t i = 0; i < ref.size(); ++i)
    if (!(std::fabs(got.flat(i) - ref[i]) <= tol * (1 + std::fabs(ref[i]))) && bad++ == 0)
      first = "element " + std::to_string(i) + ": " + std::to_string(got.flat(i)) + " vs " + std::to_string(ref[i]);
  INFO(what << ": " << bad << " elements off; first: " << first);
  CHECK(bad == 0);
}

}  // namespace

TEST_CASE("nn: cross_entropy (log-softmax fused) and mse_loss: values and gradients against double references") {
  const auto logits = fbt::signed_tensor<fb::shape<6, 5>>(11, 0.2, 3.0);
  const auto soft = soft_target<6, 5>(12);
  auto ce = [](const auto& l, const auto& t) { return nn::cross_entropy(l, t); };
  const double ref = ce_reference(logits, soft);
  const auto value = nn::cross_entropy(logits, soft);  // eager
  CHECK(std::fabs(value.flat(0) - ref) <= 1e-14 * std::fabs(ref));
  fbt::check_grad("cross_entropy, soft target", ce, fb::wrt<0, 1>, logits, soft);
  // One-hot rows from int labels.
  const int labels[6] = {0, 4, 2, 2, 1, 3};
  const auto hot = nn::one_hot<5, 6, double>(std::span<const int>(labels));
  for (int i = 0; i < 6; ++i)
    for (int c = 0; c < 5; ++c) CHECK(hot(i, c) == (labels[i] == c ? 1.0 : 0.0));
  CHECK(std::fabs(nn::cross_entropy(logits, hot).flat(0) - ce_reference(logits, hot)) <= 1e-14 * ce_reference(logits, hot));
  fbt::check_grad("cross_entropy, one-hot target", ce, fb::wrt<0>, logits, hot);
  // Compiled: the loss's forward is one row kernel (max, exp, sum, log and the target's product).
  auto compiled = fb::compile(ce);
  CHECK(std::fabs(compiled(logits, hot).flat(0) - ce_reference(logits, hot)) <= 1e-14 * ce_reference(logits, hot));

  const auto pred = fbt::signed_tensor<fb::shape<3, 4, 5>>(13), target = fbt::signed_tensor<fb::shape<3, 4, 5>>(14);
  double mse = 0;
  for (std::size_t i = 0; i < pred.size(); ++i) mse += (pred.flat(i) - target.flat(i)) * (pred.flat(i) - target.flat(i));
  mse /= static_cast<double>(pred.size());
  auto mse_fn = [](const auto& p, const auto& t) { return nn::mse_loss(p, t); };
  CHECK(std::fabs(nn::mse_loss(pred, target).flat(0) - mse) <= 1e-14 * mse);
  fbt::check_grad("mse_loss", mse_fn, fb::wrt<0, 1>, pred, target);
}

TEST_CASE("nn: one_hot refuses labels out of range and a wrong count, naming them") {
  const int bad[3] = {0, 7, 1};
  CHECK_THROWS_WITH((nn::one_hot<5, 3>(std::span<const int>(bad))), Catch::Contains("label 1 is 7, outside [0, 5)"));
  CHECK_THROWS_WITH((nn::one_hot<5, 4>(std::span<const int>(bad))),
                    Catch::Contains("3 labels for a batch of 4") && Catch::Contains("nn.cpp"));
}

TEST_CASE("nn: a sequential model's forward matches a double reference in train and eval mode; names as torch's") {
  model_t m = make_model();
  const auto params = m.parameters<double>();
  std::vector<std::string> names;
  for (const auto& p : params) names.push_back(p.name);
  CHECK(names == std::vector<std::string>{"0.weight", "0.bias", "2.weight", "2.bias", "4.weight", "4.bias"});
  CHECK(params[0].shape == fb::dims_of(fb::shape<8, 6>{}));  // [out, in], torch's Linear layout
  CHECK(params.numel() == 8 * 6 + 8 + 8 + 8 + 4 * 8 + 4);

  const auto x = fbt::signed_tensor<fb::shape<5, 6>>(21);
  // Eval: dropout is the identity; eager and compiled agree with the reference.
  const auto ref_eval = model_reference(m, x, static_cast<const fb::tensor<double, fb::shape<5, 8>>*>(nullptr));
  check_values("eval, eager", nn::forward(m, x), ref_eval, 1e-12);
  auto infer = nn::compile_forward(m);
  check_values("eval, compiled", infer(x), ref_eval, 1e-12);
  // Train: the mask is an input; the compiled train-mode forward (through the step's objective).
  const auto masks = m.make_randoms<nn::train_mode, 5>(7, 0);
  static_assert(std::tuple_size_v<decltype(masks)> == 1);
  const auto& mask = std::get<0>(masks);
  const auto ref_train = model_reference(m, x, &mask);
  auto train_fwd = [](const auto& xx, const auto& mk, const auto&... p) {
    return model_t::forward(nn::train, xx, std::tuple<const decltype(p)&...>(p...), std::tie(mk));
  };
  const auto [w0, b0, g, b, w1, b1] = m.param_refs();
  check_values("train, compiled", fb::compile(train_fwd)(x, mask, w0, b0, g, b, w1, b1), ref_train, 1e-12);
  // Parameters updated in place are seen by the next compiled call (they are arguments, not constants).
  m.layer<4>().bias.fill(0.5);
  check_values("eval after an in-place update", infer(x), model_reference(m, x, static_cast<decltype(&mask)>(nullptr)),
               1e-12);
}

TEST_CASE("nn: the model's parameter gradients (train mode, dropout on) match central differences") {
  model_t m = make_model();
  const auto x = fbt::signed_tensor<fb::shape<5, 6>>(31);
  const int labels[5] = {3, 0, 1, 1, 2};
  const auto t = nn::one_hot<4, 5, double>(std::span<const int>(labels));
  const auto mask = std::get<0>(m.make_randoms<nn::train_mode, 5>(9, 3));
  const nn::detail::objective<model_t, nn::train_mode, nn::cross_entropy_loss> f{};
  auto [w0, b0, g, b, w1, b1] = m.param_refs();
  fbt::check_grad("sequential, cross_entropy", f, fb::wrt<3, 4, 5, 6, 7, 8>, x, t, mask, w0, b0, g, b, w1, b1);
}

TEST_CASE("nn: dropout masks are deterministic, counter-based, 0 or 1/(1-p) at rate p; eval takes none") {
  const nn::dropout<64, float> d(0.3);
  const auto a = d.mask<100>(5, 0, 0), again = d.mask<100>(5, 0, 0);
  fbt::check_identical(a, again, "same seed, counter, stream");
  const auto next = d.mask<100>(5, 1, 0), other = d.mask<100>(5, 0, 1), seed = d.mask<100>(6, 0, 0);
  std::size_t zeros = 0, same_next = 0, same_other = 0, same_seed = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    const float v = a.data()[i];
    CHECK((v == 0.0f || v == static_cast<float>(1 / 0.7)));
    zeros += v == 0.0f;
    same_next += v == next.data()[i];
    same_other += v == other.data()[i];
    same_seed += v == seed.data()[i];
  }
  // 6400 draws at p = 0.3: 1920 zeros expected, sd 37; agreement of two independent masks 58%.
  CHECK(zeros > 1920 - 185);
  CHECK(zeros < 1920 + 185);
  CHECK(same_next < 4200);
  CHECK(same_other < 4200);
  CHECK(same_seed < 4200);
  static_assert(nn::dropout<8>::random_count<nn::train_mode> == 1 && nn::dropout<8>::random_count<nn::eval_mode> == 0);
  CHECK_THROWS_WITH(nn::dropout<8>(1.5), Catch::Contains("probability 1.5") && Catch::Contains("nn.cpp"));
  // p = 1 drops everything (torch gives zeros), p = 0 keeps everything unscaled.
  const auto all = nn::dropout<8, float>(1.0).mask<4>(1, 0, 0), none = nn::dropout<8, float>(0.0).mask<4>(1, 0, 0);
  for (std::size_t i = 0; i < 32; ++i) CHECK((all.data()[i] == 0.0f && none.data()[i] == 1.0f));
}

TEST_CASE("nn: compiled training steps with AdamW follow the eager ones, step by step") {
  model_t a = make_model(), b = make_model();
  auto pa = a.parameters<double>(), pb = b.parameters<double>();
  fb::optim::adamw oa(pa, {.lr = 1e-2, .weight_decay = 0.1}), ob(pb, {.lr = 1e-2, .weight_decay = 0.1});
  auto compiled = nn::compile_step(a, nn::cross_entropy_loss{}, nn::train, {}, 42);
  auto eager = nn::eager_step(b, nn::cross_entropy_loss{}, nn::train, 42);
  double first_loss = 0, last_loss = 0;
  for (int s = 0; s < 4; ++s) {
    const auto x = fbt::signed_tensor<fb::shape<5, 6>>(100 + static_cast<std::uint64_t>(s));
    const int labels[5] = {s % 4, 1, 2, 3, (s + 1) % 4};
    const auto t = nn::one_hot<4, 5, double>(std::span<const int>(labels));
    auto [la, ga] = compiled(x, t);
    auto [lb, gb] = eager(x, t);
    CHECK(std::fabs(la.flat(0) - lb.flat(0)) <= 1e-12);
    oa.step(ga);
    ob.step(gb);
    if (s == 0) first_loss = la.flat(0);
    last_loss = la.flat(0);
  }
  CHECK(compiled.counter() == 4);
  for (std::size_t i = 0; i < pa.size(); ++i) {
    std::vector<double> ref(pb[i].data, pb[i].data + pb[i].size());
    std::size_t bad = 0;
    for (std::size_t k = 0; k < ref.size(); ++k) bad += !(std::fabs(pa[i].data[k] - ref[k]) <= 1e-12 * (1 + std::fabs(ref[k])));
    INFO(pa[i].name << ": " << bad << " elements differ between compiled and eager training");
    CHECK(bad == 0);
  }
  INFO("loss " << first_loss << " -> " << last_loss);
  CHECK(std::isfinite(last_loss));
}

TEST_CASE("nn: a compiled step on a dyn batch: loss and every gradient element as the eager step's, two compiles") {
  // Eval mode (dropout takes no masks): x and the target have a dyn batch, so the step runs the
  // joint graph on the run-time path (autodiff/grad.hpp); the eager step on static copies of the
  // same rows is the reference.
  model_t m = make_model();
  auto compiled = nn::compile_step(m, nn::mse_loss_fn{}, nn::eval);
  auto eager = nn::eager_step(m, nn::mse_loss_fn{}, nn::eval);
  const auto before = fb::jit::counters().snapshot();
  auto one = [&]<std::size_t B>() {
    INFO("batch " << B);
    const auto xs = fbt::signed_tensor<fb::shape<B, 6>>(300 + B);
    const auto ts = fbt::signed_tensor<fb::shape<B, 4>>(400 + B);
    fb::tensor<double, fb::shape<fb::dyn, 6>> x(B);
    fb::tensor<double, fb::shape<fb::dyn, 4>> t(B);
    for (std::size_t i = 0; i < xs.size(); ++i) x.flat(i) = xs.flat(i);
    for (std::size_t i = 0; i < ts.size(); ++i) t.flat(i) = ts.flat(i);
    auto [la, ga] = compiled(x, t);
    auto [lb, gb] = eager(xs, ts);
    CHECK(std::fabs(la.flat(0) - lb.flat(0)) <= 1e-12 * (1 + std::fabs(lb.flat(0))));
    [&]<std::size_t... P>(std::index_sequence<P...>) {
      (([&] {
         const auto& got = std::get<P>(ga);
         const auto& want = std::get<P>(gb);
         REQUIRE(got.size() == want.size());
         std::size_t bad = 0;
         for (std::size_t k = 0; k < want.size(); ++k)
           bad += !(std::fabs(got.flat(k) - want.flat(k)) <= 1e-12 * (1 + std::fabs(want.flat(k))));
         INFO("parameter " << P << ": " << bad << " elements differ");
         CHECK(bad == 0);
       }()),
       ...);
    }(std::make_index_sequence<std::tuple_size_v<std::decay_t<decltype(ga)>>>{});
  };
  one.template operator()<7>();
  one.template operator()<3>();
  one.template operator()<7>();
  one.template operator()<12>();
  CHECK(compiled.counter() == 4);
  // The first specialisation, then one with the batch symbolic: as the forward alone would.
  CHECK(fb::jit::counters().snapshot().compiles - before.compiles <= 2);
}

TEST_CASE("nn: mse_loss and cross_entropy of a computed output on a dyn batch: its unknown extents meet the target's") {
  // Captured, tanh(x w) has an unknown batch extent (only an argument's extents are bound) and the
  // target a bound one: the losses' shape check must let them meet (it compared them with ==
  // and refused every such call). This is the forward; the compiled step on a dyn batch is above.
  auto mse = [](const auto& x, const auto& w, const auto& t) { return nn::mse_loss(fb::tanh(fb::matmul(x, w)), t); };
  auto ce = [](const auto& x, const auto& w, const auto& t) { return nn::cross_entropy(fb::matmul(x, w), t); };
  auto mse_c = fb::compile(mse);
  auto ce_c = fb::compile(ce);
  fb::tensor<double, fb::shape<6, 4>> w;
  fbt::fill_signed(w, 21, 0.1, 1.0);
  for (const std::size_t n : {5, 3}) {
    fb::tensor<double, fb::shape<fb::dyn, 6>> x(n);
    fb::tensor<double, fb::shape<fb::dyn, 4>> t(n);
    fbt::fill_signed(x, 22 + n, 0.1, 1.0);
    fbt::fill_signed(t, 23 + n, 0.1, 1.0);
    // Double references: y = x w, the mse of tanh(y) against t, the cross entropy of y with t's
    // rows made into class probabilities.
    std::vector<double> y(n * 4);
    for (std::size_t i = 0; i < n; ++i)
      for (std::size_t o = 0; o < 4; ++o) {
        double s = 0;
        for (std::size_t k = 0; k < 6; ++k) s += x(i, k) * w(k, o);
        y[i * 4 + o] = s;
      }
    double want_mse = 0;
    for (std::size_t i = 0; i < n * 4; ++i) want_mse += (std::tanh(y[i]) - t.flat(i)) * (std::tanh(y[i]) - t.flat(i));
    want_mse /= static_cast<double>(n * 4);
    INFO("batch " << n);
    const auto got_mse = mse_c(x, w, t);
    CHECK(std::fabs(got_mse.flat(0) - want_mse) <= 1e-12 * (1 + want_mse));
    fb::tensor<double, fb::shape<fb::dyn, 4>> soft(n);
    for (std::size_t i = 0; i < n; ++i) {
      double s = 0;
      for (std::size_t c = 0; c < 4; ++c) s += std::fabs(t(i, c));
      for (std::size_t c = 0; c < 4; ++c) soft(i, c) = std::fabs(t(i, c)) / s;
    }
    double want_ce = 0;
    for (std::size_t i = 0; i < n; ++i) {
      double m = -INFINITY, s = 0;
      for (std::size_t c = 0; c < 4; ++c) m = std::max(m, y[i * 4 + c]);
      for (std::size_t c = 0; c < 4; ++c) s += std::exp(y[i * 4 + c] - m);
      for (std::size_t c = 0; c < 4; ++c) want_ce -= soft(i, c) * (y[i * 4 + c] - m - std::log(s));
    }
    want_ce /= static_cast<double>(n);
    const auto got_ce = ce_c(x, w, soft);
    CHECK(std::fabs(got_ce.flat(0) - want_ce) <= 1e-12 * (1 + std::fabs(want_ce)));
  }
  // A target of another shape is still refused, by name (its extents are bound, [4, 3] against [?, 4]).
  fb::tensor<double, fb::shape<fb::dyn, 6>> x(4);
  fb::tensor<double, fb::shape<fb::dyn, fb::dyn>> t3(4, 3);
  fbt::fill_signed(x, 31, 0.1, 1.0);
  fbt::fill_signed(t3, 32, 0.1, 1.0);
  CHECK_THROWS_WITH(mse_c(x, w, t3), Catch::Contains("mse_loss") && Catch::Contains("same shape"));
}
