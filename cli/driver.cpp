// cli/driver.cpp - subcommands check, test, backward, run, schedule and ops.
#include "cli/driver.h"

#include "equiv/equiv.h"

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <regex>
#include <set>
#include <sstream>
#include <unistd.h>

#include "autograd/autograd.h"
#include "autograd/derive.h"
#include "cli/check_file.h"
#include "cli/explain.h"
#include "cli/report.h"
#include "cli/sarif.h"
#include "cli/schema.h"
#include "cli/render.h"
#include "cli/run.h"
#include "frontends/frontends.h"
#include "ir/loader.h"
#include "ir/source_file.h"
#include "schedules/schedule.h"
#include "ir/printer.h"
#include "spatial/spatial.h"
#include "temporal/temporal.h"

namespace spmd {

namespace {

bool exit_after_check = false;  // set by cli_main: the process ends when run_cli returns (tests call run_cli directly)

namespace fs = std::filesystem;

bool write_file(const std::string& path, const std::string& text, std::ostream& err) {
  std::ofstream f(path, std::ios::binary);
  // A full disk (or /dev/full) fails at the flush, after every `<<` succeeded into the buffer.
  if (!f || !(f << text) || !f.flush()) {
    err << "spmdcheck: cannot write " << path << "\n";
    return false;
  }
  return true;
}

#ifndef SPMD_VERSION
#define SPMD_VERSION "0.0.0"
#endif
constexpr const char* kVersion = SPMD_VERSION;

// --color auto|always|never: auto colours only a terminal (and never with NO_COLOR or TERM=dumb).
bool use_color(const std::string& mode, const std::ostream& out) {
  if (mode == "always") return true;
  if (mode == "never") return false;
  if (&out != &std::cout || !isatty(STDOUT_FILENO)) return false;
  const char* term = std::getenv("TERM");
  return !std::getenv("NO_COLOR") && !(term && std::string(term) == "dumb");
}

// Compiler-style colours on rendered diagnostics: the severity and check ID, and the location.
std::string colorize(const std::string& text) {
  static const std::regex sev(R"(^([^\n]*?: )(error\[[a-z0-9-]+\]|error|warning\[[a-z0-9-]+\]|note)(:))", std::regex::multiline);
  std::string s = std::regex_replace(text, sev, "\x1b[1m$1\x1b[0m\x1b[1;31m$2\x1b[0m$3");
  static const std::regex note("\x1b\\[1;31m(note)\x1b\\[0m");
  return std::regex_replace(s, note, "\x1b[1;36m$1\x1b[0m");
}

// `spmdcheck backward FILE`: the program with its derived backward, as YAML.
int cmd_backward(const std::string& path, const Options& opt, std::ostream& out) {
  try {
    Program p = load_input(path, opt);
    if (p.loss < 0) throw LoadError({}, "deriving the backward needs a `loss:` in the program (the tensor the backward starts from)");
    if (p.schedule.present && !p.schedule.stages.empty())
      throw LoadError(p.schedule.stages_loc, "a pipelined schedule's backward is derived per stage (its B, I and W steps) when the program is checked: "
                                             "`backward` prints one program's, so run `spmdcheck check` or `spmdcheck equiv` on this file");
    auto check = [&](const Program& q, SpatialTypes& types) {
      SpatialOptions so;
      so.z3_timeout_ms = opt.z3_timeout_ms;
      so.types = &types;
      return check_spatial(q, so);
    };
    // The named sizes stay names in the printed backward, so that a hand-written copy of it keeps them and `equiv`
    // checks it at reduced sizes. A concrete size is then a variable with one value, which a few rules do not
    // decide (GQA's kv heads replicated over an inner axis): such a forward is derived as written, with numbers.
    {
      std::optional<Program> g;
      try {
        LoadOptions lo;
        lo.generalize_sizes = true;
        g = load_input(path, opt, lo);
      } catch (const LoadError&) {}
      SpatialTypes types;
      if (g && !has_errors(check(*g, types))) {
        out << print_program(derive_backward(*g, types).program);
        return kClean;
      }
    }
    SpatialTypes types;
    auto diags = check(p, types);
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


// Captured graphs to a program (docs/import.md); nullopt after printing the located error.
std::optional<frontends::ImportResult> import_graphs(const frontends::ImportOptions& io, std::ostream& out) {
  try {
    return frontends::import_program(io);
  } catch (const frontends::ImportError& e) {
    out << render_load_error(e.file, LoadError(e.loc, e.what()));
    return std::nullopt;
  }
}

// `spmdcheck import fx|hlo SEQ RANKS -o OUT`
int cmd_import(const frontends::ImportOptions& io, const std::string& out_path, std::ostream& out, std::ostream& err) {
  auto r = import_graphs(io, out);
  if (!r) return kBadInput;
  if (out_path == "-") {
    out << r->yaml;
    return kClean;
  }
  if (!write_file(out_path, r->yaml, err)) return kBadInput;
  out << fmt::format("{}: {} ranks, {} ({} plan ops), spec {} ops\n", out_path, r->ranks, r->local_view ? "one local-view program" : "per-rank programs",
                     r->plan_ops, r->spec_ops);
  return kClean;
}

// `spmdcheck check SEQ_DIR RANKS_DIR`: two folders of graphs are imported first (FX dumps, or HLO with .hlo files).
bool is_graph_folder(const std::string& p) {
  std::error_code ec;
  return fs::is_directory(p, ec);
}

int cmd_check(std::vector<std::string> files, const std::string& format, Options opt, bool color, std::ostream& out, frontends::ImportOptions io = {}) {
  if (files.size() == 2 && is_graph_folder(files[0]) && is_graph_folder(files[1])) {
    io.seq = files[0], io.ranks = files[1];
    io.format = "fx";
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(files[1], ec))
      if (e.path().extension() == ".hlo") io.format = "hlo";
    auto r = import_graphs(io, out);
    if (!r) return kBadInput;
    std::string name = fs::path(files[1]).lexically_normal().string();
    while (name.size() > 1 && name.back() == '/') name.pop_back();
    name += ".imported.yaml";
    opt.imported[name] = r->yaml;
    files = {name};
  }
  int code = kClean;
  nlohmann::json all = nlohmann::json::array();
  std::vector<FileResult> kept;  // --format sarif renders every file at the end
  kept.reserve(files.size());
  for (const auto& path : files) {
    const std::string f = display_name(path);
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
    FileResult r = check_file(path, opt, dot);
    int c = r.load_failed ? kBadInput : has_errors(r.diags) ? kFindings : kClean;
    if (dot_file.is_open() && !dot_file.flush()) {
      out << f << ": error: cannot write " << opt.dump_hb << " (the happens-before graph)\n";
      c = std::max(c, static_cast<int>(kBadInput));
    }
    if (!opt.trace.empty() && r.schedule && !write_file(opt.trace, schedule_trace(*r.schedule), out)) c = std::max(c, static_cast<int>(kBadInput));
    code = std::max(code, c);
    if (format == "json") {
      nlohmann::json diags = nlohmann::json::array();
      if (r.load_failed) {
        diags.push_back({{"id", "invalid-input"},
                         {"severity", "error"},
                         {"file", f},
                         {"line", shown_loc(r.load_error.loc).line},
                         {"column", shown_loc(r.load_error.loc).col},
                         {"message", r.load_error.what()},
                         {"op", nullptr},
                         {"tensor", nullptr},
                         {"ranks", nlohmann::json::array()},
                         {"notes", nlohmann::json::array()},
                         {"fix", nullptr}});
      } else {
        diags = render_json(f, r.diags);
      }
      all.push_back({{"file", f}, {"verdict", r.load_failed ? "error" : c == kFindings ? "fail" : "pass"}, {"diagnostics", diags}});
    } else if (format == "sarif") {
      kept.push_back(std::move(r));
    } else if (r.load_failed) {
      out << (color ? colorize(r.load_message) : r.load_message);
    } else {
      out << (color ? colorize(render_text(f, r.diags)) : render_text(f, r.diags));
      if (r.schedule && !r.blocked.empty())
        out << fmt::format("{}: note: the schedule up to the deadlock (>cell< = where each blocked rank waits):\n{}", f,
                           schedule_grid(*r.schedule, r.blocked));
      if (r.dropped) out << fmt::format("{}: note: {} more diagnostics not shown (--max-diagnostics)\n", f, r.dropped);
    }
    // The process ends right after the last file (cli_main): its program (a million ops are millions of small
    // blocks) is left to the operating system instead of freed block by block.
    if (exit_after_check && &path == &files.back() && !r.program.ops.empty()) new FileResult(std::move(r));  // NOLINT
  }
  // Diagnostics may echo bytes of the input that are not UTF-8: replace them (U+FFFD) rather than fail.
  if (format == "json") out << nlohmann::json{{"files", all}}.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
  if (format == "sarif") {
    std::vector<SarifFile> sf;
    for (const auto& r : kept) sf.push_back({display_name(r.file), &r.diags, r.load_failed ? &r.load_error : nullptr});
    out << render_sarif(sf, kVersion).dump(2, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
  }
  return code;
}

// The files `test` runs: a file as given; a directory's .yaml and .yml files, recursively, in name order. A
// directory that cannot be read is an entry with its error (a FAIL), never skipped.
struct TestInput {
  std::string path, error;
};
void collect(const std::string& path, std::vector<TestInput>& files) {
  std::error_code ec;
  if (!fs::is_directory(path, ec)) return files.push_back({path, {}});
  std::vector<TestInput> found;
  std::vector<fs::path> dirs{path};
  while (!dirs.empty()) {
    fs::path d = std::move(dirs.back());
    dirs.pop_back();
    fs::directory_iterator it(d, ec), end;
    for (; !ec && it != end; it.increment(ec)) {
      std::error_code e2;
      if (it->symlink_status(e2).type() == fs::file_type::directory)
        dirs.push_back(it->path());  // a link to a directory is not followed
      else if (auto ext = it->path().extension(); ext == ".yaml" || ext == ".yml")
        found.push_back({it->path().string(), {}});  // CSV files carry no expect:
    }
    if (ec) found.push_back({d.string(), "cannot read the directory: " + ec.message()});
  }
  std::sort(found.begin(), found.end(), [](const TestInput& a, const TestInput& b) { return a.path < b.path; });
  files.insert(files.end(), found.begin(), found.end());
}

// `# expect-error: LINE:COL: text` in a file's raw text (a malformed file cannot carry `expect:`).
struct ExpectedError {
  bool present = false;
  std::uint32_t line = 0, col = 0;
  std::string text;
  std::string bad;  // why the line itself is malformed
};

ExpectedError read_expected_error(const std::string& text) {
  ExpectedError e;
  static const std::regex re(R"(^\s*#\s*expect-error:\s*(\d+):(\d+):\s*(.*?)\s*$)");
  for (std::size_t pos = 0; pos < text.size();) {
    std::size_t end = std::min(text.find('\n', pos), text.size());
    std::string_view line(text.data() + pos, end - pos);
    pos = end + 1;
    if (line.find("expect-error") == std::string_view::npos) continue;  // the regex only on candidate lines
    std::match_results<std::string_view::const_iterator> m;
    if (!std::regex_match(line.begin(), line.end(), m, re)) continue;
    e.present = true;
    auto number = [&](const auto& g, std::uint32_t& v) {
      auto r = std::from_chars(&*g.first, &*g.first + g.length(), v);
      if (r.ec != std::errc() || v == 0)
        e.bad = "`# expect-error:` gives position " + std::string(m[1]) + ":" + std::string(m[2]) + ", not a line and column of a file";
    };
    number(m[1], e.line);
    number(m[2], e.col);
    e.text = m[3];
    break;
  }
  return e;
}

int cmd_test(const std::vector<std::string>& paths, const Options& opt, std::ostream& out) {
  std::vector<TestInput> files;
  for (const auto& p : paths) collect(p, files);
  int passed = 0, failed = 0;
  for (const auto& [f, unreadable] : files) {
    std::string why = unreadable;
    ExpectedError ee;
    if (why.empty()) {
      // The file's kind and size are checked before a byte of it is read (a FIFO or /dev/zero named .yaml).
      try {
        ee = read_expected_error(input_text(f, opt));
      } catch (const LoadError& e) {
        why = "failed to load:\n  " + render_load_error(display_name(f), e);
      }
      if (why.empty() && !ee.bad.empty()) why = ee.bad;
    }
    FileResult r;
    if (why.empty()) r = check_file(f, opt);
    if (!why.empty()) {
    } else if (ee.present) {
      if (!r.load_failed) why = "expected a load error, but the file loaded";
      else if (shown_loc(r.load_error.loc).line != ee.line || shown_loc(r.load_error.loc).col != ee.col ||
               std::string(r.load_error.what()).find(ee.text) == std::string::npos)
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
        // A file with neither `expect:` nor `# expect-error:` is checked as `expect: []` (docs/format.md).
        why = r.program.has_expect ? fmt::format("expected {} but got {}\n{}", list(want_set), list(got), render_text(f, r.diags))
                                   : fmt::format("no `expect:`, so it must produce no diagnostic (as `expect: []`), but got {}\n{}", list(got),
                                                 render_text(display_name(f), r.diags));
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

// `explain FILE`: every value's shape, placements, local shape and why; with --tensor its layout picture.
int cmd_explain(const std::string& path, const ExplainFilter& filter, const Options& opt, bool color, std::ostream& out, std::ostream& err) {
  SpatialTypes types;
  types.want_origins = true;
  FileResult r = check_file(path, opt, nullptr, &types);
  const std::string f = display_name(path);
  if (r.load_failed) {
    err << r.load_message;
    return kBadInput;
  }
  if (r.schedule) {
    out << f << ": a pipeline schedule (no tensors to explain); its grid:\n" << schedule_grid(*r.schedule, r.blocked);
    return has_errors(r.diags) ? kFindings : kClean;
  }
  Explanation e = explain_program(r.program, types);
  try {
    out << explain_text(f, r.program, types, e, r.diags, filter, color);
  } catch (const LoadError& x) {
    err << "spmdcheck: " << x.what() << "\n";
    return kBadInput;
  }
  return has_errors(r.diags) ? kFindings : kClean;
}

// `report FILE -o OUT.html`: one self-contained page (exit codes as `check`).
int cmd_report(const std::string& path, const std::string& output, const Options& opt, std::ostream& out, std::ostream& err) {
  SpatialTypes types;
  types.want_origins = true;
  FileResult r = check_file(path, opt, nullptr, &types);
  // A training program: the page shows its training step (forward, backward, grad_sync), where the gradients are.
  TrainingCheck step;
  SpatialTypes step_types;
  step_types.want_origins = true;
  ReportStep rs;
  if (!r.load_failed && !r.schedule && !r.program.local_view && r.program.loss >= 0 && (r.program.train || r.program.has_backward || opt.backward)) {
    try {
      step = check_training(r.program, {opt.z3_timeout_ms, nullptr, true, &step_types});  // checks the forward again: its verdict decides
    } catch (const LoadError&) {  // check_file has reported it
    }
    if (step.built) rs = {&step.program, &step_types, step.first_backward, step.first_sync, step.first_optim};
  }
  std::string text;  // the source shown on the page; none for a file that is not a readable program (a device, too large)
  try {
    text = input_text(path, opt);
  } catch (const LoadError&) {}
  std::string html = report_html(r, r.load_failed || r.schedule ? nullptr : &types, text, kVersion, rs);
  if (output == "-") out << html;
  else if (!write_file(output, html, err)) return kBadInput;
  if (r.load_failed) err << r.load_message;  // on the page, and said where the command was run
  return r.load_failed ? kBadInput : has_errors(r.diags) ? kFindings : kClean;
}

// `run`: 0 every file agrees, 1 some file differs (or fails on one device), 2 bad input, 4 some file skipped.
int cmd_run(const std::vector<std::string>& files, const RunOptions& opt, const Options& in, std::ostream& out) {
  int code = kClean;
  bool skipped = false;
  for (const auto& f : files) {
    RunReport r;
    if (f != "-")
      r = run_program_file(f, opt);
    else if (in.stdin_error)
      r.load_error = in.stdin_error;
    else
      r = run_program_text(in.stdin_text.value_or(""), display_name(f), opt);
    out << render_run(display_name(f), r);
    if (r.load_error) code = std::max(code, static_cast<int>(kBadInput));
    else if (r.oracle.verdict == OracleVerdict::Differ || r.oracle.verdict == OracleVerdict::GlobalError) code = std::max(code, static_cast<int>(kFindings));
    else if (r.oracle.verdict == OracleVerdict::Skipped) skipped = true;
  }
  return code == kClean && skipped ? 4 : code;
}

// `spmdcheck equiv`: each file's plan against its spec (or its own ops on one device); exit 0 equivalent, 1 a
// value mismatch, 2 bad input, 4 not proved (skipped, or equal in real numbers only).
int cmd_equiv(const std::vector<std::string>& files, const EquivOptions& given, const Options& opt, std::ostream& out) {
  int code = kClean;
  bool unproved = false;
  for (const auto& path : files) {
    const std::string f = display_name(path);
    Program p;
    try {
      p = load_input(path, opt);
    } catch (const LoadError& e) {
      out << render_load_error(f, e);
      code = std::max(code, static_cast<int>(kBadInput));
      continue;
    }
    EquivResult r = check_equivalence(p, given);
    annotate_instances(p, r.diags);
    annotate_origins(p, f, r.diags);
    out << render_text(f, r.diags);
    out << f << ": " << equiv_verdict_name(r.verdict) << (r.verdict == EquivVerdict::Equivalent && r.drawn_routings ? " for the drawn routings" : "") << ": " << r.message << "\n";
    if (r.verdict == EquivVerdict::Mismatch) code = std::max(code, static_cast<int>(kFindings));
    else if (r.verdict != EquivVerdict::Equivalent) unproved = true;
  }
  return code == kClean && unproved ? 4 : code;
}

}  // namespace

int run_cli(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) { return run_cli(args, out, err, std::cin); }

int run_cli(const std::vector<std::string>& args, std::ostream& out, std::ostream& err, std::istream& in) {
  try {
    CLI::App app{"spmdcheck: a static verifier for SPMD distributed-training programs", "spmdcheck"};
    app.require_subcommand(1);
    app.fallthrough();
    app.set_version_flag("--version", std::string("spmdcheck ") + kVersion);
    std::string color_mode = "auto";
    app.add_option("--color", color_mode, "colour the output: auto (a terminal only; NO_COLOR turns it off), always or never")
        ->check(CLI::IsMember({"auto", "always", "never"}));
    Options opt;
    std::vector<std::string> files;
    std::string format = "text";
    auto* check = app.add_subcommand("check", "run every check on FILE... and print diagnostics");
    check->add_option("files", files, "program files")->required();
    check->add_option("--format", format, "text, json or sarif (SARIF 2.1.0, for GitHub code scanning)")->check(CLI::IsMember({"text", "json", "sarif"}));
    check->add_option("--z3-timeout", opt.z3_timeout_ms, "solver time limit per obligation, in milliseconds (a timeout is reported, never passed)");
    check->add_option("--max-diagnostics", opt.max_diagnostics, "show at most N diagnostics per file");
    check->add_option("--dump-hb", opt.dump_hb, "write the happens-before graph as Graphviz DOT to FILE (- for stdout)");
    check->add_option("--p2p-model", opt.p2p_model,
                      "buffering of point-to-point sends for the deadlock check: eager (a send completes at once) or rendezvous (a blocking send "
                      "waits for its receive); overrides the file's `p2p_model`, default rendezvous")
        ->check(CLI::IsMember({"eager", "rendezvous"}));
    check->add_flag("--backward", opt.backward, "derive the backward from `loss:` and check it too (as `train: true`)");
    check->add_option("--max-work", opt.max_work, "the value check of a file with a `spec:` (or `view: local`): element operations in all of its runs (as equiv's)")
        ->check(CLI::Range(std::int64_t{1}, std::int64_t{1} << 50));
    check->add_option("--max-memory", opt.max_mib, "the value check's MiB of tensor values one trial may hold at once (as equiv's)")
        ->check(CLI::Range(std::int64_t{16}, std::int64_t{1} << 20));
    frontends::ImportOptions io;  // `check SEQ_DIR RANKS_DIR` and `import`
    check->add_option("--relation", io.relation, "with SEQ_DIR RANKS_DIR: the relation file (docs/import.md)");
    check->add_option("--ops", io.ops_files, "with SEQ_DIR RANKS_DIR: more custom-op mapping files");
    check->add_option("--graph", io.graph, "with SEQ_DIR RANKS_DIR: which dump of each folder (fw, bw, both, both.g0)");
    check->add_flag("--reduce", io.reduce, "with SEQ_DIR RANKS_DIR: check at small values of the named sizes (every division kept exact)");
    auto* import = app.add_subcommand("import", "read captured graphs (PyTorch FX print_readable text, XLA HLO text) into a program with `spec:` (docs/import.md)");
    import->require_subcommand(1);
    std::string import_out;
    for (const char* fmt_name : {"fx", "hlo"}) {
      auto* s = import->add_subcommand(fmt_name, std::string(fmt_name) == "fx" ? "GraphModule.print_readable() dumps, one file per rank (fw.g0.r0.py ...)"
                                                                              : "HLO module text (as_text(), XLA dumps): one SPMD module");
      s->add_option("seq", io.seq, "the sequential graph's folder (or file)")->required();
      s->add_option("ranks", io.ranks, "the ranks' graphs' folder (or file)")->required();
      s->add_option("--relation", io.relation, "the relation file (mesh axes, placements, outputs, constants)");
      s->add_option("--ops", io.ops_files, "more custom-op mapping files (after frontends/custom_ops.yaml)");
      s->add_option("--graph", io.graph, "which dump of each folder (fw, bw, both, both.g0)");
      s->add_flag("--reduce", io.reduce, "write the named sizes at small values that keep every division exact (the graphs' values in comments)");
      s->add_option("-o,--output", import_out, "the program to write (- for standard output)")->required();
      s->callback([&io, fmt_name] { io.format = fmt_name; });
    }
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
    std::uint64_t equiv_seed = 0;
    auto* equiv = app.add_subcommand("equiv",
                                     "prove FILE...'s plan equal to its `spec:` (or to its own ops on one device), or give a counterexample and the first op "
                                     "that goes wrong (exit 0 equivalent, 1 value-mismatch, 4 not proved)");
    equiv->add_option("files", files, "program files")->required();
    equiv->add_option("--seed", equiv_seed, "the random field, the drawn inputs and the instantiation of symbolic sizes");
    bool equiv_declared = false;
    EquivOptions equiv_opt;
    equiv->add_option("--max-work", equiv_opt.max_work,
                      "element operations in all of a check's runs (default 250,000,000: about 4 s); a check past it is not proved")
        ->check(CLI::Range(std::int64_t{1}, std::int64_t{1} << 50));
    std::int64_t equiv_mib = 0;
    equiv->add_option("--max-memory", equiv_mib,
                      "MiB of tensor values one trial may hold at once (default 800), checked before allocating; a trial past it is not proved "
                      "(two trials run at once only when twice the last one's peak fits in it, each then within it)")
        ->check(CLI::Range(std::int64_t{16}, std::int64_t{1} << 20));
    equiv->add_flag("--declared-sizes", equiv_declared,
                    "run at the declared sizes, without shape reduction (docs/equivalence.md, \"Shape reduction\"); a run too large is not proved");
    std::string explain_file;
    ExplainFilter filter;
    int explain_op = -1;
    auto* explain = app.add_subcommand("explain", "show every value's global shape, placement per axis, local shape and why; --tensor draws its layout");
    explain->add_option("file", explain_file, "program file (- for standard input)")->required();
    explain->add_option("--tensor", filter.tensor, "only this tensor: its values and a picture of its layout over the mesh");
    explain->add_option("--op", explain_op, "only op N (0-based, in file order): its outputs and inputs");
    explain->add_option("--z3-timeout", opt.z3_timeout_ms, "solver time limit per obligation, in milliseconds");
    std::string report_file, report_out;
    auto* report = app.add_subcommand("report", "write one self-contained HTML page: the program with its diagnostics, placements, layouts, timeline");
    report->add_option("file", report_file, "program or schedule file (- for standard input)")->required();
    report->add_option("-o,--output", report_out, "the HTML file to write (- for standard output)")->required();
    report->add_option("--z3-timeout", opt.z3_timeout_ms, "solver time limit per obligation, in milliseconds");
    auto* schema = app.add_subcommand("schema", "print the JSON Schema of the program format (for editors and CI)");
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
    } catch (const CLI::CallForVersion& e) {
      out << e.what() << "\n";
      return kClean;
    } catch (const CLI::ParseError& e) {
      err << "spmdcheck: " << e.what() << "\n" << "run 'spmdcheck --help' for usage\n";
      return kBadInput;
    }
    // `-` reads standard input (once, whichever argument names it).
    auto wants_stdin = [&](const std::vector<std::string>& v) { return std::find(v.begin(), v.end(), "-") != v.end(); };
    if (wants_stdin(files) || wants_stdin(paths) || explain_file == "-" || report_file == "-" || bwd_file == "-") {
      try {
        opt.stdin_text = read_input_stream(in, "standard input", &in == &std::cin ? STDIN_FILENO : -1);
      } catch (const LoadError& e) {
        opt.stdin_error = e;  // each command reports it as it reports a file it cannot load
      }
    }
    bool color = use_color(color_mode, out);
    if (*check) return cmd_check(files, format, opt, color, out, io);
    if (*import) return cmd_import(io, import_out, out, err);
    if (*explain) {
      if (explain_op >= 0) filter.op = explain_op;
      if (explain->count("--op") && explain_op < 0) {
        err << "spmdcheck: --op takes an op index (0-based)\n";
        return kBadInput;
      }
      return cmd_explain(explain_file, filter, opt, color, out, err);
    }
    if (*report) return cmd_report(report_file, report_out, opt, out, err);
    if (*schema) {
      out << program_schema().dump(2) << "\n";
      return kClean;
    }
    if (*test) return cmd_test(paths, opt, out);
    if (*equiv) {
      equiv_opt.seed = equiv_seed;
      equiv_opt.reduce = !equiv_declared;
      if (equiv_mib > 0) equiv_opt.max_bytes = equiv_mib << 20;
      return cmd_equiv(files, equiv_opt, opt, out);
    }
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
    if (*run) return cmd_run(files, ropt, opt, out);
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
  exit_after_check = true;
  std::vector<std::string> args(argv + 1, argv + argc);
  return run_cli(args, std::cout, std::cerr);
}

}  // namespace spmd
