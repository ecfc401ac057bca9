// Compile-fail: max_pool2d<3, 2, fb::padding<1>>(x): a bare stride after the kernel size, mixed
// with a named padding, is refused by a static_assert naming the named form (ops/pool.hpp).
// Without FUSEBOX_SHOULD_FAIL the stride is named and it builds.
#include <fusebox/fusebox.hpp>

namespace fb = fusebox;

void use(const fb::tensor<float, fb::shape<2, 3, 8, 8>>& x) {
#ifdef FUSEBOX_SHOULD_FAIL
  auto y = fb::max_pool2d<3, 2, fb::padding<1>>(x);  // the misuse
#else
  auto y = fb::max_pool2d<3, fb::stride<2>, fb::padding<1>>(x);
#endif
  (void)y;
}
