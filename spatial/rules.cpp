// spatial/rules.cpp - the placement and shape rule of every op, per mesh axis (one exhaustive switch).
//
// Each rule reads its inputs' global shapes and per-axis placements and either writes the outputs'
// or reports a diagnostic (and the outputs are then poisoned: no cascades). Shape claims go through
// Obligations: decided at once when concrete, proved by Z3 at the end when symbolic.
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <bit>
#include <iterator>
#include <numeric>
#include <set>
#include <unordered_map>
#include <stdexcept>

#include "ir/ranks.h"
#include "spatial/obligations.h"
#include "spatial/spatial.h"

namespace spmd {

namespace {

struct Value {
  std::array<ExprId, kMaxRank> shape{};
  std::uint8_t rank = 0;
  Placements pl{};
  std::array<std::int32_t, kMaxAxes> origin;  // where this axis's placement arose (Checker::origins_), -1 = nowhere
  DType dtype = DType::F32;
  bool defined = false;
  bool poisoned = false;
  bool uneven = false;
  std::uint8_t strict = 0;  // dims whose shard this op created: they must divide evenly even if the input is uneven
  Value() { origin.fill(-1); }
  std::span<const ExprId> dims() const { return {shape.data(), rank}; }
};

struct Origin {
  Loc loc;
  std::string tensor;  // the value the placement arose on
  Placement pl;
  int axis;
  std::string why;     // empty for a declaration
};

std::vector<Loc> var_locs(const Program& p) {
  std::vector<Loc> out;
  for (const auto& v : p.vars) {
    auto it = p.size_locs.find(v.name);
    out.push_back(it == p.size_locs.end() ? Loc{} : it->second);
  }
  return out;
}

class Checker {
 public:
  Checker(const Program& p, const SpatialOptions& o)
      : p_(p), pool_(p.exprs), obl_(pool_, p.vars, var_locs(p), o.z3_timeout_ms), types_(o.types), inferred_(o.inferred_outputs) {}

  std::vector<Diagnostic> run() {
    if (types_) {
      types_->decls.clear();
      types_->outs.clear();
      types_->out_base.assign(p_.ops.size(), 0);
      types_->outs.reserve(p_.ops.size());
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
      std::uint32_t pc, end;
    };
    std::vector<State> states;
    for (const auto& prog : space.programs) {
      env_.assign(p_.names.size(), Value());
      origins_.clear();
      for (const auto& t : p_.tensors) declare(t);
      recording_decls_ = false;  // declarations are exported once (every program declares the same)
      states.push_back({std::move(env_), std::move(origins_), prog.first_op, prog.first_op + prog.n_ops});
    }
    bool force = false;  // no program could advance: let waiting Recvs go on without a Send's type
    for (;;) {
      bool progress = false, pending = false;
      for (auto& st : states) {
        if (st.pc == st.end) continue;
        env_ = std::move(st.env);
        origins_ = std::move(st.origins);
        while (st.pc < st.end) {
          if (!force && recv_waits(static_cast<int>(st.pc))) break;
          step(static_cast<int>(st.pc++));
          progress = true;
          force = false;
        }
        pending |= st.pc < st.end;
        st.env = std::move(env_);
        st.origins = std::move(origins_);
      }
      if (!pending) break;
      force = !progress;
    }
    for (auto& st : states) {
      env_ = std::move(st.env);
      origins_ = std::move(st.origins);
      check_outputs();
    }
    compare_collectives(pairs, space);
    if (types_) types_->exprs = pool_;
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

 private:
  // ---- context helpers ----------------------------------------------------------------------
  int axes() const { return p_.axis_count(); }
  const std::string& axn(int a) const { return p_.mesh[static_cast<std::size_t>(a)].name; }
  ExprId axis_size(int a) const { return p_.mesh[static_cast<std::size_t>(a)].size; }
  std::string axsize(int a) const { return dstr(axis_size(a)); }
  std::string opname() const { return std::string(op_name(op_->kind)); }
  const Value& in(int i) const { return *in_[static_cast<std::size_t>(i)]; }
  int n_in() const { return static_cast<int>(in_.size()); }
  const std::string& iname(int i) const { return p_.name(p_.ins(*op_)[static_cast<std::size_t>(i)]); }
  std::string oname(int i) const {
    auto outs = p_.outs(*op_);
    return static_cast<std::size_t>(i) < outs.size() ? p_.name(outs[static_cast<std::size_t>(i)]) : iname(0);
  }
  Loc here() const { return op_->loc; }
  const OpAttrs& at() const { return op_->attrs; }
  std::string ps(Placement pl) const { return to_string(pl); }
  std::string dstr(ExprId e) const { return pool_.str(e, p_.vars); }
  std::string sstr(std::span<const ExprId> shape) const {
    std::string t = "[";
    for (std::size_t i = 0; i < shape.size(); ++i) t += (i ? ", " : "") + dstr(shape[i]);
    return t + "]";
  }

  void report(CheckId id, std::string msg, const std::string& tensor, std::vector<Note> notes = {}) {
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

  Note fix(const std::string& text) const { return {here(), "fix: " + text}; }

  // Where the placement of `v` on axis `a` arose, as a note (none if unknown).
  void origin_note(std::vector<Note>& notes, const Value& v, int a) const {
    int o = v.origin[static_cast<std::size_t>(a)];
    if (o < 0) return;
    const Origin& org = origins_[static_cast<std::size_t>(o)];
    if (org.why.empty())
      notes.push_back({org.loc, fmt::format("{} is declared {} over {} here", org.tensor, ps(org.pl), axn(org.axis))});
    else
      notes.push_back({org.loc, fmt::format("{} became {} over {} here: {}", org.tensor, ps(org.pl), axn(org.axis), org.why)});
  }

  int new_origin(Loc l, std::string tensor, Placement pl, int a, std::string why) {
    origins_.push_back({l, std::move(tensor), pl, a, std::move(why)});
    return static_cast<int>(origins_.size() - 1);
  }
  // Sets a placement that this op creates (not one inherited from an input). A new shard must divide evenly.
  void set_new(Value& v, int a, Placement pl, std::string why) {
    v.pl[static_cast<std::size_t>(a)] = pl;
    v.origin[static_cast<std::size_t>(a)] = pl.is_r() ? -1 : new_origin(here(), oname(0), pl, a, std::move(why));
    if (pl.is_s()) v.strict = static_cast<std::uint8_t>(v.strict | (1u << pl.dim));
  }
  // Sets a placement inherited from input `i`: keeps where it arose, unless this op moves a shard to another dim.
  void set_from(Value& v, int a, Placement pl, int i) {
    Placement before = pin(i, a);
    v.pl[static_cast<std::size_t>(a)] = pl;
    if (pl == before || pl.is_r())
      v.origin[static_cast<std::size_t>(a)] = pl.is_r() ? -1 : in(i).origin[static_cast<std::size_t>(a)];
    else
      v.origin[static_cast<std::size_t>(a)] =
          new_origin(here(), oname(0), pl, a, fmt::format("{} maps {} of {} to {}", opname(), ps(before), iname(i), ps(pl)));
  }

  static Placement pl_of(const Value& v, int a) { return v.pl[static_cast<std::size_t>(a)]; }
  Placement pin(int i, int a) const { return pl_of(in(i), a); }

  Value& out(int i = 0) { return out_[static_cast<std::size_t>(i)]; }
  void set_shape(Value& v, std::span<const ExprId> s) {
    v.rank = static_cast<std::uint8_t>(s.size());
    std::copy(s.begin(), s.end(), v.shape.begin());
  }

  // A dim attribute normalized against `rank`, or -1 after a shape-mismatch report.
  int norm_dim(int d, int rank, const std::string& what, const std::string& tensor) {
    if (d == kUnset) return -1;
    if (d < -rank || d >= rank) {
      report(CheckId::ShapeMismatch, fmt::format("{} {} is out of range for {}, which has rank {}", opname(), what, tensor, rank), tensor);
      return -1;
    }
    return d < 0 ? d + rank : d;
  }

  std::string fix_allreduce(const std::string& t, int a, Placement p = Placement::p()) const {
    std::string rop = p.is_p() && p.op != ReduceOp::Sum ? fmt::format(", reduce: {}", reduce_name(p.op)) : "";
    return fmt::format("reduce first, e.g. insert {{op: AllReduce, in: [{}], out: {}_reduced, axis: {}{}}} before this op", t, t, axn(a), rop);
  }
  std::string fix_allgather(const std::string& t, int a, int d) const {
    return fmt::format("gather first, e.g. insert {{op: AllGather, in: [{}], out: {}_full, axis: {}, dim: {}}} before this op", t, t, axn(a), d);
  }

  // ---- obligations --------------------------------------------------------------------------
  // Claims a == b (e.g. a contraction dim); false after a shape-mismatch report.
  bool same_dim(ExprId a, ExprId b, const std::string& what, const std::string& tensor) {
    Decision d = obl_.decide(OblKind::Equal, a, b);
    if (d == Decision::Holds) return true;
    if (d == Decision::Fails) {
      report(CheckId::ShapeMismatch, fmt::format("{}: {} != {}", what, dstr(a), dstr(b)), tensor);
      return false;
    }
    if (obl_.first_time(OblKind::Equal, a, b))
      obl_.push({OblKind::Equal, a, b, CheckId::ShapeMismatch, here(), op_idx_, tensor, fmt::format("{} ({} == {}) must hold", what, dstr(a), dstr(b)), {}});
    return true;
  }

  // Axes (bitmask, mesh order) that shard dim d of v.
  std::uint32_t shard_mask(const Value& v, int d) const {
    std::uint32_t m = 0;
    for (int a = 0; a < axes(); ++a)
      if (v.pl[static_cast<std::size_t>(a)].is_s(d)) m |= 1u << a;
    return m;
  }
  ExprId mask_size(std::uint32_t m) {
    ExprId s = pool_.constant(1);
    for (int a = 0; a < axes(); ++a)
      if (m & (1u << a)) s = pool_.mul(s, axis_size(a));
    return s;
  }
  std::string mask_names(std::uint32_t m) const {
    std::string s;
    for (int a = 0; a < axes(); ++a)
      if (m & (1u << a)) s += (s.empty() ? "" : " x ") + axn(a);
    return s;
  }

  // Every sharded dim of v must split evenly over its axes (unless declared uneven).
  bool check_local(Value& v, const std::string& name, Loc loc, std::vector<Note> notes = {}) {
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
                               strict ? "a shard created here must be even (choose sizes divisible by the axis, or shard another dim)"
                                      : "declare `uneven: true` on the input if padded shards are intended");
      dg.notes = std::move(notes);
      diags_.push_back(std::move(dg));
      return false;
    }
    return true;
  }

  // Exact divisions and positive dims in a declared shape expression.
  void check_expr(ExprId e, Loc loc, const std::string& what) {
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

  void declare_sizes() {
    for (const auto& ax : p_.mesh) check_expr(ax.size, ax.loc, "the size of mesh axis " + ax.name);
    for (const auto& [name, e] : p_.sizes) {
      auto it = p_.size_locs.find(name);
      check_expr(e, it == p_.size_locs.end() ? Loc{} : it->second, "size " + name);
    }
  }

  // ---- declarations -------------------------------------------------------------------------
  void declare(const TensorDecl& t) {
    Value v;
    v.defined = true;
    set_shape(v, t.shape);
    v.pl = t.placement;
    v.dtype = t.dtype;
    v.uneven = t.uneven;
    const std::string& name = p_.name(t.name);
    for (int a = 0; a < axes(); ++a)
      if (!v.pl[static_cast<std::size_t>(a)].is_r())
        v.origin[static_cast<std::size_t>(a)] = new_origin(t.placement_loc, name, v.pl[static_cast<std::size_t>(a)], a, "");
    for (std::size_t d = 0; d < t.shape.size(); ++d)
      check_expr(t.shape[d], d < t.dim_locs.size() ? t.dim_locs[d] : t.shape_loc, fmt::format("dim {} of {}", d, name));
    op_idx_ = -1;
    if (!check_local(v, name, t.placement_loc)) v.poisoned = true;
    env_[static_cast<std::size_t>(t.name)] = v;
    if (types_ && recording_decls_) types_->decls.push_back(type_of(v));
  }

  static ValueType type_of(const Value& v) {
    ValueType t;
    t.shape = v.shape;
    t.rank = v.rank;
    t.pl = v.pl;
    t.dtype = v.dtype;
    t.ok = v.defined && !v.poisoned;
    return t;
  }

  // ---- the op loop --------------------------------------------------------------------------
  void step(int i) {
    op_ = &p_.ops[static_cast<std::size_t>(i)];
    op_idx_ = i;
    failed_ = false;
    in_.clear();
    bool poisoned = false;
    for (NameId n : p_.ins(*op_)) {
      const Value& v = env_[static_cast<std::size_t>(n)];
      if (!v.defined) undefined(n);
      else if (v.poisoned) poisoned = true;
      in_.push_back(&v);
    }
    if (!failed_ && !poisoned) {
      for (auto& o : out_) o = Value();
      apply();
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
      for (NameId n : outs)
        if (!env_[static_cast<std::size_t>(n)].defined) {
          report(CheckId::UndefinedTensor,
                 fmt::format("OverlapRegion writes {} in place, but no declaration or earlier op defines it", p_.name(n)), p_.name(n));
          env_[static_cast<std::size_t>(n)].defined = true;
          env_[static_cast<std::size_t>(n)].poisoned = true;
        }
      if (types_)
        for (NameId n : outs) types_->outs.push_back(type_of(env_[static_cast<std::size_t>(n)]));
      return;
    }
    for (std::size_t k = 0; k < outs.size(); ++k) {
      Value v;
      if (failed_ || poisoned) {
        v.poisoned = true;
      } else {
        v = out_[k];
        if (!check_local(v, p_.name(outs[k]), here())) v.poisoned = true;
        v.strict = 0;
      }
      v.defined = true;
      env_[static_cast<std::size_t>(outs[k])] = v;
      if (types_) types_->outs.push_back(type_of(v));
    }
  }

  void undefined(NameId n) {
    const std::string& name = p_.name(n);
    std::vector<std::string> known;
    for (std::size_t k = 0; k < env_.size(); ++k)
      if (env_[k].defined) known.push_back(p_.names[k]);
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

  void apply() {
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
    switch (op_->kind) {
      case OpKind::MatMul: return matmul();
      case OpKind::Add:
      case OpKind::Sub: return add_like(false);
      case OpKind::Multiply: return add_like(true);
      case OpKind::SiLU:
      case OpKind::GELU:
      case OpKind::ReLU:
      case OpKind::FP8Quantize: return nonlinear();
      case OpKind::Step: return step_rule();
      case OpKind::Dropout: return dropout();
      case OpKind::LayerNorm:
      case OpKind::RMSNorm: return norm();
      case OpKind::Softmax: return softmax();
      case OpKind::Sum:
      case OpKind::Mean: return reduce_dims();
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
      case OpKind::OverlapRegion: return;  // no new value; their order is the temporal checks' concern
      case OpKind::Recv: return recv();
      case OpKind::Cast:
      case OpKind::FP8Dequantize: return linear();
      case OpKind::LossScale: return loss_scale();
      case OpKind::AmaxUpdate: return amax();
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
      case OpKind::ZeROGatherParam:
      case OpKind::ZeROScatterGrad:
      case OpKind::ZeROPartitionOptState:
      case OpKind::RingRotate:
      case OpKind::RingAttentionStep:
      case OpKind::RingAttention:
      case OpKind::MoEDispatch:
      case OpKind::MoECombine:
      case OpKind::ExpertCompute:
        // The loader rejects these ("not supported yet"); reaching here is a bug, never a pass.
        throw std::logic_error("spatial rule reached for unsupported op " + opname());
    }
  }

  // ---- shared rule pieces -------------------------------------------------------------------
  // invariant-mix: on some axis one of `which` inputs is I and another is not.
  bool invariant_ok(std::initializer_list<int> which) {
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
        notes.push_back(fix(fmt::format("make both I, or convert explicitly: insert {{op: Convert, in: [{}], out: {}_r, axis: {}, to: R}} "
                                        "before this op (its backward all-reduces the gradient)",
                                        iname(inv), iname(inv), axn(a))));
        report(CheckId::InvariantMix,
               fmt::format("{} combines {}, which is I over {}, with {}, which is {}; an invariant value mixes with others only "
                           "through an explicit Convert",
                           opname(), iname(inv), axn(a), iname(other), ps(pin(other, a))),
               iname(inv), std::move(notes));
        return false;
      }
    }
    return true;
  }

  void partial_misuse(int i, int a, const std::string& why, const std::string& fix_text = "") {
    std::vector<Note> notes;
    origin_note(notes, in(i), a);
    notes.push_back(fix(fix_text.empty() ? fix_allreduce(iname(i), a, pin(i, a)) : fix_text));
    report(CheckId::PartialMisuse, fmt::format("{} applied to {}, which is {} over {}; {}", opname(), iname(i), ps(pin(i, a)), axn(a), why),
           iname(i), std::move(notes));
  }

  void sharded_dim(int i, int a, int d, const std::string& why) {
    std::vector<Note> notes;
    origin_note(notes, in(i), a);
    notes.push_back(fix(fix_allgather(iname(i), a, d)));
    report(CheckId::ShardedReductionDim,
           fmt::format("{} needs dim {} of {} whole, but it is sharded {} over {}; {}", opname(), d, iname(i), ps(pin(i, a)), axn(a), why),
           iname(i), std::move(notes));
  }

  void layout_conflict(const std::string& msg, const std::string& tensor, int i, int a, const std::string& fix_text) {
    std::vector<Note> notes;
    if (i >= 0) origin_note(notes, in(i), a);
    if (!fix_text.empty()) notes.push_back(fix(fix_text));
    report(CheckId::LayoutConflict, msg, tensor, std::move(notes));
  }

  void illegal(const std::string& msg, int a, const std::string& fix_text) {
    std::vector<Note> notes;
    if (a >= 0) origin_note(notes, in(0), a);
    if (!fix_text.empty()) notes.push_back(fix(fix_text));
    report(CheckId::IllegalCollective, msg, iname(0), std::move(notes));
  }

  // Right-aligned broadcast of two shapes; false after a report.
  bool broadcast_shape(const Value& x, const Value& y, Value& o) {
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
        if (!same_dim(ex, ey, fmt::format("{} broadcasts dim {} of {} against dim {} of {}", opname(), dx, iname(0), dy, iname(1)), iname(1)))
          return false;
        o.shape[static_cast<std::size_t>(k)] = ex;
      }
    }
    return true;
  }

  // A placement of input i (rank ri) renumbered into an output of rank ro (right-aligned).
  static Placement shift(Placement pl, int ri, int ro) {
    if (pl.is_s()) pl.dim = static_cast<std::int16_t>(pl.dim + (ro - ri));
    return pl;
  }

  // Input i is R over a and is read as its local slice of its dim d, to match a shard over a of the other
  // operand (R with S(d) gives S(d)). That slice is on this rank only if no axis inner to a already shards
  // dim d of input i (mesh order, rule (d)); otherwise layout-conflict. Found by the numeric oracle.
  bool slice_ok(int i, int a, int d, int other) {
    const Value& v = in(i);
    if (d < 0 || d >= v.rank || is_one(v.shape[static_cast<std::size_t>(d)])) return true;
    std::uint32_t m = shard_mask(v, d);
    for (int b = a + 1; b < axes(); ++b)
      if (m & (1u << b)) {
        layout_conflict(fmt::format("{} reads {} (R over {}) as its local slice of dim {} to match {} (sharded over {}), but dim {} of {} is "
                                    "already sharded over {}, which is inner to {}: the slice a rank needs is held by another rank",
                                    opname(), iname(i), axn(a), d, iname(other), axn(a), d, iname(i), axn(b), axn(a)),
                        iname(i), i, b, fmt::format("gather {} over {} first, or shard it over {} as well", iname(i), axn(b), axn(a)));
        return false;
      }
    return true;
  }

  // ---- compute rules ------------------------------------------------------------------------
  void nonlinear() {
    Value& o = out() = in(0);
    if (op_->kind == OpKind::FP8Quantize) o.dtype = at().has_dtype ? at().dtype : DType::FP8E4M3;
    for (int a = 0; a < axes(); ++a)
      if (pin(0, a).is_p())
        return partial_misuse(0, a, pin(0, a).op == ReduceOp::Sum ? "a nonlinear op on a pending sum is not the sum of its parts"
                                                                   : "a nonlinear op on a pending reduction is not the reduction of its parts");
  }

  // An opaque step: its output has the type of its first input; nothing is known to be linear.
  void step_rule() {
    out() = in(0);
    for (int i = 0; i < n_in(); ++i)
      for (int a = 0; a < axes(); ++a)
        if (pin(i, a).is_p()) return partial_misuse(i, a, "an opaque compute step is not known to be linear in a pending sum");
  }

  void linear() {
    Value& o = out() = in(0);
    if (at().has_dtype) o.dtype = at().dtype;
    else if (op_->kind == OpKind::FP8Dequantize) o.dtype = DType::F32;
    bool integral = o.dtype == DType::I64 || o.dtype == DType::I32 || o.dtype == DType::I8 || o.dtype == DType::Bool;
    for (int a = 0; a < axes() && integral; ++a)
      if (pin(0, a).linear_partial())
        return partial_misuse(0, a, fmt::format("rounding to {} does not commute with the pending sum (the rounded summands need not add up "
                                                "to the rounded total)",
                                                dtype_name(o.dtype)));
  }

  void loss_scale() {
    Value& o = out() = in(0);
    for (int a = 0; a < axes(); ++a)
      if (pin(0, a).is_p() && !pin(0, a).linear_partial() && at().number < 0)
        return partial_misuse(0, a, "a negative scale swaps max and min, so the pending reduction changes meaning");
    if (!at().axes) return;
    // `axis` states the normalization: divide by the ranks of these axes, turning per-rank values that are
    // pending over them into summands of the normalized loss. It must cover exactly the pending axes.
    std::uint32_t pending = 0;
    for (int a = 0; a < axes(); ++a)
      if (pin(0, a).linear_partial()) pending |= 1u << a;
    std::uint32_t missing = pending & ~at().axes, extra = at().axes & ~pending;
    std::string all = mask_names(pending);
    std::vector<std::string> list;
    for (int a = 0; a < axes(); ++a)
      if (pending & (1u << a)) list.push_back(axn(a));
    std::string axis_attr;
    for (const auto& x : list) axis_attr += (axis_attr.empty() ? "" : ", ") + x;
    if (list.size() != 1) axis_attr = "[" + axis_attr + "]";
    if (missing) {
      int a = std::countr_zero(missing);
      std::vector<Note> notes;
      origin_note(notes, in(0), a);
      notes.push_back(fix(fmt::format("normalize over every axis the loss is pending over: `axis: {}` with scale 1/({})", axis_attr, all)));
      report(CheckId::LossScaling,
             fmt::format("LossScale normalizes {} over {}, but it is {} over {} too: the pending sum over {} is never divided by its size, so "
                         "the loss and every gradient are {} times too large (Megatron's context-parallel loss scaling divided by dp instead "
                         "of dp x cp)",
                         iname(0), mask_names(at().axes), ps(pin(0, a)), mask_names(missing), mask_names(missing), dstr(mask_size(missing))),
             iname(0), std::move(notes));
      return;
    }
    if (extra) {
      int a = std::countr_zero(extra);
      report(CheckId::LossScaling,
             fmt::format("LossScale normalizes {} over {}, but it is {} over {}, not a pending sum: dividing by the size of an axis the loss is "
                         "not summed over makes it {} times too small",
                         iname(0), mask_names(at().axes), ps(pin(0, a)), axn(a), dstr(mask_size(extra))),
             iname(0), {fix(pending ? fmt::format("`axis: {}`", axis_attr) : "drop `axis` (and the division) on this LossScale")});
      return;
    }
    for (int a = 0; a < axes(); ++a)
      if (pending & (1u << a)) set_from(o, a, Placement::p(ReduceOp::Sum), 0);
  }

  void dropout() {
    Value& o = out() = in(0);
    for (int a = 0; a < axes(); ++a) {
      Placement p = pin(0, a);
      if (p.is_p()) return partial_misuse(0, a, "a random mask on a pending reduction is not the reduction of masked parts");
      if (at().rng_per_rank && (p.is_r() || p.is_i()))
        set_new(o, a, Placement::v(), fmt::format("Dropout with `rng: per_rank` draws a different mask on every rank of {}", axn(a)));
    }
  }

  void add_like(bool multiply) {
    const std::string op = opname();
    if (n_in() == 1) {
      out() = in(0);
      if (!at().has_number) return report(CheckId::ShapeMismatch, fmt::format("{} with one input needs `scalar:`", op), iname(0));
      for (int a = 0; a < axes(); ++a) {
        Placement p = pin(0, a);
        if (!p.is_p()) continue;
        if (multiply && p.linear_partial()) continue;
        if (multiply && at().number >= 0) continue;  // a non-negative scale keeps max and min
        if (multiply) return partial_misuse(0, a, "a negative scale swaps max and min");
        return partial_misuse(0, a, fmt::format("every rank adds the scalar, so the pending reduction counts it {} times", axsize(a)),
                              fmt::format("apply the scalar after the reduction: insert {{op: AllReduce, in: [{}], out: {}_reduced, axis: {}}} "
                                          "before this op",
                                          iname(0), iname(0), axn(a)));
      }
      return;
    }
    if (at().has_number) return report(CheckId::ShapeMismatch, fmt::format("{} takes either two inputs or one input and `scalar:`", op), iname(0));
    if (!invariant_ok({0, 1})) return;
    Value& o = out();
    if (!broadcast_shape(in(0), in(1), o)) return;
    o.dtype = in(0).dtype;
    o.uneven = in(0).uneven || in(1).uneven;
    int ro = o.rank;
    for (int a = 0; a < axes(); ++a) {
      Placement x = shift(pin(0, a), in(0).rank, ro), y = shift(pin(1, a), in(1).rank, ro);
      if (x.is_p() || y.is_p()) {
        int pi = x.is_p() ? 0 : 1, oi = 1 - pi;
        Placement other = pi == 0 ? y : x;
        Placement part = pi == 0 ? x : y;
        if (multiply) {
          if (other.is_p()) return partial_misuse(1, a, "a product of two pending sums is not the sum of the per-rank products");
          if (!part.linear_partial()) return partial_misuse(pi, a, "a product does not commute with a pending max or min");
          if (other.is_r()) {
            set_from(o, a, part, pi);
            continue;
          }
          return partial_misuse(pi, a, fmt::format("multiplying by {}, which is {} over {}, scales each summand by a different value", iname(oi),
                                                   ps(other), axn(a)));
        }
        if (other.is_p() && other == part && part.linear_partial()) {
          set_from(o, a, part, pi);
          continue;
        }
        if (other.is_p())
          return partial_misuse(pi, a, fmt::format("{} is {}; pending reductions of different kinds do not add up", iname(oi), ps(other)),
                                fmt::format("reduce both operands first ({} with reduce: {}, {} with reduce: {}), then combine them", iname(pi),
                                            reduce_name(part.op), iname(oi), reduce_name(other.op)));
        if (!part.linear_partial()) return partial_misuse(pi, a, "an addition does not commute with a pending max or min");
        std::string why = other.is_r()
                              ? fmt::format("every rank adds {} (R), so the pending sum counts it {} times (the row-parallel bias bug)", iname(oi), axsize(a))
                              : fmt::format("{} is {}; adding per-rank values to a pending sum is not affine-safe", iname(oi), ps(other));
        return partial_misuse(pi, a, why,
                              fmt::format("add {} after the reduction: insert {{op: AllReduce, in: [{}], out: {}_reduced, axis: {}}} before this op "
                                          "and add {} to its result",
                                          iname(oi), iname(pi), iname(pi), axn(a), iname(oi)));
      }
      if (x == y) {
        set_from(o, a, x, 0);
      } else if (x.is_r() || (x.is_v() && y.is_s())) {  // R (or V) with S(d): read as its local slice, so S(d)
        if (y.is_s() && !slice_ok(0, a, y.dim - (ro - in(0).rank), 1)) return;
        set_from(o, a, y, 1);
      } else if (y.is_r() || (y.is_v() && x.is_s())) {
        if (x.is_s() && !slice_ok(1, a, x.dim - (ro - in(1).rank), 0)) return;
        set_from(o, a, x, 0);
      } else if (x.is_s() && y.is_s()) {
        return layout_conflict(fmt::format("{} combines {} (S({}) over {}) with {} (S({}) over {} in the output's dims): the two are split along "
                                           "different dims, so their local pieces do not line up",
                                           op, iname(0), pin(0, a).dim, axn(a), iname(1), pin(1, a).dim, axn(a)),
                               iname(1), 1, a, fix_allgather(iname(1), a, pin(1, a).dim));
      } else {
        set_new(o, a, Placement::v(), fmt::format("{} of {} and {} gives per-rank values", op, ps(x), ps(y)));  // V with S or V
      }
    }
  }

  void matmul() {
    const Value& A = in(0);
    const Value& B = in(1);
    int ra = A.rank, rb = B.rank;
    if (ra < 2 || rb < 2)
      return report(CheckId::ShapeMismatch, fmt::format("MatMul needs operands of rank >= 2; {} has rank {} and {} has rank {}", iname(0), ra, iname(1), rb),
                    iname(ra < 2 ? 0 : 1));
    int kA = ra - 1, mA = ra - 2, kB = rb - 2, nB = rb - 1;
    if (!same_dim(A.shape[static_cast<std::size_t>(kA)], B.shape[static_cast<std::size_t>(kB)],
                  fmt::format("MatMul contracts dim {} of {} with dim {} of {}", kA, iname(0), kB, iname(1)), iname(1)))
      return;
    int ro = std::max(ra, rb);
    Value& o = out();
    o.rank = static_cast<std::uint8_t>(ro);
    o.dtype = A.dtype;
    o.uneven = A.uneven || B.uneven;
    // Batch dims broadcast right-aligned (B of rank 2 broadcasts over all of A's batch dims).
    for (int k = 0; k < ro - 2; ++k) {
      int da = k - (ro - ra), db = k - (ro - rb);
      ExprId ea = da >= 0 ? A.shape[static_cast<std::size_t>(da)] : -1;
      ExprId eb = db >= 0 ? B.shape[static_cast<std::size_t>(db)] : -1;
      if (ea >= 0 && eb >= 0 && !same_dim(ea, eb, fmt::format("MatMul batch dim {} of {} against dim {} of {}", da, iname(0), db, iname(1)), iname(1)))
        return;
      o.shape[static_cast<std::size_t>(k)] = ea >= 0 ? ea : eb;
    }
    o.shape[static_cast<std::size_t>(ro - 2)] = A.shape[static_cast<std::size_t>(mA)];
    o.shape[static_cast<std::size_t>(ro - 1)] = B.shape[static_cast<std::size_t>(nB)];
    if (!invariant_ok({0, 1})) return;
    for (int a = 0; a < axes(); ++a) {
      Placement x = pin(0, a), y = pin(1, a);
      if (x.is_p() || y.is_p()) {
        int pi = x.is_p() ? 0 : 1;
        Placement other = pi == 0 ? y : x;
        if (other.is_p()) return partial_misuse(1, a, "a product of two pending sums is not the sum of the per-rank products");
        if (!(pi == 0 ? x : y).linear_partial()) return partial_misuse(pi, a, "a matrix product does not commute with a pending max or min");
        if (!other.is_r())
          return partial_misuse(pi, a, fmt::format("the other operand, {}, is {} over {}, so each rank's summand is multiplied by a different "
                                                   "piece",
                                                   iname(1 - pi), ps(other), axn(a)));
        set_from(o, a, pi == 0 ? x : y, pi);
        continue;
      }
      if (x.is_i() && y.is_i()) {
        set_from(o, a, x, 0);
        continue;
      }
      bool xk = x.is_s(kA), yk = y.is_s(kB);
      if (xk && yk) {
        set_new(o, a, Placement::p(), fmt::format("MatMul contracts a dim sharded S({}) x S({}) over {}", kA, kB, axn(a)));
        continue;
      }
      if (xk || yk) {
        int si = xk ? 0 : 1;
        std::vector<Note> notes;
        origin_note(notes, in(si), a);
        notes.push_back(fix(fmt::format("shard both sides of the contraction (make {} S({}) over {}, the row-parallel pattern) or gather {} first",
                                        iname(1 - si), xk ? kB : kA, axn(a), iname(si))));
        return report(CheckId::ShapeMismatch,
                      fmt::format("MatMul contracts dim {} of {} ({} over {}) with dim {} of {} ({} over {}): one side holds a 1/{} slice of "
                                  "the contraction dim and the other the whole, so the local shapes do not fit",
                                  kA, iname(0), ps(x), axn(a), kB, iname(1), ps(y), axn(a), axsize(a)),
                      iname(si), std::move(notes));
      }
      // V with R or V gives V; V with a shard is read like R (its local slice), so the shard stays.
      if ((x.is_v() && !y.is_s()) || (y.is_v() && !x.is_s())) {
        set_new(o, a, Placement::v(), fmt::format("MatMul of {} and {} gives per-rank values", ps(x), ps(y)));
        continue;
      }
      auto out_dim_a = [&](int d) { return d + (ro - ra); };  // A's batch dims and m
      auto out_dim_b = [&](int d) { return d == nB ? ro - 1 : d + (ro - rb); };
      if (x.is_r() && y.is_r()) {
        set_from(o, a, x, 0);
      } else if (x.is_s() && (y.is_r() || y.is_v())) {
        if (x.dim < mA && !slice_ok(1, a, out_dim_a(x.dim) - (ro - rb), 0)) return;  // a batch shard slices B's batch dim
        set_from(o, a, Placement::s(out_dim_a(x.dim)), 0);
      } else if ((x.is_r() || x.is_v()) && y.is_s()) {
        if (y.dim < kB && !slice_ok(0, a, out_dim_b(y.dim) - (ro - ra), 1)) return;
        set_from(o, a, Placement::s(out_dim_b(y.dim)), 1);
      } else if (x.is_s() && y.is_s() && x.dim != mA && y.dim != nB && out_dim_a(x.dim) == out_dim_b(y.dim)) {
        set_from(o, a, Placement::s(out_dim_a(x.dim)), 0);
      } else {
        std::string what = x.dim == mA && y.dim == nB
                               ? "each rank multiplies its own rows by its own columns, so only the diagonal blocks are computed (the "
                                 "block-diagonal bug); the result would be sharded two ways"
                               : "the two operands are split along dims that do not correspond, so the result would be sharded two ways";
        return layout_conflict(fmt::format("MatMul of {} ({} over {}) and {} ({} over {}): {}", iname(0), ps(x), axn(a), iname(1), ps(y), axn(a), what),
                               iname(1), 1, a,
                               fmt::format("replicate one operand over {}: e.g. insert {{op: AllGather, in: [{}], out: {}_full, axis: {}, dim: {}}} "
                                           "before this op",
                                           axn(a), iname(1), iname(1), axn(a), y.dim));
      }
    }
  }

  // The normalized dims of a LayerNorm/RMSNorm/Sum/Mean `dims` attribute (default: the last).
  bool attr_dims(int rank, std::vector<int>& dims, const std::string& tensor) {
    dims.clear();
    if (at().dims == kNoIndex) {
      if (rank == 0) return report(CheckId::ShapeMismatch, fmt::format("{} of the scalar {} has no dim to work on", opname(), tensor), tensor), false;
      dims.push_back(rank - 1);
      return true;
    }
    for (int d : p_.int_lists[at().dims]) {
      int n = norm_dim(d, rank, "dim " + std::to_string(d), tensor);
      if (n < 0) return false;
      if (std::find(dims.begin(), dims.end(), n) != dims.end())
        return report(CheckId::ShapeMismatch, fmt::format("{} lists dim {} twice", opname(), n), tensor), false;
      dims.push_back(n);
    }
    std::sort(dims.begin(), dims.end());
    return true;
  }

  void norm() {
    const Value& x = in(0);
    std::vector<int> dims;
    if (!attr_dims(x.rank, dims, iname(0))) return;
    for (int i = 1; i < n_in(); ++i) {
      const Value& w = in(i);
      std::vector<ExprId> want;
      for (int d : dims) want.push_back(x.shape[static_cast<std::size_t>(d)]);
      if (w.rank != want.size())
        return report(CheckId::ShapeMismatch,
                      fmt::format("{} {} has shape {}, but the normalized dims of {} have shape {}", opname(), iname(i), sstr(w.dims()),
                                  iname(0), sstr(want)),
                      iname(i));
      for (std::size_t k = 0; k < want.size(); ++k)
        if (!same_dim(w.shape[k], want[k], fmt::format("{} {} dim {} against normalized dim {} of {}", opname(), iname(i), k, dims[k], iname(0)), iname(i)))
          return;
    }
    if (!invariant_ok({0, 1, 2})) return;
    out() = x;
    for (int a = 0; a < axes(); ++a) {
      Placement p = pin(0, a);
      if (p.is_p()) return partial_misuse(0, a, "normalization divides by the statistics of the whole value, which a pending reduction does not have yet");
      for (int d : dims)
        if (p.is_s(d)) return sharded_dim(0, a, d, "each rank would normalize with the statistics of its own slice");
      for (int i = 1; i < n_in(); ++i) {
        Placement w = pin(i, a);
        if (w.is_p()) return partial_misuse(i, a, "a norm's affine weight must be a whole value");
        if (w.is_s()) return sharded_dim(i, a, w.dim, "the weight and bias span the normalized dims, which must be whole on every rank");
        if (w.is_v() && !p.is_v())
          set_new(out(), a, Placement::v(), fmt::format("{} with a per-rank weight {} gives per-rank values", opname(), iname(i)));
      }
    }
  }

  void softmax() {
    out() = in(0);
    int d = norm_dim(at().dim == kUnset ? -1 : at().dim, in(0).rank, "dim", iname(0));
    if (d < 0) return;
    for (int a = 0; a < axes(); ++a) {
      Placement p = pin(0, a);
      if (p.is_p()) return partial_misuse(0, a, "softmax of a pending sum is not the sum of softmaxes");
      if (p.is_s(d)) return sharded_dim(0, a, d, "each rank would normalize over its own slice only");
    }
  }

  void reduce_dims() {
    const Value& x = in(0);
    bool mean = op_->kind == OpKind::Mean;
    std::vector<int> dims;
    if (!attr_dims(x.rank, dims, iname(0))) return;
    Value& o = out();
    o.dtype = x.dtype;
    o.uneven = x.uneven;
    std::vector<int> renumber(x.rank, -1);
    for (int d = 0, k = 0; d < x.rank; ++d) {
      bool reduced = std::find(dims.begin(), dims.end(), d) != dims.end();
      if (reduced && !at().keepdim) continue;
      o.shape[static_cast<std::size_t>(k)] = reduced ? pool_.constant(1) : x.shape[static_cast<std::size_t>(d)];
      renumber[static_cast<std::size_t>(d)] = k++;
      o.rank = static_cast<std::uint8_t>(k);
    }
    for (int a = 0; a < axes(); ++a) {
      Placement p = pin(0, a);
      if (p.is_p()) {
        if (!p.linear_partial()) return partial_misuse(0, a, "a sum does not commute with a pending max or min");
        set_from(o, a, p, 0);
      } else if (p.is_s() && std::find(dims.begin(), dims.end(), p.dim) != dims.end()) {
        if (mean && x.uneven) {
          std::vector<Note> notes;
          origin_note(notes, x, a);
          notes.push_back(fix(fix_allgather(iname(0), a, p.dim)));
          return report(CheckId::ShapeMismatch,
                        fmt::format("Mean over dim {} of {}, which is sharded unevenly over {}: the average of the local means is not the "
                                    "global mean when shards differ in size",
                                    p.dim, iname(0), axn(a)),
                        iname(0), std::move(notes));
        }
        set_new(o, a, Placement::p(mean ? ReduceOp::Avg : ReduceOp::Sum),
                fmt::format("{} over dim {}, which is sharded S({}) over {}: each rank holds the {} of its slice only", opname(), p.dim, p.dim, axn(a),
                            mean ? "mean" : "sum"));
      } else if (p.is_s()) {
        set_from(o, a, Placement::s(renumber[static_cast<std::size_t>(p.dim)]), 0);
      } else {
        set_from(o, a, p, 0);
      }
    }
  }

  void attention() {
    int b = 0, h = 1, s = 2, dd = 3;
    if (at().layout == AttnLayout::BSHD) s = 1, h = 2;
    if (at().layout == AttnLayout::SBHD) s = 0, b = 1, h = 2;
    const char* names[] = {"q", "k", "v"};
    for (int i = 0; i < 3; ++i)
      if (in(i).rank != 4)
        return report(CheckId::ShapeMismatch, fmt::format("FlashAttention {} ({}) must have rank 4 ({}), got shape {}", names[i], iname(i),
                                                          at().layout == AttnLayout::BHSD ? "batch, heads, seq, head_dim" : "see `layout`",
                                                          sstr(in(i).dims())),
                      iname(i));
    auto dim = [&](int i, int d) { return in(i).shape[static_cast<std::size_t>(d)]; };
    auto same = [&](int i, int di, int j, int dj, const char* what) {
      return same_dim(dim(i, di), dim(j, dj), fmt::format("FlashAttention {} of {} and {}", what, iname(i), iname(j)), iname(j));
    };
    if (!same(0, b, 1, b, "batch") || !same(1, b, 2, b, "batch") || !same(0, dd, 1, dd, "head_dim") || !same(1, s, 2, s, "key sequence") ||
        !same(1, h, 2, h, "heads"))
      return;
    // Grouped-query attention: q's heads a multiple of k's.
    auto qh = obl_.concrete(dim(0, h)), kh = obl_.concrete(dim(1, h));
    if (!(qh && kh && *kh > 0 && *qh % *kh == 0) && !same(0, h, 1, h, "heads")) return;
    if (!invariant_ok({0, 1, 2})) return;
    Value& o = out() = in(0);
    o.shape[static_cast<std::size_t>(dd)] = dim(2, dd);
    for (int a = 0; a < axes(); ++a) {
      Placement q = pin(0, a), k = pin(1, a), v = pin(2, a);
      for (int i = 0; i < 3; ++i)
        if (pin(i, a).is_p()) return partial_misuse(i, a, "attention is nonlinear in q, k and v");
      if (q.is_i() && k.is_i() && v.is_i()) continue;
      if (q.is_s(dd) || k.is_s(dd)) return sharded_dim(q.is_s(dd) ? 0 : 1, a, dd, "the q.k scores contract head_dim, so each rank would softmax partial scores");
      if (q == k && k == v && (q.is_r() || q.is_s(h) || q.is_s(b))) {
        set_from(o, a, q, 0);
      } else if (q.is_s(s) && k.is_r() && v.is_r()) {
        if (at().causal)
          return layout_conflict(fmt::format("causal FlashAttention with q sharded on the sequence (S({}) over {}) and whole k, v: a causal kernel aligns "
                                             "the mask to the local q block, not to its global position, so every rank but one masks the wrong keys",
                                             s, axn(a)),
                                 iname(0), 0, a, fmt::format("use RingAttention over {} (it offsets the mask per rank), or gather q first", axn(a)));
        set_from(o, a, q, 0);
      } else if (q.is_r() && k.is_r() && v.is_s(dd)) {
        set_from(o, a, v, 2);
      } else if (k.is_s(s) || v.is_s(s)) {
        int i = k.is_s(s) ? 1 : 2;
        return layout_conflict(fmt::format("FlashAttention with {} sharded on the sequence dim (S({}) over {}) and no ring: each rank attends to its "
                                           "own keys only, and partial attention outputs cannot be summed (they need log-sum-exp rescaling)",
                                           iname(i), s, axn(a)),
                               iname(i), i, a, fmt::format("use RingAttention over {}, or gather k and v along dim {} first", axn(a), s));
      } else if ((q.is_v() || q.is_r()) && (k.is_v() || k.is_r()) && (v.is_v() || v.is_r())) {
        set_new(o, a, Placement::v(), "attention over per-rank values gives per-rank values");
      } else {
        return layout_conflict(fmt::format("FlashAttention gets q {}, k {}, v {} over {}: the shards do not line up (shard q, k and v alike on "
                                           "batch or heads, or q alone on the sequence)",
                                           ps(q), ps(k), ps(v), axn(a)),
                               iname(0), 0, a,
                               fmt::format("give q, k and v the same placement over {} (e.g. all S({}) for heads), or gather the odd one out", axn(a), h));
      }
    }
  }

  void embedding() {
    const Value& ids = in(0);
    const Value& w = in(1);
    if (w.rank != 2)
      return report(CheckId::ShapeMismatch, fmt::format("Embedding weight {} must be [vocab, hidden], got shape {}", iname(1), sstr(w.dims())), iname(1));
    if (ids.rank + 1 > kMaxRank) return report(CheckId::ShapeMismatch, "Embedding output would exceed rank 8", iname(0));
    Value& o = out();
    o.rank = static_cast<std::uint8_t>(ids.rank + 1);
    std::copy(ids.shape.begin(), ids.shape.begin() + ids.rank, o.shape.begin());
    o.shape[ids.rank] = w.shape[1];
    o.dtype = w.dtype;
    o.uneven = ids.uneven;
    int last = ids.rank;
    for (int a = 0; a < axes(); ++a) {
      Placement pi = pin(0, a), pw = pin(1, a);
      if (pi.is_p()) return partial_misuse(0, a, "token ids cannot be a pending sum", "reduce or replicate the ids first");
      bool ids_whole = pi.is_r() || pi.is_i();
      if (pw.is_i()) {
        if (!ids_whole) {
          invariant_ok({0, 1});  // reports
          if (!failed_)
            report(CheckId::InvariantMix, fmt::format("Embedding combines {}, which is I over {}, with ids {} ({})", iname(1), axn(a), iname(0), ps(pi)), iname(1));
          return;
        }
        set_from(o, a, pw, 1);
      } else if (pw.is_r()) {
        set_from(o, a, pi.is_i() ? Placement::r() : pi, 0);
      } else if (pw.is_s(0) || pw.is_s(1)) {
        if (!ids_whole)
          return layout_conflict(fmt::format("Embedding with weight {} sharded {} over {} and ids {} sharded {} over the same axis: each rank would "
                                             "look up only its own ids in only its own slice of the table",
                                             iname(1), ps(pw), axn(a), iname(0), ps(pi)),
                                 iname(0), 0, a, fmt::format("replicate the ids over {}, or replicate the table", axn(a)));
        if (pw.is_s(0))
          set_new(o, a, Placement::p(), fmt::format("Embedding looks up {}, which is vocab-sharded S(0) over {}: each rank holds only its rows, "
                                                    "zeros elsewhere (masked lookup)",
                                                    iname(1), axn(a)));
        else
          set_from(o, a, Placement::s(last), 1);
      } else if (pw.is_p()) {
        if (!ids_whole) return partial_misuse(1, a, "a lookup by per-rank ids in a pending sum mixes summands");
        set_from(o, a, pw, 1);
      } else if (pi.is_s()) {
        set_from(o, a, pi, 0);  // a per-rank table looked up by sharded ids: each rank holds the rows of its own ids
      } else {
        set_new(o, a, Placement::v(), "Embedding with a per-rank table gives per-rank values");
      }
    }
  }

  void cross_entropy() {
    const Value& lg = in(0);
    const Value& lb = in(1);
    if (lg.rank < 1) return report(CheckId::ShapeMismatch, fmt::format("CrossEntropyLoss logits {} must have a vocab dim", iname(0)), iname(0));
    int vd = lg.rank - 1;
    if (lb.rank != lg.rank - 1)
      return report(CheckId::ShapeMismatch,
                    fmt::format("CrossEntropyLoss labels {} have shape {}, but the logits {} of shape {} need labels of shape {} (all dims but the "
                                "vocab)",
                                iname(1), sstr(lb.dims()), iname(0), sstr(lg.dims()), sstr(lg.dims().first(static_cast<std::size_t>(vd)))),
                    iname(1));
    for (int d = 0; d < vd; ++d)
      if (!same_dim(lb.shape[static_cast<std::size_t>(d)], lg.shape[static_cast<std::size_t>(d)],
                    fmt::format("CrossEntropyLoss labels dim {} against logits dim {}", d, d), iname(1)))
        return;
    std::uint32_t vocab_axes = 0;
    if (at().vocab_parallel) {
      if (at().axes) {
        vocab_axes = at().axes;
      } else {
        vocab_axes = shard_mask(lg, vd);
        if (!vocab_axes)
          return report(CheckId::PlacementMismatch,
                        fmt::format("CrossEntropyLoss has `vocab_parallel: true`, but the logits {} are not sharded on the vocab dim (dim {}) over any "
                                    "axis: a vocab-parallel loss on whole logits adds log(N) to the loss (Megatron #7452)",
                                    iname(0), vd),
                        iname(0), {fix("feed the vocab-sharded logits (S(-1)) to the loss: if they were gathered with an AllGather, drop it; or set "
                                       "vocab_parallel: false")});
      }
    }
    Value tok;  // per-token loss placement
    tok.rank = static_cast<std::uint8_t>(vd);
    std::copy(lb.shape.begin(), lb.shape.begin() + vd, tok.shape.begin());
    for (int a = 0; a < axes(); ++a) {
      Placement pl = pin(0, a), pb = pin(1, a);
      if (pl.is_p()) return partial_misuse(0, a, "the loss is nonlinear in the logits");
      if (pb.is_p()) return partial_misuse(1, a, "labels cannot be a pending sum", "reduce or replicate the labels first");
      if (vocab_axes & (1u << a)) {
        if (!pl.is_s(vd)) {
          std::vector<Note> notes;
          origin_note(notes, lg, a);
          notes.push_back(fix(fmt::format("feed the vocab-sharded logits (S({}) over {}) to the loss: if they were gathered, drop that AllGather", vd, axn(a))));
          return report(CheckId::PlacementMismatch,
                        fmt::format("vocab-parallel CrossEntropyLoss over {} expects the logits ({}) to be S({}) (vocab-sharded), but they are {}: each "
                                    "rank would treat the whole vocab as its slice and the loss gains log({}) (Megatron #7452)",
                                    axn(a), iname(0), vd, ps(pl), axsize(a)),
                        iname(0), std::move(notes));
        }
        if (!(pb.is_r() || pb.is_i()))
          return layout_conflict(fmt::format("vocab-parallel CrossEntropyLoss over {} needs the labels {} whole over that axis, but they are {}", axn(a),
                                             iname(1), ps(pb)),
                                 iname(1), 1, a, "");
        tok.pl[static_cast<std::size_t>(a)] = Placement::r();
        continue;
      }
      if (pl.is_s(vd)) {
        std::vector<Note> notes;
        origin_note(notes, lg, a);
        notes.push_back(fix(fmt::format("set `vocab_parallel: true` (Megatron's vocab_parallel_cross_entropy all-reduces the max and the sum over "
                                        "{}), or {}",
                                        axn(a), fix_allgather(iname(0), a, vd))));
        return report(CheckId::ShardedReductionDim,
                      fmt::format("CrossEntropyLoss needs the vocab dim {} of {} whole, but it is sharded S({}) over {}: the softmax would normalize "
                                  "over each rank's slice of the vocabulary",
                                  vd, iname(0), vd, axn(a)),
                      iname(0), std::move(notes));
      }
      if (pl == pb || pb.is_r() || pb.is_i()) {
        if (pl.is_s() && (pb.is_r() || pb.is_i()) && !slice_ok(1, a, pl.dim, 0)) return;
        tok.pl[static_cast<std::size_t>(a)] = pl;
        tok.origin[static_cast<std::size_t>(a)] = lg.origin[static_cast<std::size_t>(a)];
      } else if (pl.is_r() || pl.is_i()) {
        if (pb.is_s() && !slice_ok(0, a, pb.dim, 1)) return;
        tok.pl[static_cast<std::size_t>(a)] = pb;
        tok.origin[static_cast<std::size_t>(a)] = lb.origin[static_cast<std::size_t>(a)];
      } else if (pl.is_v() && pb.is_s()) {  // V is read as its local slice, as R is
        if (!slice_ok(0, a, pb.dim, 1)) return;
        tok.pl[static_cast<std::size_t>(a)] = pb;
      } else if (pb.is_v() && pl.is_s()) {
        if (!slice_ok(1, a, pl.dim, 0)) return;
        tok.pl[static_cast<std::size_t>(a)] = pl;
      } else if (pl.is_v() || pb.is_v()) {
        tok.pl[static_cast<std::size_t>(a)] = Placement::v();
      } else {
        return layout_conflict(fmt::format("CrossEntropyLoss logits {} are {} over {} but the labels {} are {}: their token shards do not line up",
                                           iname(0), ps(pl), axn(a), iname(1), ps(pb)),
                               iname(1), 1, a, "");
      }
    }
    Value& o = out();
    o.dtype = DType::F32;
    o.uneven = lg.uneven || lb.uneven;
    if (at().reduction == Reduction::None) {
      o.rank = tok.rank;
      o.shape = tok.shape;
      o.pl = tok.pl;
      o.origin = tok.origin;
      return;
    }
    bool mean = at().reduction == Reduction::Mean;
    o.rank = 0;
    for (int a = 0; a < axes(); ++a) {
      Placement p = tok.pl[static_cast<std::size_t>(a)];
      if (p.is_s()) {
        if (mean && o.uneven)
          return report(CheckId::ShapeMismatch,
                        fmt::format("CrossEntropyLoss takes the mean over tokens sharded unevenly over {}: the average of the local means is not the "
                                    "global mean",
                                    axn(a)),
                        iname(0));
        set_new(o, a, Placement::p(mean ? ReduceOp::Avg : ReduceOp::Sum),
                fmt::format("CrossEntropyLoss takes the {} over tokens sharded S({}) over {}: each rank holds the {} of its own tokens", mean ? "mean" : "sum",
                            p.dim, axn(a), mean ? "mean" : "sum"));
      } else {
        o.pl[static_cast<std::size_t>(a)] = p;
        o.origin[static_cast<std::size_t>(a)] = tok.origin[static_cast<std::size_t>(a)];
      }
    }
  }

  void topk() {
    const Value& x = in(0);
    if (x.rank < 1) return report(CheckId::ShapeMismatch, fmt::format("TopKGate input {} must have an expert dim", iname(0)), iname(0));
    int e = x.rank - 1;
    auto experts = obl_.concrete(x.shape[static_cast<std::size_t>(e)]);
    if (experts && at().k > *experts)
      return report(CheckId::ShapeMismatch, fmt::format("TopKGate k = {} exceeds the {} experts of {}", at().k, *experts, iname(0)), iname(0));
    for (int a = 0; a < axes(); ++a) {
      Placement p = pin(0, a);
      if (p.is_p()) return partial_misuse(0, a, "top-k of a pending sum is not the top-k of its parts");
      if (p.is_s(e)) return sharded_dim(0, a, e, "each rank would pick the top experts of its own slice only");
    }
    for (int i = 0; i < 2; ++i) {
      Value& o = out(i) = x;
      o.shape[static_cast<std::size_t>(e)] = pool_.constant(at().k);
      o.dtype = i == 0 ? x.dtype : DType::I64;
    }
  }

  // ---- collectives --------------------------------------------------------------------------
  std::vector<int> coll_axes(bool innermost_first) const {
    std::vector<int> v;
    for (int a = 0; a < axes(); ++a)
      if (at().axes & (1u << a)) v.push_back(a);
    if (innermost_first) std::reverse(v.begin(), v.end());
    return v;
  }

  // Adding a shard of axis a to dim d keeps mesh order only if a is inner to every axis already there.
  bool can_add_shard(const Value& v, int d, int a) {
    std::uint32_t m = shard_mask(v, d);
    for (int b = a + 1; b < axes(); ++b)
      if (m & (1u << b)) {
        illegal(fmt::format("{} over {} would shard dim {} of {} outside mesh order: dim {} is already sharded over {}, which is inner to {}; "
                            "the pieces would interleave (a strided layout no placement describes)",
                            opname(), axn(a), d, iname(0), d, axn(b), axn(a)),
                -1, fmt::format("shard over {} first, or gather over {} before this op", axn(a), axn(b)));
        return false;
      }
    return true;
  }
  bool can_remove_shard(const Value& v, int d, int a) {
    std::uint32_t m = shard_mask(v, d);
    for (int b = a + 1; b < axes(); ++b)
      if (m & (1u << b)) {
        illegal(fmt::format("{} over {} gathers dim {} of {}, which is also sharded over the inner axis {}: the gathered pieces would not be "
                            "contiguous",
                            opname(), axn(a), d, iname(0), axn(b)),
                -1, fmt::format("gather over {} first (or over both axes at once)", axn(b)));
        return false;
      }
    return true;
  }

  bool rank_in_axis(int a) {
    if (at().rank < 0) return true;
    auto n = obl_.concrete(axis_size(a));
    if (n && at().rank >= *n) {
      report(CheckId::IllegalCollective, fmt::format("{} names rank {} of axis {}, which has only {} ranks", opname(), at().rank, axn(a), *n), iname(0));
      return false;
    }
    return true;
  }

  void all_reduce() {
    Value& o = out() = in(0);
    ReduceOp rop = at().rop;
    for (int a : coll_axes(false)) {
      Placement p = pin(0, a);
      Placement dst = at().dst_invariant ? Placement::i() : Placement::r();
      std::string why = fmt::format("AllReduce({}) over {}", reduce_name(rop), axn(a));
      if (p.is_p()) {
        if (p.op != rop)
          return illegal(fmt::format("AllReduce({}) of {}, which is {} over {}: the reduce op must match the pending reduction", reduce_name(rop),
                                     iname(0), ps(p), axn(a)),
                         a, fmt::format("use `reduce: {}`", reduce_name(p.op)));
        set_new(o, a, dst, why);
      } else if (p.is_v()) {
        set_new(o, a, dst, why);
      } else if (p.is_s()) {
        return illegal(fmt::format("AllReduce of {}, which is S({}) over {}: its shards are different pieces of one tensor, not summands", iname(0), p.dim, axn(a)),
                       a, fmt::format("use {{op: AllGather, in: [{}], out: {}_full, axis: {}, dim: {}}} to assemble the pieces", iname(0), iname(0), axn(a), p.dim));
      } else if (rop == ReduceOp::Sum) {
        return illegal(fmt::format("AllReduce of {}, which is already {} over {}: all-reducing a replicated value multiplies it by {}", iname(0), ps(p),
                                   axn(a), axsize(a)),
                       a, "remove this AllReduce (the value is already whole on every rank)");
      } else {
        set_from(o, a, p.is_i() && !at().dst_invariant ? Placement::r() : p, 0);  // avg/max/min of a replicated value is that value
      }
    }
  }

  void all_gather() {
    Value& o = out() = in(0);
    int d = norm_dim(at().dim, in(0).rank, "dim", iname(0));
    if (d < 0) return;
    for (int a : coll_axes(true)) {
      Placement p = pl_of(o, a);
      if (!p.is_s(d)) {
        std::string fix_text = p.is_s() ? fmt::format("gather the dim it is sharded on: `dim: {}`", p.dim)
                               : p.is_p() ? fmt::format("a pending sum needs {{op: AllReduce, in: [{}], out: {}_reduced, axis: {}}}", iname(0), iname(0), axn(a))
                               : p.is_v() ? "declare the pieces' layout (S(d)) with Convert or SPMDGuard first"
                                          : "remove this AllGather: the value is already whole on every rank";
        return illegal(fmt::format("AllGather over {} along dim {} of {}, which is {} over {}: AllGather assembles a tensor sharded S({})", axn(a), d,
                                   iname(0), ps(p), axn(a), d),
                       a, fix_text);
      }
      if (!can_remove_shard(o, d, a)) return;
      set_new(o, a, at().dst_invariant ? Placement::i() : Placement::r(), fmt::format("AllGather over {}", axn(a)));
    }
  }

  void reduce_scatter() {
    Value& o = out() = in(0);
    int d = norm_dim(at().dim, in(0).rank, "dim", iname(0));
    if (d < 0) return;
    for (int a : coll_axes(false)) {
      Placement p = pl_of(o, a);
      if (p.is_p() && p.op != at().rop)
        return illegal(fmt::format("ReduceScatter({}) of {}, which is {} over {}: the reduce op must match", reduce_name(at().rop), iname(0), ps(p), axn(a)),
                       a, fmt::format("use `reduce: {}`", reduce_name(p.op)));
      if (!(p.is_p() || p.is_v()))
        return illegal(fmt::format("ReduceScatter over {} of {}, which is {} over {}: ReduceScatter takes a pending reduction (P) or per-rank "
                                   "summands (V)",
                                   axn(a), iname(0), ps(p), axn(a)),
                       a, p.is_r() || p.is_i() ? fmt::format("to split a replicated value use {{op: Convert, in: [{}], out: {}_shard, axis: {}, to: S({})}}",
                                                             iname(0), iname(0), axn(a), d)
                                               : "");
      if (!can_add_shard(o, d, a)) return;
      set_new(o, a, Placement::s(d), fmt::format("ReduceScatter over {} along dim {}", axn(a), d));
    }
  }

  void broadcast() {
    Value& o = out() = in(0);
    for (int a : coll_axes(false)) {
      if (!rank_in_axis(a)) return;
      Placement p = pin(0, a);
      if (p.is_p() || p.is_s())
        return illegal(fmt::format("Broadcast over {} of {}, which is {} over {}: the source rank holds only {}, not the whole value", axn(a), iname(0),
                                   ps(p), axn(a), p.is_p() ? "a summand" : "a shard"),
                       a, p.is_p() ? fix_allreduce(iname(0), a, p) : fix_allgather(iname(0), a, p.dim));
      set_new(o, a, Placement::r(), fmt::format("Broadcast over {}", axn(a)));
    }
  }

  void reduce() {
    Value& o = out() = in(0);
    for (int a : coll_axes(false)) {
      if (!rank_in_axis(a)) return;
      Placement p = pin(0, a);
      if (p.is_p() && p.op != at().rop)
        return illegal(fmt::format("Reduce({}) of {}, which is {} over {}: the reduce op must match", reduce_name(at().rop), iname(0), ps(p), axn(a)), a,
                       fmt::format("use `reduce: {}`", reduce_name(p.op)));
      if (!(p.is_p() || p.is_v()))
        return illegal(fmt::format("Reduce over {} of {}, which is {} over {}: Reduce takes a pending reduction (P) or per-rank summands (V)", axn(a),
                                   iname(0), ps(p), axn(a)),
                       a, p.is_s() ? fmt::format("use {{op: Gather, in: [{}], axis: {}, dim: {}}} to assemble the shards", iname(0), axn(a), p.dim)
                                   : "remove this Reduce: the value is already whole on every rank");
      set_new(o, a, Placement::v(), fmt::format("Reduce over {} leaves the result on rank {} only", axn(a), std::max(0, at().rank)));
    }
  }

  void all_to_all() {
    Value& o = out() = in(0);
    int s = norm_dim(at().dim, in(0).rank, "split_dim", iname(0));
    if (s < 0) return;
    int c = norm_dim(at().dim2, in(0).rank, "concat_dim", iname(0));
    if (c < 0) return;
    for (int a : coll_axes(true)) {
      Placement p = pl_of(o, a);
      if (p.is_v()) {  // per-rank values stay per-rank (e.g. MoE token exchange), but each rank's split dim shrinks and its concat dim grows
        if (s == c) continue;
        ExprId n = axis_size(a), ds = o.shape[static_cast<std::size_t>(s)];
        std::string what = fmt::format("AllToAll over {} splits dim {} of {} ({}) into {} pieces, so it must be divisible by {}", axn(a), s, iname(0), dstr(ds),
                                       axsize(a), axsize(a));
        Decision dec = obl_.decide(OblKind::Divisible, ds, n);
        if (dec == Decision::Fails) return report(CheckId::ShapeMismatch, what + ", but it is not", iname(0));
        if (dec == Decision::Deferred && obl_.first_time(OblKind::Divisible, ds, n))
          obl_.push({OblKind::Divisible, ds, n, CheckId::ShapeMismatch, here(), op_idx_, iname(0), what, {}});
        o.shape[static_cast<std::size_t>(s)] = pool_.div(ds, n);
        o.shape[static_cast<std::size_t>(c)] = pool_.mul(o.shape[static_cast<std::size_t>(c)], n);
        continue;
      }
      if (!p.is_s(c) || s == c)
        return illegal(fmt::format("AllToAll over {} (split_dim {}, concat_dim {}) of {}, which is {} over {}: AllToAll turns S(concat_dim) into "
                                   "S(split_dim)",
                                   axn(a), s, c, iname(0), ps(p), axn(a)),
                       a, p.is_s() && s != p.dim ? fmt::format("use `concat_dim: {}`", p.dim)
                          : p.is_p()               ? fix_allreduce(iname(0), a, p)
                                                   : fmt::format("AllToAll needs the input sharded on concat_dim: make {} S({}) over {} first", iname(0), c, axn(a)));
      if (!can_remove_shard(o, c, a)) return;
      o.pl[static_cast<std::size_t>(a)] = Placement::r();
      if (!can_add_shard(o, s, a)) return;
      set_new(o, a, Placement::s(s), fmt::format("AllToAll over {} from S({}) to S({})", axn(a), c, s));
    }
  }

  void scatter() {
    Value& o = out() = in(0);
    int d = norm_dim(at().dim, in(0).rank, "dim", iname(0));
    if (d < 0) return;
    for (int a : coll_axes(false)) {
      if (!rank_in_axis(a)) return;
      Placement p = pl_of(o, a);
      if (p.is_p() || p.is_s())
        return illegal(fmt::format("Scatter over {} of {}, which is {} over {}: the source rank must hold the whole value", axn(a), iname(0), ps(p), axn(a)),
                       a, "");
      if (!can_add_shard(o, d, a)) return;
      set_new(o, a, Placement::s(d), fmt::format("Scatter over {} along dim {}", axn(a), d));
    }
  }

  void gather() {
    Value& o = out() = in(0);
    int d = norm_dim(at().dim, in(0).rank, "dim", iname(0));
    if (d < 0) return;
    for (int a : coll_axes(true)) {
      if (!rank_in_axis(a)) return;
      Placement p = pl_of(o, a);
      if (!p.is_s(d))
        return illegal(fmt::format("Gather over {} along dim {} of {}, which is {} over {}: Gather assembles a tensor sharded S({})", axn(a), d, iname(0),
                                   ps(p), axn(a), d),
                       a, "");
      if (!can_remove_shard(o, d, a)) return;
      set_new(o, a, Placement::v(), fmt::format("Gather over {} leaves the whole tensor on rank {} only", axn(a), std::max(0, at().rank)));
    }
  }

  // A Recv waits (in the round-robin over programs) until one of its Sends has been reached.
  bool recv_waits(int i) const {
    if (p_.ops[static_cast<std::size_t>(i)].kind != OpKind::Recv) return false;
    auto it = recv_sends_.find(i);
    if (it == recv_sends_.end()) return false;
    return std::none_of(it->second.begin(), it->second.end(), [&](int s) { return sent_.count(s) > 0; });
  }

  // A Recv takes the type of its matching Send (every Send it pairs with, on every rank running
  // it, must agree); a declared shape, dtype or placement is checked against it (p2p-mismatch).
  // Without a reached Send (unmatched, or a deadlock) the declared type stands in, else nothing.
  void recv() {
    Value& o = out();
    const Value* sent = nullptr;
    int send_op = -1;
    if (auto it = recv_sends_.find(op_idx_); it != recv_sends_.end())
      for (int s : it->second)
        if (auto v = sent_.find(s); v != sent_.end()) {
          if (!sent) {
            sent = &v->second;
            send_op = s;
          } else if (!sent->poisoned && !v->second.poisoned) {
            std::string why = type_difference(*sent, v->second);
            if (!why.empty())
              return report(CheckId::P2PMismatch,
                            fmt::format("Recv of {} pairs with Sends that disagree on different ranks: the Send at line {} sends {}, the Send at line {} "
                                        "sends {} ({})",
                                        oname(0), line_of(send_op), type_str(*sent), line_of(s), type_str(v->second), why),
                            oname(0), {{p_.ops[static_cast<std::size_t>(send_op)].loc, "one Send is here"}, {p_.ops[static_cast<std::size_t>(s)].loc, "the other Send is here"}});
          }
        }
    if (sent && sent->poisoned) {
      failed_ = true;  // the sent value already has an error: no cascade
      return;
    }
    if (sent) {
      o.rank = sent->rank;
      o.shape = sent->shape;
      o.dtype = sent->dtype;
      o.uneven = sent->uneven;
      for (int a = 0; a < axes(); ++a) {
        Placement pl = sent->pl[static_cast<std::size_t>(a)];
        o.pl[static_cast<std::size_t>(a)] = pl;
        if (!pl.is_r())
          o.origin[static_cast<std::size_t>(a)] =
              new_origin(here(), oname(0), pl, a, fmt::format("received from the Send at line {}", line_of(send_op)));
      }
      check_declared(*sent, send_op);
      return;
    }
    if (at().shape == kNoIndex) {
      failed_ = true;  // no Send reached it and no declared type: unmatched-p2p or a deadlock says why
      return;
    }
    set_shape(o, p_.shapes[at().shape]);
    if (at().has_dtype) o.dtype = at().dtype;
    if (at().placements != kNoIndex) {
      const Placements& pm = p_.placement_maps[at().placements];
      for (int a = 0; a < axes(); ++a) {
        Placement pl = pm[static_cast<std::size_t>(a)];
        if (pl.is_s()) {
          int d = norm_dim(pl.dim, o.rank, "placement dim", oname(0));
          if (d < 0) return;
          pl.dim = static_cast<std::int16_t>(d);
        }
        set_new(o, a, pl, fmt::format("declared {} by this Recv", ps(pl)));
      }
    }
  }

  std::uint32_t line_of(int op) const { return p_.ops[static_cast<std::size_t>(op)].loc.line; }

  std::string type_str(const Value& v) const {
    std::string pl;
    for (int a = 0; a < axes(); ++a) pl += (a ? ", " : "") + axn(a) + ": " + ps(v.pl[static_cast<std::size_t>(a)]);
    return fmt::format("{} {} {{{}}}", sstr(v.dims()), dtype_name(v.dtype), pl);
  }

  // Why two values differ (empty: they agree, or their dims differ only symbolically, left to the solver).
  std::string type_difference(const Value& a, const Value& b, bool placements = true) {
    if (a.rank != b.rank) return fmt::format("rank {} vs {}", a.rank, b.rank);
    for (std::size_t d = 0; d < a.rank; ++d)
      if (obl_.decide(OblKind::Equal, a.shape[d], b.shape[d]) == Decision::Fails)
        return fmt::format("dim {} is {} vs {}", d, dstr(a.shape[d]), dstr(b.shape[d]));
    if (a.dtype != b.dtype) return fmt::format("dtype {} vs {}", dtype_name(a.dtype), dtype_name(b.dtype));
    if (placements)
      for (int x = 0; x < axes(); ++x)
        if (!(a.pl[static_cast<std::size_t>(x)] == b.pl[static_cast<std::size_t>(x)]))
          return fmt::format("{} vs {} over {}", ps(a.pl[static_cast<std::size_t>(x)]), ps(b.pl[static_cast<std::size_t>(x)]), axn(x));
    return "";
  }

  // Symbolic dims that may differ: an obligation, proved (or refuted with a counterexample) by Z3.
  void defer_equal(const Value& a, const Value& b, CheckId id, const std::string& what_a, const std::string& what_b) {
    if (a.rank != b.rank) return;
    for (std::size_t d = 0; d < a.rank; ++d)
      if (obl_.decide(OblKind::Equal, a.shape[d], b.shape[d]) == Decision::Deferred && obl_.first_time(OblKind::Equal, a.shape[d], b.shape[d]))
        obl_.push({OblKind::Equal, a.shape[d], b.shape[d], id, here(), op_idx_, oname(0),
                   fmt::format("dim {} of {} ({}) must equal dim {} of {} ({})", d, what_b, dstr(b.shape[d]), d, what_a, dstr(a.shape[d])), {}});
  }

  // The Recv's declared shape, dtype and placement against what its Send sends.
  void check_declared(const Value& sent, int send_op) {
    std::vector<Note> notes{{p_.ops[static_cast<std::size_t>(send_op)].loc, fmt::format("the matching Send (FIFO order per sender and receiver) is here")}};
    if (at().shape != kNoIndex) {
      Value want;
      set_shape(want, p_.shapes[at().shape]);
      want.dtype = sent.dtype;
      std::string why = type_difference(sent, want, false);
      if (!why.empty())
        return report(CheckId::P2PMismatch,
                      fmt::format("Recv of {} declares shape {}, but its matching Send sends {} ({})", oname(0), sstr(want.dims()), type_str(sent), why),
                      oname(0), notes);
      defer_equal(sent, want, CheckId::P2PMismatch, fmt::format("the value the Send at line {} sends", line_of(send_op)), "the declared shape of " + oname(0));
    }
    if (at().has_dtype && at().dtype != sent.dtype)
      return report(CheckId::P2PMismatch,
                    fmt::format("Recv of {} declares dtype {}, but its matching Send sends {}", oname(0), dtype_name(at().dtype), type_str(sent)), oname(0),
                    notes);
    if (at().placements != kNoIndex) {
      const Placements& pm = p_.placement_maps[at().placements];
      for (int a = 0; a < axes(); ++a) {
        Placement want = pm[static_cast<std::size_t>(a)];
        if (want.is_s() && want.dim < 0) want.dim = static_cast<std::int16_t>(want.dim + sent.rank);
        if (!(want == sent.pl[static_cast<std::size_t>(a)]))
          return report(CheckId::P2PMismatch,
                        fmt::format("Recv of {} declares {} over {}, but its matching Send sends {}", oname(0), ps(want), axn(a), type_str(sent)),
                        oname(0), notes);
      }
    }
  }

  // Matched collectives of different programs must agree on shape and dtype (kind, axis and
  // reduce op are the temporal checker's: it reports those).
  void compare_collectives(const std::vector<CollectivePair>& pairs, const RankSpace& space) {
    std::set<std::pair<int, int>> seen;
    for (const auto& c : pairs) {
      const Op& a = p_.ops[static_cast<std::size_t>(c.op_a)];
      const Op& b = p_.ops[static_cast<std::size_t>(c.op_b)];
      if (a.kind != b.kind || a.attrs.axes != b.attrs.axes || a.attrs.rop != b.attrs.rop) continue;
      if (!seen.insert({c.op_a, c.op_b}).second) continue;
      const Value& va = watched_[c.op_a];
      const Value& vb = watched_[c.op_b];
      if (va.poisoned || vb.poisoned || !va.defined || !vb.defined) continue;
      op_ = &b;
      op_idx_ = c.op_b;
      std::string why = type_difference(va, vb, false);
      std::string an = p_.name(p_.ins(a)[0]), bn = p_.name(p_.ins(b)[0]);
      if (!why.empty()) {
        Diagnostic d;
        d.id = CheckId::CollectiveMismatch;
        d.loc = b.loc;
        d.op = c.op_b;
        d.tensor = bn;
        d.message = fmt::format("{} is the {} collective of its group on rank {} with {} {}, but rank {} issues it with {} {} ({}): the ranks of a "
                                "group must exchange tensors of one shape and dtype",
                                op_name(b.kind), ordinal(c.seq + 1), space.label(p_, c.rank_b), bn, type_str(vb), space.label(p_, c.rank_a), an,
                                type_str(va), why);
        d.notes.push_back({a.loc, fmt::format("rank {} issues it here", space.label(p_, c.rank_a))});
        d.ranks = {space.label(p_, c.rank_a), space.label(p_, c.rank_b)};
        diags_.push_back(std::move(d));
        continue;
      }
      defer_equal(va, vb, CheckId::CollectiveMismatch, fmt::format("{} on rank {} (line {})", an, space.label(p_, c.rank_a), a.loc.line),
                  fmt::format("{} on rank {}", bn, space.label(p_, c.rank_b)));
    }
  }

  // ---- shape ops ----------------------------------------------------------------------------
  void transpose() {
    const auto& dims = p_.int_lists[at().dims];
    if (dims.size() != 2) return report(CheckId::ShapeMismatch, fmt::format("Transpose takes two dims to swap, got {}", dims.size()), iname(0));
    int d0 = norm_dim(dims[0], in(0).rank, "dim", iname(0));
    if (d0 < 0) return;
    int d1 = norm_dim(dims[1], in(0).rank, "dim", iname(0));
    if (d1 < 0) return;
    Value& o = out() = in(0);
    std::swap(o.shape[static_cast<std::size_t>(d0)], o.shape[static_cast<std::size_t>(d1)]);
    for (int a = 0; a < axes(); ++a) {
      Placement& p = o.pl[static_cast<std::size_t>(a)];
      if (p.is_s(d0)) p.dim = static_cast<std::int16_t>(d1);
      else if (p.is_s(d1)) p.dim = static_cast<std::int16_t>(d0);
    }
    // Two axes sharding d0 and d1 keep their order per dim, so nothing else changes.
  }

  // Rational monomials (num/den * f1*f2... / g1*g2...) for grouping reshape dims: B/4 * 4 == B.
  struct Mono {
    std::int64_t num = 1, den = 1;
    std::vector<ExprId> f, g;  // sorted factors above and below the line
    bool ok = true;            // false after an overflow: compares unequal to everything
    bool operator==(const Mono& o) const { return ok && o.ok && num == o.num && den == o.den && f == o.f && g == o.g; }
  };
  static void normalize(Mono& m) {
    std::vector<ExprId> f, g;
    std::set_difference(m.f.begin(), m.f.end(), m.g.begin(), m.g.end(), std::back_inserter(f));
    std::set_difference(m.g.begin(), m.g.end(), m.f.begin(), m.f.end(), std::back_inserter(g));
    m.f = std::move(f);
    m.g = std::move(g);
    std::int64_t d = std::gcd(m.num, m.den);
    if (d > 1) m.num /= d, m.den /= d;
  }
  static Mono times(const Mono& x, const Mono& y) {
    Mono m;
    m.ok = x.ok && y.ok && !__builtin_mul_overflow(x.num, y.num, &m.num) && !__builtin_mul_overflow(x.den, y.den, &m.den);
    std::merge(x.f.begin(), x.f.end(), y.f.begin(), y.f.end(), std::back_inserter(m.f));
    std::merge(x.g.begin(), x.g.end(), y.g.begin(), y.g.end(), std::back_inserter(m.g));
    normalize(m);
    return m;
  }
  static Mono inverse(Mono m) {
    std::swap(m.num, m.den);
    std::swap(m.f, m.g);
    return m;
  }
  Mono mono(ExprId e) const {
    Mono m;
    const ENode& n = pool_.node(e);
    if (n.op == EOp::Const && n.c > 0) {
      m.num = n.c;
    } else if (n.op == EOp::Mul) {
      m = times(mono(n.a), mono(n.b));
    } else if (n.op == EOp::Div) {
      m = times(mono(n.a), inverse(mono(n.b)));
    } else {
      m.f.push_back(e);
    }
    return m;
  }
  static bool divides(const Mono& x, const Mono& y) {  // y / x is a whole monomial
    Mono q = times(y, inverse(x));
    return q.ok && q.den == 1 && q.g.empty();
  }
  bool is_one(ExprId e) const { return pool_.is_const(e) && pool_.value(e) == 1; }

  void reshape() {
    const Value& x = in(0);
    const auto& shape = p_.shapes[at().shape];
    Value& o = out();
    o.dtype = x.dtype;
    o.uneven = x.uneven;
    set_shape(o, shape);
    // Element counts must match.
    ExprId n_in = pool_.constant(1), n_out = pool_.constant(1);
    for (int d = 0; d < x.rank; ++d) n_in = pool_.mul(n_in, x.shape[static_cast<std::size_t>(d)]);
    for (ExprId e : shape) n_out = pool_.mul(n_out, e);
    if (!same_dim(n_in, n_out, fmt::format("Reshape of {} {} to {} must keep the element count", iname(0), sstr(x.dims()), sstr(shape)),
                  iname(0)))
      return;
    // Group dims: runs of input dims whose product equals a run of output dims.
    struct Group {
      int i0, i1, o0, o1;
    };
    std::vector<Group> groups;
    int i = 0, j = 0, ri = x.rank, rj = static_cast<int>(shape.size());
    bool lost = false;
    while (i < ri || j < rj) {
      if (i < ri && is_one(x.shape[static_cast<std::size_t>(i)])) {
        groups.push_back({i, i + 1, j, j});
        ++i;
        continue;
      }
      if (j < rj && is_one(shape[static_cast<std::size_t>(j)])) {
        groups.push_back({i, i, j, j + 1});
        ++j;
        continue;
      }
      if (i >= ri || j >= rj) {
        lost = true;
        groups.push_back({i, ri, j, rj});
        break;
      }
      int i0 = i, j0 = j;
      Mono pi = mono(x.shape[static_cast<std::size_t>(i++)]), pj = mono(shape[static_cast<std::size_t>(j++)]);
      while (!(pi == pj)) {
        if (divides(pi, pj) && i < ri) pi = times(pi, mono(x.shape[static_cast<std::size_t>(i++)]));
        else if (divides(pj, pi) && j < rj) pj = times(pj, mono(shape[static_cast<std::size_t>(j++)]));
        else {
          lost = true;
          i = ri, j = rj;
          break;
        }
      }
      groups.push_back({i0, lost ? ri : i, j0, lost ? rj : j});
      if (lost) break;
    }
    for (int a = 0; a < axes(); ++a) {
      Placement p = pin(0, a);
      if (!p.is_s()) {
        set_from(o, a, p, 0);
        continue;
      }
      const Group* g = nullptr;
      for (const auto& gr : groups)
        if (p.dim >= gr.i0 && p.dim < gr.i1) g = &gr;
      std::string base = fmt::format("Reshape of {} {} to {} with dim {} sharded over {}", iname(0), sstr(x.dims()), sstr(shape), p.dim, axn(a));
      if (!g || g->o0 == g->o1 || (lost && g == &groups.back()))
        return layout_conflict(base + ": the sharded dim does not map onto output dims this reshape keeps whole", iname(0), 0, a,
                               fix_allgather(iname(0), a, p.dim));
      if (p.dim != g->i0)
        return layout_conflict(base + fmt::format(": it merges dims {}..{} and the shard is not on the leftmost, so the local pieces interleave",
                                                  g->i0, g->i1 - 1),
                               iname(0), 0, a, fix_allgather(iname(0), a, p.dim));
      if (g->i1 - g->i0 > 1 && x.uneven) {
        std::vector<Note> notes;
        origin_note(notes, x, a);
        notes.push_back(fix(fix_allgather(iname(0), a, p.dim)));
        return report(CheckId::ShapeMismatch, base + ": merging an unevenly sharded dim would leave gaps between the shards", iname(0), std::move(notes));
      }
      set_from(o, a, Placement::s(g->o0), 0);
      if (g->o1 - g->o0 > 1) o.strict = static_cast<std::uint8_t>(o.strict | (1u << g->o0));  // a split must divide evenly
    }
  }

  // ---- SPMD conversions ---------------------------------------------------------------------
  Placement norm_target(Placement t, int rank, bool& ok) {
    ok = true;
    if (!t.is_s()) return t;
    int d = norm_dim(t.dim, rank, "target S(" + std::to_string(t.dim) + ")", iname(0));
    if (d < 0) ok = false;
    else t.dim = static_cast<std::int16_t>(d);
    return t;
  }

  bool from_ok(int a) {
    if (!at().has_from) return true;
    bool ok = true;
    Placement f = norm_target(at().from, in(0).rank, ok);
    if (!ok) return false;
    if (f == pin(0, a)) return true;
    std::vector<Note> notes;
    origin_note(notes, in(0), a);
    report(CheckId::PlacementMismatch,
           fmt::format("{} expects {} to be {} over {} (`from: {}`), but it is {}", opname(), iname(0), ps(f), axn(a), ps(at().from), ps(pin(0, a))), iname(0),
           std::move(notes));
    return false;
  }

  void convert() {
    Value& o = out() = in(0);
    bool ok = true;
    Placement t = norm_target(at().to, in(0).rank, ok);
    if (!ok) return;
    for (int a : coll_axes(false)) {
      if (!from_ok(a)) return;
      Placement p = pin(0, a);
      std::string why = fmt::format("Convert over {} from {} to {}", axn(a), ps(p), ps(t));
      if (p == t) continue;
      bool legal = (p.is_i() && t.is_r()) || (p.is_r() && t.is_s()) || (p.is_v() && t.is_p()) || (p.is_r() && t.is_v()) ||
                   (p.is_s() && t.is_p() && t.op == ReduceOp::Sum);  // S(d) -> P: the shard in its slot of a zero tensor
      if (!legal) {
        std::string hint = p.is_p()           ? fix_allreduce(iname(0), a, p)
                           : p.is_r() && t.is_p() ? "R -> P multiplies the global value by the axis size; if that is meant, use Reinterpret"
                           : p.is_s() && t.is_r() ? fix_allgather(iname(0), a, p.dim)
                           : p.is_r() && t.is_i() ? "R -> I would drop the gradient's AllReduce; produce I directly (e.g. AllReduce with dst: I)"
                           : p.is_i()             ? fmt::format("convert I to R first ({{op: Convert, ..., axis: {}, to: R}}), then to {}", axn(a), ps(t))
                                                  : "Convert takes I -> R, R -> S(d), S(d) -> P, V -> P and R -> V";
        return illegal(fmt::format("Convert over {} cannot turn {} ({}) into {} without communication", axn(a), iname(0), ps(p), ps(t)), a, hint);
      }
      if (t.is_s() && !can_add_shard(o, t.dim, a)) return;
      if (p.is_s() && t.is_p() && !can_remove_shard(o, p.dim, a)) return;  // only the innermost shard has a contiguous slot
      set_new(o, a, t, why);
    }
  }

  void reinterpret() {
    Value& o = out() = in(0);
    bool ok = true;
    Placement t = norm_target(at().to, in(0).rank, ok);
    if (!ok) return;
    for (int a : coll_axes(false)) {
      if (!from_ok(a)) return;
      Placement p = pin(0, a);
      if (p == t) continue;
      if (p.is_s() || t.is_s())
        return illegal(fmt::format("Reinterpret over {} cannot relabel {} ({}) as {}: a shard and a whole value have different local shapes", axn(a),
                                   iname(0), ps(p), ps(t)),
                       a, "");
      set_new(o, a, t, fmt::format("Reinterpret over {} relabels {} as {}", axn(a), ps(p), ps(t)));
    }
  }

  void guard() {
    const Value& x = in(0);
    if (op_->n_out) out() = x;
    const Placements& want = p_.placement_maps[at().placements];
    for (int a = 0; a < axes(); ++a) {
      bool ok = true;
      Placement t = norm_target(want[static_cast<std::size_t>(a)], x.rank, ok);
      if (!ok) return;
      if (t == pin(0, a)) continue;
      std::vector<Note> notes;
      origin_note(notes, x, a);
      return report(CheckId::PlacementMismatch, fmt::format("SPMDGuard expects {} to be {} over {}, but it is {}", iname(0), ps(t), axn(a), ps(pin(0, a))),
                    iname(0), std::move(notes));
    }
    if (at().shape != kNoIndex) {
      const auto& s = p_.shapes[at().shape];
      if (s.size() != x.rank)
        return report(CheckId::ShapeMismatch, fmt::format("SPMDGuard expects {} to have shape {}, but it has {}", iname(0), sstr(s), sstr(x.dims())),
                      iname(0));
      for (std::size_t d = 0; d < s.size(); ++d)
        if (!same_dim(x.shape[d], s[d], fmt::format("SPMDGuard: dim {} of {} (actual, left) differs from the declared shape {} (right)", d, iname(0), sstr(s)),
                      iname(0)))
          return;
    }
  }

  void amax() {
    Value& o = out() = in(0);
    o.rank = 0;
    o.dtype = DType::F32;
    for (int a = 0; a < axes(); ++a) {
      Placement p = pin(0, a);
      if (p.is_p()) return partial_misuse(0, a, "the max of a pending sum is not the max of its summands");
      if (p.is_s()) set_new(o, a, Placement::p(ReduceOp::Max), fmt::format("AmaxUpdate of a tensor sharded {} over {} is each rank's own max", ps(p), axn(a)));
    }
  }

  // ---- gradient ops (the VJPs derived backward programs are made of) --------------------------
  void expand() {
    const Value& x = in(0);
    const auto& shape = p_.shapes[at().shape];
    int ro = static_cast<int>(shape.size()), ri = x.rank;
    if (ro < ri) return report(CheckId::ShapeMismatch, fmt::format("Expand of {} {} to {}: the target has fewer dims", iname(0), sstr(x.dims()), sstr(shape)), iname(0));
    Value& o = out() = x;
    set_shape(o, shape);
    for (int d = 0; d < ri; ++d) {
      ExprId e = x.shape[static_cast<std::size_t>(d)];
      if (is_one(e)) continue;
      if (!same_dim(e, shape[static_cast<std::size_t>(d + ro - ri)], fmt::format("Expand keeps dim {} of {}", d, iname(0)), iname(0))) return;
    }
    for (int a = 0; a < axes(); ++a) {
      Placement p = pin(0, a);
      if (p.is_p() && !p.linear_partial() && at().has_number && at().number < 0)
        return partial_misuse(0, a, "a negative scale swaps max and min");
      if (p.is_s() && is_one(x.shape[static_cast<std::size_t>(p.dim)]) && !is_one(shape[static_cast<std::size_t>(p.dim + ro - ri)]))
        return layout_conflict(fmt::format("Expand grows dim {} of {}, which is sharded over {}", p.dim, iname(0), axn(a)), iname(0), 0, a, "");
      set_from(o, a, shift(p, ri, ro), 0);
    }
  }

  // Shapes of two inputs must agree exactly (a gradient and the value it is the gradient of).
  bool same_shape(int i, int j) {
    if (in(i).rank != in(j).rank) {
      report(CheckId::ShapeMismatch, fmt::format("{} needs {} and {} of the same shape, got {} and {}", opname(), iname(i), iname(j), sstr(in(i).dims()),
                                                 sstr(in(j).dims())),
             iname(i));
      return false;
    }
    for (int d = 0; d < in(i).rank; ++d)
      if (!same_dim(in(i).shape[static_cast<std::size_t>(d)], in(j).shape[static_cast<std::size_t>(d)],
                    fmt::format("{} dim {} of {} against {}", opname(), d, iname(i), iname(j)), iname(i)))
        return false;
    return true;
  }

  // dy * f'(x): nonlinear in x (no P), then the Multiply rule.
  void pointwise_grad() {
    for (int a = 0; a < axes(); ++a)
      if (pin(1, a).is_p()) return partial_misuse(1, a, "the derivative of a nonlinear op at a pending sum is not the sum of derivatives");
    if (!same_shape(0, 1)) return;
    add_like(true);
  }

  void norm_grad() {
    std::vector<int> dims;
    if (!attr_dims(in(1).rank, dims, iname(1))) return;
    for (int a = 0; a < axes(); ++a) {
      if (pin(1, a).is_p()) return partial_misuse(1, a, "the gradient of a normalization depends on the statistics of the whole value");
      for (int i = 0; i < 2; ++i)
        for (int d : dims)
          if (pin(i, a).is_s(d)) return sharded_dim(i, a, d, "the gradient of a normalization reduces over the normalized dims");
      if (n_in() == 3) {
        Placement w = pin(2, a);
        if (w.is_p()) return partial_misuse(2, a, "a norm's affine weight must be a whole value");
        if (w.is_s()) return sharded_dim(2, a, w.dim, "the weight spans the normalized dims");
      }
    }
    if (!same_shape(0, 1)) return;
    add_like(true);
    if (!failed_ && n_in() == 3)
      for (int a = 0; a < axes(); ++a)
        if (pin(2, a).is_v() && !pl_of(out(), a).is_v()) set_new(out(), a, Placement::v(), "a per-rank norm weight gives per-rank gradients");
  }

  void attention_grad() {
    int b = 0, h = 1, s = 2, dd = 3;
    if (at().layout == AttnLayout::BSHD) s = 1, h = 2;
    if (at().layout == AttnLayout::SBHD) s = 0, b = 1, h = 2;
    int wrt = at().choice < 3 ? at().choice : 0;  // q, k, v
    for (int i = 0; i < 4; ++i)
      if (in(i).rank != 4) return report(CheckId::ShapeMismatch, fmt::format("AttentionGrad {} must have rank 4, got shape {}", iname(i), sstr(in(i).dims())), iname(i));
    Value& o = out() = in(1 + wrt);
    o.dtype = in(0).dtype;
    for (int a = 0; a < axes(); ++a) {
      Placement dy = pin(0, a), q = pin(1, a), k = pin(2, a), v = pin(3, a);
      for (int i = 1; i < 4; ++i)
        if (pin(i, a).is_p()) return partial_misuse(i, a, "attention is nonlinear in q, k and v");
      Placement f, res[3] = {q, k, v};
      if (q.is_i() && k.is_i() && v.is_i()) f = q;
      else if (q == k && k == v && (q.is_r() || q.is_s(h) || q.is_s(b))) f = q;
      else if (q.is_s(s) && k.is_r() && v.is_r() && !at().causal) f = q, res[1] = res[2] = Placement::p();
      else if (q.is_r() && k.is_r() && v.is_s(dd)) f = v, res[0] = res[1] = Placement::p();
      else if ((q.is_v() || q.is_r()) && (k.is_v() || k.is_r()) && (v.is_v() || v.is_r())) f = Placement::v(), res[0] = res[1] = res[2] = Placement::v();
      else
        return layout_conflict(fmt::format("AttentionGrad gets q {}, k {}, v {} over {}: attention does not take these together", ps(q), ps(k), ps(v), axn(a)),
                               iname(1), 1, a, "");
      Placement r;
      if (dy == f) r = res[wrt];
      else if (dy.is_p() && dy.linear_partial() && f.is_r()) r = dy;
      else if (dy.is_v() && f.varying()) r = Placement::v();
      else {
        std::vector<Note> notes;
        origin_note(notes, in(0), a);
        return report(CheckId::PlacementMismatch,
                      fmt::format("AttentionGrad expects {} placed like the attention output ({} over {}), but it is {}", iname(0), ps(f), axn(a), ps(dy)),
                      iname(0), std::move(notes));
      }
      if (r == pin(1 + wrt, a)) set_from(o, a, r, 1 + wrt);
      else set_new(o, a, r, fmt::format("the attention gradient with respect to {} is {} over {}", iname(1 + wrt), ps(r), axn(a)));
    }
  }

  void embedding_grad() {
    const Value& w = in(2);
    if (w.rank != 2) return report(CheckId::ShapeMismatch, fmt::format("EmbeddingGrad weight {} must be [vocab, hidden], got shape {}", iname(2), sstr(w.dims())), iname(2));
    Value& o = out() = w;
    o.dtype = in(0).dtype;
    int last = in(0).rank - 1;
    for (int a = 0; a < axes(); ++a) {
      Placement dy = pin(0, a), ids = pin(1, a), pw = pin(2, a);
      bool ids_whole = ids.is_r() || ids.is_i();
      if (ids.is_p()) return partial_misuse(1, a, "token ids cannot be a pending sum");
      if (pw.is_s(0)) {
        if (!ids_whole || !(dy.is_r() || dy.is_i()))
          return layout_conflict(fmt::format("EmbeddingGrad for the vocab-sharded {} over {} needs whole ids and a whole dy, got ids {} and dy {}", iname(2),
                                             axn(a), ps(ids), ps(dy)),
                                 iname(0), 0, a, fmt::format("all-reduce {} over {} first", iname(0), axn(a)));
        set_from(o, a, pw, 2);
      } else if (pw.is_s(1)) {
        if (!dy.is_s(last)) return layout_conflict(fmt::format("EmbeddingGrad for {} (S(1) over {}) needs dy S({}), got {}", iname(2), axn(a), last, ps(dy)), iname(0), 0, a, "");
        set_from(o, a, pw, 2);
      } else if (pw.is_i()) {
        if (!(dy.is_i() && ids_whole)) return report(CheckId::InvariantMix, fmt::format("EmbeddingGrad for the invariant {} over {} needs dy I, got {}", iname(2), axn(a), ps(dy)), iname(0));
        set_from(o, a, pw, 2);
      } else if (pw.is_v()) {
        set_from(o, a, pw, 2);
      } else if (dy.is_r() && ids_whole) {
        set_from(o, a, Placement::r(), 2);
      } else if (dy.is_p() && !dy.linear_partial()) {
        return partial_misuse(0, a, "a scatter-add does not commute with a pending max or min");
      } else {
        set_new(o, a, Placement::p(), fmt::format("EmbeddingGrad sums the rows of {} ({} over {}) on each rank: every rank holds a part of the table's gradient",
                                                  iname(0), ps(dy), axn(a)));
      }
    }
  }

  void cross_entropy_grad() {
    const Value& lg = in(1);
    if (lg.rank < 1) return report(CheckId::ShapeMismatch, fmt::format("CrossEntropyGrad logits {} must have a vocab dim", iname(1)), iname(1));
    int vd = lg.rank - 1;
    Value& o = out() = lg;
    o.dtype = in(0).dtype == DType::F32 ? lg.dtype : in(0).dtype;
    for (int a = 0; a < axes(); ++a) {
      Placement dl = pin(0, a), pl = pin(1, a), pb = pin(2, a);
      if (pl.is_p()) return partial_misuse(1, a, "the loss is nonlinear in the logits");
      if (pb.is_p()) return partial_misuse(2, a, "labels cannot be a pending sum");
      if (pl.is_s(vd)) {
        if (!at().vocab_parallel) return sharded_dim(1, a, vd, "the softmax needs the whole vocabulary (set vocab_parallel: true)");
        if (dl.is_p()) return partial_misuse(0, a, "the vocab-sharded logits gradient scales each rank's slice by the whole loss gradient",
                                             fix_allreduce(iname(0), a, dl));
        set_from(o, a, pl, 1);
      } else if (dl.is_p()) {
        if (!dl.linear_partial()) return partial_misuse(0, a, "a pending max or min is not a loss gradient");
        if (!(pl.is_r() && (pb.is_r() || pb.is_i()))) return partial_misuse(0, a, fmt::format("the logits {} are {} over {}, so each rank's summand is scaled by a different piece", iname(1), ps(pl), axn(a)));
        set_from(o, a, dl, 0);
      } else if (pl.is_r() && pb.is_s()) {
        set_new(o, a, Placement::s(pb.dim), fmt::format("the labels {} are {} over {}: each rank has the gradient of its own tokens' rows", iname(2), ps(pb), axn(a)));
      } else if (pl.is_r() && dl.is_s()) {
        set_from(o, a, dl, 0);
      } else if (pl.is_r() && dl.is_v()) {
        set_from(o, a, dl, 0);
      } else {
        set_from(o, a, pl, 1);
      }
    }
  }

  void topk_grad() {
    const Value& x = in(1);
    if (x.rank < 1) return report(CheckId::ShapeMismatch, fmt::format("TopKGrad logits {} must have an expert dim", iname(1)), iname(1));
    int e = x.rank - 1;
    Value& o = out() = x;
    o.dtype = in(0).dtype;
    for (int a = 0; a < axes(); ++a) {
      Placement dw = pin(0, a), p = pin(1, a);
      if (p.is_p()) return partial_misuse(1, a, "top-k of a pending sum is not the top-k of its parts");
      if (p.is_s(e)) return sharded_dim(1, a, e, "the routing gradient scatters over the whole expert dim");
      if (dw.is_p()) {
        if (!p.is_r()) return partial_misuse(0, a, fmt::format("the logits {} are {} over {}", iname(1), ps(p), axn(a)));
        set_from(o, a, dw, 0);
      } else if (dw.is_s(e)) {
        return sharded_dim(0, a, e, "the routing weights' gradient must hold every selected expert");
      } else {
        set_from(o, a, dw, 0);
      }
    }
  }

  // ---- postconditions -----------------------------------------------------------------------
  void check_outputs() {
    op_idx_ = -1;
    if (inferred_) inferred_->clear();
    for (const auto& od : p_.outputs) {
      const Value& v = env_[static_cast<std::size_t>(od.name)];
      const std::string& name = p_.name(od.name);
      if (inferred_) inferred_->push_back(v.poisoned || !v.defined ? std::nullopt : std::optional<Placements>(v.pl));
      if (v.poisoned || !v.defined) continue;
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
        if (got == want || (!od.has_placement && !got.is_p())) continue;  // no placement declared: only P is wrong
        Diagnostic d;
        d.loc = od.loc;
        d.tensor = name;
        origin_note(d.notes, v, a);
        if (got.is_p() && !want.is_p()) {
          d.id = CheckId::PartialOutput;
          d.message = od.has_placement
                          ? fmt::format("output {} is still {} over {}, but it is declared {}: every rank holds only a summand", name, ps(got), axn(a), ps(want))
                          : fmt::format("output {} is still {} over {}: every rank holds only a summand, and an output is P only when its declared "
                                        "placement says so",
                                        name, ps(got), axn(a));
          std::string coll = want.is_s() ? fmt::format("{{op: ReduceScatter, in: [{}], out: {}_reduced, axis: {}, dim: {}}}", name, name, axn(a), want.dim)
                                         : fmt::format("{{op: AllReduce, in: [{}], out: {}_reduced, axis: {}{}}}", name, name, axn(a),
                                                       got.op == ReduceOp::Sum ? "" : fmt::format(", reduce: {}", reduce_name(got.op)));
          d.notes.push_back({od.loc, fmt::format("fix: insert {} after the op that produces {} and output {}_reduced", coll, name, name)});
        } else {
          d.id = CheckId::PlacementMismatch;
          d.message = fmt::format("output {} is {} over {}, but it is declared {}", name, ps(got), axn(a), ps(want));
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

  const Program& p_;
  ExprPool pool_;
  Obligations obl_;
  std::vector<Diagnostic> diags_;
  std::vector<Value> env_;
  std::vector<Origin> origins_;
  int op_idx_ = -1;
  const Op* op_ = nullptr;
  std::vector<const Value*> in_;
  std::array<Value, 2> out_{};
  bool failed_ = false;
  std::unordered_map<int, std::vector<int>> recv_sends_;  // Recv op -> the Send ops it pairs with (on some rank)
  std::unordered_map<int, Value> sent_;                   // Send op -> the value it sends, once reached
  std::unordered_map<int, Value> watched_;                // collective op -> its input (ops matched across programs)
  SpatialTypes* types_ = nullptr;
  bool recording_decls_ = true;
  std::vector<std::optional<Placements>>* inferred_ = nullptr;
};

}  // namespace

std::vector<Diagnostic> check_spatial(const Program& program, const SpatialOptions& options) {
  return Checker(program, options).run();
}

}  // namespace spmd
