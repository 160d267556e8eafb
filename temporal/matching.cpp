// temporal/matching.cpp - static matching: point-to-point FIFO per (src, dst) and collectives per (group,
// sequence number), before the simulation (unmatched-p2p, p2p-mismatch, collective-mismatch).
#include <fmt/format.h>

#include <algorithm>

#include "temporal/engine.h"

namespace spmd::temporal_detail {

std::string Engine::axes_str(std::uint32_t mask) const {
  std::string s;
  for (int a = 0; a < p_.axis_count(); ++a)
    if (mask & (1u << a)) s += (s.empty() ? "" : ", ") + p_.mesh[static_cast<std::size_t>(a)].name;
  return s;
}

std::string Engine::coll_str(const Op& op) const {
  std::string s = fmt::format("{} over {}", op_name(op.kind), axes_str(op.attrs.axes));
  if (op.kind == OpKind::AllReduce || op.kind == OpKind::ReduceScatter || op.kind == OpKind::Reduce)
    s += fmt::format(" ({})", reduce_name(op.attrs.rop));
  if (op.kind == OpKind::Broadcast || op.kind == OpKind::Scatter) s += fmt::format(" (src {})", std::max(0, op.attrs.rank));
  if (op.kind == OpKind::Reduce || op.kind == OpKind::Gather) s += fmt::format(" (dst {})", std::max(0, op.attrs.rank));
  return s;
}

std::string Engine::identity_str(const Op& op) const {
  NameId in = p_.ins(op)[0];
  return op.attrs.matches >= 0 && op.attrs.matches != in ? fmt::format("{} (matches: {})", p_.name(in), p_.name(op.attrs.matches)) : p_.name(in);
}

void Engine::static_matching() {
  std::size_t first_static = diags_.size();
  std::vector<P2PMatch> matches;
  std::vector<P2PLeftover> leftovers;
  match_p2p(p_, space_, matches, leftovers);
  for (const auto& l : leftovers) leftover_.insert({l.rank, l.op});
  std::map<std::pair<int, int>, int> count;  // (src, dst) -> matched transfers
  std::set<std::pair<int, int>> named;       // (send op, recv op) pairs already reported
  for (const auto& m : matches) {
    int k = ++count[{m.src, m.dst}];
    // A Recv that names the tensor it expects (`matches:`) must get that tensor from FIFO pairing.
    const Op& rv = p_.ops[static_cast<std::size_t>(m.recv_op)];
    const Op& sd = p_.ops[static_cast<std::size_t>(m.send_op)];
    NameId sent = p_.ins(sd)[0];
    if (rv.attrs.matches < 0 || rv.attrs.matches == sent || !named.insert({m.send_op, m.recv_op}).second) continue;
    Diagnostic d = diag(CheckId::P2PMismatch, rv, m.recv_op,
                        fmt::format("Recv on rank {} expects {} from rank {}, but FIFO pairing per (src, dst) delivers {}: it is the {} Recv from {} "
                                    "and meets the {} Send to it",
                                    lbl(m.dst), p_.name(rv.attrs.matches), lbl(m.src), p_.name(sent), ordinal(k), lbl(m.src), ordinal(k)));
    d.tensor = p_.name(p_.outs(rv)[0]);
    d.notes.push_back({sd.loc, fmt::format("rank {} sends {} here", lbl(m.src), p_.name(sent))});
    d.notes.push_back({rv.loc, "fix: post the receives in the order the peer posts its sends (there are no tags)"});
    d.ranks = {lbl(m.src), lbl(m.dst)};
    diags_.push_back(std::move(d));
  }
  for (const auto& l : leftovers) {
    const Op& op = p_.ops[static_cast<std::size_t>(l.op)];
    int src = l.is_send ? l.rank : l.peer, dst = l.is_send ? l.peer : l.rank;
    int n = count[{src, dst}];
    Diagnostic d = diag(CheckId::UnmatchedP2P, op, l.op, "");
    std::string tensor = l.is_send ? p_.name(p_.ins(op)[0]) : p_.name(p_.outs(op)[0]);
    d.tensor = tensor;
    if (l.is_send) {
      d.message = fmt::format("Send of {} from rank {} to rank {} has no matching Recv: {} posts {} Recv{} from {}, and this is Send number {} to it "
                              "(sends and receives pair in FIFO order per (src, dst))",
                              tensor, lbl(src), lbl(dst), lbl(dst), n, n == 1 ? "" : "s", lbl(src), n + 1);
      d.notes.push_back({op.loc, fmt::format("fix: add {{op: Recv, out: {}_recv, peer: {}}} to the program of rank {}, or remove this Send",
                                             tensor, lbl(src), lbl(dst))});
    } else {
      d.message = fmt::format("Recv of {} on rank {} from rank {} has no matching Send: {} posts {} Send{} to {}, and this is Recv number {} from it "
                              "(sends and receives pair in FIFO order per (src, dst))",
                              tensor, lbl(dst), lbl(src), lbl(src), n, n == 1 ? "" : "s", lbl(dst), n + 1);
      d.notes.push_back({op.loc, fmt::format("fix: add {{op: Send, in: [...], peer: {}}} to the program of rank {}, or remove this Recv", lbl(dst),
                                             lbl(src))});
    }
    d.ranks = {lbl(src), lbl(dst)};
    diags_.push_back(std::move(d));
  }

  std::vector<CollectivePair> pairs;
  std::vector<CollectiveCount> counts;
  match_collectives(p_, space_, pairs, counts);
  std::set<std::tuple<int, int, std::uint32_t>> seen;
  for (const auto& c : pairs) {
    const Op& a = p_.ops[static_cast<std::size_t>(c.op_a)];
    const Op& b = p_.ops[static_cast<std::size_t>(c.op_b)];
    bool same_op = a.kind == b.kind && a.attrs.axes == b.attrs.axes && a.attrs.rop == b.attrs.rop && a.attrs.rank == b.attrs.rank;
    if (same_op && identity(a) == identity(b)) continue;  // shapes and dtypes: spatial
    if (!seen.insert({c.rank_a, c.rank_b, a.attrs.axes & b.attrs.axes}).second) continue;
    if (same_op) {
      // The same collective at the same position, but of different tensors (deepspeedai/DeepSpeed#2343:
      // gradients reduced in a rank-dependent order): the ranks would combine unrelated values.
      Diagnostic d = diag(CheckId::CollectiveMismatch, b, c.op_b,
                          fmt::format("{} of {} is the {} collective of rank {} in its group, but rank {} passes {} to it at that position: "
                                      "collectives pair by sequence number within a group, so {} and {} would be combined",
                                      coll_str(b), identity_str(b), ordinal(c.seq + 1), lbl(c.rank_b), lbl(c.rank_a), identity_str(a),
                                      p_.name(identity(a)), p_.name(identity(b))));
      d.tensor = p_.name(p_.ins(b)[0]);
      d.notes.push_back({a.loc, fmt::format("rank {} issues {} of {} here", lbl(c.rank_a), coll_str(a), identity_str(a))});
      d.notes.push_back({b.loc, fmt::format("fix: issue the collectives of a group on the same tensors in the same order on every rank; if {} and {} "
                                            "are one logical tensor under two local names, say so with `matches: {}` on this op",
                                            p_.name(p_.ins(a)[0]), p_.name(p_.ins(b)[0]), p_.name(identity(a)))});
      d.ranks = {lbl(c.rank_a), lbl(c.rank_b)};
      diags_.push_back(std::move(d));
      continue;
    }
    Diagnostic d = diag(CheckId::CollectiveMismatch, b, c.op_b,
                        fmt::format("{} is the {} collective of rank {} in its group, but rank {} issues {} at that position: collectives pair "
                                    "by sequence number within a group, so these two would be matched (and hang or mix data)",
                                    coll_str(b), ordinal(c.seq + 1), lbl(c.rank_b), lbl(c.rank_a), coll_str(a)));
    d.notes.push_back({a.loc, fmt::format("rank {} issues {} here", lbl(c.rank_a), coll_str(a))});
    d.notes.push_back({b.loc, "fix: issue the collectives of a group in the same order on every rank of the group"});
    d.ranks = {lbl(c.rank_a), lbl(c.rank_b)};
    diags_.push_back(std::move(d));
  }
  for (const auto& c : counts) {
    bool b_longer = c.n_b > c.n_a;
    int op_i = b_longer ? c.last_op_b : c.last_op_a;
    int more = b_longer ? c.rank_b : c.rank_a, fewer = b_longer ? c.rank_a : c.rank_b;
    const Op& op = p_.ops[static_cast<std::size_t>(op_i)];
    Diagnostic d = diag(CheckId::CollectiveMismatch, op, op_i,
                        fmt::format("rank {} issues {} collective{} over {} in its group, but rank {} issues {}: the {} has no partner on rank {}, "
                                    "which never arrives (a hang at run time)",
                                    lbl(more), std::max(c.n_a, c.n_b), std::max(c.n_a, c.n_b) == 1 ? "" : "s", axes_str(c.mask), lbl(fewer),
                                    std::min(c.n_a, c.n_b), ordinal(std::min(c.n_a, c.n_b) + 1), lbl(fewer)));
    d.notes.push_back({op.loc, fmt::format("fix: every rank of the group over {} must issue the same collectives", axes_str(c.mask))});
    d.ranks = {lbl(more), lbl(fewer)};
    static_blame_ = true;
    diags_.push_back(std::move(d));
  }
  static_blame_ |= !leftovers.empty();
  // Ranks that run one program repeat one finding at one op: report it once, naming the ranks.
  std::vector<Diagnostic> merged;
  std::map<std::tuple<int, std::uint32_t, std::uint32_t>, std::pair<std::size_t, int>> at;
  for (std::size_t k = first_static; k < diags_.size(); ++k) {
    Diagnostic& d = diags_[k];
    auto key = std::make_tuple(static_cast<int>(d.id), d.loc.line, d.loc.col);
    auto it = at.find(key);
    if (it == at.end()) {
      at.emplace(key, std::make_pair(merged.size(), 0));
      merged.push_back(std::move(d));
      continue;
    }
    Diagnostic& m = merged[it->second.first];
    ++it->second.second;
    for (auto& r : d.ranks)
      if (std::find(m.ranks.begin(), m.ranks.end(), r) == m.ranks.end()) m.ranks.push_back(r);
  }
  for (auto& [key, v] : at)
    if (v.second) merged[v.first].message += fmt::format(" (and {} more like it on other ranks running this program)", v.second);
  diags_.resize(first_static);
  for (auto& d : merged) diags_.push_back(std::move(d));
}

}  // namespace spmd::temporal_detail
