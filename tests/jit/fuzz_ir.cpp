// Differential fuzzing of the run-time path at scale: seeded random programs are generated as IR
// at run time (no template instantiation per program, so hundreds fit in a CI run), planned by
// the one planner, rendered, compiled in one run of the host compiler, and run through
// jit::program, specialised to their extents and with the row extent symbolic. Each result is
// checked element by element against a double-precision interpreter of the same IR.
// (tests/jit/fuzz.cpp runs a smaller set of type-level programs eagerly and statically too.)
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include <catch2/catch.hpp>

#include <fusebox/fusebox.hpp>

namespace {

namespace fb = fusebox;
constexpr std::size_t NB = 64;  // node capacity of a generated program
constexpr int programs = 320;
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
      s = fb::broadcast(s, shape(i)).out;
    }
    n.desc.shape = s;
    return add(n);
  }
  int reduce(const char* op, int in, int axis) {
    fb::ir::node n{};
    n.desc.kind = fb::node_kind::reduce;
    n.desc.name = op;
    n.desc.device = spelling(op);
    n.desc.flops = 1;
    n.desc.axis = axis;
    n.desc.keepdim = true;
    n.inputs[n.n_inputs++] = in;
    n.desc.shape = shape(in);
    n.desc.shape.extent[static_cast<std::size_t>(axis)] = 1;
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
    n.desc.shape = fb::dims{2, {shape(a).extent[0], shape(bm).extent[1]}};
    return add(n);
  }
};

/// A random program over x [R, C] (input 0), w [C] (input 1) and m [C, C] (input 2).
program_ir generate(std::uint64_t seed, std::size_t R, std::size_t C) {
  program_ir p;
  auto input = [&](std::size_t index, fb::dims s) {
    fb::ir::node n{};
    n.desc.kind = fb::node_kind::input;
    n.desc.name = "input";
    n.desc.input_index = index;
    n.desc.shape = s;
    return p.add(n);
  };
  const int x = input(0, fb::dims{2, {R, C}}), w = input(1, fb::dims{1, {C}}), m = input(2, fb::dims{2, {C, C}});
  std::uint64_t h = seed;
  auto next = [&] { return h = mix(h); };
  std::function<int(int)> expr = [&](int depth) -> int {
    if (depth == 0) return next() % 3 == 0 ? p.pointwise("mul", {x, w}) : x;
    const std::uint64_t k = next();
    const int a = expr(depth - 1);
    switch (k % 10) {
      case 0: return p.pointwise(unaries[next() % 8].name, {a});
      case 1: return p.pointwise(binaries[next() % 5].name, {a, expr(depth - 1)});
      case 2: return p.pointwise(binaries[next() % 5].name, {a, w});
      case 3: return p.pointwise("mul", {a, p.scalar(0.25f + static_cast<float>(next() % 100) / 100.0f)});
      case 4: return p.pointwise(binaries[next() % 5].name, {a, p.reduce(reducers[next() % 4], expr(depth - 1), 1)});
      case 5: {  // softmax: a used three times
        const int e = p.pointwise("exp", {p.pointwise("sub", {a, p.reduce("max", a, 1)})});
        return p.pointwise("div", {e, p.reduce("sum", e, 1)});
      }
      case 6: return p.pointwise("tanh", {p.matmul(a, m)});
      case 7: {
        const int c = expr(depth - 1);
        return p.pointwise("where", {p.pointwise("gt", {a, c}), a, c});
      }
      case 8: return p.pointwise("add", {a, p.reduce(reducers[next() % 4], expr(depth - 1), 0)});
      default: {  // layer_norm without the affine part
        const int centered = p.pointwise("sub", {a, p.reduce("mean", a, 1)});
        const int var = p.reduce("mean", p.pointwise("mul", {centered, centered}), 1);
        return p.pointwise("mul", {centered, p.pointwise("rsqrt", {p.pointwise("add", {var, p.scalar(1e-3f)})})});
      }
    }
  };
  p.output = expr(3);
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

double apply_op(const std::string& op, const std::vector<double>& a) {
  for (const auto& e : unaries)
    if (op == e.name) return e.f(a[0]);
  for (const auto& e : binaries)
    if (op == e.name) return e.f(a[0], a[1]);
  if (op == "exp") return fb::ops::exp::apply(a[0]);
  if (op == "div") return a[0] / a[1];
  if (op == "rsqrt") return fb::ops::rsqrt::apply(a[0]);
  if (op == "gt") return a[0] > a[1] ? 1.0 : 0.0;
  if (op == "where") return a[0] != 0 ? a[1] : a[2];
  FAIL("no reference for op " << op);
  return 0;
}

std::vector<dval> interpret(const program_ir& p, const std::vector<dval>& inputs) {
  std::vector<dval> val(static_cast<std::size_t>(p.size));
  for (int i = 0; i < p.size; ++i) {
    const fb::ir::node& n = p.nodes[static_cast<std::size_t>(i)];
    dval& r = val[static_cast<std::size_t>(i)];
    r.shape = n.desc.shape;
    r.v.assign(n.desc.shape.size(), 0.0);
    const auto in = [&](int q) -> const dval& { return val[static_cast<std::size_t>(n.inputs[q])]; };
    switch (n.desc.kind) {
      case fb::node_kind::input: r = inputs[n.desc.input_index]; break;
      case fb::node_kind::scalar: r.v = {static_cast<double>(p.scalars[static_cast<std::size_t>(n.payload_slot)])}; break;
      case fb::node_kind::pointwise:
        for (std::size_t e = 0; e < r.v.size(); ++e) {
          const auto idx = unravel(e, r.shape);
          std::vector<double> args;
          for (int q = 0; q < n.n_inputs; ++q) args.push_back(in(q).at(idx, r.shape.rank));
          r.v[e] = apply_op(n.desc.name, args);
        }
        break;
      case fb::node_kind::reduce: {
        const std::string op = n.desc.name;
        const dval& a = in(0);
        std::vector<double> acc(r.v.size(), op == "max" ? -INFINITY : op == "min" ? INFINITY : 0.0);
        for (std::size_t e = 0; e < a.v.size(); ++e) {
          auto idx = unravel(e, a.shape);
          idx[static_cast<std::size_t>(n.desc.axis)] = 0;
          std::size_t off = 0;
          for (std::size_t k = 0; k < r.shape.rank; ++k) off = off * r.shape.extent[k] + idx[k];
          double& t = acc[off];
          t = op == "max" ? std::max(t, a.v[e]) : op == "min" ? std::min(t, a.v[e]) : t + a.v[e];
        }
        if (op == "mean")
          for (auto& t : acc) t /= static_cast<double>(a.shape.extent[static_cast<std::size_t>(n.desc.axis)]);
        r.v = acc;
        break;
      }
      case fb::node_kind::matmul: {
        const dval &a = in(0), &bm = in(1);
        const std::size_t M = a.shape.extent[0], K = a.shape.extent[1], N = bm.shape.extent[1];
        for (std::size_t i2 = 0; i2 < M; ++i2)
          for (std::size_t j = 0; j < N; ++j) {
            double s = 0;
            for (std::size_t q = 0; q < K; ++q) s += a.v[i2 * K + q] * bm.v[q * N + j];
            r.v[i2 * N + j] = s;
          }
        break;
      }
      default: break;
    }
  }
  return val;
}

struct prepared_case {
  program_ir ir;
  std::size_t R, C;
  std::vector<std::shared_ptr<fb::jit::program<float, NB>>> progs;
  std::vector<std::vector<fb::jit::rendered_kernel>> sources;
  std::vector<std::vector<int>> which;
};

}  // namespace

TEST_CASE("hundreds of random IR programs: JIT (exact and symbolic) == double interpreter", "[jit][fuzz]") {
  fb::jit::temp_directory cache_dir(fb::jit::detail::temp_root(), "fusebox-fuzz-ir-");
  ::setenv("FUSEBOX_CACHE_DIR", cache_dir.path().c_str(), 1);
  const std::size_t rows[] = {1, 2, 7, 33}, cols[] = {1, 3, 16, 37};
  std::vector<prepared_case> cases;
  std::vector<fb::jit::rendered_kernel> all;
  for (int s = 0; s < programs; ++s) {
    prepared_case c;
    const std::uint64_t seed = 7000 + static_cast<std::uint64_t>(s);
    c.R = rows[mix(seed * 3) % 4];
    c.C = cols[mix(seed * 5) % 4];
    c.ir = generate(seed, c.R, c.C);
    REQUIRE(c.ir.size <= static_cast<int>(NB));
    const std::array<int, 1> outputs{c.ir.output};
    for (int variant = 0; variant < (c.R >= 2 ? 2 : 1); ++variant) {
      std::vector<fb::dims> pattern{fb::dims{2, {c.R, c.C}}, fb::dims{1, {c.C}}, fb::dims{2, {c.C, c.C}}};
      if (variant == 1) pattern[0].extent[0] = fb::symbol(0);
      auto prog = std::make_shared<fb::jit::program<float, NB>>();
      prog->nodes = fb::jit::specialise(c.ir.nodes, pattern);
      prog->plan = fb::plan::make_plan(prog->nodes, outputs, sizeof(float));
      for (std::size_t i = 0; i < NB; ++i) prog->unit_inner[i] = true;
      std::vector<fb::jit::rendered_kernel> mine;
      std::vector<int> ks;
      for (int k = 0; k < prog->plan.n_kernels; ++k) {
        const auto& kn = prog->plan.kernels[k];
        if (kn.kind == fb::plan::kernel_kind::rows || kn.kind == fb::plan::kernel_kind::reduce_cols ||
            (kn.kind == fb::plan::kernel_kind::matmul && kn.group >= 0)) {
          mine.push_back(fb::jit::render_cpu_kernel(prog->nodes, prog->plan, k, fb::dtype::f32, prog->unit_inner));
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
  // backend show up here on machines without a GPU. There NVRTC stops at PTX (compute_90): ptxas
  // on 800-odd kernels would be most of this test's time and finds nothing a generator gets
  // wrong; on a GPU machine the units are built into sm_90 cubins as the backend builds them.
  // NVRTC is most of this test's time, so it runs on a thread of its own while the host compiler
  // builds the CPU kernels (NVRTC runs one compilation at a time in a process, so one thread), in
  // units of 100 distinct kernels: its time grows faster than a unit's size (the 868 kernels here
  // take about a quarter less in eight units than in one).
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
                                               c.progs[v]->unit_inner);
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
          else fb::cuda::nvrtc_check(source, "fuzz_ir", "compute_90");
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
    x.fill_random(c.R * 131 + c.C);
    w.fill_random(c.C * 7 + 1, 0.5f, 1.5f);
    m.fill_random(c.C * 11 + 2, -1.0f / static_cast<float>(c.C), 1.0f / static_cast<float>(c.C));
    auto as_d = [](const auto& t) {
      dval d{t.extents(), std::vector<double>(t.size())};
      for (std::size_t i = 0; i < t.size(); ++i) d.v[i] = t.flat(i);
      return d;
    };
    const auto ref = interpret(c.ir, {as_d(x), as_d(w), as_d(m)});
    const dval& want = ref[static_cast<std::size_t>(c.ir.output)];
    const auto concrete = fb::jit::specialise(c.ir.nodes, {x.extents(), w.extents(), m.extents()});
    std::vector<fb::scalar_leaf<float>> scalars;
    for (float v : c.ir.scalars) scalars.push_back(fb::scalar_leaf<float>{{}, v});
    for (std::size_t v = 0; v < c.progs.size(); ++v) {
      auto& prog = *c.progs[v];
      for (std::size_t q = 0; q < c.which[v].size(); ++q) prog.kernels[c.which[v][q]] = bins[at++];
      fb::cpu::frame<float, NB> f;
      for (int i = 0; i < c.ir.size; ++i) {
        const auto& n = c.ir.nodes[static_cast<std::size_t>(i)];
        if (n.desc.kind == fb::node_kind::input) {
          auto t = n.desc.input_index == 0 ? x.view() : n.desc.input_index == 2 ? m.view() : w.view();
          f.loc[static_cast<std::size_t>(i)] = t;
        }
        if (n.desc.kind == fb::node_kind::scalar) f.payload[n.payload_slot] = &scalars[static_cast<std::size_t>(n.payload_slot)];
      }
      fb::tensor<float, fb::shape<fb::dyn, fb::dyn>> out(want.shape.extent[0], want.shape.extent[1]);
      const std::size_t o = static_cast<std::size_t>(c.ir.output);
      if (c.ir.nodes[o].desc.kind == fb::node_kind::input) f.copy_to[o] = out.view();
      else f.loc[o] = out.view();
      fb::cpu::runtime rt;
      rt.pool = &fb::cpu::shared_pool(2);
      prog.run(f, concrete, rt, [](int, fb::cpu::frame<float, NB>&) {});
      double worst = 0, scale = 1;
      for (double r : want.v) scale = std::max(scale, std::fabs(r));
      bool nan = false;
      for (std::size_t i = 0; i < want.v.size(); ++i) {
        const double d = std::fabs(static_cast<double>(out.flat(i)) - want.v[i]);
        nan = nan || (std::isnan(d) && !std::isnan(want.v[i]));
        if (!std::isnan(d)) worst = std::max(worst, d / scale);
      }
      INFO("program " << (&c - cases.data()) << " R=" << c.R << " C=" << c.C << (v ? " (rows symbolic)" : " (exact)") << ": " << fb::jit::describe_graph(prog.nodes));
      CHECK(!nan);
      CHECK(worst <= tolerance);
      if ((worst > tolerance || nan) && std::getenv("FUSEBOX_FUZZ_DUMP")) {
        for (const auto& r : c.sources[v]) std::printf("%s\n", r.source.c_str());
        for (std::size_t i = 0; i < want.v.size(); ++i) std::printf("%zu: %g vs %g\n", i, out.flat(i), want.v[i]);
      }
      ++checked;
    }
  }
  CHECK(cases.size() >= 300);
  CHECK(checked >= cases.size());
}
