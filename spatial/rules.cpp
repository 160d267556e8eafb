// spatial/rules.cpp - the placement and shape checker: the op loop, the one exhaustive switch over OpKind
// (apply), the shared rule pieces and the output postconditions. The rules themselves are in rules_*.cpp,
// one file per op family.
//
// Each rule reads its inputs' global shapes and per-axis placements and either writes the outputs'
// or reports a diagnostic (and the outputs are then poisoned: no cascades). Shape claims go through
// Obligations: decided at once when concrete, proved by Z3 at the end when symbolic.
#include "ir/memory.h"
#include "ir/printer.h"
#include "spatial/checker.h"

namespace spmd {

namespace {

std::vector<Loc> var_locs(const Program& p) {
  std::vector<Loc> out;
  for (const auto& v : p.vars) {
    auto it = p.size_locs.find(v.name);
    out.push_back(it == p.size_locs.end() ? Loc{} : it->second);
  }
  return out;
}

}  // namespace

namespace detail {

Checker::Checker(const Program& p, const SpatialOptions& o)
    : p_(p),
      pool_(p.exprs),
      obl_(pool_, p.vars, var_locs(p), o.z3_timeout_ms),
      types_(o.types),
      inferred_(o.inferred_outputs),
      claims_(o.claims),
      prefix_(o.prefix),
      prefix_ops_(o.prefix ? std::min(o.prefix_ops, o.prefix->out_base.size()) : 0), no_grad_from_(o.no_grad_from) {
  mask_sizes_.fill(-1);
}

std::vector<Diagnostic> Checker::run() {
  if (types_) {
    types_->decls.clear();
    types_->outs.clear();
    types_->decl_origins.clear();
    types_->out_origins.clear();
    reserve_huge(types_->out_base, p_.ops.size());  // (huge pages: ir/memory.h)
    types_->out_base.assign(p_.ops.size(), 0);
    reserve_huge(types_->outs, p_.ops.size());
  }
  declare_sizes();
  RankSpace space = make_rank_space(p_);
  std::vector<P2PMatch> matches;
  std::vector<P2PLeftover> leftovers;
  match_p2p(p_, space, matches, leftovers);
  for (const auto& m : matches) {
    auto& v = recv_sends_[m.recv_op];
    if (std::find(v.begin(), v.end(), m.send_op) == v.end()) v.push_back(m.send_op);
  }
  std::vector<CollectivePair> pairs;
  std::vector<CollectiveCount> counts;
  match_collectives(p_, space, pairs, counts);
  for (const auto& c : pairs) watched_[c.op_a] = watched_[c.op_b] = Value();

  // Each program runs with its own copy of the declared tensors. A Recv takes the type of its
  // Send, so the programs advance in turn; a Recv whose Send has not been reached yet waits.
  struct State {
    std::vector<Value> env;
    std::vector<Origin> origins;
    std::vector<NameId> names;                                  // slot -> name (local_)
    std::vector<std::pair<std::uint32_t, std::uint32_t>> outs;  // (output, slot) it holds
    std::uint32_t pc, end;
  };
  std::vector<State> states;
  const auto& progs = space.programs;
  local_ = progs.size() > 1;
  if (local_) {  // tables of their own need disjoint op ranges (every op belongs to one program)
    std::vector<char> owned(p_.ops.size(), 0);
    for (const auto& prog : progs)
      for (std::uint32_t i = prog.first_op; i < prog.first_op + prog.n_ops && local_; ++i) local_ = !std::exchange(owned[i], 1);
  }
  if (!local_) {
    std::vector<std::pair<std::uint32_t, std::uint32_t>> outs;
    for (std::size_t j = 0; j < p_.outputs.size(); ++j) outs.push_back({static_cast<std::uint32_t>(j), static_cast<std::uint32_t>(p_.outputs[j].name)});
    for (const auto& prog : progs) {
      reserve_huge(env_, p_.names.size());
      env_.assign(p_.names.size(), Value());
      origins_.clear();
      for (const auto& t : p_.tensors) declare(t, static_cast<std::size_t>(t.name));
      recording_decls_ = false;  // declarations are exported once (every program declares the same)
      states.push_back({std::move(env_), std::move(origins_), {}, outs, prog.first_op, prog.first_op + prog.n_ops});
    }
  } else {
    oslot_.assign(p_.operands.size(), 0);
    std::vector<std::int32_t> mark(p_.names.size(), -1), decl_of(p_.names.size(), -1), first_out(p_.names.size(), -1);
    std::vector<std::int32_t> next_out(p_.outputs.size(), -1);
    for (std::size_t d = 0; d < p_.tensors.size(); ++d) decl_of[static_cast<std::size_t>(p_.tensors[d].name)] = static_cast<std::int32_t>(d);
    for (std::size_t j = p_.outputs.size(); j-- > 0;) {
      auto n = static_cast<std::size_t>(p_.outputs[j].name);
      next_out[j] = first_out[n];
      first_out[n] = static_cast<std::int32_t>(j);
    }
    for (std::size_t s = 0; s < progs.size(); ++s) {
      const auto& prog = progs[s];
      State st{{}, {}, {}, {}, prog.first_op, prog.first_op + prog.n_ops};
      auto use = [&](NameId n) {
        auto& m = mark[static_cast<std::size_t>(n)];
        if (m < 0) m = static_cast<std::int32_t>(st.names.size()), st.names.push_back(n);
        return static_cast<std::uint32_t>(m);
      };
      // The first program declares every tensor (for the declarations' own findings and the exported
      // types); the others the ones they use (the same declarations, so the same findings).
      if (s == 0)
        for (const auto& t : p_.tensors) use(t.name);
      for (std::uint32_t i = prog.first_op; i < prog.first_op + prog.n_ops; ++i) {
        const Op& op = p_.ops[i];
        for (std::uint32_t k = op.first; k < op.first + op.n_in + op.n_out; ++k) oslot_[k] = use(p_.operands[k]);
      }
      env_.assign(st.names.size(), Value());
      origins_.clear();
      if (s == 0) {
        for (const auto& t : p_.tensors) declare(t, static_cast<std::size_t>(mark[static_cast<std::size_t>(t.name)]));
        recording_decls_ = false;
      } else {
        for (std::size_t k = 0; k < st.names.size(); ++k)
          if (auto d = decl_of[static_cast<std::size_t>(st.names[k])]; d >= 0) declare(p_.tensors[static_cast<std::size_t>(d)], k);
      }
      for (std::size_t k = 0; k < st.names.size(); ++k)
        for (auto j = first_out[static_cast<std::size_t>(st.names[k])]; j >= 0; j = next_out[static_cast<std::size_t>(j)])
          st.outs.push_back({static_cast<std::uint32_t>(j), static_cast<std::uint32_t>(k)});
      std::sort(st.outs.begin(), st.outs.end());
      for (NameId n : st.names) mark[static_cast<std::size_t>(n)] = -1;
      st.env = std::move(env_);
      st.origins = std::move(origins_);
      states.push_back(std::move(st));
    }
  }
  // Run each program until it ends or reaches a Recv whose Send no program has reached; a Send wakes the
  // programs waiting at its Recvs (no rounds over every program). When none can advance (a deadlock or an
  // unmatched Recv), the first waiting program goes on past its Recv without a Send's type.
  std::unordered_map<int, std::vector<int>> send_recvs;
  for (const auto& m : matches) send_recvs[m.send_op].push_back(m.recv_op);
  std::unordered_map<int, std::vector<std::size_t>> waiting;  // Recv op -> programs stopped at it
  std::vector<std::size_t> ready;
  std::vector<char> queued(states.size(), 0);
  for (std::size_t k = states.size(); k-- > 0;)
    if (states[k].pc < states[k].end) ready.push_back(k), queued[k] = 1;
  bool force = false;
  std::size_t first_pending = 0;
  for (;;) {
    while (!ready.empty()) {
      std::size_t k = ready.back();
      ready.pop_back();
      queued[k] = 0;
      State& st = states[k];
      env_ = std::move(st.env);
      origins_ = std::move(st.origins);
      slot_names_ = &st.names;
      while (st.pc < st.end) {
        int i = static_cast<int>(st.pc);
        if (!force && recv_waits(i)) {
          waiting[i].push_back(k);
          break;
        }
        force = false;
        step(static_cast<int>(st.pc++));
        if (p_.ops[static_cast<std::size_t>(i)].kind != OpKind::Send) continue;
        if (auto it = send_recvs.find(i); it != send_recvs.end())
          for (int r : it->second)
            if (auto w = waiting.find(r); w != waiting.end()) {
              for (std::size_t x : w->second)
                if (!queued[x]) ready.push_back(x), queued[x] = 1;
              waiting.erase(w);
            }
      }
      st.env = std::move(env_);
      st.origins = std::move(origins_);
    }
    while (first_pending < states.size() && states[first_pending].pc == states[first_pending].end) ++first_pending;
    if (first_pending == states.size()) break;
    force = true;
    ready.push_back(first_pending);
    queued[first_pending] = 1;
  }
  for (auto& st : states) {
    env_ = std::move(st.env);
    origins_ = std::move(st.origins);
    slot_names_ = &st.names;
    check_outputs(st.outs);
  }
  compare_collectives(pairs, space);
  if (types_) types_->exprs = pool_;
  if (claims_)
    for (const auto& o : obl_.pending()) claims_->push_back({static_cast<ClaimKind>(o.kind), o.a, o.b});
  obl_.solve(diags_);
  sort_and_cap(diags_, diags_.size());
  // Programs share declarations and outputs: report each finding once.
  diags_.erase(std::unique(diags_.begin(), diags_.end(),
                           [](const Diagnostic& a, const Diagnostic& b) {
                             return a.id == b.id && a.loc.line == b.loc.line && a.loc.col == b.loc.col && a.message == b.message;
                           }),
               diags_.end());
  return std::move(diags_);
}

std::string Checker::oname(int i) const { return p_.name(oid(i)); }

NameId Checker::oid(int i) const {
  auto outs = p_.outs(*op_);
  return static_cast<std::size_t>(i) < outs.size() ? outs[static_cast<std::size_t>(i)] : p_.ins(*op_)[0];
}

std::string Checker::sstr(std::span<const ExprId> shape) const {
  std::string t = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) t += (i ? ", " : "") + dstr(shape[i]);
  return t + "]";
}

void Checker::report(CheckId id, std::string msg, const std::string& tensor, std::vector<Note> notes) {
  Diagnostic d;
  d.id = id;
  d.loc = here();
  d.message = std::move(msg);
  d.op = op_idx_;
  d.tensor = tensor;
  d.notes = std::move(notes);
  diags_.push_back(std::move(d));
  failed_ = true;
}

// Where the placement of `v` on axis `a` arose, as a note (none if unknown).
void Checker::origin_note(std::vector<Note>& notes, const Value& v, int a) const {
  int o = v.origin[static_cast<std::size_t>(a)];
  if (o < 0) return;
  const Origin& org = origins_[static_cast<std::size_t>(o)];
  std::string why = why_of(org);
  if (why.empty())
    notes.push_back({org.loc, fmt::format("{} is declared {} over {} here", p_.name(org.tensor), ps(org.pl), axn(org.axis))});
  else
    notes.push_back({org.loc, fmt::format("{} became {} over {} here: {}", p_.name(org.tensor), ps(org.pl), axn(org.axis), why)});
}

std::string Checker::why_of(const Origin& org) const {
  if (!org.moved_by) return org.why == kNoIndex ? std::string() : whys_[org.why];
  return fmt::format("{} maps {} of {} to {}", op_name(org.moved_by->kind), ps(org.before), p_.name(p_.ins(*org.moved_by)[static_cast<std::size_t>(org.from)]),
                     ps(org.pl));
}

int Checker::new_origin(Loc l, NameId tensor, Placement pl, int a, std::string why) {
  std::uint32_t w = kNoIndex;
  if (!why.empty()) {
    w = static_cast<std::uint32_t>(whys_.size());
    whys_.push_back(std::move(why));
  }
  origins_.push_back({l, tensor, pl, a, w, op_idx_});
  return static_cast<int>(origins_.size() - 1);
}

// Sets a placement that this op creates (not one inherited from an input). A new shard must divide evenly.
void Checker::set_new(Value& v, int a, Placement pl, std::string why) {
  Placement before = v.pl[static_cast<std::size_t>(a)];
  v.pl[static_cast<std::size_t>(a)] = pl;
  if (before.is_s() && before.ord && !(pl == before)) {  // a shard left a dim cut in a shard order: the rest keep theirs, canonically
    int ord[kMaxAxes], k = 0, rest[kMaxAxes], n = 0;
    v.pl[static_cast<std::size_t>(a)] = before;
    k = shard_order(v.pl.data(), axes(), before.dim, ord);
    for (int i = 0; i < k; ++i)
      if (ord[i] != a) rest[n++] = ord[i];
    v.pl[static_cast<std::size_t>(a)] = pl;
    set_shard_order(v.pl.data(), axes(), before.dim, rest, n);
  }
  v.origin[static_cast<std::size_t>(a)] = pl.is_r() ? -1 : new_origin(here(), oid(0), pl, a, std::move(why));
  if (!pl.is_s()) return;
  if (op_->kind == OpKind::ZeROScatterGrad || op_->kind == OpKind::ZeROPartitionOptState) {  // the innermost of its dim's order (FSDP2)
    int ord[kMaxAxes], n = 0;
    v.pl[static_cast<std::size_t>(a)] = before;
    int k = shard_order(v.pl.data(), axes(), pl.dim, ord);
    v.pl[static_cast<std::size_t>(a)] = pl;
    for (int i = 0; i < k; ++i) n += ord[i] != a ? (ord[n] = ord[i], 1) : 0;
    ord[n++] = a;
    set_shard_order(v.pl.data(), axes(), pl.dim, ord, n);
  }
  // `uneven: true`: the torch.chunk layout is asked for (section 1), on a dim no other axis cuts (nested uneven
  // chunks of several axes are not modelled: such a shard must divide evenly)
  if (at().uneven && shard_mask(v, pl.dim) == (1u << a)) v.uneven = true;
  else v.strict = static_cast<std::uint8_t>(v.strict | (1u << pl.dim));
}

// Sets a placement inherited from input `i`: keeps where it arose, unless this op moves a shard to another dim.
void Checker::set_from(Value& v, int a, Placement pl, int i) {
  Placement before = pin(i, a);
  v.pl[static_cast<std::size_t>(a)] = pl;
  if (pl == before || pl.is_r())
    v.origin[static_cast<std::size_t>(a)] = pl.is_r() ? -1 : in(i).origin[static_cast<std::size_t>(a)];
  else {
    int o = new_origin(here(), oid(0), pl, a, {});
    Origin& org = origins_[static_cast<std::size_t>(o)];
    org.moved_by = op_;
    org.from = i;
    org.before = before;
    v.origin[static_cast<std::size_t>(a)] = o;
  }
}

void Checker::set_shape(Value& v, std::span<const ExprId> s) {
  v.rank = static_cast<std::uint8_t>(s.size());
  std::copy(s.begin(), s.end(), v.shape.begin());
}

// A dim attribute normalized against `rank`, or -1 after a shape-mismatch report.
int Checker::norm_dim(int d, int rank, const std::string& what, const std::string& tensor) {
  if (d == kUnset) return -1;
  if (d < -rank || d >= rank) {
    report(CheckId::ShapeMismatch, fmt::format("{} {} is out of range for {}, which has rank {}", opname(), what, tensor, rank), tensor);
    return -1;
  }
  return d < 0 ? d + rank : d;
}

std::string Checker::fix_allreduce(const std::string& t, int a, Placement p) const {
  std::string rop = p.is_p() && p.op != ReduceOp::Sum ? fmt::format(", reduce: {}", reduce_name(p.op)) : "";
  return fmt::format("reduce first, e.g. insert {{op: AllReduce, in: [{}], out: {}_reduced, axis: {}{}}} before this op and read {}_reduced here", t, t,
                     axn(a), rop, t);
}

std::string Checker::fix_allgather(const std::string& t, int a, int d) const {
  return fmt::format("gather first, e.g. insert {{op: AllGather, in: [{}], out: {}_full, axis: {}, dim: {}}} before this op and read {}_full here", t, t,
                     axn(a), d, t);
}


// Claims a == b (e.g. a contraction dim); false after a shape-mismatch report.
bool Checker::same_dim(ExprId a, ExprId b, const Lazy& what, const std::string& tensor) {
  Decision d = obl_.decide(OblKind::Equal, a, b);
  if (d == Decision::Holds) return true;
  if (d == Decision::Fails) {
    report(CheckId::ShapeMismatch, fmt::format("{}: {} != {}", what.str(), dstr(a), dstr(b)), tensor);
    return false;
  }
  if (obl_.first_time(OblKind::Equal, a, b))
    obl_.push({OblKind::Equal, a, b, CheckId::ShapeMismatch, here(), op_idx_, tensor, fmt::format("{} ({} == {}) must hold", what.str(), dstr(a), dstr(b)), {}});
  return true;
}

// Axes (bitmask, mesh order) that shard dim d of v.
std::uint32_t Checker::shard_mask(const Value& v, int d) const {
  std::uint32_t m = 0;
  for (int a = 0; a < axes(); ++a)
    if (v.pl[static_cast<std::size_t>(a)].is_s(d)) m |= 1u << a;
  return m;
}

ExprId Checker::mask_size(std::uint32_t m) {
  ExprId& cached = mask_sizes_[m & ((1u << kMaxAxes) - 1)];
  if (cached >= 0) return cached;
  ExprId& s = cached;
  s = pool_.constant(1);
  for (int a = 0; a < axes(); ++a)
    if (m & (1u << a)) s = pool_.mul(s, axis_size(a));
  return s;
}

std::string Checker::mask_names(std::uint32_t m) const {
  std::string s;
  for (int a = 0; a < axes(); ++a)
    if (m & (1u << a)) s += (s.empty() ? "" : " x ") + axn(a);
  return s;
}

// Every sharded dim of v must split evenly over its axes (unless declared uneven).
bool Checker::check_local(Value& v, const std::string& name, Loc loc, std::vector<Note> notes) {
  for (int d = 0; d < v.rank; ++d) {
    bool strict = (v.strict >> d) & 1;
    if (v.uneven && !strict) continue;
    std::uint32_t m = shard_mask(v, d);
    if (!m) continue;
    ExprId div = mask_size(m);
    ExprId dim = v.shape[static_cast<std::size_t>(d)];
    Decision dec = obl_.decide(OblKind::Divisible, dim, div);
    if (dec == Decision::Holds) continue;
    std::string what = fmt::format("dim {} of {} ({}) is sharded over {} ({}) and must be divisible by {}", d, name, dstr(dim),
                                   mask_names(m), dstr(div), dstr(div));
    if (dec == Decision::Deferred) {
      if (obl_.first_time(OblKind::Divisible, dim, div))
        obl_.push({OblKind::Divisible, dim, div, CheckId::ShapeMismatch, loc, op_idx_, name, what, notes});
      continue;
    }
    auto a = obl_.concrete(dim), b = obl_.concrete(div);
    Diagnostic dg;
    dg.id = CheckId::ShapeMismatch;
    dg.loc = loc;
    dg.op = op_idx_;
    dg.tensor = name;
    dg.message = fmt::format("dim {} of {} has size {}, sharded over {} ({} ranks), but {}; {}", d, name, a ? std::to_string(*a) : dstr(dim),
                             mask_names(m), b ? std::to_string(*b) : dstr(div),
                             a && b ? failure_words(OblKind::Divisible, *a, *b) : "it does not divide evenly",
                             strict ? (op_ && op_info(op_->kind).find_attr("uneven")
                                           ? "a shard created here must be even unless asked for: choose sizes divisible by the axis, shard another dim, or "
                                             "add `uneven: true` to this op for the torch.chunk layout (ceil-div chunks, the last smaller)"
                                           : "a shard created here must be even (choose sizes divisible by the axis, or shard another dim)")
                                    : "declare `uneven: true` on the input if padded shards are intended");
    dg.notes = std::move(notes);
    diags_.push_back(std::move(dg));
    return false;
  }
  return true;
}

// Exact divisions and positive dims in a declared shape expression.
void Checker::check_expr(ExprId e, Loc loc, const std::string& what) {
  bool has_sub = false;
  bool bad = false;
  pool_.visit(e, [&](ExprId n) {
    const ENode& node = pool_.node(n);
    if (node.op == EOp::Sub) has_sub = true;
    if (node.op != EOp::Div || bad) return;
    Decision d = obl_.decide(OblKind::ExactDiv, n, n);
    std::string text = fmt::format("{}: {} must divide exactly", what, dstr(n));
    if (d == Decision::Fails) {
      diags_.push_back({CheckId::ShapeMismatch, Severity::Error, loc, fmt::format("{} must divide exactly, but it does not", what + ": " + dstr(n)), -1, {}, {}});
      bad = true;
    } else if (d == Decision::Deferred && obl_.first_time(OblKind::ExactDiv, n, n)) {
      obl_.push({OblKind::ExactDiv, n, n, CheckId::ShapeMismatch, loc, -1, {}, text, {}});
    }
  });
  if (has_sub && !bad) {
    Decision d = obl_.decide(OblKind::Positive, e, e);
    if (d == Decision::Fails)
      diags_.push_back({CheckId::ShapeMismatch, Severity::Error, loc, fmt::format("{} ({}) must be positive", what, dstr(e)), -1, {}, {}});
    else if (d == Decision::Deferred && obl_.first_time(OblKind::Positive, e, e))
      obl_.push({OblKind::Positive, e, e, CheckId::ShapeMismatch, loc, -1, {}, fmt::format("{} ({}) must be positive", what, dstr(e)), {}});
  }
}

void Checker::declare_sizes() {
  for (const auto& ax : p_.mesh) check_expr(ax.size, ax.loc, "the size of mesh axis " + ax.name);
  for (const auto& [name, e] : p_.sizes) {
    auto it = p_.size_locs.find(name);
    check_expr(e, it == p_.size_locs.end() ? Loc{} : it->second, "size " + name);
  }
}

void Checker::declare(const TensorDecl& t, std::size_t slot) {
  Value v;
  v.defined = true;
  set_shape(v, t.shape);
  v.pl = t.placement;
  v.dtype = t.dtype;
  v.uneven = t.uneven;
  const std::string& name = p_.name(t.name);
  for (int a = 0; a < axes(); ++a)
    if (!v.pl[static_cast<std::size_t>(a)].is_r())
      v.origin[static_cast<std::size_t>(a)] = new_origin(t.placement_loc, t.name, v.pl[static_cast<std::size_t>(a)], a, "");
  v.fresh = v_axes(v);
  v.def = next_def_++;
  for (std::size_t d = 0; d < t.shape.size(); ++d)  // a constant has no division and no subtraction to check
    if (!pool_.is_const(t.shape[d])) check_expr(t.shape[d], d < t.dim_locs.size() ? t.dim_locs[d] : t.shape_loc, fmt::format("dim {} of {}", d, name));
  op_idx_ = -1;
  if (!check_local(v, name, t.placement_loc)) v.poisoned = true;
  env_[slot] = v;
  if (types_ && recording_decls_) record(true, v);
}

void Checker::record(bool decl, const Value& v) {
  (decl ? types_->decls : types_->outs).push_back(type_of(v));
  if (!types_->want_origins) return;
  AxisOrigins o;
  for (int a = 0; a < axes() && !v.poisoned; ++a) {
    int k = v.origin[static_cast<std::size_t>(a)];
    if (k < 0) continue;
    const Origin& org = origins_[static_cast<std::size_t>(k)];
    o[static_cast<std::size_t>(a)] = {org.loc, p_.name(org.tensor), why_of(org), true};
  }
  (decl ? types_->decl_origins : types_->out_origins).push_back(std::move(o));
}

ValueType Checker::type_of(const Value& v) {
  ValueType t;
  t.shape = v.shape;
  t.rank = v.rank;
  t.pl = v.pl;
  t.dtype = v.dtype;
  t.ok = v.defined && !v.poisoned;
  t.fresh = v.fresh;
  t.uneven = v.uneven;
  t.zz_axis = v.zz_axis;
  t.zz_dims = v.zz_dims;
  return t;
}

void Checker::step(int i) {
  op_ = &p_.ops[static_cast<std::size_t>(i)];
  op_idx_ = i;
  failed_ = false;
  in_.clear();
  bool poisoned = false;
  bool given = static_cast<std::size_t>(i) < prefix_ops_;
  for (std::uint32_t k = op_->first; k < op_->first + op_->n_in; ++k) {
    NameId n = p_.operands[k];
    const Value& v = env_[slot(k)];
    if (!v.defined) undefined(n);
    else if (v.poisoned) poisoned = true;
    in_.push_back(&v);
  }
  if (static_cast<std::size_t>(i) >= no_grad_from_ && !given) {  // not differentiated: I is R (SpatialOptions::no_grad_from)
    no_grad_in_.clear();
    no_grad_in_.reserve(in_.size());
    for (const Value* v : in_) {
      no_grad_in_.push_back(*v);
      for (auto& q : no_grad_in_.back().pl)
        if (q.is_i()) q = Placement::r();
    }
    for (std::size_t k = 0; k < in_.size(); ++k) in_[k] = &no_grad_in_[k];
  }
  if (!moe_dispatches_.empty() || !topk_experts_.empty())  // a name written again no longer holds the routing they recorded
    for (NameId o : p_.outs(*op_)) moe_dispatches_.erase(o), topk_experts_.erase(o);
  if (!failed_ && !poisoned) {
    for (auto& o : out_) o = Value();
    if (given) {  // checked before (the forward of a training step): its outputs' types as they were
      for (int k = 0; k < op_->n_out; ++k) {
        const ValueType& t = prefix_->out(static_cast<std::size_t>(i), k);
        Value& v = out_[static_cast<std::size_t>(k)];
        set_shape(v, t.dims());
        v.pl = t.pl;
        v.dtype = t.dtype;
        v.fresh = t.fresh;
        v.uneven = t.uneven;
        if (!t.ok) failed_ = true;
      }
    } else {
      apply();
    }
  }
  if (op_->kind == OpKind::Send && !in_.empty()) {
    Value v = *in_[0];
    v.poisoned |= failed_ || poisoned || !v.defined;
    sent_[i] = v;
  }
  if (auto w = watched_.find(i); w != watched_.end() && !in_.empty()) {
    w->second = *in_[0];
    w->second.poisoned |= poisoned || !w->second.defined;
  }
  auto outs = p_.outs(*op_);
  if (types_) types_->out_base[static_cast<std::size_t>(i)] = static_cast<std::uint32_t>(types_->outs.size());
  if (op_->kind == OpKind::OverlapRegion) {
    // Opaque compute writing its outputs in place: they keep their values (and must exist).
    for (std::size_t k = 0; k < outs.size(); ++k) {
      Value& v = env_[slot(op_->first + op_->n_in + static_cast<std::uint32_t>(k))];
      if (!v.defined) {
        report(CheckId::UndefinedTensor,
               fmt::format("OverlapRegion writes {} in place, but no declaration or earlier op defines it", p_.name(outs[k])), p_.name(outs[k]));
        v.defined = true;
        v.poisoned = true;
      }
      if (types_) record(false, v);
    }
    return;
  }
  std::uint32_t fresh_in = 0;  // a V computed from per-rank values is per-rank too
  for (const Value* x : in_) fresh_in |= x->fresh & v_axes(*x);
  for (std::size_t k = 0; k < outs.size(); ++k) {
    Value v;
    if (failed_ || poisoned) {
      v.poisoned = true;
    } else {
      v = out_[k];
      carry_cp_tags(v);
      v.fresh = (v.fresh | fresh_in) & v_axes(v);
      if (op_->kind == OpKind::Recv || op_->kind == OpKind::Reinterpret) v.fresh = v_axes(v);  // another rank's value; a relabel
      if (!given && !check_local(v, p_.name(outs[k]), here())) v.poisoned = true;
      v.strict = 0;
      v.def = next_def_++;
      fp8_carry(v);
    }
    v.defined = true;
    env_[slot(op_->first + op_->n_in + static_cast<std::uint32_t>(k))] = v;
    if (types_) record(false, v);
  }
}

void Checker::undefined(NameId n) {
  const std::string& name = p_.name(n);
  std::vector<std::string> known;
  for (std::size_t k = 0; k < env_.size(); ++k)
    if (env_[k].defined) known.push_back(p_.name(slot_name(k)));
  std::vector<Note> notes;
  for (std::size_t j = static_cast<std::size_t>(op_idx_) + 1; j < p_.ops.size(); ++j) {
    auto outs = p_.outs(p_.ops[j]);
    if (std::find(outs.begin(), outs.end(), n) != outs.end()) {
      notes.push_back({p_.ops[j].loc, fmt::format("{} is first written here, after its use", name)});
      break;
    }
  }
  auto best = did_you_mean(name, known);
  std::string msg = fmt::format("{} reads '{}', which no declaration or earlier op defines", opname(), name);
  if (best) msg += fmt::format("; did you mean '{}'?", *best);
  report(CheckId::UndefinedTensor, msg, name, std::move(notes));
}

// Ops that read a value whose dim is cut in a shard order other than mesh order (`order:`, DTensor's
// _StridedShard): those that keep every placement as it is, and the gathers (which take off the innermost
// axis of the order). Any other op is conservative: layout-conflict, gather first (docs/semantics.md, 4.4).
namespace {
bool strided_ok(OpKind k) {
  static constexpr OpKind ok[] = {OpKind::AllGather, OpKind::ZeROGatherParam, OpKind::AllReduce, OpKind::SPMDGuard, OpKind::Cast, OpKind::LossScale,
                                  OpKind::SiLU,      OpKind::GELU,            OpKind::ReLU,      OpKind::Neg,       OpKind::Exp,  OpKind::Log,
                                  OpKind::Sqrt,      OpKind::Rsqrt,           OpKind::FP8Quantize, OpKind::FP8Dequantize, OpKind::Sigmoid, OpKind::Detach};
  return std::find(std::begin(ok), std::end(ok), k) != std::end(ok);
}
}  // namespace

void Checker::apply() {
  if (at().bad_axis != kNoIndex) {
    const auto& bad = p_.bad_axes[at().bad_axis];
    auto best = did_you_mean(bad.name, p_.axis_names());
    std::string axes;
    for (const auto& n : p_.axis_names()) axes += (axes.empty() ? "" : ", ") + n;
    return report(CheckId::IllegalCollective,
                  fmt::format("{} over axis '{}', which the mesh lacks{} (mesh axes: {})", opname(), bad.name,
                              best ? fmt::format("; did you mean '{}'?", *best) : "", axes),
                  n_in() ? iname(0) : "", {{bad.loc, best ? fmt::format("fix: axis: {}", *best) : "fix: name one of the mesh axes"}});
  }
  if (!strided_ok(op_->kind))
    for (int i = 0; i < n_in(); ++i)
      for (int d = 0; d < in(i).rank; ++d) {
        int ord[kMaxAxes];
        int k = shard_order(in(i).pl.data(), axes(), d, ord);
        if (k < 2 || !pl_of(in(i), ord[0]).ord) continue;
        std::string order;
        for (int j = 0; j < k; ++j) order += (j ? ", " : "") + axn(ord[j]);
        std::vector<Note> notes;
        origin_note(notes, in(i), ord[0]);
        notes.push_back(fix(fmt::format("gather {} over {} first (ZeROGatherParam or AllGather, dim: {}), or cut the dim in mesh order", iname(i),
                                        axn(ord[k - 1]), d)));
        return report(CheckId::LayoutConflict,
                      fmt::format("{} reads {}, whose dim {} is cut in the shard order [{}] (not mesh order, a strided shard); {} is checked only on "
                                  "dims cut in mesh order",
                                  opname(), iname(i), d, order, opname()),
                      iname(i), std::move(notes));
      }
  if (!cp_inputs_ok()) return;
  if (!fp8_exchange_ok()) return;
  switch (op_->kind) {
    case OpKind::MatMul: return matmul();
    case OpKind::Add:
    case OpKind::Sub: return add_like(false);
    case OpKind::Multiply: return add_like(true);
    case OpKind::Div:
    case OpKind::Maximum:
    case OpKind::Minimum: return div_minmax();
    case OpKind::Where: return where();
    case OpKind::Eq:
    case OpKind::Ne:
    case OpKind::Lt:
    case OpKind::Le:
    case OpKind::Gt:
    case OpKind::Ge:
    case OpKind::And:
    case OpKind::Or:
    case OpKind::Not: return mask_op();
    case OpKind::OneHot: return one_hot();
    case OpKind::Bincount: return bincount();
    case OpKind::CumSum: return cumsum();
    case OpKind::Detach: return detach();
    case OpKind::Neg:
    case OpKind::Exp:
    case OpKind::Log:
    case OpKind::Sqrt:
    case OpKind::Rsqrt:
    case OpKind::Sigmoid: return math_unary();
    case OpKind::SiLU:
    case OpKind::GELU:
    case OpKind::ReLU:
    case OpKind::Sin:
    case OpKind::Cos: return nonlinear();
    case OpKind::FP8Quantize: return fp8_quantize();
    case OpKind::Step: return step_rule();
    case OpKind::Dropout: return dropout();
    case OpKind::LayerNorm:
    case OpKind::RMSNorm: return norm();
    case OpKind::Softmax: return softmax();
    case OpKind::Sum:
    case OpKind::Mean:
    case OpKind::ReduceMax:
    case OpKind::ReduceMin:
    case OpKind::LogSumExp: return reduce_dims();
    case OpKind::FlashAttention: return attention();
    case OpKind::Embedding: return embedding();
    case OpKind::CrossEntropyLoss: return cross_entropy();
    case OpKind::TopKGate: return topk();
    case OpKind::AllReduce: return all_reduce();
    case OpKind::AllGather: return all_gather();
    case OpKind::ReduceScatter: return reduce_scatter();
    case OpKind::Broadcast: return broadcast();
    case OpKind::Reduce: return reduce();
    case OpKind::AllToAll: return all_to_all();
    case OpKind::Scatter: return scatter();
    case OpKind::Gather: return gather();
    case OpKind::Send:
    case OpKind::Wait:
    case OpKind::WaitAll:
    case OpKind::WaitStream:
    case OpKind::RecordEvent:
    case OpKind::WaitEvent:
    case OpKind::OverlapRegion: return;  // no new value; their order is the temporal checks' concern
    case OpKind::Recv: return recv();
    case OpKind::Cast: return linear();
    case OpKind::FP8Dequantize: return fp8_dequantize();
    case OpKind::LossScale: return loss_scale();
    case OpKind::AmaxUpdate: return amax();
    case OpKind::AmaxHistory: return amax_history();
    case OpKind::FP8Scale: return fp8_scale();
    case OpKind::Reshape: return reshape();
    case OpKind::Transpose: return transpose();
    case OpKind::Reinterpret: return reinterpret();
    case OpKind::Convert: return convert();
    case OpKind::SPMDGuard: return guard();
    case OpKind::Expand: return expand();
    case OpKind::PointwiseGrad: return pointwise_grad();
    case OpKind::NormGrad: return norm_grad();
    case OpKind::AttentionGrad: return attention_grad();
    case OpKind::EmbeddingGrad: return embedding_grad();
    case OpKind::CrossEntropyGrad: return cross_entropy_grad();
    case OpKind::TopKGrad: return topk_grad();
    case OpKind::MoEDispatch: return moe_dispatch();
    case OpKind::MoECombine: return moe_combine();
    case OpKind::ExpertCompute: return expert_compute();
    case OpKind::MoEGateGrad: return moe_gate_grad();
    case OpKind::Slice: return slice_op();
    case OpKind::Split: return split_op();
    case OpKind::Concat: return concat_op(false);
    case OpKind::Stack: return concat_op(true);
    case OpKind::Pad: return pad_op();
    case OpKind::Arange: return arange();
    case OpKind::Full: return full();
    case OpKind::RoPE: return rope();
    case OpKind::IndexSelect: return index_select();
    case OpKind::IndexAdd: return index_add();
    case OpKind::ZeROGatherParam: return zero_gather();
    case OpKind::ZeROScatterGrad: return zero_scatter();
    case OpKind::ZeROPartitionOptState: return zero_partition();
    case OpKind::RingRotate: return ring_rotate();
    case OpKind::RingAttentionStep: return ring_attention_step();
    case OpKind::RingAttention: return ring_attention();
    case OpKind::LoadBalance: return load_balance();
    case OpKind::AdamWUpdate:
    case OpKind::SGDUpdate: return optimizer_update();
    case OpKind::GradNormSq: return grad_norm_sq();
    case OpKind::ClipCoef: return clip_coef();
  }
}

// invariant-mix: on some axis one of `which` inputs is I and another is not.
bool Checker::invariant_ok(std::initializer_list<int> which) {
  for (int a = 0; a < axes(); ++a) {
    int inv = -1, other = -1;
    for (int i : which) {
      if (i >= n_in()) continue;
      if (pin(i, a).is_i()) inv = i;
      else other = i;
    }
    if (inv >= 0 && other >= 0) {
      std::vector<Note> notes;
      origin_note(notes, in(inv), a);
      Fix f;
      notes.push_back(invariant_fix(inv, other, a, f));
      report(CheckId::InvariantMix,
             fmt::format("{} combines {}, which is I over {}, with {}, which is {}; an invariant value mixes with others only "
                         "through an explicit Convert",
                         opname(), iname(inv), axn(a), iname(other), ps(pin(other, a))),
             iname(inv), std::move(notes));
      diags_.back().fix = std::move(f);
      return false;
    }
  }
  return true;
}

// The fix of an I operand `inv` meeting an R operand `other` over axis a. Converting the I operand to R makes this
// op's result R, and every later op that meets the invariant values it came with reports again (one finding
// became seven, issue 23). Where the R operand was made R is usually the mistake: an AllReduce or AllGather that
// should leave an invariant value (`dst: I`, Megatron's g; a machine fix), or a declared replicated tensor whose
// gradient, computed from invariant values, is invariant too (declare it I). Else the explicit Convert.
Note Checker::invariant_fix(int inv, int other, int a, Fix& f) const {
  NameId n = p_.ins(*op_)[static_cast<std::size_t>(other)];
  if (pin(other, a).is_r() && !p_.per_rank) {
    for (int j = op_idx_ - 1; j >= 0; --j) {
      const Op& w = p_.ops[static_cast<std::size_t>(j)];
      auto outs = p_.outs(w);
      if (std::find(outs.begin(), outs.end(), n) == outs.end()) continue;
      if ((w.kind == OpKind::AllReduce || w.kind == OpKind::AllGather) && !w.attrs.dst_invariant && (w.attrs.axes >> a & 1u)) {
        Op changed = w;
        changed.attrs.dst_invariant = true;
        f = {FixKind::Replace, j, w.loc.line, "", print_op(p_, changed)};
        return {w.loc, fmt::format("fix: leave {} invariant where it is reduced: `dst: I` on this {} (Megatron's g: its backward is the identity), so "
                                   "it meets {} as I",
                                   iname(other), op_name(w.kind), iname(inv))};
      }
      break;
    }
    for (const auto& t : p_.tensors)
      if (t.name == n)
        return fix(fmt::format("declare {} I over {} (every rank computes the same gradient for it from invariant values, with nothing to reduce; "
                               "Megatron's replicated norm weights), or, if its gradient must be reduced, convert {} explicitly: insert "
                               "{{op: Convert, in: [{}], out: {}_r, axis: {}, to: R}} before this op",
                               iname(other), axn(a), iname(inv), iname(inv), iname(inv), axn(a)));
  }
  return fix(fmt::format("make both I, or convert explicitly: insert {{op: Convert, in: [{}], out: {}_r, axis: {}, to: R}} before this op (its backward "
                         "all-reduces the gradient)",
                         iname(inv), iname(inv), axn(a)));
}

void Checker::partial_misuse(int i, int a, const std::string& why, const std::string& fix_text) {
  std::vector<Note> notes;
  origin_note(notes, in(i), a);
  notes.push_back(fix(fix_text.empty() ? fix_allreduce(iname(i), a, pin(i, a)) : fix_text));
  report(CheckId::PartialMisuse, fmt::format("{} applied to {}, which is {} over {}; {}", opname(), iname(i), ps(pin(i, a)), axn(a), why),
         iname(i), std::move(notes));
}

void Checker::sharded_dim(int i, int a, int d, const std::string& why) {
  std::vector<Note> notes;
  origin_note(notes, in(i), a);
  notes.push_back(fix(fix_allgather(iname(i), a, d)));
  report(CheckId::ShardedReductionDim,
         fmt::format("{} needs dim {} of {} whole, but it is sharded {} over {}; {}", opname(), d, iname(i), ps(pin(i, a)), axn(a), why),
         iname(i), std::move(notes));
}

void Checker::layout_conflict(const std::string& msg, const std::string& tensor, int i, int a, const std::string& fix_text) {
  std::vector<Note> notes;
  if (i >= 0) origin_note(notes, in(i), a);
  if (!fix_text.empty()) notes.push_back(fix(fix_text));
  report(CheckId::LayoutConflict, msg, tensor, std::move(notes));
}

void Checker::illegal(const std::string& msg, int a, const std::string& fix_text) {
  std::vector<Note> notes;
  if (a >= 0) origin_note(notes, in(0), a);
  if (!fix_text.empty()) notes.push_back(fix(fix_text));
  report(CheckId::IllegalCollective, msg, iname(0), std::move(notes));
}

// Right-aligned broadcast of two shapes; false after a report.
bool Checker::broadcast_shape(const Value& x, const Value& y, Value& o) {
  int r = std::max(x.rank, y.rank);
  o.rank = static_cast<std::uint8_t>(r);
  for (int k = 0; k < r; ++k) {
    int dx = k - (r - x.rank), dy = k - (r - y.rank);
    ExprId ex = dx >= 0 ? x.shape[static_cast<std::size_t>(dx)] : -1;
    ExprId ey = dy >= 0 ? y.shape[static_cast<std::size_t>(dy)] : -1;
    auto is_one = [&](ExprId e) { return e >= 0 && pool_.is_const(e) && pool_.value(e) == 1; };
    if (ex < 0 || is_one(ex)) o.shape[static_cast<std::size_t>(k)] = ey >= 0 ? ey : ex;
    else if (ey < 0 || is_one(ey)) o.shape[static_cast<std::size_t>(k)] = ex;
    else {
      if (!same_dim(ex, ey, [&] { return fmt::format("{} broadcasts dim {} of {} against dim {} of {}", opname(), dx, iname(0), dy, iname(1)); }, iname(1)))
        return false;
      o.shape[static_cast<std::size_t>(k)] = ex;
    }
  }
  return true;
}

// An input dim of size 1 broadcast against a larger one must not be sharded: a shard of one element leaves the
// other ranks an empty slice ([4, 0] does not broadcast against [4, 3]; torch.chunk gives rank 0 the element).
// DTensor replicates such a dim before the op; here that is the user's AllGather. False after a report.
bool Checker::broadcast_shards_ok(const Value& o) {
  for (int i = 0; i < n_in(); ++i) {
    const Value& v = in(i);
    for (int d = 0; d < v.rank; ++d) {
      int k = d + (o.rank - v.rank);
      if (!is_one(v.shape[static_cast<std::size_t>(d)]) || is_one(o.shape[static_cast<std::size_t>(k)])) continue;
      std::uint32_t m = shard_mask(v, d);
      if (!m || is_one(mask_size(m))) continue;
      int a = std::countr_zero(m);
      std::vector<Note> notes;
      origin_note(notes, v, a);
      notes.push_back(fix(fix_allgather(iname(i), a, d) + ", or keep the size-1 dim replicated"));
      report(CheckId::ShapeMismatch,
             fmt::format("{} broadcasts dim {} of {} (size 1) against size {}, but that dim is sharded over {}: one rank holds its element and "
                         "the others an empty slice, which does not broadcast",
                         opname(), d, iname(i), dstr(o.shape[static_cast<std::size_t>(k)]), mask_names(m)),
             iname(i), std::move(notes));
      return false;
    }
  }
  return true;
}

// A placement of input i (rank ri) renumbered into an output of rank ro (right-aligned).
Placement Checker::shift(Placement pl, int ri, int ro) {
  if (pl.is_s()) pl.dim = static_cast<std::int16_t>(pl.dim + (ro - ri));
  return pl;
}

// Input i is R over a and is read as its local slice of its dim d, to match a shard over a of the other
// operand (R with S(d) gives S(d)). That slice is on this rank only if no axis inner to a already shards
// dim d of input i (mesh order, rule (d)); otherwise layout-conflict. Found by the numeric oracle.
bool Checker::slice_ok(int i, int a, int d, int other) {
  const Value& v = in(i);
  if (d < 0 || d >= v.rank || is_one(v.shape[static_cast<std::size_t>(d)])) return true;
  std::uint32_t m = shard_mask(v, d);
  for (int b = a + 1; b < axes(); ++b)
    if (m & (1u << b)) {
      layout_conflict(fmt::format("{} reads {} ({} over {}) as its local slice of dim {} to match {} (sharded over {}), but dim {} of {} is "
                                  "already sharded over {}, which is inner to {}: the slice a rank needs is held by another rank",
                                  opname(), iname(i), ps(pin(i, a)), axn(a), d, iname(other), axn(a), d, iname(i), axn(b), axn(a)),
                      iname(i), i, b, fmt::format("gather {} over {} first, or shard it over {} as well", iname(i), axn(b), axn(a)));
      return false;
    }
  return true;
}

bool Checker::scatter_dim_fix(const Value& v, int a, int want, std::vector<Note>& notes, Fix& fix) const {
  int o = v.origin[static_cast<std::size_t>(a)];
  if (o < 0 || want < 0) return false;
  const Origin& org = origins_[static_cast<std::size_t>(o)];
  if (org.op < 0 || org.op >= static_cast<int>(p_.ops.size()) || !org.pl.is_s()) return false;
  const Op& op = p_.ops[static_cast<std::size_t>(org.op)];
  if (!(op.kind == OpKind::ReduceScatter || op.kind == OpKind::Scatter || op.kind == OpKind::AllToAll)) return false;
  if (p_.per_rank || want >= v.rank || org.pl.dim == want) return false;
  Op changed = op;
  changed.attrs.dim = static_cast<std::int16_t>(want);
  const char* attr = op.kind == OpKind::AllToAll ? "split_dim" : "dim";
  notes.push_back({op.loc, fmt::format("fix: {} along dim {} instead: `{}: {}` on this {}", op.kind == OpKind::AllToAll ? "split" : "scatter", want, attr,
                                       want, op_name(op.kind))});
  fix = {FixKind::Replace, org.op, op.loc.line, "", print_op(p_, changed)};
  return true;
}

void Checker::check_outputs(const std::vector<std::pair<std::uint32_t, std::uint32_t>>& outs) {
  op_idx_ = -1;
  if (inferred_) inferred_->assign(p_.outputs.size(), std::nullopt);
  for (auto [j, slot] : outs) {
    const OutputDecl& od = p_.outputs[j];
    const Value& v = env_[slot];
    const std::string& name = p_.name(od.name);
    if (inferred_ && !v.poisoned && v.defined) (*inferred_)[j] = v.pl;
    if (v.poisoned || !v.defined || !fp8_output_ok(od, v)) continue;
    for (int a = 0; a < axes(); ++a) {
      Placement want = od.has_placement ? od.placement[static_cast<std::size_t>(a)] : Placement::r();
      if (want.is_s()) {
        if (want.dim < -static_cast<int>(v.rank) || want.dim >= v.rank) {
          diags_.push_back({CheckId::ShapeMismatch, Severity::Error, od.loc,
                            fmt::format("output {} is declared S({}) over {}, out of range for its rank {}", name, want.dim, axn(a), v.rank), -1, name, {}});
          break;
        }
        if (want.dim < 0) want.dim = static_cast<std::int16_t>(want.dim + v.rank);
      }
      Placement got = pl_of(v, a);
      // No placement declared claims one value: P (a summand) and V (per-rank values) are wrong, S is assembled.
      if (od.has_placement ? satisfies(got, want) : !(got.is_p() || got.is_v())) continue;
      Diagnostic d;
      d.loc = od.loc;
      d.tensor = name;
      origin_note(d.notes, v, a);
      if (got.is_p() && !want.is_p()) {
        // Every axis the output is still pending the same reduction over (an amax pending over dp and tp
        // needs both): one collective over all of them.
        std::uint32_t mask = 0;
        bool all_r = true;
        for (int b = a; b < axes(); ++b) {
          Placement wb = od.has_placement ? od.placement[static_cast<std::size_t>(b)] : Placement::r();
          if (pl_of(v, b) == got && !wb.is_p() && (b == a || !wb.is_s())) mask |= 1u << b, all_r &= !wb.is_s();
        }
        std::string axs, list;
        int n = 0;
        for (int b = 0; b < axes(); ++b)
          if (mask & (1u << b)) axs += (n ? ", " : "") + axn(b), list += (n ? " and " : "") + axn(b), ++n;
        if (n > 1) axs = "[" + axs + "]";
        d.id = CheckId::PartialOutput;
        d.message = od.has_placement
                        ? fmt::format("output {} is still {} over {}, but it is declared {}: every rank holds only a summand", name, ps(got), list, ps(want))
                        : fmt::format("output {} is still {} over {}: every rank holds only a summand, and an output is P only when its declared "
                                      "placement says so",
                                      name, ps(got), list);
        std::string rop = got.op == ReduceOp::Sum ? "" : fmt::format(", reduce: {}", reduce_name(got.op));
        std::string coll = want.is_s() && n == 1
                               ? fmt::format("{{op: ReduceScatter, in: [{}], out: {}, axis: {}, dim: {}{}}}", name, name, axs, want.dim, rop)
                               : fmt::format("{{op: AllReduce, in: [{}], out: {}, axis: {}{}}}", name, name, axs, rop);
        if (!all_r && !(want.is_s() && n == 1)) coll.clear();
        if (!coll.empty()) {
          d.notes.push_back({od.loc, fmt::format("fix: reduce it at the end of `ops:`: append {}", coll)});
          if (!p_.per_rank) d.fix = {FixKind::Append, -1, 0, "ops", coll};
        }
      } else if (!od.has_placement) {
        d.id = CheckId::PlacementMismatch;
        d.message = fmt::format("output {} is V over {}: its ranks hold different values, and an output with no declared placement claims one value",
                                name, axn(a));
        d.notes.push_back({od.loc, fmt::format("fix: declare `placement: {{{}: V}}` if per-rank values are meant; otherwise make the ranks agree "
                                               "(e.g. Dropout with the default `rng: shared`)",
                                               axn(a))});
      } else {
        d.id = CheckId::PlacementMismatch;
        if (got.is_s() && want.is_s() && got.dim == want.dim)  // the same axes, another shard order: say both orders
          d.message = fmt::format("output {} is {{{}}}, but it is declared {{{}}}: the same axes cut dim {} in another order, so each rank holds other "
                                  "rows than declared",
                                  name, placements_text(p_, v.pl), placements_text(p_, od.placement), got.dim);
        else
          d.message = fmt::format("output {} is {} over {}, but it is declared {}", name, axis_placement_text(p_, v.pl, a), axn(a),
                                  axis_placement_text(p_, od.placement, a));
        if (got.is_s() && want.is_s()) scatter_dim_fix(v, a, want.dim, d.notes, d.fix);
      }
      diags_.push_back(std::move(d));
      break;
    }
    if (od.has_shape) {
      if (od.shape.size() != v.rank) {
        diags_.push_back({CheckId::ShapeMismatch, Severity::Error, od.loc,
                          fmt::format("output {} has shape {}, but it is declared {}", name, sstr(v.dims()), sstr(od.shape)), -1, name, {}});
        continue;
      }
      for (std::size_t d = 0; d < od.shape.size(); ++d) {
        Decision dec = obl_.decide(OblKind::Equal, v.shape[d], od.shape[d]);
        if (dec == Decision::Fails) {
          diags_.push_back({CheckId::ShapeMismatch, Severity::Error, od.loc,
                            fmt::format("output {} has shape {}, but it is declared {}", name, sstr(v.dims()), sstr(od.shape)), -1, name, {}});
          break;
        }
        if (dec == Decision::Deferred && obl_.first_time(OblKind::Equal, v.shape[d], od.shape[d]))
          obl_.push({OblKind::Equal, v.shape[d], od.shape[d], CheckId::ShapeMismatch, od.loc, -1, name,
                     fmt::format("dim {} of output {} ({}) must equal its declared {}", d, name, dstr(v.shape[d]), dstr(od.shape[d])), {}});
      }
    }
  }
}

}  // namespace detail


std::vector<Diagnostic> check_spatial(const Program& program, const SpatialOptions& options) {
  // A local-view program's values are each rank's arrays, with no placement: the placement rules do not apply
  // (its shapes are checked by a run, interp/local_view.h).
  if (program.local_view) return {};
  return detail::Checker(program, options).run();
}

}  // namespace spmd
