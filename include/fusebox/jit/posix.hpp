// Forwarding header (the fusebox 0.1 path), kept for one release: include
// fusebox/runtime/posix.hpp, where the folders show the flow (docs/architecture.md).
#pragma once
#include "fusebox/runtime/posix.hpp"
