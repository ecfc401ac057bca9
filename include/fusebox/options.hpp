// options.hpp: what compile() is told, mirroring torch.compile's arguments.
// A structural type, so it can also be a template argument: compile<options{.fullgraph = true}>(m)
// makes graph breaks build errors, which a run-time options value cannot.
// Depends on: core/environment.hpp, the C++ standard library.
#pragma once

#include <string_view>

#include "fusebox/core/environment.hpp"

namespace fusebox {

namespace cpu {
struct external_pool;  // backend/cpu/thread_pool.hpp
}

enum class mode { default_, reduce_overhead, max_autotune };
enum class dynamic { automatic, always, never };
/// Where a compiled function runs.
///   automatic (default): where the arguments are: host tensors on the CPU, cuda::tensor
///                        arguments on the GPU (what fusebox always did).
///   cpu:  the CPU only; cuda::tensor arguments are an invalid_argument naming the fix.
///   cuda: the GPU; host tensor arguments are uploaded, the model runs on the GPU and the results
///         come back as host tensors. Without a usable GPU this is a backend_unavailable saying
///         what was tried and the fix (never a silent CPU run).
enum class backend { automatic, cpu, cuda };

/// Process-wide stance, like torch.compiler.set_stance: `force_eager` runs every compiled function
/// eagerly (so does FUSEBOX_DISABLE=1: bisect a wrong answer or a slowdown without a rebuild);
/// `fail_on_recompile` makes any recompile throw fusebox::recompile_error (serving).
enum class stance { default_, force_eager, fail_on_recompile };

struct options {
  fusebox::mode mode = fusebox::mode::default_;
  bool fullgraph = false;          ///< a graph break is an error (build error when given as a template argument)
  fusebox::dynamic dynamic = fusebox::dynamic::automatic;
  fusebox::backend backend = fusebox::backend::automatic;
  int recompile_limit = 8;
  bool error_on_recompile = false;
  bool fast_math = false;          ///< float transcendentals within Eigen 3.4's error instead of faithful
                                   ///< (host: vmath::fast); NVRTC's --use_fast_math on CUDA
  unsigned threads = 0;  ///< 0: fusebox::default_threads()
  /// reduce_overhead: CUDA graphs kept per compiled function (one per call signature: extents,
  /// addresses), least recently used dropped first. See compiled::cudagraph_sizes.
  unsigned cudagraph_cap = 16;
  /// compile(grad(...)) / compile(value_and_grad(...)) only, as torch._functorch.config's: the
  /// forward values the backward may keep in memory, as a fraction of what it keeps by default.
  /// 1 (default): keep every value the backward reads; 0: compute again every elementwise and
  /// reduction value it can (matmul, attention and convolution results are always kept); in
  /// between, the cheapest to recompute per byte go first (plan/recompute.hpp). Part of the
  /// compiled program's type, so give it as a template argument:
  /// compile<options{.activation_memory_budget = 0.5f}>(vg).
  float activation_memory_budget = 1.0f;
  /// Inference with parameters that do not change, as torch._inductor.config.freezing: the tensors
  /// the model captures (its parameters; not the call's arguments) are taken as constants, so what
  /// a kernel makes of them is made at the first call and kept: a 5x5 convolution's Winograd-
  /// transformed weights (backend/cpu/winograd.hpp), a one-row matmul's weight packed in column
  /// blocks (backend/cpu/gemm.hpp). Made again when a captured tensor is another one (its address);
  /// a change of its values in place may not be seen (what was kept is used): call
  /// compiled::refreeze() after it. Static shapes on the CPU; elsewhere it changes nothing. The
  /// kept weights take memory of their own (compiled::memory_bytes(threads, true) counts them).
  bool freezing = false;
  /// The caller's own thread pool for this function's CPU work, in place of fusebox's (threads is
  /// then ignored); it must outlive the compiled function. See cpu::external_pool. Last: nvcc
  /// writes an options template argument back out positionally and leaves a null pointer member
  /// out, which shifted the members after it (tests/cuda/static_nvcc.cu).
  const cpu::external_pool* pool = nullptr;
};

namespace detail {
inline stance& stance_ref() {
  static stance s = stance::default_;
  return s;
}
}  // namespace detail

inline void set_stance(stance s) { detail::stance_ref() = s; }
inline stance current_stance() { return detail::stance_ref(); }

namespace detail {
/// FUSEBOX_DISABLE=1 in the environment: every compiled function runs eagerly (read once).
inline bool disabled_by_environment() {
  static const bool off = [] {
    const char* v = ::fusebox::detail::environment_variable("FUSEBOX_DISABLE");
    return v && *v && std::string_view(v) != "0";
  }();
  return off;
}
}  // namespace detail

/// Whether the global rollback is on (stance force_eager or FUSEBOX_DISABLE=1): every compiled
/// function then runs its model eagerly. compiled::disable() does the same for one function.
inline bool rollback_active() { return detail::disabled_by_environment() || current_stance() == stance::force_eager; }

}  // namespace fusebox
