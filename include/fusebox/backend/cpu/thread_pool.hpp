// fusebox/backend/cpu/thread_pool.hpp — the CPU executor's fork-join pool.
//
// What it is for: compiled CPU kernels (GEMM, fused elementwise and reduction loops) split their
// work into tasks and call `parallel_for` a few times per model call, each time for roughly
// 20-500 us of work. What matters is therefore (1) wake-up latency: workers spin for a few
// microseconds after a call before they block, so back-to-back calls (pack, then compute) find
// them awake; (2) no allocation and no syscall on the hot path: the callable is passed by
// reference through a two-word `function_ref`, and `notify` costs a syscall only when someone
// is actually blocked; (3) an idle pool costs no CPU: after the spin, workers block in
// `std::atomic::wait` (a futex on Linux).
//
// Contract of parallel_for(tasks, fn):
//   - fn(task, worker) runs exactly once for every task in [0, tasks); worker is in [0, size())
//     and identifies the thread (the caller is worker 0 and takes tasks too), so a kernel can
//     index per-thread scratch by it. Tasks are handed out dynamically through an atomic counter.
//   - returns when every task has finished; the first exception thrown by fn is rethrown here,
//     after all running tasks stopped; tasks not yet started are skipped. (Without exceptions an
//     error ends the process where it is raised: core/errors.hpp.)
//   - re-entrant: a parallel_for issued from inside a task (of this or any pool) runs serially
//     on the calling thread, with that thread's worker index where it is the same pool.
//   - calls from several outside threads at once are serialised (one job at a time).
//
// Two ways to run without fusebox's own threads (edge builds, issue 23):
//   - the caller's pool (options::pool, an `external_pool`): parallel_for hands the job to it, and
//     the contract above holds on the caller's threads (errors included: the first is rethrown
//     here);
//   - FUSEBOX_NO_THREADS defined: fusebox starts no thread and includes neither <thread> nor
//     <mutex>; a pool of its own has one thread, the caller's (an external pool still runs tasks
//     in parallel).
//
// Depends on: the C++20 standard library, core/{errors,linkage}.hpp.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <stdexcept>
#include <type_traits>
#include <utility>
#include <vector>
#if !defined(FUSEBOX_NO_THREADS)
#include <map>
#include <mutex>
#include <thread>
#endif

#include "fusebox/core/errors.hpp"
#include "fusebox/core/linkage.hpp"

// _mm_pause only: <xmmintrin.h> (SSE), not <immintrin.h>, whose AVX-512 part is what
// backend/cpu/vector_isa.hpp must be the first to include (its comment says why).
#if defined(__x86_64__) || defined(__i386__) || defined(_M_X64) || defined(_M_IX86)
#include <xmmintrin.h>
#endif

namespace fusebox::cpu {

namespace detail {

inline void cpu_relax() noexcept {
#if defined(__x86_64__) || defined(__i386__) || defined(_M_X64) || defined(_M_IX86)
  _mm_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

}  // namespace detail

/// A non-owning reference to a callable `void(std::size_t task, unsigned worker)`: two words, no
/// allocation. The referenced callable must outlive the call (it does: parallel_for blocks until
/// done). What an external_pool is given to run.
class task_ref {
public:
  task_ref() noexcept = default;
  template <class F>
  explicit task_ref(F& f) noexcept
      : obj_(const_cast<void*>(static_cast<const void*>(std::addressof(f)))),
        call_([](void* o, std::size_t t, unsigned w) { (*static_cast<F*>(o))(t, w); }) {}
  void operator()(std::size_t task, unsigned worker) const { call_(obj_, task, worker); }

private:
  void* obj_ = nullptr;
  void (*call_)(void*, std::size_t, unsigned) = nullptr;
};

/// The caller's own thread pool, for the parallel work of a compiled function (options::pool):
/// `parallel_for(context, tasks, task)` must call task(t, worker) once for every t in [0, tasks)
/// and return when all have finished; `worker` must be in [0, threads) and differ between tasks
/// that run at the same time (kernels index per-thread scratch by it). The calling thread may take
/// tasks too. A task never calls back into the pool (fusebox runs nested work serially).
struct external_pool {
  unsigned threads = 1;  ///< how many threads run tasks at most, the calling one included
  void* context = nullptr;
  void (*parallel_for)(void* context, std::size_t tasks, task_ref task) = nullptr;
};

/// Threads this machine runs at once (std::thread::hardware_concurrency, at least 1); 1 where
/// fusebox starts no threads (FUSEBOX_NO_THREADS).
inline unsigned hardware_threads() noexcept {
#if defined(FUSEBOX_NO_THREADS)
  return 1;
#else
  return std::max(1u, std::thread::hardware_concurrency());
#endif
}

namespace detail {

// Which pool (if any) the current thread is running a task for, and as which worker.
struct pool_context {
  const void* pool = nullptr;
  unsigned worker = 0;
};
inline thread_local pool_context current_context{};

// Restores the thread's context on scope exit (also on exceptions).
class context_guard {
public:
  context_guard(const void* pool, unsigned worker) noexcept : saved_(current_context) {
    current_context = {pool, worker};
  }
  ~context_guard() { current_context = saved_; }
  context_guard(const context_guard&) = delete;
  context_guard& operator=(const context_guard&) = delete;

private:
  pool_context saved_;
};

}  // namespace detail

class thread_pool {
public:
  // How long an idle thread spins before it blocks. Long enough to bridge the gap between the
  // back-to-back parallel_for calls of one kernel (and between kernels of one model call), short
  // enough that an idle pool goes to sleep at once on a human time scale.
  static constexpr std::chrono::microseconds spin_time{20};

  // `threads` counts every thread that runs tasks, the caller included: threads - 1 workers are
  // started. 0 means hardware_threads(). With FUSEBOX_NO_THREADS the pool is the caller alone.
  explicit thread_pool(unsigned threads);
  // The caller's pool runs the tasks: this one starts no thread.
  explicit thread_pool(const external_pool& caller) : size_(std::max(1u, caller.threads)), external_(caller) {
    if (!caller.parallel_for)
      FUSEBOX_THROW(invalid_argument("fusebox: options::pool: the external_pool has no parallel_for function"));
  }

  ~thread_pool() { shutdown(); }

  thread_pool(const thread_pool&) = delete;
  thread_pool& operator=(const thread_pool&) = delete;

  unsigned size() const noexcept { return size_; }

  template <class F>
  void parallel_for(std::size_t tasks, F&& fn) {
    // Only the two-word reference depends on F: the pool's work below is one function for every
    // caller. Instantiated per callable it was ~45 KB of object code in a unit compiling two small
    // models (issue 22); tasks are 20-500 us, so one indirect call per task costs nothing.
    if (tasks != 0) run_job(tasks, task_ref(fn));
  }

private:
  void run_job(std::size_t tasks, task_ref fn) {
    const detail::pool_context ctx = detail::current_context;
    if (ctx.pool != nullptr || size_ == 1 || tasks == 1) {
      // Nested (or nothing to share): run here, in order. Inside a task of this same pool the
      // worker index is this thread's own, so per-worker scratch stays private.
      const unsigned worker = ctx.pool == this ? ctx.worker : 0u;
      detail::context_guard guard(this, worker);
      for (std::size_t t = 0; t < tasks; ++t) fn(t, worker);
      return;
    }
    if (external_.parallel_for) {
      run_external(tasks, fn);
      return;
    }
#if !defined(FUSEBOX_NO_THREADS)
    std::lock_guard<std::mutex> one_job_at_a_time(call_mutex_);
    job_ = fn;
    tasks_ = tasks;
    next_.store(0, std::memory_order_relaxed);
    failed_.store(false, std::memory_order_relaxed);
    error_ = nullptr;
    // Opening the job releases the fields above to every worker that sees it open.
    open_.store(true, std::memory_order_seq_cst);
    epoch_.fetch_add(1, std::memory_order_release);
    epoch_.notify_all();  // a syscall only if some worker is blocked

    run_tasks(0);

    // Every task is claimed now (or the job failed). Close the job, then wait only for the
    // workers that joined it: a worker descheduled before joining never holds the caller up
    // (this matters when the pool has more threads than free cores). The seq_cst pair
    // (worker: inside_++ then read open_; caller: open_ = false then read inside_) guarantees
    // that a worker which saw the job open is counted here.
    open_.store(false, std::memory_order_seq_cst);
    wait_until_zero(inside_);
#if FUSEBOX_HAS_EXCEPTIONS
    if (failed_.load(std::memory_order_relaxed)) {
      std::exception_ptr e = std::move(error_);
      error_ = nullptr;
      std::rethrow_exception(e);
    }
#endif
#endif  // !FUSEBOX_NO_THREADS
  }

  // The job on the caller's pool: each task marks its thread as this pool's worker (so nested
  // parallel_for runs serially there), and the first error is rethrown after every task ended.
  void run_external(std::size_t tasks, task_ref fn) {
    struct job_state {
      thread_pool* pool;
      task_ref fn;
      std::atomic<bool> failed{false};
#if FUSEBOX_HAS_EXCEPTIONS
      std::exception_ptr error{};
#endif
      void operator()(std::size_t t, unsigned worker) {
        if (failed.load(std::memory_order_relaxed)) return;
        detail::context_guard guard(pool, worker);
#if FUSEBOX_HAS_EXCEPTIONS
        try {
          fn(t, worker);
        } catch (...) {
          bool expected = false;
          if (failed.compare_exchange_strong(expected, true, std::memory_order_acq_rel)) error = std::current_exception();
        }
#else
        fn(t, worker);
#endif
      }
    } job{this, fn};
    external_.parallel_for(external_.context, tasks, task_ref(job));
#if FUSEBOX_HAS_EXCEPTIONS
    if (job.failed.load(std::memory_order_acquire)) std::rethrow_exception(job.error);
#endif
  }

#if !defined(FUSEBOX_NO_THREADS)

  // Spin for spin_time, then block until `counter` is 0.
  static void wait_until_zero(std::atomic<unsigned>& counter) noexcept {
    const auto deadline = std::chrono::steady_clock::now() + spin_time;
    unsigned spins = 0;
    unsigned left;
    while ((left = counter.load(std::memory_order_seq_cst)) != 0) {
      if (++spins % 64 == 0 && std::chrono::steady_clock::now() > deadline) {
        while ((left = counter.load(std::memory_order_seq_cst)) != 0)
          counter.wait(left, std::memory_order_seq_cst);
        return;
      }
      detail::cpu_relax();
    }
  }

  void run_tasks(unsigned worker) noexcept {
    detail::context_guard guard(this, worker);
    for (;;) {
      if (failed_.load(std::memory_order_relaxed)) return;
      const std::size_t t = next_.fetch_add(1, std::memory_order_relaxed);
      if (t >= tasks_) return;
#if FUSEBOX_HAS_EXCEPTIONS
      try {
        job_(t, worker);
      } catch (...) {
        bool expected = false;
        if (failed_.compare_exchange_strong(expected, true, std::memory_order_acq_rel))
          error_ = std::current_exception();
        return;
      }
#else
      job_(t, worker);  // an error ends the process in the error handler (core/errors.hpp)
#endif
    }
  }

  void worker_loop(unsigned worker) noexcept {
    // Start from 0, not from the current epoch: a worker that starts late must still see the
    // shutdown bump of a pool destroyed before it ran (it then finds stop_ set and leaves).
    std::uint32_t seen = 0;
    for (;;) {
      std::uint32_t e;
      const auto deadline = std::chrono::steady_clock::now() + spin_time;
      unsigned spins = 0;
      while ((e = epoch_.load(std::memory_order_acquire)) == seen) {
        if (++spins % 64 == 0 && std::chrono::steady_clock::now() > deadline) {
          epoch_.wait(seen, std::memory_order_acquire);
          spins = 0;
          continue;
        }
        detail::cpu_relax();
      }
      seen = e;
      if (stop_.load(std::memory_order_acquire)) return;
      inside_.fetch_add(1, std::memory_order_seq_cst);
      // The job seen open may be a later one than epoch e announced; joining it is still right.
      if (open_.load(std::memory_order_seq_cst)) run_tasks(worker);
      if (inside_.fetch_sub(1, std::memory_order_seq_cst) == 1) inside_.notify_all();
    }
  }

  std::vector<std::thread> workers_;
  std::mutex call_mutex_;

  // The current job; written by the caller before the epoch is bumped, read-only while it runs.
  task_ref job_;
  std::size_t tasks_ = 0;
  std::exception_ptr error_;

  alignas(64) std::atomic<std::uint32_t> epoch_{0};  // 32 bits: a futex word
  alignas(64) std::atomic<std::size_t> next_{0};
  alignas(64) std::atomic<unsigned> inside_{0};  // workers that joined the current job
  std::atomic<bool> open_{false};
  std::atomic<bool> failed_{false};
  std::atomic<bool> stop_{false};
#endif  // !FUSEBOX_NO_THREADS

  void shutdown() noexcept;

  unsigned size_ = 1;
  external_pool external_{};
};

// A process-wide pool per thread count, created on first use and joined at exit.
// 0 means hardware_threads(). With FUSEBOX_NO_THREADS every count gets the one pool of one thread.
FUSEBOX_RUNTIME_API thread_pool& shared_pool(unsigned threads);

// Definitions: compiled here, or once in the FUSEBOX_IMPLEMENTATION unit (core/linkage.hpp).
#if FUSEBOX_RUNTIME_BODIES
#if defined(FUSEBOX_NO_THREADS)
FUSEBOX_RUNTIME_API thread_pool::thread_pool(unsigned) {}

FUSEBOX_RUNTIME_API void thread_pool::shutdown() noexcept {}

FUSEBOX_RUNTIME_API thread_pool& shared_pool(unsigned) {
  static thread_pool one(1);
  return one;
}
#else
FUSEBOX_RUNTIME_API thread_pool::thread_pool(unsigned threads) {
  if (threads == 0) threads = hardware_threads();
  size_ = threads;
  workers_.reserve(threads - 1);
#if FUSEBOX_HAS_EXCEPTIONS
  try {
    for (unsigned w = 1; w < threads; ++w) workers_.emplace_back([this, w] { worker_loop(w); });
  } catch (...) {
    shutdown();
    throw;
  }
#else
  for (unsigned w = 1; w < threads; ++w) workers_.emplace_back([this, w] { worker_loop(w); });
#endif
}

FUSEBOX_RUNTIME_API void thread_pool::shutdown() noexcept {
  stop_.store(true, std::memory_order_release);
  epoch_.fetch_add(1, std::memory_order_release);
  epoch_.notify_all();
  for (auto& t : workers_)
    if (t.joinable()) t.join();
  workers_.clear();
}

FUSEBOX_RUNTIME_API thread_pool& shared_pool(unsigned threads) {
  if (threads == 0) threads = hardware_threads();
  static std::mutex m;
  static std::map<unsigned, std::unique_ptr<thread_pool>> pools;
  std::lock_guard<std::mutex> lock(m);
  auto& p = pools[threads];
  if (!p) p = std::make_unique<thread_pool>(threads);
  return *p;
}
#endif  // FUSEBOX_NO_THREADS
#endif

}  // namespace fusebox::cpu
