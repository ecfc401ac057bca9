// tests/cuda/attention_backward.cpp: attention's gradient kernels on the CUDA backend
// (backend/cuda/attention_backward_kernel.hpp). Without a GPU: every part's unit (float32, bf16,
// causal or not) rendered and compiled by NVRTC to PTX. With one: compile(value_and_grad) through
// attention() on cuda::tensor arguments, every gradient element against the host's compiled
// gradient of the same loss (parts 1 + 2 and part 3; static and dyn T; q, k, v strided views of
// one packed tensor). Without a GPU the GPT-2 block's training step (dyn T) is also planned for the
// GPU and every one of its kernels rendered and NVRTC-compiled (nn.gpt2's [cuda] case runs it).
#include <catch2/catch.hpp>

#include <cmath>
#include <sstream>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include <fusebox/backend/cuda/module_store.hpp>
#include <fusebox/backend/cuda/nvrtc.hpp>
#include <fusebox/fusebox.hpp>
#include <fusebox/nn/nn.hpp>

#include "../support/gpu.hpp"
#include "../support/planned_guard.hpp"

namespace fb = fusebox;

namespace {

/// sum over every dimension of e (a rank-4 expression).
template <class E>
auto total4(const E& e) {
  return fb::sum(fb::sum(fb::sum(fb::sum(e))));
}

/// A gradient node of q [B, T, H, E] and v [B, T, H, Ev] (T symbolic), part `variant`.
fb::ir::node gradient_node(int variant, bool causal, std::size_t e, std::size_t ev, fb::ir::node* q, fb::ir::node* v) {
  fb::ir::node n;
  n.desc.kind = fb::node_kind::attention;
  n.desc.name = variant == 1 ? "attention_backward_dq" : variant == 2 ? "attention_backward_dkv" : "attention_backward";
  n.desc.variant = variant;
  n.desc.causal = causal;
  q->desc.shape = fb::dims{4, {2, fb::symbol(0), 3, e}};
  v->desc.shape = fb::dims{4, {2, fb::symbol(0), 3, ev}};
  n.desc.shape = variant == 1   ? q->desc.shape
                 : variant == 2 ? fb::dims{4, {2, fb::symbol(0), 3, e + ev}}
                                : fb::dims{5, {2, fb::symbol(0), 3, 3, e}};
  return n;
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

TEST_CASE("CUDA: attention's gradient units (parts 1, 2, 3; causal or not; float32, bf16) compile with NVRTC",
          "[cuda][attention][autodiff]") {
  if (!fb::cuda::nvrtc_available()) {
    WARN("no NVRTC: skipped");
    return;
  }
  for (fb::dtype t : {fb::dtype::f32, fb::dtype::bf16})
    for (int variant : {1, 2, 3})
      for (bool causal : {false, true}) {
        const std::size_t e = 8, ev = variant == 3 ? 8 : 40;  // ev 40: two lanes' worth on some lanes
        fb::ir::node q, v;
        const fb::ir::node n = gradient_node(variant, causal, e, ev, &q, &v);
        const fb::jit::rendered_cuda_kernel k = fb::jit::render_cuda_attention(n, q, v, t);
        const std::string name = "attention_backward_part" + std::to_string(variant) + (causal ? "_causal" : "") +
                                 (t == fb::dtype::f32 ? "_f32" : "_bf16");
        INFO(name << ": " << k.summary);
        CHECK(k.kind == fb::plan::kernel_kind::attention);
        CHECK(k.source.find("fusebox_kernel_w(") != std::string::npos);  // the dq entry
        const std::string source = fb::jit::make_cuda_unit({k}).source;
        CHECK_NOTHROW(fb::cuda::nvrtc_check(source, name + ".cu", "compute_90"));
      }
  // Head dims unknown when compiling are refused by name, as the forward's.
  fb::ir::node q, v;
  fb::ir::node n = gradient_node(3, true, 8, 8, &q, &v);
  q.desc.shape = fb::dims{4, {2, 5, 3, fb::symbol(1)}};
  CHECK_THROWS_WITH(fb::jit::render_cuda_attention(n, q, v, fb::dtype::f32),
                    Catch::Contains("needs head dims known when compiling"));
}

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

namespace {
template <class VG, class X, class Refs>
struct gpt2_program;
template <class VG, class X, class... P>
struct gpt2_program<VG, X, std::tuple<P&...>> {
  using type = typename VG::template program_type<X, X, std::remove_cvref_t<P>...>;
};
}  // namespace

TEST_CASE("CUDA: the GPT-2 block's training step (dyn T) planned for the GPU: every kernel, attention's gradient "
          "among them, renders and compiles with NVRTC",
          "[cuda][attention][autodiff]") {
  if (!fb::cuda::nvrtc_available()) {
    WARN("no NVRTC: skipped");
    return;
  }
  namespace nn = fb::nn;
  using block_f = nn::gpt2_block<8, 2, fb::dyn, float>;
  using objective = nn::detail::objective<block_f, nn::train_mode, nn::mse_loss_fn>;
  using X = fb::tensor<float, fb::shape<2, fb::dyn, 8>>;
  using VG = decltype(fb::compile(fb::value_and_grad(objective{}, fb::wrt<2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13>)));
  using Prog = typename gpt2_program<VG, X, decltype(std::declval<block_f&>().param_refs())>::type;
  using D = fb::jit::dynamic_function<Prog, fb::jit::cuda_target>;
  for (std::size_t rows : {std::size_t{5}, std::size_t{0}}) {  // T 5, then T symbolic
    INFO("T " << (rows ? std::to_string(rows) : std::string("symbolic")));
    typename D::program_t p;
    D::specialise_into(p, fbt::planned_guard<Prog>(rows));
    // As build_cuda renders them (pipeline/dynamic_function.hpp).
    std::vector<fb::jit::rendered_cuda_kernel> kernels;
    int gradients = 0;
    for (int k = 0; k < p.plan.n_kernels; ++k) {
      const fb::plan::kernel& kn = p.plan.kernels[k];
      const fb::ir::node& n = p.nodes[kn.node];
      if (kn.kind == fb::plan::kernel_kind::spatial || kn.kind == fb::plan::kernel_kind::gather ||
          kn.kind == fb::plan::kernel_kind::custom) {
        FAIL("the GPT-2 block has no spatial, gather or custom kernel; kernel " << k << " is one");
      } else if (kn.kind == fb::plan::kernel_kind::pad) {
        kernels.push_back(fb::jit::render_cuda_pad(n, fb::dtype::f32));
        if (!D::generated(kn)) continue;
      }
      if (kn.kind == fb::plan::kernel_kind::attention) {
        gradients += n.desc.variant != 0;
        REQUIRE_NOTHROW(kernels.push_back(
            fb::jit::render_cuda_attention(n, p.nodes[n.inputs[0]], p.nodes[n.inputs[2]], fb::dtype::f32)));
      } else if (D::generated(kn)) {
        kernels.push_back(fb::jit::render_cuda_kernel(p.nodes, p.plan, k, fb::dtype::f32, p.unit_inner, p.sched));
      }
    }
    CHECK(gradients >= 1);
    try {
      fb::cuda::nvrtc_check(fb::jit::make_cuda_unit(kernels).source, "gpt2_step", "compute_90");
    } catch (const fb::cuda::nvrtc_error& e) {
      FAIL(e.what());
    }
  }
}
