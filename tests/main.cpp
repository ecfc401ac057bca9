// The Catch2 main, compiled once into the object library fusebox_test_main and linked into every
// test executable (tests/CMakeLists.txt), so no test file defines CATCH_CONFIG_MAIN itself.
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>
