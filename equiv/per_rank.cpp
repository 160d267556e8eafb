// equiv/per_rank.cpp - per-rank plans in the value check: held values, last writes per program, cross-program flow.
#include "equiv/per_rank.h"

#include <map>
#include <unordered_map>

#include "ir/ranks.h"

namespace spmd::equiv_detail {

bool held_pieces(const std::vector<std::int64_t>& mesh, const std::vector<interp::Val>& ranks, std::vector<interp::Tensor>& pieces,
                 std::vector<std::int64_t>& sizes, const interp::Val** first) {
  pieces.clear();
  sizes = mesh;
  std::size_t n_axes = mesh.size();
  std::vector<std::int64_t> shared(n_axes, -1);  // the coordinate every defined rank has on the axis (-2: several)
  const interp::Val* f = nullptr;
  std::size_t defined = 0;
  for (std::size_t r = 0; r < ranks.size(); ++r) {
    if (!ranks[r].defined) continue;
    ++defined;
    if (!f) f = &ranks[r];
    std::int64_t rest = static_cast<std::int64_t>(r);
    for (std::size_t a = n_axes; a-- > 0;) {
      std::int64_t c = rest % mesh[a];
      rest /= mesh[a];
      if (shared[a] == -1) shared[a] = c;
      else if (shared[a] != c) shared[a] = -2;
    }
  }
  if (first) *first = f;
  if (!f) return false;
  if (defined == ranks.size()) {
    for (const auto& v : ranks) pieces.push_back(v.t);
    return true;
  }
  std::int64_t expected = 1;
  for (std::size_t a = 0; a < n_axes; ++a) {
    if (shared[a] >= 0) sizes[a] = 1;
    expected *= sizes[a];
  }
  if (static_cast<std::int64_t>(defined) != expected) return false;
  for (const auto& v : ranks)
    if (v.defined) pieces.push_back(v.t);
  return true;
}

std::vector<char> final_writes(const Program& p) {
  std::vector<char> fin(p.operands.size(), 0);
  std::vector<char> seen(p.names.size(), 0);
  for (const auto& rp : rank_programs(p)) {
    std::vector<NameId> touched;
    for (std::uint32_t i = rp.first_op + rp.n_ops; i-- > rp.first_op;) {
      const Op& op = p.ops[i];
      auto outs = p.outs(op);
      for (std::size_t k = outs.size(); k-- > 0;) {
        auto n = static_cast<std::size_t>(outs[k]);
        if (seen[n]) continue;
        seen[n] = 1;
        touched.push_back(outs[k]);
        fin[op.first + op.n_in + k] = 1;
      }
    }
    for (NameId n : touched) seen[static_cast<std::size_t>(n)] = 0;
  }
  return fin;
}

std::vector<std::vector<int>> plan_producers(const Program& p) {
  std::vector<std::vector<int>> producers(p.ops.size());
  std::vector<int> writer(p.names.size(), -1);
  for (const auto& rp : rank_programs(p)) {
    std::vector<NameId> touched;
    for (std::uint32_t oi = rp.first_op; oi < rp.first_op + rp.n_ops; ++oi) {
      const Op& op = p.ops[oi];
      for (NameId n : p.ins(op)) producers[oi].push_back(writer[static_cast<std::size_t>(n)]);
      for (NameId n : p.outs(op)) writer[static_cast<std::size_t>(n)] = static_cast<int>(oi), touched.push_back(n);
    }
    for (NameId n : touched) writer[static_cast<std::size_t>(n)] = -1;
  }
  if (!p.per_rank) return producers;
  RankSpace space;
  try {
    space = make_rank_space(p);
  } catch (const LoadError&) {
    return producers;
  }
  std::vector<P2PMatch> matches;
  std::vector<P2PLeftover> leftovers;
  match_p2p(p, space, matches, leftovers);
  for (const auto& m : matches) {
    auto& v = producers[static_cast<std::size_t>(m.recv_op)];
    if (std::find(v.begin(), v.end(), m.send_op) == v.end()) v.push_back(m.send_op);
  }
  std::vector<CollectivePair> pairs;
  std::vector<CollectiveCount> counts;
  match_collectives(p, space, pairs, counts);
  std::vector<std::vector<int>> own = producers;
  for (const auto& c : pairs)
    for (auto [a, b] : {std::pair{c.op_a, c.op_b}, std::pair{c.op_b, c.op_a}})
      for (int q : own[static_cast<std::size_t>(b)]) {
        auto& v = producers[static_cast<std::size_t>(a)];
        if (q >= 0 && std::find(v.begin(), v.end(), q) == v.end()) v.push_back(q);
      }
  return producers;
}

std::vector<std::vector<int>> name_peers(const Program& p) {
  std::vector<std::vector<int>> peers(p.ops.size());
  if (!p.per_rank) return peers;
  std::map<std::pair<NameId, int>, std::vector<int>> by;  // (name, its k-th write in the program) -> ops
  for (const auto& rp : rank_programs(p)) {
    std::unordered_map<NameId, int> count;
    for (std::uint32_t oi = rp.first_op; oi < rp.first_op + rp.n_ops; ++oi) {
      const Op& op = p.ops[oi];
      if (op.n_out == 0) continue;
      NameId n = p.outs(op)[0];
      by[{n, count[n]++}].push_back(static_cast<int>(oi));
    }
  }
  for (const auto& [key, ops] : by)
    if (ops.size() > 1)
      for (int a : ops)
        for (int b : ops)
          if (a != b) peers[static_cast<std::size_t>(a)].push_back(b);
  return peers;
}

}  // namespace spmd::equiv_detail
