// cli/driver.cpp - subcommands check, test, backward and ops.
#include "cli/driver.h"

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <regex>
#include <set>
#include <sstream>

#include "autograd/autograd.h"
#include "autograd/derive.h"
#include "cli/render.h"
#include "ir/loader.h"
#include "ir/printer.h"
#include "spatial/spatial.h"
#include "temporal/temporal.h"

namespace spmd {

namespace {

namespace fs = std::filesystem;

enum Exit { kClean = 0, kFindings = 1, kBadInput = 2, kInternal = 3 };

struct FileResult {
  std::string file;
  bool load_failed = false;
  std::string load_message;  // rendered load error
  LoadError load_error{{}, ""};
  Program program;
  std::vector<Diagnostic> diags;
  std::size_t dropped = 0;
};

struct Options {
  unsigned z3_timeout_ms = 10000;
  std::size_t max_diagnostics = 50;
  std::string dump_hb;  // --dump-hb FILE ("-" = stdout)
  bool backward = false;  // --backward: derive and check the backward even without `train: true`
};

bool has_errors(const std::vector<Diagnostic>& d) {
  return std::any_of(d.begin(), d.end(), [](const Diagnostic& x) { return x.severity == Severity::Error; });
}

// Loads and checks one file; `dot`, when set, receives the happens-before graph.
FileResult check_file(const std::string& path, const Options& opt, std::ostream* dot = nullptr) {
  FileResult r;
  r.file = path;
  try {
    r.program = load_program_file(path);
  } catch (const LoadError& e) {
    r.load_failed = true;
    r.load_error = e;
    r.load_message = render_load_error(path, e);
    return r;
  }
  SpatialOptions so;
  so.z3_timeout_ms = opt.z3_timeout_ms;
  r.diags = check_spatial(r.program, so);
  for (auto& d : check_temporal(r.program, {dot})) r.diags.push_back(std::move(d));
  const Program& p = r.program;
  if (p.train || p.has_backward || opt.backward) {
    try {
      if (p.loss < 0) throw LoadError({}, "--backward needs a `loss:` in the program (the tensor the backward starts from)");
      TrainingCheck t = check_training(p, {opt.z3_timeout_ms});
      for (auto& d : t.diags) r.diags.push_back(std::move(d));
      if (t.built)
        for (auto& d : check_temporal(t.program))
          if (d.op >= static_cast<int>(t.first_backward)) r.diags.push_back(std::move(d));
    } catch (const LoadError& e) {
      r.load_failed = true;
      r.load_error = e;
      r.load_message = render_load_error(path, e);
      return r;
    }
  }
  r.dropped = sort_and_cap(r.diags, opt.max_diagnostics);
  return r;
}

// `spmdcheck backward FILE`: the program with its derived backward, as YAML.
int cmd_backward(const std::string& path, const Options& opt, std::ostream& out) {
  Program p;
  try {
    p = load_program_file(path);
    if (p.loss < 0) throw LoadError({}, "deriving the backward needs a `loss:` in the program (the tensor the backward starts from)");
    SpatialTypes types;
    SpatialOptions so;
    so.z3_timeout_ms = opt.z3_timeout_ms;
    so.types = &types;
    auto diags = check_spatial(p, so);
    if (has_errors(diags)) {
      out << render_text(path, diags) << path << ": error: the forward has errors, so its backward is not derived\n";
      return kFindings;
    }
    out << print_program(derive_backward(p, types).program);
    return kClean;
  } catch (const LoadError& e) {
    out << render_load_error(path, e);
    return kBadInput;
  }
}


int cmd_check(const std::vector<std::string>& files, const std::string& format, const Options& opt, std::ostream& out) {
  int code = kClean;
  nlohmann::json all = nlohmann::json::array();
  for (const auto& f : files) {
    std::ofstream dot_file;
    std::ostream* dot = nullptr;
    if (opt.dump_hb == "-") {
      dot = &out;
    } else if (!opt.dump_hb.empty()) {
      dot_file.open(opt.dump_hb);
      if (dot_file) {
        dot = &dot_file;
      } else {
        out << f << ": error: cannot write " << opt.dump_hb << "\n";
        code = std::max(code, static_cast<int>(kBadInput));
      }
    }
    FileResult r = check_file(f, opt, dot);
    int c = r.load_failed ? kBadInput : has_errors(r.diags) ? kFindings : kClean;
    code = std::max(code, c);
    if (format == "json") {
      nlohmann::json diags = nlohmann::json::array();
      if (r.load_failed) {
        diags.push_back({{"id", "invalid-input"},
                         {"severity", "error"},
                         {"file", f},
                         {"line", r.load_error.loc.line},
                         {"column", r.load_error.loc.col},
                         {"message", r.load_error.what()},
                         {"op", nullptr},
                         {"tensor", nullptr},
                         {"ranks", nlohmann::json::array()},
                         {"notes", nlohmann::json::array()}});
      } else {
        diags = render_json(f, r.diags);
      }
      all.push_back({{"file", f}, {"verdict", r.load_failed ? "error" : c == kFindings ? "fail" : "pass"}, {"diagnostics", diags}});
    } else if (r.load_failed) {
      out << r.load_message;
    } else {
      out << render_text(f, r.diags);
      if (r.dropped) out << fmt::format("{}: note: {} more diagnostics not shown (--max-diagnostics)\n", f, r.dropped);
    }
  }
  if (format == "json") out << nlohmann::json{{"files", all}}.dump(2) << "\n";
  return code;
}

void collect(const std::string& path, std::vector<std::string>& files) {
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    std::vector<std::string> found;
    for (auto it = fs::recursive_directory_iterator(path, ec); !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
      auto ext = it->path().extension();
      if (it->is_regular_file() && (ext == ".yaml" || ext == ".yml")) found.push_back(it->path().string());
    }
    std::sort(found.begin(), found.end());
    files.insert(files.end(), found.begin(), found.end());
  } else {
    files.push_back(path);
  }
}

// `# expect-error: LINE:COL: text` in a file's raw text (a malformed file cannot carry `expect:`).
struct ExpectedError {
  bool present = false;
  std::uint32_t line = 0, col = 0;
  std::string text;
};

ExpectedError read_expected_error(const std::string& path) {
  ExpectedError e;
  std::ifstream in(path);
  std::string line;
  static const std::regex re(R"(^\s*#\s*expect-error:\s*(\d+):(\d+):\s*(.*?)\s*$)");
  while (std::getline(in, line)) {
    std::smatch m;
    if (std::regex_match(line, m, re)) {
      e.present = true;
      e.line = static_cast<std::uint32_t>(std::stoul(m[1]));
      e.col = static_cast<std::uint32_t>(std::stoul(m[2]));
      e.text = m[3];
      break;
    }
  }
  return e;
}

int cmd_test(const std::vector<std::string>& paths, const Options& opt, std::ostream& out) {
  std::vector<std::string> files;
  for (const auto& p : paths) collect(p, files);
  int passed = 0, failed = 0;
  for (const auto& f : files) {
    ExpectedError ee = read_expected_error(f);
    FileResult r = check_file(f, opt);
    std::string why;
    if (ee.present) {
      if (!r.load_failed) why = "expected a load error, but the file loaded";
      else if (r.load_error.loc.line != ee.line || r.load_error.loc.col != ee.col || std::string(r.load_error.what()).find(ee.text) == std::string::npos)
        why = fmt::format("expected load error at {}:{} containing '{}', got:\n  {}", ee.line, ee.col, ee.text, r.load_message);
    } else if (r.load_failed) {
      why = "failed to load:\n  " + r.load_message;
    } else {
      std::multiset<std::string> want(r.program.expect.begin(), r.program.expect.end());
      std::set<std::string> want_set(want.begin(), want.end());
      std::set<std::string> got;
      for (const auto& d : r.diags) got.insert(std::string(check_name(d.id)));
      if (got != want_set) {
        auto list = [](const std::set<std::string>& s) {
          std::string t;
          for (const auto& x : s) t += (t.empty() ? "" : ", ") + x;
          return "[" + t + "]";
        };
        why = fmt::format("expected {} but got {}\n{}", list(want_set), list(got), render_text(f, r.diags));
      }
    }
    if (why.empty()) {
      ++passed;
      out << "PASS " << f << "\n";
    } else {
      ++failed;
      out << "FAIL " << f << ": " << why << (why.back() == '\n' ? "" : "\n");
    }
  }
  out << passed << " passed, " << failed << " failed\n";
  return failed ? kFindings : kClean;
}

}  // namespace

int run_cli(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  try {
    CLI::App app{"spmdcheck: a static verifier for SPMD distributed-training programs", "spmdcheck"};
    app.require_subcommand(1);
    Options opt;
    std::vector<std::string> files;
    std::string format = "text";
    auto* check = app.add_subcommand("check", "run every check on FILE... and print diagnostics");
    check->add_option("files", files, "program files")->required();
    check->add_option("--format", format, "text or json")->check(CLI::IsMember({"text", "json"}));
    check->add_option("--z3-timeout", opt.z3_timeout_ms, "solver time limit per obligation, in milliseconds (a timeout is reported, never passed)");
    check->add_option("--max-diagnostics", opt.max_diagnostics, "show at most N diagnostics per file");
    check->add_option("--dump-hb", opt.dump_hb, "write the happens-before graph as Graphviz DOT to FILE (- for stdout)");
    check->add_flag("--backward", opt.backward, "derive the backward from `loss:` and check it too (as `train: true`)");
    std::string bwd_file;
    auto* backward = app.add_subcommand("backward", "print FILE with its derived backward (`backward:`) as YAML");
    backward->add_option("file", bwd_file, "program file (declares `loss:`)")->required();
    std::vector<std::string> paths;
    auto* test = app.add_subcommand("test", "check files (or directories) against their `expect:`; closing line 'N passed, N failed'");
    test->add_option("paths", paths, "files or directories")->required();
    test->add_option("--z3-timeout", opt.z3_timeout_ms, "solver time limit per obligation, in milliseconds");
    bool markdown = false;
    auto* ops = app.add_subcommand("ops", "list every op with its operands, attributes and meaning");
    ops->add_flag("--markdown", markdown, "print docs/ops.md");

    std::vector<std::string> argv_rev(args.rbegin(), args.rend());
    try {
      app.parse(argv_rev);
    } catch (const CLI::CallForHelp& e) {
      out << app.help();
      return kClean;
    } catch (const CLI::CallForAllHelp& e) {
      out << app.help();
      return kClean;
    } catch (const CLI::ParseError& e) {
      err << "spmdcheck: " << e.what() << "\n" << "run 'spmdcheck --help' for usage\n";
      return kBadInput;
    }
    if (*check) return cmd_check(files, format, opt, out);
    if (*test) return cmd_test(paths, opt, out);
    if (*backward) return cmd_backward(bwd_file, opt, out);
    if (*ops) {
      out << (markdown ? ops_markdown() : ops_text());
      return kClean;
    }
    return kBadInput;
  } catch (const std::exception& e) {
    err << "spmdcheck: internal error: " << e.what() << "\n";
    return kInternal;
  } catch (...) {
    err << "spmdcheck: internal error\n";
    return kInternal;
  }
}

int cli_main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  return run_cli(args, std::cout, std::cerr);
}

}  // namespace spmd
