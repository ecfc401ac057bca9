// tensor.hpp: the owning n-dimensional array, and its strided views.
//
// `tensor<T, shape<...>>` owns 64-byte-aligned storage (shared with its views); static extents live
// in the type, `dyn` ones are given at construction. Views (transpose, reshape of contiguous data,
// slice) share the storage and carry their own element strides, so a transposed matmul operand is
// a view, not a copy. `strided` is the non-owning description (pointer, extents, strides) that the
// kernels read; every tensor converts to one.
// Depends on: core/{shape,dtype,storage,errors}.hpp.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <source_location>
#include <string>
#include <type_traits>

#include "fusebox/core/dtype.hpp"
#include "fusebox/core/errors.hpp"
#include "fusebox/core/shape.hpp"
#include "fusebox/core/storage.hpp"

namespace fusebox {

using strides_t = std::array<std::ptrdiff_t, max_rank>;

/// Row-major strides of a shape.
constexpr strides_t contiguous_strides(const dims& d) {
  strides_t s{};
  std::ptrdiff_t step = 1;
  for (std::size_t i = d.rank; i-- > 0;) {
    s[i] = step;
    step *= static_cast<std::ptrdiff_t>(d.extent[i]);
  }
  return s;
}

/// Strides that show elements laid out as `from` with `stride` in the shape `to` without moving
/// them (torch.view's rule), into `out`; false if there are none. `from` is cut, from its innermost
/// dimension out, into runs of dimensions that are contiguous with each other; `to` may split and
/// merge dimensions within a run but not across two. A contiguous input always has them.
constexpr bool view_strides(const dims& from, const strides_t& stride, const dims& to, strides_t& out) {
  if (from.size() != to.size()) return false;
  out = contiguous_strides(to);
  if (from.size() == 0 || from.rank == 0) return true;  // no element: any strides will do
  std::ptrdiff_t t = static_cast<std::ptrdiff_t>(to.rank) - 1;
  std::ptrdiff_t base = stride[from.rank - 1];  // the stride of the run's innermost dimension
  std::size_t run = 1, made = 1;                // elements of the run in `from`, and in `to` so far
  for (std::ptrdiff_t d = static_cast<std::ptrdiff_t>(from.rank) - 1; d >= 0; --d) {
    run *= from.extent[d];
    const bool run_ends = d == 0 || (from.extent[d - 1] != 1 &&
                                     stride[d - 1] != static_cast<std::ptrdiff_t>(run) * base);
    if (!run_ends) continue;
    while (t >= 0 && (made < run || to.extent[t] == 1)) {
      out[t] = static_cast<std::ptrdiff_t>(made) * base;
      made *= to.extent[t];
      --t;
    }
    if (made != run) return false;
    if (d > 0) base = stride[d - 1], run = 1, made = 1;
  }
  return t < 0;
}

/// A non-owning strided view: what kernels read and write.
template <class T>
struct strided {
  T* data = nullptr;
  dims shape;
  strides_t stride{};

  bool contiguous() const {
    return stride == contiguous_strides(shape) || shape.size() <= 1;
  }
  std::size_t size() const { return shape.size(); }
};

namespace detail {
// splitmix64: a small, good, seedable generator; tensors filled with it are reproducible.
struct splitmix64 {
  std::uint64_t state;
  std::uint64_t next() {
    std::uint64_t z = (state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  double uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }
};

/// The site fusebox names when it allocates a tensor at extents it computed itself (a program's
/// outputs, an eager op's result), where a failed check is fusebox's bug, not the caller's. A
/// constant: std::source_location::current() as a default argument inside a function template
/// spells the template's whole name into a string for each instantiation, and for a gradient
/// program's output allocation that name was 17-206 MB of .rodata and seconds of the unit's
/// compile (issue 22).
inline constexpr std::source_location internal_site = std::source_location::current();

/// Throws shape_error unless `d` fits `pattern` (a tensor type's extents, dyn where any extent
/// goes). One function for every tensor type: as a member of tensor<T, Shape> it was ~0.8 KB of
/// object code per type at -O0, 0.8% of the test suite's (issue 22).
inline void check_extents_fit(const dims& d, const dims& pattern, const char* what, const std::source_location& loc) {
  bool ok = d.rank == pattern.rank;
  for (std::size_t i = 0; ok && i < pattern.rank; ++i) ok = pattern.extent[i] == dyn || pattern.extent[i] == d.extent[i];
  if (!ok)
    FUSEBOX_THROW(shape_error(std::string(what) + ": extents " + to_string(d) + " do not fit the tensor's shape " +
                                  to_string(pattern),
                              loc));
}

template <class Shape, std::size_t A, std::size_t B, class Seq = std::make_index_sequence<Shape::rank>>
struct swap_extents;
template <std::size_t... E, std::size_t A, std::size_t B, std::size_t... I>
struct swap_extents<shape<E...>, A, B, std::index_sequence<I...>> {
  static constexpr std::array<std::size_t, sizeof...(E)> e{E...};
  using type = shape<(I == A ? e[B] : I == B ? e[A] : e[I])...>;
};

template <class Shape, std::size_t Axis, std::size_t Extent, class Seq = std::make_index_sequence<Shape::rank>>
struct set_extent;
template <std::size_t... E, std::size_t Axis, std::size_t Extent, std::size_t... I>
struct set_extent<shape<E...>, Axis, Extent, std::index_sequence<I...>> {
  static constexpr std::array<std::size_t, sizeof...(E)> e{E...};
  using type = shape<(I == Axis ? Extent : e[I])...>;
};
}  // namespace detail

template <class T, class Shape>
class tensor {
  static_assert(is_element_v<T>, "fusebox::tensor<T, S>: T must be float or double");
  static_assert(is_shape_v<Shape>, "fusebox::tensor<T, S>: S must be fusebox::shape<...>");

 public:
  using value_type = T;
  using shape_type = Shape;
  static constexpr std::size_t rank = Shape::rank;
  static constexpr std::size_t dyn_count = [] {
    std::size_t n = 0;
    for (auto e : Shape::extents) n += e == dyn;
    return n;
  }();

  /// A static-shape tensor owns its storage from the start (contents unspecified until written).
  tensor() requires(Shape::is_static) { allocate(dims_of(Shape{})); }

  /// One extent per `dyn` dimension, left to right: `tensor<float, shape<dyn, 784>> x(batch);`
  template <class... N>
    requires(sizeof...(N) == dyn_count && dyn_count > 0 && (std::is_integral_v<N> && ...))
  explicit tensor(N... run_time_extents) {
    const std::size_t given[] = {static_cast<std::size_t>(run_time_extents)...};
    dims d = dims_of(Shape{});
    std::size_t k = 0;
    for (std::size_t i = 0; i < rank; ++i)
      if (d.extent[i] == dyn) d.extent[i] = given[k++];
    allocate(d);
  }

  /// From resolved extents; static ones must agree with the type.
  explicit tensor(const dims& d, std::source_location loc = std::source_location::current()) {
    check_fits(d, "tensor(dims)", loc);
    allocate(d);
  }

  /// A static-shape tensor over memory the caller owns (contiguous, row-major; any alignment, 64
  /// bytes as fusebox's own storage is keeps vector loads within cache lines): nothing is
  /// allocated, nothing is freed, and the caller keeps the memory alive while the tensor and its
  /// views are used. For programs that allocate nothing (edge builds):
  ///   alignas(64) static float w_data[512 * 10];
  ///   auto w = tensor<float, shape<512, 10>>::over(w_data);
  static tensor over(T* data) requires(Shape::is_static) {
    return tensor(storage_ptr{}, data, dims_of(Shape{}), contiguous_strides(dims_of(Shape{})));
  }

  /// A view over storage owned elsewhere (what transpose/slice/reshape return).
  tensor(storage_ptr owner, T* data, const dims& d, const strides_t& s) : owner_(std::move(owner)) {
    view_.data = data;
    view_.shape = d;
    view_.stride = s;
  }

  T* data() noexcept { return view_.data; }
  const T* data() const noexcept { return view_.data; }
  const dims& extents() const noexcept { return view_.shape; }
  std::size_t extent(std::size_t d) const noexcept { return view_.shape.extent[d]; }
  std::ptrdiff_t stride(std::size_t d) const noexcept { return view_.stride[d]; }
  std::size_t size() const noexcept { return view_.shape.size(); }
  bool contiguous() const noexcept { return view_.contiguous(); }
  const storage_ptr& owner() const noexcept { return owner_; }

  strided<T> view() noexcept { return view_; }
  strided<const T> view() const noexcept {
    return strided<const T>{view_.data, view_.shape, view_.stride};
  }

  /// Element access by index; `at` checks bounds, `operator()` does not.
  template <class... I>
    requires(sizeof...(I) == rank)
  T& operator()(I... idx) noexcept {
    return view_.data[offset({static_cast<std::size_t>(idx)...})];
  }
  template <class... I>
    requires(sizeof...(I) == rank)
  const T& operator()(I... idx) const noexcept {
    return view_.data[offset({static_cast<std::size_t>(idx)...})];
  }
  template <class... I>
    requires(sizeof...(I) == rank)
  T& at(I... idx) {
    const std::array<std::size_t, rank> i{static_cast<std::size_t>(idx)...};
    for (std::size_t d = 0; d < rank; ++d)
      if (i[d] >= view_.shape.extent[d])
        FUSEBOX_THROW(invalid_argument("tensor::at: index " + std::to_string(i[d]) + " out of range for dimension " +
                                       std::to_string(d) + " of " + to_string(view_.shape)));
    return view_.data[offset(i)];
  }

  /// Element i of the row-major enumeration (works on any strides).
  T& flat(std::size_t i) noexcept { return view_.data[flat_offset(i)]; }
  const T& flat(std::size_t i) const noexcept { return view_.data[flat_offset(i)]; }

  // ---- views ----

  /// Swaps two dimensions (default: the last two); shares storage.
  template <std::size_t A = rank - 2, std::size_t B = rank - 1>
  auto transpose() const {
    static_assert(rank >= 2 && A < rank && B < rank, "tensor::transpose<A, B>(): A and B must be dimensions of the tensor");
    using S = typename detail::swap_extents<Shape, A, B>::type;
    dims d = view_.shape;
    strides_t s = view_.stride;
    std::swap(d.extent[A], d.extent[B]);
    std::swap(s[A], s[B]);
    return tensor<T, S>(owner_, view_.data, d, s);
  }

  /// A new shape over the same elements. Viewed where strides allow it (view_strides: always for
  /// contiguous data), copied otherwise, as in torch.reshape. `dyn` in the new shape takes the
  /// remaining size.
  template <class S2>
  auto reshape(std::source_location loc = std::source_location::current()) const {
    static_assert(!Shape::is_static || !S2::is_static || Shape::size == S2::size,
                  "tensor::reshape<S>(): the new shape must hold the same number of elements");
    dims d = dims_of(S2{});
    std::size_t known = 1, dyn_at = max_rank;
    for (std::size_t i = 0; i < d.rank; ++i) {
      if (d.extent[i] == dyn) {
        if (dyn_at != max_rank) FUSEBOX_THROW(shape_error("reshape: at most one dyn extent can be inferred", loc));
        dyn_at = i;
      } else {
        known *= d.extent[i];
      }
    }
    if (dyn_at != max_rank) d.extent[dyn_at] = known ? size() / known : 0;
    if (d.size() != size())
      FUSEBOX_THROW(shape_error("reshape: " + to_string(view_.shape) + " has " + std::to_string(size()) +
                                    " elements, cannot become " + to_string(d),
                                loc));
    if (strides_t s{}; view_strides(view_.shape, view_.stride, d, s)) return tensor<T, S2>(owner_, view_.data, d, s);
    tensor<T, S2> out(d);
    for (std::size_t i = 0; i < size(); ++i) out.data()[i] = flat(i);
    return out;
  }

  /// Elements [begin, end) of dimension Axis; the extent becomes `dyn` (known at run time).
  template <std::size_t Axis>
  auto slice(std::size_t begin, std::size_t end, std::source_location loc = std::source_location::current()) const {
    static_assert(Axis < rank, "tensor::slice<Axis>(b, e): Axis must be a dimension of the tensor");
    using S = typename detail::set_extent<Shape, Axis, dyn>::type;
    if (begin > end || end > view_.shape.extent[Axis])
      FUSEBOX_THROW(shape_error("slice<" + std::to_string(Axis) + ">(" + std::to_string(begin) + ", " +
                                    std::to_string(end) + ") is out of range for " + to_string(view_.shape),
                                loc));
    return slice_view<S, Axis>(begin, end);
  }
  /// Static slice: the extent End - Begin stays in the type.
  template <std::size_t Axis, std::size_t Begin, std::size_t End>
  auto slice() const {
    static_assert(Axis < rank && Begin <= End, "tensor::slice<Axis, Begin, End>(): need Axis < rank and Begin <= End");
    static_assert(Shape::extents[Axis] == dyn || End <= Shape::extents[Axis],
                  "tensor::slice<Axis, Begin, End>(): End is past the extent of Axis");
    using S = typename detail::set_extent<Shape, Axis, End - Begin>::type;
    if (End > view_.shape.extent[Axis])
      FUSEBOX_THROW(shape_error("slice: End past the extent " + to_string(view_.shape), std::source_location::current()));
    return slice_view<S, Axis>(Begin, End);
  }

  // ---- filling ----

  void fill(T value) {
    for (std::size_t i = 0; i < size(); ++i) flat(i) = value;
  }
  /// Uniform in [lo, hi), reproducible from the seed.
  void fill_random(std::uint64_t seed, T lo = T(-1), T hi = T(1)) {
    detail::splitmix64 g{seed};
    for (std::size_t i = 0; i < size(); ++i) flat(i) = static_cast<T>(lo + (hi - lo) * g.uniform());
  }
  /// Row-major values; the count must match.
  void assign(std::initializer_list<T> values, std::source_location loc = std::source_location::current()) {
    if (values.size() != size())
      FUSEBOX_THROW(shape_error("tensor::assign: " + std::to_string(values.size()) + " values for " + to_string(view_.shape),
                                loc));
    std::size_t i = 0;
    for (T v : values) flat(i++) = v;
  }

  /// A contiguous copy with its own storage.
  tensor clone() const {
    tensor out(view_.shape);
    for (std::size_t i = 0; i < size(); ++i) out.data()[i] = flat(i);
    return out;
  }

  /// Throws shape_error unless `d` fits the static extents of Shape.
  static void check_fits(const dims& d, const char* what, const std::source_location& loc) {
    detail::check_extents_fit(d, dims_of(Shape{}), what, loc);
  }

 private:
  void allocate(const dims& d) {
    owner_ = allocate_storage(d.size() * sizeof(T));
    view_.data = reinterpret_cast<T*>(owner_.get());
    view_.shape = d;
    view_.stride = contiguous_strides(d);
  }
  std::ptrdiff_t offset(const std::array<std::size_t, rank>& i) const noexcept {
    std::ptrdiff_t o = 0;
    for (std::size_t d = 0; d < rank; ++d) o += static_cast<std::ptrdiff_t>(i[d]) * view_.stride[d];
    return o;
  }
  std::ptrdiff_t flat_offset(std::size_t i) const noexcept {
    std::ptrdiff_t o = 0;
    for (std::size_t d = rank; d-- > 0;) {
      const std::size_t e = view_.shape.extent[d];
      o += static_cast<std::ptrdiff_t>(i % e) * view_.stride[d];
      i /= e;
    }
    return o;
  }
  template <class S, std::size_t Axis>
  tensor<T, S> slice_view(std::size_t begin, std::size_t end) const {
    dims d = view_.shape;
    d.extent[Axis] = end - begin;
    return tensor<T, S>(owner_, view_.data + static_cast<std::ptrdiff_t>(begin) * view_.stride[Axis], d, view_.stride);
  }

  storage_ptr owner_;
  strided<T> view_;
};

template <class X>
inline constexpr bool is_tensor_v = false;
template <class T, class S>
inline constexpr bool is_tensor_v<tensor<T, S>> = true;

/// A tensor of the given type filled with uniform values in [lo, hi) from a seed.
template <class T, class Shape>
tensor<T, Shape> random_tensor(std::uint64_t seed, T lo = T(-1), T hi = T(1)) requires(Shape::is_static) {
  tensor<T, Shape> t;
  t.fill_random(seed, lo, hi);
  return t;
}

}  // namespace fusebox
