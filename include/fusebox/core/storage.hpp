// storage.hpp: 64-byte-aligned, reference-counted buffers, and the byte counters behind the peak
// memory figures of `fusebox::ab` and the reports.
// Depends on: core/errors.hpp and the standard library.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdlib>
#include <memory>
#include <new>

#include "fusebox/core/errors.hpp"

namespace fusebox {

/// 64 bytes: a cache line, and the widest vector register (AVX-512).
inline constexpr std::size_t storage_alignment = 64;

/// Process-wide counters of bytes held by fusebox buffers (tensors, arenas).
struct memory_counters {
  std::atomic<std::size_t> live{0};
  std::atomic<std::size_t> peak{0};
  std::atomic<std::size_t> allocations{0};

  void add(std::size_t bytes) noexcept {
    const std::size_t now = live.fetch_add(bytes, std::memory_order_relaxed) + bytes;
    std::size_t p = peak.load(std::memory_order_relaxed);
    while (now > p && !peak.compare_exchange_weak(p, now, std::memory_order_relaxed)) {
    }
    allocations.fetch_add(1, std::memory_order_relaxed);
  }
  void remove(std::size_t bytes) noexcept { live.fetch_sub(bytes, std::memory_order_relaxed); }
  /// Starts a new peak window at the current live size.
  void reset_peak() noexcept { peak.store(live.load(std::memory_order_relaxed), std::memory_order_relaxed); }
};

inline memory_counters& memory() {
  static memory_counters counters;
  return counters;
}

namespace detail {
struct aligned_free {
  std::size_t bytes;
  void operator()(void* p) const noexcept {
    std::free(p);
    memory().remove(bytes);
  }
};
}  // namespace detail

/// An aligned byte buffer shared by a tensor and its views.
using storage_ptr = std::shared_ptr<std::byte>;

/// Allocates `bytes` (rounded up to the alignment); never returns null for bytes > 0.
inline storage_ptr allocate_storage(std::size_t bytes) {
  const std::size_t rounded = (bytes + storage_alignment - 1) / storage_alignment * storage_alignment;
  if (rounded == 0) return {};
  void* p = std::aligned_alloc(storage_alignment, rounded);
  if (!p) FUSEBOX_THROW(std::bad_alloc());
  memory().add(rounded);
  return storage_ptr(static_cast<std::byte*>(p), detail::aligned_free{rounded});
}

}  // namespace fusebox
