// Tests for include/fusebox/backend/cpu/conv.hpp's kernels, called through backend/cpu/spatial.hpp's run_spatial
// (the switch both executors use): the implicit-GEMM forward, the input gradient (packed wᵀ, then
// col2im) and the weight gradient (the batch summed in the C tiles), each against a naive double
// reference on fresh random inputs, every element; float and double (different MR / NR, so
// different panel remainders); shapes where O is not a multiple of MR and the pixels not a
// multiple of NR, stride 2 with padding, non-contiguous x, g and w (the general packing paths),
// unit strides without padding (the direct gather and col2im);
// the forward epilogue called once for each output row run; results equal bit for bit on 1, 2
// and 3 threads. The same checks for backend/cpu/winograd.hpp's three kernels (float 5x5 at unit
// stride), on shapes that qualify: T2's second layer, padding, tiles cut by the edge,
// O and C not multiples of MR and NR, strided operands, a batch not a multiple of the chunks.
//
// Tolerance: a result is a sum of K products (K = C*KH*KW, O*KH*KW or N*OH*OW): its float error
// is below K * eps * sum|products| (a loose bound); a wrong index or a missed term is off by a
// whole product (> 1/16 here: inputs are in +-[0.25, 1]). Winograd's error is not a per-term
// bound (each result mixes 64 transformed products, with constants up to 5.25 and 16): its bound
// is winograd_ulps * eps * sum|products|, measured below it on these cases (the worst element
// is printed; a wrong index or a missed tile is off by whole products here too).
#include <fusebox/backend/cpu/spatial.hpp>

#include <catch2/catch.hpp>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

namespace {

namespace cpu = fusebox::cpu;
using fusebox::dims;
using fusebox::spatial_op;
using fusebox::strided;
using fusebox::window;

template <class T>
std::vector<T> random_values(std::size_t n, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> mag(0.25, 1.0);
  std::vector<T> v(n);
  for (auto& x : v) x = T(rng() & 1 ? mag(rng) : -mag(rng));
  return v;
}

/// A rank-4 operand of logical shape d whose storage is laid out with the dimensions permuted by
/// `order` (order[0] outermost) and the innermost stored dimension spread `spread` elements apart:
/// order {0,1,2,3} with spread 1 is contiguous.
template <class T>
struct operand4 {
  std::vector<T> storage;
  strided<T> view;
  T at(std::size_t a, std::size_t b, std::size_t c, std::size_t d) const {
    return view.data[std::ptrdiff_t(a) * view.stride[0] + std::ptrdiff_t(b) * view.stride[1] +
                     std::ptrdiff_t(c) * view.stride[2] + std::ptrdiff_t(d) * view.stride[3]];
  }
};
template <class T>
operand4<T> make4(std::array<std::size_t, 4> d, std::array<int, 4> order, std::size_t spread, std::uint64_t seed) {
  operand4<T> op;
  std::ptrdiff_t step = std::ptrdiff_t(spread);
  std::array<std::ptrdiff_t, 4> st{};
  for (int i = 3; i >= 0; --i) {
    st[order[i]] = step;
    step *= std::ptrdiff_t(d[order[i]]);
  }
  op.storage = random_values<T>(std::size_t(step), seed);
  op.view.data = op.storage.data();
  op.view.shape = dims{4, {d[0], d[1], d[2], d[3]}};
  for (int i = 0; i < 4; ++i) op.view.stride[i] = st[i];
  return op;
}

struct conv_case {
  std::size_t n, c, h, w, o, kh, kw;
  int s, p;
  bool strided_operands;  // x, g and w not contiguous
  std::size_t oh() const { return (h + 2 * p - kh) / s + 1; }
  std::size_t ow() const { return (w + 2 * p - kw) / s + 1; }
};

template <class T>
std::vector<T> run_op(spatial_op op, const conv_case& k, const strided<T>& a, const strided<T>& b, dims out_shape,
                      unsigned threads, std::vector<int>* row_runs = nullptr) {
  cpu::thread_pool pool(threads);
  const window win{op, int(k.kh), int(k.kw), k.s, k.s, k.p, k.p, int(k.h), int(k.w)};
  std::vector<std::byte> ws(cpu::spatial_workspace_bytes<T>(win, a.shape, b.shape, out_shape, threads));
  std::vector<T> out(out_shape.size(), std::numeric_limits<T>::quiet_NaN());
  strided<T> o{out.data(), out_shape, fusebox::contiguous_strides(out_shape)};
  const std::size_t row_len = out_shape[3];
  if (row_runs) row_runs->assign(out_shape.size(), 0);
  cpu::run_spatial(win, a, b, o, pool, ws, [&](std::size_t row, std::size_t j0, std::size_t n) {
    if (row_runs)
      for (std::size_t j = j0; j < j0 + n; ++j) ++(*row_runs)[row * row_len + j];
  });
  return out;
}

constexpr double winograd_ulps = 64;

template <class T>
void check_close(const std::vector<T>& got, const std::vector<double>& want, const std::vector<double>& mag,
                 std::size_t terms, const char* what) {
  const double eps = std::numeric_limits<T>::epsilon();
  std::size_t bad = 0;
  double worst = 0;  // error in units of eps * sum|products|
  REQUIRE(got.size() == want.size());
  for (std::size_t i = 0; i < got.size(); ++i) {
    worst = std::max(worst, std::abs(double(got[i]) - want[i]) / (eps * mag[i] + 1e-300));
    const double tol = double(terms) * eps * mag[i] + 1e-30;
    if (!(std::abs(double(got[i]) - want[i]) <= tol)) {
      if (bad < 5) UNSCOPED_INFO(what << " element " << i << ": got " << got[i] << ", want " << want[i] << " +- " << tol);
      ++bad;
    }
  }
  UNSCOPED_INFO(what << ": worst error " << worst << " eps * sum|products|");
  CHECK(bad == 0);
}

/// `winograd`: the forward and weight gradient must run by Winograd (backend/cpu/winograd.hpp), checked
/// against winograd_ulps; otherwise every kernel runs direct.
template <class T>
void check_case(const conv_case& k, std::uint64_t seed, bool winograd = false) {
  cpu::set_conv_winograd(winograd);
  INFO((winograd ? "Winograd: " : "direct: ") << "N " << k.n << " C " << k.c << " H " << k.h << " W " << k.w << " O "
                                               << k.o << " K " << k.kh << "x" << k.kw << " stride " << k.s << " padding "
                                               << k.p << (k.strided_operands ? " (strided operands)" : ""));
  const std::size_t OH = k.oh(), OW = k.ow();
  const std::array<int, 4> plain{0, 1, 2, 3}, odd{2, 0, 3, 1};
  const auto x = make4<T>({k.n, k.c, k.h, k.w}, k.strided_operands ? odd : plain, k.strided_operands ? 2 : 1, seed);
  const auto w = make4<T>({k.o, k.c, k.kh, k.kw}, k.strided_operands ? odd : plain, 1, seed + 1);
  const auto g = make4<T>({k.n, k.o, OH, OW}, k.strided_operands ? odd : plain, k.strided_operands ? 3 : 1, seed + 2);
  const dims ys{4, {k.n, k.o, OH, OW}}, xs{4, {k.n, k.c, k.h, k.w}}, wsh{4, {k.o, k.c, k.kh, k.kw}};

  // The references, in double: every (n, o, oh, ow, c, kh, kw) term lands in y, dx and dw.
  std::vector<double> y(ys.size(), 0.0), ym(ys.size(), 0.0), dx(xs.size(), 0.0), dxm(xs.size(), 0.0),
      dw(wsh.size(), 0.0), dwm(wsh.size(), 0.0);
  for (std::size_t n = 0; n < k.n; ++n)
    for (std::size_t o = 0; o < k.o; ++o)
      for (std::size_t i = 0; i < OH; ++i)
        for (std::size_t j = 0; j < OW; ++j)
          for (std::size_t c = 0; c < k.c; ++c)
            for (std::size_t u = 0; u < k.kh; ++u)
              for (std::size_t v = 0; v < k.kw; ++v) {
                const long ih = long(i) * k.s - k.p + long(u), iw = long(j) * k.s - k.p + long(v);
                if (ih < 0 || iw < 0 || ih >= long(k.h) || iw >= long(k.w)) continue;
                const double xv = x.at(n, c, std::size_t(ih), std::size_t(iw)), wv = w.at(o, c, u, v),
                             gv = g.at(n, o, i, j);
                const std::size_t yi = ((n * k.o + o) * OH + i) * OW + j,
                                  xi = ((n * k.c + c) * k.h + std::size_t(ih)) * k.w + std::size_t(iw),
                                  wi = ((o * k.c + c) * k.kh + u) * k.kw + v;
                y[yi] += xv * wv;
                ym[yi] += std::abs(xv * wv);
                dx[xi] += gv * wv;
                dxm[xi] += std::abs(gv * wv);
                dw[wi] += gv * xv;
                dwm[wi] += std::abs(gv * xv);
              }

  const window fw{spatial_op::conv2d, int(k.kh), int(k.kw), k.s, k.s, k.p, k.p},
      iw{spatial_op::conv2d_input_grad, 0, 0, k.s, k.s, k.p, k.p, int(k.h), int(k.w)},
      wgw{spatial_op::conv2d_weight_grad, int(k.kh), int(k.kw), k.s, k.s, k.p, k.p};
  REQUIRE(cpu::runs_winograd(fw, x.view, w.view, strided<T>{nullptr, ys, {}}) == winograd);
  REQUIRE(cpu::runs_winograd(iw, g.view, w.view, strided<T>{nullptr, xs, {}}) == winograd);
  REQUIRE(cpu::runs_winograd(wgw, g.view, x.view, strided<T>{nullptr, wsh, {}}) == winograd);
  const std::size_t fterms = winograd ? std::size_t(winograd_ulps) : k.c * k.kh * k.kw,
                    iterms = winograd ? std::size_t(winograd_ulps) : k.o * k.kh * k.kw,
                    wterms = winograd ? std::size_t(winograd_ulps) : k.n * OH * OW;

  std::vector<int> runs;
  const auto y1 = run_op<T>(spatial_op::conv2d, k, x.view, w.view, ys, 1, &runs);
  check_close(y1, y, ym, fterms, "conv2d");
  std::size_t miscovered = 0;
  for (int r : runs) miscovered += r != 1;
  CHECK(miscovered == 0);  // the epilogue saw every output element exactly once

  const auto dx1 = run_op<T>(spatial_op::conv2d_input_grad, k, g.view, w.view, xs, 1);
  check_close(dx1, dx, dxm, iterms, "conv2d_input_grad");

  const auto dw1 = run_op<T>(spatial_op::conv2d_weight_grad, k, g.view, x.view, wsh, 1);
  check_close(dw1, dw, dwm, wterms, "conv2d_weight_grad");

  for (unsigned threads : {2u, 3u}) {
    INFO(threads << " threads");
    CHECK(run_op<T>(spatial_op::conv2d, k, x.view, w.view, ys, threads) == y1);
    CHECK(run_op<T>(spatial_op::conv2d_input_grad, k, g.view, w.view, xs, threads) == dx1);
    CHECK(run_op<T>(spatial_op::conv2d_weight_grad, k, g.view, x.view, wsh, threads) == dw1);
  }
  cpu::set_conv_winograd(true);
}

const conv_case cases[] = {
    {3, 32, 12, 12, 64, 5, 5, 1, 0, false},  // T2's second layer (P = 64: whole panels in float)
    {2, 1, 28, 28, 32, 5, 5, 1, 0, false},   // T2's first layer (CK = 25, P = 576)
    {2, 3, 11, 9, 13, 3, 2, 2, 1, false},    // O % MR, P % NR, stride 2, padding, KH != KW
    {5, 4, 7, 10, 9, 3, 3, 1, 2, true},      // padding wider than a row's reach; strided x, g, w
    {1, 2, 5, 5, 3, 5, 5, 1, 0, false},      // one output pixel
    {2, 3, 9, 7, 5, 3, 3, 1, 0, false},      // unit strides, no padding: runs of 5 pixels across panels
    {2, 3, 9, 7, 5, 3, 3, 1, 0, true},       // the same with strided operands (the general gather)
};

const conv_case winograd_cases[] = {
    {3, 32, 12, 12, 64, 5, 5, 1, 0, false},  // T2's second layer: 4 whole tiles an image (channels in lanes)
    {1, 32, 12, 12, 64, 5, 5, 1, 0, false},  // the same at batch 1
    {1, 19, 11, 11, 21, 5, 5, 1, 1, true},   // channels in lanes: C % L, O % L, O % NR, 9 tiles (> MR), padding, strided
    {2, 9, 11, 13, 10, 5, 5, 1, 2, true},    // padding 2, tiles cut by both edges, O % MR, C % NR, strided
    {9, 8, 9, 9, 8, 5, 5, 1, 1, false},      // 9 images in 8 weight-gradient chunks; 7x7: partial tiles
};

}  // namespace

TEST_CASE("cpu conv kernels: Winograd forward and gradients, against double references", "[cpu][conv]") {
  std::uint64_t seed = 411;
  for (const auto& k : winograd_cases) check_case<float>(k, seed += 10, true);
}

TEST_CASE("cpu conv kernels: float, against double references, every element", "[cpu][conv]") {
  std::uint64_t seed = 11;
  for (const auto& k : cases) check_case<float>(k, seed += 10);
}

TEST_CASE("cpu conv kernels: double, against double references, every element", "[cpu][conv]") {
  std::uint64_t seed = 211;
  for (const auto& k : cases) check_case<double>(k, seed += 10);
}

TEST_CASE("cpu conv kernels: a Winograd call given too little workspace says what it needs", "[cpu][conv]") {
  const conv_case k{2, 8, 12, 12, 8, 5, 5, 1, 0, false};
  const auto x = make4<float>({k.n, k.c, k.h, k.w}, {0, 1, 2, 3}, 1, 7);
  const auto w = make4<float>({k.o, k.c, k.kh, k.kw}, {0, 1, 2, 3}, 1, 8);
  const dims ys{4, {k.n, k.o, k.oh(), k.ow()}};
  const window win{spatial_op::conv2d, 5, 5, 1, 1, 0, 0};
  cpu::thread_pool pool(1);
  const std::size_t need = cpu::spatial_workspace_bytes<float>(win, x.view.shape, w.view.shape, ys, 1);
  std::vector<std::byte> ws(need - 65);  // short of what Winograd needs even after aligning
  std::vector<float> out(ys.size());
  const strided<float> y{out.data(), ys, fusebox::contiguous_strides(ys)};
  REQUIRE(cpu::runs_winograd(win, x.view, w.view, y));
  REQUIRE_THROWS_WITH(cpu::run_spatial(win, x.view, w.view, y, pool, ws, cpu::no_spatial_epilogue{}),
                      Catch::Contains("Winograd conv2d needs") && Catch::Contains("bytes of workspace"));
}
