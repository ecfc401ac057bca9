// Tests for include/fusebox/backend/cpu/thread_pool.hpp.
#include <fusebox/backend/cpu/thread_pool.hpp>

#include <catch2/catch.hpp>

#include <atomic>
#include <cstddef>
#include <stdexcept>
#include <thread>
#include <vector>

using fusebox::cpu::thread_pool;

TEST_CASE("thread_pool: every task runs exactly once, on a valid worker", "[cpu][thread_pool]") {
  for (unsigned threads : {1u, 2u, 4u, 8u}) {
    thread_pool pool(threads);
    REQUIRE(pool.size() == threads);
    for (std::size_t tasks : {std::size_t{0}, std::size_t{1}, std::size_t{7}, std::size_t{1000}}) {
      std::vector<std::atomic<int>> runs(tasks);
      std::atomic<bool> bad_worker{false};
      pool.parallel_for(tasks, [&](std::size_t t, unsigned w) {
        if (w >= threads) bad_worker = true;
        runs[t].fetch_add(1, std::memory_order_relaxed);
      });
      INFO("threads " << threads << ", tasks " << tasks);
      CHECK_FALSE(bad_worker.load());
      for (std::size_t t = 0; t < tasks; ++t) REQUIRE(runs[t].load() == 1);
    }
  }
}

TEST_CASE("thread_pool: the caller is worker 0 and workers are distinct threads", "[cpu][thread_pool]") {
  thread_pool pool(4);
  const auto caller = std::this_thread::get_id();
  std::vector<std::thread::id> ids(pool.size());
  std::atomic<bool> mismatch{false};
  // Tasks that take a while, so that every worker gets some.
  pool.parallel_for(64, [&](std::size_t, unsigned w) {
    const auto me = std::this_thread::get_id();
    if (w == 0 && me != caller) mismatch = true;
    if (w != 0 && me == caller) mismatch = true;
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  });
  CHECK_FALSE(mismatch.load());
}

TEST_CASE("thread_pool: the first exception propagates after all tasks stop", "[cpu][thread_pool]") {
  for (unsigned threads : {1u, 2u, 4u}) {
    thread_pool pool(threads);
    std::atomic<int> running{0}, max_after_throw{0};
    std::atomic<bool> thrown{false};
    auto body = [&](std::size_t t, unsigned) {
      running.fetch_add(1);
      if (t == 3) {
        thrown = true;
        running.fetch_sub(1);
        throw std::runtime_error("task 3 failed");
      }
      std::this_thread::sleep_for(std::chrono::microseconds(50));
      running.fetch_sub(1);
    };
    CHECK_THROWS_WITH(pool.parallel_for(1000, body), "task 3 failed");
    // When parallel_for returned, nothing may still be running.
    CHECK(running.load() == 0);
    (void)max_after_throw;
    // The pool is usable afterwards.
    std::atomic<int> count{0};
    pool.parallel_for(100, [&](std::size_t, unsigned) { count.fetch_add(1); });
    CHECK(count.load() == 100);
  }
}

TEST_CASE("thread_pool: remaining tasks are skipped after an exception", "[cpu][thread_pool]") {
  thread_pool pool(2);
  std::atomic<int> ran{0};
  CHECK_THROWS_AS(pool.parallel_for(100000,
                                    [&](std::size_t t, unsigned) {
                                      ran.fetch_add(1);
                                      if (t == 0) throw std::logic_error("stop");
                                      std::this_thread::sleep_for(std::chrono::microseconds(10));
                                    }),
                  std::logic_error);
  CHECK(ran.load() < 100000);
}

TEST_CASE("thread_pool: nested parallel_for runs serially on the calling thread", "[cpu][thread_pool]") {
  for (unsigned threads : {1u, 2u, 4u}) {
    thread_pool pool(threads);
    thread_pool other(3);
    std::vector<std::atomic<int>> runs(16 * 32);
    std::atomic<bool> wrong_thread{false}, wrong_worker{false};
    pool.parallel_for(16, [&](std::size_t outer, unsigned w) {
      const auto me = std::this_thread::get_id();
      pool.parallel_for(32, [&](std::size_t inner, unsigned w2) {
        if (std::this_thread::get_id() != me) wrong_thread = true;
        if (w2 != w) wrong_worker = true;
        runs[outer * 32 + inner].fetch_add(1);
      });
      // A different pool, called from inside a task, also runs inline (no deadlock, no
      // oversubscription).
      other.parallel_for(4, [&](std::size_t, unsigned w3) {
        if (std::this_thread::get_id() != me) wrong_thread = true;
        if (w3 >= other.size()) wrong_worker = true;
      });
    });
    CHECK_FALSE(wrong_thread.load());
    CHECK_FALSE(wrong_worker.load());
    for (auto& r : runs) REQUIRE(r.load() == 1);
  }
}

TEST_CASE("thread_pool: many rapid tiny calls do not hang", "[cpu][thread_pool]") {
  for (unsigned threads : {2u, 4u}) {
    thread_pool pool(threads);
    std::atomic<std::size_t> total{0};
    constexpr std::size_t calls = 100000;
    for (std::size_t c = 0; c < calls; ++c)
      pool.parallel_for(c % 5 + 1, [&](std::size_t, unsigned) { total.fetch_add(1, std::memory_order_relaxed); });
    std::size_t expected = 0;
    for (std::size_t c = 0; c < calls; ++c) expected += c % 5 + 1;
    CHECK(total.load() == expected);
  }
}

TEST_CASE("thread_pool: calls after the workers went to sleep still complete", "[cpu][thread_pool]") {
  thread_pool pool(3);
  for (int round = 0; round < 5; ++round) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));  // well past the spin time
    std::atomic<int> count{0};
    pool.parallel_for(9, [&](std::size_t, unsigned) { count.fetch_add(1); });
    CHECK(count.load() == 9);
  }
}

TEST_CASE("thread_pool: concurrent callers from outside threads are serialised", "[cpu][thread_pool]") {
  thread_pool pool(2);
  std::atomic<long> total{0};
  std::vector<std::thread> callers;
  for (int c = 0; c < 3; ++c)
    callers.emplace_back([&] {
      for (int i = 0; i < 2000; ++i) pool.parallel_for(5, [&](std::size_t, unsigned) { total.fetch_add(1); });
    });
  for (auto& t : callers) t.join();
  CHECK(total.load() == 3 * 2000 * 5);
}

TEST_CASE("thread_pool: shared_pool returns one pool per thread count", "[cpu][thread_pool]") {
  auto& a = fusebox::cpu::shared_pool(2);
  auto& b = fusebox::cpu::shared_pool(2);
  auto& c = fusebox::cpu::shared_pool(3);
  CHECK(&a == &b);
  CHECK(&a != &c);
  CHECK(a.size() == 2);
  CHECK(c.size() == 3);
}

namespace {
// A caller's own pool, as an application has one (options::pool): `threads` std::threads per job,
// each taking tasks from a shared counter with its own worker index, the calling thread waiting.
struct callers_threads {
  unsigned threads;
  std::atomic<int> jobs{0};
  static void parallel_for(void* self, std::size_t tasks, fusebox::cpu::task_ref task) {
    auto& me = *static_cast<callers_threads*>(self);
    me.jobs.fetch_add(1);
    std::atomic<std::size_t> next{0};
    std::vector<std::thread> team;
    for (unsigned w = 0; w < me.threads; ++w)
      team.emplace_back([&, w] {
        for (std::size_t t; (t = next.fetch_add(1)) < tasks;) task(t, w);
      });
    for (auto& t : team) t.join();
  }
};
}  // namespace

TEST_CASE("thread_pool: on the caller's pool every task runs once, nested calls run serially, errors come back",
          "[cpu][thread_pool]") {
  callers_threads caller{3};
  const fusebox::cpu::external_pool ext{3, &caller, &callers_threads::parallel_for};
  thread_pool pool(ext);
  CHECK(pool.size() == 3);
  std::vector<std::atomic<int>> runs(500);
  std::vector<std::atomic<int>> busy(3);
  std::atomic<bool> shared_worker{false}, nested_wrong{false};
  pool.parallel_for(runs.size(), [&](std::size_t t, unsigned w) {
    if (busy[w].fetch_add(1) != 0) shared_worker = true;  // two tasks at once on one worker index
    // Nested work runs here, in order, as this worker.
    std::size_t seen = 0;
    pool.parallel_for(4, [&](std::size_t n, unsigned nw) {
      if (n != seen++ || nw != w) nested_wrong = true;
    });
    runs[t].fetch_add(1);
    busy[w].fetch_sub(1);
  });
  CHECK(caller.jobs.load() == 1);  // the nested calls did not reach the caller's pool
  CHECK_FALSE(shared_worker.load());
  CHECK_FALSE(nested_wrong.load());
  for (auto& r : runs) REQUIRE(r.load() == 1);

  std::atomic<int> after_error{0};
  CHECK_THROWS_WITH(pool.parallel_for(300,
                                      [&](std::size_t t, unsigned) {
                                        if (t == 5) throw std::runtime_error("task 5 failed");
                                        after_error.fetch_add(1);
                                      }),
                    "task 5 failed");
  CHECK(after_error.load() < 300);

  const fusebox::cpu::external_pool none{2, nullptr, nullptr};
  CHECK_THROWS_WITH(thread_pool(none), Catch::Contains("no parallel_for"));
}
