// fusebox/backend/cuda/cudnn_attention.hpp: cuDNN's fused (flash) attention for one problem, built as a
// cuDNN operation graph: the alternative that max_autotune times against fusebox's own attention
// kernel (backend/cuda/attention_choice.hpp).
//
// The graph is the pattern cuDNN's fused-attention engines match (cuDNN 9.14 on an H100 offers
// five configurations of two engines for W4's problem):
//     S = Q·Kᵀ (float) → S·scale → causal: select(row ≥ column, S, -inf) → softmax as
//     m = max(S), E = exp(S - m), l = sum(E), stats = m + log(l) (virtual), P = E / l (storage type)
//     → O = P·V
// cuDNN's engines refuse it without the statistics (measured: no engine) and with P in float.
// Q, K, V and O are strided views in fusebox's attention layout [batch, token, head, dim]; cuDNN
// takes them as [batch, head, token, dim] with the same strides (so W4's packed qkv projection is
// read in place, as torch's cuDNN path does), and Kᵀ as [batch, head, dim, token].
//
// Where cuDNN runs it: 16-bit storage (bfloat16, float16), unit stride along the head dim, every
// other stride a multiple of 8 elements and every pointer 16-byte aligned (`run` refuses other
// pointers, and the caller runs its own kernel). The causal mask is the one of fusebox's attention
// (key j ≤ query i, as many queries as keys).
//
// Cost: finalising a configuration compiles its kernel (0.36-1.1 s measured on an H100 for W4's
// problem; cuDNN caches it for the process, ~65 ms for the same graph again).
//
// Depends on: the C++20 standard library, fusebox/backend/cuda/{cudnn,memory,driver}.hpp,
// fusebox/core/linkage.hpp.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <deque>
#include <limits>
#include <mutex>
#include <string>
#include <vector>

#include "fusebox/backend/cuda/cudnn.hpp"
#include "fusebox/backend/cuda/driver.hpp"
#include "fusebox/backend/cuda/memory.hpp"
#include "fusebox/core/errors.hpp"
#include "fusebox/core/linkage.hpp"

namespace fusebox::cuda {

/// One attention problem: storage type, extents, causality and the element strides of q, k, v, o
/// along (batch, token, head, dim).
struct cudnn_attention_problem {
  bool bf16 = true;  // else float16
  std::int64_t batch = 0, heads = 0, tq = 0, tk = 0, e = 0, ev = 0;
  bool causal = false;
  std::int64_t q[4] = {}, k[4] = {}, v[4] = {}, o[4] = {};

  /// Whether cuDNN can take it at all (before asking its heuristic): see the file comment.
  bool supported() const;

  /// A text naming the problem completely (a tuner's key).
  std::string key() const;
};

class cudnn_attention {
 public:
  /// Builds the operation graph and asks cuDNN's heuristic for its configurations; throws
  /// cudnn_error where cuDNN cannot express or finalise the graph.
  explicit cudnn_attention(const cudnn_attention_problem& p);

  cudnn_attention(const cudnn_attention&) = delete;
  cudnn_attention& operator=(const cudnn_attention&) = delete;

  const cudnn_attention_problem& problem() const { return problem_; }

  /// The heuristic's configurations, best first by its own model (none: cuDNN cannot run it).
  std::size_t candidates() const { return configs_.size(); }

  /// Makes configuration i the one `run` uses: finalises its execution plan (compiling its kernel)
  /// the first time and sizes the workspace. Throws cudnn_error if cuDNN cannot build it. Never
  /// during a stream capture (it may allocate). A plan once built is kept: finalising the same
  /// configuration a second time failed inside cuDNN 9.14 (its runtime compilation, H100), and
  /// the tuner comes back to its winner after timing the others.
  void use(std::size_t i);

  /// Releases the plans of every configuration but the chosen one (after a tuner has decided).
  void drop_others();

  /// The configuration in use (-1: none yet).
  int chosen() const { return chosen_; }

  /// Queues O = attention(Q, K, V) on `on` with the chosen configuration; false (nothing queued)
  /// where a pointer is not 16-byte aligned, which the graph's tensors promise.
  bool run(CUdeviceptr q, CUdeviceptr k, CUdeviceptr v, CUdeviceptr o, CUstream on);

 private:
  static constexpr std::int64_t uid_q = 1, uid_k = 2, uid_v = 3, uid_o = 4, uid_scale = 5, uid_mask = 6;

  std::int64_t tensor(std::int64_t uid, int type, const std::vector<std::int64_t>& dims,
                      const std::vector<std::int64_t>& strides, bool is_virtual = false, bool by_value = false);
  cudnnBackendDescriptor_t tensor_of(std::int64_t uid) const;
  cudnn_descriptor& keep(int type) { return kept_.emplace_back(type); }

  /// y = mode(x[, b][, t]) (t: binary_select's condition; axis: gen_index's).
  cudnnBackendDescriptor_t pointwise(int mode, int precision, std::int64_t x, std::int64_t b, std::int64_t y,
                                     std::int64_t t = 0, std::int64_t axis = -1);
  cudnnBackendDescriptor_t reduction(int how, std::int64_t x, std::int64_t y);
  cudnnBackendDescriptor_t matmul(std::int64_t a, std::int64_t b, std::int64_t c);
  void set_tensor(cudnn_descriptor& op, int name, std::int64_t uid) {
    const cudnnBackendDescriptor_t t = tensor_of(uid);
    op.set(name, cudnn_enum::type_backend_descriptor, 1, &t);
  }

  cudnn_attention_problem problem_;
  float scale_, mask_ = -std::numeric_limits<float>::infinity();
  std::int64_t next_virtual_ = 100;
  std::deque<cudnn_descriptor> kept_;  // tensors and operations (the graph refers to them); a deque keeps references
  std::vector<std::pair<std::int64_t, cudnnBackendDescriptor_t>> tensors_;
  cudnn_descriptor graph_;
  std::vector<cudnn_descriptor> configs_;
  std::vector<cudnn_descriptor> plans_;  // per configuration, built by use()
  std::mutex mutex_;                     // pack_, bound_, workspace_, chosen_
  cudnn_descriptor pack_;
  CUdeviceptr bound_[4] = {};
  device_buffer workspace_;
  int chosen_ = -1;
};

// Definitions: compiled here, or once in the FUSEBOX_IMPLEMENTATION unit (core/linkage.hpp).
#if FUSEBOX_RUNTIME_BODIES
FUSEBOX_RUNTIME_API bool cudnn_attention_problem::supported() const {
  const std::int64_t* all[] = {q, k, v, o};
  for (const std::int64_t* s : all) {
    if (s[3] != 1) return false;
    for (int d = 0; d < 3; ++d)
      if (s[d] % 8 != 0) return false;
  }
  return e % 8 == 0 && ev % 8 == 0 && e <= 256 && ev <= 256 && batch > 0 && heads > 0 && tq > 0 && tk > 0 &&
         (!causal || tq == tk);
}

FUSEBOX_RUNTIME_API std::string cudnn_attention_problem::key() const {
  std::string s = std::string(bf16 ? "bf16" : "f16") + " b" + std::to_string(batch) + " h" + std::to_string(heads) +
                  " tq" + std::to_string(tq) + " tk" + std::to_string(tk) + " e" + std::to_string(e) + " ev" +
                  std::to_string(ev) + (causal ? " causal" : "") + " strides";
  for (const std::int64_t* st : {q, k, v, o})
    for (int d = 0; d < 4; ++d) s += " " + std::to_string(st[d]);
  return s;
}

FUSEBOX_RUNTIME_API cudnn_attention::cudnn_attention(const cudnn_attention_problem& p)
    : problem_(p), scale_(static_cast<float>(1.0 / std::sqrt(static_cast<double>(p.e)))) {
  namespace ce = cudnn_enum;
  const int io = p.bf16 ? ce::data_bfloat16 : ce::data_half;
  const std::int64_t B = p.batch, H = p.heads, TQ = p.tq, TK = p.tk;
  // [b, h, token, dim] with fusebox's strides (batch, head, token, dim order).
  auto bhsd = [](const std::int64_t* s) { return std::vector<std::int64_t>{s[0], s[2], s[1], s[3]}; };
  tensor(uid_q, io, {B, H, TQ, p.e}, bhsd(p.q));
  tensor(uid_k, io, {B, H, p.e, TK}, {p.k[0], p.k[2], p.k[3], p.k[1]});  // Kᵀ: dim before token
  tensor(uid_v, io, {B, H, TK, p.ev}, bhsd(p.v));
  tensor(uid_o, io, {B, H, TQ, p.ev}, bhsd(p.o));
  tensor(uid_scale, ce::data_float, {1, 1, 1, 1}, {1, 1, 1, 1}, false, true);
  if (p.causal) tensor(uid_mask, ce::data_float, {1, 1, 1, 1}, {1, 1, 1, 1}, false, true);
  const std::vector<std::int64_t> sd{B, H, TQ, TK}, ss{H * TQ * TK, TQ * TK, TK, 1}, rd{B, H, TQ, 1},
      rs{H * TQ, TQ, 1, 1};
  auto scores = [&](int type = ce::data_float) { return tensor(next_virtual_++, type, sd, ss, true); };
  auto per_row = [&] { return tensor(next_virtual_++, ce::data_float, rd, rs, true); };

  std::vector<cudnnBackendDescriptor_t> ops;
  const std::int64_t s0 = scores();
  ops.push_back(matmul(uid_q, uid_k, s0));
  std::int64_t s = scores();
  ops.push_back(pointwise(ce::pw_mul, ce::data_float, s0, uid_scale, s));
  if (p.causal) {
    const std::int64_t row = scores(), col = scores(), keep = scores(ce::data_boolean), masked = scores();
    ops.push_back(pointwise(ce::pw_gen_index, ce::data_float, s, 0, row, 0, 2));
    ops.push_back(pointwise(ce::pw_gen_index, ce::data_float, s, 0, col, 0, 3));
    ops.push_back(pointwise(ce::pw_cmp_ge, ce::data_boolean, row, col, keep));
    ops.push_back(pointwise(ce::pw_binary_select, ce::data_float, s, uid_mask, masked, keep));
    s = masked;
  }
  const std::int64_t m = per_row(), centred = scores(), e = scores(), l = per_row(), log_l = per_row(),
                     stats = per_row(), probs = scores(io);
  ops.push_back(reduction(ce::reduce_max, s, m));
  ops.push_back(pointwise(ce::pw_sub, ce::data_float, s, m, centred));
  ops.push_back(pointwise(ce::pw_exp, ce::data_float, centred, 0, e));
  ops.push_back(reduction(ce::reduce_add, e, l));
  ops.push_back(pointwise(ce::pw_log, ce::data_float, l, 0, log_l));
  ops.push_back(pointwise(ce::pw_add, ce::data_float, m, log_l, stats));
  ops.push_back(pointwise(ce::pw_div, ce::data_float, e, l, probs));
  ops.push_back(matmul(probs, uid_v, uid_o));

  cudnn_context& ctx = cudnn_handle();
  graph_ = cudnn_descriptor(ce::operationgraph_descriptor);
  graph_.set(ce::operationgraph_ops, ce::type_backend_descriptor, static_cast<std::int64_t>(ops.size()), ops.data());
  graph_.set(ce::operationgraph_handle, ce::type_handle, 1, &ctx.handle);
  graph_.finalize("cudnnBackendFinalize (attention operation graph)");

  cudnn_descriptor heuristic(ce::engineheur_descriptor);
  const int mode = ce::heur_mode_a;
  heuristic.set(ce::engineheur_operation_graph, graph_).set(ce::engineheur_mode, ce::type_heur_mode, 1, &mode);
  heuristic.finalize("cudnnBackendFinalize (engine heuristic)");
  std::int64_t count = 0;
  cudnn_check(cudnn().get_attribute(heuristic.get(), ce::engineheur_results, ce::type_backend_descriptor, 0, &count,
                                    nullptr),
              "cudnnBackendGetAttribute (heuristic results)");
  std::vector<cudnnBackendDescriptor_t> raw;
  for (std::int64_t i = 0; i < count; ++i) {
    configs_.emplace_back(ce::enginecfg_descriptor);
    raw.push_back(configs_.back().get());
  }
  std::int64_t got = 0;
  if (count > 0)
    cudnn_check(cudnn().get_attribute(heuristic.get(), ce::engineheur_results, ce::type_backend_descriptor, count,
                                      &got, raw.data()),
                "cudnnBackendGetAttribute (heuristic results)");
  configs_.resize(static_cast<std::size_t>(got));
  plans_.resize(configs_.size());
}

FUSEBOX_RUNTIME_API void cudnn_attention::use(std::size_t i) {
  namespace ce = cudnn_enum;
  if (!plans_.at(i)) {
    cudnn_context& ctx = cudnn_handle();
    cudnn_descriptor plan(ce::execution_plan_descriptor);
    plan.set(ce::execution_plan_handle, ce::type_handle, 1, &ctx.handle)
        .set(ce::execution_plan_engine_config, configs_[i]);
    plan.finalize("cudnnBackendFinalize (attention execution plan)");
    plans_[i] = std::move(plan);
  }
  std::int64_t bytes = 0, n = 0;
  cudnn_check(
      cudnn().get_attribute(plans_[i].get(), ce::execution_plan_workspace_size, ce::type_int64, 1, &n, &bytes),
      "cudnnBackendGetAttribute (workspace size)");
  std::lock_guard lock(mutex_);
  if (bytes > 0) workspace_.ensure(static_cast<std::size_t>(bytes));
  pack_ = cudnn_descriptor();  // the workspace may have moved
  chosen_ = static_cast<int>(i);
}

FUSEBOX_RUNTIME_API void cudnn_attention::drop_others() {
  for (std::size_t i = 0; i < plans_.size(); ++i)
    if (static_cast<int>(i) != chosen_) plans_[i] = cudnn_descriptor();
}

FUSEBOX_RUNTIME_API bool cudnn_attention::run(CUdeviceptr q, CUdeviceptr k, CUdeviceptr v, CUdeviceptr o, CUstream on) {
  namespace ce = cudnn_enum;
  if (chosen_ < 0) FUSEBOX_THROW(invalid_argument("fusebox: cudnn_attention::run before use()"));
  if ((q | k | v | o) % 16 != 0) return false;
  cudnn_context& ctx = cudnn_handle();
  std::lock_guard lock(mutex_);
  const CUdeviceptr now[4] = {q, k, v, o};
  if (!pack_ || !std::equal(now, now + 4, bound_)) {  // a variant pack per set of addresses
    std::copy(now, now + 4, bound_);
    // The pack names exactly the graph's non-virtual tensors: the mask value only with the mask
    // (an extra id fails the pack's check with BAD_PARAM_NULL_POINTER, cuDNN 9.14).
    const std::int64_t uids[] = {uid_q, uid_k, uid_v, uid_o, uid_scale, uid_mask};
    void* pointers[] = {reinterpret_cast<void*>(q), reinterpret_cast<void*>(k), reinterpret_cast<void*>(v),
                        reinterpret_cast<void*>(o), &scale_, &mask_};
    const std::int64_t count = problem_.causal ? 6 : 5;
    void* workspace = reinterpret_cast<void*>(workspace_.get());
    cudnn_descriptor pack(ce::variant_pack_descriptor);
    pack.set(ce::variant_pack_unique_ids, ce::type_int64, count, uids)
        .set(ce::variant_pack_data_pointers, ce::type_void_ptr, count, pointers)
        .set(ce::variant_pack_workspace, ce::type_void_ptr, 1, &workspace);
    pack.finalize("cudnnBackendFinalize (variant pack)");
    pack_ = std::move(pack);
  }
  std::lock_guard use_handle(ctx.mutex);
  cudnn_check(cudnn().set_stream(ctx.handle, on), "cudnnSetStream");
  const cudnnBackendDescriptor_t plan = plans_[static_cast<std::size_t>(chosen_)].get();
  cudnn_check(cudnn().execute(ctx.handle, plan, pack_.get()), "cudnnBackendExecute (attention)");
  return true;
}

FUSEBOX_RUNTIME_API std::int64_t cudnn_attention::tensor(std::int64_t uid, int type,
                                                         const std::vector<std::int64_t>& dims,
                                                         const std::vector<std::int64_t>& strides, bool is_virtual,
                                                         bool by_value) {
  namespace ce = cudnn_enum;
  cudnn_descriptor& t = keep(ce::tensor_descriptor);
  const bool v = is_virtual, b = by_value;
  t.set_data_type(ce::tensor_data_type, type)
      .set(ce::tensor_dimensions, ce::type_int64, static_cast<std::int64_t>(dims.size()), dims.data())
      .set(ce::tensor_strides, ce::type_int64, static_cast<std::int64_t>(strides.size()), strides.data())
      .set(ce::tensor_unique_id, uid)
      .set(ce::tensor_byte_alignment, std::int64_t{16})
      .set(ce::tensor_is_virtual, ce::type_boolean, 1, &v);
  if (by_value) t.set(ce::tensor_is_by_value, ce::type_boolean, 1, &b);
  t.finalize("cudnnBackendFinalize (tensor)");
  tensors_.push_back({uid, t.get()});
  return uid;
}

FUSEBOX_RUNTIME_API cudnnBackendDescriptor_t cudnn_attention::tensor_of(std::int64_t uid) const {
  for (const auto& [id, d] : tensors_)
    if (id == uid) return d;
  FUSEBOX_THROW(invalid_argument("fusebox: cudnn_attention: no tensor " + std::to_string(uid)));
}

FUSEBOX_RUNTIME_API cudnnBackendDescriptor_t cudnn_attention::pointwise(int mode, int precision, std::int64_t x,
                                                                        std::int64_t b, std::int64_t y,
                                                                        std::int64_t t, std::int64_t axis) {
  namespace ce = cudnn_enum;
  cudnn_descriptor& d = keep(ce::pointwise_descriptor);
  d.set(ce::pointwise_mode, ce::type_pointwise_mode, 1, &mode).set_data_type(ce::pointwise_math_prec, precision);
  if (axis >= 0) d.set(ce::pointwise_axis, axis);
  d.finalize("cudnnBackendFinalize (pointwise)");
  cudnn_descriptor& op = keep(ce::operation_pointwise_descriptor);
  op.set(ce::operation_pointwise_pw_descriptor, d);
  set_tensor(op, ce::operation_pointwise_xdesc, x);
  if (b) set_tensor(op, ce::operation_pointwise_bdesc, b);
  if (t) set_tensor(op, ce::operation_pointwise_tdesc, t);
  set_tensor(op, ce::operation_pointwise_ydesc, y);
  op.finalize("cudnnBackendFinalize (pointwise operation)");
  return op.get();
}

FUSEBOX_RUNTIME_API cudnnBackendDescriptor_t cudnn_attention::reduction(int how, std::int64_t x, std::int64_t y) {
  namespace ce = cudnn_enum;
  cudnn_descriptor& d = keep(ce::reduction_descriptor);
  d.set(ce::reduction_operator, ce::type_reduction_operator, 1, &how)
      .set_data_type(ce::reduction_comp_type, ce::data_float)
      .finalize("cudnnBackendFinalize (reduction)");
  cudnn_descriptor& op = keep(ce::operation_reduction_descriptor);
  set_tensor(op, ce::operation_reduction_xdesc, x);
  set_tensor(op, ce::operation_reduction_ydesc, y);
  op.set(ce::operation_reduction_desc, d).finalize("cudnnBackendFinalize (reduction operation)");
  return op.get();
}

FUSEBOX_RUNTIME_API cudnnBackendDescriptor_t cudnn_attention::matmul(std::int64_t a, std::int64_t b, std::int64_t c) {
  namespace ce = cudnn_enum;
  cudnn_descriptor& d = keep(ce::matmul_descriptor);
  d.set_data_type(ce::matmul_comp_type, ce::data_float).finalize("cudnnBackendFinalize (matmul)");
  cudnn_descriptor& op = keep(ce::operation_matmul_descriptor);
  set_tensor(op, ce::operation_matmul_adesc, a);
  set_tensor(op, ce::operation_matmul_bdesc, b);
  set_tensor(op, ce::operation_matmul_cdesc, c);
  op.set(ce::operation_matmul_desc, d).finalize("cudnnBackendFinalize (matmul operation)");
  return op.get();
}
#endif

}  // namespace fusebox::cuda
