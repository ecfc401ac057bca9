// pipeline/dynamic_function.hpp: a compiled function's run-time path for one expression type with `dyn` extents.
// The pipeline, in order (DESIGN.md's flow, at run time):
//   capture      the model was called on symbolic inputs (compile.hpp); the expression type is the graph
//   guard        does an existing specialisation accept this call? (runtime/guard.hpp)
//   specialise   put the guard's extents (known or symbolic) into the IR (ir/specialize.hpp)
//   plan         the one planner, plan::make_plan, the same function the build-time path runs
//   render       each generated kernel as C++ over xsimd (backend/cpu/codegen.hpp)
//   compile      memory cache, disk cache, host compiler (runtime/kernel_store.hpp)
//   run          jit::program on the thread pool (backend/cpu/generated_program.hpp)
// A recompile is counted and logged with its reason; past options.recompile_limit new extents run
// eagerly (one warning); a compile failure runs eagerly with a warning that keeps the source and the
// compiler's log (under fullgraph it throws).
// Depends on: runtime/{guard,kernel_store}.hpp, ir/specialize.hpp, backend/cpu/generated_program.hpp, backend/cpu/executor.hpp, options.hpp.
#pragma once

#include <algorithm>
#include <limits>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "fusebox/backend/cpu/executor.hpp"
#include "fusebox/backend/cpu/generated_program.hpp"
#include "fusebox/backend/cuda/generated_program.hpp"
#include "fusebox/core/errors.hpp"
#include "fusebox/ir/merge.hpp"
#include "fusebox/ir/specialize.hpp"
#include "fusebox/options.hpp"
#include "fusebox/pipeline/targets.hpp"
#include "fusebox/plan/report.hpp"
#include "fusebox/runtime/guard.hpp"
#include "fusebox/runtime/kernel_store.hpp"

namespace fusebox::jit {

template <class Prog, class Target>
class dynamic_function {
  using T = typename Prog::value_type;

 public:
  using prog_type = Prog;

 private:
  static constexpr std::size_t N = Prog::N;
  static constexpr bool on_cuda = std::is_same_v<Target, cuda_target>;

 public:
  /// Node arrays of the run-time path are padded to a few sizes (16, 32, 64, ...), so the planner,
  /// the code generator and the host executor are instantiated once per size class rather than
  /// once per model: compile time of the model's translation unit is a performance figure too.
  static constexpr std::size_t NB = [] {
    std::size_t b = 16;
    while (b < N) b *= 2;
    return b;
  }();
  using program_t = std::conditional_t<on_cuda, cuda_program<T, NB>, program<T, NB>>;

  /// The graph of Prog padded with unused scalar leaves.
  static std::array<ir::node, NB> padded(const std::array<ir::node, N>& nodes) {
    std::array<ir::node, NB> out{};
    for (std::size_t i = 0; i < N; ++i) out[i] = nodes[i];
    for (std::size_t i = N; i < NB; ++i) {
      out[i].desc.kind = node_kind::scalar;
      out[i].desc.name = "unused";
    }
    return out;
  }

  /// opaque() nodes in the graph (graph breaks: ir/specialize.hpp) and the segment that computes the
  /// model's outputs.
  static constexpr std::size_t n_breaks = count_breaks(Prog::graph::nodes);
  static constexpr int last_segment = std::numeric_limits<int>::max();

  /// The padded graph with each opaque node naming its break entry among `n_entries` extents.
  static std::array<ir::node, NB> numbered(std::size_t n_entries) {
    std::array<ir::node, NB> g = padded(Prog::graph::nodes);
    if constexpr (n_breaks > 0) number_breaks(g, n_entries - n_breaks);
    return g;
  }

  /// The operands of the opaque() nodes of `level` (each once; the rest of the array repeats the
  /// first): the roots of that segment.
  static std::array<int, n_breaks> break_operands(const std::array<ir::node, NB>& g, const std::array<int, NB>& level,
                                                  int at) {
    std::array<int, n_breaks> roots{};
    std::size_t n = 0;
    for (std::size_t i = 0; i < NB; ++i)
      if (g[i].desc.kind == node_kind::opaque && level[i] == at && g[i].n_inputs > 0 &&
          std::find(roots.begin(), roots.begin() + n, g[i].inputs[0]) == roots.begin() + n)
        roots[n++] = g[i].inputs[0];
    for (std::size_t k = n; k < n_breaks; ++k) roots[k] = roots[0];
    return roots;
  }

  /// Runs program p on a frame of Prog (inputs, payloads and outputs bound) for these extents.
  static void execute(const program_t& p, typename Prog::frame_t& f, const std::vector<dims>& extents,
                      cpu::runtime& rt) {
    execute(p, f, specialise(p.graph, extents), rt);
  }

  /// The host step of an opaque() kernel. Its function ran before the segment that reads it
  /// (facts(): run_breaks), so the program's node is cut from its operand and only its result is
  /// bound; a program built otherwise runs the function here.
  static void bind_break(const program_t& p, typename Prog::frame_t& f, int id, cpu::frame<T, NB>& gf) {
    if (p.graph[id].n_inputs != 0) {
      for (std::size_t i = 0; i < N; ++i) f.loc[i] = gf.loc[i];
      Prog::run_opaque_at(id, f);
      for (std::size_t i = 0; i < N; ++i) gf.loc[i] = f.loc[i];
    }
    gf.loc[id] = f.loc[id];
    gf.keep[id] = f.keep[id];
  }

  /// Runs program p with the call's node shapes already made (reduce_overhead's fast path keeps
  /// them per call signature: no specialise per call).
  static void execute(const program_t& p, typename Prog::frame_t& f, const std::array<ir::node, NB>& concrete,
                      cpu::runtime& rt) {
    cpu::frame<T, NB> g;
    for (std::size_t i = 0; i < N; ++i) {
      g.loc[i] = f.loc[i];
      g.copy_to[i] = f.copy_to[i];
      g.payload[i] = f.payload[i];
    }
    g.pool = rt.pool;
    p.run(g, concrete, rt, [&f, &p](int id, cpu::frame<T, NB>& gf) { bind_break(p, f, id, gf); });
  }

  /// What a call runs: the program select() chose and the call's node shapes, made once per call
  /// (the outputs are allocated at them and the runner reads them). mode::reduce_overhead keeps it
  /// per call signature (every fact a guard reads, compared exactly: extents, inner strides,
  /// alignment, the payloads' equality pattern), so a repeat skips the guards, the hint checks, the
  /// lock's search and the specialisation.
  struct fast_entry {
    call_facts facts;
    std::shared_ptr<const program_t> prog;
    std::array<ir::node, NB> concrete;  ///< specialise(prog->graph, extents), made in place (no copy)
    fast_entry(call_facts c, std::shared_ptr<const program_t> p)
        : facts(std::move(c)), prog(std::move(p)), concrete(specialise(prog->graph, facts.extents)) {}
  };
  static constexpr std::size_t fast_entries = fast_path_signatures;

  /// The entry of exactly this signature, or null (then select() and remember()).
  std::shared_ptr<const fast_entry> fast(const call_facts& c) const {
    std::lock_guard lock(mutex_);
    for (const auto& e : fast_)
      if (e && same_signature(e->facts, c)) return e;
    return nullptr;
  }
  /// Keeps the entry of a call of `prog` for its signature (the least recently added of
  /// fast_entries goes).
  std::shared_ptr<const fast_entry> remember(call_facts c, std::shared_ptr<const program_t> prog) {
    auto kept = std::make_shared<const fast_entry>(std::move(c), std::move(prog));
    std::lock_guard lock(mutex_);
    for (std::size_t i = fast_entries - 1; i > 0; --i) fast_[i] = std::move(fast_[i - 1]);
    fast_[0] = kept;
    return kept;
  }
  static bool same_signature(const call_facts& a, const call_facts& b) {
    return a.extents == b.extents && a.unit_inner == b.unit_inner && a.aligned == b.aligned &&
           a.dyn_mask == b.dyn_mask && a.payload_class == b.payload_class;
  }

  /// The facts the guards check, read from a frame whose inputs are bound. With graph breaks
  /// (opaque() nodes), their user functions run here, each after the segment that computes its
  /// operand, and their results are bound in f: the extents they return are facts of the call
  /// (break entries after the arguments, ir/specialize.hpp) that the rest is specialised for.
  static call_facts facts(typename Prog::frame_t& f, std::size_t n_args) {
    call_facts c;
    c.extents.assign(n_args, dims{});
    c.unit_inner.assign(n_args, true);
    c.aligned.assign(n_args, true);
    c.dyn_mask.assign(n_args, 0);
    for (std::size_t i = 0; i < N; ++i) {
      const ir::node& n = Prog::nodes[i];
      if (n.desc.kind != node_kind::input) continue;
      const std::size_t a = n.desc.input_index;
      const strided<T>& s = f.loc[i];
      c.extents[a] = s.shape;
      c.unit_inner[a] = s.shape.rank == 0 || s.stride[s.shape.rank - 1] == 1 || s.shape.back(0) == 1;
      c.aligned[a] = reinterpret_cast<std::uintptr_t>(s.data) % 64 == 0;
      for (std::size_t d = 0; d < n.desc.shape.rank; ++d)
        if (n.desc.shape.extent[d] == dyn) c.dyn_mask[a] |= 1u << d;
    }
    c.payload_class = payload_classes<T>(Prog::nodes, f.payload, f.loc.data());
    if constexpr (n_breaks > 0) run_breaks(f, c, n_args);
    return c;
  }

  /// Runs the graph breaks of a call, level by level (ir/specialize.hpp): the segment that
  /// computes the operands of level L (specialised for the arguments and the results of lower
  /// levels, guarded and cached like a call's program), then those opaque() functions, whose
  /// results are checked against the declared type, bound in f and written to the break entries.
  /// On the CUDA target the segments run on the device and each user function on the host, as
  /// in torch.compile's eager fallback: the call's stream is synchronised, the operand copied to
  /// host memory, the function's result copied back to device memory of its own (run_break_on_host).
  static void run_breaks(typename Prog::frame_t& f, call_facts& c, std::size_t n_args) {
    for (std::size_t i = 0; i < N; ++i) {
      const ir::node& n = Prog::nodes[i];
      if (n.desc.kind != node_kind::opaque) continue;
      std::uint32_t mask = 0;
      for (std::size_t d = 0; d < n.desc.shape.rank; ++d)
        if (n.desc.shape.extent[d] == dyn) mask |= 1u << d;
      c.extents.push_back(dims{});  // unknown until its segment has run
      c.unit_inner.push_back(true);
      c.aligned.push_back(true);
      c.dyn_mask.push_back(mask);
    }
    const auto g = merge_duplicates(numbered(c.extents.size()), c.payload_class, Prog::graph::outputs);
    const auto level = break_levels(g);
    int top = -1;
    for (std::size_t i = 0; i < NB; ++i)
      if (g[i].desc.kind == node_kind::opaque) top = std::max(top, level[i]);
    for (int at = 0; at <= top; ++at) {
      const auto prog = segment_program(c, at);
      const auto concrete = specialise(prog->graph, c.extents);
      const auto roots = break_operands(g, level, at);
      cpu::frame<T, NB> seg;  // no copy_to: the roots stay where they are computed
      for (std::size_t i = 0; i < N; ++i) {
        seg.loc[i] = f.loc[i];
        seg.payload[i] = f.payload[i];
      }
      // Computed roots get memory of their own, alive for the call (the segment's arena is
      // reused, and a user function may return a view of its operand); on the device, buffers
      // kept per model type and reused by the next call (it synchronises before writing them).
      std::array<storage_ptr, NB> owned{};
      for (int r : roots) {
        const node_kind k = prog->graph[r].desc.kind;
        if (owned[r] || ir::is_leaf_kind(k) || k == node_kind::view || k == node_kind::opaque) continue;
        const dims& shape = concrete[r].desc.shape;
        const std::size_t bytes = std::max<std::size_t>(1, shape.size()) * sizeof(T);
        T* at_memory = nullptr;
        if constexpr (on_cuda) {
          cuda::device_buffer& b = break_buffers()[static_cast<std::size_t>(r)];
          b.ensure(bytes);
          at_memory = reinterpret_cast<T*>(b.get());
          owned[r] = storage_ptr(std::shared_ptr<void>{}, reinterpret_cast<std::byte*>(at_memory));
        } else {
          owned[r] = allocate_storage(bytes);
          at_memory = reinterpret_cast<T*>(owned[r].get());
        }
        seg.loc[r] = strided<T>{at_memory, shape, contiguous_strides(shape)};
      }
      auto& rt = segment_runtime();
      if constexpr (on_cuda) {
        if (prog->storage != dtype::f32)
          FUSEBOX_THROW(invalid_argument("fusebox: a graph break (opaque user function or item()) on the CUDA backend "
                                         "needs float32 storage; this model stores " + std::string(fusebox::name(prog->storage))));
        prog->run(seg, concrete, rt);
        rt.stream.sync();  // the operands are read on the host next
      } else {
        seg.pool = rt.pool;
        prog->run(seg, concrete, rt, [&f, &prog](int id, cpu::frame<T, NB>& gf) { bind_break(*prog, f, id, gf); });
      }
      for (std::size_t o = 0; o < N; ++o) {
        if (g[o].desc.kind != node_kind::opaque || level[o] != at) continue;
        // The function reads its operand where the model's own graph has it (merging may have
        // pointed the opaque node at an earlier copy of it).
        const int r = g[o].inputs[0], own = Prog::nodes[o].inputs[0];
        f.loc[own] = seg.loc[r];
        if (owned[r]) f.keep[own] = owned[r];
        if constexpr (on_cuda) run_break_on_host(static_cast<int>(o), own, f);
        else Prog::run_opaque_at(static_cast<int>(o), f);
        check_break_result(static_cast<int>(o), f);
        c.extents[g[o].desc.input_index] = f.loc[o].shape;
      }
    }
    // An opaque node merged into an earlier one (one capture, e.g. softmax's copies of its
    // operand) is that one's value.
    for (std::size_t o = 0; o < N; ++o) {
      const int first = c.payload_class[o];
      if (Prog::nodes[o].desc.kind != node_kind::opaque || first < 0 || first == static_cast<int>(o)) continue;
      if (c.extents[n_args + break_rank(o)].rank != 0) continue;
      c.extents[n_args + break_rank(o)] = c.extents[n_args + break_rank(static_cast<std::size_t>(first))];
      f.loc[o] = f.loc[first];
      f.keep[o] = f.keep[first];
    }
  }

  /// The device memory of a model's graph-break values (segment roots, user functions' results),
  /// per node, kept per thread and model type and reused by the next call.
  static std::array<cuda::device_buffer, NB>& break_buffers() {
    thread_local std::array<cuda::device_buffer, NB> buffers;
    return buffers;
  }

  /// User function o of a call on the CUDA backend (the stream is synchronised): its operand, at
  /// f.loc[own] in device memory, copied to host memory (the span its strides cover, so the
  /// function sees the same view), the function run as on the host backend, and its result
  /// copied, packed, into device memory; f.loc[o] is then that.
  static void run_break_on_host(int o, int own, typename Prog::frame_t& f) {
    const strided<T> dev = f.loc[own];
    std::size_t span = dev.shape.size() == 0 ? 0 : 1;
    for (std::size_t d = 0; d < dev.shape.rank && span; ++d) {
      if (dev.stride[d] < 0)
        FUSEBOX_THROW(invalid_argument("fusebox internal: a graph break's operand on the CUDA backend has a negative stride"));
      span += (dev.shape.extent[d] - 1) * static_cast<std::size_t>(dev.stride[d]);
    }
    typename Prog::frame_t host = f;
    host.keep[own] = allocate_storage(std::max<std::size_t>(1, span) * sizeof(T));
    cuda::copy_to_host(host.keep[own].get(), reinterpret_cast<cuda::CUdeviceptr>(dev.data), span * sizeof(T));
    host.loc[own] = strided<T>{reinterpret_cast<T*>(host.keep[own].get()), dev.shape, dev.stride};
    Prog::run_opaque_at(o, host);
    const strided<T>& out = host.loc[o];
    const dims shape = out.shape;
    strided<T> packed{nullptr, shape, contiguous_strides(shape)};
    storage_ptr packed_memory;
    if (out.contiguous()) {
      packed.data = out.data;
    } else {
      packed_memory = allocate_storage(std::max<std::size_t>(1, shape.size()) * sizeof(T));
      packed.data = reinterpret_cast<T*>(packed_memory.get());
      cpu::strided_copy(out, packed);
    }
    cuda::device_buffer& b = break_buffers()[static_cast<std::size_t>(o)];
    b.ensure(std::max<std::size_t>(1, shape.size()) * sizeof(T));
    cuda::copy_to_device(b.get(), packed.data, shape.size() * sizeof(T));
    f.loc[o] = strided<T>{reinterpret_cast<T*>(b.get()), shape, contiguous_strides(shape)};
    f.keep[o] = nullptr;
  }

  /// Among the opaque() nodes, the rank of node o.
  static std::size_t break_rank(std::size_t o) {
    std::size_t j = 0;
    for (std::size_t i = 0; i < o; ++i) j += Prog::nodes[i].desc.kind == node_kind::opaque;
    return j;
  }

  /// The runtime segments run on (not the eager one: a user function's own eager ops use that).
  /// On the CUDA target, a runtime on the calls' stream (cuda::work_stream) with its own arena.
  static auto& segment_runtime() {
    if constexpr (on_cuda) {
      thread_local cuda_runtime rt;
      return rt;
    } else {
      thread_local cpu::runtime rt;
      rt.pool = &cpu::shared_pool(std::max(1u, std::thread::hardware_concurrency()));
      return rt;
    }
  }

  /// The program of segment `at` for this call: one whose guard accepts it, or a new one (policy
  /// automatic: a dimension that changed becomes symbolic). Kept per model type, a few per level.
  static std::shared_ptr<const program_t> segment_program(const call_facts& c, int at) {
    struct entry {
      int at;
      guard g;
      std::shared_ptr<const program_t> prog;
    };
    static std::mutex mutex;
    static std::vector<entry> entries;
    std::lock_guard lock(mutex);
    std::vector<guard> same_level;
    for (auto it = entries.rbegin(); it != entries.rend(); ++it) {
      if (it->at != at) continue;
      if (it->g.matches(c)) return it->prog;
      same_level.insert(same_level.begin(), it->g);
    }
    guard g = next_guard(c, fusebox::dynamic::automatic, same_level, {});
    log(log_category::guards, "graph break segment " + std::to_string(at) + ": new specialisation " + g.text());
    auto prog = build(g, false, at);
    if (same_level.size() >= 8)
      entries.erase(std::find_if(entries.begin(), entries.end(), [at](const entry& e) { return e.at == at; }));
    entries.push_back({at, std::move(g), prog});
    return prog;
  }

  /// Throws graph_break, naming the opaque() call, when the tensor its function returned does not
  /// have the declared result type's rank and static extents.
  static void check_break_result(int o, const typename Prog::frame_t& f) {
    const dims& got = f.loc[o].shape;
    const dims& declared = Prog::nodes[o].desc.shape;
    bool ok = got.rank == declared.rank;
    for (std::size_t d = 0; ok && d < declared.rank; ++d)
      ok = !is_known_extent(declared.extent[d]) || got.extent[d] == declared.extent[d];
    if (ok) return;
    std::source_location site{};
    [&]<std::size_t... I>(std::index_sequence<I...>) {
      ((static_cast<int>(I) == o ? void(site = break_site<I>(f)) : void()), ...);
    }(std::make_index_sequence<N>{});
    FUSEBOX_THROW(graph_break("opaque(): the function returned a tensor of extents " + to_string(got) +
                                  ", but the result type it declares has extents " + to_string(declared) +
                                  " (static extents must match; declare the ones that vary dyn)",
                              site));
  }
  template <std::size_t I>
  static std::source_location break_site(const typename Prog::frame_t& f) {
    if constexpr (Prog::nodes[I].desc.kind == node_kind::opaque) {
      using E = typename Prog::graph::template type_of<I>;
      return static_cast<const E*>(static_cast<const opaque_base*>(f.payload[Prog::nodes[I].payload_slot]))->loc;
    } else {
      return {};
    }
  }

  /// The program for this call, or null when the call must run eagerly (limit reached, or its
  /// specialisation failed to compile).
  std::shared_ptr<const program_t> select(const call_facts& c, const options& o, const std::vector<dim_hint>& hints,
                                          const char* fn_name) {
    check_hints(c, hints);
    std::lock_guard lock(mutex_);
    for (auto it = entries_.rbegin(); it != entries_.rend(); ++it)
      if (it->g.matches(c)) return it->prog;
    std::string why = "first call";
    if (!entries_.empty()) {
      entries_.back().g.matches(c, &why);
      const std::string reason = std::string(fn_name) + ": " + why;
      if (o.error_on_recompile || current_stance() == stance::fail_on_recompile)
        FUSEBOX_THROW(recompile_error("fusebox: recompile refused (" +
                                      std::string(o.error_on_recompile ? "error_on_recompile" : "stance fail_on_recompile") +
                                      "): guard failed: " + reason));
      if (recompiles_ >= o.recompile_limit) {
        if (!warned_limit_) {
          std::string all;
          for (const auto& r : reasons_) all += "\n  - " + r;
          warn("fusebox: " + std::string(fn_name) + " hit recompile_limit (" + std::to_string(o.recompile_limit) +
               "); new extents run eagerly from now on. Recompiles so far:" + all + "\n  - " + reason);
          warned_limit_ = true;
        }
        return nullptr;
      }
      ++recompiles_;
      reasons_.push_back(reason);
      counters().add_recompile(reason);
      log(log_category::recompiles, "recompiling " + reason);
    }
    std::vector<guard> guards;
    for (const auto& e : entries_) guards.push_back(e.g);
    entry e{next_guard(c, o.dynamic, guards, hints), nullptr};
    log(log_category::guards, std::string(fn_name) + ": new specialisation " + e.g.text());
    try {
      e.prog = build(e.g, o.fast_math);
    } catch (const compile_failure& failure) {
      if (o.fullgraph) throw;
      warn(std::string(failure.what()) + "; running eagerly. Compiler log:\n" + failure.log + "\nSource:\n" +
           failure.source);
      last_failure_ = failure.source;
    }
    entries_.push_back(e);
    return e.prog;
  }

  int recompiles() const { return recompiles_; }
  std::size_t specialisations() const { return entries_.size(); }
  std::vector<guard> guards() const {
    std::lock_guard lock(mutex_);
    std::vector<guard> g;
    for (const auto& e : entries_) g.push_back(e.g);
    return g;
  }

  /// A program planned and rendered, its kernels not yet compiled (so a caller can compile the
  /// kernels of many programs in one run of the compiler).
  struct prepared {
    std::shared_ptr<program_t> prog;
    std::vector<rendered_kernel> sources;
    std::vector<int> which;  ///< kernel index of each source
  };

  /// Specialises the graph to the guard's extents and plans it (the one planner); records which
  /// memory has unit inner stride.
  /// `segment`: which part of a model with graph breaks (ir/specialize.hpp): last_segment, the
  /// model's outputs with every opaque() node cut from its operand (the program a call selects),
  /// or L, the operands of the opaque() nodes of level L (run_breaks).
  template <class P>
  static void specialise_into(P& p, const guard& g, int segment = last_segment) {
    p.graph = merge_duplicates(numbered(g.pattern.size()), g.payload_class, Prog::graph::outputs);
    if constexpr (n_breaks > 0) {
      const auto level = break_levels(p.graph);
      if (segment != last_segment) {
        const auto roots = break_operands(p.graph, level, segment);
        p.graph = break_segment(p.graph, level, segment, roots);
        p.nodes = specialise(p.graph, g.pattern);
        p.plan = plan::make_plan(p.nodes, roots, sizeof(T));
      } else {
        p.graph = break_segment(p.graph, level, segment, Prog::graph::outputs);
      }
    }
    if (segment == last_segment) {
      p.nodes = specialise(p.graph, g.pattern);
      p.plan = plan::make_plan(p.nodes, Prog::graph::outputs, sizeof(T));
    }
    p.key = describe_graph(p.nodes);
    // Which memory has unit inner stride: arguments as guarded; our own buffers always; a
    // transpose of the last dimension never; anything the user hands back (graph breaks,
    // captured tensors) is read with its strides.
    for (std::size_t i = 0; i < NB; ++i) {
      const ir::node& n = p.nodes[i];
      switch (n.desc.kind) {
        case node_kind::input: p.unit_inner[i] = g.unit_inner[n.desc.input_index]; break;
        case node_kind::tensor:
        case node_kind::opaque: p.unit_inner[i] = false; break;
        case node_kind::view: {
          // A slice or a reshape keeps the innermost stride (a reshape's last dimension lies in
          // the input's innermost contiguous run: ops/layout.hpp); a transpose keeps it unless it
          // moves the last dimension.
          const int last = static_cast<int>(n.desc.shape.rank) - 1;
          p.unit_inner[i] = (n.desc.view_a != last && n.desc.view_b != last) && p.unit_inner[n.inputs[0]];
          break;
        }
        default: p.unit_inner[i] = true;
      }
    }
    if constexpr (on_cuda) p.sched = schedule::make_schedule(p.nodes, p.plan, p.unit_inner, cuda_caps_for(storage_dtype<T>()));
    else p.sched = schedule::make_schedule(p.nodes, p.plan, p.unit_inner, P::caps);
    if constexpr (!on_cuda)
      for (int k = 0; k < p.plan.n_kernels; ++k) p.kernel_names[k] = plan::kernel_ops(p.nodes, p.plan, k);
  }

  static bool generated(const plan::kernel& kn) {
    return kn.kind == plan::kernel_kind::rows || kn.kind == plan::kernel_kind::reduce_cols ||
           ((kn.kind == plan::kernel_kind::matmul || kn.kind == plan::kernel_kind::spatial) && kn.group >= 0);
  }

  /// Specialise, plan and render the program of one guard (with fast math: kernels evaluate
  /// ops::fast_math_t of each op).
  static prepared prepare(const guard& g, bool fast_math = false, int segment = last_segment) {
    prepared out;
    auto p = std::make_shared<program_t>();
    specialise_into(*p, g, segment);
    const dtype t = dtype_of<T>();
    for (int k = 0; k < p->plan.n_kernels; ++k) {
      if (!generated(p->plan.kernels[k])) continue;
      out.sources.push_back(render_cpu_kernel(p->nodes, p->plan, k, t, p->unit_inner, fast_math, p->sched));
      out.which.push_back(k);
    }
    out.prog = std::move(p);
    return out;
  }

  /// Attaches compiled kernels (in the order of `prepared::sources`).
  static std::shared_ptr<const program_t> attach(prepared&& p, std::vector<kernel_binary> bins) {
    for (std::size_t i = 0; i < p.which.size(); ++i) p.prog->kernels[p.which[i]] = std::move(bins[i]);
    return p.prog;
  }

  /// Builds the program of one guard: prepare, then compile its kernels in one compiler run
  /// (the host compiler, or NVRTC for the CUDA target).
  /// `fast_math`: NVRTC --use_fast_math on the CUDA target, vmath::fast in generated host kernels.
  static std::shared_ptr<const program_t> build(const guard& g, bool fast_math = false, int segment = last_segment) {
    if constexpr (on_cuda) {
      return build_cuda(g, fast_math, segment);
    } else {
      prepared p = prepare(g, fast_math, segment);
      auto bins = kernel_store::instance().get_all(p.sources);
      return attach(std::move(p), std::move(bins));
    }
  }

  /// The CUDA program of one guard: the same specialisation and plan, kernels rendered as CUDA and
  /// compiled by NVRTC (a unit per kernel, in parallel). An NVRTC failure becomes a compile_failure (source and log kept).
  static std::shared_ptr<const program_t> build_cuda(const guard& g, bool fast_math, int segment = last_segment) {
    profile::scoped_span span("CUDA program build", "compile");
    auto p = std::make_shared<program_t>();
    specialise_into(*p, g, segment);
    p->storage = storage_dtype<T>();
    std::vector<rendered_cuda_kernel> rs;
    std::vector<int> which;
    std::vector<bool> op_unit;  // rs[i] is kernel which[i]'s op unit (not generated code)
    for (int k = 0; k < p->plan.n_kernels; ++k) {
      const plan::kernel& kn = p->plan.kernels[k];
      // Spatial, gather, pad and custom nodes: a unit of their own (backend/cuda/spatial_kernels.hpp,
      // custom_kernels.hpp), in op_kernels;
      // a spatial node's epilogue is rendered below like a matmul's.
      if (kn.kind == plan::kernel_kind::spatial || kn.kind == plan::kernel_kind::gather ||
          kn.kind == plan::kernel_kind::pad || kn.kind == plan::kernel_kind::custom) {
        const ir::node& n = p->nodes[kn.node];
        dims in[ir::max_inputs];
        for (int q = 0; q < n.n_inputs; ++q) in[q] = p->nodes[n.inputs[q]].desc.shape;
        rs.push_back(kn.kind == plan::kernel_kind::spatial  ? render_cuda_spatial(n, p->storage)
                     : kn.kind == plan::kernel_kind::gather ? render_cuda_gather(n, in[1].rank, p->storage)
                     : kn.kind == plan::kernel_kind::custom ? render_cuda_custom(n, in, p->storage)
                                                            : render_cuda_pad(n, p->storage));
        which.push_back(k);
        op_unit.push_back(true);
        if (!generated(kn)) continue;
      }
      if (kn.kind == plan::kernel_kind::attention) {
        const ir::node& n = p->nodes[kn.node];
        rs.push_back(render_cuda_attention(n, p->nodes[n.inputs[0]], p->nodes[n.inputs[2]], p->storage));
      } else if (generated(kn)) {
        rs.push_back(render_cuda_kernel(p->nodes, p->plan, k, p->storage, p->unit_inner, p->sched));
      } else {
        continue;
      }
      which.push_back(k);
      op_unit.push_back(false);
    }
    if (!rs.empty()) {
      cuda_binary bin;
      try {
        bin = cuda_store::instance().get(rs, fast_math);
      } catch (const cuda::nvrtc_error& e) {
        FUSEBOX_THROW(compile_failure(std::string("fusebox: generated CUDA kernels failed to compile: ") + e.what(), e.source,
                                      e.log));
      }
      for (std::size_t i = 0; i < which.size(); ++i) {
        if (op_unit[i]) {  // stages: the op, then its second pass where it has one
          p->op_kernels[which[i]] = rs[i];
          p->op_first[which[i]] = bin.vector_entry[i];
          p->op_second[which[i]] = bin.wide_entry[i];
          continue;
        }
        p->kernels[which[i]] = rs[i];
        p->wide_entry[which[i]] = bin.wide_entry[i];
        p->vector_entry[which[i]] = bin.vector_entry[i];
        p->scalar_entry[which[i]] = bin.scalar_entry[i];
      }
      p->modules = std::move(bin.modules);
    }
    return p;
  }

 private:
  struct entry {
    guard g;
    std::shared_ptr<const program_t> prog;
  };
  mutable std::mutex mutex_;
  std::vector<entry> entries_;
  std::array<std::shared_ptr<const fast_entry>, fast_entries> fast_{};  // reduce_overhead
  std::vector<std::string> reasons_;
  int recompiles_ = 0;
  bool warned_limit_ = false;
  std::string last_failure_;
};

}  // namespace fusebox::jit
