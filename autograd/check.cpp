// autograd/check.cpp - the training step as one program; gradient duality and synchronization.
#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <optional>
#include <string>
#include <unordered_map>
#include <unordered_set>

#include "autograd/autograd.h"
#include "autograd/derive.h"
#include "ir/memory.h"
#include "autograd/loss_scaling.h"
#include "ir/printer.h"
#include "spatial/spatial.h"

namespace spmd {

namespace {

bool is_comm(OpKind k) { return op_info(k).category == OpCategory::collective; }

// What a collective is, for comparing a backward one with the dual of a forward one.
struct Sig {
  OpKind kind;
  std::uint32_t axes = 0;
  int dim = kUnset, dim2 = kUnset, rank = -1;
  bool operator==(const Sig& o) const { return kind == o.kind && axes == o.axes && dim == o.dim && dim2 == o.dim2 && rank == o.rank; }
};

// A forward collective or conversion and the duals that may stand for it in a backward.
struct Forward {
  int op;
  std::vector<Sig> duals;  // acceptable backward collectives (empty: the dual needs no communication)
  bool required = false;   // the dual communicates, so a backward without it is wrong
  bool matched = false;
};

class TrainingChecker {
 public:
  // `p` is the forward; it becomes the training step in place (undo says how to give the forward back).
  TrainingChecker(Program& p, ForwardUndo& undo, const TrainingOptions& o) : p_(p), step_(p), undo_(undo), o_(o) {}

  TrainingCheck run() {
    TrainingCheck r;
    if (p_.loss < 0) return r;
    // The forward's types: the caller's check of the forward when given, else one here. The forward is
    // not checked again below (the step's check takes them as the types of its first ops).
    SpatialTypes own;
    SpatialOptions so;
    so.z3_timeout_ms = o_.z3_timeout_ms;
    if (!o_.forward_types) {
      so.types = &own;
      for (auto& d : check_spatial(p_, so))
        if (d.severity == Severity::Error) r.diags.push_back(std::move(d));
      if (!r.diags.empty()) return r;  // not built: the forward's errors
    } else if (!o_.forward_ok) {
      return r;
    }
    const SpatialTypes& ft = o_.forward_types ? *o_.forward_types : own;
    ft_ = &ft;
    // From here on p_ is also the step: the forward is its first n_ops_ ops and n_tensors_ declarations.
    n_ops_ = p_.ops.size();
    n_tensors_ = p_.tensors.size();
    has_backward_ = p_.has_backward;
    has_grad_sync_ = p_.has_grad_sync;
    backward_loc_ = p_.backward_loc;
    save(step_);
    hand_ = has_backward_;
    Program& t = step_;
    if (hand_) t.exprs = ft.exprs;
    else forward_op_ = derive_backward_in_place(t, ft);
    // The seed: <loss>.grad, the dual of the loss's placement.
    ValueType lt = final_type(p_, ft, p_.loss, n_ops_);
    TensorDecl seed;
    seed.name = t.intern(t.name(p_.loss) + ".grad");
    seed.loc = seed.shape_loc = seed.placement_loc = p_.loss_loc;
    seed.shape.assign(lt.shape.begin(), lt.shape.begin() + lt.rank);
    seed.dtype = lt.dtype;
    for (int a = 0; a < t.axis_count(); ++a) seed.placement[static_cast<std::size_t>(a)] = dual(lt.pl[static_cast<std::size_t>(a)]);
    t.tensors.push_back(std::move(seed));
    first_bwd_ = n_ops_;  // a derived backward is appended to the ops already, a hand-written one here
    std::size_t params = 0;
    for (const auto& d : fwd_tensors()) params += d.param;
    reserve_huge(t.ops, t.ops.size() + undo_.backward.size() + params * static_cast<std::size_t>(t.axis_count()) + undo_.grad_sync.size() +
                            undo_.optimizer.size());
    t.ops.insert(t.ops.end(), undo_.backward.begin(), undo_.backward.end());
    first_relabel_ = t.ops.size();
    relabel_mean_loss(t, lt);
    first_sync_ = t.ops.size();
    t.ops.insert(t.ops.end(), undo_.grad_sync.begin(), undo_.grad_sync.end());
    first_optim_ = t.ops.size();
    t.ops.insert(t.ops.end(), undo_.optimizer.begin(), undo_.optimizer.end());
    t.backward.clear();
    t.grad_sync.clear();
    t.optimizer.clear();
    t.has_backward = t.has_grad_sync = t.has_optimizer = t.train = false;
    t.outputs.clear();
    t.has_expect = false;
    r.first_backward = first_bwd_;
    r.built = true;

    so.types = &tt_;
    so.prefix = &ft;
    so.prefix_ops = first_bwd_;
    so.no_grad_from = first_optim_;
    std::vector<Diagnostic> spatial = check_spatial(t, so);
    index(t);
    if (compensated(t, spatial)) {  // grad_sync scales those gradients back: check the step without their relabels
      spatial = check_spatial(t, so);
      index(t);
    }
    if (hand_) match_duals(t, ft, r.diags);
    // After a duality finding, the placement errors further down the backward are its consequences.
    int first_dual = std::numeric_limits<int>::max();
    for (const auto& d : r.diags) first_dual = std::min(first_dual, d.op < static_cast<int>(first_bwd_) ? static_cast<int>(first_bwd_) : d.op);
    for (auto& d : spatial) {
      if (d.op < static_cast<int>(first_bwd_) || flagged_.count(d.op)) continue;
      if (d.op >= static_cast<int>(first_relabel_) && d.op < static_cast<int>(first_sync_)) {
        fold_relabel_finding(t, d);
        continue;
      }
      relabel_notes(d);
      bool placement = d.id == CheckId::PartialMisuse || d.id == CheckId::InvariantMix || d.id == CheckId::IllegalCollective ||
                       d.id == CheckId::PlacementMismatch || d.id == CheckId::LayoutConflict;
      if (placement && d.op >= first_dual) continue;
      if (!hand_ && static_cast<std::size_t>(d.op) < first_relabel_) {
        const Op& f = p_.ops[static_cast<std::size_t>(forward_op_[static_cast<std::size_t>(d.op) - first_bwd_])];
        d.message = fmt::format("in the derived backward of {} (line {}): {}", op_name(f.kind), f.loc.line, d.message);
      }
      r.diags.push_back(std::move(d));
    }
    if (!hand_) self_check(t, r.diags);
    unsynced(t, r.diags);
    mean_loss_findings(t, r.diags);
    optimizer_consequences(r.diags);
    sort_and_cap(r.diags, r.diags.size());
    r.first_relabel = first_relabel_;
    r.first_sync = first_sync_;
    if (!hand_) r.forward_op = forward_op_;
    r.first_optim = first_optim_;
    if (o_.step_types) *o_.step_types = std::move(tt_);
    return r;
  }

 private:
  // ---- a per-rank mean loss ------------------------------------------------------------------------
  // Each rank's backward starts from 1 on its own loss, as autograd does (DDP, FSDP, Megatron), so over
  // an axis where the loss is P(avg) (a per-rank mean) the backward computes the gradient of the sum of
  // the per-rank losses: N times the gradient of the mean. A parameter gradient that is a pending sum
  // there is therefore, as a gradient of the loss, a pending average: the per-rank values are the
  // same, the reading is divided by N. Between the backward and grad_sync, every parameter gradient is
  // relabelled P(sum) -> P(avg) over those axes (a Reinterpret with `from: P`); a gradient that is not
  // a pending sum there (already reduced, sharded, invariant) would be N times too large, and the
  // Reinterpret's placement-mismatch becomes a loss-scaling finding (mean_loss_finding).
  void relabel_mean_loss(Program& t, const ValueType& lt) {
    for (int a = 0; a < t.axis_count(); ++a) {
      Placement p = lt.pl[static_cast<std::size_t>(a)];
      if (p.is_p() && p.op == ReduceOp::Avg) avg_axes_ |= 1u << a;
      // A replicated loss: its seed, 1 on every rank, is typed P(sum) (the dual of R), a pending sum of N
      // ones, so the backward computes the gradient of N copies of the loss, as over a per-rank mean.
      if (p.is_r()) avg_axes_ |= 1u << a, repl_axes_ |= 1u << a;
    }
    if (!avg_axes_) return;
    std::vector<char> written(t.names.size(), 0);
    for (std::size_t i = first_bwd_; i < t.ops.size(); ++i)
      for (NameId n : t.outs(t.ops[i])) written[static_cast<std::size_t>(n)] = 1;
    for (const auto& decl : fwd_tensors()) {
      if (!decl.param) continue;
      auto it = t.name_ids.find(p_.name(decl.name) + ".grad");
      if (it == t.name_ids.end() || !written[static_cast<std::size_t>(it->second)]) continue;
      for (int a = 0; a < t.axis_count(); ++a) {
        if (!(avg_axes_ & (1u << a))) continue;
        Op o;
        o.kind = OpKind::Reinterpret;
        o.loc = p_.loss_loc;
        o.attrs.axes = 1u << a;
        o.attrs.from = Placement::p();
        o.attrs.has_from = true;
        o.attrs.to = Placement::p(ReduceOp::Avg);
        o.attrs.has_to = true;
        NameId n = it->second;
        t.add_op(o, std::span<const NameId>(&n, 1), std::span<const NameId>(&n, 1));
        relabel_param_.push_back(decl.name);
      }
    }
  }
  // ---- findings at the relabels ---------------------------------------------------------------------
  // A relabel fails when a parameter gradient is not a pending sum over an axis the loss is a per-rank mean
  // (or replicated) over: it is N times the gradient of the loss. Per-rank (V) gradients of whole parameters
  // are left to unsynced-gradient. The findings are one cause (the loss), so they are folded per cause and
  // reported once (mean_loss_findings): at the op that replicated the loss, or at the loss.
  void fold_relabel_finding(const Program& t, const Diagnostic& d) {
    std::size_t k = static_cast<std::size_t>(d.op) - first_relabel_;
    const Op& op = t.ops[static_cast<std::size_t>(d.op)];
    int a = std::countr_zero(op.attrs.axes);
    const TensorDecl* decl = param_decl(relabel_param_[k]);
    const ValueType* g = type_of(src_[op.first]);
    if (!decl || !g) return;
    Placement have = g->pl[static_cast<std::size_t>(a)], pp = decl->placement[static_cast<std::size_t>(a)];
    if (have.is_v() && (pp.is_r() || pp.is_i())) return;
    ((repl_axes_ >> a) & 1u ? repl_fold_ : mean_fold_).push_back({t.name(t.ins(op)[0]), to_string(have), a});
  }
  const TensorDecl* param_decl(NameId n) const {
    for (const auto& td : fwd_tensors())
      if (td.name == n) return &td;
    return nullptr;
  }
  void mean_loss_findings(const Program& t, std::vector<Diagnostic>& out) {
    std::string loss = p_.name(p_.loss);
    if (!repl_fold_.empty()) {
      std::uint32_t axes = 0;
      for (const auto& f : repl_fold_) axes |= 1u << f.axis;
      // the cascade of the same cause: replicated gradients never averaged over those axes
      std::vector<std::string> left;
      std::erase_if(out, [&](const Diagnostic& d) {
        auto it = unsynced_axes_.find(d.tensor);
        if (d.id != CheckId::UnsyncedGradient || it == unsynced_axes_.end() || (it->second & ~axes)) return false;
        left.push_back(d.tensor);
        return true;
      });
      std::string ax = axis_list(t, axes);
      Diagnostic d;
      d.id = CheckId::LossScaling;
      d.loc = p_.loss_loc;
      d.tensor = loss;
      int w = replicating_op(std::countr_zero(axes));
      const Op* op = w >= 0 ? &p_.ops[static_cast<std::size_t>(w)] : nullptr;
      std::string tail = left.empty() ? ""
                         : fmt::format("; and {} {} left pending over {} (grad_sync never averages {})", fmt::join(left, ", "), left.size() > 1 ? "are" : "is",
                                       ax, left.size() > 1 ? "them" : "it");
      d.message = fmt::format("the loss {} is replicated over {} (R){}, so each rank's backward, seeded with 1 on its own copy as autograd does, computes "
                              "the gradient of {} copies of the loss (the seed, dual of R, is a pending sum): {} {} the gradient of the loss times the "
                              "size of {}{}",
                              loss, ax, op && op->kind == OpKind::AllReduce ? " after this AllReduce" : "", ax, grads_text(repl_fold_),
                              repl_fold_.size() > 1 ? "are" : "is", ax, tail);
      if (op && (op->kind == OpKind::AllReduce || op->kind == OpKind::CrossEntropyLoss)) {
        d.loc = op->loc;
        d.op = w;
        Op fixed = *op;
        fixed.attrs.dst_invariant = true;
        std::string why = op->kind == OpKind::AllReduce
                              ? "a DTensor P -> R redistribute has an identity backward, and so has Megatron's reduce_from_tensor_model_parallel_region"
                              : "Megatron's vocab_parallel_cross_entropy computes the same loss on every rank and its backward is local";
        std::vector<std::string> also = replicated_after(p_, *ft_, n_ops_, w, axes);
        d.notes.push_back({op->loc, fmt::format("fix: make the loss invariant: `dst: I` on this {} ({}): its gradient is then the loss's gradient on "
                                                "every rank, with nothing to average{}",
                                                op_name(op->kind), why,
                                                also.empty() ? ""
                                                             : fmt::format("; and declare {} invariant (I) over {} too, as {} combined with the "
                                                                           "invariant values after it (each rank computes the same gradient)",
                                                                           fmt::join(also, ", "), ax, also.size() > 1 ? "they are" : "it is"))});
        // a hand-written backward holds the old dual (an AllReduce): the fix is two edits there
        if (also.empty() && !hand_) d.fix = {FixKind::Replace, w, op->loc.line, "", print_op(p_, fixed)};
        if (hand_) d.notes.back().message += fmt::format(", and drop that {}'s dual from `backward:` (the dual of `dst: I` is the identity)", op_name(op->kind));
      } else {
        d.notes.push_back({p_.loss_loc, fmt::format("fix: every rank of {} computes the whole loss from replicated values: declare the values it is "
                                                    "computed from invariant (I) over {} (Megatron's f, Convert I -> R, marks where the gradient "
                                                    "is reduced), or average the gradients over {} in grad_sync with `reduce: avg`",
                                                    ax, ax, ax)});
      }
      out.push_back(std::move(d));
    }
    if (!mean_fold_.empty()) {
      std::uint32_t axes = 0;
      for (const auto& f : mean_fold_) axes |= 1u << f.axis;
      std::string ax = axis_list(t, axes);
      Diagnostic d;
      d.id = CheckId::LossScaling;
      d.loc = p_.loss_loc;
      d.tensor = loss;
      d.message = fmt::format("the loss {} is a per-rank mean over {} (P(avg)), so each rank's backward, seeded with 1 on its own loss as autograd "
                              "does, computes the gradient of the sum of the per-rank losses: {} {} there, so {} the gradient of the mean loss "
                              "times the size of {}",
                              loss, ax, grads_text(mean_fold_), mean_fold_.size() > 1 ? "are not pending sums" : "is not a pending sum",
                              mean_fold_.size() > 1 ? "they are" : "it is", ax);
      // LossScale must name every axis the loss is a per-rank mean over (its rule), so the fix lists them all.
      std::uint32_t mean_axes = avg_axes_ & ~repl_axes_;
      std::string scale = scale_text(t, mean_axes);
      d.notes.push_back({p_.loss_loc, fmt::format("fix: make the per-rank losses summands of the mean before the backward: insert {{op: LossScale, in: "
                                                  "[{}], out: {}_scaled, scale: {}, axis: {}}} after the op that produces {} and use {}_scaled as the "
                                                  "loss; or scale those gradients by {} in grad_sync (DeepSpeed's expert gradients: average over the "
                                                  "expert-data-parallel group, then multiply by 1/ep)",
                                                  loss, loss, scale, axis_attr(t, mean_axes), loss, loss, scale_text(t, axes))});
      out.push_back(std::move(d));
    }
  }
  // ---- a scale in grad_sync that compensates (DeepSpeed #6546) ----------------------------------------
  // A gradient N times too large over the axes its relabels fail on is right when grad_sync multiplies it
  // by exactly 1/N before the optimizer (DeepSpeed averages expert gradients over the expert-data-parallel
  // group, then multiplies by 1/ep). Those relabels become no-ops (a LossScale by 1) and the step is checked
  // again. True when some relabel changed.
  bool compensated(Program& t, const std::vector<Diagnostic>& spatial) {
    std::unordered_map<NameId, std::vector<std::size_t>> failed;  // parameter -> its failed relabel ops
    for (const auto& d : spatial)
      if (d.op >= static_cast<int>(first_relabel_) && d.op < static_cast<int>(first_sync_))
        failed[relabel_param_[static_cast<std::size_t>(d.op) - first_relabel_]].push_back(static_cast<std::size_t>(d.op));
    bool changed = false;
    for (auto& [param, ops] : failed) {
      std::sort(ops.begin(), ops.end());
      ops.erase(std::unique(ops.begin(), ops.end()), ops.end());
      double n = 1;
      bool concrete = true;
      for (std::size_t j : ops) {
        ExprId e = t.mesh[static_cast<std::size_t>(std::countr_zero(t.ops[j].attrs.axes))].size;
        if (t.exprs.is_const(e)) n *= static_cast<double>(t.exprs.value(e));
        else concrete = false;
      }
      auto f = sync_scale(t, first_sync_, first_optim_, t.ins(t.ops[ops[0]])[0]);
      if (!concrete || !f || std::abs(*f * n - 1) > 1e-9) continue;
      for (std::size_t j : ops) {
        Op& o = t.ops[j];
        o.kind = OpKind::LossScale;
        o.attrs = OpAttrs();
        o.attrs.number = 1;
        o.attrs.has_number = true;
      }
      changed = true;
    }
    return changed;
  }
  // The forward op at which the loss became R over axis a: follow the loss back through ops whose output
  // keeps their first input's placement there (a mean, a scale, a cast) to the one whose input was not R.
  int replicating_op(int a) const {
    const SpatialTypes& ft = *ft_;
    NameId n = p_.loss;
    for (std::size_t end = n_ops_; end > 0;) {
      int w = -1;
      for (std::size_t i = end; i-- > 0 && w < 0;)
        for (NameId o : p_.outs(p_.ops[i]))
          if (o == n) w = static_cast<int>(i);
      if (w < 0) return -1;
      const Op& op = p_.ops[static_cast<std::size_t>(w)];
      if (op.n_in == 0) return w;
      NameId in = p_.ins(op)[0];
      if (!final_type(p_, ft, in, static_cast<std::size_t>(w)).pl[static_cast<std::size_t>(a)].is_r()) return w;
      n = in;
      end = static_cast<std::size_t>(w);
    }
    return -1;
  }

  // The origin note of a relabelled gradient names the mean loss, not the internal Reinterpret.
  void relabel_notes(Diagnostic& d) const {
    if (!avg_axes_) return;
    for (auto& n : d.notes) {
      if (n.loc.line != p_.loss_loc.line || n.loc.col != p_.loss_loc.col) continue;
      auto at = n.message.find(": Reinterpret over ");
      if (at == std::string::npos) continue;
      std::size_t nb = at + std::string(": Reinterpret over ").size(), ne = n.message.find(' ', nb);
      std::string axname = n.message.substr(nb, ne == std::string::npos ? std::string::npos : ne - nb);
      int a = -1;
      for (int k = 0; k < p_.axis_count(); ++k)
        if (p_.mesh[static_cast<std::size_t>(k)].name == axname) a = k;
      bool repl = a >= 0 && (repl_axes_ & (1u << a));
      n.message = n.message.substr(0, at) + (repl ? ": the loss is replicated (R) over that axis, so each rank's gradient, seeded with 1 on its "
                                                    "own copy, is a summand of an average over the copies"
                                                  : ": the loss is a per-rank mean (P(avg)) over that axis, so each rank's gradient, seeded with 1 "
                                                    "on its own loss, is a summand of an average");
    }
  }

  // ---- writers of the training step ---------------------------------------------------------------
  // A writer is an op output (index into tt_.outs, >= 0) or a declaration (-(d + 2)); -1 = none.
  void index(const Program& t) {
    std::vector<std::int64_t> cur(t.names.size(), -1);
    for (std::size_t d = 0; d < t.tensors.size(); ++d) cur[static_cast<std::size_t>(t.tensors[d].name)] = -static_cast<std::int64_t>(d) - 2;
    src_.assign(t.operands.size(), -1);
    out_op_.assign(tt_.outs.size(), 0);
    for (std::size_t i = 0; i < t.ops.size(); ++i) {
      if (i == first_relabel_) before_sync_ = cur;
      const Op& op = t.ops[i];
      auto ins = t.ins(op);
      for (std::size_t k = 0; k < ins.size(); ++k) src_[op.first + k] = cur[static_cast<std::size_t>(ins[k])];
      auto outs = t.outs(op);
      for (std::size_t k = 0; k < outs.size(); ++k) {
        std::size_t w = tt_.out_base[i] + k;
        out_op_[w] = static_cast<std::uint32_t>(i);
        cur[static_cast<std::size_t>(outs[k])] = static_cast<std::int64_t>(w);
      }
    }
    if (first_relabel_ == t.ops.size()) before_sync_ = cur;
    final_ = std::move(cur);
  }
  const ValueType* type_of(std::int64_t w) const {
    if (w >= 0) return &tt_.outs[static_cast<std::size_t>(w)];
    if (w <= -2) return &tt_.decls[static_cast<std::size_t>(-w - 2)];
    return nullptr;
  }

  static int norm(int d, int rank) { return d == kUnset ? d : d < 0 ? d + rank : d; }

  // ---- gradient duality (hand-written backward) ---------------------------------------------------
  // Forward ops whose backward is needed: an output reaches the loss and an input depends on a
  // floating-point declaration.
  std::vector<char> relevant(const Program& p, const SpatialTypes& ft, std::size_t n_ops) const {
    std::vector<char> needs(p.names.size(), 0), live(p.names.size(), 0), rel(n_ops, 0);
    for (std::size_t d = 0; d < ft.decls.size(); ++d) {
      DType dt = ft.decls[d].dtype;
      needs[static_cast<std::size_t>(p.tensors[d].name)] = !(dt == DType::I64 || dt == DType::I32 || dt == DType::I8 || dt == DType::Bool);
    }
    std::vector<char> op_needs(n_ops, 0);
    for (std::size_t i = 0; i < n_ops; ++i) {
      bool any = false;
      for (NameId n : p.ins(p.ops[i])) any |= needs[static_cast<std::size_t>(n)] != 0;
      op_needs[i] = any;
      for (NameId n : p.outs(p.ops[i])) needs[static_cast<std::size_t>(n)] = any;
    }
    live[static_cast<std::size_t>(p.loss)] = 1;
    for (std::size_t i = n_ops; i-- > 0;) {
      bool reaches = false;
      for (NameId n : p.outs(p.ops[i])) reaches |= live[static_cast<std::size_t>(n)] != 0;
      if (!reaches) continue;
      rel[i] = op_needs[i];
      for (NameId n : p.ins(p.ops[i])) live[static_cast<std::size_t>(n)] = 1;
    }
    return rel;
  }

  static std::string sig_text(const Program& p, const Sig& s) {
    std::string t = std::string(op_name(s.kind));
    std::string ax;
    for (int a = 0; a < p.axis_count(); ++a)
      if (s.axes & (1u << a)) ax += (ax.empty() ? "" : ", ") + p.mesh[static_cast<std::size_t>(a)].name;
    t += " over " + ax;
    if (s.kind == OpKind::AllToAll) t += fmt::format(" (split_dim {}, concat_dim {})", s.dim, s.dim2);
    else if (s.dim != kUnset) t += fmt::format(" (dim {})", s.dim);
    if (s.rank >= 0) t += fmt::format(" ({} {})", s.kind == OpKind::Broadcast || s.kind == OpKind::Scatter ? "src" : "dst", s.rank);
    return t;
  }
  static std::string sig_yaml(const Program& p, const Sig& s, const std::string& in, const std::string& out) {
    std::string ax;
    int n = 0;
    for (int a = 0; a < p.axis_count(); ++a)
      if (s.axes & (1u << a)) ax += (ax.empty() ? "" : ", ") + p.mesh[static_cast<std::size_t>(a)].name, ++n;
    if (n > 1) ax = "[" + ax + "]";
    std::string t = fmt::format("{{op: {}, in: [{}], out: {}, axis: {}", op_name(s.kind), in, out, ax);
    if (s.kind == OpKind::AllToAll) t += fmt::format(", split_dim: {}, concat_dim: {}", s.dim, s.dim2);
    else if (s.dim != kUnset) t += fmt::format(", dim: {}", s.dim);
    if (s.rank >= 0) t += fmt::format(", {}: {}", s.kind == OpKind::Broadcast || s.kind == OpKind::Scatter ? "src" : "dst", s.rank);
    return t + "}";
  }

  Forward forward_dual(const Program& p, const ValueType& x, std::size_t i) const {
    const Op& op = p.ops[i];
    const OpAttrs& a = op.attrs;
    int d = norm(a.dim, x.rank), d2 = norm(a.dim2, x.rank);
    Forward f{static_cast<int>(i), {}, false, false};
    auto need = [&](OpKind k, int dim = kUnset, int dim2 = kUnset, int rank = -1, std::uint32_t axes = 0) {
      f.duals.push_back({k, axes ? axes : a.axes, dim, dim2, rank});
      f.required = true;
    };
    // Only collectives and conversions have duals that communicate (the table in docs/semantics.md).
    if (op.kind == OpKind::AllReduce && !a.dst_invariant) need(OpKind::AllReduce);
    if (op.kind == OpKind::AllGather && !a.dst_invariant) need(OpKind::ReduceScatter, d);
    if (op.kind == OpKind::ReduceScatter) need(OpKind::AllGather, d);
    if (op.kind == OpKind::AllToAll) need(OpKind::AllToAll, d2, d);
    if (op.kind == OpKind::Broadcast) need(OpKind::Reduce, kUnset, kUnset, a.rank);
    if (op.kind == OpKind::Reduce) need(OpKind::Broadcast, kUnset, kUnset, a.rank);
    if (op.kind == OpKind::Scatter) need(OpKind::Gather, d, kUnset, a.rank);
    if (op.kind == OpKind::Gather) need(OpKind::Scatter, d, kUnset, a.rank);
    if (op.kind == OpKind::MoEDispatch) need(OpKind::MoECombine);  // adjoint token exchanges over the same axis
    if (op.kind == OpKind::MoECombine) need(OpKind::MoEDispatch);
    // ZeRO (section 4.4): a gather's dual is a reduce-scatter and back; written as ZeRO ops or as the plain collectives.
    int zd = norm(a.dim == kUnset ? 0 : a.dim, x.rank);
    if (op.kind == OpKind::ZeROGatherParam) need(OpKind::ZeROScatterGrad, zd), f.duals.push_back({OpKind::ReduceScatter, a.axes, zd, kUnset, -1});
    if (op.kind == OpKind::ZeROScatterGrad) need(OpKind::ZeROGatherParam, zd), f.duals.push_back({OpKind::AllGather, a.axes, zd, kUnset, -1});
    if (op.kind == OpKind::AllGather && !a.dst_invariant) f.duals.push_back({OpKind::ZeROScatterGrad, a.axes, d, kUnset, -1});
    if (op.kind == OpKind::ReduceScatter) f.duals.push_back({OpKind::ZeROGatherParam, a.axes, d, kUnset, -1});
    if (op.kind == OpKind::ZeROPartitionOptState) f.duals.push_back({OpKind::AllGather, a.axes, zd, kUnset, -1});
    if (op.kind == OpKind::Convert)
      for (int ax = 0; ax < p.axis_count(); ++ax) {
        if (!(a.axes & (1u << ax))) continue;
        Placement from = x.pl[static_cast<std::size_t>(ax)];
        if (from.is_i() && a.to.is_r()) need(OpKind::AllReduce, kUnset, kUnset, -1, 1u << ax);  // Megatron's f
        if (from.is_r() && a.to.is_s()) f.duals.push_back({OpKind::AllGather, 1u << ax, norm(a.to.dim, x.rank), kUnset, -1});
      }
    return f;
  }

  Sig backward_sig(const Program& t, std::size_t j) const {
    const Op& op = t.ops[j];
    const ValueType* x = op.n_in ? type_of(src_[op.first]) : nullptr;
    int rank = x ? x->rank : 0;
    Sig s{op.kind, op.attrs.axes, norm(op.attrs.dim, rank), norm(op.attrs.dim2, rank), -1};
    if (op.kind == OpKind::AllReduce || op.kind == OpKind::AllGather || op.kind == OpKind::ReduceScatter) s.dim2 = kUnset;
    if (op.kind == OpKind::AllReduce) s.dim = kUnset;
    if (op.kind == OpKind::ZeROGatherParam || op.kind == OpKind::ZeROScatterGrad) s.dim = norm(op.attrs.dim == kUnset ? 0 : op.attrs.dim, rank), s.dim2 = kUnset;
    if (op.kind == OpKind::Broadcast || op.kind == OpKind::Reduce || op.kind == OpKind::Scatter || op.kind == OpKind::Gather)
      s.rank = std::max(0, op.attrs.rank);
    return s;
  }

  bool is_param_grad(const Program& t, NameId n) const {
    const std::string& s = t.name(n);
    if (s.size() <= 5 || s.compare(s.size() - 5, 5, ".grad") != 0) return false;
    std::string base = s.substr(0, s.size() - 5);
    for (const auto& d : fwd_tensors())
      if (d.param && p_.name(d.name) == base) return true;
    return false;
  }

  void match_duals(const Program& t, const SpatialTypes& ft, std::vector<Diagnostic>& out) {
    std::vector<char> rel = relevant(p_, ft, n_ops_);
    std::vector<Forward> fwd;
    std::vector<const ValueType*> cur(p_.names.size(), nullptr);
    for (std::size_t d = 0; d < n_tensors_; ++d) cur[static_cast<std::size_t>(p_.tensors[d].name)] = &ft.decls[d];
    for (std::size_t i = 0; i < n_ops_; ++i) {
      const ValueType* x = p_.ops[i].n_in ? cur[static_cast<std::size_t>(p_.ins(p_.ops[i])[0])] : nullptr;
      auto outs = p_.outs(p_.ops[i]);
      for (std::size_t k = 0; k < outs.size(); ++k) cur[static_cast<std::size_t>(outs[k])] = &ft.out(i, static_cast<int>(k));
      if (!rel[i] || !x) continue;
      Forward f = forward_dual(p_, *x, i);
      if (!f.duals.empty()) {
        for (auto& s : f.duals) {
          if (s.kind == OpKind::Broadcast || s.kind == OpKind::Reduce || s.kind == OpKind::Scatter || s.kind == OpKind::Gather) s.rank = std::max(0, s.rank);
        }
        fwd.push_back(std::move(f));
      }
    }
    auto bwd_in = [&](std::size_t j) { return t.ops[j].n_in ? t.name(t.ins(t.ops[j])[0]) : std::string("?"); };
    auto bwd_out = [&](std::size_t j) { return t.ops[j].n_out ? t.name(t.outs(t.ops[j])[0]) : std::string("?"); };
    for (std::size_t j = first_bwd_; j < first_relabel_; ++j) {
      const Op& op = t.ops[j];
      if (!is_comm(op.kind)) continue;
      Sig s = backward_sig(t, j);
      Forward* hit = nullptr;
      for (auto it = fwd.rbegin(); it != fwd.rend() && !hit; ++it)
        if (!it->matched && std::find(it->duals.begin(), it->duals.end(), s) != it->duals.end()) hit = &*it;
      if (hit) {
        hit->matched = true;
        continue;
      }
      if ((op.kind == OpKind::AllReduce || op.kind == OpKind::ReduceScatter || op.kind == OpKind::ZeROScatterGrad) && op.n_in && (is_param_grad(t, t.ins(op)[0]) || (op.n_out && is_param_grad(t, t.outs(op)[0]))))
        continue;  // a gradient synchronization written into the backward
      Forward* same_axes = nullptr;
      for (auto it = fwd.rbegin(); it != fwd.rend() && !same_axes; ++it)
        if (!it->matched && it->required && (it->duals[0].axes & s.axes)) same_axes = &*it;
      Diagnostic d;
      d.id = CheckId::GradientDuality;
      d.loc = op.loc;
      d.op = static_cast<int>(j);
      d.tensor = bwd_in(j);
      flagged_.insert(static_cast<int>(j));
      if (same_axes) {
        same_axes->matched = true;
        const Op& f = p_.ops[static_cast<std::size_t>(same_axes->op)];
        const Sig& want = same_axes->duals[0];
        d.message = fmt::format("backward {} is not the dual of the forward {} at line {}: its dual is {}{}", sig_text(t, s), op_name(f.kind),
                                f.loc.line, sig_text(t, want), why(f.kind, f.attrs.dst_invariant));
        d.notes.push_back({f.loc, fmt::format("the forward {} whose dual is needed", op_name(f.kind))});
        d.notes.push_back({op.loc, "fix: replace it with " + sig_yaml(t, want, bwd_in(j), bwd_out(j))});
        d.fix = {FixKind::Replace, static_cast<int>(j - first_bwd_), op.loc.line, "", sig_yaml(t, want, bwd_in(j), bwd_out(j))};
      } else {
        d.message = fmt::format("backward {} is the dual of no forward collective: nothing in the forward made {} need it", sig_text(t, s), bwd_in(j));
        d.notes.push_back({op.loc, "fix: remove it (if it synchronizes a parameter gradient, move it to `grad_sync:`)"});
      }
      out.push_back(std::move(d));
    }
    for (const auto& f : fwd) {
      if (f.matched || !f.required) continue;
      const Op& op = p_.ops[static_cast<std::size_t>(f.op)];
      const Sig& want = f.duals[0];
      std::string x = p_.name(p_.ins(op)[0]), y = op.n_out ? p_.name(p_.outs(op)[0]) : x;
      Diagnostic d;
      d.id = CheckId::GradientDuality;
      d.loc = op.loc;
      d.op = f.op;
      d.tensor = y;
      d.message = fmt::format("the hand-written backward has no dual of this {}: {} is missing{}", op_name(op.kind), sig_text(t, want), why(op.kind, op.attrs.dst_invariant));
      d.notes.push_back({backward_loc_, "fix: insert " + sig_yaml(t, want, y + ".grad", x + ".grad") + " into `backward:` where " + y + ".grad is complete"});
      out.push_back(std::move(d));
    }
  }

  static std::string why(OpKind k, bool dst_i) {
    switch (k) {
      case OpKind::AllReduce: return dst_i ? "" : " (the gradient of a replicated value is a partial sum on every rank)";
      case OpKind::AllGather: return " (each rank's gradient of the gathered tensor is a partial sum that must be reduced, then split)";
      case OpKind::ReduceScatter: return " (every rank needs the whole gradient of the pending sum)";
      case OpKind::Convert: return " (Megatron's f: the input gradient is a partial sum over the axis)";
      case OpKind::ZeROGatherParam: return " (each rank's gradient of the gathered parameter is a partial sum that must be reduce-scattered into its shard)";
      case OpKind::ZeROScatterGrad: return " (every rank needs the whole gradient of the reduce-scattered shard)";
      default: return "";
    }
  }

  // ---- consistency of a derived backward ------------------------------------------------------------
  void self_check(const Program& t, std::vector<Diagnostic>& out) const {
    for (std::size_t d = 0; d < n_tensors_; ++d) {
      auto it = t.name_ids.find(p_.name(p_.tensors[d].name) + ".grad");
      if (it == t.name_ids.end()) continue;
      std::int64_t w = before_sync_[static_cast<std::size_t>(it->second)];
      if (w < 0) continue;
      const ValueType* g = type_of(w);
      if (!g->ok) continue;
      for (int a = 0; a < t.axis_count(); ++a) {
        Placement want = dual(p_.tensors[d].placement[static_cast<std::size_t>(a)]), have = g->pl[static_cast<std::size_t>(a)];
        if (have == want || (want.is_v() && have.is_s())) continue;
        Diagnostic dg;
        dg.id = CheckId::GradientDuality;
        dg.loc = p_.tensors[d].loc;
        dg.tensor = it->first;
        dg.message = fmt::format("the derived backward gives {} placement {} over {}, but the dual of {}'s placement {} is {}", it->first, to_string(have),
                                 t.mesh[static_cast<std::size_t>(a)].name, p_.name(p_.tensors[d].name),
                                 to_string(p_.tensors[d].placement[static_cast<std::size_t>(a)]), to_string(want));
        out.push_back(std::move(dg));
        break;
      }
    }
  }

  // ---- gradient synchronization ---------------------------------------------------------------------
  void unsynced(const Program& t, std::vector<Diagnostic>& out) {
    for (const auto& decl : fwd_tensors()) {
      if (!decl.param) continue;
      const std::string pname = p_.name(decl.name);
      auto it = t.name_ids.find(pname + ".grad");
      if (it == t.name_ids.end()) continue;
      std::int64_t w = final_[static_cast<std::size_t>(it->second)];
      if (w < 0) continue;  // no gradient reaches it
      const ValueType* g = type_of(w);
      if (!g->ok) continue;
      std::uint32_t bad = 0;
      bool per_rank = false;
      for (int a = 0; a < t.axis_count(); ++a) {
        Placement pp = decl.placement[static_cast<std::size_t>(a)], gp = g->pl[static_cast<std::size_t>(a)];
        if (!(pp.is_r() || pp.is_i())) continue;
        if (gp.linear_partial() || gp.is_v()) bad |= 1u << a;
        per_rank |= gp.is_v();
      }
      if (!bad) continue;
      unsynced_axes_[it->first] = bad;
      int a0 = std::countr_zero(bad);
      Diagnostic d;
      d.id = CheckId::UnsyncedGradient;
      d.loc = decl.loc;
      d.tensor = it->first;
      std::string pl = to_string(g->pl[static_cast<std::size_t>(a0)]);
      d.message = fmt::format("parameter {} is {} over {}, but its gradient {} reaches the optimizer still {} over {}: {}", pname,
                              to_string(decl.placement[static_cast<std::size_t>(a0)]), axis_list(t, bad), it->first, pl, axis_list(t, bad),
                              per_rank ? "it differs per rank, so the replicas of the parameter drift apart"
                                       : "each rank holds only its own contribution, so the replicas of the parameter drift apart");
      origin(t, w, a0, it->first, d.notes);
      Loc where = has_grad_sync_ ? p_.grad_sync_loc : has_backward_ ? backward_loc_ : decl.loc;
      // One AllReduce per reduce op: a gradient pending an average over some axes (a per-rank mean loss)
      // and a sum over others needs both.
      std::uint32_t avg = 0;
      for (int a = 0; a < t.axis_count(); ++a)
        if ((bad & (1u << a)) && g->pl[static_cast<std::size_t>(a)].is_p() && g->pl[static_cast<std::size_t>(a)].op == ReduceOp::Avg) avg |= 1u << a;
      std::string ins, yaml;
      if (bad & ~avg) ins += fmt::format("{{op: AllReduce, in: [{}], out: {}, axis: {}}}", it->first, it->first, axis_attr(t, bad & ~avg));
      yaml = ins;
      if (avg) {
        std::string one = fmt::format("{{op: AllReduce, in: [{}], out: {}, axis: {}, reduce: avg}}", it->first, it->first, axis_attr(t, avg));
        ins += (ins.empty() ? "" : " and ") + one;
        yaml += (yaml.empty() ? "" : "\n") + one;
      }
      d.notes.push_back({where, fmt::format("fix: insert {} into `grad_sync:` (after the backward, before the optimizer step)", ins)});
      d.fix = {FixKind::Append, -1, has_grad_sync_ ? p_.grad_sync_loc.line : 0, "grad_sync", yaml};
      out.push_back(std::move(d));
    }
  }

  // An optimizer op that reads a gradient unsynced-gradient reports (still pending) repeats that finding: the fix is
  // the gradient's reduction in grad_sync, which unsynced-gradient gives.
  void optimizer_consequences(std::vector<Diagnostic>& diags) const {
    std::unordered_set<std::string> unsynced_grads;
    for (const auto& d : diags)
      if (d.id == CheckId::UnsyncedGradient) unsynced_grads.insert(d.tensor);
    if (unsynced_grads.empty()) return;
    std::erase_if(diags, [&](const Diagnostic& d) {
      return d.op >= static_cast<int>(first_optim_) && d.id == CheckId::PartialMisuse && unsynced_grads.count(d.tensor) > 0;
    });
  }

  // Where a gradient became P over axis a: the first op on its chain whose inputs were not P there.
  void origin(const Program& t, std::int64_t w, int a, const std::string& grad, std::vector<Note>& notes) const {
    for (std::size_t steps = 0; w >= 0 && steps < t.ops.size(); ++steps) {
      std::size_t j = out_op_[static_cast<std::size_t>(w)];
      if (j < first_bwd_) return;
      const Op& op = t.ops[j];
      std::int64_t next = -1;
      for (std::size_t k = 0; k < op.n_in && next < 0; ++k) {
        std::int64_t s = src_[op.first + k];
        const ValueType* ty = type_of(s);
        bool backward_value = s >= 0 ? out_op_[static_cast<std::size_t>(s)] >= first_bwd_ : s <= -2 && static_cast<std::size_t>(-s - 2) + 1 == t.tensors.size();
        if (ty && backward_value && ty->pl[static_cast<std::size_t>(a)].is_p()) next = s;
      }
      if (next < 0) {
        std::string where;
        if (!hand_ && j < first_relabel_) {
          const Op& f = p_.ops[static_cast<std::size_t>(forward_op_[j - first_bwd_])];
          where = fmt::format("in the backward of this {} ({} in the derived backward)", op_name(f.kind), op_name(op.kind));
        } else {
          where = fmt::format("here ({})", op_name(op.kind));
        }
        notes.push_back({op.loc, fmt::format("{} became {} over {} {}", grad, to_string(type_of(w)->pl[static_cast<std::size_t>(a)]),
                                             t.mesh[static_cast<std::size_t>(a)].name, where)});
        return;
      }
      if (next <= -2) return;
      w = next;
    }
  }

  // The forward, and the training step it becomes (the same program: the forward is the first n_ops_ ops and
  // n_tensors_ declarations; has_backward_, has_grad_sync_ and backward_loc_ are the forward's, which the step clears).
  const Program& p_;
  Program& step_;
  ForwardUndo& undo_;
  std::size_t n_ops_ = 0, n_tensors_ = 0;
  bool has_backward_ = false, has_grad_sync_ = false;
  Loc backward_loc_;
  std::span<const TensorDecl> fwd_tensors() const { return {p_.tensors.data(), n_tensors_}; }
  // Records in undo_ what the step changes, and takes out the lists it moves into its ops.
  void save(Program& p) {
    ForwardUndo& u = undo_;
    u.ops = p.ops.size();
    u.operands = p.operands.size();
    u.names = p.names.size();
    u.tensors = p.tensors.size();
    u.int_lists = p.int_lists.size();
    u.shapes = p.shapes.size();
    u.placement_maps = p.placement_maps.size();
    u.coords = p.coords.size();
    u.name_lists = p.name_lists.size();
    u.exprs = p.exprs;
    u.backward = std::move(p.backward);
    u.grad_sync = std::move(p.grad_sync);
    u.optimizer = std::move(p.optimizer);
    p.backward.clear();
    p.grad_sync.clear();
    p.optimizer.clear();
    u.outputs = p.outputs;
    u.expect = p.expect;
    u.has_backward = p.has_backward;
    u.has_grad_sync = p.has_grad_sync;
    u.has_optimizer = p.has_optimizer;
    u.train = p.train;
    u.has_expect = p.has_expect;
    u.backward_loc = p.backward_loc;
    u.saved = true;
  }
  TrainingOptions o_;
  bool hand_ = false;
  std::vector<std::int32_t> forward_op_;
  std::size_t first_bwd_ = 0, first_relabel_ = 0, first_sync_ = 0, first_optim_ = 0;
  std::uint32_t avg_axes_ = 0;         // axes on which the loss is P(avg) or R: the backward computes N times its gradient
  std::uint32_t repl_axes_ = 0;        // those on which it is R
  const SpatialTypes* ft_ = nullptr;   // the forward's types
  std::vector<NameId> relabel_param_;  // per relabel op: the parameter whose gradient it relabels
  std::vector<FoldedGrad> repl_fold_, mean_fold_;
  std::unordered_map<std::string, std::uint32_t> unsynced_axes_;  // unsynced-gradient finding (by gradient) -> its axes  // failed relabels over axes the loss is replicated / a per-rank mean over
  SpatialTypes tt_;
  std::vector<std::int64_t> src_, before_sync_, final_;
  std::vector<std::uint32_t> out_op_;
  std::unordered_set<int> flagged_;
};

}  // namespace

TrainingCheck check_training_in_place(Program& program, ForwardUndo& undo, const TrainingOptions& options) {
  undo = ForwardUndo();
  if (program.local_view)  // no placements to check a backward by (its values are checked: equiv/training.h)
    throw LoadError(program.view_loc,
                    "a local-view program (`view: local`) has no typed training step: its hand-written backward is checked by value against the `spec:`");
  try {
    return TrainingChecker(program, undo, options).run();
  } catch (...) {
    restore_forward(program, undo);
    throw;
  }
}

TrainingCheck check_training(const Program& program, const TrainingOptions& options) {
  Program step = program;
  ForwardUndo undo;
  TrainingCheck r = check_training_in_place(step, undo, options);
  if (r.built) r.program = std::move(step);
  return r;
}

void restore_forward(Program& p, ForwardUndo& u) {
  if (!u.saved) return;
  auto cut = [](auto& v, std::size_t n) {
    if (v.size() > n) v.erase(v.begin() + static_cast<std::ptrdiff_t>(n), v.end());
  };
  cut(p.ops, u.ops);
  cut(p.operands, u.operands);
  if (p.names.size() > u.names) {  // the names interned after the forward's: Program::intern is the only writer of both
    cut(p.names, u.names);
    p.name_ids.clear();
    p.name_ids.reserve(p.names.size());
    for (std::size_t i = 0; i < p.names.size(); ++i) p.name_ids.find_or_insert(p.names[i], static_cast<NameId>(i));
  }
  cut(p.tensors, u.tensors);
  cut(p.int_lists, u.int_lists);
  cut(p.shapes, u.shapes);
  cut(p.placement_maps, u.placement_maps);
  cut(p.coords, u.coords);
  cut(p.name_lists, u.name_lists);
  p.exprs = std::move(u.exprs);
  p.backward = std::move(u.backward);
  p.grad_sync = std::move(u.grad_sync);
  p.optimizer = std::move(u.optimizer);
  p.outputs = std::move(u.outputs);
  p.expect = std::move(u.expect);
  p.has_backward = u.has_backward;
  p.has_grad_sync = u.has_grad_sync;
  p.has_optimizer = u.has_optimizer;
  p.train = u.train;
  p.has_expect = u.has_expect;
  p.backward_loc = u.backward_loc;
  u = ForwardUndo();
}

}  // namespace spmd
