// backend/cpu.hpp: the CPU back end. Static programs are instantiated when the translation unit is
// compiled (backend/cpu/executor.hpp: kernels over xsimd, gemm with the epilogue on finished rows); a
// run-time program's kernels are generated C++ compiled by the host compiler (backend/cpu/generated_program.hpp).
// Both run on the function's thread pool.
// The run-time path's types reach this back end as template arguments (pipeline/dynamic_function.hpp
// is not needed to run static programs).
// Depends on: backend/backend.hpp, backend/cpu/{autotune,invoke,report}.hpp, pipeline/targets.hpp,
// plan/{at_extents,report}.hpp.
#pragma once

#include <array>
#include <memory>
#include <string>

#include "fusebox/backend/backend.hpp"
#include "fusebox/backend/cpu/autotune.hpp"
#include "fusebox/backend/cpu/invoke.hpp"
#include "fusebox/backend/cpu/report.hpp"
#include "fusebox/core/tensor.hpp"
#include "fusebox/pipeline/targets.hpp"
#include "fusebox/plan/at_extents.hpp"
#include "fusebox/plan/report.hpp"

namespace fusebox::backends {

struct cpu_backend {
  static constexpr const char* name = "cpu";
  static constexpr schedule::backend_caps caps = schedule::cpu_caps;
  using target = jit::cpu_target;
  /// Records no call graphs (reduce_overhead on the CPU is the guard fast path alone).
  static constexpr bool records_graphs = false;
  template <class T, class S>
  using tensor = fusebox::tensor<T, S>;

  /// The thread pool, and the arena and workspace a call reuses (held by value: a compiled
  /// function allocates nothing when it is made).
  struct state {
    cpu::runtime rt;
    unsigned threads() const { return rt.pool->size(); }
  };

  /// A program whose extents are all static was instantiated with the translation unit.
  template <class Prog>
  static constexpr bool has_static_kernels = Prog::all_static;

  template <class Prog, class Outs>
  static void run_static(typename Prog::frame_t& f, Outs& outs, state& s, const options& o) {
    cpu::bind_and_run<Prog>(f, outs, s.rt, o.freezing);
  }

  /// One call of run-time program e.prog at the call's node shapes e.concrete.
  template <class D, class Outs>
  static void run_dynamic(const typename D::fast_entry& e, typename D::prog_type::frame_t& f, Outs& outs, state& s,
                          const options&, bool) {
    using Prog = typename D::prog_type;
    cpu::bind_outputs<Prog>(f, outs);
    D::execute(*e.prog, f, e.concrete, s.rt);
    cpu::copy_repeated_outputs<Prog>(outs);
  }

  template <class Prog>
  static std::string describe_static(const state& s) {
    return cpu::describe<Prog>(s.threads());
  }

  /// Run-time program p at one call's node shapes: the plan's report at those extents, each kernel
  /// generated or on the host.
  template <class D>
  static std::string describe_dynamic(const typename D::program_t& p, const std::array<ir::node, D::NB>& concrete,
                                      const state& s) {
    using T = typename D::prog_type::value_type;
    const auto at = plan::at_extents(p.plan, concrete, sizeof(T));
    const std::string threads = "; threads " + std::to_string(s.threads());
    auto how = [&](int k) -> std::string {
      const plan::kernel& kn = at.kernels[k];
      switch (kn.kind) {
        case plan::kernel_kind::rows:
        case plan::kernel_kind::reduce_cols: return "generated: " + p.kernels[k].summary + threads;
        case plan::kernel_kind::matmul:
        case plan::kernel_kind::spatial:
          return cpu::conv_algorithm<T>(concrete, kn) + "on the host" +
                 (kn.group >= 0 ? ", generated epilogue: " + p.kernels[k].summary : std::string()) + threads;
        default: return "on the host" + threads;
      }
    };
    return plan::describe_kernels(concrete, at, sizeof(T), how) + "  arena: " +
           plan::detail::human_bytes(static_cast<double>(at.arena_bytes)) +
           " at this call's extents (laid out per call)\n";
  }

  /// What each mode does on the CPU, the one `o` selects marked. Said even where a mode does
  /// nothing: a mode accepted and silently ignored is worse than one explained.
  static std::string modes_text(const options& o) {
    auto mark = [&](mode m) { return std::string(o.mode == m ? " (this compile)" : ""); };
    return std::string("modes on the CPU:\n") + "  default_" + mark(mode::default_) +
           ": each call of the run-time path (dyn extents) checks the guards and specialises the plan to its "
           "extents; kernels take their rules (gemm path and grid, direct or Winograd convolution, rows per task)\n" +
           "  reduce_overhead" + mark(mode::reduce_overhead) + ": on the run-time path an exact repeat of one of the last " +
           std::to_string(jit::fast_path_signatures) +
           " call signatures (extents, inner strides, alignment, which scalars are equal) skips the guards, the "
           "hint checks and the specialisation (counters().fast_path_calls); static shapes have no guard or "
           "specialisation per call, so there it changes nothing; no CUDA graphs on the CPU\n" +
           "  max_autotune" + mark(mode::max_autotune) + ": reduce_overhead, plus timed choices per problem: " +
           cpu::autotune::description() + "; winners kept in memory and in " +
           cpu::autotune::persistent_where() +
           ", so a later process times nothing (FUSEBOX_LOGS=autotune, counters().autotune_timed / "
           "autotune_from_disk); the run-time path's generated row and column kernels are not tuned\n";
  }
};
static_assert(Backend<cpu_backend>);

}  // namespace fusebox::backends
