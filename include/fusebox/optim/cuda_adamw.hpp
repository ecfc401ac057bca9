// optim/cuda_adamw.hpp: AdamW's fused update on the GPU: the same per-element formulas as
// optim/adamw.hpp (torch's, see there), one NVRTC kernel, one launch per step over a chunk table
// of every parameter (a block per chunk of at most `chunk_elements` elements), queued on
// cuda::work_stream() like every compiled call.
//
//   fb::optim::cuda_adamw opt({fb::optim::device_parameter("0.weight", w), ...}, {.lr = 1e-3});
//   opt.step(std::tie(dw, ...));          // device gradients (cuda::tensor<float, S>), same order
//
// Parameters are float32 cuda::tensors, updated in place; the moments live in one device buffer.
// Scalars (lr, bias corrections) are kernel arguments computed in double on the host, so
// schedules change numbers, never code; the kernel is compiled once per process and device
// architecture (`--fmad=false`, so a*b+c rounds as the host loop's separate multiply and add).
// amsgrad is not in the kernel yet (refused by name). The source is `cuda_adamw_source()`, which CI
// compiles with NVRTC without a GPU (tests/cuda/optim.cpp).
// Device gradients come from compile(value_and_grad(...)) called with device tensors (bench/gpu.cpp's W5).
// Depends on: optim/adamw.hpp (options, checks), backend/cuda/{tensor,memory,module,nvrtc}.hpp.
#pragma once

#include <cmath>
#include <source_location>
#include <string>
#include <tuple>
#include <vector>

#include "fusebox/backend/cuda/memory.hpp"
#include "fusebox/backend/cuda/module.hpp"
#include "fusebox/backend/cuda/nvrtc.hpp"
#include "fusebox/backend/cuda/tensor.hpp"
#include "fusebox/core/errors.hpp"
#include "fusebox/optim/adamw.hpp"

namespace fusebox::optim {

/// The kernel: blockIdx.x is the chunk, threads stride over its elements.
inline std::string cuda_adamw_source() {
  return R"(// fusebox: fused AdamW (optim/cuda_adamw.hpp)
struct fusebox_adamw_chunk {
  float* p;
  const float* g;
  float* m;
  float* v;
  unsigned long long n;
};
__device__ __forceinline__ void fusebox_adamw_one(float& p, float g, float& m, float& v, float decay, float b1,
                                                  float one_minus_b1, float b2, float one_minus_b2, float step_size,
                                                  float bc2_sqrt, float eps, float sign) {
  g = sign * g;
  p = p * decay;
  m = m * b1 + g * one_minus_b1;
  v = v * b2 + g * g * one_minus_b2;
  const float denom = sqrtf(v) / bc2_sqrt + eps;
  p = p - step_size * (m / denom);
}
// A chunk whose four arrays are 16-byte aligned goes four elements a thread-step (one 16-byte
// access per array); the rest, and a chunk's tail, one at a time. The arithmetic is the same.
extern "C" __global__ void fusebox_adamw_f32(const fusebox_adamw_chunk* chunks, float decay, float b1,
                                             float one_minus_b1, float b2, float one_minus_b2,
                                             float step_size, float bc2_sqrt, float eps, float sign) {
  const fusebox_adamw_chunk c = chunks[blockIdx.x];
  unsigned long long done = 0;
  const unsigned long long bits = reinterpret_cast<unsigned long long>(c.p) | reinterpret_cast<unsigned long long>(c.g) |
                                  reinterpret_cast<unsigned long long>(c.m) | reinterpret_cast<unsigned long long>(c.v);
  if ((bits & 15) == 0) {
    const unsigned long long n4 = c.n / 4;
    for (unsigned long long i = threadIdx.x; i < n4; i += blockDim.x) {
      float4 p = reinterpret_cast<const float4*>(c.p)[i], m = reinterpret_cast<const float4*>(c.m)[i],
             v = reinterpret_cast<const float4*>(c.v)[i];
      const float4 g = reinterpret_cast<const float4*>(c.g)[i];
      fusebox_adamw_one(p.x, g.x, m.x, v.x, decay, b1, one_minus_b1, b2, one_minus_b2, step_size, bc2_sqrt, eps, sign);
      fusebox_adamw_one(p.y, g.y, m.y, v.y, decay, b1, one_minus_b1, b2, one_minus_b2, step_size, bc2_sqrt, eps, sign);
      fusebox_adamw_one(p.z, g.z, m.z, v.z, decay, b1, one_minus_b1, b2, one_minus_b2, step_size, bc2_sqrt, eps, sign);
      fusebox_adamw_one(p.w, g.w, m.w, v.w, decay, b1, one_minus_b1, b2, one_minus_b2, step_size, bc2_sqrt, eps, sign);
      reinterpret_cast<float4*>(c.p)[i] = p;
      reinterpret_cast<float4*>(c.m)[i] = m;
      reinterpret_cast<float4*>(c.v)[i] = v;
    }
    done = n4 * 4;
  }
  for (unsigned long long i = done + threadIdx.x; i < c.n; i += blockDim.x) {
    float p = c.p[i], m = c.m[i], v = c.v[i];
    fusebox_adamw_one(p, c.g[i], m, v, decay, b1, one_minus_b1, b2, one_minus_b2, step_size, bc2_sqrt, eps, sign);
    c.p[i] = p;
    c.m[i] = m;
    c.v[i] = v;
  }
}
)";
}

/// A device parameter for cuda_adamw: a name and a float32 cuda::tensor's memory.
template <class S>
nn::named_parameter<float> device_parameter(std::string name, cuda::tensor<float, S>& t) {
  return {std::move(name), t.data(), t.extents()};
}

class cuda_adamw {
 public:
  cuda_adamw(std::vector<nn::named_parameter<float>> params, const adamw_options& o = {})
      : params_(std::move(params)), options_(o) {
    detail::require(o.lr >= 0, "cuda_adamw", "learning rate", o.lr, "lr >= 0");
    detail::require(o.eps >= 0, "cuda_adamw", "epsilon value", o.eps, "eps >= 0");
    detail::require(o.beta1 >= 0 && o.beta1 < 1, "cuda_adamw", "beta parameter at index 0", o.beta1, "0 <= beta1 < 1");
    detail::require(o.beta2 >= 0 && o.beta2 < 1, "cuda_adamw", "beta parameter at index 1", o.beta2, "0 <= beta2 < 1");
    detail::require(o.weight_decay >= 0, "cuda_adamw", "weight_decay value", o.weight_decay, "weight_decay >= 0");
    if (o.amsgrad) FUSEBOX_THROW(invalid_argument("fusebox::optim::cuda_adamw: amsgrad is not in the CUDA kernel yet"));
    if (params_.empty()) FUSEBOX_THROW(invalid_argument("fusebox::optim::cuda_adamw: no parameters"));
    std::size_t total = 0;
    for (const auto& p : params_) {
      offset_.push_back(total);
      total += detail::round_up(p.size(), 64);  // 256-byte-aligned moments
    }
    moments_ = cuda::device_buffer(2 * total * sizeof(float));
    cuda::fill_bytes(moments_.get(), 0, moments_.size());
    total_ = total;
    for (std::size_t i = 0; i < params_.size(); ++i)
      for (std::size_t b = 0; b < params_[i].size(); b += chunk_elements)
        chunks_.push_back({static_cast<std::uint32_t>(i), 0, b, std::min(params_[i].size(), b + chunk_elements)});
    table_ = cuda::device_buffer(chunks_.size() * sizeof(device_chunk));
  }

  adamw_options& options() noexcept { return options_; }
  std::uint64_t steps() const noexcept { return step_; }
  /// How many steps uploaded the chunk table: once, in a loop whose gradients stay where they are.
  std::uint64_t table_uploads() const noexcept { return table_uploads_; }

  /// One update from device gradients (a cuda::tensor or a std::tuple of them, in order).
  template <class G>
  void step(const G& grads, std::source_location loc = std::source_location::current()) {
    std::vector<nn::gradient_view<float>> g;
    if constexpr (cuda::is_tensor_v<G>) {
      g.push_back({grads.data(), grads.extents(), true});
    } else {
      std::apply([&](const auto&... t) { (g.push_back({t.data(), t.extents(), true}), ...); }, grads);
    }
    if (g.size() != params_.size())
      FUSEBOX_THROW(shape_error("fusebox::optim::cuda_adamw::step: " + std::to_string(g.size()) + " gradients for " +
                                    std::to_string(params_.size()) + " parameters",
                                loc));
    for (std::size_t i = 0; i < g.size(); ++i)
      if (!(g[i].shape == params_[i].shape))
        FUSEBOX_THROW(shape_error("fusebox::optim::cuda_adamw::step: gradient " + std::to_string(i) + " is " +
                                      to_string(g[i].shape) + " but parameter " + std::to_string(i) + " ('" + params_[i].name +
                                      "') is " + to_string(params_[i].shape),
                                  loc));
    std::vector<device_chunk>& rows = next_table_;
    rows.clear();
    const auto m0 = moments_.get();
    for (const auto& c : chunks_) {
      const std::size_t i = c.param;
      rows.push_back({reinterpret_cast<std::uint64_t>(params_[i].data + c.begin),
                             reinterpret_cast<std::uint64_t>(g[i].data + c.begin),
                             m0 + (offset_[i] + c.begin) * sizeof(float),
                             m0 + (total_ + offset_[i] + c.begin) * sizeof(float), c.end - c.begin});
    }
    auto& stream = cuda::work_stream();
    // The table moves only when a gradient's address does (a compiled call usually returns the
    // same buffers every step): the upload (~40 bytes a chunk, from pageable memory, which the
    // driver stages before returning) is skipped otherwise. Ordered on the stream after the
    // previous step's kernel, which reads the old table.
    if (rows != host_table_) {
      host_table_.swap(rows);
      ++table_uploads_;
      cuda::copy_to_device_async(table_.get(), host_table_.data(), host_table_.size() * sizeof(device_chunk),
                                 stream.get());
    }
    const auto& o = options_;
    const double t = static_cast<double>(++step_);
    const double bc1 = 1 - std::pow(o.beta1, t), bc2 = 1 - std::pow(o.beta2, t);
    cuda::CUdeviceptr table = table_.get();
    float decay = static_cast<float>(1 - o.lr * o.weight_decay), b1 = static_cast<float>(o.beta1),
          omb1 = static_cast<float>(1 - o.beta1), b2 = static_cast<float>(o.beta2), omb2 = static_cast<float>(1 - o.beta2),
          step_size = static_cast<float>(o.lr / bc1), bc2_sqrt = static_cast<float>(std::sqrt(bc2)),
          eps = static_cast<float>(o.eps), sign = o.maximize ? -1.0f : 1.0f;
    void* args[] = {&table, &decay, &b1, &omb1, &b2, &omb2, &step_size, &bc2_sqrt, &eps, &sign};
    cuda::launch(kernel(), {static_cast<unsigned>(chunks_.size()), 1, 1}, {256, 1, 1}, 0, stream.get(), args,
                 "fusebox_adamw_f32");
  }

  /// exp_avg (k = 0) or exp_avg_sq (k = 1) of parameter i, downloaded.
  std::vector<float> moment(std::size_t k, std::size_t i) const {
    cuda::synchronize();
    std::vector<float> out(params_.at(i).size());
    cuda::copy_to_host(out.data(), moments_.get() + (k * total_ + offset_[i]) * sizeof(float), out.size() * sizeof(float));
    return out;
  }

 private:
  struct device_chunk {
    std::uint64_t p, g;
    cuda::CUdeviceptr m, v;
    std::uint64_t n;
    bool operator==(const device_chunk&) const = default;
  };
  static_assert(sizeof(device_chunk) == 40, "device_chunk must match fusebox_adamw_chunk's layout");

  static cuda::CUfunction kernel() {
    // One module per process (and device: fusebox uses one device per process).
    static const cuda::module m = [] {
      const auto r = cuda::nvrtc_compile(cuda_adamw_source(), "fusebox_adamw.cu", cuda::current_device().arch,
                                         {"--fmad=false"});
      return cuda::module(r.cubin, "fusebox_adamw");
    }();
    static const cuda::CUfunction f = m.function("fusebox_adamw_f32");
    return f;
  }

  std::vector<nn::named_parameter<float>> params_;
  adamw_options options_;
  std::vector<std::size_t> offset_;
  std::size_t total_ = 0;
  std::vector<detail::chunk> chunks_;
  std::vector<device_chunk> host_table_, next_table_;
  cuda::device_buffer moments_, table_;
  std::uint64_t step_ = 0, table_uploads_ = 0;
};

}  // namespace fusebox::optim
