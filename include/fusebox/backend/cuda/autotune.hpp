// backend/cuda/autotune.hpp: `mode::max_autotune`. Two tuners, one pattern; and lt_choices, which
// persists default mode's cuBLASLt choices the same way (a warm process asks no heuristic).
//
// lt_tuner, for the products: per GEMM problem, cuBLASLt's
// heuristic offers up to `candidates` algorithms (best first by its own model), followed by the
// split-K forms of its first two (2, 3, 4 or 8 parts, summed in float32 in the workspace) that
// cuBLASLt accepts; each is timed on the call's own buffers (2 warm-up runs, then 5 between CUDA
// events, mean) and the fastest is kept. The heuristic's first choice is what default mode runs,
// so tuning can only win or tie (a split-K winner sums K in another order: last-bit differences).
//
// Winners persist in the kernel cache directory (a small blob per problem) as the index into the
// heuristic's list, which is deterministic for one problem, GPU and cuBLASLt version, all in the
// key: a later process takes the winner from disk and times nothing. Timing synchronises the
// stream, so it never runs while a stream is being captured: the first call of each shape in
// max_autotune runs outside a graph (backend/cuda/generated_program.hpp), and the recording after it finds
// every winner known.
//
// kernel_tuner, for the generated kernels: per kernel (its source digest), index space and the
// entries the call's alignment allows, the launch configurations backend/cuda/generated_program.hpp offers
// (entry: 32, 16 or one element's bytes a thread; threads per block; blocks per SM the grid is
// capped at) are timed the same way and the fastest is kept, in memory and on disk as its three
// numbers. The default configuration is the first candidate, so tuning only wins or ties. A
// kernel that writes memory it also reads (a matmul epilogue in place) is not timed: repeating
// it would change its input.
// Depends on: backend/cuda/{cublaslt,memory}.hpp, core/linkage.hpp, runtime/{cache_key,disk_cache,logs}.hpp.
#pragma once

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "fusebox/backend/cuda/cublaslt.hpp"
#include "fusebox/backend/cuda/memory.hpp"
#include "fusebox/core/errors.hpp"
#include "fusebox/core/linkage.hpp"
#include "fusebox/runtime/cache_key.hpp"
#include "fusebox/runtime/disk_cache.hpp"
#include "fusebox/runtime/logs.hpp"
#include "fusebox/version.hpp"

namespace fusebox::jit {

/// The start of every choice's cache key: what is chosen, fusebox's version and the GPU (a choice
/// timed on one device is not another's). `cublaslt`: the choice names cuBLASLt algorithms.
FUSEBOX_RUNTIME_API cache_key device_choice_key(const char* what, bool cublaslt);

class lt_tuner {
 public:
  static constexpr int candidates = 8;

  static lt_tuner& instance() {
    static lt_tuner* t = new lt_tuner;  // never destroyed, like cuBLASLt's own state
    return *t;
  }

  /// Queues C = A·B (+ bias where p.bias) for `p` on `on` with the tuned algorithm, tuning it
  /// first if `p` is new.
  void matmul(const cuda::lt_problem& p, cuda::CUdeviceptr a, cuda::CUdeviceptr b, cuda::CUdeviceptr c,
              cuda::CUdeviceptr bias, cuda::CUstream on, cuda::CUdeviceptr residual = 0) {
    cuda::lt_matmul(p, a, b, c, bias, on, choose(p, a, b, c, bias, on, residual), residual);
  }

  /// Problems tuned by timing in this process, and taken from the disk cache (tests, reports).
  std::size_t timed() const { return timed_; }
  std::size_t from_disk() const { return from_disk_; }

 private:
  cuda::lt_algorithm choose(const cuda::lt_problem& p, cuda::CUdeviceptr a, cuda::CUdeviceptr b, cuda::CUdeviceptr c,
                            cuda::CUdeviceptr bias, cuda::CUstream on, cuda::CUdeviceptr residual);

  /// Times every candidate; returns the fastest one's index (candidates that fail are skipped).
  std::size_t time_all(const cuda::lt_problem& p, const std::vector<cuda::lt_algorithm>& list, cuda::CUdeviceptr a,
                       cuda::CUdeviceptr b, cuda::CUdeviceptr c, cuda::CUdeviceptr bias, cuda::CUstream on,
                       cuda::CUdeviceptr residual);

  static cache_key key_for(const std::string& problem);

  std::mutex mutex_;
  std::map<std::string, cuda::lt_algorithm> winners_;
  disk_cache disk_;
  std::size_t timed_ = 0, from_disk_ = 0;
};

/// The default mode's cuBLASLt choices (the heuristic's first), persisted like the tuners'
/// winners: a process that finds a problem's choice on disk seeds cuBLASLt's plan with it and never
/// asks the heuristic, whose first query in a process costs ~75 ms (most of a warm start).
class lt_choices {
 public:
  static lt_choices& instance() {
    static lt_choices* c = new lt_choices;  // never destroyed, like the tuners
    return *c;
  }

  /// Queues C = A·B (+ bias, + residual) with the default choice for `p`.
  void matmul(const cuda::lt_problem& p, cuda::CUdeviceptr a, cuda::CUdeviceptr b, cuda::CUdeviceptr c,
              cuda::CUdeviceptr bias, cuda::CUstream on, cuda::CUdeviceptr residual = 0);

  std::size_t from_disk() const { return from_disk_; }

 private:
  static constexpr std::size_t record_bytes = sizeof(cuda::cublasLtMatmulAlgo_t) + sizeof(std::size_t);

  static cache_key key_for(const cuda::lt_problem& p);

  std::mutex mutex_;
  std::set<std::string> seen_;
  disk_cache disk_;
  std::size_t from_disk_ = 0;
};

/// How a generated kernel is launched: which entry (2: `_w`, 1: the vector entry, 0: `_v1`),
/// threads per block, and the most blocks per SM its grid may have (grid-stride loops cover the
/// rest).
struct kernel_launch {
  int entry = 1;
  unsigned threads = 256;
  unsigned blocks_per_sm = 32;
  bool operator==(const kernel_launch&) const = default;
};

class kernel_tuner {
 public:
  static kernel_tuner& instance() {
    static kernel_tuner* t = new kernel_tuner;  // never destroyed, like lt_tuner
    return *t;
  }

  /// The configuration for `problem` (kernel digest, space, allowed entries): a known winner, or,
  /// if `may_time`, the fastest of `candidates` (the first is the default) timed with `run(c, n)`,
  /// which queues n launches of configuration c on `on`; otherwise the first candidate.
  template <class Run>
  kernel_launch choose(const std::string& problem, const std::vector<kernel_launch>& candidates, bool may_time,
                       cuda::CUstream on, Run&& run) {
    std::lock_guard lock(mutex_);
    if (auto it = winners_.find(problem); it != winners_.end()) return it->second;
    const cache_key key = key_for(problem);
    kernel_launch stored;
    if (auto blob = disk_.enabled() ? disk_.lookup_blob(key) : std::nullopt;
        blob && std::sscanf(blob->c_str(), "%d %u %u", &stored.entry, &stored.threads, &stored.blocks_per_sm) == 3 &&
        std::find(candidates.begin(), candidates.end(), stored) != candidates.end()) {
      ++from_disk_;
      return winners_.emplace(problem, stored).first->second;
    }
    if (!may_time || candidates.size() < 2) return candidates.front();
    cuda::event start, stop;
    std::vector<float> ms(candidates.size());
    for (std::size_t i = 0; i < candidates.size(); ++i) {
      run(candidates[i], 2);
      start.record(on);
      run(candidates[i], 5);
      stop.record(on);
      stop.sync();
      ms[i] = cuda::elapsed_ms(start, stop) / 5;
    }
    const std::size_t best = static_cast<std::size_t>(std::min_element(ms.begin(), ms.end()) - ms.begin());
    ++timed_;
    const kernel_launch& w = candidates[best];
    if (disk_.enabled())
      disk_.store_blob(key, std::to_string(w.entry) + " " + std::to_string(w.threads) + " " + std::to_string(w.blocks_per_sm));
    if (enabled(log_category::autotune))
      log(log_category::autotune, problem + ": " + std::to_string(candidates.size()) + " launch configurations timed; " +
                                      "default " + std::to_string(ms[0] * 1e3f) + " us, chose entry " +
                                      std::to_string(w.entry) + ", " + std::to_string(w.threads) + " threads, " +
                                      std::to_string(w.blocks_per_sm) + " blocks/SM: " + std::to_string(ms[best] * 1e3f) +
                                      " us");
    return winners_.emplace(problem, w).first->second;
  }

  std::size_t timed() const { return timed_; }
  std::size_t from_disk() const { return from_disk_; }

 private:
  static cache_key key_for(const std::string& problem);

  std::mutex mutex_;
  std::map<std::string, kernel_launch> winners_;
  disk_cache disk_;
  std::size_t timed_ = 0, from_disk_ = 0;
};

// Definitions: compiled here, or once in the FUSEBOX_IMPLEMENTATION unit (core/linkage.hpp).
#if FUSEBOX_RUNTIME_BODIES
FUSEBOX_RUNTIME_API cache_key device_choice_key(const char* what, bool cublaslt) {
  const cuda::device_info& dev = cuda::current_device();
  cache_key key;
  key.add("fusebox", version_string).add("what", what).add("gpu", dev.name).add("arch", dev.arch);
  if (cublaslt) key.add("cublaslt", static_cast<std::uint64_t>(cuda::cublaslt().version));
  return key;
}

FUSEBOX_RUNTIME_API cuda::lt_algorithm lt_tuner::choose(const cuda::lt_problem& p, cuda::CUdeviceptr a,
                                                        cuda::CUdeviceptr b, cuda::CUdeviceptr c,
                                                        cuda::CUdeviceptr bias, cuda::CUstream on,
                                                        cuda::CUdeviceptr residual) {
  const std::string problem = cuda::detail::lt_plan_key(p);
  std::lock_guard lock(mutex_);
  if (auto it = winners_.find(problem); it != winners_.end()) return it->second;
  const std::vector<cuda::lt_algorithm> list = cuda::lt_algorithms(p, candidates, /*split_k=*/true);
  if (list.empty()) FUSEBOX_THROW(invalid_argument("fusebox: " + cuda::detail::describe(p) + ": cuBLASLt offers no algorithm"));
  const cache_key key = key_for(problem);
  std::size_t best = 0;
  if (auto stored = disk_.enabled() ? disk_.lookup_blob(key) : std::nullopt;
      stored && std::sscanf(stored->c_str(), "%zu", &best) == 1 && best < list.size()) {
    ++from_disk_;
    log(log_category::autotune, cuda::detail::describe(p) + ": algorithm #" + std::to_string(best) + " from the cache");
  } else {
    best = time_all(p, list, a, b, c, bias, on, residual);
    ++timed_;
    if (disk_.enabled()) disk_.store_blob(key, std::to_string(best));
  }
  return winners_.emplace(problem, list[best]).first->second;
}

FUSEBOX_RUNTIME_API std::size_t lt_tuner::time_all(const cuda::lt_problem& p,
                                                   const std::vector<cuda::lt_algorithm>& list, cuda::CUdeviceptr a,
                                                   cuda::CUdeviceptr b, cuda::CUdeviceptr c, cuda::CUdeviceptr bias,
                                                   cuda::CUstream on, cuda::CUdeviceptr residual) {
  cuda::event start, stop;
  std::vector<float> ms(list.size(), -1.0f);
  for (std::size_t i = 0; i < list.size(); ++i) {
    try {
      for (int w = 0; w < 2; ++w) cuda::lt_matmul(p, a, b, c, bias, on, list[i], residual);
      start.record(on);
      for (int r = 0; r < 5; ++r) cuda::lt_matmul(p, a, b, c, bias, on, list[i], residual);
      stop.record(on);
      stop.sync();
      ms[i] = cuda::elapsed_ms(start, stop) / 5;
    } catch (const fusebox::error&) {
      // A candidate this workspace or these pointers cannot run: not a choice.
    }
  }
  std::size_t best = 0;
  for (std::size_t i = 0; i < ms.size(); ++i)
    if (ms[i] >= 0 && (ms[best] < 0 || ms[i] < ms[best])) best = i;
  if (enabled(log_category::autotune)) {
    std::string line = cuda::detail::describe(p) + ": " + std::to_string(list.size()) + " algorithms timed (ms):";
    for (float t : ms) line += " " + (t < 0 ? std::string("failed") : std::to_string(t));
    log(log_category::autotune, line + "; chose #" + std::to_string(best));
  }
  return best;
}

FUSEBOX_RUNTIME_API cache_key lt_tuner::key_for(const std::string& problem) {
  cache_key key = device_choice_key("cuBLASLt algorithm choice", true);
  key.add("candidates", candidates).add("split_k", 1).add("problem", problem);
  return key;
}

FUSEBOX_RUNTIME_API void lt_choices::matmul(const cuda::lt_problem& p, cuda::CUdeviceptr a, cuda::CUdeviceptr b,
                                            cuda::CUdeviceptr c, cuda::CUdeviceptr bias, cuda::CUstream on,
                                            cuda::CUdeviceptr residual) {
  bool store = false;
  if (disk_.enabled()) {
    std::lock_guard lock(mutex_);
    if (seen_.insert(cuda::detail::lt_plan_key(p)).second) {
      const auto blob = disk_.lookup_blob(key_for(p));
      cuda::lt_algorithm algo;
      if (blob && blob->size() == record_bytes) {
        std::memcpy(&algo.algo, blob->data(), sizeof algo.algo);
        std::memcpy(&algo.workspace_bytes, blob->data() + sizeof algo.algo, sizeof algo.workspace_bytes);
        cuda::lt_seed_default_algorithm(p, algo);
        ++from_disk_;
        log(log_category::autotune, cuda::detail::describe(p) + ": cuBLASLt's choice from the cache");
      } else {
        store = true;
      }
    }
  }
  cuda::lt_matmul(p, a, b, c, bias, on, std::optional<std::size_t>{}, residual);
  if (store)
    if (const auto algo = cuda::lt_default_algorithm(p)) {
      std::string record(record_bytes, '\0');
      std::memcpy(record.data(), &algo->algo, sizeof algo->algo);
      std::memcpy(record.data() + sizeof algo->algo, &algo->workspace_bytes, sizeof algo->workspace_bytes);
      disk_.store_blob(key_for(p), record);
    }
}

FUSEBOX_RUNTIME_API cache_key lt_choices::key_for(const cuda::lt_problem& p) {
  cache_key key = device_choice_key("cuBLASLt heuristic choice", true);
  key.add("problem", cuda::detail::lt_plan_key(p));
  return key;
}

FUSEBOX_RUNTIME_API cache_key kernel_tuner::key_for(const std::string& problem) {
  cache_key key = device_choice_key("generated kernel launch choice", false);
  key.add("problem", problem);
  return key;
}
#endif

}  // namespace fusebox::jit
