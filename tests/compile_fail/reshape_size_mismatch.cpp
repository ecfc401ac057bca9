// Compile-fail: reshape<shape<5, 5>>(x) of a [3, 4] value inside a model: 25 elements are not 12, a
// build error naming both shapes (expr/static_checks.hpp: reshape_size_mismatch). Without
// FUSEBOX_SHOULD_FAIL the new shape is [2, 6] and it builds.
#include <fusebox/fusebox.hpp>

namespace fb = fusebox;

#ifdef FUSEBOX_SHOULD_FAIL
using new_shape = fb::shape<5, 5>;
#else
using new_shape = fb::shape<2, 6>;
#endif

auto model = [](auto x) { return fb::reshape<new_shape>(x * 2.0); };  // the misuse

void use(const fb::tensor<float, fb::shape<3, 4>>& x) {
  auto y = fb::compile(model)(x);
  (void)y;
}
