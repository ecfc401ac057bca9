// Compile-fail: eager fb::value_and_grad(f)(x) with x of shape<dyn, 4>: eager gradients run op by
// op on the static path, and the build error names the fix (compile the gradient, which takes dyn
// extents on the run-time path: autodiff/grad.hpp, static_check::not_static). Without
// FUSEBOX_SHOULD_FAIL the same gradient is compiled, and it builds.
#include <fusebox/fusebox.hpp>

namespace fb = fusebox;

auto loss = [](const auto& x) { return fb::mean(fb::mean(x * x)); };

void use(const fb::tensor<float, fb::shape<fb::dyn, 4>>& x) {
#ifdef FUSEBOX_SHOULD_FAIL
  auto g = fb::value_and_grad(loss)(x);  // the misuse: eager on dyn extents
#else
  auto g = fb::compile(fb::value_and_grad(loss))(x);
#endif
  (void)g;
}
