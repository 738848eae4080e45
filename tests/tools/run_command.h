// Runs a shell command for the tools' tests: its exit status, its output (stdout and stderr
// together) and how long it took.
#pragma once

#include <sys/wait.h>

#include <chrono>
#include <cstdio>
#include <string>

struct CommandResult {
  int exit_code = -1;  ///< the exit status, or 128 + the signal that killed the shell
  std::string output;
  double seconds = 0;
};

inline CommandResult run_command(const std::string& command) {
  CommandResult result;
  const auto start = std::chrono::steady_clock::now();
  std::FILE* pipe = ::popen((command + " 2>&1").c_str(), "r");
  if (pipe == nullptr) return result;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), pipe)) > 0) result.output.append(buf, n);
  const int status = ::pclose(pipe);
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (WIFEXITED(status)) result.exit_code = WEXITSTATUS(status);
  if (WIFSIGNALED(status)) result.exit_code = 128 + WTERMSIG(status);
  return result;
}

/// `text` quoted for /bin/sh.
inline std::string shell_quote(const std::string& text) {
  std::string out = "'";
  for (char c : text) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}
