// backend/cpu/spatial_epilogue.hpp: what the spatial kernels (conv.hpp, winograd.hpp, pool.hpp) call on
// their finished output, and how they call it.
//
// An epilogue is called as epilogue(row, j0, n): elements [j0, j0 + n) of output row `row`, where
// rows index the output's leading dimensions ([N, C, H] of an NCHW output) and columns its last.
// An epilogue that declares `takes_row_spans` also takes a run past the row's end, on through
// the next rows in row-major order; kernels finishing whole rows in order hand those over in one
// call (epilogue_rows). The executor's epilogue takes spans, and where its operands allow, walks
// them as one long row: T2's rows are 8 to 24 elements, and a call per row cost as much as the
// work.
// Depends on: the C++20 standard library.
#pragma once

#include <cstddef>
#include <type_traits>

namespace fusebox::cpu {

/// An epilogue that does nothing (a spatial kernel without a fused consumer).
struct no_spatial_epilogue {
  static constexpr bool takes_row_spans = true;
  void operator()(std::size_t, std::size_t, std::size_t) const noexcept {}
};

/// An epilogue F that also takes a run longer than a row: (row, j0, n) with j0 + n past the
/// row's end goes on through the next rows, in row-major order.
template <class F>
struct row_span_epilogue {
  static constexpr bool takes_row_spans = true;
  F f;
  void operator()(std::size_t row, std::size_t j0, std::size_t n) const { f(row, j0, n); }
};
template <class F>
row_span_epilogue(F) -> row_span_epilogue<F>;

/// Whether E declares that it takes runs past a row's end.
template <class E>
concept takes_row_spans = bool(std::remove_cvref_t<E>::takes_row_spans);

/// Rows [first, first + count) of `width` elements each, whole, through `epilogue`: one call
/// where it takes spans of rows, one per row otherwise.
template <class E>
void epilogue_rows(E& epilogue, std::size_t first, std::size_t count, std::size_t width) {
  if constexpr (takes_row_spans<E>) {
    if (count > 0) epilogue(first, 0, count * width);
  } else {
    for (std::size_t r = first; r < first + count; ++r) epilogue(r, 0, width);
  }
}

}  // namespace fusebox::cpu
