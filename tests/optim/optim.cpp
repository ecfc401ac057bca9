// tests/optim/optim.cpp: the fused optimizers (include/fusebox/optim/) against double-precision
// references of torch's update formulas (written out here element by element, independently of
// the library's loop), several steps with fresh random gradients each step, every element of
// every parameter and of the optimizer state; parameters of odd sizes and one larger than a chunk,
// in two groups with different options; float within rounding of the reference, double to 1e-12.
// Also: learning-rate schedules (values, and the optimizer following them mid-run), bad input
// (gradient count and shapes, invalid hyperparameters) with errors that name what is wrong.
#include <cmath>
#include <cstdio>
#include <string>
#include <tuple>
#include <vector>

#include <catch2/catch.hpp>

#include <fusebox/core/tensor.hpp>
#include <fusebox/optim/adamw.hpp>
#include <fusebox/optim/lr_scheduler.hpp>
#include <fusebox/optim/sgd.hpp>

#include "../support/check.hpp"

namespace fb = fusebox;

namespace {

// Three parameters: odd sizes (vector tails), and one over a chunk (16384) so a parameter is split
// across tasks.
template <class T>
struct params {
  fb::tensor<T, fb::shape<37, 19>> a;
  fb::tensor<T, fb::shape<19>> b;
  fb::tensor<T, fb::shape<3, 5501>> c;  // 16503 elements: two chunks
  explicit params(std::uint64_t seed) {
    fbt::fill_signed(a, seed + 1, 0.1, 1.0);
    fbt::fill_signed(b, seed + 2, 0.1, 1.0);
    fbt::fill_signed(c, seed + 3, 0.1, 1.0);
  }
  auto grads(std::uint64_t seed) const {
    std::tuple<fb::tensor<T, fb::shape<37, 19>>, fb::tensor<T, fb::shape<19>>, fb::tensor<T, fb::shape<3, 5501>>> g;
    fbt::fill_signed(std::get<0>(g), seed + 11, 0.01, 2.0);
    fbt::fill_signed(std::get<1>(g), seed + 12, 0.01, 2.0);
    fbt::fill_signed(std::get<2>(g), seed + 13, 0.01, 2.0);
    return g;
  }
};

std::vector<double> to_vector(const auto& t) {
  std::vector<double> v(t.size());
  for (std::size_t i = 0; i < t.size(); ++i) v[i] = static_cast<double>(t.flat(i));
  return v;
}

/// Compares every element; reports the first that is off and how many are.
template <class T>
void check_close(const std::string& what, const T* got, const std::vector<double>& ref, double abs, double rel) {
  std::size_t bad = 0;
  std::string first;
  for (std::size_t i = 0; i < ref.size(); ++i) {
    const double g = static_cast<double>(got[i]);
    if (!(std::fabs(g - ref[i]) <= abs + rel * std::fabs(ref[i])) && bad++ == 0) {
      char buf[160];
      std::snprintf(buf, sizeof buf, "element %zu: got %.17g, reference %.17g", i, g, ref[i]);
      first = buf;
    }
  }
  INFO(what << ": " << bad << " of " << ref.size() << " elements off; first: " << first);
  CHECK(bad == 0);
}

// ---- double references of torch's formulas (torch/optim/adamw.py and sgd.py, single-tensor) ----

struct adam_ref {
  std::vector<double> p, m, v, vmax;
  void step(const std::vector<double>& grad, const fb::optim::adamw_options& o, int t) {
    if (m.empty()) m.assign(p.size(), 0), v.assign(p.size(), 0), vmax.assign(p.size(), 0);
    const double bc1 = 1 - std::pow(o.beta1, t), bc2 = 1 - std::pow(o.beta2, t);
    for (std::size_t i = 0; i < p.size(); ++i) {
      const double g = o.maximize ? -grad[i] : grad[i];
      p[i] *= 1 - o.lr * o.weight_decay;
      m[i] = o.beta1 * m[i] + (1 - o.beta1) * g;
      v[i] = o.beta2 * v[i] + (1 - o.beta2) * g * g;
      double s = v[i];
      if (o.amsgrad) s = vmax[i] = std::max(vmax[i], v[i]);
      p[i] -= o.lr / bc1 * m[i] / (std::sqrt(s) / std::sqrt(bc2) + o.eps);
    }
  }
};

struct sgd_ref {
  std::vector<double> p, buf;
  void step(const std::vector<double>& grad, const fb::optim::sgd_options& o) {
    const bool first = buf.empty();
    if (first) buf.assign(p.size(), 0);
    for (std::size_t i = 0; i < p.size(); ++i) {
      double d = o.maximize ? -grad[i] : grad[i];
      if (o.weight_decay != 0) d += o.weight_decay * p[i];
      if (o.momentum != 0) {
        buf[i] = first ? d : o.momentum * buf[i] + (1 - o.dampening) * d;
        d = o.nesterov ? d + o.momentum * buf[i] : buf[i];
      }
      p[i] -= o.lr * d;
    }
  }
};

template <class T>
double tol_rel() {
  return std::is_same_v<T, float> ? 2e-5 : 1e-12;
}

/// Two groups: {a, b} with options o1, {c} with o2; five steps; every element of the parameters and
/// of the first state buffer against the reference after each step.
template <class T, class Opt, class Options, class Ref, class StepRef>
void run_against_reference(const std::string& what, Options o1, Options o2, StepRef step_ref) {
  params<T> p(100);
  fb::nn::parameter_list<T> g1, g2;
  g1.add("a", p.a);
  g1.add("b", p.b);
  g2.add("c", p.c);
  Opt opt(g1, o1);
  opt.add_param_group(g2, o2);
  Ref ref[3];
  ref[0].p = to_vector(p.a), ref[1].p = to_vector(p.b), ref[2].p = to_vector(p.c);
  for (int t = 1; t <= 5; ++t) {
    const auto grads = p.grads(1000 + 17 * static_cast<std::uint64_t>(t));
    opt.step(grads);
    step_ref(ref[0], to_vector(std::get<0>(grads)), o1, t);
    step_ref(ref[1], to_vector(std::get<1>(grads)), o1, t);
    step_ref(ref[2], to_vector(std::get<2>(grads)), o2, t);
    const T* data[3] = {p.a.data(), p.b.data(), p.c.data()};
    for (int k = 0; k < 3; ++k) {
      const std::string w = what + ", step " + std::to_string(t) + ", parameter " + std::to_string(k);
      // A float step's error relative to the parameter is ~lr * eps_float per step: tol on the
      // parameters' scale.
      check_close(w, data[k], ref[k].p, tol_rel<T>(), tol_rel<T>());
    }
  }
}

}  // namespace

TEMPLATE_TEST_CASE("optim: AdamW matches torch's update formulas in double, every element, 5 steps", "", float,
                   double) {
  using T = TestType;
  const fb::optim::adamw_options o1{.lr = 1e-2, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .weight_decay = 0.05};
  const fb::optim::adamw_options o2{.lr = 3e-3, .beta1 = 0.8, .beta2 = 0.99, .eps = 1e-6, .weight_decay = 0.3};
  auto step_ref = [](adam_ref& r, const std::vector<double>& g, const fb::optim::adamw_options& o, int t) { r.step(g, o, t); };
  run_against_reference<T, fb::optim::adamw<T>, fb::optim::adamw_options, adam_ref>("adamw", o1, o2, step_ref);
  auto ams1 = o1, ams2 = o2;
  ams1.amsgrad = true;
  ams2.maximize = true;
  run_against_reference<T, fb::optim::adamw<T>, fb::optim::adamw_options, adam_ref>("adamw amsgrad / maximize", ams1,
                                                                                     ams2, step_ref);
}

TEST_CASE("optim: AdamW's moments are torch's exp_avg and exp_avg_sq") {
  params<double> p(200);
  fb::nn::parameter_list<double> list;
  list.add("b", p.b);
  fb::optim::adamw opt(list, {.lr = 1e-2});
  adam_ref ref;
  ref.p = to_vector(p.b);
  for (int t = 1; t <= 3; ++t) {
    const auto grads = p.grads(50 + static_cast<std::uint64_t>(t));
    opt.step(std::get<1>(grads));  // one parameter: a bare tensor
    ref.step(to_vector(std::get<1>(grads)), opt.param_group(0).options, t);
  }
  check_close("exp_avg", opt.state(0, 0), ref.m, 1e-15, 1e-13);
  check_close("exp_avg_sq", opt.state(1, 0), ref.v, 1e-15, 1e-13);
  CHECK(opt.param_group(0).step == 3);
}

TEMPLATE_TEST_CASE("optim: SGD (momentum, dampening, nesterov, weight decay, maximize) matches torch's formulas", "",
                   float, double) {
  using T = TestType;
  auto step_ref = [](sgd_ref& r, const std::vector<double>& g, const fb::optim::sgd_options& o, int) { r.step(g, o); };
  const fb::optim::sgd_options plain{.lr = 0.05};
  const fb::optim::sgd_options momentum{.lr = 0.03, .momentum = 0.9, .dampening = 0.1, .weight_decay = 0.01};
  const fb::optim::sgd_options nesterov{.lr = 0.02, .momentum = 0.8, .weight_decay = 0.05, .nesterov = true};
  const fb::optim::sgd_options maximize{.lr = 0.01, .momentum = 0.5, .maximize = true};
  run_against_reference<T, fb::optim::sgd<T>, fb::optim::sgd_options, sgd_ref>("sgd plain / momentum", plain, momentum,
                                                                                step_ref);
  run_against_reference<T, fb::optim::sgd<T>, fb::optim::sgd_options, sgd_ref>("sgd nesterov / maximize", nesterov,
                                                                                maximize, step_ref);
}

TEST_CASE("optim: one fused pass covers every parameter; results do not depend on the thread count") {
  params<float> p1(300), p2(300);
  fb::nn::parameter_list<float> l1, l2;
  l1.add("a", p1.a), l1.add("b", p1.b), l1.add("c", p1.c);
  l2.add("a", p2.a), l2.add("b", p2.b), l2.add("c", p2.c);
  fb::optim::adamw o1(l1, {.lr = 1e-2, .threads = 1});
  fb::optim::adamw o2(l2, {.lr = 1e-2, .threads = 2});
  CHECK(o1.tasks() == 1 + 1 + 2);  // chunks of 16384 elements at most
  for (int t = 0; t < 3; ++t) {
    const auto g = p1.grads(400 + static_cast<std::uint64_t>(t));
    o1.step(g);
    o2.step(g);
  }
  fbt::check_identical(p1.a, p2.a, "a, 1 vs 2 threads");
  fbt::check_identical(p1.c, p2.c, "c, 1 vs 2 threads");
}

TEST_CASE("optim: learning-rate schedules follow torch's closed forms, and the optimizer uses the new lr") {
  using namespace fb::optim;
  const step_lr st{.step_size = 2, .gamma = 0.5};
  CHECK(st(1.0, 0) == 1.0);
  CHECK(st(1.0, 1) == 1.0);
  CHECK(st(1.0, 2) == 0.5);
  CHECK(st(1.0, 5) == 0.25);
  const cosine_annealing_lr cos{.t_max = 10, .eta_min = 0.1};
  CHECK(cos(1.0, 0) == Approx(1.0).epsilon(1e-15));
  CHECK(cos(1.0, 5) == Approx(0.55).epsilon(1e-14));
  CHECK(cos(1.0, 10) == Approx(0.1).epsilon(1e-14));
  CHECK(cos(1.0, 3) == Approx(0.1 + 0.9 * (1 + std::cos(3.14159265358979323846 * 0.3)) / 2).epsilon(1e-14));
  const linear_lr warm{.start_factor = 0.25, .end_factor = 1.0, .total_iters = 4};
  CHECK(warm(2.0, 0) == 0.5);
  CHECK(warm(2.0, 2) == 1.25);
  CHECK(warm(2.0, 4) == 2.0);
  CHECK(warm(2.0, 9) == 2.0);
  const sequential_lr warm_cos{warm, cosine_annealing_lr{.t_max = 6}, 4};
  CHECK(warm_cos(2.0, 3) == warm(2.0, 3));
  CHECK(warm_cos(2.0, 4) == Approx(2.0).epsilon(1e-15));
  CHECK(warm_cos(2.0, 7) == Approx(1.0).epsilon(1e-14));

  // The optimizer follows the schedule step by step (the lr is a run-time scalar of its pass).
  params<double> p(500);
  fb::nn::parameter_list<double> list;
  list.add("a", p.a);
  adamw opt(list, {.lr = 0.1, .weight_decay = 0.02});
  scheduler sched(opt, sequential_lr{linear_lr{.start_factor = 0.5, .total_iters = 2}, step_lr{.step_size = 1, .gamma = 0.7}, 2});
  adam_ref ref;
  ref.p = to_vector(p.a);
  for (int t = 1; t <= 5; ++t) {
    const auto g = p.grads(600 + static_cast<std::uint64_t>(t));
    auto o = opt.param_group(0).options;
    opt.step(std::get<0>(g));
    ref.step(to_vector(std::get<0>(g)), o, t);
    sched.step();
  }
  CHECK(sched.last_lr() == Approx(0.1 * 0.7 * 0.7 * 0.7).epsilon(1e-14));
  check_close("adamw under a schedule", p.a.data(), ref.p, 1e-12, 1e-12);
}

TEST_CASE("optim: wrong gradients and invalid hyperparameters are clear errors") {
  params<float> p(700);
  fb::nn::parameter_list<float> list;
  list.add("layer.weight", p.a);
  list.add("layer.bias", p.b);
  fb::optim::adamw opt(list);
  const auto g = p.grads(800);
  // Shapes swapped: the message names the gradient, the parameter, both shapes and this file.
  CHECK_THROWS_WITH(opt.step(std::tie(std::get<1>(g), std::get<0>(g))),
                    Catch::Contains("adamw::step: gradient 0 is [19] but parameter 0 ('layer.weight') is [37, 19]") &&
                        Catch::Contains("optim.cpp"));
  CHECK_THROWS_AS(opt.step(std::tie(std::get<1>(g), std::get<0>(g))), fb::shape_error);
  CHECK_THROWS_WITH(opt.step(std::get<0>(g)), Catch::Contains("1 gradients for 2 parameters"));
  CHECK(opt.param_group(0).step == 0);  // refused steps do not count
  // A transposed (non-contiguous) gradient of the right extents.
  fb::tensor<float, fb::shape<19, 37>> gt;
  fbt::fill_signed(gt, 1, 0.1, 1.0);
  const auto transposed = gt.transpose();
  CHECK_THROWS_WITH(opt.step(std::tie(transposed, std::get<1>(g))), Catch::Contains("not contiguous"));

  fb::optim::sgd s(list, {.lr = 0.1});
  CHECK_THROWS_WITH(s.step(std::tie(std::get<0>(g), std::get<0>(g))),
                    Catch::Contains("sgd::step: gradient 1 is [37, 19] but parameter 1 ('layer.bias') is [19]"));
  CHECK_THROWS_WITH(fb::optim::sgd(list, {.lr = -1}), Catch::Contains("invalid learning rate"));
  CHECK_THROWS_WITH(fb::optim::sgd(list, {.lr = 0.1, .nesterov = true}), Catch::Contains("nesterov"));
  CHECK_THROWS_WITH(fb::optim::adamw(list, {.beta2 = 1.0}), Catch::Contains("beta parameter at index 1"));
  CHECK_THROWS_WITH(list.add("layer.bias", p.b), Catch::Contains("'layer.bias' is used twice"));
  // A group added after a step would lose the state: refused. An invalid lr set later (a schedule
  // gone wrong) is refused at the step, before any parameter or step count changes.
  fb::optim::adamw stepped(list, {.lr = 1e-3});
  stepped.step(std::tie(std::get<0>(g), std::get<1>(g)));
  fb::nn::parameter_list<float> more;
  more.add("c", p.c);
  CHECK_THROWS_WITH(stepped.add_param_group(more, {}), Catch::Contains("after a step"));
  stepped.param_group(0).options.lr = -0.5;
  const auto before = p.a.clone();
  CHECK_THROWS_WITH(stepped.step(std::tie(std::get<0>(g), std::get<1>(g))), Catch::Contains("invalid learning rate"));
  CHECK(stepped.param_group(0).step == 1);
  fbt::check_identical(p.a, before, "parameters after a refused step");
  fb::nn::parameter_list<float> empty;
  CHECK_THROWS_WITH(fb::optim::adamw(empty), Catch::Contains("no parameters"));
}
