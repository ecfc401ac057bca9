// backend/backend.hpp: what a back end gives the call pipeline (pipeline/call.hpp), as a concept.
// backend/cpu.hpp and backend/cuda.hpp implement it; a third back end implements the same members
// and compile(), the gradients and explain() run on it unchanged. Everything above a back end
// (capture, guards, specialisation, the planner, the schedule's rules) is shared; a back end says
// what it can do (`caps`, read by the schedule) and runs what it is given.
// Depends on: schedule/schedule.hpp, options.hpp.
#pragma once

#include <concepts>
#include <string>

#include "fusebox/core/shape.hpp"
#include "fusebox/options.hpp"
#include "fusebox/schedule/schedule.hpp"

namespace fusebox::backends {

/// A back end, as the pipeline uses it:
///   name                     "cpu", "cuda": for messages and explain()
///   caps                     what its kernels can do (schedule::backend_caps): the schedule's input
///   target                   the run-time path's target: jit::dynamic_function<Prog, target>
///   records_graphs           whether reduce_overhead records a call to replay it (CUDA graphs)
///   tensor<T, S>             the tensor a call's results are (host memory, device memory)
///   state                    what one compiled function keeps on it between calls (thread pool,
///                            arena, stream, CUDA graphs)
///   modes_text(o)            what each compile mode does on it (explain())
/// and, checked where the pipeline instantiates them (they are templates over the program):
///   has_static_kernels<Prog> kernels for Prog exist from the build (all extents static and the
///                            back end instantiates them in this translation unit)
///   run_static<Prog>(f, outs, state, opts)  one call: binds the outputs `outs` (allocated by the
///                            pipeline at the call's shapes), runs, fills a result returned twice
///   run_dynamic<D>(entry, f, outs, state, opts, record_graph)  the same for a run-time program
///                            (entry: D::fast_entry, the program and the call's node shapes)
///   describe_static<Prog>(state), describe_dynamic<D>(prog, shapes, state)  explain()'s kernels
template <class B>
concept Backend = requires(const options& o) {
  { B::name } -> std::convertible_to<const char*>;
  { B::caps } -> std::convertible_to<schedule::backend_caps>;
  typename B::target;
  { B::records_graphs } -> std::convertible_to<bool>;
  typename B::state;
  typename B::template tensor<float, shape<1>>;
  { B::modes_text(o) } -> std::same_as<std::string>;
};

}  // namespace fusebox::backends
