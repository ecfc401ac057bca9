// Compile-fail: cumsum(x, axis<2>) on a rank-2 x: the axis is not a dimension of x, and the build
// error says so by the op's name (ops/cumsum.hpp: static_check::cumsum_axis). Without
// FUSEBOX_SHOULD_FAIL the axis is 1 and it builds.
#include <fusebox/fusebox.hpp>

namespace fb = fusebox;

#ifdef FUSEBOX_SHOULD_FAIL
inline constexpr auto which = fb::axis<2>;  // the misuse: x has dimensions 0 and 1
#else
inline constexpr auto which = fb::axis<1>;
#endif

auto use(const fb::tensor<float, fb::shape<3, 4>>& x) { return fb::cumsum(x, which); }
