// Tests for include/fusebox/backend/cuda/pinned_pool.hpp and uploader.hpp, and the data loader's
// pin_memory on a GPU: buffers are recycled and capped, storage may outlive its pool, and a
// double-buffered upload pipeline on a side stream delivers every batch intact even when the
// work stream is slower than the copies (the case where an unordered copy would overwrite a slot
// before the step that reads it ran).
//
// Every case skips, saying so, where no GPU is present (CI); the loader's fallback there is tested
// in tests/data/loader.cpp.
#include <catch2/catch.hpp>

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "fusebox/backend/cuda/driver.hpp"
#include "fusebox/backend/cuda/memory.hpp"
#include "fusebox/backend/cuda/pinned_pool.hpp"
#include "fusebox/backend/cuda/uploader.hpp"
#include "fusebox/data/loader.hpp"

namespace cuda = fusebox::cuda;

namespace {

bool skip_without_cuda() {
  if (cuda::available()) return false;
  std::string why;
  try {
    cuda::current_device();
  } catch (const std::exception& e) {
    why = e.what();
  }
  WARN("no CUDA device: skipped (" << why << ")");
  return true;
}

}  // namespace

TEST_CASE("pinned_pool recycles buffers by size, caps idle memory, and outlives nothing it hands out",
          "[cuda]") {
  if (skip_without_cuda()) return;
  cuda::pinned_pool pool(3 * 4096);
  {
    auto a = pool.allocate(4096);
    std::memset(a.get(), 1, 4096);  // host memory, writable
    CHECK(pool.allocations() == 1);
  }
  CHECK(pool.idle_bytes() == 4096);
  auto b = pool.allocate(4096);  // the same buffer again
  CHECK(pool.allocations() == 1);
  CHECK(pool.reuses() == 1);
  auto c = pool.allocate(8192);  // another size: a new buffer
  CHECK(pool.allocations() == 2);
  auto d = pool.allocate(4096);
  CHECK(pool.allocations() == 3);
  b.reset();
  c.reset();  // 4096 + 8192 idle: at the cap
  CHECK(pool.idle_bytes() == 3 * 4096);
  d.reset();  // over the cap: freed, not kept
  CHECK(pool.idle_bytes() == 3 * 4096);
  pool.release_idle();
  CHECK(pool.idle_bytes() == 0);
  CHECK(pool.allocate(0) == nullptr);

  // Several threads at once; storage that outlives its pool is freed when dropped.
  fusebox::storage_ptr survivor;
  {
    cuda::pinned_pool short_lived;
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; ++t)
      threads.emplace_back([&short_lived] {
        for (int i = 0; i < 20; ++i) {
          auto s = short_lived.allocate(1024);
          std::memset(s.get(), i, 1024);
        }
      });
    for (auto& t : threads) t.join();
    CHECK(short_lived.allocations() <= 4);
    CHECK(short_lived.allocations() + short_lived.reuses() == 80);
    survivor = short_lived.allocate(2048);
  }
  std::memset(survivor.get(), 7, 2048);
  survivor.reset();
}

TEST_CASE("uploader: double-buffered batches on a side stream arrive intact behind a slow work stream",
          "[cuda]") {
  if (skip_without_cuda()) return;
  constexpr std::size_t n = 1 << 16, batches = 24;
  cuda::pinned_pool pool;
  std::mt19937 gen(11);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<std::vector<float>> expected(batches, std::vector<float>(n));
  for (auto& b : expected)
    for (auto& x : b) x = dist(gen);

  cuda::device_buffer slot[2] = {cuda::device_buffer(n * sizeof(float)), cuda::device_buffer(n * sizeof(float))};
  cuda::device_buffer out(batches * n * sizeof(float));
  // The "step": a large copy that keeps the work stream busy far longer than an upload, then the
  // slot copied into this batch's row of `out`.
  const std::size_t busy_bytes = std::size_t{256} << 20;
  cuda::device_buffer busy_from(busy_bytes), busy_to(busy_bytes);
  cuda::fill_bytes(out.get(), 0xFF, batches * n * sizeof(float));
  auto& work = cuda::work_stream();

  auto staged = [&](std::size_t k) {
    auto s = pool.allocate(n * sizeof(float));
    std::memcpy(s.get(), expected[k].data(), n * sizeof(float));
    return s;
  };
  cuda::uploader up;
  auto next = up.copy(slot[0].get(), staged(0), n * sizeof(float));
  for (std::size_t k = 0; k < batches; ++k) {
    up.use(next);
    if (k + 1 < batches) next = up.copy(slot[(k + 1) % 2].get(), staged(k + 1), n * sizeof(float));
    cuda::copy_on_device_async(busy_to.get(), busy_from.get(), busy_bytes, work.get());
    cuda::copy_on_device_async(out.get() + k * n * sizeof(float), slot[k % 2].get(), n * sizeof(float), work.get());
  }
  CHECK(up.held() >= 1);  // the work stream is far behind: copies (and their sources) are still held
  cuda::synchronize();
  up.sync();
  CHECK(up.held() == 0);
  // Every source came back to the pool once its copy had run.
  CHECK(pool.idle_bytes() == pool.allocations() * n * sizeof(float));

  std::vector<float> got(batches * n);
  cuda::copy_to_host(got.data(), out.get(), got.size() * sizeof(float));
  std::size_t wrong = 0;
  for (std::size_t k = 0; k < batches; ++k)
    for (std::size_t i = 0; i < n; ++i) wrong += got[k * n + i] != expected[k][i];
  CHECK(wrong == 0);

  CHECK_THROWS_WITH(up.copy(slot[0].get(), nullptr, 16), Catch::Matchers::Contains("empty host storage"));
}

TEST_CASE("loader: pin_memory with no allocator stages batches in the shared pinned pool", "[cuda]") {
  if (skip_without_cuda()) return;
  struct numbers {
    std::size_t size() const { return 40; }
    std::pair<std::array<float, 3>, std::int64_t> get(std::size_t i) const {
      return {{static_cast<float>(i), 0.5f * static_cast<float>(i), -1.0f}, static_cast<std::int64_t>(i)};
    }
  };
  const std::size_t before = cuda::shared_pinned_pool().allocations() + cuda::shared_pinned_pool().reuses();
  fusebox::data::loader loader(numbers{}, {.batch_size = 8, .num_workers = 2, .pin_memory = true});
  CHECK(loader.pinned());
  std::size_t rows = 0;
  for (auto& [x, id] : loader)
    for (std::size_t i = 0; i < id.shape[0]; ++i, ++rows) {
      CHECK(x.values()[3 * i] == static_cast<float>(id.values()[i]));
      CHECK(x.values()[3 * i + 1] == 0.5f * static_cast<float>(id.values()[i]));
    }
  CHECK(rows == 40);
  CHECK(cuda::shared_pinned_pool().allocations() + cuda::shared_pinned_pool().reuses() - before == 10);
}
