// tests/compile/explain.cpp: explain(model, args...) (include/fusebox/explain.hpp) names every kernel
// the planner makes, with its fused ops, loop and traffic, and returns what it prints. The plans of
// the reference workloads are checked in composite.cpp; graph breaks in graph_break.cpp.
#include <iostream>
#include <sstream>
#include <string>

#include <catch2/catch.hpp>

#include <fusebox/fusebox.hpp>

#include "../support/check.hpp"

namespace fb = fusebox;
using fbt::rel_diff;
using fbt::to_double_dyn;

namespace {
bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

/// Captures what is written to std::cout while it lives.
struct capture_cout {
  std::ostringstream text;
  std::streambuf* saved = std::cout.rdbuf(text.rdbuf());
  ~capture_cout() { std::cout.rdbuf(saved); }
};

}  // namespace

TEST_CASE("explain() lists every kernel with its ops", "[compile][explain]") {
  fb::tensor<float, fb::shape<17, 33>> x;
  fb::tensor<float, fb::shape<33, 9>> w;
  fbt::fill_signed(x, 51, 0.05, 3.0);
  fbt::fill_signed(w, 52, 0.05, 1.0);
  // A column reduction, a row kernel that uses it, and a matmul with an epilogue.
  auto model = [](auto x, auto w) {
    const auto centered = x - fb::mean(x, fb::axis<0>, fb::keepdim);
    return fb::relu(fb::matmul(fb::softmax(centered), w));
  };
  const std::string plan = fb::explain_text(model, x, w);
  INFO(plan);
  CHECK(contains(plan, "1 segment(s), 0 graph break(s)"));
  CHECK(contains(plan, "[reduce_cols] mean"));
  CHECK(contains(plan, "[rows] sub, max, sub, exp, sum, div"));
  CHECK(contains(plan, "[matmul] matmul + epilogue(relu)"));
  CHECK(contains(plan, "gemm [17, 33] x [33, 9] -> [17, 9]"));
  CHECK(contains(plan, "arena:"));
  // Each kernel line has its loop and its traffic.
  std::size_t kernels = 0, loops = 0, moves = 0;
  for (std::size_t at = 0; (at = plan.find("  kernel ", at)) != std::string::npos; ++at) ++kernels;
  for (std::size_t at = 0; (at = plan.find("loop: ", at)) != std::string::npos; ++at) ++loops;
  for (std::size_t at = 0; (at = plan.find("moves ", at)) != std::string::npos; ++at) ++moves;
  CHECK(kernels == 3);
  CHECK(loops == kernels);
  CHECK(moves == kernels);
  // explain() prints the same text and returns it.
  std::string returned, printed;
  {
    capture_cout out;
    returned = fb::explain(model, x, w);
    printed = out.text.str();
  }
  CHECK(returned == plan);
  CHECK(printed == plan);
  // And the model it describes computes the right thing.
  CHECK(rel_diff(fb::compile(model)(x, w), fb::eager(model)(to_double_dyn(x), to_double_dyn(w))) <= 2e-6);
}

TEST_CASE("explain() on the run-time path: the selected specialisation's kernels with loops, bytes and flops at "
          "the call's extents",
          "[compile][explain][jit]") {
  // The same model as above on a dyn batch: the report is the plan's at this call's extents, each
  // kernel as the CPU back end runs it (generated, or on the host), the same lines as the static
  // path's.
  fb::tensor<float, fb::shape<fb::dyn, 33>> x(fb::dims{2, {17, 33}});
  fb::tensor<float, fb::shape<33, 9>> w;
  fbt::fill_signed(x, 53, 0.05, 3.0);
  fbt::fill_signed(w, 54, 0.05, 1.0);
  auto model = [](auto x, auto w) { return fb::relu(fb::matmul(fb::softmax(x), w)); };
  const std::string plan = fb::explain_text(model, x, w);
  INFO(plan);
  CHECK(contains(plan, "run-time path on the cpu (dyn extents)"));
  CHECK(contains(plan, "[17, 33] [33, 9]"));  // the guard of the specialisation
  CHECK(contains(plan, "[rows] max, sub, exp, sum, div"));
  CHECK(contains(plan, "generated: rows over [17, 33]"));
  CHECK(contains(plan, "[matmul] matmul + epilogue(relu)"));
  CHECK(contains(plan, "gemm [17, 33] x [33, 9] -> [17, 9]; on the host, generated epilogue"));
  // 2·17·9·33 flops of the product and one of the relu per element: numbers, not symbols.
  CHECK(contains(plan, "10.3 kflop"));
  CHECK(contains(plan, "at this call's extents"));
  std::size_t kernels = 0, loops = 0, moves = 0;
  for (std::size_t at = 0; (at = plan.find("  kernel ", at)) != std::string::npos; ++at) ++kernels;
  for (std::size_t at = 0; (at = plan.find("loop: ", at)) != std::string::npos; ++at) ++loops;
  for (std::size_t at = 0; (at = plan.find("moves ", at)) != std::string::npos; ++at) ++moves;
  CHECK(kernels == 2);
  CHECK(loops == kernels);
  CHECK(moves == kernels);
  // With options it ends with the CPU's modes.
  CHECK(contains(fb::explain_text(model, fb::options{.mode = fb::mode::reduce_overhead}, x, w),
                 "modes on the CPU:\n  default_"));
}

TEST_CASE("explain() names the algorithm each convolution runs by: Winograd where it applies, im2col + gemm elsewhere",
          "[compile][explain]") {
  // The T2 CNN's two layers at batch 1: the second (32 -> 64 channels, 5x5) qualifies for
  // Winograd F(4x4, 5x5), which the CPU takes by default; the first (one input channel) does not.
  auto model = [](auto x, auto w1, auto w2) { return fb::conv2d(fb::max_pool2d<2>(fb::conv2d(x, w1)), w2); };
  fb::tensor<float, fb::shape<1, 1, 28, 28>> x;
  fb::tensor<float, fb::shape<32, 1, 5, 5>> w1;
  fb::tensor<float, fb::shape<64, 32, 5, 5>> w2;
  x.fill_random(1);
  w1.fill_random(2);
  w2.fill_random(3);
  const std::string plan = fb::explain_text(model, x, w1, w2);
  INFO(plan);
  CHECK(contains(plan, "[1, 1, 28, 28], [32, 1, 5, 5] -> [1, 32, 24, 24], stride 1x1, padding 0x0; im2col + gemm"));
  CHECK(contains(plan, "[1, 32, 12, 12], [64, 32, 5, 5] -> [1, 64, 8, 8], stride 1x1, padding 0x0; Winograd F(4x4, 5x5), "
                        "channels in the vector lanes (few tiles)"));
}
