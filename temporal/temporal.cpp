// temporal/temporal.cpp - the rank simulation, vector clocks, access checks, matching and deadlocks.
#include "temporal/temporal.h"

#include <boost/container/small_vector.hpp>
#include <boost/graph/adjacency_list.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <deque>
#include <map>
#include <optional>
#include <ostream>
#include <set>
#include <span>
#include <unordered_map>

#include "ir/ranks.h"

namespace spmd {

namespace {

// A vector clock over a window of chains [lo, lo + v.size()): components outside it are 0. Chains are
// numbered rank by rank (compute, then comm, of each rank first), so a pipeline stage or a ring member
// that hears of its neighbours only keeps a short window, and one that hears of every rank a dense array.
struct VC {
  int lo = 0;
  std::vector<std::uint32_t> v;
  bool empty() const { return v.empty(); }
  void swap(VC& o) {
    std::swap(lo, o.lo);
    v.swap(o.v);
  }
  std::uint32_t get(int chain) const {
    std::int64_t k = std::int64_t{chain} - lo;
    return k >= 0 && k < static_cast<std::int64_t>(v.size()) ? v[static_cast<std::size_t>(k)] : 0;
  }
  // Widens the window to hold [a, b).
  void cover(int a, int b) {
    if (v.empty()) {
      lo = a;
      v.assign(static_cast<std::size_t>(b - a), 0);
      return;
    }
    int hi = lo + static_cast<int>(v.size());
    if (a >= lo && b <= hi) return;
    int nlo = std::min(a, lo), nhi = std::max(b, hi);
    std::vector<std::uint32_t> n(static_cast<std::size_t>(nhi - nlo), 0);
    std::copy(v.begin(), v.end(), n.begin() + (lo - nlo));
    v.swap(n);
    lo = nlo;
  }
  void set(int chain, std::uint32_t x) {
    cover(chain, chain + 1);
    v[static_cast<std::size_t>(chain - lo)] = x;
  }
};

void join(VC& into, const VC& x) {
  if (x.v.empty()) return;
  into.cover(x.lo, x.lo + static_cast<int>(x.v.size()));
  std::uint32_t* d = into.v.data() + (x.lo - into.lo);
  for (std::size_t k = 0; k < x.v.size(); ++k) d[k] = std::max(d[k], x.v[k]);
}

enum class EventKind : std::uint8_t { Op, GroupEnd, Hub };

// One op of one rank on one of its streams (chain). Clocks live on the chains and on the
// communication records that need them, not on every event: an event is (chain, stamp).
struct Event {
  int op;
  int chain;              // -1 for a collective hub (drawing only)
  std::uint32_t stamp;
  EventKind kind = EventKind::Op;
};

struct Access {
  int event;              // the event at which the access starts (the issue of an async op)
  int inst = -1;          // async: the instance whose Wait ends the access; -1 for a synchronous access
  bool write;
};

enum class EpKind : std::uint8_t { Collective, Send, Recv, Local };

// One rank's part in a collective or a point-to-point transfer.
struct Endpoint {
  int rank, op;
  int inst = -1;           // the async instance it completes; -1: a synchronous op (its rank blocks on it)
  EpKind kind;
  int peer = -1;           // point-to-point partner
  std::int64_t slot = -1;  // collective: (group, sequence number); point-to-point: its channel
  int seq = 0;             // its number in its group (collective) or in its channel's sends or receives (point-to-point)
  VC vc;                   // the clock when issued
  int event = -1;          // the event that stands for it in the graph
  int channel = -1;        // point-to-point: index of its (src, dst) channel
  int chain = -1;          // the serialized stream it runs on (-1: `comm`, where ops do not wait for each other)
  std::int64_t unit = -1;  // ops of one unit start together on their stream (a batched group); else its own index
  bool posted = false;     // reached the network (on a serialized stream: once the ops before it completed)
  bool complete = false;
  bool barrier = false;    // a WaitStream / WaitEvent on a serialized stream: completes once what it waits for did
};

// One issue of an async op (or an implicit one: a synchronous member of a batched group).
struct Instance {
  int rank;
  NameId name;             // -1: implicit (batched group member)
  int op;
  int issue_event;
  int ep = -1;             // its endpoint; -1: completes at once
  VC done_vc{};            // what a Wait of it joins
  bool complete = false;
  int wait_event = -1, wait_op = -1;
  bool reported = false;   // already reported as orphaned (reused while unwaited)
};

struct Slot {
  std::vector<int> eps;
  VC vc;
};

struct Buffer {
  std::optional<Access> last_write;
  boost::container::small_vector<Access, 2> reads;  // most buffers are read once or twice
};

// A (rank, stream). Every stream but `comm` runs its communication one op after another, as a GPU
// stream does: an op starts once the unit before it completed (`running`, `queue`).
struct Chain {
  int rank;
  NameId stream;
  VC vc;
  std::uint32_t stamp = 0;    // its own component
  int last = -1;
  std::vector<int> running;   // endpoints of the unit now running, not yet complete
  std::int64_t unit = -1;     // that unit
  std::deque<int> queue;      // endpoints waiting for it
  bool draining = false;
};

// Sends and receives of one (src, dst) pair, by their number in issue order (-1: not posted yet).
struct Channel {
  std::vector<int> sends, recvs;
  int n_sends = 0, n_recvs = 0;  // issued so far
};

struct Rank {
  std::uint32_t pc = 0, end = 0;
  bool done = false, blocked = false;
  int sync_ep = -1;                   // blocked on this synchronous op
  std::vector<int> waiting;           // blocked on these instances (Wait, WaitAll, the end of a batched group)
  std::vector<int> wait_insts;        // every instance the pending Wait completes
  int wait_op = -1;                   // the Wait / WaitAll (or the last member of the group)
  int wait_chain = -1;
  bool group_end = false;             // the pending wait is the end of a batched group
  std::vector<std::pair<NameId, int>> chains;  // stream -> chain (a rank has a few streams)
  std::unordered_map<NameId, int> live;        // handle name -> its latest instance
  std::unordered_map<std::int64_t, int> seq;   // collective group -> next sequence number
  NameId group = -1;                           // the open batched group
  std::vector<int> group_insts;
  int group_last_op = -1;
  std::int64_t group_unit = -1;                // the open batched group's unit on serialized streams
  struct Record {
    int event;
    VC vc;
    std::vector<int> pending;  // communication not yet complete on the recorded stream at that point
  };
  std::unordered_map<NameId, Record> events;   // CUDA event name -> its latest RecordEvent
};

using Graph = boost::adjacency_list<boost::vecS, boost::vecS, boost::directedS>;

constexpr NameId kCompute = -2, kComm = -3;
constexpr std::int64_t kGroupUnits = std::int64_t{1} << 40;  // units of batched groups (other units are endpoint indices)

class Engine {
 public:
  Engine(const Program& p, const TemporalOptions& o)
      : p_(p), space_(make_rank_space(p)), compute_(default_stream(p, "compute", kCompute)), comm_(default_stream(p, "comm", kComm)) {
    model_ = o.p2p_model ? *o.p2p_model : p.p2p_model;
    for (int a : space_.axes) relevant_ |= 1u << a;
    multi_ = space_.count() > 1;
  }

  void run() {
    events_.reserve(p_.ops.size() + 16);
    edges_.reserve(2 * p_.ops.size() + 16);
    bufs_.reserve(p_.ops.size() + 16);
    eps_.reserve(p_.ops.size() / 2 + 16);
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

  std::vector<Diagnostic> take() {
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

  // The happens-before graph (program order, issue, completion -> Wait, Send -> Recv, collective
  // hubs) as a Boost.Graph adjacency list; built on request (the checks use the clocks).
  Graph graph() const {
    Graph g(events_.size());
    for (auto [a, b] : edges_) boost::add_edge(static_cast<std::size_t>(a), static_cast<std::size_t>(b), g);
    return g;
  }
  const std::vector<Event>& events() const { return events_; }
  const std::vector<Chain>& chains() const { return chains_; }
  std::string rank_label(int r) const { return space_.label(p_, r); }
  std::string stream_name(int chain) const {
    NameId id = chains_[static_cast<std::size_t>(chain)].stream;
    return id == kCompute ? "compute" : id == kComm ? "comm" : p_.name(id);
  }
  std::string hub_label(int event) const { return hubs_.count(event) ? hubs_.at(event) : "collective"; }

 private:
  // ---- static matching ----------------------------------------------------------------------
  std::string axes_str(std::uint32_t mask) const {
    std::string s;
    for (int a = 0; a < p_.axis_count(); ++a)
      if (mask & (1u << a)) s += (s.empty() ? "" : ", ") + p_.mesh[static_cast<std::size_t>(a)].name;
    return s;
  }
  std::string coll_str(const Op& op) const {
    std::string s = fmt::format("{} over {}", op_name(op.kind), axes_str(op.attrs.axes));
    if (op.kind == OpKind::AllReduce || op.kind == OpKind::ReduceScatter || op.kind == OpKind::Reduce)
      s += fmt::format(" ({})", reduce_name(op.attrs.rop));
    if (op.kind == OpKind::Broadcast || op.kind == OpKind::Scatter) s += fmt::format(" (src {})", std::max(0, op.attrs.rank));
    if (op.kind == OpKind::Reduce || op.kind == OpKind::Gather) s += fmt::format(" (dst {})", std::max(0, op.attrs.rank));
    return s;
  }
  std::string lbl(int r) const { return space_.label(p_, r); }
  // What a collective combines across ranks: its `matches:` name (the logical tensor), else its input's name.
  NameId identity(const Op& op) const { return op.attrs.matches >= 0 ? op.attrs.matches : p_.ins(op)[0]; }
  std::string identity_str(const Op& op) const {
    NameId in = p_.ins(op)[0];
    return op.attrs.matches >= 0 && op.attrs.matches != in ? fmt::format("{} (matches: {})", p_.name(in), p_.name(op.attrs.matches)) : p_.name(in);
  }

  void static_matching() {
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

  // ---- events and clocks ------------------------------------------------------------------
  int chain_of(int r, NameId stream) {
    Rank& R = ranks_[static_cast<std::size_t>(r)];
    for (auto [s, c] : R.chains)
      if (s == stream) return c;
    int c = static_cast<int>(chains_.size());
    R.chains.emplace_back(stream, c);
    chains_.push_back({r, stream, {}, 0, -1, {}, -1, {}, false});
    return c;
  }

  // A new event on `chain` after the chain's previous event, joining `extra` (clocks of other events).
  int add_event(int op, int chain, const VC* extra = nullptr, std::span<const int> from = {}, EventKind kind = EventKind::Op) {
    Chain& ch = chains_[static_cast<std::size_t>(chain)];
    if (extra) join(ch.vc, *extra);
    std::uint32_t stamp = ++ch.stamp;
    ch.vc.set(chain, stamp);
    int id = static_cast<int>(events_.size());
    events_.push_back({op, chain, stamp, kind});
    if (ch.last >= 0) edges_.push_back({ch.last, id});
    for (int x : from)
      if (x >= 0 && x != ch.last) edges_.push_back({x, id});
    ch.last = id;
    return id;
  }

  // a happens before b, where b is the latest event of its chain (every query is made right then).
  bool hb(int a, int b) const {
    const Event& ea = events_[static_cast<std::size_t>(a)];
    const VC& v = chains_[static_cast<std::size_t>(events_[static_cast<std::size_t>(b)].chain)].vc;
    return v.get(ea.chain) >= ea.stamp;
  }

  bool ended_before(const Access& x, int y) const {
    if (x.inst < 0) return hb(x.event, y);
    const Instance& h = insts_[static_cast<std::size_t>(x.inst)];
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

  // A finding about one rank's own order: merged across ranks running the same program.
  void local(Diagnostic d, int r) {
    std::string key = fmt::format("{}:{}:{}:{}", static_cast<int>(d.id), d.loc.line, d.loc.col, d.message);
    auto it = local_.find(key);
    if (it == local_.end()) local_.emplace(key, std::make_pair(std::move(d), std::vector<int>{r}));
    else if (it->second.second.back() != r) it->second.second.push_back(r);
  }

  const Op& op_at(int i) const { return p_.ops[static_cast<std::size_t>(i)]; }
  const Op& op_of(int event) const { return op_at(events_[static_cast<std::size_t>(event)].op); }

  static bool is_async(const Op& op) { return op.attrs.handle >= 0 && op.kind != OpKind::Wait; }
  static bool is_comm(const Op& op) {
    auto c = op_info(op.kind).category;
    return c == OpCategory::collective || c == OpCategory::p2p;
  }

  // ---- the simulation ---------------------------------------------------------------------
  void run_rank(int r) {
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

  void exec(int r, int i) {
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
  void stream_order(int r, const Op& op, int i) {
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

  int find_chain(int r, NameId stream) const {
    for (auto [s, c] : ranks_[static_cast<std::size_t>(r)].chains)
      if (s == stream) return c;
    return -1;
  }

  // The communication issued on `chain` that has not completed (running or queued there).
  std::vector<int> pending_on(int chain) const {
    const Chain& ch = chains_[static_cast<std::size_t>(chain)];
    std::vector<int> out(ch.running.begin(), ch.running.end());
    out.insert(out.end(), ch.queue.begin(), ch.queue.end());
    return out;
  }

  bool is_local(const Op& op) const {
    return op_info(op.kind).category == OpCategory::collective && !(op.attrs.axes & relevant_);
  }

  // Every stream but `comm` runs its ops one after another (the default `comm` stands for the
  // process groups' own NCCL streams, which do not wait for each other).
  bool serialized(NameId stream) const { return stream != comm_; }

  // Nothing runs or waits on the serialized chain, or only ops of `unit`: an op of `unit` starts at once.
  bool idle(int chain, std::int64_t unit) const {
    const Chain& ch = chains_[static_cast<std::size_t>(chain)];
    return ch.queue.empty() && (ch.running.empty() || ch.unit == unit);
  }

  void issue_async(int r, const Op& op, int i, bool implicit) {
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
      auto live = R.live.find(op.attrs.handle);
      if (live != R.live.end() && insts_[static_cast<std::size_t>(live->second)].wait_event < 0) {
        Instance& old = insts_[static_cast<std::size_t>(live->second)];
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
    else R.live[op.attrs.handle] = inst;
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
  int make_ep(int r, const Op& op, int i, int inst, VC vc, int event, int chain, std::int64_t unit) {
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
  void submit(int e) {
    int c = eps_[static_cast<std::size_t>(e)].chain;
    if (c < 0) return post(e);
    if (idle(c, eps_[static_cast<std::size_t>(e)].unit)) return start(c, e);
    chains_[static_cast<std::size_t>(c)].queue.push_back(e);
  }

  void start(int c, int e) {
    Chain& ch = chains_[static_cast<std::size_t>(c)];
    ch.unit = eps_[static_cast<std::size_t>(e)].unit;
    ch.running.push_back(e);
    post(e);
  }

  // The running unit of chain c completed: start the next one (a loop, not a recursion, per chain).
  void drain(int c) {
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
  void post(int e) {
    eps_[static_cast<std::size_t>(e)].posted = true;
    const Endpoint& ep = eps_[static_cast<std::size_t>(e)];
    const Op& op = op_at(ep.op);
    int i = ep.op;
    switch (ep.kind) {
      case EpKind::Local:
        if (ep.barrier && barrier_pending_[e] > 0) return;  // completes with the last op it waits for
        return complete_ep(e, nullptr);
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
      for (int x : done.eps) complete_ep(x, &done.vc);
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
  void transfer(int s, int rv) {
    // (complete_ep never adds endpoints, so these references stay valid)
    complete_ep(rv, &eps_[static_cast<std::size_t>(s)].vc);
    if (!eps_[static_cast<std::size_t>(s)].complete) complete_ep(s, &eps_[static_cast<std::size_t>(rv)].vc);
    int a = eps_[static_cast<std::size_t>(s)].event, b = eps_[static_cast<std::size_t>(rv)].event;
    if (a >= 0 && b >= 0) edges_.push_back({a, b});
    VC().swap(eps_[static_cast<std::size_t>(s)].vc);
    VC().swap(eps_[static_cast<std::size_t>(rv)].vc);
  }

  void complete_ep(int e, const VC* extra) {
    Endpoint& ep = eps_[static_cast<std::size_t>(e)];
    ep.complete = true;
    if (ep.barrier) {
      // no event of its own: the WaitStream / WaitEvent happened when issued
    } else if (ep.inst >= 0) {
      VC v = ep.vc;
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

  void complete_inst(int inst, VC v) {
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

  void close_group(int r) {
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

  void wait(int r, const Op& op, int i) {
    Rank& R = ranks_[static_cast<std::size_t>(r)];
    int chain = chain_of(r, op.attrs.stream >= 0 ? op.attrs.stream : compute_);
    std::vector<NameId> hs;
    if (op.kind == OpKind::Wait) hs.push_back(op.attrs.handle);
    else hs = p_.name_lists[op.attrs.handles];
    std::vector<int> done;
    for (NameId h : hs) {
      auto it = R.live.find(h);
      if (it == R.live.end()) {
        std::vector<std::string> known;
        for (const auto& [id, inst] : R.live) known.push_back(p_.name(id));
        std::sort(known.begin(), known.end());
        auto best = did_you_mean(p_.name(h), known);
        local(diag(CheckId::InvalidWait, op, i,
                   fmt::format("{} of handle {}, which no earlier op returned{}", op_name(op.kind), p_.name(h),
                               best ? fmt::format("; did you mean {}?", *best) : "")),
              r);
        continue;
      }
      const Instance& st = insts_[static_cast<std::size_t>(it->second)];
      if (st.wait_event >= 0 || std::find(done.begin(), done.end(), it->second) != done.end()) {
        Diagnostic d = diag(CheckId::InvalidWait, op, i, fmt::format("{} of handle {}, which was already waited", op_name(op.kind), p_.name(h)));
        d.notes.push_back({op_at(st.wait_event >= 0 ? st.wait_op : i).loc, fmt::format("handle {} was waited here", p_.name(h))});
        local(std::move(d), r);
        continue;
      }
      done.push_back(it->second);
    }
    R.wait_insts = std::move(done);
    R.wait_op = i;
    R.wait_chain = chain;
    R.group_end = false;
    block_on_waits(r);
  }

  void block_on_waits(int r) {
    Rank& R = ranks_[static_cast<std::size_t>(r)];
    R.waiting.clear();
    for (int x : R.wait_insts)
      if (!insts_[static_cast<std::size_t>(x)].complete) R.waiting.push_back(x);
    if (R.waiting.empty()) return finish_wait(r);
    R.blocked = true;
  }

  // The Wait (or the end of a batched group) happens: after the completion of what it waits for.
  void finish_wait(int r) {
    Rank& R = ranks_[static_cast<std::size_t>(r)];
    VC v;
    std::vector<int> from;
    for (int x : R.wait_insts) {
      join(v, insts_[static_cast<std::size_t>(x)].done_vc);
      from.push_back(insts_[static_cast<std::size_t>(x)].issue_event);
    }
    int ev = add_event(R.wait_op, R.wait_chain, &v, from, R.group_end ? EventKind::GroupEnd : EventKind::Op);
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
  void overlap_checks(int r, const Op& op, int i) {
    Rank& R = ranks_[static_cast<std::size_t>(r)];
    for (NameId h : p_.name_lists[op.attrs.handles]) {
      auto it = R.live.find(h);
      if (it == R.live.end()) {
        local(diag(CheckId::InvalidWait, op, i,
                   fmt::format("OverlapRegion overlaps handle {}, which no earlier op returned: nothing is in flight to overlap with", p_.name(h))),
              r);
      } else if (insts_[static_cast<std::size_t>(it->second)].wait_event >= 0) {
        Diagnostic d = diag(CheckId::InvalidWait, op, i,
                            fmt::format("OverlapRegion overlaps handle {}, which was already waited: the region runs after the op completes, so "
                                        "nothing overlaps (the Wait serializes them)",
                                        p_.name(h)));
        d.notes.push_back({op_at(insts_[static_cast<std::size_t>(it->second)].wait_op).loc, fmt::format("handle {} was waited here", p_.name(h))});
        d.notes.push_back({op.loc, fmt::format("fix: move the Wait of {} after this region", p_.name(h))});
        local(std::move(d), r);
      }
    }
  }

  // ---- accesses -----------------------------------------------------------------------------
  void accesses(int r, const Op& op, int ev, int inst) {
    for (NameId n : p_.ins(op)) access(r, n, {ev, inst, false}, op);
    for (NameId n : p_.outs(op)) access(r, n, {ev, inst, true}, op);
  }

  // Checks the access y against the buffer's earlier accesses on this rank, then records it.
  void access(int r, NameId buf, Access y, const Op& yop) {
    Buffer& b = buffer(r, buf);
    if (b.last_write && b.last_write->event != y.event && !ended_before(*b.last_write, y.event)) report(r, buf, *b.last_write, y, yop);
    if (y.write)
      for (const auto& x : b.reads)
        if (x.event != y.event && !ended_before(x, y.event)) report(r, buf, x, y, yop);
    if (y.write) {
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

  // Buffers are per rank. Most names live on one rank: the name's first buffer is found directly;
  // the others (a name every rank uses) through a (rank, name) index, so no lookup walks the ranks.
  Buffer& buffer(int r, NameId n) {
    if (static_cast<std::size_t>(n) >= buf_head_.size()) buf_head_.resize(std::max(p_.names.size(), static_cast<std::size_t>(n) + 1), -1);
    // The first kDirect ranks of a name: a short list from the name; the rest: the (rank, name) index.
    constexpr int kDirect = 4;
    int* link = &buf_head_[static_cast<std::size_t>(n)];
    int walked = 0;
    for (; *link >= 0 && walked < kDirect; ++walked) {
      BufSlot& sl = bufs_[static_cast<std::size_t>(*link)];
      if (sl.rank == r) return sl.b;
      link = &sl.next;
    }
    if (walked == kDirect) {
      auto [it, fresh] = buf_index_.try_emplace((static_cast<std::uint64_t>(static_cast<std::uint32_t>(r)) << 32) | static_cast<std::uint32_t>(n),
                                                static_cast<int>(bufs_.size()));
      if (!fresh) return bufs_[static_cast<std::size_t>(it->second)].b;
    } else {
      *link = static_cast<int>(bufs_.size());
    }
    bufs_.push_back({r, -1, {}});
    return bufs_.back().b;
  }

  std::string inst_name(int inst) const {
    const Instance& h = insts_[static_cast<std::size_t>(inst)];
    return h.name >= 0 ? p_.name(h.name) : fmt::format("the batched group {}", p_.name(op_at(h.op).attrs.group));
  }

  std::string describe(const Access& a) const {
    const Op& op = op_of(a.event);
    std::string s = stream_name(events_[static_cast<std::size_t>(a.event)].chain);
    if (a.inst >= 0) {
      const Instance& h = insts_[static_cast<std::size_t>(a.inst)];
      if (h.name < 0) return fmt::format("{} (line {}, in batched group {}, stream {})", op_name(op.kind), op.loc.line, p_.name(op.attrs.group), s);
      return fmt::format("{} (line {}, handle {}, stream {})", op_name(op.kind), op.loc.line, p_.name(h.name), s);
    }
    return fmt::format("{} (line {}, stream {})", op_name(op.kind), op.loc.line, s);
  }

  std::string wait_fix(int inst, int ychain = -1) const {
    const Instance& h = insts_[static_cast<std::size_t>(inst)];
    if (h.name < 0) return fmt::format("end the batched group {} before this op", p_.name(op_at(h.op).attrs.group));
    if (h.wait_event >= 0 && ychain >= 0 && events_[static_cast<std::size_t>(h.wait_event)].chain != ychain)
      return fmt::format("move the {} of {} (line {}) to stream {}, before this op (a Wait orders only the stream it runs on)", op_name(op_at(h.wait_op).kind),
                         p_.name(h.name), op_at(h.wait_op).loc.line, stream_name(ychain));
    return fmt::format("insert {{op: Wait, handle: {}}} before this op", p_.name(h.name));
  }

  // The Waits on y's stream between x's issue and y: evidence of a Wait on the wrong handle or stream.
  void wait_notes(const Access& x, const Access& y, std::vector<Note>& notes) const {
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

  void report(int r, NameId buf, const Access& x, const Access& y, const Op& yop) {
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

  // ---- deadlock -----------------------------------------------------------------------------
  // The endpoints a blocked rank waits on.
  std::vector<int> blocked_eps(int r) const {
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
  std::vector<int> waits_for(int e) const {
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

  std::string kind_word(const Endpoint& ep, const char* op) const {
    if (ep.inst < 0) return op;
    return insts_[static_cast<std::size_t>(ep.inst)].name >= 0 ? fmt::format("the async {}", op) : fmt::format("the batched {}", op);
  }

  std::string why_blocked(int e) const {
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

  std::string rank_state(int r) const {
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

  Loc blocked_loc(int r) const {
    const Rank& R = ranks_[static_cast<std::size_t>(r)];
    return op_at(R.sync_ep >= 0 ? eps_[static_cast<std::size_t>(R.sync_ep)].op : R.wait_op).loc;
  }
  int blocked_op(int r) const {
    const Rank& R = ranks_[static_cast<std::size_t>(r)];
    return R.sync_ep >= 0 ? eps_[static_cast<std::size_t>(R.sync_ep)].op : R.wait_op;
  }

  // No rank can move and not all are done: find a cycle of waits among the blocked ranks.
  void stalled() {
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

  static NameId default_stream(const Program& p, const std::string& name, NameId reserved) {
    auto it = p.name_ids.find(name);
    return it == p.name_ids.end() ? reserved : it->second;
  }

  const Program& p_;
  RankSpace space_;
  NameId compute_, comm_;
  P2PModel model_ = P2PModel::Rendezvous;
  std::uint32_t relevant_ = 0;
  bool multi_ = false;
  bool static_blame_ = false;
  std::set<std::pair<int, int>> leftover_;  // (rank, op) of Sends and Recvs with no partner
  std::vector<Rank> ranks_;
  std::deque<int> ready_;
  std::int64_t next_group_unit_ = 0;
  std::unordered_map<int, int> barrier_pending_;           // barrier endpoint -> ops it still waits for
  std::unordered_map<int, std::vector<int>> waiters_;      // endpoint -> barriers waiting for it
  std::vector<Event> events_;
  std::vector<Chain> chains_;
  std::vector<Instance> insts_;
  std::vector<Endpoint> eps_;
  std::unordered_map<std::int64_t, Slot> slots_;
  std::vector<Channel> channels_;                          // (complete_ep never adds one: references stay valid)
  std::unordered_map<std::int64_t, int> channel_index_;   // (src, dst) -> its channel
  struct BufSlot {
    int rank, next;  // next: the name's next buffer among its first few ranks
    Buffer b;
  };
  std::vector<int> buf_head_;     // name -> its first buffer (on the first rank that used it)
  std::unordered_map<std::uint64_t, int> buf_index_;  // (rank, name) -> buffer, for the name's other ranks
  std::vector<BufSlot> bufs_;
  std::vector<std::pair<int, int>> waits_;  // (event, op) of every Wait, in order
  std::unordered_map<int, std::string> hubs_;
  std::vector<std::pair<int, int>> edges_;
  std::vector<Diagnostic> diags_;
  std::map<std::string, std::pair<Diagnostic, std::vector<int>>> local_;
};

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
  Graph g = e.graph();
  auto [it, end] = boost::edges(g);
  for (; it != end; ++it) out << "  e" << boost::source(*it, g) << " -> e" << boost::target(*it, g) << ";\n";
  out << "}\n";
}

}  // namespace

std::vector<Diagnostic> check_temporal(const Program& program, const TemporalOptions& options) {
  Engine e(program, options);
  e.run();
  if (options.dot) dot_graph(program, e, *options.dot);
  return e.take();
}

void write_hb_dot(const Program& program, std::ostream& out) {
  TemporalOptions o;
  o.dot = &out;
  check_temporal(program, o);
}

}  // namespace spmd
