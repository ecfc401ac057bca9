// nn/parameters.hpp: a model's parameters as a named list (torch's named_parameters()): what
// optimizers update and what save/load reads and writes. Entries refer to tensors owned by the
// model (a name, the data pointer, the extents); the list owns nothing, so it stays valid as long
// as the model does and the model's tensors are not reassigned.
//
// Also gradient_views(): the gradients a compiled value_and_grad returns (one tensor or a
// std::tuple of them, in the order of the parameters) as a list an optimizer checks and reads.
// Depends on: core/{tensor,errors}.hpp.
#pragma once

#include <cstddef>
#include <source_location>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include "fusebox/core/errors.hpp"
#include "fusebox/core/tensor.hpp"

namespace fusebox::nn {

/// One parameter: a name ("0.weight", torch's spelling for a Sequential's first Linear) and a
/// contiguous tensor's memory.
template <class T>
struct named_parameter {
  std::string name;
  T* data = nullptr;
  dims shape;
  std::size_t size() const noexcept { return shape.size(); }
};

/// The parameters of a model, in a fixed order (the order of its gradients).
template <class T>
class parameter_list {
 public:
  using value_type = T;

  /// Adds a tensor under `name`. It must be contiguous (a view of other storage would alias) and
  /// the name unused.
  template <class S>
  void add(std::string name, tensor<T, S>& t, std::source_location loc = std::source_location::current()) {
    if (!t.contiguous())
      FUSEBOX_THROW(invalid_argument("fusebox::nn::parameter_list::add: parameter '" + name + "' " + to_string(t.extents()) +
                                     " is a strided view; parameters must own contiguous storage (at " + where(loc) + ")"));
    for (const auto& p : items_)
      if (p.name == name)
        FUSEBOX_THROW(invalid_argument("fusebox::nn::parameter_list::add: the name '" + name + "' is used twice (at " +
                                       where(loc) + ")"));
    items_.push_back({std::move(name), t.data(), t.extents()});
  }

  /// Adds `shape.size()` contiguous elements at `data` that the caller owns (an optimizer's state
  /// buffers, say) under `name`, unused.
  void add(std::string name, T* data, const dims& shape, std::source_location loc = std::source_location::current()) {
    for (const auto& p : items_)
      if (p.name == name)
        FUSEBOX_THROW(invalid_argument("fusebox::nn::parameter_list::add: the name '" + name + "' is used twice (at " +
                                       where(loc) + ")"));
    items_.push_back({std::move(name), data, shape});
  }

  std::size_t size() const noexcept { return items_.size(); }
  const named_parameter<T>& operator[](std::size_t i) const { return items_[i]; }
  auto begin() const noexcept { return items_.begin(); }
  auto end() const noexcept { return items_.end(); }
  /// Elements over every parameter.
  std::size_t numel() const noexcept {
    std::size_t n = 0;
    for (const auto& p : items_) n += p.size();
    return n;
  }
  /// The parameter called `name`, or null.
  const named_parameter<T>* find(const std::string& name) const noexcept {
    for (const auto& p : items_)
      if (p.name == name) return &p;
    return nullptr;
  }
  /// Every parameter of `other` after ours, each name prefixed (how modules nest: "1." + "weight").
  void append(const parameter_list& other, const std::string& prefix = {}) {
    for (const auto& p : other.items_) {
      if (find(prefix + p.name))
        FUSEBOX_THROW(invalid_argument("fusebox::nn::parameter_list::append: the name '" + prefix + p.name + "' is used twice"));
      items_.push_back({prefix + p.name, p.data, p.shape});
    }
  }

 private:
  std::vector<named_parameter<T>> items_;
};

/// A read-only view of one gradient.
template <class T>
struct gradient_view {
  const T* data = nullptr;
  dims shape;
  bool contiguous = true;
};

namespace detail {
template <class T, class S>
void push_gradient(std::vector<gradient_view<T>>& out, const tensor<T, S>& g) {
  out.push_back({g.data(), g.extents(), g.contiguous()});
}
}  // namespace detail

/// Gradients as views: from one tensor, a std::tuple of tensors (what compile(value_and_grad(...,
/// wrt<...>)) returns), or a vector of views (passed through).
template <class T, class G>
std::vector<gradient_view<T>> gradient_views(const G& grads) {
  std::vector<gradient_view<T>> out;
  if constexpr (is_tensor_v<G>) {
    detail::push_gradient(out, grads);
  } else if constexpr (std::is_same_v<G, std::vector<gradient_view<T>>>) {
    out = grads;
  } else {
    std::apply([&](const auto&... g) { (detail::push_gradient(out, g), ...); }, grads);
  }
  return out;
}

}  // namespace fusebox::nn
