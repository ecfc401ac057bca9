// backend/cuda.hpp: the CUDA back end. A run-time program's kernels are CUDA compiled by NVRTC,
// its products run in cuBLASLt (with what the schedule gives it of their epilogues), and in
// reduce_overhead and max_autotune a call is replayed from a CUDA graph (backend/cuda/generated_program.hpp).
// In an nvcc translation unit a program whose extents are all static and whose kernels all have
// templates runs instead on kernels nvcc instantiated at build time (backend/cuda/static_kernels.cuh): no
// guard, no NVRTC, launched directly in every mode.
// Depends on: backend/backend.hpp, backend/cuda/tensor.hpp, pipeline/dynamic_function.hpp, plan/{at_extents,report}.hpp.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "fusebox/backend/backend.hpp"
#include "fusebox/backend/cpu/invoke.hpp"
#include "fusebox/backend/cuda/memory.hpp"
#include "fusebox/backend/cuda/tensor.hpp"
#include "fusebox/pipeline/dynamic_function.hpp"
#include "fusebox/pipeline/targets.hpp"
#include "fusebox/plan/at_extents.hpp"
#include "fusebox/plan/report.hpp"
#if defined(__CUDACC__)
#include "fusebox/backend/cuda/static_kernels.cuh"  // nvcc units: kernels for static shapes instantiated at build time
#endif

namespace fusebox {
namespace backends {

struct cuda_backend {
  static constexpr const char* name = "cuda";
  static constexpr schedule::backend_caps caps = schedule::cuda_caps;
  using target = jit::cuda_target;
  /// Records a call as a graph to replay (reduce_overhead): CUDA graphs.
  static constexpr bool records_graphs = true;
  template <class T, class S>
  using tensor = cuda::tensor<T, S>;

  /// The stream's arena, the CUDA graphs and the tuning state, made by the function's first CUDA
  /// call (a CPU-only user never touches the driver).
  struct state {
    std::unique_ptr<jit::cuda_runtime> rt;
    jit::cuda_runtime& get(const options& o) {
      if (!rt) {
        rt = std::make_unique<jit::cuda_runtime>();
        rt->graphs.set_cap(o.cudagraph_cap);
        rt->autotune = o.mode == mode::max_autotune;
      }
      return *rt;
    }
  };

  /// Throws backend_unavailable (what was tried, the fix) unless a device can run this back end.
  static void check_device() { (void)cuda::current_device(); }

  /// A compiled gradient's lifted numbers on the device (autodiff/grad.hpp, which names no CUDA
  /// type: a host-only gradient compiles none of the driver): a buffer of `bytes`, its address,
  /// and an upload into it once the calls queued before, which may read it, are done.
  static std::shared_ptr<void> make_numbers(std::size_t bytes) { return std::make_shared<cuda::device_buffer>(bytes); }
  static std::uintptr_t numbers_address(const std::shared_ptr<void>& n) {
    return static_cast<std::uintptr_t>(static_cast<const cuda::device_buffer*>(n.get())->get());
  }
  static void upload_numbers(const std::shared_ptr<void>& n, const void* src, std::size_t bytes) {
    cuda::work_stream().sync();
    cuda::copy_to_device(static_cast<const cuda::device_buffer*>(n.get())->get(), src, bytes);
  }

  template <class Prog>
  static constexpr bool has_static_kernels =
#if defined(__CUDACC__)
      cuda::static_path::supported<Prog>();
#else
      false;
#endif

  template <class Prog, class Outs>
  static void run_static(typename Prog::frame_t& f, Outs& outs, state& s, const options& o) {
#if defined(__CUDACC__)
    cpu::bind_outputs<Prog>(f, outs);
    jit::cuda_runtime& rt = s.get(o);
    cuda::static_path::runner<Prog>::run(f, rt);
    cuda::static_path::calls().fetch_add(1, std::memory_order_relaxed);
    copy_repeated_outputs<Prog>(outs, rt.stream.get());
#else
    (void)f, (void)outs, (void)s, (void)o;
    static_assert(sizeof(Prog) == 0, "fusebox internal: the static CUDA path exists in nvcc units only");
#endif
  }

  /// One call of run-time program e.prog at the call's node shapes e.concrete, on the caller's
  /// stream: the frame widened to the merged graph's size and, unless in default mode or
  /// `record_graph` is false (compiled::cudagraph_sizes), replayed from a CUDA graph.
  template <class D, class Outs>
  static void run_dynamic(const typename D::fast_entry& e, typename D::prog_type::frame_t& f, Outs& outs, state& s,
                          const options& o, bool record_graph) {
    using Prog = typename D::prog_type;
    cpu::bind_outputs<Prog>(f, outs);
    cpu::frame<typename Prog::value_type, D::NB> g;
    for (std::size_t i = 0; i < Prog::N; ++i) {
      g.loc[i] = f.loc[i];
      g.copy_to[i] = f.copy_to[i];
      g.payload[i] = f.payload[i];
    }
    jit::cuda_runtime& rt = s.get(o);
    // max_autotune is reduce_overhead plus tuning, as in torch.compile.
    if (o.mode != mode::default_ && record_graph)
      e.prog->run_graph(g, [&]() -> const std::array<ir::node, D::NB>& { return e.concrete; }, e.facts.extents, rt);
    else e.prog->run(g, e.concrete, rt);
    copy_repeated_outputs<Prog>(outs, rt.stream.get());
  }

  /// A model that returns one node twice gets it computed into the first result; the others are
  /// copies of it, queued after the call.
  template <class Prog, class Outs>
  static void copy_repeated_outputs(Outs& outs, cuda::CUstream on) {
    [&]<std::size_t... R>(std::index_sequence<R...>) {
      (([&] {
         constexpr std::size_t first = cpu::first_output<Prog, R>();
         if constexpr (first != R) {
           auto& to = std::get<R>(outs);
           using E = typename std::remove_cvref_t<decltype(to)>::value_type;
           cuda::copy_on_device_async(reinterpret_cast<cuda::CUdeviceptr>(to.view().data),
                                      reinterpret_cast<cuda::CUdeviceptr>(std::get<first>(outs).view().data),
                                      to.extents().size() * sizeof(E), on);
         }
       }()),
       ...);
    }(std::make_index_sequence<std::tuple_size_v<Outs>>{});
  }

  template <class Prog>
  static std::string describe_static(const state&) {
    return plan::describe_kernels(Prog::nodes, Prog::plan, sizeof(typename Prog::value_type),
                                  [](int) { return std::string("CUDA kernel instantiated by nvcc at build time"); }) +
           "  arena: " + plan::detail::human_bytes(static_cast<double>(Prog::arena_bytes)) + " (constexpr)\n";
  }

  /// Run-time program p at one call's node shapes: the plan's report at those extents, each kernel
  /// an NVRTC kernel, a cuBLASLt call (and what it takes of the epilogue), or a library kernel.
  template <class D>
  static std::string describe_dynamic(const typename D::program_t& p, const std::array<ir::node, D::NB>& concrete,
                                      const state&) {
    using T = typename D::prog_type::value_type;
    const auto at = plan::at_extents(p.plan, concrete, sizeof(T));
    auto how = [&](int k) -> std::string {
      const plan::kernel& kn = at.kernels[k];
      switch (kn.kind) {
        case plan::kernel_kind::rows:
        case plan::kernel_kind::reduce_cols: return "NVRTC: " + p.kernels[k].summary;
        case plan::kernel_kind::matmul: {
          const schedule::library_epilogue& lib = p.sched.kernels[k].library;
          std::string s = "cuBLASLt";
          if (lib.bias >= 0 || lib.residual >= 0 || lib.whole)
            s += std::string(" with its epilogue's ") + (lib.bias >= 0 ? "bias" : "") +
                 (lib.bias >= 0 && lib.residual >= 0 ? " and " : "") + (lib.residual >= 0 ? "residual" : "") +
                 (lib.whole ? (lib.bias >= 0 || lib.residual >= 0 ? ", the whole epilogue" : "whole epilogue") : "");
          if (kn.group >= 0 && !lib.whole) s += "; rest of the epilogue by NVRTC: " + p.kernels[k].summary;
          return s;
        }
        case plan::kernel_kind::attention: return "fusebox's attention kernel, or cuDNN's under max_autotune when faster";
        case plan::kernel_kind::copy: return "strided copy on the GPU";
        default:
          return "NVRTC: " + p.op_kernels[k].summary +
                 (kn.group >= 0 ? "; epilogue by NVRTC: " + p.kernels[k].summary : std::string());
      }
    };
    return plan::describe_kernels(concrete, at, sizeof(T), how) + "  arena: " +
           plan::detail::human_bytes(static_cast<double>(at.arena_bytes)) +
           " on the device at this call's extents (laid out per call)\n";
  }

  /// What each mode does on the GPU, the one `o` selects marked.
  static std::string modes_text(const options& o) {
    auto mark = [&](mode m) { return std::string(o.mode == m ? " (this compile)" : ""); };
    return std::string("modes on the GPU:\n") + "  default_" + mark(mode::default_) +
           ": each call checks the guards and launches its kernels and cuBLASLt calls on the caller's stream\n" +
           "  reduce_overhead" + mark(mode::reduce_overhead) + ": an exact repeat of one of the last " +
           std::to_string(jit::fast_path_signatures) +
           " call signatures skips the guards and the specialisation, and the call is recorded once as a CUDA graph "
           "and replayed with one launch (up to options::cudagraph_cap = " + std::to_string(o.cudagraph_cap) +
           " graphs; compiled::cudagraph_sizes limits which sizes; counters graph_captures / replays)\n" +
           "  max_autotune" + mark(mode::max_autotune) +
           ": reduce_overhead, plus timed choices on a shape's first call: cuBLASLt algorithms and split-K forms, "
           "each generated kernel's entry and block size, cuDNN's fused attention against fusebox's; winners kept "
           "in the cache directory (FUSEBOX_LOGS=autotune)\n";
  }
};
static_assert(Backend<cuda_backend>);

}  // namespace backends
}  // namespace fusebox
