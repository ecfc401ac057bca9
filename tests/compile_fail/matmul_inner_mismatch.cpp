// Compile-fail: matmul(a, b) with a [3, 4] and b [5, 6]: the inner extents differ, a build error that
// says so and suggests matmul(a, transpose(b)) (expr/static_checks.hpp: matmul_inner_mismatch).
// Without FUSEBOX_SHOULD_FAIL b is [4, 6] and it builds.
#include <fusebox/fusebox.hpp>

namespace fb = fusebox;

#ifdef FUSEBOX_SHOULD_FAIL
using b_shape = fb::shape<5, 6>;
#else
using b_shape = fb::shape<4, 6>;
#endif

auto model = [](auto a, auto b) { return fb::matmul(a, b); };  // the misuse

void use(const fb::tensor<float, fb::shape<3, 4>>& a, const fb::tensor<float, b_shape>& b) {
  auto c = fb::compile(model)(a, b);
  (void)c;
}
