// fusebox/nn/nn.hpp: everything training needs, in one include: modules, losses, the step and
// inference functions, optimizers and schedules, safetensors.
#pragma once

#include "fusebox/io/safetensors.hpp"
#include "fusebox/nn/activation.hpp"
#include "fusebox/nn/attention.hpp"
#include "fusebox/nn/dropout.hpp"
#include "fusebox/nn/embedding.hpp"
#include "fusebox/nn/gpt2.hpp"
#include "fusebox/nn/layer_norm.hpp"
#include "fusebox/nn/linear.hpp"
#include "fusebox/nn/loss.hpp"
#include "fusebox/nn/module.hpp"
#include "fusebox/nn/parameters.hpp"
#include "fusebox/nn/sequential.hpp"
#include "fusebox/nn/step.hpp"
#include "fusebox/optim/adamw.hpp"
#include "fusebox/optim/lr_scheduler.hpp"
#include "fusebox/optim/sgd.hpp"
