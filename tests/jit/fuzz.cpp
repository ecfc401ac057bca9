// Differential fuzzing (tests/jit/fuzz.hpp): FUSEBOX_FUZZ_COUNT seeded programs, each run eagerly,
// through the static path, and through the JIT specialised to its extents and with the row extent
// symbolic, against a double-precision reference. The JIT kernels of every program in this part
// are compiled in one run of the host compiler.
//
// Which programs: the seeds FUSEBOX_FUZZ_BASE .. FUSEBOX_FUZZ_BASE + FUSEBOX_FUZZ_POOL - 1 (the
// pool), ordered by their extents and then by seed, and of those the FUSEBOX_FUZZ_SLICE-th run of
// FUSEBOX_FUZZ_COUNT. Parts that split one pool into slices build every seed of it exactly once.
// Ordering by extents is for the build: eager evaluation instantiates a cpu::program per op and
// operand shapes, and programs over the same extents share those, so a part that holds two or three
// of the 16 extent pairs builds in about two thirds of the time of one that holds them all.
#include <catch2/catch.hpp>
#include <fusebox/fusebox.hpp>

#include "../support/gpu.hpp"
#include "../support/prelude_seed.hpp"
#include "fuzz.hpp"

#include <algorithm>
#include <array>
#include <functional>
#include <memory>
#include <tuple>
#include <utility>

#ifndef FUSEBOX_FUZZ_BASE
#define FUSEBOX_FUZZ_BASE 1000
#endif
#ifndef FUSEBOX_FUZZ_COUNT
#define FUSEBOX_FUZZ_COUNT 50
#endif
#ifndef FUSEBOX_FUZZ_POOL
#define FUSEBOX_FUZZ_POOL FUSEBOX_FUZZ_COUNT
#endif
#ifndef FUSEBOX_FUZZ_SLICE
#define FUSEBOX_FUZZ_SLICE 0
#endif
// Whether this part also renders its programs as CUDA (NVRTC, and a run on a GPU when present).
// The CUDA half adds ~15% to a part's build and an NVRTC run to its test time, and the IR fuzzer
// (fuzz_ir.cpp) covers the CUDA generator with 320 programs, so CI has one part do it.
#ifndef FUSEBOX_FUZZ_CUDA
#define FUSEBOX_FUZZ_CUDA 1
#endif

namespace {

using namespace fz;

struct case_result {
  std::string name;
  std::vector<fb::jit::rendered_kernel> sources;
  std::function<void(std::vector<fb::jit::kernel_binary>)> finish;  // runs the JIT programs and checks
#if FUSEBOX_FUZZ_CUDA
  std::vector<fb::jit::rendered_cuda_kernel> cuda_sources;  // the same programs as CUDA
  std::function<void()> run_cuda;  // on a GPU: builds and runs the CUDA programs and checks
#endif
};

constexpr double tolerance = 2e-4;

// The extents of program `seed`: x is [rows_of(seed), cols_of(seed)].
constexpr std::size_t rows_of(std::uint64_t seed) {
  constexpr std::size_t rows_choice[] = {1, 3, 17, 33};
  return rows_choice[mix(seed * 7) % 4];
}
constexpr std::size_t cols_of(std::uint64_t seed) {
  constexpr std::size_t cols_choice[] = {1, 5, 16, 40};
  return cols_choice[mix(seed * 11) % 4];
}

static_assert((FUSEBOX_FUZZ_SLICE + 1) * FUSEBOX_FUZZ_COUNT <= FUSEBOX_FUZZ_POOL,
              "fuzz: slice FUSEBOX_FUZZ_SLICE of FUSEBOX_FUZZ_COUNT seeds lies outside the pool");

/// This part's seeds (see the top of the file).
constexpr std::array<std::uint64_t, FUSEBOX_FUZZ_COUNT> part_seeds = [] {
  std::array<std::uint64_t, FUSEBOX_FUZZ_POOL> pool{};
  for (std::size_t i = 0; i < pool.size(); ++i) pool[i] = FUSEBOX_FUZZ_BASE + i;
  std::sort(pool.begin(), pool.end(), [](std::uint64_t a, std::uint64_t b) {
    return std::tuple(rows_of(a), cols_of(a), a) < std::tuple(rows_of(b), cols_of(b), b);
  });
  std::array<std::uint64_t, FUSEBOX_FUZZ_COUNT> mine{};
  for (std::size_t i = 0; i < mine.size(); ++i) mine[i] = pool[FUSEBOX_FUZZ_SLICE * FUSEBOX_FUZZ_COUNT + i];
  return mine;
}();

template <std::uint64_t Seed>
case_result run_case() {
  constexpr std::size_t R = rows_of(Seed), C = cols_of(Seed);
  using L = leaves<R, C>;
  using E = typename gen<L, Seed, 3>::type;
  using Prog = fb::cpu::program<float, E>;

  auto x = std::make_shared<fb::tensor<float, fb::shape<R, C>>>();
  auto w = std::make_shared<fb::tensor<float, fb::shape<C>>>();
  auto m = std::make_shared<fb::tensor<float, fb::shape<C, C>>>();
  x->fill_random(Seed);
  w->fill_random(Seed + 1, 0.5f, 1.5f);
  m->fill_random(Seed + 2, -1.0f / C, 1.0f / C);
  if constexpr (Seed % 2 == 1) sprinkle_specials(*x, Seed);  // every other program reads special values
  std::uint64_t s = Seed;
  auto e = std::make_shared<E>(make<E>(s));
  auto args = std::tie(*x, *w, *m);

  case_result out;
  out.name = "program " + std::to_string(Seed) + " [" + std::to_string(R) + ", " + std::to_string(C) + "] with " +
             std::to_string(Prog::N) + " nodes, " + std::to_string(Prog::plan.n_kernels) + " kernels";
  const auto reference = std::make_shared<dtensor>(ref(*e, args));
  INFO(out.name);
  std::string why;

  // Eager: op by op.
  const auto eager_result = eager(*e, args);
  CHECK(error_against(eager_result, *reference, &why) <= tolerance);

  // Static: the plan made at build time.
  fb::tensor<float, fb::shape_of_t<E>> static_result;
  {
    typename Prog::frame_t f;
    fb::cpu::runtime rt;
    rt.pool = &fb::cpu::shared_pool(2);
    fb::cpu::bind_inputs<Prog>(f, std::tie(*e), args);
    auto outs = std::tie(static_result);
    fb::cpu::bind_and_run<Prog>(f, outs, rt);
  }
  CHECK(error_against(static_result, *reference, &why) <= tolerance);

  // The JIT, twice: extents as they are, and rows symbolic.
  using dynamic = fb::jit::dynamic_function<Prog, fb::jit::cpu_target>;
  fb::jit::guard exact;
  exact.pattern = {x->extents(), w->extents(), m->extents()};
  exact.unit_inner = {true, true, true};
  exact.aligned = {true, true, true};
  std::vector<typename dynamic::prepared> prepared;
  prepared.push_back(dynamic::prepare(exact));
  if (R >= 2) {
    fb::jit::guard symbolic = exact;
    symbolic.pattern[0].extent[0] = fb::symbol(0);
    symbolic.symbol_min = {2};
    symbolic.symbol_max = {fb::dyn};
    prepared.push_back(dynamic::prepare(symbolic));
  }
  for (const auto& p : prepared) out.sources.insert(out.sources.end(), p.sources.begin(), p.sources.end());

#if FUSEBOX_FUZZ_CUDA
  // CUDA: the same specialisations rendered for NVRTC (compiled for sm_90 in the test body, GPU
  // or not), and on a GPU built and run against the same reference.
  using cuda_dynamic = fb::jit::dynamic_function<Prog, fb::jit::cuda_target>;
  std::vector<fb::jit::guard> cuda_guards{exact};
  if (R >= 2) {
    fb::jit::guard symbolic = exact;
    symbolic.pattern[0].extent[0] = fb::symbol(0);
    symbolic.symbol_min = {2};
    symbolic.symbol_max = {fb::dyn};
    cuda_guards.push_back(symbolic);
  }
  for (const auto& g : cuda_guards) {
    typename cuda_dynamic::program_t cp;
    cuda_dynamic::specialise_into(cp, g);
    for (int k = 0; k < cp.plan.n_kernels; ++k)
      if (cuda_dynamic::generated(cp.plan.kernels[k]))
        out.cuda_sources.push_back(fb::jit::render_cuda_kernel(cp.nodes, cp.plan, k, fb::dtype::f32, cp.unit_inner));
  }
  out.run_cuda = [=, name = out.name] {
    INFO(name << " (CUDA)");
    fb::cuda::tensor<float, fb::shape<R, C>> dx(*x);
    fb::cuda::tensor<float, fb::shape<C>> dw(*w);
    fb::cuda::tensor<float, fb::shape<C, C>> dm(*m);
    fb::cuda::tensor<float, fb::shape_of_t<E>> dy;
    fb::jit::cuda_runtime crt;
    for (const auto& g : cuda_guards) {
      const auto prog = cuda_dynamic::build(g);
      typename Prog::frame_t f;
      fb::cpu::bind_inputs<Prog>(f, std::tie(*e), std::tie(dx, dw, dm));
      auto outs = std::tie(dy);
      fb::cpu::bind_outputs<Prog>(f, outs);
      const auto concrete = fb::jit::specialise(cuda_dynamic::padded(Prog::graph::nodes),
                                                {x->extents(), w->extents(), m->extents()});
      fb::cpu::frame<float, cuda_dynamic::NB> gf;
      for (std::size_t i = 0; i < Prog::N; ++i) {
        gf.loc[i] = f.loc[i];
        gf.copy_to[i] = f.copy_to[i];
        gf.payload[i] = f.payload[i];
      }
      prog->run(gf, concrete, crt);
      crt.stream.sync();
      std::string why3;
      CHECK(error_against(dy.to_host(), *reference, &why3) <= tolerance);
      INFO(why3);
    }
  };
#endif
  auto shared = std::make_shared<std::vector<typename dynamic::prepared>>(std::move(prepared));
  out.finish = [=, name = out.name](std::vector<fb::jit::kernel_binary> bins) {
    INFO(name);
    std::size_t at = 0;
    for (auto& p : *shared) {
      std::vector<fb::jit::kernel_binary> mine(bins.begin() + at, bins.begin() + at + p.sources.size());
      at += p.sources.size();
      const auto prog = dynamic::attach(std::move(p), std::move(mine));
      typename Prog::frame_t f;
      fb::cpu::runtime rt;
      rt.pool = &fb::cpu::shared_pool(2);
      auto a = std::tie(*x, *w, *m);
      fb::cpu::bind_inputs<Prog>(f, std::tie(*e), a);
      fb::tensor<float, fb::shape_of_t<E>> jit_result;
      auto outs = std::tie(jit_result);
      fb::cpu::bind_outputs<Prog>(f, outs);
      dynamic::execute(*prog, f, {x->extents(), w->extents(), m->extents()}, rt);
      std::string why2;
      CHECK(error_against(jit_result, *reference, &why2) <= tolerance);
      INFO(why2);
    }
  };
  return out;
}

template <std::size_t... I>
std::vector<case_result> all_cases(std::index_sequence<I...>) {
  std::vector<case_result> v;
  (v.push_back(run_case<part_seeds[I]>()), ...);
  return v;
}

}  // namespace

TEST_CASE("seeded random programs agree: eager == static == JIT == double reference", "[jit][fuzz]") {
  // A cache of this test's own, so the kernels are really generated and compiled here.
  fb::jit::temp_directory cache_dir(fb::jit::detail::temp_root(), "fusebox-fuzz-");
  ::setenv("FUSEBOX_CACHE_DIR", cache_dir.path().c_str(), 1);
  fbt::seed_prelude(cache_dir.path());
  std::vector<case_result> cases = all_cases(std::make_index_sequence<FUSEBOX_FUZZ_COUNT>{});
  std::vector<fb::jit::rendered_kernel> all;
  for (const auto& c : cases) all.insert(all.end(), c.sources.begin(), c.sources.end());
  const auto before = fb::jit::counters().compiles.load();
  std::vector<fb::jit::kernel_binary> bins = fb::jit::kernel_store::instance().get_all(all);
  CHECK(fb::jit::counters().compiles.load() - before <= 1);
  std::size_t at = 0;
  for (auto& c : cases) {
    std::vector<fb::jit::kernel_binary> mine(bins.begin() + at, bins.begin() + at + c.sources.size());
    at += c.sources.size();
    c.finish(std::move(mine));
  }
  CHECK(cases.size() == FUSEBOX_FUZZ_COUNT);

#if FUSEBOX_FUZZ_CUDA
  // CUDA: every program's kernels compile with NVRTC (no GPU needed), and on a GPU
  // every program runs there against the same double reference.
  if (!fb::cuda::nvrtc_available()) {
    WARN("NVRTC not found: the CUDA rendering of these programs was not compiled");
    return;
  }
  std::vector<fb::jit::rendered_cuda_kernel> cuda_all;
  for (const auto& c : cases) cuda_all.insert(cuda_all.end(), c.cuda_sources.begin(), c.cuda_sources.end());
  // As in fuzz_ir.cpp: NVRTC's front end only without a GPU, a cubin with one.
  try {
    const std::string source = fb::jit::make_cuda_unit(cuda_all).source;
    if (fb::cuda::available()) CHECK(!fb::cuda::nvrtc_compile(source, "fuzz", "sm_90").cubin.empty());
    else fb::cuda::nvrtc_check(source, "fuzz", "compute_90", fbt::nvrtc_front_end_only);
  } catch (const fb::cuda::nvrtc_error& e) {
    FAIL(e.what());
  }
  if (!fb::cuda::available()) {
    WARN("no CUDA device: the programs' CUDA was checked by NVRTC but not run on a GPU");
    return;
  }
  for (auto& c : cases) c.run_cuda();
#else
  WARN("this part does not render its programs as CUDA (FUSEBOX_FUZZ_CUDA=0)");
#endif
}
