// bench/gemm.cpp — fusebox::cpu::gemm against OpenBLAS on the W3c MLP layer shapes.
//
// Shapes: Linear 1024->4096, 4096->4096, 4096->1024 (x[M, K] @ W), M = 1, 32, 256, with W stored
// [K, N] ("kn", row-major) and [N, K] ("nk", used transposed); threads 1 and 2. Peers: OpenBLAS
// cblas_sgemm (and cblas_sgemv at M = 1) with openblas_set_num_threads(threads), same buffers.
// Limits measured in the same run with the same thread count: STREAM-style read (the better of
// a plain read and an eight-stream read with prefetch), copy and triad over 256 MiB (fusebox
// thread pool), and a 2048^3 OpenBLAS sgemm as the arithmetic peak.
// floor = max(bytes / read bandwidth, flops / peak). Each measurement: median of >= 20 timed
// runs (50 for short ones) after >= 10 warm-up calls, ours and the peers alternating in blocks.
//
// Build: g++ -std=c++20 -O3 -march=native -I include bench/gemm.cpp
//          -I/usr/include/x86_64-linux-gnu/openblas-pthread -lopenblas -pthread -o bench_gemm
// Run:   ./bench_gemm [--quick | --limits | --t1 | --stream [rounds] | --stream-pages [rounds]]
//
// --t1: instead, T1's eight products (the MLP 784 -> 256 -> 128 -> 10 of train_fashion_mnist at
// batch 128: three forward x W^T, three weight gradients dY^T x, two input gradients dY W; W stored
// [out, in] as nn::linear and torch store it), each against cblas_sgemm with the same transposes,
// threads 1 and 2, and their sum: how fast a training step's products can be at this ISA
// (docs/benchmarks.md, run AY).
//
// --stream [rounds]: case 4's loop orders and K blocks (gemm_choice::stream_kc) on W3c b256's layers,
// W stored [N, K], against cblas_sgemm and the blocked path (docs/benchmarks.md, run AZ).
//
// --stream-pages [rounds]: case 4's packed A^T layouts (gemm_choice::stream_panel_major) with the
// workspace on 4 KiB and on 2 MiB pages, on W3c b256's two layers with K = 4096 (run BA).
#include <fusebox/backend/cpu/gemm.hpp>
#include <fusebox/backend/cpu/thread_pool.hpp>

#include <cblas.h>
#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <thread>
#include <vector>

extern "C" void openblas_set_num_threads(int);
extern "C" char* openblas_get_corename(void);

namespace {

using clock_type = std::chrono::steady_clock;
namespace fc = fusebox::cpu;

struct free_deleter {
  void operator()(void* p) const noexcept { std::free(p); }
};
template <class T>
using buffer = std::unique_ptr<T[], free_deleter>;

template <class T>
buffer<T> make_buffer(std::size_t n) {
  const std::size_t bytes = (n * sizeof(T) + 63) / 64 * 64;
  return buffer<T>(static_cast<T*>(std::aligned_alloc(64, bytes)));
}

void fill_random(float* p, std::size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(-1.f, 1.f);
  for (std::size_t i = 0; i < n; ++i) p[i] = d(rng);
}

double seconds_since(clock_type::time_point t0) {
  return std::chrono::duration<double>(clock_type::now() - t0).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// Times several callables in alternating blocks (A's runs, B's runs, A's runs, ...), each
// block after its own warm-up, so that drift on a shared machine hits all of them alike.
// Blocks rather than single runs, with a pause between them: OpenBLAS's idle threads spin
// for about 2^28 cycles after a call and would otherwise take the second core from the next
// system's threads. Returns each callable's median in seconds. Each block's warm-up also lasts at
// least min_warmup_s: on the 2-core Zen 3 VM a two-thread call ran at one thread's speed for about
// 30 ms after the pause (the second core coming back from idle; a loop without OpenBLAS shows it
// too), longer than the 20 warm-up calls of a short product (docs/benchmarks.md, run AY).
std::vector<double> measure_interleaved(const std::vector<std::function<void()>>& fns, int warmup, int runs,
                                        int rounds = 2, double min_warmup_s = 0.1) {
  std::vector<std::vector<double>> t(fns.size());
  for (int round = 0; round < rounds; ++round)
    for (std::size_t i = 0; i < fns.size(); ++i) {
      if (fns.size() > 1) std::this_thread::sleep_for(std::chrono::milliseconds(150));
      const auto warm_start = clock_type::now();
      for (int w = 0; w < (round == 0 ? warmup : std::max(2, warmup / 4)) || seconds_since(warm_start) < min_warmup_s;
           ++w)
        fns[i]();
      for (int r = 0; r < (runs + rounds - 1) / rounds; ++r) {
        const auto t0 = clock_type::now();
        fns[i]();
        t[i].push_back(seconds_since(t0));
      }
    }
  std::vector<double> med;
  for (auto& v : t) med.push_back(median(v));
  return med;
}

struct limits {
  double read_gbps, copy_gbps, triad_gbps, peak_gflops;
};

volatile float sink;

limits measure_limits(unsigned threads, bool quick) {
  fc::thread_pool& pool = fc::shared_pool(threads);
  const std::size_t n = (256u << 20) / sizeof(float);  // 256 MiB per array
  auto a = make_buffer<float>(n), b = make_buffer<float>(n), c = make_buffer<float>(n);
  pool.parallel_for(64, [&](std::size_t t, unsigned) {  // first touch by the threads that use it
    const std::size_t lo = n * t / 64, hi = n * (t + 1) / 64;
    for (std::size_t i = lo; i < hi; ++i) a[i] = 1.0f + float(i % 7), b[i] = 2.0f, c[i] = 0.0f;
  });
  using V = xsimd::batch<float>;
  constexpr std::size_t W = V::size;
  const std::size_t chunks = 64 * threads;
  std::vector<float> partial(chunks);
  auto read = [&] {
    pool.parallel_for(chunks, [&](std::size_t t, unsigned) {
      const std::size_t lo = n * t / chunks / (4 * W) * (4 * W), hi = n * (t + 1) / chunks / (4 * W) * (4 * W);
      V s0(0.f), s1(0.f), s2(0.f), s3(0.f);
      for (std::size_t i = lo; i < hi; i += 4 * W) {
        s0 += V::load_aligned(&a[i]);
        s1 += V::load_aligned(&a[i + W]);
        s2 += V::load_aligned(&a[i + 2 * W]);
        s3 += V::load_aligned(&a[i + 3 * W]);
      }
      partial[t] = xsimd::hadd((s0 + s1) + (s2 + s3));
    });
    sink = partial[0];
  };
  // The same, as eight concurrent streams per task with software prefetch into L2 (what the
  // GEMV kernels do); the better of the two reads is the machine's read bandwidth.
  auto read8 = [&] {
    pool.parallel_for(chunks, [&](std::size_t t, unsigned) {
      const std::size_t lo = n * t / chunks / (8 * W) * (8 * W), hi = n * (t + 1) / chunks / (8 * W) * (8 * W);
      const std::size_t part = (hi - lo) / 8;
      V s[8] = {V(0.f), V(0.f), V(0.f), V(0.f), V(0.f), V(0.f), V(0.f), V(0.f)};
      for (std::size_t i = 0; i < part; i += W) {
        for (std::size_t q = 0; q < 8; ++q) {
          const float* p = &a[lo + q * part + i];
          if (i % 16 == 0 && i + 256 < part) __builtin_prefetch(p + 256, 0, 2);
          s[q] += V::load_unaligned(p);
        }
      }
      partial[t] = xsimd::hadd(((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7])));
    });
    sink = partial[0];
  };
  auto copy = [&] {
    pool.parallel_for(chunks, [&](std::size_t t, unsigned) {
      const std::size_t lo = n * t / chunks, hi = n * (t + 1) / chunks;
      std::memcpy(&c[lo], &a[lo], (hi - lo) * sizeof(float));
    });
  };
  auto triad = [&] {
    pool.parallel_for(chunks, [&](std::size_t t, unsigned) {
      const std::size_t lo = n * t / chunks / W * W, hi = n * (t + 1) / chunks / W * W;
      const V s(3.0f);
      for (std::size_t i = lo; i < hi; i += W)
        xsimd::fma(s, V::load_aligned(&b[i]), V::load_aligned(&a[i])).store_aligned(&c[i]);
    });
  };
  const int runs = quick ? 5 : 15;
  const auto med = measure_interleaved({read, read8, copy, triad}, 2, runs);
  limits l;
  const double bytes = double(n) * sizeof(float);
  l.read_gbps = bytes / std::min(med[0], med[1]) * 1e-9;
  l.copy_gbps = 2 * bytes / med[2] * 1e-9;
  l.triad_gbps = 3 * bytes / med[3] * 1e-9;

  openblas_set_num_threads(int(threads));
  const int s = 2048;
  auto A = make_buffer<float>(std::size_t(s) * s), B = make_buffer<float>(std::size_t(s) * s),
       C = make_buffer<float>(std::size_t(s) * s);
  fill_random(A.get(), std::size_t(s) * s, 1);
  fill_random(B.get(), std::size_t(s) * s, 2);
  auto big = [&] {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, s, s, s, 1.f, A.get(), s, B.get(), s, 0.f, C.get(), s);
  };
  const double t = measure_interleaved({big}, 2, quick ? 3 : 7)[0];
  l.peak_gflops = 2.0 * s * s * s / t * 1e-9;
  return l;
}

struct row {
  std::string workload, layout, peer_op;
  std::size_t M, K, N;
  unsigned threads;
  double ours_us, peer_us, sgemm_us, floor_us;
  double max_rel_diff;
};

void print_json(const char* workload, const char* system, const char* mode, const row& r, double us, double flops,
                double bytes) {
  std::printf(
      "{\"workload\": \"%s\", \"system\": \"%s\", \"mode\": \"%s\", \"threads\": %u, \"M\": %zu, \"K\": %zu, "
      "\"N\": %zu, \"layout\": \"%s\", \"median_us\": %.1f, \"floor_us\": %.1f, \"gflops\": %.2f, \"gbps\": %.2f, "
      "\"max_rel_err\": %.2e}\n",
      workload, system, mode, r.threads, r.M, r.K, r.N, r.layout.c_str(), us, r.floor_us, flops / us * 1e-3,
      bytes / us * 1e-3, r.max_rel_diff);
}

std::string load_average() {
  char buf[128] = {};
  if (FILE* f = std::fopen("/proc/loadavg", "r")) {
    if (!std::fgets(buf, sizeof buf, f)) buf[0] = 0;
    std::fclose(f);
  }
  std::string s(buf);
  return s.substr(0, s.find(' ', s.find(' ', s.find(' ') + 1) + 1));  // the 1, 5 and 15 minute loads
}

// T1's products, each C[M, N] = op(A) op(B) with row-major storage: a transposed A is the output
// gradient dY[K, M] read as dY^T, a transposed B the weight W[N, K] read as W^T.
struct t1_product {
  const char* name;
  std::size_t M, K, N;
  bool trans_a, trans_b;
};

int run_t1() {
  const std::size_t batch = 128;
  const t1_product products[] = {
      {"fwd1 x@W1^T", batch, 784, 256, false, true},   {"fwd2 h1@W2^T", batch, 256, 128, false, true},
      {"fwd3 h2@W3^T", batch, 128, 10, false, true},   {"dW3 dY3^T@h2", 10, batch, 128, true, false},
      {"dH2 dY3@W3", batch, 10, 128, false, false},   {"dW2 dY2^T@h1", 128, batch, 256, true, false},
      {"dH1 dY2@W2", batch, 128, 256, false, false},  {"dW1 dY1^T@x", 256, batch, 784, true, false}};
  for (unsigned threads : {1u, 2u}) {
    fc::thread_pool& pool = fc::shared_pool(threads);
    openblas_set_num_threads(int(threads));
    double ours_sum = 0, peer_sum = 0, flops_sum = 0;
    for (const t1_product& p : products) {
      const std::size_t M = p.M, K = p.K, N = p.N;
      auto A = make_buffer<float>(M * K), B = make_buffer<float>(K * N), C = make_buffer<float>(M * N),
           Cp = make_buffer<float>(M * N);
      fill_random(A.get(), M * K, unsigned(M + K));
      fill_random(B.get(), K * N, unsigned(K + N + 1));
      // Stored A: [M, K], or [K, M] when transposed; B: [K, N], or [N, K] when transposed.
      const fc::matrix_view<float> Av = p.trans_a ? fc::matrix_view<float>{A.get(), 1, std::ptrdiff_t(M)}
                                                  : fc::matrix_view<float>{A.get(), std::ptrdiff_t(K), 1};
      const fc::matrix_view<float> Bv = p.trans_b ? fc::matrix_view<float>{B.get(), 1, std::ptrdiff_t(K)}
                                                  : fc::matrix_view<float>{B.get(), std::ptrdiff_t(N), 1};
      const std::size_t ws_bytes = fc::gemm_workspace_bytes<float>(1, M, N, K, threads);
      auto ws = make_buffer<std::byte>(std::max<std::size_t>(ws_bytes, 64));
      auto ours = [&] {
        fc::gemm<float>(1, M, N, K, Av, 0, Bv, 0, C.get(), std::ptrdiff_t(N), 0, fc::no_epilogue{}, pool,
                        {ws.get(), ws_bytes});
      };
      auto sgemm = [&] {
        cblas_sgemm(CblasRowMajor, p.trans_a ? CblasTrans : CblasNoTrans, p.trans_b ? CblasTrans : CblasNoTrans,
                    int(M), int(N), int(K), 1.f, A.get(), p.trans_a ? int(M) : int(K), B.get(),
                    p.trans_b ? int(K) : int(N), 0.f, Cp.get(), int(N));
      };
      const auto med = measure_interleaved({ours, sgemm}, 50, 200, 4);
      double maxdiff = 0, maxref = 0;
      for (std::size_t i = 0; i < M * N; ++i) {
        maxdiff = std::max(maxdiff, double(std::abs(C[i] - Cp[i])));
        maxref = std::max(maxref, double(std::abs(Cp[i])));
      }
      const double flops = 2.0 * double(M) * double(N) * double(K);
      std::printf("{\"workload\": \"T1 %s\", \"threads\": %u, \"M\": %zu, \"K\": %zu, \"N\": %zu, "
                  "\"fusebox_us\": %.2f, \"openblas_us\": %.2f, \"fusebox_gflops\": %.1f, \"openblas_gflops\": "
                  "%.1f, \"max_rel_diff\": %.1e}\n",
                  p.name, threads, M, K, N, med[0] * 1e6, med[1] * 1e6, flops / med[0] * 1e-9, flops / med[1] * 1e-9,
                  maxdiff / maxref);
      ours_sum += med[0], peer_sum += med[1], flops_sum += flops;
    }
    // 469 steps an epoch (60,000 / 128).
    std::printf("{\"workload\": \"T1 products\", \"threads\": %u, \"fusebox_us\": %.1f, \"openblas_us\": %.1f, "
                "\"ratio\": %.3f, \"fusebox_gflops\": %.1f, \"openblas_gflops\": %.1f, \"fusebox_s_per_epoch\": %.3f, "
                "\"openblas_s_per_epoch\": %.3f}\n",
                threads, ours_sum * 1e6, peer_sum * 1e6, ours_sum / peer_sum, flops_sum / ours_sum * 1e-9,
                flops_sum / peer_sum * 1e-9, ours_sum * 469, peer_sum * 469);
    std::fflush(stdout);
  }
  return 0;
}

// One of W3c b256's layers for case 4: x [M, K] and W stored [N, K], random, and the results Y
// (fusebox) and Ys (cblas_sgemm, the peer).
struct nk_layer {
  std::size_t M, K, N;
  buffer<float> W, X, Y, Ys;
  nk_layer(std::size_t m, std::size_t k, std::size_t n)
      : M(m), K(k), N(n), W(make_buffer<float>(k * n)), X(make_buffer<float>(m * k)), Y(make_buffer<float>(m * n)),
        Ys(make_buffer<float>(m * n)) {
    fill_random(W.get(), K * N, unsigned(K + N));
    fill_random(X.get(), M * K, unsigned(M));
  }
  // Y = X W^T through gemm_with with `choice`.
  void ours(const fc::detail::gemm_choice& choice, fc::thread_pool& pool, std::span<std::byte> ws) {
    const fc::matrix_view<float> Xv{X.get(), std::ptrdiff_t(K), 1}, Wv{W.get(), 1, std::ptrdiff_t(K)};
    fc::no_epilogue none;
    fc::epilogue_ref<float> ref(none);
    fc::detail::gemm_with<float>(choice, 1, M, N, K, Xv, 0, Wv, 0, Y.get(), std::ptrdiff_t(N), 0, ref, pool, ws);
  }
  // Ys = X W^T through cblas_sgemm.
  void peer() {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(M), int(N), int(K), 1.f, X.get(), int(K), W.get(),
                int(K), 0.f, Ys.get(), int(N));
  }
};

// One round's line: OpenBLAS's rate, then each variant's median over OpenBLAS's (med's last).
void print_ratios(const char* mode, const nk_layer& l, unsigned threads, int round, const std::vector<double>& med,
                  const std::vector<const char*>& names) {
  std::printf("%s M %zu K %zu N %zu threads %u round %d: openblas %.1f GFLOP/s;", mode, l.M, l.K, l.N, threads, round,
              2.0 * double(l.M) * double(l.N) * double(l.K) / med.back() * 1e-9);
  for (std::size_t i = 0; i < names.size(); ++i) std::printf(" %s %.3fx", names[i], med[i] / med.back());
  std::printf("\n");
  std::fflush(stdout);
}

// --stream: case 4 (C^T = B^T A^T, W stored [N, K]) on W3c b256's layers at M = 256, each loop
// order and K block against the blocked path and cblas_sgemm, threads 1 and 2, `rounds` times
// over (each round alternates all of them): which variant a machine wants, in one run.
int run_stream(int rounds) {
  namespace fd = fc::detail;
  const std::size_t M = 256;
  const std::size_t layers[][2] = {{4096, 1024}, {4096, 4096}, {1024, 4096}};  // {K, N}
  struct variant {
    const char* name;
    fd::gemm_choice choice;
  };
  const variant variants[] = {
      {"default", {fd::gemm_path::stream_bt}},
      {"sliver_first_1024", {fd::gemm_path::stream_bt, false, 4, fd::stream_order::sliver_first, 1024}},
      {"kblock_first_256", {fd::gemm_path::stream_bt, false, 4, fd::stream_order::k_block_first, 256}},
      {"kblock_first_512", {fd::gemm_path::stream_bt, false, 4, fd::stream_order::k_block_first, 512}},
      {"kblock_first_1024", {fd::gemm_path::stream_bt, false, 4, fd::stream_order::k_block_first, 1024}},
      {"kblock_first_2048", {fd::gemm_path::stream_bt, false, 4, fd::stream_order::k_block_first, 2048}},
      {"blocked", {fd::gemm_path::blocked}},
  };
  for (unsigned threads : {1u, 2u}) {
    fc::thread_pool& pool = fc::shared_pool(threads);
    openblas_set_num_threads(int(threads));
    for (auto& layer : layers) {
      nk_layer l(M, layer[0], layer[1]);
      const std::size_t K = l.K, N = l.N;
      std::size_t ws_bytes = 64;
      for (const variant& v : variants)
        ws_bytes = std::max(ws_bytes, fd::layout_for<float>(v.choice.path, M, N, K).total(threads));
      auto ws = make_buffer<std::byte>(ws_bytes);
      std::vector<std::function<void()>> fns;
      std::vector<const char*> names;
      for (const variant& v : variants) {
        fns.push_back([&, choice = v.choice] { l.ours(choice, pool, {ws.get(), ws_bytes}); });
        names.push_back(v.name);
      }
      fns.push_back([&] { l.peer(); });
      fns.back()();
      for (std::size_t i = 0; i < std::size(variants); ++i) {  // each variant's result against OpenBLAS's
        fns[i]();
        double maxdiff = 0, maxref = 0;
        for (std::size_t e = 0; e < M * N; ++e) {
          maxdiff = std::max(maxdiff, double(std::abs(l.Y[e] - l.Ys[e])));
          maxref = std::max(maxref, double(std::abs(l.Ys[e])));
        }
        if (!(maxdiff <= 1e-5 * maxref)) {
          std::printf("stream %s M %zu K %zu N %zu: max difference %.2e of %.2e\n", variants[i].name, M, K, N,
                      maxdiff, maxref);
          return 1;
        }
      }
      for (int round = 0; round < rounds; ++round)
        print_ratios("stream", l, threads, round, measure_interleaved(fns, 3, 10, 2), names);
    }
  }
  return 0;
}

// Memory of `bytes` on its own mapping: 2 MiB-aligned and advised MADV_HUGEPAGE (`huge`; THP is
// "madvise" on the machines measured) or MADV_NOHUGEPAGE, touched; null when mmap fails.
struct mapping {
  void* base = MAP_FAILED;
  std::size_t len = 0;
  std::byte* at = nullptr;
  mapping(std::size_t bytes, bool huge) {
    constexpr std::size_t two_mib = std::size_t(2) << 20;
    len = (bytes + 2 * two_mib - 1) / two_mib * two_mib;
    base = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (base == MAP_FAILED) return;
    const auto u = reinterpret_cast<std::uintptr_t>(base);
    at = static_cast<std::byte*>(base) + ((two_mib - u % two_mib) % two_mib);
    madvise(at, bytes, huge ? MADV_HUGEPAGE : MADV_NOHUGEPAGE);
    std::memset(at, 1, bytes);
  }
  ~mapping() {
    if (base != MAP_FAILED) munmap(base, len);
  }
  mapping(const mapping&) = delete;
  mapping& operator=(const mapping&) = delete;
};

// kB of anonymous huge pages this process holds (/proc/self/smaps_rollup), -1 if unknown.
long anon_huge_kb() {
  std::FILE* f = std::fopen("/proc/self/smaps_rollup", "r");
  if (!f) return -1;
  char line[256];
  long kb = -1;
  while (std::fgets(line, sizeof line, f))
    if (std::sscanf(line, "AnonHugePages: %ld kB", &kb) == 1) break;
  std::fclose(f);
  return kb;
}

// --stream-pages: case 4's packed A^T, panel by panel (each panel's whole K, so at K = 4096 the
// panels of one K block lie 256 KiB apart) or K block by K block (one K block's panels contiguous),
// with the workspace on 4 KiB pages or on 2 MiB pages, against cblas_sgemm, on W3c b256's two
// layers with K > kc_stream, threads 1 and 2 (docs/benchmarks.md, run BA).
int run_stream_pages(int rounds) {
  namespace fd = fc::detail;
  const std::size_t M = 256;
  const std::size_t layers[][2] = {{4096, 1024}, {4096, 4096}};  // {K, N}
  struct variant {
    const char* name;
    bool panel_major, huge;
  };
  const variant variants[] = {{"panel_4k", true, false},
                              {"block_4k", false, false},
                              {"panel_2m", true, true},
                              {"block_2m", false, true}};
  for (unsigned threads : {1u, 2u}) {
    fc::thread_pool& pool = fc::shared_pool(threads);
    openblas_set_num_threads(int(threads));
    for (auto& layer : layers) {
      nk_layer l(M, layer[0], layer[1]);
      const std::size_t K = l.K, N = l.N;
      const std::size_t ws_bytes = fd::layout_for<float>(fd::gemm_path::stream_bt, M, N, K).total(threads);
      // Fresh mappings each round: which physical pages a workspace gets (and so how its lines fall
      // on the L2's sets) is a draw per mapping, which one mapping would repeat in every round.
      std::unique_ptr<mapping> small, large;
      auto remap = [&] {
        small.reset();
        large.reset();
        const long huge_before = anon_huge_kb();
        small = std::make_unique<mapping>(ws_bytes, false);
        large = std::make_unique<mapping>(ws_bytes, true);
        std::printf("# workspace %zu bytes; AnonHugePages %ld kB before, %ld kB after mapping\n", ws_bytes,
                    huge_before, anon_huge_kb());
        return small->at && large->at;
      };
      if (!remap()) {
        std::printf("stream-pages: mmap failed\n");
        return 1;
      }
      std::vector<std::function<void()>> fns;
      std::vector<const char*> names;
      for (const variant& v : variants) {
        fns.push_back([&, v] {
          fd::gemm_choice choice{fd::gemm_path::stream_bt};
          choice.stream_panel_major = v.panel_major;
          l.ours(choice, pool, {v.huge ? large->at : small->at, ws_bytes});
        });
        names.push_back(v.name);
      }
      fns.push_back([&] { l.peer(); });
      fns.back()();
      std::vector<float> first;
      for (std::size_t i = 0; i < std::size(variants); ++i) {  // the layouts give the same bits
        fns[i]();
        if (i == 0) first.assign(l.Y.get(), l.Y.get() + M * N);
        else if (std::memcmp(first.data(), l.Y.get(), M * N * sizeof(float)) != 0) {
          std::printf("stream-pages %s M %zu K %zu N %zu: not the bits of %s\n", variants[i].name, M, K, N,
                      variants[0].name);
          return 1;
        }
      }
      for (int round = 0; round < rounds; ++round) {
        if (round > 0 && !remap()) {
          std::printf("stream-pages: mmap failed\n");
          return 1;
        }
        print_ratios("stream-pages", l, threads, round, measure_interleaved(fns, 3, 10, 2), names);
      }
      std::printf("# AnonHugePages %ld kB\n", anon_huge_kb());
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string opt = argc > 1 ? argv[1] : "";
  const bool quick = opt == "--quick", limits_only = opt == "--limits";
  const std::string load_at_start = load_average();
  std::printf("# OpenBLAS core: %s; fusebox vector: %s x %zu floats\n", openblas_get_corename(),
              xsimd::default_arch::name(), xsimd::batch<float>::size);
  if (opt == "--t1") return run_t1();
  if (opt == "--stream") return run_stream(argc > 2 ? std::atoi(argv[2]) : 3);
  if (opt == "--stream-pages") return run_stream_pages(argc > 2 ? std::atoi(argv[2]) : 3);

  const std::size_t layers[][2] = {{1024, 4096}, {4096, 4096}, {4096, 1024}};  // {K, N}
  const std::size_t Ms[] = {1, 32, 256};
  std::vector<row> rows;
  std::vector<limits> lim_by_threads;

  for (unsigned threads : {1u, 2u}) {
    const limits lim = measure_limits(threads, quick);
    lim_by_threads.push_back(lim);
    std::printf(
        "{\"workload\": \"stream\", \"system\": \"limit\", \"mode\": \"read\", \"threads\": %u, \"gbps\": %.2f}\n"
        "{\"workload\": \"stream\", \"system\": \"limit\", \"mode\": \"copy\", \"threads\": %u, \"gbps\": %.2f}\n"
        "{\"workload\": \"stream\", \"system\": \"limit\", \"mode\": \"triad\", \"threads\": %u, \"gbps\": %.2f}\n"
        "{\"workload\": \"sgemm_2048\", \"system\": \"limit\", \"mode\": \"openblas\", \"threads\": %u, "
        "\"gflops\": %.2f}\n",
        threads, lim.read_gbps, threads, lim.copy_gbps, threads, lim.triad_gbps, threads, lim.peak_gflops);
    std::fflush(stdout);
    if (limits_only) continue;
    fc::thread_pool& pool = fc::shared_pool(threads);
    openblas_set_num_threads(int(threads));

    for (auto& layer : layers) {
      const std::size_t K = layer[0], N = layer[1];
      auto W = make_buffer<float>(K * N);
      fill_random(W.get(), K * N, unsigned(K + N));
      for (std::size_t M : Ms) {
        auto X = make_buffer<float>(M * K), Y = make_buffer<float>(M * N), Yp = make_buffer<float>(M * N),
             Ys = make_buffer<float>(M * N);
        fill_random(X.get(), M * K, unsigned(M));
        const std::size_t ws_bytes = fc::gemm_workspace_bytes<float>(1, M, N, K, threads);
        auto ws = make_buffer<std::byte>(std::max<std::size_t>(ws_bytes, 64));
        for (const char* layout : {"kn", "nk"}) {
          const bool nk = layout[0] == 'n';
          // W[K, N] row-major, or W stored [N, K] and used transposed: swapped strides.
          const fc::matrix_view<float> Bv = nk ? fc::matrix_view<float>{W.get(), 1, std::ptrdiff_t(K)}
                                               : fc::matrix_view<float>{W.get(), std::ptrdiff_t(N), 1};
          auto ours = [&] {
            fc::gemm<float>(1, M, N, K, {X.get(), std::ptrdiff_t(K), 1}, 0, Bv, 0, Y.get(), std::ptrdiff_t(N), 0,
                            fc::no_epilogue{}, pool, {ws.get(), ws_bytes});
          };
          auto sgemm = [&] {
            cblas_sgemm(CblasRowMajor, CblasNoTrans, nk ? CblasTrans : CblasNoTrans, int(M), int(N), int(K), 1.f,
                        X.get(), int(K), W.get(), nk ? int(K) : int(N), 0.f, Ys.get(), int(N));
          };
          auto sgemv = [&] {
            if (nk)
              cblas_sgemv(CblasRowMajor, CblasNoTrans, int(N), int(K), 1.f, W.get(), int(K), X.get(), 1, 0.f,
                          Yp.get(), 1);
            else
              cblas_sgemv(CblasRowMajor, CblasTrans, int(K), int(N), 1.f, W.get(), int(N), X.get(), 1, 0.f,
                          Yp.get(), 1);
          };
          const double flops = 2.0 * double(M) * double(N) * double(K);
          const double bytes = double(K * N + M * K + M * N) * sizeof(float);
          const bool heavy = flops > 1e9;
          const int warmup = quick ? 2 : (heavy ? 10 : 20);
          const int runs = quick ? 5 : (heavy ? 20 : 50);
          std::vector<std::function<void()>> fns{ours, sgemm};
          if (M == 1) fns.push_back(sgemv);
          const auto med = measure_interleaved(fns, warmup, runs);

          row r;
          r.layout = layout;
          r.M = M, r.K = K, r.N = N, r.threads = threads;
          r.ours_us = med[0] * 1e6;
          r.sgemm_us = med[1] * 1e6;
          r.peer_us = M == 1 ? std::min(med[1], med[2]) * 1e6 : r.sgemm_us;
          r.peer_op = M == 1 ? (med[2] < med[1] ? "sgemv" : "sgemm") : "sgemm";
          r.floor_us = std::max(bytes / (lim.read_gbps * 1e9), flops / (lim.peak_gflops * 1e9)) * 1e6;
          // Agreement with OpenBLAS, relative to the largest output.
          const float* ref = M == 1 ? Yp.get() : Ys.get();
          double maxdiff = 0, maxref = 0;
          for (std::size_t i = 0; i < M * N; ++i) {
            maxdiff = std::max(maxdiff, double(std::abs(Y[i] - ref[i])));
            maxref = std::max(maxref, double(std::abs(ref[i])));
          }
          r.max_rel_diff = maxdiff / maxref;
          r.workload = "gemm_M" + std::to_string(M) + "_K" + std::to_string(K) + "_N" + std::to_string(N);
          print_json(r.workload.c_str(), "fusebox", "eager", r, r.ours_us, flops, bytes);
          print_json(r.workload.c_str(), "openblas", "sgemm", r, r.sgemm_us, flops, bytes);
          if (M == 1) print_json(r.workload.c_str(), "openblas", "sgemv", r, med[2] * 1e6, flops, bytes);
          std::fflush(stdout);
          rows.push_back(r);
        }
      }
    }
  }

  std::printf("\n");
  for (unsigned t = 0; t < lim_by_threads.size(); ++t)
    std::printf("threads %u: read %.1f GB/s, copy %.1f GB/s, triad %.1f GB/s, OpenBLAS sgemm 2048^3 %.1f GFLOP/s\n",
                t + 1, lim_by_threads[t].read_gbps, lim_by_threads[t].copy_gbps, lim_by_threads[t].triad_gbps,
                lim_by_threads[t].peak_gflops);
  std::printf("\nB layout: kn = W[K, N] row-major, nk = W stored [N, K] and used transposed. OpenBLAS best = the\n"
              "faster of sgemm and sgemv at M = 1. ours/OB = time ratio (< 1: fusebox faster).\n\n");
  std::printf("%-4s %-5s %-5s %-3s %-3s | %10s %10s %10s | %7s %6s | %9s %7s\n", "M", "K", "N", "B", "thr",
              "ours us", "sgemm us", "OB best us", "ours/OB", "(OB)", "floor us", "t/floor");
  for (const auto& r : rows)
    std::printf("%-4zu %-5zu %-5zu %-3s %-3u | %10.1f %10.1f %10.1f | %7.2f %6s | %9.1f %7.2f\n", r.M, r.K, r.N,
                r.layout.c_str(), r.threads, r.ours_us, r.sgemm_us, r.peer_us, r.ours_us / r.peer_us,
                r.peer_op.c_str(), r.floor_us, r.ours_us / r.floor_us);
  std::printf("\nload average at start: %s, at end: %s\n", load_at_start.c_str(), load_average().c_str());
  return 0;
}
