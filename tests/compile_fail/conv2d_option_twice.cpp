// Compile-fail: conv2d<fb::stride<2>, fb::padding<1>, fb::stride<1>>(x, w): a named option given
// twice is refused by a static_assert that says to give each at most once (ops/conv.hpp), rather
// than one of them silently winning. Without FUSEBOX_SHOULD_FAIL each is given once and it builds.
#include <fusebox/fusebox.hpp>

namespace fb = fusebox;

void use(const fb::tensor<float, fb::shape<2, 3, 8, 8>>& x, const fb::tensor<float, fb::shape<4, 3, 3, 3>>& w) {
#ifdef FUSEBOX_SHOULD_FAIL
  auto y = fb::conv2d<fb::stride<2>, fb::padding<1>, fb::stride<1>>(x, w);  // the misuse
#else
  auto y = fb::conv2d<fb::stride<2>, fb::padding<1>>(x, w);
#endif
  (void)y;
}
