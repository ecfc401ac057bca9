// fusebox/train.hpp: training on top of <fusebox/jit.hpp>: nn modules and losses, the compiled
// training step, optimizers, learning-rate schedules, gradient clipping, checkpoints and
// safetensors. With <fusebox/cuda.hpp> as well, the step runs on device tensors (nn::to_device).
#pragma once

#include "fusebox/io/safetensors.hpp"
#include "fusebox/jit.hpp"
#include "fusebox/nn/nn.hpp"
#include "fusebox/optim/adamw.hpp"
#include "fusebox/optim/checkpoint.hpp"
#include "fusebox/optim/clip_grad.hpp"
#include "fusebox/optim/lr_scheduler.hpp"
#include "fusebox/optim/sgd.hpp"
