#include "efccl/ef/load.h"

#include <exception>
#include <filesystem>
#include <fstream>
#include <system_error>

namespace efccl::ef {

LoadResult load_program_text(std::string_view text, const std::string& file_name,
                             const LoadLimits& limits) {
  std::size_t i = 0;
  // Skip a UTF-8 byte-order mark and leading white space.
  if (text.size() >= 3 && text.substr(0, 3) == "\xEF\xBB\xBF") i = 3;
  while (i < text.size() && (text[i] == ' ' || text[i] == '\t' || text[i] == '\n' || text[i] == '\r'))
    ++i;
  LoadResult out;
  if (i < text.size() && text[i] == '{') {
    JsonLimits json_limits;
    json_limits.max_bytes = limits.max_file_bytes;
    json_limits.max_memory_bytes = limits.max_memory_bytes;
    auto r = load_json(text, file_name, json_limits);
    out.program = std::move(r.program);
    out.diagnostics = std::move(r.diagnostics);
  } else if (i < text.size() && text[i] == '<') {
    XmlLimits xml_limits;
    xml_limits.max_bytes = limits.max_file_bytes;
    xml_limits.max_memory_bytes = limits.max_memory_bytes;
    auto r = load_msccl_xml(text, file_name, xml_limits);
    out.program = std::move(r.program);
    out.diagnostics = std::move(r.diagnostics);
  } else {
    out.diagnostics.push_back({file_name, i < text.size() ? "byte " + std::to_string(i) : "",
                               "unknown-format",
                               i < text.size()
                                   ? "expected EF JSON (starting with '{') or MSCCL XML (starting "
                                     "with '<')"
                                   : "the file is empty"});
  }
  return out;
}

LoadResult load_program_file(const std::string& path, const LoadLimits& limits) {
  LoadResult out;
  std::error_code ec;
  const auto status = std::filesystem::status(path, ec);
  if (ec || !std::filesystem::exists(status)) {
    out.diagnostics.push_back({path, "", "io", "cannot open: no such file"});
    return out;
  }
  if (!std::filesystem::is_regular_file(status)) {
    out.diagnostics.push_back({path, "", "io", "not a regular file"});
    return out;
  }
  const auto size = std::filesystem::file_size(path, ec);
  if (ec) {
    out.diagnostics.push_back({path, "", "io", "cannot read its size: " + ec.message()});
    return out;
  }
  if (size > limits.max_file_bytes) {
    out.diagnostics.push_back({path, "", "file-too-large",
                               "file is " + std::to_string(size) + " bytes; the limit is " +
                                   std::to_string(limits.max_file_bytes)});
    return out;
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    out.diagnostics.push_back({path, "", "io", "cannot open for reading"});
    return out;
  }
  try {
    std::string text(static_cast<std::size_t>(size), '\0');
    in.read(text.data(), static_cast<std::streamsize>(size));
    text.resize(static_cast<std::size_t>(in.gcount()));
    return load_program_text(text, path, limits);
  } catch (const std::exception& e) {  // allocation failure: the text or a loader's result
    out.program.reset();
    out.diagnostics.push_back({path, "", "io", std::string("cannot load the file: ") + e.what()});
    return out;
  }
}

}  // namespace efccl::ef
