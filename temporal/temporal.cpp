// temporal/temporal.cpp - the temporal check's entry point: the run loop over ranks, findings merged
// across ranks, and the happens-before graph as Graphviz DOT.
#include <boost/graph/adjacency_list.hpp>
#include <fmt/format.h>

#include <map>
#include <ostream>

#include "ir/memory.h"
#include "temporal/engine.h"

namespace spmd::temporal_detail {

using Graph = boost::adjacency_list<boost::vecS, boost::vecS, boost::directedS>;

void Engine::run() {
  // The engine's arrays grow with the program: reserved once, on huge pages (ir/memory.h).
  reserve_huge(events_, p_.ops.size() + 16);
  reserve_huge(edges_, 2 * p_.ops.size() + 16);
  reserve_huge(bufs_, p_.ops.size() + 16);
  reserve_huge(eps_, p_.ops.size() / 2 + 16);
  reserve_huge(insts_, p_.ops.size() / 2 + 16);
  static_matching();
  ranks_.resize(static_cast<std::size_t>(space_.count()));
  // Number the chains rank by rank (compute, then comm) so that clocks of neighbouring ranks are near.
  chains_.reserve(2 * static_cast<std::size_t>(space_.count()) + 16);
  for (int r = 0; r < space_.count(); ++r) {
    chain_of(r, compute_);
    chain_of(r, comm_);
  }
  for (int r = 0; r < space_.count(); ++r) {
    const RankProgram& rp = space_.programs[static_cast<std::size_t>(space_.program[static_cast<std::size_t>(r)])];
    ranks_[static_cast<std::size_t>(r)].pc = rp.first_op;
    ranks_[static_cast<std::size_t>(r)].end = rp.first_op + rp.n_ops;
    ready_.push_back(r);
  }
  while (!ready_.empty()) {
    int r = ready_.front();
    ready_.pop_front();
    run_rank(r);
  }
  if (std::any_of(ranks_.begin(), ranks_.end(), [](const Rank& r) { return !r.done; })) stalled();
  for (const auto& h : insts_) {
    if (h.wait_event >= 0 || h.reported || h.name < 0 || !ranks_[static_cast<std::size_t>(h.rank)].done) continue;
    const Op& op = p_.ops[static_cast<std::size_t>(h.op)];
    Diagnostic d = diag(CheckId::OrphanedHandle, op, h.op,
                        fmt::format("{} returns handle {}, which is never waited: the op may still be running when the program ends and "
                                    "nothing after it is ordered with it",
                                    op_name(op.kind), p_.name(h.name)));
    d.notes.push_back({op.loc, fmt::format("fix: insert {{op: Wait, handle: {}}} before the first use of its result", p_.name(h.name))});
    d.fix = {FixKind::InsertAfter, h.op, op.loc.line, "", fmt::format("{{op: Wait, handle: {}}}", p_.name(h.name))};
    local(std::move(d), h.rank);
  }
}

std::vector<Diagnostic> Engine::take() {
  // Ranks that run one program find the same local problem: report it once, naming them.
  for (auto& [key, entry] : local_) {
    auto& [d, ranks] = entry;
    if (multi_) {
      std::vector<std::string> labels;
      for (int r : ranks) labels.push_back(space_.label(p_, r));
      d.ranks = labels;
      std::string list;
      for (std::size_t i = 0; i < labels.size() && i < 4; ++i) list += (i ? ", " : "") + labels[i];
      if (labels.size() > 4) list += fmt::format(" and {} more", labels.size() - 4);
      d.message += fmt::format(" (on rank{} {})", labels.size() > 1 ? "s" : "", list);
    }
    diags_.push_back(std::move(d));
  }
  local_.clear();
  sort_and_cap(diags_, diags_.size());
  return std::move(diags_);
}

namespace {

// The happens-before graph (program order, issue, completion -> Wait, Send -> Recv, collective
// hubs) as a Boost.Graph adjacency list; built on request (the checks use the clocks).
Graph hb_graph(const Engine& e) {
  Graph g(e.events().size());
  for (auto [a, b] : e.edges()) boost::add_edge(static_cast<std::size_t>(a), static_cast<std::size_t>(b), g);
  return g;
}

void dot_graph(const Program& program, const Engine& e, std::ostream& out) {
  const auto& ev = e.events();
  const auto& chains = e.chains();
  out << "digraph hb {\n  rankdir=TB;\n  node [shape=box, fontname=\"monospace\"];\n";
  std::vector<std::vector<std::size_t>> by_chain(chains.size());
  for (std::size_t i = 0; i < ev.size(); ++i)
    if (ev[i].chain >= 0) by_chain[static_cast<std::size_t>(ev[i].chain)].push_back(i);
  // Ranks as clusters, their streams as clusters inside.
  std::map<int, std::vector<std::size_t>> by_rank;
  for (std::size_t c = 0; c < chains.size(); ++c) by_rank[chains[c].rank].push_back(c);
  for (const auto& [r, cs] : by_rank) {
    out << "  subgraph cluster_rank" << r << " {\n    label=\"rank " << e.rank_label(r) << "\";\n";
    for (std::size_t c : cs) {
      if (by_chain[c].empty()) continue;  // a stream with no event (every rank's comm is numbered up front)
      out << "    subgraph cluster_" << c << " {\n      label=\"stream " << e.stream_name(static_cast<int>(c)) << "\";\n";
      for (std::size_t i : by_chain[c]) {
        const Op& op = program.ops[static_cast<std::size_t>(ev[i].op)];
        std::string label = ev[i].kind == EventKind::GroupEnd ? "end of group " + program.name(op.attrs.group) : std::string(op_name(op.kind));
        if (ev[i].kind == EventKind::Op && op.attrs.handle >= 0) label += " (" + program.name(op.attrs.handle) + ")";
        out << "      e" << i << " [label=\"" << label << "\\nline " << op.loc.line << "\"];\n";
      }
      out << "    }\n";
    }
    out << "  }\n";
  }
  for (std::size_t i = 0; i < ev.size(); ++i)
    if (ev[i].chain < 0) out << "  e" << i << " [shape=ellipse, label=\"" << e.hub_label(static_cast<int>(i)) << "\"];\n";
  Graph g = hb_graph(e);
  auto [it, end] = boost::edges(g);
  for (; it != end; ++it) out << "  e" << boost::source(*it, g) << " -> e" << boost::target(*it, g) << ";\n";
  out << "}\n";
}

}  // namespace
}  // namespace spmd::temporal_detail

namespace spmd {


std::vector<Diagnostic> check_temporal(const Program& program, const TemporalOptions& options) {
  temporal_detail::Engine e(program, options);
  e.run();
  if (options.dot) temporal_detail::dot_graph(program, e, *options.dot);
  return e.take();
}

void write_hb_dot(const Program& program, std::ostream& out) {
  TemporalOptions o;
  o.dot = &out;
  check_temporal(program, o);
}

}  // namespace spmd
