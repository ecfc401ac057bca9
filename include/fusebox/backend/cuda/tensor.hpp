// fusebox/backend/cuda/tensor.hpp: `cuda::tensor<T, Shape>`, a tensor in GPU memory. Same shape rules as
// the host tensor (static extents in the type, `dyn` ones given at construction); storage is one
// cuMemAlloc block, contiguous, 256-byte aligned. Element types: float, and the storage types
// `bfloat16` and `float16` (computed in float on the device).
//
// Calling a compiled function with device tensors runs it on the CUDA backend; its results are
// device tensors. Host <-> device: `cuda::tensor(host)` uploads, `to_host()` downloads (both
// synchronous); bfloat16 and float16 tensors upload from and download to float host tensors,
// rounding to nearest even.
// Depends on: core/{tensor,shape}.hpp, backend/cuda/{memory,driver}.hpp, pipeline/targets.hpp.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <map>
#include <mutex>
#include <memory>
#include <source_location>
#include <string>
#include <vector>

#include "fusebox/backend/cuda/memory.hpp"
#include "fusebox/core/errors.hpp"
#include "fusebox/core/linkage.hpp"
#include "fusebox/core/low_precision.hpp"
#include "fusebox/core/shape.hpp"
#include "fusebox/core/tensor.hpp"
#include "fusebox/pipeline/targets.hpp"

namespace fusebox {

namespace cuda {

/// Device blocks freed by tensors, kept for the next tensor of the same size (as PyTorch's caching
/// allocator does): cuMemAlloc and cuMemFree cost tens to hundreds of microseconds and cuMemFree
/// waits for the device, which would dominate a compiled call that returns a new tensor each time.
/// Up to `max_cached_bytes` (1 GiB; FUSEBOX_CUDA_CACHE_BYTES) are kept; beyond that blocks are freed.
class block_cache {
 public:
  static block_cache& instance() {
    static block_cache* c = new block_cache;  // never destroyed: blocks may outlive static tensors
    return *c;
  }
  std::unique_ptr<device_buffer> take(std::size_t bytes);
  void give(std::unique_ptr<device_buffer> b);
  static std::size_t max_cached_bytes();

 private:
  std::mutex mutex_;
  std::multimap<std::size_t, std::unique_ptr<device_buffer>> free_;
  std::size_t cached_ = 0;
};

template <class T, class Shape>
class tensor {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, bfloat16> || std::is_same_v<T, float16>,
                "fusebox: CUDA tensors hold float, bfloat16 or float16");

 public:
  using value_type = T;
  using shape_type = Shape;
  static constexpr std::size_t rank = Shape::rank;
  /// The host tensor type this one uploads from and downloads to (float for 16-bit storage too).
  using host_tensor = fusebox::tensor<float, Shape>;

  tensor() requires(Shape::is_static) { allocate(dims_of(Shape{})); }

  /// One extent per `dyn` dimension, left to right.
  template <class... N>
    requires(sizeof...(N) > 0 && (std::is_integral_v<N> && ...))
  explicit tensor(N... run_time_extents) {
    const std::size_t given[] = {static_cast<std::size_t>(run_time_extents)...};
    dims d = dims_of(Shape{});
    std::size_t k = 0;
    for (std::size_t i = 0; i < rank; ++i)
      if (d.extent[i] == dyn) {
        if (k == sizeof...(N)) break;
        d.extent[i] = given[k++];
      }
    if (k != sizeof...(N) || !d.is_static())
      FUSEBOX_THROW(shape_error("cuda::tensor: " + std::to_string(sizeof...(N)) + " extent(s) given for the shape " +
                                    to_string(dims_of(Shape{})),
                                std::source_location::current()));
    allocate(d);
  }

  explicit tensor(const dims& d, std::source_location loc = std::source_location::current()) {
    host_tensor::check_fits(d, "cuda::tensor(dims)", loc);
    allocate(d);
  }

  /// Uploads a host tensor (any strides) into contiguous device storage.
  explicit tensor(const host_tensor& host) {
    allocate(host.extents());
    upload(host);
  }

  /// Copies a host tensor of the same extents into this tensor's storage (which stays where it
  /// is: a CUDA graph recorded with this tensor reads the new values when it replays).
  void upload(const host_tensor& host, std::source_location loc = std::source_location::current()) {
    if (!(host.extents() == view_.shape))
      FUSEBOX_THROW(shape_error("cuda::tensor::upload: host tensor " + to_string(host.extents()) + " into device tensor " +
                                    to_string(view_.shape),
                                loc));
    const std::size_t n = host.size();
    if constexpr (std::is_same_v<T, float>) {
      if (host.contiguous()) {  // straight from the host tensor: no staging, no per-element indexing
        copy_to_device_async(buffer_->get(), host.data(), n * sizeof(T), work_stream().get());
        return;
      }
    }
    std::vector<T> staged(n);
    if (host.contiguous())
      for (std::size_t i = 0; i < n; ++i) staged[i] = convert(host.data()[i]);
    else
      for (std::size_t i = 0; i < n; ++i) staged[i] = convert(host.flat(i));
    // From pageable memory the call returns once `staged` is copied out, so it may go at once;
    // on the work stream, so calls queued before this one still read the old values.
    copy_to_device_async(buffer_->get(), staged.data(), staged.size() * sizeof(T), work_stream().get());
  }

  tensor(tensor&&) noexcept = default;
  tensor& operator=(tensor&& other) noexcept {
    if (this != &other) {
      block_cache::instance().give(std::move(buffer_));
      buffer_ = std::move(other.buffer_);
      view_ = other.view_;
    }
    return *this;
  }
  ~tensor() { block_cache::instance().give(std::move(buffer_)); }

  /// Downloads into a new host tensor; waits for the work queued before (the calls that wrote
  /// this tensor) and for the copy.
  host_tensor to_host() const {
    host_tensor h(view_.shape);  // contiguous
    if constexpr (std::is_same_v<T, float>) {
      copy_to_host_async(h.data(), buffer_->get(), size() * sizeof(T), work_stream().get());
      work_stream().sync();
    } else {
      std::vector<T> staged(size());
      copy_to_host_async(staged.data(), buffer_->get(), staged.size() * sizeof(T), work_stream().get());
      work_stream().sync();
      for (std::size_t i = 0; i < staged.size(); ++i) h.data()[i] = back(staged[i]);
    }
    return h;
  }

  /// The device address of element 0 (not dereferenceable on the host).
  T* data() noexcept { return view_.data; }
  const T* data() const noexcept { return view_.data; }
  const dims& extents() const noexcept { return view_.shape; }
  std::size_t extent(std::size_t d) const noexcept { return view_.shape.extent[d]; }
  std::size_t size() const noexcept { return view_.shape.size(); }
  bool contiguous() const noexcept { return true; }
  strided<const T> view() const noexcept { return {view_.data, view_.shape, view_.stride}; }
  strided<T> view() noexcept { return view_; }

 private:
  static T convert(float x) {
    if constexpr (std::is_same_v<T, float>) return x;
    else return T::from_float(x);
  }
  static float back(T x) {
    if constexpr (std::is_same_v<T, float>) return x;
    else return x.to_float();
  }
  void allocate(const dims& d) {
    buffer_ = block_cache::instance().take((std::max<std::size_t>(d.size() * sizeof(T), 1) + 255) / 256 * 256);
    view_.data = reinterpret_cast<T*>(buffer_->get());
    view_.shape = d;
    view_.stride = contiguous_strides(d);
  }

  std::unique_ptr<device_buffer> buffer_;
  strided<T> view_{};
};

// cuda::is_tensor_v: pipeline/targets.hpp.

// Definitions: compiled here, or once in the FUSEBOX_IMPLEMENTATION unit (core/linkage.hpp).
#if FUSEBOX_RUNTIME_BODIES
FUSEBOX_RUNTIME_API std::unique_ptr<device_buffer> block_cache::take(std::size_t bytes) {
  {
    std::lock_guard lock(mutex_);
    auto it = free_.find(bytes);
    if (it != free_.end()) {
      auto b = std::move(it->second);
      free_.erase(it);
      cached_ -= bytes;
      return b;
    }
  }
  return std::make_unique<device_buffer>(bytes);
}

FUSEBOX_RUNTIME_API void block_cache::give(std::unique_ptr<device_buffer> b) {
  if (!b) return;
  const std::size_t bytes = b->size();
  std::lock_guard lock(mutex_);
  if (cached_ + bytes > max_cached_bytes()) {
    // Freed here: queued calls may still use it, so let them finish first.
    try {
      work_stream().sync();
    } catch (...) {
    }
    return;
  }
  cached_ += bytes;
  free_.emplace(bytes, std::move(b));
}

FUSEBOX_RUNTIME_API std::size_t block_cache::max_cached_bytes() {
  static const std::size_t cap = [] {
    const char* v = std::getenv("FUSEBOX_CUDA_CACHE_BYTES");
    return v && *v ? static_cast<std::size_t>(std::strtoull(v, nullptr, 10)) : std::size_t{1} << 30;
  }();
  return cap;
}
#endif

}  // namespace cuda
}  // namespace fusebox
