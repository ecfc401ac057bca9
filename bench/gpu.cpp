// bench/gpu.cpp: fusebox on the GPU (issue 4), BENCHMARKS.md's W1, W2 and W3 (float32, TF32 off)
// through compile() with cuda::tensor arguments, and the physical limits measured in the same run:
// a 1 GiB device-to-device copy (bytes read + written over time) and a cuBLASLt float32 GEMM
// (8192^3, no TF32).
//
// Timing: host wall time per compiled call, each call complete (the call synchronises its stream)
// — so fusebox's figure includes its host overhead, which torch_reference.py's CUDA-event figures
// for W1 and W2 do not (conservative for fusebox). Median after warm-up. Prints JSON lines
// (BENCHMARKS.md fields, system "fusebox" / "limit", mode "jit") then a table; compile_s is the
// first call (NVRTC cold unless the cache directory is warm), max_rel_err against a double
// reference on sampled rows.
//   bench_gpu [--quick]
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include <fusebox/fusebox.hpp>

#include "harness.hpp"

namespace fb = fusebox;
namespace bench = fusebox::bench;
using bench::fmt;

namespace {

auto w1 = [](auto x, auto w, auto b) { return fb::gelu(x * w + b) * fb::sigmoid(x); };
auto w2 = [](auto x, auto g, auto b) { return fb::layer_norm(fb::softmax(x), g, b, 1e-5f); };
auto w3 = [](auto x, auto w1_, auto b1, auto w2_, auto b2, auto w3_, auto b3) {
  auto h1 = fb::gelu(fb::matmul(x, w1_) + b1);
  auto h2 = fb::gelu(fb::matmul(h1, w2_) + b2);
  return fb::matmul(h2, w3_) + b3;
};

template <std::size_t... E>
using dev = fb::cuda::tensor<float, fb::shape<E...>>;
template <std::size_t... E>
using host = fb::tensor<float, fb::shape<E...>>;

std::vector<bench::record> records;
bench::table tab({"workload", "system", "mode", "median us", "floor us", "floor/time", "compile s", "max rel err", "note"});

void add(bench::record r) {
  tab.add({r.workload, r.system, r.mode, r.median_us > 0 ? fmt("%.1f", r.median_us) : "-",
           r.floor_us > 0 ? fmt("%.1f", r.floor_us) : "-",
           r.floor_us > 0 && r.median_us > 0 ? fmt("%.2f", r.floor_us / r.median_us) : "-",
           r.compile_s >= 0 ? fmt("%.2f", r.compile_s) : "-", r.max_rel_err >= 0 ? fmt("%.1e", r.max_rel_err) : "-",
           r.note});
  std::printf("%s\n", bench::to_json(r).c_str());
  std::fflush(stdout);
  records.push_back(std::move(r));
}

double seconds(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

/// ||y - r|| / ||r|| over the sampled rows (r holds only those rows, row-major).
double rel_err(const std::vector<double>& y, const std::vector<double>& r) {
  double num = 0, den = 0;
  for (std::size_t i = 0; i < r.size(); ++i) {
    num += (y[i] - r[i]) * (y[i] - r[i]);
    den += r[i] * r[i];
  }
  return std::sqrt(num / den);
}

double gelu(double u) { return 0.5 * u * (1.0 + std::erf(u / std::sqrt(2.0))); }

struct limits {
  double gbps = 0, f32_tflops = 0;
};

limits measure_limits(bool quick) {
  limits l;
  {  // device-to-device copy, 1 GiB
    const std::size_t bytes = std::size_t{1} << 30;
    fb::cuda::device_buffer a(bytes), b(bytes);
    fb::cuda::stream s;
    fb::cuda::event e0, e1;
    std::vector<double> ms;
    for (int i = 0; i < (quick ? 10 : 30); ++i) {
      e0.record(s.get());
      fb::cuda::copy_on_device_async(b.get(), a.get(), bytes, s.get());
      e1.record(s.get());
      e1.sync();
      if (i >= 3) ms.push_back(fb::cuda::elapsed_ms(e0, e1));
    }
    std::sort(ms.begin(), ms.end());
    l.gbps = 2.0 * bytes / (ms[ms.size() / 2] * 1e-3) / 1e9;
    bench::record r{"copy_1GiB", "limit", "cuMemcpyDtoD"};
    r.median_us = ms[ms.size() / 2] * 1e3;
    r.gbps = l.gbps;
    r.note = "bytes read + written";
    add(r);
  }
  {  // cuBLASLt float32 GEMM, TF32 off
    const std::size_t n = 8192;
    fb::tensor<float, fb::shape<fb::dyn, fb::dyn>> ha(n, n);
    ha.fill_random(1, -1.0f, 1.0f);
    fb::cuda::device_buffer a(n * n * 4), b(n * n * 4), c(n * n * 4);
    fb::cuda::copy_to_device(a.get(), ha.data(), n * n * 4);
    fb::cuda::copy_to_device(b.get(), ha.data(), n * n * 4);
    fb::cuda::stream s;
    fb::cuda::event e0, e1;
    fb::cuda::lt_problem p;
    p.m = p.n = p.k = n;
    std::vector<double> ms;
    for (int i = 0; i < (quick ? 5 : 12); ++i) {
      e0.record(s.get());
      fb::cuda::lt_matmul(p, a.get(), b.get(), c.get(), 0, s.get());
      e1.record(s.get());
      e1.sync();
      if (i >= 2) ms.push_back(fb::cuda::elapsed_ms(e0, e1));
    }
    std::sort(ms.begin(), ms.end());
    l.f32_tflops = 2.0 * n * n * n / (ms[ms.size() / 2] * 1e-3) / 1e12;
    bench::record r{"gemm_8192_f32", "limit", "cuBLASLt"};
    r.median_us = ms[ms.size() / 2] * 1e3;
    r.gflops = l.f32_tflops * 1e3;
    r.note = "CUBLAS_COMPUTE_32F (no TF32)";
    add(r);
  }
  return l;
}

template <class F>
bench::timing time_calls(F&& fn, bool quick) {
  bench::measure_config cfg;
  cfg.warmup = 10;
  cfg.min_iters = quick ? 30 : 100;
  cfg.min_seconds = quick ? 0.2 : 0.5;
  return bench::measure(fn, cfg);
}

}  // namespace

int main(int argc, char** argv) {
  bool quick = false;
  for (int i = 1; i < argc; ++i) quick = quick || std::string(argv[i]) == "--quick";
  if (!fb::cuda::available()) {
    std::fprintf(stderr, "bench_gpu: no CUDA device; nothing to measure\n");
    return 2;
  }
  const fb::cuda::device_info& devinfo = fb::cuda::current_device();
  std::fprintf(stderr, "bench_gpu: %s (%s, %d SMs)\n", devinfo.name.c_str(), devinfo.arch.c_str(), devinfo.sm_count);
  const limits lim = measure_limits(quick);

  {  // W1: elementwise, x [8192, 8192]
    constexpr std::size_t R = 8192, C = 8192;
    fb::tensor<float, fb::shape<fb::dyn, C>> x(R);
    host<C> w, b;
    x.fill_random(1);
    w.fill_random(2, 0.5f, 1.5f);
    b.fill_random(3);
    const fb::cuda::tensor<float, fb::shape<fb::dyn, C>> dx(x);
    const dev<C> dw(w), db(b);
    auto fast = fb::compile(w1);
    const auto t0 = std::chrono::steady_clock::now();
    auto y = fast(dx, dw, db);
    const double first = seconds(t0);
    const auto t = time_calls([&] { y = fast(dx, dw, db); }, quick);
    const auto yh = y.to_host();
    std::vector<double> got, ref;
    for (std::size_t i = 0; i < R; i += 97)
      for (std::size_t j = 0; j < C; ++j) {
        const double xv = x.flat(i * C + j), u = xv * w.flat(j) + b.flat(j);
        ref.push_back(gelu(u) / (1.0 + std::exp(-xv)));
        got.push_back(yh.flat(i * C + j));
      }
    bench::record r{"W1", "fusebox", "jit"};
    r.set(t);
    r.bytes = 2.0 * R * C * 4;
    r.floor_us = r.bytes / (lim.gbps * 1e9) * 1e6;
    r.compile_s = first;
    r.max_rel_err = rel_err(got, ref);
    r.gbps = r.bytes / (r.median_us * 1e-6) / 1e9;
    r.note = fmt("%.0f GB/s (%.0f%% of copy); host wall per call incl. output alloc", r.gbps, 100 * r.gbps / lim.gbps);
    add(r);
  }
  {  // W2: softmax + layer_norm, x [16384, 4096]
    constexpr std::size_t R = 16384, C = 4096;
    fb::tensor<float, fb::shape<fb::dyn, C>> x(R);
    host<C> g, b;
    x.fill_random(4, -4.0f, 4.0f);
    g.fill_random(5, 0.5f, 1.5f);
    b.fill_random(6);
    const fb::cuda::tensor<float, fb::shape<fb::dyn, C>> dx(x);
    const dev<C> dg(g), db(b);
    auto fast = fb::compile(w2);
    const auto t0 = std::chrono::steady_clock::now();
    auto y = fast(dx, dg, db);
    const double first = seconds(t0);
    const auto t = time_calls([&] { y = fast(dx, dg, db); }, quick);
    const auto yh = y.to_host();
    std::vector<double> got, ref;
    for (std::size_t i = 0; i < R; i += 331) {
      double mx = -1e300, s = 0, mean = 0, var = 0;
      std::vector<double> p(C);
      for (std::size_t j = 0; j < C; ++j) mx = std::max(mx, static_cast<double>(x.flat(i * C + j)));
      for (std::size_t j = 0; j < C; ++j) s += p[j] = std::exp(x.flat(i * C + j) - mx);
      for (auto& v : p) mean += v /= s;
      mean /= C;
      for (auto v : p) var += (v - mean) * (v - mean);
      var /= C;
      for (std::size_t j = 0; j < C; ++j) {
        ref.push_back((p[j] - mean) / std::sqrt(var + 1e-5) * g.flat(j) + b.flat(j));
        got.push_back(yh.flat(i * C + j));
      }
    }
    bench::record r{"W2", "fusebox", "jit"};
    r.set(t);
    r.bytes = 2.0 * R * C * 4;
    r.floor_us = r.bytes / (lim.gbps * 1e9) * 1e6;
    r.compile_s = first;
    r.max_rel_err = rel_err(got, ref);
    r.gbps = r.bytes / (r.median_us * 1e-6) / 1e9;
    r.note = fmt("%.0f GB/s (%.0f%% of copy)", r.gbps, 100 * r.gbps / lim.gbps);
    add(r);
  }
  {  // W3: MLP, float32 (TF32 off), batch 1, 32, 256
    host<1024, 4096> w1h;
    host<4096> b1h, b2h;
    host<4096, 4096> w2h;
    host<4096, 1024> w3h;
    host<1024> b3h;
    w1h.fill_random(11, -0.03f, 0.03f);
    b1h.fill_random(12);
    w2h.fill_random(13, -0.015f, 0.015f);
    b2h.fill_random(14);
    w3h.fill_random(15, -0.015f, 0.015f);
    b3h.fill_random(16);
    const dev<1024, 4096> dw1(w1h);
    const dev<4096> db1(b1h), db2(b2h);
    const dev<4096, 4096> dw2(w2h);
    const dev<4096, 1024> dw3(w3h);
    const dev<1024> db3(b3h);
    auto fast = fb::compile(w3);
    for (std::size_t batch : {std::size_t{1}, std::size_t{32}, std::size_t{256}}) {
      fb::tensor<float, fb::shape<fb::dyn, 1024>> x(batch);
      x.fill_random(batch);
      const fb::cuda::tensor<float, fb::shape<fb::dyn, 1024>> dx(x);
      const auto t0 = std::chrono::steady_clock::now();
      auto y = fast(dx, dw1, db1, dw2, db2, dw3, db3);
      const double first = seconds(t0);
      const auto t = time_calls([&] { y = fast(dx, dw1, db1, dw2, db2, dw3, db3); }, quick);
      const auto yh = y.to_host();
      // Double reference for the first row.
      std::vector<double> h1(4096), h2(4096), ref(1024), got(1024);
      for (std::size_t j = 0; j < 4096; ++j) {
        double s = b1h.flat(j);
        for (std::size_t k = 0; k < 1024; ++k) s += static_cast<double>(x.flat(k)) * w1h.flat(k * 4096 + j);
        h1[j] = gelu(s);
      }
      for (std::size_t j = 0; j < 4096; ++j) {
        double s = b2h.flat(j);
        for (std::size_t k = 0; k < 4096; ++k) s += h1[k] * w2h.flat(k * 4096 + j);
        h2[j] = gelu(s);
      }
      for (std::size_t j = 0; j < 1024; ++j) {
        double s = b3h.flat(j);
        for (std::size_t k = 0; k < 4096; ++k) s += h2[k] * w3h.flat(k * 1024 + j);
        ref[j] = s;
        got[j] = yh.flat(j);
      }
      const double flops = 2.0 * batch * (1024.0 * 4096 + 4096.0 * 4096 + 4096.0 * 1024);
      const double bytes = 4.0 * (1024.0 * 4096 + 4096.0 * 4096 + 4096.0 * 1024) + 4.0 * batch * (1024 + 4096 * 4 + 1024);
      bench::record r{"W3_b" + std::to_string(batch) + "_f32", "fusebox", "jit"};
      r.set(t);
      r.flops = flops;
      r.bytes = bytes;
      r.floor_us = std::max(bytes / (lim.gbps * 1e9), flops / (lim.f32_tflops * 1e12)) * 1e6;
      r.compile_s = first;
      r.max_rel_err = rel_err(got, ref);
      r.note = "host wall per call (synchronised); batch dyn, one program for all three";
      add(r);
    }
  }
  std::printf("\n# table (%s)\n", devinfo.name.c_str());
  tab.print();
  return 0;
}
