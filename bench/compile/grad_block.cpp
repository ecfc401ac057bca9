// bench/compile/grad_block.cpp: a training program's unit for bench/compile/build_cost.sh (issue
// 22): the gradient of a pre-norm attention block (layer_norm, q k v projections, softmax of
// scaled scores, two residuals, a GELU MLP, MSE), eager and compiled, in float. build_cost.sh
// builds it as it is (grad_block) and with -Wall (grad_block_wall), the flags most users build
// with: GCC's -Wsequence-point, part of -Wall, was superlinear in the size of such programs.
#include <cstdio>

#include <fusebox/fusebox.hpp>

namespace fb = fusebox;

int main() {
  auto block_loss = [](const auto& x, const auto& g, const auto& b, const auto& wq, const auto& wk, const auto& wv,
                       const auto& w1, const auto& w2, const auto& t) {
    const auto n = fb::layer_norm(x, g, b, 1e-5f);
    const auto a = fb::softmax(fb::matmul(fb::matmul(n, wq), fb::transpose(fb::matmul(n, wk))) * 0.35f);
    const auto h = x + fb::matmul(a, fb::matmul(n, wv));
    const auto y = h + fb::matmul(fb::gelu(fb::matmul(fb::layer_norm(h, g, b, 1e-5f), w1)), w2);
    const auto e = y - t;
    return fb::mean(fb::mean(e * e));
  };
  fb::tensor<float, fb::shape<32, 64>> x, t;
  fb::tensor<float, fb::shape<64>> g, b;
  fb::tensor<float, fb::shape<64, 64>> wq, wk, wv;
  fb::tensor<float, fb::shape<64, 256>> w1;
  fb::tensor<float, fb::shape<256, 64>> w2;
  x.fill_random(1);
  t.fill_random(2);
  g.fill_random(3, 0.5f, 1.5f);
  b.fill_random(4);
  wq.fill_random(5, -0.1f, 0.1f);
  wk.fill_random(6, -0.1f, 0.1f);
  wv.fill_random(7, -0.1f, 0.1f);
  w1.fill_random(8, -0.1f, 0.1f);
  w2.fill_random(9, -0.1f, 0.1f);
  auto vg = fb::value_and_grad(block_loss, fb::wrt<1, 2, 3, 4, 5, 6, 7>);
  const auto [loss, grads] = vg(x, g, b, wq, wk, wv, w1, w2, t);
  auto compiled = fb::compile(vg);
  const auto [closs, cgrads] = compiled(x, g, b, wq, wk, wv, w1, w2, t);
  std::printf("loss eager %g, compiled %g; d loss / d w2[0, 0] eager %g, compiled %g\n", loss.flat(0), closs.flat(0),
              std::get<6>(grads).flat(0), std::get<6>(cgrads).flat(0));
}
