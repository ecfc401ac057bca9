// Differential fuzzing of the run-time path at scale: seeded random programs are generated as IR
// at run time (no template instantiation per program, so hundreds fit in a CI run), planned by
// the one planner, rendered, compiled in one run of the host compiler, and run through
// jit::program, specialised to their extents and with the row extents symbolic. Each result is
// checked element by element against a double-precision interpreter of the same IR.
// The programs read inputs of rank 1 to 3 and give results of rank 0 to 3: pointwise ops with
// broadcasting, reductions along every axis with and without keepdim (row and column kernels),
// reductions of reductions (the outer one reading the inner one's result, or that result
// broadcast into its input), softmax, layer_norm and matmul epilogues.
// (tests/jit/fuzz.cpp runs a smaller set of type-level programs eagerly and statically too.)
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <future>
#include <limits>
#include <map>
#include <memory>
#include <set>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <catch2/catch.hpp>

#include <fusebox/fusebox.hpp>

#include "../support/gpu.hpp"
#include "../support/prelude_seed.hpp"

namespace {

namespace fb = fusebox;
constexpr std::size_t NB = 64;  // node capacity of a generated program
// How many: tests/CMakeLists.txt's FUSEBOX_FUZZ_IR_PROGRAMS (200 in CI; a deeper local run takes
// more). The coverage floors at the end scale with the count.
#ifndef FUSEBOX_FUZZ_IR_PROGRAMS
#define FUSEBOX_FUZZ_IR_PROGRAMS 200
#endif
constexpr int programs = FUSEBOX_FUZZ_IR_PROGRAMS;
constexpr double tolerance = 2e-4;

std::uint64_t mix(std::uint64_t z) {
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// The double-precision meaning of each op, taken from the op structs themselves (the reference
// checks the planner, the generator and the executor; vmath has its own tests against libm).
struct unary_entry {
  const char* name;
  double (*f)(double);
};
struct binary_entry {
  const char* name;
  double (*f)(double, double);
};
template <class Op>
double u(double x) { return Op::apply(x); }
template <class Op>
double b(double x, double y) { return Op::apply(x, y); }
const unary_entry unaries[] = {{"neg", u<fb::ops::neg>},         {"abs", u<fb::ops::abs>},
                               {"tanh", u<fb::ops::tanh>},       {"sigmoid", u<fb::ops::sigmoid>},
                               {"relu", u<fb::ops::relu>},       {"gelu", u<fb::ops::gelu>},
                               {"gelu_tanh", u<fb::ops::gelu_tanh>}, {"silu", u<fb::ops::silu>}};
const binary_entry binaries[] = {{"add", b<fb::ops::add>},         {"sub", b<fb::ops::sub>},
                                 {"mul", b<fb::ops::mul>},         {"maximum", b<fb::ops::maximum>},
                                 {"minimum", b<fb::ops::minimum>}};
const char* reducers[] = {"sum", "mean", "max", "min"};

/// An op's CUDA spelling by name, from the op structs (the IR built here names ops by string).
template <class... Ops>
const char* device_of(std::string_view name) {
  const char* d = "";
  ((name == Ops::name ? (d = Ops::device, 0) : 0), ...);
  return d;
}
const char* spelling(std::string_view name) {
  namespace o = fb::ops;
  return device_of<o::neg, o::abs, o::exp, o::log, o::sqrt, o::rsqrt, o::tanh, o::sigmoid, o::relu, o::gelu,
                   o::gelu_tanh, o::silu, o::add, o::sub, o::mul, o::div, o::pow, o::maximum, o::minimum, o::eq,
                   o::ne, o::lt, o::le, o::gt, o::ge, o::where, o::sum, o::mean, o::max, o::min>(name);
}

struct program_ir {
  std::array<fb::ir::node, NB> nodes{};
  int size = 0;
  int output = -1;
  std::vector<float> scalars;  // by payload slot

  int add(fb::ir::node n) {
    if (size == static_cast<int>(NB)) throw std::length_error("fuzz_ir: a generated program outgrew NB nodes");
    nodes[static_cast<std::size_t>(size)] = n;
    return size++;
  }
  const fb::dims& shape(int i) const { return nodes[static_cast<std::size_t>(i)].desc.shape; }
  int pointwise(const char* op, std::initializer_list<int> in) {
    fb::ir::node n{};
    n.desc.kind = fb::node_kind::pointwise;
    n.desc.name = op;
    n.desc.device = spelling(op);
    n.desc.flops = 4;
    fb::dims s{};
    for (int i : in) {
      n.inputs[n.n_inputs++] = i;
      const auto r = fb::broadcast(s, shape(i));
      if (!r.ok) throw std::logic_error("fuzz_ir: the generator combined shapes that do not broadcast");
      s = r.out;
    }
    n.desc.shape = s;
    return add(n);
  }
  // As the static path's reduction node (expr/node.hpp): the axis normalised, the shape from the
  // same rule specialise() applies (keepdim: extent 1; otherwise the axis is dropped).
  int reduce(const char* op, int in, int axis, bool keepdim) {
    fb::ir::node n{};
    n.desc.kind = fb::node_kind::reduce;
    n.desc.name = op;
    n.desc.device = spelling(op);
    n.desc.flops = 1;
    n.desc.axis = axis;
    n.desc.keepdim = keepdim;
    n.inputs[n.n_inputs++] = in;
    n.desc.shape = fb::detail::reduced_shape(shape(in), axis, keepdim);
    return add(n);
  }
  int scalar(float v) {
    fb::ir::node n{};
    n.desc.kind = fb::node_kind::scalar;
    n.desc.name = "scalar";
    n.payload_slot = static_cast<int>(scalars.size());
    scalars.push_back(v);
    return add(n);
  }
  int matmul(int a, int bm) {
    fb::ir::node n{};
    n.desc.kind = fb::node_kind::matmul;
    n.desc.name = "matmul";
    n.inputs[n.n_inputs++] = a;
    n.inputs[n.n_inputs++] = bm;
    n.desc.shape = fb::detail::matmul_shape(shape(a), shape(bm)).out;
    return add(n);
  }
};

// The generator builds shapes over the labels B, R and C (and 1), written as three distinct
// extents that no test uses: fb::broadcast then refuses what would only work when two extents
// happen to be equal (R = C = 1, say), so every program is valid for all extents and for symbolic
// ones. The test specialises the IR to the real extents before planning and interpreting it.
constexpr std::size_t label_b = 1000003, label_r = 1000033, label_c = 1000037;
const fb::dims shape_x3{3, {label_b, label_r, label_c}}, shape_x{2, {label_r, label_c}}, shape_w{1, {label_c}},
    shape_m{2, {label_c, label_c}};

/// One reduction between two shapes of the generator's world.
struct reduction_rule {
  fb::dims from;
  int axis;
  bool keepdim;
  fb::dims to;
};

/// Every shape a program can reach from x3 [B, R, C], x [R, C] and w [C] by reductions (any axis,
/// keepdim or not), with the reductions between them and each shape's distance from an input.
struct shape_world {
  std::vector<fb::dims> shapes;
  std::vector<int> distance;
  std::vector<reduction_rule> rules;

  shape_world() {
    shapes = {shape_x3, shape_x, shape_w};
    distance = {0, 0, 0};
    for (std::size_t i = 0; i < shapes.size(); ++i)
      for (int axis = 0; axis < static_cast<int>(shapes[i].rank); ++axis)
        for (const bool keepdim : {true, false}) {
          const fb::dims from = shapes[i], to = fb::detail::reduced_shape(from, axis, keepdim);
          rules.push_back({from, axis, keepdim, to});
          if (index(to) < 0) {
            shapes.push_back(to);
            distance.push_back(distance[i] + 1);
          }
        }
  }
  int index(const fb::dims& s) const {
    for (std::size_t i = 0; i < shapes.size(); ++i)
      if (shapes[i] == s) return static_cast<int>(i);
    return -1;
  }
  int distance_of(const fb::dims& s) const { return distance[static_cast<std::size_t>(index(s))]; }
};
const shape_world& world() {
  static const shape_world w;
  return w;
}

bool broadcasts_into(const fb::dims& s, const fb::dims& want) {
  const auto r = fb::broadcast(s, want);
  return r.ok && r.out == want;
}

/// Would a column kernel over `space` read a reduction's result (its shape, axis and keepdim)
/// wrongly if it took the strides of its own reduction for it (reduced axis zeroed, the kept axes
/// lined up from the left) instead of an operand's (lined up from the right)? It did until
/// f1f7d61: a column sum of a column sum summed the first row only.
bool misread_as_own(const fb::dims& value, int axis, bool keepdim, const fb::dims& space) {
  const fb::strided<float> at{nullptr, value, fb::contiguous_strides(value)};
  std::ptrdiff_t own[fb::max_rank] = {}, right[fb::max_rank] = {};
  fb::cpu::reduced_space_strides(at, space, static_cast<std::size_t>(axis), keepdim, own);
  fb::cpu::space_strides(at, space, right);
  for (std::size_t d = 0; d < space.rank; ++d)
    if (space.extent[d] > 1 && own[d] != right[d]) return true;
  return false;
}

/// A random program over x [R, C] (input 0), w [C] (input 1), m [C, C] (input 2) and x3 [B, R, C]
/// (input 3). Its result has the shape [R, C] or [B, R, C], or in a tenth of the programs any
/// shape reductions reach, and in a tenth rank 0; operands of a smaller shape (reductions along
/// any axis, keepdim or not, and reductions of reductions) broadcast against it.
program_ir generate(std::uint64_t seed) {
  program_ir p;
  auto input = [&](std::size_t index, fb::dims s) {
    fb::ir::node n{};
    n.desc.kind = fb::node_kind::input;
    n.desc.name = "input";
    n.desc.input_index = index;
    n.desc.shape = s;
    return p.add(n);
  };
  const int x = input(0, shape_x), w = input(1, shape_w), m = input(2, shape_m), x3 = input(3, shape_x3);
  const shape_world& sw = world();
  std::uint64_t h = seed;
  auto next = [&] { return h = mix(h); };
  // Every random choice is its own statement: the order of a call's arguments is unspecified,
  // and a program must not depend on the compiler that built the test.
  auto pick = [&](const std::vector<reduction_rule>& rules) { return rules[next() % rules.size()]; };
  auto rules_where = [&](auto keep) {
    std::vector<reduction_rule> out;
    for (const auto& r : sw.rules)
      if (keep(r)) out.push_back(r);
    return out;
  };
  auto reducer = [&] { return reducers[next() % 4]; };
  auto unary = [&] { return unaries[next() % 8].name; };
  auto binary = [&] { return binaries[next() % 5].name; };
  auto factor = [&](float from) { return p.scalar(from + static_cast<float>(next() % 100) / 100.0f); };
  // A value of shape s made with few nodes: an input, or reductions of one towards s.
  std::function<int(const fb::dims&)> source = [&](const fb::dims& s) -> int {
    if (s == shape_x3) return next() % 3 == 0 ? p.pointwise("add", {x3, x}) : x3;
    if (s == shape_x) return next() % 3 == 0 ? p.pointwise("mul", {x, w}) : x;
    if (s == shape_w) return w;
    const int d = sw.distance_of(s);
    const auto r = pick(rules_where([&](const reduction_rule& q) { return q.to == s && sw.distance_of(q.from) < d; }));
    const char* op = reducer();
    return p.reduce(op, source(r.from), r.axis, r.keepdim);
  };
  // Past this many nodes a program stops growing (sources only), so it fits in NB.
  constexpr int budget = static_cast<int>(NB) - 26;
  // The cases' weights (out of 18) and a depth of 2 keep the compile time where it was before
  // reductions of reductions and rank 3 came in (depth 3 and uniform weights: 2.6 times the
  // kernels): non-keepdim and non-last-axis reductions never fuse with their consumers, so each
  // is a kernel of its own, and the host compiler's and NVRTC's time grow with the distinct
  // kernels. Measured: 1194 of them now compile in less than the 868 deeper ones before.
  std::function<int(int, const fb::dims&)> expr = [&](int depth, const fb::dims& want) -> int {
    if (depth == 0 || p.size > budget) return source(want);
    const auto sub = [&] { return expr(depth - 1, want); };
    // A reduction of a value of shape r.from: an expression when r.from is an input's shape, a
    // source otherwise (an expression there would mostly add kernels, not new patterns).
    const auto reduction = [&](const reduction_rule& r) {
      const char* op = reducer();
      const bool input_shape = r.from == shape_x3 || r.from == shape_x || r.from == shape_w;
      return p.reduce(op, input_shape ? expr(depth - 1, r.from) : source(r.from), r.axis, r.keepdim);
    };
    const bool last_c = want.rank > 0 && want.extent[want.rank - 1] == label_c;
    switch (next() % 18) {
      case 0:
      case 1: {
        const char* op = unary();
        return p.pointwise(op, {sub()});
      }
      case 2:
      case 3: {
        const char* op = binary();
        const int a = sub();
        return p.pointwise(op, {a, sub()});
      }
      case 4:
      case 5: {
        const int a = sub();
        if (!last_c) return p.pointwise("sub", {a, source(want)});
        const char* op = binary();
        return p.pointwise(op, {a, w});
      }
      case 6:
      case 7: {
        const int a = sub();
        return p.pointwise("mul", {a, factor(0.25f)});
      }
      case 8:  // any reduction that broadcasts back: a row or a column of it, or an axis dropped
      case 9: {
        const char* op = binary();
        const int a = sub();
        const auto r = pick(rules_where([&](const reduction_rule& q) { return broadcasts_into(q.to, want); }));
        return p.pointwise(op, {a, reduction(r)});
      }
      case 10: {  // softmax over the last axis: a used three times
        const int a = sub();
        if (want.rank == 0) return p.pointwise("neg", {a});
        const int axis = static_cast<int>(want.rank) - 1;
        const int e = p.pointwise("exp", {p.pointwise("sub", {a, p.reduce("max", a, axis, true)})});
        return p.pointwise("div", {e, p.reduce("sum", e, axis, true)});
      }
      case 11:
      case 12: {
        const int a = sub();
        if (last_c && want.rank >= 2) return p.pointwise("tanh", {p.matmul(a, m)});
        return p.pointwise("abs", {a});
      }
      case 13: {
        const int a = sub(), c = sub();
        return p.pointwise("where", {p.pointwise("gt", {a, c}), a, c});
      }
      case 14:
      case 15: {  // a reduction of a reduction: its input, or broadcast into its input in one kernel
        // Mostly a pair where the outer one is a column kernel that would read the inner one's
        // result wrongly with its own reduction's strides (the bug fixed in f1f7d61).
        const bool aim = next() % 4 != 0;
        std::vector<std::pair<reduction_rule, reduction_rule>> pairs, aimed;  // inner, outer
        for (const auto& outer : sw.rules)
          if (broadcasts_into(outer.to, want))
            for (const auto& inner : sw.rules)
              if ((inner.to == outer.from && !(outer.from == shape_x3)) || broadcasts_into(inner.to, outer.from)) {
                pairs.push_back({inner, outer});
                if (outer.axis + 1 < static_cast<int>(outer.from.rank) &&
                    misread_as_own(inner.to, inner.axis, inner.keepdim, outer.from))
                  aimed.push_back(pairs.back());
              }
        const auto& from = aim && !aimed.empty() ? aimed : pairs;
        const auto [inner, outer] = from[next() % from.size()];
        int t = reduction(inner);
        switch (inner.to == outer.from ? next() % 3 : 2) {
          case 0: break;
          case 1: t = p.pointwise("mul", {t, factor(0.5f)}); break;
          default: {  // the inner result broadcast against the outer reduction's input
            const char* op = binary();
            t = p.pointwise(op, {t, source(outer.from)});
            break;
          }
        }
        const char* op = reducer();
        const int r = p.reduce(op, t, outer.axis, outer.keepdim);
        if (outer.to == want && next() % 2 == 0) return r;
        const char* combine = binary();
        return p.pointwise(combine, {sub(), r});
      }
      default: {  // layer_norm over the last axis, without the affine part
        const int a = sub();
        if (want.rank == 0) return p.pointwise("tanh", {a});
        const int axis = static_cast<int>(want.rank) - 1;
        const int centered = p.pointwise("sub", {a, p.reduce("mean", a, axis, true)});
        const int var = p.reduce("mean", p.pointwise("mul", {centered, centered}), axis, true);
        return p.pointwise("mul", {centered, p.pointwise("rsqrt", {p.pointwise("add", {var, p.scalar(1e-3f)})})});
      }
    }
  };
  const std::uint64_t kind = next() % 10;
  const fb::dims result = kind < 4 ? shape_x : kind < 8 ? shape_x3 : kind == 8 ? sw.shapes[next() % sw.shapes.size()] : fb::dims{};
  p.output = expr(2, result);
  for (int i = p.size; i < static_cast<int>(NB); ++i) {
    p.nodes[static_cast<std::size_t>(i)].desc.kind = fb::node_kind::scalar;  // unused padding
    p.nodes[static_cast<std::size_t>(i)].desc.name = "unused";
  }
  return p;
}

// ---- the double-precision interpreter ----

struct dval {
  fb::dims shape;
  std::vector<double> v;
  /// The element at index idx of a result of rank `rank`, broadcasting (right-aligned, extent 1).
  double at(const std::array<std::size_t, fb::max_rank>& idx, std::size_t rank) const {
    std::size_t off = 0;
    for (std::size_t k = 0; k < shape.rank; ++k)
      off = off * shape.extent[k] + (shape.extent[k] == 1 ? 0 : idx[k + rank - shape.rank]);
    return v[off];
  }
};

std::array<std::size_t, fb::max_rank> unravel(std::size_t i, const fb::dims& d) {
  std::array<std::size_t, fb::max_rank> idx{};
  for (std::size_t k = d.rank; k-- > 0;) {
    idx[k] = i % d.extent[k];
    i /= d.extent[k];
  }
  return idx;
}

/// Replaces about one element in eight of t by a special value (+-0, +-inf, NaN, denormals),
/// chosen and placed by the seed: in vector lanes and in tails alike.
template <class Tensor>
void sprinkle_specials(Tensor& t, std::uint64_t seed) {
  constexpr float inf = std::numeric_limits<float>::infinity();
  constexpr float set[] = {0.0f, -0.0f, inf, -inf, std::numeric_limits<float>::quiet_NaN(),
                           std::numeric_limits<float>::denorm_min(), -std::numeric_limits<float>::denorm_min(), 1e-40f};
  for (std::size_t i = 0; i < t.size(); ++i) {
    const std::uint64_t h = mix(seed * 1000003 + i);
    if (h % 8 == 0) t.flat(i) = set[(h >> 8) % std::size(set)];
  }
}

/// An op's double-precision meaning, looked up once per node (the interpreter evaluates millions
/// of elements; a lookup by name for each was most of its time).
struct reference_op {
  double (*unary)(double) = nullptr;
  double (*binary)(double, double) = nullptr;
  enum { table, exp, div, rsqrt, gt, where } special = table;

  double operator()(const double* a) const {
    switch (special) {
      case exp: return fb::ops::exp::apply(a[0]);
      case div: return a[0] / a[1];
      case rsqrt: return fb::ops::rsqrt::apply(a[0]);
      case gt: return a[0] > a[1] ? 1.0 : 0.0;
      case where: return a[0] != 0 ? a[1] : a[2];
      default: return unary ? unary(a[0]) : binary(a[0], a[1]);
    }
  }
};

reference_op reference_of(std::string_view op) {
  reference_op r;
  for (const auto& e : unaries)
    if (op == e.name) r.unary = e.f;
  for (const auto& e : binaries)
    if (op == e.name) r.binary = e.f;
  if (r.unary || r.binary) return r;
  constexpr std::pair<std::string_view, decltype(r.special)> specials[] = {
      {"exp", reference_op::exp}, {"div", reference_op::div}, {"rsqrt", reference_op::rsqrt},
      {"gt", reference_op::gt},   {"where", reference_op::where}};
  for (const auto& [name, special] : specials)
    if (op == name) {
      r.special = special;
      return r;
    }
  FAIL("no reference for op " << op);
  return r;
}

/// Every node's value; `nodes` are specialised to the inputs' extents.
std::vector<dval> interpret(const std::array<fb::ir::node, NB>& nodes, int size, const std::vector<float>& scalars,
                            const std::vector<dval>& inputs) {
  std::vector<dval> val(static_cast<std::size_t>(size));
  for (int i = 0; i < size; ++i) {
    const fb::ir::node& n = nodes[static_cast<std::size_t>(i)];
    dval& r = val[static_cast<std::size_t>(i)];
    r.shape = n.desc.shape;
    r.v.assign(n.desc.shape.size(), 0.0);
    const auto in = [&](int q) -> const dval& { return val[static_cast<std::size_t>(n.inputs[q])]; };
    switch (n.desc.kind) {
      case fb::node_kind::input: r = inputs[n.desc.input_index]; break;
      case fb::node_kind::scalar: r.v = {static_cast<double>(scalars[static_cast<std::size_t>(n.payload_slot)])}; break;
      case fb::node_kind::pointwise: {
        const reference_op f = reference_of(n.desc.name);
        for (std::size_t e = 0; e < r.v.size(); ++e) {
          const auto idx = unravel(e, r.shape);
          double args[fb::ir::max_inputs] = {};
          for (int q = 0; q < n.n_inputs; ++q) args[q] = in(q).at(idx, r.shape.rank);
          r.v[e] = static_cast<float>(f(args));  // as stored: a float overflow is inf, an underflow 0
        }
        break;
      }
      case fb::node_kind::reduce: {
        const std::string_view op = n.desc.name;
        const bool max = op == "max", min = op == "min";
        const dval& a = in(0);
        const auto axis = static_cast<std::size_t>(n.desc.axis);
        std::vector<double> acc(r.v.size(), max ? -INFINITY : min ? INFINITY : 0.0);
        for (std::size_t e = 0; e < a.v.size(); ++e) {
          // The result's offset skips the reduced axis: it has extent 1 (keepdim) or is gone.
          const auto idx = unravel(e, a.shape);
          std::size_t off = 0;
          for (std::size_t k = 0; k < a.shape.rank; ++k)
            if (k != axis) off = off * a.shape.extent[k] + idx[k];
          double& t = acc[off];
          t = max ? fb::ops::max::combine(t, a.v[e]) : min ? fb::ops::min::combine(t, a.v[e]) : t + a.v[e];
        }
        if (op == "mean")
          for (auto& t : acc) t /= static_cast<double>(a.shape.extent[axis]);
        r.v = acc;
        break;
      }
      case fb::node_kind::matmul: {  // [M, K] or [batch or 1, M, K] times [K, N] or [batch or 1, K, N]
        const dval &a = in(0), &bm = in(1);
        const std::size_t M = a.shape.back(1), K = a.shape.back(0), N = bm.shape.back(0);
        const std::size_t batches = r.shape.rank == 3 ? r.shape.extent[0] : 1;
        const std::size_t a_step = a.shape.rank == 3 && a.shape.extent[0] != 1 ? M * K : 0;
        const std::size_t b_step = bm.shape.rank == 3 && bm.shape.extent[0] != 1 ? K * N : 0;
        for (std::size_t bi = 0; bi < batches; ++bi)
          for (std::size_t i2 = 0; i2 < M; ++i2)
            for (std::size_t j = 0; j < N; ++j) {
              double s = 0;
              for (std::size_t q = 0; q < K; ++q) s += a.v[bi * a_step + i2 * K + q] * bm.v[bi * b_step + q * N + j];
              r.v[(bi * M + i2) * N + j] = s;
            }
        break;
      }
      default: break;
    }
  }
  return val;
}

/// Does a member of kernel group k read node g?
bool reads(const fb::plan::plan_t<NB>& p, const std::array<fb::ir::node, NB>& nodes, int k, int g, int size) {
  for (int i = 0; i < size; ++i)
    for (int q = 0; q < nodes[static_cast<std::size_t>(i)].n_inputs; ++q)
      if (p.group[i] == k && nodes[static_cast<std::size_t>(i)].inputs[q] == g) return true;
  return false;
}

/// What the planned programs exercise, counted over the exact specialisations: the reduction
/// patterns this fuzzer exists to cover are checked to occur, so a generator change that stops
/// making them fails here instead of silently covering less.
struct coverage {
  int rank3_reductions[3][2] = {};  // [axis][keepdim] of reductions of a rank-3 value
  int dropped_axis = 0;             // reductions without keepdim
  int column_of_column = 0;         // a column kernel reading another kernel's column reduction
  int column_of_row = 0;            // ... reading a row reduction
  int row_of_column = 0;            // a rows kernel with passes reading a column reduction
  int row_of_row = 0;               // ... reading a row reduction of another kernel
  int column_reads_reduction_elsewhere = 0;  // a column kernel that misread one (misread_as_own)
  int rank0_results = 0;            // reductions to rank 0
  int rank0_kernels = 0;            // kernels over a rank-0 space
  int merged_rows = 0;              // elementwise kernels of rank >= 2 the schedule merges per call
  int merged_columns = 0;           // column kernels with >= 2 dimensions after the axis, merged likewise

  void count_schedule(const fb::plan::plan_t<NB>& p, const fb::schedule::schedule_t<NB>& s) {
    for (int k = 0; k < p.n_kernels; ++k) {
      const auto& kn = p.kernels[k];
      const int from = s.kernels[k].merge_from;
      if (from < 0 || kn.space.rank < 2) continue;
      if (kn.kind == fb::plan::kernel_kind::rows) ++merged_rows;
      else if (kn.space.rank - static_cast<std::size_t>(from) >= 2) ++merged_columns;
    }
  }

  void count(const std::array<fb::ir::node, NB>& nodes, const fb::plan::plan_t<NB>& p, int size) {
    for (int i = 0; i < size; ++i) {
      const auto& n = nodes[static_cast<std::size_t>(i)];
      if (n.desc.kind != fb::node_kind::reduce) continue;
      if (nodes[static_cast<std::size_t>(n.inputs[0])].desc.shape.rank == 3) ++rank3_reductions[n.desc.axis][n.desc.keepdim ? 1 : 0];
      dropped_axis += n.desc.keepdim ? 0 : 1;
      rank0_results += n.desc.shape.rank == 0 ? 1 : 0;
    }
    for (int k = 0; k < p.n_kernels; ++k) {
      const auto& kn = p.kernels[k];
      rank0_kernels += kn.space.rank == 0 ? 1 : 0;
      const bool cols = kn.kind == fb::plan::kernel_kind::reduce_cols;
      if (!cols && !(kn.kind == fb::plan::kernel_kind::rows && kn.passes > 0)) continue;
      bool reads_col = false, reads_row = false, misread = false;
      for (int g = 0; g < size; ++g) {
        const auto& n = nodes[static_cast<std::size_t>(g)];
        if (n.desc.kind != fb::node_kind::reduce || p.group[g] == kn.group || !reads(p, nodes, kn.group, g, size)) continue;
        (fb::plan::is_last_axis_reduce(n) ? reads_row : reads_col) = true;
        if (cols) {
          const fb::dims& space = nodes[static_cast<std::size_t>(nodes[static_cast<std::size_t>(kn.node)].inputs[0])].desc.shape;
          misread = misread || misread_as_own(n.desc.shape, n.desc.axis, n.desc.keepdim, space);
        }
      }
      (cols ? column_of_column : row_of_column) += reads_col ? 1 : 0;
      (cols ? column_of_row : row_of_row) += reads_row ? 1 : 0;
      column_reads_reduction_elsewhere += misread ? 1 : 0;
    }
  }
};

struct prepared_case {
  program_ir ir;
  std::size_t B, R, C;
  std::vector<std::shared_ptr<fb::jit::program<float, NB>>> progs;
  std::vector<std::vector<fb::jit::rendered_kernel>> sources;
  std::vector<std::vector<int>> which;
};

}  // namespace

TEST_CASE("hundreds of random IR programs: JIT (exact and symbolic) == double interpreter", "[jit][fuzz]") {
  fb::jit::temp_directory cache_dir(fb::jit::detail::temp_root(), "fusebox-fuzz-ir-");
  ::setenv("FUSEBOX_CACHE_DIR", cache_dir.path().c_str(), 1);
  fbt::seed_prelude(cache_dir.path());
  const std::size_t batches[] = {1, 2, 3, 5}, rows[] = {1, 2, 7, 33}, cols[] = {1, 3, 16, 37};
  std::vector<prepared_case> cases;
  std::vector<fb::jit::rendered_kernel> all;
  coverage seen_in_plans;
  for (int s = 0; s < programs; ++s) {
    prepared_case c;
    const std::uint64_t seed = 7000 + static_cast<std::uint64_t>(s);
    c.B = batches[mix(seed * 7) % 4];
    c.R = rows[mix(seed * 3) % 4];
    c.C = cols[mix(seed * 5) % 4];
    c.ir = generate(seed);
    const std::array<int, 1> outputs{c.ir.output};
    // The symbolic variant (R >= 2): R, and B unless it is 1, unknown when planning and rendering,
    // as a guard that lets the row count vary makes them; an extent of 1 stays known, as there.
    for (int variant = 0; variant < (c.R >= 2 ? 2 : 1); ++variant) {
      std::vector<fb::dims> pattern{fb::dims{2, {c.R, c.C}}, fb::dims{1, {c.C}}, fb::dims{2, {c.C, c.C}},
                                    fb::dims{3, {c.B, c.R, c.C}}};
      if (variant == 1) pattern[0].extent[0] = pattern[3].extent[1] = fb::symbol(0);
      if (variant == 1 && c.B >= 2) pattern[3].extent[0] = fb::symbol(1);
      auto prog = std::make_shared<fb::jit::program<float, NB>>();
      prog->nodes = fb::jit::specialise(c.ir.nodes, pattern);
      prog->plan = fb::plan::make_plan(prog->nodes, outputs, sizeof(float), false, /*checked=*/true);
      for (std::size_t i = 0; i < NB; ++i) prog->unit_inner[i] = true;
      // The schedule the run-time path makes: elementwise and column kernels merge dimensions
      // at each call (schedule/merge_dims.hpp), so their generated code reads rank and extents.
      prog->sched = fb::schedule::make_schedule(prog->nodes, prog->plan, prog->unit_inner, prog->caps);
      if (variant == 0) seen_in_plans.count(prog->nodes, prog->plan, c.ir.size);
      if (variant == 0) seen_in_plans.count_schedule(prog->plan, prog->sched);
      std::vector<fb::jit::rendered_kernel> mine;
      std::vector<int> ks;
      for (int k = 0; k < prog->plan.n_kernels; ++k) {
        const auto& kn = prog->plan.kernels[k];
        if (kn.kind == fb::plan::kernel_kind::rows || kn.kind == fb::plan::kernel_kind::reduce_cols ||
            (kn.kind == fb::plan::kernel_kind::matmul && kn.group >= 0)) {
          mine.push_back(fb::jit::render_cpu_kernel(prog->nodes, prog->plan, k, fb::dtype::f32, prog->unit_inner, false,
                                                    prog->sched));
          ks.push_back(k);
        }
      }
      all.insert(all.end(), mine.begin(), mine.end());
      c.progs.push_back(prog);
      c.sources.push_back(std::move(mine));
      c.which.push_back(std::move(ks));
    }
    cases.push_back(std::move(c));
  }
  // The same kernels rendered as CUDA and compiled by NVRTC: code-generation errors of the CUDA
  // backend show up here on machines without a GPU. There NVRTC runs its front end only
  // (fbt::nvrtc_front_end_only): NVVM and ptxas on a thousand kernels would be most of this test's
  // time and find nothing a generator gets wrong that tests/cuda/compiled.cpp's PTX builds miss; on
  // a GPU machine the units are built into sm_90 cubins as the backend builds them.
  // NVRTC is most of this test's time, so it runs on a thread of its own while the host compiler
  // builds the CPU kernels (NVRTC runs one compilation at a time in a process, so one thread), in
  // units of 100 distinct kernels: its time grows faster than a unit's size (the 868 kernels of
  // an earlier version of these programs took about a quarter less in eight units than in one).
  struct cuda_outcome {
    std::size_t units = 0, empty_cubins = 0;
    std::string error;  // the first NVRTC error, with its log
  };
  std::future<cuda_outcome> cuda_check;
  if (fb::cuda::nvrtc_available()) {
    std::vector<fb::jit::rendered_cuda_kernel> cuda_kernels;
    std::set<std::string> seen;  // identical kernels are one kernel in a unit too
    for (const auto& c : cases)
      for (std::size_t v = 0; v < c.progs.size(); ++v)
        for (int k : c.which[v]) {
          auto r = fb::jit::render_cuda_kernel(c.progs[v]->nodes, c.progs[v]->plan, k, fb::dtype::f32,
                                               c.progs[v]->unit_inner, c.progs[v]->sched);
          if (seen.insert(r.source).second) cuda_kernels.push_back(std::move(r));
        }
    constexpr std::size_t per_unit = 100;
    std::vector<std::string> units;
    for (std::size_t from = 0; from < cuda_kernels.size(); from += per_unit) {
      const auto first = cuda_kernels.begin() + static_cast<std::ptrdiff_t>(from);
      const auto last = cuda_kernels.begin() + static_cast<std::ptrdiff_t>(std::min(from + per_unit, cuda_kernels.size()));
      units.push_back(fb::jit::make_cuda_unit(std::vector<fb::jit::rendered_cuda_kernel>(first, last)).source);
    }
    const bool gpu = fb::cuda::available();
    cuda_check = std::async(std::launch::async, [units = std::move(units), gpu] {
      cuda_outcome out;
      for (const auto& source : units) {
        try {
          if (gpu) out.empty_cubins += fb::cuda::nvrtc_compile(source, "fuzz_ir", "sm_90").cubin.empty() ? 1 : 0;
          else fb::cuda::nvrtc_check(source, "fuzz_ir", "compute_90", fbt::nvrtc_front_end_only);
        } catch (const fb::cuda::nvrtc_error& e) {
          if (out.error.empty()) out.error = e.what();
        }
        ++out.units;
      }
      return out;
    });
  } else {
    WARN("NVRTC not found: the CUDA rendering of these programs was not compiled");
  }
  std::vector<fb::jit::kernel_binary> bins;
  try {
    bins = fb::jit::kernel_store::instance().get_all(all);
  } catch (const fb::jit::compile_failure& e) {
    FAIL(e.what() << "\n" << e.log.substr(0, 4000));
  }
  if (cuda_check.valid()) {
    const cuda_outcome cuda = cuda_check.get();
    INFO(cuda.units << " NVRTC unit(s)");
    CHECK(cuda.empty_cubins == 0);
    if (!cuda.error.empty()) FAIL(cuda.error);
  }
  std::size_t at = 0, checked = 0;
  for (auto& c : cases) {
    fb::tensor<float, fb::shape<fb::dyn, fb::dyn>> x(c.R, c.C), m(c.C, c.C);
    fb::tensor<float, fb::shape<fb::dyn>> w(c.C);
    fb::tensor<float, fb::shape<fb::dyn, fb::dyn, fb::dyn>> x3(c.B, c.R, c.C);
    x.fill_random(c.R * 131 + c.C);
    w.fill_random(c.C * 7 + 1, 0.5f, 1.5f);
    m.fill_random(c.C * 11 + 2, -1.0f / static_cast<float>(c.C), 1.0f / static_cast<float>(c.C));
    x3.fill_random(c.B * 977 + c.R * 13 + c.C);
    // Every other program also reads special values: about one element in eight of x and x3.
    const bool specials = (&c - cases.data()) % 2 == 1;
    if (specials) {
      sprinkle_specials(x, c.R * 31 + c.C);
      sprinkle_specials(x3, c.B * 37 + c.R * 5 + c.C);
    }
    auto as_d = [](const auto& t) {
      dval d{t.extents(), std::vector<double>(t.size())};
      for (std::size_t i = 0; i < t.size(); ++i) d.v[i] = t.flat(i);
      return d;
    };
    const auto concrete = fb::jit::specialise(c.ir.nodes, {x.extents(), w.extents(), m.extents(), x3.extents()});
    const auto ref = interpret(concrete, c.ir.size, c.ir.scalars, {as_d(x), as_d(w), as_d(m), as_d(x3)});
    const dval& want = ref[static_cast<std::size_t>(c.ir.output)];
    std::vector<fb::scalar_leaf<float>> scalars;
    for (float v : c.ir.scalars) scalars.push_back(fb::scalar_leaf<float>{{}, v});
    for (std::size_t v = 0; v < c.progs.size(); ++v) {
      auto& prog = *c.progs[v];
      for (std::size_t q = 0; q < c.which[v].size(); ++q) prog.kernels[c.which[v][q]] = bins[at++];
      fb::cpu::frame<float, NB> f;
      for (int i = 0; i < c.ir.size; ++i) {
        const auto& n = c.ir.nodes[static_cast<std::size_t>(i)];
        if (n.desc.kind == fb::node_kind::input) {
          const std::size_t which_input = n.desc.input_index;
          f.loc[static_cast<std::size_t>(i)] = which_input == 0 ? x.view() : which_input == 1 ? w.view()
                                             : which_input == 2 ? m.view() : x3.view();
        }
        if (n.desc.kind == fb::node_kind::scalar) f.payload[n.payload_slot] = &scalars[static_cast<std::size_t>(n.payload_slot)];
      }
      // The result, of any rank from 0 to 3, in a buffer of its own with contiguous strides.
      std::vector<float> out(want.v.size(), std::nanf(""));
      const fb::strided<float> out_view{out.data(), want.shape, fb::contiguous_strides(want.shape)};
      const std::size_t o = static_cast<std::size_t>(c.ir.output);
      if (c.ir.nodes[o].desc.kind == fb::node_kind::input) f.copy_to[o] = out_view;
      else f.loc[o] = out_view;
      fb::cpu::runtime rt;
      rt.pool = &fb::cpu::shared_pool(2);
      prog.run(f, concrete, rt, [](int, fb::cpu::frame<float, NB>&) {});
      // NaN exactly where the reference has NaN, +-inf exactly; finite values to the tolerance,
      // relative to the largest finite reference value.
      double worst = 0, scale = 1;
      for (double r : want.v)
        if (std::isfinite(r)) scale = std::max(scale, std::fabs(r));
      bool nan = false;
      std::size_t first_bad = want.v.size();
      for (std::size_t i = 0; i < want.v.size(); ++i) {
        const double g = out[i], r = want.v[i];
        if (!std::isfinite(g) || !std::isfinite(r)) {
          if (!(g == r || (std::isnan(g) && std::isnan(r))) && first_bad == want.v.size()) first_bad = i;
          nan = nan || !(g == r || (std::isnan(g) && std::isnan(r)));
          continue;
        }
        worst = std::max(worst, std::fabs(g - r) / scale);
      }
      INFO("program " << (&c - cases.data()) << " B=" << c.B << " R=" << c.R << " C=" << c.C
                      << (v ? " (rows symbolic)" : " (exact)") << (specials ? ", special values in x and x3" : "")
                      << ": " << fb::jit::describe_graph(prog.nodes));
      INFO("first NaN/inf mismatch at " << first_bad << ": "
                                        << (first_bad < want.v.size() ? out[first_bad] : 0.0f) << " vs reference "
                                        << (first_bad < want.v.size() ? want.v[first_bad] : 0.0));
      CHECK(!nan);
      CHECK(worst <= tolerance);
      if ((worst > tolerance || nan) && std::getenv("FUSEBOX_FUZZ_DUMP")) {
        for (const auto& r : c.sources[v]) std::printf("%s\n", r.source.c_str());
        for (std::size_t i = 0; i < want.v.size(); ++i) std::printf("%zu: %g vs %g\n", i, out[i], want.v[i]);
      }
      ++checked;
    }
  }
  CHECK(cases.size() == static_cast<std::size_t>(programs));
  CHECK(checked >= cases.size());
  // The patterns the generator exists for occur (counted over the exact plans; about twice these
  // numbers per 320 programs), so a change to the generator that stops making them fails here.
  const coverage& cov = seen_in_plans;
  const auto per_320 = [](int n) { return n * programs / 320; };
  INFO("column kernels that misread another kernel's reduction with the old strides "
       << cov.column_reads_reduction_elsewhere << "; column of column " << cov.column_of_column << ", column of row "
       << cov.column_of_row << ", row of column " << cov.row_of_column << ", row of row " << cov.row_of_row
       << "; axis dropped " << cov.dropped_axis << ", rank-0 results " << cov.rank0_results << ", rank-0 kernels "
       << cov.rank0_kernels << "; merged elementwise " << cov.merged_rows << ", merged column " << cov.merged_columns);
  for (int axis = 0; axis < 3; ++axis)
    for (int keep = 0; keep < 2; ++keep) {
      INFO("reductions of a rank-3 value along axis " << axis << (keep ? " (keepdim)" : ""));
      CHECK(cov.rank3_reductions[axis][keep] >= per_320(10));
    }
  CHECK(cov.column_reads_reduction_elsewhere >= per_320(20));
  CHECK(cov.column_of_column >= per_320(60));
  CHECK(cov.column_of_row >= per_320(20));
  CHECK(cov.row_of_column >= per_320(25));
  CHECK(cov.row_of_row >= per_320(25));
  CHECK(cov.dropped_axis >= per_320(100));
  CHECK(cov.rank0_results >= per_320(20));
  CHECK(cov.rank0_kernels >= per_320(10));
  CHECK(cov.merged_rows >= per_320(80));
  CHECK(cov.merged_columns >= per_320(60));
}
