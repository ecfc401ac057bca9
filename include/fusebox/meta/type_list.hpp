// meta/type_list.hpp: the few type-level tools the capture and lowering need.
// Kept here (not spread across headers) so the metaprogramming library underneath can change.
// Boost.Hana is used where it reads better (tuples of values); type lists are hand-rolled because
// folding a model graph as one deeply nested hana::tuple is what makes build times explode.
// Depends on: the standard library only.
#pragma once

#include <cstddef>
#include <type_traits>
#include <utility>

/// Whether A and B are one type, without instantiating a template for the pair. Lookups by type in
/// a program's node list compare each node with every other (N^2 pairs for N nodes, ~300 in a
/// GPT-2 block's gradient): a std::is_same_v<A, B> per pair, in a fold, was ~10% of such a unit's
/// compile (docs/benchmarks.md, run AH).
#if defined(__has_builtin)
#if __has_builtin(__is_same)
#define FUSEBOX_SAME_TYPE(A, B) __is_same(A, B)
#endif
#endif
#ifndef FUSEBOX_SAME_TYPE
#define FUSEBOX_SAME_TYPE(A, B) std::is_same_v<A, B>
#endif

namespace fusebox::meta {

template <class... Ts>
struct type_list {
  static constexpr std::size_t size = sizeof...(Ts);
};

template <class L, class T>
struct push_back;
template <class... Ts, class T>
struct push_back<type_list<Ts...>, T> {
  using type = type_list<Ts..., T>;
};

namespace detail {
template <class T>
struct tag {};
template <class... Ts>
struct inherit : tag<Ts>... {};
template <std::size_t I, class T>
struct indexed {
  using type = T;
};
template <class Seq, class... Ts>
struct indexer;
template <std::size_t... I, class... Ts>
struct indexer<std::index_sequence<I...>, Ts...> : indexed<I, Ts>... {};
template <std::size_t I, class T>
indexed<I, T> select(const indexed<I, T>&);
}  // namespace detail

/// Whether T is in the list: one base-class lookup, not a recursive search. The list must not
/// hold duplicates (a class cannot inherit the same base twice).
template <class L, class T>
struct contains;
template <class... Ts, class T>
struct contains<type_list<Ts...>, T> : std::is_base_of<detail::tag<T>, detail::inherit<Ts...>> {};

/// The I-th type of a list, without recursion.
template <std::size_t I, class L>
struct at;
template <std::size_t I, class... Ts>
struct at<I, type_list<Ts...>> {
  using type = typename decltype(detail::select<I>(
      detail::indexer<std::index_sequence_for<Ts...>, Ts...>{}))::type;
};
template <std::size_t I, class L>
using at_t = typename at<I, L>::type;

/// A distinct address per type, usable in constant expressions to compare types as values.
template <class T>
inline constexpr char type_tag = 0;

}  // namespace fusebox::meta
