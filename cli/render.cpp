// cli/render.cpp - text and JSON rendering of diagnostics.
#include "cli/render.h"

#include <fmt/format.h>

namespace spmd {

namespace {

std::string where(const std::string& file, Loc l) {
  if (l.line == 0) return file;
  if (l.col == 0) return fmt::format("{}:{}", file, l.line);  // a source line without a column (an imported op's)
  return fmt::format("{}:{}:{}", file, l.line, l.col);
}

// A diagnostic or note names its own file when it is elsewhere (an imported op's model source or graph).
const std::string& file_of(const std::string& program, const std::string& own) { return own.empty() ? program : own; }

std::string_view severity_name(Severity s) {
  switch (s) {
    case Severity::Error: return "error";
    case Severity::Warning: return "warning";
    case Severity::Note: return "note";
  }
  return "error";
}

}  // namespace

std::string render_text(const std::string& file, const std::vector<Diagnostic>& diags) {
  std::string s;
  for (const auto& d : diags) {
    s += fmt::format("{}: {}[{}]: {}\n", where(file_of(file, d.file), d.loc), severity_name(d.severity), check_name(d.id), printable(d.message));
    for (const auto& n : d.notes)
      s += n.loc.line ? fmt::format("{}: note: {}\n", where(file_of(file, n.file), n.loc), printable(n.message))
                      : fmt::format("{}: note: {}\n", where(file_of(file, d.file), d.loc), printable(n.message));
  }
  return s;
}

std::string render_load_error(const std::string& file, const LoadError& e) {
  return fmt::format("{}: error: {}\n", where(file, shown_loc(e.loc)), e.what());
}

nlohmann::json render_json(const std::string& file, const std::vector<Diagnostic>& diags) {
  nlohmann::json arr = nlohmann::json::array();
  for (const auto& d : diags) {
    nlohmann::json notes = nlohmann::json::array();
    for (const auto& n : d.notes) {
      Loc l = n.loc.line ? n.loc : d.loc;
      const std::string& nf = n.loc.line ? file_of(file, n.file) : file_of(file, d.file);
      notes.push_back({{"file", nf}, {"line", l.line}, {"column", l.col}, {"message", n.message}});
    }
    arr.push_back({{"id", std::string(check_name(d.id))},
                   {"severity", std::string(severity_name(d.severity))},
                   {"file", file_of(file, d.file)},
                   {"line", d.loc.line},
                   {"column", d.loc.col},
                   {"message", d.message},
                   {"op", d.op >= 0 ? nlohmann::json(d.op) : nlohmann::json(nullptr)},
                   {"tensor", d.tensor.empty() ? nlohmann::json(nullptr) : nlohmann::json(d.tensor)},
                   {"ranks", d.ranks},
                   {"notes", notes}});
    if (d.fix.kind != FixKind::None) {
      nlohmann::json f = {{"kind", fix_kind_name(d.fix.kind)},
                          {"op_index", d.fix.op >= 0 ? nlohmann::json(d.fix.op) : nlohmann::json(nullptr)},
                          {"line", d.fix.line},
                          {"yaml", d.fix.yaml}};
      if (!d.fix.section.empty()) f["section"] = d.fix.section;
      if (d.fix.kind == FixKind::Move) f["from_line"] = d.fix.from_line;
      arr.back()["fix"] = std::move(f);
    } else {
      arr.back()["fix"] = nullptr;
    }
  }
  return arr;
}

}  // namespace spmd
