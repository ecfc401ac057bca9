// bench/peers/xnnpack_cpu.cpp: the XNNPACK peer of bench/edge_latency.cpp (issue 23), through
// XNNPACK's subgraph API, the way TensorFlow Lite's XNNPACK delegate drives it.
//
// Configuration (said next to every number):
//   - Each model is one subgraph; xnn_create_runtime_v2 with no thread pool runs it on the calling
//     thread. XNNPACK picks its microkernels at run time from the CPU (cpuinfo), so the flags this
//     file is compiled with do not matter to its speed.
//   - ReLU is fused the way XNNPACK expects it: output_min = 0 on the convolution or fully
//     connected node, not a separate clamp node.
//   - Weights are converted once, here, from fusebox's layouts to XNNPACK's (conv OIHW -> OHWI,
//     linear [in, out] -> [out, in], and the T2 linear layer's rows permuted from the NCHW flatten
//     order to NHWC's); XNNPACK packs them again when it creates the runtime.
//   - The input and output are bound with xnn_setup_runtime once per address, so a timed call is
//     xnn_invoke_runtime alone.
#include "xnnpack_cpu.hpp"

#include <xnnpack.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

namespace fusebox::bench::edge {
namespace {

static_assert(runner::input_slack_bytes >= XNN_EXTRA_BYTES, "runner::input_slack_bytes must cover XNN_EXTRA_BYTES");

constexpr float inf = std::numeric_limits<float>::infinity();
constexpr std::uint32_t input_id = 0, output_id = 1;  // the subgraph's two external values

void check(xnn_status s, const char* what) {
  if (s != xnn_status_success) throw std::runtime_error(std::string("XNNPACK: ") + what + " failed (status " + std::to_string(s) + ")");
}

/// xnn_initialize once per process (it is reference counted; never deinitialised: the runners may
/// live until exit).
void initialize() {
  static const xnn_status s = xnn_initialize(nullptr);
  check(s, "xnn_initialize");
}

/// A runtime and the weights its subgraph was defined with (XNNPACK requires static data to
/// outlive the runtime).
class xnnpack_runner final : public runner {
 public:
  std::vector<std::vector<float>> weights;
  xnn_runtime_t runtime = nullptr;

  ~xnnpack_runner() override {
    if (runtime) xnn_delete_runtime(runtime);
  }

  void run(const float* in, float* out) override {
    if (in != bound_in_ || out != bound_out_) {
      // XNNPACK never writes an external input; its API just has one pointer type for both.
      const xnn_external_value io[2] = {{input_id, const_cast<float*>(in)}, {output_id, out}};
      check(xnn_setup_runtime(runtime, 2, io), "xnn_setup_runtime");
      bound_in_ = in, bound_out_ = out;
    }
    check(xnn_invoke_runtime(runtime), "xnn_invoke_runtime");
  }

  /// Keeps a converted weight alive for the runtime; returns its data.
  const float* keep(std::vector<float> w) { return weights.emplace_back(std::move(w)).data(); }

 private:
  const float* bound_in_ = nullptr;
  float* bound_out_ = nullptr;
};

/// A subgraph under construction: each value is an fp32 tensor, static when given data.
class graph {
 public:
  graph() {
    initialize();
    check(xnn_create_subgraph(2, 0, &g_), "xnn_create_subgraph");
  }
  ~graph() { xnn_delete_subgraph(g_); }
  graph(const graph&) = delete;
  graph& operator=(const graph&) = delete;

  std::uint32_t input(std::vector<std::size_t> dims) { return value(dims, nullptr, input_id, XNN_VALUE_FLAG_EXTERNAL_INPUT); }
  std::uint32_t output(std::vector<std::size_t> dims) { return value(dims, nullptr, output_id, XNN_VALUE_FLAG_EXTERNAL_OUTPUT); }
  std::uint32_t internal(std::vector<std::size_t> dims) { return value(dims, nullptr, XNN_INVALID_VALUE_ID, 0); }
  std::uint32_t constant(std::vector<std::size_t> dims, const float* data) {
    return value(dims, data, XNN_INVALID_VALUE_ID, 0);
  }

  /// Convolution, stride 1, no padding, with bias and relu (output clamped to [0, inf)).
  void conv_relu(std::uint32_t x, std::uint32_t w, std::uint32_t b, std::uint32_t y, std::size_t k, std::size_t in_c,
                 std::size_t out_c) {
    const auto kk = static_cast<std::uint32_t>(k);
    check(xnn_define_convolution_2d(g_, 0, 0, 0, 0, kk, kk, 1, 1, 1, 1, 1, in_c, out_c, 0.0f, inf, x, w, b, y, 0),
          "xnn_define_convolution_2d");
  }
  /// Max pooling 2x2, stride 2.
  void max_pool2(std::uint32_t x, std::uint32_t y) {
    check(xnn_define_max_pooling_2d(g_, 0, 0, 0, 0, 2, 2, 2, 2, 1, 1, -inf, inf, x, y, 0), "xnn_define_max_pooling_2d");
  }
  /// y = x W^T + b, W [out, in]; `flatten`: x is first flattened to [1, in] (TensorFlow's reshape).
  void fully_connected(std::uint32_t x, std::uint32_t w, std::uint32_t b, std::uint32_t y, float lo, bool flatten) {
    check(xnn_define_fully_connected(g_, lo, inf, x, w, b, y, flatten ? XNN_FLAG_TENSORFLOW_RESHAPE_2D : 0),
          "xnn_define_fully_connected");
  }

  /// The runtime for `r`, one thread (no pthreadpool).
  void finish(xnnpack_runner& r) { check(xnn_create_runtime_v2(g_, nullptr, 0, &r.runtime), "xnn_create_runtime_v2"); }

 private:
  std::uint32_t value(const std::vector<std::size_t>& dims, const float* data, std::uint32_t ext, std::uint32_t flags) {
    std::uint32_t id = 0;
    check(xnn_define_tensor_value(g_, xnn_datatype_fp32, dims.size(), dims.data(), data, ext, flags, &id),
          "xnn_define_tensor_value");
    return id;
  }
  xnn_subgraph_t g_ = nullptr;
};

/// OIHW -> OHWI (XNNPACK's filter layout for NHWC convolution).
std::vector<float> oihw_to_ohwi(const float* w, std::size_t o, std::size_t c, std::size_t k) {
  std::vector<float> r(o * c * k * k);
  for (std::size_t a = 0; a < o; ++a)
    for (std::size_t i = 0; i < c; ++i)
      for (std::size_t h = 0; h < k; ++h)
        for (std::size_t x = 0; x < k; ++x) r[((a * k + h) * k + x) * c + i] = w[((a * c + i) * k + h) * k + x];
  return r;
}

std::vector<float> copy(const float* p, std::size_t n) { return {p, p + n}; }

/// [in, out] -> [out, in].
std::vector<float> transpose(const float* w, std::size_t in, std::size_t out) {
  std::vector<float> r(in * out);
  for (std::size_t i = 0; i < in; ++i)
    for (std::size_t o = 0; o < out; ++o) r[o * in + i] = w[i * out + o];
  return r;
}

}  // namespace

std::unique_ptr<runner> xnnpack_t2_cnn(const t2_cnn_params& p) {
  using P = t2_cnn_params;
  auto r = std::make_unique<xnnpack_runner>();
  // The T2 linear layer in XNNPACK's [out, in] layout, its inputs in the NHWC flatten order
  // (h, w, c) of the pooled [1, 4, 4, 64] tensor; fusebox's rows are in NCHW order (c, h, w).
  std::vector<float> w3(P::classes * P::features);
  for (std::size_t c = 0; c < P::c2; ++c)
    for (std::size_t h = 0; h < P::pooled2; ++h)
      for (std::size_t w = 0; w < P::pooled2; ++w) {
        const std::size_t nchw = (c * P::pooled2 + h) * P::pooled2 + w, nhwc = (h * P::pooled2 + w) * P::c2 + c;
        for (std::size_t o = 0; o < P::classes; ++o) w3[o * P::features + nhwc] = p.w3[nchw * P::classes + o];
      }

  graph g;
  // [1, 1, 28, 28] NCHW and [1, 28, 28, 1] NHWC are the same bytes (one channel).
  const auto x = g.input({1, P::side, P::side, 1});
  const auto w1 = g.constant({P::c1, P::kernel, P::kernel, 1}, r->keep(oihw_to_ohwi(p.w1, P::c1, 1, P::kernel)));
  const auto b1 = g.constant({P::c1}, r->keep(copy(p.b1, P::c1)));
  const auto w2 = g.constant({P::c2, P::kernel, P::kernel, P::c1}, r->keep(oihw_to_ohwi(p.w2, P::c2, P::c1, P::kernel)));
  const auto b2 = g.constant({P::c2}, r->keep(copy(p.b2, P::c2)));
  const auto w3v = g.constant({P::classes, P::features}, r->keep(std::move(w3)));
  const auto b3 = g.constant({P::classes}, r->keep(copy(p.b3, P::classes)));
  const auto c1 = g.internal({1, P::side1, P::side1, P::c1});
  const auto h1 = g.internal({1, P::pooled1, P::pooled1, P::c1});
  const auto c2 = g.internal({1, P::side2, P::side2, P::c2});
  const auto h2 = g.internal({1, P::pooled2, P::pooled2, P::c2});
  const auto y = g.output({1, P::classes});
  g.conv_relu(x, w1, b1, c1, P::kernel, 1, P::c1);
  g.max_pool2(c1, h1);
  g.conv_relu(h1, w2, b2, c2, P::kernel, P::c1, P::c2);
  g.max_pool2(c2, h2);
  g.fully_connected(h2, w3v, b3, y, -inf, /*flatten=*/true);
  g.finish(*r);
  return r;
}

std::unique_ptr<runner> xnnpack_mlp(const mlp_params& p) {
  using P = mlp_params;
  auto r = std::make_unique<xnnpack_runner>();
  graph g;
  const auto x = g.input({1, P::inputs});
  const auto w1 = g.constant({P::hidden, P::inputs}, r->keep(transpose(p.w1, P::inputs, P::hidden)));
  const auto b1 = g.constant({P::hidden}, r->keep(copy(p.b1, P::hidden)));
  const auto w2 = g.constant({P::outputs, P::hidden}, r->keep(transpose(p.w2, P::hidden, P::outputs)));
  const auto b2 = g.constant({P::outputs}, r->keep(copy(p.b2, P::outputs)));
  const auto h = g.internal({1, P::hidden});
  const auto y = g.output({1, P::outputs});
  g.fully_connected(x, w1, b1, h, 0.0f, false);  // relu fused: output clamped to [0, inf)
  g.fully_connected(h, w2, b2, y, -inf, false);
  g.finish(*r);
  return r;
}

std::string xnnpack_describe() {
  return std::string("XNNPACK ") + FUSEBOX_BENCH_XNNPACK_VERSION +
         " subgraph API, runtime without a thread pool (1 thread), NHWC, fused relu (output_min 0), "
         "microkernels chosen by XNNPACK at run time";
}

}  // namespace fusebox::bench::edge
