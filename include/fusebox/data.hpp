// fusebox/data.hpp: the data loader (datasets, samplers, collation, worker processes, bucketing by
// length, progress) and the Fashion-MNIST reader. Needs nothing else of fusebox but tensors.
#pragma once

#include "fusebox/core/errors.hpp"
#if !FUSEBOX_HAS_EXCEPTIONS
#error "fusebox: <fusebox/data.hpp> (the data loader) needs C++ exceptions; a build with -fno-exceptions can use <fusebox/cpu.hpp> (static shapes on the CPU) and <fusebox/io/safetensors.hpp> (core/errors.hpp)"
#endif

#include "fusebox/data/bucketing.hpp"
#include "fusebox/data/collate.hpp"
#include "fusebox/data/dataset.hpp"
#include "fusebox/data/fashion_mnist.hpp"
#include "fusebox/data/loader.hpp"
#include "fusebox/data/progress.hpp"
#include "fusebox/data/sampler.hpp"
