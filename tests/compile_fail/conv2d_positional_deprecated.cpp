// Compile-fail: the positional conv2d<Stride, Padding>(x, w) still compiles but is deprecated, and
// the warning names the replacement (ops/conv.hpp). The warning is made an error here to check
// it. Without FUSEBOX_SHOULD_FAIL the named form builds under the same pragma.
#include <fusebox/fusebox.hpp>

namespace fb = fusebox;

#pragma GCC diagnostic error "-Wdeprecated-declarations"

void use(const fb::tensor<float, fb::shape<2, 3, 8, 8>>& x, const fb::tensor<float, fb::shape<4, 3, 3, 3>>& w) {
#ifdef FUSEBOX_SHOULD_FAIL
  auto y = fb::conv2d<2, 1>(x, w);  // the old form
#else
  auto y = fb::conv2d<fb::stride<2>, fb::padding<1>>(x, w);
#endif
  (void)y;
}
