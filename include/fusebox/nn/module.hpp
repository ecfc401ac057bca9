// nn/module.hpp: what an nn module is, and the train/eval modes.
//
// A module is a struct that owns its parameters as tensors and describes its computation as a
// static function over *operands* (tensors when run eagerly, input leaves when captured), so one
// forward serves eager runs, compile() and value_and_grad. The parameters enter the computation
// as arguments of the captured function (not as captured constants), which is what lets
// value_and_grad differentiate them and lets one compiled program serve every step while the
// optimizer changes the values in place.
//
//   static constexpr std::size_t param_count;                    tensors in param_refs()
//   template <class Mode> static constexpr std::size_t random_count;   random inputs (dropout masks)
//   auto param_refs();                                           std::tuple<tensor&...>, fixed order
//   void collect(parameter_list<T>& out, const std::string& prefix);   named, torch's names
//   template <class Mode, std::size_t Batch> auto make_randoms(seed, counter, stream) const;
//   template <class Mode, class X, class P, class R>
//   static auto forward(Mode, const X& x, const P& params, const R& randoms);  P, R: tuples of operands
//
// Train and eval modes are types (nn::train, nn::eval), so the mode is part of the captured
// function's type: a compiled train step and a compiled eval forward are different programs, and
// switching mode never reuses the other's plan (torch.compile guards on module.training instead).
// Depends on: the standard library only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <tuple>
#include <type_traits>
#include <utility>

namespace fusebox::nn {

struct train_mode {};
struct eval_mode {};
inline constexpr train_mode train{};
inline constexpr eval_mode eval{};
template <class M>
inline constexpr bool is_train_v = std::is_same_v<M, train_mode>;

/// How modules with parameters are initialised from a seed (sequential passes seed + layer index;
/// layers without parameters are default-constructed).
struct seeded {
  std::uint64_t seed = 0;
};

namespace detail {
/// Elements [Begin, Begin + Count) of a tuple, as a tuple of const references.
template <std::size_t Begin, std::size_t Count, class Tuple>
auto sub_tuple(const Tuple& t) {
  return [&]<std::size_t... I>(std::index_sequence<I...>) {
    return std::tuple<const std::remove_cvref_t<std::tuple_element_t<Begin + I, Tuple>>&...>(std::get<Begin + I>(t)...);
  }(std::make_index_sequence<Count>{});
}
}  // namespace detail

}  // namespace fusebox::nn
