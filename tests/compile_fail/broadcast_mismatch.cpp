// Compile-fail: elementwise operands whose static shapes cannot broadcast ([3, 4] + [5]) are a build
// error naming the op and both shapes (expr/static_checks.hpp: cannot_broadcast), with "required
// from here" at the user's line. Without FUSEBOX_SHOULD_FAIL the second operand is [4] and it builds.
#include <fusebox/fusebox.hpp>

namespace fb = fusebox;

#ifdef FUSEBOX_SHOULD_FAIL
using second_shape = fb::shape<5>;
#else
using second_shape = fb::shape<4>;
#endif

fb::tensor<float, fb::shape<3, 4>> use(const fb::tensor<float, fb::shape<3, 4>>& a,
                                       const fb::tensor<float, second_shape>& b) {
  return fb::add(a, b);  // the misuse
}
