// tests/ops/special_values.cpp: every elementwise op and every reduction on +-0, +-inf, NaN,
// denormals and the largest finite values, in SIMD lanes and in scalar tails, on every path:
// eager, static, the run-time JIT (CPU), and the NVRTC CUDA rendering (NVRTC's front end without
// a GPU; with one, run on the device against the same reference: the [cuda] case).
// The semantics are docs/architecture.md's "Numeric semantics": C's <cmath> and IEEE 754 as
// PyTorch has them. The reference is written here in double, op by op (NaN propagation by hand:
// std::fmax would drop a NaN).
//
// Lanes and tails: the elementwise inputs hold every pair of the special set S once. The "lanes"
// call runs them in one tensor whose length is a multiple of the vector width VS (every element in
// a vector lane on every path); the "tails" calls run them VS - 1 at a time (every element in the
// scalar tail; on CUDA, the scalar entry). A lane and a tail must give the same bits, and eager,
// static and JIT must give the same bits. Reductions run on rows of 4 VS + 5 holding two specials
// each, one in the vector body and one in the tail, both ways round, along the last axis (row
// kernels) and along axis 0 (column kernels).
//
// The derivative ops (the *_backward ops and select_* of ops/elementwise.hpp, which autodiff emits)
// are a family of their own: g = a and the second operand b; the three-operand ones twice, once
// with g = 0.75 over (a, b) and once with g = a over (b, 1). Their references are the derivatives
// written from the math in double, with torch's choices where it makes one (below, by op).
//
// Cost: one model per op family (elementwise, derivatives, reductions), so one JIT compile
// (symbolic extents: dynamic::always) and two static programs per family.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <span>
#include <string>
#include <tuple>
#include <vector>

#include <catch2/catch.hpp>

#include <fusebox/fusebox.hpp>

#include "../support/gpu.hpp"
#include "../support/private_cache.hpp"

namespace fb = fusebox;

namespace {

constexpr std::size_t VS = xsimd::batch<float>::size;
constexpr float inf = std::numeric_limits<float>::infinity();
constexpr float nan = std::numeric_limits<float>::quiet_NaN();
constexpr float fmax_ = std::numeric_limits<float>::max();
constexpr float fmin_ = std::numeric_limits<float>::min();
constexpr float dmin = std::numeric_limits<float>::denorm_min();

// The special set, with ordinary values beside them (pow's odd and even integers, |x| < 1 and > 1).
constexpr float specials[] = {0.0f,  -0.0f, inf,   -inf,  nan,   dmin,  -dmin, 1e-40f, -1e-40f, fmin_, -fmin_,
                              fmax_, -fmax_, 1.0f, -1.0f, 0.5f,  -0.5f, 2.0f,  -2.0f,  3.0f,    -3.0f, 2.5f,
                              -2.5f, 100.0f, -100.0f};
constexpr std::size_t NS = std::size(specials);
constexpr std::size_t pairs = NS * NS;
constexpr std::size_t lanes_n = (pairs + VS - 1) / VS * VS;  // the lanes call's length
constexpr std::size_t tail_n = VS - 1;                       // each tails call's length
constexpr std::size_t tail_calls = (pairs + tail_n - 1) / tail_n;

// ---- the elementwise family: one model, the reference of each output --------------------------

auto elementwise_model = [](auto a, auto b) {
  return std::make_tuple(fb::neg(a), fb::abs(a), fb::exp(a), fb::log(a), fb::sqrt(a), fb::rsqrt(a), fb::tanh(a),
                         fb::sigmoid(a), fb::relu(a), fb::gelu(a), fb::gelu_tanh(a), fb::silu(a), fb::add(a, b),
                         fb::sub(a, b), fb::mul(a, b), fb::div(a, b), fb::pow(a, b), fb::maximum(a, b),
                         fb::minimum(a, b), fb::eq(a, b), fb::ne(a, b), fb::lt(a, b), fb::le(a, b), fb::gt(a, b),
                         fb::ge(a, b), fb::where(a, b, fb::neg(b)), fb::where(fb::ne(a, a), 0.0f, a));
};

// grad: approx, with the absolute part scaled by |g| (= |a|): g times a derivative near 0 (silu' at
// -100 is a float denormal) keeps the derivative's absolute error, times g.
enum class cmp { exact, approx, pow, grad };
struct op_ref {
  const char* name;
  cmp how;
  double (*f)(double, double);
  /// The pairs the reference holds for (null: all). A derivative that reads its forward result y
  /// is checked where the forward can give that y; a formula's intermediate that float can't hold
  /// while the result fits (torch's formulas share it) is left out and said so.
  bool (*valid)(double, double) = nullptr;
};
bool isnan2(double a, double b) { return std::isnan(a) || std::isnan(b); }
constexpr double qnan = std::numeric_limits<double>::quiet_NaN();
const op_ref elementwise_refs[] = {
    {"neg", cmp::exact, [](double a, double) { return -a; }},
    {"abs", cmp::exact, [](double a, double) { return std::fabs(a); }},
    {"exp", cmp::approx, [](double a, double) { return std::exp(a); }},
    {"log", cmp::approx, [](double a, double) { return std::log(a); }},
    {"sqrt", cmp::exact, [](double a, double) { return std::sqrt(a); }},
    {"rsqrt", cmp::approx, [](double a, double) { return 1 / std::sqrt(a); }},
    {"tanh", cmp::approx, [](double a, double) { return std::tanh(a); }},
    {"sigmoid", cmp::approx, [](double a, double) { return 1 / (1 + std::exp(-a)); }},
    // torch.relu: NaN stays NaN; x < 0 ? 0 : x (so -0 stays -0).
    {"relu", cmp::exact, [](double a, double) { return a < 0 ? 0.0 : a; }},
    {"gelu", cmp::approx,
     [](double a, double) { return std::isinf(a) && a < 0 ? -0.0 : 0.5 * a * (1 + std::erf(a / std::sqrt(2.0))); }},
    {"gelu_tanh", cmp::approx,
     [](double a, double) {
       const double k = std::sqrt(2.0 / 3.14159265358979323846);
       return std::isinf(a) && a < 0 ? -0.0 : 0.5 * a * (1 + std::tanh(k * (a + 0.044715 * a * a * a)));
     }},
    {"silu", cmp::approx, [](double a, double) { return std::isinf(a) && a < 0 ? -0.0 : a / (1 + std::exp(-a)); }},
    {"add", cmp::exact, [](double a, double b) { return a + b; }},
    {"sub", cmp::exact, [](double a, double b) { return a - b; }},
    {"mul", cmp::exact, [](double a, double b) { return a * b; }},
    {"div", cmp::exact, [](double a, double b) { return a / b; }},
    {"pow", cmp::pow, [](double a, double b) { return std::pow(a, b); }},
    // torch.maximum / torch.minimum: NaN in either operand gives NaN; ties (+-0) give a.
    {"maximum", cmp::exact, [](double a, double b) { return isnan2(a, b) ? qnan : (a < b ? b : a); }},
    {"minimum", cmp::exact, [](double a, double b) { return isnan2(a, b) ? qnan : (b < a ? b : a); }},
    {"eq", cmp::exact, [](double a, double b) { return a == b ? 1.0 : 0.0; }},
    {"ne", cmp::exact, [](double a, double b) { return a != b ? 1.0 : 0.0; }},
    {"lt", cmp::exact, [](double a, double b) { return a < b ? 1.0 : 0.0; }},
    {"le", cmp::exact, [](double a, double b) { return a <= b ? 1.0 : 0.0; }},
    {"gt", cmp::exact, [](double a, double b) { return a > b ? 1.0 : 0.0; }},
    {"ge", cmp::exact, [](double a, double b) { return a >= b ? 1.0 : 0.0; }},
    // where(c, a, b): a NaN condition is non-zero (C's c != 0, torch's bool(NaN)).
    {"where", cmp::exact, [](double a, double b) { return a != 0 ? b : -b; }},
    {"where(ne(a, a), 0, a)", cmp::exact, [](double a, double) { return a != a ? 0.0 : a; }},
};
constexpr std::size_t n_elementwise = std::size(elementwise_refs);
static_assert(std::tuple_size_v<decltype(elementwise_model(fb::tensor<float, fb::shape<1>>{},
                                                           fb::tensor<float, fb::shape<1>>{}))> == n_elementwise);

// ---- the derivative family: the ops autodiff emits, as nodes of their own ------------------------

template <class Op, class... X>
auto op(const X&... xs) {
  return fb::detail::make_pointwise<Op>(std::source_location::current(), xs...);
}
auto backward_model = [](auto a, auto b) {
  namespace o = fb::ops;
  return std::make_tuple(
      op<o::abs_backward>(a, b), op<o::sqrt_backward>(a, b), op<o::rsqrt_backward>(a, b),
      op<o::tanh_backward>(a, b), op<o::sigmoid_backward>(a, b), op<o::relu_backward>(a, b),
      op<o::gelu_backward>(a, b), op<o::gelu_tanh_backward>(a, b), op<o::silu_backward>(a, b),
      op<o::where_backward_true>(a, b), op<o::where_backward_false>(a, b),
      op<o::div_rhs_backward>(0.75f, a, b), op<o::div_rhs_backward>(a, b, 1.0f),
      op<o::pow_base_backward>(0.75f, a, b), op<o::pow_base_backward>(a, b, 1.0f),
      op<o::pow_exponent_backward>(0.75f, a, b), op<o::pow_exponent_backward>(a, b, 2.0f),
      op<o::select_ge>(0.75f, a, b), op<o::select_ge>(a, b, 1.0f), op<o::select_gt>(0.75f, a, b),
      op<o::select_gt>(a, b, 1.0f), op<o::select_le>(0.75f, a, b), op<o::select_le>(a, b, 1.0f),
      op<o::select_lt>(0.75f, a, b), op<o::select_lt>(a, b, 1.0f), op<o::select_eq>(0.75f, a, b),
      op<o::select_eq>(a, b, 1.0f));
};

constexpr double pi = 3.14159265358979323846;
/// x beyond +-inf's reach: gelu', gelu_tanh' and silu' at +-inf are their limits (1; 0, and -0 for
/// silu, from below), where torch's formulas give inf * 0 = NaN (see ops/elementwise.hpp).
double limit_or(double x, double at_minus_inf, double at_inf, double value) {
  return std::isinf(x) ? (x < 0 ? at_minus_inf : at_inf) : value;
}
/// The three-operand derivatives f(g, a, b), in the two placements of the model.
template <double (*F)(double, double, double)>
constexpr double g_ab(double a, double b) { return F(0.75, a, b); }
template <double (*F)(double, double, double)>
constexpr double ab_1(double a, double b) { return F(a, b, 1.0); }
template <double (*F)(double, double, double)>
constexpr double ab_2(double a, double b) { return F(a, b, 2.0); }
double div_rhs(double g, double y, double b) { return -g * y / b; }
// torch's pow_backward masks b = 0 to 0 (b a^(b-1) would be 0 * inf at a = 0).
double pow_base(double g, double a, double b) { return b == 0 ? g * 0.0 : g * b * std::pow(a, b - 1); }
// torch's pow_backward_exponent is 0 where the base is 0 and the exponent >= 0 (then y is +-0 or 1).
double pow_exponent(double g, double y, double x) {
  return x == 0 && std::fabs(y) <= 1 ? 0.0 : g * y * std::log(x);
}
double select_ge(double g, double a, double b) { return a >= b ? g : 0.0; }
double select_gt(double g, double a, double b) { return a > b ? g : 0.0; }
double select_le(double g, double a, double b) { return a <= b ? g : 0.0; }
double select_lt(double g, double a, double b) { return a < b ? g : 0.0; }
double select_eq(double g, double a, double b) { return a == b ? g : 0.0; }

// g = a; y (the forward result) or x (its operand) = b.
const op_ref backward_refs[] = {
    // torch: g * sgn(x), sgn(+-0) = sgn(NaN) = 0, so a NaN or inf g gives NaN at x = +-0 or NaN.
    {"abs_backward(g, x)", cmp::exact,
     [](double g, double x) { return x > 0 ? g : x < 0 ? -g : g * 0.0; }},
    // torch: g / (2 y): +-inf at y = +-0, NaN for g = 0 there.
    // y = sqrt(x): NaN, -0, [0, 1.9e19] or inf.
    {"sqrt_backward(g, y)", cmp::grad, [](double g, double y) { return g / (2 * y); },
     [](double, double y) { return y == INFINITY || (!(y < 0) && !(y > 2e19)); }},
    // y = rsqrt(x): NaN, +-inf (x = +-0) or [0, 8.5e22].
    {"rsqrt_backward(g, y)", cmp::grad, [](double g, double y) { return -0.5 * g * y * y * y; },
     [](double, double y) { return std::isinf(y) || (!(y < 0) && !(y > 8.5e22)); }},
    {"tanh_backward(g, y)", cmp::grad, [](double g, double y) { return g * (1 - y * y); },
     [](double, double y) { return !(std::fabs(y) > 1); }},
    {"sigmoid_backward(g, y)", cmp::grad, [](double g, double y) { return g * y * (1 - y); },
     [](double, double y) { return !(y < 0) && !(y > 1); }},
    // torch's threshold_backward: y <= 0 ? 0 : g, so relu's gradient at NaN (y = NaN) is g.
    {"relu_backward(g, y)", cmp::exact, [](double g, double y) { return y <= 0 ? 0.0 : g; }},
    {"gelu_backward(g, x)", cmp::grad,
     [](double g, double x) {
       return g * limit_or(x, 0, 1, 0.5 * (1 + std::erf(x / std::sqrt(2.0))) + x * std::exp(-0.5 * x * x) / std::sqrt(2 * pi));
     }},
    {"gelu_tanh_backward(g, x)", cmp::grad,
     [](double g, double x) {
       const double k = std::sqrt(2 / pi), c = 0.044715, t = std::tanh(k * (x + c * x * x * x));
       return g * limit_or(x, 0, 1, 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * k * (1 + 3 * c * x * x));
     }},
    {"silu_backward(g, x)", cmp::grad,
     [](double g, double x) {
       const double s = 1 / (1 + std::exp(-x));
       return g * limit_or(x, -0.0, 1, s * (1 + x * (1 - s)));
     }},
    // torch's where_backward: where(c, g, 0); a NaN condition is true, as in the forward.
    {"where_backward_true(g, c)", cmp::exact, [](double g, double c) { return c != 0 ? g : 0.0; }},
    {"where_backward_false(g, c)", cmp::exact, [](double g, double c) { return c != 0 ? 0.0 : g; }},
    // y = a / b: no y != 0 whose dividend a = y b would be below float's denormals (-g y underflows).
    {"div_rhs_backward(0.75, y, b)", cmp::approx, g_ab<div_rhs>,
     [](double y, double b) {
       return !(y != 0 && std::isfinite(y) && std::isfinite(b) && std::fabs(y * b) < dmin);
     }},
    {"div_rhs_backward(g, y, 1)", cmp::grad, ab_1<div_rhs>},
    // Not where a^(b-1) overflows float while 0.75 b a^(b-1) fits (a denormal base, b near 0).
    {"pow_base_backward(0.75, a, b)", cmp::pow, g_ab<pow_base>,
     [](double a, double b) {
       const double p = std::pow(a, b - 1);
       return !(std::isfinite(p) && std::fabs(p) > fmax_ && std::fabs(0.75 * b * p) <= fmax_);
     }},
    {"pow_base_backward(g, a, 1)", cmp::pow, ab_1<pow_base>},
    {"pow_exponent_backward(0.75, y, x)", cmp::approx, g_ab<pow_exponent>},
    // Base 2, not 1: pow(1, e) is 1, so a y != 1 over base 1 is no forward's (and g y overflows
    // before the * log(1) = 0).
    {"pow_exponent_backward(g, y, 2)", cmp::grad, ab_2<pow_exponent>},
    // The masks of maximum, minimum and the extremum reductions: IEEE comparisons, so a NaN operand
    // masks g to 0 (ties go to a, as in their forward; torch splits a tie and passes g at NaN).
    {"select_ge(0.75, a, b)", cmp::exact, g_ab<select_ge>},
    {"select_ge(g, a, 1)", cmp::exact, ab_1<select_ge>},
    {"select_gt(0.75, a, b)", cmp::exact, g_ab<select_gt>},
    {"select_gt(g, a, 1)", cmp::exact, ab_1<select_gt>},
    {"select_le(0.75, a, b)", cmp::exact, g_ab<select_le>},
    {"select_le(g, a, 1)", cmp::exact, ab_1<select_le>},
    {"select_lt(0.75, a, b)", cmp::exact, g_ab<select_lt>},
    {"select_lt(g, a, 1)", cmp::exact, ab_1<select_lt>},
    {"select_eq(0.75, a, b)", cmp::exact, g_ab<select_eq>},
    {"select_eq(g, a, 1)", cmp::exact, ab_1<select_eq>},
};
static_assert(std::tuple_size_v<decltype(backward_model(fb::tensor<float, fb::shape<1>>{},
                                                        fb::tensor<float, fb::shape<1>>{}))> ==
              std::size(backward_refs));

std::uint32_t bits(float x) { return std::bit_cast<std::uint32_t>(x); }
bool same_bits(float x, float y) { return bits(x) == bits(y) || (std::isnan(x) && std::isnan(y)); }

/// Whether got matches the double reference r: NaN exactly where r is NaN; +-inf exactly; exact
/// ops bit for bit (the sign of zero included); the transcendental ops to float's few ulps
/// (vmath, or the CUDA library on the device); pow to xsimd's exp(b log a).
bool matches(float got, double r, cmp how, double scale = 1) {
  const float rf = static_cast<float>(r);
  if (std::isnan(rf) || std::isnan(got)) return std::isnan(rf) && std::isnan(got);
  if (how == cmp::exact) return bits(got) == bits(rf);
  if (std::isinf(rf) || std::isinf(got)) return got == rf;
  const double rel = how == cmp::pow ? 2e-5 : 4e-6;
  return std::fabs(static_cast<double>(got) - r) <= 2e-7 * scale + rel * std::fabs(r);
}

/// The operands of pair p: a = S[p / NS], b = S[p % NS]; padding past the pairs is 1.
float operand_a(std::size_t p) { return p < pairs ? specials[p / NS] : 1.0f; }
float operand_b(std::size_t p) { return p < pairs ? specials[p % NS] : 1.0f; }

/// Results by output and pair, of one path in one placement (lanes or tails).
using results = std::vector<std::vector<float>>;

template <class Outs>
void gather(const Outs& outs, std::size_t first, std::size_t count, results& r) {
  [&]<std::size_t... K>(std::index_sequence<K...>) {
    ((void)[&] {
      for (std::size_t i = 0; i < count && first + i < pairs; ++i) r[K][first + i] = std::get<K>(outs).flat(i);
    }(), ...);
  }(std::make_index_sequence<std::tuple_size_v<Outs>>{});
}

void check_reference(std::span<const op_ref> refs, const results& r, const std::string& what) {
  for (std::size_t k = 0; k < refs.size(); ++k) {
    std::size_t bad = 0;
    std::string first;
    for (std::size_t p = 0; p < pairs; ++p) {
      const double a = operand_a(p), b = operand_b(p);
      const double ref = refs[k].f(a, b);
      if (refs[k].valid && !refs[k].valid(a, b)) continue;
      if (!matches(r[k][p], ref, refs[k].how, refs[k].how == cmp::grad ? std::max(1.0, std::fabs(a)) : 1.0) &&
          bad++ == 0)
        first = "(" + std::to_string(a) + ", " + std::to_string(b) + "): got " + std::to_string(r[k][p]) +
                ", reference " + std::to_string(ref);
    }
    INFO(refs[k].name << " (" << what << "): " << bad << " of " << pairs << " wrong; first " << first);
    CHECK(bad == 0);
  }
}

void check_same(std::span<const op_ref> refs, const results& x, const results& y, const std::string& what) {
  for (std::size_t k = 0; k < refs.size(); ++k) {
    std::size_t bad = 0, first = 0;
    for (std::size_t p = 0; p < pairs; ++p)
      if (!same_bits(x[k][p], y[k][p]) && bad++ == 0) first = p;
    INFO(refs[k].name << ": " << what << ": " << bad << " differ; first (" << operand_a(first) << ", "
                                  << operand_b(first) << "): " << x[k][first] << " vs " << y[k][first]);
    CHECK(bad == 0);
  }
}

template <class Tensor>
void fill_pairs(Tensor& a, Tensor& b, std::size_t first) {
  for (std::size_t i = 0; i < a.size(); ++i) {
    a.flat(i) = operand_a(first + i);
    b.flat(i) = operand_b(first + i);
  }
}

/// A tensor of n elements: dyn tensors take n, static ones know it.
template <class Tensor>
Tensor make(std::size_t n) {
  if constexpr (std::is_constructible_v<Tensor, std::size_t>) return Tensor(n);
  else return Tensor{};
}

/// Runs f(a, b) over every pair: once as one lanes call, once as tails calls.
template <class Tensor, class TailTensor, class F>
std::pair<results, results> run_elementwise(F&& f) {
  constexpr std::size_t n = std::tuple_size_v<decltype(f(std::declval<Tensor&>(), std::declval<Tensor&>()))>;
  std::pair<results, results> out{results(n, std::vector<float>(pairs)), results(n, std::vector<float>(pairs))};
  {
    Tensor a = make<Tensor>(lanes_n);
    Tensor b = make<Tensor>(lanes_n);
    fill_pairs(a, b, 0);
    gather(f(a, b), 0, lanes_n, out.first);
  }
  for (std::size_t c = 0; c < tail_calls; ++c) {
    TailTensor a = make<TailTensor>(tail_n);
    TailTensor b = make<TailTensor>(tail_n);
    fill_pairs(a, b, c * tail_n);
    gather(f(a, b), c * tail_n, tail_n, out.second);
  }
  return out;
}

// ---- the reductions: rows of 4 VS + 5 with two specials each ------------------------------------

auto reduce_model = [](auto x) {
  return std::make_tuple(fb::sum(x), fb::mean(x), fb::max(x), fb::min(x), fb::sum(x, fb::axis<0>),
                         fb::mean(x, fb::axis<0>), fb::max(x, fb::axis<0>), fb::min(x, fb::axis<0>));
};
constexpr const char* reduce_names[] = {"sum", "mean", "max", "min", "sum axis 0", "mean axis 0", "max axis 0", "min axis 0"};
constexpr float row_specials[] = {nan, inf, -inf, 0.0f, -0.0f, fmax_, -fmax_, dmin, -1e-40f, 1.0f};
constexpr std::size_t NR = std::size(row_specials);
constexpr std::size_t W = 4 * VS + 5;
constexpr std::size_t R = 2 * NR * NR;
constexpr std::size_t lane_col = 3, tail_col = W - 2;  // in the vector body; in the scalar tail

template <class Tensor>
void fill_rows(Tensor& x) {
  std::uint64_t s = 12345;
  for (std::size_t i = 0; i < R * W; ++i) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    x.flat(i) = static_cast<float>(static_cast<double>(s >> 11) / 9007199254740992.0 * 2 - 1);
  }
  for (std::size_t r = 0; r < R; ++r) {
    const std::size_t pair = r / 2;
    const float u = row_specials[pair / NR], v = row_specials[pair % NR];
    x.flat(r * W + (r % 2 ? tail_col : lane_col)) = u;
    x.flat(r * W + (r % 2 ? lane_col : tail_col)) = v;
  }
}

/// The reference of reduction k (0..3 along the last axis, 4..7 along axis 0) at output i, and
/// whether a finite result is compared to a tolerance (sum, mean) or exactly (max, min).
double reduce_ref(const std::vector<float>& x, std::size_t k, std::size_t i, double* scale) {
  const bool rows = k < 4;
  const std::size_t n = rows ? W : R;
  double s = 0, abs_sum = 0, mx = -INFINITY, mn = INFINITY;
  bool any_nan = false;
  for (std::size_t j = 0; j < n; ++j) {
    const double v = rows ? x[i * W + j] : x[j * W + i];
    any_nan |= std::isnan(v);
    s += v;
    abs_sum += std::fabs(v);
    mx = v > mx ? v : mx;
    mn = v < mn ? v : mn;
  }
  *scale = abs_sum;
  if (any_nan) return qnan;
  switch (k % 4) {
    case 0: return s;
    // A float sum that overflowed stays inf when divided (the accumulator is float, as torch's).
    case 1: return std::isinf(static_cast<float>(s)) ? s : s / static_cast<double>(n);
    case 2: return mx;
    default: return mn;
  }
}

template <class Outs>
void check_reductions(const Outs& outs, const std::vector<float>& x, const std::string& what) {
  [&]<std::size_t... K>(std::index_sequence<K...>) {
    ((void)[&] {
      const auto& y = std::get<K>(outs);
      std::size_t bad = 0;
      std::string first;
      for (std::size_t i = 0; i < y.size(); ++i) {
        double scale = 0;
        const double r = reduce_ref(x, K, i, &scale);
        const float g = y.flat(i), rf = static_cast<float>(r);
        bool ok;
        if (std::isnan(rf) || std::isnan(g)) ok = std::isnan(rf) && std::isnan(g);
        else if (std::isinf(rf) || std::isinf(g)) ok = g == rf;
        else if (K % 4 >= 2) ok = g == rf;  // max, min: exact; +0 and -0 compare equal (see the docs)
        else ok = std::fabs(g - r) <= 1e-6 * scale + 1e-30;
        if (!ok && bad++ == 0) first = "at " + std::to_string(i) + ": got " + std::to_string(g) + ", reference " + std::to_string(r);
      }
      INFO(reduce_names[K] << " (" << what << "): " << bad << " of " << y.size() << " wrong; first " << first);
      CHECK(bad == 0);
    }(), ...);
  }(std::make_index_sequence<std::tuple_size_v<Outs>>{});
}

template <class Outs>
std::vector<std::vector<float>> flatten(const Outs& outs) {
  std::vector<std::vector<float>> v;
  std::apply([&](const auto&... y) { (v.push_back([&] {
    std::vector<float> f(y.size());
    for (std::size_t i = 0; i < y.size(); ++i) f[i] = y.flat(i);
    return f;
  }()), ...); }, outs);
  return v;
}

using vec = fb::tensor<float, fb::shape<fb::dyn>>;
using mat = fb::tensor<float, fb::shape<fb::dyn, W>>;

/// The program the run-time path makes of `model` over the given leaves (for the CUDA rendering).
template <class Tuple>
struct program_of;
template <class... E>
struct program_of<std::tuple<E...>> {
  using type = fb::cpu::program<float, E...>;
};

/// Every kernel of the model's program rendered for CUDA with the extents symbolic.
template <class Prog>
void render_cuda(std::vector<fb::jit::rendered_cuda_kernel>& out, std::size_t inputs) {
  using D = fb::jit::dynamic_function<Prog, fb::jit::cuda_target>;
  fb::jit::guard g;
  g.pattern.assign(inputs, fb::dims{});
  for (std::size_t i = 0; i < Prog::N; ++i) {
    const auto& n = Prog::nodes[i];
    if (n.desc.kind != fb::node_kind::input) continue;
    fb::dims d = n.desc.shape;
    if (d.extent[0] == fb::dyn) d.extent[0] = fb::symbol(0);
    g.pattern[n.desc.input_index] = d;
  }
  g.unit_inner.assign(inputs, true);
  g.aligned.assign(inputs, true);
  typename D::program_t p;
  D::specialise_into(p, g);
  for (int k = 0; k < p.plan.n_kernels; ++k)
    if (D::generated(p.plan.kernels[k]))
      out.push_back(fb::jit::render_cuda_kernel(p.nodes, p.plan, k, fb::dtype::f32, p.unit_inner));
}

}  // namespace

namespace {
/// One family on every CPU path, lanes and tails, against its reference table and across paths.
template <class Model>
void check_family(Model model, std::span<const op_ref> refs) {
  fbt::use_private_cache("fusebox-special-");
  const auto eager = run_elementwise<vec, vec>(fb::eager(model));
  auto compiled = fb::compile(model);
  const auto statik =
      run_elementwise<fb::tensor<float, fb::shape<lanes_n>>, fb::tensor<float, fb::shape<tail_n>>>(compiled);
  auto jit = fb::compile(model, fb::options{.dynamic = fb::dynamic::always});
  const auto dynamic = run_elementwise<vec, vec>(jit);
  for (const auto& [r, name] : {std::pair{&eager, "eager"}, {&statik, "static"}, {&dynamic, "JIT"}}) {
    check_reference(refs, r->first, std::string(name) + ", lanes");
    check_reference(refs, r->second, std::string(name) + ", tails");
    check_same(refs, r->first, r->second, std::string(name) + ": lane == tail");
  }
  check_same(refs, eager.first, statik.first, "eager == static (lanes)");
  check_same(refs, eager.first, dynamic.first, "eager == JIT (lanes)");
  check_same(refs, eager.second, dynamic.second, "eager == JIT (tails)");
}
}  // namespace

TEST_CASE("special values: every elementwise op, lanes and tails, eager == static == JIT == C/IEEE reference",
          "[ops][special]") {
  check_family(elementwise_model, elementwise_refs);
}

TEST_CASE("special values: every derivative op (*_backward, select_*), lanes and tails, eager == static == JIT == "
          "reference from the math", "[ops][special][autodiff]") {
  check_family(backward_model, backward_refs);
}

TEST_CASE("special values: sum, mean, max, min over rows and columns, a special in the body and one in the tail, "
          "eager == static == JIT == reference (NaN propagates)", "[ops][special]") {
  fbt::use_private_cache("fusebox-special-");
  fb::tensor<float, fb::shape<R, W>> xs;
  fill_rows(xs);
  mat xd(R);
  std::vector<float> x(R * W);
  for (std::size_t i = 0; i < R * W; ++i) x[i] = xd.flat(i) = xs.flat(i);
  const auto e = fb::eager(reduce_model)(xd);
  const auto s = fb::compile(reduce_model)(xs);
  const auto j = fb::compile(reduce_model, fb::options{.dynamic = fb::dynamic::always})(xd);
  check_reductions(e, x, "eager");
  check_reductions(s, x, "static");
  check_reductions(j, x, "JIT");
  const auto fe = flatten(e), fs = flatten(s), fj = flatten(j);
  for (std::size_t k = 0; k < fe.size(); ++k) {
    INFO(reduce_names[k]);
    std::size_t bad = 0;
    for (std::size_t i = 0; i < fe[k].size(); ++i)
      bad += !(fe[k][i] == fs[k][i] || (std::isnan(fe[k][i]) && std::isnan(fs[k][i]))) ||
             !(fe[k][i] == fj[k][i] || (std::isnan(fe[k][i]) && std::isnan(fj[k][i])));
    CHECK(bad == 0);
  }
}

TEST_CASE("special values: the CUDA rendering of both families compiles with NVRTC (front end only without a GPU)",
          "[ops][special][codegen]") {
  if (!fb::cuda::nvrtc_available()) {
    WARN("NVRTC not found: skipped");
    return;
  }
  using A = fb::input_leaf<0, float, fb::shape<fb::dyn>>;
  using B = fb::input_leaf<1, float, fb::shape<fb::dyn>>;
  using X = fb::input_leaf<0, float, fb::shape<fb::dyn, W>>;
  std::vector<fb::jit::rendered_cuda_kernel> kernels;
  render_cuda<typename program_of<decltype(elementwise_model(A{}, B{}))>::type>(kernels, 2);
  render_cuda<typename program_of<decltype(backward_model(A{}, B{}))>::type>(kernels, 2);
  render_cuda<typename program_of<decltype(reduce_model(X{}))>::type>(kernels, 1);
  CHECK(!kernels.empty());
  try {
    const std::string source = fb::jit::make_cuda_unit(kernels).source;
    if (fb::cuda::available()) CHECK(!fb::cuda::nvrtc_compile(source, "special_values", "sm_90").cubin.empty());
    else fb::cuda::nvrtc_check(source, "special_values", "compute_90", fbt::nvrtc_front_end_only);
  } catch (const fb::cuda::nvrtc_error& e) {
    FAIL(e.what());
  }
}

TEST_CASE("special values on the GPU: every elementwise op (vector and scalar entries) and every reduction against "
          "the same reference", "[cuda][special]") {
  if (!fb::cuda::available()) {
    WARN("no CUDA device: skipped (the device spellings were checked by NVRTC in the [codegen] case)");
    return;
  }
  using dvec = fb::cuda::tensor<float, fb::shape<fb::dyn>>;
  const auto on_gpu = [&](auto model_fn, std::span<const op_ref> refs) {
    auto model = fb::compile(model_fn);
    const auto on_device = [&](const vec& a, const vec& b) {
      const auto outs = model(dvec(a), dvec(b));
      return std::apply([](const auto&... y) { return std::make_tuple(y.to_host()...); }, outs);
    };
    const auto cuda = run_elementwise<vec, vec>(on_device);
    check_reference(refs, cuda.first, "CUDA, vector entry");
    check_reference(refs, cuda.second, "CUDA, scalar entry");
  };
  on_gpu(elementwise_model, elementwise_refs);
  on_gpu(backward_model, backward_refs);

  fb::tensor<float, fb::shape<R, W>> xs;
  fill_rows(xs);
  mat xd(R);
  std::vector<float> x(R * W);
  for (std::size_t i = 0; i < R * W; ++i) x[i] = xd.flat(i) = xs.flat(i);
  const auto outs = fb::compile(reduce_model)(fb::cuda::tensor<float, fb::shape<fb::dyn, W>>(xd));
  check_reductions(std::apply([](const auto&... y) { return std::make_tuple(y.to_host()...); }, outs), x, "CUDA");
}
