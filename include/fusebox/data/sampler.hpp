// fusebox/data/sampler.hpp: which sample indices form each batch of an epoch.
//
// A batch sampler is any callable `index_batches(std::uint64_t epoch)`, like torch's
// batch_sampler with set_epoch folded into the call: the loader calls it once per epoch on the
// caller's thread. batch_indices is the default one (torch's BatchSampler over a Sequential or
// RandomSampler); bucketing.hpp has one for variable-length samples.
//
// Shuffling is our own Fisher-Yates over splitmix64, not std::shuffle: the standard leaves
// std::shuffle's algorithm to the implementation, and the same seed must give the same order with
// every standard library. The order depends on (seed, epoch) only: a new epoch is a new order,
// a rerun with the same seed is the same run.
//
// Depends on: the C++20 standard library, fusebox/core/errors.hpp, fusebox/core/tensor.hpp
// (detail::splitmix64).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include "fusebox/core/errors.hpp"
#include "fusebox/core/tensor.hpp"

namespace fusebox::data {

using index_batches = std::vector<std::vector<std::size_t>>;
using batch_sampler = std::function<index_batches(std::uint64_t epoch)>;

/// The seed of one epoch: a fixed mix of (seed, epoch), so neighbouring epochs and seeds give
/// unrelated orders.
inline std::uint64_t epoch_seed(std::uint64_t seed, std::uint64_t epoch) {
  fusebox::detail::splitmix64 mix{seed};
  mix.state ^= epoch * 0xD1B54A32D192ED03ull;
  return mix.next();
}

/// Shuffles `indices` in place, the same way for the same seed everywhere.
inline void shuffle_indices(std::vector<std::size_t>& indices, std::uint64_t seed) {
  fusebox::detail::splitmix64 random{seed};
  for (std::size_t i = indices.size(); i > 1; --i) {
    // The modulo's bias is below i / 2^64: invisible for any dataset that fits in memory.
    const std::size_t j = static_cast<std::size_t>(random.next() % i);
    std::swap(indices[i - 1], indices[j]);
  }
}

/// Cuts `indices` into batches of `batch_size`; the last one is shorter, or dropped.
inline index_batches make_batches(const std::vector<std::size_t>& indices, std::size_t batch_size,
                                  bool drop_last) {
  index_batches batches;
  for (std::size_t at = 0; at < indices.size(); at += batch_size) {
    const std::size_t end = std::min(indices.size(), at + batch_size);
    if (end - at < batch_size && drop_last) break;
    batches.emplace_back(indices.begin() + static_cast<std::ptrdiff_t>(at),
                         indices.begin() + static_cast<std::ptrdiff_t>(end));
  }
  return batches;
}

/// Batches over [0, n): in order, or shuffled by (seed, epoch).
inline index_batches batch_indices(std::size_t n, std::size_t batch_size, bool shuffle,
                                   bool drop_last, std::uint64_t seed, std::uint64_t epoch) {
  if (batch_size == 0) FUSEBOX_THROW(invalid_argument("fusebox: data loader: batch_size must be at least 1"));
  std::vector<std::size_t> indices(n);
  std::iota(indices.begin(), indices.end(), std::size_t{0});
  if (shuffle) shuffle_indices(indices, epoch_seed(seed, epoch));
  return make_batches(indices, batch_size, drop_last);
}

}  // namespace fusebox::data
