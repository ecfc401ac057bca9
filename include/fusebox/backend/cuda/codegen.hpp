// backend/cuda/codegen.hpp: renders one kernel of a plan as CUDA C++ for NVRTC.
//
// It walks the same plan as the C++ generator (backend/cpu/codegen.hpp) and the static executor, and
// maps each kernel kind onto the GPU:
//   rows, no reduction    elementwise: a grid-stride loop over (row, chunk of VEC columns); each
//                         thread loads VEC elements of every operand with one 16-byte access
//   rows with passes      one thread block per row: each reduction pass strides the row in chunks
//                         of VEC, combines in registers, then across the block (warp shuffles and
//                         one shared word per warp); row scalars follow; the output pass writes
//   reduce_cols           a block of 256 threads takes 256 / S consecutive outputs; the S threads
//                         of an output each walk every S-th index of the reduced axis, and the S
//                         partials combine as a fixed tree in shared memory (no atomics; S is a
//                         literal of the source, so the result does not depend on the launch)
//   matmul epilogue       the elementwise form over the matmul's output, read in place (the
//                         product itself comes from cuBLASLt on the host side); likewise the
//                         epilogue of a spatial node (conv2d's bias and relu: backend/cuda/spatial_kernels.hpp)
// Every kernel is a template on VEC with two entry points: `<name>` (VEC = 16 bytes of the
// storage type) and `<name>_v1` (scalar). The host takes the vector entry when every unit-stride
// operand is 16-byte aligned and its row strides are multiples of VEC, else the scalar one.
//
// Ops are spelled by their own `device` member (ops/*.hpp), wrapped in one __device__ function
// per op used; values are float whatever the storage type (bfloat16 and float16 convert on load
// and store). Known extents are literals; symbolic ones are read from the arguments; an
// elementwise kernel whose dimensions the schedule merges per call (schedule/merge_dims.hpp) reads
// its rank and every extent from the arguments. Node numbers are local to the kernel, so
// identical kernels render to identical text.
// Depends on: plan/planner.hpp, schedule/schedule.hpp, ir/graph.hpp, backend/emitter.hpp, jit/kernel_abi.hpp,
// core/dtype.hpp.
#pragma once

#include <array>
#include <set>
#include <string>
#include <vector>

#include "fusebox/backend/emitter.hpp"
#include "fusebox/core/dtype.hpp"
#include "fusebox/core/errors.hpp"
#include "fusebox/core/linkage.hpp"
#include "fusebox/ir/graph.hpp"
#include "fusebox/jit/kernel_abi.hpp"
#include "fusebox/plan/planner.hpp"
#include "fusebox/schedule/schedule.hpp"

namespace fusebox::jit {

/// The byte layout of a CUDA kernel's one parameter (a struct passed by value) for L local nodes:
/// ptr[L] (8 bytes each), stride[L * abi_max_rank] (8), space[abi_max_rank] (8), scalar[L] (4).
struct cuda_args_layout {
  std::size_t locals = 0;
  std::size_t ptr_at() const { return 0; }
  std::size_t stride_at() const { return 8 * locals; }
  std::size_t space_at() const { return stride_at() + 8 * locals * abi_max_rank; }
  std::size_t scalar_at() const { return space_at() + 8 * abi_max_rank; }
  std::size_t rank_at() const { return (scalar_at() + 4 * locals + 7) / 8 * 8; }
  std::size_t bytes() const { return rank_at() + 8; }
};

/// A CUDA kernel as source: the entry point is `fusebox_kernel` (vector) and `fusebox_kernel_v1`.
struct rendered_cuda_kernel {
  std::string source;  ///< device functions and the two entry points (the prelude is separate)
  plan::kernel_kind kind = plan::kernel_kind::rows;
  std::vector<int> locals;  ///< local number -> graph node id
  std::vector<int> unit_operands;  ///< locals read or written with unit stride (alignment checked at launch)
  bool block_per_row = false;      ///< rows kernels with reduction passes
  unsigned block_threads = 0;      ///< threads per block the source is written for (0: host's choice)
  unsigned rows_per_block = 1;     ///< rows kernels with passes: rows a block takes at once (a warp each if > 1)
  unsigned outputs_per_block = 0;  ///< reduce_cols: consecutive outputs a block takes (block_threads / slices)
  bool tensor_cores = false;       ///< attention: `fusebox_kernel` is the tensor-core entry (jit/cuda_attention.hpp)
  bool merged_space = false;       ///< takes a space the host merged (rank and extents from the arguments)
  std::string summary;
};

/// The device-side helpers every generated unit starts with: storage conversions for bfloat16
/// and float16 (no CUDA headers: NVRTC compiles it as it is), 16-byte vector loads and stores,
/// and the block reduction.
FUSEBOX_RUNTIME_API const std::string& cuda_prelude();

/// The storage type's name in generated CUDA source.
FUSEBOX_RUNTIME_API const char* cuda_storage_name(dtype t);

/// Body values of generated CUDA are float scalars at element (j + v); loads, stores and op calls
/// are spelled by the generator itself (vector loads hoisted out of the element loop).
inline const language& cuda_language() {
  static const language l{"float", nullptr, nullptr, nullptr, nullptr, nullptr};
  return l;
}

namespace detail {

template <std::size_t N>
class cuda_codegen {
 public:
  cuda_codegen(const std::array<ir::node, N>& nodes, const plan::plan_t<N>& p, int k, dtype t,
               const std::array<bool, N>& unit_inner, const schedule::schedule_t<N>& s)
      : nodes_(nodes), p_(p), k_(plan::at_least_rank1(p.kernels[k])), t_(t), unit_inner_(unit_inner), s_(s), ks_(s.kernels[k]),
        merged_(ks_.merge_from == 0 && k_.kind == plan::kernel_kind::rows && k_.passes == 0) {
    local_of_.fill(-1);
  }

  rendered_cuda_kernel render() {
    std::string body;
    if (k_.kind == plan::kernel_kind::rows && k_.passes > 0) plan_row_cache();
    switch (k_.kind) {
      case plan::kernel_kind::rows: body = k_.passes > 0 ? row_blocks() : elementwise(); break;
      case plan::kernel_kind::reduce_cols: body = reduce_cols(); break;
      case plan::kernel_kind::matmul:
      case plan::kernel_kind::spatial: body = elementwise(); break;  // epilogues, in place
      default: return {};
    }
    rendered_cuda_kernel r;
    r.kind = k_.kind;
    r.locals = locals_;
    r.block_per_row = k_.kind == plan::kernel_kind::rows && k_.passes > 0;
    r.merged_space = merged_;
    r.block_threads = row_cache_ ? block_threads_ * rows_per_block_ : k_.kind == plan::kernel_kind::reduce_cols ? cols_block_ : 0;
    r.rows_per_block = rows_per_block_;
    r.outputs_per_block = k_.kind == plan::kernel_kind::reduce_cols ? cols_block_ / cols_slices_ : 0;
    r.summary = summary_;
    for (int g : unit_) r.unit_operands.push_back(local(g));
    std::string ops;
    for (std::size_t g = 0; g < N; ++g)
      if (member(static_cast<int>(g))) ops += std::string(ops.empty() ? "" : ", ") + nodes_[g].desc.name;
    r.source = "// fusebox generated CUDA kernel: " + summary_ + "; ops: " + ops + "\n" + functions_ + args_struct() +
               body;
    return r;
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
  bool member(int g) const { return k_.group >= 0 && p_.group[g] == k_.group; }
  std::string storage() const { return cuda_storage_name(t_); }

  /// The __device__ function (or struct, for reductions) of an op, emitted once per kernel.
  std::string op_function(const ir::node& nd) {
    const std::string fn = std::string("fb_") + nd.desc.name;
    if (!defined_.insert(fn).second) return fn;
    if (!nd.desc.device || !*nd.desc.device)
      FUSEBOX_THROW(invalid_argument(std::string("fusebox: op '") + nd.desc.name +
                                     "' has no CUDA spelling (a `device` member in its op struct); it cannot run on the CUDA backend"));
    if (nd.desc.kind == node_kind::reduce) {
      functions_ += "struct " + fn + " { " + nd.desc.device + " };\n";
    } else {
      const char* params[] = {"float x", "float a, float b", "float c, float a, float b"};
      functions_ += "__device__ __forceinline__ float " + fn + "(" + params[nd.n_inputs - 1] + ") { return " +
                    nd.desc.device + "; }\n";
    }
    return fn;
  }

  /// Declares the row pointer of memory node g (offset by the row coordinates), once.
  std::string ptr(int g, bool writable = false) {
    const std::string l = L(g);
    if (pointer_decl_[g].empty()) {
      const std::size_t r = merged_ ? 0 : k_.space.rank;
      std::string s = std::string(writable ? "T* const p" : "const T* const p") + l + " = reinterpret_cast<" +
                      (writable ? "T*" : "const T*") + ">(a.ptr[" + l + "])";
      if (merged_) s += " + fb_row_offset(a, " + l + ", row_)";
      for (std::size_t d = 0; d + 1 < r; ++d)
        s += " + static_cast<long long>(i" + std::to_string(d) + ") * a.stride[" +
             std::to_string(local(g) * static_cast<int>(abi_max_rank) + static_cast<int>(d)) + "]";
      pointer_decl_[g] = s + ";";
      pointer_order_.push_back(g);
    }
    return "p" + l;
  }
  std::string inner_stride(int g) {
    if (merged_) return "a.stride[" + std::to_string(local(g) * static_cast<int>(abi_max_rank)) + " + R_ - 1]";
    return "a.stride[" + std::to_string(local(g) * static_cast<int>(abi_max_rank) + static_cast<int>(k_.space.rank) - 1) +
           "]";
  }

  /// What one element loop needs before it starts: the vector loads of its operands (each once).
  struct preloads {
    std::string text;
    std::set<int> loaded;
  };

  /// The value of node g at element (j + v) in a body; `pre` collects the vector loads that must
  /// come before the unrolled element loop.
  std::string value(body& b, int g, preloads& pre) {
    const ir::node& nd = nodes_[g];
    if (nd.desc.kind == node_kind::scalar) return b.let("a.scalar[" + L(g) + "]");
    if (member(g)) {
      if (nd.desc.kind == node_kind::reduce || p_.row_constant[g]) return b.let("rs[" + L(g) + "]");
      if (value_cached_.count(g)) return b.let("c" + L(g) + "[kk][v]");
      std::vector<std::string> args;
      for (int q = 0; q < nd.n_inputs; ++q) args.push_back(value(b, nd.inputs[q], pre));
      std::string call = op_function(nd) + "(";
      for (std::size_t i = 0; i < args.size(); ++i) call += (i ? ", " : "") + args[i];
      const std::string t = b.let(call + ")");
      if (value_cache_.count(g)) {
        b.statement("c" + L(g) + "[kk][v] = " + t + ";");
        value_stored_.insert(g);
      }
      return t;
    }
    const std::string p = ptr(g);
    if (nd.desc.shape.rank == 0 || nd.desc.shape.back(0) == 1) return b.let("fb_to_float(*" + p + ")");
    if (unit_inner_[g] && row_cache_ && varies_by_row(nd)) {
      // Row kernels with a known row length keep each operand's slice of the row in registers,
      // loaded once per row: every pass reads them there instead of from memory. An operand
      // that is the same for every row (layer_norm's gamma, a bias) is read where it is used:
      // it stays in L1, and registers go to the next row's prefetch instead.
      unit_.insert(g);
      row_cached_.insert(g);
      return b.let("x" + L(g) + "[kk][v]");
    }
    if (unit_inner_[g]) {
      const std::string x = "x" + L(g);
      if (pre.loaded.insert(g).second) {
        unit_.insert(g);
        pre.text += "float " + x + "[VEC];\nfb_load<VEC>(" + p + " + j, " + x + ");\n";
      }
      return b.let(x + "[v]");
    }
    return b.let("fb_to_float(" + p + "[static_cast<long long>(j + v) * " + inner_stride(g) + "])");
  }

  std::string prologue() const {
    std::string s = "  using T = " + storage() + ";\n";
    if (merged_)  // the host merged dimensions (schedule/merge_dims.hpp): rank and extents are the call's
      return s + "  const unsigned long long R_ = a.rank, W = a.space[R_ - 1];\n  unsigned long long rows = 1;\n"
                 "  for (unsigned long long d = 0; d + 1 < R_; ++d) rows *= a.space[d];\n  (void)W; (void)rows;\n";
    const std::size_t r = k_.space.rank;
    for (std::size_t d = 0; d < r; ++d)
      s += "  const unsigned long long E" + std::to_string(d) + " = " +
           (is_known_extent(k_.space.extent[d]) ? std::to_string(k_.space.extent[d]) + "ull"
                                                : "a.space[" + std::to_string(d) + "]") +
           ";\n";
    s += "  const unsigned long long W = E" + std::to_string(r - 1) + ";\n  unsigned long long rows = 1;\n";
    for (std::size_t d = 0; d + 1 < r; ++d) s += "  rows *= E" + std::to_string(d) + ";\n";
    return s + "  (void)W; (void)rows;\n";
  }
  std::string coordinates(const std::string& row, const std::string& indent) const {
    if (merged_) return indent + "const unsigned long long row_ = " + row + ";\n";
    std::string s = indent + "unsigned long long q_ = " + row + ";\n";
    const std::size_t r = k_.space.rank;
    for (std::size_t d = r - 1; d-- > 0;)
      s += indent + "const unsigned long long i" + std::to_string(d) + " = q_ % E" + std::to_string(d) + "; q_ /= E" +
           std::to_string(d) + ";\n";
    return s + indent + "(void)q_;\n";
  }
  std::string pointers(const std::string& indent) const {
    std::string s;
    for (int g : pointer_order_) s += indent + pointer_decl_[g] + "\n";
    return s;
  }
  static std::string indent(const std::string& text, const std::string& by) {
    std::string s, line;
    for (char c : text) {
      line += c;
      if (c == '\n') {
        s += by + line;
        line.clear();
      }
    }
    return s + (line.empty() ? "" : by + line + "\n");
  }

  /// Per-row scalars (members of per-row shape that are not reductions): every thread computes them.
  std::string row_scalars() {
    std::string s;
    for (std::size_t g = 0; g < N; ++g) {
      if (!member(static_cast<int>(g)) || nodes_[g].desc.kind == node_kind::reduce || !p_.row_constant[g]) continue;
      body b(cuda_language());
      preloads pre;
      const ir::node& nd = nodes_[g];
      std::vector<std::string> args;
      for (int q = 0; q < nd.n_inputs; ++q) args.push_back(value(b, nd.inputs[q], pre));
      std::string call = op_function(nd) + "(";
      for (std::size_t i = 0; i < args.size(); ++i) call += (i ? ", " : "") + args[i];
      s += "      {\n        const int v = 0; const unsigned long long j = 0; (void)v; (void)j;\n" + indent(pre.text, "        ") +
           b.text("        ") + "        rs[" + L(static_cast<int>(g)) + "] = " + call + ");\n      }\n";
    }
    return s;
  }

  /// The element loop of the output pass: every full-width materialised member, stored.
  std::string output_body(preloads& pre, bool& any) {
    body b(cuda_language());
    std::string stores;
    for (std::size_t g = 0; g < N; ++g) {
      if (!member(static_cast<int>(g)) || !p_.materialised[g] || nodes_[g].desc.kind != node_kind::pointwise ||
          p_.row_constant[g])
        continue;
      const std::string v = value(b, static_cast<int>(g), pre);
      const std::string o = "o" + L(static_cast<int>(g));
      const std::string p = ptr(static_cast<int>(g), true);
      any = true;
      if (unit_inner_[g]) {
        unit_.insert(static_cast<int>(g));
        outs_decl_ += "float " + o + "[VEC];\n";
        outs_store_ += "fb_store<VEC>(" + p + " + j, " + o + ");\n";
        b.statement(o + "[v] = " + v + ";");
      } else {
        b.statement(p + "[static_cast<long long>(j + v) * " + inner_stride(static_cast<int>(g)) +
                    "] = fb_from_float<T>(" + v + ");");
      }
    }
    return b.text("  ");
  }

  std::string scalar_outputs(const std::string& indent_by) {
    std::string s;
    for (std::size_t g = 0; g < N; ++g)
      if (member(static_cast<int>(g)) && p_.materialised[g] &&
          (nodes_[g].desc.kind == node_kind::reduce || p_.row_constant[g]))
        s += indent_by + "*" + ptr(static_cast<int>(g), true) + " = fb_from_float<T>(rs[" + L(static_cast<int>(g)) + "]);\n";
    return s;
  }

  /// Three entries: `_w` (elementwise kernels: 32 bytes a thread, two 16-byte accesses in flight
  /// per operand; other kinds: the same as the vector entry), the vector entry (16 bytes), `_v1`.
  std::string entry_points() const {
    const std::size_t vec = 16 / size_of(t_);
    const bool wide = k_.kind == plan::kernel_kind::matmul || k_.kind == plan::kernel_kind::spatial ||
                      (k_.kind == plan::kernel_kind::rows && k_.passes == 0);
    return "extern \"C\" __global__ void fusebox_kernel_w(const fb_args a) { fb_body<" + std::to_string(wide ? 2 * vec : vec) +
           ">(a); }\nextern \"C\" __global__ void fusebox_kernel(const fb_args a) { fb_body<" + std::to_string(vec) +
           ">(a); }\nextern \"C\" __global__ void fusebox_kernel_v1(const fb_args a) { fb_body<1>(a); }\n";
  }

  std::string args_struct() {
    const std::size_t l = std::max<std::size_t>(locals_.size(), 1);
    return "struct fb_args { unsigned long long ptr[" + std::to_string(l) + "]; long long stride[" +
           std::to_string(l * abi_max_rank) + "]; unsigned long long space[" + std::to_string(abi_max_rank) +
           "]; float scalar[" + std::to_string(l) + "]; unsigned long long rank; };\n" +
           (merged_ ? "__device__ __forceinline__ long long fb_row_offset(const fb_args& a, int l, unsigned long long row) {\n"
                      "  long long o = 0;\n"
                      "  for (unsigned long long d = a.rank - 1; d-- > 0;) {\n"
                      "    o += static_cast<long long>(row % a.space[d]) * a.stride[l * " + std::to_string(abi_max_rank) + " + d];\n"
                      "    row /= a.space[d];\n  }\n  return o;\n}\n"
                    : "");
  }

  /// Elementwise over the kernel's space: rows kernels without passes, and matmul epilogues.
  std::string elementwise() {
    preloads pre;
    bool any = false;
    const std::string out = output_body(pre, any);
    const std::string rs = row_scalars();
    const std::string souts = scalar_outputs("      ");
    std::string s = "template <int VEC>\n__device__ __forceinline__ void fb_body(const fb_args& a) {\n" + prologue();
    s += "  const unsigned long long chunks = W / VEC, total = rows * chunks;\n";
    s += "  for (unsigned long long t = blockIdx.x * static_cast<unsigned long long>(blockDim.x) + threadIdx.x; t < total;\n"
         "       t += static_cast<unsigned long long>(gridDim.x) * blockDim.x) {\n";
    s += "    const unsigned long long r = t / chunks, j = (t - r * chunks) * VEC;\n";
    s += coordinates("r", "    ") + pointers("    ");
    s += "    float rs[" + std::to_string(locals_.size() + 1) + "];\n    (void)rs;\n" + rs;
    if (any)
      s += indent(pre.text + outs_decl_, "    ") + "#pragma unroll\n    for (int v = 0; v < VEC; ++v) {\n" + indent(out, "    ") +
           "    }\n" + indent(outs_store_, "    ");
    if (!souts.empty()) s += "    if (j == 0) {\n" + souts + "    }\n";
    s += "  }\n}\n" + entry_points();
    summary_ = std::string(k_.kind == plan::kernel_kind::matmul    ? "matmul epilogue"
                           : k_.kind == plan::kernel_kind::spatial ? std::string(nodes_[k_.node].desc.name) + " epilogue"
                                                                   : "elementwise") +
               " over " + to_string(k_.space) + (merged_ ? ", dimensions merged per call" : "");
    return s;
  }

  /// One reduction pass of a row block.
  std::string reduction_pass(int r_id) {
    const ir::node& nd = nodes_[r_id];
    body b(cuda_language());
    preloads pre;
    const std::string v = value(b, nd.inputs[0], pre);
    const std::string op = op_function(nd);
    std::string s = "      {  // pass " + std::to_string(p_.pass[r_id]) + ": " + nd.desc.name + "\n";
    s += "        float acc = " + op + "::identity();\n";
    s += "        " + row_loop_head() + " {\n";
    s += indent(pre.text, "          ") + "#pragma unroll\n          for (int v = 0; v < VEC; ++v) {\n" + b.text("            ") +
         "            acc = " + op + "::combine(acc, " + v + ");\n          }\n        }\n";
    s += "        rs[" + L(r_id) + "] = " + op + "::finalize(" +
         (rows_per_block_ > 1 ? "fb_warp_reduce<" + op + ">(acc)" : "fb_block_reduce<" + op + ">(acc, fb_red)") +
         ", W);\n      }\n";
    value_cached_.merge(value_stored_);  // stored by this pass: later bodies read them
    return s;
  }

  /// Row cache: the values a reduction pass keeps in registers for later passes, as the schedule
  /// says (schedule/row_values.hpp: keep::registers).
  void plan_value_cache() {
    for (std::size_t g = 0; g < N; ++g)
      if (member(static_cast<int>(g)) && s_.keep_in[g] == schedule::keep::registers) value_cache_.insert(static_cast<int>(g));
  }
  std::string value_cache_decl() {
    std::string s;
    for (int g : value_cache_) s += "    float c" + L(g) + "[FB_K][VEC];\n";
    return s;
  }

  /// Whether this row kernel keeps its operands' rows in registers, and its geometry: the
  /// schedule's (schedule/row_values.hpp; the source is written for one block size).
  void plan_row_cache() {
    if (ks_.registers.threads == 0) return;
    row_cache_ = true;
    block_threads_ = ks_.registers.threads;
    rows_per_block_ = ks_.registers.rows_per_block;
  }

  /// The loop over this thread's chunks of the row: strided by the block, or (row cache) an
  /// unrolled loop over its FB_K register slots.
  std::string row_loop_head() const {
    if (!row_cache_)
      return "for (unsigned long long j = threadIdx.x * static_cast<unsigned long long>(VEC); j < W; j += blockDim.x * "
             "static_cast<unsigned long long>(VEC))";
    return "#pragma unroll\n    for (unsigned long long kk = 0; kk < FB_K; ++kk) if (const unsigned long long j = (kk * "
           "FB_BLOCK + fb_t) * VEC; j < W)";
  }

  /// Whether an operand differs from row to row (some extent other than 1 before its last).
  static bool varies_by_row(const ir::node& nd) {
    for (std::size_t d = 0; d + 1 < nd.desc.shape.rank; ++d)
      if (nd.desc.shape.extent[d] != 1) return true;
    return false;
  }

  /// Row cache: each cached operand's slice of the row into registers `<prefix><local>`, with
  /// the row pointers in scope.
  std::string row_loads(const std::string& prefix, const std::string& in) {
    std::string s;
    for (int g : row_cached_)
      s += in + "#pragma unroll\n" + in + "for (unsigned long long kk = 0; kk < FB_K; ++kk) {\n" + in +
           "  const unsigned long long j = (kk * FB_BLOCK + fb_t) * VEC;\n" + in + "  if (j < W) fb_load<VEC>(" +
           ptr(g) + " + j, " + prefix + L(g) + "[kk]);\n" + in + "}\n";
    return s;
  }
  std::string row_cache_decl(const std::string& prefix, const std::string& in) {
    std::string s;
    for (int g : row_cached_) s += in + "float " + prefix + L(g) + "[FB_K][VEC];\n";
    return s;
  }

  /// Row cache, software-pipelined: a block loads the next row it will process (r + gridDim.x)
  /// into a second set of registers before working on this one, so its loads are in flight
  /// during this row's reductions (without it the memory pipe idles while a block reduces:
  /// W2 ran at 44% of the copy bandwidth).
  std::string row_prefetch_first() {
    if (!row_cache_) return "";
    return row_cache_decl("n", "  ") + "  if (fb_first < rows) {\n    const unsigned long long r = fb_first;\n" +
           coordinates("r", "    ") + pointers("    ") + row_loads("n", "    ") + "  }\n";
  }
  std::string row_prefetch_next() {
    if (!row_cache_) return "";
    std::string s = row_cache_decl("x", "    ");
    for (int g : row_cached_)
      s += "#pragma unroll\n    for (int kk = 0; kk < FB_K; ++kk)\n#pragma unroll\n      for (int v = 0; v < VEC; ++v) x" +
           L(g) + "[kk][v] = n" + L(g) + "[kk][v];\n";
    return s + "    if (r + fb_step < rows) {\n      const unsigned long long r_next = r + fb_step;\n      {\n" +
           "        const unsigned long long r = r_next;\n" + coordinates("r", "        ") + pointers("        ") +
           row_loads("n", "        ") + "      }\n    }\n";
  }

  /// Rows with reduction passes: one block per row.
  std::string row_blocks() {
    plan_value_cache();
    std::string steps;
    for (std::size_t g = 0; g < N; ++g) {
      if (!member(static_cast<int>(g))) continue;
      if (nodes_[g].desc.kind == node_kind::reduce) steps += reduction_pass(static_cast<int>(g));
      else if (p_.row_constant[g]) steps += row_scalars_one(static_cast<int>(g));
    }
    preloads pre;
    bool any = false;
    const std::string out = output_body(pre, any);
    const std::string souts = scalar_outputs("        ");
    std::string s = "template <int VEC>\n__device__ __forceinline__ void fb_body(const fb_args& a) {\n" + prologue();
    s += "  __shared__ float fb_red[32];\n";
    if (row_cache_)
      s += "  constexpr unsigned long long FB_BLOCK = " + std::to_string(block_threads_) +
           ", FB_K = (" + std::to_string(k_.space.back(0)) + "ull + VEC * FB_BLOCK - 1) / (VEC * FB_BLOCK);\n";
    // fb_t: the thread's place in its row; rows_per_block_ rows a block, FB_BLOCK threads each.
    const std::string per = std::to_string(rows_per_block_);
    s += row_cache_ ? "  const unsigned fb_t = threadIdx.x % FB_BLOCK;\n  const unsigned long long fb_first = blockIdx.x * " +
                          per + "ull + threadIdx.x / FB_BLOCK, fb_step = static_cast<unsigned long long>(gridDim.x) * " +
                          per + "ull;\n"
                    : "  const unsigned fb_t = threadIdx.x;\n  const unsigned long long fb_first = blockIdx.x, fb_step = gridDim.x;\n  (void)fb_t;\n";
    s += row_prefetch_first();
    s += "  for (unsigned long long r = fb_first; r < rows; r += fb_step) {\n" + coordinates("r", "    ") +
         pointers("    ");
    s += "    float rs[" + std::to_string(locals_.size() + 1) + "];\n    (void)rs;\n" + row_prefetch_next() + value_cache_decl() + steps;
    if (any)
      s += "    " + row_loop_head() + " {\n" + indent(pre.text + outs_decl_, "      ") +
           "#pragma unroll\n      for (int v = 0; v < VEC; ++v) {\n" + indent(out, "      ") + "      }\n" +
           indent(outs_store_, "      ") + "    }\n";
    if (!souts.empty()) s += "    if (fb_t == 0) {\n" + souts + "    }\n";
    s += "  }\n}\n" + entry_points();
    summary_ = "row reduction over " + to_string(k_.space) + ", " + std::to_string(k_.passes) + " pass(es), " +
               (rows_per_block_ > 1 ? "a warp per row, " + per + " rows a block" : std::string("block per row"));
    return s;
  }

  std::string row_scalars_one(int g) {
    body b(cuda_language());
    preloads pre;
    const ir::node& nd = nodes_[g];
    std::vector<std::string> args;
    for (int q = 0; q < nd.n_inputs; ++q) args.push_back(value(b, nd.inputs[q], pre));
    std::string call = op_function(nd) + "(";
    for (std::size_t i = 0; i < args.size(); ++i) call += (i ? ", " : "") + args[i];
    return "      {\n        const int v = 0; const unsigned long long j = 0; (void)v; (void)j;\n" + indent(pre.text, "        ") +
           b.text("        ") + "        rs[" + L(g) + "] = " + call + ");\n      }\n";
  }

  /// Column reduction. A block of cols_block_ threads takes cols_block_ / S consecutive outputs
  /// (column j of output row o); the S threads of an output (its slices) each accumulate every
  /// S-th index of the reduced axis in order, and the S partials combine as a fixed binary tree.
  /// S is a literal of the source, so the result does not depend on the grid, and bfloat16
  /// outputs are rounded once. One thread walking the whole axis was latency-bound: W5's bias
  /// gradients ([256, 4096] summed over 256 rows, 4096 threads) took 95 us for 4 MB.
  std::string reduce_cols() {
    const int r_id = k_.node;
    const ir::node& rn = nodes_[r_id];
    const std::string op = op_function(rn);
    const std::size_t axis = static_cast<std::size_t>(rn.desc.axis);
    // S: up to 32 slices, each of at least 8 indices where the axis is known; 8 where it is not.
    // (S = 8 left W5's [256, 4096] bias gradients at 128 blocks: 12.8 us for 4 MB.)
    const std::size_t extent = k_.space.extent[axis];
    cols_slices_ = 8;
    if (is_known_extent(extent)) {
      cols_slices_ = 32;
      while (cols_slices_ > 1 && extent < 8 * cols_slices_) cols_slices_ /= 2;
    }
    body b(cuda_language());
    preloads pre;
    const std::string v = value(b, rn.inputs[0], pre);
    for (std::size_t g = 0; g < N; ++g)
      if (member(static_cast<int>(g)) && p_.materialised[g] && nodes_[g].desc.kind == node_kind::pointwise)
        b.statement(ptr(static_cast<int>(g), true) + "[static_cast<long long>(j) * " + inner_stride(static_cast<int>(g)) +
                    "] = fb_from_float<T>(" + value(b, static_cast<int>(g), pre) + ");");
    const std::string po = ptr(r_id, true);
    const std::string ea = "E" + std::to_string(axis), ia = "i" + std::to_string(axis);
    std::string s = "template <int VEC>\n__device__ __forceinline__ void fb_body(const fb_args& a) {\n" + prologue();
    s += "  constexpr unsigned FB_S = " + std::to_string(cols_slices_) + ", FB_C = " + std::to_string(cols_block_) +
         " / FB_S;\n  __shared__ float fb_part[" + std::to_string(cols_block_) + "];\n";
    s += "  const unsigned fb_lane = threadIdx.x % FB_C, fb_slice = threadIdx.x / FB_C;\n  const int v = 0; (void)v;\n";
    s += "  const unsigned long long outs = rows / " + ea + " * W;\n";
    // The tile loop is uniform across the block (it holds __syncthreads).
    s += "  for (unsigned long long base = blockIdx.x * static_cast<unsigned long long>(FB_C); base < outs;\n"
         "       base += static_cast<unsigned long long>(gridDim.x) * FB_C) {\n";
    s += "    const unsigned long long t = base + fb_lane;\n    const bool live = t < outs;\n";
    s += "    const unsigned long long j = live ? t % W : 0, o = live ? t / W : 0;\n";
    s += "    float acc = " + op + "::identity();\n    T* out = nullptr;\n";
    s += "    if (live)\n      for (unsigned long long " + ia + " = fb_slice; " + ia + " < " + ea + "; " + ia + " += FB_S) {\n"
         "        unsigned long long q_ = o;\n";
    for (std::size_t d = k_.space.rank - 1; d-- > 0;)
      if (d != axis)
        s += "        const unsigned long long i" + std::to_string(d) + " = q_ % E" + std::to_string(d) + "; q_ /= E" +
             std::to_string(d) + ";\n";
    s += "        (void)q_;\n" + pointers("        ");
    s += indent(pre.text, "        ") + b.text("        ") + "        acc = " + op + "::combine(acc, " + v + ");\n";
    s += "        out = " + po + " + static_cast<long long>(j) * " + inner_stride(r_id) + ";\n      }\n";
    // The partials combine as a fixed tree over the slices (S is a power of two).
    s += "    fb_part[threadIdx.x] = acc;\n    __syncthreads();\n";
    s += "    for (unsigned w = FB_S / 2; w > 0; w /= 2) {\n"
         "      if (fb_slice < w) fb_part[threadIdx.x] = " + op + "::combine(fb_part[threadIdx.x], fb_part[threadIdx.x + w * FB_C]);\n"
         "      __syncthreads();\n    }\n";
    // Slice 0 visits index 0 of the axis first, so its `out` is set whenever the axis is not empty.
    s += "    if (live && fb_slice == 0 && out) *out = fb_from_float<T>(" + op + "::finalize(fb_part[fb_lane], " + ea + "));\n"
         "    __syncthreads();\n  }\n}\n";
    s += "extern \"C\" __global__ void fusebox_kernel_w(const fb_args a) { fb_body<1>(a); }\n"
         "extern \"C\" __global__ void fusebox_kernel(const fb_args a) { fb_body<1>(a); }\n"
         "extern \"C\" __global__ void fusebox_kernel_v1(const fb_args a) { fb_body<1>(a); }\n";
    summary_ = std::string("column ") + rn.desc.name + " over " + to_string(k_.space) + ", " +
               std::to_string(cols_slices_) + " thread(s) per column";
    return s;
  }

  const std::array<ir::node, N>& nodes_;
  const plan::plan_t<N>& p_;
  const plan::kernel k_;
  dtype t_;
  const std::array<bool, N>& unit_inner_;
  const schedule::schedule_t<N>& s_;
  const schedule::kernel_schedule& ks_;
  const bool merged_;  ///< an elementwise kernel whose space the host merges per call (schedule::kernel_schedule)
  std::array<int, N> local_of_{};
  std::vector<int> locals_;
  std::array<std::string, N> pointer_decl_{};
  std::vector<int> pointer_order_;
  std::set<int> unit_, row_cached_;
  std::set<int> value_cache_, value_stored_, value_cached_;  // values kept in registers; stored by this pass; by earlier ones
  bool row_cache_ = false;
  unsigned block_threads_ = 0;   ///< threads per row (row cache)
  unsigned rows_per_block_ = 1;
  unsigned cols_block_ = 256;  ///< reduce_cols: threads per block
  unsigned cols_slices_ = 1;   ///< reduce_cols: threads sharing one output (S)
  std::set<std::string> defined_;
  std::string functions_, outs_decl_, outs_store_, summary_;
};

}  // namespace detail

/// The CUDA back end's capabilities for a storage type (schedule/schedule.hpp).
FUSEBOX_RUNTIME_API schedule::backend_caps cuda_caps_for(dtype storage);

/// Renders kernel k of plan p as CUDA (kinds rows, reduce_cols, and matmul epilogues; the
/// product of a matmul and other kinds run through the host side) as schedule `s` says.
/// `unit_inner[g]`: memory node g has inner stride 1 at run time.
template <std::size_t N>
rendered_cuda_kernel render_cuda_kernel(const std::array<ir::node, N>& nodes, const plan::plan_t<N>& p, int k, dtype t,
                                        const std::array<bool, N>& unit_inner, const schedule::schedule_t<N>& s) {
  return detail::cuda_codegen<N>(nodes, p, k, t, unit_inner, s).render();
}
/// ... with the schedule made here for this storage type.
template <std::size_t N>
rendered_cuda_kernel render_cuda_kernel(const std::array<ir::node, N>& nodes, const plan::plan_t<N>& p, int k, dtype t,
                                        const std::array<bool, N>& unit_inner) {
  return render_cuda_kernel(nodes, p, k, t, unit_inner, schedule::make_schedule(nodes, p, unit_inner, cuda_caps_for(t)));
}

#ifdef FUSEBOX_RUNTIME_INSTANCE  // compiled once where a program asks for it (core/linkage.hpp)
FUSEBOX_RUNTIME_INSTANCE class detail::cuda_codegen<16>;
FUSEBOX_RUNTIME_INSTANCE class detail::cuda_codegen<32>;
FUSEBOX_RUNTIME_INSTANCE class detail::cuda_codegen<64>;
FUSEBOX_RUNTIME_INSTANCE class detail::cuda_codegen<128>;
#endif

// Definitions: compiled here, or once in the FUSEBOX_IMPLEMENTATION unit (core/linkage.hpp).
#if FUSEBOX_RUNTIME_BODIES
FUSEBOX_RUNTIME_API const std::string& cuda_prelude() {
  static const std::string s = R"(// fusebox CUDA prelude
struct fb_bf16 { unsigned short bits; };
struct fb_f16 { unsigned short bits; };
__device__ __forceinline__ float fb_to_float(float x) { return x; }
__device__ __forceinline__ float fb_to_float(fb_bf16 x) { return __uint_as_float(static_cast<unsigned>(x.bits) << 16); }
__device__ __forceinline__ float fb_to_float(fb_f16 x) {
  float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(x.bits)); return f;
}
template <class T> __device__ __forceinline__ T fb_from_float(float x);
template <> __device__ __forceinline__ float fb_from_float<float>(float x) { return x; }
template <> __device__ __forceinline__ fb_bf16 fb_from_float<fb_bf16>(float x) {
  unsigned short h; asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(x)); return fb_bf16{h};
}
template <> __device__ __forceinline__ fb_f16 fb_from_float<fb_f16>(float x) {
  unsigned short h; asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(x)); return fb_f16{h};
}
struct __align__(16) fb_vec16 { unsigned int w[4]; };
/// VEC consecutive elements at p as floats: 16-byte loads when VEC * sizeof(T) is a multiple of 16.
template <int VEC, class T>
__device__ __forceinline__ void fb_load(const T* p, float (&out)[VEC]) {
  if constexpr (VEC * sizeof(T) % 16 == 0) {
    constexpr int per = 16 / sizeof(T);
#pragma unroll
    for (int c = 0; c < VEC / per; ++c) {
      const fb_vec16 v = *reinterpret_cast<const fb_vec16*>(p + c * per);
      const T* e = reinterpret_cast<const T*>(&v);
#pragma unroll
      for (int i = 0; i < per; ++i) out[c * per + i] = fb_to_float(e[i]);
    }
  } else {
#pragma unroll
    for (int i = 0; i < VEC; ++i) out[i] = fb_to_float(p[i]);
  }
}
template <int VEC, class T>
__device__ __forceinline__ void fb_store(T* p, const float (&in)[VEC]) {
  if constexpr (VEC * sizeof(T) % 16 == 0) {
    constexpr int per = 16 / sizeof(T);
#pragma unroll
    for (int c = 0; c < VEC / per; ++c) {
      fb_vec16 v;
      T* e = reinterpret_cast<T*>(&v);
#pragma unroll
      for (int i = 0; i < per; ++i) e[i] = fb_from_float<T>(in[c * per + i]);
      *reinterpret_cast<fb_vec16*>(p + c * per) = v;
    }
  } else {
#pragma unroll
    for (int i = 0; i < VEC; ++i) p[i] = fb_from_float<T>(in[i]);
  }
}
/// Combines one value per lane across the warp; every lane gets the result.
template <class Op>
__device__ __forceinline__ float fb_warp_reduce(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = Op::combine(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
/// Combines one value per thread across the block; every thread gets the result. `red` holds
/// one word per warp; the barrier on entry keeps a previous reduction's readers safe.
template <class Op>
__device__ __forceinline__ float fb_block_reduce(float v, float* red) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = Op::combine(v, __shfl_xor_sync(0xffffffffu, v, o));
  const unsigned warp = threadIdx.x >> 5, lane = threadIdx.x & 31u, warps = (blockDim.x + 31u) >> 5;
  __syncthreads();
  if (lane == 0) red[warp] = v;
  __syncthreads();
  v = lane < warps ? red[lane] : Op::identity();
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = Op::combine(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
)";
  return s;
}

FUSEBOX_RUNTIME_API const char* cuda_storage_name(dtype t) {
  switch (t) {
    case dtype::f32: return "float";
    case dtype::bf16: return "fb_bf16";
    case dtype::f16: return "fb_f16";
    default: FUSEBOX_THROW(invalid_argument(std::string("fusebox: the CUDA backend stores float32, bfloat16 or float16, not ") + name(t)));
  }
}

FUSEBOX_RUNTIME_API schedule::backend_caps cuda_caps_for(dtype storage) {
  schedule::backend_caps c = schedule::cuda_caps;
  c.rows.element_bytes = size_of(storage);
  return c;
}
#endif

}  // namespace fusebox::jit
