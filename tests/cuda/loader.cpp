// Tests for include/fusebox/backend/cuda/library.hpp, driver.hpp and nvrtc.hpp that need no GPU: on a
// machine without one (CI), asking for the driver is a backend_unavailable that names libcuda and
// the fix, every time, and nothing crashes; NVRTC, which needs no GPU, compiles a kernel to an
// sm_90 cubin, and a broken kernel is an nvrtc_error carrying the log and the source.
//
// Run a second time by CTest as cuda.loader.stub, with the CUDA toolkit's link-time stub libcuda
// on LD_LIBRARY_PATH and FUSEBOX_TEST_EXPECT_STUB=1: the stub defines every driver function, so
// failing in cuInit with CUDA_ERROR_STUB_LIBRARY (rather than in dlsym) proves that every symbol
// the driver table binds exists under the name used.
#include <catch2/catch.hpp>

#include <cstdlib>
#include <optional>
#include <regex>
#include <string>
#include <vector>

#include "fusebox/backend/cuda/driver.hpp"
#include "fusebox/backend/cuda/library.hpp"
#include "fusebox/backend/cuda/memory.hpp"
#include "fusebox/backend/cuda/nvrtc.hpp"
#include "fusebox/core/errors.hpp"

namespace cuda = fusebox::cuda;
using Catch::Matchers::Contains;

namespace {

class scoped_env {
 public:
  scoped_env(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value)
      ::setenv(name, value, 1);
    else
      ::unsetenv(name);
  }
  ~scoped_env() {
    if (old_)
      ::setenv(name_, old_->c_str(), 1);
    else
      ::unsetenv(name_);
  }
  scoped_env(const scoped_env&) = delete;
  scoped_env& operator=(const scoped_env&) = delete;

 private:
  const char* name_;
  std::optional<std::string> old_;
};

std::string message_of(auto&& call) {
  try {
    call();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

bool expect_stub() {
  const char* env = std::getenv("FUSEBOX_TEST_EXPECT_STUB");
  return env && std::string(env) == "1";
}

const char* saxpy_source = R"(
extern "C" __global__ void saxpy(int n, float a, const float* x, const float* y, float* out) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = a * x[i] + y[i];
}
)";

}  // namespace

TEST_CASE("without a GPU, the CUDA driver is backend_unavailable naming libcuda and the fix",
          "[cuda][loader]") {
  if (cuda::available()) {
    WARN("a CUDA device is present: the no-GPU case is skipped (tests/cuda/runtime.cpp runs instead)");
    return;
  }
  CHECK_FALSE(cuda::available());  // asking twice neither throws nor changes the answer
  std::string first;
  try {
    cuda::driver();
    FAIL("driver() returned without a usable device");
  } catch (const fusebox::backend_unavailable& e) {
    first = e.what();
  }
  INFO(first);
  CHECK_THAT(first, Contains("the CUDA backend is unavailable"));
  CHECK_THAT(first, Contains("libcuda"));
  CHECK_THAT(first, Contains("To fix:"));
  if (expect_stub()) {
    // The stub loaded, every symbol resolved, and cuInit said what it is.
    CHECK_THAT(first, Contains("cuInit(0) failed with CUDA_ERROR_STUB_LIBRARY"));
    CHECK_THAT(first, Contains("stubs"));
  } else if (first.find("cannot load") != std::string::npos) {
    // No driver at all: each soname tried is listed with the loader's error.
    CHECK_THAT(first, Contains("libcuda.so.1 ("));
    CHECK_THAT(first, Contains("libcuda.so ("));
    CHECK_THAT(first, Contains("install the NVIDIA driver"));
  }

  // The failure is kept: the same exception, the same message, every time and from every entry.
  CHECK(message_of([] { cuda::driver(); }) == first);
  CHECK_THROWS_AS(cuda::current_device(), fusebox::backend_unavailable);
  CHECK_THROWS_AS(cuda::device_buffer(64), fusebox::backend_unavailable);
  CHECK_THROWS_AS(cuda::stream(), fusebox::backend_unavailable);
  CHECK_THROWS_AS(cuda::copy_to_device(0, nullptr, 16), fusebox::backend_unavailable);
  // Empty objects need no driver: constructing and destroying them is fine without one.
  cuda::device_buffer empty;
  CHECK(empty.empty());
  empty.ensure(0);
  CHECK(empty.get() == 0);
}

TEST_CASE("the stub libcuda resolves every driver function", "[cuda][loader][stub]") {
  if (!expect_stub()) {
    WARN("FUSEBOX_TEST_EXPECT_STUB is not 1: skipped (CTest runs it as cuda.loader.stub)");
    return;
  }
  if (cuda::available()) {
    WARN("a real libcuda with a device was loaded instead of the stub: skipped");
    return;
  }
  const std::string message = message_of([] { cuda::driver(); });
  INFO(message);
  CHECK_THAT(message, Contains("CUDA_ERROR_STUB_LIBRARY"));
  CHECK_THAT(message, !Contains("lacks the function"));
}

TEST_CASE("open_first lists every name tried with the loader's error", "[cuda][loader]") {
  const std::string message = message_of([] {
    cuda::open_first("libnothing (a test library)",
                     {"libfusebox_no_such_library.so.7", "/nonexistent/dir/libnothing.so"},
                     "do nothing, this is a test");
  });
  INFO(message);
  CHECK_THAT(message, Contains("the CUDA backend is unavailable: cannot load libnothing (a test library)"));
  CHECK_THAT(message, Contains("libfusebox_no_such_library.so.7 ("));
  CHECK_THAT(message, Contains("/nonexistent/dir/libnothing.so ("));
  CHECK_THAT(message, Contains("No such file"));
  CHECK_THAT(message, Contains("To fix: do nothing, this is a test"));
  CHECK_THROWS_AS(cuda::open_first("x", {"libfusebox_no_such_library.so.7"}, ""),
                  fusebox::backend_unavailable);
}

TEST_CASE("toolkit libraries are looked for in FUSEBOX_CUDA_HOME, CUDA_HOME, by soname, then "
          "/usr/local/cuda", "[cuda][loader]") {
  scoped_env home("FUSEBOX_CUDA_HOME", "/opt/my-cuda/");
  scoped_env other("CUDA_HOME", "/opt/other-cuda");
  const auto candidates = cuda::toolkit_library_candidates({"libnvrtc.so.13", "libnvrtc.so"});
  const std::vector<std::string> expected = {
      "/opt/my-cuda/lib64/libnvrtc.so.13",    "/opt/my-cuda/lib64/libnvrtc.so",
      "/opt/my-cuda/lib/libnvrtc.so.13",      "/opt/my-cuda/lib/libnvrtc.so",
      "/opt/other-cuda/lib64/libnvrtc.so.13", "/opt/other-cuda/lib64/libnvrtc.so",
      "/opt/other-cuda/lib/libnvrtc.so.13",   "/opt/other-cuda/lib/libnvrtc.so",
      "libnvrtc.so.13",                       "libnvrtc.so",
      "/usr/local/cuda/lib64/libnvrtc.so.13", "/usr/local/cuda/lib64/libnvrtc.so"};
  CHECK(candidates == expected);

  scoped_env same("CUDA_HOME", "/usr/local/cuda");
  scoped_env unset("FUSEBOX_CUDA_HOME", nullptr);
  const auto deduplicated = cuda::toolkit_library_candidates({"libnvrtc.so.13"});
  const std::vector<std::string> expected_once = {"/usr/local/cuda/lib64/libnvrtc.so.13",
                                                  "/usr/local/cuda/lib/libnvrtc.so.13",
                                                  "libnvrtc.so.13"};
  CHECK(deduplicated == expected_once);
}

TEST_CASE("NVRTC compiles a kernel to an sm_90 cubin without a GPU", "[cuda][nvrtc]") {
  if (!cuda::nvrtc_available()) {
    WARN("libnvrtc cannot be loaded: skipped. " << message_of([] { cuda::nvrtc(); }));
    return;
  }
  const std::string version = cuda::nvrtc_version();
  INFO("NVRTC " << version << " from " << cuda::nvrtc().path);
  CHECK(std::regex_match(version, std::regex("[0-9]+\\.[0-9]+")));

  const auto result = cuda::nvrtc_compile(saxpy_source, "saxpy.cu", "sm_90");
  REQUIRE(result.cubin.size() > 64);
  // An ELF file (SASS), not PTX text: magic, 64-bit class, and e_machine EM_CUDA (190).
  CHECK(result.cubin[0] == 0x7f);
  CHECK(result.cubin[1] == 'E');
  CHECK(result.cubin[2] == 'L');
  CHECK(result.cubin[3] == 'F');
  CHECK(result.cubin[4] == 2);
  const auto machine = static_cast<unsigned char>(result.cubin[18]) |
                       (static_cast<unsigned char>(result.cubin[19]) << 8);
  CHECK(machine == 190);
  const std::vector<std::string> options = {"-arch=sm_90", "-std=c++17", "-default-device"};
  CHECK(result.options == options);  // and no --use_fast_math unless asked

  const auto fast = cuda::nvrtc_compile(saxpy_source, "saxpy.cu", "sm_90", {"--use_fast_math"});
  CHECK(fast.options.back() == "--use_fast_math");
  CHECK(!fast.cubin.empty());
}

TEST_CASE("a kernel that does not compile is an nvrtc_error with the log and the source",
          "[cuda][nvrtc]") {
  if (!cuda::nvrtc_available()) {
    WARN("libnvrtc cannot be loaded: skipped. " << message_of([] { cuda::nvrtc(); }));
    return;
  }
  const std::string broken = R"(
extern "C" __global__ void broken(float* x) {
  x[threadIdx.x] = fusebox_undefined_name * 2.0f;
}
)";
  try {
    cuda::nvrtc_compile(broken, "broken.cu", "sm_90");
    FAIL("nvrtc_compile accepted a kernel using an undefined name");
  } catch (const cuda::nvrtc_error& e) {
    INFO(e.what());
    CHECK_THAT(e.log, Contains("fusebox_undefined_name"));
    CHECK_THAT(e.log, Contains("error"));
    CHECK(e.source == broken);
    CHECK_THAT(std::string(e.what()), Contains("broken.cu"));
    CHECK_THAT(std::string(e.what()), Contains("nvrtcCompileProgram"));
    CHECK_THAT(std::string(e.what()), Contains("-arch=sm_90"));
  }

  // An option NVRTC does not know is its error too, naming the option.
  try {
    cuda::nvrtc_compile(saxpy_source, "saxpy.cu", "sm_90", {"--fusebox-no-such-option"});
    FAIL("nvrtc_compile accepted an unknown option");
  } catch (const cuda::nvrtc_error& e) {
    INFO(e.what());
    CHECK_THAT(std::string(e.what()), Contains("--fusebox-no-such-option"));
  }
}

TEST_CASE("nvrtc_compile wants a real architecture, so that it yields a cubin", "[cuda][nvrtc]") {
  // Checked before NVRTC is loaded: this holds on every machine.
  for (const char* arch : {"compute_90", "sm_", "90", "sm_90x", ""}) {
    INFO(arch);
    CHECK_THROWS_AS(cuda::nvrtc_compile(saxpy_source, "saxpy.cu", arch), fusebox::invalid_argument);
  }
  CHECK(cuda::detail::is_real_arch("sm_90a"));
  CHECK(cuda::detail::is_real_arch("sm_100f"));
  CHECK(cuda::detail::is_real_arch("sm_120"));
}

TEST_CASE("nvrtc_check compiles to PTX for a virtual architecture and reports errors as nvrtc_compile does",
          "[cuda][nvrtc]") {
  CHECK_THROWS_AS(cuda::nvrtc_check(saxpy_source, "saxpy.cu", "sm_90"), fusebox::invalid_argument);
  if (!cuda::nvrtc_available()) {
    WARN("libnvrtc cannot be loaded: skipped. " << message_of([] { cuda::nvrtc(); }));
    return;
  }
  CHECK_NOTHROW(cuda::nvrtc_check(saxpy_source, "saxpy.cu"));
  const std::string broken = R"(
extern "C" __global__ void broken(float* x) { x[threadIdx.x] = fusebox_other_undefined_name; }
)";
  try {
    cuda::nvrtc_check(broken, "broken.cu", "compute_90");
    FAIL("nvrtc_check accepted a kernel using an undefined name");
  } catch (const cuda::nvrtc_error& e) {
    INFO(e.what());
    CHECK_THAT(e.log, Contains("fusebox_other_undefined_name"));
    CHECK(e.source == broken);
    CHECK_THAT(std::string(e.what()), Contains("-arch=compute_90"));
  }
}
