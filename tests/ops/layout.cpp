// tests/ops/layout.cpp: flatten (include/fusebox/ops/layout.hpp) on every path: eager on static and
// dyn tensors (a view of contiguous data, a copy of a transposed one, as torch.flatten), compiled
// with static shapes, and on the run-time path with a dyn batch (flatten feeding a matmul, the
// CNN-to-classifier step), every element against a double reference on fresh random inputs.
// Its gradient is in tests/autodiff/ops_structural.cpp.
#include <cmath>
#include <string>

#include <catch2/catch.hpp>

#include <fusebox/fusebox.hpp>

#include "../support/check.hpp"

namespace fb = fusebox;
using fbt::coord;

namespace {

/// got (any shape) against the row-major elements of ref(i), exactly (a view or a copy moves no
/// value through arithmetic).
template <class Got, class Ref>
void check_elements(const Got& got, std::size_t n, Ref ref, const std::string& what) {
  INFO(what);
  REQUIRE(got.size() == n);
  std::size_t bad = 0;
  for (std::size_t i = 0; i < n; ++i) bad += static_cast<double>(got.flat(i)) != ref(i);
  CHECK(bad == 0);
}

}  // namespace

TEST_CASE("flatten: eager on tensors is torch.flatten (a view of contiguous data, a copy otherwise)",
          "[ops][layout][flatten]") {
  fb::tensor<float, fb::shape<2, 3, 4, 5>> x;
  fbt::fill_signed(x, 11, 0.1, 1.0);
  auto same = [&](std::size_t i) { return static_cast<double>(x.flat(i)); };

  const auto a = fb::flatten(x);  // nn.Flatten's default: keep dimension 0
  STATIC_REQUIRE(std::is_same_v<typename decltype(a)::shape_type, fb::shape<2, 60>>);
  CHECK(a.data() == x.data());
  check_elements(a, 120, same, "flatten<1>");
  const auto b = fb::flatten<0>(x);
  STATIC_REQUIRE(std::is_same_v<typename decltype(b)::shape_type, fb::shape<120>>);
  check_elements(b, 120, same, "flatten<0>");
  const auto c = fb::flatten<1, 2>(x);
  STATIC_REQUIRE(std::is_same_v<typename decltype(c)::shape_type, fb::shape<2, 12, 5>>);
  check_elements(c, 120, same, "flatten<1, 2>");
  const auto d = fb::flatten<-2>(x);
  STATIC_REQUIRE(std::is_same_v<typename decltype(d)::shape_type, fb::shape<2, 3, 20>>);
  check_elements(d, 120, same, "flatten<-2>");

  // dyn extents: the merged extent is dyn when one of the merged ones is.
  const auto xd = fbt::to_dyn(x);
  const auto e = fb::flatten(xd);
  STATIC_REQUIRE(std::is_same_v<typename decltype(e)::shape_type, fb::shape<fb::dyn, fb::dyn>>);
  CHECK(e.extents() == fb::dims{2, {2, 60}});
  CHECK(e.data() == xd.data());
  check_elements(e, 120, same, "flatten<1> of a dyn tensor");

  // A transposed tensor's dimensions 1..3 are not one strided run: copied, in its own order.
  const auto t = x.transpose<1, 3>();  // [2, 5, 4, 3]
  const auto f = fb::flatten(t);
  CHECK(f.extents() == fb::dims{2, {2, 60}});
  check_elements(
      f, 120,
      [&](std::size_t i) {
        const std::size_t n = i / 60, r = i % 60, w = r / 12, h = (r / 3) % 4, ch = r % 3;
        return static_cast<double>(x(n, ch, h, w));
      },
      "flatten of a transposed tensor (a copy)");
}

TEST_CASE("flatten: compiled, static and dyn batch, feeding a matmul, against the reference",
          "[ops][layout][flatten][dyn]") {
  constexpr std::size_t N = 3, C = 2, H = 3, W = 4, F = C * H * W, O = 5;
  fb::tensor<float, fb::shape<N, C, H, W>> x;
  fb::tensor<float, fb::shape<F, O>> w;
  fb::tensor<float, fb::shape<O>> bias;
  fbt::fill_signed(x, 21, 0.1, 1.0);
  fbt::fill_signed(w, 22, 0.1, 1.0);
  fbt::fill_signed(bias, 23, 0.1, 1.0);
  // y = relu(x) flattened, times w, plus bias: the classifier head of a CNN.
  auto model = [](const auto& xx, const auto& ww, const auto& bb) {
    return fb::matmul(fb::flatten(fb::relu(xx)), ww) + bb;
  };
  auto check = [&](const auto& y, std::size_t n_rows, const std::string& what) {
    INFO(what);
    REQUIRE(y.extents() == fb::dims{2, {n_rows, O}});
    std::size_t bad = 0;
    for (std::size_t n = 0; n < n_rows; ++n)
      for (std::size_t o = 0; o < O; ++o) {
        double s = bias(o), mag = std::fabs(s);
        for (std::size_t k = 0; k < F; ++k) {
          const double p = std::max(0.0, static_cast<double>(x.flat(n * F + k))) * w(k, o);
          s += p;
          mag += std::fabs(p);
        }
        bad += !(std::fabs(static_cast<double>(y(n, o)) - s) <= (F + 2) * 1.2e-7 * mag + 1e-30);
      }
    CHECK(bad == 0);
  };
  check(fb::compile(model)(x, w, bias), N, "compiled, static shapes");
  check(fb::eager(model)(x, w, bias), N, "eager");
  // A dyn batch: the run-time path, then another batch (a recompile or a symbolic batch).
  fb::tensor<float, fb::shape<fb::dyn, C, H, W>> xd(N);
  for (std::size_t i = 0; i < x.size(); ++i) xd.flat(i) = x.flat(i);
  auto compiled = fb::compile(model);
  check(compiled(xd, w, bias), N, "run-time path, batch 3");
  fb::tensor<float, fb::shape<fb::dyn, C, H, W>> x2(2);
  for (std::size_t i = 0; i < x2.size(); ++i) x2.flat(i) = x.flat(i);
  check(compiled(x2, w, bias), 2, "run-time path, batch 2");
  // Every extent dyn, the flatten alone as the output (a view of the relu's buffer).
  const auto xa = fbt::to_dyn(x);
  auto flat_only = [](const auto& xx) { return fb::flatten<1>(xx * 2.0f); };
  const auto y = fb::compile(flat_only)(xa);
  REQUIRE(y.extents() == fb::dims{2, {N, F}});
  check_elements(y, N * F, [&](std::size_t i) { return 2.0 * x.flat(i); }, "run-time path, every extent dyn");
}
