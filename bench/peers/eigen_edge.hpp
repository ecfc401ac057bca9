// bench/peers/eigen_edge.hpp: the Eigen 3.4 peer of bench/edge_latency.cpp (issue 23), declared
// without Eigen's headers so the fusebox translation unit never sees them.
// Depends on: ../edge_models.hpp.
#pragma once

#include <memory>
#include <string>

#include "../edge_models.hpp"

namespace fusebox::bench::edge {

/// The T2 CNN as an Eigen user would write it: im2col then Eigen's GEMM per convolution, pooling,
/// bias and relu as Eigen array expressions, one thread.
std::unique_ptr<runner> eigen_t2_cnn(const t2_cnn_params& p);
/// The MLP as two Eigen vector-matrix products with bias (and relu) expressions, one thread.
std::unique_ptr<runner> eigen_mlp(const mlp_params& p);

/// Which Eigen and how it runs, for the records.
std::string eigen_edge_describe();

}  // namespace fusebox::bench::edge
