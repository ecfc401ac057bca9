// tests/compile/compositions.cpp: compile() on a fixed menu of composite models that combine
// elementwise ops, reductions (with keepdim broadcast back), views and matmuls in the shapes that
// stress the planner (plan/planner.hpp): a node used twice, a reduction feeding another reduction, a
// pointwise node with consumers in two different kernels, a matmul read by two epilogue ops, column
// reductions with consumers, views of intermediates, and several outputs.
//
// Each model: compiled with 1, 2 and 4 threads (bitwise identical: rows go to one thread each, column
// blocks and gemm tiles do not change any element's arithmetic); against eager on the same float
// values (norm-wise 1e-5); and against the same model run eagerly in double (norm-wise 1e-5). The
// shapes (120 x 300) give several row tasks and several column blocks, so the thread counts split
// the work differently.
//
// tests/CMakeLists.txt builds the whole menu once (the three parts share most of their
// instantiations: 86 CPU-s whole, 137 in parts); FUSEBOX_TEST_PART=1 (elementwise ops, row
// reductions), 2 (reductions of reductions, views, nodes read by two kernels) or 3 (matmuls)
// builds one part alone.
#include <cmath>
#include <string>
#include <tuple>

#include <catch2/catch.hpp>

#include <fusebox/fusebox.hpp>

#include "../support/check.hpp"

namespace fb = fusebox;

namespace {

constexpr std::size_t R = 120, C = 300, H = 17;

struct inputs {
  fb::tensor<float, fb::shape<R, C>> x, y;
  fb::tensor<float, fb::shape<C>> v;
  fb::tensor<float, fb::shape<C, H>> w;
  fb::tensor<float, fb::shape<H, C>> u;
  inputs() {
    fbt::fill_signed(x, 1, 0.05, 1.0);
    fbt::fill_signed(y, 2, 0.05, 1.0);
    fbt::fill_signed(v, 3, 0.05, 1.0);
    fbt::fill_signed(w, 4, 0.01, 0.1);
    fbt::fill_signed(u, 5, 0.01, 0.1);
  }
};

template <class Out>
auto as_tuple(const Out& o) {
  if constexpr (fb::is_tensor_v<Out>) return std::tie(o);
  else return o;
}

/// Compares every output of a and b with `cmp(a_k, b_k, k)`.
template <class A, class B, class Cmp>
void each_output(const A& a, const B& b, Cmp cmp) {
  const auto ta = as_tuple(a);
  const auto tb = as_tuple(b);
  static_assert(std::tuple_size_v<decltype(ta)> == std::tuple_size_v<decltype(tb)>);
  fbt::for_each_index<std::tuple_size_v<decltype(ta)>>([&](auto k) { cmp(std::get<k>(ta), std::get<k>(tb), k); });
}

/// The checks above for model m(x, y, v, w, u).
template <class Model>
void check_composition(const std::string& name, Model m) {
  static const inputs in;
  INFO("composition: " << name);
  const auto c1 = fb::compile(m, {.threads = 1})(in.x, in.y, in.v, in.w, in.u);
  const auto c2 = fb::compile(m, {.threads = 2})(in.x, in.y, in.v, in.w, in.u);
  const auto c4 = fb::compile(m, {.threads = 4})(in.x, in.y, in.v, in.w, in.u);
  const auto e = fb::eager(m)(fbt::to_dyn(in.x), fbt::to_dyn(in.y), fbt::to_dyn(in.v), fbt::to_dyn(in.w),
                              fbt::to_dyn(in.u));
  const auto ref = fb::eager(m)(fbt::to_double_dyn(in.x), fbt::to_double_dyn(in.y), fbt::to_double_dyn(in.v),
                                fbt::to_double_dyn(in.w), fbt::to_double_dyn(in.u));
  each_output(c1, c2, [&](const auto& a, const auto& b, std::size_t k) {
    fbt::check_identical(a, b, name + ", output " + std::to_string(k) + ": 1 thread == 2 threads");
  });
  each_output(c1, c4, [&](const auto& a, const auto& b, std::size_t k) {
    fbt::check_identical(a, b, name + ", output " + std::to_string(k) + ": 1 thread == 4 threads");
  });
  each_output(c1, e, [&](const auto& a, const auto& b, std::size_t k) {
    INFO("output " << k << ", compiled against eager");
    CHECK(fbt::rel_diff(a, b) <= 1e-5);
  });
  each_output(c1, ref, [&](const auto& a, const auto& b, std::size_t k) {
    INFO("output " << k << ", compiled against eager in double");
    CHECK(fbt::rel_diff(a, b) <= 1e-5);
  });
  each_output(e, ref, [&](const auto& a, const auto& b, std::size_t k) {
    INFO("output " << k << ", eager against eager in double");
    CHECK(fbt::rel_diff(a, b) <= 1e-5);
  });
}

}  // namespace

// The model parameters are (x [R, C], y [R, C], v [C], w [C, H], u [H, C]); unused ones are fine.
#define FBT_MODEL(...) [](auto x, auto y, auto v, auto w, auto u) { \
  (void)x; (void)y; (void)v; (void)w; (void)u;                       \
  __VA_ARGS__                                                        \
}

#ifndef FUSEBOX_TEST_PART
#define FUSEBOX_TEST_PART 0
#endif

#if FUSEBOX_TEST_PART == 0 || FUSEBOX_TEST_PART == 1
TEST_CASE("compositions: nodes used twice and reductions broadcast back", "[compile][compositions]") {
  check_composition("t * t + t, t = x * y", FBT_MODEL(const auto t = x * y; return t * t + t;));
  check_composition("x - mean(x, -1, keepdim)", FBT_MODEL(return x - fb::mean(x, fb::axis<-1>, fb::keepdim);));
  check_composition("rms: sqrt(|x| + 1) * rsqrt(sum(x x, -1, keepdim) + 1)",
                    FBT_MODEL(return fb::sqrt(fb::abs(x) + 1.0) *
                                     fb::rsqrt(fb::sum(x * x, fb::axis<-1>, fb::keepdim) + 1.0);));
  check_composition("sum(exp(x), 0, keepdim) * x",
                    FBT_MODEL(return fb::sum(fb::exp(x), fb::axis<0>, fb::keepdim) * x;));
  check_composition("elu(x) * sum(y, -1, keepdim)",
                    FBT_MODEL(return fb::where(fb::lt(x, 0.0), fb::exp(x) - 1.0, x) *
                                     fb::sum(y, fb::axis<-1>, fb::keepdim);));
  check_composition("gelu_tanh(x) - silu(y) * 0.5 + pow(|x| + 0.5, y)",
                    FBT_MODEL(return fb::gelu_tanh(x) - fb::silu(y) * 0.5 + fb::pow(fb::abs(x) + 0.5, y);));
  check_composition("log_softmax(x * v)", FBT_MODEL(return fb::log_softmax(x * v);));
  check_composition("layer_norm(x + y, v, v, 1e-5)", FBT_MODEL(return fb::layer_norm(x + y, v, v, 1e-5);));
}

#endif

#if FUSEBOX_TEST_PART == 0 || FUSEBOX_TEST_PART == 2
TEST_CASE("compositions: reductions feeding reductions", "[compile][compositions]") {
  check_composition("sum(max(x, -1, keepdim) * y, 0)",
                    FBT_MODEL(return fb::sum(fb::max(x, fb::axis<-1>, fb::keepdim) * y, fb::axis<0>);));
  check_composition("mean(sum(x * y, -1), 0) (rank 0)",
                    FBT_MODEL(return fb::mean(fb::sum(x * y, fb::axis<-1>), fb::axis<0>);));
  check_composition("min(x, 0) + max(y, 0)", FBT_MODEL(return fb::min(x, fb::axis<0>) + fb::max(y, fb::axis<0>);));
  check_composition("sum over the middle axis of reshape<[30, 4, C]>(x * y)",
                    FBT_MODEL(return fb::sum(fb::reshape<fb::shape<R / 4, 4, C>>(x * y), fb::axis<1>);));
}

TEST_CASE("compositions: views of intermediates, column means broadcast back", "[compile][compositions]") {
  check_composition("where(x > y, x - mean(x, 0, keepdim), y)",
                    FBT_MODEL(return fb::where(fb::gt(x, y), x - fb::mean(x, fb::axis<0>, fb::keepdim), y);));
  check_composition("softmax of a transposed intermediate",
                    FBT_MODEL(return fb::softmax(fb::transpose(x * y));));
}
TEST_CASE("compositions: a pointwise node read by two kernels", "[compile][compositions]") {
  check_composition("t / sum(|t|, 0, keepdim) + max(t, -1, keepdim), t = tanh(x)",
                    FBT_MODEL(const auto t = fb::tanh(x);
                              return t / fb::sum(fb::abs(t), fb::axis<0>, fb::keepdim) +
                                     fb::max(t, fb::axis<-1>, fb::keepdim);));
  check_composition("column normalisation: c * rsqrt(mean(c c, 0, keepdim) + 1e-5), c = x - mean(x, 0)",
                    FBT_MODEL(const auto c = x - fb::mean(x, fb::axis<0>, fb::keepdim);
                              return c * fb::rsqrt(fb::mean(c * c, fb::axis<0>, fb::keepdim) + 1e-5);));
  check_composition("two outputs: softmax(x) and its column sums",
                    FBT_MODEL(const auto s = fb::softmax(x); return std::make_tuple(s, fb::sum(s, fb::axis<0>));));
}

#endif

#if FUSEBOX_TEST_PART == 0 || FUSEBOX_TEST_PART == 3
TEST_CASE("compositions: matmuls", "[compile][compositions]") {
  check_composition("softmax(x w)", FBT_MODEL(return fb::softmax(fb::matmul(x, w));));
  check_composition("relu(m) * sigmoid(m), m = x w",
                    FBT_MODEL(const auto m = fb::matmul(x, w); return fb::relu(m) * fb::sigmoid(m);));
  check_composition("x w + mean(x, -1, keepdim)",
                    FBT_MODEL(return fb::matmul(x, w) + fb::mean(x, fb::axis<-1>, fb::keepdim);));
  check_composition("residual MLP: gelu(x w) u + x",
                    FBT_MODEL(return fb::matmul(fb::gelu(fb::matmul(x, w)), u) + x;));
  check_composition("attention: softmax(x y^T * 0.05) x",
                    FBT_MODEL(return fb::matmul(fb::softmax(fb::matmul(x, fb::transpose(y)) * 0.05), x);));
}
#endif
