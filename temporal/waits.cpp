// temporal/waits.cpp - Wait, WaitAll, the end of a batched group and OverlapRegion: which instances they
// complete (invalid-wait), and findings about one rank's own order merged across ranks.
#include <fmt/format.h>

#include <algorithm>

#include "temporal/engine.h"

namespace spmd::temporal_detail {

// A finding about one rank's own order: merged across ranks running the same program.
void Engine::local(Diagnostic d, int r) {
  std::string key = fmt::format("{}:{}:{}:{}", static_cast<int>(d.id), d.loc.line, d.loc.col, d.message);
  auto it = local_.find(key);
  if (it == local_.end()) local_.emplace(key, std::make_pair(std::move(d), std::vector<int>{r}));
  else if (it->second.second.back() != r) it->second.second.push_back(r);
}

void Engine::close_group(int r) {
  Rank& R = ranks_[static_cast<std::size_t>(r)];
  R.group = -1;
  if (R.group_insts.empty()) return;
  // A batched group of synchronous ops completes as a whole: the caller waits for all of them.
  R.wait_insts = std::move(R.group_insts);
  R.group_insts.clear();
  R.wait_op = R.group_last_op;
  R.wait_chain = chain_of(r, compute_);
  R.group_end = true;
  block_on_waits(r);
}

void Engine::wait(int r, const Op& op, int i) {
  Rank& R = ranks_[static_cast<std::size_t>(r)];
  int chain = chain_of(r, op.attrs.stream >= 0 ? op.attrs.stream : compute_);
  std::vector<NameId> hs;
  if (op.kind == OpKind::Wait) hs.push_back(op.attrs.handle);
  else hs = p_.name_lists[op.attrs.handles];
  std::vector<int> done;
  for (NameId h : hs) {
    int in = live(r, h);
    if (in < 0) {
      std::vector<std::string> known;
      for (NameId id : R.handles) known.push_back(p_.name(id));
      std::sort(known.begin(), known.end());
      auto best = did_you_mean(p_.name(h), known);
      local(diag(CheckId::InvalidWait, op, i,
                 fmt::format("{} of handle {}, which no earlier op returned{}", op_name(op.kind), p_.name(h),
                             best ? fmt::format("; did you mean {}?", *best) : "")),
            r);
      continue;
    }
    const Instance& st = insts_[static_cast<std::size_t>(in)];
    if (st.wait_event >= 0 || std::find(done.begin(), done.end(), in) != done.end()) {
      Diagnostic d = diag(CheckId::InvalidWait, op, i, fmt::format("{} of handle {}, which was already waited", op_name(op.kind), p_.name(h)));
      d.notes.push_back({op_at(st.wait_event >= 0 ? st.wait_op : i).loc, fmt::format("handle {} was waited here", p_.name(h))});
      local(std::move(d), r);
      continue;
    }
    done.push_back(in);
  }
  R.wait_insts = std::move(done);
  R.wait_op = i;
  R.wait_chain = chain;
  R.group_end = false;
  block_on_waits(r);
}

void Engine::block_on_waits(int r) {
  Rank& R = ranks_[static_cast<std::size_t>(r)];
  R.waiting.clear();
  for (int x : R.wait_insts)
    if (!insts_[static_cast<std::size_t>(x)].complete) R.waiting.push_back(x);
  if (R.waiting.empty()) return finish_wait(r);
  R.blocked = true;
}

// The Wait (or the end of a batched group) happens: after the completion of what it waits for.
void Engine::finish_wait(int r) {
  Rank& R = ranks_[static_cast<std::size_t>(r)];
  // The Wait's chain joins every completion clock: all but the last directly, the last through add_event
  // (joins commute, so this is the join of them all, with no temporary clock).
  std::vector<int> from;
  const VC* last = nullptr;
  for (int x : R.wait_insts) {
    if (last) join(chains_[static_cast<std::size_t>(R.wait_chain)].vc, *last);
    last = &insts_[static_cast<std::size_t>(x)].done_vc;
    from.push_back(insts_[static_cast<std::size_t>(x)].issue_event);
  }
  int ev = add_event(R.wait_op, R.wait_chain, last, from, R.group_end ? EventKind::GroupEnd : EventKind::Op);
  for (int x : R.wait_insts) {
    Instance& h = insts_[static_cast<std::size_t>(x)];
    h.wait_event = ev;
    h.wait_op = R.wait_op;
    VC().swap(h.done_vc);
  }
  if (!R.group_end) {
    waits_.push_back({ev, R.wait_op});
    ++R.pc;
  }
  R.wait_insts.clear();
  R.group_end = false;
}

// OverlapRegion: the async ops it names must be in flight (issued on this rank and not yet waited).
void Engine::overlap_checks(int r, const Op& op, int i) {
  for (NameId h : p_.name_lists[op.attrs.handles]) {
    int in = live(r, h);
    if (in < 0) {
      local(diag(CheckId::InvalidWait, op, i,
                 fmt::format("OverlapRegion overlaps handle {}, which no earlier op returned: nothing is in flight to overlap with", p_.name(h))),
            r);
    } else if (insts_[static_cast<std::size_t>(in)].wait_event >= 0) {
      Diagnostic d = diag(CheckId::InvalidWait, op, i,
                          fmt::format("OverlapRegion overlaps handle {}, which was already waited: the region runs after the op completes, so "
                                      "nothing overlaps (the Wait serializes them)",
                                      p_.name(h)));
      d.notes.push_back({op_at(insts_[static_cast<std::size_t>(in)].wait_op).loc, fmt::format("handle {} was waited here", p_.name(h))});
      d.notes.push_back({op.loc, fmt::format("fix: move the Wait of {} after this region", p_.name(h))});
      local(std::move(d), r);
    }
  }
}

}  // namespace spmd::temporal_detail
