// shape.hpp: extents known at build time or at run time, per dimension.
//
// `shape<64, dyn>` is a type: 64 is a static extent, `dyn` marks an extent known only at run time.
// Code that works on shapes asks `is_static` and never keeps two copies of an algorithm (the CuTe
// rule): a `dims` value carries the same facts as a constexpr array, with `dyn` in place of
// run-time extents, and a `dims` value carries the resolved extents of one tensor at run time.
// Depends on: the standard library only.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>

namespace fusebox {

/// Marks an extent known only at run time.
inline constexpr std::size_t dyn = static_cast<std::size_t>(-1);

/// Symbolic extents of the run-time path: `symbol(k)` stands for the k-th size variable of a
/// specialisation. Values from `symbol_base` up (and `dyn` itself) are not known numbers.
inline constexpr std::size_t symbol_base = dyn - 1024;
constexpr std::size_t symbol(std::size_t k) { return symbol_base + k; }
constexpr bool is_known_extent(std::size_t e) { return e < symbol_base; }

/// The largest rank fusebox handles; keeps run-time shapes in fixed arrays (no heap).
inline constexpr std::size_t max_rank = 6;

/// A shape: one entry per dimension, each a static extent or `dyn`.
template <std::size_t... Extents>
struct shape {
  static constexpr std::size_t rank = sizeof...(Extents);
  static_assert(rank <= max_rank, "fusebox::shape: at most 6 dimensions are supported");
  static constexpr std::array<std::size_t, rank> extents{Extents...};
  static constexpr bool is_static = ((Extents < symbol_base) && ...);
  /// Number of elements; only meaningful when every extent is static.
  static constexpr std::size_t size = is_static ? (std::size_t{1} * ... * Extents) : dyn;
};

template <class S>
inline constexpr bool is_shape_v = false;
template <std::size_t... E>
inline constexpr bool is_shape_v<shape<E...>> = true;

/// Shape facts as a value: what the planner and the run-time checks read.
struct dims {
  std::size_t rank = 0;
  std::array<std::size_t, max_rank> extent{};

  constexpr std::size_t operator[](std::size_t d) const { return extent[d]; }
  constexpr std::size_t& operator[](std::size_t d) { return extent[d]; }
  /// Element count; dyn when any extent is dyn.
  constexpr std::size_t size() const {
    std::size_t n = 1;
    for (std::size_t d = 0; d < rank; ++d) {
      if (!is_known_extent(extent[d])) return dyn;
      n *= extent[d];
    }
    return n;
  }
  constexpr bool is_static() const {
    for (std::size_t d = 0; d < rank; ++d)
      if (!is_known_extent(extent[d])) return false;
    return true;
  }
  /// Extents counted from the right: back(0) is the last dimension, 1 for dimensions left of rank.
  constexpr std::size_t back(std::size_t i) const { return i < rank ? extent[rank - 1 - i] : 1; }
  friend constexpr bool operator==(const dims& a, const dims& b) {
    if (a.rank != b.rank) return false;
    for (std::size_t d = 0; d < a.rank; ++d)
      if (a.extent[d] != b.extent[d]) return false;
    return true;
  }
};

template <std::size_t... E>
constexpr dims dims_of(shape<E...>) {
  return dims{sizeof...(E), {E...}};
}

/// "[64, 784]" or "[?, 784]" for error messages and reports.
inline std::string to_string(const dims& d) {
  std::string s = "[";
  for (std::size_t i = 0; i < d.rank; ++i) {
    if (i) s += ", ";
    const std::size_t e = d.extent[i];
    // Appended piece by piece: GCC 12 at -O2 flags `"s" + std::to_string(...)` with a known false
    // -Wrestrict inside std::string, in every unit built with -Wall that inlines this.
    if (e == dyn) {
      s += '?';
    } else if (is_known_extent(e)) {
      s += std::to_string(e);
    } else {
      s += 's';
      s += std::to_string(e - symbol_base);
    }
  }
  return s + "]";
}

/// NumPy broadcasting of two shapes (right-aligned; extent 1 stretches; an unknown extent (dyn or
/// a symbol) meets anything and takes the other side's known extent, to be checked at run time).
/// `ok` is false when they cannot broadcast.
struct broadcast_result {
  dims out;
  bool ok = true;
  std::size_t bad_dim = 0;  ///< counted from the right, for the error message
};

constexpr broadcast_result broadcast(const dims& a, const dims& b) {
  broadcast_result r;
  r.out.rank = a.rank > b.rank ? a.rank : b.rank;
  for (std::size_t i = 0; i < r.out.rank; ++i) {
    const std::size_t x = a.back(i), y = b.back(i);
    std::size_t e;
    if (x == y) e = x;
    else if (x == 1) e = y;
    else if (y == 1) e = x;
    else if (!is_known_extent(x)) e = y;  // checked again at run time
    else if (!is_known_extent(y)) e = x;
    else {
      r.ok = false;
      r.bad_dim = i;
      e = x;
    }
    r.out.extent[r.out.rank - 1 - i] = e;
  }
  return r;
}

/// Turns a constexpr dims value back into a shape type. `Holder::value` is the dims (a class-type
/// template argument would be shorter, but g++ 12 crashes on it in this position).
template <class Holder, class Seq = std::make_index_sequence<Holder::value.rank>>
struct shape_from_dims;
template <class Holder, std::size_t... I>
struct shape_from_dims<Holder, std::index_sequence<I...>> {
  using type = shape<Holder::value.extent[I]...>;
};
template <class Holder>
using shape_from_dims_t = typename shape_from_dims<Holder>::type;

/// Normalises a possibly negative axis against a rank (Python style, -1 is the last).
constexpr std::size_t normalize_axis(int axis, std::size_t rank) {
  return axis < 0 ? static_cast<std::size_t>(static_cast<int>(rank) + axis) : static_cast<std::size_t>(axis);
}

}  // namespace fusebox
