// Tests for include/fusebox/data/loader.hpp and what it is made of (dataset.hpp, sampler.hpp,
// collate.hpp, workers.hpp), bucketing.hpp and progress.hpp.
//
// Nothing here waits on time for correctness: where a test needs a worker to be held back it
// waits on a condition that the test's own loop sets, with a deadline only as a guard that turns
// a broken loader into a failure instead of a hang.
#include <fusebox/data/bucketing.hpp>
#include <fusebox/data/loader.hpp>
#include <fusebox/data/progress.hpp>

#include <catch2/catch.hpp>

#include <fcntl.h>
#include <poll.h>
#include <stdlib.h>  // posix_openpt, grantpt, unlockpt, ptsname
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <map>
#include <mutex>
#include <numeric>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "../support/check.hpp"  // fbt::rng

namespace data = fusebox::data;
using Catch::Matchers::Contains;

namespace {

// Map-style: sample i is the row {i, -i} and the label i.
struct numbers {
  std::size_t n;
  std::size_t size() const { return n; }
  std::pair<std::array<float, 2>, std::int64_t> get(std::size_t i) const {
    return {{static_cast<float>(i), -static_cast<float>(i)}, static_cast<std::int64_t>(i)};
  }
};

// Iterable: each worker streams its shard of [0, n).
struct number_stream {
  std::size_t n;
  struct stream {
    std::size_t at, end;
    std::optional<std::int64_t> next() {
      if (at == end) return std::nullopt;
      return static_cast<std::int64_t>(at++);
    }
  };
  stream open(const data::worker_info& w) const {
    const auto [begin, end] = data::shard_range(n, w);
    return {begin, end};
  }
};

// The labels of every batch of one epoch, in the order the loop saw them. For `numbers` it also
// checks that each row holds {label, -label}: the collate kept the members of a sample together.
template <class Loader>
std::vector<std::vector<std::int64_t>> run_epoch(Loader& loader) {
  std::vector<std::vector<std::int64_t>> batches;
  for (auto& batch : loader) {
    std::vector<std::int64_t> labels;
    if constexpr (requires { std::get<1>(batch); }) {
      const auto& [rows, ids] = batch;
      REQUIRE(rows.shape == std::vector<std::size_t>{ids.shape[0], 2});
      for (std::size_t i = 0; i < ids.shape[0]; ++i) {
        REQUIRE(rows.data()[2 * i] == static_cast<float>(ids.data()[i]));
        REQUIRE(rows.data()[2 * i + 1] == -static_cast<float>(ids.data()[i]));
        labels.push_back(ids.data()[i]);
      }
    } else {
      REQUIRE(batch.shape.size() == 1);
      labels.assign(batch.data(), batch.data() + batch.shape[0]);
    }
    batches.push_back(std::move(labels));
  }
  return batches;
}

std::vector<std::int64_t> flatten(const std::vector<std::vector<std::int64_t>>& batches) {
  std::vector<std::int64_t> all;
  for (const auto& b : batches) all.insert(all.end(), b.begin(), b.end());
  return all;
}

std::vector<std::int64_t> iota(std::int64_t begin, std::int64_t end) {
  std::vector<std::int64_t> v(static_cast<std::size_t>(end - begin));
  std::iota(v.begin(), v.end(), begin);
  return v;
}

// Blocks until `ready()` or a generous deadline; false on the deadline (the test then fails
// instead of hanging).
template <class Ready>
bool wait_until(std::mutex& m, std::condition_variable& cv, Ready ready) {
  std::unique_lock lock(m);
  return cv.wait_for(lock, std::chrono::seconds(20), ready);
}

}  // namespace

TEST_CASE("shard_range: the workers' parts cover [0, n) once and differ by at most one",
          "[data][loader]") {
  for (std::size_t n = 0; n < 20; ++n)
    for (std::size_t workers = 1; workers <= 5; ++workers) {
      std::size_t expected_begin = 0;
      for (std::size_t w = 0; w < workers; ++w) {
        const auto [begin, end] = data::shard_range(n, {w, workers, 0, 0});
        INFO("n " << n << ", worker " << w << " of " << workers);
        REQUIRE(begin == expected_begin);
        REQUIRE(end - begin >= n / workers);
        REQUIRE(end - begin <= n / workers + 1);
        expected_begin = end;
      }
      REQUIRE(expected_begin == n);
    }
}

TEST_CASE("loader, map-style: every sample exactly once per epoch, for every option combination",
          "[data][loader]") {
  constexpr std::size_t n = 103, batch = 10;
  for (std::size_t workers : {0u, 1u, 2u, 4u})
    for (bool shuffle : {false, true})
      for (bool in_order : {true, false})
        for (bool drop_last : {false, true}) {
          INFO("num_workers " << workers << ", shuffle " << shuffle << ", in_order " << in_order
                              << ", drop_last " << drop_last);
          data::loader loader(numbers{n}, {.batch_size = batch, .shuffle = shuffle,
                                           .drop_last = drop_last, .num_workers = workers,
                                           .in_order = in_order, .seed = 5});
          // In sampler order: what the caller's thread loads, one batch at a time.
          data::loader reference(numbers{n}, {.batch_size = batch, .shuffle = shuffle,
                                              .drop_last = drop_last, .seed = 5});
          REQUIRE(loader.size() == (drop_last ? 10u : 11u));
          for (int epoch = 0; epoch < 2; ++epoch) {
            const auto batches = run_epoch(loader);
            const auto expected = run_epoch(reference);
            REQUIRE(batches.size() == loader.size());
            std::size_t partial = 0;
            for (const auto& b : batches) partial += b.size() != batch;
            CHECK(partial == (drop_last ? 0u : 1u));

            auto all = flatten(batches);
            REQUIRE(all.size() == (drop_last ? 100u : n));
            if (in_order) {
              CHECK(batches == expected);
            } else {
              auto sorted = batches, sorted_expected = expected;
              std::sort(sorted.begin(), sorted.end());
              std::sort(sorted_expected.begin(), sorted_expected.end());
              CHECK(sorted == sorted_expected);
            }
            std::sort(all.begin(), all.end());
            CHECK(std::adjacent_find(all.begin(), all.end()) == all.end());  // no duplicate
            if (!shuffle || !drop_last) CHECK(all == iota(0, static_cast<std::int64_t>(all.size())));
            if (!shuffle && in_order) CHECK(flatten(batches) == all);
          }
        }
}

TEST_CASE("loader, iterable: every sample exactly once, each worker batching its own shard",
          "[data][loader]") {
  constexpr std::size_t n = 103, batch = 10;
  for (std::size_t workers : {0u, 1u, 2u, 4u})
    for (bool in_order : {true, false})
      for (bool drop_last : {false, true}) {
        INFO("num_workers " << workers << ", in_order " << in_order << ", drop_last " << drop_last);
        // Expected, as torch does it: worker w cuts its shard into batches (dropping its own last
        // partial batch with drop_last); the loop takes one batch from each worker in turn.
        const std::size_t parts = std::max<std::size_t>(workers, 1);
        std::vector<std::vector<std::vector<std::int64_t>>> per_worker(parts);
        for (std::size_t w = 0; w < parts; ++w) {
          const auto [begin, end] = data::shard_range(n, {w, parts, 0, 0});
          for (std::size_t at = begin; at < end; at += batch) {
            const std::size_t stop = std::min(end, at + batch);
            if (stop - at < batch && drop_last) break;
            per_worker[w].push_back(iota(static_cast<std::int64_t>(at), static_cast<std::int64_t>(stop)));
          }
        }
        std::size_t rounds = 0;
        for (const auto& p : per_worker) rounds = std::max(rounds, p.size());
        std::vector<std::vector<std::int64_t>> expected;
        for (std::size_t round = 0; round < rounds; ++round)
          for (const auto& p : per_worker)
            if (round < p.size()) expected.push_back(p[round]);

        data::loader loader(number_stream{n}, {.batch_size = batch, .drop_last = drop_last,
                                               .num_workers = workers, .in_order = in_order});
        for (int epoch = 0; epoch < 2; ++epoch) {
          auto batches = run_epoch(loader);
          if (!in_order) {
            std::sort(batches.begin(), batches.end());
            std::sort(expected.begin(), expected.end());
          }
          CHECK(batches == expected);
          auto all = flatten(batches);
          std::sort(all.begin(), all.end());
          CHECK(std::adjacent_find(all.begin(), all.end()) == all.end());
          if (!drop_last) CHECK(all == iota(0, n));
        }
      }
}

TEST_CASE("loader: the same seed gives the same order; another epoch or seed another order",
          "[data][loader]") {
  auto make = [](std::uint64_t seed, std::size_t workers) {
    return std::make_unique<data::loader<numbers>>(
        numbers{200}, data::loader_options{.batch_size = 8, .shuffle = true,
                                           .num_workers = workers, .seed = seed});
  };
  auto a = make(7, 0), b = make(7, 3), c = make(8, 2);
  const auto a0 = run_epoch(*a), a1 = run_epoch(*a);
  CHECK(run_epoch(*b) == a0);  // the order does not depend on the number of workers
  CHECK(run_epoch(*b) == a1);
  CHECK(a0 != a1);
  CHECK(run_epoch(*c) != a0);
  CHECK(flatten(a0) != iota(0, 200));  // shuffled at all
  a->set_epoch(1);
  CHECK(a->epoch() == 1);
  CHECK(run_epoch(*a) == a1);
  CHECK(a->epoch() == 2);
}

TEST_CASE("loader: worker info and seeds are the epoch's base seed plus the worker id; batch k "
          "is loaded by worker k % num_workers",
          "[data][loader]") {
  struct who_loads {
    std::size_t size() const { return 60; }
    std::tuple<std::int64_t, std::int64_t, std::uint64_t, std::uint64_t> get(std::size_t i) const {
      const data::worker_info* w = data::get_worker_info();
      if (!w) throw std::logic_error("get_worker_info() is null inside get()");
      return {static_cast<std::int64_t>(i), static_cast<std::int64_t>(w->id),
              w->num_workers, w->seed};
    }
  };
  CHECK(data::get_worker_info() == nullptr);
  for (std::size_t workers : {0u, 3u}) {
    data::loader loader(who_loads{}, {.batch_size = 4, .num_workers = workers, .seed = 11});
    for (std::uint64_t epoch = 0; epoch < 2; ++epoch) {
      std::size_t k = 0;
      for (auto& [index, id, count, seed] : loader) {
        const std::size_t expected_id = workers ? k % workers : 0;
        INFO("num_workers " << workers << ", epoch " << epoch << ", batch " << k);
        for (std::size_t s = 0; s < 4; ++s) {
          REQUIRE(index.data()[s] == static_cast<std::int64_t>(4 * k + s));
          REQUIRE(id.data()[s] == static_cast<std::int64_t>(expected_id));
          REQUIRE(count.data()[s] == std::max<std::size_t>(workers, 1));
          REQUIRE(seed.data()[s] == data::epoch_seed(11, epoch) + expected_id);
        }
        ++k;
      }
      CHECK(k == 15);
    }
  }
  CHECK(data::get_worker_info() == nullptr);  // restored after loading in this thread
}

namespace {
struct bad_sample : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Throws on sample `bad`.
struct faulty {
  std::size_t n, bad;
  std::size_t size() const { return n; }
  std::int64_t get(std::size_t i) const {
    if (i == bad) throw bad_sample("sample " + std::to_string(i) + " is bad");
    return static_cast<std::int64_t>(i);
  }
};

// Worker `bad_worker`'s stream throws after `after` samples; open() throws for `bad_open`.
struct faulty_stream {
  std::size_t n, bad_worker, after, bad_open = 99;
  struct stream {
    std::size_t at, end, left;
    bool throws;
    std::optional<std::int64_t> next() {
      if (throws && left-- == 0) throw bad_sample("stream broke");
      if (at == end) return std::nullopt;
      return static_cast<std::int64_t>(at++);
    }
  };
  stream open(const data::worker_info& w) const {
    if (w.id == bad_open) throw bad_sample("cannot open shard " + std::to_string(w.id));
    const auto [begin, end] = data::shard_range(n, w);
    return {begin, end, after, w.id == bad_worker};
  }
};
}  // namespace

TEST_CASE("loader: a throwing dataset surfaces its exception in the loop, at its batch",
          "[data][loader]") {
  for (std::size_t workers : {0u, 1u, 2u, 4u})
    for (bool in_order : {true, false})
      for (bool persistent : {false, true}) {
        if (persistent && workers == 0) continue;
        INFO("num_workers " << workers << ", in_order " << in_order << ", persistent " << persistent);
        data::loader loader(faulty{100, 37}, {.batch_size = 10, .num_workers = workers,
                                              .persistent_workers = persistent,
                                              .in_order = in_order});
        for (int round = 0; round < 2; ++round) {  // and the next epoch starts cleanly
          std::size_t before = 0;
          auto loop = [&] {
            for (auto& batch : loader) {
              (void)batch;
              ++before;
            }
          };
          REQUIRE_THROWS_AS(loop(), bad_sample);
          if (in_order) CHECK(before == 3);  // batches 0..2 came, batch 3 threw
          else CHECK(before <= 9);
          REQUIRE_THROWS_WITH(loop(), "sample 37 is bad");
        }
      }

  for (std::size_t workers : {0u, 2u, 3u}) {
    INFO("iterable, num_workers " << workers);
    data::loader broken(faulty_stream{90, workers ? 1u : 0u, 7}, {.batch_size = 5, .num_workers = workers});
    std::vector<std::int64_t> seen;
    auto loop = [&] {
      for (auto& batch : broken) seen.insert(seen.end(), batch.data(), batch.data() + batch.shape[0]);
    };
    REQUIRE_THROWS_WITH(loop(), "stream broke");
    // In turn, one batch of 5 from each worker, then the broken one's second batch is the error.
    CHECK(seen.size() == (workers ? (workers + 1) * 5 : 5u));
    const std::size_t bad_open = workers ? workers - 1 : 0;
    data::loader unopenable(faulty_stream{90, 99, 0, bad_open}, {.batch_size = 5, .num_workers = workers});
    REQUIRE_THROWS_WITH(run_epoch(unopenable), "cannot open shard " + std::to_string(bad_open));
  }

  // An exception from the collate on a worker: rows of different sizes.
  struct ragged {
    std::size_t size() const { return 6; }
    std::vector<float> get(std::size_t i) const { return std::vector<float>(i < 3 ? 2 : 3, 1.0f); }
  };
  data::loader loader(ragged{}, {.batch_size = 4, .num_workers = 2});
  REQUIRE_THROWS_WITH(run_epoch(loader), Contains("sample 3 of the batch has 3 values") &&
                                             Contains("sample 0 2"));
}

TEST_CASE("loader: leaving an epoch early or destroying the loader stops and joins the workers",
          "[data][loader]") {
  struct slow {
    std::atomic<int>* inside;
    std::atomic<int>* calls;
    std::size_t size() const { return 2000; }
    std::int64_t get(std::size_t i) const {
      inside->fetch_add(1);
      calls->fetch_add(1);
      std::this_thread::sleep_for(std::chrono::microseconds(200));
      inside->fetch_sub(1);
      return static_cast<std::int64_t>(i);
    }
  };
  for (bool persistent : {false, true}) {
    INFO("persistent " << persistent);
    std::atomic<int> inside{0}, calls{0};
    {
      data::loader loader(slow{&inside, &calls}, {.batch_size = 4, .num_workers = 4,
                                                  .persistent_workers = persistent});
      int taken = 0;
      for (auto& batch : loader) {
        (void)batch;
        if (++taken == 2) break;
      }
      // A new epoch after a broken-off one starts from the beginning and is complete.
      std::vector<std::int64_t> all;
      for (auto& batch : loader) all.insert(all.end(), batch.data(), batch.data() + batch.shape[0]);
      CHECK(all == iota(0, 2000));
      taken = 0;
      for (auto& batch : loader) {
        (void)batch;
        if (++taken == 3) break;
      }
    }  // destroyed mid-epoch
    CHECK(inside.load() == 0);
    const int after = calls.load();
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    CHECK(calls.load() == after);  // no worker is left running
  }

  // A stale iterator refuses to advance.
  data::loader loader(numbers{10}, {.batch_size = 2});
  auto old = loader.begin();
  auto current = loader.begin();
  REQUIRE_THROWS_WITH(++old, Contains("single-pass"));
  CHECK(old == std::default_sentinel);
  CHECK_FALSE(current == std::default_sentinel);
}

TEST_CASE("loader: each worker has at most prefetch_factor batches loaded or loading",
          "[data][loader]") {
  struct counted {
    std::mutex* m;
    std::condition_variable* cv;
    std::size_t* started;  // batches whose first sample was asked for
    std::size_t size() const { return 400; }
    std::int64_t get(std::size_t i) const {
      if (i % 4 == 0) {
        std::lock_guard lock(*m);
        ++*started;
        cv->notify_all();
      }
      return static_cast<std::int64_t>(i);
    }
  };
  for (std::size_t workers : {1u, 3u})
    for (std::size_t prefetch : {1u, 2u, 4u}) {
      INFO("num_workers " << workers << ", prefetch_factor " << prefetch);
      std::mutex m;
      std::condition_variable cv;
      std::size_t started = 0, consumed = 0, most_ahead = 0;
      data::loader loader(counted{&m, &cv, &started}, {.batch_size = 4, .num_workers = workers,
                                                       .prefetch_factor = prefetch});
      for (auto& batch : loader) {
        (void)batch;
        ++consumed;
        const std::size_t limit = std::min<std::size_t>(100, consumed + workers * prefetch);
        if (consumed == 1 || consumed == 50) {
          // The workers fill up to the limit while the loop holds back...
          REQUIRE(wait_until(m, cv, [&] { return started == limit; }));
          std::this_thread::sleep_for(std::chrono::milliseconds(5));
        }
        std::lock_guard lock(m);
        most_ahead = std::max(most_ahead, started - consumed);
        REQUIRE(started <= limit);  // ... and never past it
      }
      CHECK(consumed == 100);
      CHECK(most_ahead == workers * prefetch);
    }
}

TEST_CASE("loader: in_order = false hands out a batch that is ready before an earlier one",
          "[data][loader]") {
  // Batch 0 cannot finish until the loop has received another batch: in order, that would be a
  // deadlock (caught by the deadline); out of order it is the expected run.
  struct held {
    std::mutex* m;
    std::condition_variable* cv;
    bool* released;
    bool* timed_out;
    std::size_t size() const { return 40; }
    std::int64_t get(std::size_t i) const {
      if (i == 0 && !wait_until(*m, *cv, [&] { return *released; })) *timed_out = true;
      return static_cast<std::int64_t>(i);
    }
  };
  std::mutex m;
  std::condition_variable cv;
  bool released = false, timed_out = false;
  data::loader loader(held{&m, &cv, &released, &timed_out},
                      {.batch_size = 4, .num_workers = 2, .in_order = false});
  std::vector<std::int64_t> firsts;
  for (auto& batch : loader) {
    firsts.push_back(batch.data()[0]);
    std::lock_guard lock(m);
    released = true;
    cv.notify_all();
  }
  CHECK_FALSE(timed_out);
  REQUIRE(firsts.size() == 10);
  CHECK(firsts.front() != 0);
  std::sort(firsts.begin(), firsts.end());
  CHECK(firsts == std::vector<std::int64_t>{0, 4, 8, 12, 16, 20, 24, 28, 32, 36});
}

TEST_CASE("loader: persistent_workers keeps the same threads across epochs", "[data][loader]") {
  static std::atomic<int> threads_seen{0};
  struct thread_counting {
    std::size_t size() const { return 40; }
    std::int64_t get(std::size_t i) const {
      // Constructed once per thread that loads, whatever its id (ids of joined threads recur).
      thread_local struct first_use {
        first_use() { threads_seen.fetch_add(1); }
      } once;
      (void)once;
      return static_cast<std::int64_t>(i);
    }
  };
  for (bool persistent : {false, true}) {
    threads_seen = 0;
    data::loader loader(thread_counting{}, {.batch_size = 10, .num_workers = 2,
                                            .persistent_workers = persistent});
    for (int epoch = 0; epoch < 3; ++epoch) CHECK(flatten(run_epoch(loader)) == iota(0, 40));
    CHECK(threads_seen.load() == (persistent ? 2 : 6));
  }
}

TEST_CASE("loader: pin_memory allocates every batch through the pinned allocator",
          "[data][loader]") {
  std::mutex m;
  std::set<const std::byte*> allocated;
  data::batch_allocator pinned = [&](std::size_t bytes) {
    auto storage = fusebox::allocate_storage(bytes);
    std::lock_guard lock(m);
    allocated.insert(storage.get());
    return storage;
  };
  for (std::size_t workers : {0u, 2u}) {
    data::loader loader(numbers{50}, {.batch_size = 8, .num_workers = workers,
                                      .pin_memory = true, .pinned_allocator = pinned});
    std::size_t batches = 0;
    for (auto& [rows, ids] : loader) {
      std::lock_guard lock(m);
      CHECK(allocated.count(rows.storage.get()) == 1);
      CHECK(allocated.count(ids.storage.get()) == 1);
      ++batches;
    }
    CHECK(batches == 7);
    data::loader heap(numbers{50}, {.batch_size = 8, .num_workers = workers});
    for (auto& [rows, ids] : heap) {
      std::lock_guard lock(m);
      CHECK(allocated.count(rows.storage.get()) == 0);
    }
  }
}

// With no allocator of its own, pin_memory takes the CUDA backend's shared pinned pool; where CUDA
// cannot run (CI) the loader says so once and loads into ordinary memory, as torch's does.
TEST_CASE("loader: pin_memory without an allocator pins where CUDA runs, else warns and loads as usual",
          "[data][loader]") {
  std::string logged;
  fusebox::jit::set_log_sink([&](std::string_view line) { logged += line; });
  const bool cuda_here = fusebox::cuda::available();
  for (std::size_t workers : {0u, 2u}) {
    data::loader loader(numbers{50}, {.batch_size = 8, .shuffle = true, .num_workers = workers, .seed = 3,
                                      .pin_memory = true});
    CHECK(loader.pinned() == cuda_here);
    std::vector<std::int64_t> seen;
    for (auto& [rows, ids] : loader) {
      REQUIRE(rows.shape == std::vector<std::size_t>{ids.shape[0], 2});
      for (std::size_t i = 0; i < ids.shape[0]; ++i) {
        seen.push_back(ids.values()[i]);
        CHECK(rows.values()[2 * i] == static_cast<float>(ids.values()[i]));
        CHECK(rows.values()[2 * i + 1] == -static_cast<float>(ids.values()[i]));
      }
    }
    std::sort(seen.begin(), seen.end());
    CHECK(seen == iota(0, 50));
  }
  fusebox::jit::set_log_sink({});
  if (cuda_here) {
    CHECK(logged.find("pin_memory") == std::string::npos);
  } else {
    // Once per process, naming the option and the reason.
    const std::string warning = "pin_memory is set but the CUDA backend is unavailable";
    CHECK_THAT(logged, Contains(warning));
    CHECK(logged.find(warning) == logged.rfind(warning));
  }
  data::loader plain(numbers{5}, {});
  CHECK_FALSE(plain.pinned());
}

TEST_CASE("loader: contradictory options are refused by name", "[data][loader]") {
  REQUIRE_THROWS_WITH(data::loader(numbers{5}, {.persistent_workers = true}),
                      Contains("persistent_workers needs num_workers > 0"));
  REQUIRE_THROWS_WITH(data::loader(numbers{5}, {.batch_size = 0}), Contains("batch_size must be"));
  REQUIRE_THROWS_WITH(data::loader(numbers{5}, {.num_workers = 1, .prefetch_factor = 0}),
                      Contains("prefetch_factor"));
  data::batch_sampler sampler = [](std::uint64_t) { return data::index_batches{{0, 1}}; };
  REQUIRE_THROWS_WITH(data::loader(numbers{5}, {.shuffle = true, .sampler = sampler}),
                      Contains("leave batch_size, shuffle and drop_last"));
  REQUIRE_THROWS_WITH(data::loader(number_stream{5}, {.shuffle = true}), Contains("map-style datasets only"));
  data::batch_sampler out_of_range = [](std::uint64_t) { return data::index_batches{{0, 1}, {5}}; };
  data::loader loader(numbers{5}, {.sampler = out_of_range});
  REQUIRE_THROWS_WITH(run_epoch(loader), Contains("batch 1 of epoch 0 holds index 5, but the dataset has 5 samples"));
}

TEST_CASE("collate: the default stacks values and rows; a collate of one's own replaces it",
          "[data][loader]") {
  std::vector<std::pair<std::vector<float>, int>> samples = {{{1, 2, 3}, 7}, {{4, 5, 6}, 8}};
  auto [rows, labels] = data::default_collate{}(std::move(samples), {});
  CHECK(rows.shape == std::vector<std::size_t>{2, 3});
  CHECK(std::vector<float>(rows.values().begin(), rows.values().end()) == std::vector<float>{1, 2, 3, 4, 5, 6});
  CHECK(labels.shape == std::vector<std::size_t>{2});
  CHECK(labels.data()[0] == 7);
  CHECK(labels.data()[1] == 8);
  CHECK(reinterpret_cast<std::uintptr_t>(rows.data()) % fusebox::storage_alignment == 0);

  std::vector<std::vector<double>> ragged = {{1, 2}, {3}};
  REQUIRE_THROWS_WITH(data::default_collate{}(std::move(ragged), {}),
                      Contains("the value of sample 1 of the batch has 1 values and of sample 0 2"));

  // A collate without the allocator: the batch is the sum of the labels.
  auto sum = [](std::vector<std::pair<std::array<float, 2>, std::int64_t>>&& batch) {
    std::int64_t total = 0;
    for (const auto& s : batch) total += s.second;
    return total;
  };
  data::loader summed(numbers{10}, {.batch_size = 4, .num_workers = 2}, sum);
  std::vector<std::int64_t> sums;
  for (std::int64_t s : summed) sums.push_back(s);
  CHECK(sums == std::vector<std::int64_t>{0 + 1 + 2 + 3, 4 + 5 + 6 + 7, 8 + 9});
}

namespace {
// Sample i is a row of lengths[i] values, each i + 0.5 (never the padding value -1).
struct sentences {
  std::vector<std::size_t> lengths;
  std::size_t size() const { return lengths.size(); }
  std::vector<float> get(std::size_t i) const {
    return std::vector<float>(lengths[i], static_cast<float>(i) + 0.5f);
  }
};

std::size_t smallest_fitting(const std::vector<std::size_t>& boundaries, std::size_t length) {
  for (std::size_t b : boundaries)
    if (b >= length) return b;
  return 0;
}
}  // namespace

TEST_CASE("bucketing_sampler: each sample once, in the smallest bucket that fits", "[data][bucketing]") {
  fbt::rng random{3};
  std::vector<std::size_t> lengths(500);
  for (auto& l : lengths) l = 1 + random.next() % 100;
  lengths[0] = 8;  // exactly on a boundary
  lengths[1] = 9;  // just past one
  const std::vector<std::size_t> boundaries = {8, 16, 32, 64, 100};
  for (bool shuffle : {false, true})
    for (bool drop_last : {false, true}) {
      INFO("shuffle " << shuffle << ", drop_last " << drop_last);
      data::bucketing_sampler sampler(lengths, boundaries, 16, shuffle, drop_last, 9);
      CHECK(sampler.bucket_length(8) == 8);
      CHECK(sampler.bucket_length(9) == 16);
      std::map<std::size_t, std::size_t> per_bucket, partial_batches;
      for (std::size_t l : lengths) ++per_bucket[smallest_fitting(boundaries, l)];
      const auto batches = sampler(0);
      std::vector<int> seen(lengths.size());
      std::size_t kept = 0;
      for (const auto& batch : batches) {
        REQUIRE(!batch.empty());
        REQUIRE(batch.size() <= 16);
        const std::size_t bucket = smallest_fitting(boundaries, lengths[batch[0]]);
        for (std::size_t i : batch) {
          REQUIRE(smallest_fitting(boundaries, lengths[i]) == bucket);
          ++seen[i];
        }
        partial_batches[bucket] += batch.size() < 16;
        kept += batch.size();
      }
      for (const auto& [bucket, count] : per_bucket) {
        INFO("bucket " << bucket << " with " << count << " samples");
        CHECK(partial_batches[bucket] == (drop_last || count % 16 == 0 ? 0u : 1u));
      }
      std::size_t expected_kept = 0;
      for (const auto& [bucket, count] : per_bucket) expected_kept += drop_last ? count / 16 * 16 : count;
      CHECK(kept == expected_kept);
      CHECK(std::count(seen.begin(), seen.end(), 1) == static_cast<std::ptrdiff_t>(kept));
      CHECK(std::count_if(seen.begin(), seen.end(), [](int s) { return s > 1; }) == 0);

      CHECK(sampler(0) == batches);  // deterministic
      if (shuffle) CHECK(sampler(1) != batches);
      else CHECK(sampler(1) == batches);
      if (!shuffle) {  // ascending buckets, index order inside each
        std::vector<std::size_t> flat;
        for (const auto& b : batches) flat.insert(flat.end(), b.begin(), b.end());
        CHECK(std::is_sorted(flat.begin(), flat.end(), [&](std::size_t x, std::size_t y) {
          const auto bx = smallest_fitting(boundaries, lengths[x]), by = smallest_fitting(boundaries, lengths[y]);
          return bx != by ? bx < by : x < y;
        }));
      }
    }

  REQUIRE_THROWS_WITH(data::bucketing_sampler({5, 101}, boundaries, 4),
                      Contains("sample 1 has length 101, more than the largest bucket boundary 100"));
  REQUIRE_THROWS_WITH(data::bucketing_sampler({5}, {8, 8}, 4), Contains("strictly increasing"));
}

TEST_CASE("bucketing: through the loader, batches have only the boundary lengths, padded",
          "[data][bucketing]") {
  fbt::rng random{4};
  sentences text;
  for (int i = 0; i < 300; ++i) text.lengths.push_back(1 + random.next() % 50);
  const std::vector<std::size_t> boundaries = {10, 25, 50};
  for (std::size_t workers : {0u, 2u}) {
    data::loader loader(text, {.num_workers = workers,
                               .sampler = data::bucketing_sampler(text.lengths, boundaries, 8, true, false, 1)},
                        data::bucket_collate(boundaries, -1.0));
    std::set<std::size_t> shapes;
    std::vector<int> seen(text.size());
    for (auto& batch : loader) {
      const auto& v = batch.values;
      REQUIRE(v.shape.size() == 2);
      REQUIRE(v.shape[0] == batch.lengths.size());
      shapes.insert(v.shape[1]);
      for (std::size_t r = 0; r < v.shape[0]; ++r) {
        const float value = v.data()[r * v.shape[1]];
        const auto i = static_cast<std::size_t>(value);
        REQUIRE(value == static_cast<float>(i) + 0.5f);
        REQUIRE(batch.lengths[r] == text.lengths[i]);
        REQUIRE(v.shape[1] == smallest_fitting(boundaries, text.lengths[i]));
        for (std::size_t c = 0; c < v.shape[1]; ++c)
          REQUIRE(v.data()[r * v.shape[1] + c] == (c < text.lengths[i] ? value : -1.0f));
        ++seen[i];
      }
    }
    CHECK(shapes == std::set<std::size_t>(boundaries.begin(), boundaries.end()));
    CHECK(std::all_of(seen.begin(), seen.end(), [](int s) { return s == 1; }));
  }
}

TEST_CASE("progress: the line names epoch, samples, loss, rate and ETA; silent off a terminal",
          "[data][progress]") {
  const std::string line = data::format_progress(3, 15000, 60000, 0.43216, 3.0);
  CHECK_THAT(line, Contains("epoch 3") && Contains("15000/60000") && Contains("[=====     ") &&
                       Contains("loss 0.4322") && Contains("5000 samples/s") && Contains("ETA 0:09"));
  CHECK_THAT(data::format_progress(0, 0, 100, 1.0, 0.0), Contains("ETA -"));

  std::FILE* file = std::tmpfile();
  REQUIRE(file);
  data::progress_bar bar(100, file);
  CHECK_FALSE(bar.enabled());
  bar.start_epoch(0);
  for (std::size_t done = 10; done <= 100; done += 10) bar.update(done, 0.5);
  CHECK(std::ftell(file) == 0);
  std::fclose(file);
}

TEST_CASE("progress: on a terminal the line is redrawn in place and ends the epoch with a newline",
          "[data][progress]") {
  const int master = ::posix_openpt(O_RDWR | O_NOCTTY);
  if (master < 0 || ::grantpt(master) != 0 || ::unlockpt(master) != 0) {
    WARN("no pseudo-terminal here: skipped");
    if (master >= 0) ::close(master);
    return;
  }
  std::FILE* tty = std::fopen(::ptsname(master), "w");
  REQUIRE(tty);
  data::progress_bar bar(100, tty);
  CHECK(bar.enabled());
  bar.start_epoch(2);
  bar.update(50, 0.25);
  bar.update(100, 0.125);
  std::string seen;
  char chunk[512];
  while (seen.find("100/100") == std::string::npos || seen.find('\n') == std::string::npos) {
    pollfd p{master, POLLIN, 0};
    if (::poll(&p, 1, 5000) <= 0) break;  // a guard: nothing more is coming
    const auto got = ::read(master, chunk, sizeof chunk);
    if (got <= 0) break;
    seen.append(chunk, static_cast<std::size_t>(got));
  }
  std::fclose(tty);
  ::close(master);
  CHECK_THAT(seen, Contains("\repoch 2  50/100") && Contains("loss 0.2500") &&
                       Contains("\repoch 2  100/100 [====================] loss 0.1250"));
  CHECK(seen.back() == '\n');
}
