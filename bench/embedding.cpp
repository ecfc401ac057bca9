// bench/embedding.cpp: embedding()'s host kernels (backend/cpu/gather.hpp) at GPT-2's token table: weight
// [50257, 768] float, ids [8, 256] (W4's batch), random ids. Forward (check the ids, copy 2048
// rows) and the weight's gradient (check, counting sort, zero [V, D], add 2048 rows), best of 7, on
// 1 and 2 threads. Not registered in bench/CMakeLists.txt; build by hand:
//   g++ -std=c++20 -O2 -march=native -I include bench/embedding.cpp -o /tmp/bench_embedding -ldl -lpthread
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

#include <fusebox/fusebox.hpp>

namespace fb = fusebox;
int main() {
  const std::size_t V = 50257, D = 768, N = 8 * 256;
  std::vector<float> w(V * D), ids(N), out(N * D), g(N * D), dw(V * D);
  fb::detail::splitmix64 r{1};
  for (auto& x : w) x = static_cast<float>(r.uniform());
  for (auto& x : g) x = static_cast<float>(r.uniform());
  for (auto& x : ids) x = static_cast<float>(r.next() % V);
  fb::strided<float> sw{w.data(), fb::dims{2, {V, D}}, fb::contiguous_strides(fb::dims{2, {V, D}})};
  fb::strided<float> si{ids.data(), fb::dims{2, {8, 256}}, fb::contiguous_strides(fb::dims{2, {8, 256}})};
  fb::strided<float> so{out.data(), fb::dims{3, {8, 256, D}}, fb::contiguous_strides(fb::dims{3, {8, 256, D}})};
  fb::strided<float> sd{dw.data(), fb::dims{2, {V, D}}, fb::contiguous_strides(fb::dims{2, {V, D}})};
  for (unsigned t : {1u, 2u}) {
    auto& pool = fb::cpu::shared_pool(t);
    auto time = [&](auto&& f) {
      std::vector<double> ms;
      for (int k = 0; k < 7; ++k) {
        auto a = std::chrono::steady_clock::now();
        f();
        ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - a).count());
      }
      std::sort(ms.begin(), ms.end());
      return ms[0];
    };
    double f = time([&] { fb::cpu::embedding(sw, si, so, pool); });
    double b = time([&] { fb::cpu::embedding_backward(so, si, sd, pool); });
    std::printf("threads %u: forward %.3f ms, backward %.2f ms (best of 7)\n", t, f, b);
  }
}
