// A whole input file for the `efccl` subcommands (topology JSON, demand matrices): a regular
// file of at most a bound, or a message on stderr naming the file and what is wrong.
#pragma once

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>

namespace efccl::cli {

/// The most bytes a subcommand reads from one input file.
inline constexpr std::uintmax_t kMaxInputFileBytes = 64u << 20;

/// The text of `path`; nullopt, with "`who`: `path`: why" on stderr, when it cannot be read.
inline std::optional<std::string> read_input_file(const std::string& path, std::string_view who) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const auto fail = [&](const std::string& why) -> std::optional<std::string> {
    std::cerr << who << ": " << path << ": " << why << '\n';
    return std::nullopt;
  };
  if (!fs::exists(path, ec)) return fail("no such file");
  if (!fs::is_regular_file(path, ec)) return fail("cannot be read (not a regular file)");
  const auto size = fs::file_size(path, ec);
  if (ec) return fail("cannot be read (" + ec.message() + ")");
  if (size > kMaxInputFileBytes)
    return fail(std::to_string(size) + " bytes, more than the " +
                std::to_string(kMaxInputFileBytes) + " an input file may have");
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  if (!in && !in.eof()) return fail("cannot be read");
  return text.str();
}

}  // namespace efccl::cli
