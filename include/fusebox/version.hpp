#pragma once
// fusebox/version.hpp: the library version, for programs that report it and for the JIT cache
// key (DESIGN.md: the key covers the fusebox version). Depends on nothing.
// Keep equal to project(fusebox VERSION ...) in CMakeLists.txt: tests/build/smoke.cpp checks it.

namespace fusebox {

inline constexpr int version_major = 0;
inline constexpr int version_minor = 1;
inline constexpr int version_patch = 0;
inline constexpr const char* version_string = "0.1.0";

}  // namespace fusebox
