// fusebox/backend/cuda/library.hpp: finds and opens NVIDIA's run-time libraries (libcuda, libnvrtc,
// cuBLASLt) with dlopen, and resolves their functions by name.
//
// DESIGN.md: one binary runs everywhere. Nothing here links against CUDA or includes a CUDA
// header; a missing library or function is a `fusebox::backend_unavailable` that lists every
// name tried with the loader's own error, so "why is CUDA off?" is answered by the message.
//
// Where toolkit libraries (libnvrtc, libcublasLt) are looked for, in order: $FUSEBOX_CUDA_HOME
// and $CUDA_HOME (lib64/, then lib/), then the loader's search by soname (LD_LIBRARY_PATH,
// ld.so.cache), then /usr/local/cuda/lib64/. An explicit home comes first because whoever set
// it chose that toolkit. libcuda belongs to the driver, not the toolkit, and is only searched for
// by soname (a toolkit's lib64/stubs/libcuda.so is a link-time stub that cannot run anything).
//
// Libraries opened here are meant to live as long as the process (the tables that own them are
// never destroyed): unloading the driver while static objects still hold device memory would
// turn their destructors into crashes.
//
// Depends on: the C++20 standard library, POSIX dlfcn (dladdr), fusebox/core/{errors,linkage}.hpp,
// fusebox/runtime/shared_library.hpp.
#pragma once

#include <cstdlib>
#include <initializer_list>
#include <string>
#include <string_view>
#include <vector>

#include <dlfcn.h>

#include "fusebox/core/errors.hpp"
#include "fusebox/core/linkage.hpp"
#include "fusebox/runtime/shared_library.hpp"

namespace fusebox::cuda {

/// Paths and sonames to try for a CUDA toolkit library, in the order above, without duplicates.
FUSEBOX_RUNTIME_API std::vector<std::string> toolkit_library_candidates(
    std::initializer_list<std::string_view> sonames);

/// Opens the first of `candidates` that loads (a name without '/' goes through the loader's
/// search). `what` names the library for the message ("libcuda (the NVIDIA driver)"), `fix` says
/// what to install or set. Throws backend_unavailable("CUDA", ...) listing each candidate and why
/// it did not load.
FUSEBOX_RUNTIME_API jit::shared_library open_first(std::string_view what,
                                                   const std::vector<std::string>& candidates,
                                                   std::string_view fix);

/// resolve()'s work, once for every function type: the address of `symbol`, never null.
FUSEBOX_RUNTIME_API void* resolve_address(const jit::shared_library& library, const char* symbol,
                                          std::string_view what);
/// Sets `function` to `symbol` from `library`. A library too old to have the symbol is a
/// backend_unavailable naming the library file, the symbol and `what`; the caller vouches that
/// `Function` is the symbol's real type.
template <class Function>
void resolve(const jit::shared_library& library, Function*& function, const char* symbol,
             std::string_view what) {
  // A thin cast over resolve_address: the driver table resolves ~40 function types, and a body
  // per type was 59 KB of object code in every unit that can reach the driver (issue 22).
  function = reinterpret_cast<Function*>(resolve_address(library, symbol, what));
}

/// The file `library` was loaded from ("/usr/lib/x86_64-linux-gnu/libcuda.so.1" rather than the
/// soname asked for), found through the address of one of its functions; its name if unknown.
FUSEBOX_RUNTIME_API std::string loaded_file(const jit::shared_library& library, const void* function);

// Definitions: compiled here, or once in the FUSEBOX_IMPLEMENTATION unit (core/linkage.hpp).
#if FUSEBOX_RUNTIME_BODIES
FUSEBOX_RUNTIME_API std::vector<std::string> toolkit_library_candidates(
    std::initializer_list<std::string_view> sonames) {
  std::vector<std::string> candidates;
  auto add = [&](std::string candidate) {
    for (const auto& existing : candidates)
      if (existing == candidate) return;
    candidates.push_back(std::move(candidate));
  };
  auto add_home = [&](const char* home) {
    if (!home || !*home) return;
    std::string root = home;
    while (root.size() > 1 && root.back() == '/') root.pop_back();
    for (const char* dir : {"/lib64/", "/lib/"})
      for (auto soname : sonames) add(root + dir + std::string(soname));
  };
  add_home(std::getenv("FUSEBOX_CUDA_HOME"));
  add_home(std::getenv("CUDA_HOME"));
  for (auto soname : sonames) add(std::string(soname));
  for (auto soname : sonames) add("/usr/local/cuda/lib64/" + std::string(soname));
  return candidates;
}

FUSEBOX_RUNTIME_API jit::shared_library open_first(std::string_view what, const std::vector<std::string>& candidates,
                                                   std::string_view fix) {
  std::string tried;
  for (const auto& name : candidates) {
    try {
      return jit::shared_library::system(name);
    } catch (const jit::load_error& e) {
      // load_error reads "fusebox: cannot load 'x': <dlerror>"; keep the part after the name.
      std::string reason = e.what();
      const std::string marker = "'" + name + "': ";
      if (const auto at = reason.find(marker); at != std::string::npos)
        reason = reason.substr(at + marker.size());
      tried += (tried.empty() ? "" : "; ") + name + " (" + reason + ")";
    }
  }
  FUSEBOX_THROW(backend_unavailable("CUDA", "cannot load " + std::string(what) + ": tried " + tried,
                                    std::string(fix)));
}

FUSEBOX_RUNTIME_API void* resolve_address(const jit::shared_library& library, const char* symbol,
                                          std::string_view what) {
  void* address = nullptr;
  try {
    address = library.symbol(symbol);
  } catch (const jit::load_error& e) {
    FUSEBOX_THROW(backend_unavailable(
        "CUDA",
        std::string(what) + " at '" + library.path() + "' lacks the function '" + symbol +
            "' (" + e.what() + ")",
        "install a newer " + std::string(what)));
  }
  if (!address)
    FUSEBOX_THROW(backend_unavailable("CUDA",
                                      std::string(what) + " at '" + library.path() + "' defines '" +
                                          symbol + "' as a null address",
                                      "reinstall " + std::string(what)));
  return address;
}

FUSEBOX_RUNTIME_API std::string loaded_file(const jit::shared_library& library, const void* function) {
  Dl_info info{};
  if (function && ::dladdr(function, &info) != 0 && info.dli_fname && *info.dli_fname)
    return info.dli_fname;
  return library.path();
}
#endif

}  // namespace fusebox::cuda
