// backend/cpu/autotune.hpp: `mode::max_autotune` on the CPU. The host kernels that have real run-time
// choices ask here which one to run:
//   gemm (backend/cpu/gemm.hpp)       the path where another one is valid for the operands (gemv rows,
//                             gemv dots or stream-B^T against BLIS-style blocking), the task grid
//                             of the blocked path (4 tasks a thread, or 1), and one thread vs all;
//   conv2d and its gradients  direct vs Winograd where both apply (5x5, unit stride, float), and
//   (backend/cpu/spatial.hpp)         one thread vs all;
//   rows kernels              one thread vs all, and tasks four times as large (the static path's
//   (backend/cpu/executor.hpp)        fused row and elementwise kernels).
// Per problem (kernel, extents, layouts, dtype, thread count; the store adds the CPU and fusebox's
// version) every candidate runs on the call's own operands into a private output (so an epilogue
// that works in place is never disturbed): 2 warm-up runs each, then 7 rounds in which each runs
// once, median; another candidate than the default must win by 10% (below that it is noise on a
// loaded machine). The winner is kept in memory and handed to the `store` of the call (compile() gives the cache directory's:
// backend/cpu/winner_store.hpp), so a later process times nothing. Candidate 0 is always what the default
// mode runs, so tuning only wins or ties (up to timing noise).
//
// Off (every call outside a max_autotune call, and every call nested in a pool task) the cost is
// one thread-local load: default mode runs exactly what it ran before. A kernel that is being
// timed does not tune what it calls.
// FUSEBOX_LOGS=autotune prints each candidate's median and the choice.
// Depends on: runtime/logs.hpp, runtime/counters.hpp (standard library only), backend/cpu/thread_pool.hpp,
// core/lock.hpp.
#pragma once

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>
#include <cstddef>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "fusebox/backend/cpu/thread_pool.hpp"
#include "fusebox/core/linkage.hpp"
#include "fusebox/core/lock.hpp"
#include "fusebox/runtime/counters.hpp"
#include "fusebox/runtime/logs.hpp"

namespace fusebox::cpu::autotune {

/// Where winners persist between processes (backend/cpu/winner_store.hpp: the cache directory).
struct store {
  virtual ~store() = default;
  /// The index of the stored winner of `problem` among `candidates` choices, if any.
  virtual std::optional<std::size_t> load(const std::string& problem, std::size_t candidates) = 0;
  virtual void save(const std::string& problem, std::size_t candidates, std::size_t winner, const std::string& name) = 0;
  /// Where, in words (for explain()).
  virtual std::string where() const = 0;
};

/// The store max_autotune keeps winners in between processes, where the program has one:
/// backend/cpu/winner_store.hpp sets it (the cache directory) in every unit that includes it,
/// which fusebox/jit.hpp and fusebox/fusebox.hpp do. Null: winners are kept in memory only. A
/// pointer rather than a call, so that a program of static CPU shapes compiles no disk cache.
inline store* (*persistent_store)() = nullptr;

/// Where winners persist, in words (explain()).
inline std::string persistent_where() {
  return persistent_store ? persistent_store()->where()
                          : std::string("memory only (this program includes no disk store: <fusebox/jit.hpp> or "
                                        "<fusebox/fusebox.hpp> brings it)");
}

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

/// A problem's identity for the in-memory lookup: a kernel tag and up to 15 numbers (extents,
/// layouts, threads), compared whole. Cheap to build per call, unlike the text the store and the
/// log use, which is made only when a problem is new.
struct problem_id {
  std::array<std::uint64_t, 16> v{};
  friend bool operator<(const problem_id& a, const problem_id& b) { return a.v < b.v; }
};

namespace detail {
struct winners {
  ::fusebox::detail::state_mutex mutex;
  std::map<problem_id, std::size_t> chosen;  // problem -> candidate index
};
inline winners& memory() {
  static winners* w = new winners;  // never destroyed: kernels may run during static destruction
  return *w;
}

/// Median seconds of each candidate: 2 warm-up runs each, then `rounds` rounds in which every
/// candidate runs once, so that load from other processes falls on all of them alike.
FUSEBOX_RUNTIME_API std::vector<double> median_seconds(const std::vector<candidate>& cands, int rounds = 7);
}  // namespace detail

/// A candidate other than the default (index 0) wins only if it is this much faster: below it
/// the difference is timing noise on a loaded machine (backend/cpu/gemm.hpp's blocking was tuned there
/// and differences under ~10% were not resolvable; with a 3% margin, 1-thread candidates that won
/// by 3-4% during a load spike lost 30-40% in steady state), and the default is the tested rule.
inline constexpr double win_margin = 0.10;

/// Forgets every winner held in memory (tests: a fresh process's state; fusebox::reset()).
FUSEBOX_RUNTIME_API void forget();

/// Problems with a winner in memory.
FUSEBOX_RUNTIME_API std::size_t known();

/// The index of the candidate to run for problem `id` (`n` candidates): the winner in memory,
/// else the store's, else the fastest by timing. `text` names the problem for the store and the
/// log, `make` builds the candidates: both only for a new problem. A problem with one candidate
/// is not timed.
/// choose()'s work, once for every caller (per kernel it was ~3 KB of object code; issue 22).
FUSEBOX_RUNTIME_API std::size_t choose_among(const problem_id& id, std::size_t n,
                                             const std::function<std::string()>& text,
                                             const std::function<std::vector<candidate>()>& make);
template <class Text, class Make>
std::size_t choose(const problem_id& id, std::size_t n, Text&& text, Make&& make) {
  if (n <= 1) return 0;
  return choose_among(id, n, std::ref(text), std::ref(make));
}

/// What max_autotune tunes on the CPU, in words (explain()).
inline const char* description() {
  return "gemm: the path where another is valid (gemv or stream-B^T vs blocked), the blocked task grid, 1 thread vs "
         "all; conv2d and its gradients: direct vs Winograd where both apply, 1 thread vs all; the static path's "
         "rows kernels: 1 thread vs all, tasks 4x larger. Each problem's "
         "candidates are timed once (2 warm-up runs, median of 7 interleaved rounds; the default unless another "
         "is 10% faster)";
}

// Definitions: compiled here, or once in the FUSEBOX_IMPLEMENTATION unit (core/linkage.hpp).
#if FUSEBOX_RUNTIME_BODIES
namespace detail {
FUSEBOX_RUNTIME_API std::vector<double> median_seconds(const std::vector<candidate>& cands, int rounds) {
  for (const candidate& c : cands)
    for (int w = 0; w < 2; ++w) c.run();
  std::vector<std::vector<double>> t(cands.size());
  for (int r = 0; r < rounds; ++r)
    for (std::size_t i = 0; i < cands.size(); ++i) {
      const auto t0 = std::chrono::steady_clock::now();
      cands[i].run();
      t[i].push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
  std::vector<double> med(cands.size());
  for (std::size_t i = 0; i < cands.size(); ++i) {
    std::sort(t[i].begin(), t[i].end());
    med[i] = t[i][t[i].size() / 2];
  }
  return med;
}
}  // namespace detail

FUSEBOX_RUNTIME_API void forget() {
  auto& m = detail::memory();
  ::fusebox::detail::state_lock lock(m.mutex);
  m.chosen.clear();
}

FUSEBOX_RUNTIME_API std::size_t known() {
  auto& m = detail::memory();
  ::fusebox::detail::state_lock lock(m.mutex);
  return m.chosen.size();
}

FUSEBOX_RUNTIME_API std::size_t choose_among(const problem_id& id, std::size_t n,
                                             const std::function<std::string()>& text,
                                             const std::function<std::vector<candidate>()>& make) {
  if (n <= 1) return 0;
  auto& m = detail::memory();
  {
    ::fusebox::detail::state_lock lock(m.mutex);
    if (auto it = m.chosen.find(id); it != m.chosen.end()) return it->second;
  }
  const std::string problem = text();
  store* disk = current.disk;
  if (disk)
    if (auto stored = disk->load(problem, n); stored && *stored < n) {
      jit::counters().autotune_from_disk.fetch_add(1, std::memory_order_relaxed);
      jit::log(jit::log_category::autotune, problem + ": candidate #" + std::to_string(*stored) + " from the cache");
      ::fusebox::detail::state_lock lock(m.mutex);
      return m.chosen.emplace(id, *stored).first->second;
    }
  const std::vector<candidate> cands = make();
  std::vector<double> secs;
  {
    struct timing_flag {
      bool saved = timing;
      timing_flag() { timing = true; }
      ~timing_flag() { timing = saved; }
    } flag;
    secs = detail::median_seconds(cands);
  }
  std::size_t best = 0;
  for (std::size_t i = 1; i < secs.size(); ++i)
    if (secs[i] < secs[best] && secs[i] < secs[0] * (1 - win_margin)) best = i;
  jit::counters().autotune_timed.fetch_add(1, std::memory_order_relaxed);
  if (jit::enabled(jit::log_category::autotune)) {
    std::string line = problem + ": " + std::to_string(cands.size()) + " candidates timed (median of 7 rounds, us):";
    for (std::size_t i = 0; i < cands.size(); ++i)
      line += " [" + std::to_string(i) + "] " + cands[i].name + " " + std::to_string(secs[i] * 1e6) + ";";
    jit::log(jit::log_category::autotune, line + " chose #" + std::to_string(best) + " (" + cands[best].name + ")");
  }
  if (disk) disk->save(problem, n, best, cands[best].name);
  ::fusebox::detail::state_lock lock(m.mutex);
  return m.chosen.emplace(id, best).first->second;
}
#endif

}  // namespace fusebox::cpu::autotune
