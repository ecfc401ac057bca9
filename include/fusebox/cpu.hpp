// fusebox/cpu.hpp: the entry header for models whose shapes are all static, on the CPU: tensors,
// every op, compile() (its kernels instantiated with this translation unit), eager(), explain(),
// ab(), graph breaks, and gradients of static shapes (compile(grad(...))). It parses neither the
// run-time path (generated kernels, the host compiler, the disk cache) nor the CUDA back end, and a
// program built from it links no JIT, CUDA, dlopen or filesystem code (issue 22).
//
// What it leaves out, and the header that brings it:
//   dyn extents (the run-time path)        <fusebox/jit.hpp>: a call that needs it is a build
//                                          error naming that header
//   device tensors, backend::cuda          <fusebox/cuda.hpp>
//   max_autotune's winners on disk         <fusebox/jit.hpp> (without it, kept in memory only)
//   nn modules, optimizers, checkpoints    <fusebox/train.hpp>
//   the data loader                        <fusebox/data.hpp>
// <fusebox/fusebox.hpp> is the everything header.
#pragma once

#include "fusebox/core/dtype.hpp"
#include "fusebox/core/errors.hpp"
#include "fusebox/core/shape.hpp"
#include "fusebox/core/tensor.hpp"
#include "fusebox/ops/attention.hpp"
#include "fusebox/ops/capture.hpp"
#include "fusebox/ops/composite.hpp"
#include "fusebox/ops/conv.hpp"
#include "fusebox/ops/cumsum.hpp"
#include "fusebox/ops/elementwise.hpp"
#include "fusebox/ops/embedding.hpp"
#include "fusebox/ops/layout.hpp"
#include "fusebox/ops/matmul.hpp"
#include "fusebox/ops/pool.hpp"
#include "fusebox/ops/reduce.hpp"
#include "fusebox/graph_break.hpp"
#include "fusebox/ab.hpp"
#include "fusebox/compile.hpp"
#include "fusebox/autodiff/grad.hpp"
#include "fusebox/explain.hpp"
#include "fusebox/version.hpp"
