// optim/multi_tensor.hpp: what every fused optimizer shares. Parameters come in groups (torch's
// param_groups: each group has its own hyperparameters); all parameters of all groups are cut
// into chunks of at most `chunk_elements`, once, at construction, and a step is ONE thread-pool
// pass over that chunk table: each task updates one chunk of one parameter (and its gradient and
// state) in a single SIMD loop, with the scalars of its group. This is torch's "fused" /
// multi_tensor_apply layout on the CPU: no op per tensor, no temporary, every element read and
// written once per step.
//
// Optimizer state (momentum, Adam's moments) is one 64-byte-aligned buffer per kind of state,
// parameters at 64-byte-aligned offsets in it.
//
// The update's scalars (learning rate, step count, bias corrections) are arguments of the pass, not
// part of any compiled program, so a learning-rate schedule changes numbers, never code.
//
// Checks at each step (a clear error, never a silent wrong update): the number of gradients, each
// gradient's extents against its parameter's (naming both, the parameter's name, the optimizer and
// the caller's line), contiguity of each gradient.
// Depends on: nn/parameters.hpp, core/{storage,errors}.hpp, backend/cpu/{simd,thread_pool,evaluate}.hpp.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <source_location>
#include <string>
#include <vector>

#include "fusebox/backend/cpu/evaluate.hpp"
#include "fusebox/backend/cpu/simd.hpp"
#include "fusebox/backend/cpu/thread_pool.hpp"
#include "fusebox/core/errors.hpp"
#include "fusebox/core/storage.hpp"
#include "fusebox/nn/parameters.hpp"

namespace fusebox::optim {

/// Elements a task updates: 64 KiB of floats per operand, so a task streams ~320 KiB (parameter,
/// gradient, two moments read and written) in some microseconds: big enough to hide the
/// pool's hand-out, small enough that two threads split a 200k-element layer evenly.
inline constexpr std::size_t chunk_elements = 16384;

namespace detail {

struct chunk {
  std::uint32_t param;  // index over every parameter of every group
  std::uint32_t group;
  std::size_t begin, end;
};

inline std::size_t round_up(std::size_t n, std::size_t to) { return (n + to - 1) / to * to; }

/// Per-parameter pointers of one step.
template <class T, std::size_t States>
struct bound_param {
  T* param;
  const T* grad;
  T* state[States == 0 ? 1 : States];
};

/// The chunk table, the state buffers and the checks; Derived supplies the per-element update.
template <class T, class Options, std::size_t States>
class multi_tensor {
 public:
  using value_type = T;

  struct group {
    nn::parameter_list<T> params;
    Options options;
    std::uint64_t step = 0;  ///< steps taken by this group (torch's state['step'])
    double initial_lr = 0;   ///< the lr given at construction: what schedulers scale
  };

  std::size_t group_count() const noexcept { return groups_.size(); }
  group& param_group(std::size_t g) { return groups_.at(g); }
  const group& param_group(std::size_t g) const { return groups_.at(g); }
  /// The learning rate of every group (what schedulers set); one group's: param_group(g).options.lr.
  void set_lr(double lr) {
    for (auto& g : groups_) g.options.lr = lr;
  }
  double lr(std::size_t g = 0) const { return groups_.at(g).options.lr; }
  std::size_t parameter_count() const noexcept { return params_.size(); }
  /// State buffer k of parameter i (momentum, exp_avg, ...), as many elements as the parameter.
  T* state(std::size_t k, std::size_t i) { return state_[k].get() ? reinterpret_cast<T*>(state_[k].get()) + offset_[i] : nullptr; }
  const T* state(std::size_t k, std::size_t i) const {
    return state_[k].get() ? reinterpret_cast<const T*>(state_[k].get()) + offset_[i] : nullptr;
  }
  /// Kinds of state per parameter, and parameter i over every group (in order).
  static constexpr std::size_t state_kinds = States;
  const nn::named_parameter<T>& parameter(std::size_t i) const { return params_.at(i); }
  /// The optimizer's name ("adamw", "sgd").
  const char* name() const noexcept { return name_; }
  /// Tasks of one step (the chunk table's size).
  std::size_t tasks() const noexcept { return chunks_.size(); }

 protected:
  multi_tensor(const char* name, unsigned threads) : name_(name), threads_(threads) {}

  void add_group(const nn::parameter_list<T>& params, const Options& o) {
    if (params.size() == 0)
      FUSEBOX_THROW(invalid_argument(std::string("fusebox::optim::") + name_ + ": a parameter group with no parameters"));
    for (const auto& g : groups_)
      if (g.step > 0)
        FUSEBOX_THROW(invalid_argument(std::string("fusebox::optim::") + name_ +
                                       ": add_param_group after a step would reset the optimizer state; add every group first"));
    groups_.push_back({params, o, 0, o.lr});
    const auto g = static_cast<std::uint32_t>(groups_.size() - 1);
    for (const auto& p : params) {
      const auto i = static_cast<std::uint32_t>(params_.size());
      params_.push_back(p);
      group_of_.push_back(g);
      offset_.push_back(total_);
      total_ += round_up(p.size(), storage_alignment / sizeof(T));
      for (std::size_t b = 0; b < p.size(); b += chunk_elements) chunks_.push_back({i, g, b, std::min(p.size(), b + chunk_elements)});
    }
    // State buffers are reallocated (zeroed) when a group is added (only before the first step).
    for (std::size_t k = 0; k < States; ++k) {
      state_[k] = allocate_storage(total_ * sizeof(T));
      std::fill_n(reinterpret_cast<T*>(state_[k].get()), total_, T(0));
    }
  }

  /// Checks the gradients against the parameters and binds the pointers of this step.
  std::vector<bound_param<T, States>> bind(const std::vector<nn::gradient_view<T>>& grads,
                                           const std::source_location& loc) {
    const std::string op = std::string("fusebox::optim::") + name_ + "::step";
    if (grads.size() != params_.size())
      FUSEBOX_THROW(shape_error(op + ": " + std::to_string(grads.size()) + " gradients for " + std::to_string(params_.size()) +
                                    " parameters; pass the gradients of every parameter, in the parameters' order",
                                loc));
    std::vector<bound_param<T, States>> out(params_.size());
    for (std::size_t i = 0; i < params_.size(); ++i) {
      const auto& p = params_[i];
      if (!(grads[i].shape == p.shape))
        FUSEBOX_THROW(shape_error(op + ": gradient " + std::to_string(i) + " is " + to_string(grads[i].shape) + " but parameter " +
                                      std::to_string(i) + " ('" + p.name + "') is " + to_string(p.shape) +
                                      "; gradients must come in the parameters' order with their shapes",
                                  loc));
      if (!grads[i].contiguous || (p.size() > 0 && !grads[i].data))
        FUSEBOX_THROW(invalid_argument(op + ": gradient " + std::to_string(i) + " ('" + p.name +
                                       "') is not contiguous; pass the tensors the gradient call returned (at " + where(loc) + ")"));
      out[i].param = p.data;
      out[i].grad = grads[i].data;
      for (std::size_t k = 0; k < States; ++k) out[i].state[k] = reinterpret_cast<T*>(state_[k].get()) + offset_[i];
    }
    return out;
  }

  /// One pool pass over the chunk table: body(bound_param, group, begin, end) per chunk.
  template <class Body>
  void run(const std::vector<bound_param<T, States>>& bound, Body&& body) {
    auto& pool = cpu::shared_pool(threads_ ? threads_ : default_threads());
    pool.parallel_for(chunks_.size(), [&](std::size_t t, unsigned) {
      const chunk& c = chunks_[t];
      body(bound[c.param], c.group, c.begin, c.end);
    });
  }

  /// The SIMD loop of one chunk: f(V& p, const V& g, V* state) for V = vec<T>, then T for the
  /// tail; the first Used state buffers are loaded and stored.
  template <std::size_t Used = States, class F>
  static void for_elements(const bound_param<T, States>& b, std::size_t begin, std::size_t end, F&& f) {
    using V = cpu::vec<T>;
    constexpr std::size_t W = V::size;
    std::size_t i = begin;
    for (; i + W <= end; i += W) step_at<V, Used>(b, i, f);
    for (; i < end; ++i) step_at<T, Used>(b, i, f);
  }

  std::vector<group> groups_;

 private:
  template <class V, std::size_t Used, class F>
  static void step_at(const bound_param<T, States>& b, std::size_t i, F& f) {
    V p = cpu::load_v<V>(b.param + i);
    const V g = cpu::load_v<V>(b.grad + i);
    V s[States == 0 ? 1 : States];
    for (std::size_t k = 0; k < Used; ++k) s[k] = cpu::load_v<V>(b.state[k] + i);
    f(p, g, s);
    cpu::store_v(b.param + i, p);
    for (std::size_t k = 0; k < Used; ++k) cpu::store_v(b.state[k] + i, s[k]);
  }

  const char* name_;
  unsigned threads_;
  std::vector<nn::named_parameter<T>> params_;  // copies: groups_ may reallocate
  std::vector<std::uint32_t> group_of_;
  std::vector<std::size_t> offset_;
  std::size_t total_ = 0;
  std::vector<chunk> chunks_;
  storage_ptr state_[States == 0 ? 1 : States];
};

/// Throws invalid_argument("fusebox::optim::<name>: invalid <what>: <value> (<rule>)") unless ok.
inline void require(bool ok, const char* name, const char* what, double value, const char* rule) {
  if (!ok)
    FUSEBOX_THROW(invalid_argument(std::string("fusebox::optim::") + name + ": invalid " + what + ": " + std::to_string(value) +
                                   " (" + rule + ")"));
}

}  // namespace detail
}  // namespace fusebox::optim
