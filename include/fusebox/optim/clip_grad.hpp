// optim/clip_grad.hpp: gradient clipping by total norm, torch.nn.utils.clip_grad_norm_'s semantics:
//   total = (sum over every element of every gradient of |g|^p)^(1/p)     (p = inf: max |g|)
//   coef  = max_norm / (total + 1e-6), clamped to at most 1;  every gradient *= coef
// and the total norm (before clipping) is returned. Between the gradient call and the optimizer:
//
//   auto [loss, grads] = step(x, t, params...);
//   const double norm = fb::optim::clip_grad_norm(grads, 1.0);
//   opt.step(grads);
//
// The norm is accumulated in double, per chunk of 16384 elements on the thread pool, and the
// chunks' partial sums are added in chunk order: the result does not depend on the thread count.
// Gradients must be contiguous host tensors (what compile(value_and_grad) returns); a bare tensor
// or a std::tuple of them. With `error_if_nonfinite`, a NaN or infinite norm is an error naming
// it and the call site, and nothing is scaled (torch's flag); without it the NaN propagates into
// the gradients, as torch's does.
// Depends on: core/{tensor,errors}.hpp, backend/cpu/thread_pool.hpp, optim/multi_tensor.hpp (chunk size).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
#include <source_location>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include "fusebox/backend/cpu/thread_pool.hpp"
#include "fusebox/core/errors.hpp"
#include "fusebox/core/tensor.hpp"
#include "fusebox/optim/multi_tensor.hpp"

namespace fusebox::optim {

struct clip_options {
  double norm_type = 2.0;           ///< p of the p-norm; std::numeric_limits<double>::infinity() for max |g|
  bool error_if_nonfinite = false;  ///< a NaN or infinite total norm throws instead of scaling
  unsigned threads = 0;             ///< 0: fusebox::default_threads()
};

namespace detail {

template <class T>
struct mutable_span {
  T* data;
  std::size_t size;
};

template <class T, class S>
void push_mutable(std::vector<mutable_span<T>>& out, tensor<T, S>& g, const std::source_location& loc) {
  if (!g.contiguous())
    FUSEBOX_THROW(invalid_argument("fusebox::optim::clip_grad_norm: gradient " + std::to_string(out.size()) + " " +
                                   to_string(g.extents()) + " is a strided view; pass the tensors the gradient call returned (at " +
                                   where(loc) + ")"));
  out.push_back({g.data(), g.size()});
}

template <class G>
struct gradient_value {
  using type = typename G::value_type;  // one tensor
};
template <class... Ts>
struct gradient_value<std::tuple<Ts...>> {
  using type = typename std::tuple_element_t<0, std::tuple<Ts...>>::value_type;
};

/// Sum of squares of x[begin, end) in double: eight independent sums (an add's latency would
/// otherwise bound the loop), combined in a fixed order.
template <class T>
double sum_of_squares(const T* x, std::size_t begin, std::size_t end) {
  double s[8] = {};
  std::size_t i = begin;
  for (; i + 8 <= end; i += 8)
    for (std::size_t l = 0; l < 8; ++l) s[l] += static_cast<double>(x[i + l]) * static_cast<double>(x[i + l]);
  for (std::size_t l = 0; i < end; ++i, ++l) s[l] += static_cast<double>(x[i]) * static_cast<double>(x[i]);
  return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
}

}  // namespace detail

/// Scales `grads` (a tensor, or a std::tuple of tensors of one element type) so their total
/// p-norm is at most `max_norm`; returns the total norm before scaling.
template <class G>
double clip_grad_norm(G& grads, double max_norm, const clip_options& o = {},
                      std::source_location loc = std::source_location::current()) {
  const double p = o.norm_type;
  if (!(p > 0) || std::isnan(max_norm) || max_norm < 0)
    FUSEBOX_THROW(invalid_argument("fusebox::optim::clip_grad_norm: need norm_type > 0 (got " + std::to_string(p) +
                                   ") and max_norm >= 0 (got " + std::to_string(max_norm) + ") (at " + where(loc) + ")"));
  using T = typename detail::gradient_value<G>::type;
  std::vector<detail::mutable_span<T>> spans;
  if constexpr (is_tensor_v<G>) detail::push_mutable(spans, grads, loc);
  else std::apply([&](auto&... g) { (detail::push_mutable(spans, g, loc), ...); }, grads);

  struct piece {
    std::size_t span, begin, end;
  };
  std::vector<piece> pieces;
  for (std::size_t s = 0; s < spans.size(); ++s)
    for (std::size_t b = 0; b < spans[s].size; b += chunk_elements)
      pieces.push_back({s, b, std::min(spans[s].size, b + chunk_elements)});

  const bool inf_norm = std::isinf(p), two = p == 2.0;
  std::vector<double> partial(pieces.size(), 0.0);
  auto& pool = cpu::shared_pool(o.threads ? o.threads : default_threads());
  pool.parallel_for(pieces.size(), [&](std::size_t t, unsigned) {
    const piece& c = pieces[t];
    const T* x = spans[c.span].data;
    double acc = 0;
    if (inf_norm)
      for (std::size_t i = c.begin; i < c.end; ++i) acc = std::max(acc, std::abs(static_cast<double>(x[i])));
    else if (two)
      acc = detail::sum_of_squares(x, c.begin, c.end);
    else
      for (std::size_t i = c.begin; i < c.end; ++i) acc += std::pow(std::abs(static_cast<double>(x[i])), p);
    partial[t] = acc;
  });
  double total = 0;
  for (double v : partial) total = inf_norm ? std::max(total, v) : total + v;  // in chunk order
  if (!inf_norm) total = two ? std::sqrt(total) : std::pow(total, 1.0 / p);

  if (o.error_if_nonfinite && !std::isfinite(total))
    FUSEBOX_THROW(invalid_argument("fusebox::optim::clip_grad_norm: the total " + std::to_string(p) + "-norm of the gradients is " +
                                   std::to_string(total) +
                                   "; clipping cannot make it finite (set error_if_nonfinite = false to scale anyway) (at " +
                                   where(loc) + ")"));
  const double coef = max_norm / (total + 1e-6);
  if (coef < 1.0 || std::isnan(coef)) {
    const T c = static_cast<T>(coef);
    pool.parallel_for(pieces.size(), [&](std::size_t t, unsigned) {
      const piece& k = pieces[t];
      T* x = spans[k.span].data;
      for (std::size_t i = k.begin; i < k.end; ++i) x[i] *= c;
    });
  }
  return total;
}

}  // namespace fusebox::optim
