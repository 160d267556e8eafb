// ir/diagnostic.h - findings (with a stable check ID) and located input errors.
#pragma once
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "ir/op_table.h"

namespace spmd {

struct Loc {
  std::uint32_t line = 0, col = 0;  // 1-based; 0 = unknown
};

enum class Severity : std::uint8_t { Error, Warning, Note };

struct Note {
  Loc loc;
  std::string message;
};

struct Diagnostic {
  CheckId id;
  Severity severity = Severity::Error;
  Loc loc;
  std::string message;
  int op = -1;             // op index, -1 = none
  std::string tensor;      // empty = none
  std::vector<Note> notes; // related places; a note whose message starts with "fix: " suggests the fix
  std::vector<std::string> ranks{};  // the ranks involved, e.g. {pp: 0} (per-rank programs)
};

// A program that cannot be read: YAML syntax, unknown op or key, bad attribute... (exit code 2).
struct LoadError : std::runtime_error {
  Loc loc;
  LoadError(Loc l, const std::string& msg) : std::runtime_error(msg), loc(l) {}
};

// Sorts by position and keeps at most `cap` diagnostics; returns how many were dropped.
std::size_t sort_and_cap(std::vector<Diagnostic>& diags, std::size_t cap);

}  // namespace spmd
