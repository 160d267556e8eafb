// tests/helpers.h - small helpers shared by the unit tests.
#pragma once
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "cli/driver.h"
#include "ir/loader.h"
#include "spatial/spatial.h"

namespace spmd::test {

// The set of check IDs the spatial checker reports for an inline program.
inline std::set<std::string> ids(const std::string& yaml) {
  Program p = load_program_string(yaml, "t.yaml");
  std::set<std::string> out;
  for (const auto& d : check_spatial(p)) out.insert(std::string(check_name(d.id)));
  return out;
}

inline std::set<std::string> none() { return {}; }
inline std::set<std::string> one(const char* id) { return {id}; }

// The diagnostics themselves, for message and position checks.
inline std::vector<Diagnostic> diags(const std::string& yaml) { return check_spatial(load_program_string(yaml, "t.yaml")); }

// The load error of an inline program ("" when it loads).
inline std::string load_error(const std::string& yaml, Loc* loc = nullptr) {
  try {
    load_program_string(yaml, "t.yaml");
  } catch (const LoadError& e) {
    if (loc) *loc = e.loc;
    return e.what();
  }
  return "";
}

// The command line run in-process: exit code, standard output and error.
struct Run {
  int code;
  std::string out, err;
};

inline Run run(const std::vector<std::string>& args) {
  std::ostringstream out, err;
  int code = run_cli(args, out, err);
  return {code, out.str(), err.str()};
}

}  // namespace spmd::test
