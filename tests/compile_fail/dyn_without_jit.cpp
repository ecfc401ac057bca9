// Compile-fail: a model called on a dyn extent in a unit that includes only <fusebox/cpu.hpp>
// (static shapes on the CPU, no run-time path): a build error that names the header to include
// (pipeline/call.hpp). Without FUSEBOX_SHOULD_FAIL the extent is static and it builds.
#include <fusebox/cpu.hpp>

namespace fb = fusebox;

#ifdef FUSEBOX_SHOULD_FAIL
using x_shape = fb::shape<fb::dyn, 8>;
#else
using x_shape = fb::shape<4, 8>;
#endif

void use(const fb::tensor<float, x_shape>& x) {
  auto y = fb::compile([](auto x) { return fb::exp(x) * 2.0f; })(x);
  (void)y;
}
