// cli/report.cpp - the self-contained HTML report: source with diagnostics, placements, layouts, timeline, grid.
#include "cli/report.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "cli/explain.h"
#include "cli/layout.h"
#include "cli/timeline.h"

namespace spmd {

namespace {

constexpr std::size_t kMaxLayouts = 40;
constexpr int kMaxRows = 2000;  // placement table rows (a large program's page stays usable)

std::string esc(const std::string& s) { return html_escape(s); }

const char* kStyle = R"(
:root { --fg: #1d2330; --muted: #5b6478; --line: #d9dee8; --err: #c62828; --note: #1565c0; --ok: #2e7d32; }
* { box-sizing: border-box; }
body { margin: 0; font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; color: var(--fg); background: #f6f7fb; }
header { background: #1d2330; color: #fff; padding: 14px 24px; }
header h1 { margin: 0; font-size: 20px; }
header .meta { color: #c9d1e3; margin-top: 4px; }
.badge { display: inline-block; padding: 2px 10px; border-radius: 10px; font-weight: 600; margin-left: 8px; }
.badge.pass { background: var(--ok); } .badge.fail { background: var(--err); } .badge.error { background: #8e24aa; }
nav { padding: 8px 24px; background: #fff; border-bottom: 1px solid var(--line); position: sticky; top: 0; z-index: 2; }
nav a { margin-right: 16px; color: var(--note); text-decoration: none; }
main { padding: 8px 24px 40px; }
section { background: #fff; border: 1px solid var(--line); border-radius: 8px; margin: 16px 0; padding: 12px 16px; overflow-x: auto; }
h2 { font-size: 16px; margin: 4px 0 10px; }
code, pre, .mono, table.source td, svg text { font-family: ui-monospace, "DejaVu Sans Mono", Menlo, Consolas, monospace; }
table.source { border-collapse: collapse; width: 100%; }
table.source td { padding: 0 8px; white-space: pre; font-size: 13px; vertical-align: top; }
table.source td.ln { color: var(--muted); text-align: right; user-select: none; width: 1%; }
table.source tr.line.has-diag td { background: #fff1f0; }
table.source tr.line:target td { background: #fff8c5; }
.diag { white-space: normal; margin: 2px 0 6px 0; padding: 6px 10px; border-left: 4px solid var(--err); background: #fdecea; border-radius: 4px; font-family: system-ui, sans-serif; }
.diag .id { font-weight: 700; color: var(--err); }
.diag ul { margin: 4px 0 0 0; padding-left: 18px; }
.diag li.fix { color: var(--ok); }
table.placements { border-collapse: collapse; font-size: 13px; }
table.placements th, table.placements td { border: 1px solid var(--line); padding: 3px 8px; text-align: left; vertical-align: top; }
table.placements th { background: #eef1f7; }
table.placements td { white-space: nowrap; }
table.placements td.why { color: var(--muted); font-size: 12px; max-width: 640px; white-space: normal; }
.pl { font-family: ui-monospace, "DejaVu Sans Mono", monospace; font-weight: 600; padding: 0 4px; border-radius: 3px; }
.pl-R { background: #e8f5e9; } .pl-I { background: #e0f2f1; } .pl-V { background: #fff3e0; } .pl-P { background: #fce4ec; } .pl-S { background: #e3f2fd; }
.layouts { display: flex; flex-wrap: wrap; gap: 16px; }
figure.layout-fig { margin: 0; padding: 8px; border: 1px solid var(--line); border-radius: 6px; background: #fbfcfe; }
figure.layout-fig figcaption { font-size: 13px; margin-bottom: 4px; }
figure.layout-fig ul { margin: 4px 0 0 0; padding-left: 18px; font-size: 12px; color: var(--muted); max-width: 520px; }
svg.layout text { font-size: 11px; fill: #1d2330; }
svg.layout text.head { fill: var(--muted); }
svg.timeline text { font-size: 11px; }
svg.timeline .lane-bg { fill: #fafbfd; } svg.timeline .lane-bg.odd { fill: #f0f3f8; }
svg.timeline g.op rect { fill: #e3f2fd; stroke: #5c7ea8; }
svg.timeline g.op.collective rect { fill: #ede7f6; }
svg.timeline g.op.async rect { stroke-dasharray: 4 3; fill: #fff8e1; }
svg.timeline g.op.wait rect { fill: #e8f5e9; }
svg.timeline g.op.p2p-op rect { fill: #e0f7fa; }
svg.timeline g.op.unmatched rect { stroke: #ef6c00; stroke-width: 2; }
svg.timeline g.op.blocked rect { fill: #ffebee; stroke: var(--err); stroke-width: 2.5; }
svg.timeline path.p2p { stroke: #2a6; stroke-width: 1.5; fill: none; }
svg.timeline path.inflight { stroke: #b08900; stroke-dasharray: 4 3; fill: none; }
svg.timeline path.cycle { stroke: var(--err); stroke-width: 2; fill: none; }
svg.timeline text.legend, svg.timeline text.step { fill: var(--muted); }
table.pipeline { border-collapse: collapse; font-size: 12px; }
table.pipeline td, table.pipeline th { border: 1px solid var(--line); padding: 2px 6px; text-align: center; font-family: ui-monospace, monospace; }
table.pipeline td.F { background: #e3f2fd; } table.pipeline td.B { background: #fce4ec; } table.pipeline td.W { background: #f3e5f5; }
table.pipeline td.I { background: #fff3e0; } table.pipeline td.comm { background: #e0f7fa; } table.pipeline td.bubble { color: #bbb; }
table.pipeline td.blocked { outline: 3px solid var(--err); background: #ffcdd2; font-weight: 700; }
.muted { color: var(--muted); }
#selfcheck { font-size: 12px; color: var(--muted); }
)";

// Checks the page against what the generator put in it; the verdict goes to <body data-selfcheck>.
const char* kSelfCheck = R"(
(function () {
  var want = JSON.parse(document.getElementById('expect').textContent);
  var problems = [];
  function count(sel) { return document.querySelectorAll(sel).length; }
  if (count('#program tr.line') !== want.lines) problems.push('source lines: ' + count('#program tr.line') + ' of ' + want.lines);
  if (count('#program .diag') !== want.diagnostics) problems.push('diagnostics: ' + count('#program .diag') + ' of ' + want.diagnostics);
  if (count('table.placements tbody tr') !== want.placements) problems.push('placement rows: ' + count('table.placements tbody tr') + ' of ' + want.placements);
  var svgs = document.querySelectorAll('svg.layout');
  if (svgs.length !== want.layouts) problems.push('layouts: ' + svgs.length + ' of ' + want.layouts);
  for (var i = 0; i < svgs.length; i++) {
    var b = svgs[i].getBBox();
    if (!(b.width > 0 && b.height > 0) || svgs[i].querySelectorAll('g.block').length === 0) problems.push('layout ' + i + ' draws nothing');
  }
  if (want.timeline && count('#timeline g.op') === 0) problems.push('timeline: no ops');
  if (want.timeline_p2p && count('#timeline path.p2p') === 0) problems.push('timeline: no send->recv arrows');
  if (want.cycle && count('#timeline g.op.blocked') + count('table.pipeline td.blocked') === 0) problems.push('deadlock: nothing highlighted');
  if (want.pipeline && count('table.pipeline td.action') === 0) problems.push('pipeline grid: no actions');
  document.body.setAttribute('data-selfcheck', problems.length ? 'fail: ' + problems.join('; ') : 'ok');
  document.getElementById('selfcheck').textContent = 'page self-check: ' + (problems.length ? problems.join('; ') : 'ok');
  if (problems.length) console.error('spmdcheck report self-check failed: ' + problems.join('; '));
})();
)";

std::string pl_span(const Placement& pl) {
  const char* k = "R";
  switch (pl.kind) {
    case PKind::R: k = "R"; break;
    case PKind::I: k = "I"; break;
    case PKind::V: k = "V"; break;
    case PKind::P: k = "P"; break;
    case PKind::S: k = "S"; break;
  }
  return fmt::format("<span class=\"pl pl-{}\">{}</span>", k, esc(to_string(pl)));
}

std::string severity_word(Severity s) {
  switch (s) {
    case Severity::Error: return "error";
    case Severity::Warning: return "warning";
    case Severity::Note: return "note";
  }
  return "error";
}

std::string line_link(Loc l) { return l.line ? fmt::format("<a href=\"#L{}\">line {}</a>", l.line, l.line) : std::string("(no line)"); }

std::string diag_html(const Diagnostic& d) {
  std::string s = fmt::format("<div class=\"diag {}\" data-id=\"{}\"><span class=\"id\">{}[{}]</span> {}", severity_word(d.severity), check_name(d.id),
                              severity_word(d.severity), check_name(d.id), esc(d.message));
  if (!d.notes.empty()) {
    s += "<ul>";
    for (const auto& n : d.notes) {
      bool fix = n.message.rfind("fix: ", 0) == 0;
      // a note in another file (an imported op's model source or graph) is shown as file:line, not linked
      std::string where = !n.file.empty() && n.loc.line ? esc(fmt::format("{}:{}", n.file, n.loc.line)) : line_link(n.loc.line ? n.loc : d.loc);
      s += fmt::format("<li{}>{}: {}</li>", fix ? " class=\"fix\"" : "", where, esc(n.message));
    }
    s += "</ul>";
  }
  return s + "</div>";
}

std::vector<std::string> split_lines(const std::string& text) {
  std::vector<std::string> lines;
  std::string cur;
  for (char c : text) {
    if (c == '\n') lines.push_back(cur), cur.clear();
    else if (c != '\r') cur += c;
  }
  if (!cur.empty()) lines.push_back(cur);
  return lines;
}

std::string action_class(const Action& a) {
  switch (a.type) {
    case ActionType::F: return "F";
    case ActionType::I: return "I";
    case ActionType::W: return "W";
    case ActionType::B: return "B";
    case ActionType::OverlapFB: return "B";
    case ActionType::SendF:
    case ActionType::RecvF:
    case ActionType::SendB:
    case ActionType::RecvB: return "comm";
    case ActionType::Unshard:
    case ActionType::Reshard:
    case ActionType::ReduceGrad: return "comm";
  }
  return "F";
}

}  // namespace

std::string report_html(const FileResult& r, const SpatialTypes* types, const std::string& source, const std::string& version) {
  const std::string file = display_name(r.file);
  const Program& p = r.program;
  std::size_t errors = 0;
  for (const auto& d : r.diags) errors += d.severity == Severity::Error;
  std::string verdict = r.load_failed ? "error" : errors ? "fail" : "pass";
  std::string verdict_text = r.load_failed ? "not a valid program" : errors ? fmt::format("{} error{}", errors, errors == 1 ? "" : "s") : "every check passed";
  nlohmann::json want = {{"lines", 0}, {"diagnostics", 0}, {"placements", 0}, {"layouts", 0}, {"timeline", false},
                         {"timeline_p2p", false}, {"cycle", false}, {"pipeline", false}};
  std::string body;
  // ---- program with diagnostics inline -------------------------------------------------------
  std::map<std::uint32_t, std::vector<std::string>> at_line;
  std::vector<std::string> unplaced;
  auto place = [&](Loc l, std::string html) {
    if (l.line) at_line[l.line].push_back(std::move(html));
    else unplaced.push_back(std::move(html));
  };
  int ndiag = 0;
  if (r.load_failed) {
    place(r.load_error.loc, fmt::format("<div class=\"diag error\" data-id=\"invalid-input\"><span class=\"id\">error</span> {}</div>", esc(r.load_error.what())));
    ++ndiag;
  }
  for (const auto& d : r.diags) {
    Loc l = d.loc;  // a diagnostic moved to an imported op's source line sits at the op in this file
    if (!d.file.empty()) {
      l = {};
      for (const auto& n : d.notes)
        if (n.file.empty() && n.loc.line) {
          l = n.loc;
          break;
        }
    }
    place(l, diag_html(d)), ++ndiag;
  }
  auto lines = split_lines(source);
  std::string src = "<section id=\"program\"><h2>Program</h2>";
  for (const auto& u : unplaced) src += u;
  src += "<table class=\"source\"><tbody>";
  for (std::size_t i = 0; i < lines.size(); ++i) {
    auto it = at_line.find(static_cast<std::uint32_t>(i + 1));
    src += fmt::format("<tr class=\"line{}\" id=\"L{}\"><td class=\"ln\">{}</td><td>{}</td></tr>", it != at_line.end() ? " has-diag" : "", i + 1, i + 1, esc(lines[i]));
    if (it != at_line.end()) {
      src += "<tr class=\"diags\"><td></td><td>";
      for (const auto& h : it->second) src += h;
      src += "</td></tr>";
    }
  }
  // Diagnostics past the last line (should not happen) still show.
  for (const auto& [line, hs] : at_line)
    if (line > lines.size())
      for (const auto& h : hs) src += "<tr class=\"diags\"><td></td><td>" + h + "</td></tr>";
  src += "</tbody></table></section>";
  want["lines"] = lines.size();
  want["diagnostics"] = ndiag;
  body += src;
  std::string nav = "<a href=\"#program\">Program</a>";
  // ---- placements and layouts --------------------------------------------------------------
  if (types && !r.load_failed) {
    Explanation e = explain_program(p, *types);
    std::string t = "<section id=\"placements\"><h2>Placements per op</h2><table class=\"placements\"><thead><tr><th>op</th><th>line</th><th>kind</th>"
                    "<th>value</th><th>global shape</th>";
    for (const auto& ax : p.mesh) t += fmt::format("<th>{}</th>", esc(ax.name));
    t += "<th>local shape</th><th>why</th></tr></thead><tbody>";
    int rows = 0;
    int skipped = 0;
    auto row = [&](const std::string& op, Loc loc, const std::string& kind, const ExplainValue& v) {
      if (rows >= kMaxRows) {
        ++skipped;
        return;
      }
      t += fmt::format("<tr><td>{}</td><td>{}</td><td>{}</td><td class=\"mono\">{}</td>", op, line_link(loc), esc(kind), esc(v.name));
      if (!v.type || !v.type->ok) {
        t += fmt::format("<td colspan=\"{}\" class=\"muted\">no type: undefined, or an earlier error</td></tr>", p.mesh.size() + 3);
      } else {
        std::string shape = "[";
        for (int d = 0; d < v.type->rank; ++d) shape += (d ? ", " : "") + types->exprs.str(v.type->shape[static_cast<std::size_t>(d)], p.vars);
        t += fmt::format("<td class=\"mono\">{}] {}</td>", esc(shape), dtype_name(v.type->dtype));
        for (std::size_t a = 0; a < p.mesh.size(); ++a) t += "<td>" + pl_span(v.type->pl[a]) + "</td>";
        std::string why;
        for (const auto& w : v.why) why += (why.empty() ? "" : "<br>") + esc(w);
        t += fmt::format("<td class=\"mono\">{}</td><td class=\"why\">{}</td></tr>", esc(local_shape(p, types->exprs, *v.type)), why);
      }
      ++rows;
    };
    for (std::size_t i = 0; i < e.decls.size(); ++i) row("decl", p.tensors[i].loc, "declared", e.decls[i]);
    for (const auto& o : e.ops) {
      const Op& op = p.ops[static_cast<std::size_t>(o.op)];
      for (const auto& v : o.outs) row(std::to_string(o.op), op.loc, std::string(op_name(op.kind)), v);
    }
    t += "</tbody></table>";
    if (skipped) t += fmt::format("<p class=\"muted\">{} more values not listed (spmdcheck explain prints them all)</p>", skipped);
    t += "</section>";
    want["placements"] = rows;
    body += t;
    nav += "<a href=\"#placements\">Placements</a>";
    // One picture per tensor name: its last value.
    std::vector<const ExplainValue*> last;
    std::map<std::string, std::size_t> index;
    auto note = [&](const ExplainValue& v) {
      if (!v.type || !v.type->ok) return;
      auto it = index.find(v.name);
      if (it == index.end()) index[v.name] = last.size(), last.push_back(&v);
      else last[it->second] = &v;
    };
    for (const auto& v : e.decls) note(v);
    for (const auto& o : e.ops)
      for (const auto& v : o.outs) note(v);
    std::string lay = "<section id=\"layouts\"><h2>Layouts over the mesh</h2><p class=\"muted\">Each grid is one tensor's blocks (rows and columns: its "
                      "sharded dims); a cell names the ranks that hold that block. <b>axis*</b>: every coordinate of an R or I axis holds the same "
                      "block; <b>+</b>: stacked summands of a P value; <b>own value</b>: V, differs per rank.</p><div class=\"layouts\">";
    int nlay = 0;
    for (const ExplainValue* v : last) {
      if (static_cast<std::size_t>(nlay) >= kMaxLayouts) break;
      Layout l = tensor_layout(p, types->exprs, *v->type, v->name);
      lay += fmt::format("<figure class=\"layout-fig\" id=\"layout-{}\"><figcaption><b class=\"mono\">{}</b> <span class=\"mono\">{}</span></figcaption>", esc(v->name),
                         esc(v->name), esc(l.summary));
      if (!l.col_label.empty()) lay += fmt::format("<div class=\"muted\">columns: {}</div>", esc(l.col_label));
      if (!l.row_label.empty()) lay += fmt::format("<div class=\"muted\">rows: {}</div>", esc(l.row_label));
      lay += layout_svg(l);
      if (l.drawable) ++nlay;
      if (!l.notes.empty()) {
        lay += "<ul>";
        for (const auto& n : l.notes) lay += "<li>" + esc(n) + "</li>";
        lay += "</ul>";
      }
      lay += "</figure>";
    }
    if (last.size() > kMaxLayouts) lay += fmt::format("<p class=\"muted\">{} more tensors not drawn</p>", last.size() - kMaxLayouts);
    lay += "</div></section>";
    want["layouts"] = nlay;
    body += lay;
    nav += "<a href=\"#layouts\">Layouts</a>";
    std::string tl = timeline_svg(p, r.diags);
    if (!tl.empty()) {
      body += "<section id=\"timeline-section\"><h2>Timeline per rank and stream</h2>" + tl + "</section>";
      nav += "<a href=\"#timeline-section\">Timeline</a>";
      want["timeline"] = true;
      want["timeline_p2p"] = tl.find("class=\"p2p\"") != std::string::npos;
      want["cycle"] = tl.find("op blocked") != std::string::npos || tl.find(" blocked\"") != std::string::npos;
    }
  }
  // ---- pipeline grid -----------------------------------------------------------------------
  if (r.schedule) {
    const Schedule& s = *r.schedule;
    std::size_t cols = 0;
    for (const auto& row : s.rows) cols = std::max(cols, row.size());
    std::string g = fmt::format("<section id=\"pipeline\"><h2>Pipeline schedule</h2><p class=\"muted\">{}: {} ranks, {} stages, {} microbatches; red: where a "
                                "rank is blocked in a deadlock</p><table class=\"pipeline\"><thead><tr><th>rank</th>",
                                esc(s.source), s.rows.size(), s.stages, s.microbatches);
    for (std::size_t c = 0; c < cols; ++c) g += fmt::format("<th>{}</th>", c);
    g += "</tr></thead><tbody>";
    for (std::size_t ri = 0; ri < s.rows.size(); ++ri) {
      g += fmt::format("<tr><th>{}</th>", ri);
      for (std::size_t c = 0; c < cols; ++c) {
        const auto& a = c < s.rows[ri].size() ? s.rows[ri][c] : std::nullopt;
        if (!a) {
          g += "<td class=\"bubble\">.</td>";
          continue;
        }
        bool blocked = std::any_of(r.blocked.begin(), r.blocked.end(), [&](Loc l) { return l.line == a->loc.line && l.col == a->loc.col; });
        g += fmt::format("<td class=\"action {}{}\">{}</td>", action_class(*a), blocked ? " blocked" : "", esc(action_text(*a)));
        if (blocked) want["cycle"] = true;
      }
      g += "</tr>";
    }
    g += "</tbody></table></section>";
    body += g;
    nav += "<a href=\"#pipeline\">Pipeline</a>";
    want["pipeline"] = true;
  }
  std::string mesh;
  for (const auto& ax : p.mesh) mesh += fmt::format("{}{}: {}", mesh.empty() ? "" : ", ", ax.name, p.exprs.str(ax.size, p.vars));
  std::string head = fmt::format(
      "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
      "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; style-src 'unsafe-inline'; script-src 'unsafe-inline'; img-src data:\">"
      "<title>spmdcheck report: {}</title><style>{}</style></head>\n<body data-selfcheck=\"pending\"><header><h1>spmdcheck report: <span class=\"mono\">{}</span>"
      "<span class=\"badge {}\" id=\"verdict\">{}</span></h1><div class=\"meta\">{}{} &middot; spmdcheck {}</div></header><nav>{}</nav><main>",
      esc(file), kStyle, esc(file), verdict, esc(verdict_text), p.title.empty() ? "" : esc(p.title) + " &middot; ",
      mesh.empty() ? "" : "mesh {" + esc(mesh) + "} &middot; " + std::to_string(p.ops.size()) + " ops", esc(version), nav);
  return head + body + "<p id=\"selfcheck\"></p></main><script type=\"application/json\" id=\"expect\">" + want.dump() + "</script><script>" + kSelfCheck +
         "</script></body></html>\n";
}

}  // namespace spmd
