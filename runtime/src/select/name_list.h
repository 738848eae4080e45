// The list syntax of NCCL's and efccl's environment variables: names separated by ',' or ':'.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace efccl::runtime {

/// "a,b:c" -> {"a", "b", "c"}; empty items are dropped.
inline std::vector<std::string> split_name_list(std::string_view s) {
  std::vector<std::string> out;
  std::string cur;
  for (char c : s) {
    if (c == ',' || c == ':') {
      if (!cur.empty()) out.push_back(cur);
      cur.clear();
    } else {
      cur += c;
    }
  }
  if (!cur.empty()) out.push_back(cur);
  return out;
}

/// ASCII lower case (names and file extensions).
inline std::string lowercase(std::string_view s) {
  std::string out(s);
  for (char& c : out)
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  return out;
}

}  // namespace efccl::runtime
