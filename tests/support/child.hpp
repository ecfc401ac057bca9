// tests/support/child.hpp: runs this test binary again, as a fresh process, on one hidden test
// case ("[.][tag]") with an environment of the caller's choosing, and returns what it printed.
// For what a process reads once at start-up (FUSEBOX_LOGS, FUSEBOX_CACHE_DIR, the JIT's prelude).
// Depends on: POSIX (posix_spawn, waitpid), the C++ standard library.
#pragma once

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

extern char** environ;

namespace fbt {

struct child_result {
  bool passed = false;  // exited with status 0
  std::string text;     // stdout and stderr together
};

/// This process's environment without the variables named in `drop` (by "NAME=" prefix).
inline std::vector<std::string> environment_without(const std::vector<std::string>& drop) {
  std::vector<std::string> env;
  for (char** e = environ; *e; ++e) {
    const std::string_view v(*e);
    bool keep = true;
    for (const auto& name : drop) keep = keep && v.rfind(name + "=", 0) != 0;
    if (keep) env.emplace_back(v);
  }
  return env;
}

/// Runs this binary on the test cases `tags` selects, with exactly `env` as its environment,
/// stdout and stderr going to `output` (a file the caller owns), and waits for it.
inline child_result run_self(const std::string& tags, std::vector<std::string> env,
                             const std::filesystem::path& output) {
  std::string self = std::filesystem::read_symlink("/proc/self/exe").string();
  std::string selector = tags;
  std::vector<char*> argv = {self.data(), selector.data(), nullptr};
  std::vector<char*> envp;
  for (auto& e : env) envp.push_back(e.data());
  envp.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 1, output.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  posix_spawn_file_actions_adddup2(&actions, 1, 2);
  pid_t pid = -1;
  const int spawned = posix_spawn(&pid, self.c_str(), &actions, nullptr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  if (spawned != 0) throw std::runtime_error("run_self: posix_spawn of " + self + " failed");
  int status = 0;
  if (::waitpid(pid, &status, 0) != pid) throw std::runtime_error("run_self: waitpid failed");
  std::ifstream in(output);
  child_result r;
  r.text.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  r.passed = WIFEXITED(status) && WEXITSTATUS(status) == 0;
  return r;
}

}  // namespace fbt
