// bench/render_dump.cpp: every generated kernel (CPU C++ and CUDA source) of a set of models, as the
// run-time path renders them, printed to compare two versions of the library byte for byte: a
// refactor below the planner that claims "the same kernels" shows it with this (docs/benchmarks.md,
// run AB). Rendering needs no GPU and no host compiler run. Not built by CMake:
//
//   g++ -std=c++20 -O0 -march=native -I<old tree>/include bench/render_dump.cpp -o old -lz -ldl -pthread
//   g++ -std=c++20 -O0 -march=native -DNEW_API -I$PWD/include bench/render_dump.cpp -o new -lz -ldl -pthread
//   ./old > old.txt; ./new > new.txt; cmp old.txt new.txt
//
// NEW_API: render_cuda_kernel takes the whole schedule (since run AB) rather than one kernel's.
#include <cstdio>
#include <string>

#include <fusebox/fusebox.hpp>

#include "../tests/support/planned_guard.hpp"

namespace fb = fusebox;

template <class E>
void dump(const char* name, std::size_t rows) {
  using Prog = fb::cpu::program<float, E>;
  {
    using D = fb::jit::dynamic_function<Prog, fb::jit::cuda_target>;
    typename D::program_t p;
    D::specialise_into(p, fbt::planned_guard<Prog>(rows));
    for (int k = 0; k < p.plan.n_kernels; ++k)
      if (D::generated(p.plan.kernels[k])) {
#ifdef NEW_API
        const auto r = fb::jit::render_cuda_kernel(p.nodes, p.plan, k, fb::dtype::f32, p.unit_inner, p.sched);
#else
        const auto r = fb::jit::render_cuda_kernel(p.nodes, p.plan, k, fb::dtype::f32, p.unit_inner, p.sched.kernels[k]);
#endif
        std::printf("=== %s rows %zu cuda kernel %d threads %u rpb %u\n%s\n", name, rows, k, r.block_threads, r.rows_per_block, r.source.c_str());
      }
  }
  {
    using D = fb::jit::dynamic_function<Prog, fb::jit::cpu_target>;
    const auto pr = D::prepare(fbt::planned_guard<Prog>(rows));
    for (const auto& r : pr.sources) std::printf("=== %s rows %zu cpu\n%s\n", name, rows, r.source.c_str());
  }
}

template <std::size_t C>
using X = fb::input_leaf<0, float, fb::shape<fb::dyn, C>>;
template <std::size_t C>
using G = fb::input_leaf<1, float, fb::shape<C>>;
template <std::size_t C>
using B = fb::input_leaf<2, float, fb::shape<C>>;

template <std::size_t C>
void family(std::size_t rows) {
  auto sm = [](auto x) { return fb::softmax(x); };
  auto ln = [](auto x, auto g, auto b) { return fb::layer_norm(x, g, b, 1e-5f); };
  auto w2 = [](auto x, auto g, auto b) { return fb::layer_norm(fb::softmax(x), g, b, 1e-5f); };
  auto lse = [](auto x) { return fb::log_softmax(x * 2.0f); };
  auto cols = [](auto x, auto g) { return fb::sum(fb::exp(x) * g, fb::axis<0>); };
  auto ew = [](auto x, auto g) { return fb::relu(x) * g + 0.5f; };
  const std::string c = std::to_string(C);
  dump<decltype(sm(X<C>{}))>(("softmax " + c).c_str(), rows);
  dump<decltype(ln(X<C>{}, G<C>{}, B<C>{}))>(("layer_norm " + c).c_str(), rows);
  dump<decltype(w2(X<C>{}, G<C>{}, B<C>{}))>(("w2 " + c).c_str(), rows);
  dump<decltype(lse(X<C>{}))>(("log_softmax " + c).c_str(), rows);
  dump<decltype(cols(X<C>{}, G<C>{}))>(("cols " + c).c_str(), rows);
  dump<decltype(ew(X<C>{}, G<C>{}))>(("ew " + c).c_str(), rows);
}

int main() {
  for (std::size_t rows : {0u, 7u, 256u}) {
    family<19>(rows);
    family<64>(rows);
    family<768>(rows);
    family<4096>(rows);
    family<20000>(rows);
  }
}
