// Compile-fail: conv2d(x, w) with x [8, 32, 14, 14] and w [64, 16, 5, 5]: the image has 32 channels,
// the weight expects 16, a build error that names the rule (expr/static_checks.hpp: spatial_shapes).
// Without FUSEBOX_SHOULD_FAIL w is [64, 32, 5, 5] and it builds.
#include <fusebox/fusebox.hpp>

namespace fb = fusebox;

#ifdef FUSEBOX_SHOULD_FAIL
using w_shape = fb::shape<64, 16, 5, 5>;
#else
using w_shape = fb::shape<64, 32, 5, 5>;
#endif

auto model = [](auto x, auto w) { return fb::relu(fb::conv2d<fb::padding<2>>(x, w)); };  // the misuse

void use(const fb::tensor<float, fb::shape<8, 32, 14, 14>>& x, const fb::tensor<float, w_shape>& w) {
  auto y = fb::compile(model)(x, w);
  (void)y;
}
