// fusebox/cuda.hpp: <fusebox/jit.hpp> and the CUDA back end: device tensors (cuda::tensor), compiled
// functions and gradients on them (kernels by NVRTC, products in cuBLASLt, CUDA graphs) and
// backend::cuda. The AdamW step on the device is <fusebox/optim/cuda_adamw.hpp>.
#pragma once

#include "fusebox/backend/cuda.hpp"
#include "fusebox/backend/cuda/uploader.hpp"  // batches staged to the device (data.hpp's pin_memory)
#include "fusebox/jit.hpp"
