// temporal/races.cpp - buffer accesses per rank: each access against the earlier ones by happens-before
// (missing-wait, data-race, buffer-aliasing), with the notes and fixes of each finding.
#include <fmt/format.h>

#include <algorithm>

#include "ir/printer.h"
#include "temporal/engine.h"

namespace spmd::temporal_detail {

void Engine::accesses(int r, const Op& op, int ev, int inst) {
  for (NameId n : p_.ins(op)) access(r, n, {ev, inst, false}, op);
  for (NameId n : p_.outs(op)) access(r, n, {ev, inst, true}, op);
}

// Checks the access y against the buffer's earlier accesses on this rank, then records it.
void Engine::access(int r, NameId buf, Access y, const Op& yop) {
  Buffer& b = buffer(r, buf);
  if (b.last_write && b.last_write->event != y.event && !ended_before(*b.last_write, y.event)) report(r, buf, *b.last_write, y, yop);
  if (y.write)
    for (const auto& x : b.reads)
      if (x.event != y.event && !ended_before(x, y.event)) report(r, buf, x, y, yop);
  if (y.write) {
    b.unread_over = b.last_write && b.reads.empty() ? b.last_write->event : -1;
    b.last_write = y;
    b.reads.clear();
  } else {
    // Keep one synchronous read per stream (later ones dominate earlier ones) and every async read.
    int chain = events_[static_cast<std::size_t>(y.event)].chain;
    if (y.inst < 0)
      b.reads.erase(std::remove_if(b.reads.begin(), b.reads.end(),
                                   [&](const Access& x) { return x.inst < 0 && events_[static_cast<std::size_t>(x.event)].chain == chain; }),
                    b.reads.end());
    b.reads.push_back(y);
  }
}

// Buffers (and handles) are per rank. Most names live on one rank: the name's first slot is found directly;
// the others (a name every rank uses) through a (rank, name) index, so no lookup walks the ranks.
BufSlot& Engine::slot(int r, NameId n) {
  if (static_cast<std::size_t>(n) >= buf_head_.size()) buf_head_.resize(std::max(p_.names.size(), static_cast<std::size_t>(n) + 1), -1);
  // The first kDirect ranks of a name: a short list from the name; the rest: the (rank, name) index.
  constexpr int kDirect = 4;
  int* link = &buf_head_[static_cast<std::size_t>(n)];
  int walked = 0;
  for (; *link >= 0 && walked < kDirect; ++walked) {
    BufSlot& sl = bufs_[static_cast<std::size_t>(*link)];
    if (sl.rank == r) return sl;
    link = &sl.next;
  }
  if (walked == kDirect) {
    auto [it, fresh] = buf_index_.try_emplace((static_cast<std::uint64_t>(static_cast<std::uint32_t>(r)) << 32) | static_cast<std::uint32_t>(n),
                                              static_cast<int>(bufs_.size()));
    if (!fresh) return bufs_[static_cast<std::size_t>(it->second)];
  } else {
    *link = static_cast<int>(bufs_.size());
  }
  bufs_.push_back({r, -1, -1, {}});
  return bufs_.back();
}

std::string Engine::inst_name(int inst) const {
  const Instance& h = insts_[static_cast<std::size_t>(inst)];
  return h.name >= 0 ? p_.name(h.name) : fmt::format("the batched group {}", p_.name(op_at(h.op).attrs.group));
}

std::string Engine::describe(const Access& a) const {
  const Op& op = op_of(a.event);
  std::string s = stream_name(events_[static_cast<std::size_t>(a.event)].chain);
  if (a.inst >= 0) {
    const Instance& h = insts_[static_cast<std::size_t>(a.inst)];
    if (h.name < 0) return fmt::format("{} (line {}, in batched group {}, stream {})", op_name(op.kind), op.loc.line, p_.name(op.attrs.group), s);
    return fmt::format("{} (line {}, handle {}, stream {})", op_name(op.kind), op.loc.line, p_.name(h.name), s);
  }
  return fmt::format("{} (line {}, stream {})", op_name(op.kind), op.loc.line, s);
}

std::string Engine::wait_fix(int inst, int ychain) const {
  const Instance& h = insts_[static_cast<std::size_t>(inst)];
  if (h.name < 0) return fmt::format("end the batched group {} before this op", p_.name(op_at(h.op).attrs.group));
  if (h.wait_event >= 0 && ychain >= 0 && events_[static_cast<std::size_t>(h.wait_event)].chain != ychain)
    return fmt::format("move the {} of {} (line {}) to stream {}, before this op (a Wait orders only the stream it runs on)", op_name(op_at(h.wait_op).kind),
                       p_.name(h.name), op_at(h.wait_op).loc.line, stream_name(ychain));
  return fmt::format("insert {{op: Wait, handle: {}}} before this op", p_.name(h.name));
}

// The Waits on y's stream between x's issue and y: evidence of a Wait on the wrong handle or stream.
void Engine::wait_notes(const Access& x, const Access& y, std::vector<Note>& notes) const {
  const Instance& h = insts_[static_cast<std::size_t>(x.inst)];
  if (h.name < 0) return;
  int ychain = events_[static_cast<std::size_t>(y.event)].chain;
  if (h.wait_event >= 0 && events_[static_cast<std::size_t>(h.wait_event)].chain != ychain && h.wait_event < y.event)
    notes.push_back({op_at(h.wait_op).loc, fmt::format("Wait({}) is here, on stream {}, which does not order stream {}", p_.name(h.name),
                                                       stream_name(events_[static_cast<std::size_t>(h.wait_event)].chain), stream_name(ychain))});
  for (auto it = waits_.rbegin(); it != waits_.rend(); ++it) {
    auto [wev, wop] = *it;
    if (wev >= y.event) continue;
    if (wev <= x.event) break;
    if (events_[static_cast<std::size_t>(wev)].chain != ychain) continue;
    const Op& w = op_at(wop);
    std::string which = w.kind == OpKind::Wait ? p_.name(w.attrs.handle) : "its handles";
    if (which == p_.name(h.name)) continue;  // an earlier use of the same handle name
    notes.push_back({w.loc, fmt::format("this {} completes {}, not {}", op_name(w.kind), which, p_.name(h.name))});
    break;
  }
}

void Engine::report(int r, NameId buf, const Access& x, const Access& y, const Op& yop) {
  const Op& xop = op_of(x.event);
  std::string b = p_.name(buf);
  std::string ystream = stream_name(events_[static_cast<std::size_t>(y.event)].chain);
  const char* yverb = y.write ? "writes" : "reads";
  std::vector<Note> notes;
  CheckId id;
  std::string msg, wait_yaml;
  std::uint32_t wait_from = 0, wait_all = 0;  // the line of a later Wait to move up, of a later WaitAll of the handle
  if (x.inst >= 0 && x.write && y.inst >= 0 && y.write) {
    id = CheckId::BufferAliasing;
    msg = fmt::format("{} ({}) writes {} while {} may still be writing it: two in-flight async ops write one buffer", op_name(yop.kind),
                      insts_[static_cast<std::size_t>(y.inst)].name >= 0 ? "handle " + inst_name(y.inst) : inst_name(y.inst), b, describe(x));
    notes.push_back({xop.loc, fmt::format("{} is written asynchronously here", b)});
    notes.push_back({yop.loc, fmt::format("fix: write into a separate buffer, or {}", wait_fix(x.inst, events_[static_cast<std::size_t>(y.event)].chain))});
  } else if (x.inst >= 0 && x.write) {
    id = CheckId::MissingWait;
    msg = insts_[static_cast<std::size_t>(x.inst)].name >= 0
              ? fmt::format("{} {} {} on stream {}, but {} may still be writing it: no Wait({}) on stream {} before this {}", op_name(yop.kind), yverb, b,
                            ystream, describe(x), inst_name(x.inst), ystream, y.write ? "write" : "read")
              : fmt::format("{} {} {} on stream {}, but {} may still be writing it: the end of {} does not order stream {} before this {}",
                            op_name(yop.kind), yverb, b, ystream, describe(x), inst_name(x.inst), ystream, y.write ? "write" : "read");
    notes.push_back({xop.loc, fmt::format("{} is written asynchronously here ({})", b,
                                          insts_[static_cast<std::size_t>(x.inst)].name >= 0 ? "handle " + inst_name(x.inst) : inst_name(x.inst))});
    wait_notes(x, y, notes);
    const Instance& h = insts_[static_cast<std::size_t>(x.inst)];
    int ychain = events_[static_cast<std::size_t>(y.event)].chain;
    bool moved = h.wait_event >= 0 && events_[static_cast<std::size_t>(h.wait_event)].chain != ychain;
    if (h.name >= 0 && !moved)
      wait_yaml = fmt::format("{{op: Wait, handle: {}{}}}", p_.name(h.name), ystream == "compute" ? "" : fmt::format(", stream: {}", ystream));
    // a later Wait of this handle on this stream: moving it up is the fix (a second Wait would be invalid-wait)
    if (!wait_yaml.empty())
      for (std::uint32_t j = static_cast<std::uint32_t>(&yop - p_.ops.data()) + 1; j < ranks_[static_cast<std::size_t>(r)].end; ++j) {
        const Op& w = op_at(static_cast<int>(j));
        if (w.kind == OpKind::WaitAll && w.attrs.handles != kNoIndex) {
          const auto& hs = p_.name_lists[w.attrs.handles];
          if (std::find(hs.begin(), hs.end(), h.name) != hs.end()) {
            wait_all = w.loc.line;
            break;
          }
        }
        if (w.attrs.handle != h.name) continue;
        if (w.kind == OpKind::Wait && (w.attrs.stream >= 0 ? p_.name(w.attrs.stream) : std::string("compute")) == ystream) wait_from = w.loc.line;
        break;
      }
    const Buffer& bb = buffer(r, buf);
    if (!y.write && h.name >= 0 && bb.unread_over >= 0 && bb.last_write && bb.last_write->event == x.event && yop.kind != OpKind::OverlapRegion) {
      // The async write replaced a value no op read yet, and this read comes before its Wait: the read is meant
      // for the value it overwrote (a prefetch into the buffer the current layer still reads). A Wait before
      // the read would hand it the prefetched value: the write-after-read on the buffer is the bug.
      const Op& old = op_of(bb.unread_over);
      msg = fmt::format("{} reads {}, but {} overwrites it before this read: the value {} wrote at line {} is never read, so this read, meant for it, "
                        "gets the new one once the write lands (a write-after-read on {}: the buffer is reused while its reader still needs it)",
                        op_name(yop.kind), b, describe(x), op_name(old.kind), old.loc.line, b);
      notes.push_back({old.loc, fmt::format("the value this read needs is written here, and nothing reads it before line {} overwrites {}", xop.loc.line, b)});
      std::size_t yi = static_cast<std::size_t>(&yop - p_.ops.data());
      bool next = yi + 1 < ranks_[static_cast<std::size_t>(r)].end;
      notes.push_back({yop.loc, fmt::format("fix: give the {} at line {} a second buffer (`out: {}_next`, read by the ops after its Wait), or wait "
                                            "for the reader: move it after this op",
                                            op_name(xop.kind), xop.loc.line, b)});
      Diagnostic d = diag(id, yop, static_cast<int>(yi), std::move(msg));
      d.tensor = b;
      if (next) d.fix = {FixKind::Move, static_cast<int>(yi), op_at(static_cast<int>(yi) + 1).loc.line, "", print_op(p_, xop), xop.loc.line};
      d.notes = std::move(notes);
      local(std::move(d), r);
      return;
    }
    if (yop.kind == OpKind::OverlapRegion) {
      // the region overlaps the op that writes what it reads: a Wait before it would leave nothing to overlap
      wait_yaml.clear();
      notes.push_back({yop.loc, fmt::format("fix: do not read {} in a region that overlaps the op writing it: read it after the Wait of {}", b,
                                            inst_name(x.inst))});
    } else if (wait_all) {
      notes.push_back({yop.loc, fmt::format("fix: insert {} before this op and drop {} from the WaitAll at line {}", wait_yaml, p_.name(h.name), wait_all)});
      wait_yaml.clear();  // two edits: no machine-readable form
    } else {
      notes.push_back({yop.loc, wait_from ? fmt::format("fix: move the {} at line {} before this op", wait_yaml, wait_from)
                                : !wait_yaml.empty() ? fmt::format("fix: insert {} before this op", wait_yaml)
                                                     : "fix: " + wait_fix(x.inst, ychain)});
    }
  } else {
    id = CheckId::DataRace;
    std::string xverb = x.write ? "writes" : "reads";
    if (x.inst >= 0) {
      msg = fmt::format("{} {} {} on stream {} while {} may still read it: the input of an in-flight async op is overwritten (no Wait({}) "
                        "orders them)",
                        op_name(yop.kind), yverb, b, ystream, describe(x), inst_name(x.inst));
      notes.push_back({xop.loc, fmt::format("{} is read asynchronously from here until Wait({})", b, inst_name(x.inst))});
      wait_notes(x, y, notes);
      notes.push_back({yop.loc, fmt::format("fix: {}, or write into a fresh buffer", wait_fix(x.inst, events_[static_cast<std::size_t>(y.event)].chain))});
    } else {
      msg = fmt::format("{} {} {} on stream {}, and {} {} it, with no happens-before order between them", op_name(yop.kind), yverb, b, ystream,
                        describe(x), xverb);
      notes.push_back({xop.loc, fmt::format("the other access ({} {})", xverb, b)});
      std::string xstream = stream_name(events_[static_cast<std::size_t>(x.event)].chain);
      notes.push_back({yop.loc, fmt::format("fix: order the streams: insert {{op: WaitStream{}, for: {}}} before this op (or a RecordEvent on {} "
                                            "after the other access and a WaitEvent here), or move both ops to one stream",
                                            ystream == "compute" ? "" : ", stream: " + ystream, xstream, xstream)});
    }
  }
  Diagnostic d = diag(id, yop, static_cast<int>(&yop - p_.ops.data()), std::move(msg));
  d.tensor = b;
  if (!wait_yaml.empty()) d.fix = {wait_from ? FixKind::Move : FixKind::InsertBefore, d.op, yop.loc.line, "", wait_yaml, wait_from};
  d.notes = std::move(notes);
  local(std::move(d), r);
}

}  // namespace spmd::temporal_detail
