// fusebox/data/workers.hpp: the threads and queues behind a loader's epoch (see loader.hpp).
//
// worker_threads: n threads that each run the current job once per start(), then wait for the
// next one; the loader keeps them between epochs (persistent_workers) or makes new ones per
// epoch. The destructor stops and joins them: a job must return once its epoch is cancelled.
//
// batch_queues: one bounded FIFO per worker. A worker waits for room before it starts a batch, so
// it has at most `capacity` batches loaded or loading (torch's prefetch_factor). The consumer
// takes, in order, from the workers in turn, skipping those that have finished (torch's order:
// for a map-style dataset the worker of batch k is k % n, so this is the sampler's order), or
// else the oldest batch of any worker. Why neither side can wait forever: in order, the consumer
// waits only on a worker whose queue is empty, which therefore has room and is loading or has
// finished; out of order, it waits only while every queue is empty, so no worker is held up.
//
// Depends on: the C++20 standard library only.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

namespace fusebox::data::detail {

class worker_threads {
 public:
  explicit worker_threads(std::size_t n) {
    try {
      for (std::size_t id = 0; id < n; ++id) threads_.emplace_back([this, id] { loop(id); });
    } catch (...) {
      stop();  // a thread that failed to start: join the ones that did
      throw;
    }
  }
  worker_threads(const worker_threads&) = delete;
  worker_threads& operator=(const worker_threads&) = delete;
  ~worker_threads() { stop(); }

  std::size_t size() const noexcept { return threads_.size(); }

  /// Every thread runs job(id) once. The previous job must have finished (wait()). `job` must not
  /// throw: it runs on a thread that has nobody to throw to.
  void start(std::function<void(std::size_t)> job) {
    {
      std::lock_guard lock(mutex_);
      job_ = std::move(job);
      running_ = threads_.size();
      ++generation_;
    }
    changed_.notify_all();
  }

  /// Returns when every thread has returned from the current job.
  void wait() {
    std::unique_lock lock(mutex_);
    changed_.wait(lock, [&] { return running_ == 0; });
  }

 private:
  void loop(std::size_t id) {
    std::uint64_t seen = 0;
    for (;;) {
      {
        std::unique_lock lock(mutex_);
        changed_.wait(lock, [&] { return stopping_ || generation_ != seen; });
        if (stopping_) return;
        seen = generation_;
      }
      job_(id);  // job_ is not reassigned before every thread is done with it (start's contract)
      std::lock_guard lock(mutex_);
      if (--running_ == 0) changed_.notify_all();
    }
  }

  void stop() {
    {
      std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    changed_.notify_all();
    for (auto& t : threads_) t.join();
    threads_.clear();
  }

  std::mutex mutex_;
  std::condition_variable changed_;  // a new job, stopping, or a job finished
  std::function<void(std::size_t)> job_;
  std::uint64_t generation_ = 0;
  std::size_t running_ = 0;
  bool stopping_ = false;
  std::vector<std::thread> threads_;
};

template <class Batch>
class batch_queues {
 public:
  /// A loaded batch, or the exception that loading it threw.
  struct result {
    std::optional<Batch> batch;
    std::exception_ptr error;
  };

  batch_queues(std::size_t workers, std::size_t capacity, bool in_order)
      : workers_(workers), capacity_(capacity), in_order_(in_order) {}

  /// Whether loading has been cancelled (read by workers between samples).
  bool cancelled() const noexcept { return cancelled_.load(std::memory_order_relaxed); }

  /// Worker side: waits until worker `w` may start a batch; false once cancelled.
  bool wait_for_room(std::size_t w) {
    std::unique_lock lock(mutex_);
    room_.wait(lock, [&] { return cancelled() || workers_[w].ready.size() < capacity_; });
    return !cancelled();
  }

  void push(std::size_t w, result r) {
    {
      std::lock_guard lock(mutex_);
      workers_[w].ready.push_back(std::move(r));
      if (!in_order_) arrivals_.push_back(w);
    }
    arrived_.notify_all();
  }

  /// Worker side: worker `w` will push nothing more this epoch.
  void finish(std::size_t w) {
    {
      std::lock_guard lock(mutex_);
      workers_[w].done = true;
      ++finished_;
    }
    arrived_.notify_all();
  }

  /// Consumer side: the next result, or nothing once every worker has finished and been drained.
  std::optional<result> take() {
    std::unique_lock lock(mutex_);
    const std::size_t n = workers_.size();
    for (;;) {
      if (in_order_) {
        std::size_t skipped = 0;
        while (skipped < n && workers_[next_].done && workers_[next_].ready.empty()) {
          next_ = (next_ + 1) % n;
          ++skipped;
        }
        if (skipped == n) return std::nullopt;
        if (!workers_[next_].ready.empty()) {
          auto r = pop(next_);
          next_ = (next_ + 1) % n;
          return r;
        }
      } else {
        if (!arrivals_.empty()) {
          const std::size_t w = arrivals_.front();
          arrivals_.pop_front();
          return pop(w);
        }
        if (finished_ == n) return std::nullopt;
      }
      arrived_.wait(lock);
    }
  }

  /// Makes waiting workers give up and running ones stop at their next sample.
  void cancel() {
    {
      std::lock_guard lock(mutex_);
      cancelled_.store(true, std::memory_order_relaxed);
    }
    room_.notify_all();
  }

 private:
  struct worker {
    std::deque<result> ready;
    bool done = false;
  };

  // Called with mutex_ held.
  result pop(std::size_t w) {
    result r = std::move(workers_[w].ready.front());
    workers_[w].ready.pop_front();
    room_.notify_all();
    return r;
  }

  std::mutex mutex_;
  std::condition_variable room_, arrived_;
  std::vector<worker> workers_;
  std::deque<std::size_t> arrivals_;  // out of order: workers in the order their batches arrived
  std::size_t capacity_, next_ = 0, finished_ = 0;
  bool in_order_;
  std::atomic<bool> cancelled_{false};
};

}  // namespace fusebox::data::detail
