// Compile-fail: slice<1, 4, 9>(x) of a [3, 8] value inside a model: column 9 is past the 8 columns,
// a build error naming the shape and the bounds (expr/static_checks.hpp: slice_out_of_range).
// Without FUSEBOX_SHOULD_FAIL the slice is columns 4..8 and it builds.
#include <fusebox/fusebox.hpp>

namespace fb = fusebox;

#ifdef FUSEBOX_SHOULD_FAIL
constexpr std::size_t end = 9;
#else
constexpr std::size_t end = 8;
#endif

auto model = [](auto x) { return fb::slice<1, 4, end>(x * 2.0) + 1.0; };  // the misuse

void use(const fb::tensor<float, fb::shape<3, 8>>& x) {
  auto y = fb::compile(model)(x);
  (void)y;
}
