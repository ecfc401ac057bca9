// Compile-fail: attention(q, k, v) with q [2, 16, 4, 32] and k [2, 16, 4, 64]: q and k have different
// head dims, a build error that names the layout (expr/static_checks.hpp: attention_shapes).
// Without FUSEBOX_SHOULD_FAIL k is [2, 16, 4, 32] and it builds.
#include <fusebox/fusebox.hpp>

namespace fb = fusebox;

#ifdef FUSEBOX_SHOULD_FAIL
using k_shape = fb::shape<2, 16, 4, 64>;
#else
using k_shape = fb::shape<2, 16, 4, 32>;
#endif

auto model = [](auto q, auto k, auto v) { return fb::attention(q, k, v, fb::causal); };  // the misuse

void use(const fb::tensor<float, fb::shape<2, 16, 4, 32>>& q, const fb::tensor<float, k_shape>& k,
         const fb::tensor<float, fb::shape<2, 16, 4, 32>>& v) {
  auto o = fb::compile(model)(q, k, v);
  (void)o;
}
