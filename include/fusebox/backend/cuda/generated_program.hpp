// backend/cuda/generated_program.hpp: the host side of a generated CUDA program. Like jit::program (the CPU
// one), it holds one specialisation (IR with known or symbolic extents, and the plan the one
// planner made for it) and runs a call on a stream: lays out the device arena for the call's
// extents, binds every node's device memory, and runs the kernels in plan order: generated
// kernels for rows, column reductions and matmul epilogues; cuBLASLt for products; device copies;
// hand-written units for attention (backend/cuda/attention_kernel.hpp), conv2d, pooling, embedding and pad
// (backend/cuda/spatial_kernels.hpp), the latter with a device scratch after the arena's nodes (the weight
// gradient's split partials, embedding_backward's row counts, one bad-id flag per gather kernel,
// attention's gradient kernels' L and D per query row: backend/cuda/attention_backward_kernel.hpp).
//
// Launch shapes: elementwise kernels take 256 threads a block and a grid of at most 32 blocks per
// SM (grid-stride beyond); row kernels one block per row (grid-stride over rows) with enough
// threads that each walks about four 16-byte chunks of the row per pass; column reductions one
// thread per output element (grid-stride). The vector entry (16-byte accesses) runs when every unit-stride operand is
// 16-byte aligned with row strides in whole vectors and the row length is too; else the scalar one.
// Elementwise kernels take the wide entry (two vectors a thread) where rows allow twice that.
// Depends on: backend/cpu/generated_program.hpp, backend/cuda/{module_store,codegen,graph_cache,autotune,attention_kernel,attention_choice,spatial_kernels}.hpp,
// backend/cuda/{cublaslt,memory,module}.hpp.
#pragma once

#include <array>
#include <cstring>
#include <memory>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "fusebox/backend/cpu/addressing.hpp"
#include "fusebox/backend/cpu/gather.hpp"
#include "fusebox/backend/cpu/generated_program.hpp"
#include "fusebox/backend/cuda/attention_choice.hpp"
#include "fusebox/backend/cuda/attention_kernel.hpp"
#include "fusebox/backend/cuda/autotune.hpp"
#include "fusebox/backend/cuda/codegen.hpp"
#include "fusebox/backend/cuda/cublaslt.hpp"
#include "fusebox/backend/cuda/custom_kernels.hpp"
#include "fusebox/backend/cuda/graph_cache.hpp"
#include "fusebox/backend/cuda/memory.hpp"
#include "fusebox/backend/cuda/module.hpp"
#include "fusebox/backend/cuda/module_store.hpp"
#include "fusebox/backend/cuda/spatial_kernels.hpp"
#include "fusebox/backend/cuda/strided_copy.hpp"
#include "fusebox/core/errors.hpp"
#include "fusebox/core/linkage.hpp"
#include "fusebox/core/low_precision.hpp"
#include "fusebox/profile.hpp"
#include "fusebox/schedule/schedule.hpp"

namespace fusebox::jit {

/// Per compiled function: the stream its calls run on, the device arena they reuse, and the
/// CUDA graphs of `mode::reduce_overhead` (they point into the arena, so they live with it).
/// Calls run on cuda::work_stream(), shared by every compiled function and tensor copy, so the
/// arena is reused only after the previous call's kernels (stream order) and results are read
/// after the call that wrote them. cuBLASLt's workspace for that stream is never released here:
/// other functions' graphs point into it.
struct cuda_runtime {
  cuda::stream& stream = cuda::work_stream();
  cuda::device_buffer arena;
  cuda_graph_cache graphs;
  bool autotune = false;  // mode::max_autotune: products through lt_tuner
  std::set<std::vector<std::uint64_t>> tuned;  // shapes (graph_key::shape) whose first call ran outside a graph
  bool lt_ready = false;  // cuBLASLt's handle and the stream's workspace exist (needed before a capture)
  cuda_runtime() = default;
  cuda_runtime(const cuda_runtime&) = delete;
  cuda_runtime& operator=(const cuda_runtime&) = delete;
  ~cuda_runtime() {
    try {
      stream.sync();  // queued calls may still use the arena
    } catch (...) {
    }
  }
};

template <class T, std::size_t N>
struct cuda_program {
  std::array<ir::node, N> graph{};  ///< the model's graph, duplicates merged (jit/merge.hpp), generic extents
  std::array<ir::node, N> nodes{};
  plan::plan_t<N> plan{};
  std::array<bool, N> unit_inner{};
  /// How each kernel runs on this back end (schedule/schedule.hpp): here, what cuBLASLt takes of
  /// each matmul's epilogue.
  schedule::schedule_t<N> sched{};
  static constexpr schedule::backend_caps caps = schedule::cuda_caps;
  dtype storage = dtype::f32;
  std::array<rendered_cuda_kernel, N + 1> kernels{};  ///< generated kernels (others empty)
  std::array<cuda::CUfunction, N + 1> wide_entry{}, vector_entry{}, scalar_entry{};
  /// Spatial, gather, pad and custom kernels (backend/cuda/spatial_kernels.hpp, custom_kernels.hpp): the op's
  /// unit and its two stages; a spatial node's epilogue, if any, is in `kernels` like a matmul's.
  std::array<rendered_cuda_kernel, N + 1> op_kernels{};
  std::array<cuda::CUfunction, N + 1> op_first{}, op_second{};
  std::vector<std::shared_ptr<cuda::module>> modules;  ///< what the entry points live in (kept loaded)
  std::string key;

  /// One call queued on rt.stream (the caller's reads wait for it: cuda::tensor::to_host). `f`
  /// has inputs and outputs bound to device memory; `concrete` holds the call's node shapes.
  void run(cpu::frame<T, N>& f, const std::array<ir::node, N>& concrete, cuda_runtime& rt) const {
    plan::plan_t<N> p = plan;
    bind(f, p, concrete, rt);
    enqueue(f, p, concrete, rt.stream.get(), rt.autotune, profile::device_timing());
    check_ids(f, p, concrete, rt);
  }

  /// The same call replayed from a CUDA graph (mode::reduce_overhead and max_autotune), recorded
  /// on a miss. Under max_autotune a shape's first call runs outside a graph: tuning times
  /// candidates and synchronises, which a capture forbids.
  /// `concrete()` gives the call's node shapes; it runs only where the call is not a replay.
  template <class Concrete>
  void run_graph(cpu::frame<T, N>& f, Concrete&& concrete_shapes, const std::vector<dims>& extents,
                 cuda_runtime& rt) const {
    graph_key key = key_for(f, extents);  // before bind: only what the caller passed is bound yet
    // The steady state: a graph recorded for these extents, addresses and scalars in this arena
    // is all the call needs (bind would lay the arena out as it did then), so it is replayed
    // without the per-call host work that grows with the node count (specialise, a copy of the
    // plan, bind: arrays of N nodes, 512 for W4 as one function). Not for embeddings (their
    // calls read the bad-id flags back) or a shape max_autotune has yet to tune.
    if (!has_gather() && !(rt.autotune && !rt.tuned.contains(key.shape))) {
      key.binding.push_back(rt.arena.get());
      if (rt.graphs.replay(key, rt.stream.get())) return;
      key.binding.pop_back();
    }
    const std::array<ir::node, N> concrete = concrete_shapes();
    plan::plan_t<N> p = plan;
    if (bind(f, p, concrete, rt)) rt.graphs.clear();  // the arena moved: every graph points into the old one
    key.binding.push_back(rt.arena.get());
    if (rt.autotune && rt.tuned.insert(key.shape).second) {
      enqueue(f, p, concrete, rt.stream.get(), true, false, true);  // outside a graph: it may time candidates
      check_ids(f, p, concrete, rt);
      return;
    }
    if (!rt.lt_ready) {
      cuda::lt_prepare(rt.stream.get());  // allocating during a capture is not allowed
      rt.lt_ready = true;
    }
    rt.graphs.run(key, rt.stream.get(), [&] { enqueue(f, p, concrete, rt.stream.get(), rt.autotune); },
                  "compiled function (CUDA)");
    check_ids(f, p, concrete, rt);
  }

  /// Whether the plan has an embedding kernel (its calls end by reading the bad-id flags).
  bool has_gather() const {
    for (int k = 0; k < plan.n_kernels; ++k)
      if (plan.kernels[k].kind == plan::kernel_kind::gather) return true;
    return false;
  }

  /// What a recorded call depends on (backend/cuda/graph_cache.hpp): this specialisation and the call's
  /// extents; the addresses the caller bound (inputs, outputs, copy targets) and scalar values.
  graph_key key_for(const cpu::frame<T, N>& f, const std::vector<dims>& extents) const {
    graph_key key;
    key.shape.push_back(reinterpret_cast<std::uintptr_t>(this));
    for (const dims& d : extents) {
      key.shape.push_back(d.rank);
      for (std::size_t i = 0; i < d.rank; ++i) key.shape.push_back(d.extent[i]);
    }
    for (std::size_t i = 0; i < N; ++i) {
      if (f.loc[i].data) key.binding.insert(key.binding.end(), {i, reinterpret_cast<std::uintptr_t>(f.loc[i].data)});
      if (f.copy_to[i].data)
        key.binding.insert(key.binding.end(), {i + N, reinterpret_cast<std::uintptr_t>(f.copy_to[i].data)});
      if (nodes[i].desc.kind == node_kind::scalar && nodes[i].payload_slot >= 0) {  // not a padding node
        const float v = static_cast<float>(static_cast<const scalar_leaf<T>*>(f.payload[nodes[i].payload_slot])->value);
        std::uint32_t bits;
        std::memcpy(&bits, &v, sizeof bits);
        key.binding.insert(key.binding.end(), {i + 2 * N, bits});
      }
    }
    return key;
  }

 private:
  using host = program<T, N>;

  /// Lays out the device arena for the call's extents and binds every node's device memory in
  /// `f`; true when the arena had to grow (it moved).
  bool bind(cpu::frame<T, N>& f, plan::plan_t<N>& p, const std::array<ir::node, N>& concrete, cuda_runtime& rt) const {
    plan::assign_arena(p, concrete, sizeof(T));
    // The scratch of spatial and gather kernels after the nodes: flags, then the largest need.
    const std::size_t scratch_at = (p.arena_bytes + 255) / 256 * 256, flags = flag_bytes(p);
    p.arena_bytes = scratch_at + flags + op_scratch_bytes(p, concrete);
    // 256-byte aligned offsets: cuBLASLt and the 16-byte vector entries rely on it.
    const cuda::CUdeviceptr before = rt.arena.get();
    if (p.arena_bytes + 256 > rt.arena.size()) rt.stream.sync();  // growing frees the arena queued calls use
    rt.arena.ensure(p.arena_bytes + 256);
    const cuda::CUdeviceptr base = (rt.arena.get() + 255) / 256 * 256;
    for (std::size_t i = 0; i < N; ++i)
      if (p.offset[i] != plan::no_offset)
        f.loc[i] = strided<T>{reinterpret_cast<T*>(base + p.offset[i]), concrete[i].desc.shape,
                              contiguous_strides(concrete[i].desc.shape)};
    for (int k = 0; k < p.n_kernels; ++k)
      if ((p.kernels[k].kind == plan::kernel_kind::matmul || p.kernels[k].kind == plan::kernel_kind::spatial) &&
          p.kernels[k].group >= 0)
        f.loc[p.kernels[k].node] = f.loc[host::epilogue_output_of(p, p.kernels[k].group)];
    host::bind_views(nodes, f, concrete);
    f.workspace = reinterpret_cast<std::byte*>(base + scratch_at);  // device memory: flags, then kernel scratch
    f.workspace_bytes = p.arena_bytes - scratch_at;
    return rt.arena.get() != before;
  }

  /// Bytes of bad-id flags: 8 per gather kernel (at 8 * k), rounded to 256; 0 without gathers.
  std::size_t flag_bytes(const plan::plan_t<N>& p) const {
    return has_gather() ? (8 * static_cast<std::size_t>(p.n_kernels) + 255) / 256 * 256 : 0;
  }

  /// The most scratch one spatial, gather or attention-gradient kernel needs for this call (they run one after another).
  std::size_t op_scratch_bytes(const plan::plan_t<N>& p, const std::array<ir::node, N>& concrete) const {
    std::size_t most = 0;
    for (int k = 0; k < p.n_kernels; ++k) {
      const ir::node& n = concrete[p.kernels[k].node];
      if (p.kernels[k].kind == plan::kernel_kind::spatial)
        most = std::max(most, spatial_scratch_bytes(n.desc.win, concrete[n.inputs[0]].desc.shape,
                                                    concrete[n.inputs[n.n_inputs - 1]].desc.shape, n.desc.shape));
      else if (p.kernels[k].kind == plan::kernel_kind::gather)
        most = std::max(most, gather_scratch_bytes(n, n.desc.shape));
      else if (p.kernels[k].kind == plan::kernel_kind::attention && n.desc.variant != 0)  // L and D per query row
        most = std::max(most, attention_backward_scratch_bytes(concrete[n.inputs[0]].desc.shape));
    }
    return most;
  }

  /// After a call of a program with embeddings: waits for it and throws the host kernel's message
  /// for the first bad id a gather kernel recorded (that kernel wrote zero rows for it, or skipped it).
  void check_ids(const cpu::frame<T, N>& f, const plan::plan_t<N>& p, const std::array<ir::node, N>& concrete,
                 cuda_runtime& rt) const {
    if (!has_gather()) return;
    std::vector<std::uint64_t> words(static_cast<std::size_t>(p.n_kernels));
    cuda::copy_to_host_async(words.data(), reinterpret_cast<cuda::CUdeviceptr>(f.workspace), words.size() * 8,
                             rt.stream.get());
    rt.stream.sync();
    for (int k = 0; k < p.n_kernels; ++k) {
      if (p.kernels[k].kind != plan::kernel_kind::gather || words[k] == gather_flag_clear) continue;
      const ir::node& n = concrete[p.kernels[k].node];
      const std::uint32_t bits = static_cast<std::uint32_t>(words[k] & 0xffffffffu);
      float id;
      std::memcpy(&id, &bits, sizeof id);
      const dims& ids = concrete[n.inputs[1]].desc.shape;
      const dims weight = n.desc.variant == 0 ? concrete[n.inputs[0]].desc.shape : n.desc.shape;
      FUSEBOX_THROW(invalid_argument("fusebox: " + cpu::embedding_id_error(n.desc.variant == 0 ? "embedding" : "embedding_backward",
                                                                          static_cast<double>(id), words[k] >> 32, ids,
                                                                          weight[0], weight) +
                                     " (found on the CUDA device after the call: that id's row was zero, or skipped)"));
    }
  }

  /// Queues the call's kernels, matmuls and copies on `on`, in plan order; `tune`: products take
  /// max_autotune's algorithm choice; `timing` (never while capturing a graph): each step's device
  /// time becomes a profile span, waiting for the call's work.
  void enqueue(const cpu::frame<T, N>& f, const plan::plan_t<N>& p, const std::array<ir::node, N>& concrete,
               cuda::CUstream on, bool tune, bool timing = false, bool may_time = false) const {
    const cuda::device_info& dev = cuda::current_device();
    // profile::device_timing(): events around each step, read once the call's work is done.
    struct timed_step {
      std::string name;
      cuda::event start, stop;
    };
    std::vector<timed_step> timed;
    const cuda::CUdeviceptr flags = reinterpret_cast<cuda::CUdeviceptr>(f.workspace), scratch = flags + flag_bytes(p);
    if (has_gather()) cuda::fill_bytes_async(flags, 0xff, flag_bytes(p), on);  // every flag gather_flag_clear
    for (int k = 0; k < p.n_kernels; ++k) {
      const plan::kernel& kn = p.kernels[k];
      if (timing) {
        timed.emplace_back();
        timed.back().name = kn.kind == plan::kernel_kind::matmul ? "matmul " + std::to_string(k) + ": " +
                                                                       describe_matmul(f, concrete, k, kn)
                            : kn.kind == plan::kernel_kind::copy ? std::string("copy")
                            : op_kernels[k].summary.empty()      ? kernels[k].summary
                                                                 : op_kernels[k].summary;
        timed.back().start.record(on);
      }
      const int repeats = timing ? profile::device_timing_repeats().load(std::memory_order_relaxed) : 1;
      for (int rep = 0; rep < repeats; ++rep) switch (kn.kind) {
        case plan::kernel_kind::rows:
        case plan::kernel_kind::reduce_cols: launch(f, p, concrete, k, kn, dev, on, tune, may_time); break;
        case plan::kernel_kind::matmul: {
          const schedule::library_epilogue fused = library_epilogue_for(f, k);  // residual, bias, activation: in cuBLASLt
          run_matmul(f, concrete, kn, on, tune, fused);
          if (kn.group >= 0 && !fused.whole) launch(f, p, concrete, k, kn, dev, on, tune, may_time);
          break;
        }
        case plan::kernel_kind::copy:  // none for a graph-break segment's root that is a leaf or a view
          if (f.copy_to[kn.node].data) copy(f.loc[kn.node], f.copy_to[kn.node], on);
          break;
        case plan::kernel_kind::attention: {
          const ir::node& n = nodes[kn.node];
          if (n.desc.variant != 0) {  // a gradient kernel: reads q, k, v, o and the gradient at o
            profile::scoped_span span(kernels[k].summary, "kernel");
            launch_attention_backward(kernels[k], vector_entry[k], wide_entry[k], scalar_entry[k], n.desc.variant,
                                      f.loc[n.inputs[0]], f.loc[n.inputs[1]], f.loc[n.inputs[2]], f.loc[n.inputs[3]],
                                      f.loc[n.inputs[4]], f.loc[kn.node], scratch, on);
            break;
          }
          const strided<T>&q = f.loc[n.inputs[0]], &kk = f.loc[n.inputs[1]], &v = f.loc[n.inputs[2]], &o = f.loc[kn.node];
          auto own = [&](int times) {
            bool tc = false;
            for (int i = 0; i < times; ++i) tc = launch_attention(kernels[k], vector_entry[k], scalar_entry[k], q, kk, v, o, on);
            return tc;
          };
          if (cuda::cudnn_attention* dnn = tune ? cudnn_attention_for(n, q, kk, v, o, on, may_time, own) : nullptr) {
            profile::scoped_span span("cuDNN fused attention", "kernel");
            if (dnn->run(device_address(q), device_address(kk), device_address(v), device_address(o), on)) {
              if (timing && rep == 0) timed.back().name += "; cuDNN's fused attention";
              break;
            }
          }
          profile::scoped_span span(kernels[k].summary, "kernel");
          const bool tc = own(1);
          if (timing && rep == 0 && kernels[k].tensor_cores && !tc) timed.back().name += "; ran the generic entry (rows not aligned)";
          break;
        }
        case plan::kernel_kind::opaque:
          // A graph break's user function ran on the host before this program (pipeline/dynamic_function.hpp
          // run_breaks), which cut the node from its operand and bound its result's device copy.
          if (nodes[kn.node].n_inputs != 0)
            FUSEBOX_THROW(invalid_argument("fusebox internal: a graph break reached the CUDA runner uncut"));
          break;
        case plan::kernel_kind::spatial: {
          const ir::node& n = nodes[kn.node];
          {
            profile::scoped_span span(op_kernels[k].summary, "kernel");
            launch_spatial(op_kernels[k], op_first[k], op_second[k], n.desc.win, f.loc[n.inputs[0]],
                           f.loc[n.inputs[n.n_inputs - 1]], f.loc[kn.node], scratch, on);
          }
          if (kn.group >= 0) launch(f, p, concrete, k, kn, dev, on, tune, may_time);  // the epilogue, in place
          break;
        }
        case plan::kernel_kind::gather: {
          const ir::node& n = nodes[kn.node];
          profile::scoped_span span(op_kernels[k].summary, "kernel");
          launch_gather(op_kernels[k], op_first[k], op_second[k], n, f.loc[n.inputs[0]], f.loc[n.inputs[1]],
                        f.loc[kn.node], scratch, flags + 8 * static_cast<cuda::CUdeviceptr>(k), on);
          break;
        }
        case plan::kernel_kind::pad: {
          const ir::node& n = nodes[kn.node];
          strided<T> in[ir::max_inputs];
          for (int q = 0; q < n.n_inputs; ++q) in[q] = f.loc[n.inputs[q]];
          profile::scoped_span span(op_kernels[k].summary, "kernel");
          launch_pad(op_kernels[k], op_first[k], n, in, f.loc[kn.node], on);
          break;
        }
        case plan::kernel_kind::custom: {
          const ir::node& n = nodes[kn.node];
          strided<T> in[ir::max_inputs];
          for (int q = 0; q < n.n_inputs; ++q) in[q] = f.loc[n.inputs[q]];
          profile::scoped_span span(op_kernels[k].summary, "kernel");
          launch_custom(op_kernels[k], op_first[k], n, in, f.loc[kn.node], on);
          break;
        }
      }
      if (timing) timed.back().stop.record(on);
    }
    const double per = timing ? 1000.0 / profile::device_timing_repeats().load(std::memory_order_relaxed) : 0.0;
    for (timed_step& t : timed) profile::add_span(t.name, "device", per * cuda::elapsed_ms(t.start, t.stop));
  }

  static cuda::CUdeviceptr device_address(const strided<T>& x) { return reinterpret_cast<cuda::CUdeviceptr>(x.data); }

  /// max_autotune: cuDNN's attention for this call's q, k, v, o (backend/cuda/attention_choice.hpp),
  /// or null where fusebox's kernel is the choice or the only option (float32 storage).
  template <class RunOwn>
  cuda::cudnn_attention* cudnn_attention_for(const ir::node& n, const strided<T>& q, const strided<T>& k,
                                             const strided<T>& v, const strided<T>& o, cuda::CUstream on, bool may_time,
                                             RunOwn& own) const {
    if (storage != dtype::bf16 && storage != dtype::f16) return nullptr;
    cuda::cudnn_attention_problem p;
    p.bf16 = storage == dtype::bf16;
    p.batch = static_cast<std::int64_t>(q.shape[0]);
    p.tq = static_cast<std::int64_t>(q.shape[1]);
    p.heads = static_cast<std::int64_t>(q.shape[2]);
    p.e = static_cast<std::int64_t>(q.shape[3]);
    p.tk = static_cast<std::int64_t>(k.shape[1]);
    p.ev = static_cast<std::int64_t>(v.shape[3]);
    p.causal = n.desc.causal;
    for (int d = 0; d < 4; ++d) {
      p.q[d] = q.stride[d];
      p.k[d] = k.stride[d];
      p.v[d] = v.stride[d];
      p.o[d] = o.stride[d];
    }
    return attention_chooser::instance().choose(p, device_address(q), device_address(k), device_address(v),
                                                device_address(o), may_time, on, [&](int times) { own(times); });
  }

  /// "[B] MxK · KxN" of matmul kernel kn, for device-timing spans.
  std::string describe_matmul(const cpu::frame<T, N>& f, const std::array<ir::node, N>& concrete, int k,
                              const plan::kernel& kn) const {
    const auto s = host::mm_sizes(concrete, kn.node);
    return "[" + std::to_string(s[0]) + "] " + std::to_string(s[1]) + "x" + std::to_string(s[3]) + " * " +
           std::to_string(s[3]) + "x" + std::to_string(s[2]) +
           (kn.group < 0 ? "" : library_epilogue_for(f, k).whole ? " + cuBLASLt epilogue" : " + epilogue kernel");
  }


  /// Packs kernel k's parameter block (cuda_args_layout) for this call.
  /// Each local's strides in kernel k's index space (abi_max_rank each; 0 for scalars).
  std::vector<std::ptrdiff_t> kernel_strides(const cpu::frame<T, N>& f, const plan::plan_t<N>& p, int k,
                                             const plan::kernel& kn, const dims& space) const {
    const rendered_cuda_kernel& rk = kernels[k];
    std::vector<std::ptrdiff_t> strides(rk.locals.size() * abi_max_rank, 0);
    for (std::size_t l = 0; l < rk.locals.size(); ++l) {
      const int g = rk.locals[l];
      const ir::node& n = nodes[g];
      if (n.desc.kind == node_kind::scalar) continue;
      std::ptrdiff_t* st = &strides[l * abi_max_rank];
      // Reduced in this kernel: a column kernel's own node, or a row group's reductions. Another
      // kernel's reduction read here is an ordinary operand (a column sum of a column sum read
      // the first sum with its reduced axis' stride zeroed: only its first row).
      const bool reduced_here =
          n.desc.kind == node_kind::reduce &&
          (kn.kind == plan::kernel_kind::reduce_cols ? g == kn.node : (p.group[g] == kn.group && kn.group >= 0));
      if (reduced_here)
        cpu::reduced_space_strides(f.loc[g], space, static_cast<std::size_t>(n.desc.axis), n.desc.keepdim, st);
      else
        cpu::space_strides(f.loc[g], space, st);
    }
    return strides;
  }

  /// Packs kernel k's parameter block (cuda_args_layout) for this call: `space` and `strides` as
  /// the kernel walks them (merged where it was rendered for that).
  std::vector<unsigned char> pack(const cpu::frame<T, N>& f, int k, const dims& space,
                                  const std::vector<std::ptrdiff_t>& strides) const {
    const rendered_cuda_kernel& rk = kernels[k];
    const cuda_args_layout layout{rk.locals.size()};
    std::vector<unsigned char> bytes(std::max<std::size_t>(layout.bytes(), 8), 0);
    auto put = [&](std::size_t at, const auto& v) { std::memcpy(bytes.data() + at, &v, sizeof v); };
    for (std::size_t d = 0; d < abi_max_rank; ++d)
      put(layout.space_at() + 8 * d, static_cast<unsigned long long>(d < space.rank ? space.extent[d] : 1));
    put(layout.rank_at(), static_cast<unsigned long long>(space.rank));
    for (std::size_t l = 0; l < rk.locals.size(); ++l) {
      const int g = rk.locals[l];
      const ir::node& n = nodes[g];
      if (n.desc.kind == node_kind::scalar) {
        put(layout.scalar_at() + 4 * l, static_cast<float>(static_cast<const scalar_leaf<T>*>(f.payload[n.payload_slot])->value));
        continue;
      }
      put(layout.ptr_at() + 8 * l, reinterpret_cast<unsigned long long>(f.loc[g].data));
      for (std::size_t d = 0; d < abi_max_rank; ++d)
        put(layout.stride_at() + 8 * (l * abi_max_rank + d), static_cast<long long>(strides[l * abi_max_rank + d]));
    }
    return bytes;
  }

  /// Whether the vector entry may run: the row length and every unit-stride operand's strides
  /// between rows of the kernel's space are whole vectors, and its address is 16-byte aligned.
  bool vector_ok(const cpu::frame<T, N>& f, int k, const dims& space, const std::vector<std::ptrdiff_t>& strides,
                 std::size_t vec) const {
    if (space.back(0) % vec != 0) return false;
    const rendered_cuda_kernel& rk = kernels[k];
    for (int l : rk.unit_operands) {
      const int g = rk.locals[l];
      if (reinterpret_cast<std::uintptr_t>(f.loc[g].data) % 16 != 0) return false;
      for (std::size_t d = 0; d + 1 < space.rank; ++d)
        if (strides[static_cast<std::size_t>(l) * abi_max_rank + d] % static_cast<std::ptrdiff_t>(vec) != 0) return false;
    }
    return true;
  }

  /// Grid and block of configuration c for kernel kn over `space` (v elements a thread).
  static std::pair<cuda::dim3, cuda::dim3> geometry(const plan::kernel& kn, const rendered_cuda_kernel& rk,
                                                    const std::array<ir::node, N>& nodes_, const dims& space,
                                                    std::size_t v, const kernel_launch& c, const cuda::device_info& dev) {
    const std::size_t width = space.back(0), rows = space.size() / std::max<std::size_t>(width, 1);
    const std::size_t max_blocks = static_cast<std::size_t>(dev.sm_count) * c.blocks_per_sm;
    cuda::dim3 grid, block;
    block.x = c.threads;
    if (kn.kind == plan::kernel_kind::reduce_cols) {  // outputs_per_block outputs a block, grid-stride
      const std::size_t axis = static_cast<std::size_t>(nodes_[kn.node].desc.axis);
      const std::size_t outputs = space.size() / std::max<std::size_t>(space.extent[axis], 1);
      const std::size_t per = std::max<std::size_t>(rk.outputs_per_block, 1);
      grid.x = static_cast<unsigned>(std::max<std::size_t>(1, std::min((outputs + per - 1) / per, max_blocks)));
    } else if (rk.block_per_row) {
      const std::size_t per = std::max<std::size_t>(rk.rows_per_block, 1);
      grid.x = static_cast<unsigned>(std::max<std::size_t>(1, std::min((rows + per - 1) / per, max_blocks)));
    } else {
      const std::size_t total = rows * (width / v);
      grid.x = static_cast<unsigned>(std::max<std::size_t>(1, std::min((total + c.threads - 1) / c.threads, max_blocks)));
    }
    return {grid, block};
  }

  /// The launch configurations of kernel k for this call: the default first (the widest entry
  /// the alignment allows, 256 threads, or for a block per row the smallest power of two giving
  /// each thread about four chunks; 32 blocks per SM), then what max_autotune also tries.
  std::vector<kernel_launch> launch_candidates(const plan::kernel& kn, const rendered_cuda_kernel& rk, bool vector,
                                               bool wide, std::size_t vec, const dims& space) const {
    const int best_entry = wide ? 2 : vector ? 1 : 0;
    kernel_launch d{best_entry, 256, 32};
    std::vector<unsigned> threads{128, 256, 512, 1024};
    if (rk.block_per_row) {
      const std::size_t v = best_entry == 2 ? 2 * vec : best_entry == 1 ? vec : 1;
      const std::size_t chunks = (space.back(0) + v - 1) / v;
      unsigned t = 32;
      while (t < 1024 && t * 4 < chunks) t *= 2;
      d.threads = rk.block_threads ? rk.block_threads : t;
      if (rk.block_threads) threads = {rk.block_threads};  // a row-cached kernel is written for its block
      else threads = {32, 64, 128, 256, 512, 1024};
    } else if (rk.block_threads) {  // a column reduction is written for its block
      d.threads = rk.block_threads;
      threads = {rk.block_threads};
    }
    std::vector<kernel_launch> out{d};
    const bool elementwise = kn.kind == plan::kernel_kind::rows && !rk.block_per_row;
    for (int e = best_entry; e >= (elementwise ? std::max(best_entry - 1, 0) : best_entry); --e)
      for (unsigned t : threads)
        for (unsigned per_sm : {4u, 8u, 16u, 32u}) {
          const kernel_launch c{e, t, per_sm};
          if (std::find(out.begin(), out.end(), c) == out.end()) out.push_back(c);
        }
    return out;
  }

  /// Whether kernel k reads memory it writes (a matmul epilogue applied in place): timing it
  /// repeatedly would change its input.
  bool in_place(const cpu::frame<T, N>& f, const plan::plan_t<N>& p, int k, const plan::kernel& kn) const {
    const rendered_cuda_kernel& rk = kernels[k];
    for (int w : rk.locals) {
      if (!(p.kernel_of[w] == k && p.materialised[w]) && !(kn.kind == plan::kernel_kind::matmul && w == kn.node))
        continue;
      for (int r : rk.locals)
        if (r != w && f.loc[r].data && f.loc[r].data == f.loc[w].data) return true;
    }
    return kn.kind == plan::kernel_kind::matmul;  // the product is read and overwritten where it lies
  }

  void launch(const cpu::frame<T, N>& f, const plan::plan_t<N>& p, const std::array<ir::node, N>& concrete, int k,
              const plan::kernel& kn, const cuda::device_info& dev, cuda::CUstream on, bool tune = false,
              bool may_time = false) const {
    dims space = plan::kernel_space(p, concrete, kn);
    if (space.size() == 0) return;
    if (space.rank == 0) space = dims{1, {1}};  // one element, as jit/codegen_cuda.hpp renders it
    const rendered_cuda_kernel& rk = kernels[k];
    std::vector<std::ptrdiff_t> strides = kernel_strides(f, p, k, kn, space);
    // An elementwise kernel rendered for it walks the space with the dimensions every operand
    // takes as one merged (schedule/merge_dims.hpp): [128, 64, 4, 4] is one row, not 32768 of 4.
    if (rk.merged_space && sched.kernels[k].merge_from >= 0)
      schedule::merge_dims(static_cast<std::size_t>(sched.kernels[k].merge_from), space, static_cast<int>(rk.locals.size()),
                           [&](int l) { return &strides[static_cast<std::size_t>(l) * abi_max_rank]; });
    std::vector<unsigned char> params = pack(f, k, space, strides);
    void* args[] = {params.data()};
    const std::size_t vec = 16 / size_of(storage);
    const bool vector = kn.kind != plan::kernel_kind::reduce_cols && vector_ok(f, k, space, strides, vec);
    // Elementwise kernels take 32 bytes a thread where rows allow (two loads in flight per operand).
    const bool wide = vector && !rk.block_per_row && vector_ok(f, k, space, strides, 2 * vec);
    const std::vector<kernel_launch> candidates = launch_candidates(kn, rk, vector, wide, vec, space);
    auto queue = [&](const kernel_launch& c, int times) {
      const std::size_t v = c.entry == 2 ? 2 * vec : c.entry == 1 ? vec : 1;
      const auto [grid, block] = geometry(kn, rk, nodes, space, v, c, dev);
      const cuda::CUfunction fn = c.entry == 2 ? wide_entry[k] : c.entry == 1 ? vector_entry[k] : scalar_entry[k];
      for (int i = 0; i < times; ++i) cuda::launch(fn, grid, block, 0, on, args, rk.summary);
    };
    kernel_launch use = candidates.front();
    if (tune && !in_place(f, p, k, kn)) {
      std::string problem = kernel_digest(k) + " over " + to_string(space) + " entries " +
                            (wide ? "w" : "") + (vector ? "v" : "") + "1";
      use = kernel_tuner::instance().choose(problem, candidates, may_time, on, queue);
    }
    profile::scoped_span span(rk.summary, "kernel");
    queue(use, 1);
  }

  /// A kernel's identity for the tuner: its source's digest (the unit's entry name).
  std::string kernel_digest(int k) const { return "fbk_" + sha256_hex(kernels[k].source).substr(0, 20); }

  static cuda::lt_type lt_type_of(dtype t) {
    return t == dtype::bf16 ? cuda::lt_type::bf16 : t == dtype::f16 ? cuda::lt_type::f16 : cuda::lt_type::f32;
  }

  /// What cuBLASLt takes of matmul kernel k's epilogue in this call: the schedule's choice
  /// (schedule/library_epilogue.hpp), or nothing where the call's residual is not contiguous.
  schedule::library_epilogue library_epilogue_for(const cpu::frame<T, N>& f, int k) const {
    const schedule::library_epilogue& l = sched.kernels[k].library;
    return l.usable(f.loc.data()) ? l : schedule::library_epilogue{};
  }
  static cuda::lt_epilogue lt_activation(schedule::activation a) {
    return a == schedule::activation::relu        ? cuda::lt_epilogue::relu
           : a == schedule::activation::gelu_tanh ? cuda::lt_epilogue::gelu_tanh
                                                  : cuda::lt_epilogue::none;
  }

  void run_matmul(const cpu::frame<T, N>& f, const std::array<ir::node, N>& concrete, const plan::kernel& kn,
                  cuda::CUstream on, bool tune, const schedule::library_epilogue& fused) const {
    const int bias = fused.bias;
    const int m = kn.node;
    const strided<T>& A = f.loc[nodes[m].inputs[0]];
    const strided<T>& B = f.loc[nodes[m].inputs[1]];
    const strided<T>& C = f.loc[m];
    const auto s = host::mm_sizes(concrete, m);
    // Each operand row-major, or the transposed view of a row-major matrix (cuBLASLt transposes
    // as it reads); anything else is an error naming the strides.
    auto transposed = [](const strided<T>& x, const char* which) {
      const std::size_t r = x.shape.rank;
      const auto rows = static_cast<std::ptrdiff_t>(x.shape.back(1)), cols = static_cast<std::ptrdiff_t>(x.shape.back(0));
      if (x.stride[r - 1] == 1 && (x.stride[r - 2] == cols || rows == 1)) return false;
      if (x.stride[r - 2] == 1 && x.stride[r - 1] == rows) return true;
      std::string st;
      for (std::size_t d = 0; d < r; ++d) st += (d ? ", " : "") + std::to_string(x.stride[d]);
      FUSEBOX_THROW(invalid_argument(std::string("fusebox: matmul on the CUDA backend needs each operand row-major or a "
                                                 "transposed row-major matrix; the ") +
                                     which + " is " + to_string(x.shape) + " with strides [" + st + "]"));
    };
    cuda::lt_problem prob;
    prob.batch = s[0];
    prob.m = s[1];
    prob.n = s[2];
    prob.k = s[3];
    prob.type = lt_type_of(storage);
    prob.trans_a = transposed(A, "left operand");
    prob.trans_b = transposed(B, "right operand");
    prob.stride_a = A.shape.rank == 3 && A.shape.extent[0] != 1 ? A.stride[0] : 0;
    prob.stride_b = B.shape.rank == 3 && B.shape.extent[0] != 1 ? B.stride[0] : 0;
    if (prob.batch == 1) prob.stride_a = prob.stride_b = cuda::lt_problem::packed;
    prob.bias = bias >= 0;
    prob.epilogue = lt_activation(fused.act);
    prob.residual = fused.residual >= 0;
    const void* residual_data = prob.residual ? static_cast<const void*>(f.loc[fused.residual].data) : nullptr;
    const void* bias_data = prob.bias ? static_cast<const void*>(f.loc[bias].data) : nullptr;
    std::uint32_t align = 256;
    for (const void* ptr : {static_cast<const void*>(A.data), static_cast<const void*>(B.data), static_cast<const void*>(C.data),
                            bias_data, residual_data})
      while (ptr && align > sizeof(T) && reinterpret_cast<std::uintptr_t>(ptr) % align != 0) align /= 2;
    prob.alignment = align;
    const char* act = fused.act == schedule::activation::relu        ? " + relu"
                      : fused.act == schedule::activation::gelu_tanh ? " + gelu_tanh"
                                                                     : "";
    profile::scoped_span span(std::string("cuBLASLt matmul") + (prob.residual ? " + residual" : "") +
                                  (prob.bias ? " + bias" : "") + act,
                              "kernel");
    const auto a = reinterpret_cast<cuda::CUdeviceptr>(A.data), b = reinterpret_cast<cuda::CUdeviceptr>(B.data),
               c = reinterpret_cast<cuda::CUdeviceptr>(C.data), bv = reinterpret_cast<cuda::CUdeviceptr>(bias_data);
    const auto rv = reinterpret_cast<cuda::CUdeviceptr>(residual_data);
    if (tune) lt_tuner::instance().matmul(prob, a, b, c, bv, on, rv);
    else lt_choices::instance().matmul(prob, a, b, c, bv, on, rv);
  }

  /// An output that is a leaf or a view, copied into its result (backend/cuda/strided_copy.hpp).
  static void copy(const strided<T>& from, const strided<T>& to, cuda::CUstream on) {
    if (!(from.shape == to.shape))
      FUSEBOX_THROW(invalid_argument("fusebox internal: a copy on the CUDA backend from " + to_string(from.shape) + " to " +
                                     to_string(to.shape)));
    if (from.contiguous() && to.contiguous())
      cuda::copy_on_device_async(reinterpret_cast<cuda::CUdeviceptr>(to.data),
                                 reinterpret_cast<cuda::CUdeviceptr>(from.data), from.shape.size() * sizeof(T), on);
    else
      cuda::strided_copy_async(reinterpret_cast<cuda::CUdeviceptr>(to.data), to.stride,
                               reinterpret_cast<cuda::CUdeviceptr>(from.data), from.stride, from.shape, sizeof(T), on);
  }
};

#ifdef FUSEBOX_RUNTIME_INSTANCE  // compiled once where a program asks for it (core/linkage.hpp)
// float storage only: bfloat16, float16 and double programs are rarer, compiled where used.
FUSEBOX_RUNTIME_INSTANCE struct cuda_program<float, 16>;
FUSEBOX_RUNTIME_INSTANCE struct cuda_program<float, 32>;
FUSEBOX_RUNTIME_INSTANCE struct cuda_program<float, 64>;
FUSEBOX_RUNTIME_INSTANCE struct cuda_program<float, 128>;
#endif

}  // namespace fusebox::jit
