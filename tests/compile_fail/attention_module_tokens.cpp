// Compile-fail: nn::causal_self_attention<8, 2, 4> (d 8, 2 heads, T 4) called on x [2, 5, 8]:
// sequences of 5 tokens where the module was made for 4; the build error names x's shape, d and T
// (nn/attention.hpp: token_rows_check). Without FUSEBOX_SHOULD_FAIL, x is [2, 4, 8] and it builds.
#include <fusebox/fusebox.hpp>
#include <fusebox/nn/attention.hpp>
#include <fusebox/nn/step.hpp>

namespace fb = fusebox;
namespace nn = fusebox::nn;

#ifdef FUSEBOX_SHOULD_FAIL
using x_shape = fb::shape<2, 5, 8>;  // the misuse: 5 tokens per sequence
#else
using x_shape = fb::shape<2, 4, 8>;
#endif

void use(nn::causal_self_attention<8, 2, 4>& attn, const fb::tensor<float, x_shape>& x) {
  auto y = nn::forward(attn, x);
  (void)y;
}
