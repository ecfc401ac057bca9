// bench/peers/eigen_edge.cpp: the Eigen 3.4 peer of bench/edge_latency.cpp (issue 23), batch 1,
// one thread, written as well as Eigen allows.
//
// Configuration (said next to every number):
//   - Built with -march=native and without OpenMP, so Eigen's GEMM runs on the calling thread.
//   - Eigen's own GEMM/GEMV kernels (no EIGEN_USE_BLAS).
//   - Every buffer (im2col columns, convolution outputs, pooled maps) is allocated once, when the
//     model is built; a call allocates nothing.
//   - Convolution is im2col then one GEMM, W [O, C*K*K] * columns [C*K*K, OH*OW], both row-major:
//     the OIHW weights are already that matrix, and the result is NCHW, fusebox's flatten order.
//   - Pooling runs before bias and relu: max over a window commutes with adding the channel's bias
//     and with relu (both monotone), so they touch a quarter of the values; same function.
//   - Linear layers are a row vector times a row-major [in, out] matrix, which Eigen evaluates as
//     its column-major GEMV (contiguous, vectorised axpy over the outputs).
#include "eigen_edge.hpp"

#include <Eigen/Core>

#include <algorithm>
#include <string>

namespace fusebox::bench::edge {
namespace {

using mat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using arr = Eigen::Array<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using row_vec = Eigen::Matrix<float, 1, Eigen::Dynamic>;
using col_arr = Eigen::Array<float, Eigen::Dynamic, 1>;

/// Copies a row-major [rows, cols] float array into an Eigen matrix.
mat from(const float* p, Eigen::Index rows, Eigen::Index cols) { return Eigen::Map<const mat>(p, rows, cols); }

/// im2col for a stride-1, unpadded convolution: x [C, S, S] -> cols [C*K*K, OS*OS], OS = S-K+1;
/// row (c, kh, kw) holds the input each output position sees through that kernel tap.
void im2col(const float* x, Eigen::Index channels, Eigen::Index side, Eigen::Index k, mat& cols) {
  const Eigen::Index os = side - k + 1;
  float* out = cols.data();
  for (Eigen::Index c = 0; c < channels; ++c)
    for (Eigen::Index kh = 0; kh < k; ++kh)
      for (Eigen::Index kw = 0; kw < k; ++kw)
        for (Eigen::Index oh = 0; oh < os; ++oh, out += os)
          std::copy_n(x + (c * side + oh + kh) * side + kw, os, out);
}

/// y [C, S/2 * S/2] = relu(max_pool2x2(conv) + bias), conv [C, S*S] row-major (NCHW, batch 1),
/// as Eigen array expressions over strided views; `half` [C*S, S/2] is scratch.
void pool_bias_relu(const mat& conv, const col_arr& bias, Eigen::Index side, arr& half, arr& y) {
  const Eigen::Index n = conv.size() / 2, hs = side / 2;
  // Horizontal pairs: even and odd columns of every row are the even and odd elements overall.
  using strided = Eigen::Map<const Eigen::Array<float, Eigen::Dynamic, 1>, 0, Eigen::InnerStride<2>>;
  Eigen::Map<Eigen::Array<float, Eigen::Dynamic, 1>>(half.data(), n) =
      strided(conv.data(), n).max(strided(conv.data() + 1, n));
  // Vertical pairs: two consecutive half rows form one row of a [C*S/2, S] view.
  const Eigen::Map<const arr> rows2(half.data(), conv.rows() * hs, side);
  Eigen::Map<arr>(y.data(), conv.rows() * hs, hs) = rows2.leftCols(hs).max(rows2.rightCols(hs));
  y = (y.colwise() + bias).max(0.0f);
}

class cnn final : public runner {
 public:
  using P = t2_cnn_params;
  static constexpr Eigen::Index k = P::kernel;

  explicit cnn(const t2_cnn_params& p)
      : w1_(from(p.w1, P::c1, k * k)),
        w2_(from(p.w2, P::c2, P::c1 * k * k)),
        w3_(from(p.w3, P::features, P::classes)),
        b1_(Eigen::Map<const col_arr>(p.b1, P::c1)),
        b2_(Eigen::Map<const col_arr>(p.b2, P::c2)),
        b3_(Eigen::Map<const row_vec>(p.b3, P::classes)),
        cols1_(k * k, P::side1 * P::side1),
        conv1_(P::c1, P::side1 * P::side1),
        half1_(P::c1 * P::side1, P::pooled1),
        h1_(P::c1, P::pooled1 * P::pooled1),
        cols2_(P::c1 * k * k, P::side2 * P::side2),
        conv2_(P::c2, P::side2 * P::side2),
        half2_(P::c2 * P::side2, P::pooled2),
        h2_(P::c2, P::pooled2 * P::pooled2) {}

  void run(const float* in, float* out) override {
    im2col(in, 1, P::side, k, cols1_);
    conv1_.noalias() = w1_ * cols1_;
    pool_bias_relu(conv1_, b1_, P::side1, half1_, h1_);
    im2col(h1_.data(), P::c1, P::pooled1, k, cols2_);
    conv2_.noalias() = w2_ * cols2_;
    pool_bias_relu(conv2_, b2_, P::side2, half2_, h2_);
    // h2_ [64, 16] row-major is the NCHW flatten: the 1024 features in w3's row order.
    Eigen::Map<row_vec> y(out, P::classes);
    y.noalias() = Eigen::Map<const row_vec>(h2_.data(), P::features) * w3_;
    y += b3_;
  }

 private:
  mat w1_, w2_, w3_;
  col_arr b1_, b2_;
  row_vec b3_;
  mat cols1_, conv1_;
  arr half1_, h1_;
  mat cols2_, conv2_;
  arr half2_, h2_;
};

class mlp final : public runner {
 public:
  using P = mlp_params;

  explicit mlp(const mlp_params& p)
      : w1_(from(p.w1, P::inputs, P::hidden)),
        w2_(from(p.w2, P::hidden, P::outputs)),
        b1_(Eigen::Map<const row_vec>(p.b1, P::hidden)),
        b2_(Eigen::Map<const row_vec>(p.b2, P::outputs)),
        h_(P::hidden) {}

  void run(const float* in, float* out) override {
    h_.noalias() = Eigen::Map<const row_vec>(in, P::inputs) * w1_;
    h_ = (h_ + b1_).cwiseMax(0.0f);
    Eigen::Map<row_vec> y(out, P::outputs);
    y.noalias() = h_ * w2_;
    y += b2_;
  }

 private:
  mat w1_, w2_;
  row_vec b1_, b2_, h_;
};

}  // namespace

std::unique_ptr<runner> eigen_t2_cnn(const t2_cnn_params& p) { return std::make_unique<cnn>(p); }
std::unique_ptr<runner> eigen_mlp(const mlp_params& p) { return std::make_unique<mlp>(p); }

std::string eigen_edge_describe() {
  return "Eigen " + std::to_string(EIGEN_WORLD_VERSION) + "." + std::to_string(EIGEN_MAJOR_VERSION) + "." +
         std::to_string(EIGEN_MINOR_VERSION) + ", SIMD: " + Eigen::SimdInstructionSetsInUse() +
         ", 1 thread (no OpenMP), im2col + Eigen GEMM for conv, pool before bias+relu, GEMV for linear";
}

}  // namespace fusebox::bench::edge
