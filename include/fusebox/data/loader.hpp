// fusebox/data/loader.hpp: fusebox::data::loader, torch.utils.data.DataLoader for C++.
//
//   fusebox::data::loader batches(std::move(dataset), {.batch_size = 64, .shuffle = true,
//                                                      .num_workers = 2, .seed = 1});
//   for (int epoch = 0; epoch < 10; ++epoch)
//     for (auto& [images, labels] : batches) train_step(images, labels);
//
// The loader keeps its own copy of the dataset; to borrow one instead, name the type:
// `loader<const my_dataset&> batches(dataset, {...})`.
//
// Each begin() starts the next epoch (set_epoch() picks one): the batch sampler's order depends
// on (seed, epoch), so epochs differ and a rerun repeats them. The options mean what torch's do:
//   batch_size, shuffle, drop_last   the default batch sampler (sampler.hpp); `sampler` replaces
//                                    all three (for instance a bucketing_sampler)
//   num_workers                      threads that load batches; 0 loads in the caller's thread
//                                    when the loop asks for the next batch
//   prefetch_factor                  batches each worker may have loaded or loading ahead
//   persistent_workers               keep the threads from one epoch to the next
//   in_order                         true: batches come in sampler order; false: as they are ready
//   pin_memory                       batch storage in page-locked memory, so copies to the GPU are
//                                    asynchronous (backend/cuda/uploader.hpp): from `pinned_allocator` if
//                                    given, else from cuda::shared_pinned_pool() (recycled
//                                    buffers). Where CUDA cannot run, the loader warns once and
//                                    uses ordinary memory, as torch's does; pinned() says which
// Map-style datasets: batch k of the epoch is loaded by worker k % num_workers, as in torch, so
// which worker (and which worker seed) loads a sample is reproducible. Iterable datasets: each
// worker opens its own shard (dataset.hpp) and batches it; batches come from the workers in
// turn, and with drop_last each worker drops its own last partial batch (torch does the same).
//
// Errors: an exception thrown by a dataset or collate on a worker is rethrown, as it was thrown,
// from the loop's ++ (or begin()) where that batch would have come; the epoch then ends. Leaving
// the loop early, starting another epoch or destroying the loader stops the workers at their next
// sample and joins them. An iterator is single-pass and belongs to its epoch.
//
// Depends on: the C++20 standard library, fusebox/core/errors.hpp,
// fusebox/data/{dataset,sampler,collate,workers}.hpp, fusebox/backend/cuda/pinned_pool.hpp (loaded
// with dlopen on first use: nothing is linked), fusebox/runtime/logs.hpp (the warning).
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <iterator>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include "fusebox/backend/cuda/pinned_pool.hpp"
#include "fusebox/core/errors.hpp"
#include "fusebox/data/collate.hpp"
#include "fusebox/data/dataset.hpp"
#include "fusebox/data/sampler.hpp"
#include "fusebox/data/workers.hpp"
#include "fusebox/runtime/logs.hpp"

namespace fusebox::data {

struct loader_options {
  std::size_t batch_size = 1;
  bool shuffle = false;
  bool drop_last = false;
  std::size_t num_workers = 0;
  std::size_t prefetch_factor = 2;
  bool persistent_workers = false;
  bool in_order = true;
  std::uint64_t seed = 0;
  batch_sampler sampler = {};        // map-style only; excludes batch_size, shuffle, drop_last
  bool pin_memory = false;
  batch_allocator pinned_allocator = {};  // what pin_memory allocates batches with (default: the
                                          // CUDA backend's shared pinned pool)
};

namespace detail {

/// pin_memory's allocator when the options name none: the CUDA backend's shared pool, or, where
/// CUDA cannot run, nothing (ordinary memory) with a warning saying why, once per process.
inline batch_allocator default_pinned_allocator() {
  if (cuda::available())
    return [](std::size_t bytes) { return cuda::shared_pinned_pool().allocate(bytes); };
  static const bool warned = [] {
    std::string why = "no usable CUDA device";
    try {
      (void)cuda::current_device();
    } catch (const std::exception& e) {
      why = e.what();
    }
    jit::warn("data loader: pin_memory is set but the CUDA backend is unavailable here; batches use "
              "ordinary memory (" + why + ")");
    return true;
  }();
  (void)warned;
  return {};
}

}  // namespace detail

namespace detail {

// A collate is called as collate(samples, allocator), or as collate(samples) if it has no use
// for the allocator.
template <class Collate, class Sample>
decltype(auto) call_collate(const Collate& collate, std::vector<Sample>&& samples,
                            const batch_allocator& allocate) {
  if constexpr (std::is_invocable_v<const Collate&, std::vector<Sample>&&, const batch_allocator&>)
    return collate(std::move(samples), allocate);
  else if constexpr (std::is_invocable_v<const Collate&, std::vector<Sample>&&>)
    return collate(std::move(samples));
  else
    static_assert(always_false<Collate>,
                  "loader: the collate must be callable as collate(std::vector<sample>&&, const "
                  "batch_allocator&) or collate(std::vector<sample>&&), and const");
}

template <class Dataset>
struct stream_of {
  using type = decltype(std::declval<const Dataset&>().open(worker_info{}));
};

}  // namespace detail

template <class Dataset, class Collate = default_collate>
  requires map_dataset<Dataset> || iterable_dataset<Dataset>
class loader {
  static constexpr bool map_style = map_dataset<Dataset>;

 public:
  using sample_type = sample_t<Dataset>;
  using batch_type = std::remove_cvref_t<decltype(detail::call_collate(
      std::declval<const Collate&>(), std::declval<std::vector<sample_type>>(),
      std::declval<const batch_allocator&>()))>;

  class iterator {
   public:
    using value_type = batch_type;
    using difference_type = std::ptrdiff_t;

    iterator() = default;
    batch_type& operator*() const { return *owner_->current_; }
    batch_type* operator->() const { return &*owner_->current_; }
    iterator& operator++() {
      if (run_ != owner_->run_)
        FUSEBOX_THROW(invalid_argument("fusebox: data loader: ++ on an iterator of an epoch that has "
                                       "ended (begin() was called again); iterators are single-pass"));
      owner_->advance();
      return *this;
    }
    void operator++(int) { ++*this; }
    friend bool operator==(const iterator& it, std::default_sentinel_t) { return it.at_end(); }

   private:
    friend class loader;
    iterator(loader* owner, std::uint64_t run) : owner_(owner), run_(run) {}
    bool at_end() const { return !owner_ || run_ != owner_->run_ || !owner_->current_; }
    loader* owner_ = nullptr;
    std::uint64_t run_ = 0;
  };

  explicit loader(Dataset dataset, loader_options options = {}, Collate collate = {})
      : dataset_(std::forward<Dataset>(dataset)), options_(std::move(options)),
        collate_(std::move(collate)) {
    const auto& o = options_;
    auto refuse = [](const std::string& why) {
      FUSEBOX_THROW(invalid_argument("fusebox: data loader: " + why));
    };
    if (o.batch_size == 0) refuse("batch_size must be at least 1");
    if (o.prefetch_factor == 0) refuse("prefetch_factor must be at least 1");
    if (o.persistent_workers && o.num_workers == 0)
      refuse("persistent_workers needs num_workers > 0 (there are no workers to keep)");
    if (o.sampler && (o.batch_size != 1 || o.shuffle || o.drop_last))
      refuse("a batch sampler decides batch size, order and dropping itself: leave batch_size, "
             "shuffle and drop_last at their defaults when `sampler` is given");
    if (!map_style && (o.sampler || o.shuffle))
      refuse("an iterable dataset decides its own order: shuffle and sampler apply to map-style "
             "datasets only");
    allocator_ = !o.pin_memory         ? batch_allocator{}
                 : o.pinned_allocator ? o.pinned_allocator
                                      : detail::default_pinned_allocator();
  }

  /// Whether batches come from a page-locked allocator (pin_memory, and CUDA runs here or an
  /// allocator was given).
  bool pinned() const noexcept { return static_cast<bool>(allocator_); }

  loader(const loader&) = delete;  // the workers hold `this`
  loader& operator=(const loader&) = delete;
  ~loader() {
    stop_epoch();
    threads_.reset();
  }

  /// Starts the next epoch and loads its first batch.
  iterator begin() {
    start_epoch();
    iterator it(this, run_);
    advance();
    return it;
  }
  std::default_sentinel_t end() const noexcept { return {}; }

  /// The epoch the next begin() starts (then it counts on from there).
  std::uint64_t epoch() const noexcept { return next_epoch_; }
  void set_epoch(std::uint64_t epoch) noexcept { next_epoch_ = epoch; }

  /// Batches per epoch (torch's len(loader)); map-style datasets only.
  std::size_t size() const
    requires map_style
  {
    if (options_.sampler) return options_.sampler(next_epoch_).size();
    const std::size_t n = dataset_.size(), b = options_.batch_size;
    return options_.drop_last ? n / b : (n + b - 1) / b;
  }

  const loader_options& options() const noexcept { return options_; }
  const std::remove_reference_t<Dataset>& dataset() const noexcept { return dataset_; }

 private:
  using stream_type = typename std::conditional_t<map_style, std::type_identity<std::monostate>,
                                                  detail::stream_of<Dataset>>::type;

  // What one worker loads in one epoch (see the header comment).
  struct source {
    const loader& owner;
    const worker_info& info;
    std::size_t next;  // map-style: the next of the epoch's batches for this worker
    stream_type stream;
    bool ended = false;

    source(const loader& o, const worker_info& i) : owner(o), info(i), next(i.id), stream(open(o, i)) {}

    static stream_type open(const loader& o, const worker_info& i) {
      if constexpr (map_style) return {};
      else return o.dataset_.open(i);
    }

    // The next batch, or nothing at the end of this worker's part (or when cancelled).
    template <class Cancelled>
    std::optional<batch_type> load(const Cancelled& cancelled) {
      std::vector<sample_type> samples;
      if constexpr (map_style) {
        const index_batches& all = *owner.batches_;
        if (next >= all.size()) return std::nullopt;
        const auto& indices = all[next];
        next += info.num_workers;
        samples.reserve(indices.size());
        for (std::size_t i : indices) {
          if (cancelled()) return std::nullopt;
          samples.push_back(owner.dataset_.get(i));
        }
      } else {
        while (!ended && samples.size() < owner.options_.batch_size) {
          if (cancelled()) return std::nullopt;
          auto sample = stream.next();
          if (!sample) ended = true;
          else samples.push_back(std::move(*sample));
        }
        if (samples.empty() || (samples.size() < owner.options_.batch_size && owner.options_.drop_last))
          return std::nullopt;
      }
      return detail::call_collate(owner.collate_, std::move(samples), owner.allocator_);
    }
  };

  void start_epoch() {
    stop_epoch();
    ++run_;
    const std::uint64_t epoch = next_epoch_++;
    const std::size_t workers = std::max<std::size_t>(1, options_.num_workers);
    const std::uint64_t base_seed = epoch_seed(options_.seed, epoch);
    infos_.clear();
    for (std::size_t w = 0; w < workers; ++w) infos_.push_back({w, workers, epoch, base_seed + w});

    if constexpr (map_style) {
      auto batches = std::make_shared<index_batches>(
          options_.sampler ? options_.sampler(epoch)
                           : batch_indices(dataset_.size(), options_.batch_size, options_.shuffle,
                                           options_.drop_last, options_.seed, epoch));
      // Checked here, on the caller's thread, so a sampler's mistake is not a worker's exception.
      const std::size_t n = dataset_.size();
      for (std::size_t k = 0; k < batches->size(); ++k)
        for (std::size_t i : (*batches)[k])
          if (i >= n)
            FUSEBOX_THROW(invalid_argument("fusebox: data loader: batch " + std::to_string(k) +
                                           " of epoch " + std::to_string(epoch) + " holds index " +
                                           std::to_string(i) + ", but the dataset has " +
                                           std::to_string(n) + " samples"));
      batches_ = std::move(batches);
    }

    if (options_.num_workers == 0) {
      detail::worker_scope scope(infos_[0]);
      inline_source_.emplace(*this, infos_[0]);
      return;
    }
    queues_ = std::make_unique<detail::batch_queues<batch_type>>(workers, options_.prefetch_factor,
                                                                 options_.in_order);
    if (!threads_) threads_ = std::make_unique<detail::worker_threads>(workers);
    threads_->start([this](std::size_t w) { work(w); });
  }

  // A worker's whole epoch. Its first exception is its last result: after a throw the state of
  // the dataset's stream (or the worker's share of batches) is unknown.
  void work(std::size_t w) noexcept {
    auto& queues = *queues_;
    detail::worker_scope scope(infos_[w]);
    try {
      source from(*this, infos_[w]);
      while (queues.wait_for_room(w)) {
        auto batch = from.load([&] { return queues.cancelled(); });
        if (!batch) break;
        queues.push(w, {std::move(batch), nullptr});
      }
    } catch (...) {
      queues.push(w, {std::nullopt, std::current_exception()});
    }
    queues.finish(w);
  }

  // Makes current_ the epoch's next batch, or empty at its end.
  void advance() {
    current_.reset();
    if (options_.num_workers == 0) {
      if (!inline_source_) return;
      detail::worker_scope scope(infos_[0]);
      try {
        current_ = inline_source_->load([] { return false; });
      } catch (...) {
        inline_source_.reset();
        throw;
      }
      if (!current_) inline_source_.reset();
      return;
    }
    if (!queues_) return;
    auto next = queues_->take();
    if (!next) {
      stop_epoch();
    } else if (next->error) {
      stop_epoch();
      std::rethrow_exception(next->error);
    } else {
      current_ = std::move(next->batch);
    }
  }

  // Cancels the running epoch, if any, and waits until no worker is inside it.
  void stop_epoch() {
    inline_source_.reset();
    if (!queues_) return;
    queues_->cancel();
    if (options_.persistent_workers) threads_->wait();
    else threads_.reset();  // joins
    queues_.reset();
  }

  Dataset dataset_;
  loader_options options_;
  Collate collate_;
  batch_allocator allocator_;
  std::uint64_t next_epoch_ = 0;
  std::uint64_t run_ = 0;  // counts begin() calls, so an old epoch's iterator is recognised

  // The running epoch.
  std::vector<worker_info> infos_;
  std::shared_ptr<const index_batches> batches_;
  std::optional<source> inline_source_;  // num_workers == 0
  std::unique_ptr<detail::batch_queues<batch_type>> queues_;
  std::unique_ptr<detail::worker_threads> threads_;
  std::optional<batch_type> current_;
};

template <class Dataset>
loader(Dataset, loader_options) -> loader<Dataset>;
template <class Dataset, class Collate>
loader(Dataset, loader_options, Collate) -> loader<Dataset, Collate>;

}  // namespace fusebox::data
