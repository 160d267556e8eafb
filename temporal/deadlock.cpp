// temporal/deadlock.cpp - when no rank can move and not all are done: what each blocked rank waits for, and
// the cycle of waits (deadlock) with its fix.
#include <fmt/format.h>

#include <algorithm>

#include "temporal/engine.h"

namespace spmd::temporal_detail {

// The endpoints a blocked rank waits on.
std::vector<int> Engine::blocked_eps(int r) const {
  const Rank& R = ranks_[static_cast<std::size_t>(r)];
  std::vector<int> out;
  if (R.sync_ep >= 0) out.push_back(R.sync_ep);
  for (int x : R.waiting) {
    const Instance& h = insts_[static_cast<std::size_t>(x)];
    if (!h.complete && h.ep >= 0) out.push_back(h.ep);
  }
  return out;
}

// The ranks an endpoint waits for.
std::vector<int> Engine::waits_for(int e) const {
  const Endpoint& ep = eps_[static_cast<std::size_t>(e)];
  if (!ep.posted) {
    // Queued on its stream: it waits for what the op running there waits for.
    std::vector<int> out;
    for (int x : chains_[static_cast<std::size_t>(ep.chain)].running)
      for (int r : waits_for(x)) out.push_back(r);
    return out;
  }
  if (ep.barrier) {
    std::vector<int> out;
    for (const auto& [x, ws] : waiters_)
      if (std::find(ws.begin(), ws.end(), e) != ws.end())
        for (int r : waits_for(x)) out.push_back(r);
    return out;
  }
  if (ep.kind == EpKind::Local) return {};
  if (ep.kind != EpKind::Collective) return {ep.peer};
  std::vector<int> out;
  const Op& op = op_at(ep.op);
  std::vector<int> arrived;
  if (auto it = slots_.find(ep.slot); it != slots_.end())
    for (int x : it->second.eps) arrived.push_back(eps_[static_cast<std::size_t>(x)].rank);
  std::sort(arrived.begin(), arrived.end());
  for (int r : space_.members(ep.rank, op.attrs.axes))
    if (!std::binary_search(arrived.begin(), arrived.end(), r)) out.push_back(r);
  return out;
}

std::string Engine::kind_word(const Endpoint& ep, const char* op) const {
  if (ep.inst < 0) return op;
  return insts_[static_cast<std::size_t>(ep.inst)].name >= 0 ? fmt::format("the async {}", op) : fmt::format("the batched {}", op);
}

std::string Engine::why_blocked(int e) const {
  const Endpoint& ep = eps_[static_cast<std::size_t>(e)];
  const Op& op = op_at(ep.op);
  if (!ep.posted) {
    const Chain& ch = chains_[static_cast<std::size_t>(ep.chain)];
    std::string ahead = "the ops before it";
    if (!ch.running.empty()) {
      const Op& x = op_at(eps_[static_cast<std::size_t>(ch.running.front())].op);
      ahead = fmt::format("{} (line {}), which has not completed", op_name(x.kind), x.loc.line);
    }
    return fmt::format("{} (line {}) is queued on stream {} behind {} (the ops of one stream run one after another)",
                       kind_word(ep, std::string(op_name(op.kind)).c_str()), op.loc.line, stream_name(ep.chain), ahead);
  }
  if (ep.barrier) {
    std::string what = "the communication it waits for";
    for (const auto& [x, ws] : waiters_)
      if (std::find(ws.begin(), ws.end(), e) != ws.end()) {
        const Op& y = op_at(eps_[static_cast<std::size_t>(x)].op);
        what = fmt::format("{} (line {}) on stream {}", op_name(y.kind), y.loc.line, stream_name(eps_[static_cast<std::size_t>(x)].chain));
        break;
      }
    return fmt::format("{} (line {}) holds stream {} until {} completes", op_name(op.kind), op.loc.line, stream_name(ep.chain), what);
  }
  switch (ep.kind) {
    case EpKind::Local: return fmt::format("{} (line {}) runs on stream {}", op_name(op.kind), op.loc.line, stream_name(ep.chain));
    case EpKind::Send:
      return fmt::format("{} to {} (line {}) waits for {} to post the matching Recv (a blocking send under the rendezvous model)", kind_word(ep, "Send"),
                         lbl(ep.peer), op.loc.line, lbl(ep.peer));
    case EpKind::Recv:
      return fmt::format("{} from {} (line {}) waits for {} to post the matching Send", kind_word(ep, "Recv"), lbl(ep.peer), op.loc.line,
                         lbl(ep.peer));
    case EpKind::Collective: {
      std::string missing;
      auto w = waits_for(e);
      for (std::size_t k = 0; k < w.size() && k < 4; ++k) missing += (k ? ", " : "") + lbl(w[k]);
      if (w.size() > 4) missing += fmt::format(" and {} more", w.size() - 4);
      return fmt::format("{} (line {}, the {} collective of its group) waits for {} to arrive", coll_str(op), op.loc.line, ordinal(ep.seq + 1), missing);
    }
  }
  return "";
}

std::string Engine::rank_state(int r) const {
  const Rank& R = ranks_[static_cast<std::size_t>(r)];
  std::string s;
  if (R.sync_ep < 0) {
    const Op& w = op_at(R.wait_op);
    s = R.group_end ? fmt::format("at the end of batched group {} (line {}): ", p_.name(w.attrs.group), w.loc.line)
                    : fmt::format("in {} (line {}): ", op_name(w.kind), w.loc.line);
  }
  auto eps = blocked_eps(r);
  for (std::size_t k = 0; k < eps.size(); ++k) s += (k ? "; " : "") + why_blocked(eps[k]);
  return s;
}

Loc Engine::blocked_loc(int r) const {
  const Rank& R = ranks_[static_cast<std::size_t>(r)];
  return op_at(R.sync_ep >= 0 ? eps_[static_cast<std::size_t>(R.sync_ep)].op : R.wait_op).loc;
}

int Engine::blocked_op(int r) const {
  const Rank& R = ranks_[static_cast<std::size_t>(r)];
  return R.sync_ep >= 0 ? eps_[static_cast<std::size_t>(R.sync_ep)].op : R.wait_op;
}

// No rank can move and not all are done: find a cycle of waits among the blocked ranks.
void Engine::stalled() {
  int n = space_.count();
  std::vector<std::vector<int>> edges(static_cast<std::size_t>(n));
  for (int r = 0; r < n; ++r) {
    if (!ranks_[static_cast<std::size_t>(r)].blocked) continue;
    for (int e0 : blocked_eps(r)) {
      std::vector<int> eps{e0};
      if (!eps_[static_cast<std::size_t>(e0)].posted) eps = chains_[static_cast<std::size_t>(eps_[static_cast<std::size_t>(e0)].chain)].running;
      for (int e : eps) {
        // A Send or Recv that static matching left without a partner waits forever: unmatched-p2p says so.
        if (leftover_.count({eps_[static_cast<std::size_t>(e)].rank, eps_[static_cast<std::size_t>(e)].op})) continue;
        for (int s : waits_for(e))
          if (!ranks_[static_cast<std::size_t>(s)].done) edges[static_cast<std::size_t>(r)].push_back(s);
      }
    }
  }
  // Iterative DFS; a back edge closes a cycle.
  std::vector<int> color(static_cast<std::size_t>(n), 0), parent(static_cast<std::size_t>(n), -1);
  std::vector<int> cycle;
  for (int start = 0; start < n && cycle.empty(); ++start) {
    if (color[static_cast<std::size_t>(start)] || !ranks_[static_cast<std::size_t>(start)].blocked) continue;
    std::vector<std::pair<int, std::size_t>> stack{{start, 0}};
    color[static_cast<std::size_t>(start)] = 1;
    while (!stack.empty() && cycle.empty()) {
      auto& [u, k] = stack.back();
      if (k == edges[static_cast<std::size_t>(u)].size()) {
        color[static_cast<std::size_t>(u)] = 2;
        stack.pop_back();
        continue;
      }
      int v = edges[static_cast<std::size_t>(u)][k++];
      if (color[static_cast<std::size_t>(v)] == 1) {
        for (int w = u; w != v; w = parent[static_cast<std::size_t>(w)]) cycle.push_back(w);
        cycle.push_back(v);
        std::reverse(cycle.begin(), cycle.end());
      } else if (color[static_cast<std::size_t>(v)] == 0) {
        color[static_cast<std::size_t>(v)] = 1;
        parent[static_cast<std::size_t>(v)] = u;
        stack.push_back({v, 0});
      }
    }
  }
  if (cycle.empty()) {
    if (static_blame_) return;  // they wait on ranks that finished: unmatched-p2p / collective-mismatch say why
    int r = 0;
    while (!ranks_[static_cast<std::size_t>(r)].blocked) ++r;
    Diagnostic d = diag(CheckId::Deadlock, op_at(blocked_op(r)), blocked_op(r),
                        fmt::format("rank {} can never continue: {}", lbl(r), rank_state(r)));
    d.ranks = {lbl(r)};
    diags_.push_back(std::move(d));
    return;
  }
  std::string chain;
  for (int r : cycle) chain += lbl(r) + " -> ";
  chain += lbl(cycle.front());
  int first = cycle.front();
  bool sync_sends = false, async_sends = false, p2p = false, colls = false;
  int queued_on = -1;  // a blocked op waits for its turn on this serialized stream
  Diagnostic d = diag(CheckId::Deadlock, op_at(blocked_op(first)), blocked_op(first),
                      fmt::format("deadlock under the {} model: a cycle of waits {} (each rank waits for the next); none of them can move", model_ == P2PModel::Eager ? "eager" : "rendezvous",
                                  chain));
  for (int r : cycle) {
    d.notes.push_back({blocked_loc(r), fmt::format("rank {} is blocked here: {}", lbl(r), rank_state(r))});
    d.ranks.push_back(lbl(r));
    for (int e : blocked_eps(r)) {
      const Endpoint& ep = eps_[static_cast<std::size_t>(e)];
      sync_sends |= ep.kind == EpKind::Send && (ep.inst < 0 || insts_[static_cast<std::size_t>(ep.inst)].name < 0);
      async_sends |= ep.kind == EpKind::Send && ep.inst >= 0 && insts_[static_cast<std::size_t>(ep.inst)].name >= 0;
      p2p |= ep.kind == EpKind::Send || ep.kind == EpKind::Recv;
      colls |= ep.kind == EpKind::Collective;
      if (!ep.posted && queued_on < 0) queued_on = ep.chain;
    }
  }
  int others = 0;
  for (int r = 0; r < n; ++r)
    if (ranks_[static_cast<std::size_t>(r)].blocked && std::find(cycle.begin(), cycle.end(), r) == cycle.end() && others++ < 4)
      d.notes.push_back({blocked_loc(r), fmt::format("rank {} is also blocked: {}", lbl(r), rank_state(r))});
  std::string fix;
  if (queued_on >= 0)
    fix = fmt::format("the ops of stream {} run one after another, so an op queued there cannot start before the one ahead of it "
                      "completes: order them on every rank so that the op at the head of each stream can complete (by rank parity: even "
                      "ranks send first, odd ranks receive first; collectives in one order), post sends and receives together in one "
                      "batched group (`group:`), or give them separate streams",
                      stream_name(queued_on));
  else if (colls && p2p)
    fix = "a rank blocked in point-to-point cannot arrive at a collective, nor the reverse: move the Send after the collective, or post the "
          "Recv before it, in the same order on every rank";
  else if (sync_sends)
    fix = "order sends and receives by rank parity (even ranks send first, odd ranks receive first, as Megatron does), post them together "
          "in one batched group (`group:`), or make the sends asynchronous (`handle:`) and wait after the receives";
  else if (async_sends)
    fix = "wait for the isends after posting the receives: under the rendezvous model an isend completes only once its Recv is posted";
  else if (colls)
    fix = "issue the collectives in one order on every rank (a rank blocked in one group cannot arrive at another)";
  else
    fix = "post every receive's matching send before the receive can block";
  d.notes.push_back({blocked_loc(first), "fix: " + fix});
  diags_.push_back(std::move(d));
}

}  // namespace spmd::temporal_detail
