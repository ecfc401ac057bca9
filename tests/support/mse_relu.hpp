// tests/support/mse_relu.hpp: the small loss several gradient tests differentiate, and its loss
// and gradients by hand in double:
//
//   mse_relu(x, w, b, t) = mean(mean((relu(x w + b) - t)^2)),  x [B, In], w [In, Out], b [Out], t [B, Out]
//
// mean's 1 / n depends on the batch, which makes it the dyn-batch case's test of per-call
// constants (autodiff/grad.cpp, compile/capability_matrix.cpp).
// Depends on: nothing of fusebox but the tensors' flat() and extents().
#pragma once

#include <cstddef>
#include <vector>

namespace fbt {

inline constexpr auto mse_relu = [](const auto& x, const auto& w, const auto& b, const auto& t) {
  const auto e = fusebox::relu(fusebox::matmul(x, w) + b) - t;
  return fusebox::mean(fusebox::mean(e * e));
};

/// mse_relu's value and gradients with respect to x, w and b.
struct mse_relu_reference {
  double loss = 0;
  std::vector<double> dx, dw, db;
};

template <class X, class W, class B, class T>
mse_relu_reference mse_relu_expected(const X& x, const W& w, const B& b, const T& t) {
  const std::size_t batch = x.extents().extent[0], in = w.extents().extent[0], out = w.extents().extent[1];
  mse_relu_reference r;
  r.dx.assign(batch * in, 0.0), r.dw.assign(in * out, 0.0), r.db.assign(out, 0.0);
  const double n = static_cast<double>(batch * out);
  for (std::size_t i = 0; i < batch; ++i)
    for (std::size_t j = 0; j < out; ++j) {
      double z = b.flat(j);
      for (std::size_t k = 0; k < in; ++k) z += static_cast<double>(x.flat(i * in + k)) * w.flat(k * out + j);
      const double e = (z > 0 ? z : 0.0) - t.flat(i * out + j);
      r.loss += e * e / n;
      const double dz = z > 0 ? 2.0 * e / n : 0.0;
      r.db[j] += dz;
      for (std::size_t k = 0; k < in; ++k) {
        r.dw[k * out + j] += static_cast<double>(x.flat(i * in + k)) * dz;
        r.dx[i * in + k] += dz * w.flat(k * out + j);
      }
    }
  return r;
}

}  // namespace fbt
