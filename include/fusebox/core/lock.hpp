// core/lock.hpp: the mutex that guards fusebox's process-wide state (the profiler's recorder,
// max_autotune's winners) and its guard. Under FUSEBOX_NO_THREADS (the edge configuration: no
// threads, and a toolchain that may have no <mutex>) a lock that does nothing; otherwise std::mutex.
// Depends on: the C++ standard library.
#pragma once

#if defined(FUSEBOX_NO_THREADS)
namespace fusebox::detail {
struct state_mutex {
  void lock() noexcept {}
  void unlock() noexcept {}
};
}  // namespace fusebox::detail
#else
#include <mutex>
namespace fusebox::detail {
using state_mutex = std::mutex;
}  // namespace fusebox::detail
#endif

namespace fusebox::detail {

/// std::lock_guard's job, without <mutex>.
template <class Mutex>
class state_lock {
public:
  explicit state_lock(Mutex& m) : m_(m) { m_.lock(); }
  ~state_lock() { m_.unlock(); }
  state_lock(const state_lock&) = delete;
  state_lock& operator=(const state_lock&) = delete;

private:
  Mutex& m_;
};

}  // namespace fusebox::detail
