// fusebox/backend/cuda/uploader.hpp: host-to-device copies of batches on a stream of their own, so the
// copy of the next batch runs while the device computes on this one (what torch users write with
// pin_memory, `.to(device, non_blocking=True)` and a side stream).
//
//   fb::cuda::uploader up;
//   slot[0], slot[1]: the device tensors of two batches (double buffering)
//   auto next = up.copy(slot[0] ..., first batch's pinned storage ...);
//   for each batch k:
//     up.use(next);                                   // the step below sees batch k's copy
//     if (batch k + 1 exists) next = up.copy(slot[(k + 1) % 2] ..., batch k+1 ...);
//     step(slot[k % 2] ...);                          // queued on work_stream()
//
// The rules, and why:
//   - copy() queues the copy on the uploader's stream after everything already queued on
//     work_stream(): the step that last read the destination (two batches back, with two slots)
//     is queued there, so the copy cannot overwrite what a running step reads. It does not wait
//     for work queued later, so it overlaps the step queued after it.
//   - use(t) makes work queued on work_stream() from then on start after copy t (and after every
//     copy queued before it: the uploader's stream runs in order). Nothing waits on the host.
//   - the source storage is held until its copy has run, so a pinned buffer goes back to its pool
//     (backend/cuda/pinned_pool.hpp) only when the device no longer reads it. Finished copies are released
//     at each copy() and use(), and all of them at sync() and destruction.
// The source should be page-locked (a pinned_pool's storage); from pageable memory the driver
// copies through its own staging and the copy stops being asynchronous, but stays correct.
//
// Depends on: the C++20 standard library, fusebox/core/{errors,linkage,storage}.hpp,
// fusebox/backend/cuda/{memory,tensor}.hpp.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <string>
#include <utility>
#include <vector>

#include "fusebox/backend/cuda/memory.hpp"
#include "fusebox/backend/cuda/tensor.hpp"
#include "fusebox/core/errors.hpp"
#include "fusebox/core/linkage.hpp"
#include "fusebox/core/storage.hpp"

namespace fusebox::cuda {

class uploader {
 public:
  /// Names one queued copy, for use().
  struct ticket {
    std::uint64_t id = 0;
  };

  uploader() : after_work_(CU_EVENT_DISABLE_TIMING) {}
  uploader(const uploader&) = delete;
  uploader& operator=(const uploader&) = delete;
  ~uploader();

  /// Queues a copy of `bytes` bytes from host storage `src` to device address `dst` (rules above).
  ticket copy(CUdeviceptr dst, storage_ptr src, std::size_t bytes);

  /// The same into a device tensor: `src` holds the tensor's elements, row-major, in its storage type.
  template <class T, class S>
  ticket copy(tensor<T, S>& dst, storage_ptr src) {
    return copy(reinterpret_cast<CUdeviceptr>(dst.data()), std::move(src), dst.size() * sizeof(T));
  }

  /// Work queued on work_stream() from now on starts after copy `t` (and every copy before it).
  void use(ticket t);

  /// Waits for every queued copy and releases their sources.
  void sync();

  /// Copies whose source storage is still held (queued, or finished but not yet noticed).
  std::size_t held() const noexcept { return pending_.size(); }
  /// The uploader's own stream (for timing or for ordering other work after its copies).
  const stream& copy_stream() const noexcept { return side_; }

 private:
  struct pending {
    std::uint64_t id;
    event done;
    storage_ptr source;
  };

  void release_finished() {
    while (!pending_.empty() && pending_.front().done.done()) retire_front();
  }
  void retire_front() {
    spare_.push_back(std::move(pending_.front().done));
    pending_.pop_front();  // drops the source: a pinned buffer goes back to its pool here
  }
  event take_event();

  stream side_;
  event after_work_;  // recorded on work_stream() before each copy; re-recording it later does not
                      // change what an earlier wait waits for (cuStreamWaitEvent takes the record
                      // at the time of the call)
  std::deque<pending> pending_;
  std::vector<event> spare_;
  std::uint64_t last_id_ = 0;
};

// Definitions: compiled here, or once in the FUSEBOX_IMPLEMENTATION unit (core/linkage.hpp).
#if FUSEBOX_RUNTIME_BODIES
FUSEBOX_RUNTIME_API uploader::~uploader() {
  try {
    sync();
  } catch (...) {
    // a failed copy at teardown: the driver reported it to whoever synchronised first
  }
}

FUSEBOX_RUNTIME_API uploader::ticket uploader::copy(CUdeviceptr dst, storage_ptr src, std::size_t bytes) {
  if (bytes > 0 && !src)
    FUSEBOX_THROW(invalid_argument("fusebox: cuda::uploader::copy: a copy of " + std::to_string(bytes) +
                                   " bytes from empty host storage"));
  release_finished();
  after_work_.record(work_stream().get());
  side_.wait(after_work_);
  copy_to_device_async(dst, src.get(), bytes, side_.get());
  pending p{++last_id_, take_event(), std::move(src)};
  p.done.record(side_.get());
  pending_.push_back(std::move(p));
  return {last_id_};
}

FUSEBOX_RUNTIME_API void uploader::use(ticket t) {
  for (const pending& p : pending_)
    if (p.id == t.id) {
      work_stream().wait(p.done);
      break;
    }
  // not pending: it has run already (released), or was never queued (id 0)
  release_finished();
}

FUSEBOX_RUNTIME_API void uploader::sync() {
  side_.sync();
  while (!pending_.empty()) retire_front();
}

FUSEBOX_RUNTIME_API event uploader::take_event() {
  if (spare_.empty()) return event(CU_EVENT_DISABLE_TIMING);
  event e = std::move(spare_.back());
  spare_.pop_back();
  return e;
}
#endif

}  // namespace fusebox::cuda
