// backend/cpu/codegen.hpp: renders one kernel of a plan as C++ over xsimd, for the host compiler.
//
// It walks the same plan the static executor instantiates (backend/cpu/executor.hpp), kernel kind by
// kernel kind, and emits what the executor's templates would have instantiated: a rows kernel is
// a loop over rows with one reduction pass per reduce (four accumulators, then the scalar tail),
// per-row scalars between passes, and an output pass; a reduce_cols kernel accumulates rows into
// an output row; a matmul epilogue evaluates its group over a run of one output row. Known extents
// are baked in as literals; symbolic ones are read from `kernel_args::space`. Where the schedule
// merges the kernel's dimensions at bind time (schedule/merge_dims.hpp: elementwise rows, and a
// column reduction's dimensions after its axis), the kernel reads its rank and every extent from
// `kernel_args` instead. Node numbers are local to the kernel (jit/kernel_abi.hpp), so identical
// kernels render to identical text.
// Depends on: plan/planner.hpp, schedule/schedule.hpp, ir/graph.hpp, backend/emitter.hpp, jit/kernel_abi.hpp.
#pragma once

#include <array>
#include <string>
#include <vector>

#include "fusebox/backend/emitter.hpp"
#include "fusebox/core/dtype.hpp"
#include "fusebox/core/linkage.hpp"
#include "fusebox/ir/graph.hpp"
#include "fusebox/jit/kernel_abi.hpp"
#include "fusebox/plan/planner.hpp"
#include "fusebox/schedule/schedule.hpp"

namespace fusebox::jit {

/// A kernel as source, with the map from its local node numbers to the graph's.
struct rendered_kernel {
  std::string source;
  plan::kernel_kind kind = plan::kernel_kind::rows;
  std::vector<int> locals;  ///< local number -> graph node id
  std::string summary;      ///< one line for logs and explain()
  bool fast_math = false;   ///< ops spelled ops::fast_math_t<...> (vmath::fast); part of the cache key
};

namespace detail {

inline std::string extent_text(std::size_t e, std::size_t d) {
  return is_known_extent(e) ? std::to_string(e) + "u" : "a->space[" + std::to_string(d) + "]";
}

template <std::size_t N>
class cpu_codegen {
 public:
  cpu_codegen(const std::array<ir::node, N>& nodes, const plan::plan_t<N>& p, int k, dtype t,
              const std::array<bool, N>& unit_inner, bool fast_math, const schedule::schedule_t<N>& s)
      : nodes_(nodes), p_(p), k_(plan::at_least_rank1(p.kernels[k])), t_(t), unit_inner_(unit_inner),
        fast_math_(fast_math), merged_(s.kernels[k].merge_from >= 0), keep_in_(s.keep_in) {
    local_of_.fill(-1);
  }

  rendered_kernel render() {
    switch (k_.kind) {
      case plan::kernel_kind::rows: return finish(rows());
      case plan::kernel_kind::reduce_cols: return finish(reduce_cols());
      case plan::kernel_kind::matmul:
      case plan::kernel_kind::spatial: return finish(epilogue());
      default: return {};
    }
  }

 private:
  int local(int g) {
    if (local_of_[g] < 0) {
      local_of_[g] = static_cast<int>(locals_.size());
      locals_.push_back(g);
    }
    return local_of_[g];
  }
  std::string L(int g) { return std::to_string(local(g)); }
  /// The op as the language's apply() names it inside fusebox::ops: with fast math, its
  /// fast_math_t (ops/fast_math.hpp; the op itself where it has no fast variant).
  std::string op(const ir::node& nd) const {
    return fast_math_ ? "fast_math_t<fusebox::ops::" + std::string(nd.desc.name) + ">" : std::string(nd.desc.name);
  }
  bool member(int g) const { return k_.group >= 0 && p_.group[g] == k_.group; }
  const char* elem() const { return t_ == dtype::f64 ? "double" : "float"; }

  /// The pointer variable of memory node g (row-adjusted in the loop prologue).
  std::string ptr(int g, bool writable = false) {
    const std::string l = L(g);
    if (pointer_decl_[g].empty()) {
      const std::size_t r = merged_ ? 0 : k_.space.rank;
      std::string s = std::string(writable ? "T* const p" : "const T* const p") + l + " = static_cast<" +
                      (writable ? "T*" : "const T*") + ">(a->ptr[" + l + "])";
      if (merged_) s += " + fusebox::jit::row_offset(a, " + l + ", row_)";
      for (std::size_t d = 0; d + 1 < r; ++d)
        s += " + static_cast<std::ptrdiff_t>(i" + std::to_string(d) + ") * a->stride[" +
             std::to_string(local(g) * static_cast<int>(abi_max_rank) + static_cast<int>(d)) + "]";
      pointer_decl_[g] = s + ";";
      pointer_order_.push_back(g);
    }
    return "p" + l;
  }
  std::string inner_stride(int g) {
    if (merged_) return "a->stride[" + std::to_string(local(g) * static_cast<int>(abi_max_rank)) + " + R_ - 1]";
    return "a->stride[" + std::to_string(local(g) * static_cast<int>(abi_max_rank) + static_cast<int>(k_.space.rank) - 1) + "]";
  }

  /// The value of node g at column j inside a body of the given pass.
  std::string value(body& b, int g, int pass) {
    const ir::node& nd = nodes_[g];
    const language& lang = b.lang();
    if (nd.desc.kind == node_kind::scalar)
      return b.let(lang.splat(lang.value_type, "static_cast<T>(a->scalar[" + L(g) + "])"));
    if (member(g)) {
      if (nd.desc.kind == node_kind::reduce || p_.row_constant[g]) return b.let(lang.splat(lang.value_type, "rs[" + L(g) + "]"));
      // Kept in the row scratch (the schedule's keep::scratch, in the planner's slot): written in
      // its first pass, read back in later ones.
      const bool kept = keep_in_[g] == schedule::keep::scratch;
      const std::string scratch_row = "scratch + " + std::to_string(p_.cache_slot[g]) + " * W";
      if (kept && p_.pass[g] < pass) return b.let(lang.load(lang.value_type, scratch_row));
      std::vector<std::string> args;
      for (int q = 0; q < nd.n_inputs; ++q) args.push_back(value(b, nd.inputs[q], pass));
      const std::string v = b.let(lang.apply(op(nd), args));
      if (kept) b.statement(lang.store(scratch_row, v));
      return v;
    }
    const std::string p = ptr(g);
    if (nd.desc.shape.rank == 0 || nd.desc.shape.back(0) == 1) return b.let(lang.splat(lang.value_type, "*" + p));
    if (unit_inner_[g]) return b.let(lang.load(lang.value_type, p));
    return b.let(lang.load_strided(lang.value_type, p, inner_stride(g)));
  }

  /// Loop-invariant prologue: extents and the row coordinates.
  std::string prologue() const {
    std::string s = "  using T = " + std::string(elem()) + ";\n  using V = xsimd::batch<T>;\n  constexpr std::size_t VS = V::size;\n";
    if (merged_)  // the host merged dimensions: rank and extents are the call's
      return s + "  const std::size_t R_ = a->rank;\n  const std::size_t W = a->space[R_ - 1];\n  (void)W; (void)VS;\n";
    const std::size_t r = k_.space.rank;
    for (std::size_t d = 0; d < r; ++d)
      s += "  const std::size_t E" + std::to_string(d) + " = " + extent_text(k_.space.extent[d], d) + ";\n";
    s += "  const std::size_t W = E" + std::to_string(r - 1) + ";\n  (void)W; (void)VS;\n";
    return s;
  }
  std::string coordinates(const std::string& row) const {
    if (merged_) return "    const std::size_t row_ = " + row + ";\n";
    std::string s = "    std::size_t q_ = " + row + ";\n";
    const std::size_t r = k_.space.rank;
    for (std::size_t d = r - 1; d-- > 0;)
      s += "    const std::size_t i" + std::to_string(d) + " = q_ % E" + std::to_string(d) + "; q_ /= E" +
           std::to_string(d) + ";\n";
    return s + "    (void)q_;\n";
  }
  std::string pointers() const {
    std::string s;
    for (int g : pointer_order_) s += "    " + pointer_decl_[g] + "\n";
    return s;
  }

  /// The j loop of a body lambda over [from, to): vector steps, then the scalar tail.
  static std::string column_loop(const std::string& fn, const std::string& from, const std::string& to) {
    return "      std::size_t j = " + from + ";\n      for (; j + VS <= " + to + "; j += VS) " + fn +
           ".template operator()<V>(j);\n      for (; j < " + to + "; ++j) " + fn + ".template operator()<T>(j);\n";
  }

  std::string reduction_pass(int r_id) {
    const ir::node& nd = nodes_[r_id];
    body b(cpp_xsimd());
    const std::string v = value(b, nd.inputs[0], p_.pass[r_id]);
    std::string s = "    {  // pass " + std::to_string(p_.pass[r_id]) + ": " + nd.desc.name + "\n";
    s += "      using Op = fusebox::ops::" + std::string(nd.desc.name) + ";\n";
    s += "      auto at = [&]<class W_>(std::size_t j) -> W_ {\n" + b.text("        ") + "        return " + v + ";\n      };\n";
    s += "      V acc0 = Op::identity<V>(), acc1 = acc0, acc2 = acc0, acc3 = acc0;\n      std::size_t j = 0;\n";
    s += "      for (; j + 4 * VS <= W; j += 4 * VS) {\n"
         "        acc0 = Op::combine(acc0, at.template operator()<V>(j));\n"
         "        acc1 = Op::combine(acc1, at.template operator()<V>(j + VS));\n"
         "        acc2 = Op::combine(acc2, at.template operator()<V>(j + 2 * VS));\n"
         "        acc3 = Op::combine(acc3, at.template operator()<V>(j + 3 * VS));\n      }\n";
    s += "      for (; j + VS <= W; j += VS) acc0 = Op::combine(acc0, at.template operator()<V>(j));\n";
    s += "      T total = Op::horizontal(Op::combine(Op::combine(acc0, acc1), Op::combine(acc2, acc3)));\n";
    s += "      for (; j < W; ++j) total = Op::combine(total, at.template operator()<T>(j));\n";
    s += "      rs[" + L(r_id) + "] = Op::finalize(total, W);\n    }\n";
    return s;
  }

  std::string row_scalar(int g) {
    language scalar_lang = cpp_xsimd();
    scalar_lang.value_type = "T";
    body b(scalar_lang);
    std::vector<std::string> args;
    const ir::node& nd = nodes_[g];
    for (int q = 0; q < nd.n_inputs; ++q) args.push_back(value(b, nd.inputs[q], 0));
    const std::string v = b.let(scalar_lang.apply(op(nd), args));
    return "    {\n      constexpr std::size_t j = 0; (void)j;\n" + b.text("      ") + "      rs[" + L(g) + "] = " + v + ";\n    }\n";
  }

  /// Output pass over [from, to): every full-width materialised member.
  std::string output_pass(const std::string& from, const std::string& to) {
    body b(cpp_xsimd());
    bool any = false;
    for (std::size_t g = 0; g < N; ++g) {
      if (!member(static_cast<int>(g)) || !p_.materialised[g] || nodes_[g].desc.kind != node_kind::pointwise ||
          p_.row_constant[g])
        continue;
      const std::string v = value(b, static_cast<int>(g), k_.passes);
      b.statement("fusebox::cpu::store_out_v(a->stream, " + ptr(static_cast<int>(g), true) + " + j, " + v + ");");
      any = true;
    }
    if (!any) return "";
    return "    {  // output pass\n      auto out = [&]<class W_>(std::size_t j) {\n" + b.text("        ") + "      };\n" +
           column_loop("out", from, to) + "      if (a->stream) fusebox::cpu::stream_fence();\n    }\n";
  }

  std::string rows() {
    std::string steps;
    for (std::size_t g = 0; g < N; ++g) {
      if (!member(static_cast<int>(g))) continue;
      if (nodes_[g].desc.kind == node_kind::reduce) steps += reduction_pass(static_cast<int>(g));
      else if (p_.row_constant[g]) steps += row_scalar(static_cast<int>(g));
    }
    const std::string out = output_pass("c0", "c1");
    std::string scalar_outs;
    for (std::size_t g = 0; g < N; ++g)
      if (member(static_cast<int>(g)) && p_.materialised[g] &&
          (nodes_[g].desc.kind == node_kind::reduce || p_.row_constant[g]))
        scalar_outs += "    *" + ptr(static_cast<int>(g), true) + " = rs[" + L(static_cast<int>(g)) + "];\n";
    std::string s = signature("std::size_t r0, std::size_t r1, std::size_t c0, std::size_t c1, unsigned worker");
    s += prologue();
    s += "  T* const scratch = reinterpret_cast<T*>(a->scratch + worker * a->scratch_stride);\n  (void)scratch; (void)c0; (void)c1;\n";
    s += "  for (std::size_t r = r0; r < r1; ++r) {\n" + coordinates("r") + pointers();
    s += "    T rs[" + std::to_string(locals_.size() + 1) + "];\n    (void)rs;\n";
    s += steps + out + scalar_outs + "  }\n}\n";
    summary_ = "rows over " + to_string(k_.space) + ", " + std::to_string(k_.passes) + " pass(es)" +
               (merged_ ? ", dimensions merged per call" : "");
    return s;
  }

  std::string reduce_cols() {
    const int r_id = k_.node;
    const ir::node& rn = nodes_[r_id];
    body b(cpp_xsimd());
    const std::string v = value(b, rn.inputs[0], 0);
    // Producers fused into the reduction that another kernel also reads: written in this pass.
    for (std::size_t g = 0; g < N; ++g)
      if (member(static_cast<int>(g)) && p_.materialised[g] && nodes_[g].desc.kind == node_kind::pointwise)
        b.statement(b.lang().store(ptr(static_cast<int>(g), true), value(b, static_cast<int>(g), 0)));
    const std::string po = ptr(r_id, true);
    std::string s = signature("std::size_t o0, std::size_t o1, std::size_t c0, std::size_t c1");
    s += prologue();
    const std::string axis = std::to_string(rn.desc.axis);
    const std::string inner_rows = [&] {  // input rows between two steps along the axis
      if (merged_)
        return "[&] { std::size_t e = 1; for (std::size_t d = " + axis + " + 1; d + 1 < R_; ++d) e *= a->space[d]; return e; }()";
      std::string e = "1u";
      for (std::size_t d = static_cast<std::size_t>(rn.desc.axis) + 1; d + 1 < k_.space.rank; ++d) e += " * E" + std::to_string(d);
      return e;
    }();
    const std::string count = merged_ ? "a->space[" + axis + "]" : "E" + axis;
    const std::string os = inner_stride(r_id);
    s += "  using Op = fusebox::ops::" + std::string(rn.desc.name) + ";\n";
    s += "  const std::size_t count = " + count + ", inner_rows = " + inner_rows + ";\n";
    // Output row o (the input's rows without the reduced axis) sums input rows
    // input_row(o, 0..count-1), in that order whatever the task split.
    s += "  auto input_row = [&](std::size_t o, std::size_t k) { return ((o / inner_rows) * count + k) * inner_rows + o % inner_rows; };\n";
    s += "  (void)input_row;\n";
    s += "  for (std::size_t orow = o0; orow < o1; ++orow) {\n" + coordinates("input_row(orow, 0)") + pointers();
    s += "    for (std::size_t j = c0; j < c1; ++j) " + po + "[static_cast<std::ptrdiff_t>(j) * " + os + "] = Op::identity<T>();\n  }\n";
    s += "  for (std::size_t orow = o0; orow < o1; ++orow)\n  for (std::size_t k = 0; k < count; ++k) {\n" + coordinates("input_row(orow, k)") + pointers();
    s += "    auto acc = [&]<class W_>(std::size_t j) {\n" + b.text("      ") +
         "      if constexpr (std::is_same_v<W_, T>) {\n        T& o = " + po + "[static_cast<std::ptrdiff_t>(j) * " + os +
         "];\n        o = Op::combine(o, " + v + ");\n      } else {\n        fusebox::cpu::store_v(" + po +
         " + j, Op::combine(fusebox::cpu::load_v<W_>(" + po + " + j), " + v + "));\n      }\n    };\n";
    s += "    if (" + os + " == 1) {\n" + column_loop("acc", "c0", "c1") +
         "    } else {\n      for (std::size_t j = c0; j < c1; ++j) acc.template operator()<T>(j);\n    }\n  }\n";
    s += "  for (std::size_t orow = o0; orow < o1; ++orow) {\n" + coordinates("input_row(orow, 0)") + pointers();
    s += "    for (std::size_t j = c0; j < c1; ++j) {\n      T& x = " + po + "[static_cast<std::ptrdiff_t>(j) * " + os + "];\n      x = Op::finalize(x, count);\n    }\n  }\n}\n";
    summary_ = std::string("column ") + rn.desc.name + " over " + to_string(k_.space);
    return s;
  }

  std::string epilogue() {
    const std::string out = output_pass("j0", "j0 + n");
    std::string s = signature("std::size_t row, std::size_t j0, std::size_t n");
    s += prologue();
    s += "  {\n" + coordinates("row") + pointers() + out + "  }\n}\n";
    summary_ = std::string(k_.kind == plan::kernel_kind::matmul ? "matmul" : nodes_[k_.node].desc.name) +
               " epilogue over " + to_string(k_.space);
    return s;
  }

  std::string signature(const std::string& params) const {
    return "extern \"C\" void fusebox_kernel(const fusebox::jit::kernel_args* a, " + params + ") {\n";
  }

  rendered_kernel finish(std::string body_text) {
    rendered_kernel r;
    r.kind = k_.kind;
    r.locals = locals_;
    r.summary = summary_;
    r.fast_math = fast_math_;
    std::string ops;
    for (std::size_t g = 0; g < N; ++g)
      if (member(static_cast<int>(g))) ops += std::string(ops.empty() ? "" : ", ") + nodes_[g].desc.name;
    r.source = "// fusebox generated kernel: " + summary_ + "; ops: " + ops + "\n#include \"fusebox/jit/prelude.hpp\"\n\n" +
               body_text;
    return r;
  }

  const std::array<ir::node, N>& nodes_;
  const plan::plan_t<N>& p_;
  const plan::kernel k_;
  dtype t_;
  const std::array<bool, N>& unit_inner_;
  bool fast_math_ = false;
  bool merged_ = false;  ///< the host merges the space's dimensions per call (schedule::kernel_schedule::merge_from)
  std::array<schedule::keep, N> keep_in_{};  ///< where rows members live between passes (schedule::schedule_t::keep_in)
  std::array<int, N> local_of_{};
  std::vector<int> locals_;
  std::array<std::string, N> pointer_decl_{};
  std::vector<int> pointer_order_;
  std::string summary_;
};

}  // namespace detail

/// Renders kernel k of plan p (kinds rows, reduce_cols, and matmul epilogues; other kinds run on
/// the host). `unit_inner[g]` says whether memory node g has inner stride 1 at run time;
/// `fast_math`, whether its ops evaluate vmath::fast (options::fast_math); `s`, the plan's
/// schedule for the CPU (schedule/schedule.hpp).
template <std::size_t N>
rendered_kernel render_cpu_kernel(const std::array<ir::node, N>& nodes, const plan::plan_t<N>& p, int k, dtype t,
                                  const std::array<bool, N>& unit_inner, bool fast_math,
                                  const schedule::schedule_t<N>& s) {
  return detail::cpu_codegen<N>(nodes, p, k, t, unit_inner, fast_math, s).render();
}
/// ... with the CPU's schedule made here.
template <std::size_t N>
rendered_kernel render_cpu_kernel(const std::array<ir::node, N>& nodes, const plan::plan_t<N>& p, int k, dtype t,
                                  const std::array<bool, N>& unit_inner, bool fast_math = false) {
  return render_cpu_kernel(nodes, p, k, t, unit_inner, fast_math,
                           schedule::make_schedule(nodes, p, unit_inner, schedule::cpu_caps));
}

#ifdef FUSEBOX_RUNTIME_INSTANCE  // compiled once where a program asks for it (core/linkage.hpp)
FUSEBOX_RUNTIME_INSTANCE class detail::cpu_codegen<16>;
FUSEBOX_RUNTIME_INSTANCE class detail::cpu_codegen<32>;
FUSEBOX_RUNTIME_INSTANCE class detail::cpu_codegen<64>;
FUSEBOX_RUNTIME_INSTANCE class detail::cpu_codegen<128>;
#endif

}  // namespace fusebox::jit
