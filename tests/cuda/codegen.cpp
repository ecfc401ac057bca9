// What the CUDA backend does on a machine without a GPU, where CI runs: a compiled call on
// cuda::tensor arguments says the backend is unavailable, and every kernel of the reference
// workloads' models (compiled.cpp's, models.hpp) in float32, bfloat16 and float16 storage, with
// the convolution, pooling, attention, embedding and pad kernels, is rendered and compiled by NVRTC
// (to PTX without a GPU, to an sm_90 cubin with one). The calls themselves, on a device, are
// compiled.cpp.
#include <cstddef>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include <fusebox/fusebox.hpp>

#include "../support/gpu.hpp"
#include "models.hpp"

namespace fb = fusebox;
using fbt::cuda_models::cols;
using fbt::cuda_models::mlp;
using fbt::cuda_models::w1;
using fbt::cuda_models::w2;

TEST_CASE("CUDA: a call without a GPU says the backend is unavailable", "[cuda]") {
  if (fb::cuda::available()) {
    WARN("a CUDA device is present: the unavailable path is not exercised here");
    return;
  }
  fb::tensor<float, fb::shape<4, 8>> x;
  x.fill_random(1);
  try {
    fb::cuda::tensor<float, fb::shape<4, 8>> dx(x);
    FAIL("a device tensor was created without a GPU");
  } catch (const fb::backend_unavailable& e) {
    CHECK(std::string(e.what()).find("CUDA") != std::string::npos);
  }
}

TEST_CASE("CUDA code generation: every kernel of these models compiles with NVRTC (for sm_90 with a GPU, to "
          "compute_90 PTX without), in float32, bfloat16 and float16 storage", "[cuda][codegen]") {
  if (!fb::cuda::nvrtc_available()) {
    WARN("NVRTC not found: skipped");
    return;
  }
  using X = fb::input_leaf<0, float, fb::shape<fb::dyn, 96>>;
  using V = fb::input_leaf<1, float, fb::shape<96>>;
  using M = fb::input_leaf<1, float, fb::shape<96, 96>>;
  using B = fb::input_leaf<2, float, fb::shape<96>>;
  std::vector<fb::jit::rendered_cuda_kernel> kernels;
  int spatial_units = 0;
  auto add = [&]<class E>(E*, std::size_t rows) {
    using Prog = fb::cpu::program<float, E>;
    using D = fb::jit::dynamic_function<Prog, fb::jit::cuda_target>;
    fb::jit::guard g;
    g.pattern.assign(3, fb::dims{});
    for (std::size_t i = 0; i < Prog::N; ++i) {
      const auto& n = Prog::nodes[i];
      if (n.desc.kind != fb::node_kind::input) continue;
      fb::dims d = n.desc.shape;
      if (d.extent[0] == fb::dyn) d.extent[0] = rows;  // rows == 0: symbolic
      if (rows == 0 && n.desc.shape.extent[0] == fb::dyn) d.extent[0] = fb::symbol(0);
      g.pattern[n.desc.input_index] = d;
    }
    g.unit_inner.assign(3, true);
    g.aligned.assign(3, true);
    typename D::program_t p;
    D::specialise_into(p, g);
    for (int k = 0; k < p.plan.n_kernels; ++k) {
      if (D::generated(p.plan.kernels[k]))  // a conv's epilogue too
        for (fb::dtype t : {fb::dtype::f32, fb::dtype::bf16, fb::dtype::f16})
          kernels.push_back(fb::jit::render_cuda_kernel(p.nodes, p.plan, k, t, p.unit_inner));
      if (p.plan.kernels[k].kind == fb::plan::kernel_kind::spatial) {
        kernels.push_back(fb::jit::render_cuda_spatial(p.nodes[p.plan.kernels[k].node], fb::dtype::f32));
        ++spatial_units;
      }
    }
  };
  using X4 = fb::input_leaf<0, float, fb::shape<fb::dyn, 3, 12, 12>>;
  using W4 = fb::input_leaf<1, float, fb::shape<8, 3, 3, 3>>;
  using B4 = fb::input_leaf<2, float, fb::shape<8>>;
  auto conv = [](auto x, auto w, auto b) { return fb::max_pool2d<2>(fb::relu(fb::conv2d<fb::stride<2>, fb::padding<1>>(x, w, b))); };
  for (std::size_t rows : {std::size_t{0}, std::size_t{5}}) {
    add(static_cast<decltype(conv(X4{}, W4{}, B4{}))*>(nullptr), rows);
    add(static_cast<decltype(w1(X{}, V{}, B{}))*>(nullptr), rows);
    add(static_cast<decltype(w2(X{}, V{}, B{}))*>(nullptr), rows);
    add(static_cast<decltype(mlp(X{}, M{}, B{}))*>(nullptr), rows);
    add(static_cast<decltype(cols(X{}, V{}))*>(nullptr), rows);
  }
  // attention(): the tensor-core entry (16-bit storage, head dims 64 and 128, causal or not) and
  // the generic one (float32, and head dims the tensor-core entry does not take).
  auto attention_node = [](std::size_t e, std::size_t ev, bool causal, fb::ir::node* q, fb::ir::node* v) {
    fb::ir::node n;
    n.desc.kind = fb::node_kind::attention;
    n.desc.axis = causal ? 1 : 0;
    n.desc.shape = fb::dims{4, {2, fb::symbol(0), 3, ev}};
    q->desc.shape = fb::dims{4, {2, fb::symbol(0), 3, e}};
    v->desc.shape = fb::dims{4, {2, fb::symbol(0), 3, ev}};
    return n;
  };
  struct variant {
    fb::dtype t;
    std::size_t e, ev;
    bool causal, tensor_cores;
  };
  for (const variant& a : {variant{fb::dtype::bf16, 64, 64, true, true}, variant{fb::dtype::f16, 128, 128, false, true},
                           variant{fb::dtype::f32, 64, 64, true, false}, variant{fb::dtype::bf16, 40, 24, false, false}}) {
    fb::ir::node q, v;
    const fb::ir::node n = attention_node(a.e, a.ev, a.causal, &q, &v);
    kernels.push_back(fb::jit::render_cuda_attention(n, q, v, a.t));
    CHECK(kernels.back().tensor_cores == a.tensor_cores);
  }
  CHECK(spatial_units == 4);  // conv2d and max_pool2d, at two batches
  // Every spatial op, embedding and its gradient (ids of rank 1 and 2), pad (one and two
  // operands), in each storage type (backend/cuda/spatial_kernels.hpp).
  for (fb::dtype t : {fb::dtype::f32, fb::dtype::bf16, fb::dtype::f16}) {
    for (int op = 1; op <= 7; ++op) {
      fb::ir::node n;
      n.desc.kind = fb::node_kind::spatial;
      n.desc.win.op = static_cast<fb::spatial_op>(op);
      n.desc.shape = fb::dims{4, {2, 3, 5, 5}};
      kernels.push_back(fb::jit::render_cuda_spatial(n, t));
    }
    for (int variant : {0, 1})
      for (std::size_t rank : {std::size_t{1}, std::size_t{2}}) {
        fb::ir::node n;
        n.desc.kind = fb::node_kind::gather;
        n.desc.variant = variant;
        n.desc.shape = fb::dims{2, {50, 8}};
        kernels.push_back(fb::jit::render_cuda_gather(n, rank, t));
      }
    for (int operands : {1, 2}) {
      fb::ir::node n;
      n.desc.kind = fb::node_kind::pad;
      n.desc.axis = 1;
      n.desc.shape = fb::dims{3, {2, 12, 7}};
      n.n_inputs = operands;
      kernels.push_back(fb::jit::render_cuda_pad(n, t));
    }
  }
  REQUIRE(kernels.size() >= 28);
  for (const auto& k : kernels) CHECK(k.source.find("fusebox_kernel_v1(") != std::string::npos);
  // With a GPU, down to a cubin as the backend builds it; without one (CI), to PTX only, as
  // tests/jit/fuzz_ir.cpp does: every code-generation error shows there, and ptxas, which only
  // adds register and shared-memory limits, was most of this test's time on a machine without a GPU.
  try {
    const std::string unit = fb::jit::make_cuda_unit(kernels).source;
    if (fb::cuda::available()) {
      const auto built = fb::cuda::nvrtc_compile(unit, "compiled_models", "sm_90");
      CHECK(built.cubin.size() > 4);
    } else {
      fb::cuda::nvrtc_check(unit, "compiled_models", "compute_90");
    }
  } catch (const fb::cuda::nvrtc_error& e) {
    FAIL(e.what());
  }
}
