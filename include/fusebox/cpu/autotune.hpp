// cpu/autotune.hpp: `mode::max_autotune` on the CPU. The host kernels that have real run-time
// choices ask here which one to run:
//   gemm (cpu/gemm.hpp)       the path where another one is valid for the operands (gemv rows,
//                             gemv dots or stream-B^T against BLIS-style blocking), the task grid
//                             of the blocked path (4 tasks a thread, or 1), and one thread vs all;
//   conv2d and its gradients  direct vs Winograd where both apply (5x5, unit stride, float), and
//   (cpu/spatial.hpp)         one thread vs all.
// Per problem (kernel, extents, layouts, dtype, thread count; the store adds the CPU and fusebox's
// version) every candidate runs on the call's own operands into a private output (so an epilogue
// that works in place is never disturbed): 2 warm-up runs, then 5 timed, median. The fastest is
// kept in memory and handed to the `store` of the call (compile() gives the cache directory's:
// jit/cpu_autotune.hpp), so a later process times nothing. Candidate 0 is always what the default
// mode runs, so tuning only wins or ties (up to timing noise).
//
// Off (every call outside a max_autotune call, and every call nested in a pool task) the cost is
// one thread-local load: default mode runs exactly what it ran before. A kernel that is being
// timed does not tune what it calls.
// FUSEBOX_LOGS=autotune prints each candidate's median and the choice.
// Depends on: jit/logs.hpp, jit/counters.hpp (standard library only), cpu/thread_pool.hpp.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "fusebox/cpu/thread_pool.hpp"
#include "fusebox/jit/counters.hpp"
#include "fusebox/jit/logs.hpp"

namespace fusebox::cpu::autotune {

/// Where winners persist between processes (jit/cpu_autotune.hpp: the cache directory).
struct store {
  virtual ~store() = default;
  /// The index of the stored winner of `problem` among `candidates` choices, if any.
  virtual std::optional<std::size_t> load(const std::string& problem, std::size_t candidates) = 0;
  virtual void save(const std::string& problem, std::size_t candidates, std::size_t winner, const std::string& name) = 0;
  /// Where, in words (for explain()).
  virtual std::string where() const = 0;
};

/// The tuning state of the current thread: on during a max_autotune call (compile.hpp).
struct context {
  bool on = false;
  store* disk = nullptr;
};
inline thread_local context current{};
inline thread_local bool timing = false;  // a candidate is being timed: no nested tuning

/// Turns tuning on (or leaves it off) for the current thread while it lives.
class scope {
 public:
  scope(bool on, store* disk) noexcept : saved_(current) {
    if (on) current = context{true, disk};
  }
  ~scope() { current = saved_; }
  scope(const scope&) = delete;
  scope& operator=(const scope&) = delete;

 private:
  context saved_;
};

/// Whether a kernel starting now should tune: in a max_autotune call, not timing, not nested
/// in a pool task (whose per-worker scratch a one-thread candidate would share).
inline bool active() noexcept { return current.on && !timing && cpu::detail::current_context.pool == nullptr; }

/// The one-thread pool one-thread candidates run on (the caller's thread, in order).
inline thread_pool& serial_pool() {
  static thread_pool& p = shared_pool(1);
  return p;
}

struct candidate {
  std::string name;             ///< for logs: "blocked, 1 thread"
  std::function<void()> run;    ///< one run on the call's operands, into a private output
};

namespace detail {
struct winners {
  std::mutex mutex;
  std::map<std::string, std::size_t> chosen;  // problem -> candidate index
};
inline winners& memory() {
  static winners* w = new winners;  // never destroyed: kernels may run during static destruction
  return *w;
}

inline double median_seconds(const std::function<void()>& run) {
  for (int w = 0; w < 2; ++w) run();
  double t[5];
  for (double& s : t) {
    const auto t0 = std::chrono::steady_clock::now();
    run();
    s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  std::sort(t, t + 5);
  return t[2];
}
}  // namespace detail

/// Forgets every winner held in memory (tests: a fresh process's state; fusebox::reset()).
inline void forget() {
  auto& m = detail::memory();
  std::lock_guard lock(m.mutex);
  m.chosen.clear();
}

/// Problems with a winner in memory.
inline std::size_t known() {
  auto& m = detail::memory();
  std::lock_guard lock(m.mutex);
  return m.chosen.size();
}

/// The index of the candidate to run for `problem`: the winner in memory, else the store's,
/// else the fastest by timing (`make` builds the candidates only then). A problem with one
/// candidate is not timed.
inline std::size_t choose(const std::string& problem, std::size_t n, const std::function<std::vector<candidate>()>& make) {
  if (n <= 1) return 0;
  auto& m = detail::memory();
  {
    std::lock_guard lock(m.mutex);
    if (auto it = m.chosen.find(problem); it != m.chosen.end()) return it->second;
  }
  store* disk = current.disk;
  if (disk)
    if (auto stored = disk->load(problem, n); stored && *stored < n) {
      jit::counters().autotune_from_disk.fetch_add(1, std::memory_order_relaxed);
      jit::log(jit::log_category::autotune, problem + ": candidate #" + std::to_string(*stored) + " from the cache");
      std::lock_guard lock(m.mutex);
      return m.chosen.emplace(problem, *stored).first->second;
    }
  const std::vector<candidate> cands = make();
  std::vector<double> secs(cands.size());
  {
    struct timing_flag {
      bool saved = timing;
      timing_flag() { timing = true; }
      ~timing_flag() { timing = saved; }
    } flag;
    for (std::size_t i = 0; i < cands.size(); ++i) secs[i] = detail::median_seconds(cands[i].run);
  }
  const std::size_t best = static_cast<std::size_t>(std::min_element(secs.begin(), secs.end()) - secs.begin());
  jit::counters().autotune_timed.fetch_add(1, std::memory_order_relaxed);
  if (jit::enabled(jit::log_category::autotune)) {
    std::string line = problem + ": " + std::to_string(cands.size()) + " candidates timed (median of 5, us):";
    for (std::size_t i = 0; i < cands.size(); ++i)
      line += " [" + std::to_string(i) + "] " + cands[i].name + " " + std::to_string(secs[i] * 1e6) + ";";
    jit::log(jit::log_category::autotune, line + " chose #" + std::to_string(best) + " (" + cands[best].name + ")");
  }
  if (disk) disk->save(problem, n, best, cands[best].name);
  std::lock_guard lock(m.mutex);
  return m.chosen.emplace(problem, best).first->second;
}

/// What max_autotune tunes on the CPU, in words (explain()).
inline const char* description() {
  return "gemm: the path where another is valid (gemv or stream-B^T vs blocked), the blocked task grid, 1 thread vs "
         "all; conv2d and its gradients: direct vs Winograd where both apply, 1 thread vs all. Each problem's "
         "candidates are timed once (2 warm-up runs, median of 5)";
}

}  // namespace fusebox::cpu::autotune
