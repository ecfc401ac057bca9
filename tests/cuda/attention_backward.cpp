// tests/cuda/attention_backward.cpp: attention's gradient kernels on the CUDA backend
// (backend/cuda/attention_backward_kernel.hpp) on a device: compile(value_and_grad) through
// attention() on cuda::tensor arguments, every gradient element against the host's compiled
// gradient of the same loss (parts 1 + 2 and part 3; static and dyn T; q, k, v strided views of
// one packed tensor). Every case needs a GPU: where the build found none this file is only
// compiled, -fsyntax-only (tests/CMakeLists.txt, FUSEBOX_TEST_CUDA_DEVICE); the NVRTC checks that
// run without one are attention_backward_codegen.cpp.
#include <catch2/catch.hpp>

#include <cmath>
#include <sstream>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include <fusebox/fusebox.hpp>
#include <fusebox/nn/nn.hpp>

#include "../support/gpu.hpp"

namespace fb = fusebox;

namespace {

/// sum over every dimension of e (a rank-4 expression).
template <class E>
auto total4(const E& e) {
  return fb::sum(fb::sum(fb::sum(fb::sum(e))));
}

/// Every element of `got` (downloaded) against `want` (host): |got - want| <= tol (1 + |want|);
/// says the first bad element's index and both values.
template <class Got, class Want>
void check_close(const std::string& what, const Got& got, const Want& want, double tol = 1e-4) {
  REQUIRE(got.size() == want.size());
  std::size_t bad = 0, first = got.size();
  double worst = 0;
  for (std::size_t i = 0; i < want.size(); ++i) {
    const double w = want.flat(i), g = got.flat(i), d = std::fabs(g - w);
    worst = std::max(worst, d / (1 + std::fabs(w)));
    if (!(d <= tol * (1 + std::fabs(w)))) {
      if (bad++ == 0) first = i;
    }
  }
  std::ostringstream s;
  s << what << ": " << bad << " of " << want.size() << " elements off the host's; worst scaled difference " << worst;
  if (bad) s << "; first bad flat index " << first << ": device " << got.flat(first) << ", host " << want.flat(first);
  INFO(s.str());
  CHECK(bad == 0);
}

}  // namespace

namespace {

/// compile(value_and_grad(loss, wrt<0, 1, 2>)) on the device against the host, for q [B, Tq, H, E],
/// k [B, Tk, H, E], v [B, Tk, H, Ev] of host types Q, K, V (extents from the arguments, dyn ones
/// from tq and tk).
template <class Q, class K, class V, class W, class Loss>
void device_against_host(const char* what, Loss loss, const Q& q, const K& k, const V& v, const W& w) {
  auto host = fb::compile(fb::value_and_grad(loss, fb::wrt<0, 1, 2>));
  auto device = fb::compile(fb::value_and_grad(loss, fb::wrt<0, 1, 2>));
  const auto [hl, hg] = host(q, k, v, w);
  using fb::cuda::tensor;
  const auto [dl, dg] = device(tensor<float, typename Q::shape_type>(q), tensor<float, typename K::shape_type>(k),
                               tensor<float, typename V::shape_type>(v), tensor<float, typename W::shape_type>(w));
  std::ostringstream shapes;
  shapes << what << ": q " << fb::to_string(q.extents()) << ", k " << fb::to_string(k.extents()) << ", v "
         << fb::to_string(v.extents());
  INFO(shapes.str());
  const double l = dl.to_host().flat(0), lh = hl.flat(0);
  INFO("loss: device " << l << ", host " << lh);
  CHECK(std::fabs(l - lh) <= 1e-4 * (1 + std::fabs(lh)));
  const auto& [hq, hk, hv] = hg;
  const auto& [gq, gk, gv] = dg;
  check_close(shapes.str() + ", dq", gq.to_host(), hq);
  check_close(shapes.str() + ", dk", gk.to_host(), hk);
  check_close(shapes.str() + ", dv", gv.to_host(), hv);
}

const auto plain = [](const auto& q, const auto& k, const auto& v, const auto& w) {
  return total4(fb::attention(q, k, v) * w);
};
const auto causal = [](const auto& q, const auto& k, const auto& v, const auto& w) {
  return total4(fb::attention(q, k, v, fb::causal) * w);
};

template <std::size_t B, std::size_t Tq, std::size_t Tk, std::size_t H, std::size_t E, std::size_t Ev>
void static_case(std::uint64_t seed) {
  fb::tensor<float, fb::shape<B, Tq, H, E>> q;
  fb::tensor<float, fb::shape<B, Tk, H, E>> k;
  fb::tensor<float, fb::shape<B, Tk, H, Ev>> v;
  fb::tensor<float, fb::shape<B, Tq, H, Ev>> w;
  q.fill_random(seed, -1.5f, 1.5f), k.fill_random(seed + 1, -1.5f, 1.5f), v.fill_random(seed + 2), w.fill_random(seed + 3);
  const std::string shape = "B " + std::to_string(B) + ", Tq " + std::to_string(Tq) + ", Tk " + std::to_string(Tk) +
                            ", H " + std::to_string(H) + ", E " + std::to_string(E) + ", Ev " + std::to_string(Ev);
  device_against_host(("not causal, " + shape).c_str(), plain, q, k, v, w);
  if constexpr (Tq == Tk) device_against_host(("causal, " + shape).c_str(), causal, q, k, v, w);  // causal needs Tq == Tk
}

}  // namespace

TEST_CASE("CUDA: compiled gradients through attention() on the device equal the host's (part 3: Tq == Tk, E == Ev)",
          "[cuda][attention][autodiff]") {
  FUSEBOX_REQUIRE_GPU();
  static_case<2, 5, 5, 2, 8, 8>(100);
  static_case<2, 13, 13, 2, 8, 8>(110);
  static_case<1, 40, 40, 3, 64, 64>(120);  // lanes across two warps' worth of head dims
}

TEST_CASE("CUDA: compiled gradients through attention() on the device equal the host's (parts 1 and 2: Tq != Tk or "
          "E != Ev)",
          "[cuda][attention][autodiff]") {
  FUSEBOX_REQUIRE_GPU();
  static_case<2, 5, 13, 2, 8, 4>(200);   // more keys than queries, Ev < E
  static_case<2, 13, 5, 2, 8, 8>(210);   // fewer keys than queries
  static_case<2, 7, 7, 2, 8, 4>(220);    // Tq == Tk, Ev != E: causal too
  static_case<2, 7, 7, 2, 8, 40>(230);   // Ev > 32: two values a lane
}

TEST_CASE("CUDA: compiled gradients through attention() with a dyn sequence length on the device equal the host's",
          "[cuda][attention][autodiff]") {
  FUSEBOX_REQUIRE_GPU();
  using X = fb::tensor<float, fb::shape<2, fb::dyn, 2, 8>>;
  for (std::size_t t : {5u, 13u, 1u, 33u}) {
    X q(t), k(t), v(t), w(t);
    q.fill_random(300 + t, -1.5f, 1.5f), k.fill_random(400 + t, -1.5f, 1.5f), v.fill_random(500 + t), w.fill_random(600 + t);
    const std::string what = "dyn T = " + std::to_string(t);
    device_against_host((what + ", not causal").c_str(), plain, q, k, v, w);
    device_against_host((what + ", causal").c_str(), causal, q, k, v, w);
  }
}

TEST_CASE("CUDA: compiled gradients through attention() of q, k, v sliced from one packed tensor equal the host's",
          "[cuda][attention][autodiff]") {
  FUSEBOX_REQUIRE_GPU();
  // q | k | v as strided views of x [B, T, H, 3E] (rows 3E apart): the kernels read through strides,
  // and x's gradient is the three gradients side by side (a pad).
  constexpr std::size_t B = 2, T = 9, H = 2, E = 8;
  auto loss = [](const auto& x, const auto& w) {
    return total4(fb::attention(fb::slice<3, 0, E>(x), fb::slice<3, E, 2 * E>(x), fb::slice<3, 2 * E, 3 * E>(x),
                                fb::causal) *
                  w);
  };
  fb::tensor<float, fb::shape<B, T, H, 3 * E>> x;
  fb::tensor<float, fb::shape<B, T, H, E>> w;
  x.fill_random(700, -1.5f, 1.5f), w.fill_random(701);
  auto host = fb::compile(fb::value_and_grad(loss, fb::wrt<0>));
  auto device = fb::compile(fb::value_and_grad(loss, fb::wrt<0>));
  const auto [hl, hg] = host(x, w);
  const auto [dl, dg] = device(fb::cuda::tensor<float, fb::shape<B, T, H, 3 * E>>(x),
                               fb::cuda::tensor<float, fb::shape<B, T, H, E>>(w));
  INFO("x [2, 9, 2, 24], causal; loss: device " << dl.to_host().flat(0) << ", host " << hl.flat(0));
  CHECK(std::fabs(dl.to_host().flat(0) - hl.flat(0)) <= 1e-4 * (1 + std::fabs(hl.flat(0))));
  check_close("packed x [2, 9, 2, 24], dx", dg.to_host(), hg);
}
