// tests/support/gelu_sigmoid.hpp: W1c's elementwise chain, gelu(x * w + b) * sigmoid(x), and its
// double reference: the small model the switch tests share (rollback, backend, FUSEBOX_DISABLE).
// Depends on: fusebox/fusebox.hpp.
#pragma once

#include <cmath>

#include <fusebox/fusebox.hpp>

namespace fbt {

inline constexpr auto gelu_sigmoid = [](auto x, auto w, auto b) { return fusebox::gelu(x * w + b) * fusebox::sigmoid(x); };

inline double gelu_sigmoid_ref(double x, double w, double b) {
  const double u = x * w + b;
  return 0.5 * u * (1.0 + std::erf(u / std::sqrt(2.0))) / (1.0 + std::exp(-x));
}

}  // namespace fbt
