// fusebox/fusebox.hpp: the umbrella header: everything a model needs, on the CPU (static shapes
// and dyn extents) and on the GPU. Smaller entry headers, each a superset of the one before, parse
// only what their programs use (README, "Entry headers"): <fusebox/cpu.hpp> (static shapes on the
// CPU), <fusebox/jit.hpp> (+ dyn extents), <fusebox/cuda.hpp> (+ the GPU); <fusebox/train.hpp> and
// <fusebox/data.hpp> for training and data loading.
#pragma once

#include "fusebox/cpu.hpp"
#include "fusebox/cuda.hpp"
#include "fusebox/jit.hpp"
