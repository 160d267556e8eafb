// cli/driver.cpp - subcommands check, test, backward, run, schedule and ops.
#include "cli/driver.h"

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <regex>
#include <set>
#include <sstream>

#include "autograd/autograd.h"
#include "autograd/derive.h"
#include "cli/render.h"
#include "cli/run.h"
#include "ir/loader.h"
#include "schedules/schedule.h"
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
  std::optional<Schedule> schedule;  // a pipeline schedule (a .csv file or `schedule:`)
  std::vector<Loc> blocked;          // its cells where a deadlock left a rank blocked
};

struct Options {
  unsigned z3_timeout_ms = 10000;
  std::size_t max_diagnostics = 50;
  std::string dump_hb;  // --dump-hb FILE ("-" = stdout)
  std::string p2p_model;  // --p2p-model eager|rendezvous (overrides the file's `p2p_model`)
  std::string trace;      // --trace FILE: a Chrome trace of the (first) schedule checked
  bool backward = false;  // --backward: derive and check the backward even without `train: true`
};

bool has_errors(const std::vector<Diagnostic>& d) {
  return std::any_of(d.begin(), d.end(), [](const Diagnostic& x) { return x.severity == Severity::Error; });
}

bool write_file(const std::string& path, const std::string& text, std::ostream& err) {
  std::ofstream f(path);
  if (!f || !(f << text)) {
    err << "spmdcheck: cannot write " << path << "\n";
    return false;
  }
  return true;
}

// --p2p-model, when given (it overrides the file's `p2p_model`).
std::optional<P2PModel> model_option(const Options& opt) {
  if (opt.p2p_model.empty()) return std::nullopt;
  return opt.p2p_model == "eager" ? P2PModel::Eager : P2PModel::Rendezvous;
}

bool is_csv(const std::string& path) { return fs::path(path).extension() == ".csv"; }

// The schedule a file describes: a CSV file, or a program's `schedule:` (generated or a CSV next to it).
Schedule schedule_of(const std::string& path, const Program& p) {
  if (is_csv(path)) return load_schedule_csv(path);
  const ScheduleSpec& sp = p.schedule;
  if (!sp.kind.empty()) {
    try {
      return generate_schedule(sp.kind, static_cast<int>(sp.ranks), static_cast<int>(sp.microbatches), static_cast<int>(sp.virtual_stages));
    } catch (const std::invalid_argument& e) {
      throw LoadError(sp.kind_loc, e.what());
    }
  }
  fs::path csv = fs::path(path).parent_path() / sp.csv;
  Schedule s;
  try {
    s = load_schedule_csv(csv.string());
  } catch (const LoadError& e) {
    throw LoadError(sp.csv_loc, e.loc.line ? fmt::format("in {}:{}:{}: {}", csv.string(), e.loc.line, e.loc.col, e.what()) : e.what());
  }
  if (static_cast<std::int64_t>(s.rows.size()) != sp.ranks)
    throw LoadError(sp.csv_loc, fmt::format("{} has {} rows (pipeline ranks), but mesh axis {} has size {}", sp.csv, s.rows.size(),
                                            p.mesh[static_cast<std::size_t>(sp.axis)].name, sp.ranks));
  return s;
}

// Validates a schedule; when it is valid, lowers it to per-rank programs and runs the temporal checks
// (default model: eager, as PyTorch's runtime posts isend/irecv).
void check_schedule(FileResult& r, const Options& opt, std::ostream* dot) {
  const Schedule& s = *r.schedule;
  r.diags = validate_schedule(s);
  bool invalid = std::any_of(r.diags.begin(), r.diags.end(), [](const Diagnostic& d) { return d.id == CheckId::ScheduleInvalid; });
  if (invalid) return;  // the simulation of an incomplete schedule would only repeat it
  P2PModel model = model_option(opt).value_or(r.program.has_p2p_model ? r.program.p2p_model : P2PModel::Eager);
  Program lowered = lower_schedule(s, model);
  TemporalOptions to;
  to.dot = dot;
  to.p2p_model = model;
  for (auto& d : check_temporal(lowered, to)) {
    if (d.id == CheckId::Deadlock)
      for (const auto& n : d.notes)
        if (n.message.find("is blocked here") != std::string::npos) r.blocked.push_back(n.loc);
    r.diags.push_back(std::move(d));
  }
}

// Loads and checks one file; `dot`, when set, receives the happens-before graph.
FileResult check_file(const std::string& path, const Options& opt, std::ostream* dot = nullptr) {
  FileResult r;
  r.file = path;
  try {
    if (!is_csv(path)) r.program = load_program_file(path);
    if (is_csv(path) || r.program.schedule.present) r.schedule = schedule_of(path, r.program);
  } catch (const LoadError& e) {
    r.load_failed = true;
    r.load_error = e;
    r.load_message = render_load_error(path, e);
    return r;
  }
  if (r.schedule) {
    check_schedule(r, opt, dot);
    if (!is_csv(path)) {
      // Positions inside a generated or referenced schedule are grid cells, not lines of this file.
      Loc at = r.program.schedule.loc;
      for (auto& d : r.diags) {
        d.message += r.program.schedule.kind.empty() ? fmt::format(" [at {}:{}:{}]", r.program.schedule.csv, d.loc.line, d.loc.col)
                                                     : fmt::format(" [schedule rank {}, step {}]", d.loc.line ? d.loc.line - 1 : 0, d.loc.col);
        d.loc = at;
        for (auto& n : d.notes) n.loc = at;
      }
    }
    r.dropped = sort_and_cap(r.diags, opt.max_diagnostics);
    return r;
  }
  SpatialOptions so;
  so.z3_timeout_ms = opt.z3_timeout_ms;
  SpatialTypes forward;  // kept for the training step, which does not check the forward again
  bool training = r.program.train || r.program.has_backward || opt.backward;
  if (training) so.types = &forward;
  r.diags = check_spatial(r.program, so);
  bool forward_ok = !has_errors(r.diags);
  TemporalOptions to;
  to.dot = dot;
  to.p2p_model = model_option(opt);
  for (auto& d : check_temporal(r.program, to)) r.diags.push_back(std::move(d));
  const Program& p = r.program;
  if (training) {
    try {
      if (p.loss < 0) throw LoadError({}, "--backward needs a `loss:` in the program (the tensor the backward starts from)");
      TrainingCheck t = check_training(p, {opt.z3_timeout_ms, &forward, forward_ok});
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
    if (!opt.trace.empty() && r.schedule && !write_file(opt.trace, schedule_trace(*r.schedule), out)) c = std::max(c, static_cast<int>(kBadInput));
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
      if (r.schedule && !r.blocked.empty())
        out << fmt::format("{}: note: the schedule up to the deadlock (>cell< = where each blocked rank waits):\n{}", f,
                           schedule_grid(*r.schedule, r.blocked));
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
      if (it->is_regular_file() && (ext == ".yaml" || ext == ".yml")) found.push_back(it->path().string());  // CSV files carry no expect:
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

// `run`: 0 every file agrees, 1 some file differs (or fails on one device), 2 bad input, 4 some file skipped.
int cmd_run(const std::vector<std::string>& files, const RunOptions& opt, std::ostream& out) {
  int code = kClean;
  bool skipped = false;
  for (const auto& f : files) {
    RunReport r = run_program_file(f, opt);
    out << render_run(f, r);
    if (r.load_error) code = std::max(code, static_cast<int>(kBadInput));
    else if (r.oracle.verdict == OracleVerdict::Differ || r.oracle.verdict == OracleVerdict::GlobalError) code = std::max(code, static_cast<int>(kFindings));
    else if (r.oracle.verdict == OracleVerdict::Skipped) skipped = true;
  }
  return code == kClean && skipped ? 4 : code;
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
    check->add_option("--p2p-model", opt.p2p_model,
                      "buffering of point-to-point sends for the deadlock check: eager (a send completes at once) or rendezvous (a blocking send "
                      "waits for its receive); overrides the file's `p2p_model`, default rendezvous")
        ->check(CLI::IsMember({"eager", "rendezvous"}));
    check->add_flag("--backward", opt.backward, "derive the backward from `loss:` and check it too (as `train: true`)");
    std::string bwd_file;
    auto* backward = app.add_subcommand("backward", "print FILE with its derived backward (`backward:`) as YAML");
    backward->add_option("file", bwd_file, "program file (declares `loss:`)")->required();
    std::vector<std::string> paths;
    auto* test = app.add_subcommand("test", "check files (or directories) against their `expect:`; closing line 'N passed, N failed'");
    test->add_option("paths", paths, "files or directories")->required();
    test->add_option("--z3-timeout", opt.z3_timeout_ms, "solver time limit per obligation, in milliseconds");
    check->add_option("--trace", opt.trace, "for a schedule: write a Chrome/Perfetto trace (JSON) to FILE");
    auto* sched = app.add_subcommand("schedule", "pipeline schedules: generate, show");
    sched->require_subcommand(1);
    std::string kind;
    int stages = 0, microbatches = 0, virtual_stages = 1;
    bool comms = false;
    std::string trace;
    auto* gen = sched->add_subcommand("gen", "print a generated schedule as PyTorch pipelining CSV");
    gen->add_option("--kind", kind, "GPipe, 1F1B, Interleaved1F1B or ZBH1")->required();
    gen->add_option("--stages", stages, "pipeline ranks")->required();
    gen->add_option("--microbatches", microbatches, "microbatches")->required();
    gen->add_option("--virtual", virtual_stages, "virtual stages per rank (Interleaved1F1B)");
    gen->add_flag("--comms", comms, "include SEND/RECV actions (the lowered form)");
    gen->add_option("--trace", trace, "also write a Chrome/Perfetto trace (JSON) to FILE");
    std::string show_file;
    auto* show = sched->add_subcommand("show", "print a schedule (CSV, or a program with `schedule:`) as a per-rank grid");
    show->add_option("file", show_file, "schedule file")->required();
    show->add_flag("--comms", comms, "show the SEND/RECV actions of a compute-only schedule");
    show->add_option("--trace", trace, "also write a Chrome/Perfetto trace (JSON) to FILE");
    RunOptions ropt;
    auto* run = app.add_subcommand("run", "run FILE... per rank and on one device and compare the outputs (exit 0 agree, 1 differ, 4 skipped)");
    run->add_option("files", files, "program files")->required();
    run->add_option("--seed", ropt.seed, "input values and the instantiation of symbolic sizes");
    run->add_option("--z3-timeout", ropt.z3_timeout_ms, "solver time limit per obligation, in milliseconds");
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
    if (*sched) {
      Schedule sc;
      if (*gen) {
        try {
          sc = generate_schedule(kind, stages, microbatches, virtual_stages);
        } catch (const std::invalid_argument& e) {
          err << "spmdcheck: " << e.what() << "\n";
          return kBadInput;
        }
      } else {
        Program p;
        try {
          if (!is_csv(show_file)) p = load_program_file(show_file);
          if (!is_csv(show_file) && !p.schedule.present) {
            err << show_file << ": error: the program has no `schedule:`\n";
            return kBadInput;
          }
          sc = schedule_of(show_file, p);
        } catch (const LoadError& e) {
          err << render_load_error(show_file, e);
          return kBadInput;
        }
      }
      if (comms) sc = with_comms(sc);
      if (*gen) out << schedule_csv(sc);
      else out << sc.source << ": " << sc.rows.size() << " ranks, " << sc.stages << " stages, " << sc.microbatches << " microbatches\n" << schedule_grid(sc);
      if (!trace.empty() && !write_file(trace, schedule_trace(sc), err)) return kBadInput;
      return kClean;
    }
    if (*backward) return cmd_backward(bwd_file, opt, out);
    if (*run) return cmd_run(files, ropt, out);
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
