// fusebox/backend/cuda/pinned_pool.hpp: page-locked host memory for batch staging, recycled (the data
// loader's pin_memory, torch's pinned-memory caching host allocator).
//
// cuMemAllocHost and cuMemFreeHost cost far more than copying a batch (they map and pin pages,
// and synchronise the device), so a loader that allocated each batch's storage afresh would lose
// what pinning gains. The pool hands out `storage_ptr`s (the storage tensors and batches own);
// when the last owner drops one, its buffer goes back to the pool for the next request of the
// same size, from any thread. Buffers beyond `keep_bytes` of idle memory are freed instead.
//
// Lifetime: storage handed out keeps the pool's state alive, so a batch may outlive the pool
// object (a loader destroyed before the batches it produced, say); its buffer is then freed when
// the batch drops it. What the pool cannot know is whether the device still reads a buffer: a
// batch copied asynchronously must be kept until the copy has run (backend/cuda/uploader.hpp does that).
//
// Depends on: the C++20 standard library, fusebox/core/{linkage,storage}.hpp, fusebox/backend/cuda/memory.hpp.
#pragma once

#include <cstddef>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "fusebox/backend/cuda/memory.hpp"
#include "fusebox/core/linkage.hpp"
#include "fusebox/core/storage.hpp"

namespace fusebox::cuda {

class pinned_pool {
 public:
  /// Keeps at most `keep_bytes` of idle page-locked memory for reuse (256 MiB by default).
  explicit pinned_pool(std::size_t keep_bytes = std::size_t{256} << 20)
      : state_(std::make_shared<state>()) {
    state_->keep_bytes = keep_bytes;
  }

  /// `bytes` bytes of page-locked memory (aligned as cuMemAllocHost aligns: at least 256 bytes);
  /// a recycled buffer of that size when one is idle. Thread-safe. Throws backend_unavailable
  /// where CUDA cannot run, driver_error if the driver refuses the allocation.
  storage_ptr allocate(std::size_t bytes);

  /// cuMemAllocHost calls made so far, and requests served by a recycled buffer.
  std::size_t allocations() const {
    std::lock_guard lock(state_->mutex);
    return state_->allocations;
  }
  std::size_t reuses() const {
    std::lock_guard lock(state_->mutex);
    return state_->reuses;
  }
  /// Idle page-locked bytes held for reuse.
  std::size_t idle_bytes() const {
    std::lock_guard lock(state_->mutex);
    return state_->idle_bytes;
  }
  /// Frees every idle buffer (buffers still in use come back, and are kept, as usual).
  void release_idle();

 private:
  struct state {
    mutable std::mutex mutex;
    std::vector<pinned_buffer> idle;
    std::size_t keep_bytes = 0, idle_bytes = 0, allocations = 0, reuses = 0;

    // Over the cap, or if the list cannot grow, the buffer is freed as `b` goes (after the lock).
    void give_back(std::unique_ptr<pinned_buffer> b) noexcept;
  };
  std::shared_ptr<state> state_;
};

/// The process's pool: what a loader with `pin_memory` and no allocator of its own uses. Never
/// destroyed (batches in static storage may still give buffers back at exit).
inline pinned_pool& shared_pinned_pool() {
  static pinned_pool* pool = new pinned_pool;
  return *pool;
}

// Definitions: compiled here, or once in the FUSEBOX_IMPLEMENTATION unit (core/linkage.hpp).
#if FUSEBOX_RUNTIME_BODIES
FUSEBOX_RUNTIME_API storage_ptr pinned_pool::allocate(std::size_t bytes) {
  if (bytes == 0) return {};
  pinned_buffer buffer;
  {
    std::lock_guard lock(state_->mutex);
    auto& idle = state_->idle;
    for (auto it = idle.begin(); it != idle.end(); ++it)
      if (it->size() == bytes) {
        buffer = std::move(*it);
        idle.erase(it);
        state_->idle_bytes -= bytes;
        ++state_->reuses;
        break;
      }
  }
  if (!buffer.data()) {
    buffer = pinned_buffer(bytes);
    std::lock_guard lock(state_->mutex);
    ++state_->allocations;
  }
  auto* held = new pinned_buffer(std::move(buffer));
  return storage_ptr(static_cast<std::byte*>(held->data()),
                     [s = state_, held](std::byte*) { s->give_back(std::unique_ptr<pinned_buffer>(held)); });
}

FUSEBOX_RUNTIME_API void pinned_pool::release_idle() {
  std::vector<pinned_buffer> freed;
  std::lock_guard lock(state_->mutex);
  freed.swap(state_->idle);
  state_->idle_bytes = 0;
}

FUSEBOX_RUNTIME_API void pinned_pool::state::give_back(std::unique_ptr<pinned_buffer> b) noexcept {
  try {
    std::lock_guard lock(mutex);
    if (idle_bytes + b->size() > keep_bytes) return;
    idle.push_back(std::move(*b));
    idle_bytes += idle.back().size();
  } catch (...) {
  }
}
#endif

}  // namespace fusebox::cuda
