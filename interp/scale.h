// interp/scale.h - a scaled copy of a program's text: named concrete sizes replaced by smaller ones.
//
// Examples use realistic sizes (hidden 1024, vocab 32000) that are too large to run numerically. The
// oracle runs a copy whose integer entries under `sizes:` are smaller (sizes given as expressions, such
// as F: 4*H, follow); the caller decides whether the copy still means the same thing (cli/run.cpp
// requires the checker's verdict to be unchanged).
#pragma once
#include <cstdint>
#include <map>
#include <optional>
#include <string>

namespace spmd {

// The integer literals under `sizes:`, by name (empty when there are none or the text is not YAML).
std::map<std::string, std::int64_t> named_sizes(const std::string& yaml_text);

// The text with the integer sizes under `sizes:` replaced by `values` (names not listed keep theirs);
// nullopt when the text is not a YAML mapping with `sizes`, or a value would need more digits than it has. Every
// other byte keeps its place, so line:column positions in the copy are positions in the original.
std::optional<std::string> with_sizes(const std::string& yaml_text, const std::map<std::string, std::int64_t>& values);

}  // namespace spmd
