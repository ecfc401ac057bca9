// fusebox/data/progress.hpp: a one-line training progress bar (epoch, samples, loss, samples/s,
// ETA), redrawn in place with '\r'.
//
// It draws only when its stream is a terminal (isatty): redirected to a file or a CI log, '\r'
// redraws would pile up as thousands of lines, so it is silent there and the program logs what
// it wants itself. Redraws are limited to 10 per second; the last update of an epoch always
// draws. format_progress() is the text alone, for tests and for callers with their own output.
//
// Depends on: the C++20 standard library, POSIX isatty/fileno.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>

#include <stdio.h>  // fileno
#include <unistd.h>  // isatty

namespace fusebox::data {

/// "epoch 3  12800/60000 [=====               ] loss 0.4321  5230 samples/s  ETA 0:09"
inline std::string format_progress(std::uint64_t epoch, std::size_t done, std::size_t total,
                                   double loss, double seconds) {
  constexpr std::size_t width = 20;
  const std::size_t filled = total ? std::min(width, done * width / total) : width;
  const double rate = seconds > 0 ? static_cast<double>(done) / seconds : 0;
  char text[160];
  std::snprintf(text, sizeof text, "epoch %llu  %zu/%zu [%s%s] loss %.4f  %.0f samples/s  ",
                static_cast<unsigned long long>(epoch), done, total,
                std::string(filled, '=').c_str(), std::string(width - filled, ' ').c_str(), loss,
                rate);
  std::string line = text;
  if (rate > 0 && done <= total) {
    const auto eta = static_cast<unsigned long long>((total - done) / rate + 0.5);
    std::snprintf(text, sizeof text, "ETA %llu:%02llu", eta / 60, eta % 60);
    line += text;
  } else {
    line += "ETA -";
  }
  return line;
}

class progress_bar {
 public:
  /// `total` samples per epoch, drawn on `out` (stderr by default: stdout stays for results).
  explicit progress_bar(std::size_t total, std::FILE* out = stderr)
      : total_(total), out_(out), enabled_(out && ::isatty(::fileno(out)) == 1) {}

  bool enabled() const noexcept { return enabled_; }

  void start_epoch(std::uint64_t epoch) {
    epoch_ = epoch;
    start_ = clock::now();
    last_draw_ = {};
  }

  /// `done` samples of this epoch so far, and the latest loss.
  void update(std::size_t done, double loss) {
    if (!enabled_) return;
    const auto now = clock::now();
    if (done < total_ && now - last_draw_ < std::chrono::milliseconds(100)) return;
    last_draw_ = now;
    const double seconds = std::chrono::duration<double>(now - start_).count();
    // "\x1b[K" clears what a longer previous line left at the end.
    std::fprintf(out_, "\r%s\x1b[K", format_progress(epoch_, done, total_, loss, seconds).c_str());
    if (done >= total_) std::fputc('\n', out_);
    std::fflush(out_);
  }

 private:
  using clock = std::chrono::steady_clock;
  std::size_t total_;
  std::FILE* out_;
  bool enabled_;
  std::uint64_t epoch_ = 0;
  clock::time_point start_ = clock::now(), last_draw_{};
};

}  // namespace fusebox::data
