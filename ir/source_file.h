// ir/source_file.h - reading an input file or standard input with a size cap (programs, included files,
// schedule CSVs): the kind and size are checked before a byte is read, and a stream is read in bounded steps.
#pragma once
#include <cstddef>
#include <iosfwd>
#include <string>

namespace spmd {

inline constexpr std::size_t kMaxInputBytes = std::size_t{1} << 30;  // 1 GiB
inline constexpr std::size_t kMaxCsvBytes = std::size_t{64} << 20;   // a schedule CSV: 64 MiB

// The whole file. Throws LoadError (no line) when it is not a regular file (a directory, /dev/zero, a pipe),
// cannot be opened, or is larger than `cap` bytes; never reads more than `cap` + 1 bytes.
std::string read_input_file(const std::string& path, std::size_t cap = kMaxInputBytes);

// A whole stream (standard input), at most `cap` bytes: throws LoadError (no line) beyond it. `fd` >= 0 is the
// descriptor behind `in`: a regular file is checked by its size before reading, and a device that is not a
// terminal (/dev/zero, /dev/urandom) is refused at once.
std::string read_input_stream(std::istream& in, const std::string& name, int fd = -1, std::size_t cap = kMaxInputBytes);

}  // namespace spmd
