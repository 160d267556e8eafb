// spatial/rules_shape.cpp - placement and shape rules of the shape ops
//
// Ops: Transpose, Reshape (with the monomial grouping of reshape dims). Dispatched from Checker::apply()
// in rules.cpp.
#include <bit>

#include "spatial/checker.h"

namespace spmd::detail {

void Checker::transpose() {
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

void Checker::normalize(Mono& m) {
  std::vector<ExprId> f, g;
  std::set_difference(m.f.begin(), m.f.end(), m.g.begin(), m.g.end(), std::back_inserter(f));
  std::set_difference(m.g.begin(), m.g.end(), m.f.begin(), m.f.end(), std::back_inserter(g));
  m.f = std::move(f);
  m.g = std::move(g);
  std::int64_t d = std::gcd(m.num, m.den);
  if (d > 1) m.num /= d, m.den /= d;
}

Checker::Mono Checker::times(const Mono& x, const Mono& y) {
  Mono m;
  m.ok = x.ok && y.ok && !__builtin_mul_overflow(x.num, y.num, &m.num) && !__builtin_mul_overflow(x.den, y.den, &m.den);
  std::merge(x.f.begin(), x.f.end(), y.f.begin(), y.f.end(), std::back_inserter(m.f));
  std::merge(x.g.begin(), x.g.end(), y.g.begin(), y.g.end(), std::back_inserter(m.g));
  normalize(m);
  return m;
}

Checker::Mono Checker::inverse(Mono m) {
  std::swap(m.num, m.den);
  std::swap(m.f, m.g);
  return m;
}

Checker::Mono Checker::mono(ExprId e) const {
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

bool Checker::divides(const Mono& x, const Mono& y) {  // y / x is a whole monomial
  Mono q = times(y, inverse(x));
  return q.ok && q.den == 1 && q.g.empty();
}

void Checker::reshape() {
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
  if (!same_dim(n_in, n_out, [&] { return fmt::format("Reshape of {} {} to {} must keep the element count", iname(0), sstr(x.dims()), sstr(shape)); },
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
    // Extend the side whose product divides the other's; when neither divides (a regroup such as [6, 4] ->
    // [4, 6], or [H] -> [NH, H/NH] where H/NH is whole only by an obligation), no group can end before
    // both sides grow, so extend both (or the one that still can).
    while (!(pi == pj)) {
      bool xi = i < ri, xj = j < rj;
      if (divides(pi, pj) && xi) pi = times(pi, mono(x.shape[static_cast<std::size_t>(i++)]));
      else if (divides(pj, pi) && xj) pj = times(pj, mono(shape[static_cast<std::size_t>(j++)]));
      else if (xi || xj) {
        if (xi) pi = times(pi, mono(x.shape[static_cast<std::size_t>(i++)]));
        if (xj) pj = times(pj, mono(shape[static_cast<std::size_t>(j++)]));
      } else {
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
    auto base_text = [&] { return fmt::format("Reshape of {} {} to {} with dim {} sharded over {}", iname(0), sstr(x.dims()), sstr(shape), p.dim, axn(a)); };
    if (!g || g->o0 == g->o1 || (lost && g == &groups.back()))
      return layout_conflict(base_text() + ": the sharded dim does not map onto output dims this reshape keeps whole", iname(0), 0, a,
                             fix_allgather(iname(0), a, p.dim));
    // A shard not on the group's leftmost dim keeps contiguous pieces only when every dim left of it is cut
    // down to one element per rank by axes outer to the ones further right: then the pieces of all those
    // axes, in mesh order, are consecutive blocks of the flattened group ([2, 12] {dp: S(0), tp: S(1)} ->
    // [24] {dp: S(0), tp: S(0)}).
    if (p.dim != g->i0 && !prefix_whole_per_rank(x, g->i0, p.dim))
      return layout_conflict(base_text() + fmt::format(": it regroups dims {}..{} and the shard is not on the leftmost (nor is every dim left of it "
                                                "split to one element per rank by outer axes), so the local pieces interleave",
                                                g->i0, g->i1 - 1),
                             iname(0), 0, a, fix_allgather(iname(0), a, p.dim));
    if (g->i1 - g->i0 > 1 && uneven_dim(x, p.dim)) {
      std::vector<Note> notes;
      origin_note(notes, x, a);
      notes.push_back(fix(fix_allgather(iname(0), a, p.dim)));
      return report(CheckId::ShapeMismatch, base_text() + ": merging an unevenly sharded dim would leave gaps between the shards", iname(0), std::move(notes));
    }
    // Each rank holds a contiguous block of the flattened group; it is whole rows of the first new dim when
    // that dim is divisible by the axes' product (DTensor's view rule): a split must divide evenly.
    set_from(o, a, Placement::s(g->o0), 0);
    if (g->o1 - g->o0 > 1) o.strict = static_cast<std::uint8_t>(o.strict | (1u << g->o0));
  }
}

// Dims [from, to) of x are each sharded by axes whose sizes multiply to the dim's size (one element per
// rank), and every axis sharding one of them is outer (earlier in the mesh) to every axis sharding a
// later dim up to and including `to`.
bool Checker::prefix_whole_per_rank(const Value& x, int from, int to) {
  std::vector<std::uint32_t> mask(static_cast<std::size_t>(to - from + 1), 0);
  for (int a = 0; a < axes(); ++a) {
    Placement p = pl_of(x, a);
    if (p.is_s() && p.dim >= from && p.dim <= to) mask[static_cast<std::size_t>(p.dim - from)] |= 1u << a;
  }
  std::uint32_t later = 0;
  for (int e = to; e >= from; --e) {
    std::uint32_t m = mask[static_cast<std::size_t>(e - from)];
    if (e < to) {
      if (!m) return false;
      if (later && static_cast<int>(std::bit_width(m)) - 1 >= std::countr_zero(later)) return false;  // an axis here is not outer to one further right
      ExprId n = pool_.constant(1);
      for (int a = 0; a < axes(); ++a)
        if (m & (1u << a)) n = pool_.mul(n, axis_size(a));
      if (obl_.decide(OblKind::Equal, x.shape[static_cast<std::size_t>(e)], n) != Decision::Holds) return false;
    }
    later |= m;
  }
  return true;
}

}  // namespace spmd::detail
