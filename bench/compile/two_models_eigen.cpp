// bench/compile/two_models_eigen.cpp: the work of two_models_fusebox.cpp written with Eigen 3.4,
// the build-cost peer (bench/compile/build_cost.sh). Each model is written as Eigen users write it
// (matrix products, GELU by unaryExpr, the row block row by row), then checked against a plain
// loop reference and timed, as fusebox's ab() does: what is compared is what it costs to build.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <vector>

#include <Eigen/Dense>

using matrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using row = Eigen::RowVectorXf;

namespace {

float gelu(float v) { return 0.5f * v * (1.0f + std::erf(v * 0.70710678f)); }

matrix mlp(const matrix& x, const matrix& w1, const row& b1, const matrix& w2, const row& b2) {
  matrix h = ((x * w1).rowwise() + b1).unaryExpr(&gelu);
  return (h * w2).rowwise() + b2;
}

matrix block(const matrix& x, const row& gamma, const row& beta) {
  matrix y(x.rows(), x.cols());
  for (Eigen::Index r = 0; r < x.rows(); ++r) {
    const row e = (x.row(r).array() - x.row(r).maxCoeff()).exp().matrix();
    const row s = e / e.sum();
    const float mean = s.mean();
    const float var = (s.array() - mean).square().mean();
    y.row(r) = ((s.array() - mean) / std::sqrt(var + 1e-5f) * gamma.array() + beta.array()).matrix();
  }
  return y;
}

// The loop references, in double (as ab() compares compiled against eager).
std::vector<double> mlp_reference(const matrix& x, const matrix& w1, const row& b1, const matrix& w2, const row& b2) {
  std::vector<double> h(x.rows() * w1.cols()), y(x.rows() * w2.cols());
  for (Eigen::Index i = 0; i < x.rows(); ++i)
    for (Eigen::Index j = 0; j < w1.cols(); ++j) {
      double z = b1(j);
      for (Eigen::Index k = 0; k < x.cols(); ++k) z += double(x(i, k)) * w1(k, j);
      h[i * w1.cols() + j] = 0.5 * z * (1.0 + std::erf(z / std::sqrt(2.0)));
    }
  for (Eigen::Index i = 0; i < x.rows(); ++i)
    for (Eigen::Index j = 0; j < w2.cols(); ++j) {
      double z = b2(j);
      for (Eigen::Index k = 0; k < w1.cols(); ++k) z += h[i * w1.cols() + k] * w2(k, j);
      y[i * w2.cols() + j] = z;
    }
  return y;
}

std::vector<double> block_reference(const matrix& x, const row& gamma, const row& beta) {
  std::vector<double> y(x.size());
  const Eigen::Index n = x.cols();
  for (Eigen::Index r = 0; r < x.rows(); ++r) {
    double m = x(r, 0), sum = 0, mean = 0, var = 0;
    for (Eigen::Index c = 0; c < n; ++c) m = std::max(m, double(x(r, c)));
    std::vector<double> s(n);
    for (Eigen::Index c = 0; c < n; ++c) sum += s[c] = std::exp(x(r, c) - m);
    for (Eigen::Index c = 0; c < n; ++c) mean += (s[c] /= sum) / n;
    for (Eigen::Index c = 0; c < n; ++c) var += (s[c] - mean) * (s[c] - mean) / n;
    for (Eigen::Index c = 0; c < n; ++c) y[r * n + c] = (s[c] - mean) / std::sqrt(var + 1e-5) * gamma(c) + beta(c);
  }
  return y;
}

template <class F>
bool check_and_time(const char* name, F f, const std::vector<double>& want) {
  const matrix got = f();
  double worst = 0, mag = 0;
  for (Eigen::Index i = 0; i < got.size(); ++i) {
    worst = std::max(worst, std::fabs(got.data()[i] - want[i]));
    mag = std::max(mag, std::fabs(want[i]));
  }
  std::vector<double> t;
  for (int i = 0; i < 50; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    const matrix y = f();
    t.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(t.begin(), t.end());
  std::printf("%s: median %.1f us, max rel err %.2e\n", name, t[t.size() / 2], worst / mag);
  return worst <= 1e-4 * mag;
}

}  // namespace

int main() {
  const matrix x = matrix::Random(64, 256), w1 = matrix::Random(256, 512) * 0.05f, w2 = matrix::Random(512, 32) * 0.05f;
  const row b1 = row::Random(512), b2 = row::Random(32);
  const bool mlp_ok = check_and_time("mlp", [&] { return mlp(x, w1, b1, w2, b2); }, mlp_reference(x, w1, b1, w2, b2));
  const matrix xs = matrix::Random(256, 512);
  const row gamma = row::Random(512), beta = row::Random(512);
  const bool block_ok =
      check_and_time("layer_norm(softmax(x))", [&] { return block(xs, gamma, beta); }, block_reference(xs, gamma, beta));
  return mlp_ok && block_ok ? 0 : 1;
}
