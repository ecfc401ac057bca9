// tests/ops/conv.cpp: conv2d, max_pool2d and avg_pool2d (include/fusebox/ops/conv.hpp, pool.hpp) on
// the host, against naive double references on fresh random inputs, every element: eager, compiled
// with static shapes (backend/cpu/executor.hpp, bias and relu fused as the convolution's epilogue) and with a
// dyn batch (the run-time path, the epilogue generated); stride 2 and padding; the T2 CNN's forward;
// errors for bad shapes naming the shapes and the caller's line.
//
// Tolerance: each conv output is a float sum of K = C*KH*KW products (+ bias): its rounding error
// is below K * 2^-24 * sum|products| (a loose bound; summation error grows slower), so the check is
// |got - want| <= 1e-6 * K * sum|products| + 1e-6. A wrong index, stride, padding or channel is
// off by the size of a product (> 1e-2 here). Pooling takes no rounding (max) or one per term (avg).
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include <fusebox/fusebox.hpp>

#include "../support/check.hpp"

namespace fb = fusebox;
using fbt::fill_signed;

namespace {

struct conv_ref {
  std::vector<double> value, scale;  // the double result, and sum |product| per element
};

/// Naive conv2d in double: x [N,C,H,W], w [O,C,KH,KW], b [O] (or none), stride (sh, sw), padding
/// (ph, pw), times `scale` (a weight computed as w * scale).
template <class X, class W, class B>
conv_ref conv2d_reference(const X& x, const W& w, const B* b, int sh, int sw, int ph, int pw, bool relu,
                          double scale = 1) {
  const auto xs = x.extents(), ws = w.extents();
  const std::size_t N = xs[0], C = xs[1], H = xs[2], Wd = xs[3], O = ws[0], KH = ws[2], KW = ws[3];
  const std::size_t OH = (H + 2 * ph - KH) / sh + 1, OW = (Wd + 2 * pw - KW) / sw + 1;
  conv_ref r;
  r.value.assign(N * O * OH * OW, 0.0);
  r.scale.assign(r.value.size(), 0.0);
  for (std::size_t n = 0; n < N; ++n)
    for (std::size_t o = 0; o < O; ++o)
      for (std::size_t i = 0; i < OH; ++i)
        for (std::size_t j = 0; j < OW; ++j) {
          double acc = b ? static_cast<double>(b->flat(o)) : 0.0, mag = std::fabs(acc);
          for (std::size_t c = 0; c < C; ++c)
            for (std::size_t u = 0; u < KH; ++u)
              for (std::size_t v = 0; v < KW; ++v) {
                const long ih = static_cast<long>(i * sh + u) - ph, iw = static_cast<long>(j * sw + v) - pw;
                if (ih < 0 || iw < 0 || ih >= static_cast<long>(H) || iw >= static_cast<long>(Wd)) continue;
                const double t = static_cast<double>(x.flat(((n * C + c) * H + ih) * Wd + iw)) *
                                 (static_cast<double>(w.flat(((o * C + c) * KH + u) * KW + v)) * scale);
                acc += t;
                mag += std::fabs(t);
              }
          const std::size_t at = ((n * O + o) * OH + i) * OW + j;
          r.value[at] = relu ? std::max(acc, 0.0) : acc;
          r.scale[at] = mag * static_cast<double>(C * KH * KW);
        }
  return r;
}
template <class X, class W, class B>
conv_ref conv2d_reference(const X& x, const W& w, const B* b, int s, int p, bool relu) {
  return conv2d_reference(x, w, b, s, s, p, p, relu);
}

/// Naive max (or average, count_include_pad) pooling in double, stride (sh, sw), padding (ph, pw).
template <class X>
std::vector<double> pool_reference(const X& x, int k, int sh, int sw, int ph, int pw, bool is_max) {
  const auto xs = x.extents();
  const std::size_t N = xs[0], C = xs[1], H = xs[2], W = xs[3];
  const std::size_t OH = (H + 2 * ph - k) / sh + 1, OW = (W + 2 * pw - k) / sw + 1;
  std::vector<double> out(N * C * OH * OW);
  for (std::size_t q = 0; q < N * C; ++q)
    for (std::size_t i = 0; i < OH; ++i)
      for (std::size_t j = 0; j < OW; ++j) {
        double m = -INFINITY, sum = 0;
        for (int u = 0; u < k; ++u)
          for (int v = 0; v < k; ++v) {
            const long ih = static_cast<long>(i * sh) + u - ph, iw = static_cast<long>(j * sw) + v - pw;
            if (ih < 0 || iw < 0 || ih >= static_cast<long>(H) || iw >= static_cast<long>(W)) continue;
            const double e = static_cast<double>(x.flat((q * H + ih) * W + iw));
            m = std::max(m, e);
            sum += e;
          }
        out[(q * OH + i) * OW + j] = is_max ? m : sum / (k * k);
      }
  return out;
}
template <class X>
std::vector<double> pool_reference(const X& x, int k, int s, int p, bool is_max) {
  return pool_reference(x, k, s, s, p, p, is_max);
}

template <class Got>
void check_conv(const Got& got, const conv_ref& want, const std::string& what) {
  REQUIRE(got.size() == want.value.size());
  std::size_t bad = 0;
  std::string first;
  for (std::size_t i = 0; i < want.value.size(); ++i) {
    const double g = static_cast<double>(got.flat(i));
    if (!(std::fabs(g - want.value[i]) <= 1e-6 * want.scale[i] + 1e-6) && bad++ == 0)
      first = "element " + std::to_string(i) + ": got " + std::to_string(g) + ", want " + std::to_string(want.value[i]);
  }
  INFO(what << ": " << bad << " of " << want.value.size() << " elements off; first: " << first);
  CHECK(bad == 0);
}

template <class Got>
void check_pool(const Got& got, const std::vector<double>& want, const std::string& what) {
  REQUIRE(got.size() == want.size());
  std::size_t bad = 0;
  std::string first;
  for (std::size_t i = 0; i < want.size(); ++i) {
    const double g = static_cast<double>(got.flat(i));
    if (!(std::fabs(g - want[i]) <= 1e-6 * (1 + std::fabs(want[i]))) && bad++ == 0)
      first = "element " + std::to_string(i) + ": got " + std::to_string(g) + ", want " + std::to_string(want[i]);
  }
  INFO(what << ": " << bad << " of " << want.size() << " elements off; first: " << first);
  CHECK(bad == 0);
}

/// One conv configuration: eager, compiled (bias + relu fused), compiled without bias, dyn batch.
template <int S, int P, std::size_t N, std::size_t C, std::size_t H, std::size_t W, std::size_t O, std::size_t K>
void conv_case(std::uint64_t seed) {
  fb::tensor<float, fb::shape<N, C, H, W>> x;
  fb::tensor<float, fb::shape<O, C, K, K>> w;
  fb::tensor<float, fb::shape<O>> b;
  fill_signed(x, seed, 0.1, 1.0);
  fill_signed(w, seed + 1, 0.05, 0.5);
  fill_signed(b, seed + 2, 0.1, 1.0);
  const std::string what = "conv2d<stride<" + std::to_string(S) + ">, padding<" + std::to_string(P) + ">> x " +
                           fb::to_string(x.extents()) + " w " + fb::to_string(w.extents());
  const conv_ref with_bias = conv2d_reference(x, w, &b, S, P, false);
  const conv_ref with_relu = conv2d_reference(x, w, &b, S, P, true);
  const conv_ref plain = conv2d_reference(x, w, static_cast<decltype(b)*>(nullptr), S, P, false);
  check_conv(fb::conv2d<fb::stride<S>, fb::padding<P>>(x, w, b), with_bias, what + " eager");
  check_conv(fb::conv2d<fb::stride<S>, fb::padding<P>>(x, w), plain, what + " eager, no bias");
  // Weights as arguments and as captured tensors; relu fused after the bias.
  auto fused = [](const auto& xx, const auto& ww, const auto& bb) { return fb::relu(fb::conv2d<fb::stride<S>, fb::padding<P>>(xx, ww, bb)); };
  check_conv(fb::compile(fused)(x, w, b), with_relu, what + " compiled, bias + relu epilogue");
  auto captured = [&](const auto& xx) { return fb::conv2d<fb::stride<S>, fb::padding<P>>(xx, w); };
  check_conv(fb::compile(captured)(x), plain, what + " compiled, captured weight, no epilogue");
  // A dyn batch: the run-time path (host kernel, generated epilogue).
  fb::tensor<float, fb::shape<fb::dyn, C, H, W>> xd(N);
  for (std::size_t i = 0; i < x.size(); ++i) xd.flat(i) = x.flat(i);
  check_conv(fb::compile(fused)(xd, w, b), with_relu, what + " run-time path (dyn batch)");
}

}  // namespace

TEST_CASE("conv2d: eager, compiled and dyn batch match the double reference (stride, padding, bias, relu)",
          "[ops][conv]") {
  conv_case<1, 0, 2, 3, 9, 7, 4, 3>(11);   // no padding, non-square image
  conv_case<1, 2, 3, 2, 8, 8, 5, 5>(21);   // 5x5 "same" convolution (T2's)
  conv_case<2, 1, 2, 3, 9, 10, 6, 3>(31);  // stride 2 with padding, odd extents
  conv_case<2, 0, 5, 1, 6, 6, 3, 2>(41);   // more images than threads, one input channel
}

TEST_CASE("conv2d: strided operands (a transposed weight, a sliced batch) read through their strides",
          "[ops][conv]") {
  // w stored [C, O, K, K] (a transposed-conv layout): transpose<0, 1> is a view, not a copy.
  fb::tensor<float, fb::shape<3, 4, 3, 3>> w_co;
  fb::tensor<float, fb::shape<2, 3, 7, 7>> x;
  fill_signed(w_co, 5, 0.05, 0.5);
  fill_signed(x, 6, 0.1, 1.0);
  fb::tensor<float, fb::shape<4, 3, 3, 3>> w;
  for (std::size_t o = 0; o < 4; ++o)
    for (std::size_t c = 0; c < 3; ++c)
      for (std::size_t k = 0; k < 9; ++k) w.flat((o * 3 + c) * 9 + k) = w_co.flat((c * 4 + o) * 9 + k);
  const conv_ref want = conv2d_reference(x, w, static_cast<fb::tensor<float, fb::shape<4>>*>(nullptr), 1, 1, false);
  auto model = [](const auto& xx, const auto& wt) { return fb::conv2d<fb::padding<1>>(xx, fb::transpose<0, 1>(wt)); };
  check_conv(fb::compile(model)(x, w_co), want, "transposed weight, compiled");
  check_conv(fb::conv2d<fb::padding<1>>(x, w_co.transpose<0, 1>()), want, "transposed weight, eager");
}

/// The number of elements where a and b differ in their bits (both are float results of one op).
template <class A, class B>
std::size_t differing(const A& a, const B& b) {
  REQUIRE(a.size() == b.size());
  std::size_t bad = 0;
  for (std::size_t i = 0; i < a.size(); ++i) bad += std::memcmp(&a.flat(i), &b.flat(i), sizeof(float)) != 0;
  return bad;
}

// The positional form is deprecated; these cases check it still means what it meant.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
auto positional_conv = [](const auto& xx, const auto& ww, const auto& bb) { return fb::conv2d<2, 1>(xx, ww, bb); };
auto positional_max = [](const auto& xx) { return fb::max_pool2d<3, 2, 1>(xx); };
auto positional_avg = [](const auto& xx) { return fb::avg_pool2d<3, 2, 1>(xx); };
#pragma GCC diagnostic pop

TEST_CASE("conv2d with fb::stride and fb::padding: either order and the positional form and the defaults agree with "
          "the reference",
          "[ops][conv]") {
  fb::tensor<float, fb::shape<2, 3, 9, 10>> x;
  fb::tensor<float, fb::shape<5, 3, 3, 3>> w;
  fb::tensor<float, fb::shape<5>> b;
  fill_signed(x, 51, 0.1, 1.0);
  fill_signed(w, 52, 0.05, 0.5);
  fill_signed(b, 53, 0.1, 1.0);
  auto named = [](const auto& xx, const auto& ww, const auto& bb) {
    return fb::conv2d<fb::stride<2>, fb::padding<1>>(xx, ww, bb);
  };
  auto swapped = [](const auto& xx, const auto& ww, const auto& bb) {
    return fb::conv2d<fb::padding<1>, fb::stride<2>>(xx, ww, bb);
  };
  auto pairs = [](const auto& xx, const auto& ww, const auto& bb) {
    return fb::conv2d<fb::padding<1, 1>, fb::stride<2, 2>>(xx, ww, bb);
  };
  const conv_ref want = conv2d_reference(x, w, &b, 2, 1, false);
  const auto named_eager = named(x, w, b);
  check_conv(named_eager, want, "stride<2>, padding<1> eager");
  check_conv(swapped(x, w, b), want, "padding<1>, stride<2> eager");
  check_conv(positional_conv(x, w, b), want, "positional <2, 1> eager");
  const auto named_compiled = fb::compile(named)(x, w, b);
  check_conv(named_compiled, want, "stride<2>, padding<1> compiled");
  check_conv(fb::compile(swapped)(x, w, b), want, "padding<1>, stride<2> compiled");
  check_conv(fb::compile(pairs)(x, w, b), want, "padding<1, 1>, stride<2, 2> compiled");
  const auto positional_compiled = fb::compile(positional_conv)(x, w, b);
  check_conv(positional_compiled, want, "positional <2, 1> compiled");
  // One op whatever the spelling: the same bits.
  CHECK(differing(named_eager, swapped(x, w, b)) == 0);
  CHECK(differing(named_eager, positional_conv(x, w, b)) == 0);
  CHECK(differing(named_compiled, positional_compiled) == 0);
  // torch's defaults: stride 1, padding 0, each on its own.
  check_conv(fb::conv2d(x, w, b), conv2d_reference(x, w, &b, 1, 0, false), "defaults eager");
  check_conv(fb::conv2d<fb::stride<2>>(x, w, b), conv2d_reference(x, w, &b, 2, 0, false), "stride<2> alone eager");
  check_conv(fb::conv2d<fb::padding<2>>(x, w, b), conv2d_reference(x, w, &b, 1, 2, false), "padding<2> alone eager");
}

TEST_CASE("conv2d with fb::stride and fb::padding pairs: unequal height and width on every path",
          "[ops][conv]") {
  fb::tensor<float, fb::shape<2, 3, 9, 10>> x;
  fb::tensor<float, fb::shape<5, 3, 3, 3>> w;
  fb::tensor<float, fb::shape<5>> b;
  fill_signed(x, 61, 0.1, 1.0);
  fill_signed(w, 62, 0.05, 0.5);
  fill_signed(b, 63, 0.1, 1.0);
  auto model = [](const auto& xx, const auto& ww, const auto& bb) {
    return fb::relu(fb::conv2d<fb::stride<2, 1>, fb::padding<0, 2>>(xx, ww, bb));
  };
  const conv_ref want = conv2d_reference(x, w, &b, 2, 1, 0, 2, true);  // [2, 5, 4, 12]
  check_conv(model(x, w, b), want, "stride<2, 1>, padding<0, 2> eager");
  const auto y = fb::compile(model)(x, w, b);
  REQUIRE(y.extents() == fb::dims{4, {2, 5, 4, 12}});
  check_conv(y, want, "stride<2, 1>, padding<0, 2> compiled");
  fb::tensor<float, fb::shape<fb::dyn, 3, 9, 10>> xd(2);
  for (std::size_t i = 0; i < x.size(); ++i) xd.flat(i) = x.flat(i);
  check_conv(fb::compile(model)(xd, w, b), want, "stride<2, 1>, padding<0, 2> dyn batch");
}

TEST_CASE("max_pool2d and avg_pool2d with fb::stride and fb::padding: either order and the positional form; the "
          "stride defaults to the kernel; unequal pairs",
          "[ops][pool]") {
  fb::tensor<float, fb::shape<2, 3, 9, 8>> x;
  fill_signed(x, 71, 0.1, 1.0);
  auto max_named = [](const auto& xx) { return fb::max_pool2d<3, fb::stride<2>, fb::padding<1>>(xx); };
  auto max_swapped = [](const auto& xx) { return fb::max_pool2d<3, fb::padding<1>, fb::stride<2>>(xx); };
  auto avg_swapped = [](const auto& xx) { return fb::avg_pool2d<3, fb::padding<1>, fb::stride<2>>(xx); };
  const std::vector<double> want_max = pool_reference(x, 3, 2, 1, true), want_avg = pool_reference(x, 3, 2, 1, false);
  check_pool(max_named(x), want_max, "max 3, stride<2>, padding<1> eager");
  check_pool(fb::compile(max_swapped)(x), want_max, "max 3, padding<1>, stride<2> compiled");
  check_pool(fb::compile(avg_swapped)(x), want_avg, "avg 3, padding<1>, stride<2> compiled");
  check_pool(fb::compile(positional_max)(x), want_max, "max positional <3, 2, 1> compiled");
  check_pool(fb::compile(positional_avg)(x), want_avg, "avg positional <3, 2, 1> compiled");
  CHECK(differing(max_named(x), positional_max(x)) == 0);
  CHECK(differing(avg_swapped(x), positional_avg(x)) == 0);
  // No stride: the kernel's (torch's stride=None).
  check_pool(fb::max_pool2d<2, fb::padding<1>>(x), pool_reference(x, 2, 2, 1, true), "max 2, padding<1> eager");
  check_pool(fb::avg_pool2d<2, fb::padding<1>>(x), pool_reference(x, 2, 2, 1, false), "avg 2, padding<1> eager");
  // (height, width) pairs, compiled and on the run-time path.
  auto uneven = [](const auto& xx) { return fb::avg_pool2d<3, fb::stride<1, 2>, fb::padding<1, 0>>(xx); };
  auto uneven_max = [](const auto& xx) { return fb::max_pool2d<3, fb::padding<0, 1>, fb::stride<2, 1>>(xx); };
  check_pool(fb::compile(uneven)(x), pool_reference(x, 3, 1, 2, 1, 0, false), "avg 3, stride<1, 2>, padding<1, 0>");
  check_pool(fb::compile(uneven_max)(x), pool_reference(x, 3, 2, 1, 0, 1, true), "max 3, stride<2, 1>, padding<0, 1>");
  fb::tensor<float, fb::shape<fb::dyn, 3, 9, 8>> xd(2);
  for (std::size_t i = 0; i < x.size(); ++i) xd.flat(i) = x.flat(i);
  check_pool(fb::compile(uneven)(xd), pool_reference(x, 3, 1, 2, 1, 0, false), "avg 3, stride<1, 2>, padding<1, 0> dyn");
}

TEST_CASE("max_pool2d and avg_pool2d: eager, compiled and dyn batch match the double reference", "[ops][pool]") {
  fb::tensor<float, fb::shape<2, 3, 9, 8>> x;
  fill_signed(x, 7, 0.1, 1.0);
  check_pool(fb::max_pool2d<2>(x), pool_reference(x, 2, 2, 0, true), "max 2/2 eager");
  check_pool(fb::avg_pool2d<2>(x), pool_reference(x, 2, 2, 0, false), "avg 2/2 eager");
  auto overlapping = [](const auto& xx) { return fb::max_pool2d<3, fb::stride<2>, fb::padding<1>>(xx); };
  auto overlapping_avg = [](const auto& xx) { return fb::avg_pool2d<3, fb::stride<2>, fb::padding<1>>(xx); };
  check_pool(fb::compile(overlapping)(x), pool_reference(x, 3, 2, 1, true), "max 3/2 pad 1 compiled");
  check_pool(fb::compile(overlapping_avg)(x), pool_reference(x, 3, 2, 1, false), "avg 3/2 pad 1 compiled");
  fb::tensor<float, fb::shape<fb::dyn, 3, 9, 8>> xd(2);
  for (std::size_t i = 0; i < x.size(); ++i) xd.flat(i) = x.flat(i);
  check_pool(fb::compile(overlapping)(xd), pool_reference(x, 3, 2, 1, true), "max 3/2 pad 1 dyn batch");
  // A pooled value that feeds an elementwise consumer: the consumer is the pool's epilogue.
  auto scaled = [](const auto& xx) { return fb::avg_pool2d<2>(xx) * 3.0f + 1.0f; };
  std::vector<double> want = pool_reference(x, 2, 2, 0, false);
  for (double& v : want) v = v * 3 + 1;
  check_pool(fb::compile(scaled)(x), want, "avg 2/2 with an epilogue");
}

TEST_CASE("the T2 CNN's forward (conv 5x5 32, relu, pool, conv 5x5 64, relu, pool) matches the reference",
          "[ops][conv]") {
  constexpr std::size_t N = 3;
  fb::tensor<float, fb::shape<N, 1, 28, 28>> x;
  fb::tensor<float, fb::shape<32, 1, 5, 5>> w1;
  fb::tensor<float, fb::shape<32>> b1;
  fb::tensor<float, fb::shape<64, 32, 5, 5>> w2;
  fb::tensor<float, fb::shape<64>> b2;
  fill_signed(x, 1, 0.0, 1.0);
  fill_signed(w1, 2, 0.02, 0.4);
  fill_signed(b1, 3, 0.01, 0.1);
  fill_signed(w2, 4, 0.005, 0.06);
  fill_signed(b2, 5, 0.01, 0.1);
  auto features = [](const auto& xx, const auto& a, const auto& ab, const auto& c, const auto& cb) {
    const auto h = fb::max_pool2d<2>(fb::relu(fb::conv2d<fb::padding<2>>(xx, a, ab)));
    return fb::max_pool2d<2>(fb::relu(fb::conv2d<fb::padding<2>>(h, c, cb)));
  };
  const auto y = fb::compile(features)(x, w1, b1, w2, b2);
  REQUIRE(y.extents() == fb::dims{4, {N, 64, 7, 7}});
  // The reference in stages, each from the previous stage's double values.
  fb::tensor<double, fb::shape<N, 1, 28, 28>> xd;
  fb::tensor<double, fb::shape<32, 1, 5, 5>> w1d;
  fb::tensor<double, fb::shape<32>> b1d;
  fb::tensor<double, fb::shape<64, 32, 5, 5>> w2d;
  fb::tensor<double, fb::shape<64>> b2d;
  auto copy = [](const auto& from, auto& to) {
    for (std::size_t i = 0; i < from.size(); ++i) {
      if constexpr (requires { from.flat(i); }) to.flat(i) = from.flat(i);
      else to.flat(i) = from[i];
    }
  };
  copy(x, xd), copy(w1, w1d), copy(b1, b1d), copy(w2, w2d), copy(b2, b2d);
  const conv_ref c1 = conv2d_reference(xd, w1d, &b1d, 1, 2, true);
  fb::tensor<double, fb::shape<N, 32, 28, 28>> h1;
  copy(c1.value, h1);
  fb::tensor<double, fb::shape<N, 32, 14, 14>> p1;
  copy(pool_reference(h1, 2, 2, 0, true), p1);
  conv_ref c2 = conv2d_reference(p1, w2d, &b2d, 1, 2, true);
  fb::tensor<double, fb::shape<N, 64, 14, 14>> h2;
  copy(c2.value, h2);
  const std::vector<double> want = pool_reference(h2, 2, 2, 0, true);
  // The first layer's rounding reaches the second through 800-term sums: bound it by the second
  // layer's magnitudes (scale) with the first layer's relative error folded in.
  std::size_t bad = 0;
  for (std::size_t i = 0; i < want.size(); ++i)
    bad += !(std::fabs(static_cast<double>(y.flat(i)) - want[i]) <= 1e-4 * (1 + std::fabs(want[i])));
  INFO(bad << " of " << want.size() << " T2 feature values off");
  CHECK(bad == 0);
}

TEST_CASE("conv2d and pooling: bad shapes are errors naming the shapes and the line", "[ops][conv]") {
  fb::tensor<float, fb::shape<fb::dyn, 3, 8, 8>> x(2);
  fb::tensor<float, fb::shape<4, fb::dyn, 3, 3>> w(2);  // 2 in-channels for a 3-channel image
  fill_signed(x, 1, 0.1, 1.0);
  fill_signed(w, 2, 0.1, 1.0);
  const int line = __LINE__ + 2;
  try {
    (void)fb::conv2d<fb::padding<1>>(x, w);
    FAIL("no shape_error");
  } catch (const fb::shape_error& e) {
    const std::string m = e.what();
    CHECK_THAT(m, Catch::Contains("[2, 3, 8, 8]") && Catch::Contains("[4, 2, 3, 3]") && Catch::Contains("channels"));
    CHECK_THAT(m, Catch::Contains(std::to_string(line)));
  }
  // A window larger than the padded image.
  fb::tensor<float, fb::shape<fb::dyn, fb::dyn, fb::dyn, fb::dyn>> tiny(1, 1, 2, 2);
  auto pool3 = [&] { return fb::max_pool2d<3, fb::stride<1>>(tiny); };
  CHECK_THROWS_WITH(pool3(), Catch::Contains("[1, 1, 2, 2]") && Catch::Contains("window"));
  // The run-time path: only the batch may vary; a changed image size is refused by name.
  auto model = [](const auto& xx) { return fb::max_pool2d<2>(xx); };
  auto c = fb::compile(model, {.dynamic = fb::dynamic::always});
  fb::tensor<float, fb::shape<fb::dyn, fb::dyn, fb::dyn, fb::dyn>> img(2, 3, 8, 8);
  fill_signed(img, 3, 0.1, 1.0);
  CHECK_THROWS_WITH(c(img), Catch::Contains("max_pool2d") && Catch::Contains("only the batch"));
}

TEST_CASE("conv2d of a computed weight (w * 2) and a bias on dyn extents: unknown out channels meet a known bias",
          "[ops][conv]") {
  // Captured, w * 2 of a weight whose out channels are dyn has an unknown extent there (only an
  // argument's extents are bound); the bias check must leave it to the call (was a shape_error).
  constexpr std::size_t N = 3, C = 2, H = 7, W = 6, O = 4, K = 3;
  fb::tensor<float, fb::shape<fb::dyn, C, H, W>> x(N);
  fb::tensor<float, fb::shape<fb::dyn, C, K, K>> w(O);
  fb::tensor<float, fb::shape<O>> b;
  fill_signed(x, 81, 0.1, 1.0);
  fill_signed(w, 82, 0.05, 0.5);
  fill_signed(b, 83, 0.1, 1.0);
  auto model = [](const auto& xx, const auto& ww, const auto& bb) {
    return fb::relu(fb::conv2d<fb::padding<1>>(xx, ww * 2.0f, bb));
  };
  const conv_ref want = conv2d_reference(x, w, &b, 1, 1, 1, 1, true, 2.0);
  auto compiled = fb::compile(model);
  check_conv(compiled(x, w, b), want, "dyn batch and out channels, computed weight");
  // Another batch size through the same compiled function.
  fb::tensor<float, fb::shape<fb::dyn, C, H, W>> x5(5);
  fill_signed(x5, 84, 0.1, 1.0);
  check_conv(compiled(x5, w, b), conv2d_reference(x5, w, &b, 1, 1, 1, 1, true, 2.0), "second batch size");
  // A static weight under a dyn batch (its out channels known at capture).
  fb::tensor<float, fb::shape<O, C, K, K>> ws;
  for (std::size_t i = 0; i < ws.size(); ++i) ws.flat(i) = w.flat(i);
  check_conv(fb::compile(model)(x, ws, b), want, "dyn batch, static computed weight");
  // Out channels that do not match the bias are still refused, on the call's extents.
  fb::tensor<float, fb::shape<fb::dyn, C, K, K>> w5(O + 1);
  fill_signed(w5, 85, 0.05, 0.5);
  CHECK_THROWS_AS(compiled(x, w5, b), fb::shape_error);
}
