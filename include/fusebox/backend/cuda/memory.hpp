// fusebox/backend/cuda/memory.hpp: owned device memory, pinned host memory, streams and events, and
// copies between host and device.
//
// Every constructor and copy goes through `current_device()`, so the primary context is current
// on whichever thread does the work. Destructors never throw: a failure to free at process exit
// (the driver may already be shutting down) is not worth a terminate. Objects are move-only; a
// moved-from object is empty.
//
// `device_buffer::ensure(bytes)` grows and never shrinks, like an arena: the executor asks for
// the plan's arena size before each run and pays for an allocation only when a larger plan comes.
// Growing discards the contents (nothing in the arena outlives a run).
//
// Depends on: the C++20 standard library, fusebox/core/{errors,linkage}.hpp, fusebox/backend/cuda/driver.hpp.
#pragma once

#include <cstddef>
#include <span>
#include <string>
#include <type_traits>
#include <utility>

#include "fusebox/backend/cuda/driver.hpp"
#include "fusebox/core/errors.hpp"
#include "fusebox/core/linkage.hpp"

namespace fusebox::cuda {

namespace detail {
inline std::string bytes_text(std::size_t bytes) { return std::to_string(bytes) + " bytes"; }
}  // namespace detail

/// Device memory from cuMemAlloc, freed on destruction.
class device_buffer {
 public:
  device_buffer() = default;
  explicit device_buffer(std::size_t bytes) { allocate(bytes); }
  device_buffer(device_buffer&& other) noexcept
      : pointer_(std::exchange(other.pointer_, 0)), bytes_(std::exchange(other.bytes_, 0)) {}
  device_buffer& operator=(device_buffer&& other) noexcept;
  device_buffer(const device_buffer&) = delete;
  device_buffer& operator=(const device_buffer&) = delete;
  ~device_buffer() { release(); }

  CUdeviceptr get() const noexcept { return pointer_; }
  std::size_t size() const noexcept { return bytes_; }
  bool empty() const noexcept { return bytes_ == 0; }

  /// At least `bytes` bytes afterwards; reallocates (losing the contents) only to grow.
  void ensure(std::size_t bytes);

  /// Frees the memory now; the buffer is empty afterwards.
  void reset() noexcept { release(); }

 private:
  void allocate(std::size_t bytes);
  void release() noexcept;

  CUdeviceptr pointer_ = 0;
  std::size_t bytes_ = 0;
};

/// Page-locked host memory from cuMemAllocHost: asynchronous copies from and to it really are
/// asynchronous, and faster than from pageable memory.
class pinned_buffer {
 public:
  pinned_buffer() = default;
  explicit pinned_buffer(std::size_t bytes);
  pinned_buffer(pinned_buffer&& other) noexcept
      : pointer_(std::exchange(other.pointer_, nullptr)), bytes_(std::exchange(other.bytes_, 0)) {}
  pinned_buffer& operator=(pinned_buffer&& other) noexcept;
  pinned_buffer(const pinned_buffer&) = delete;
  pinned_buffer& operator=(const pinned_buffer&) = delete;
  ~pinned_buffer() { release(); }

  void* data() const noexcept { return pointer_; }
  std::size_t size() const noexcept { return bytes_; }
  /// The memory as `size() / sizeof(T)` elements of T (trivially copyable types only).
  template <class T>
  std::span<T> as() const noexcept {
    static_assert(std::is_trivially_copyable_v<T>, "pinned_buffer::as<T>(): T must be trivially copyable");
    return {static_cast<T*>(pointer_), bytes_ / sizeof(T)};
  }

 private:
  void release() noexcept;

  void* pointer_ = nullptr;
  std::size_t bytes_ = 0;
};

class event;

/// A CUDA stream. Non-blocking: work on it never waits for the legacy default stream, which
/// other libraries in the process may be using.
class stream {
 public:
  stream() {
    current_device();
    check(driver().stream_create(&handle_, CU_STREAM_NON_BLOCKING), "cuStreamCreate");
  }
  stream(stream&& other) noexcept : handle_(std::exchange(other.handle_, nullptr)) {}
  stream& operator=(stream&& other) noexcept;
  stream(const stream&) = delete;
  stream& operator=(const stream&) = delete;
  ~stream() { release(); }

  CUstream get() const noexcept { return handle_; }
  /// Waits for all work queued on the stream; an error from that work (a faulting kernel)
  /// surfaces here.
  void sync() const { check(driver().stream_synchronize(handle_), "cuStreamSynchronize"); }
  /// Work queued on this stream from now on starts after `e`'s recorded work (the host does not wait).
  void wait(const event& e) const;

 private:
  void release() noexcept;

  CUstream handle_ = nullptr;
};

/// The stream every compiled call and every cuda::tensor copy runs on (PyTorch's "current stream"):
/// work on it runs in the order it was queued, so a compiled call returns once its kernels are
/// queued, a result is read after them (cuda::tensor::to_host waits for the stream), and a block
/// a tensor gives back can go to the next tensor at once. Created on first use and never destroyed
/// (tensors in static storage may still queue copies at exit).
inline stream& work_stream() {
  static stream* s = new stream;
  return *s;
}

/// Waits for everything queued on work_stream(): before timing, or before handing device memory
/// to code that does not use the stream.
inline void synchronize() { work_stream().sync(); }

/// A CUDA event: timing enabled by default, for measuring work on a stream; CU_EVENT_DISABLE_TIMING
/// for one that only orders work (cheaper to record and wait on).
class event {
 public:
  explicit event(unsigned flags = CU_EVENT_DEFAULT) {
    current_device();
    check(driver().event_create(&handle_, flags), "cuEventCreate");
  }
  event(event&& other) noexcept : handle_(std::exchange(other.handle_, nullptr)) {}
  event& operator=(event&& other) noexcept;
  event(const event&) = delete;
  event& operator=(const event&) = delete;
  ~event() { release(); }

  CUevent get() const noexcept { return handle_; }
  void record(CUstream on) { check(driver().event_record(handle_, on), "cuEventRecord"); }
  void sync() const { check(driver().event_synchronize(handle_), "cuEventSynchronize"); }
  /// Whether the work recorded before the event has run (never waits); an event never recorded is done.
  bool done() const;

 private:
  void release() noexcept;

  CUevent handle_ = nullptr;
};

inline void stream::wait(const event& e) const {
  check(driver().stream_wait_event(handle_, e.get(), 0), "cuStreamWaitEvent");
}

/// Milliseconds between two recorded events (waits for `stop`).
FUSEBOX_RUNTIME_API float elapsed_ms(const event& start, const event& stop);

// --- copies ----------------------------------------------------------------------------------
// Raw forms take device addresses and byte counts; the span forms check that the data fits the
// buffer and say so with both sizes.
//
// The synchronous forms are complete when they return, so any later work on any stream sees
// them. CUDA's own "synchronous" calls are not: they run on the legacy default stream, and a
// memset, a device-to-device copy or the DMA of a host-to-device copy may still be in flight on
// return, unordered with our non-blocking streams (a kernel queued next on one raced with them:
// seen on an H100). So these wait for the legacy stream before returning. They do not wait for
// other streams: sync a stream before reading back what its work wrote.
//
// The async forms queue on `on` and return at once: the host memory must stay valid (and, to
// overlap, be pinned) until the stream reaches the copy.

namespace detail {
/// Waits for the legacy default stream, where the synchronous driver calls run.
inline void finish_legacy_stream(const char* after, std::size_t bytes) {
  check(driver().stream_synchronize(nullptr), "cuStreamSynchronize",
        std::string("legacy default stream, after ") + after + " of " + bytes_text(bytes));
}
}  // namespace detail

FUSEBOX_RUNTIME_API void copy_to_device(CUdeviceptr dst, const void* src, std::size_t bytes);
FUSEBOX_RUNTIME_API void copy_to_host(void* dst, CUdeviceptr src, std::size_t bytes);
FUSEBOX_RUNTIME_API void copy_on_device(CUdeviceptr dst, CUdeviceptr src, std::size_t bytes);
FUSEBOX_RUNTIME_API void copy_to_device_async(CUdeviceptr dst, const void* src, std::size_t bytes, CUstream on);
FUSEBOX_RUNTIME_API void copy_to_host_async(void* dst, CUdeviceptr src, std::size_t bytes, CUstream on);
FUSEBOX_RUNTIME_API void copy_on_device_async(CUdeviceptr dst, CUdeviceptr src, std::size_t bytes, CUstream on);

/// Sets `bytes` bytes at `dst` to `value` (tests poison outputs with it before a run).
FUSEBOX_RUNTIME_API void fill_bytes(CUdeviceptr dst, unsigned char value, std::size_t bytes);
FUSEBOX_RUNTIME_API void fill_bytes_async(CUdeviceptr dst, unsigned char value, std::size_t bytes, CUstream on);

namespace detail {
inline void check_fits(const char* call, std::size_t bytes, const device_buffer& buffer) {
  if (bytes > buffer.size())
    FUSEBOX_THROW(invalid_argument(std::string("fusebox: ") + call + ": " + bytes_text(bytes) +
                                   " do not fit a device buffer of " + bytes_text(buffer.size())));
}
}  // namespace detail

/// Copies `src` to the start of `dst`.
template <class T>
void copy_to_device(device_buffer& dst, std::span<const T> src) {
  static_assert(std::is_trivially_copyable_v<T>, "copy_to_device(dst, src): T must be trivially copyable");
  detail::check_fits("copy_to_device", src.size_bytes(), dst);
  copy_to_device(dst.get(), src.data(), src.size_bytes());
}
/// Fills `dst` from the start of `src`.
template <class T>
void copy_to_host(std::span<T> dst, const device_buffer& src) {
  static_assert(std::is_trivially_copyable_v<T>, "copy_to_host(dst, src): T must be trivially copyable");
  detail::check_fits("copy_to_host", dst.size_bytes(), src);
  copy_to_host(dst.data(), src.get(), dst.size_bytes());
}
template <class T>
void copy_to_device_async(device_buffer& dst, std::span<const T> src, CUstream on) {
  static_assert(std::is_trivially_copyable_v<T>, "copy_to_device_async(dst, src, on): T must be trivially copyable");
  detail::check_fits("copy_to_device_async", src.size_bytes(), dst);
  copy_to_device_async(dst.get(), src.data(), src.size_bytes(), on);
}
template <class T>
void copy_to_host_async(std::span<T> dst, const device_buffer& src, CUstream on) {
  static_assert(std::is_trivially_copyable_v<T>, "copy_to_host_async(dst, src, on): T must be trivially copyable");
  detail::check_fits("copy_to_host_async", dst.size_bytes(), src);
  copy_to_host_async(dst.data(), src.get(), dst.size_bytes(), on);
}

// Definitions: compiled here, or once in the FUSEBOX_IMPLEMENTATION unit (core/linkage.hpp).
#if FUSEBOX_RUNTIME_BODIES
FUSEBOX_RUNTIME_API device_buffer& device_buffer::operator=(device_buffer&& other) noexcept {
  if (this != &other) {
    release();
    pointer_ = std::exchange(other.pointer_, 0);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

FUSEBOX_RUNTIME_API void device_buffer::ensure(std::size_t bytes) {
  if (bytes <= bytes_) return;
  release();
  allocate(bytes);
}

FUSEBOX_RUNTIME_API void device_buffer::allocate(std::size_t bytes) {
  if (bytes == 0) return;  // cuMemAlloc refuses 0 bytes; an empty buffer needs no memory
  const auto& device = current_device();
  CUdeviceptr pointer = 0;  // stored only on success: a failed call may write anything here
  check(driver().mem_alloc(&pointer, bytes), "cuMemAlloc",
        "allocating " + detail::bytes_text(bytes) + " on device " +
            std::to_string(device.ordinal) + " (" + device.name + ")");
  pointer_ = pointer;
  bytes_ = bytes;
}

FUSEBOX_RUNTIME_API void device_buffer::release() noexcept {
  if (pointer_) {
    try {
      current_device();  // cuMemFree needs the context current on this thread
      driver().mem_free(pointer_);
    } catch (...) {
    }
  }
  pointer_ = 0;
  bytes_ = 0;
}

FUSEBOX_RUNTIME_API pinned_buffer::pinned_buffer(std::size_t bytes) {
  if (bytes == 0) return;
  current_device();
  void* pointer = nullptr;
  check(driver().mem_alloc_host(&pointer, bytes), "cuMemAllocHost",
        "allocating " + detail::bytes_text(bytes) + " of pinned host memory");
  pointer_ = pointer;
  bytes_ = bytes;
}

FUSEBOX_RUNTIME_API pinned_buffer& pinned_buffer::operator=(pinned_buffer&& other) noexcept {
  if (this != &other) {
    release();
    pointer_ = std::exchange(other.pointer_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

FUSEBOX_RUNTIME_API void pinned_buffer::release() noexcept {
  if (pointer_) {
    try {
      current_device();
      driver().mem_free_host(pointer_);
    } catch (...) {
    }
  }
  pointer_ = nullptr;
  bytes_ = 0;
}

FUSEBOX_RUNTIME_API stream& stream::operator=(stream&& other) noexcept {
  if (this != &other) {
    release();
    handle_ = std::exchange(other.handle_, nullptr);
  }
  return *this;
}

FUSEBOX_RUNTIME_API void stream::release() noexcept {
  if (handle_) {
    try {
      current_device();
      driver().stream_destroy(handle_);
    } catch (...) {
    }
  }
  handle_ = nullptr;
}

FUSEBOX_RUNTIME_API event& event::operator=(event&& other) noexcept {
  if (this != &other) {
    release();
    handle_ = std::exchange(other.handle_, nullptr);
  }
  return *this;
}

FUSEBOX_RUNTIME_API bool event::done() const {
  const CUresult r = driver().event_query(handle_);
  if (r == CUDA_ERROR_NOT_READY) return false;
  check(r, "cuEventQuery");
  return true;
}

FUSEBOX_RUNTIME_API void event::release() noexcept {
  if (handle_) {
    try {
      current_device();
      driver().event_destroy(handle_);
    } catch (...) {
    }
  }
  handle_ = nullptr;
}

FUSEBOX_RUNTIME_API float elapsed_ms(const event& start, const event& stop) {
  stop.sync();
  float ms = 0;
  check(driver().event_elapsed_time(&ms, start.get(), stop.get()), "cuEventElapsedTime");
  return ms;
}

FUSEBOX_RUNTIME_API void copy_to_device(CUdeviceptr dst, const void* src, std::size_t bytes) {
  if (bytes == 0) return;
  current_device();
  check(driver().memcpy_htod(dst, src, bytes), "cuMemcpyHtoD", detail::bytes_text(bytes));
  detail::finish_legacy_stream("cuMemcpyHtoD", bytes);
}

FUSEBOX_RUNTIME_API void copy_to_host(void* dst, CUdeviceptr src, std::size_t bytes) {
  if (bytes == 0) return;
  current_device();
  check(driver().memcpy_dtoh(dst, src, bytes), "cuMemcpyDtoH", detail::bytes_text(bytes));
}

FUSEBOX_RUNTIME_API void copy_on_device(CUdeviceptr dst, CUdeviceptr src, std::size_t bytes) {
  if (bytes == 0) return;
  current_device();
  check(driver().memcpy_dtod(dst, src, bytes), "cuMemcpyDtoD", detail::bytes_text(bytes));
  detail::finish_legacy_stream("cuMemcpyDtoD", bytes);
}

FUSEBOX_RUNTIME_API void copy_to_device_async(CUdeviceptr dst, const void* src, std::size_t bytes, CUstream on) {
  if (bytes == 0) return;
  current_device();
  check(driver().memcpy_htod_async(dst, src, bytes, on), "cuMemcpyHtoDAsync",
        detail::bytes_text(bytes));
}

FUSEBOX_RUNTIME_API void copy_to_host_async(void* dst, CUdeviceptr src, std::size_t bytes, CUstream on) {
  if (bytes == 0) return;
  current_device();
  check(driver().memcpy_dtoh_async(dst, src, bytes, on), "cuMemcpyDtoHAsync",
        detail::bytes_text(bytes));
}

FUSEBOX_RUNTIME_API void copy_on_device_async(CUdeviceptr dst, CUdeviceptr src, std::size_t bytes, CUstream on) {
  if (bytes == 0) return;
  current_device();
  check(driver().memcpy_dtod_async(dst, src, bytes, on), "cuMemcpyDtoDAsync",
        detail::bytes_text(bytes));
}

FUSEBOX_RUNTIME_API void fill_bytes(CUdeviceptr dst, unsigned char value, std::size_t bytes) {
  if (bytes == 0) return;
  current_device();
  check(driver().memset_d8(dst, value, bytes), "cuMemsetD8", detail::bytes_text(bytes));
  detail::finish_legacy_stream("cuMemsetD8", bytes);
}

FUSEBOX_RUNTIME_API void fill_bytes_async(CUdeviceptr dst, unsigned char value, std::size_t bytes, CUstream on) {
  if (bytes == 0) return;
  current_device();
  check(driver().memset_d8_async(dst, value, bytes, on), "cuMemsetD8Async",
        detail::bytes_text(bytes));
}
#endif

}  // namespace fusebox::cuda
