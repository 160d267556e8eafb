// ir/source_file.h - reading an input file with a size cap (programs, included files, schedule CSVs).
#pragma once
#include <cstddef>
#include <string>

namespace spmd {

inline constexpr std::size_t kMaxInputBytes = std::size_t{1} << 30;  // 1 GiB

// The whole file. Throws LoadError (no line) when it is not a regular file (a directory, /dev/zero, a pipe),
// cannot be opened, or is larger than `cap` bytes; never reads more than `cap` + 1 bytes.
std::string read_input_file(const std::string& path, std::size_t cap = kMaxInputBytes);

}  // namespace spmd
