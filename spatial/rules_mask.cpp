// spatial/rules_mask.cpp - placement and shape rules of masks, counts and running sums (issues 21 and 23)
//
// Ops: Eq/Ne/Lt/Le/Gt/Ge (comparisons), And/Or/Not, OneHot, Bincount, CumSum, Detach, and AllToAll's explicit
// `split_sizes`. Sigmoid is a monotone map (math_unary in rules_math.cpp). Which pending reductions pass a mask
// is decided by reduce_through (ir/placement.h) from the direction the mask moves with each operand.
// Dispatched from Checker::apply() in rules.cpp; docs/semantics.md, section 3.10.
#include "spatial/checker.h"

namespace spmd::detail {

namespace {

bool is_logical(OpKind k) { return k == OpKind::And || k == OpKind::Or || k == OpKind::Not; }

}  // namespace

// How the bool result of a comparison or logical op moves with its operand `i` (0: a, 1: b) when the other
// is fixed: a > b rises with a and falls with b; a == b does neither. On bool data And and Or rise with each
// operand and Not falls; on other data they test x != 0, which is not monotone.
PointwiseMap Checker::mask_map(int i) const {
  const OpKind k = op_->kind;
  int slope = 0;
  if (k == OpKind::Gt || k == OpKind::Ge) slope = i == 0 ? +1 : -1;
  else if (k == OpKind::Lt || k == OpKind::Le) slope = i == 0 ? -1 : +1;
  else if (is_logical(k) && in(i).dtype == DType::Bool) slope = k == OpKind::Not ? -1 : +1;
  return slope > 0 ? PointwiseMap::monotone_up() : slope < 0 ? PointwiseMap::monotone_down() : PointwiseMap::opaque();
}

// Comparisons (two operands broadcast, or one and `scalar`) and And/Or/Not: a bool mask whose layout combines
// as Add's; a pending max or min passes a monotone mask with a replicated other operand (max_r x_r > b is
// max_r (x_r > b)); every other pending reduction is partial-misuse.
void Checker::mask_op() {
  const OpKind k = op_->kind;
  const std::string op = opname();
  if (n_in() == 1) {
    Value& o = out() = in(0);
    o.dtype = DType::Bool;
    if (k != OpKind::Not && !at().has_number) return report(CheckId::ShapeMismatch, fmt::format("{} with one input needs `scalar:`", op), iname(0));
    map_partials(o, 0, mask_map(0), k == OpKind::Not ? std::string("Not") : fmt::format("{} with {}", op, at().number));
    return;
  }
  Value* po = broadcast_pair(false);
  if (!po) return;
  Value& o = *po;
  o.dtype = DType::Bool;
  int ro = o.rank;
  for (int a = 0; a < axes(); ++a) {
    Placement x = shift(pin(0, a), in(0).rank, ro), y = shift(pin(1, a), in(1).rank, ro);
    if (!x.is_p() && !y.is_p()) {
      if (!combine_layout(o, a, 0, x, 1, y, ro)) return;
      continue;
    }
    int pi = x.is_p() ? 0 : 1, oi = 1 - pi;
    Placement part = pi == 0 ? x : y, other = pi == 0 ? y : x;
    if (other.is_p())
      return partial_misuse(pi, a, fmt::format("{} compares two pending reductions ({} and {}); comparing the per-rank summands compares nothing", op,
                                               ps(x), ps(y)));
    if (!other.is_r())
      return partial_misuse(pi, a, fmt::format("{} is {}; comparing per-rank values with a pending {} is not the comparison of the reduced value", iname(oi),
                                               ps(other), reduce_name(part.op)));
    auto r = reduce_through(mask_map(pi), part.op);
    if (!r) {
      std::string why = is_logical(k) && in(pi).dtype != DType::Bool
                            ? fmt::format("{} tests {} != 0, which is not monotone on {} data", op, iname(pi), dtype_name(in(pi).dtype))
                            : fmt::format("{} is not monotone in {}{}", op, iname(pi), part.linear_partial() ? " (nor linear)" : "");
      return partial_misuse(pi, a, why + fmt::format(", so each rank's mask of its summand is not the mask of the pending {}", reduce_name(part.op)),
                            fix_allreduce(iname(pi), a, part));
    }
    set_from(o, a, Placement::p(*r), pi);
  }
}

// OneHot(ids, classes: C): ids[..., C]; the new last dim is whole, the ids' dims and shards stay.
void Checker::one_hot() {
  const Value& x = in(0);
  if (x.rank >= kMaxRank)
    return report(CheckId::ShapeMismatch, fmt::format("OneHot adds a dim to {}, which has {} already (the limit is {})", iname(0), x.rank, kMaxRank), iname(0));
  for (int a = 0; a < axes(); ++a)
    if (pin(0, a).is_p()) return partial_misuse(0, a, "ids pending a reduction are not ids yet: each rank would mark its own summand");
  ExprId c = size_arg("classes", pool_.constant(1));
  Value& o = out() = x;
  o.shape[static_cast<std::size_t>(x.rank)] = c;
  o.rank = static_cast<std::uint8_t>(x.rank + 1);
  o.dtype = at().has_dtype ? at().dtype : DType::I64;
}

// Bincount(ids, length: L): counts[L]. Sharded ids give each rank the counts of its own ids: a pending sum.
void Checker::bincount() {
  const Value& x = in(0);
  for (int a = 0; a < axes(); ++a)
    if (pin(0, a).is_p()) return partial_misuse(0, a, "ids pending a reduction are not ids yet: each rank would count its own summand");
  Value& o = out() = x;
  o.rank = 1;
  o.shape[0] = size_arg("length", pool_.constant(1));
  o.dtype = at().has_dtype ? at().dtype : DType::I64;
  o.uneven = false;
  o.strict = 0;
  for (int a = 0; a < axes(); ++a) {
    Placement p = pin(0, a);
    if (p.is_s())
      set_new(o, a, Placement::p(ReduceOp::Sum),
              fmt::format("Bincount of {}, sharded S({}) over {}: each rank counts its own ids", iname(0), p.dim, axn(a)));
  }
}

// CumSum(x, dim): a running sum along a whole dim. A sharded dim would need each rank's prefix (the sum of the
// blocks before it) carried in; a dim in zigzag order would sum in the wrong order. Linear: P(sum|avg) pass.
void Checker::cumsum() {
  const Value& x = in(0);
  int d = norm_dim(at().dim, x.rank, "dim", iname(0));
  if (d < 0) return;
  for (int a = 0; a < axes(); ++a)
    if (pin(0, a).is_s(d))
      return sharded_dim(0, a, d, "each rank would sum its own block only, without the running total of the ranks before it (a prefix-sum carry)");
  if (x.zz_dims >> d & 1u)
    return report(CheckId::LayoutConflict, fmt::format("CumSum runs along dim {} of {}, which is in zigzag order over {} (LoadBalance): the running sum would follow the "
                                       "zigzag order, not the sequence's",
                                       d, iname(0), axn(x.zz_axis)),
                  iname(0), {fix("take the running sum before LoadBalance (or after its inverse)")});
  Value& o = out() = x;
  map_partials(o, 0, PointwiseMap::times_unknown_sign(), "a running sum");
}

// Detach: the same value; only the backward differs (none flows through it).
void Checker::detach() { out() = in(0); }

// AllToAll's `split_sizes`: one piece of split_dim per rank of the group, adding up to the rank's piece of the dim
// (all_to_all_single splits the local tensor: the dim divided by the axes that shard it already), and (the output
// being S(split_dim), or per-rank values split evenly) equal to the blocks each rank holds: n/N each, or
// torch.chunk's with `uneven: true`. False after a report.
bool Checker::split_sizes_ok(int s) {
  const auto& sizes = p_.shapes[at().shape];
  std::uint32_t cut = shard_mask(in(0), s);
  ExprId dim = cut ? pool_.div(in(0).shape[static_cast<std::size_t>(s)], mask_size(cut)) : in(0).shape[static_cast<std::size_t>(s)];
  std::string piece = cut ? fmt::format("each rank's piece of dim {} of {} (split over {} already)", s, iname(0), mask_names(cut))
                          : fmt::format("dim {} of {}", s, iname(0));
  ExprId group = mask_size(at().axes);
  std::string names = mask_names(at().axes);
  if (!same_dim(pool_.constant(static_cast<std::int64_t>(sizes.size())), group,
                fmt::format("AllToAll lists {} split sizes, one per rank of its group over {}", sizes.size(), names), iname(0)))
    return false;
  ExprId total = pool_.constant(0);
  for (ExprId e : sizes) total = pool_.add(total, e);
  if (!same_dim(total, dim, fmt::format("AllToAll's split_sizes must add up to {}", piece), iname(0))) return false;
  auto n = obl_.concrete(dim), g = obl_.concrete(group);
  std::vector<std::int64_t> given;
  for (ExprId e : sizes)
    if (auto v = obl_.concrete(e)) given.push_back(*v);
  if (n && g && *g > 0 && given.size() == sizes.size()) {
    std::vector<std::int64_t> even, chunk;
    std::int64_t step = (*n + *g - 1) / *g;
    for (std::int64_t i = 0; i < *g; ++i) {
      even.push_back(*n % *g == 0 ? *n / *g : -1);
      chunk.push_back(std::max<std::int64_t>(0, std::min(*n, (i + 1) * step) - std::min(*n, i * step)));
    }
    if (given == even || given == chunk) return true;
    auto text = [](const std::vector<std::int64_t>& v) {
      std::string t;
      for (auto x : v) t += (t.empty() ? "" : ", ") + std::to_string(x);
      return "[" + t + "]";
    };
    report(CheckId::ShapeMismatch,
           fmt::format("AllToAll sends pieces {} of {} ({}) to the {} ranks of {}, but S({}) over {} holds the blocks {}{}: rank i would receive "
                       "another rank's slice",
                       text(given), piece, *n, *g, names, s, names, text(*n % *g == 0 ? even : chunk),
                       *n % *g == 0 ? "" : " (torch.chunk, with `uneven: true`)"),
           iname(0), {fix(fmt::format("split_sizes: {}", text(*n % *g == 0 ? even : chunk)))});
    return false;
  }
  ExprId block = pool_.div(dim, group);  // symbolic: every piece must be the even block
  for (std::size_t i = 0; i < sizes.size(); ++i)
    if (!same_dim(sizes[i], block, fmt::format("AllToAll's split size {} (rank {}) must be {} divided by the ranks of {}", i, i, piece, names), iname(0)))
      return false;
  return true;
}

}  // namespace spmd::detail
