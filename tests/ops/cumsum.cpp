// tests/ops/cumsum.cpp: cumsum(x, axis<A>) (ops/cumsum.hpp), the custom op (expr/custom.hpp) on
// every path: eager, compiled with static shapes, the run-time path (dyn extents), gradients
// (static and dyn: the reversed scan), explain(), and the CUDA back end (on a GPU every cell runs;
// without one the op's CUDA unit, forward and reversed, is compiled by NVRTC for sm_90). Every
// element against a double-precision reference on fresh random inputs.
#include <cmath>
#include <cstddef>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include <fusebox/fusebox.hpp>

#include "../support/check.hpp"

namespace fb = fusebox;

namespace {

/// The double reference of a running sum along `axis` of x (read through its strides), from the
/// end when `reverse`; `bound` gets each element's rounding bound (the line's magnitudes).
template <class X>
std::vector<double> running_sum(const X& x, std::size_t axis, bool reverse, std::vector<double>* bound = nullptr) {
  const fb::dims d = x.extents();
  std::vector<double> r(d.size()), mag(d.size());
  for (std::size_t i = 0; i < d.size(); ++i) {
    const fbt::coord c = fbt::unravel(i, d);
    double s = 0, m = 0;
    fbt::coord k = c;
    for (std::size_t j = 0; j < d.extent[axis]; ++j) {
      if (reverse ? j < c[axis] : j > c[axis]) continue;
      k[axis] = j;
      const double v = fbt::at(x, k, d.rank);
      s += v;
      m += std::fabs(v);
    }
    r[i] = s;
    mag[i] = m;
  }
  if (bound) *bound = mag;
  return r;
}

template <class Y>
void check_against(const Y& y, const std::vector<double>& ref, const std::vector<double>& mag, double eps,
                   const std::string& what) {
  const fb::dims d = y.extents();
  REQUIRE(y.size() == ref.size());
  auto flat = [d](const fbt::coord& c) {
    std::size_t i = 0;
    for (std::size_t k = 0; k < d.rank; ++k) i = i * d.extent[k] + c[k];
    return i;
  };
  fbt::check_bounded(
      y, [&](const fbt::coord& c) { return ref[flat(c)]; },
      [&](const fbt::coord& c) { return 4 * eps * static_cast<double>(d.extent[0] + d.extent[d.rank - 1] + 8) * mag[flat(c)] + 1e-30; },
      what);
}

template <class T>
constexpr double eps_of = std::is_same_v<T, float> ? 6e-8 : 1.2e-16;

}  // namespace

TEMPLATE_TEST_CASE("cumsum: eager and compiled, every axis, float and double", "[ops][cumsum]", float, double) {
  using T = TestType;
  fb::tensor<T, fb::shape<3, 7, 5>> x;
  fbt::fill_signed(x, 71, 0.1, 2.0);
  std::vector<double> mag;
  SECTION("axis 0") {
    const auto ref = running_sum(x, 0, false, &mag);
    check_against(fb::cumsum(x, fb::axis<0>), ref, mag, eps_of<T>, "eager cumsum axis 0");
    check_against(fb::compile([](const auto& a) { return fb::cumsum(a, fb::axis<0>); })(x), ref, mag, eps_of<T>,
                  "compiled cumsum axis 0");
  }
  SECTION("axis 1") {
    const auto ref = running_sum(x, 1, false, &mag);
    check_against(fb::cumsum(x, fb::axis<1>), ref, mag, eps_of<T>, "eager cumsum axis 1");
    check_against(fb::compile([](const auto& a) { return fb::cumsum(a, fb::axis<1>); })(x), ref, mag, eps_of<T>,
                  "compiled cumsum axis 1");
  }
  SECTION("axis -1 (the last), the default") {
    const auto ref = running_sum(x, 2, false, &mag);
    check_against(fb::cumsum(x), ref, mag, eps_of<T>, "eager cumsum default axis");
    check_against(fb::compile([](const auto& a) { return fb::cumsum(a, fb::axis<-1>); })(x), ref, mag, eps_of<T>,
                  "compiled cumsum axis -1");
  }
  SECTION("fused neighbours and a strided operand (a transpose) feed it and read it") {
    // 2 x^T, scanned along its dimension 1, plus 1: the scan reads a view and a kernel reads it.
    auto f = fb::compile([](const auto& a) { return fb::cumsum(fb::transpose<0, 2>(a) * T(2), fb::axis<1>) + T(1); });
    const auto y = f(x);
    fb::tensor<double, fb::shape<5, 7, 3>> xt;
    for (std::size_t i = 0; i < xt.size(); ++i) {
      const fbt::coord c = fbt::unravel(i, xt.extents());
      xt.flat(i) = 2 * fbt::at(x, fbt::coord{c[2], c[1], c[0]}, 3);
    }
    auto ref = running_sum(xt, 1, false, &mag);
    for (double& v : ref) v += 1;
    check_against(y, ref, mag, eps_of<T>, "compiled cumsum of a transpose");
  }
}

TEST_CASE("cumsum: the run-time path (dyn extents) along the dyn and the static dimension", "[ops][cumsum][jit]") {
  auto along0 = fb::compile([](const auto& a) { return fb::cumsum(fb::exp(a), fb::axis<0>); });
  auto along1 = fb::compile([](const auto& a) { return fb::cumsum(a, fb::axis<1>) * 0.5f; });
  for (std::size_t rows : {5u, 12u, 1u}) {
    fb::tensor<float, fb::shape<fb::dyn, 9>> x(rows);
    fbt::fill_signed(x, 80 + rows, 0.1, 1.5);
    std::vector<double> mag;
    fb::tensor<double, fb::shape<fb::dyn, 9>> ex(rows);
    for (std::size_t i = 0; i < x.size(); ++i) ex.flat(i) = std::exp(static_cast<double>(x.flat(i)));
    check_against(along0(x), running_sum(ex, 0, false, &mag), mag, 2 * eps_of<float>, "cumsum(exp(x)) along the dyn rows");
    auto ref = running_sum(x, 1, false, &mag);
    for (double& v : ref) v *= 0.5;
    check_against(along1(x), ref, mag, eps_of<float>, "cumsum(x) along the columns, dyn rows");
  }
}

TEST_CASE("cumsum: gradients (its derivative is the reversed cumsum), static and dyn, equal to eager's",
          "[ops][cumsum][autodiff]") {
  // L = sum(w * cumsum(x, 1)): dL/dx = the reversed running sum of w along dimension 1.
  const auto loss = [](const auto& x, const auto& w) { return fb::sum(fb::sum(w * fb::cumsum(x, fb::axis<1>), fb::axis<1>), fb::axis<0>); };
  fb::tensor<double, fb::shape<6, 11>> x, w;
  fbt::fill_signed(x, 91, 0.1, 1.0);
  fbt::fill_signed(w, 92, 0.1, 1.0);
  std::vector<double> mag;
  const auto ref = running_sum(w, 1, true, &mag);
  SECTION("eager") {
    const auto [v, g] = fb::value_and_grad(loss, fb::wrt<0>)(x, w);
    check_against(g, ref, mag, eps_of<double>, "eager d/dx");
  }
  SECTION("compiled, static shapes") {
    const auto [v, g] = fb::compile(fb::value_and_grad(loss, fb::wrt<0>))(x, w);
    check_against(g, ref, mag, eps_of<double>, "compiled d/dx");
  }
  SECTION("compiled, a dyn batch: recompiles only as the forward does") {
    auto vg = fb::compile(fb::value_and_grad(loss, fb::wrt<0>));
    for (std::size_t rows : {4u, 9u, 13u}) {
      fb::tensor<float, fb::shape<fb::dyn, 11>> xd(rows), wd(rows);
      fbt::fill_signed(xd, 100 + rows, 0.1, 1.0);
      fbt::fill_signed(wd, 200 + rows, 0.1, 1.0);
      const auto [v, g] = vg(xd, wd);
      const auto r = running_sum(wd, 1, true, &mag);
      check_against(g, r, mag, eps_of<float>, "dyn-batch d/dx, " + std::to_string(rows) + " rows");
    }
  }
}

TEST_CASE("cumsum: explain() names it with its bytes and flops", "[ops][cumsum][explain]") {
  fb::tensor<float, fb::shape<8, 16>> x;
  fbt::fill_signed(x, 5, 0.1, 1.0);
  const std::string plan = fb::explain_text([](const auto& a) { return fb::cumsum(a, fb::axis<0>); }, x);
  INFO(plan);
  CHECK(plan.find("[custom] cumsum") != std::string::npos);
  CHECK(plan.find("cumsum along dimension 0 of [8, 16], the op's own kernel") != std::string::npos);
  CHECK(plan.find("moves 1.0 KiB, 128 flop") != std::string::npos);
}

TEST_CASE("cumsum on the CUDA backend: static, dyn and its gradient (CUDA)", "[ops][cumsum][cuda]") {
  if (!fb::cuda::available()) {
    // No device: the op's unit, forward and reversed, compiled by NVRTC for sm_90.
    if (!fb::cuda::nvrtc_available()) {
      WARN("no CUDA device and no NVRTC: skipped");
      return;
    }
    WARN("no CUDA device: cumsum's CUDA units are compiled by NVRTC instead of run");
    using X = fb::input_leaf<0, float, fb::shape<fb::dyn, 6, 5>>;
    auto unit = [](const fb::node_desc& d, const char* name) {
      fb::ir::node n{};
      n.desc = d;
      n.n_inputs = 1;
      n.inputs[0] = 0;
      const fb::dims in[1] = {d.shape};
      const auto k = fb::jit::render_cuda_custom(n, in, fb::dtype::f32);
      CHECK(k.source.find("fbc_op::combine") != std::string::npos);
      try {
        fb::cuda::nvrtc_check(fb::jit::make_cuda_unit({k}).source, name, "compute_90");
      } catch (const fb::cuda::nvrtc_error& e) {
        FAIL(e.what());
      }
    };
    unit(fb::custom_node<fb::ops::scan<fb::ops::sum, 1, false>, X>::desc, "cumsum");
    unit(fb::custom_node<fb::ops::scan<fb::ops::sum, 2, true>, X>::desc, "cumsum_reverse");
    return;
  }
  fb::tensor<float, fb::shape<7, 33>> x, w;
  fbt::fill_signed(x, 301, 0.1, 1.0);
  fbt::fill_signed(w, 302, 0.1, 1.0);
  std::vector<double> mag;
  const fb::cuda::tensor<float, fb::shape<7, 33>> dx(x), dw(w);
  SECTION("static shapes, both axes") {
    check_against(fb::compile([](const auto& a) { return fb::cumsum(a, fb::axis<0>); })(dx).to_host(),
                  running_sum(x, 0, false, &mag), mag, eps_of<float>, "CUDA cumsum axis 0");
    check_against(fb::compile([](const auto& a) { return fb::cumsum(a, fb::axis<1>); })(dx).to_host(),
                  running_sum(x, 1, false, &mag), mag, eps_of<float>, "CUDA cumsum axis 1");
  }
  SECTION("dyn rows") {
    auto f = fb::compile([](const auto& a) { return fb::cumsum(a, fb::axis<0>) + 1.0f; });
    for (std::size_t rows : {3u, 10u}) {
      fb::tensor<float, fb::shape<fb::dyn, 33>> xd(rows);
      fbt::fill_signed(xd, 310 + rows, 0.1, 1.0);
      auto ref = running_sum(xd, 0, false, &mag);
      for (double& v : ref) v += 1;
      check_against(f(fb::cuda::tensor<float, fb::shape<fb::dyn, 33>>(xd)).to_host(), ref, mag, eps_of<float>,
                    "CUDA cumsum, dyn rows");
    }
  }
  SECTION("value_and_grad: the reversed scan on the device") {
    const auto loss = [](const auto& a, const auto& b) { return fb::sum(fb::sum(b * fb::cumsum(a, fb::axis<1>), fb::axis<1>), fb::axis<0>); };
    const auto [v, g] = fb::compile(fb::value_and_grad(loss, fb::wrt<0>))(dx, dw);
    check_against(g.to_host(), running_sum(w, 1, true, &mag), mag, eps_of<float>, "CUDA d/dx");
  }
}
