// tests/autodiff/grad.cpp: fusebox::grad and value_and_grad as a user meets them
// (include/fusebox/autodiff/grad.hpp): a 3-layer MLP with an MSE loss against central finite
// differences in double, every parameter element (an attention block: attention_block.cpp); the result shapes of one and several wrt
// indices; gradients of unused arguments; captured weights and numbers (lifted to inputs, so
// the joint graph stays small); float against a double reference; the eager stance; a host read
// in a loss refused at run time; and the node counts of the MLP's forward and joint graphs.
#include <cmath>
#include <cstdio>
#include <string>
#include <tuple>

#include <catch2/catch.hpp>

#include <fusebox/fusebox.hpp>

#include "check_grad.hpp"
#include "../support/mse_relu.hpp"

namespace fb = fusebox;
using fbt::check_grad;
using fbt::signed_tensor;
using fbt::total;

namespace {

// A 3-layer MLP, 8 -> 32 -> 32 -> 4, relu and gelu, MSE against t: weights are arguments.
auto mlp_loss = [](const auto& x, const auto& w1, const auto& b1, const auto& w2, const auto& b2, const auto& w3,
                   const auto& b3, const auto& t) {
  const auto h1 = fb::relu(fb::matmul(x, w1) + b1);
  const auto h2 = fb::gelu(fb::matmul(h1, w2) + b2);
  const auto y = fb::matmul(h2, w3) + b3;
  const auto e = y - t;
  return fb::mean(fb::mean(e * e));
};

template <class T>
struct mlp_params {
  fb::tensor<T, fb::shape<16, 8>> x;
  fb::tensor<T, fb::shape<8, 32>> w1;
  fb::tensor<T, fb::shape<32>> b1;
  fb::tensor<T, fb::shape<32, 32>> w2;
  fb::tensor<T, fb::shape<32>> b2;
  fb::tensor<T, fb::shape<32, 4>> w3;
  fb::tensor<T, fb::shape<4>> b3;
  fb::tensor<T, fb::shape<16, 4>> t;
  explicit mlp_params(std::uint64_t seed) {
    fbt::fill_signed(x, seed + 1, 0.1, 1.0);
    fbt::fill_signed(w1, seed + 2, 0.05, 0.5);
    fbt::fill_signed(b1, seed + 3, 0.05, 0.3);
    fbt::fill_signed(w2, seed + 4, 0.02, 0.3);
    fbt::fill_signed(b2, seed + 5, 0.05, 0.3);
    fbt::fill_signed(w3, seed + 6, 0.05, 0.5);
    fbt::fill_signed(b3, seed + 7, 0.05, 0.3);
    fbt::fill_signed(t, seed + 8, 0.1, 1.0);
  }
};

}  // namespace

TEST_CASE("autodiff: a 3-layer MLP's MSE gradients match central differences, every parameter element") {
  const mlp_params<double> p(1000);
  check_grad("mlp", mlp_loss, fb::wrt<1, 2, 3, 4, 5, 6>, p.x, p.w1, p.b1, p.w2, p.b2, p.w3, p.b3, p.t);
  // The input and the target too (a target's gradient is -(the prediction's)).
  check_grad("mlp wrt x, t", mlp_loss, fb::wrt<0, 7>, p.x, p.w1, p.b1, p.w2, p.b2, p.w3, p.b3, p.t);
}

TEST_CASE("autodiff: the MLP's joint graph shares forward values: node counts stay linear") {
  const mlp_params<double> p(2000);
  const auto vg = fb::value_and_grad(mlp_loss, fb::wrt<1, 2, 3, 4, 5, 6>);
  const fb::autodiff::graph_stats s = vg.stats(p.x, p.w1, p.b1, p.w2, p.b2, p.w3, p.b3, p.t);
  INFO("forward " << s.forward_nodes << " nodes, " << s.forward_kernels << " kernels, arena " << s.forward_arena_bytes
                  << " B; forward + backward " << s.joint_nodes << " nodes (" << s.joint_tree_nodes
                  << " as a tree), " << s.joint_kernels << " kernels, arena " << s.joint_arena_bytes << " B\n"
                  << vg.describe(p.x, p.w1, p.b1, p.w2, p.b2, p.w3, p.b3, p.t));
  // Measured (this commit): 20 forward nodes; 42 joint nodes from 422 tree nodes. The bounds are
  // the design's promise: the backward adds a few nodes per forward node, never a copy of a subtree.
  CHECK(s.forward_nodes == 20);
  CHECK(s.joint_nodes <= 3 * s.forward_nodes);
  CHECK(s.joint_tree_nodes > 2 * s.joint_nodes);
  // Fusion happened across forward and backward: fewer kernels than non-leaf nodes.
  CHECK(s.joint_kernels < static_cast<int>(s.joint_nodes) / 2);
  CHECK(s.joint_arena_bytes >= s.forward_arena_bytes);
}

TEST_CASE("autodiff: one wrt index gives a tensor, several a tuple; grad() alone; default wrt<0>") {
  const auto a = signed_tensor<fb::shape<2, 3>>(1), b = signed_tensor<fb::shape<2, 3>>(2);
  auto f = [](const auto& u, const auto& v) { return total(u * v); };
  const fb::tensor<double, fb::shape<2, 3>> da = fb::grad(f)(a, b);  // d/da (u v) = v
  fbt::check_all(da, [&](const fbt::coord& i) { return b(i[0], i[1]); }, fbt::exact, "grad(f) = b");
  const auto [db, da2] = fb::grad(f, fb::wrt<1, 0>)(a, b);
  fbt::check_all(db, [&](const fbt::coord& i) { return a(i[0], i[1]); }, fbt::exact, "wrt<1, 0> first: d/db");
  fbt::check_all(da2, [&](const fbt::coord& i) { return b(i[0], i[1]); }, fbt::exact, "wrt<1, 0> second: d/da");
  auto compiled = fb::compile(fb::value_and_grad(f, fb::wrt<0>));
  const auto [value, dac] = compiled(a, b);
  double ref = 0;
  for (std::size_t i = 0; i < a.size(); ++i) ref += a.flat(i) * b.flat(i);
  CHECK(std::fabs(value.flat(0) - ref) <= 1e-15 * std::fabs(ref) + 1e-15);
  fbt::check_all(dac, [&](const fbt::coord& i) { return b(i[0], i[1]); }, fbt::exact, "compiled d/da");
  // compile<options{...}>(g): options known at build time.
  auto fixed = fb::compile<fb::options{.threads = 1}>(fb::grad(f, fb::wrt<1>));
  fbt::check_all(fixed(a, b), [&](const fbt::coord& i) { return a(i[0], i[1]); }, fbt::exact, "compile<options>");
}

TEST_CASE("autodiff: an argument the loss does not use (or uses only through a comparison) gets zeros") {
  const auto a = signed_tensor<fb::shape<2, 3>>(3);
  const auto b = signed_tensor<fb::shape<4>>(4);
  auto f = [](const auto& u, const auto&) { return total(fb::exp(u)); };
  auto [da, db] = fb::grad(f, fb::wrt<0, 1>)(a, b);
  auto [cda, cdb] = fb::compile(fb::grad(f, fb::wrt<0, 1>))(a, b);
  fbt::check_all(db, [](const fbt::coord&) { return 0.0; }, fbt::exact, "unused argument, eager");
  fbt::check_all(cdb, [](const fbt::coord&) { return 0.0; }, fbt::exact, "unused argument, compiled");
  fbt::check_all(da, [&](const fbt::coord& i) { return std::exp(a(i[0], i[1])); }, {1e-15, 1e-15}, "d exp");
  auto g = [](const auto& u, const auto& v) { return total(fb::gt(u, 0.0) * v); };
  auto [gu, gv] = fb::compile(fb::grad(g, fb::wrt<0, 1>))(a, a);
  fbt::check_all(gu, [](const fbt::coord&) { return 0.0; }, fbt::exact, "through a comparison only");
  fbt::check_all(gv, [&](const fbt::coord& i) { return a(i[0], i[1]) > 0 ? 1.0 : 0.0; }, fbt::exact, "the mask");
}

TEST_CASE("autodiff: captured weights and numbers are lifted: a captured-weight MLP is checked too") {
  const mlp_params<double> p(3000);
  // The weights are captured by the loss (payloads in the captured expression); x is the argument.
  auto captured = [w1 = p.w1, b1 = p.b1, w2 = p.w2, b2 = p.b2, w3 = p.w3, b3 = p.b3](const auto& x, const auto& t) {
    const auto h1 = fb::tanh(fb::matmul(x, w1) + b1) * 0.5;
    const auto h2 = fb::silu((fb::matmul(h1, w2) + b2) * 2.0);
    const auto e = fb::matmul(h2, w3) + b3 - t;
    return fb::mean(fb::mean(e * e)) * 0.25;
  };
  check_grad("captured-weight mlp", captured, fb::wrt<0>, p.x, p.t);
  const auto s = fb::grad(captured, fb::wrt<0>).stats(p.x, p.t);
  INFO("forward " << s.forward_nodes << " nodes, joint " << s.joint_nodes << " (tree " << s.joint_tree_nodes << ")");
  CHECK(s.joint_nodes <= 3 * s.forward_nodes);
}

TEST_CASE("autodiff: compiled float gradients agree with the double gradients") {
  const mlp_params<double> d(4000);
  mlp_params<float> f(4000);  // the same seeds: the same values rounded to float
  const auto [dl, dg] = fb::value_and_grad(mlp_loss, fb::wrt<1, 3, 5>)(d.x, d.w1, d.b1, d.w2, d.b2, d.w3, d.b3, d.t);
  auto compiled = fb::compile(fb::value_and_grad(mlp_loss, fb::wrt<1, 3, 5>));
  const auto [fl, fg] = compiled(f.x, f.w1, f.b1, f.w2, f.b2, f.w3, f.b3, f.t);
  CHECK(std::fabs(fl.flat(0) - dl.flat(0)) <= 1e-5 * std::fabs(dl.flat(0)));
  // Norm-wise: the inputs themselves differ by float rounding.
  CHECK(fbt::rel_diff(std::get<0>(fg), std::get<0>(dg)) < 1e-5);
  CHECK(fbt::rel_diff(std::get<1>(fg), std::get<1>(dg)) < 1e-5);
  CHECK(fbt::rel_diff(std::get<2>(fg), std::get<2>(dg)) < 1e-5);
  // A second call reuses the arena and gives the same bits.
  const auto [fl2, fg2] = compiled(f.x, f.w1, f.b1, f.w2, f.b2, f.w3, f.b3, f.t);
  CHECK(fl2.flat(0) == fl.flat(0));
  fbt::check_identical(std::get<1>(fg2), std::get<1>(fg), "second call");
}

TEST_CASE("autodiff: under stance force_eager a compiled gradient runs op by op, with the eager result") {
  const mlp_params<double> p(5000);
  auto vg = fb::value_and_grad(mlp_loss, fb::wrt<3>);
  auto compiled = fb::compile(vg);
  const auto [l, g] = vg(p.x, p.w1, p.b1, p.w2, p.b2, p.w3, p.b3, p.t);
  fb::set_stance(fb::stance::force_eager);
  const auto [le, ge] = compiled(p.x, p.w1, p.b1, p.w2, p.b2, p.w3, p.b3, p.t);
  fb::set_stance(fb::stance::default_);
  CHECK(le.flat(0) == l.flat(0));
  fbt::check_identical(ge, g, "force_eager");
}

TEST_CASE("autodiff: type-identical parts holding different numbers or tensors are refused at the call") {
  const auto x = signed_tensor<fb::shape<5>>(7);
  auto numbers = [](const auto& u) { return fb::sum(u * 0.5 + u * 0.7); };
  CHECK_THROWS_WITH(fb::grad(numbers)(x), Catch::Contains("same structure hold different numbers"));
  CHECK_THROWS_AS(fb::compile(fb::grad(numbers))(x), fb::invalid_argument);
  const auto a = signed_tensor<fb::shape<5>>(8), b = signed_tensor<fb::shape<5>>(9);
  auto tensors = [a, b](const auto& u) { return fb::sum(u * a + u * b); };
  CHECK_THROWS_WITH(fb::grad(tensors)(x), Catch::Contains("hold different captured tensors"));
  // Equal numbers in type-identical parts are one value, and the gradient is right.
  auto equal = [](const auto& u) { return fb::sum(u * 0.5 + u * 0.5); };
  const auto g = fb::compile(fb::grad(equal))(x);
  fbt::check_all(g, [](const fbt::coord&) { return 1.0; }, fbt::exact, "d sum(x/2 + x/2)");
}

TEST_CASE("autodiff: a loss that reads a value on the host (item()) is refused at the call, with the reason") {
  const auto x = signed_tensor<fb::shape<5>>(6);
  auto f = [](const auto& u) { return fb::sum(u * fb::item(fb::sum(u))); };
  CHECK_THROWS_WITH(fb::grad(f)(x), Catch::Contains("item()") && Catch::Contains("gradient cannot flow"));
  auto compiled = fb::compile(fb::grad(f));
  CHECK_THROWS_AS(compiled(x), fb::invalid_argument);
}

// ---- dyn extents: the joint graph on the run-time path (issue 21) ----

namespace {

// relu(x w + b) against t, mean over both axes (tests/support/mse_relu.hpp).
const auto dyn_loss = fbt::mse_relu;
constexpr std::size_t dyn_in = 16, dyn_out = 8;
using dyn_x = fb::tensor<float, fb::shape<fb::dyn, dyn_in>>;
using dyn_t = fb::tensor<float, fb::shape<fb::dyn, dyn_out>>;
template <class Got>
void check_all(const Got& got, const std::vector<double>& want, const char* what) {
  REQUIRE(got.size() == want.size());
  for (std::size_t i = 0; i < want.size(); ++i) {
    INFO(what << " element " << i);
    CHECK(static_cast<double>(got.flat(i)) == Approx(want[i]).epsilon(1e-4).margin(1e-6));
  }
}

}  // namespace

TEST_CASE("autodiff: compiled value_and_grad on a dyn batch: every gradient element, recompiles as the forward's",
          "[autodiff][dyn]") {
  fb::tensor<float, fb::shape<dyn_in, dyn_out>> w;
  fb::tensor<float, fb::shape<dyn_out>> b;
  fbt::fill_signed(w, 41, 0.05, 0.5);
  fbt::fill_signed(b, 42, 0.05, 0.3);
  auto vg = fb::compile(fb::value_and_grad(dyn_loss, fb::wrt<0, 1, 2>));
  const auto before = fb::jit::counters().snapshot();
  for (const std::size_t batch : {32, 17, 5, 32, 64}) {
    INFO("batch " << batch);
    dyn_x x(batch);
    dyn_t t(batch);
    fbt::fill_signed(x, 100 + batch, 0.1, 1.0);
    fbt::fill_signed(t, 200 + batch, 0.1, 1.0);
    const auto [loss, grads] = vg(x, w, b, t);
    const auto& [dx, dw, db] = grads;
    const fbt::mse_relu_reference want = fbt::mse_relu_expected(x, w, b, t);
    CHECK(static_cast<double>(loss.flat(0)) == Approx(want.loss).epsilon(1e-4));
    CHECK(dx.extents() == x.extents());
    check_all(dx, want.dx, "dx");
    check_all(dw, want.dw, "dw");
    check_all(db, want.db, "db");
  }
  // The first specialisation (batch 32), then one with the batch symbolic: as compile() of the
  // forward alone would.
  CHECK(fb::jit::counters().snapshot().compiles - before.compiles <= 2);
  // Rolled back (stance force_eager, FUSEBOX_DISABLE=1), it would need the eager gradient, which
  // dyn extents do not have: refused by name rather than run some other way.
  dyn_x x(4);
  dyn_t t(4);
  fbt::fill_signed(x, 7, 0.1, 1.0);
  fbt::fill_signed(t, 8, 0.1, 1.0);
  fb::set_stance(fb::stance::force_eager);
  CHECK_THROWS_WITH(vg(x, w, b, t), Catch::Contains("force_eager") && Catch::Contains("dyn extents"));
  fb::set_stance(fb::stance::default_);
}

TEST_CASE("autodiff: a dyn extent of 1 broadcast against another dyn extent is refused, naming the compile() line",
          "[autodiff][dyn]") {
  // The backward's sums over broadcast dimensions are fixed by the types: x's gradient would come
  // out [3, 4] for an x of [1, 4].
  using dx_t = fb::tensor<float, fb::shape<fb::dyn, 4>>;
  auto g = fb::compile(fb::grad([](const auto& x, const auto& y) { return fb::sum(fb::sum(x * y)); }));
  dx_t x(1), y(3);
  fbt::fill_signed(x, 11, 0.1, 1.0);
  fbt::fill_signed(y, 12, 0.1, 1.0);
  CHECK_THROWS_WITH(g(x, y), Catch::Contains("gradient of argument 0 [1, 4]") && Catch::Contains("[3, 4]") &&
                                 Catch::Contains("grad.cpp:"));
  // The same shapes without the broadcast still run.
  dx_t y1(1);
  fbt::fill_signed(y1, 13, 0.1, 1.0);
  const auto dx = g(x, y1);
  for (std::size_t i = 0; i < 4; ++i) CHECK(dx.flat(i) == Approx(y1.flat(i)));
}

TEST_CASE("autodiff: compiled value_and_grad on a dyn batch on the GPU matches the reference", "[autodiff][dyn][cuda]") {
  if (!fb::cuda::available()) {
    WARN("no CUDA device: skipped");
    return;
  }
  fb::tensor<float, fb::shape<dyn_in, dyn_out>> w;
  fb::tensor<float, fb::shape<dyn_out>> b;
  fbt::fill_signed(w, 43, 0.05, 0.5);
  fbt::fill_signed(b, 44, 0.05, 0.3);
  const fb::cuda::tensor<float, fb::shape<dyn_in, dyn_out>> dw_(w);
  const fb::cuda::tensor<float, fb::shape<dyn_out>> db_(b);
  auto vg = fb::compile(fb::value_and_grad(dyn_loss, fb::wrt<1, 2>));
  for (const std::size_t batch : {24, 9, 24}) {
    INFO("batch " << batch);
    dyn_x x(batch);
    dyn_t t(batch);
    fbt::fill_signed(x, 300 + batch, 0.1, 1.0);
    fbt::fill_signed(t, 400 + batch, 0.1, 1.0);
    const fb::cuda::tensor<float, fb::shape<fb::dyn, dyn_in>> xd(x);
    const fb::cuda::tensor<float, fb::shape<fb::dyn, dyn_out>> td(t);
    const auto [loss, grads] = vg(xd, dw_, db_, td);
    const auto& [gw, gb] = grads;
    const fbt::mse_relu_reference want = fbt::mse_relu_expected(x, w, b, t);
    CHECK(static_cast<double>(loss.to_host().flat(0)) == Approx(want.loss).epsilon(1e-4));
    check_all(gw.to_host(), want.dw, "dw");
    check_all(gb.to_host(), want.db, "db");
  }
}
