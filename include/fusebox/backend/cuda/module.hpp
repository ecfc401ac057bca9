// fusebox/backend/cuda/module.hpp: a loaded cubin (a CUDA module) and kernel launches.
//
// `module` owns what cuModuleLoadData returns and unloads it on destruction; `function(name)`
// looks a kernel up by its (extern "C", unmangled) name. `launch` checks the configuration
// before the driver sees it, raises the kernel's dynamic shared memory limit when a launch asks
// for more than the default 48 KiB (the driver refuses such launches otherwise), and reports a
// failed launch naming the kernel, grid, block and shared bytes.
//
// Spell the type `cuda::module` where a line would begin with it: in C++20 a line starting
// `module name` can be read as a module declaration by compilers with modules enabled.
//
// A launch that is accepted can still fail while it runs (an illegal address): like every
// asynchronous error, that surfaces at the next synchronisation (stream::sync()), not here.
//
// Depends on: the C++20 standard library, fusebox/core/{errors,linkage}.hpp, fusebox/backend/cuda/driver.hpp.
#pragma once

#include <cstddef>
#include <span>
#include <string>
#include <string_view>
#include <utility>

#include "fusebox/backend/cuda/driver.hpp"
#include "fusebox/core/errors.hpp"
#include "fusebox/core/linkage.hpp"

namespace fusebox::cuda {

/// Launch extents (cuda_runtime's dim3, without its header).
struct dim3 {
  unsigned x = 1, y = 1, z = 1;
};

class module {
 public:
  module() = default;
  /// Loads `image`, an ELF cubin such as nvrtc_compile returns. `name` is for messages.
  explicit module(std::span<const char> image, std::string name = "module");
  module(module&& other) noexcept
      : handle_(std::exchange(other.handle_, nullptr)), name_(std::move(other.name_)) {}
  module& operator=(module&& other) noexcept;
  module(const module&) = delete;
  module& operator=(const module&) = delete;
  ~module() { release(); }

  CUmodule get() const noexcept { return handle_; }

  /// The kernel `kernel` (its extern "C" name); throws driver_error naming both if it is absent.
  CUfunction function(const std::string& kernel) const;

 private:
  void release() noexcept;

  CUmodule handle_ = nullptr;
  std::string name_;
};

/// The default dynamic shared memory limit of a kernel; beyond it the kernel must opt in.
inline constexpr unsigned default_shared_bytes_limit = 48 * 1024;

/// Queues `f` on `on` with `args` (one pointer per kernel parameter, as cuLaunchKernel takes
/// them). `name` is for messages.
FUSEBOX_RUNTIME_API void launch(CUfunction f, dim3 grid, dim3 block, unsigned shared_bytes, CUstream on,
                                void** args, std::string_view name = "kernel");

// Definitions: compiled here, or once in the FUSEBOX_IMPLEMENTATION unit (core/linkage.hpp).
#if FUSEBOX_RUNTIME_BODIES
FUSEBOX_RUNTIME_API module::module(std::span<const char> image, std::string name) : name_(std::move(name)) {
  if (image.size() < 4 || image[0] != 0x7f || image[1] != 'E' || image[2] != 'L' || image[3] != 'F')
    FUSEBOX_THROW(invalid_argument("fusebox: module '" + name_ + "': the image (" +
                                   std::to_string(image.size()) + " bytes) is not an ELF cubin"));
  const auto& device = current_device();
  check(driver().module_load_data(&handle_, image.data()), "cuModuleLoadData",
        "module '" + name_ + "' (" + std::to_string(image.size()) + " bytes) on " + device.name +
            " (" + device.arch + ")");
}

FUSEBOX_RUNTIME_API module& module::operator=(module&& other) noexcept {
  if (this != &other) {
    release();
    handle_ = std::exchange(other.handle_, nullptr);
    name_ = std::move(other.name_);
  }
  return *this;
}

FUSEBOX_RUNTIME_API CUfunction module::function(const std::string& kernel) const {
  if (!handle_) FUSEBOX_THROW(invalid_argument("fusebox: function('" + kernel + "') on an empty module"));
  CUfunction f = nullptr;
  current_device();
  check(driver().module_get_function(&f, handle_, kernel.c_str()), "cuModuleGetFunction",
        "kernel '" + kernel + "' in module '" + name_ + "'");
  return f;
}

FUSEBOX_RUNTIME_API void module::release() noexcept {
  if (handle_) {
    try {
      current_device();
      driver().module_unload(handle_);
    } catch (...) {
    }
  }
  handle_ = nullptr;
}

FUSEBOX_RUNTIME_API void launch(CUfunction f, dim3 grid, dim3 block, unsigned shared_bytes, CUstream on, void** args,
                                std::string_view name) {
  auto where = [&] {
    auto extent = [](dim3 d) {
      // Appended piece by piece: "(" + std::to_string(...) trips GCC 12's -Wrestrict false positive.
      std::string s = "(";
      s += std::to_string(d.x);
      s += ", ";
      s += std::to_string(d.y);
      s += ", ";
      s += std::to_string(d.z);
      s += ")";
      return s;
    };
    return "kernel '" + std::string(name) + "', grid " + extent(grid) + ", block " +
           extent(block) + ", " + std::to_string(shared_bytes) + " bytes of dynamic shared memory";
  };
  if (!f) FUSEBOX_THROW(invalid_argument("fusebox: launch: null function for " + where()));
  if (grid.x == 0 || grid.y == 0 || grid.z == 0 || block.x == 0 || block.y == 0 || block.z == 0)
    FUSEBOX_THROW(invalid_argument("fusebox: launch: empty grid or block for " + where()));
  const auto& device = current_device();
  const auto& api = driver();
  if (shared_bytes > default_shared_bytes_limit) {
    if (shared_bytes > static_cast<unsigned>(device.max_shared_bytes_optin))
      FUSEBOX_THROW(invalid_argument("fusebox: launch: " + where() + " exceeds the " +
                                     std::to_string(device.max_shared_bytes_optin) +
                                     " bytes a block may use on " + device.name));
    check(api.func_set_attribute(f, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                 static_cast<int>(shared_bytes)),
          "cuFuncSetAttribute", "MAX_DYNAMIC_SHARED_SIZE_BYTES for " + where());
  }
  check(api.launch_kernel(f, grid.x, grid.y, grid.z, block.x, block.y, block.z, shared_bytes, on,
                          args, nullptr),
        "cuLaunchKernel", where());
}
#endif

}  // namespace fusebox::cuda
