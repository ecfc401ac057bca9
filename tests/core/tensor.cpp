// tests/core/tensor.cpp: fusebox::tensor (include/fusebox/core/tensor.hpp): construction with static
// and dyn extents, row-major strides, 64-byte alignment, views (transpose, slice, reshape) with the
// right extents and strides over shared storage, reshape copying what it cannot view, the errors
// (at() out of range, reshape and slice misuse, dims that do not fit the type), and seeded filling.
#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <type_traits>
#include <vector>

#include <catch2/catch.hpp>

#include <fusebox/fusebox.hpp>

namespace fb = fusebox;

namespace {
fb::dims D(std::initializer_list<std::size_t> e) {
  fb::dims d;
  d.rank = e.size();
  std::size_t k = 0;
  for (auto x : e) d.extent[k++] = x;
  return d;
}

/// Fills t with 0, 1, 2, ... in row-major order.
template <class T, class S>
void iota(fb::tensor<T, S>& t) {
  for (std::size_t i = 0; i < t.size(); ++i) t.flat(i) = static_cast<T>(i);
}
}  // namespace

TEST_CASE("static tensors: extents, row-major strides, alignment", "[core][tensor]") {
  fb::tensor<float, fb::shape<3, 4, 5>> t;
  STATIC_REQUIRE(decltype(t)::rank == 3);
  STATIC_REQUIRE(decltype(t)::dyn_count == 0);
  CHECK(t.extents() == D({3, 4, 5}));
  CHECK(t.size() == 60);
  CHECK(t.stride(0) == 20);
  CHECK(t.stride(1) == 5);
  CHECK(t.stride(2) == 1);
  CHECK(t.contiguous());
  CHECK(reinterpret_cast<std::uintptr_t>(t.data()) % fb::storage_alignment == 0);
  iota(t);
  CHECK(t(0, 0, 0) == 0);
  CHECK(t(1, 2, 3) == 1 * 20 + 2 * 5 + 3);
  CHECK(t(2, 3, 4) == 59);
  CHECK(t.flat(33) == 33);
  t(1, 1, 1) = -7;
  CHECK(t.data()[1 * 20 + 1 * 5 + 1] == -7);

  fb::tensor<double, fb::shape<>> scalar;  // rank 0: one element
  CHECK(scalar.size() == 1);
  scalar.fill(2.5);
  CHECK(scalar.flat(0) == 2.5);
}

TEST_CASE("dyn extents are given at construction, left to right", "[core][tensor]") {
  fb::tensor<float, fb::shape<fb::dyn, 100>> y(7);
  STATIC_REQUIRE(decltype(y)::dyn_count == 1);
  CHECK(y.extents() == D({7, 100}));
  CHECK(y.stride(0) == 100);

  fb::tensor<double, fb::shape<fb::dyn, 3, fb::dyn>> z(2, 5);
  CHECK(z.extents() == D({2, 3, 5}));
  CHECK(z.stride(0) == 15);
  CHECK(z.stride(1) == 5);
  CHECK(reinterpret_cast<std::uintptr_t>(z.data()) % fb::storage_alignment == 0);

  // From resolved dims: static extents must agree with the type.
  fb::tensor<float, fb::shape<fb::dyn, 4>> ok(D({9, 4}));
  CHECK(ok.extents() == D({9, 4}));
  CHECK_THROWS_AS((fb::tensor<float, fb::shape<fb::dyn, 4>>(D({9, 5}))), fb::shape_error);
  CHECK_THROWS_WITH((fb::tensor<float, fb::shape<fb::dyn, 4>>(D({9, 5}))),
                    Catch::Contains("[9, 5]") && Catch::Contains("[?, 4]") && Catch::Contains("tensor.cpp"));
  CHECK_THROWS_AS((fb::tensor<float, fb::shape<fb::dyn, 4>>(D({9}))), fb::shape_error);  // wrong rank
  // A higher rank whose leading extents fit: only the rank tells it apart.
  CHECK_THROWS_WITH((fb::tensor<float, fb::shape<fb::dyn, 4>>(D({9, 4, 2}))),
                    Catch::Contains("[9, 4, 2]") && Catch::Contains("[?, 4]"));

  // An empty dyn tensor is a valid value.
  fb::tensor<float, fb::shape<fb::dyn>> empty(0);
  CHECK(empty.size() == 0);
}

TEST_CASE("at() checks bounds; the error names index, dimension and shape", "[core][tensor]") {
  fb::tensor<float, fb::shape<3, 4>> t;
  iota(t);
  CHECK(t.at(2, 3) == 11);
  t.at(0, 1) = 42;
  CHECK(t(0, 1) == 42);
  CHECK_THROWS_AS(t.at(3, 0), fb::invalid_argument);
  CHECK_THROWS_AS(t.at(0, 4), fb::invalid_argument);
  CHECK_THROWS_WITH(t.at(0, 4), Catch::Contains("index 4") && Catch::Contains("dimension 1") &&
                                    Catch::Contains("[3, 4]"));
  // Also on views, against the view's extents. (A non-const view: tensor::at has no const
  // overload.)
  auto v = t.transpose();  // [4, 3]
  CHECK(v.at(3, 2) == 11);
  CHECK_THROWS_AS(v.at(0, 3), fb::invalid_argument);
}

TEST_CASE("transpose is a strided view over the same storage", "[core][tensor][views]") {
  fb::tensor<float, fb::shape<3, 5>> t;
  iota(t);
  auto v = t.transpose();
  STATIC_REQUIRE(std::is_same_v<decltype(v), fb::tensor<float, fb::shape<5, 3>>>);
  CHECK(v.extents() == D({5, 3}));
  CHECK(v.stride(0) == 1);
  CHECK(v.stride(1) == 5);
  CHECK_FALSE(v.contiguous());
  CHECK(v.data() == t.data());
  CHECK(v.owner() == t.owner());
  for (std::size_t i = 0; i < 3; ++i)
    for (std::size_t j = 0; j < 5; ++j) CHECK(v(j, i) == t(i, j));
  // Writes through the view land in the original.
  v(4, 2) = -1;
  CHECK(t(2, 4) == -1);
  // The view keeps the storage alive after the original is gone.
  fb::tensor<float, fb::shape<5, 3>> survivor = [] {
    fb::tensor<float, fb::shape<3, 5>> local;
    local.fill(3);
    return local.transpose();
  }();
  CHECK(survivor(4, 2) == 3);
  // flat() and clone() walk the view in its own row-major order.
  CHECK(v.flat(1) == t(1, 0));
  const auto c = v.clone();
  CHECK(c.contiguous());
  CHECK(c.data() != t.data());
  for (std::size_t i = 0; i < c.size(); ++i) CHECK(c.flat(i) == v.flat(i));
  // fb::transpose on a tensor is the same view; transpose<0, 2> swaps other axes.
  CHECK(fb::transpose(t).data() == t.data());
  CHECK(fb::transpose(t).stride(0) == 1);
  fb::tensor<double, fb::shape<2, 3, 4>> r3;
  iota(r3);
  const auto s = r3.transpose<0, 2>();
  CHECK(s.extents() == D({4, 3, 2}));
  CHECK(s.stride(0) == 1);
  CHECK(s.stride(1) == 4);
  CHECK(s.stride(2) == 12);
  CHECK(s(3, 1, 1) == r3(1, 1, 3));
  const auto last2 = r3.transpose();  // default: the last two dimensions
  CHECK(last2.extents() == D({2, 4, 3}));
  CHECK(last2(1, 3, 2) == r3(1, 2, 3));
}

TEST_CASE("slice is a view with an offset and the same strides", "[core][tensor][views]") {
  fb::tensor<float, fb::shape<6, 10>> t;
  iota(t);
  const auto rows = t.slice<0>(2, 5);
  STATIC_REQUIRE(std::is_same_v<std::remove_const_t<decltype(rows)>, fb::tensor<float, fb::shape<fb::dyn, 10>>>);
  CHECK(rows.extents() == D({3, 10}));
  CHECK(rows.data() == t.data() + 20);
  CHECK(rows.owner() == t.owner());
  CHECK(rows.stride(0) == 10);
  CHECK(rows.contiguous());
  CHECK(rows(0, 0) == 20);
  CHECK(rows(2, 9) == 49);

  const auto cols = t.slice<1>(3, 7);
  CHECK(cols.extents() == D({6, 4}));
  CHECK(cols.data() == t.data() + 3);
  CHECK(cols.stride(0) == 10);
  CHECK(cols.stride(1) == 1);
  CHECK_FALSE(cols.contiguous());
  CHECK(cols(5, 3) == 56);

  // A static slice keeps its extent in the type.
  const auto st = t.slice<1, 2, 5>();
  STATIC_REQUIRE(std::is_same_v<std::remove_const_t<decltype(st)>, fb::tensor<float, fb::shape<6, 3>>>);
  CHECK(st(1, 0) == 12);

  // An empty slice is allowed; out of range or reversed is a shape_error naming the call.
  CHECK(t.slice<0>(4, 4).size() == 0);
  CHECK_THROWS_AS(t.slice<0>(2, 7), fb::shape_error);
  CHECK_THROWS_AS(t.slice<1>(5, 3), fb::shape_error);
  CHECK_THROWS_WITH(t.slice<0>(2, 7), Catch::Contains("slice<0>(2, 7)") && Catch::Contains("[6, 10]") &&
                                          Catch::Contains("tensor.cpp"));
}

TEST_CASE("reshape views contiguous data and copies strided data", "[core][tensor][views]") {
  fb::tensor<float, fb::shape<4, 6>> t;
  iota(t);
  SECTION("contiguous: a view") {
    const auto r = t.reshape<fb::shape<2, 3, 4>>();
    CHECK(r.extents() == D({2, 3, 4}));
    CHECK(r.data() == t.data());
    CHECK(r.owner() == t.owner());
    CHECK(r.stride(0) == 12);
    CHECK(r.stride(1) == 4);
    CHECK(r(1, 2, 3) == 23);
    const auto f = fb::reshape<fb::shape<24>>(t);
    CHECK(f.data() == t.data());
    CHECK(f(17) == 17);
  }
  SECTION("one dyn extent is inferred") {
    const auto r = t.reshape<fb::shape<fb::dyn, 8>>();
    CHECK(r.extents() == D({3, 8}));
    CHECK(r.data() == t.data());
  }
  SECTION("strided (a transposed view): a row-major copy") {
    const auto v = t.transpose();  // [6, 4]
    const auto r = v.reshape<fb::shape<24>>();
    CHECK(r.data() != t.data());
    CHECK(r.contiguous());
    for (std::size_t i = 0; i < 24; ++i) CHECK(r(i) == v.flat(i));
    CHECK(r(1) == t(1, 0));
  }
  SECTION("strided but splitting only within contiguous runs (torch.view's rule): a view") {
    // Columns 0..2 of a [4, 6] tensor as [2, 2, 3]: the rows split (4 -> 2 x 2, strides 12 and
    // 6), the columns stay.
    const auto cols = t.slice<1, 0, 3>();  // [4, 3], strides [6, 1]
    const auto r = cols.reshape<fb::shape<2, 2, 3>>();
    CHECK(r.data() == t.data());
    CHECK(r.stride(0) == 12);
    CHECK(r.stride(1) == 6);
    CHECK(r.stride(2) == 1);
    for (std::size_t i = 0; i < 12; ++i) CHECK(r.flat(i) == cols.flat(i));
    // Merging the rows of that slice would cross a gap: copied.
    const auto flat = cols.reshape<fb::shape<12>>();
    CHECK(flat.data() != t.data());
    for (std::size_t i = 0; i < 12; ++i) CHECK(flat(i) == cols.flat(i));
  }
  SECTION("errors: the element count must match, at most one dyn extent") {
    fb::tensor<float, fb::shape<fb::dyn, 6>> d(4);
    CHECK_THROWS_AS((d.reshape<fb::shape<5, 5>>()), fb::shape_error);
    CHECK_THROWS_WITH((d.reshape<fb::shape<5, 5>>()),
                      Catch::Contains("[4, 6]") && Catch::Contains("[5, 5]") && Catch::Contains("tensor.cpp"));
    CHECK_THROWS_AS((d.reshape<fb::shape<fb::dyn, 5>>()), fb::shape_error);  // 24 is not a multiple of 5
    CHECK_THROWS_AS((t.reshape<fb::shape<fb::dyn, fb::dyn>>()), fb::shape_error);
    CHECK_THROWS_WITH((t.reshape<fb::shape<fb::dyn, fb::dyn>>()), Catch::Contains("at most one dyn"));
  }
}

TEST_CASE("fill_random is reproducible from the seed and stays in [lo, hi)", "[core][tensor]") {
  fb::tensor<float, fb::shape<17, 33>> a, b, c;
  a.fill_random(123);
  b.fill_random(123);
  c.fill_random(124);
  std::size_t same_ab = 0, same_ac = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    same_ab += a.flat(i) == b.flat(i);
    same_ac += a.flat(i) == c.flat(i);
    CHECK(a.flat(i) >= -1.0f);
    CHECK(a.flat(i) < 1.0f);
  }
  CHECK(same_ab == a.size());
  CHECK(same_ac < 5);
  // Values are spread over the range, not constant.
  float lo = a.flat(0), hi = a.flat(0);
  for (std::size_t i = 0; i < a.size(); ++i) {
    lo = std::min(lo, a.flat(i));
    hi = std::max(hi, a.flat(i));
  }
  CHECK(lo < -0.9f);
  CHECK(hi > 0.9f);
  fb::tensor<double, fb::shape<100>> d;
  d.fill_random(5, 2.0, 3.0);
  for (std::size_t i = 0; i < d.size(); ++i) {
    CHECK(d(i) >= 2.0);
    CHECK(d(i) < 3.0);
  }
  // random_tensor is fill_random on a new tensor.
  const auto r = fb::random_tensor<float, fb::shape<17, 33>>(123);
  for (std::size_t i = 0; i < r.size(); ++i) CHECK(r.flat(i) == a.flat(i));
  // fill_random on a view fills the view's elements only, in its row-major order.
  fb::tensor<float, fb::shape<4, 4>> base;
  base.fill(9);
  auto col = base.slice<1>(1, 2);  // [4, 1]
  col.fill_random(1);
  CHECK(base(0, 0) == 9);
  CHECK(base(3, 2) == 9);
  CHECK(base(2, 1) != 9);
}

TEST_CASE("assign and fill; clone is deep", "[core][tensor]") {
  fb::tensor<double, fb::shape<2, 3>> t;
  t.assign({1, 2, 3, 4, 5, 6});
  CHECK(t(1, 0) == 4);
  CHECK_THROWS_AS(t.assign({1, 2, 3}), fb::shape_error);
  CHECK_THROWS_WITH(t.assign({1, 2, 3}), Catch::Contains("3 values") && Catch::Contains("[2, 3]"));
  auto c = t.clone();
  c(0, 0) = -1;
  CHECK(t(0, 0) == 1);
  t.fill(0.5);
  for (std::size_t i = 0; i < t.size(); ++i) CHECK(t.flat(i) == 0.5);
  CHECK(c(1, 2) == 6);
}

TEST_CASE("storage is counted and released with its last view", "[core][tensor][storage]") {
  const std::size_t before = fb::memory().live.load();
  {
    fb::tensor<float, fb::shape<100, 100>> t;  // 40000 bytes, a multiple of 64
    CHECK(fb::memory().live.load() == before + 40000);
    {
      const auto v = t.transpose();
      const auto s = t.slice<0>(3, 9);
      CHECK(v.owner() == s.owner());
      CHECK(fb::memory().live.load() == before + 40000);  // views allocate nothing
    }
    fb::tensor<float, fb::shape<fb::dyn>> odd(3);  // 12 bytes, rounded up to the alignment
    CHECK(fb::memory().live.load() == before + 40000 + 64);
  }
  CHECK(fb::memory().live.load() == before);
}

TEST_CASE("view_strides: whenever it finds strides they address every element where the source does; "
          "it refuses what needs a copy", "[core][tensor][views]") {
  // Sources: a contiguous [4, 6, 2] base seen through transposes and slices; targets: every shape
  // of rank 1 to 4 with the same element count whose extents are its divisors.
  struct source {
    const char* what;
    fb::dims shape;
    fb::strides_t stride;
  };
  const std::vector<source> sources = {
      {"contiguous", D({4, 6, 2}), {12, 2, 1}},
      {"transposed 0, 2", D({2, 6, 4}), {1, 2, 12}},
      {"columns 1..4 of [4, 6, 2]", D({4, 3, 2}), {12, 2, 1}},
      {"[4, 6, 2] sliced to [4, 6, 1]", D({4, 6, 1}), {12, 2, 1}},
      {"rows 1..3 (contiguous, offset)", D({2, 6, 2}), {12, 2, 1}},
  };
  auto offset = [](const fb::dims& d, const fb::strides_t& st, std::size_t flat) {
    std::ptrdiff_t off = 0;
    for (std::size_t k = d.rank; k-- > 0;) {
      off += static_cast<std::ptrdiff_t>(flat % d.extent[k]) * st[k];
      flat /= d.extent[k];
    }
    return off;
  };
  auto is_contiguous_layout = [&](const source& s) { return s.stride == fb::contiguous_strides(s.shape); };
  int found = 0, refused = 0;
  for (const auto& s : sources) {
    const std::size_t n = s.shape.size();
    std::vector<std::size_t> divisors;
    for (std::size_t e = 1; e <= n; ++e)
      if (n % e == 0) divisors.push_back(e);
    std::vector<fb::dims> targets;
    for (std::size_t a : divisors) {
      targets.push_back(D({n}));
      if (n % a) continue;
      targets.push_back(D({a, n / a}));
      for (std::size_t b : divisors)
        if ((n / a) % b == 0) {
          targets.push_back(D({a, b, n / a / b}));
          for (std::size_t c : divisors)
            if ((n / a / b) % c == 0) targets.push_back(D({a, b, c, n / a / b / c}));
        }
    }
    for (const auto& to : targets) {
      INFO(s.what << " as " << fb::to_string(to));
      fb::strides_t st{};
      if (!fb::view_strides(s.shape, s.stride, to, st)) {
        CHECK_FALSE(is_contiguous_layout(s));  // contiguous data is always viewable
        ++refused;
        continue;
      }
      ++found;
      for (std::size_t i = 0; i < n; ++i) REQUIRE(offset(to, st, i) == offset(s.shape, s.stride, i));
    }
  }
  CHECK(found > 50);
  CHECK(refused > 10);  // the transposed and sliced sources cannot be viewed in every shape
  // Named cases: a transposed matrix cannot be flattened; a different element count never fits.
  fb::strides_t st{};
  CHECK_FALSE(fb::view_strides(D({6, 4}), {1, 6}, D({24}), st));
  CHECK_FALSE(fb::view_strides(D({6, 4}), {4, 1}, D({25}), st));
  CHECK(fb::view_strides(D({6, 4}), {1, 6}, D({6, 2, 2}), st));  // splitting the strided dim 4 is fine
  CHECK(st == fb::strides_t{1, 12, 6});
}
