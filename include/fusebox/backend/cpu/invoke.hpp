// backend/cpu/invoke.hpp: one call of a program: binds the inputs, the payloads, the outputs, the arena and
// the workspace into a frame, then runs the kernels. Shared by eager evaluation and compiled calls.
// Depends on: backend/cpu/executor.hpp, backend/cpu/report.hpp (kernel names for the profiler), core/, profile.hpp.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdlib>
#include <span>
#include <string>
#include <tuple>
#include <utility>

#include "fusebox/backend/cpu/executor.hpp"
#include "fusebox/backend/cpu/report.hpp"
#include "fusebox/core/errors.hpp"
#include "fusebox/core/storage.hpp"
#include "fusebox/core/tensor.hpp"
#include "fusebox/profile.hpp"

namespace fusebox::cpu {

/// A growable 64-byte-aligned byte buffer: grows on the first calls, then stays (no heap after).
class buffer {
 public:
  std::byte* ensure(std::size_t bytes) {
    if (bytes > size_) {
      owner_ = allocate_storage(bytes);
      size_ = bytes;
    }
    return owner_.get();
  }
  std::byte* data() const noexcept { return owner_.get(); }
  std::size_t size() const noexcept { return size_; }

 private:
  storage_ptr owner_;
  std::size_t size_ = 0;
};

/// What a call runs with: threads, and memory that outlives the call. `fixed` (compiled::
/// use_memory) is the caller's memory for static programs: the arena at its start, then (under
/// options::freezing) the frozen region, then the workspace, each 64-byte aligned; the buffers are
/// then never grown. `frozen_for`: the program whose kept weights the frozen region holds (null:
/// none; compiled::refreeze and use_memory reset it).
struct runtime {
  thread_pool* pool = nullptr;
  buffer arena;
  buffer workspace;
  buffer frozen;
  std::span<std::byte> fixed;
  const void* frozen_for = nullptr;
};

/// Offset of what follows the arena in a runtime's fixed memory: the arena, rounded up to 64 bytes.
constexpr std::size_t fixed_workspace_offset(std::size_t arena_bytes) { return (arena_bytes + 63) / 64 * 64; }

namespace detail {
template <class T>
strided<T> writable(const strided<const T>& v) {
  return strided<T>{const_cast<T*>(v.data), v.shape, v.stride};
}
template <class T>
strided<T> writable(const strided<T>& v) {
  return v;
}
}  // namespace detail

/// Binds leaves and payloads of `roots` (a tuple of expression objects) and `args` (a tuple of
/// tensors, by reference) into `f`, and resolves the extents of every node.
template <class Program, class Roots, class Args>
void bind_inputs(typename Program::frame_t& f, const Roots& roots, const Args& args) {
  using T = typename std::remove_cvref_t<std::tuple_element_t<0, Roots>>::value_type;
  int k = 0;
  std::apply([&](const auto&... r) { (ir::collect_payloads(r, f.payload, k), ...); }, roots);
  [&]<std::size_t... I>(std::index_sequence<I...>) {
    (([&] {
       constexpr auto nd = Program::nodes[I];
       if constexpr (nd.desc.kind == node_kind::input) {
         using std::get;  // args may be a std::tuple or another tuple-like with an ADL get
         f.loc[I] = detail::writable<T>(get<nd.desc.input_index>(args).view());
       } else if constexpr (nd.desc.kind == node_kind::tensor) {
         using E = typename Program::graph::template type_of<I>;
         f.loc[I] = detail::writable<T>(static_cast<const E*>(f.payload[nd.payload_slot])->view);
       }
     }()),
     ...);
  }(std::make_index_sequence<Program::N>{});
  Program::resolve_shapes(f);
}

/// Where output R's node first stands among Program's outputs: R, unless the model returns one
/// node twice (identical subtrees merge); the later results are then copies of the first, made
/// after the run (copy_repeated_outputs here, cuda_backend's on the device).
template <class Program, std::size_t R>
constexpr std::size_t first_output() {
  for (std::size_t q = 0; q < R; ++q)
    if (Program::graph::outputs[q] == Program::graph::outputs[R]) return q;
  return R;
}

/// Points the output nodes at the caller's tensors (a tuple of references). Outputs that no kernel
/// writes (a leaf, a view, an opaque result) are copied at the end instead.
template <class Program, class Outs>
void bind_outputs(typename Program::frame_t& f, Outs& outs) {
  [&]<std::size_t... R>(std::index_sequence<R...>) {
    (([&] {
       constexpr int o = Program::graph::outputs[R];
       auto& t = std::get<R>(outs);
       constexpr node_kind k = Program::nodes[o].desc.kind;
       if constexpr (first_output<Program, R>() != R) return;  // copied from its first occurrence after the run
       else if constexpr (ir::is_leaf_kind(k) || k == node_kind::view || k == node_kind::opaque) f.copy_to[o] = t.view();
       else f.loc[o] = t.view();
     }()),
     ...);
  }(std::make_index_sequence<std::tuple_size_v<Outs>>{});
}

/// A model that returns the same node twice (identical subtrees merge into one node) gets it
/// computed into the first result; the others are copies of it, made after the run.
template <class Program, class Outs>
void copy_repeated_outputs(Outs& outs) {
  [&]<std::size_t... R>(std::index_sequence<R...>) {
    (([&] {
       constexpr std::size_t first = first_output<Program, R>();
       if constexpr (first != R) strided_copy(std::get<first>(outs).view(), std::get<R>(outs).view());
     }()),
     ...);
  }(std::make_index_sequence<std::tuple_size_v<Outs>>{});
}

/// Program::run while profiling: each kernel's span is named by its fused ops, as explain() lists
/// them ("mul, add, gelu", "matmul + epilogue(add, relu)"), not by its kind alone ("rows").
template <class Program>
void run_named(typename Program::frame_t& f) {
  static const auto names = [] {
    std::array<std::string, Program::plan.n_kernels> n;
    for (int k = 0; k < Program::plan.n_kernels; ++k) n[k] = kernel_ops<Program>(k);
    return n;
  }();
  // What Program::run does (each kernel in plan order), with a name for each kernel's span.
  auto one = [&]<int K>() {
    profile::kernel_name_scope name(names[K]);
    Program::template run_kernel<K>(f);
  };
  [&]<int... K>(std::integer_sequence<int, K...>) {
    (one.template operator()<K>(), ...);
  }(std::make_integer_sequence<int, Program::plan.n_kernels>{});
}

/// Binds output tensors, the arena, the frozen region (`freezing`: options::freezing) and the
/// workspace, then runs the static program.
template <class Program, class Outs>
void bind_and_run(typename Program::frame_t& f, Outs& outs, runtime& rt, bool freezing = false) {
  bind_outputs<Program>(f, outs);
  f.pool = rt.pool;
  const bool fixed = rt.fixed.data() != nullptr;
  f.arena = fixed ? rt.fixed.data() : rt.arena.ensure(Program::arena_bytes);
  Program::bind_intermediates(f);
  Program::number_values(f);
  const bool frozen = freezing && Program::all_static && Program::frozen_bytes > 0;
  std::size_t ws = 0;
  if constexpr (Program::all_static) ws = Program::workspace_bytes(rt.pool->size(), frozen);
  else ws = Program::workspace_bytes(rt.pool->size(), f);
  if (fixed) {
    const std::size_t kept = frozen ? Program::frozen_bytes : 0, at = fixed_workspace_offset(Program::arena_bytes);
    if (at + kept + ws > rt.fixed.size())
      FUSEBOX_THROW(invalid_argument("fusebox: compiled::use_memory: the memory given holds " +
                                     std::to_string(rt.fixed.size()) + " bytes; this call needs " +
                                     std::to_string(at + kept + ws) + " (arena " + std::to_string(Program::arena_bytes) +
                                     (frozen ? ", frozen weights " + std::to_string(kept) : std::string()) +
                                     ", workspace " + std::to_string(ws) + " on " + std::to_string(rt.pool->size()) +
                                     " threads): give it memory_bytes<Args...>(threads()" + (frozen ? ", true" : "") +
                                     ") bytes for these arguments"));
    f.frozen = frozen ? rt.fixed.data() + at : nullptr;
    f.workspace = rt.fixed.data() + at + kept;
    f.workspace_bytes = rt.fixed.size() - at - kept;
  } else {
    f.frozen = frozen ? rt.frozen.ensure(Program::frozen_bytes) : nullptr;
    f.workspace = rt.workspace.ensure(ws);
    f.workspace_bytes = rt.workspace.size();
  }
  if (frozen && rt.frozen_for != &Program::plan) {  // another program's, or none: nothing kept yet
    std::fill_n(reinterpret_cast<const void**>(f.frozen), Program::plan.n_kernels, nullptr);
    rt.frozen_for = &Program::plan;
  }
  if (profile::active()) run_named<Program>(f);
  else Program::run(f);
  copy_repeated_outputs<Program>(outs);
}

}  // namespace fusebox::cpu
