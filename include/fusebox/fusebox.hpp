// fusebox/fusebox.hpp: the umbrella header: everything a model needs.
#pragma once

#include "fusebox/core/dtype.hpp"
#include "fusebox/core/errors.hpp"
#include "fusebox/core/shape.hpp"
#include "fusebox/core/tensor.hpp"
#include "fusebox/ops/attention.hpp"
#include "fusebox/ops/capture.hpp"
#include "fusebox/ops/composite.hpp"
#include "fusebox/ops/elementwise.hpp"
#include "fusebox/ops/layout.hpp"
#include "fusebox/ops/matmul.hpp"
#include "fusebox/ops/reduce.hpp"
#include "fusebox/graph_break.hpp"
#include "fusebox/ab.hpp"
#include "fusebox/compile.hpp"
#include "fusebox/explain.hpp"
#include "fusebox/version.hpp"
