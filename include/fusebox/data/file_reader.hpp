// fusebox/data/file_reader.hpp: reads a file that may be gzip-compressed, as a stream of bytes.
//
// Which it is comes from the file's first two bytes (0x1f 0x8b, gzip's magic), not from its name,
// so a renamed file still reads. Plain files are read with stdio. Gzip files go through zlib's
// gzopen/gzread, with zlib loaded at run time (dlopen "libz.so.1") rather than linked: like the
// CUDA libraries (DESIGN.md, "one binary runs everywhere"), a program that never opens a .gz file
// does not need zlib, and fusebox::fusebox gains no link dependency that every consumer's package
// configuration would have to find. The four functions used have had the same signatures since
// zlib 1.2 (2003).
//
// Errors are fusebox::invalid_argument and name the file: cannot open (with strerror), corrupt or
// truncated gzip stream (with zlib's own message), zlib not loadable (with the loader's message).
//
// Depends on: the C++20 standard library, POSIX dlopen (through runtime/shared_library.hpp),
// fusebox/core/errors.hpp.
#pragma once

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <utility>

#include "fusebox/core/errors.hpp"
#include "fusebox/runtime/shared_library.hpp"

namespace fusebox::data {

namespace detail {

// The part of zlib's gz* interface that file_reader uses. gzFile is a pointer to an opaque
// struct, so void* has the same representation and calling convention.
struct zlib_api {
  jit::shared_library library;
  void* (*gzopen)(const char* path, const char* mode) = nullptr;
  int (*gzread)(void* file, void* into, unsigned bytes) = nullptr;
  int (*gzclose)(void* file) = nullptr;
  const char* (*gzerror)(void* file, int* errnum) = nullptr;
};

inline constexpr int z_ok = 0;          // Z_OK
inline constexpr int z_errno = -1;      // Z_ERRNO: a read error; see errno
inline constexpr int z_buf_error = -5;  // Z_BUF_ERROR: gzread's "unexpected end of file"

// Loaded on first use and kept for the life of the process. If loading throws, the next call
// tries again (a function-local static whose initialiser throws is not initialised).
inline const zlib_api& zlib() {
  static const zlib_api api = [] {
    zlib_api z;
    z.library = jit::shared_library::system("libz.so.1");
    z.gzopen = z.library.function<void*(const char*, const char*)>("gzopen");
    z.gzread = z.library.function<int(void*, void*, unsigned)>("gzread");
    z.gzclose = z.library.function<int(void*)>("gzclose");
    z.gzerror = z.library.function<const char*(void*, int*)>("gzerror");
    return z;
  }();
  return api;
}

}  // namespace detail

class file_reader {
 public:
  explicit file_reader(std::filesystem::path path) : path_(std::move(path)) {
    file_ = std::fopen(path_.c_str(), "rb");
    if (!file_) fail(std::string("cannot open it: ") + std::strerror(errno));
    unsigned char magic[2] = {};
    const std::size_t got = std::fread(magic, 1, 2, file_);
    if (got == 2 && magic[0] == 0x1f && magic[1] == 0x8b) {
      std::fclose(file_);
      file_ = nullptr;
      open_gzip();
    } else if (std::fseek(file_, 0, SEEK_SET) != 0) {
      const std::string why = std::strerror(errno);
      std::fclose(file_);  // the destructor does not run for a constructor that throws
      fail("cannot seek to its start: " + why);
    }
  }

  file_reader(const file_reader&) = delete;
  file_reader& operator=(const file_reader&) = delete;
  ~file_reader() {
    if (file_) std::fclose(file_);
    if (gz_) detail::zlib().gzclose(gz_);
  }

  const std::filesystem::path& path() const noexcept { return path_; }
  bool compressed() const noexcept { return gz_ != nullptr; }

  /// Reads up to `bytes` bytes into `into` (decompressed, for a gzip file); fewer only at the
  /// end of the data. A read error or a corrupt or truncated gzip stream throws.
  std::size_t read(void* into, std::size_t bytes) {
    auto* out = static_cast<unsigned char*>(into);
    std::size_t done = 0;
    while (done < bytes) {
      const std::size_t got = gz_ ? read_gzip(out + done, bytes - done)
                                  : std::fread(out + done, 1, bytes - done, file_);
      if (!gz_ && std::ferror(file_)) fail(std::string("read error: ") + std::strerror(errno));
      if (got == 0) break;
      done += got;
    }
    return done;
  }

  /// Throws fusebox::invalid_argument("fusebox: '<path>': <what>").
  [[noreturn]] void fail(const std::string& what) const {
    FUSEBOX_THROW(invalid_argument("fusebox: '" + path_.string() + "': " + what));
  }

 private:
  void open_gzip() {
    const detail::zlib_api* z = nullptr;
    try {
      z = &detail::zlib();
    } catch (const jit::load_error& e) {
      fail(std::string("the file is gzip-compressed and zlib could not be loaded (") + e.what() +
           "). Install zlib (Debian: zlib1g) or decompress the file with gunzip");
    }
    gz_ = z->gzopen(path_.c_str(), "rb");
    if (!gz_) fail(std::string("zlib cannot open it: ") + std::strerror(errno));
  }

  // One gzread of at most INT_MAX bytes (it returns an int). A short read is the end of the data
  // only if zlib reports no error: a stream cut short reads as Z_BUF_ERROR, not as -1.
  std::size_t read_gzip(unsigned char* out, std::size_t bytes) {
    const auto& z = detail::zlib();
    const auto ask = static_cast<unsigned>(std::min<std::size_t>(bytes, INT_MAX));
    const int got = z.gzread(gz_, out, ask);
    if (got < 0 || static_cast<unsigned>(got) < ask) {
      int errnum = detail::z_ok;
      std::string message = z.gzerror(gz_, &errnum);
      // zlib starts its message with the path, which ours names already.
      if (const std::string path = path_.string() + ": "; message.starts_with(path))
        message.erase(0, path.size());
      if (errnum == detail::z_buf_error)
        fail("the gzip stream is truncated (zlib: " + message + ")");
      if (errnum == detail::z_errno) fail(std::string("read error: ") + std::strerror(errno));
      if (errnum != detail::z_ok) fail("corrupt gzip stream (zlib: " + message + ")");
    }
    return got < 0 ? 0 : static_cast<std::size_t>(got);
  }

  std::filesystem::path path_;
  std::FILE* file_ = nullptr;
  void* gz_ = nullptr;
};

}  // namespace fusebox::data
