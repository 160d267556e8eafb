// temporal/simulation.cpp - the rank simulation: ops issued, communication posted on its stream, matched
// (Send with Recv, collective members in their slot) and completed, with the clocks joined along the way.
#include <fmt/format.h>

#include <algorithm>

#include "temporal/engine.h"

namespace spmd::temporal_detail {

void Engine::run_rank(int r) {
  for (;;) {
    Rank& R = ranks_[static_cast<std::size_t>(r)];
    if (R.done || R.blocked) return;
    if (R.group >= 0 && (R.pc == R.end || op_at(static_cast<int>(R.pc)).attrs.group != R.group)) {
      close_group(r);
      continue;
    }
    if (R.pc == R.end) {
      R.done = true;
      return;
    }
    exec(r, static_cast<int>(R.pc));
  }
}

void Engine::exec(int r, int i) {
  const Op& op = op_at(i);
  Rank& R = ranks_[static_cast<std::size_t>(r)];
  if (op.kind == OpKind::Wait || op.kind == OpKind::WaitAll) return wait(r, op, i);
  if (op.kind == OpKind::WaitStream || op.kind == OpKind::RecordEvent || op.kind == OpKind::WaitEvent) return stream_order(r, op, i);
  if (op.kind == OpKind::OverlapRegion) overlap_checks(r, op, i);
  bool grouped = op.attrs.group >= 0 && !is_async(op);
  if (op.attrs.group >= 0) {
    if (R.group != op.attrs.group) R.group_unit = kGroupUnits + next_group_unit_++;
    R.group = op.attrs.group;
    R.group_last_op = i;
  }
  if (is_async(op) || grouped) {
    issue_async(r, op, i, grouped);
    ++R.pc;
    return;
  }
  NameId stream = op.attrs.stream >= 0 ? op.attrs.stream : compute_;
  int chain = chain_of(r, stream);
  if (!is_comm(op) || is_local(op)) {
    int ev = add_event(i, chain);
    accesses(r, op, ev, -1);
    ++R.pc;
    return;
  }
  // A synchronous collective or point-to-point op: post it (once its stream is free), and block until it completes.
  int e = make_ep(r, op, i, -1, chains_[static_cast<std::size_t>(chain)].vc, -1, serialized(stream) ? chain : -1, -1);
  submit(e);
  if (!eps_[static_cast<std::size_t>(e)].complete) {
    R.blocked = true;
    R.sync_ep = e;
  }
}

// Stream-to-stream order (WaitStream, RecordEvent, WaitEvent): an event on this op's stream that
// joins the clock of the other stream (now, or at the RecordEvent). Later communication on this
// stream also waits, on the GPU, for the communication then pending on the other one (a barrier).
void Engine::stream_order(int r, const Op& op, int i) {
  Rank& R = ranks_[static_cast<std::size_t>(r)];
  ++R.pc;
  NameId stream = op.attrs.stream >= 0 ? op.attrs.stream : compute_;
  int chain = chain_of(r, stream);
  if (op.kind == OpKind::RecordEvent) {
    int ev = add_event(i, chain);
    R.events[op.attrs.sync] = {ev, chains_[static_cast<std::size_t>(chain)].vc, pending_on(chain)};
    return;
  }
  int from = -1;
  VC vc;
  std::vector<int> deps;
  if (op.kind == OpKind::WaitStream) {
    int o = find_chain(r, op.attrs.sync);  // (`compute` and `comm` are interned names once a program mentions them)
    if (o >= 0 && o != chain) {
      from = chains_[static_cast<std::size_t>(o)].last;
      vc = chains_[static_cast<std::size_t>(o)].vc;
      deps = pending_on(o);
    }
  } else {
    auto it = R.events.find(op.attrs.sync);
    if (it == R.events.end()) {
      std::vector<std::string> known;
      for (const auto& [id, rec] : R.events) known.push_back(p_.name(id));
      std::sort(known.begin(), known.end());
      auto best = did_you_mean(p_.name(op.attrs.sync), known);
      Diagnostic d = diag(CheckId::InvalidWait, op, i,
                          fmt::format("WaitEvent of event {}, which no earlier RecordEvent on this rank recorded: waiting for an event never "
                                      "recorded returns at once and orders nothing{}",
                                      p_.name(op.attrs.sync), best ? fmt::format("; did you mean {}?", *best) : ""));
      d.notes.push_back({op.loc, fmt::format("fix: insert {{op: RecordEvent, event: {}, stream: S}} on the producing stream S before this op",
                                             p_.name(op.attrs.sync))});
      local(std::move(d), r);
    } else {
      from = it->second.event;
      vc = it->second.vc;
      deps = it->second.pending;
    }
  }
  add_event(i, chain, vc.empty() ? nullptr : &vc, std::span<const int>(&from, 1));
  std::erase_if(deps, [&](int x) { return eps_[static_cast<std::size_t>(x)].complete; });
  if (deps.empty() || !serialized(stream)) return;
  int e = make_ep(r, op, i, -1, {}, -1, chain, -1);
  eps_[static_cast<std::size_t>(e)].barrier = true;
  barrier_pending_[e] = static_cast<int>(deps.size());
  for (int x : deps) waiters_[x].push_back(e);
  submit(e);
}

// The communication issued on `chain` that has not completed (running or queued there).
std::vector<int> Engine::pending_on(int chain) const {
  const Chain& ch = chains_[static_cast<std::size_t>(chain)];
  std::vector<int> out(ch.running.begin(), ch.running.end());
  out.insert(out.end(), ch.queue.begin(), ch.queue.end());
  return out;
}

void Engine::issue_async(int r, const Op& op, int i, bool implicit) {
  Rank& R = ranks_[static_cast<std::size_t>(r)];
  NameId stream = op.attrs.stream >= 0 ? op.attrs.stream : comm_;
  int chain = chain_of(r, stream);
  // Issued from the program's default stream: everything before it there happens before its start.
  int calling = chain_of(r, compute_);
  const Chain& cc = chains_[static_cast<std::size_t>(calling)];
  int from = cc.last;
  // (no chain is added from here on, so the calling chain's clock can be joined in place)
  int ev = add_event(i, chain, calling == chain ? nullptr : &cc.vc, std::span<const int>(&from, 1));
  if (!implicit) {
    int prev = live(r, op.attrs.handle);
    if (prev >= 0 && insts_[static_cast<std::size_t>(prev)].wait_event < 0) {
      Instance& old = insts_[static_cast<std::size_t>(prev)];
      old.reported = true;
      Diagnostic d = diag(CheckId::OrphanedHandle, op, i,
                          fmt::format("{} reuses handle {} while the op that returned it (line {}) was never waited", op_name(op.kind),
                                      p_.name(op.attrs.handle), op_at(old.op).loc.line));
      d.notes.push_back({op_at(old.op).loc, fmt::format("handle {} first returned here", p_.name(op.attrs.handle))});
      local(std::move(d), r);
    }
  }
  int inst = static_cast<int>(insts_.size());
  insts_.push_back({r, implicit ? NameId{-1} : op.attrs.handle, i, ev});
  if (implicit) R.group_insts.push_back(inst);
  else {
    int& l = slot(r, op.attrs.handle).live;
    if (l < 0) R.handles.push_back(op.attrs.handle);
    l = inst;
  }
  accesses(r, op, ev, inst);
  VC issued = chains_[static_cast<std::size_t>(chain)].vc;
  bool serial = serialized(stream);
  std::int64_t unit = implicit ? R.group_unit : -1;
  if ((!is_comm(op) || is_local(op)) && (!serial || idle(chain, unit))) {
    complete_inst(inst, issued);
    return;
  }
  // Communication, or a local op queued behind communication on its stream (it completes when it starts).
  int e = make_ep(r, op, i, inst, std::move(issued), ev, serial ? chain : -1, unit);
  insts_[static_cast<std::size_t>(inst)].ep = e;
  submit(e);
}

// A communication endpoint, numbered in issue order within its group or channel; not posted yet.
int Engine::make_ep(int r, const Op& op, int i, int inst, VC vc, int event, int chain, std::int64_t unit) {
  int e = static_cast<int>(eps_.size());
  Endpoint ep;
  ep.rank = r;
  ep.op = i;
  ep.inst = inst;
  ep.event = event;
  ep.vc = std::move(vc);
  ep.chain = chain;
  ep.unit = unit >= 0 ? unit : e;
  if (!is_comm(op) || is_local(op)) {
    ep.kind = EpKind::Local;
  } else if (op.kind == OpKind::Send || op.kind == OpKind::Recv) {
    bool send = op.kind == OpKind::Send;
    ep.kind = send ? EpKind::Send : EpKind::Recv;
    ep.peer = space_.with(r, p_.coords[op.attrs.coords]);
    ep.slot = send ? std::int64_t{r} * kMaxRepresentatives + ep.peer : std::int64_t{ep.peer} * kMaxRepresentatives + r;
    auto [it, fresh] = channel_index_.try_emplace(ep.slot, static_cast<int>(channels_.size()));
    if (fresh) channels_.emplace_back();
    ep.channel = it->second;
    Channel& ch = channels_[static_cast<std::size_t>(ep.channel)];
    ep.seq = send ? ch.n_sends++ : ch.n_recvs++;
  } else {
    ep.kind = EpKind::Collective;
    std::int64_t group = space_.group(r, op.attrs.axes).first;
    ep.seq = ranks_[static_cast<std::size_t>(r)].seq[group]++;
    ep.slot = group * (std::int64_t{1} << 32) + ep.seq;
  }
  eps_.push_back(std::move(ep));
  return e;
}

// Posts `e` now, or queues it behind the ops running on its serialized stream.
void Engine::submit(int e) {
  int c = eps_[static_cast<std::size_t>(e)].chain;
  if (c < 0) return post(e);
  if (idle(c, eps_[static_cast<std::size_t>(e)].unit)) return start(c, e);
  chains_[static_cast<std::size_t>(c)].queue.push_back(e);
}

void Engine::start(int c, int e) {
  Chain& ch = chains_[static_cast<std::size_t>(c)];
  ch.unit = eps_[static_cast<std::size_t>(e)].unit;
  ch.running.push_back(e);
  post(e);
}

// The running unit of chain c completed: start the next one (a loop, not a recursion, per chain).
void Engine::drain(int c) {
  if (chains_[static_cast<std::size_t>(c)].draining) return;
  chains_[static_cast<std::size_t>(c)].draining = true;
  for (;;) {
    Chain& ch = chains_[static_cast<std::size_t>(c)];
    if (ch.queue.empty()) break;
    int f = ch.queue.front();
    if (!ch.running.empty() && eps_[static_cast<std::size_t>(f)].unit != ch.unit) break;
    ch.queue.pop_front();
    start(c, f);
  }
  chains_[static_cast<std::size_t>(c)].draining = false;
}

// Posts a communication endpoint; it may complete at once.
void Engine::post(int e) {
  eps_[static_cast<std::size_t>(e)].posted = true;
  const Endpoint& ep = eps_[static_cast<std::size_t>(e)];
  const Op& op = op_at(ep.op);
  int i = ep.op;
  switch (ep.kind) {
    case EpKind::Local:
      if (ep.barrier && barrier_pending_[e] > 0) return;  // completes with the last op it waits for
      return complete_ep(e, nullptr, true);
    case EpKind::Send:
    case EpKind::Recv: {
      bool send = ep.kind == EpKind::Send;
      std::size_t k = static_cast<std::size_t>(ep.seq);
      std::size_t c = static_cast<std::size_t>(ep.channel);
      auto& mine = send ? channels_[c].sends : channels_[c].recvs;
      if (mine.size() <= k) mine.resize(k + 1, -1);
      mine[k] = e;
      if (send && model_ == P2PModel::Eager) complete_ep(e, nullptr);  // a buffered send completes at once
      auto& other = send ? channels_[c].recvs : channels_[c].sends;
      if (k < other.size() && other[k] >= 0) {
        int o = other[k];
        send ? transfer(e, o) : transfer(o, e);
      }
      return;
    }
    case EpKind::Collective: break;
  }
  int members = space_.group(ep.rank, op.attrs.axes).second;
  Slot& s = slots_[ep.slot];
  s.eps.push_back(e);
  join(s.vc, ep.vc);
  if (static_cast<int>(s.eps.size()) == members) {
    // Every member has arrived: each departs after every arrival.
    Slot done = std::move(s);
    slots_.erase(eps_[static_cast<std::size_t>(e)].slot);
    for (int x : done.eps) complete_ep(x, &done.vc, true);
    int hub = static_cast<int>(events_.size());
    events_.push_back({i, -1, 0, EventKind::Hub});
    hubs_[hub] = fmt::format("{} #{}", coll_str(op), eps_[static_cast<std::size_t>(e)].seq + 1);
    for (int x : done.eps) {
      Endpoint& m = eps_[static_cast<std::size_t>(x)];
      // Async: issue -> hub (the hub is where it completes); synchronous: hub -> the op's one event.
      if (m.event >= 0 && m.inst >= 0) edges_.push_back({m.event, hub});
      else if (m.event >= 0) edges_.push_back({hub, m.event});
      VC().swap(m.vc);
    }
  }
}

// A Send meets its Recv: the Recv completes after the Send was posted; a rendezvous Send
// completes once the Recv is posted.
void Engine::transfer(int s, int rv) {
  // (complete_ep never adds endpoints, so these references stay valid)
  // The Recv's clock is read once more only to complete a rendezvous Send (below); the Send's is last read
  // by its own completion (rendezvous) or by this Recv's (eager: the Send completed when posted).
  bool send_done = eps_[static_cast<std::size_t>(s)].complete;
  complete_ep(rv, &eps_[static_cast<std::size_t>(s)].vc, send_done);
  if (!eps_[static_cast<std::size_t>(s)].complete) complete_ep(s, &eps_[static_cast<std::size_t>(rv)].vc, true);
  int a = eps_[static_cast<std::size_t>(s)].event, b = eps_[static_cast<std::size_t>(rv)].event;
  if (a >= 0 && b >= 0) edges_.push_back({a, b});
  VC().swap(eps_[static_cast<std::size_t>(s)].vc);
  VC().swap(eps_[static_cast<std::size_t>(rv)].vc);
}

void Engine::complete_ep(int e, const VC* extra, bool last_use) {
  Endpoint& ep = eps_[static_cast<std::size_t>(e)];
  ep.complete = true;
  if (ep.barrier) {
    // no event of its own: the WaitStream / WaitEvent happened when issued
  } else if (ep.inst >= 0) {
    VC v = last_use ? std::move(ep.vc) : ep.vc;
    if (extra) join(v, *extra);
    complete_inst(ep.inst, std::move(v));
  } else {
    // A synchronous op: its one event happens now, on its rank's stream.
    int r = ep.rank;
    const Op& op = op_at(ep.op);
    int chain = chain_of(r, op.attrs.stream >= 0 ? op.attrs.stream : compute_);
    int ev = add_event(ep.op, chain, extra);
    eps_[static_cast<std::size_t>(e)].event = ev;
    accesses(r, op, ev, -1);
    Rank& R = ranks_[static_cast<std::size_t>(r)];
    ++R.pc;
    if (R.blocked && R.sync_ep == e) {
      R.blocked = false;
      R.sync_ep = -1;
      ready_.push_back(r);
    }
  }
  // Barriers waiting for it.
  if (auto it = waiters_.empty() ? waiters_.end() : waiters_.find(e); it != waiters_.end()) {
    std::vector<int> ws = std::move(it->second);
    waiters_.erase(it);
    for (int b : ws)
      if (--barrier_pending_[b] == 0 && eps_[static_cast<std::size_t>(b)].posted && !eps_[static_cast<std::size_t>(b)].complete) complete_ep(b, nullptr);
  }
  // Its stream is free once its unit completed.
  int c = eps_[static_cast<std::size_t>(e)].chain;
  if (c < 0) return;
  auto& run = chains_[static_cast<std::size_t>(c)].running;
  run.erase(std::remove(run.begin(), run.end(), e), run.end());
  if (run.empty()) drain(c);
}

void Engine::complete_inst(int inst, VC v) {
  Instance& h = insts_[static_cast<std::size_t>(inst)];
  h.complete = true;
  h.done_vc = std::move(v);
  Rank& R = ranks_[static_cast<std::size_t>(h.rank)];
  if (R.blocked && !R.waiting.empty() &&
      std::all_of(R.waiting.begin(), R.waiting.end(), [&](int x) { return insts_[static_cast<std::size_t>(x)].complete; })) {
    R.waiting.clear();
    finish_wait(h.rank);
    R.blocked = false;
    ready_.push_back(h.rank);
  }
}

}  // namespace spmd::temporal_detail
