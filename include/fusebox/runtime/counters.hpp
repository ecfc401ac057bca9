// fusebox/runtime/counters.hpp: the JIT's public counters (DESIGN.md: counters are public) and the
// test switch that makes any compile an error.
//
// `fusebox::jit::counters()` is one process-wide set: cache hits and misses (in memory and on
// disk), compiles, recompiles, disk stores, evictions, calls rolled back to eager, CPU autotune
// choices (timed, or read from disk), reduce_overhead's fast-path calls, compile seconds, and the
// most recent
// recompile reasons (bounded, so a long-running server cannot grow it without limit). The
// numbers are relaxed atomics: they are bumped on hot paths and read for reports, and no code
// orders other memory by them. `snapshot()` copies them into a plain struct for printing and
// for tests that compare before and after.
//
// `forbid_compiles(true)` (or FUSEBOX_FORBID_COMPILES=1 in the environment, for a child process
// in a warm-start test) makes every compile throw `compile_forbidden`, so a test can prove that
// a process with a warm cache compiled nothing. Compilers call `check_compile_allowed()` first.
//
// Depends on: the C++20 standard library and fusebox/core/{environment,errors,linkage,lock}.hpp.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <deque>
#include <string>
#include <string_view>
#include <vector>

#include "fusebox/core/environment.hpp"
#include "fusebox/core/errors.hpp"
#include "fusebox/core/linkage.hpp"
#include "fusebox/core/lock.hpp"

namespace fusebox::jit {

/// A compile was attempted while compiles are forbidden (forbid_compiles / FUSEBOX_FORBID_COMPILES).
struct compile_forbidden : fusebox::error {
  using fusebox::error::error;
};

/// A plain copy of the counters at one moment.
struct counter_snapshot {
  std::uint64_t hits = 0;             // in-memory kernel cache hits
  std::uint64_t misses = 0;           // in-memory kernel cache misses
  std::uint64_t compiles = 0;         // host compiler / NVRTC runs (successful or not)
  std::uint64_t kernels_compiled = 0; // distinct kernels in those runs (identical kernels count once)
  std::uint64_t compile_failures = 0; // of those, the ones that failed
  std::uint64_t recompiles = 0;       // compiles caused by a failed guard
  std::uint64_t disk_hits = 0;
  std::uint64_t disk_misses = 0;      // absent, or rejected (corrupt, wrong key)
  std::uint64_t disk_stores = 0;
  std::uint64_t evictions = 0;        // disk entries removed to respect the size cap
  std::uint64_t graph_captures = 0;   // CUDA graphs recorded (reduce_overhead)
  std::uint64_t graph_updates = 0;    // of those, written over an existing graph (cuGraphExecUpdate)
  std::uint64_t graph_replays = 0;    // calls that replayed a recorded graph as it was
  std::uint64_t rollback_calls = 0;   // compiled calls run eagerly by a rollback switch (f.disable(),
                                      // stance force_eager, FUSEBOX_DISABLE=1)
  std::uint64_t autotune_timed = 0;      // CPU max_autotune problems tuned by timing (cpu/autotune.hpp)
  std::uint64_t autotune_from_disk = 0;  // CPU max_autotune winners read from the cache directory
  std::uint64_t fast_path_calls = 0;     // run-time path calls that took reduce_overhead's fast path
                                         // (an exact repeat of a call signature: no guard, no specialise)
  double compile_seconds = 0;
  std::uint64_t recompile_reasons_dropped = 0;  // reasons older than the kept window
  std::vector<std::string> recompile_reasons;   // oldest first
};

class counter_set {
 public:
  /// How many recompile reasons are kept (the most recent ones).
  static constexpr std::size_t max_reasons = 256;

  std::atomic<std::uint64_t> hits{0};
  std::atomic<std::uint64_t> misses{0};
  std::atomic<std::uint64_t> compiles{0};
  std::atomic<std::uint64_t> kernels_compiled{0};
  std::atomic<std::uint64_t> compile_failures{0};
  std::atomic<std::uint64_t> recompiles{0};
  std::atomic<std::uint64_t> disk_hits{0};
  std::atomic<std::uint64_t> disk_misses{0};
  std::atomic<std::uint64_t> disk_stores{0};
  std::atomic<std::uint64_t> evictions{0};
  std::atomic<std::uint64_t> graph_captures{0};
  std::atomic<std::uint64_t> graph_updates{0};
  std::atomic<std::uint64_t> graph_replays{0};
  std::atomic<std::uint64_t> rollback_calls{0};
  std::atomic<std::uint64_t> autotune_timed{0};
  std::atomic<std::uint64_t> autotune_from_disk{0};
  std::atomic<std::uint64_t> fast_path_calls{0};

  void add_compile_seconds(double seconds) noexcept {
    compile_nanoseconds_.fetch_add(static_cast<std::uint64_t>(seconds * 1e9),
                                   std::memory_order_relaxed);
  }
  double compile_seconds() const noexcept {
    return static_cast<double>(compile_nanoseconds_.load(std::memory_order_relaxed)) * 1e-9;
  }

  /// Counts a recompile and keeps its reason ("f: guard x.extent(0) == 64 failed: 32").
  void add_recompile(std::string reason);

  std::vector<std::string> recompile_reasons() const {
    ::fusebox::detail::state_lock lock(mutex_);
    return {reasons_.begin(), reasons_.end()};
  }

  counter_snapshot snapshot() const;

  /// Zeroes everything (fusebox::reset() and tests).
  void reset();

 private:
  std::atomic<std::uint64_t> compile_nanoseconds_{0};
  mutable ::fusebox::detail::state_mutex mutex_;  // guards reasons_ and dropped_
  std::deque<std::string> reasons_;
  std::uint64_t dropped_ = 0;
};

/// The process-wide counters.
inline counter_set& counters() noexcept {
  static counter_set set;
  return set;
}

namespace detail {
FUSEBOX_RUNTIME_API std::atomic<bool>& compiles_forbidden_flag() noexcept;
}  // namespace detail

/// Test switch: while on, every compile throws compile_forbidden.
inline void forbid_compiles(bool forbid) noexcept {
  detail::compiles_forbidden_flag().store(forbid, std::memory_order_relaxed);
}

inline bool compiles_forbidden() noexcept {
  return detail::compiles_forbidden_flag().load(std::memory_order_relaxed);
}

/// Called by every compiler before it starts; `what` names the thing being compiled.
FUSEBOX_RUNTIME_API void check_compile_allowed(std::string_view what);

// Definitions: compiled here, or once in the FUSEBOX_IMPLEMENTATION unit (core/linkage.hpp).
#if FUSEBOX_RUNTIME_BODIES
FUSEBOX_RUNTIME_API void counter_set::add_recompile(std::string reason) {
  recompiles.fetch_add(1, std::memory_order_relaxed);
  ::fusebox::detail::state_lock lock(mutex_);
  if (reasons_.size() == max_reasons) {
    reasons_.pop_front();
    ++dropped_;
  }
  reasons_.push_back(std::move(reason));
}

FUSEBOX_RUNTIME_API counter_snapshot counter_set::snapshot() const {
  counter_snapshot s;
  s.hits = hits.load(std::memory_order_relaxed);
  s.misses = misses.load(std::memory_order_relaxed);
  s.compiles = compiles.load(std::memory_order_relaxed);
  s.kernels_compiled = kernels_compiled.load(std::memory_order_relaxed);
  s.compile_failures = compile_failures.load(std::memory_order_relaxed);
  s.recompiles = recompiles.load(std::memory_order_relaxed);
  s.disk_hits = disk_hits.load(std::memory_order_relaxed);
  s.disk_misses = disk_misses.load(std::memory_order_relaxed);
  s.disk_stores = disk_stores.load(std::memory_order_relaxed);
  s.evictions = evictions.load(std::memory_order_relaxed);
  s.graph_captures = graph_captures.load(std::memory_order_relaxed);
  s.graph_updates = graph_updates.load(std::memory_order_relaxed);
  s.graph_replays = graph_replays.load(std::memory_order_relaxed);
  s.rollback_calls = rollback_calls.load(std::memory_order_relaxed);
  s.autotune_timed = autotune_timed.load(std::memory_order_relaxed);
  s.autotune_from_disk = autotune_from_disk.load(std::memory_order_relaxed);
  s.fast_path_calls = fast_path_calls.load(std::memory_order_relaxed);
  s.compile_seconds = compile_seconds();
  ::fusebox::detail::state_lock lock(mutex_);
  s.recompile_reasons_dropped = dropped_;
  s.recompile_reasons.assign(reasons_.begin(), reasons_.end());
  return s;
}

FUSEBOX_RUNTIME_API void counter_set::reset() {
  for (auto* c : {&hits, &misses, &compiles, &kernels_compiled, &compile_failures, &recompiles, &disk_hits,
                  &disk_misses, &disk_stores, &evictions, &graph_captures, &graph_updates, &graph_replays,
                  &rollback_calls, &autotune_timed, &autotune_from_disk, &fast_path_calls})
    c->store(0, std::memory_order_relaxed);
  compile_nanoseconds_.store(0, std::memory_order_relaxed);
  ::fusebox::detail::state_lock lock(mutex_);
  reasons_.clear();
  dropped_ = 0;
}

namespace detail {
FUSEBOX_RUNTIME_API std::atomic<bool>& compiles_forbidden_flag() noexcept {
  static std::atomic<bool> flag = [] {
    const char* env = ::fusebox::detail::environment_variable("FUSEBOX_FORBID_COMPILES");
    return env != nullptr && env[0] != '\0' && std::string_view(env) != "0";
  }();
  return flag;
}
}  // namespace detail

FUSEBOX_RUNTIME_API void check_compile_allowed(std::string_view what) {
  if (compiles_forbidden())
    FUSEBOX_THROW(compile_forbidden("fusebox: compile of " + std::string(what) +
                                    " attempted while compiles are forbidden (forbid_compiles(true) or "
                                    "FUSEBOX_FORBID_COMPILES): the cache did not serve it"));
}
#endif

}  // namespace fusebox::jit
