// tests/nn/gpt2.cpp: nn/attention.hpp (causal multi-head self-attention, packed c_attn) and
// nn/gpt2.hpp (the GPT-2 block of BENCHMARKS.md): the forward, eager and compiled, against a naive
// double reference written here; parameter names as torch's state_dict; every parameter's
// gradient against central differences (tests/autodiff/check_grad.hpp); compiled AdamW training
// steps equal to the eager ones; a safetensors round trip by name; the block under activation
// memory budgets 0.5 and 0 (autodiff/remat.hpp: gradients equal budget 1's, memory falls, the
// report names what is recomputed). Small sizes, double.
#include <cmath>
#include <cstdio>
#include <string>
#include <tuple>
#include <vector>

#include <catch2/catch.hpp>

#include <fusebox/fusebox.hpp>
#include <fusebox/io/safetensors.hpp>
#include <fusebox/nn/device.hpp>
#include <fusebox/nn/nn.hpp>

#include "../autodiff/check_grad.hpp"
#include "../autodiff/memory_budget.hpp"
#include "../support/gpu.hpp"

namespace fb = fusebox;
namespace nn = fusebox::nn;

namespace {

constexpr std::size_t B = 2, T = 3, D = 4, H = 2, E = D / H, N = B * T;
using block_t = nn::gpt2_block<D, H, T, double>;
using attn_t = nn::causal_self_attention<D, H, T, double>;
using rows = std::vector<double>;  // [n, width] row-major

/// Every parameter random (layer norms away from 1 and 0), so every one is used and tested.
template <class M>
void randomise(M& m, std::uint64_t seed) {
  std::apply([&](auto&... p) { (fbt::fill_signed(p, seed++, 0.1, 0.9), ...); }, m.param_refs());
}

template <class W, class Bias>
rows linear_ref(const rows& x, std::size_t in, const W& w, const Bias& b) {
  const std::size_t n = x.size() / in, out = w.extent(0);
  rows y(n * out);
  for (std::size_t i = 0; i < n; ++i)
    for (std::size_t o = 0; o < out; ++o) {
      double s = b(o);
      for (std::size_t k = 0; k < in; ++k) s += x[i * in + k] * w(o, k);
      y[i * out + o] = s;
    }
  return y;
}
template <class L>
rows layer_norm_ref(const rows& x, const L& ln) {
  rows y(x.size());
  for (std::size_t i = 0; i < x.size() / D; ++i) {
    double mean = 0, var = 0;
    for (std::size_t j = 0; j < D; ++j) mean += x[i * D + j] / D;
    for (std::size_t j = 0; j < D; ++j) var += (x[i * D + j] - mean) * (x[i * D + j] - mean) / D;
    for (std::size_t j = 0; j < D; ++j)
      y[i * D + j] = (x[i * D + j] - mean) / std::sqrt(var + 1e-5) * ln.weight(j) + ln.bias(j);
  }
  return y;
}
/// GPT-2's attention on token rows: q | k | v columns of c_attn's output, heads of E columns;
/// sequences of T tokens (a module's own T, or a call's when the module's is dyn).
template <class A>
rows attention_ref(A& a, const rows& x, std::size_t T = ::T) {
  const rows qkv = linear_ref(x, D, a.c_attn.weight, a.c_attn.bias);
  rows y(x.size(), 0.0);
  for (std::size_t b = 0; b < x.size() / D / T; ++b)
    for (std::size_t h = 0; h < H; ++h)
      for (std::size_t i = 0; i < T; ++i) {
        auto at = [&](std::size_t t, std::size_t part, std::size_t e) { return qkv[(b * T + t) * 3 * D + part * D + h * E + e]; };
        std::vector<double> s(i + 1);
        double m = -INFINITY, z = 0;
        for (std::size_t j = 0; j <= i; ++j) {
          s[j] = 0;
          for (std::size_t e = 0; e < E; ++e) s[j] += at(i, 0, e) * at(j, 1, e);
          s[j] /= std::sqrt(static_cast<double>(E));
          m = std::max(m, s[j]);
        }
        for (std::size_t j = 0; j <= i; ++j) z += std::exp(s[j] - m);
        for (std::size_t j = 0; j <= i; ++j)
          for (std::size_t e = 0; e < E; ++e) y[(b * T + i) * D + h * E + e] += std::exp(s[j] - m) / z * at(j, 2, e);
      }
  return linear_ref(y, D, a.c_proj.weight, a.c_proj.bias);
}
template <class M>
rows block_ref(M& m, const rows& x, std::size_t T = ::T) {
  rows h = attention_ref(m.attn, layer_norm_ref(x, m.ln_1), T);
  for (std::size_t i = 0; i < h.size(); ++i) h[i] += x[i];
  rows f = linear_ref(layer_norm_ref(h, m.ln_2), D, m.mlp.c_fc.weight, m.mlp.c_fc.bias);
  for (double& u : f) u = 0.5 * u * (1 + std::tanh(std::sqrt(2 / M_PI) * (u + 0.044715 * u * u * u)));
  rows y = linear_ref(f, 4 * D, m.mlp.c_proj.weight, m.mlp.c_proj.bias);
  for (std::size_t i = 0; i < y.size(); ++i) y[i] += h[i];
  return y;
}

template <class Y>
void check_rows(const Y& y, const rows& ref, const std::string& what) {
  REQUIRE(y.size() == ref.size());
  std::size_t bad = 0;
  double worst = 0;
  for (std::size_t i = 0; i < ref.size(); ++i) {
    const double d = std::fabs(static_cast<double>(y.flat(i)) - ref[i]);
    worst = std::max(worst, d);
    bad += !(d <= 1e-12 * (1 + std::fabs(ref[i])));
  }
  INFO(what << ": " << bad << " of " << ref.size() << " elements off the double reference; worst " << worst);
  CHECK(bad == 0);
}

template <class X>
rows to_rows(const X& x) {
  rows r(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) r[i] = x.flat(i);
  return r;
}

std::vector<std::string> names_of(const nn::parameter_list<double>& p) {
  std::vector<std::string> n;
  for (const auto& q : p) n.push_back(q.name);
  return n;
}

}  // namespace

TEST_CASE("nn: causal_self_attention and gpt2_block forward match a double reference; names as torch's") {
  attn_t a(nn::seeded{3});
  randomise(a, 10);
  CHECK(names_of(a.parameters()) ==
        std::vector<std::string>{"c_attn.weight", "c_attn.bias", "c_proj.weight", "c_proj.bias"});
  CHECK(a.c_attn.weight.extents() == fb::dims_of(fb::shape<3 * D, D>{}));
  const auto xr = fbt::signed_tensor<fb::shape<N, D>>(20);  // token rows
  check_rows(nn::forward(a, xr), attention_ref(a, to_rows(xr)), "attention, eager, [B*T, d]");
  check_rows(nn::compile_forward(a)(xr), attention_ref(a, to_rows(xr)), "attention, compiled, [B*T, d]");

  block_t m(7);
  randomise(m, 30);
  CHECK(names_of(m.parameters()) ==
        std::vector<std::string>{"ln_1.weight", "ln_1.bias", "attn.c_attn.weight", "attn.c_attn.bias",
                                 "attn.c_proj.weight", "attn.c_proj.bias", "ln_2.weight", "ln_2.bias",
                                 "mlp.c_fc.weight", "mlp.c_fc.bias", "mlp.c_proj.weight", "mlp.c_proj.bias"});
  const auto x = fbt::signed_tensor<fb::shape<B, T, D>>(40);
  const auto y = nn::forward(m, x);
  static_assert(std::is_same_v<typename std::remove_cvref_t<decltype(y)>::shape_type, fb::shape<B, T, D>>);
  check_rows(y, block_ref(m, to_rows(x)), "block, eager, [B, T, d]");
  // The compiled block is checked through compile_step below: compile_forward of the whole block
  // is past the planner's constexpr budget (docs/architecture.md, "Attention's derivative").
}

TEST_CASE("nn: gpt2_block's parameter gradients match central differences, every element") {
  block_t m(5);
  randomise(m, 50);
  const auto x = fbt::signed_tensor<fb::shape<B, T, D>>(60);
  const auto t = fbt::signed_tensor<fb::shape<B, T, D>>(61);
  const nn::detail::objective<block_t, nn::train_mode, nn::mse_loss_fn> f{};
  std::apply(
      [&](auto&... p) {
        fbt::check_grad("gpt2_block, mse", f, fb::wrt<2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13>, x, t, p...);
      },
      m.param_refs());
}

TEST_CASE("nn: gpt2_block: compiled AdamW steps follow the eager ones; safetensors round trip by name") {
  block_t a(9), b(9);
  auto pa = a.parameters(), pb = b.parameters();
  fb::optim::adamw oa(pa, {.lr = 1e-2, .weight_decay = 0.1}), ob(pb, {.lr = 1e-2, .weight_decay = 0.1});
  auto compiled = nn::compile_step(a, nn::mse_loss_fn{});
  auto eager = nn::eager_step(b, nn::mse_loss_fn{});
  const auto x = fbt::signed_tensor<fb::shape<B, T, D>>(70);
  const auto t = fbt::signed_tensor<fb::shape<B, T, D>>(71);
  double first = 0, last = 0;
  {  // the compiled forward inside the step, against the reference: mse of block(x) - t
    const rows y = block_ref(a, to_rows(x));
    double ref = 0;
    for (std::size_t i = 0; i < y.size(); ++i) ref += (y[i] - t.flat(i)) * (y[i] - t.flat(i)) / static_cast<double>(y.size());
    auto [l0, g0] = compiled(x, t);
    CHECK(std::fabs(l0.flat(0) - ref) <= 1e-12 * (1 + ref));
    auto [l1, g1] = eager(x, t);
    CHECK(std::fabs(l1.flat(0) - ref) <= 1e-12 * (1 + ref));
  }
  for (int s = 0; s < 5; ++s) {
    auto [la, ga] = compiled(x, t);
    auto [lb, gb] = eager(x, t);
    CHECK(std::fabs(la.flat(0) - lb.flat(0)) <= 1e-12 * (1 + std::fabs(lb.flat(0))));
    oa.step(ga);
    ob.step(gb);
    if (s == 0) first = la.flat(0);
    last = la.flat(0);
  }
  for (std::size_t i = 0; i < pa.size(); ++i) {
    std::size_t bad = 0;
    for (std::size_t k = 0; k < pa[i].size(); ++k)
      bad += !(std::fabs(pa[i].data[k] - pb[i].data[k]) <= 1e-12 * (1 + std::fabs(pb[i].data[k])));
    INFO(pa[i].name << ": " << bad << " elements differ between compiled and eager training");
    CHECK(bad == 0);
  }
  INFO("loss " << first << " -> " << last);
  CHECK(last < first);  // five steps on one batch must fit it better

  const std::string path = "gpt2_block_test.safetensors";
  fb::io::save_safetensors(path, pa);
  block_t c(123);
  fb::io::load_safetensors(path, c.parameters());
  const auto pc = c.parameters();
  for (std::size_t i = 0; i < pa.size(); ++i)
    for (std::size_t k = 0; k < pa[i].size(); ++k) REQUIRE(pc[i].data[k] == pa[i].data[k]);
  std::remove(path.c_str());
}

TEST_CASE("nn: gpt2_block under an activation memory budget (0.5, 0): gradients equal budget 1's; memory falls") {
  // The block's budget-1 program is the one compile_step above uses; 0.5 and 0 are rewrites of it.
  block_t m(3);
  randomise(m, 40);
  const auto x = fbt::signed_tensor<fb::shape<B, T, D>>(50);
  const auto t = fbt::signed_tensor<fb::shape<B, T, D>>(51);
  const auto vg = fb::value_and_grad(nn::detail::objective<block_t, nn::train_mode, nn::mse_loss_fn>{},
                                     fb::wrt<2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13>);
  auto c1 = fb::compile<fb::options{.threads = 1}>(vg);
  auto ch = fb::compile<fb::options{.threads = 1, .activation_memory_budget = 0.5f}>(vg);
  auto c0 = fb::compile<fb::options{.threads = 1, .activation_memory_budget = 0.0f}>(vg);
  auto args = std::apply([&](auto&... p) { return std::make_tuple(x, t, p...); }, m.param_refs());

  const std::size_t p1 = std::apply([&](const auto&... a) { return fbt::measured_peak(c1, a...); }, args);
  const std::size_t ph = std::apply([&](const auto&... a) { return fbt::measured_peak(ch, a...); }, args);
  const std::size_t p0 = std::apply([&](const auto&... a) { return fbt::measured_peak(c0, a...); }, args);
  const fb::memory_report r1 = std::apply([&](const auto&... a) { return c1.memory(a...); }, args);
  const fb::memory_report rh = std::apply([&](const auto&... a) { return ch.memory(a...); }, args);
  const fb::memory_report r0 = std::apply([&](const auto&... a) { return c0.memory(a...); }, args);
  INFO(r1.table() << rh.table() << r0.table() << "measured peaks: " << p1 << ", " << ph << ", " << p0 << " B");
  CHECK(r1.recomputed.empty());
  CHECK_FALSE(r0.recomputed.empty());
  CHECK(rh.saved_bytes <= r1.saved_bytes);
  CHECK(r0.saved_bytes <= rh.saved_bytes);
  CHECK(r0.saved_bytes < r1.saved_bytes);
  CHECK(ph <= p1);
  CHECK(p0 <= ph);
  CHECK(p0 < p1);

  auto [l1, g1] = std::apply(c1, args);
  auto [lh, gh] = std::apply(ch, args);
  auto [l0, g0] = std::apply(c0, args);
  CHECK(std::fabs(lh.flat(0) - l1.flat(0)) <= 1e-14 * std::fabs(l1.flat(0)));
  CHECK(std::fabs(l0.flat(0) - l1.flat(0)) <= 1e-14 * std::fabs(l1.flat(0)));
  std::size_t differ = 0;
  [&]<std::size_t... G>(std::index_sequence<G...>) {
    ((differ += fbt::check_equal("budget 0.5, gradient " + std::to_string(G), std::get<G>(gh), std::get<G>(g1))), ...);
    ((differ += fbt::check_equal("budget 0, gradient " + std::to_string(G), std::get<G>(g0), std::get<G>(g1))), ...);
  }(std::make_index_sequence<12>{});
  std::printf("memory budget, GPT-2 block: %zu gradient elements not bit-equal to budget 1's\n", differ);
  // Central differences of budget 0's own loss through the recomputed regions (the layer norms,
  // gelu): every gradient element equals budget 1's above, whose differences nn/gpt2.cpp checks.
  fbt::check_fd<2>("budget 0, ln_1.weight", c0, args, std::get<0>(g0));
  fbt::check_fd<8>("budget 0, ln_2.weight", c0, args, std::get<6>(g0));
  fbt::check_fd<11>("budget 0, mlp.c_fc.bias", c0, args, std::get<9>(g0));
}

// ---- a dyn sequence length (issue 21): gpt2_block<d, heads, fb::dyn> ----
namespace {
using dyn_block_t = nn::gpt2_block<D, H, fb::dyn, double>;
using dyn_objective = nn::detail::objective<dyn_block_t, nn::train_mode, nn::mse_loss_fn>;

/// Every element of each gradient in `got` against `want` (same order, same shapes).
template <class Got, class Want>
void check_grads_equal(const Got& got, const Want& want, const std::string& what) {
  [&]<std::size_t... P>(std::index_sequence<P...>) {
    (([&] {
       const auto& g = std::get<P>(got);
       const auto& w = std::get<P>(want);
       REQUIRE(g.size() == w.size());
       std::size_t bad = 0;
       double worst = 0;
       for (std::size_t k = 0; k < w.size(); ++k) {
         const double d = std::fabs(g.flat(k) - w.flat(k));
         worst = std::max(worst, d);
         bad += !(d <= 1e-12 * (1 + std::fabs(w.flat(k))));
       }
       INFO(what << ", parameter " << P << ": " << bad << " of " << w.size() << " elements differ; worst " << worst);
       CHECK(bad == 0);
     }()),
     ...);
  }(std::make_index_sequence<std::tuple_size_v<Want>>{});
}

/// One call with Bn sequences of L tokens, x and the target of type X (dyn extents): each of
/// `runs` (a name and a function of (x, t) returning {loss, gradients}) against the eager step of
/// a static gpt2_block<d, heads, L> holding m's parameters on static copies of the same rows (its
/// gradients are checked against central differences above), and its loss against the double
/// reference.
template <class X, std::size_t Bn, std::size_t L, class... Run>
void check_dyn_call(dyn_block_t& m, const std::pair<const char*, Run>&... runs) {
  INFO(Bn << " sequences of " << L << " tokens");
  nn::gpt2_block<D, H, L, double> s(0);
  std::apply([&](auto&... to) { std::apply([&](const auto&... from) { ((to = from.clone()), ...); }, m.param_refs()); },
             s.param_refs());
  const auto xs = fbt::signed_tensor<fb::shape<Bn, L, D>>(90 + 20 * Bn + L);
  const auto ts = fbt::signed_tensor<fb::shape<Bn, L, D>>(190 + 20 * Bn + L);
  auto dyn_copy = [](const auto& from) {
    X to = [] {
      if constexpr (X::shape_type::extents[0] == fb::dyn) return X(Bn, L);
      else return X(L);
    }();
    REQUIRE(to.size() == from.size());
    for (std::size_t i = 0; i < from.size(); ++i) to.flat(i) = from.flat(i);
    return to;
  };
  const X x = dyn_copy(xs), t = dyn_copy(ts);
  const rows y = block_ref(m, to_rows(x), L);
  double ref = 0;
  for (std::size_t i = 0; i < y.size(); ++i) ref += (y[i] - t.flat(i)) * (y[i] - t.flat(i)) / static_cast<double>(y.size());
  auto eager = nn::eager_step(s, nn::mse_loss_fn{});
  const auto [le, ge] = eager(xs, ts);
  CHECK(std::fabs(le.flat(0) - ref) <= 1e-12 * (1 + ref));
  // The dyn-T block's own forward, eager on the static rows: heads split by unflatten on tensors.
  check_rows(nn::forward(m, xs), y, "gpt2_block<d, heads, dyn>, eager");
  (([&] {
     const auto [l, g] = runs.second(x, t);
     INFO(runs.first);
     CHECK(std::fabs(l.flat(0) - ref) <= 1e-12 * (1 + ref));
     check_grads_equal(g, ge, std::string(runs.first) + ", B " + std::to_string(Bn) + ", T " + std::to_string(L));
   }()),
   ...);
}
}  // namespace

TEST_CASE("nn: gpt2_block with a dyn sequence length: compiled value_and_grad and step equal the eager gradients; "
          "recompiles as the forward's") {
  // The model's T is dyn: x is [B, T, d] with T per call, so the joint graph runs on the run-time
  // path (each Linear a batched product, heads split by unflatten, attention's gradient kernel).
  using X = fb::tensor<double, fb::shape<B, fb::dyn, D>>;
  dyn_block_t m(11);
  randomise(m, 80);
  auto vg = fb::compile(fb::value_and_grad(dyn_objective{}, fb::wrt<2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13>));
  auto step = nn::compile_step(m, nn::mse_loss_fn{});
  std::uint64_t recompiles[2] = {};  // value_and_grad, step
  auto counted = [&](int which, auto&& call) {
    const auto before = fb::jit::counters().snapshot().recompiles;
    auto r = call();
    recompiles[which] += fb::jit::counters().snapshot().recompiles - before;
    return r;
  };
  const auto run_vg = [&](const X& x, const X& t) {
    return counted(0, [&] { return std::apply([&](const auto&... p) { return vg(x, t, p...); }, m.param_refs()); });
  };
  const auto run_step = [&](const X& x, const X& t) { return counted(1, [&] { return step(x, t); }); };
  const auto calls = [&]<std::size_t L>() {
    check_dyn_call<X, B, L>(m, std::pair{"compiled value_and_grad", run_vg}, std::pair{"compiled step", run_step});
  };
  calls.template operator()<5>();
  calls.template operator()<8>();
  calls.template operator()<13>();
  calls.template operator()<5>();
  // As compile() of a forward under the default policy (automatic; capability matrix row 8):
  // specialised to T 5 first, then T symbolic from 8 on, which 13 and 5 reuse: one recompile
  // each. (compile() of this block's own forward is past max_expanded_nodes: its layer norms'
  // eps are payloads, which only the gradient's lifting merges; docs/architecture.md.)
  INFO("recompiles: value_and_grad " << recompiles[0] << ", step " << recompiles[1]);
  CHECK(recompiles[0] == 1);
  CHECK(recompiles[1] == 1);
}

TEST_CASE("nn: gpt2_block with a dyn batch and sequence length: the compiled step equals the eager gradients") {
  using X = fb::tensor<double, fb::shape<fb::dyn, fb::dyn, D>>;
  dyn_block_t m(12);
  randomise(m, 120);
  auto step = nn::compile_step(m, nn::mse_loss_fn{});
  const auto before = fb::jit::counters().snapshot().recompiles;
  const auto run = [&](const X& x, const X& t) { return step(x, t); };
  check_dyn_call<X, 2, 5>(m, std::pair{"compiled step", run});
  check_dyn_call<X, 3, 8>(m, std::pair{"compiled step", run});
  check_dyn_call<X, 3, 5>(m, std::pair{"compiled step", run});
  check_dyn_call<X, 2, 13>(m, std::pair{"compiled step", run});
  // [2, 5] exactly, then both dimensions symbolic from [3, 8] on: one recompile.
  CHECK(fb::jit::counters().snapshot().recompiles - before == 1);
}

TEST_CASE("nn: gpt2_block with a dyn sequence length: compile_step on the device equals the host's compiled step",
          "[cuda]") {
  // The GPT-2 block's training step with every kernel on the GPU, attention's gradient included
  // (backend/cuda/attention_backward_kernel.hpp): nn::to_device's parameters, device x and targets.
  FUSEBOX_REQUIRE_GPU();
  using block_f = nn::gpt2_block<D, H, fb::dyn, float>;
  using X = fb::tensor<float, fb::shape<B, fb::dyn, D>>;
  using DX = fb::cuda::tensor<float, fb::shape<B, fb::dyn, D>>;
  block_f m(13);
  randomise(m, 140);
  auto gpu = nn::to_device(m);
  auto host_step = nn::compile_step(m, nn::mse_loss_fn{});
  auto device_step = nn::compile_step(gpu, nn::mse_loss_fn{});
  for (std::size_t L : {5u, 13u, 8u}) {
    X x(L), t(L);
    fbt::fill_signed(x, 160 + L, 0.1, 1.0);
    fbt::fill_signed(t, 170 + L, 0.1, 1.0);
    const auto [lh, gh] = host_step(x, t);
    const auto [ld, gd] = device_step(DX(x), DX(t));
    INFO("B " << B << ", T " << L << ", d " << D << ", heads " << H);
    const double loss_d = ld.to_host().flat(0), loss_h = lh.flat(0);
    INFO("loss: device " << loss_d << ", host " << loss_h);
    CHECK(std::fabs(loss_d - loss_h) <= 1e-5 * (1 + std::fabs(loss_h)));
    [&]<std::size_t... P>(std::index_sequence<P...>) {
      (([&] {
         const auto got = std::get<P>(gd).to_host();
         const auto& want = std::get<P>(gh);
         REQUIRE(got.size() == want.size());
         std::size_t bad = 0, first = 0;
         double worst = 0;
         for (std::size_t k = 0; k < want.size(); ++k) {
           const double d = std::fabs(static_cast<double>(got.flat(k)) - want.flat(k));
           worst = std::max(worst, d / (1 + std::fabs(want.flat(k))));
           if (!(d <= 1e-4 * (1 + std::fabs(want.flat(k)))) && bad++ == 0) first = k;
         }
         INFO("parameter " << P << " (nanoGPT's order): " << bad << " of " << want.size()
                           << " elements differ; worst scaled difference " << worst << "; first bad flat index "
                           << first << ": device " << got.flat(first) << ", host " << want.flat(first));
         CHECK(bad == 0);
       }()),
       ...);
    }(std::make_index_sequence<std::tuple_size_v<std::remove_cvref_t<decltype(gh)>>>{});
  }
}
