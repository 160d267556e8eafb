// cli/timeline.cpp - SVG timeline per rank and stream: async ops, waits, send->recv arrows, deadlock cycle.
#include "cli/timeline.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <map>

#include "cli/check_file.h"
#include "cli/layout.h"
#include "ir/ranks.h"

namespace spmd {

namespace {

constexpr int kMaxReps = 16, kMaxSteps = 200;
constexpr int kColW = 150, kLaneH = 40, kBoxW = 110, kBoxH = 24, kLeft = 170, kTop = 28;

std::string esc(const std::string& s) { return html_escape(s); }

bool is_async(const Op& op) {
  OpCategory c = op_info(op.kind).category;
  return op.attrs.handle >= 0 && (c == OpCategory::collective || c == OpCategory::p2p || c == OpCategory::later);
}

struct Box {
  int x, y;
};

}  // namespace

std::string timeline_svg(const Program& p, const std::vector<Diagnostic>& diags) {
  RankSpace s;
  try {
    s = make_rank_space(p);
  } catch (const LoadError&) {
    return "";
  }
  bool temporal = s.count() > 1;
  for (const Op& op : p.ops) {
    OpCategory c = op_info(op.kind).category;
    temporal |= op.attrs.stream >= 0 || op.attrs.handle >= 0 || c == OpCategory::p2p || c == OpCategory::async;
  }
  if (!temporal || p.ops.empty()) return "";
  int reps = std::min(s.count(), kMaxReps);
  // Lanes: per representative, its streams in order of first use (the default stream first).
  std::vector<std::pair<int, NameId>> lanes;
  std::map<std::pair<int, NameId>, int> lane_of;
  std::map<std::pair<int, int>, Box> box;  // (rep, op) -> position
  int steps = 0;
  for (int r = 0; r < reps; ++r) {
    const RankProgram& rp = s.programs[static_cast<std::size_t>(s.program[static_cast<std::size_t>(r)])];
    std::vector<NameId> streams = {-1};
    for (std::uint32_t i = rp.first_op; i < rp.first_op + rp.n_ops; ++i)
      if (std::find(streams.begin(), streams.end(), p.ops[i].attrs.stream) == streams.end()) streams.push_back(p.ops[i].attrs.stream);
    for (NameId st : streams) {
      lane_of[{r, st}] = static_cast<int>(lanes.size());
      lanes.push_back({r, st});
    }
    int n = static_cast<int>(std::min<std::uint32_t>(rp.n_ops, kMaxSteps));
    steps = std::max(steps, n);
    for (int k = 0; k < n; ++k) {
      int i = static_cast<int>(rp.first_op) + k;
      int lane = lane_of[{r, p.ops[static_cast<std::size_t>(i)].attrs.stream}];
      box[{r, i}] = {kLeft + k * kColW, kTop + lane * kLaneH};
    }
  }
  // Blocked ops of a deadlock: the notes "rank {..} is blocked here: ..." (the cycle, in its order) and "rank {..} is
  // also blocked: ..." (waiting on it) at the op's location. Only the cycle's ops are joined by the red arrows.
  std::vector<std::pair<int, int>> blocked, cycle;  // (rep, op)
  for (const auto& d : diags) {
    if (d.id != CheckId::Deadlock) continue;
    for (const auto& n : d.notes) {
      auto br = blocked_rank(n);
      if (!br) continue;
      for (int r = 0; r < reps; ++r) {
        if (s.label(p, r) != br->label) continue;
        for (const auto& [key, b] : box)
          if (key.first == r && p.ops[static_cast<std::size_t>(key.second)].loc.line == n.loc.line &&
              p.ops[static_cast<std::size_t>(key.second)].loc.col == n.loc.col) {
            blocked.push_back(key);
            if (br->in_cycle) cycle.push_back(key);
          }
      }
    }
  }
  auto is_blocked = [&](int r, int i) { return std::find(blocked.begin(), blocked.end(), std::make_pair(r, i)) != blocked.end(); };
  std::vector<P2PMatch> matches;
  std::vector<P2PLeftover> leftovers;
  match_p2p(p, s, matches, leftovers);
  auto unmatched = [&](int r, int i) {
    return std::any_of(leftovers.begin(), leftovers.end(), [&](const P2PLeftover& l) { return l.rank == r && l.op == i; });
  };
  int w = kLeft + steps * kColW + 20, h = kTop + static_cast<int>(lanes.size()) * kLaneH + 8;
  std::string o = fmt::format("<svg id=\"timeline\" class=\"timeline\" xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{}\" viewBox=\"0 0 {} {}\">", w, h, w, h);
  o += "<defs><marker id=\"arrow\" viewBox=\"0 0 10 10\" refX=\"9\" refY=\"5\" markerWidth=\"7\" markerHeight=\"7\" orient=\"auto-start-reverse\">"
       "<path d=\"M0,0 L10,5 L0,10 z\" fill=\"#2a6\"/></marker>"
       "<marker id=\"arrow-red\" viewBox=\"0 0 10 10\" refX=\"9\" refY=\"5\" markerWidth=\"7\" markerHeight=\"7\" orient=\"auto-start-reverse\">"
       "<path d=\"M0,0 L10,5 L0,10 z\" fill=\"#d22\"/></marker></defs>";
  for (int k = 0; k < steps; ++k) o += fmt::format("<text x=\"{}\" y=\"16\" class=\"step\">{}</text>", kLeft + k * kColW + 30, k);
  for (std::size_t l = 0; l < lanes.size(); ++l) {
    int y = kTop + static_cast<int>(l) * kLaneH;
    std::string stream = lanes[l].second < 0 ? "default" : p.name(lanes[l].second);
    o += fmt::format("<g class=\"lane\"><rect x=\"0\" y=\"{}\" width=\"{}\" height=\"{}\" class=\"lane-bg{}\"/><text x=\"4\" y=\"{}\">{} {}</text></g>", y - 4, w,
                     kLaneH, l % 2 ? " odd" : "", y + 15, esc(s.label(p, lanes[l].first)), esc(stream));
  }
  // Async op -> the Wait that completes it (same rank).
  for (const auto& [key, b] : box) {
    const Op& op = p.ops[static_cast<std::size_t>(key.second)];
    if (!is_async(op)) continue;
    for (const auto& [k2, b2] : box) {
      if (k2.first != key.first || k2.second <= key.second) continue;
      const Op& wt = p.ops[static_cast<std::size_t>(k2.second)];
      bool completes = (wt.kind == OpKind::Wait && wt.attrs.handle == op.attrs.handle);
      if (wt.kind == OpKind::WaitAll && wt.attrs.handles != kNoIndex) {
        const auto& hs = p.name_lists[wt.attrs.handles];
        completes = std::find(hs.begin(), hs.end(), op.attrs.handle) != hs.end();
      }
      if (!completes) continue;
      o += fmt::format("<path class=\"inflight\" d=\"M{},{} C{},{} {},{} {},{}\"/>", b.x + kBoxW, b.y + kBoxH / 2, b.x + kBoxW + 30, b.y + kBoxH / 2, b2.x - 30,
                       b2.y + kBoxH / 2, b2.x, b2.y + kBoxH / 2);
      break;
    }
  }
  for (const auto& m : matches) {
    auto a = box.find({m.src, m.send_op}), b = box.find({m.dst, m.recv_op});
    if (a == box.end() || b == box.end()) continue;
    int x1 = a->second.x + kBoxW / 2, y1 = a->second.y + (b->second.y > a->second.y ? kBoxH : 0);
    int x2 = b->second.x + kBoxW / 2, y2 = b->second.y + (b->second.y > a->second.y ? 0 : kBoxH);
    o += fmt::format("<path class=\"p2p\" d=\"M{},{} L{},{}\" marker-end=\"url(#arrow)\"/>", x1, y1, x2, y2);
  }
  for (std::size_t k = 0; cycle.size() > 1 && k < cycle.size(); ++k) {
    Box a = box[cycle[k]], b = box[cycle[(k + 1) % cycle.size()]];
    // Bulging left of the boxes, so it crosses no other op.
    int bulge = 18 + std::abs(b.y - a.y) / 6;
    o += fmt::format("<path class=\"cycle\" d=\"M{},{} C{},{} {},{} {},{}\" marker-end=\"url(#arrow-red)\"/>", a.x, a.y + kBoxH / 2, a.x - bulge,
                     a.y + kBoxH / 2, b.x - bulge, b.y + kBoxH / 2, b.x, b.y + kBoxH / 2);
  }
  for (const auto& [key, b] : box) {
    const Op& op = p.ops[static_cast<std::size_t>(key.second)];
    std::string cls = "op";
    if (is_async(op)) cls += " async";
    if (op.kind == OpKind::Wait || op.kind == OpKind::WaitAll) cls += " wait";
    if (op_info(op.kind).category == OpCategory::p2p) cls += " p2p-op";
    if (op_info(op.kind).category == OpCategory::collective) cls += " collective";
    if (unmatched(key.first, key.second)) cls += " unmatched";
    if (is_blocked(key.first, key.second)) cls += " blocked";
    std::string label(op_name(op.kind));
    if (op.kind == OpKind::Wait && op.attrs.handle >= 0) label += " " + p.name(op.attrs.handle);
    std::string title = fmt::format("op {} (line {}): {}", key.second, op.loc.line, op_name(op.kind));
    if (!p.outs(op).empty()) title += " -> " + p.name(p.outs(op)[0]);
    if (op.attrs.handle >= 0) title += ", handle " + p.name(op.attrs.handle);
    o += fmt::format("<g class=\"{}\" data-op=\"{}\" data-line=\"{}\"><title>{}</title><rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" rx=\"4\"/>"
                     "<text x=\"{}\" y=\"{}\">{}</text></g>",
                     cls, key.second, op.loc.line, esc(title), b.x, b.y, kBoxW, kBoxH, b.x + 5, b.y + 15, esc(label.size() > 13 ? label.substr(0, 12) + "~" : label));
  }
  o += "</svg>";
  o += fmt::format("<p class=\"muted legend\">Program order per lane (logical steps, not to scale). Dashed boxes: async ops, joined to the Wait that "
                   "completes them; green arrows: each Send to its Recv; orange outline: a Send or Recv with no partner; red: the ops where "
                   "ranks are blocked in a deadlock, and the cycle of waits{}.</p>",
                   s.count() > reps ? fmt::format(" (the first {} of {} ranks are drawn)", reps, s.count()) : "");
  return o;
}

}  // namespace spmd
