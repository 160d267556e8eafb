// ir/diagnostic.h - findings (with a stable check ID) and located input errors.
#pragma once
#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>
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
  std::string file{};  // empty: the program's file (an imported op's note may name the model's source or its graph)
};

// A fix in machine-readable form (docs/format.md, "JSON output"): ops to write into the file. `yaml` holds
// one or more ops, one YAML flow mapping per line. InsertBefore/InsertAfter put them next to the op on
// `line`; Replace puts them in its place; Append adds them at the end of the top-level list `section`
// (e.g. grad_sync), which is created if the file has none; Move takes the op on `from_line` (whose
// text is `yaml`) and puts it before the op on `line`.
enum class FixKind : std::uint8_t { None, InsertBefore, InsertAfter, Replace, Append, Move };
struct Fix {
  FixKind kind = FixKind::None;
  int op = -1;             // the index of the op on `line` in its list (ops, backward or grad_sync), -1 = none
  std::uint32_t line = 0;  // 1-based line of that op (or of the section's key for Append; 0 = not in the file)
  std::string section;     // Append: the top-level key
  std::string yaml;
  std::uint32_t from_line = 0;  // Move: the line of the op to move
};
const char* fix_kind_name(FixKind k);

struct Diagnostic {
  CheckId id;
  Severity severity = Severity::Error;
  Loc loc;
  std::string message;
  int op = -1;             // op index, -1 = none
  std::string tensor;      // empty = none
  std::vector<Note> notes; // related places; a note whose message starts with "fix: " suggests the fix
  std::vector<std::string> ranks{};  // the ranks involved, e.g. {pp: 0} (per-rank programs)
  Fix fix{};               // the `fix:` note in machine-readable form, when it is an insert or a replace
  std::string file{};      // empty: the program's file; else where `loc` is (an imported op's source line)
};

// `s` safe to print on one line: control bytes (a NUL would cut the message) escaped as \0, \n, \t, \r or \xNN;
// longer than `max` bytes, the rest is left out and counted (a UTF-8 character is never split).
std::string printable(std::string_view s, std::size_t max = std::string_view::npos);
// Input text quoted in a message (a name, a cell, a value): printable and at most `max` bytes.
inline std::string excerpt(std::string_view s, std::size_t max = 64) { return printable(s, max); }
// A whole message, printable and at most about 4 KiB: a longer one keeps its start and its end (where the
// reason and the fix usually are) and counts what it leaves out between them.
std::string bounded_message(std::string_view msg);

// A program that cannot be read: YAML syntax, unknown op or key, bad attribute... (exit code 2).
struct LoadError : std::runtime_error {
  Loc loc;
  LoadError(Loc l, const std::string& msg) : std::runtime_error(bounded_message(msg)), loc(l) {}
};

// Where a load error is shown: an error about the whole file (missing, a directory, too large) at 1:1.
inline Loc shown_loc(Loc l) { return l.line ? l : Loc{1, 1}; }

// Sorts by position and keeps at most `cap` diagnostics; returns how many were dropped.
std::size_t sort_and_cap(std::vector<Diagnostic>& diags, std::size_t cap);

}  // namespace spmd
