// Compile-fail: fb::grad(f) where f returns a row of sums ([3]), not one element: a build error that
// names the loss's shape and says to reduce it with sum() or mean()
// (autodiff/grad.hpp: static_check::loss_not_scalar). Without FUSEBOX_SHOULD_FAIL the loss is
// reduced once more, to a scalar, and it builds.
#include <fusebox/fusebox.hpp>

namespace fb = fusebox;

auto loss = [](const auto& x) {
#ifdef FUSEBOX_SHOULD_FAIL
  return fb::sum(fb::tanh(x));  // the misuse: [3, 4] -> [3]
#else
  return fb::sum(fb::sum(fb::tanh(x)));
#endif
};

void use(const fb::tensor<float, fb::shape<3, 4>>& x) {
  auto dx = fb::grad(loss)(x);
  (void)dx;
}
