// A compiled call into caller-owned outputs allocates nothing once warm: the arena and workspace
// are sized by the plan (a constant of the program) and kept. Counted by replacing operator new.
#include <atomic>
#include <cstdlib>
#include <new>

#include <catch2/catch.hpp>

#include <fusebox/fusebox.hpp>

namespace {
std::atomic<long> heap_allocations{0};
}

void* operator new(std::size_t n) {
  heap_allocations.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }

namespace fb = fusebox;

TEST_CASE("a warm compiled call into caller-owned outputs does not touch the heap", "[compile]") {
  auto model = [](auto x, auto w, auto b, auto g) {
    auto h = fb::gelu(fb::matmul(x, w) + b);
    return fb::layer_norm(fb::softmax(h), g, b, 1e-5f);
  };
  fb::tensor<float, fb::shape<33, 40>> x;
  fb::tensor<float, fb::shape<40, 24>> w;
  fb::tensor<float, fb::shape<24>> b, g;
  fb::tensor<float, fb::shape<33, 24>> out;
  x.fill_random(1);
  w.fill_random(2);
  b.fill_random(3);
  g.fill_random(4);
  auto fast = fb::compile(model, {.threads = 2});
  fast.run(out, x, w, b, g);  // first call: sizes the arena and workspace
  const float first = out(5, 7);
  const long before = heap_allocations.load();
  for (int i = 0; i < 20; ++i) fast.run(out, x, w, b, g);
  CHECK(heap_allocations.load() - before == 0);
  CHECK(out(5, 7) == first);
  // The counter does count: an eager call allocates its results.
  const long eager_before = heap_allocations.load();
  auto y = fb::eager(model)(x, w, b, g);
  CHECK(heap_allocations.load() > eager_before);
  CHECK(y(5, 7) == Approx(first).epsilon(1e-5));
  STATIC_REQUIRE(decltype(fast)::arena_bytes<decltype(x), decltype(w), decltype(b), decltype(g)>() > 0);
}
