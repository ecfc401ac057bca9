// backend/cuda/attention_choice.hpp: which attention runs, fusebox's kernel (backend/cuda/attention_kernel.hpp)
// or cuDNN's fused attention (backend/cuda/cudnn_attention.hpp), chosen by measurement in max_autotune.
//
// Per problem (storage type, extents, causality, strides: cudnn_attention_problem::key) the first
// max_autotune call that may time (outside a graph capture) times fusebox's kernel and every
// configuration cuDNN's heuristic offers on the call's own buffers (2 warm-up runs, then 10
// between CUDA events), keeps the fastest, and stores its index (-1: fusebox's kernel) in the
// kernel cache directory, keyed by GPU, cuDNN version and problem, so a later process times
// nothing (it still finalises the chosen configuration: 0.4-1 s, cuDNN compiles its kernel). Why
// only max_autotune: finalising cuDNN's configurations costs 0.4-1.1 s each on an H100 (W4's
// problem, five of them), more than a whole cold compile of W4 (0.8 s), which default and
// reduce_overhead keep; there fusebox's kernel runs.
//
// FUSEBOX_ATTENTION=own never considers cuDNN; =cudnn takes cuDNN wherever it accepts the problem
// (the fastest of its configurations, fusebox's kernel not timed; tests use it); unset or =auto
// is the above. Where cuDNN cannot be loaded, refuses the problem (float32, strides, head dims)
// or fails to build a configuration, fusebox's kernel runs, and FUSEBOX_LOGS=autotune says why.
// Depends on: backend/cuda/cudnn_attention.hpp, backend/cuda/autotune.hpp, core/linkage.hpp,
// runtime/{disk_cache,logs}.hpp.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "fusebox/backend/cuda/autotune.hpp"
#include "fusebox/backend/cuda/cudnn_attention.hpp"
#include "fusebox/backend/cuda/memory.hpp"
#include "fusebox/core/errors.hpp"
#include "fusebox/core/linkage.hpp"
#include "fusebox/runtime/disk_cache.hpp"
#include "fusebox/runtime/logs.hpp"

namespace fusebox::jit {

enum class attention_policy { automatic, own, cudnn };

/// FUSEBOX_ATTENTION, read on each use (tests switch it); anything else is an error naming it.
FUSEBOX_RUNTIME_API attention_policy attention_policy_from_env();

class attention_chooser {
 public:
  static attention_chooser& instance() {
    static attention_chooser* c = new attention_chooser;  // never destroyed, like the tuners
    return *c;
  }

  /// cuDNN's attention for `p` if it is the choice (built, with its configuration in use), or null
  /// for fusebox's kernel. `run_own(n)` queues n launches of fusebox's kernel on `on`; `may_time`:
  /// candidates may be timed (no capture under way). Without a known choice and without timing,
  /// fusebox's kernel (not remembered: a later call that may time decides).
  template <class RunOwn>
  cuda::cudnn_attention* choose(const cuda::cudnn_attention_problem& p, cuda::CUdeviceptr q, cuda::CUdeviceptr k,
                                cuda::CUdeviceptr v, cuda::CUdeviceptr o, bool may_time, cuda::CUstream on,
                                RunOwn&& run_own) {
    const attention_policy policy = attention_policy_from_env();
    if (policy == attention_policy::own || !p.supported()) return nullptr;
    const std::string problem = p.key() + (policy == attention_policy::cudnn ? " (cudnn only)" : "");
    std::lock_guard lock(mutex_);
    if (auto it = winners_.find(problem); it != winners_.end()) return it->second.get();
    std::unique_ptr<cuda::cudnn_attention> built;
    std::optional<cache_key> key;
    try {
      built = std::make_unique<cuda::cudnn_attention>(p);
      key = key_for(problem);
    } catch (const fusebox::error& e) {  // no cuDNN, or it cannot express the problem
      log(log_category::autotune, "attention " + p.key() + ": cuDNN unavailable, fusebox's kernel: " + e.what());
      return remember(problem, nullptr);
    }
    if (built->candidates() == 0) {
      log(log_category::autotune, "attention " + p.key() + ": cuDNN offers no engine, fusebox's kernel");
      return remember(problem, nullptr);
    }
    int best = -1;
    if (auto stored = disk_.enabled() ? disk_.lookup_blob(*key) : std::nullopt;
        stored && std::sscanf(stored->c_str(), "%d", &best) == 1 && best < static_cast<int>(built->candidates())) {
      ++from_disk_;
      log(log_category::autotune, "attention " + p.key() + ": choice " + std::to_string(best) + " from the cache");
    } else if (may_time) {
      const std::function<void(int)> own = run_own;
      best = time_all(*built, q, k, v, o, on, policy == attention_policy::cudnn ? nullptr : &own, p.key());
      ++timed_;
      if (disk_.enabled()) disk_.store_blob(*key, std::to_string(best));
    } else {
      return nullptr;
    }
    if (best < 0) return remember(problem, nullptr);
    try {
      built->use(static_cast<std::size_t>(best));
      built->drop_others();
    } catch (const fusebox::error& e) {
      log(log_category::autotune, "attention " + p.key() + ": cuDNN configuration " + std::to_string(best) +
                                      " failed to build, fusebox's kernel: " + e.what());
      return remember(problem, nullptr);
    }
    ++cudnn_chosen_;
    return remember(problem, std::move(built));
  }

  /// Problems timed in this process, taken from the disk cache, and given to cuDNN (tests, reports).
  std::size_t timed() const { return timed_; }
  std::size_t from_disk() const { return from_disk_; }
  std::size_t cudnn_chosen() const { return cudnn_chosen_; }

 private:
  cuda::cudnn_attention* remember(const std::string& problem, std::unique_ptr<cuda::cudnn_attention> a) {
    return winners_.insert_or_assign(problem, std::move(a)).first->second.get();
  }

  /// The fastest of fusebox's kernel (index -1, if `run_own`) and cuDNN's configurations that
  /// build; -1 if none of cuDNN's does.
  int time_all(cuda::cudnn_attention& a, cuda::CUdeviceptr q, cuda::CUdeviceptr k, cuda::CUdeviceptr v,
               cuda::CUdeviceptr o, cuda::CUstream on, const std::function<void(int)>* run_own,
               const std::string& what);

  static cache_key key_for(const std::string& problem);

  std::mutex mutex_;
  std::map<std::string, std::unique_ptr<cuda::cudnn_attention>> winners_;
  disk_cache disk_;
  std::size_t timed_ = 0, from_disk_ = 0, cudnn_chosen_ = 0;
};

// Definitions: compiled here, or once in the FUSEBOX_IMPLEMENTATION unit (core/linkage.hpp).
#if FUSEBOX_RUNTIME_BODIES
FUSEBOX_RUNTIME_API attention_policy attention_policy_from_env() {
  const char* v = std::getenv("FUSEBOX_ATTENTION");
  const std::string_view s = v ? v : "";
  if (s.empty() || s == "auto") return attention_policy::automatic;
  if (s == "own") return attention_policy::own;
  if (s == "cudnn") return attention_policy::cudnn;
  FUSEBOX_THROW(invalid_argument("fusebox: FUSEBOX_ATTENTION='" + std::string(s) + "': expected auto, own or cudnn"));
}

FUSEBOX_RUNTIME_API int attention_chooser::time_all(cuda::cudnn_attention& a, cuda::CUdeviceptr q,
                                                    cuda::CUdeviceptr k, cuda::CUdeviceptr v, cuda::CUdeviceptr o,
                                                    cuda::CUstream on, const std::function<void(int)>* run_own,
                                                    const std::string& what) {
  constexpr int warm = 2, timed = 10;
  cuda::event start, stop;
  auto time = [&](auto&& queue) {
    queue(warm);
    start.record(on);
    queue(timed);
    stop.record(on);
    stop.sync();
    return cuda::elapsed_ms(start, stop) * 1000.0f / timed;
  };
  std::string line = "attention " + what + ":";
  int best = -1;
  float best_us = -1;
  if (run_own) {
    best_us = time([&](int n) { (*run_own)(n); });
    line += " fusebox's kernel " + std::to_string(best_us) + " us;";
  }
  for (std::size_t i = 0; i < a.candidates(); ++i) {
    try {
      a.use(i);
      bool aligned = true;
      const float us = time([&](int n) {
        for (int r = 0; r < n; ++r) aligned = a.run(q, k, v, o, on) && aligned;
      });
      if (!aligned) break;  // these buffers cannot take cuDNN at all
      line += " cuDNN #" + std::to_string(i) + " " + std::to_string(us) + " us;";
      if (best_us < 0 || us < best_us) {
        best_us = us;
        best = static_cast<int>(i);
      }
    } catch (const fusebox::error& e) {
      line += " cuDNN #" + std::to_string(i) + " failed (" + std::string(e.what()).substr(0, 160) + ");";
    }
  }
  log(log_category::autotune, line + " chose " + (best < 0 ? std::string("fusebox's kernel") : "cuDNN #" + std::to_string(best)));
  return best;
}

FUSEBOX_RUNTIME_API cache_key attention_chooser::key_for(const std::string& problem) {
  cache_key key = device_choice_key("attention choice", false);
  key.add("cudnn", static_cast<std::uint64_t>(cuda::cudnn().version)).add("problem", problem);
  return key;
}
#endif

}  // namespace fusebox::jit
