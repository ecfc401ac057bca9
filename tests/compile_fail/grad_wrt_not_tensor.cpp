// Compile-fail: fb::grad(f, fb::wrt<1>) where argument 1 is a number, not a tensor: only tensor
// arguments have gradients, and the build error says so (autodiff/grad.hpp:
// static_check::wrt_not_a_tensor). Without FUSEBOX_SHOULD_FAIL the gradient is taken with respect
// to the tensor argument 0 and it builds.
#include <fusebox/fusebox.hpp>

namespace fb = fusebox;

auto loss = [](const auto& x, float scale) { return fb::sum(fb::sum(x * x)) * scale; };

#ifdef FUSEBOX_SHOULD_FAIL
inline constexpr auto which = fb::wrt<1>;  // the misuse: argument 1 is a float
#else
inline constexpr auto which = fb::wrt<0>;
#endif

void use(const fb::tensor<float, fb::shape<3, 4>>& x) {
  auto g = fb::compile(fb::grad(loss, which))(x, 0.5f);
  (void)g;
}
