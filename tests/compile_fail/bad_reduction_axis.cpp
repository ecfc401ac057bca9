// Compile-fail: sum(x, axis<2>) on a rank-2 tensor: the axis is not a dimension of x, a build error
// (expr/static_checks.hpp: bad_axis) naming the op, the shape and the axis. Without
// FUSEBOX_SHOULD_FAIL the axis is 1 and it builds.
#include <fusebox/fusebox.hpp>

namespace fb = fusebox;

#ifdef FUSEBOX_SHOULD_FAIL
constexpr int reduced_axis = 2;
#else
constexpr int reduced_axis = 1;
#endif

auto use(const fb::tensor<float, fb::shape<3, 4>>& x) {
  return fb::sum(x, fb::axis<reduced_axis>);  // the misuse
}
