// fusebox/data/dataset.hpp: what a loader can load from, and what a worker tells a dataset.
//
// Two kinds of dataset, as in torch.utils.data:
//   - map-style: `size()` and `get(i)` for i in [0, size()). The loader's workers call get() on
//     one shared object concurrently, so get() is const and must be safe to call from several
//     threads at once (reading members is; caching into them is not).
//   - iterable (streaming): `open(const worker_info&)` returns a stream whose `next()` gives
//     std::optional<sample> (empty at the end). Each worker opens its own stream once per epoch,
//     with its id and the number of workers; the dataset must return that worker's shard (for
//     instance with shard_range), otherwise every worker yields every sample, as in torch.
//
// worker_info is also reachable from inside get() through get_worker_info(), like torch's
// torch.utils.data.get_worker_info(); unlike torch it is set when loading in the caller's thread
// too (num_workers = 0 reads as worker 0 of 1), so a dataset sees one seed rule everywhere.
//
// Depends on: the C++20 standard library only.
#pragma once

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <type_traits>
#include <utility>

namespace fusebox::data {

struct worker_info {
  std::size_t id = 0;           // in [0, num_workers)
  std::size_t num_workers = 1;  // 1 when loading in the caller's thread
  std::uint64_t epoch = 0;
  std::uint64_t seed = 0;       // the epoch's base seed + id: distinct per worker, reproducible
};

namespace detail {
inline const worker_info*& current_worker() {
  thread_local const worker_info* info = nullptr;
  return info;
}

// Sets the calling thread's worker_info for its lifetime, then restores the previous one.
class worker_scope {
 public:
  explicit worker_scope(const worker_info& info) : saved_(current_worker()) {
    current_worker() = &info;
  }
  worker_scope(const worker_scope&) = delete;
  worker_scope& operator=(const worker_scope&) = delete;
  ~worker_scope() { current_worker() = saved_; }

 private:
  const worker_info* saved_;
};
}  // namespace detail

/// The worker that is loading on this thread, or nullptr outside a loader.
inline const worker_info* get_worker_info() noexcept { return detail::current_worker(); }

/// Worker `info.id`'s contiguous part of [0, n): parts differ in size by at most one and together
/// cover [0, n) once.
inline std::pair<std::size_t, std::size_t> shard_range(std::size_t n, const worker_info& info) {
  const std::size_t base = n / info.num_workers, extra = n % info.num_workers;
  const std::size_t begin = info.id * base + (info.id < extra ? info.id : extra);
  return {begin, begin + base + (info.id < extra ? 1 : 0)};
}

template <class D>
concept map_dataset = requires(const D& d, std::size_t i) {
  { d.size() } -> std::convertible_to<std::size_t>;
  d.get(i);
};

template <class D>
concept iterable_dataset = requires(const D& d, const worker_info& info) { d.open(info); } &&
    requires(decltype(std::declval<const D&>().open(worker_info{}))& stream) {
      { stream.next().has_value() } -> std::convertible_to<bool>;
      *stream.next();
    };

/// The type of one sample (without references: the loader keeps its own copy).
template <class D>
struct sample_of;
template <map_dataset D>
struct sample_of<D> {
  using type = std::remove_cvref_t<decltype(std::declval<const D&>().get(std::size_t{}))>;
};
template <iterable_dataset D>
  requires(!map_dataset<D>)
struct sample_of<D> {
  using type = std::remove_cvref_t<decltype(*std::declval<const D&>().open(worker_info{}).next())>;
};
template <class D>
using sample_t = typename sample_of<D>::type;

}  // namespace fusebox::data
