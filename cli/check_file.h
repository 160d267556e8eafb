// cli/check_file.h - load one input (a program, a schedule CSV, or `-` for standard input) and run every check.
//
// The subcommands check, test, explain and report share this: FileResult holds the program, its
// diagnostics (sorted and capped), the schedule when there is one, and the load error when it failed.
#pragma once
#include <iosfwd>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "ir/diagnostic.h"
#include "ir/loader.h"
#include "ir/program.h"
#include "schedules/schedule.h"
#include "spatial/spatial.h"

namespace spmd {

enum Exit { kClean = 0, kFindings = 1, kBadInput = 2, kInternal = 3 };

struct Options {
  unsigned z3_timeout_ms = 10000;
  std::size_t max_diagnostics = 50;
  std::string dump_hb;    // --dump-hb FILE ("-" = stdout)
  std::string p2p_model;  // --p2p-model eager|rendezvous (overrides the file's `p2p_model`)
  std::string trace;      // --trace FILE: a Chrome trace of the (first) schedule checked
  bool backward = false;  // --backward: derive and check the backward even without `train: true`
  std::int64_t max_work = 0;   // --max-work: the value check's element operations (0: equiv's default)
  std::int64_t max_mib = 0;    // --max-memory: MiB of tensor values one value-check trial may hold (0: the default)
  std::optional<std::string> stdin_text;  // the text of standard input, read once when a file argument is `-`
  std::map<std::string, std::string> imported;  // programs imported in memory (`check SEQ_DIR RANKS_DIR`), by the name shown
  std::optional<LoadError> stdin_error;   // why it could not be read (a device, more than the size limit)
};

struct FileResult {
  std::string file;  // as given ("-" for standard input)
  bool load_failed = false;
  std::string load_message;  // rendered load error
  LoadError load_error{{}, ""};
  Program program;
  std::vector<Diagnostic> diags;
  std::size_t dropped = 0;
  std::optional<Schedule> schedule;  // a pipeline schedule (a .csv file or `schedule:`)
  std::vector<Loc> blocked;          // its cells where a deadlock left a rank blocked
};

// A deadlock's note that names a blocked rank ("rank {pp: 1} is blocked here: ..." for a rank of the cycle,
// "rank {pp: 0} is also blocked: ..." for one that waits on it): the rank's label and whether it is in the cycle.
struct BlockedRank {
  std::string label;
  bool in_cycle = false;
};
std::optional<BlockedRank> blocked_rank(const Note& n);

// The name a file is shown by in diagnostics ("<stdin>" for "-").
std::string display_name(const std::string& path);
// The raw text of an input (standard input for "-"), read as the loader reads it (a regular file of at most
// 1 GiB, a CSV of at most 64 MiB); throws LoadError otherwise.
std::string input_text(const std::string& path, const Options& opt);
// Loads a program from a file or, for "-", from standard input (throws LoadError).
Program load_input(const std::string& path, const Options& opt, const LoadOptions& lo = {});
bool is_csv(const std::string& path);
bool has_errors(const std::vector<Diagnostic>& d);

// Loads and checks one file; `dot`, when set, receives the happens-before graph; `types`, when set,
// receives every value's spatial type (programs without a schedule only).
FileResult check_file(const std::string& path, const Options& opt, std::ostream* dot = nullptr, SpatialTypes* types = nullptr);

// The schedule a file describes: a CSV file, or a program's `schedule:` (generated or a CSV next to it).
Schedule schedule_of(const std::string& path, const Program& p);

}  // namespace spmd
