// bench/peers/torch_conv_missing.cpp: stands in for peers/torch_conv.cpp where libtorch is not found:
// the peer's rows are left out (bench/conv.cpp checks for an empty function).
#include "torch_conv.hpp"

namespace fusebox::bench {
std::function<void()> torch_conv_block(const conv_block_problem&, unsigned, std::string& config) {
  config = "libtorch not found";
  return {};
}
std::function<void()> torch_conv_block_train(const conv_block_problem&, const float*, unsigned, std::string& config) {
  config = "libtorch not found";
  return {};
}
}  // namespace fusebox::bench
