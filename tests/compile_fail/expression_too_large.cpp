// Compile-fail: a stack of 3 residual blocks written as one expression with captured weights.
// Every use of `h` copies its expression, so the tree has about 600 node copies (4^L growth): the
// lowering refuses it with one static_assert that says what to do (compile the block), where the
// constexpr planner would otherwise stop at GCC's operation limit (and at 4 blocks first run for
// minutes in 9 GB). Without FUSEBOX_SHOULD_FAIL the stack has 2 blocks (about 140 copies) and builds.
#include <cstddef>

#include <fusebox/fusebox.hpp>

namespace fb = fusebox;

#ifdef FUSEBOX_SHOULD_FAIL
constexpr std::size_t layers = 3;
#else
constexpr std::size_t layers = 2;
#endif

struct weights {
  fb::tensor<float, fb::shape<8>> gamma, beta, bias;
  fb::tensor<float, fb::shape<8, 8>> w;
};

template <std::size_t L, class X>
auto stack(const X& x, const weights* p) {
  if constexpr (L == 0) {
    return x;
  } else {
    const auto h = stack<L - 1>(x, p);
    return h + fb::gelu(fb::matmul(fb::layer_norm(h, p[L - 1].gamma, p[L - 1].beta, 1e-5f), p[L - 1].w) + p[L - 1].bias);
  }
}

void use(const fb::tensor<float, fb::shape<4, 8>>& x, const weights* p) {
  auto y = fb::compile([p](auto in) { return stack<layers>(in, p); })(x);  // the misuse
  (void)y;
}
