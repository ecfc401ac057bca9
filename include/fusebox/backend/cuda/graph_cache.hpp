// backend/cuda/graph_cache.hpp: the CUDA graphs of one compiled function in `mode::reduce_overhead`.
//
// A graph bakes in everything a call passes to its kernels: the specialisation, the call's
// extents, the address of every argument and output, the arena's address, and scalar values.
// So the cache is keyed by exactly those (`graph_key`), and a call replays a graph only when all
// of them are the same as when it was recorded: correct whatever the caller does with its
// tensors, with no copy into static input buffers (torch.compile's cudagraph trees copy inputs
// whose addresses change; here a loop that passes the same tensors, or alternates between two
// output blocks of the device block cache, replays with no copy at all).
//
// On a miss the call is recorded (its host work runs, its kernels do not) and then
//   - instantiated as a new entry while the cache holds fewer than `cap` graphs;
//   - else written over the least recently used entry of the same shape with cuGraphExecUpdate
//     (new addresses: a few microseconds, no instantiation), and only if the driver refuses or no
//     such entry exists, the least recently used entry is dropped and the graph instantiated.
// A loop that passes fresh tensors every call therefore pays one recording and one update per
// call, about what a default-mode call costs on the host, and still gets one launch.
// Depends on: backend/cuda/graph.hpp, core/linkage.hpp, runtime/counters.hpp, runtime/logs.hpp.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "fusebox/backend/cuda/graph.hpp"
#include "fusebox/core/linkage.hpp"
#include "fusebox/runtime/counters.hpp"
#include "fusebox/runtime/logs.hpp"

namespace fusebox::jit {

/// What a recorded call depends on: `shape` (specialisation and extents: the same shape means
/// the same kernels in the same order) and `binding` (addresses and scalar values).
struct graph_key {
  std::vector<std::uint64_t> shape, binding;
  bool operator==(const graph_key&) const = default;
};

class cuda_graph_cache {
 public:
  explicit cuda_graph_cache(std::size_t cap = 16) : cap_(cap == 0 ? 1 : cap) {}

  /// Queues the graph for `key` on `on`; records it by calling `enqueue()` under capture first
  /// where the cache has none. `what` names the function in logs.
  template <class Enqueue>
  void run(const graph_key& key, cuda::CUstream on, Enqueue&& enqueue, std::string_view what) {
    if (replay(key, on)) return;
    ++clock_;
    cuda::graph recorded = cuda::capture(on, enqueue);
    counters().graph_captures.fetch_add(1, std::memory_order_relaxed);
    if (entries_.size() >= cap_) {
      if (entry* same = least_recent(&key.shape); same && cuda::update(same->exec, recorded)) {
        counters().graph_updates.fetch_add(1, std::memory_order_relaxed);
        log(log_category::cudagraphs, std::string(what) + ": CUDA graph updated in place (new addresses or scalars)");
        same->key = key;
        same->used = clock_;
        same->exec.launch(on);
        return;
      }
      entry* victim = least_recent(nullptr);
      log(log_category::cudagraphs, std::string(what) + ": CUDA graph cache full (" + std::to_string(cap_) +
                                        "): dropping the least recently used graph");
      *victim = entry{key, cuda::instantiate(recorded), clock_};
      victim->exec.launch(on);
      return;
    }
    entries_.push_back(entry{key, cuda::instantiate(recorded), clock_});
    log(log_category::cudagraphs, std::string(what) + ": CUDA graph recorded (" + std::to_string(entries_.size()) + " of at most " +
                                      std::to_string(cap_) + ")");
    entries_.back().exec.launch(on);
  }

  /// Queues the graph for `key` on `on` if the cache has it; false (nothing queued) if not.
  bool replay(const graph_key& key, cuda::CUstream on);

  /// Drops every graph (the arena they point into moved).
  void clear() noexcept { entries_.clear(); }
  std::size_t size() const noexcept { return entries_.size(); }
  std::size_t cap() const noexcept { return cap_; }
  void set_cap(std::size_t cap);

 private:
  struct entry {
    graph_key key;
    cuda::graph_exec exec;
    std::uint64_t used = 0;
  };

  /// The least recently used entry, of that shape if `shape` is given (null if none).
  entry* least_recent(const std::vector<std::uint64_t>* shape);

  std::vector<entry> entries_;
  std::size_t cap_;
  std::uint64_t clock_ = 0;
};

// Definitions: compiled here, or once in the FUSEBOX_IMPLEMENTATION unit (core/linkage.hpp).
#if FUSEBOX_RUNTIME_BODIES
FUSEBOX_RUNTIME_API bool cuda_graph_cache::replay(const graph_key& key, cuda::CUstream on) {
  for (entry& e : entries_)
    if (e.key == key) {
      e.used = ++clock_;
      counters().graph_replays.fetch_add(1, std::memory_order_relaxed);
      e.exec.launch(on);
      return true;
    }
  return false;
}

FUSEBOX_RUNTIME_API void cuda_graph_cache::set_cap(std::size_t cap) {
  cap_ = cap == 0 ? 1 : cap;
  while (entries_.size() > cap_) entries_.erase(entries_.begin() + (least_recent(nullptr) - entries_.data()));
}

FUSEBOX_RUNTIME_API cuda_graph_cache::entry* cuda_graph_cache::least_recent(const std::vector<std::uint64_t>* shape) {
  entry* best = nullptr;
  for (entry& e : entries_)
    if ((!shape || e.key.shape == *shape) && (!best || e.used < best->used)) best = &e;
  return best;
}
#endif

}  // namespace fusebox::jit
