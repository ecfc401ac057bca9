// Proves the compile-fail machinery (fusebox_add_compile_fail in tests/CMakeLists.txt): without
// FUSEBOX_SHOULD_FAIL this file must compile; with it, the build must fail with the message below.
// Real compile-fail tests follow the same pattern: the only difference between the two builds is
// the one misuse guarded by FUSEBOX_SHOULD_FAIL, so the failure is known to come from it.
#include <fusebox/version.hpp>

static_assert(fusebox::version_major >= 0);

#ifdef FUSEBOX_SHOULD_FAIL
static_assert(sizeof(int) == 0, "fusebox example: this must fail");
#endif
