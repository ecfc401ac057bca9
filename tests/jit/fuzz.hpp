// tests/jit/fuzz.hpp: differential fuzzing. Seeded random expression programs are generated as
// types (a constexpr generator picks ops, shapes and structure from the seed), and each program
// runs four ways: eagerly (op by op), through the static path (when every extent is static),
// through the JIT specialised to the call's extents, and through the JIT with the batch extent
// symbolic. Each result is compared with a double-precision evaluation of the same expression.
//
// The programs cover: every elementwise op family, broadcasting of rows and columns, scalars
// (which keep duplicated subtrees apart), reductions of every kind over the last axis feeding
// back into the row, column reductions, softmax and layer_norm structures, matmuls (epilogues),
// nodes used twice, and odd extents (tails of every vector width).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include <fusebox/fusebox.hpp>

namespace fz {

namespace fb = fusebox;
using fb::dyn;

constexpr std::uint64_t mix(std::uint64_t z) {
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

/// The leaves of a program: x [R, C], a row vector w [C], a square weight m [C, C].
template <std::size_t R, std::size_t C>
struct leaves {
  using X = fb::input_leaf<0, float, fb::shape<R, C>>;
  using W = fb::input_leaf<1, float, fb::shape<C>>;
  using M = fb::input_leaf<2, float, fb::shape<C, C>>;
};

template <class Op, class... A>
using pw = fb::pointwise<Op, A...>;
using S = fb::scalar_leaf<float>;

template <std::uint64_t K, class... Ops>
using pick = fb::meta::at_t<K % sizeof...(Ops), fb::meta::type_list<Ops...>>;

template <class L, std::uint64_t Seed, int Depth>
struct gen;

template <class L, std::uint64_t Seed>
struct gen<L, Seed, 0> {
  using type = std::conditional_t<Seed % 3 == 0, pw<fb::ops::mul, typename L::X, typename L::W>, typename L::X>;
};

template <class L, std::uint64_t Seed, int Depth>
struct gen {
  static constexpr std::uint64_t h = mix(Seed);
  using a = typename gen<L, mix(h + 1), Depth - 1>::type;
  using b = typename gen<L, mix(h + 2), (Depth >= 2 ? Depth - 1 - static_cast<int>(h >> 60 & 1) : 0)>::type;
  using unary = pick<(h >> 8), fb::ops::neg, fb::ops::abs, fb::ops::tanh, fb::ops::sigmoid, fb::ops::relu,
                     fb::ops::gelu, fb::ops::gelu_tanh, fb::ops::silu>;
  using binary = pick<(h >> 16), fb::ops::add, fb::ops::sub, fb::ops::mul, fb::ops::maximum, fb::ops::minimum>;
  using reducer = pick<(h >> 24), fb::ops::sum, fb::ops::mean, fb::ops::max, fb::ops::min>;
  template <class E>
  using row = fb::reduction<reducer, 1, true, E>;
  template <class E>
  using softmax = pw<fb::ops::div, pw<fb::ops::exp, pw<fb::ops::sub, E, fb::reduction<fb::ops::max, 1, true, E>>>,
                     fb::reduction<fb::ops::sum, 1, true,
                                   pw<fb::ops::exp, pw<fb::ops::sub, E, fb::reduction<fb::ops::max, 1, true, E>>>>>;
  template <class E>
  using centered = pw<fb::ops::sub, E, fb::reduction<fb::ops::mean, 1, true, E>>;
  template <class E>
  using normalised = pw<fb::ops::mul, centered<E>,
                        pw<fb::ops::rsqrt, pw<fb::ops::add, fb::reduction<fb::ops::mean, 1, true,
                                                                           pw<fb::ops::mul, centered<E>, centered<E>>>,
                                              S>>>;
  using choices = fb::meta::type_list<
      pw<unary, a>,                                                    // 0 elementwise
      pw<binary, a, b>,                                                // 1 two subtrees
      pw<binary, a, typename L::W>,                                    // 2 row broadcast
      pw<fb::ops::mul, a, S>,                                          // 3 scalar
      pw<binary, a, row<b>>,                                           // 4 a row reduction fed back
      softmax<a>,                                                      // 5 softmax
      pw<fb::ops::tanh, fb::matmul_node<a, typename L::M>>,            // 6 matmul + epilogue
      pw<fb::ops::where, pw<fb::ops::gt, a, b>, a, b>,                 // 7 where
      pw<fb::ops::add, a, fb::reduction<reducer, 0, true, b>>,         // 8 column reduction
      normalised<a>,                                                   // 9 layer_norm
      pw<fb::ops::log, pw<fb::ops::add, pw<fb::ops::abs, a>, S>>,      // 10 log of a positive value
      pw<fb::ops::mul, pw<fb::ops::sqrt, pw<fb::ops::abs, a>>, pw<fb::ops::exp, pw<fb::ops::tanh, b>>>>;  // 11
  using type = fb::meta::at_t<h % choices::size, choices>;
};

/// An expression object of type E whose scalars take values from the seed.
template <class E>
E make(std::uint64_t& seed) {
  E e{};
  if constexpr (std::is_same_v<E, S>) {
    seed = mix(seed);
    e.value = 0.25f + static_cast<float>(seed % 1000) / 1000.0f;
  } else if constexpr (E::desc.kind == fb::node_kind::pointwise) {
    e.args = std::apply([&](auto... c) { return std::make_tuple(make<decltype(c)>(seed)...); }, e.args);
  } else if constexpr (E::desc.kind == fb::node_kind::reduce) {
    e.arg = make<decltype(e.arg)>(seed);
  } else if constexpr (E::desc.kind == fb::node_kind::matmul) {
    e.a = make<decltype(e.a)>(seed);
    e.b = make<decltype(e.b)>(seed);
  }
  return e;
}

// ---- double-precision reference ----

struct dtensor {
  fb::dims shape;
  std::vector<double> v;
  double at(const std::array<std::size_t, fb::max_rank>& idx, std::size_t out_rank) const {
    std::size_t off = 0;
    for (std::size_t k = 0; k < shape.rank; ++k) {
      const std::size_t i = shape.extent[k] == 1 ? 0 : idx[k + out_rank - shape.rank];
      off = off * shape.extent[k] + i;
    }
    return v[off];
  }
};

inline std::array<std::size_t, fb::max_rank> unravel(std::size_t i, const fb::dims& d) {
  std::array<std::size_t, fb::max_rank> idx{};
  for (std::size_t k = d.rank; k-- > 0;) {
    idx[k] = i % d.extent[k];
    i /= d.extent[k];
  }
  return idx;
}

template <class T, class Sh>
dtensor to_d(const fb::tensor<T, Sh>& t) {
  dtensor d{t.extents(), std::vector<double>(t.size())};
  for (std::size_t i = 0; i < t.size(); ++i) d.v[i] = t.flat(i);
  return d;
}

template <class E, class Args>
dtensor ref(const E& e, const Args& args) {
  if constexpr (E::desc.kind == fb::node_kind::input) {
    return to_d(std::get<E::desc.input_index>(args));
  } else if constexpr (E::desc.kind == fb::node_kind::scalar) {
    return dtensor{fb::dims{}, {static_cast<double>(e.value)}};
  } else if constexpr (E::desc.kind == fb::node_kind::pointwise) {
    auto kids = std::apply([&](const auto&... c) { return std::array<dtensor, sizeof...(c)>{ref(c, args)...}; }, e.args);
    fb::dims out{};
    for (const auto& k : kids) out = fb::broadcast(out, k.shape).out;
    dtensor r{out, std::vector<double>(out.size())};
    for (std::size_t i = 0; i < r.v.size(); ++i) {
      const auto idx = unravel(i, out);
      // Rounded to float, as stored: a float overflow is inf, an underflow 0.
      if constexpr (kids.size() == 1) r.v[i] = static_cast<float>(E::op::apply(kids[0].at(idx, out.rank)));
      else if constexpr (kids.size() == 2)
        r.v[i] = static_cast<float>(E::op::apply(kids[0].at(idx, out.rank), kids[1].at(idx, out.rank)));
      else
        r.v[i] = static_cast<float>(
            E::op::apply(kids[0].at(idx, out.rank), kids[1].at(idx, out.rank), kids[2].at(idx, out.rank)));
    }
    return r;
  } else if constexpr (E::desc.kind == fb::node_kind::reduce) {
    const dtensor in = ref(e.arg, args);
    const std::size_t axis = static_cast<std::size_t>(E::desc.axis);
    fb::dims out = in.shape;
    out.extent[axis] = 1;
    dtensor r{out, std::vector<double>(out.size(), E::op::template identity<double>())};
    for (std::size_t i = 0; i < in.v.size(); ++i) {
      auto idx = unravel(i, in.shape);
      idx[axis] = 0;
      std::size_t off = 0;
      for (std::size_t k = 0; k < out.rank; ++k) off = off * out.extent[k] + idx[k];
      r.v[off] = E::op::combine(r.v[off], in.v[i]);
    }
    for (auto& x : r.v) x = E::op::finalize(x, in.shape.extent[axis]);
    if (!E::desc.keepdim) r.shape = E::desc.shape;
    return r;
  } else if constexpr (E::desc.kind == fb::node_kind::matmul) {
    const dtensor a = ref(e.a, args), b = ref(e.b, args);
    const std::size_t m = a.shape.extent[0], k = a.shape.extent[1], n = b.shape.extent[1];
    dtensor r{fb::dims{2, {m, n}}, std::vector<double>(m * n)};
    for (std::size_t i = 0; i < m; ++i)
      for (std::size_t j = 0; j < n; ++j) {
        double s = 0;
        for (std::size_t q = 0; q < k; ++q) s += a.v[i * k + q] * b.v[q * n + j];
        r.v[i * n + j] = s;
      }
    return r;
  }
}

// ---- eager: the same expression, op by op through the public front ends ----

template <class E, class Args>
auto eager(const E& e, const Args& args) {
  const std::source_location here = std::source_location::current();
  if constexpr (E::desc.kind == fb::node_kind::input) {
    return std::get<E::desc.input_index>(args);
  } else if constexpr (E::desc.kind == fb::node_kind::scalar) {
    return e.value;
  } else if constexpr (E::desc.kind == fb::node_kind::pointwise) {
    return std::apply([&](const auto&... c) { return fb::detail::make_pointwise<typename E::op>(here, eager(c, args)...); },
                      e.args);
  } else if constexpr (E::desc.kind == fb::node_kind::reduce) {
    return fb::detail::make_reduce<typename E::op, E::desc.axis, E::desc.keepdim>(eager(e.arg, args), here);
  } else if constexpr (E::desc.kind == fb::node_kind::matmul) {
    return fb::matmul(eager(e.a, args), eager(e.b, args));
  }
}

/// Replaces about one element in eight of t by a special value (+-0, +-inf, NaN, denormals),
/// placed by the seed: in vector lanes and in tails alike.
template <class T, class Sh>
void sprinkle_specials(fb::tensor<T, Sh>& t, std::uint64_t seed) {
  constexpr float inf = std::numeric_limits<float>::infinity();
  constexpr float set[] = {0.0f, -0.0f, inf, -inf, std::numeric_limits<float>::quiet_NaN(),
                           std::numeric_limits<float>::denorm_min(), -std::numeric_limits<float>::denorm_min(), 1e-40f};
  for (std::size_t i = 0; i < t.size(); ++i) {
    const std::uint64_t h = mix(seed * 1000003 + i);
    if (h % 8 == 0) t.flat(i) = set[(h >> 8) % std::size(set)];
  }
}

/// The largest error relative to the largest finite reference value; INFINITY where a NaN or an
/// infinity is not exactly where the reference has it.
template <class T, class Sh>
double error_against(const fb::tensor<T, Sh>& t, const dtensor& r, std::string* why) {
  if (!(t.extents() == r.shape)) {
    *why = "shape " + fb::to_string(t.extents()) + " vs reference " + fb::to_string(r.shape);
    return INFINITY;
  }
  double worst = 0, scale = 1;
  for (double x : r.v)
    if (std::isfinite(x)) scale = std::max(scale, std::fabs(x));
  for (std::size_t i = 0; i < r.v.size(); ++i) {
    const double g = static_cast<double>(t.flat(i)), want = r.v[i];
    if (!std::isfinite(g) || !std::isfinite(want)) {
      if (!(g == want || (std::isnan(g) && std::isnan(want)))) {
        *why = "element " + std::to_string(i) + ": " + std::to_string(g) + " vs reference " + std::to_string(want);
        return INFINITY;
      }
      continue;
    }
    worst = std::max(worst, std::fabs(g - want) / scale);
  }
  return worst;
}

}  // namespace fz
