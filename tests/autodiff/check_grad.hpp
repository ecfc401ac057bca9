// tests/autodiff/check_grad.hpp: the law every autodiff test checks. For a loss function and
// arguments (double precision), value_and_grad run eagerly (op by op) and compiled (one planned
// program) must give
//   - the loss the model gives when called on the tensors (eager forward), and
//   - for every element of every differentiated argument, the central finite difference
//     (f(x + h) - f(x - h)) / 2h of that eager forward, h = 1e-6 max(1, |x|): truncation ~h^2,
//     rounding ~1e-16 / h, so 1e-7 absolute + 1e-7 relative is far above the measured ~1e-10 and
//     far below any wrong rule (a wrong factor or sign is off by O(1));
// and eager and compiled gradients must agree to 1e-12 of the largest gradient (they differ only in
// summation order). Failures name the argument, the element, the values and how many elements
// are out of tolerance.
// Depends on: fusebox, Catch2.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <tuple>
#include <utility>

#include <catch2/catch.hpp>

#include <fusebox/fusebox.hpp>

#include "../support/check.hpp"

namespace fbt {

/// A gradient result as a tuple (one wrt index gives a bare tensor).
template <class G>
auto as_tuple(G&& g) {
  if constexpr (fb::is_tensor_v<std::remove_cvref_t<G>>) return std::tuple<std::remove_cvref_t<G>>(std::forward<G>(g));
  else return std::forward<G>(g);
}

/// The loss f(args...) evaluated eagerly, as a double.
template <class F, class... Args>
double loss_value(F& f, const Args&... args) {
  const auto l = f(args...);
  return static_cast<double>(l.flat(0));
}

struct grad_tolerance {
  double abs = 1e-7, rel = 1e-7;
};

namespace detail {
template <std::size_t W, std::size_t K, class F, class ArgsTuple, class G, class C>
void check_argument(const std::string& what, F& f, ArgsTuple& args, const G& eager_grads, const C& compiled_grads,
                    grad_tolerance tol) {
  auto& x = std::get<W>(args);
  const auto& ge = std::get<K>(eager_grads);
  const auto& gc = std::get<K>(compiled_grads);
  REQUIRE(ge.extents() == x.extents());
  REQUIRE(gc.extents() == x.extents());
  std::size_t bad = 0, mismatch = 0;
  std::string first, first_mismatch;
  double scale = 0;
  for (std::size_t i = 0; i < x.size(); ++i) scale = std::max(scale, std::fabs(static_cast<double>(ge.flat(i))));
  for (std::size_t i = 0; i < x.size(); ++i) {
    const auto saved = x.flat(i);
    const double h = 1e-6 * std::max(1.0, std::fabs(static_cast<double>(saved)));
    x.flat(i) = saved + h;
    const double up = std::apply([&](const auto&... a) { return loss_value(f, a...); }, args);
    x.flat(i) = saved - h;
    const double down = std::apply([&](const auto&... a) { return loss_value(f, a...); }, args);
    x.flat(i) = saved;
    const double fd = (up - down) / (2 * h);
    const double e = static_cast<double>(ge.flat(i)), c = static_cast<double>(gc.flat(i));
    if (!(std::fabs(e - fd) <= tol.abs + tol.rel * std::fabs(fd)) && bad++ == 0) {
      char buf[200];
      std::snprintf(buf, sizeof buf, "element %zu: gradient %.17g, finite difference %.17g", i, e, fd);
      first = buf;
    }
    if (!(std::fabs(e - c) <= 1e-12 * std::max(1.0, scale)) && mismatch++ == 0) {
      char buf[200];
      std::snprintf(buf, sizeof buf, "element %zu: eager %.17g, compiled %.17g", i, e, c);
      first_mismatch = buf;
    }
  }
  INFO(what << ": d loss / d argument " << W << " " << fb::to_string(x.extents()) << ": " << bad << " of "
            << x.size() << " elements off the finite difference; first: " << first);
  CHECK(bad == 0);
  INFO(what << ": argument " << W << ": " << mismatch << " elements where eager and compiled differ; first: "
            << first_mismatch);
  CHECK(mismatch == 0);
}
}  // namespace detail

/// Checks value_and_grad(f, wrt<W...>) at args (tensors in double; others pass through), eager
/// and compiled, against the eager forward and central differences, element by element.
template <class F, std::size_t... W, class... Args>
void check_grad(const std::string& what, F f, fb::wrt_t<W...> w, Args... args) {
  auto vg = fb::value_and_grad(f, w);
  auto [value, grads] = vg(args...);
  auto compiled = fb::compile(vg);
  auto [cvalue, cgrads] = compiled(args...);
  const auto eager_grads = as_tuple(std::move(grads));
  const auto compiled_grads = as_tuple(std::move(cgrads));
  const double f0 = loss_value(f, args...);
  {
    INFO(what << ": loss eager " << value.flat(0) << ", compiled " << cvalue.flat(0) << ", forward " << f0);
    CHECK(std::fabs(static_cast<double>(value.flat(0)) - f0) <= 1e-12 * std::max(1.0, std::fabs(f0)));
    CHECK(std::fabs(static_cast<double>(cvalue.flat(0)) - f0) <= 1e-12 * std::max(1.0, std::fabs(f0)));
  }
  auto args_tuple = std::tuple<Args&...>(args...);
  [&]<std::size_t... K>(std::index_sequence<K...>) {
    constexpr std::size_t ws[] = {W...};
    (detail::check_argument<ws[K], K>(what, f, args_tuple, eager_grads, compiled_grads, grad_tolerance{}), ...);
  }(std::index_sequence_for<decltype(W)...>{});
}

/// A double tensor of shape S with random magnitudes in [lo, hi] and random signs (never zero).
template <class S>
fb::tensor<double, S> signed_tensor(std::uint64_t seed, double lo = 0.2, double hi = 2.0) {
  fb::tensor<double, S> t;
  fill_signed(t, seed, lo, hi);
  return t;
}
/// A double tensor of shape S uniform in [lo, hi) (positive for log, sqrt, pow).
template <class S>
fb::tensor<double, S> positive_tensor(std::uint64_t seed, double lo = 0.5, double hi = 2.0) {
  fb::tensor<double, S> t;
  fill_uniform(t, seed, lo, hi);
  return t;
}

template <class E>
constexpr std::size_t rank_of() {
  if constexpr (fb::is_tensor_v<E>) return E::rank;
  else return E::desc.shape.rank;
}

/// sum over every dimension: the scalar a loss needs (an expression while captured, a tensor
/// when the loss runs eagerly for the finite differences).
template <class E>
auto total(const E& e) {
  if constexpr (rank_of<E>() == 0) return e;
  else return total(fb::sum(e));
}

}  // namespace fbt
