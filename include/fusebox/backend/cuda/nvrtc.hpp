// fusebox/backend/cuda/nvrtc.hpp: NVRTC, loaded at run time, compiling CUDA C++ source to a cubin.
//
// NVRTC needs no GPU and no driver, so kernels can be generated and compiled (and cached) on a
// machine without one; only loading the cubin needs the device. `nvrtc_compile` always asks for
// a real architecture (-arch=sm_XY), so the result is SASS in an ELF cubin, loaded without a JIT
// step by the driver, never PTX. Options it passes: -arch=<arch>, -std=c++17, -default-device
// (every function without an execution-space annotation is device code, which generated code
// relies on), then the caller's extras. Fast math is never on by default: pass --use_fast_math in
// the extras when the user asked for it (options::fast_math).
//
// Libraries tried: libnvrtc.so.13, .so.12, .so (see backend/cuda/library.hpp for where). The table is
// loaded once per process, thread-safely; a failure is kept and rethrown as the same
// backend_unavailable on every use.
//
// Depends on: the C++20 standard library, fusebox/core/{errors,linkage}.hpp, fusebox/backend/cuda/library.hpp.
#pragma once

#include <cstddef>
#include <exception>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "fusebox/backend/cuda/library.hpp"
#include "fusebox/core/errors.hpp"
#include "fusebox/core/linkage.hpp"

struct _nvrtcProgram;  // nvrtc.h: typedef struct _nvrtcProgram *nvrtcProgram;

namespace fusebox::cuda {

// nvrtc.h types (CUDA 13.0)
using nvrtcResult = int;  // enum nvrtcResult; NVRTC_SUCCESS = 0
using nvrtcProgram = ::_nvrtcProgram*;
inline constexpr nvrtcResult NVRTC_SUCCESS = 0;
inline constexpr nvrtcResult NVRTC_ERROR_COMPILATION = 6;

/// The NVRTC functions fusebox calls; each comment names the symbol bound.
struct nvrtc_api {
  nvrtcResult (*version)(int* major, int* minor);  // nvrtcVersion
  nvrtcResult (*create_program)(nvrtcProgram*, const char* source, const char* name,
                                int header_count, const char* const* headers,
                                const char* const* include_names);  // nvrtcCreateProgram
  nvrtcResult (*compile_program)(nvrtcProgram, int option_count,
                                 const char* const* options);  // nvrtcCompileProgram
  nvrtcResult (*get_program_log_size)(nvrtcProgram, std::size_t*);  // nvrtcGetProgramLogSize
  nvrtcResult (*get_program_log)(nvrtcProgram, char*);               // nvrtcGetProgramLog
  nvrtcResult (*get_cubin_size)(nvrtcProgram, std::size_t*);         // nvrtcGetCUBINSize
  nvrtcResult (*get_cubin)(nvrtcProgram, char*);                     // nvrtcGetCUBIN
  nvrtcResult (*destroy_program)(nvrtcProgram*);                     // nvrtcDestroyProgram
  const char* (*get_error_string)(nvrtcResult);                      // nvrtcGetErrorString

  int major = 0, minor = 0;  // nvrtcVersion
  std::string path;          // the libnvrtc that was loaded
};

/// A compilation NVRTC refused, or an NVRTC call that failed. `log` is NVRTC's program log (the
/// compiler's diagnostics), `source` the program as given, kept for the report (DESIGN.md:
/// failure degrades, it does not lose work).
struct nvrtc_error : fusebox::error {
  nvrtc_error(const std::string& what, std::string program_log, std::string program_source)
      : fusebox::error(what), log(std::move(program_log)), source(std::move(program_source)) {}
  std::string log;
  std::string source;
};

namespace detail {

inline constexpr std::string_view libnvrtc_what = "libnvrtc (NVRTC, the CUDA run-time compiler)";

struct nvrtc_state {
  jit::shared_library library;
  nvrtc_api api{};
  std::exception_ptr failure;
};

FUSEBOX_RUNTIME_API void load_nvrtc(nvrtc_state& state);

FUSEBOX_RUNTIME_API const nvrtc_state& nvrtc_once();

inline std::string nvrtc_message(const nvrtc_api& api, nvrtcResult result) {
  const char* text = api.get_error_string ? api.get_error_string(result) : nullptr;
  return text ? std::string(text) : "NVRTC error " + std::to_string(result);
}

/// "sm_90", "sm_90a", "sm_100f": a real architecture, so NVRTC can emit a cubin.
FUSEBOX_RUNTIME_API bool is_real_arch(std::string_view arch);

/// Destroys the program however the compile ends.
struct program_guard {
  const nvrtc_api& api;
  nvrtcProgram program = nullptr;
  ~program_guard() {
    if (program) api.destroy_program(&program);
  }
};

}  // namespace detail

/// The loaded NVRTC; throws backend_unavailable if it cannot be loaded.
FUSEBOX_RUNTIME_API const nvrtc_api& nvrtc();

/// Whether NVRTC can be loaded. Never throws.
FUSEBOX_RUNTIME_API bool nvrtc_available() noexcept;

/// "13.0": the loaded NVRTC's version (part of every JIT cache key).
inline std::string nvrtc_version() {
  const auto& api = nvrtc();
  return std::to_string(api.major) + "." + std::to_string(api.minor);
}

struct compile_result {
  std::vector<char> cubin;           // an ELF image for cuModuleLoadData
  std::string log;                   // warnings, if any
  std::vector<std::string> options;  // the full option list used (for cache keys and reports)
};

namespace detail {

/// "fusebox: NVRTC 13.0 (path): <what> for '<name>' failed with <error>; options: ...", then the log.
FUSEBOX_RUNTIME_API std::string nvrtc_failure(const nvrtc_api& api, const std::string& what, const std::string& name,
                                              nvrtcResult code, const std::vector<std::string>& options,
                                              const std::string& log);

/// One nvrtcCompileProgram of `source` with `options`; throws nvrtc_error (with the log and the
/// source) if it does not compile. On success the program is left in `guard` for its outputs and
/// the warnings are in `log`.
FUSEBOX_RUNTIME_API void run_nvrtc(const nvrtc_api& api, program_guard& guard, const std::string& source,
                                   const std::string& name, const std::vector<std::string>& options, std::string& log);

FUSEBOX_RUNTIME_API std::vector<std::string> nvrtc_options(const std::string& arch,
                                                           const std::vector<std::string>& extra);

}  // namespace detail

/// Compiles `source` (named `name` in diagnostics) for `arch` ("sm_90") with the options above
/// plus `extra_options`. Throws nvrtc_error, carrying the log and the source, if it does not
/// compile; invalid_argument if `arch` is not a real architecture.
FUSEBOX_RUNTIME_API compile_result nvrtc_compile(const std::string& source, const std::string& name,
                                                 const std::string& arch,
                                                 const std::vector<std::string>& extra_options = {});

/// Checks that `source` compiles for the virtual architecture `arch` ("compute_90"): NVRTC's
/// front end and NVVM, down to PTX, without ptxas. Every error of a code generator (syntax,
/// types, overloads, a missing intrinsic) shows here at a fraction of a cubin build's cost; what
/// only ptxas checks (register or shared-memory limits) needs nvrtc_compile. Returns the
/// warnings; throws nvrtc_error like nvrtc_compile.
FUSEBOX_RUNTIME_API std::string nvrtc_check(const std::string& source, const std::string& name,
                                            const std::string& arch = "compute_90",
                                            const std::vector<std::string>& extra_options = {});

// Definitions: compiled here, or once in the FUSEBOX_IMPLEMENTATION unit (core/linkage.hpp).
#if FUSEBOX_RUNTIME_BODIES
FUSEBOX_RUNTIME_API void detail::load_nvrtc(nvrtc_state& state) {
  state.library = open_first(
      libnvrtc_what, toolkit_library_candidates({"libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"}),
      "install the CUDA toolkit's NVRTC (e.g. the cuda-nvrtc package) and set FUSEBOX_CUDA_HOME "
      "or CUDA_HOME to the toolkit root, or put its lib64 directory on LD_LIBRARY_PATH");
  auto& api = state.api;
  auto bind = [&](auto*& function, const char* symbol) {
    resolve(state.library, function, symbol, libnvrtc_what);
  };
  bind(api.version, "nvrtcVersion");
  bind(api.create_program, "nvrtcCreateProgram");
  bind(api.compile_program, "nvrtcCompileProgram");
  bind(api.get_program_log_size, "nvrtcGetProgramLogSize");
  bind(api.get_program_log, "nvrtcGetProgramLog");
  bind(api.get_cubin_size, "nvrtcGetCUBINSize");
  bind(api.get_cubin, "nvrtcGetCUBIN");
  bind(api.destroy_program, "nvrtcDestroyProgram");
  bind(api.get_error_string, "nvrtcGetErrorString");
  api.path = loaded_file(state.library, reinterpret_cast<const void*>(api.version));
  if (api.version(&api.major, &api.minor) != NVRTC_SUCCESS)
    FUSEBOX_THROW(backend_unavailable("CUDA", "nvrtcVersion failed in '" + api.path + "'",
                                      "reinstall NVRTC"));
}

FUSEBOX_RUNTIME_API const detail::nvrtc_state& detail::nvrtc_once() {
  static const nvrtc_state* state = [] {
    auto* s = new nvrtc_state;  // never destroyed: see cuda/library.hpp
    try {
      load_nvrtc(*s);
    } catch (...) {
      s->failure = std::current_exception();
    }
    return s;
  }();
  return *state;
}

FUSEBOX_RUNTIME_API bool detail::is_real_arch(std::string_view arch) {
  if (arch.size() < 4 || arch.substr(0, 3) != "sm_") return false;
  std::size_t i = 3;
  while (i < arch.size() && arch[i] >= '0' && arch[i] <= '9') ++i;
  if (i == 3) return false;
  return i == arch.size() || (i + 1 == arch.size() && (arch[i] == 'a' || arch[i] == 'f'));
}

FUSEBOX_RUNTIME_API const nvrtc_api& nvrtc() {
  const auto& state = detail::nvrtc_once();
  if (state.failure) std::rethrow_exception(state.failure);
  return state.api;
}

FUSEBOX_RUNTIME_API bool nvrtc_available() noexcept {
  try {
    nvrtc();
    return true;
  } catch (...) {
    return false;
  }
}

FUSEBOX_RUNTIME_API std::string detail::nvrtc_failure(const nvrtc_api& api, const std::string& what,
                                                      const std::string& name, nvrtcResult code,
                                                      const std::vector<std::string>& options, const std::string& log) {
  std::string joined;
  for (const auto& option : options) joined += (joined.empty() ? "" : " ") + option;
  std::string message = "fusebox: NVRTC " + std::to_string(api.major) + "." + std::to_string(api.minor) + " (" +
                        api.path + "): " + what + " for '" + name + "' failed with " + nvrtc_message(api, code) +
                        "; options: " + joined;
  if (!log.empty()) message += "\n" + log;
  return message;
}

FUSEBOX_RUNTIME_API void detail::run_nvrtc(const nvrtc_api& api, program_guard& guard, const std::string& source,
                                           const std::string& name, const std::vector<std::string>& options,
                                           std::string& log) {
  std::vector<const char*> argv;
  for (const auto& option : options) argv.push_back(option.c_str());
  auto fail = [&](const std::string& what, nvrtcResult code) {
    return nvrtc_error(nvrtc_failure(api, what, name, code, options, log), log, source);
  };
  if (auto code = api.create_program(&guard.program, source.c_str(), name.c_str(), 0, nullptr, nullptr);
      code != NVRTC_SUCCESS)
    FUSEBOX_THROW(fail("nvrtcCreateProgram", code));
  const nvrtcResult compiled = api.compile_program(guard.program, static_cast<int>(argv.size()), argv.data());
  // The log is read whether or not the compile worked: on success it holds the warnings.
  std::size_t log_size = 0;
  if (api.get_program_log_size(guard.program, &log_size) == NVRTC_SUCCESS && log_size > 1) {
    log.resize(log_size);
    if (api.get_program_log(guard.program, log.data()) != NVRTC_SUCCESS) log.clear();
    while (!log.empty() && (log.back() == '\0' || log.back() == '\n')) log.pop_back();
  }
  if (compiled != NVRTC_SUCCESS) FUSEBOX_THROW(fail("nvrtcCompileProgram", compiled));
}

FUSEBOX_RUNTIME_API std::vector<std::string> detail::nvrtc_options(const std::string& arch,
                                                                   const std::vector<std::string>& extra) {
  std::vector<std::string> options = {"-arch=" + arch, "-std=c++17", "-default-device"};
  options.insert(options.end(), extra.begin(), extra.end());
  return options;
}

FUSEBOX_RUNTIME_API compile_result nvrtc_compile(const std::string& source, const std::string& name,
                                                 const std::string& arch,
                                                 const std::vector<std::string>& extra_options) {
  if (!detail::is_real_arch(arch))
    FUSEBOX_THROW(invalid_argument("fusebox: nvrtc_compile(" + name + "): arch '" + arch +
                                   "' is not a real GPU architecture such as sm_90; a virtual one "
                                   "(compute_90) would give PTX, not a cubin (nvrtc_check takes one)"));
  const auto& api = nvrtc();
  compile_result result;
  result.options = detail::nvrtc_options(arch, extra_options);
  detail::program_guard guard{api};
  detail::run_nvrtc(api, guard, source, name, result.options, result.log);
  auto fail = [&](const std::string& what, nvrtcResult code) {
    return nvrtc_error(detail::nvrtc_failure(api, what, name, code, result.options, result.log), result.log, source);
  };
  std::size_t cubin_size = 0;
  if (auto code = api.get_cubin_size(guard.program, &cubin_size); code != NVRTC_SUCCESS)
    FUSEBOX_THROW(fail("nvrtcGetCUBINSize", code));
  if (cubin_size == 0)
    FUSEBOX_THROW(nvrtc_error("fusebox: NVRTC produced no cubin for '" + name + "' (arch " + arch + ")",
                              result.log, source));
  result.cubin.resize(cubin_size);
  if (auto code = api.get_cubin(guard.program, result.cubin.data()); code != NVRTC_SUCCESS)
    FUSEBOX_THROW(fail("nvrtcGetCUBIN", code));
  return result;
}

FUSEBOX_RUNTIME_API std::string nvrtc_check(const std::string& source, const std::string& name,
                                            const std::string& arch, const std::vector<std::string>& extra_options) {
  if (arch.rfind("compute_", 0) != 0)
    FUSEBOX_THROW(invalid_argument("fusebox: nvrtc_check(" + name + "): arch '" + arch +
                                   "' is not a virtual architecture such as compute_90"));
  const auto& api = nvrtc();
  detail::program_guard guard{api};
  std::string log;
  detail::run_nvrtc(api, guard, source, name, detail::nvrtc_options(arch, extra_options), log);
  return log;
}
#endif

}  // namespace fusebox::cuda
