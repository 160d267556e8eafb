// cli/check_file.cpp - load one input and run every check on it (shared by check, test, explain, report).
#include "cli/check_file.h"

#include "equiv/equiv.h"
#include "equiv/pipeline.h"

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "autograd/autograd.h"
#include "cli/render.h"
#include "ir/loader.h"
#include "ir/source_file.h"
#include "interp/interp.h"
#include "temporal/temporal.h"

namespace spmd {

namespace {

namespace fs = std::filesystem;

// The value check's budgets: --max-work and --max-memory when given, else equiv's defaults.
EquivOptions value_check_options(const Options& opt) {
  EquivOptions eo;
  if (opt.max_work > 0) eo.max_work = opt.max_work;
  if (opt.max_mib > 0) eo.max_bytes = opt.max_mib << 20;
  return eo;
}

// --p2p-model, when given (it overrides the file's `p2p_model`).
std::optional<P2PModel> model_option(const Options& opt) {
  if (opt.p2p_model.empty()) return std::nullopt;
  return opt.p2p_model == "eager" ? P2PModel::Eager : P2PModel::Rendezvous;
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
        if (blocked_rank(n)) r.blocked.push_back(n.loc);
    r.diags.push_back(std::move(d));
  }
}

// A schedule whose stages run real ops (docs/schedules.md, "Stages"): the stages' one-microbatch training step is
// checked (spatial, backward, unsynced-gradient), the per-rank programs it lowers to get the temporal checks, and the
// value check compares them with the spec.
void check_stages(FileResult& r, const Options& opt, const std::string& path) {
  if (std::any_of(r.diags.begin(), r.diags.end(), [](const Diagnostic& d) { return d.id == CheckId::ScheduleInvalid; })) return;
  PipelineLowering pl;
  try {
    pl = lower_pipeline(r.program, *r.schedule);
  } catch (const LoadError& e) {
    r.load_failed = true;
    r.load_error = e;
    r.load_message = render_load_error(display_name(path), e);
    return;
  }
  // Their op indices are the step's or the lowered programs', not the file's (which has no ops): located by line only.
  auto add = [&](std::vector<Diagnostic> ds) {
    for (auto& d : ds) d.op = -1, r.diags.push_back(std::move(d));
  };
  add(std::move(pl.diags));
  if (!pl.built || has_errors(r.diags)) return;
  TemporalOptions to;
  to.p2p_model = model_option(opt).value_or(r.program.has_p2p_model ? r.program.p2p_model : P2PModel::Eager);
  add(check_temporal(pl.program, to));
  if (r.program.has_spec && !has_errors(r.diags)) add(check_equivalence(r.program, value_check_options(opt)).diags);
}

}  // namespace

std::optional<BlockedRank> blocked_rank(const Note& n) {
  if (n.message.rfind("rank ", 0) != 0) return std::nullopt;
  for (auto [text, cycle] : {std::pair<const char*, bool>{" is blocked here: ", true}, {" is also blocked: ", false}})
    if (auto at = n.message.find(text); at != std::string::npos) return BlockedRank{n.message.substr(5, at - 5), cycle};
  return std::nullopt;
}

std::string display_name(const std::string& path) { return path == "-" ? "<stdin>" : path; }

std::string input_text(const std::string& path, const Options& opt) {
  if (auto it = opt.imported.find(path); it != opt.imported.end()) return it->second;
  if (path != "-") return read_input_file(path, is_csv(path) ? kMaxCsvBytes : kMaxInputBytes);
  if (opt.stdin_error) throw *opt.stdin_error;
  return opt.stdin_text.value_or("");
}

Program load_input(const std::string& path, const Options& opt, const LoadOptions& lo) {
  if (path == "-") return load_program_string(input_text(path, opt), display_name(path), lo);
  if (auto it = opt.imported.find(path); it != opt.imported.end()) return load_program_string(it->second, path, lo);
  return load_program_file(path, lo);
}

bool is_csv(const std::string& path) { return fs::path(path).extension() == ".csv"; }

bool has_errors(const std::vector<Diagnostic>& d) {
  return std::any_of(d.begin(), d.end(), [](const Diagnostic& x) { return x.severity == Severity::Error; });
}

// The schedule a file describes: a CSV file, or a program's `schedule:` (generated or a CSV next to it).
Schedule schedule_of(const std::string& path, const Program& p) {
  if (is_csv(path)) return load_schedule_csv(path);
  return program_schedule(p, path);
}

// Loads and checks one file; `dot`, when set, receives the happens-before graph.
FileResult check_file(const std::string& path, const Options& opt, std::ostream* dot, SpatialTypes* types) {
  FileResult r;
  r.file = path;
  try {
    if (!is_csv(path)) r.program = load_input(path, opt);
    if (is_csv(path) || r.program.schedule.present) r.schedule = schedule_of(path, r.program);
  } catch (const LoadError& e) {
    r.load_failed = true;
    r.load_error = e;
    r.load_message = render_load_error(display_name(path), e);
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
    if (!r.program.schedule.stages.empty()) check_stages(r, opt, path);
    if (r.load_failed) return r;
    r.dropped = sort_and_cap(r.diags, opt.max_diagnostics);
    return r;
  }
  SpatialOptions so;
  so.z3_timeout_ms = opt.z3_timeout_ms;
  SpatialTypes forward;  // kept for the training step, which does not check the forward again
  // A local-view backward is hand-written rank by rank, with no placements to type it: the value check compares its
  // gradients with the spec's (equiv/training.h, local_training_pair).
  bool training = (r.program.train || r.program.has_backward || opt.backward) && !r.program.local_view;
  so.types = types ? types : training ? &forward : nullptr;
  r.diags = check_spatial(r.program, so);
  bool forward_ok = !has_errors(r.diags);
  TemporalOptions to;
  to.dot = dot;
  to.p2p_model = model_option(opt);
  for (auto& d : check_temporal(r.program, to)) r.diags.push_back(std::move(d));
  if (r.program.local_view)  // local view: no placement rules ran; the shapes are checked by a run per rank
    for (auto& d : check_local_view(r.program)) r.diags.push_back(std::move(d));
  if (training) {
    ForwardUndo undo;
    try {
      if (r.program.loss < 0) throw LoadError({}, "--backward needs a `loss:` in the program (the tensor the backward starts from)");
      // The step is built in the program itself (no copy of the forward) and turned back into the forward after.
      TrainingCheck t = check_training_in_place(r.program, undo, {opt.z3_timeout_ms, so.types, forward_ok});
      for (auto& d : t.diags) r.diags.push_back(std::move(d));
      TemporalOptions step_to;  // the CLI's `--p2p-model` holds for the step too (no second DOT graph)
      step_to.p2p_model = to.p2p_model;
      if (t.built)
        for (auto& d : check_temporal(r.program, step_to))
          if (d.op >= static_cast<int>(t.first_backward)) r.diags.push_back(std::move(d));
      restore_forward(r.program, undo);
    } catch (const LoadError& e) {
      restore_forward(r.program, undo);
      r.load_failed = true;
      r.load_error = e;
      r.load_message = render_load_error(display_name(path), e);
      return r;
    }
  }
  // The value-level check runs on a plan the type checks accept: a type error is the better diagnostic.
  if ((r.program.has_spec || r.program.local_view) && !has_errors(r.diags))
    for (auto& d : check_equivalence(r.program, value_check_options(opt)).diags) r.diags.push_back(std::move(d));
  r.dropped = sort_and_cap(r.diags, opt.max_diagnostics);
  annotate_instances(r.program, r.diags);
  annotate_origins(r.program, display_name(path), r.diags);
  return r;
}

}  // namespace spmd
