// backend/cuda/graph.hpp: CUDA graphs. `capture` records what a function queues on a stream (nothing
// runs while recording) into a graph; `instantiate` makes it launchable; a launch then replays
// the whole recorded sequence with one driver call, which is what `mode::reduce_overhead` buys:
// no per-kernel launch cost on the host and no gaps between kernels on the device.
//
// Capture runs in thread-local mode: a call on this thread that is not allowed while capturing
// (cuMemAlloc, a synchronisation) fails at once instead of silently breaking the graph; other
// threads of the process (a data loader's copies) are not affected. `update` rewrites an
// instantiated graph with the parameters of a newly captured one of the same shape (new
// addresses, new scalar values), much cheaper than instantiating again; the driver refuses when
// the node structure differs (cuBLASLt may choose other kernels for other alignments).
// Depends on: backend/cuda/driver.hpp, core/linkage.hpp.
#pragma once

#include <utility>

#include "fusebox/backend/cuda/driver.hpp"
#include "fusebox/core/linkage.hpp"

namespace fusebox::cuda {

inline constexpr CUresult CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE = 910;

/// A recorded graph (CUgraph), destroyed with this object.
class graph {
 public:
  graph() = default;
  explicit graph(CUgraph g) noexcept : handle_(g) {}
  graph(graph&& other) noexcept : handle_(std::exchange(other.handle_, nullptr)) {}
  graph& operator=(graph&& other) noexcept;
  graph(const graph&) = delete;
  graph& operator=(const graph&) = delete;
  ~graph() { release(); }

  CUgraph get() const noexcept { return handle_; }

 private:
  void release() noexcept {
    if (handle_) driver().graph_destroy(handle_);
    handle_ = nullptr;
  }
  CUgraph handle_ = nullptr;
};

/// An instantiated graph (CUgraphExec), launchable on any stream of its context.
class graph_exec {
 public:
  graph_exec() = default;
  explicit graph_exec(CUgraphExec e) noexcept : handle_(e) {}
  graph_exec(graph_exec&& other) noexcept : handle_(std::exchange(other.handle_, nullptr)) {}
  graph_exec& operator=(graph_exec&& other) noexcept;
  graph_exec(const graph_exec&) = delete;
  graph_exec& operator=(const graph_exec&) = delete;
  ~graph_exec() { release(); }

  CUgraphExec get() const noexcept { return handle_; }
  explicit operator bool() const noexcept { return handle_ != nullptr; }

  /// Queues one replay on `on`.
  void launch(CUstream on) const { check(driver().graph_launch(handle_, on), "cuGraphLaunch"); }

 private:
  void release() noexcept {
    if (handle_) driver().graph_exec_destroy(handle_);
    handle_ = nullptr;
  }
  CUgraphExec handle_ = nullptr;
};

/// Records what `enqueue()` queues on `on` into a graph. If `enqueue` throws, the capture is
/// ended (the stream stays usable) and the exception propagates.
template <class Enqueue>
graph capture(CUstream on, Enqueue&& enqueue) {
  current_device();
  const driver_api& api = driver();
  check(api.stream_begin_capture(on, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL), "cuStreamBeginCapture");
  try {
    enqueue();
  } catch (...) {
    CUgraph partial = nullptr;
    api.stream_end_capture(on, &partial);
    graph discard(partial);
    throw;
  }
  CUgraph recorded = nullptr;
  check(api.stream_end_capture(on, &recorded), "cuStreamEndCapture",
        "a call that is not allowed while capturing a CUDA graph ran during the capture");
  return graph(recorded);
}

FUSEBOX_RUNTIME_API graph_exec instantiate(const graph& g);

/// Gives `exec` the node parameters of `g`; false where the driver refuses because the two
/// graphs differ in structure (then instantiate `g` instead).
FUSEBOX_RUNTIME_API bool update(graph_exec& exec, const graph& g);

// Definitions: compiled here, or once in the FUSEBOX_IMPLEMENTATION unit (core/linkage.hpp).
#if FUSEBOX_RUNTIME_BODIES
FUSEBOX_RUNTIME_API graph& graph::operator=(graph&& other) noexcept {
  if (this != &other) {
    release();
    handle_ = std::exchange(other.handle_, nullptr);
  }
  return *this;
}

FUSEBOX_RUNTIME_API graph_exec& graph_exec::operator=(graph_exec&& other) noexcept {
  if (this != &other) {
    release();
    handle_ = std::exchange(other.handle_, nullptr);
  }
  return *this;
}

FUSEBOX_RUNTIME_API graph_exec instantiate(const graph& g) {
  CUgraphExec exec = nullptr;
  check(driver().graph_instantiate(&exec, g.get(), 0), "cuGraphInstantiateWithFlags");
  return graph_exec(exec);
}

FUSEBOX_RUNTIME_API bool update(graph_exec& exec, const graph& g) {
  CUgraphExecUpdateResultInfo info;
  const CUresult r = driver().graph_exec_update(exec.get(), g.get(), &info);
  if (r == CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE) return false;
  check(r, "cuGraphExecUpdate");
  return true;
}
#endif

}  // namespace fusebox::cuda
