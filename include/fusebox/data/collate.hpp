// fusebox/data/collate.hpp: turns the samples of one batch into the batch (torch's collate_fn).
//
// default_collate stacks fixed-size samples into contiguous arrays with the batch as the first
// dimension:
//   - an arithmetic value (float, int, ...)                          -> stacked<T> [batch]
//   - a contiguous range of them (std::vector, std::array, std::span) -> stacked<T> [batch, n]
//     (every sample of the batch must have the same n; the error names the two that differ)
//   - a std::pair or std::tuple of the above                          -> a std::tuple of those
// Anything else fails to build with a message saying to pass a collate of one's own.
//
// Batch memory comes from a batch_allocator, the loader's hook for pin_memory: the default is
// fusebox's ordinary 64-byte-aligned heap storage (allocate_storage), the same storage_ptr that
// tensors own, so a batch can become a tensor view without a copy. A page-locked allocator (the
// CUDA backend's cuda::pinned_pool, which the loader's pin_memory uses) goes in the same hook.
// Nothing here includes a CUDA header.
//
// Depends on: the C++20 standard library, fusebox/core/{errors,storage}.hpp.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <new>
#include <ranges>
#include <span>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "fusebox/core/errors.hpp"
#include "fusebox/core/storage.hpp"

namespace fusebox::data {

/// Allocates `bytes` bytes of batch storage; must not return null for bytes > 0.
using batch_allocator = std::function<storage_ptr(std::size_t bytes)>;

/// A stacked field of a batch: `shape[0]` samples, row-major.
template <class T>
struct stacked {
  std::vector<std::size_t> shape;
  storage_ptr storage;

  T* data() const noexcept { return reinterpret_cast<T*>(storage.get()); }
  std::size_t size() const noexcept {
    std::size_t n = 1;
    for (std::size_t e : shape) n *= e;
    return n;
  }
  std::span<T> values() const noexcept { return {data(), size()}; }
};

/// A stacked<T> of `shape` with storage from `allocate` (ordinary heap storage if it is empty).
template <class T>
stacked<T> allocate_stacked(std::vector<std::size_t> shape, const batch_allocator& allocate) {
  stacked<T> out{std::move(shape), {}};
  const std::size_t bytes = out.size() * sizeof(T);
  out.storage = allocate ? allocate(bytes) : allocate_storage(bytes);
  if (bytes > 0 && !out.storage)
    FUSEBOX_THROW(std::bad_alloc());  // the hook's contract; a null here would be a crash later
  if (reinterpret_cast<std::uintptr_t>(out.storage.get()) % alignof(T) != 0)
    FUSEBOX_THROW(invalid_argument("fusebox: data loader: the batch allocator returned memory aligned to "
                                   "less than the " + std::to_string(alignof(T)) +
                                   " bytes the batch's element type needs"));
  return out;
}

namespace detail {

template <class T>
concept collate_row = std::ranges::contiguous_range<const T&> &&
                      std::ranges::sized_range<const T&> &&
                      std::is_arithmetic_v<std::ranges::range_value_t<const T&>>;

template <class T>
struct is_tuple_like : std::false_type {};
template <class A, class B>
struct is_tuple_like<std::pair<A, B>> : std::true_type {};
template <class... T>
struct is_tuple_like<std::tuple<T...>> : std::true_type {};

template <class>
inline constexpr bool always_false = false;

// Stacks field(sample) over the batch; `what` names the field in messages.
template <class Sample, class Field>
auto collate_field(const std::vector<Sample>& samples, Field field, const std::string& what,
                   const batch_allocator& allocate) {
  using F = std::remove_cvref_t<decltype(field(samples.front()))>;
  const std::size_t batch = samples.size();
  if constexpr (std::is_arithmetic_v<F>) {
    auto out = allocate_stacked<F>({batch}, allocate);
    for (std::size_t i = 0; i < batch; ++i) out.data()[i] = field(samples[i]);
    return out;
  } else if constexpr (collate_row<F>) {
    using T = std::remove_cv_t<std::ranges::range_value_t<const F&>>;
    const std::size_t n = batch ? std::ranges::size(field(samples[0])) : 0;
    auto out = allocate_stacked<T>({batch, n}, allocate);
    for (std::size_t i = 0; i < batch; ++i) {
      const auto& row = field(samples[i]);
      if (std::ranges::size(row) != n)
        FUSEBOX_THROW(invalid_argument(
            "fusebox: default_collate: " + what + " of sample " + std::to_string(i) +
            " of the batch has " + std::to_string(std::ranges::size(row)) + " values and of "
            "sample 0 " + std::to_string(n) + "; samples stacked into one batch must have one "
            "size (for variable lengths use bucketing_sampler with bucket_collate, or a collate "
            "of your own)"));
      std::ranges::copy(row, out.data() + i * n);
    }
    return out;
  } else {
    static_assert(always_false<F>,
                  "default_collate: a sample (or each member of a pair/tuple sample) must be an "
                  "arithmetic value or a contiguous range of them (std::vector, std::array, "
                  "std::span); pass a collate of your own to the loader for other samples");
  }
}

}  // namespace detail

struct default_collate {
  template <class Sample>
  auto operator()(std::vector<Sample>&& samples, const batch_allocator& allocate) const {
    if constexpr (detail::is_tuple_like<Sample>::value) {
      return [&]<std::size_t... I>(std::index_sequence<I...>) {
        return std::tuple{detail::collate_field(
            samples, [](const Sample& s) -> const auto& { return std::get<I>(s); },
            "member " + std::to_string(I), allocate)...};
      }(std::make_index_sequence<std::tuple_size_v<Sample>>{});
    } else {
      return detail::collate_field(
          samples, [](const Sample& s) -> const Sample& { return s; }, "the value", allocate);
    }
  }
};

}  // namespace fusebox::data
