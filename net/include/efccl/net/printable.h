// Bytes from a peer made safe to print: whatever an unauthenticated connection sent must not
// reach an operator's terminal or a log as control characters, nor flood it.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace efccl::net {

/// `bytes` with printable ASCII kept (space to '~', except '\\'), everything else as \xNN and
/// '\\' as "\\\\"; the shown part is at most `max_bytes` characters long (escapes count in full,
/// none is cut), followed by "...(N bytes)" when not every byte was shown.
std::string printable(std::string_view bytes, std::size_t max_bytes = 80);

}  // namespace efccl::net
