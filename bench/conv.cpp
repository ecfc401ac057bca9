// bench/conv.cpp: T2's convolution layers (BENCHMARKS.md: the Fashion-MNIST CNN) on the CPU at
// batch 128, fusebox compiled against libtorch eager where the peer is built:
//   T2_conv1  max_pool2d(relu(conv2d(x [128,1,28,28], w [32,1,5,5], b)), 2) -> [128,32,12,12]
//   T2_conv2  max_pool2d(relu(conv2d(x [128,32,12,12], w [64,32,5,5], b)), 2) -> [128,64,4,4]
// (padding 0: T2's flattened features are then the 1024 inputs of its linear layer;
// examples/fashion_cnn.hpp)
// each as a forward and as a training step (forward + gradients of x, w and b of sum(y * r): fusebox
// compile(value_and_grad(...)), libtorch autograd). fusebox runs the block as two kernels (conv with
// bias + relu as its epilogue, then the pool); the training step's plan is printed with --explain.
// Then T2_conv2's three convolution kernels alone through cpu::run_spatial (no epilogue), direct
// (backend/cpu/conv.hpp) and Winograd (backend/cpu/winograd.hpp) in the same run; their max rel diff column is
// Winograd's result against direct's. The blocks above use whatever FUSEBOX_CONV_WINOGRAD says.
// Then T2's first max pooling and its backward alone (backend/cpu/max_pool_2x2.hpp), against a copy of
// the same bytes in the same run.
//   bench_conv [--threads=1,2] [--out=results.jsonl] [--explain]
// Prints one JSON object per measurement (bench/harness.hpp), then a table.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include <fusebox/fusebox.hpp>

#include "harness.hpp"
#include "peers/torch_conv.hpp"

namespace fb = fusebox;
using namespace fusebox::bench;

namespace {

template <class T>
void fill(T& t, std::uint64_t seed, float lo, float hi) {
  fill_uniform(t.data(), t.size(), seed, lo, hi);
}

double max_rel_diff(const float* a, const float* b, std::size_t n) {
  double diff = 0, scale = 0;
  for (std::size_t i = 0; i < n; ++i) {
    diff = std::max(diff, std::fabs(static_cast<double>(a[i]) - b[i]));
    scale = std::max(scale, std::fabs(static_cast<double>(b[i])));
  }
  return scale > 0 ? diff / scale : diff;
}

struct row {
  std::string workload, system, mode;
  unsigned threads;
  timing t;
  double gflops, err;
  double gbps = -1;  // bytes the kernel must move / its median (the pooling rows)
};

template <std::size_t C, std::size_t H, std::size_t O>
void block(const char* name, unsigned threads, bool explain, const std::string& out, std::vector<row>& rows) {
  constexpr std::size_t N = 128, K = 5;
  fb::tensor<float, fb::shape<N, C, H, H>> x;
  fb::tensor<float, fb::shape<O, C, K, K>> w;
  fb::tensor<float, fb::shape<O>> b;
  constexpr std::size_t OH = H - K + 1;  // padding 0
  fb::tensor<float, fb::shape<N, O, OH / 2, OH / 2>> r;
  fill(x, 1, 0.f, 1.f);
  fill(w, 2, -0.2f, 0.2f);
  fill(b, 3, -0.1f, 0.1f);
  fill(r, 4, -1.f, 1.f);
  const double conv_flops = 2.0 * N * O * OH * OH * C * K * K;
  auto forward = [](const auto& xx, const auto& ww, const auto& bb) {
    return fb::max_pool2d<2>(fb::relu(fb::conv2d(xx, ww, bb)));
  };
  auto loss = [](const auto& xx, const auto& ww, const auto& bb, const auto& rr) {
    return fb::sum(fb::sum(fb::sum(fb::sum(fb::max_pool2d<2>(fb::relu(fb::conv2d(xx, ww, bb))) * rr))));
  };
  auto fwd = fb::compile(forward, {.threads = threads});
  auto step = fb::compile(fb::value_and_grad(loss, fb::wrt<0, 1, 2>), {.threads = threads});
  if (explain && threads == 2) {
    std::printf("%s forward:\n", name);
    fb::explain(forward, x, w, b);
    std::printf("%s training step:\n%s", name, step.describe(x, w, b, r).c_str());
  }
  auto y = fwd(x, w, b);
  std::vector<float> peer_y(y.size());
  std::string cfg;
  conv_block_problem prob{x.data(), w.data(), b.data(), static_cast<int>(N), static_cast<int>(C), static_cast<int>(H),
                          static_cast<int>(H), static_cast<int>(O), static_cast<int>(K), 0, peer_y.data()};
  const auto torch_fwd = torch_conv_block(prob, threads, cfg);
  double err = -1;
  if (torch_fwd) {
    torch_fwd();
    err = max_rel_diff(y.data(), peer_y.data(), y.size());
  }
  const auto emit_row = [&](const std::string& wl, const std::string& sys, const std::string& mode, const timing& t,
                            double flops, double e, const std::string& config) {
    record rec;
    rec.workload = wl, rec.system = sys, rec.mode = mode, rec.threads = threads, rec.config = config;
    rec.set(t);
    rec.flops = flops;
    rec.gflops = flops / t.median_us * 1e-3;
    rec.max_rel_err = e;
    emit(rec, out);
    rows.push_back({wl, sys, mode, threads, t, rec.gflops, e});
  };
  emit_row(std::string(name), "fusebox", "compiled", measure([&] { y = fwd(x, w, b); }), conv_flops, err,
           "static shapes; conv2d + epilogue(bias, relu), max_pool2d");
  if (torch_fwd) emit_row(std::string(name), "libtorch", "eager", measure(torch_fwd), conv_flops, err, cfg);
  // Training step: 3 convolutions' worth of flops (forward, input grad, weight grad).
  auto vg = step(x, w, b, r);
  emit_row(std::string(name) + "_train", "fusebox", "compiled", measure([&] { vg = step(x, w, b, r); }), 3 * conv_flops,
           -1, "value_and_grad wrt x, w, b");
  std::string tcfg;
  const auto torch_step = torch_conv_block_train(prob, r.data(), threads, tcfg);
  if (torch_step) emit_row(std::string(name) + "_train", "libtorch", "eager", measure(torch_step), 3 * conv_flops, -1, tcfg);
}

/// T2_conv2's forward, input gradient and weight gradient alone, direct and by Winograd.
void conv2_kernels(unsigned threads, const std::string& out, std::vector<row>& rows) {
  constexpr std::size_t N = 128, C = 32, H = 12, O = 64, K = 5, OH = H - K + 1;
  const fb::dims xd{4, {N, C, H, H}}, wd{4, {O, C, K, K}}, yd{4, {N, O, OH, OH}};
  std::vector<float> x(xd.size()), w(wd.size()), gy(yd.size());
  fill_uniform(x.data(), x.size(), 11, 0.f, 1.f);
  fill_uniform(w.data(), w.size(), 12, -0.2f, 0.2f);
  fill_uniform(gy.data(), gy.size(), 13, -1.f, 1.f);
  auto view = [](std::vector<float>& v, const fb::dims& d) { return fb::strided<float>{v.data(), d, fb::contiguous_strides(d)}; };
  const fb::window fw{fb::spatial_op::conv2d, int(K), int(K), 1, 1, 0, 0},
      iw{fb::spatial_op::conv2d_input_grad, 0, 0, 1, 1, 0, 0, int(H), int(H)},
      ww{fb::spatial_op::conv2d_weight_grad, int(K), int(K), 1, 1, 0, 0};
  struct kernel {
    const char* name;
    fb::window win;
    std::vector<float>*a, *b;
    fb::dims ad, bd, od;
  } kernels[] = {{"T2_conv2_kernel_forward", fw, &x, &w, xd, wd, yd},
                 {"T2_conv2_kernel_input_grad", iw, &gy, &w, yd, wd, xd},
                 {"T2_conv2_kernel_weight_grad", ww, &gy, &x, yd, xd, wd}};
  fb::cpu::thread_pool pool(threads);
  const double flops = 2.0 * N * O * OH * OH * C * K * K;
  const bool was = fb::cpu::conv_winograd();
  for (kernel& k : kernels) {
    std::vector<std::byte> ws(fb::cpu::spatial_workspace_bytes<float>(k.win, k.ad, k.bd, k.od, threads));
    std::vector<float> direct(k.od.size()), wino(k.od.size());
    for (const bool winograd : {false, true}) {
      fb::cpu::set_conv_winograd(winograd);
      std::vector<float>& o = winograd ? wino : direct;
      const auto a = view(*k.a, k.ad), b = view(*k.b, k.bd), y = view(o, k.od);
      const timing t = measure([&] { fb::cpu::run_spatial(k.win, a, b, y, pool, ws, fb::cpu::no_spatial_epilogue{}); });
      const double err = winograd ? max_rel_diff(wino.data(), direct.data(), wino.size()) : -1;
      record rec;
      rec.workload = k.name, rec.system = "fusebox", rec.mode = winograd ? "winograd" : "direct", rec.threads = threads;
      rec.config = "cpu::run_spatial, no epilogue";
      rec.set(t);
      rec.flops = flops;
      rec.gflops = flops / t.median_us * 1e-3;  // direct convolution's flops, for both
      rec.max_rel_err = err;
      emit(rec, out);
      rows.push_back({k.name, "fusebox", rec.mode, threads, t, rec.gflops, err});
    }
  }
  fb::cpu::set_conv_winograd(was);
}

/// T2's first pooling (max, 2x2, stride 2: [128, 32, 24, 24] -> [128, 32, 12, 12]) and its
/// backward alone through cpu::run_spatial, on ReLU'd activations (a quarter of them zero: ties),
/// against the floor of the same run: a copy moving the bytes the kernel must move (forward: x
/// read, y written; backward: x and g read, dx written), by std::memcpy on one thread.
void pool1_kernels(unsigned threads, const std::string& out, std::vector<row>& rows) {
  constexpr std::size_t N = 128, C = 32, H = 24, OH = H / 2;
  const fb::dims xd{4, {N, C, H, H}}, yd{4, {N, C, OH, OH}};
  std::vector<float> x(xd.size()), y(yd.size()), gy(yd.size()), dx(xd.size());
  fill_uniform(x.data(), x.size(), 21, -0.5f, 1.5f);
  for (float& v : x) v = v > 0 ? v : 0.f;
  fill_uniform(gy.data(), gy.size(), 22, -1.f, 1.f);
  auto view = [](std::vector<float>& v, const fb::dims& d) { return fb::strided<float>{v.data(), d, fb::contiguous_strides(d)}; };
  const fb::window fw{fb::spatial_op::max_pool2d, 2, 2, 2, 2, 0, 0},
      bw{fb::spatial_op::max_pool2d_backward, 2, 2, 2, 2, 0, 0, int(H), int(H)};
  fb::cpu::thread_pool pool(threads);
  const double fwd_bytes = 4.0 * (xd.size() + yd.size()), bwd_bytes = 4.0 * (2 * xd.size() + yd.size());
  struct kernel {
    const char* name;
    double bytes;
    std::function<void()> run;
  } kernels[] = {
      {"T2_pool1_kernel_forward", fwd_bytes,
       [&] { fb::cpu::run_spatial(fw, view(x, xd), fb::strided<float>{}, view(y, yd), pool, {}, fb::cpu::no_spatial_epilogue{}); }},
      {"T2_pool1_kernel_backward", bwd_bytes,
       [&] { fb::cpu::run_spatial(bw, view(gy, yd), view(x, xd), view(dx, xd), pool, {}, fb::cpu::no_spatial_epilogue{}); }}};
  for (kernel& k : kernels) {
    // The floor: a copy of half the bytes (a copy reads and writes each byte it copies).
    std::vector<char> src(static_cast<std::size_t>(k.bytes / 2), 1), dst(src.size());
    const timing floor = measure([&] { std::memcpy(dst.data(), src.data(), src.size()); });
    const timing t = measure(k.run);
    for (const bool is_limit : {false, true}) {
      const timing& m = is_limit ? floor : t;
      record rec;
      rec.workload = k.name, rec.system = is_limit ? "limit" : "fusebox", rec.mode = is_limit ? "copy" : "compiled";
      rec.threads = is_limit ? 1 : threads;
      rec.config = is_limit ? "std::memcpy of the same bytes, one thread" : "cpu::run_spatial, no epilogue";
      rec.set(m);
      rec.bytes = k.bytes;
      rec.traffic = "read_write";
      rec.floor_us = floor.median_us;
      rec.gbps = k.bytes / m.median_us * 1e-3;
      emit(rec, out);
      rows.push_back({k.name, rec.system, rec.mode, rec.threads, m, -1, -1, rec.gbps});
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<unsigned> threads{1, 2};
  std::string out;
  bool explain = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a.rfind("--threads=", 0) == 0) {
      threads.clear();
      for (std::size_t p = 10; p < a.size();) {
        const std::size_t q = a.find(',', p);
        threads.push_back(static_cast<unsigned>(std::stoul(a.substr(p, q - p))));
        p = q == std::string::npos ? a.size() : q + 1;
      }
    } else if (a.rfind("--out=", 0) == 0) {
      out = a.substr(6);
    } else if (a == "--explain") {
      explain = true;
    } else {
      std::fprintf(stderr, "usage: bench_conv [--threads=1,2] [--out=results.jsonl] [--explain]\n");
      return 2;
    }
  }
  std::vector<row> rows;
  for (const unsigned t : threads) {
    block<1, 28, 32>("T2_conv1", t, explain, out, rows);
    block<32, 12, 64>("T2_conv2", t, explain, out, rows);
  }
  for (const unsigned t : threads) conv2_kernels(t, out, rows);
  for (const unsigned t : threads) pool1_kernels(t, out, rows);
  table tab({"workload", "system", "mode", "threads", "median us", "p10 us", "p90 us", "GFLOP/s", "GB/s", "max rel diff"});
  for (const row& r : rows)
    tab.add({r.workload, r.system, r.mode, std::to_string(r.threads), fmt("%.0f", r.t.median_us), fmt("%.0f", r.t.p10_us),
             fmt("%.0f", r.t.p90_us), r.gflops < 0 ? std::string("") : fmt("%.1f", r.gflops),
             r.gbps < 0 ? std::string("") : fmt("%.1f", r.gbps), r.err < 0 ? std::string("") : fmt("%.1e", r.err)});
  tab.print();
}
