// temporal/temporal.cpp - events, vector clocks and the access checks for async ops and streams.
#include "temporal/temporal.h"

#include <boost/graph/adjacency_list.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <optional>
#include <span>
#include <ostream>
#include <unordered_map>

namespace spmd {

namespace {

// One op of the representative rank becomes one event on its stream (chain).
struct Event {
  int op;                  // op index
  int chain;               // stream index
  std::uint32_t stamp;     // position on its chain (1-based)
  std::vector<std::uint32_t> vc;
};

struct Access {
  int event;               // the event at which the access starts (the issue of an async op)
  int handle = -1;         // async: the handle instance whose Wait ends the access; -1 for a synchronous access
  bool write;
};

// One issue of an async op. A handle name may be reused once waited, so accesses refer to instances.
struct HandleState {
  int issue_event;         // the async op's issue event
  int wait_event = -1;     // the first Wait of it, once seen
  int wait_op = -1;
  NameId name;
  bool reported = false;   // already reported as orphaned (reused while unwaited)
};

using Graph = boost::adjacency_list<boost::vecS, boost::vecS, boost::directedS>;

class Engine {
 public:
  explicit Engine(const Program& p) : p_(p), compute_(default_stream(p, "compute", -2)), comm_(default_stream(p, "comm", -3)) {}

  void run() {
    buffers_.resize(p_.names.size());
    for (std::size_t i = 0; i < p_.ops.size(); ++i) step(static_cast<int>(i));
    for (const auto& h : handles_) {
      if (h.wait_event >= 0 || h.reported) continue;
      const Op& op = p_.ops[static_cast<std::size_t>(events_[static_cast<std::size_t>(h.issue_event)].op)];
      Diagnostic d = diag(CheckId::OrphanedHandle, op, events_[static_cast<std::size_t>(h.issue_event)].op,
                          fmt::format("{} returns handle {}, which is never waited: the op may still be running when the program ends and "
                                      "nothing after it is ordered with it",
                                      op_name(op.kind), p_.name(h.name)));
      d.notes.push_back({op.loc, fmt::format("fix: insert {{op: Wait, handle: {}}} before the first use of its result", p_.name(h.name))});
      diags_.push_back(std::move(d));
    }
  }

  std::vector<Diagnostic> take() {
    sort_and_cap(diags_, diags_.size());
    return std::move(diags_);
  }

  const Graph& graph() const { return graph_; }
  const std::vector<Event>& events() const { return events_; }
  const std::vector<NameId>& chains() const { return chain_names_; }

 private:
  int chain_of(NameId stream) {
    auto it = chain_index_.find(stream);
    if (it != chain_index_.end()) return it->second;
    int c = static_cast<int>(chain_names_.size());
    chain_index_.emplace(stream, c);
    chain_names_.push_back(stream);
    last_.push_back(-1);
    for (auto& e : events_) e.vc.resize(chain_names_.size(), 0);  // rare: a stream appears for the first time
    return c;
  }

  // A new event on `chain`, after `preds` (and the previous event on the chain).
  int add_event(int op, int chain, std::span<const int> preds = {}) {
    Event e;
    e.op = op;
    e.chain = chain;
    e.vc.assign(chain_names_.size(), 0);
    auto join = [&](int x) {
      if (x < 0) return;
      const auto& v = events_[static_cast<std::size_t>(x)].vc;
      for (std::size_t k = 0; k < v.size(); ++k) e.vc[k] = std::max(e.vc[k], v[k]);
    };
    int prev = last_[static_cast<std::size_t>(chain)];
    join(prev);
    for (int x : preds) join(x);
    e.stamp = ++e.vc[static_cast<std::size_t>(chain)];
    int id = static_cast<int>(events_.size());
    events_.push_back(std::move(e));
    boost::add_vertex(graph_);
    if (prev >= 0) boost::add_edge(static_cast<std::size_t>(prev), static_cast<std::size_t>(id), graph_);
    for (int x : preds)
      if (x >= 0 && x != prev) boost::add_edge(static_cast<std::size_t>(x), static_cast<std::size_t>(id), graph_);
    last_[static_cast<std::size_t>(chain)] = id;
    return id;
  }

  // a happens before b (or is b).
  bool hb(int a, int b) const {
    const Event& ea = events_[static_cast<std::size_t>(a)];
    return events_[static_cast<std::size_t>(b)].vc[static_cast<std::size_t>(ea.chain)] >= ea.stamp;
  }

  // The access x has ended before the access (or event) starting at y begins.
  bool ended_before(const Access& x, int y) const {
    if (x.handle < 0) return hb(x.event, y);
    const HandleState& h = handles_[static_cast<std::size_t>(x.handle)];
    return h.wait_event >= 0 && hb(h.wait_event, y);
  }

  Diagnostic diag(CheckId id, const Op& op, int op_index, std::string msg) const {
    Diagnostic d;
    d.id = id;
    d.loc = op.loc;
    d.op = op_index;
    d.message = std::move(msg);
    return d;
  }

  std::string stream_name(int chain) const {
    NameId id = chain_names_[static_cast<std::size_t>(chain)];
    return id == -2 ? "compute" : id == -3 ? "comm" : p_.name(id);
  }
 public:
  std::string chain_label(int chain) const { return stream_name(chain); }
 private:
  const Op& op_of(int event) const { return p_.ops[static_cast<std::size_t>(events_[static_cast<std::size_t>(event)].op)]; }

  bool is_async(const Op& op) const { return op.attrs.handle >= 0 && op.kind != OpKind::Wait; }

  void step(int i) {
    const Op& op = p_.ops[static_cast<std::size_t>(i)];
    bool async = is_async(op);
    NameId stream = op.attrs.stream >= 0 ? op.attrs.stream : async ? comm_ : compute_;
    int chain = chain_of(stream);
    if (op.kind == OpKind::Wait || op.kind == OpKind::WaitAll) return wait(op, i, chain);
    int ev;
    if (async) {
      // Issued from the program's default stream: everything before it there happens before its start.
      int calling = last_[static_cast<std::size_t>(chain_of(compute_))];
      ev = add_event(i, chain, std::span<const int>(&calling, 1));
      auto live = live_.find(op.attrs.handle);
      if (live != live_.end() && handles_[static_cast<std::size_t>(live->second)].wait_event < 0) {
        HandleState& old = handles_[static_cast<std::size_t>(live->second)];
        old.reported = true;
        Diagnostic d = diag(CheckId::OrphanedHandle, op, i,
                            fmt::format("{} reuses handle {} while the op that returned it (line {}) was never waited", op_name(op.kind),
                                        p_.name(op.attrs.handle), op_of(old.issue_event).loc.line));
        d.notes.push_back({op_of(old.issue_event).loc, fmt::format("handle {} first returned here", p_.name(op.attrs.handle))});
        diags_.push_back(std::move(d));
      }
      live_[op.attrs.handle] = static_cast<int>(handles_.size());
      handles_.push_back({ev, -1, -1, op.attrs.handle});
    } else {
      ev = add_event(i, chain);
    }
    int h = async ? live_[op.attrs.handle] : -1;
    for (NameId n : p_.ins(op)) access(n, {ev, h, false}, i);
    for (NameId n : p_.outs(op)) access(n, {ev, h, true}, i);
  }

  void wait(const Op& op, int i, int chain) {
    std::vector<NameId> hs;
    if (op.kind == OpKind::Wait) hs.push_back(op.attrs.handle);
    else hs = p_.name_lists[op.attrs.handles];
    std::vector<int> preds, done;  // issue events to order after; the handle instances this Wait completes
    for (NameId h : hs) {
      auto it = live_.find(h);
      if (it == live_.end()) {
        std::vector<std::string> known;
        for (const auto& [id, inst] : live_) known.push_back(p_.name(id));
        auto best = did_you_mean(p_.name(h), known);
        diags_.push_back(diag(CheckId::InvalidWait, op, i,
                              fmt::format("{} of handle {}, which no earlier op returned{}", op_name(op.kind), p_.name(h),
                                          best ? fmt::format("; did you mean {}?", *best) : "")));
        continue;
      }
      const HandleState& st = handles_[static_cast<std::size_t>(it->second)];
      if (st.wait_event >= 0 || std::find(done.begin(), done.end(), it->second) != done.end()) {
        Diagnostic d = diag(CheckId::InvalidWait, op, i, fmt::format("{} of handle {}, which was already waited", op_name(op.kind), p_.name(h)));
        d.notes.push_back({p_.ops[static_cast<std::size_t>(st.wait_event >= 0 ? st.wait_op : i)].loc, fmt::format("handle {} was waited here", p_.name(h))});
        diags_.push_back(std::move(d));
        continue;
      }
      preds.push_back(st.issue_event);
      done.push_back(it->second);
    }
    int ev = add_event(i, chain, preds);
    for (int inst : done) {
      handles_[static_cast<std::size_t>(inst)].wait_event = ev;
      handles_[static_cast<std::size_t>(inst)].wait_op = i;
    }
    waits_on_chain_.push_back({ev, i});
  }

  // Checks the access y against the buffer's earlier accesses, then records it.
  void access(NameId buf, Access y, int op_index) {
    auto& b = buffers_[static_cast<std::size_t>(buf)];
    // Accesses of one op (an in-place op reads and writes its buffer) never conflict with each other.
    if (b.last_write && b.last_write->event != y.event && !ended_before(*b.last_write, y.event)) report(buf, *b.last_write, y, op_index);
    if (y.write)
      for (const auto& r : b.reads)
        if (r.event != y.event && !ended_before(r, y.event)) report(buf, r, y, op_index);
    if (y.write) {
      b.last_write = y;
      b.reads.clear();
    } else {
      // Keep one synchronous read per stream (later ones dominate earlier ones) and every async read.
      int chain = events_[static_cast<std::size_t>(y.event)].chain;
      if (y.handle < 0)
        b.reads.erase(std::remove_if(b.reads.begin(), b.reads.end(),
                                     [&](const Access& r) { return r.handle < 0 && events_[static_cast<std::size_t>(r.event)].chain == chain; }),
                      b.reads.end());
      b.reads.push_back(y);
    }
  }

  std::string describe(const Access& a) const {
    const Event& e = events_[static_cast<std::size_t>(a.event)];
    const Op& op = op_of(a.event);
    if (a.handle >= 0)
      return fmt::format("{} (line {}, handle {}, stream {})", op_name(op.kind), op.loc.line, handle_name(a), stream_name(e.chain));
    return fmt::format("{} (line {}, stream {})", op_name(op.kind), op.loc.line, stream_name(e.chain));
  }

  std::string handle_name(const Access& a) const { return p_.name(handles_[static_cast<std::size_t>(a.handle)].name); }

  // The Waits on y's stream between x's issue and y: evidence of a Wait on the wrong handle or stream.
  void wait_notes(const Access& x, const Access& y, std::vector<Note>& notes) const {
    const HandleState& h = handles_[static_cast<std::size_t>(x.handle)];
    int ychain = events_[static_cast<std::size_t>(y.event)].chain;
    if (h.wait_event >= 0 && events_[static_cast<std::size_t>(h.wait_event)].chain != ychain && h.wait_event < y.event)
      notes.push_back({p_.ops[static_cast<std::size_t>(h.wait_op)].loc,
                       fmt::format("Wait({}) is here, on stream {}, which does not order stream {}", handle_name(x),
                                   stream_name(events_[static_cast<std::size_t>(h.wait_event)].chain), stream_name(ychain))});
    for (auto it = waits_on_chain_.rbegin(); it != waits_on_chain_.rend(); ++it) {
      auto [wev, wop] = *it;
      if (wev >= y.event || wev <= x.event || wev < 0) continue;
      if (events_[static_cast<std::size_t>(wev)].chain != ychain) continue;
      const Op& w = p_.ops[static_cast<std::size_t>(wop)];
      std::string which = w.kind == OpKind::Wait ? p_.name(w.attrs.handle) : "its handles";
      if (which == handle_name(x)) continue;  // an earlier use of the same handle name
      notes.push_back({w.loc, fmt::format("this {} completes {}, not {}", op_name(w.kind), which, handle_name(x))});
      break;
    }
  }

  void report(NameId buf, const Access& x, const Access& y, int op_index) {
    const Op& yop = p_.ops[static_cast<std::size_t>(op_index)];
    const Op& xop = op_of(x.event);
    std::string b = p_.name(buf);
    std::string ystream = stream_name(events_[static_cast<std::size_t>(y.event)].chain);
    const char* yverb = y.write ? "writes" : "reads";
    std::vector<Note> notes;
    CheckId id;
    std::string msg;
    if (x.handle >= 0 && x.write && y.handle >= 0 && y.write) {
      id = CheckId::BufferAliasing;
      msg = fmt::format("{} (handle {}) writes {} while {} may still be writing it: two in-flight async ops write one buffer", op_name(yop.kind),
                        handle_name(y), b, describe(x));
      notes.push_back({xop.loc, fmt::format("{} is written asynchronously here", b)});
      notes.push_back({yop.loc, fmt::format("fix: write into a separate buffer, or insert {{op: Wait, handle: {}}} before this op", handle_name(x))});
    } else if (x.handle >= 0 && x.write) {
      id = CheckId::MissingWait;
      msg = fmt::format("{} {} {} on stream {}, but {} may still be writing it: no Wait({}) on stream {} before this {}", op_name(yop.kind), yverb, b,
                        ystream, describe(x), handle_name(x), ystream, y.write ? "write" : "read");
      notes.push_back({xop.loc, fmt::format("{} is written asynchronously here (handle {})", b, handle_name(x))});
      wait_notes(x, y, notes);
      notes.push_back({yop.loc, fmt::format("fix: insert {{op: Wait, handle: {}{}}} before this op", handle_name(x),
                                            ystream == "compute" ? "" : fmt::format(", stream: {}", ystream))});
    } else {
      id = CheckId::DataRace;
      std::string xverb = x.write ? "writes" : "reads";
      if (x.handle >= 0) {
        msg = fmt::format("{} {} {} on stream {} while {} may still read it: the input of an in-flight async op is overwritten (no Wait({}) "
                          "orders them)",
                          op_name(yop.kind), yverb, b, ystream, describe(x), handle_name(x));
        notes.push_back({xop.loc, fmt::format("{} is read asynchronously from here until Wait({})", b, handle_name(x))});
        wait_notes(x, y, notes);
        notes.push_back({yop.loc, fmt::format("fix: insert {{op: Wait, handle: {}}} before this op, or write into a fresh buffer", handle_name(x))});
      } else {
        msg = fmt::format("{} {} {} on stream {}, and {} {} it, with no happens-before order between them", op_name(yop.kind), yverb, b, ystream,
                          describe(x), xverb);
        notes.push_back({xop.loc, fmt::format("the other access ({} {})", xverb, b)});
        notes.push_back({yop.loc, "fix: order the streams: move both ops to one stream, or wait for the other stream's work (an async op's "
                                  "handle) before this op"});
      }
    }
    Diagnostic d = diag(id, yop, op_index, std::move(msg));
    d.tensor = b;
    d.notes = std::move(notes);
    diags_.push_back(std::move(d));
  }

  struct Buffer {
    std::optional<Access> last_write;
    std::vector<Access> reads;
  };

  // The default streams: the program's own name when it mentions them, else a reserved negative id.
  static NameId default_stream(const Program& p, const std::string& name, NameId reserved) {
    auto it = p.name_ids.find(name);
    return it == p.name_ids.end() ? reserved : it->second;
  }

  const Program& p_;
  NameId compute_, comm_;
  std::vector<Event> events_;
  std::vector<int> last_;  // last event per chain
  std::unordered_map<NameId, int> chain_index_;
  std::vector<NameId> chain_names_;
  std::vector<HandleState> handles_;          // every issue of an async op, in order
  std::unordered_map<NameId, int> live_;      // handle name -> its latest instance
  std::vector<std::pair<int, int>> waits_on_chain_;  // (event, op) of every Wait, in order
  std::vector<Buffer> buffers_;
  Graph graph_;
  std::vector<Diagnostic> diags_;
};

}  // namespace

namespace {

void dot_graph(const Program& program, const Engine& e, std::ostream& out) {
  const auto& ev = e.events();
  out << "digraph hb {\n  rankdir=TB;\n  node [shape=box, fontname=\"monospace\"];\n";
  for (std::size_t c = 0; c < e.chains().size(); ++c) {
    out << "  subgraph cluster_" << c << " {\n    label=\"rank 0 / stream " << e.chain_label(static_cast<int>(c)) << "\";\n";
    for (std::size_t i = 0; i < ev.size(); ++i) {
      if (static_cast<std::size_t>(ev[i].chain) != c) continue;
      const Op& op = program.ops[static_cast<std::size_t>(ev[i].op)];
      std::string label = std::string(op_name(op.kind));
      if (op.attrs.handle >= 0) label += " (" + program.name(op.attrs.handle) + ")";
      out << "    e" << i << " [label=\"" << label << "\\nline " << op.loc.line << "\"];\n";
    }
    out << "  }\n";
  }
  auto [it, end] = boost::edges(e.graph());
  for (; it != end; ++it) out << "  e" << boost::source(*it, e.graph()) << " -> e" << boost::target(*it, e.graph()) << ";\n";
  out << "}\n";
}

}  // namespace

std::vector<Diagnostic> check_temporal(const Program& program, const TemporalOptions& options) {
  Engine e(program);
  e.run();
  if (options.dot) dot_graph(program, e, *options.dot);
  return e.take();
}

void write_hb_dot(const Program& program, std::ostream& out) { check_temporal(program, {&out}); }

}  // namespace spmd
