// pipeline/targets.hpp: the names the call pipeline uses of the run-time path and of the CUDA back
// end, declared without their definitions, so that a program that runs only static shapes on the
// CPU does not parse (or compile) the JIT or the CUDA back end (issue 22; docs/benchmarks.md,
// run AE: <fusebox/cpu.hpp> 2.7 CPU-s). The definitions are in pipeline/dynamic_function.hpp (the run-time path,
// on either target) and backend/cuda.hpp; an entry point names them only in branches that the
// argument types select, so a unit instantiates them only when it calls them, and then it has
// included them (fusebox/jit.hpp, fusebox/cuda.hpp or fusebox/fusebox.hpp). A header that defines
// one of these names includes this one, so each is declared in one place.
// Depends on: nothing.
#pragma once

#include <cstddef>

namespace fusebox {
namespace jit {
/// Where a run-time program runs: generated C++ on the CPU, or generated CUDA on the GPU. The
/// guards, the recompile policy and the planner are the same for both.
struct cpu_target {};
struct cuda_target {};

template <class Prog, class Target>
class dynamic_function;

/// Clears the run-time path's in-memory kernel cache (fusebox::reset()); set by the kernel
/// store's constructor (runtime/kernel_store.hpp), null while there is no store to clear.
inline void (*clear_kernel_memory)() = nullptr;

/// mode::reduce_overhead: call signatures a run-time function keeps for its fast path (most
/// recent first).
inline constexpr std::size_t fast_path_signatures = 8;
}  // namespace jit

namespace backends {
struct cuda_backend;
}  // namespace backends

namespace cuda {
/// A tensor in GPU memory (backend/cuda/tensor.hpp). compile.hpp names it in the branches that
/// device arguments or backend::cuda select: <fusebox/cpu.hpp> parses none of the CUDA driver
/// layer (backend/cuda/{tensor,memory,driver,library}.hpp).
template <class T, class Shape>
class tensor;

template <class X>
inline constexpr bool is_tensor_v = false;
template <class T, class S>
inline constexpr bool is_tensor_v<tensor<T, S>> = true;

/// Checks that a device can run the CUDA back end (throws backend_unavailable with what was tried
/// and the fix otherwise). Null until this process first tries the driver (backend/cuda/driver.hpp's
/// driver_once). A pointer, so that host code which only refuses a CUDA request on host tensors
/// (compile.hpp) does not compile the driver into every unit.
inline void (*require_device)() = nullptr;
}  // namespace cuda

namespace pipeline {
/// Whether type X is defined in this unit (used only to turn a missing header into a readable
/// build error; the answer never changes what is compiled).
template <class X>
inline constexpr bool defined_here = requires { sizeof(X); };
}  // namespace pipeline
}  // namespace fusebox
