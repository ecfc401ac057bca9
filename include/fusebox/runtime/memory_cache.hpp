// fusebox/runtime/memory_cache.hpp: the in-process JIT cache, `memory_cache<V>`.
//
// Contract of get_or_create(key, factory):
//   - a key seen before returns its value (a hit) without calling the factory;
//   - the first caller for a new key runs factory() outside the cache lock; every other thread
//     asking for the same key meanwhile waits for it and receives the same value, so a kernel is
//     compiled once however many threads want it;
//   - if the factory throws, nothing is cached: the exception is rethrown to the creator and to
//     every thread that was waiting, and the next request runs the factory again;
//   - a factory that asks for its own key (directly or through another factory) would wait for
//     itself: that is reported as std::logic_error instead of a deadlock.
// Lookups go to a bucket by a 64-bit hash, then compare the FULL canonical key (STYLE.md: a
// hash-only hit returns the wrong kernel on a collision). The bucket hash is a constructor
// argument so a test can force every key into one bucket.
//
// V is copied out to callers: make it cheap to copy (a shared_ptr to the compiled kernel).
// The cache does not count hits and misses itself (it also serves other kinds of values); the
// `outcome` it reports lets the caller bump fusebox::jit::counters() for its kind.
//
// Depends on: the C++20 standard library and fusebox/runtime/cache_key.hpp.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "fusebox/core/errors.hpp"
#include "fusebox/runtime/cache_key.hpp"

namespace fusebox::jit {

/// How get_or_create produced its value.
enum class cache_outcome {
  hit,      // the value was ready
  created,  // this call ran the factory
  waited,   // another thread was running the factory; this call waited for its value
};

template <class V>
class memory_cache {
 public:
  using bucket_hash = std::uint64_t (*)(const cache_key&);

  /// `hash` picks the bucket; the default is cache_key::hash64. Tests pass a constant to force
  /// collisions.
  explicit memory_cache(bucket_hash hash = &default_hash) : hash_(hash) {}

  memory_cache(const memory_cache&) = delete;
  memory_cache& operator=(const memory_cache&) = delete;

  template <class Factory>
  V get_or_create(const cache_key& key, Factory&& factory, cache_outcome* outcome = nullptr) {
    const std::uint64_t h = hash_(key);
    std::shared_ptr<entry> slot;
    {
      std::unique_lock lock(mutex_);
      auto& bucket = buckets_[h];
      for (const auto& e : bucket)
        if (e->key == key) {  // the full key, never only the hash
          slot = e;
          break;
        }
      if (slot) {
        if (!slot->ready && slot->creator == std::this_thread::get_id())
          FUSEBOX_THROW(std::logic_error(
              "fusebox: memory_cache::get_or_create re-entered for a key whose factory is "
              "running on this thread (it would wait for itself)"));
        const bool was_ready = slot->ready;
        ready_.wait(lock, [&] { return slot->ready; });
        if (outcome) *outcome = was_ready ? cache_outcome::hit : cache_outcome::waited;
        if (slot->error) std::rethrow_exception(slot->error);
        return *slot->value;
      }
      slot = std::make_shared<entry>();
      slot->key = key;
      slot->creator = std::this_thread::get_id();
      bucket.push_back(slot);
    }

    // The factory runs without the lock: other keys stay served meanwhile.
    try {
      V value = std::forward<Factory>(factory)();
      std::lock_guard lock(mutex_);
      slot->value.emplace(std::move(value));
      slot->ready = true;
    } catch (...) {
      std::lock_guard lock(mutex_);
      slot->error = std::current_exception();
      slot->ready = true;
      erase(h, slot);  // a failure is not cached: the next request tries again
      ready_.notify_all();
      throw;
    }
    ready_.notify_all();
    if (outcome) *outcome = cache_outcome::created;
    return *slot->value;  // immutable once ready; this thread wrote it
  }

  /// The value for `key` if it is ready (no waiting, no factory).
  std::optional<V> find(const cache_key& key) const {
    const std::uint64_t h = hash_(key);
    std::lock_guard lock(mutex_);
    const auto it = buckets_.find(h);
    if (it == buckets_.end()) return std::nullopt;
    for (const auto& e : it->second)
      if (e->key == key && e->ready && !e->error) return *e->value;
    return std::nullopt;
  }

  /// Drops every entry. Factories still running finish and hand their value to the threads
  /// already waiting for it, but it is not kept.
  void clear() {
    std::lock_guard lock(mutex_);
    buckets_.clear();
  }

  /// Entries held, including ones whose factory is still running.
  std::size_t size() const {
    std::lock_guard lock(mutex_);
    std::size_t n = 0;
    for (const auto& [h, bucket] : buckets_) n += bucket.size();
    return n;
  }

 private:
  struct entry {
    cache_key key;
    std::thread::id creator;
    bool ready = false;              // guarded by mutex_
    std::optional<V> value;          // set once, before ready
    std::exception_ptr error;        // set once, before ready
  };

  static std::uint64_t default_hash(const cache_key& key) { return key.hash64(); }

  void erase(std::uint64_t h, const std::shared_ptr<entry>& slot) {
    const auto it = buckets_.find(h);
    if (it == buckets_.end()) return;  // clear() ran meanwhile
    auto& bucket = it->second;
    for (auto e = bucket.begin(); e != bucket.end(); ++e)
      if (*e == slot) {
        bucket.erase(e);
        break;
      }
    if (bucket.empty()) buckets_.erase(it);
  }

  bucket_hash hash_;
  mutable std::mutex mutex_;
  std::condition_variable ready_;
  std::unordered_map<std::uint64_t, std::vector<std::shared_ptr<entry>>> buckets_;
};

}  // namespace fusebox::jit
