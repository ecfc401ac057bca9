// bench/w5c.hpp: W5c's model and batch (BENCHMARKS.md: the W3 MLP, Linear 1024 -> 4096, GELU,
// 4096 -> 4096, GELU, 4096 -> 1024, biases, torch's [out, in] weight layout; batch 64), and the
// two timing helpers its benchmarks share (bench/train.cpp, bench/memory_budget.cpp).
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <vector>

#include <fusebox/nn/nn.hpp>

namespace bench_w5c {

using clock_type = std::chrono::steady_clock;
inline double us_since(clock_type::time_point t0) {
  return std::chrono::duration<double, std::micro>(clock_type::now() - t0).count();
}
inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

using w3 = fusebox::nn::sequential<fusebox::nn::linear<1024, 4096>, fusebox::nn::gelu_layer,
                                   fusebox::nn::linear<4096, 4096>, fusebox::nn::gelu_layer,
                                   fusebox::nn::linear<4096, 1024>>;
constexpr std::size_t batch = 64;

}  // namespace bench_w5c
