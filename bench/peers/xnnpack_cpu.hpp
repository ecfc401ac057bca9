// bench/peers/xnnpack_cpu.hpp: the XNNPACK peer of bench/edge_latency.cpp (issue 23), declared
// without xnnpack.h so the fusebox translation unit never sees it.
// Depends on: ../edge_models.hpp.
#pragma once

#include <memory>
#include <string>

#include "../edge_models.hpp"

namespace fusebox::bench::edge {

/// Each model as an XNNPACK subgraph (NHWC, weights converted from fusebox's layouts), made into a
/// runtime without a thread pool (one thread). run() rebinds its input and output only when their
/// addresses change, so a warm call is xnn_invoke_runtime alone. Throws std::runtime_error naming
/// the XNNPACK call that failed.
std::unique_ptr<runner> xnnpack_t2_cnn(const t2_cnn_params& p);
std::unique_ptr<runner> xnnpack_mlp(const mlp_params& p);

/// Which XNNPACK and how it runs, for the records.
std::string xnnpack_describe();

}  // namespace fusebox::bench::edge
