// fusebox/data/bucketing.hpp: batches of variable-length samples padded to a few fixed lengths.
//
// A compiled model specialises on its input shapes (runtime/guard.hpp): feeding it every sequence
// length that occurs would compile once per length, or make the length symbolic. Bucketing bounds
// the shapes to the user's boundaries, e.g. {32, 64, 128}: bucketing_sampler puts each sample in
// the smallest bucket whose boundary is at least its length and makes each batch from one bucket;
// bucket_collate pads the batch to that boundary. A sample longer than the largest boundary is
// refused by name when the sampler is built, not truncated.
//
// With shuffle, samples are shuffled within each bucket and the batches of all buckets are then
// shuffled together, both by (seed, epoch); without it, buckets come in ascending order and
// samples in index order. drop_last applies to each bucket's last batch.
//
// Depends on: the C++20 standard library, fusebox/core/errors.hpp,
// fusebox/data/{sampler,collate}.hpp.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <ranges>
#include <string>
#include <utility>
#include <vector>

#include "fusebox/core/errors.hpp"
#include "fusebox/data/collate.hpp"
#include "fusebox/data/sampler.hpp"

namespace fusebox::data {

namespace detail {
// The index of the smallest boundary >= length, or boundaries.size() if none is.
inline std::size_t bucket_index(const std::vector<std::size_t>& boundaries, std::size_t length) {
  return static_cast<std::size_t>(
      std::lower_bound(boundaries.begin(), boundaries.end(), length) - boundaries.begin());
}

inline void check_boundaries(const std::vector<std::size_t>& boundaries, const char* who) {
  if (boundaries.empty())
    FUSEBOX_THROW(invalid_argument(std::string("fusebox: ") + who + ": no bucket boundaries given"));
  for (std::size_t b = 0; b < boundaries.size(); ++b)
    if (boundaries[b] == 0 || (b > 0 && boundaries[b] <= boundaries[b - 1]))
      FUSEBOX_THROW(invalid_argument(std::string("fusebox: ") + who + ": bucket boundaries must be " +
                                     "positive and strictly increasing; boundary " + std::to_string(b) +
                                     " is " + std::to_string(boundaries[b])));
}
}  // namespace detail

/// A batch_sampler (see sampler.hpp) over samples of the given lengths.
class bucketing_sampler {
 public:
  bucketing_sampler(const std::vector<std::size_t>& lengths, std::vector<std::size_t> boundaries,
                    std::size_t batch_size, bool shuffle = true, bool drop_last = false,
                    std::uint64_t seed = 0)
      : boundaries_(std::move(boundaries)), batch_size_(batch_size), shuffle_(shuffle),
        drop_last_(drop_last), seed_(seed) {
    detail::check_boundaries(boundaries_, "bucketing_sampler");
    if (batch_size_ == 0) FUSEBOX_THROW(invalid_argument("fusebox: bucketing_sampler: batch_size must be at least 1"));
    buckets_.resize(boundaries_.size());
    for (std::size_t i = 0; i < lengths.size(); ++i) {
      const std::size_t b = detail::bucket_index(boundaries_, lengths[i]);
      if (b == boundaries_.size())
        FUSEBOX_THROW(invalid_argument("fusebox: bucketing_sampler: sample " + std::to_string(i) +
                                       " has length " + std::to_string(lengths[i]) +
                                       ", more than the largest bucket boundary " +
                                       std::to_string(boundaries_.back()) +
                                       "; add a larger boundary or shorten the sample"));
      buckets_[b].push_back(i);
    }
  }

  const std::vector<std::size_t>& boundaries() const noexcept { return boundaries_; }
  /// The length a sample of `length` is padded to.
  std::size_t bucket_length(std::size_t length) const {
    const std::size_t b = detail::bucket_index(boundaries_, length);
    return b < boundaries_.size() ? boundaries_[b] : 0;
  }

  index_batches operator()(std::uint64_t epoch) const {
    const std::uint64_t seed = epoch_seed(seed_, epoch);
    index_batches all;
    for (std::size_t b = 0; b < buckets_.size(); ++b) {
      std::vector<std::size_t> indices = buckets_[b];
      if (shuffle_) shuffle_indices(indices, epoch_seed(seed, b + 1));
      for (auto& batch : make_batches(indices, batch_size_, drop_last_)) all.push_back(std::move(batch));
    }
    if (shuffle_) {
      std::vector<std::size_t> order(all.size());
      for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
      shuffle_indices(order, seed);
      index_batches shuffled(all.size());
      for (std::size_t i = 0; i < order.size(); ++i) shuffled[i] = std::move(all[order[i]]);
      all = std::move(shuffled);
    }
    return all;
  }

 private:
  std::vector<std::size_t> boundaries_;
  std::vector<std::vector<std::size_t>> buckets_;  // sample indices per bucket, ascending
  std::size_t batch_size_;
  bool shuffle_, drop_last_;
  std::uint64_t seed_;
};

/// A batch of variable-length samples padded to its bucket's length.
template <class T>
struct padded_batch {
  stacked<T> values;                 // [batch, bucket length], padding after each sample
  std::vector<std::size_t> lengths;  // each sample's own length
};

/// The collate for bucketing_sampler: samples are contiguous ranges of arithmetic values
/// (std::vector, std::span, ...); the batch is padded with `pad` to the smallest boundary that
/// holds its longest sample (with bucketing_sampler's batches, that is the bucket's boundary).
struct bucket_collate {
  std::vector<std::size_t> boundaries;
  double pad = 0;

  explicit bucket_collate(std::vector<std::size_t> bucket_boundaries, double pad_value = 0)
      : boundaries(std::move(bucket_boundaries)), pad(pad_value) {
    detail::check_boundaries(boundaries, "bucket_collate");
  }

  template <class Sample>
    requires detail::collate_row<Sample>
  auto operator()(std::vector<Sample>&& samples, const batch_allocator& allocate) const {
    using T = std::remove_cv_t<std::ranges::range_value_t<const Sample&>>;
    std::size_t longest = 0;
    for (const auto& s : samples) longest = std::max<std::size_t>(longest, std::ranges::size(s));
    const std::size_t b = detail::bucket_index(boundaries, longest);
    if (b == boundaries.size())
      FUSEBOX_THROW(invalid_argument("fusebox: bucket_collate: a sample of length " +
                                     std::to_string(longest) + " is longer than the largest boundary " +
                                     std::to_string(boundaries.back())));
    const std::size_t length = boundaries[b];
    padded_batch<T> out{allocate_stacked<T>({samples.size(), length}, allocate), {}};
    for (std::size_t i = 0; i < samples.size(); ++i) {
      T* row = out.values.data() + i * length;
      const auto end = std::ranges::copy(samples[i], row).out;
      std::fill(end, row + length, static_cast<T>(pad));
      out.lengths.push_back(std::ranges::size(samples[i]));
    }
    return out;
  }
};

}  // namespace fusebox::data
