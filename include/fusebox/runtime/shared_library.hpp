// fusebox/runtime/shared_library.hpp: a loaded shared object (a JIT-compiled kernel library, or a
// runtime such as libnvrtc), owned: dlopen(RTLD_NOW | RTLD_LOCAL) in the constructor, dlclose in
// the destructor, dlsym by name. RTLD_NOW so a missing symbol fails here, at load, with a
// message, not later as a crash mid-run; RTLD_LOCAL so two kernels' symbols never resolve
// against each other. Errors are `fusebox::jit::load_error` naming the path (and the symbol)
// and dlerror().
//
// A path without a '/' would make dlopen search the library path; such paths are given a
// leading "./" so that what is loaded is always the file named. Use `system()` for a library
// the dynamic loader should find by name (libnvrtc.so.13).
//
// Depends on: the C++20 standard library, POSIX dlopen, fusebox/core/errors.hpp.
#pragma once

#include <string>
#include <utility>

#include <dlfcn.h>

#include "fusebox/core/errors.hpp"
#include "fusebox/core/linkage.hpp"

namespace fusebox::jit {

/// A shared object could not be loaded, or lacks a symbol.
struct load_error : fusebox::error {
  using fusebox::error::error;
};

class shared_library {
 public:
  shared_library() = default;

  /// Loads the file at `path` (never searched for). A std::filesystem::path converts to
  /// std::string here, so this header (which <fusebox/cpu.hpp> reaches through the CUDA driver
  /// layer) does not need <filesystem> (issue 22).
  explicit shared_library(const std::string& path);

  /// Loads a library by name through the dynamic loader's search (LD_LIBRARY_PATH, ld.so.cache).
  static shared_library system(const std::string& name);

  shared_library(shared_library&& other) noexcept
      : handle_(std::exchange(other.handle_, nullptr)), path_(std::move(other.path_)) {}
  shared_library& operator=(shared_library&& other) noexcept;
  shared_library(const shared_library&) = delete;
  shared_library& operator=(const shared_library&) = delete;
  ~shared_library() { close(); }

  explicit operator bool() const noexcept { return handle_ != nullptr; }
  const std::string& path() const noexcept { return path_; }
  void* native_handle() const noexcept { return handle_; }

  /// The address of `name`; throws load_error if the library does not define it.
  void* symbol(const char* name) const;

  /// The function `name` as a pointer of type `Function*` (the caller vouches for the type).
  template <class Function>
  Function* function(const char* name) const {
    return reinterpret_cast<Function*>(symbol(name));
  }

 private:
  void open(const std::string& name);

  void close() noexcept {
    if (handle_) ::dlclose(handle_);
    handle_ = nullptr;
  }

  void* handle_ = nullptr;
  std::string path_;
};

// Definitions: compiled here, or once in the FUSEBOX_IMPLEMENTATION unit (core/linkage.hpp).
#if FUSEBOX_RUNTIME_BODIES
FUSEBOX_RUNTIME_API shared_library::shared_library(const std::string& path) {
  std::string name = path;
  if (name.find('/') == std::string::npos) name = "./" + name;
  open(name);
}

FUSEBOX_RUNTIME_API shared_library shared_library::system(const std::string& name) {
  shared_library lib;
  lib.open(name);
  return lib;
}

FUSEBOX_RUNTIME_API shared_library& shared_library::operator=(shared_library&& other) noexcept {
  if (this != &other) {
    close();
    handle_ = std::exchange(other.handle_, nullptr);
    path_ = std::move(other.path_);
  }
  return *this;
}

FUSEBOX_RUNTIME_API void* shared_library::symbol(const char* name) const {
  if (!handle_) FUSEBOX_THROW(load_error(std::string("fusebox: dlsym '") + name + "': no library loaded"));
  ::dlerror();  // clear a stale error: a symbol may legitimately be null
  void* address = ::dlsym(handle_, name);
  if (const char* error = ::dlerror())
    FUSEBOX_THROW(load_error("fusebox: symbol '" + std::string(name) + "' not found in '" + path_ +
                             "': " + error));
  return address;
}

FUSEBOX_RUNTIME_API void shared_library::open(const std::string& name) {
  handle_ = ::dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
  path_ = name;
  if (!handle_) {
    const char* error = ::dlerror();
    FUSEBOX_THROW(load_error("fusebox: cannot load '" + name + "': " + (error ? error : "unknown error")));
  }
}
#endif

}  // namespace fusebox::jit
