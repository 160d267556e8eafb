// cli/report.cpp - the self-contained HTML report: source with diagnostics, placements, layouts, timeline, grid.
#include "cli/report.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>

#include "cli/explain.h"
#include "cli/layout.h"
#include "cli/timeline.h"
#include "ir/printer.h"

namespace spmd {

namespace {

constexpr std::size_t kMaxLayouts = 40;  // layout cards
constexpr std::size_t kMaxNames = 12;    // names written on one card (all of them are in its filter data)
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
figure.layout-fig.flagged { border: 2px solid var(--err); } figure.layout-fig b.flagged { color: var(--err); }
figure.layout-fig[hidden] { display: none; }
p.filter input { font: inherit; padding: 2px 6px; width: 220px; }
table.placements tr.backward td { background: #fbfaf4; } table.placements tr.grad_sync td { background: #f4f9f4; } table.placements tr.optimizer td { background: #f4f6fb; }
table.placements tr:target td { background: #fff8c5; }
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
table.pipeline td.F, .swatch.F { background: #dbeafe; } table.pipeline td.B, .swatch.B { background: #dcfce7; }
table.pipeline td.W, .swatch.W { background: #ede9fe; } table.pipeline td.I, .swatch.I { background: #fef3c7; }
table.pipeline td.comm, .swatch.comm { background: #e0f2f1; } table.pipeline td.bubble { color: #bbb; } table.pipeline td.after { background: #f3f4f6; }
table.pipeline td.blocked, .swatch.blocked { background: var(--err); color: #fff; font-weight: 700; }
.legend .swatch { display: inline-block; width: 14px; height: 14px; border: 1px solid #9aa3b5; border-radius: 3px; vertical-align: -2px; margin: 0 4px 0 10px; }
.legend .swatch:first-child { margin-left: 0; }
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
  // A blocked rank runs nothing after its blocked cell, and the blocked red stands apart from every action colour.
  var prows = document.querySelectorAll('table.pipeline tbody tr');
  for (var r = 0; r < prows.length; r++) {
    var seen = false, cells = prows[r].querySelectorAll('td');
    for (var c = 0; c < cells.length; c++) {
      if (seen && cells[c].classList.contains('action')) { problems.push('pipeline rank ' + r + ': an action after its blocked cell'); break; }
      seen = seen || cells[c].classList.contains('blocked');
    }
  }
  function rgb(el) { var m = getComputedStyle(el).backgroundColor.match(/\d+/g); return m ? m.slice(0, 3).map(Number) : [0, 0, 0]; }
  var red = document.querySelector('.legend .swatch.blocked');
  if (want.pipeline && !red) problems.push('pipeline legend: no swatch for a blocked rank');
  if (red) {
    var kinds = document.querySelectorAll('.legend .swatch:not(.blocked)');
    for (var k = 0; k < kinds.length; k++) {
      var a = rgb(kinds[k]), b = rgb(red);
      var dist = Math.sqrt(Math.pow(a[0] - b[0], 2) + Math.pow(a[1] - b[1], 2) + Math.pow(a[2] - b[2], 2));
      if (dist < 100) problems.push('pipeline legend: ' + kinds[k].className + ' is too close to the blocked red (' + Math.round(dist) + ')');
    }
  }
  // Every reference (a why to the row it continues from, a diagnostic to its tensor's layout) leads somewhere.
  var refs = document.querySelectorAll('a.ref');
  for (var i = 0; i < refs.length; i++)
    if (!document.getElementById(refs[i].getAttribute('href').slice(1))) problems.push('why reference ' + refs[i].getAttribute('href') + ' leads nowhere');
  document.body.setAttribute('data-selfcheck', problems.length ? 'fail: ' + problems.join('; ') : 'ok');
  document.getElementById('selfcheck').textContent = 'page self-check: ' + (problems.length ? problems.join('; ') : 'ok');
  if (problems.length) console.error('spmdcheck report self-check failed: ' + problems.join('; '));
})();
)";

// A placement cell: coloured by kind, with its text (which carries the shard order when it is not mesh order).
// The layout filter: shows the cards with a name containing the text (typed, or given as #filter=TEXT).
const char* kFilter = R"(
(function () {
  var box = document.getElementById('layout-filter');
  if (!box) return;
  var figs = document.querySelectorAll('figure.layout-fig');
  var count = document.getElementById('layout-count');
  function apply() {
    var q = box.value.trim().toLowerCase(), shown = 0;
    for (var i = 0; i < figs.length; i++) {
      var names = (figs[i].getAttribute('data-names') || '').toLowerCase().split(' ');
      var hit = !q || names.some(function (n) { return n.indexOf(q) >= 0; });
      figs[i].hidden = !hit;
      shown += hit;
    }
    count.textContent = q ? shown + ' of ' + figs.length + ' cards match' : figs.length + ' cards';
  }
  box.addEventListener('input', apply);
  var m = /^#filter=(.*)$/.exec(location.hash);
  if (m) { box.value = decodeURIComponent(m[1]); apply(); }
})();
)";

std::string pl_span(const Placement& pl, const std::string& text) {
  const char* k = "R";
  switch (pl.kind) {
    case PKind::R: k = "R"; break;
    case PKind::I: k = "I"; break;
    case PKind::V: k = "V"; break;
    case PKind::P: k = "P"; break;
    case PKind::S: k = "S"; break;
  }
  return fmt::format("<span class=\"pl pl-{}\">{}</span>", k, esc(text));
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

// A diagnostic; `drawn` holds the tensors that have a layout card (the diagnostic links to its tensor's).
std::string diag_html(const Diagnostic& d, const std::set<std::string>& drawn) {
  std::string s = fmt::format("<div class=\"diag {}\" data-id=\"{}\"><span class=\"id\">{}[{}]</span> {}", severity_word(d.severity), check_name(d.id),
                              severity_word(d.severity), check_name(d.id), esc(d.message));
  if (drawn.count(d.tensor)) s += fmt::format(" <a class=\"ref\" href=\"#layout-{}\">layout of {}</a>", esc(d.tensor), esc(d.tensor));
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

// The anchor of a value's row in the placement table.
std::string row_id(ValueRef r) { return r.op == -1 ? fmt::format("v-d{}", r.k) : fmt::format("v-{}-{}", r.op, r.k); }

// Which part of a training step op i belongs to (empty for a program that does not train).
std::string part_of(const ReportStep& step, int i) {
  if (!step.program) return "";
  if (static_cast<std::size_t>(i) < step.first_backward) return "forward";
  return static_cast<std::size_t>(i) < step.first_sync ? "backward" : static_cast<std::size_t>(i) < step.first_optim ? "grad_sync" : "optimizer";
}

// The placement table: a row per value, its placement per axis and the one step that explains it, linked to the
// row of the input it kept that placement from (so each chain is written once, across rows).
std::string placements_section(const Program& p, const SpatialTypes& types, const Explanation& e, const ReportStep& step, int& rows) {
  std::string t = "<section id=\"placements\"><h2>Placements per op</h2>";
  if (step.program)
    t += "<p class=\"muted\">The training step: the forward, its backward (derived, or written under <code>backward:</code>; each op at the line of "
         "the forward op it differentiates) , <code>grad_sync:</code> and <code>optimizer:</code>. Gradients are named <code>x.grad</code>.</p>";
  t += "<p class=\"muted\">why: how the placement arose at this value; &larr; links to the row of the input it was kept from, whose own row "
       "continues the explanation.</p><table class=\"placements\"><thead><tr><th>op</th><th>line</th><th>kind</th><th>value</th><th>global shape</th>";
  for (const auto& ax : p.mesh) t += fmt::format("<th>{}</th>", esc(ax.name));
  t += "<th>local shape</th><th>why</th></tr></thead><tbody>";
  int skipped = 0;
  auto row = [&](const std::string& op, const std::string& part, Loc loc, const std::string& kind, const ExplainValue& v) {
    if (rows >= kMaxRows) {
      ++skipped;
      return;
    }
    t += fmt::format("<tr id=\"{}\"{}><td>{}</td><td>{}</td><td>{}</td><td class=\"mono\">{}</td>", row_id(v.ref), part.empty() ? "" : " class=\"" + part + "\"",
                     op, line_link(loc), esc(kind), esc(v.name));
    if (!v.type || !v.type->ok) {
      t += fmt::format("<td colspan=\"{}\" class=\"muted\">no type: undefined, or an earlier error</td></tr>", p.mesh.size() + 3);
    } else {
      std::string shape = "[";
      for (int d = 0; d < v.type->rank; ++d) shape += (d ? ", " : "") + types.exprs.str(v.type->shape[static_cast<std::size_t>(d)], p.vars);
      t += fmt::format("<td class=\"mono\">{}] {}</td>", esc(shape), dtype_name(v.type->dtype));
      for (std::size_t a = 0; a < p.mesh.size(); ++a) t += "<td>" + pl_span(v.type->pl[a], axis_placement_text(p, v.type->pl, static_cast<int>(a))) + "</td>";
      std::string why;
      for (const auto& w : v.why_step) {
        why += fmt::format("{}<b>{}</b>: {}", why.empty() ? "" : "<br>", esc(w.text), esc(w.brief));
        if (w.from) why += fmt::format(" &larr; <a class=\"ref\" href=\"#{}\">{}</a>", row_id(*w.from), esc(w.from_name));
      }
      std::string zz = zigzag_text(p, *v.type);
      if (!zz.empty()) why += (why.empty() ? "" : "<br>") + esc(zz);
      t += fmt::format("<td class=\"mono\">{}</td><td class=\"why\">{}</td></tr>", esc(local_shape(p, types.exprs, *v.type)), why);
    }
    ++rows;
  };
  for (std::size_t i = 0; i < e.decls.size(); ++i) row("decl", "", p.tensors[i].loc, "declared", e.decls[i]);
  for (const auto& o : e.ops) {
    const Op& op = p.ops[static_cast<std::size_t>(o.op)];
    std::string part = part_of(step, o.op);
    for (const auto& v : o.outs) row(part == "forward" || part.empty() ? std::to_string(o.op) : part + " " + std::to_string(o.op), part, op.loc,
                                     std::string(op_name(op.kind)), v);
  }
  t += "</tbody></table>";
  if (skipped) t += fmt::format("<p class=\"muted\">{} more values not listed (spmdcheck explain prints them all)</p>", skipped);
  return t + "</section>";
}

// The layouts: one picture per tensor name (its last value), and one card for all the names whose values have the
// same shape, dtype and placements (the same picture). Cards of tensors a diagnostic names come first; a filter
// box (and a #filter=TEXT address) shows only the cards with a matching name.
std::string layouts_section(const Program& p, const SpatialTypes& types, const Explanation& e, const std::vector<Diagnostic>& diags, int& drawn) {
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
  std::set<std::string> flagged;  // tensors a diagnostic is about
  for (const auto& d : diags)
    if (!d.tensor.empty()) flagged.insert(d.tensor);
  struct Group {
    Layout layout;
    std::vector<std::pair<std::string, std::string>> members;  // name, "[shape] dtype"
    bool flagged = false;
  };
  std::vector<Group> groups;
  std::map<std::string, std::size_t> by_key;
  for (const ExplainValue* v : last) {
    Layout l = tensor_layout(p, types.exprs, *v->type, v->name);
    auto [it, fresh] = by_key.try_emplace(layout_key(l), groups.size());
    std::string shape = l.shape_dtype;
    if (fresh) groups.push_back({std::move(l), {}, false});
    Group& g = groups[it->second];
    g.members.push_back({v->name, shape});
    g.flagged |= flagged.count(v->name) > 0;
  }
  std::stable_sort(groups.begin(), groups.end(), [](const Group& a, const Group& b) { return a.flagged > b.flagged; });
  std::string lay =
      "<section id=\"layouts\"><h2>Layouts over the mesh</h2><p class=\"muted\">Each grid is one tensor's blocks (rows and columns: its sharded dims, "
      "in global order); a cell names the ranks that hold that block, so a strided or zigzag shard shows each rank's blocks where they lie. "
      "<b>axis*</b>: every coordinate of an R or I axis holds the same block; <b>+</b>: stacked summands of a P value; <b>own value</b>: V, "
      "differs per rank. Tensors whose pictures are the same share one card (their shapes may differ in the dims not drawn); cards of tensors "
      "named in a diagnostic come first, outlined in red.</p>";
  lay += fmt::format("<p class=\"filter\"><label>filter by name <input type=\"search\" id=\"layout-filter\" placeholder=\"e.g. .grad\" "
                     "autocomplete=\"off\"></label> <span id=\"layout-count\" class=\"muted\">{} cards, {} tensors</span></p><div class=\"layouts\">",
                     std::min(groups.size(), kMaxLayouts), last.size());
  std::size_t shown = 0;
  for (const Group& g : groups) {
    if (shown >= kMaxLayouts) break;
    ++shown;
    const Layout& l = g.layout;
    bool one_shape = std::all_of(g.members.begin(), g.members.end(), [&](const auto& m) { return m.second == g.members[0].second; });
    std::string names, anchors, all;
    for (std::size_t k = 0; k < g.members.size(); ++k) {
      const auto& [name, shape] = g.members[k];
      anchors += fmt::format("<span class=\"anchor\" id=\"layout-{}\"></span>", esc(name));
      all += (all.empty() ? "" : " ") + name;
      bool bad = flagged.count(name) > 0;
      if (k < kMaxNames)
        names += fmt::format("{}<b class=\"mono{}\">{}</b>{}", k ? ", " : "", bad ? " flagged" : "", esc(name),
                             one_shape ? "" : " <span class=\"mono muted\">" + esc(shape) + "</span>");
    }
    if (g.members.size() > kMaxNames) names += fmt::format(" and {} more", g.members.size() - kMaxNames);
    lay += fmt::format("<figure class=\"layout-fig{}{}\" data-names=\"{}\">{}<figcaption>{}{}<div class=\"mono\">{}</div></figcaption>",
                       g.members.size() > 1 ? " group" : "", g.flagged ? " flagged" : "", esc(all), anchors, names,
                       one_shape ? " <span class=\"mono\">" + esc(l.shape_dtype) + "</span>" : "", esc(l.placements));
    if (!l.col_label.empty()) lay += fmt::format("<div class=\"muted\">columns: {}</div>", esc(l.col_label));
    if (!l.row_label.empty()) lay += fmt::format("<div class=\"muted\">rows: {}</div>", esc(l.row_label));
    lay += layout_svg(l);
    if (l.drawable) ++drawn;
    if (!l.notes.empty()) {
      lay += "<ul>";
      for (const auto& n : l.notes) lay += "<li>" + esc(n) + "</li>";
      lay += "</ul>";
    }
    lay += "</figure>";
  }
  if (groups.size() > kMaxLayouts) lay += fmt::format("<p class=\"muted\">{} more cards not drawn</p>", groups.size() - kMaxLayouts);
  return lay + "</div></section>";
}

// The pipeline grid of a schedule: a cell per action, coloured by kind (the legend shows each colour), the cells
// where a deadlock leaves a rank blocked in solid red; the rank runs nothing after that cell.
std::string pipeline_section(const Schedule& s, const std::vector<Loc>& blocked_at, bool& any_blocked) {
  std::size_t cols = 0;
  for (const auto& row : s.rows) cols = std::max(cols, row.size());
  std::string g = fmt::format("<section id=\"pipeline\"><h2>Pipeline schedule</h2><p class=\"muted\">{}: {} ranks, {} stages, {} microbatches</p>"
                              "<p class=\"legend\">",
                              esc(s.source), s.rows.size(), s.stages, s.microbatches);
  for (auto [cls, what] : {std::pair<const char*, const char*>{"F", "forward"}, {"B", "backward"}, {"I", "backward (input)"},
                           {"W", "backward (weight)"}, {"comm", "send, receive, unshard, reshard"}, {"blocked", "a rank blocked in a deadlock"}})
    g += fmt::format("<span class=\"swatch {}\"></span>{} ", cls, what);
  g += "</p><table class=\"pipeline\"><thead><tr><th>rank</th>";
  for (std::size_t c = 0; c < cols; ++c) g += fmt::format("<th>{}</th>", c);
  g += "</tr></thead><tbody>";
  for (std::size_t ri = 0; ri < s.rows.size(); ++ri) {
    g += fmt::format("<tr><th>{}</th>", ri);
    bool stopped = false;
    for (std::size_t c = 0; c < cols; ++c) {
      const auto& a = c < s.rows[ri].size() ? s.rows[ri][c] : std::nullopt;
      if (stopped) {
        g += "<td class=\"after\"></td>";
        continue;
      }
      if (!a) {
        g += "<td class=\"bubble\">.</td>";
        continue;
      }
      bool blocked = std::any_of(blocked_at.begin(), blocked_at.end(), [&](Loc l) { return l.line == a->loc.line && l.col == a->loc.col; });
      g += fmt::format("<td class=\"action {}{}\">{}</td>", action_class(*a), blocked ? " blocked" : "", esc(action_text(*a)));
      any_blocked |= blocked;
      stopped = blocked;
    }
    g += "</tr>";
  }
  return g + "</tbody></table></section>";
}

}  // namespace

std::string report_html(const FileResult& r, const SpatialTypes* types, const std::string& source, const std::string& version, const ReportStep& step) {
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
  // The explanation of the program (of its training step, when there is one): placements, layouts, and the
  // names that get a layout card.
  const Program& view = step.program ? *step.program : p;
  std::optional<Explanation> e;
  std::set<std::string> drawn;
  if (types && !r.load_failed) {
    e = explain_program(view, step.types ? *step.types : *types);
    for (const auto& v : e->decls)
      if (v.type && v.type->ok) drawn.insert(v.name);
    for (const auto& o : e->ops)
      for (const auto& v : o.outs)
        if (v.type && v.type->ok) drawn.insert(v.name);
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
    place(l, diag_html(d, drawn)), ++ndiag;
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
  // ---- placements and layouts (of the training step, when there is one) --------------------
  if (types && !r.load_failed) {
    const SpatialTypes& vt = step.types ? *step.types : *types;
    int rows = 0, pictures = 0;
    body += placements_section(view, vt, *e, step, rows);
    want["placements"] = rows;
    nav += "<a href=\"#placements\">Placements</a>";
    body += layouts_section(view, vt, *e, r.diags, pictures);
    want["layouts"] = pictures;
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
    bool blocked = false;
    body += pipeline_section(*r.schedule, r.blocked, blocked);
    if (blocked) want["cycle"] = true;
    nav += "<a href=\"#pipeline\">Pipeline</a>";
    want["pipeline"] = true;
  }
  // The line under the title: the program's name, its mesh and ops (or the schedule's size), the version.
  std::vector<std::string> meta;
  if (!p.title.empty()) meta.push_back(esc(p.title));
  std::string mesh;
  for (const auto& ax : p.mesh) mesh += fmt::format("{}{}: {}", mesh.empty() ? "" : ", ", ax.name, p.exprs.str(ax.size, p.vars));
  if (!mesh.empty()) meta.push_back("mesh {" + esc(mesh) + "}" + (p.ops.empty() ? "" : fmt::format(" &middot; {} ops", p.ops.size())));
  if (r.schedule)
    meta.push_back(fmt::format("pipeline schedule: {} ranks, {} stages, {} microbatches", r.schedule->rows.size(), r.schedule->stages, r.schedule->microbatches));
  meta.push_back("spmdcheck " + esc(version));
  std::string meta_line;
  for (const auto& m : meta) meta_line += (meta_line.empty() ? "" : " &middot; ") + m;
  std::string head = fmt::format(
      "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
      "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; style-src 'unsafe-inline'; script-src 'unsafe-inline'; img-src data:\">"
      "<title>spmdcheck report: {}</title><style>{}</style></head>\n<body data-selfcheck=\"pending\"><header><h1>spmdcheck report: <span class=\"mono\">{}</span>"
      "<span class=\"badge {}\" id=\"verdict\">{}</span></h1><div class=\"meta\">{}</div></header><nav>{}</nav><main>",
      esc(file), kStyle, esc(file), verdict, esc(verdict_text), meta_line, nav);
  return head + body + "<p id=\"selfcheck\"></p></main><script type=\"application/json\" id=\"expect\">" + want.dump() + "</script><script>" + kSelfCheck +
         kFilter + "</script></body></html>\n";
}

}  // namespace spmd
