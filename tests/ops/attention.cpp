// tests/ops/attention.cpp: attention(q, k, v[, causal]) (include/fusebox/ops/attention.hpp) on the
// host: eager, compiled with static shapes (backend/cpu/executor.hpp) and with a dyn batch (the run-time
// path), causal and not, operands that are strided views (heads of one projection, PyTorch's
// [B, H, T, E] layout through transpose, q, k and v sliced from one packed projection), against a double reference of softmax(q·kᵀ/sqrt(E))·v
// on every output element; shape errors name the three shapes.
//
// Tolerance: each output is a convex combination of v's entries (weights from a softmax computed in
// float), so the error is a few ulps of max|v| times the rounding of the scores, which grows with
// E·max|q|·max|k|; 2e-5 relative to max|v| bounds it for the sizes here with a wide margin, and a
// wrong mask, scale or normalisation is off by far more (> 1e-2).
#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include <fusebox/fusebox.hpp>

namespace fb = fusebox;

namespace {

/// softmax(q·kᵀ/sqrt(E) [masked]) · v in double for [B, T, H, E] operands given as accessors.
template <class Q, class K, class V>
std::vector<double> reference(std::size_t B, std::size_t Tq, std::size_t Tk, std::size_t H, std::size_t E,
                              std::size_t Ev, bool causal, Q q, K k, V v) {
  std::vector<double> out(B * Tq * H * Ev, 0.0);
  for (std::size_t b = 0; b < B; ++b)
    for (std::size_t h = 0; h < H; ++h)
      for (std::size_t i = 0; i < Tq; ++i) {
        std::vector<double> s(Tk, -INFINITY);
        double mx = -INFINITY, sum = 0;
        for (std::size_t j = 0; j < Tk; ++j) {
          if (causal && j > i) continue;
          double d = 0;
          for (std::size_t e = 0; e < E; ++e) d += q(b, i, h, e) * k(b, j, h, e);
          s[j] = d / std::sqrt(static_cast<double>(E));
          mx = std::max(mx, s[j]);
        }
        for (double& x : s) sum += x = std::exp(x - mx);
        for (std::size_t j = 0; j < Tk; ++j)
          for (std::size_t e = 0; e < Ev; ++e) out[((b * Tq + i) * H + h) * Ev + e] += s[j] / sum * v(b, j, h, e);
      }
  return out;
}

template <class S>
auto accessor(const fb::tensor<float, S>& t) {
  return [&t](std::size_t b, std::size_t i, std::size_t h, std::size_t e) {
    const auto& x = t.extents();
    return static_cast<double>(t.flat(((b * x[1] + i) * x[2] + h) * x[3] + e));
  };
}

template <class Out>
void check(const Out& got, const std::vector<double>& want, double vmax) {
  REQUIRE(got.size() == want.size());
  for (std::size_t i = 0; i < want.size(); ++i) {
    INFO("element " << i);
    REQUIRE(std::abs(static_cast<double>(got.flat(i)) - want[i]) <= 2e-5 * vmax);
  }
}

constexpr std::size_t B = 2, T = 9, H = 3, E = 8, EV = 5;

}  // namespace

TEST_CASE("attention: eager and compiled (static shapes) match the double reference, causal and not",
          "[ops][attention]") {
  fb::tensor<float, fb::shape<B, T, H, E>> q, k;
  fb::tensor<float, fb::shape<B, T, H, EV>> v;
  q.fill_random(1, -2.0f, 2.0f), k.fill_random(2, -2.0f, 2.0f), v.fill_random(3);
  for (bool causal : {false, true}) {
    INFO((causal ? "causal" : "full"));
    const auto want = reference(B, T, T, H, E, EV, causal, accessor(q), accessor(k), accessor(v));
    auto full = [](auto a, auto b, auto c) { return fb::attention(a, b, c); };
    auto masked = [](auto a, auto b, auto c) { return fb::attention(a, b, c, fb::causal); };
    if (causal) {
      check(fb::eager(masked)(q, k, v), want, 1.0);
      check(fb::compile(masked)(q, k, v), want, 1.0);
    } else {
      check(fb::eager(full)(q, k, v), want, 1.0);
      check(fb::compile(full)(q, k, v), want, 1.0);
    }
  }
}

TEST_CASE("attention: more keys than queries, and a dyn batch through the run-time path", "[ops][attention]") {
  ::setenv("FUSEBOX_CXXFLAGS", "-O1", 1);
  constexpr std::size_t TK = 13;
  fb::tensor<float, fb::shape<fb::dyn, T, H, E>> q(3);
  fb::tensor<float, fb::shape<fb::dyn, TK, H, E>> k(3);
  fb::tensor<float, fb::shape<fb::dyn, TK, H, EV>> v(3);
  q.fill_random(4, -2.0f, 2.0f), k.fill_random(5, -2.0f, 2.0f), v.fill_random(6);
  // Other ops around it: the operands come from a scaled input, the result gets a bias.
  auto model = [](auto a, auto b, auto c) { return fb::attention(a * 0.5f, b, c) + 1.0f; };
  const auto y = fb::compile(model)(q, k, v);
  auto half_q = [&](std::size_t b_, std::size_t i, std::size_t h, std::size_t e) { return 0.5 * accessor(q)(b_, i, h, e); };
  auto want = reference(3, T, TK, H, E, EV, false, half_q, accessor(k), accessor(v));
  for (double& w : want) w += 1.0;
  check(y, want, 2.0);
}

TEST_CASE("attention: rows of more than 256 keys (the score row outgrows its stack buffer)", "[ops][attention]") {
  constexpr std::size_t TQ = 5, TK = 300, TC = 260;
  fb::tensor<float, fb::shape<1, TQ, 2, 4>> q;
  fb::tensor<float, fb::shape<1, TK, 2, 4>> k;
  fb::tensor<float, fb::shape<1, TK, 2, 3>> v;
  q.fill_random(41, -2.0f, 2.0f), k.fill_random(42, -2.0f, 2.0f), v.fill_random(43);
  check(fb::attention(q, k, v), reference(1, TQ, TK, 2, 4, 3, false, accessor(q), accessor(k), accessor(v)), 2.0);
  fb::tensor<float, fb::shape<1, TC, 1, 4>> qc, kc;
  fb::tensor<float, fb::shape<1, TC, 1, 3>> vc;
  qc.fill_random(44, -2.0f, 2.0f), kc.fill_random(45, -2.0f, 2.0f), vc.fill_random(46);
  check(fb::attention(qc, kc, vc, fb::causal),
        reference(1, TC, TC, 1, 4, 3, true, accessor(qc), accessor(kc), accessor(vc)), 2.0);
}

TEST_CASE("attention: head dims that are multiples of the vector (the four-row micro-kernel), ragged row blocks",
          "[ops][attention]") {
  constexpr std::size_t TQ = 7, TK = 11, E16 = 32, EV16 = 16;  // 7 rows: a block of 4 and one of 3
  fb::tensor<float, fb::shape<2, TQ, 3, E16>> q;
  fb::tensor<float, fb::shape<2, TK, 3, E16>> k;
  fb::tensor<float, fb::shape<2, TK, 3, EV16>> v;
  q.fill_random(51, -1.0f, 1.0f), k.fill_random(52, -1.0f, 1.0f), v.fill_random(53);
  check(fb::attention(q, k, v), reference(2, TQ, TK, 3, E16, EV16, false, accessor(q), accessor(k), accessor(v)), 2.0);
  fb::tensor<float, fb::shape<2, TQ, 3, E16>> kc;
  fb::tensor<float, fb::shape<2, TQ, 3, EV16>> vc;
  kc.fill_random(54, -1.0f, 1.0f), vc.fill_random(55);
  check(fb::attention(q, kc, vc, fb::causal),
        reference(2, TQ, TQ, 3, E16, EV16, true, accessor(q), accessor(kc), accessor(vc)), 2.0);
  auto compiled = fb::compile([](auto a, auto b, auto c) { return fb::attention(a, b, c, fb::causal); });
  check(compiled(q, kc, vc), reference(2, TQ, TQ, 3, E16, EV16, true, accessor(q), accessor(kc), accessor(vc)), 2.0);
}

TEST_CASE("attention: q, k, v as strided views (one projection's heads; PyTorch's layout transposed)",
          "[ops][attention]") {
  // x·w is [B*T, 3*H*E]: q, k and v are its three column blocks seen as [B, T, H, E]. The
  // fusebox way: three projections reshaped (contiguous), and a [B, H, T, E] tensor transposed.
  fb::tensor<float, fb::shape<B * T, 16>> x;
  fb::tensor<float, fb::shape<16, H * E>> wq, wk;
  fb::tensor<float, fb::shape<B, H, T, EV>> v_bhte;  // PyTorch's SDPA layout
  x.fill_random(7), wq.fill_random(8, -0.5f, 0.5f), wk.fill_random(9, -0.5f, 0.5f), v_bhte.fill_random(10);
  using heads = fb::shape<B, T, H, E>;
  auto model = [](auto xx, auto a, auto b, auto vv) {
    auto q = fb::reshape<heads>(fb::matmul(xx, a));
    auto k = fb::reshape<heads>(fb::matmul(xx, b));
    return fb::attention(q, k, fb::transpose<1, 2>(vv), fb::causal);
  };
  const auto y = fb::compile(model)(x, wq, wk, v_bhte);
  auto proj = [&](const auto& w) {
    return [&x, &w](std::size_t b, std::size_t i, std::size_t h, std::size_t e) {
      double s = 0;
      for (std::size_t c = 0; c < 16; ++c) s += static_cast<double>(x.flat((b * T + i) * 16 + c)) * w.flat(c * H * E + h * E + e);
      return s;
    };
  };
  auto v = [&](std::size_t b, std::size_t i, std::size_t h, std::size_t e) {
    return static_cast<double>(v_bhte.flat(((b * H + h) * T + i) * EV + e));
  };
  check(y, reference(B, T, T, H, E, EV, true, proj(wq), proj(wk), v), 1.0);
}

TEST_CASE("attention: q, k, v sliced from one packed projection (torch's qkv.split + view), static and "
          "run-time paths", "[ops][attention]") {
  // x·w is [B*T, 3*H*E]; slice<1, ...> takes each block of H*E columns (row stride 3*H*E) and
  // reshape<[B, T, H, E]> splits its rows and columns without a copy (view_strides).
  fb::tensor<float, fb::shape<B * T, 16>> x;
  fb::tensor<float, fb::shape<16, 3 * H * E>> w;
  x.fill_random(17), w.fill_random(18, -0.5f, 0.5f);
  using heads = fb::shape<B, T, H, E>;
  auto model = [](auto xx, auto ww) {
    auto qkv = fb::matmul(xx, ww);
    auto q = fb::reshape<heads>(fb::slice<1, 0, H * E>(qkv));
    auto k = fb::reshape<heads>(fb::slice<1, H * E, 2 * H * E>(qkv));
    auto v = fb::reshape<heads>(fb::slice<1, 2 * H * E, 3 * H * E>(qkv));
    return fb::attention(q, k, v, fb::causal);
  };
  auto block = [&](std::size_t which) {
    return [&x, &w, which](std::size_t b, std::size_t i, std::size_t h, std::size_t e) {
      double s = 0;
      for (std::size_t c = 0; c < 16; ++c)
        s += static_cast<double>(x.flat((b * T + i) * 16 + c)) * w.flat(c * 3 * H * E + which * H * E + h * E + e);
      return s;
    };
  };
  const auto want = reference(B, T, T, H, E, E, true, block(0), block(1), block(2));
  check(fb::compile(model)(x, w), want, 4.0);
  check(fb::eager(model)(x, w), want, 4.0);
  // The run-time path (a dyn-batch tensor of the same extents) rebuilds the views from the graph.
  fb::tensor<float, fb::shape<fb::dyn, 16>> xd(B * T);
  for (std::size_t i = 0; i < xd.size(); ++i) xd.flat(i) = x.flat(i);
  auto flat = [](auto xx, auto ww) {
    auto qkv = fb::matmul(xx, ww);
    return fb::slice<1, H * E, 2 * H * E>(qkv) * 2.0f + fb::slice<1, 0, H * E>(qkv);
  };
  const auto y = fb::compile(flat)(xd, w);
  for (std::size_t r = 0; r < B * T; ++r)
    for (std::size_t c = 0; c < H * E; ++c) {
      double q = 0, k = 0;
      for (std::size_t j = 0; j < 16; ++j) {
        q += static_cast<double>(x.flat(r * 16 + j)) * w.flat(j * 3 * H * E + c);
        k += static_cast<double>(x.flat(r * 16 + j)) * w.flat(j * 3 * H * E + H * E + c);
      }
      INFO("row " << r << ", column " << c);
      REQUIRE(std::abs(y(r, c) - (2 * k + q)) < 1e-4 * (1 + std::abs(2 * k + q)));
    }
  // A slice past the run-time extent is a shape_error naming the slice and the shape.
  fb::tensor<float, fb::shape<fb::dyn, fb::dyn>> narrow(4, 3);
  narrow.fill_random(19);
  auto past = [](auto a) { return fb::slice<1, 2, 5>(a) + 1.0f; };
  CHECK_THROWS_WITH(fb::compile(past)(narrow), Catch::Contains("slice<1, 2, 5>") && Catch::Contains("[4, 3]"));
}

TEST_CASE("attention: mismatched shapes are a shape_error naming q, k and v", "[ops][attention]") {
  fb::tensor<float, fb::shape<fb::dyn, T, H, E>> q(2);
  fb::tensor<float, fb::shape<fb::dyn, T, H, E>> k(3);  // another batch
  fb::tensor<float, fb::shape<fb::dyn, T, H, EV>> v(2);
  q.fill_random(11), k.fill_random(12), v.fill_random(13);
  auto model = [](auto a, auto b, auto c) { return fb::attention(a, b, c); };
  try {
    (void)fb::eager(model)(q, k, v);
    FAIL("no error");
  } catch (const fb::shape_error& e) {
    const std::string what = e.what();
    CHECK(what.find("[2, 9, 3, 8]") != std::string::npos);
    CHECK(what.find("[3, 9, 3, 8]") != std::string::npos);
    CHECK(what.find("attention") != std::string::npos);
  }
  // Tokens known only at run time: 9 queries, 4 keys, under a causal mask.
  fb::tensor<float, fb::shape<2, fb::dyn, H, E>> q9(T), short_k(4);
  fb::tensor<float, fb::shape<2, fb::dyn, H, EV>> short_v(4);
  q9.fill_random(14), short_k.fill_random(15), short_v.fill_random(16);
  auto masked = [](auto a, auto b, auto c) { return fb::attention(a, b, c, fb::causal); };
  CHECK_THROWS_WITH(fb::compile(masked)(q9, short_k, short_v), Catch::Contains("as many queries as keys"));
}
