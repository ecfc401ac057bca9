// tests/cuda/attention_backward_codegen.cpp: what attention's gradient kernels
// (backend/cuda/attention_backward_kernel.hpp) check without a GPU: every part's unit (float32,
// bf16, causal or not) rendered and compiled by NVRTC to PTX, and the GPT-2 block's training step
// (dyn T) planned for the GPU with every one of its kernels rendered and NVRTC-compiled (nn.gpt2's
// [cuda] case runs it on a device). The gradients on a device are attention_backward.cpp.
#include <catch2/catch.hpp>

#include <cstddef>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include <fusebox/backend/cuda/nvrtc.hpp>
#include <fusebox/fusebox.hpp>
#include <fusebox/nn/nn.hpp>

#include "../support/gpu.hpp"
#include "../support/planned_guard.hpp"

namespace fb = fusebox;

namespace {

/// A gradient node of q [B, T, H, E] and v [B, T, H, Ev] (T symbolic), part `variant`.
fb::ir::node gradient_node(int variant, bool causal, std::size_t e, std::size_t ev, fb::ir::node* q, fb::ir::node* v) {
  fb::ir::node n;
  n.desc.kind = fb::node_kind::attention;
  n.desc.name = variant == 1 ? "attention_backward_dq" : variant == 2 ? "attention_backward_dkv" : "attention_backward";
  n.desc.variant = variant;
  n.desc.causal = causal;
  q->desc.shape = fb::dims{4, {2, fb::symbol(0), 3, e}};
  v->desc.shape = fb::dims{4, {2, fb::symbol(0), 3, ev}};
  n.desc.shape = variant == 1   ? q->desc.shape
                 : variant == 2 ? fb::dims{4, {2, fb::symbol(0), 3, e + ev}}
                                : fb::dims{5, {2, fb::symbol(0), 3, 3, e}};
  return n;
}

}  // namespace

TEST_CASE("CUDA: attention's gradient units (parts 1, 2, 3; causal or not; float32, bf16) compile with NVRTC",
          "[cuda][attention][autodiff]") {
  if (!fb::cuda::nvrtc_available()) {
    WARN("no NVRTC: skipped");
    return;
  }
  for (fb::dtype t : {fb::dtype::f32, fb::dtype::bf16})
    for (int variant : {1, 2, 3})
      for (bool causal : {false, true}) {
        const std::size_t e = 8, ev = variant == 3 ? 8 : 40;  // ev 40: two lanes' worth on some lanes
        fb::ir::node q, v;
        const fb::ir::node n = gradient_node(variant, causal, e, ev, &q, &v);
        const fb::jit::rendered_cuda_kernel k = fb::jit::render_cuda_attention(n, q, v, t);
        const std::string name = "attention_backward_part" + std::to_string(variant) + (causal ? "_causal" : "") +
                                 (t == fb::dtype::f32 ? "_f32" : "_bf16");
        INFO(name << ": " << k.summary);
        CHECK(k.kind == fb::plan::kernel_kind::attention);
        CHECK(k.source.find("fusebox_kernel_w(") != std::string::npos);  // the dq entry
        const std::string source = fb::jit::make_cuda_unit({k}).source;
        CHECK_NOTHROW(fb::cuda::nvrtc_check(source, name + ".cu", "compute_90"));
      }
  // Head dims unknown when compiling are refused by name, as the forward's.
  fb::ir::node q, v;
  fb::ir::node n = gradient_node(3, true, 8, 8, &q, &v);
  q.desc.shape = fb::dims{4, {2, 5, 3, fb::symbol(1)}};
  CHECK_THROWS_WITH(fb::jit::render_cuda_attention(n, q, v, fb::dtype::f32),
                    Catch::Contains("needs head dims known when compiling"));
}

namespace {
template <class VG, class X, class Refs>
struct gpt2_program;
template <class VG, class X, class... P>
struct gpt2_program<VG, X, std::tuple<P&...>> {
  using type = typename VG::template program_type<X, X, std::remove_cvref_t<P>...>;
};
}  // namespace

TEST_CASE("CUDA: the GPT-2 block's training step (dyn T) planned for the GPU: every kernel, attention's gradient "
          "among them, renders and compiles with NVRTC",
          "[cuda][attention][autodiff]") {
  if (!fb::cuda::nvrtc_available()) {
    WARN("no NVRTC: skipped");
    return;
  }
  namespace nn = fb::nn;
  using block_f = nn::gpt2_block<8, 2, fb::dyn, float>;
  using objective = nn::detail::objective<block_f, nn::train_mode, nn::mse_loss_fn>;
  using X = fb::tensor<float, fb::shape<2, fb::dyn, 8>>;
  using VG = decltype(fb::compile(fb::value_and_grad(objective{}, fb::wrt<2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13>)));
  using Prog = typename gpt2_program<VG, X, decltype(std::declval<block_f&>().param_refs())>::type;
  using D = fb::jit::dynamic_function<Prog, fb::jit::cuda_target>;
  for (std::size_t rows : {std::size_t{5}, std::size_t{0}}) {  // T 5, then T symbolic
    INFO("T " << (rows ? std::to_string(rows) : std::string("symbolic")));
    typename D::program_t p;
    D::specialise_into(p, fbt::planned_guard<Prog>(rows));
    // As build_cuda renders them (pipeline/dynamic_function.hpp).
    std::vector<fb::jit::rendered_cuda_kernel> kernels;
    int gradients = 0;
    for (int k = 0; k < p.plan.n_kernels; ++k) {
      const fb::plan::kernel& kn = p.plan.kernels[k];
      const fb::ir::node& n = p.nodes[kn.node];
      if (kn.kind == fb::plan::kernel_kind::spatial || kn.kind == fb::plan::kernel_kind::gather ||
          kn.kind == fb::plan::kernel_kind::custom) {
        FAIL("the GPT-2 block has no spatial, gather or custom kernel; kernel " << k << " is one");
      } else if (kn.kind == fb::plan::kernel_kind::pad) {
        kernels.push_back(fb::jit::render_cuda_pad(n, fb::dtype::f32));
        if (!D::generated(kn)) continue;
      }
      if (kn.kind == fb::plan::kernel_kind::attention) {
        gradients += n.desc.variant != 0;
        REQUIRE_NOTHROW(kernels.push_back(
            fb::jit::render_cuda_attention(n, p.nodes[n.inputs[0]], p.nodes[n.inputs[2]], fb::dtype::f32)));
      } else if (D::generated(kn)) {
        kernels.push_back(fb::jit::render_cuda_kernel(p.nodes, p.plan, k, fb::dtype::f32, p.unit_inner, p.sched));
      }
    }
    CHECK(gradients >= 1);
    try {
      fb::cuda::nvrtc_check(fb::jit::make_cuda_unit(kernels).source, "gpt2_step", "compute_90");
    } catch (const fb::cuda::nvrtc_error& e) {
      FAIL(e.what());
    }
  }
}
