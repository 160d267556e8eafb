// temporal/engine.h - the temporal checker's state (private to temporal/; the entry point is temporal.h).
//
// One Engine simulates the representative ranks. Its members are defined by topic: temporal.cpp (the
// entry point, the run loop, findings, the happens-before graph), matching.cpp (static p2p and collective
// matching), simulation.cpp (issuing, posting and completing ops and communication), waits.cpp (Wait,
// WaitAll, batched groups, OverlapRegion: handle checks), races.cpp (buffer accesses: missing-wait,
// data-race, buffer-aliasing) and deadlock.cpp (the cycle of waits when no rank can move). Vector clocks
// and the happens-before queries are inline here.
#pragma once
#include "temporal/temporal.h"

#include <boost/container/small_vector.hpp>
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

namespace spmd::temporal_detail {

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

inline void join(VC& into, const VC& x) {
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
  int unread_over = -1;  // the event of the write last_write replaced when that value was never read (-1: none)
  boost::container::small_vector<Access, 2> reads;  // most buffers are read once or twice
};

// What one rank keeps per name: the buffer's accesses, and the latest instance returned under the name
// when it is a handle (a handle and a tensor may share a name: the fields are apart).
struct BufSlot {
  int rank, next;  // next: the name's next slot among its first few ranks
  int live = -1;   // handle: its latest instance on this rank (-1: none returned yet)
  Buffer b;
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
  std::vector<NameId> handles;                 // handle names returned on this rank (their instances: BufSlot::live)
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

  void run();
  std::vector<Diagnostic> take();

  const std::vector<std::pair<int, int>>& edges() const { return edges_; }
  const std::vector<Event>& events() const { return events_; }
  const std::vector<Chain>& chains() const { return chains_; }
  std::string rank_label(int r) const { return space_.label(p_, r); }
  std::string stream_name(int chain) const {
    NameId id = chains_[static_cast<std::size_t>(chain)].stream;
    return id == kCompute ? "compute" : id == kComm ? "comm" : p_.name(id);
  }
  std::string hub_label(int event) const { return hubs_.count(event) ? hubs_.at(event) : "collective"; }

 private:
  // ---- static matching (matching.cpp) ------------------------------------------------------------
  std::string axes_str(std::uint32_t mask) const;
  std::string coll_str(const Op& op) const;
  std::string lbl(int r) const { return space_.label(p_, r); }
  // What a collective combines across ranks: its `matches:` name (the logical tensor), else its input's name.
  NameId identity(const Op& op) const { return op.attrs.matches >= 0 ? op.attrs.matches : p_.ins(op)[0]; }
  std::string identity_str(const Op& op) const;
  void static_matching();

  // ---- events and clocks (inline) ----------------------------------------------------------------
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

  void local(Diagnostic d, int r);

  const Op& op_at(int i) const { return p_.ops[static_cast<std::size_t>(i)]; }
  const Op& op_of(int event) const { return op_at(events_[static_cast<std::size_t>(event)].op); }

  static bool is_async(const Op& op) { return op.attrs.handle >= 0 && op.kind != OpKind::Wait; }
  static bool is_comm(const Op& op) {
    auto c = op_info(op.kind).category;
    return c == OpCategory::collective || c == OpCategory::p2p;
  }

  // ---- the simulation (simulation.cpp; Waits and groups: waits.cpp) ------------------------------
  void run_rank(int r);
  void exec(int r, int i);
  void stream_order(int r, const Op& op, int i);

  int find_chain(int r, NameId stream) const {
    for (auto [s, c] : ranks_[static_cast<std::size_t>(r)].chains)
      if (s == stream) return c;
    return -1;
  }

  std::vector<int> pending_on(int chain) const;

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

  void issue_async(int r, const Op& op, int i, bool implicit);
  int make_ep(int r, const Op& op, int i, int inst, VC vc, int event, int chain, std::int64_t unit);
  void submit(int e);
  void start(int c, int e);
  void drain(int c);
  void post(int e);
  void transfer(int s, int rv);
  // last_use: nothing reads the endpoint's clock after this (it is moved, not copied, into its instance).
  void complete_ep(int e, const VC* extra, bool last_use = false);
  void complete_inst(int inst, VC v);
  void close_group(int r);
  void wait(int r, const Op& op, int i);
  void block_on_waits(int r);
  void finish_wait(int r);
  void overlap_checks(int r, const Op& op, int i);

  // ---- accesses (races.cpp) ----------------------------------------------------------------------
  void accesses(int r, const Op& op, int ev, int inst);
  void access(int r, NameId buf, Access y, const Op& yop);
  BufSlot& slot(int r, NameId n);
  Buffer& buffer(int r, NameId n) { return slot(r, n).b; }
  // The latest instance of handle h on rank r (-1: none).
  int live(int r, NameId h) { return slot(r, h).live; }
  std::string inst_name(int inst) const;
  std::string describe(const Access& a) const;
  std::string wait_fix(int inst, int ychain = -1) const;
  void wait_notes(const Access& x, const Access& y, std::vector<Note>& notes) const;
  void report(int r, NameId buf, const Access& x, const Access& y, const Op& yop);

  // ---- deadlock (deadlock.cpp) -------------------------------------------------------------------
  std::vector<int> blocked_eps(int r) const;
  std::vector<int> waits_for(int e) const;
  std::string kind_word(const Endpoint& ep, const char* op) const;
  std::string why_blocked(int e) const;
  std::string rank_state(int r) const;
  Loc blocked_loc(int r) const;
  int blocked_op(int r) const;
  void stalled();

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
  std::vector<int> buf_head_;     // name -> its first buffer (on the first rank that used it)
  std::unordered_map<std::uint64_t, int> buf_index_;  // (rank, name) -> buffer, for the name's other ranks
  std::vector<BufSlot> bufs_;
  std::vector<std::pair<int, int>> waits_;  // (event, op) of every Wait, in order
  std::unordered_map<int, std::string> hubs_;
  std::vector<std::pair<int, int>> edges_;
  std::vector<Diagnostic> diags_;
  std::map<std::string, std::pair<Diagnostic, std::vector<int>>> local_;
};

}  // namespace spmd::temporal_detail
