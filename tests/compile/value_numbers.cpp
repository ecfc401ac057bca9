// tests/compile/value_numbers.cpp: a value computed once in the user's code is computed once per
// compiled call (ir/value_numbers.hpp, plan step 5 in plan/planner.hpp, backend/cpu/executor.hpp's
// skippable kernels and row-group twins), and twins that hold different values stay apart.
//
// Laws: a user function whose result softmax copies four times runs once per call, on the static
// and on the run-time path, as in eager; two opaque() calls run twice; a captured weight's product
// read twice is one matmul kernel (profile spans); layer_norm's output, which softmax copies into
// each pass, is computed once per pass set (one max pass run, by the plan); nodes of one type
// holding different scalars or tensors give the double reference's values, element by element.
#include <cmath>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include <fusebox/fusebox.hpp>

#include "../support/check.hpp"

namespace fb = fusebox;
using fbt::coord;

namespace {

int calls = 0;  // user-function calls, counted by the opaque() bodies below

template <std::size_t R, std::size_t C>
fb::tensor<float, fb::shape<R, C>> doubled(const fb::tensor<float, fb::shape<R, C>>& t) {
  ++calls;
  fb::tensor<float, fb::shape<R, C>> r;
  for (std::size_t i = 0; i < t.size(); ++i) r.flat(i) = 2 * t.flat(i);
  return r;
}

/// softmax over the last axis of a row-major [rows, cols] array in double.
std::vector<double> softmax_rows(std::vector<double> v, std::size_t cols) {
  for (std::size_t r = 0; r < v.size() / cols; ++r) {
    double m = -INFINITY, s = 0;
    for (std::size_t c = 0; c < cols; ++c) m = std::max(m, v[r * cols + c]);
    for (std::size_t c = 0; c < cols; ++c) s += std::exp(v[r * cols + c] - m);
    for (std::size_t c = 0; c < cols; ++c) v[r * cols + c] = std::exp(v[r * cols + c] - m) / s;
  }
  return v;
}

std::vector<double> layer_norm_rows(std::vector<double> v, std::size_t cols, const float* g, const float* b, double eps) {
  for (std::size_t r = 0; r < v.size() / cols; ++r) {
    double mean = 0, var = 0;
    for (std::size_t c = 0; c < cols; ++c) mean += v[r * cols + c];
    mean /= double(cols);
    for (std::size_t c = 0; c < cols; ++c) var += (v[r * cols + c] - mean) * (v[r * cols + c] - mean);
    var /= double(cols);
    for (std::size_t c = 0; c < cols; ++c) v[r * cols + c] = (v[r * cols + c] - mean) / std::sqrt(var + eps) * g[c] + b[c];
  }
  return v;
}

template <class T, class S>
std::vector<double> as_double(const fb::tensor<T, S>& t) {
  std::vector<double> v(t.size());
  for (std::size_t i = 0; i < t.size(); ++i) v[i] = t.flat(i);
  return v;
}

template <class S>
void check_against(const fb::tensor<float, S>& got, const std::vector<double>& ref, double tol, const std::string& what) {
  const fb::dims d = got.extents();
  fbt::check_all(got, [&](const coord& idx) {
    std::size_t flat = 0;
    for (std::size_t k = 0; k < d.rank; ++k) flat = flat * d.extent[k] + idx[k];
    return ref[flat];
  }, fbt::tol{tol, tol}, what);
}

int count(const std::string& text, const std::string& what) {
  int n = 0;
  for (std::size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

/// Kernel spans of the last profiled calls whose name starts with `prefix`.
int kernel_spans(const std::string& prefix) {
  int n = 0;
  for (const auto& e : fb::profile::events())
    if (e.category == "kernel" && e.name.rfind(prefix, 0) == 0) ++n;
  return n;
}

}  // namespace

TEST_CASE("a user function whose result softmax copies runs once per compiled call", "[compile][value_numbers]") {
  fb::tensor<float, fb::shape<6, 19>> x;  // 19 columns: vector lanes and a scalar tail
  fbt::fill_signed(x, 101, 0.1, 2.0);
  auto model = [](const auto& v) { return fb::softmax(fb::opaque([](const auto& t) { return doubled(t); }, v)); };
  std::vector<double> ref = as_double(x);
  for (double& e : ref) e *= 2;
  ref = softmax_rows(ref, 19);

  calls = 0;
  const auto eager = model(x);
  CHECK(calls == 1);

  auto f = fb::compile(model);
  for (int call = 0; call < 3; ++call) {
    calls = 0;
    const auto y = f(x);
    CHECK(calls == 1);
    check_against(y, ref, 1e-6, "softmax(opaque(2x)) compiled");
  }
  check_against(eager, ref, 1e-6, "softmax(opaque(2x)) eager");
  // explain lists the user function once, and its copies as that kernel.
  const std::string text = fb::explain_text(model, x);
  INFO(text);
  CHECK(count(text, "[opaque] opaque") == 1);
  CHECK(count(text, "[opaque] = kernel") == 3);

  SECTION("on the run-time path too (dyn rows)") {
    fb::tensor<float, fb::shape<fb::dyn, 19>> xd(fb::dims{2, {6, 19}});
    for (std::size_t i = 0; i < x.size(); ++i) xd.flat(i) = x.flat(i);
    auto dyn_model = [](const auto& v) {
      return fb::softmax(fb::opaque(
          [](const auto& t) {
            ++calls;
            fb::tensor<float, fb::shape<fb::dyn, 19>> r(t.extents());
            for (std::size_t i = 0; i < t.size(); ++i) r.flat(i) = 2 * t.flat(i);
            return r;
          },
          v));
    };
    auto g = fb::compile(dyn_model);
    calls = 0;
    const auto y = g(xd);
    CHECK(calls == 1);
    check_against(y, ref, 1e-6, "softmax(opaque(2x)) on the run-time path");
  }
}

TEST_CASE("two opaque() calls on the same value run twice", "[compile][value_numbers]") {
  fb::tensor<float, fb::shape<4, 21>> x;
  fbt::fill_signed(x, 102, 0.1, 2.0);
  auto model = [](const auto& v) {
    auto twice = [](const auto& t) { return doubled(t); };
    return fb::opaque(twice, v) + fb::opaque(twice, v);  // two calls: a function may count or draw
  };
  auto f = fb::compile(model);
  calls = 0;
  const auto y = f(x);
  CHECK(calls == 2);
  std::vector<double> ref = as_double(x);
  for (double& e : ref) e *= 4;
  check_against(y, ref, 0, "opaque(2x) + opaque(2x)");
}

TEST_CASE("a captured weight's product read twice is one matmul kernel", "[compile][value_numbers]") {
  fb::tensor<float, fb::shape<8, 24>> x;
  fb::tensor<float, fb::shape<24, 20>> w, w2;
  fbt::fill_signed(x, 103, 0.1, 1.0);
  fbt::fill_signed(w, 104, 0.1, 1.0);
  fbt::fill_signed(w2, 105, 0.1, 1.0);
  // h is one value read twice; x·w and x·w2 are one type holding two values.
  auto model = [&](const auto& v) {
    const auto h = fb::matmul(v, w);
    return h + fb::relu(h) * fb::matmul(v, w2);
  };
  std::vector<double> ref(8 * 20);
  for (std::size_t i = 0; i < 8; ++i)
    for (std::size_t j = 0; j < 20; ++j) {
      double h = 0, h2 = 0;
      for (std::size_t k = 0; k < 24; ++k) {
        h += double(x(i, k)) * w(k, j);
        h2 += double(x(i, k)) * w2(k, j);
      }
      ref[i * 20 + j] = h + std::max(h, 0.0) * h2;
    }
  auto f = fb::compile(model);
  (void)f(x);  // first call: buffers
  fb::profile::clear();
  fb::profile::start();
  const auto y = f(x);
  fb::profile::stop();
  check_against(y, ref, 1e-5, "h + relu(h) * x w2");
  CHECK(kernel_spans("matmul") == 2);  // x·w once, x·w2 once (three matmul nodes)
  fb::profile::clear();
}

TEST_CASE("layer_norm then softmax computes the normalised row once", "[compile][value_numbers]") {
  fb::tensor<float, fb::shape<5, 37>> x;  // 37 columns: lanes and a tail
  fb::tensor<float, fb::shape<37>> gamma, beta;
  fbt::fill_signed(x, 106, 0.1, 3.0);
  fbt::fill_uniform(gamma, 107, 0.5, 1.5);
  fbt::fill_signed(beta, 108, 0.1, 0.5);
  auto one = [&](const auto& v) { return fb::softmax(fb::layer_norm(v, gamma, beta, 1e-5f)); };
  const auto ref = softmax_rows(layer_norm_rows(as_double(x), 37, gamma.data(), beta.data(), 1e-5), 37);
  auto f = fb::compile(one);
  check_against(f(x), ref, 1e-6, "softmax(layer_norm(x))");

  // The plan: softmax's second max over the row is a twin of the first, and every copy of
  // layer_norm's output reads the first copy.
  using P = fb::cpu::program<float, decltype(one(fb::input_leaf<0, float, fb::shape<5, 37>>{}))>;
  int twin_passes = 0, twins = 0;
  for (std::size_t i = 0; i < P::N; ++i) {
    twins += P::plan.same_as[i] >= 0;
    twin_passes += P::plan.same_as[i] >= 0 && P::nodes[i].desc.kind == fb::node_kind::reduce;
  }
  CHECK(twin_passes == 1);
  CHECK(twins >= 10);
  CHECK(P::plan.kernels[0].twins);
  const std::string text = fb::explain_text(one, x);
  INFO(text);
  CHECK(count(text, "max") == 1);
  CHECK(count(text, "4 reduction pass(es)") == 1);

  SECTION("and twins holding different values stay apart") {
    // Two layer_norms of one type, eps 1e-5 and 0.5: twins by type, not by value.
    auto two = [&](const auto& v) {
      return fb::softmax(fb::layer_norm(v, gamma, beta, 1e-5f)) + fb::softmax(fb::layer_norm(v, gamma, beta, 0.5f));
    };
    const auto ref2 = softmax_rows(layer_norm_rows(as_double(x), 37, gamma.data(), beta.data(), 0.5), 37);
    std::vector<double> sum(ref.size());
    for (std::size_t i = 0; i < sum.size(); ++i) sum[i] = ref[i] + ref2[i];
    auto g = fb::compile(two);
    check_against(g(x), sum, 2e-6, "softmax(layer_norm(x, 1e-5)) + softmax(layer_norm(x, 0.5))");
    // The same model with equal eps: the twins are one value.
    auto same = [&](const auto& v) {
      return fb::softmax(fb::layer_norm(v, gamma, beta, 1e-5f)) + fb::softmax(fb::layer_norm(v, gamma, beta, 1e-5f));
    };
    std::vector<double> twice(ref.size());
    for (std::size_t i = 0; i < twice.size(); ++i) twice[i] = 2 * ref[i];
    check_against(fb::compile(same)(x), twice, 2e-6, "twice softmax(layer_norm(x, 1e-5))");
  }
}

TEST_CASE("scalars and tensors of one type with different values are each computed", "[compile][value_numbers]") {
  fb::tensor<float, fb::shape<3, 17>> x;
  fb::tensor<float, fb::shape<17>> a, b;
  fbt::fill_signed(x, 109, 0.1, 2.0);
  fbt::fill_signed(a, 110, 0.1, 2.0);
  fbt::fill_signed(b, 111, 0.1, 2.0);
  // x * 0.5 and x * 0.7 are one type; so are x * a and x * b; the sums also reduce per row.
  auto model = [&](const auto& v) {
    const auto s = v * 0.5f + v * 0.7f + v * a - v * b;
    return s / fb::sum(fb::exp(v * 0.5f) + fb::exp(v * 0.7f), fb::axis<-1>, fb::keepdim);
  };
  std::vector<double> ref(x.size());
  for (std::size_t r = 0; r < 3; ++r) {
    double den = 0;
    for (std::size_t c = 0; c < 17; ++c) den += std::exp(double(x(r, c)) * 0.5) + std::exp(double(x(r, c)) * double(0.7f));
    for (std::size_t c = 0; c < 17; ++c) {
      const double v = x(r, c);
      ref[r * 17 + c] = (v * 0.5 + v * double(0.7f) + v * a(c) - v * b(c)) / den;
    }
  }
  check_against(fb::compile(model)(x), ref, 2e-6, "x*0.5 + x*0.7 + x*a - x*b over a row sum");
}
