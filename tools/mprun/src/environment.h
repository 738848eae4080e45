// The environment efccl-mprun gives a process it starts: its own, with some variables set.
#pragma once

#include <unistd.h>  // environ (declared by glibc with _GNU_SOURCE, which g++ defines)

#include <set>
#include <string>
#include <utility>
#include <vector>

namespace efccl::mprun {

/// This process's environment without the variables of `set`, then those ("KEY=value").
inline std::vector<std::string> environment_with(
    const std::vector<std::pair<std::string, std::string>>& set) {
  std::set<std::string> keys;
  for (const auto& kv : set) keys.insert(kv.first);
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string entry(*e);
    if (keys.count(entry.substr(0, entry.find('='))) == 0) env.push_back(entry);
  }
  for (const auto& [key, value] : set) env.push_back(key + "=" + value);
  return env;
}

}  // namespace efccl::mprun
