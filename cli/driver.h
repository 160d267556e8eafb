// cli/driver.h - the spmdcheck command line as a library entry point (main() is one line).
//
// Subcommands: check (diagnostics as text, JSON or SARIF), test (golden files with `expect:` or
// `# expect-error:`), explain, report, schema, backward, run, schedule, ops (the op table). Exit codes: 0 clean, 1 findings, 2 unreadable or invalid
// input, 3 internal error. Every exception is caught here; none escapes to the caller.
#pragma once
#include <iosfwd>
#include <string>
#include <vector>

namespace spmd {

int run_cli(const std::vector<std::string>& args, std::ostream& out, std::ostream& err);
// The same, reading a file argument `-` from `in` instead of standard input.
int run_cli(const std::vector<std::string>& args, std::ostream& out, std::ostream& err, std::istream& in);
int cli_main(int argc, char** argv);

}  // namespace spmd
