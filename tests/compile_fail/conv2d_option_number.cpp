// Compile-fail: conv2d<2, fb::padding<1>>(x, w, b): a bare number among the named options (half
// of the deprecated positional form) is refused by a static_assert naming the named form
// (ops/conv.hpp). Without FUSEBOX_SHOULD_FAIL the stride is named too and it builds.
#include <fusebox/fusebox.hpp>

namespace fb = fusebox;

auto model = [](const auto& x, const auto& w, const auto& b) {
#ifdef FUSEBOX_SHOULD_FAIL
  return fb::conv2d<2, fb::padding<1>>(x, w, b);  // the misuse
#else
  return fb::conv2d<fb::padding<1>, fb::stride<2>>(x, w, b);
#endif
};

void use(const fb::tensor<float, fb::shape<2, 3, 8, 8>>& x, const fb::tensor<float, fb::shape<4, 3, 3, 3>>& w,
         const fb::tensor<float, fb::shape<4>>& b) {
  auto y = fb::compile(model)(x, w, b);
  (void)y;
}
