// equiv/reduce.cpp - shape reduction: the smallest sizes with the declared sizes' partition structure (reduce.h).
#include "equiv/reduce.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>
#include <set>

namespace spmd::equiv_detail {
namespace {

// A structural fact of the program at its declared sizes that the reduced sizes must keep.
struct Fact {
  // Value: a size expression written in the program (a shape, a size attribute) stays 0, 1 or at least 2 as declared
  enum Kind : std::uint8_t { Divisible, Equal, Positive, ExactDiv, Block, Value } kind;
  const ExprPool* pool;
  ExprId a, b;                  // Block: a is the dim, b unused
  std::int64_t parts = 1;       // Block: the ranks the dim is cut over
  std::int64_t dparts = 1;      // Block: the ranks it is cut over on the declared mesh (choose_mesh)
  std::int64_t ra = 0, rb = 0;  // the values at the declared sizes
  std::vector<int> vars;
};

std::optional<std::int64_t> ev(const ExprPool& pool, ExprId e, const std::vector<std::int64_t>& vals) {
  try {
    return pool.eval(e, vals);
  } catch (const AxisExprError&) {
    return std::nullopt;
  }
}

// torch.chunk of n over `parts`: (non-empty chunks, the last one shorter, any chunk empty).
std::tuple<std::int64_t, bool, bool> chunk_shape(std::int64_t n, std::int64_t parts) {
  if (parts <= 1) return {1, false, n == 0};
  std::int64_t c = (n + parts - 1) / parts;
  std::int64_t full = c ? n / c : 0, rest = c ? n % c : 0;
  std::int64_t nonempty = full + (rest ? 1 : 0);
  return {nonempty, rest != 0, nonempty < parts};
}

// Whether `f` holds at `vals` the way it holds at the declared sizes.
bool keeps(const Fact& f, const std::vector<std::int64_t>& vals) {
  auto a = ev(*f.pool, f.a, vals);
  if (!a) return false;
  switch (f.kind) {
    case Fact::Divisible: {
      auto b = ev(*f.pool, f.b, vals);
      if (!b || *b == 0 || *a % *b != 0) return false;
      return f.rb == 0 || f.ra / f.rb < 2 || *a / *b >= 2;  // a quotient of 2 or more stays 2 or more
    }
    case Fact::Equal: {
      auto b = ev(*f.pool, f.b, vals);
      return b && *a == *b;
    }
    case Fact::Positive:
      return *a >= std::min<std::int64_t>(f.ra, 2);
    case Fact::ExactDiv: {
      const ENode& n = f.pool->node(f.a);
      auto x = ev(*f.pool, n.a, vals), y = ev(*f.pool, n.b, vals);
      if (!x || !y || *y == 0 || *x % *y != 0) return false;
      return f.ra < 2 || *x / *y >= 2;
    }
    case Fact::Value:
      return f.ra <= 1 ? *a == f.ra : *a >= 2;
    case Fact::Block: {
      if (f.ra == 1) return *a == 1;  // a broadcast dim stays one
      if (f.dparts != f.parts) {  // cut over a reduced mesh: equal blocks; one element a block stays one, two or more stay two or more
        if (f.ra % f.dparts != 0 || *a % f.parts != 0) return false;
        std::int64_t declared = f.ra / f.dparts, now = *a / f.parts;
        return declared <= 1 ? now == declared : now >= 2;
      }
      if (*a < std::min<std::int64_t>(f.ra, 2)) return false;
      if (f.parts <= 1) return true;
      if (chunk_shape(*a, f.parts) != chunk_shape(f.ra, f.parts)) return false;
      std::int64_t real_block = (f.ra + f.parts - 1) / f.parts, block = (*a + f.parts - 1) / f.parts;
      if (block < std::min<std::int64_t>(real_block, 2)) return false;
      // the last (shorter) chunk keeps at least min(2, its size) elements too
      std::int64_t real_last = f.ra - real_block * (std::get<0>(chunk_shape(f.ra, f.parts)) - 1);
      std::int64_t last = *a - block * (std::get<0>(chunk_shape(*a, f.parts)) - 1);
      return last >= std::min<std::int64_t>(real_last, 2);
    }
  }
  return false;
}


// Ops whose value uses an extent (a count it divides by, a head dim, a frequency base): the runner reads real extents
// for them, which needs the types of their inputs.
bool uses_extent_as_value(const Op& op) {
  switch (op.kind) {
    case OpKind::Mean:
    case OpKind::LayerNorm:
    case OpKind::RMSNorm:
    case OpKind::NormGrad:
    case OpKind::CrossEntropyLoss:
    case OpKind::CrossEntropyGrad:
    case OpKind::FlashAttention:
    case OpKind::AttentionGrad:
    case OpKind::RingAttentionStep:
    case OpKind::RoPE:
      return true;
    default:
      return false;
  }
}

std::string loc_text(const Op& op) { return fmt::format("line {}", op.loc.line); }

}  // namespace

std::vector<std::vector<const ValueType*>> input_types(const TypedOps& t) {
  std::vector<std::vector<const ValueType*>> out(t.ops->size());
  if (!t.types) return out;
  const Program& p = *t.program;
  std::vector<const ValueType*> env(p.names.size(), nullptr);
  for (std::size_t i = 0; i < p.tensors.size() && i < t.types->decls.size(); ++i)
    env[static_cast<std::size_t>(p.tensors[i].name)] = &t.types->decls[i];
  for (std::size_t oi = 0; oi < t.ops->size(); ++oi) {
    const Op& op = (*t.ops)[oi];
    for (NameId n : p.ins(op)) out[oi].push_back(env[static_cast<std::size_t>(n)]);
    if (oi >= t.types->out_base.size()) continue;
    auto outs = p.outs(op);
    for (std::size_t k = 0; k < outs.size(); ++k) env[static_cast<std::size_t>(outs[k])] = &t.types->out(oi, static_cast<int>(k));
  }
  return out;
}

// The steps of the local search over the order in which the shape reduction's sizes take their values: each step
// searches (sizes - 1)^2 orders.
constexpr int kMaxOrderSteps = 12;

Reduction choose_reduction(const Program& g, const std::vector<std::int64_t>& base, const std::vector<TypedOps>& lists,
                           const std::vector<std::int64_t>& declared_mesh) {
  Reduction red;
  red.vars = base;
  const std::size_t nv = g.vars.size();
  std::vector<char> pinned(nv, 0);
  std::vector<std::string> why(nv);
  auto pin_expr = [&](const ExprPool& pool, ExprId e, const std::string& reason) {
    std::vector<int> vs;
    try {
      pool.collect_vars(e, vs);
    } catch (const AxisExprError&) {
      return;
    }
    for (int v : vs)
      if (static_cast<std::size_t>(v) < nv && g.vars[static_cast<std::size_t>(v)].general && !pinned[static_cast<std::size_t>(v)])
        pinned[static_cast<std::size_t>(v)] = 1, why[static_cast<std::size_t>(v)] = reason;
  };
  auto pin_all = [&](const std::string& reason) {
    for (std::size_t v = 0; v < nv; ++v)
      if (g.vars[v].general && !pinned[v]) pinned[v] = 1, why[v] = reason;
  };
  // ---- the facts ----
  std::vector<Fact> facts;
  std::set<std::tuple<const ExprPool*, int, ExprId, ExprId, std::int64_t, std::int64_t>> seen;
  auto add = [&](Fact f) {
    if (!seen.insert({f.pool, static_cast<int>(f.kind), f.a, f.b, f.parts, f.dparts}).second) return;
    try {
      f.pool->collect_vars(f.a, f.vars);
      if (f.kind == Fact::Divisible || f.kind == Fact::Equal) f.pool->collect_vars(f.b, f.vars);
    } catch (const AxisExprError&) {
      return;
    }
    auto a = ev(*f.pool, f.a, base);
    if (!a) return;  // does not hold at the declared sizes either: the checks report it
    f.ra = *a;
    if (f.kind == Fact::Divisible || f.kind == Fact::Equal) {
      auto b = ev(*f.pool, f.b, base);
      if (!b) return;
      f.rb = *b;
    }
    if (f.kind == Fact::ExactDiv) {
      const ENode& n = f.pool->node(f.a);
      if (n.op != EOp::Div) return;
    }
    if (!keeps(f, base)) return;  // false at the declared sizes: nothing to keep
    facts.push_back(std::move(f));
  };
  const std::vector<std::int64_t> mesh = mesh_sizes(g);
  // Extents: each dim of each typed value (the count a reduction along it sums, or a softmax normalizes over), with
  // its declared value.
  struct Extent {
    const ExprPool* pool;
    ExprId e;
    std::int64_t declared;
    std::vector<int> vars;  // the size variables it names
  };
  std::vector<Extent> extents;
  std::set<std::pair<const ExprPool*, ExprId>> seen_extent;
  auto add_extents = [&](const ExprPool& pool, const ValueType& t) {
    for (int d = 0; d < t.rank; ++d) {
      ExprId e = t.shape[static_cast<std::size_t>(d)];
      if (!seen_extent.insert({&pool, e}).second) continue;
      auto v = ev(pool, e, base);
      if (!v) continue;
      Extent x{&pool, e, *v, {}};
      try {
        pool.collect_vars(e, x.vars);
      } catch (const AxisExprError&) {  // (a mesh axis size: fixed)
      }
      extents.push_back(std::move(x));
    }
  };
  auto add_value = [&](const ExprPool& pool, const ValueType& t) {
    if (!t.ok) return;
    add_extents(pool, t);
    for (int d = 0; d < t.rank; ++d) {
      ExprId e = t.shape[static_cast<std::size_t>(d)];
      if (pool.is_const(e)) continue;
      std::int64_t parts = 1, dparts = 1;
      for (std::size_t a = 0; a < g.mesh.size(); ++a)
        if (t.pl[a].is_s(d)) parts *= mesh[a], dparts *= a < declared_mesh.size() ? declared_mesh[a] : mesh[a];
      add({Fact::Block, &pool, e, -1, parts, dparts, 0, 0, {}});
    }
  };
  // Every size expression the program writes (shapes, size attributes, in every op list): its divisions stay exact
  // and its value stays 0, 1 or at least 2 (what a local-view plan or a value without a type still relies on).
  auto add_written = [&](ExprId e) {
    if (e < 0 || g.exprs.is_const(e)) return;
    g.exprs.visit(e, [&](ExprId sub) {
      if (g.exprs.node(sub).op == EOp::Div && !g.exprs.has_axis(sub)) add({Fact::ExactDiv, &g.exprs, sub, -1, 1, 1, 0, 0, {}});
    });
    if (!g.exprs.has_axis(e)) add({Fact::Value, &g.exprs, e, -1, 1, 1, 0, 0, {}});
  };
  for (const auto& shape : g.shapes)
    for (ExprId e : shape) add_written(e);
  for (const auto& t : g.tensors)
    for (ExprId e : t.shape) add_written(e);
  for (const auto& l : lists) {
    if (!l.types) {
      for (const auto& op : *l.ops)
        if (uses_extent_as_value(op)) {
          pin_all(fmt::format("the local-view plan's {} ({}) uses an extent as a value, which cannot be traced to sizes there", op_name(op.kind),
                              loc_text(op)));
          break;
        }
      continue;
    }
    const ExprPool& pool = l.types->exprs;
    if (l.claims)
      for (const auto& c : *l.claims) add({static_cast<Fact::Kind>(c.kind), &pool, c.a, c.b, 1, 1, 0, 0, {}});
    for (const auto& t : l.types->decls) add_value(pool, t);
    for (const auto& t : l.types->outs) add_value(pool, t);
    // A size attribute written as a number, on an op whose input dims follow sizes, would land elsewhere on the
    // reduced dims: those sizes are kept.
    auto tin = input_types(l);
    const Program& p = *l.program;
    for (std::size_t oi = 0; oi < l.ops->size(); ++oi) {
      const Op& op = (*l.ops)[oi];
      if (op.attrs.sizes == kNoIndex) continue;
      bool literal = false;
      for (ExprId e : p.shapes[op.attrs.sizes])
        if (e >= 0 && p.exprs.is_const(e) && p.exprs.value(e) != 0) literal = true;
      if (!literal) continue;
      for (std::size_t k = 0; k < tin[oi].size(); ++k) {
        const ValueType* t = tin[oi][k];
        if (!t || !t->ok) continue;
        for (int d = 0; d < t->rank; ++d) {
          // (TopKGate's k counts choices among the experts, the last dim: the tokens are free)
          bool relevant = op.kind == OpKind::TopKGate ? d == t->rank - 1
                                                      : op.attrs.dim == kUnset || d == (op.attrs.dim < 0 ? op.attrs.dim + t->rank : op.attrs.dim);
          if (relevant)
            pin_expr(pool, t->shape[static_cast<std::size_t>(d)],
                     fmt::format("{} ({}) gives a size attribute as a number on a dim that depends on it", op_name(op.kind), loc_text(op)));
        }
      }
    }
  }
  // Positions (Arange) are indices: a reduced sequence has fewer of them, which RoPE and the ops that move them
  // (a cp shard, a gather, a slice, a zigzag reorder) take in stride. Positions used as data in arithmetic or a
  // comparison would see other values: the sizes of that Arange are kept.
  for (const auto& l : lists) {
    const Program& p = *l.program;
    std::vector<char> position(p.names.size(), 0);
    std::vector<const Op*> source(p.names.size(), nullptr);
    for (const auto& op : *l.ops) {
      auto ins = p.ins(op);
      bool from_pos = std::any_of(ins.begin(), ins.end(), [&](NameId n) { return position[static_cast<std::size_t>(n)]; });
      const Op* src = nullptr;
      for (NameId n : ins)
        if (position[static_cast<std::size_t>(n)]) src = source[static_cast<std::size_t>(n)];
      bool mover = op.kind == OpKind::Convert || op.kind == OpKind::AllGather || op.kind == OpKind::Slice || op.kind == OpKind::LoadBalance ||
                   op.kind == OpKind::Concat || op.kind == OpKind::Split || op.kind == OpKind::Reshape || op.kind == OpKind::Broadcast;
      if (from_pos && !mover &&
          !(op.kind == OpKind::RoPE && ins.size() > 1 && position[static_cast<std::size_t>(ins[1])] && !position[static_cast<std::size_t>(ins[0])])) {
        if (src && src->attrs.sizes != kNoIndex)
          for (ExprId e : p.shapes[src->attrs.sizes])
            if (e >= 0)
              pin_expr(p.exprs, e,
                       fmt::format("the positions of Arange ({}) are used as data by {} ({})", loc_text(*src), op_name(op.kind), loc_text(op)));
      }
      for (NameId n : p.outs(op)) {
        position[static_cast<std::size_t>(n)] = op.kind == OpKind::Arange || (from_pos && mover);
        source[static_cast<std::size_t>(n)] = op.kind == OpKind::Arange ? &op : src;
      }
    }
  }
  // ---- the search: each size in turn, its smallest value that keeps every fact (a few passes) ----
  std::vector<std::vector<std::size_t>> by_var(nv);
  for (std::size_t i = 0; i < facts.size(); ++i)
    for (int v : facts[i].vars)
      if (static_cast<std::size_t>(v) < nv) by_var[static_cast<std::size_t>(v)].push_back(i);
  std::vector<std::int64_t> cur = base;
  // Extents declared different stay different: a count computed by the ops (the sum of a softmax over an [N8, 2*N2]
  // value along dim 0 is 2*N2 per column summed, along dim 1 N8) must not coincide at the reduced sizes where it
  // differs at the declared ones (N8 -> 4 with N2 = 2 would make the two sums agree). Only extents whose sizes are
  // all settled are compared: a size the search has not reached yet still has its declared value, and an extent
  // such as B*S at a reduced S and the declared B could meet a declared 2048 that no choice keeps.
  std::vector<char> settled(nv, 1);
  auto apart = [&]() {
    std::map<std::int64_t, std::int64_t> seen;  // reduced -> declared
    for (const auto& x : extents) {
      if (std::any_of(x.vars.begin(), x.vars.end(), [&](int v) { return static_cast<std::size_t>(v) < nv && !settled[static_cast<std::size_t>(v)]; }))
        continue;
      auto r = ev(*x.pool, x.e, cur);
      if (!r) return false;
      auto [it, fresh] = seen.emplace(*r, x.declared);
      if (!fresh && it->second != x.declared) return false;
    }
    return true;
  };
  auto fits = [&](std::size_t v) {
    for (std::size_t i : by_var[v])
      if (!keeps(facts[i], cur)) return false;
    return apart();
  };
  // One greedy search: each size in `order` takes its smallest value that keeps every fact, a few passes over all.
  // `settle`: a size is compared with the others' extents once the search has reached it (without: from the start,
  // at their declared values, which keeps every step apart). None when the result does not keep every extent apart
  // (a size that kept its value met one settled after it).
  // `start`: the values the search lowers from (the declared ones, or a choice that keeps every fact).
  auto search = [&](const std::vector<std::size_t>& order, bool settle,
                    const std::vector<std::int64_t>& start) -> std::optional<std::vector<std::int64_t>> {
    cur = start;
    for (std::size_t v = 0; v < nv; ++v) settled[v] = !settle || !g.vars[v].general || pinned[v];
    for (int pass = 0; pass < 3; ++pass) {
      bool changed = false;
      for (std::size_t v : order) {
        if (!g.vars[v].general || pinned[v]) continue;
        settled[v] = 1;
        std::int64_t was = cur[v];
        std::vector<std::int64_t> cands;
        for (std::int64_t c = 1; c < was && c <= 4096; ++c) cands.push_back(c);
        for (std::int64_t d = 1; d * d <= base[v]; ++d)
          if (base[v] % d == 0)
            for (std::int64_t c : {d, base[v] / d})
              if (c > 4096 && c < was) cands.push_back(c);
        std::sort(cands.begin(), cands.end());
        cands.erase(std::unique(cands.begin(), cands.end()), cands.end());
        // An even size stays even (the divisibility the facts do not name: RoPE's head dim pairs), and divisors of
        // the declared value come first.
        if (base[v] % 2 == 0) cands.erase(std::remove_if(cands.begin(), cands.end(), [](std::int64_t c) { return c % 2 != 0; }), cands.end());
        std::stable_partition(cands.begin(), cands.end(), [&](std::int64_t c) { return base[v] % c == 0; });
        for (std::int64_t c : cands) {
          cur[v] = c;
          if (fits(v)) break;
          cur[v] = was;
        }
        changed |= cur[v] != was;
      }
      if (!changed) break;
    }
    std::fill(settled.begin(), settled.end(), 1);
    if (!apart()) return std::nullopt;
    return cur;
  };
  // What a choice costs the run: the elements of every typed value at those sizes.
  auto cost = [&](const std::vector<std::int64_t>& vals) {
    double total = 0;
    for (const auto& l : lists) {
      if (!l.types) continue;
      for (const auto& t : l.types->outs) {
        if (!t.ok) continue;
        double n = 1;
        for (int d = 0; d < t.rank; ++d)
          if (auto x = ev(l.types->exprs, t.shape[static_cast<std::size_t>(d)], vals)) n *= static_cast<double>(*x);
        total += n;
      }
    }
    return total;
  };
  // The sizes kept apart crowd the small values, so the order of the search matters (Llama-3-405B's plan: S 10, D 2,
  // F 18 when the smallest declared size goes first; S 2, D 8, F 10 with S first, a third of the elements;
  // DeepSeek-V2-Lite's: B 96, S 16 with each size in turn first; B 64, S 8, half the elements, when the microbatch's
  // batch goes before K and S before E). A local search over orders: from the smallest first, every move of one size
  // to another place in the order is searched, the cheapest result taken while it is cheaper (the first on a tie).
  std::vector<std::size_t> order;  // the sizes that move, the smallest first, so each finds its place above the ones below
  for (std::size_t v = 0; v < nv; ++v)
    if (g.vars[v].general && !pinned[v]) order.push_back(v);
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return base[a] < base[b]; });
  std::vector<std::int64_t> best = search(order, false, base).value_or(base);  // (every step kept apart: the result is)
  double best_cost = cost(best);
  if (auto r = search(order, true, base))
    if (double c = cost(*r); c < best_cost) best = std::move(*r), best_cost = c;
  for (int step = 0; step < kMaxOrderSteps; ++step) {
    std::vector<std::size_t> next;
    for (std::size_t i = 0; i < order.size(); ++i)
      for (std::size_t j = 0; j < order.size(); ++j) {
        if (i == j) continue;
        std::vector<std::size_t> moved = order;
        const std::size_t v = moved[i];
        moved.erase(moved.begin() + static_cast<std::ptrdiff_t>(i));
        moved.insert(moved.begin() + static_cast<std::ptrdiff_t>(j), v);
        auto r = search(moved, true, base);
        if (!r) continue;
        if (double c = cost(*r); c < best_cost) best = std::move(*r), best_cost = c, next = std::move(moved);
      }
    if (next.empty()) break;
    order = std::move(next);
  }
  // The orders reach a choice one move at a time, and a cheaper one can be two moves away (DeepSeek-V3-671B's plan:
  // E 16, FE 18, F 12, V 10, while its 58 MoE layers hold B x S x E x FE values each and the 3 dense ones B x S x F):
  // a second local search over the values themselves, each step every exchange of two sizes' values (each at most
  // its declared value, an even size even) that keeps every fact and every extent apart, then each size lowered as
  // far as it goes (E 10, FE 12, F 16, V 18 there).
  auto keeps_all = [&](const std::vector<std::int64_t>& vals) {
    cur = vals;
    for (const auto& f : facts)
      if (!keeps(f, cur)) return false;
    std::fill(settled.begin(), settled.end(), 1);
    return apart();
  };
  for (int step = 0; step < kMaxOrderSteps; ++step) {
    bool better = false;
    for (std::size_t i = 0; i < order.size(); ++i)
      for (std::size_t j = i + 1; j < order.size(); ++j) {
        std::vector<std::int64_t> x = best;
        std::swap(x[order[i]], x[order[j]]);
        auto allowed = [&](std::size_t v) { return x[v] <= base[v] && (base[v] % 2 != 0 || x[v] % 2 == 0); };  // (an even size stays even)
        if (x == best || !allowed(order[i]) || !allowed(order[j]) || !keeps_all(x)) continue;
        auto r = search(order, false, x);
        if (!r) continue;
        if (double c = cost(*r); c < best_cost) best = std::move(*r), best_cost = c, better = true;
      }
    if (!better) break;
  }
  cur = best;
  red.vars = cur;
  for (std::size_t v = 0; v < nv; ++v) {
    if (!g.vars[v].general) continue;
    if (cur[v] != base[v])
      red.text += fmt::format("{}{} {} -> {}", red.text.empty() ? "" : ", ", g.vars[v].name, base[v], cur[v]), red.applied = true;
    else if (pinned[v])
      red.kept.push_back(fmt::format("{} = {}: {}", g.vars[v].name, base[v], why[v]));
  }
  return red;
}

namespace {

// A dropless MoE dispatch's routing: its indices' name, its axes and its capacity (the bound T), as written.
struct DroplessRouting {
  std::string indices;
  std::uint32_t axes;
  std::string capacity;
  bool operator==(const DroplessRouting&) const = default;
};

// The routing of a MoEDispatch (`p`'s op `op`), its capacity as written ("" when it has no buffer attribute).
DroplessRouting routing_of(const Program& p, const Op& op) {
  std::string cap;
  if (op.attrs.shape != kNoIndex && p.shapes[op.attrs.shape].size() == 2) cap = p.expr_str(p.shapes[op.attrs.shape][1]);
  return {p.name(p.ins(op)[1]), op.attrs.axes, cap};
}

// Whether `op` (of `p`), which names mesh axes, uses them only through the partition and a function of the whole
// group that does not depend on which rank is which (choose_mesh): a reduction, a concatenation in rank order, an
// exchange of blocks, a slice of the own block. A root, a ring, a point-to-point transfer, MoE capacity that drops
// tokens and context-parallel attention's positions tell ranks apart. A dropless MoE dispatch is a scatter of each
// rank's own tokens into its expert-major slots (every token has one: the capacity is the bound C = T) followed by
// an exchange of expert blocks: it treats ranks alike, and so do the ops of the same routing (the same indices over
// the same axes): a dispatch into a buffer of the same capacity (a combine's derived gradient), and a combine or a
// gate gradient, whose buffer the type checker reads as their dispatch's.
bool symmetric_over_axes(const Program& p, const Op& op, const std::vector<DroplessRouting>& dropless) {
  static constexpr OpKind kSymmetric[] = {OpKind::AllReduce,        OpKind::AllGather,       OpKind::ReduceScatter,         OpKind::Convert,
                                          OpKind::ZeROGatherParam,  OpKind::ZeROScatterGrad, OpKind::ZeROPartitionOptState, OpKind::GradNormSq,
                                          OpKind::CrossEntropyLoss, OpKind::CrossEntropyGrad, OpKind::LossScale};
  if (op.kind == OpKind::AllToAll) return op.attrs.shape == kNoIndex;  // explicit split sizes differ per rank
  if (op.kind == OpKind::MoEDispatch)
    return op.attrs.dropless || std::find(dropless.begin(), dropless.end(), routing_of(p, op)) != dropless.end();
  if (op.kind == OpKind::MoECombine || op.kind == OpKind::MoEGateGrad) {
    const std::string idx = p.name(p.ins(op)[op.kind == OpKind::MoECombine ? 1 : 2]);
    return std::any_of(dropless.begin(), dropless.end(), [&](const DroplessRouting& d) { return d.indices == idx && d.axes == op.attrs.axes; });
  }
  return std::find(std::begin(kSymmetric), std::end(kSymmetric), op.kind) != std::end(kSymmetric);
}

}  // namespace

std::vector<std::int64_t> choose_mesh(const Program& g, const std::vector<OpList>& lists, std::vector<std::string>& kept) {
  const std::vector<std::int64_t> mesh = mesh_sizes(g);
  std::vector<std::int64_t> out = mesh;
  if (g.local_view || g.per_rank || g.schedule.present) return out;
  std::vector<DroplessRouting> dropless;
  for (const auto& list : lists)
    for (const auto& op : *list.ops)
      if (op.kind == OpKind::MoEDispatch && op.attrs.dropless && op.n_in >= 2) dropless.push_back(routing_of(*list.program, op));
  for (std::size_t a = 0; a < g.mesh.size(); ++a) {
    if (!g.exprs.is_const(g.mesh[a].size) || mesh[a] <= 2) continue;
    std::string why;
    for (const auto& od : g.outputs)
      for (auto [axis, c] : od.ranks)
        if (static_cast<std::size_t>(axis) == a && why.empty())
          why = fmt::format("output {} is read from {} = {} only (line {})", g.name(od.name), g.mesh[a].name, c, od.loc.line);
    for (const auto& list : lists)
      for (const auto& op : *list.ops)
        if (why.empty() && (op.attrs.axes & (1u << a)) && !symmetric_over_axes(*list.program, op, dropless))
          why = fmt::format("{} ({}) tells its ranks apart", op_name(op.kind), loc_text(op));
    if (why.empty())
      out[a] = 2;
    else
      kept.push_back(fmt::format("{} = {} ranks: {}", g.mesh[a].name, mesh[a], why));
  }
  return out;
}

std::vector<std::int64_t> mesh_sizes(const Program& g) {
  std::vector<std::int64_t> mesh(g.mesh.size(), 1);
  for (std::size_t a = 0; a < g.mesh.size(); ++a)
    if (g.exprs.is_const(g.mesh[a].size)) mesh[a] = g.exprs.value(g.mesh[a].size);
  return mesh;
}

Program at_mesh(const Program& g, const std::vector<std::int64_t>& mesh) {
  Program q = g;
  for (std::size_t a = 0; a < q.mesh.size() && a < mesh.size(); ++a) q.mesh[a].size = q.exprs.constant(mesh[a]);
  return q;
}

Program at_sizes(const Program& g, const std::vector<std::int64_t>& vars) {
  Program q = g;
  for (std::size_t v = 0; v < q.vars.size() && v < vars.size(); ++v) {
    q.vars[v].in = {vars[v]};
    q.vars[v].min = std::min(q.vars[v].min, vars[v]);
    q.vars[v].max = std::max(q.vars[v].max, vars[v]);
    q.vars[v].multiple_of = 1;
  }
  return q;
}

namespace {

// Equal sizes: `pe` of p at `pv`, `ge` of g at `gv`.
bool same_size(const Program& p, ExprId pe, const std::vector<std::int64_t>& pv, const Program& g, ExprId ge, const std::vector<std::int64_t>& gv) {
  if ((pe < 0) != (ge < 0)) return false;
  if (pe < 0) return true;
  try {
    return p.exprs.eval(pe, pv) == g.exprs.eval(ge, gv) && p.exprs.has_axis(pe) == g.exprs.has_axis(ge);
  } catch (const AxisExprError&) {
    return p.expr_str(pe) == g.expr_str(ge);  // local view: axis_index terms, compared as written
  }
}

bool same_shape(const Program& p, std::span<const ExprId> a, const std::vector<std::int64_t>& pv, const Program& g, std::span<const ExprId> b,
                const std::vector<std::int64_t>& gv) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (!same_size(p, a[i], pv, g, b[i], gv)) return false;
  return true;
}

bool same_names(const Program& p, std::span<const NameId> a, const Program& g, std::span<const NameId> b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (p.name(a[i]) != g.name(b[i])) return false;
  return true;
}

bool same_op(const Program& p, const Op& x, const std::vector<std::int64_t>& pv, const Program& g, const Op& y, const std::vector<std::int64_t>& gv) {
  if (x.kind != y.kind || x.n_in != y.n_in || x.n_out != y.n_out || x.loc.line != y.loc.line || x.loc.col != y.loc.col) return false;
  if (!same_names(p, p.ins(x), g, g.ins(y)) || !same_names(p, p.outs(x), g, g.outs(y))) return false;
  const OpAttrs &a = x.attrs, &b = y.attrs;
  auto name_eq = [&](NameId m, NameId n) { return (m < 0 && n < 0) || (m >= 0 && n >= 0 && p.name(m) == g.name(n)); };
  if (a.axes != b.axes || a.dim != b.dim || a.dim2 != b.dim2 || a.rank != b.rank || a.k != b.k || a.number != b.number || !(a.to == b.to) ||
      !(a.from == b.from) || a.rop != b.rop || a.dtype != b.dtype || a.reduction != b.reduction || a.layout != b.layout ||
      a.has_number != b.has_number || a.has_to != b.has_to || a.has_from != b.has_from || a.has_dtype != b.has_dtype || a.keepdim != b.keepdim ||
      a.causal != b.causal || a.vocab_parallel != b.vocab_parallel || a.dropless != b.dropless || a.rng_per_rank != b.rng_per_rank ||
      a.dst_invariant != b.dst_invariant || a.inverse != b.inverse || a.uneven != b.uneven || a.choice != b.choice || a.order != b.order)
    return false;
  if (!name_eq(a.handle, b.handle) || !name_eq(a.stream, b.stream) || !name_eq(a.group, b.group) || !name_eq(a.matches, b.matches) ||
      !name_eq(a.label, b.label) || !name_eq(a.sync, b.sync))
    return false;
  auto idx_eq = [](std::uint32_t m, std::uint32_t n) { return (m == kNoIndex) == (n == kNoIndex); };
  if (!idx_eq(a.dims, b.dims) || !idx_eq(a.shape, b.shape) || !idx_eq(a.placements, b.placements) || !idx_eq(a.coords, b.coords) ||
      !idx_eq(a.handles, b.handles) || !idx_eq(a.sizes, b.sizes) || !idx_eq(a.bad_axis, b.bad_axis) || !idx_eq(a.numbers, b.numbers))
    return false;
  if (a.numbers != kNoIndex) {  // the optimizer ops' lr, betas... (NaN: not given)
    const auto &u = p.number_lists[a.numbers], &v = g.number_lists[b.numbers];
    if (u.size() != v.size()) return false;
    for (std::size_t i = 0; i < u.size(); ++i)
      if (!(u[i] == v[i] || (std::isnan(u[i]) && std::isnan(v[i])))) return false;
  }
  if (a.dims != kNoIndex && p.int_lists[a.dims] != g.int_lists[b.dims]) return false;
  if (a.placements != kNoIndex && p.placement_maps[a.placements] != g.placement_maps[b.placements]) return false;
  if (a.coords != kNoIndex && p.coords[a.coords] != g.coords[b.coords]) return false;
  if (a.handles != kNoIndex && !same_names(p, p.name_lists[a.handles], g, g.name_lists[b.handles])) return false;
  if (a.shape != kNoIndex && !same_shape(p, p.shapes[a.shape], pv, g, g.shapes[b.shape], gv)) return false;
  if (a.sizes != kNoIndex && !same_shape(p, p.shapes[a.sizes], pv, g, g.shapes[b.sizes], gv)) return false;
  return true;
}

bool same_ops(const Program& p, const std::vector<Op>& a, const std::vector<std::int64_t>& pv, const Program& g, const std::vector<Op>& b,
              const std::vector<std::int64_t>& gv) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (!same_op(p, a[i], pv, g, b[i], gv)) return false;
  return true;
}

bool same_links(const Program& p, const std::vector<Program::SpecLink>& a, const Program& g, const std::vector<Program::SpecLink>& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (p.name(a[i].plan) != g.name(b[i].plan) || p.name(a[i].spec) != g.name(b[i].spec)) return false;
  return true;
}

}  // namespace

bool same_program(const Program& p, const Program& g, const std::vector<std::int64_t>& gv) {
  // p's variables (the symbolic sizes) take the values g's variables of the same name have
  std::vector<std::int64_t> pv(p.vars.size(), 1);
  for (std::size_t i = 0; i < p.vars.size(); ++i) {
    bool found = false;
    for (std::size_t j = 0; j < g.vars.size() && !found; ++j)
      if (g.vars[j].name == p.vars[i].name && !g.vars[j].general) pv[i] = gv[j], found = true;
    if (!found) return false;
  }
  if (p.mesh.size() != g.mesh.size() || p.tensors.size() != g.tensors.size() || p.outputs.size() != g.outputs.size()) return false;
  for (std::size_t a = 0; a < p.mesh.size(); ++a)
    if (p.mesh[a].name != g.mesh[a].name || !same_size(p, p.mesh[a].size, pv, g, g.mesh[a].size, gv)) return false;
  for (std::size_t i = 0; i < p.tensors.size(); ++i) {
    const TensorDecl &x = p.tensors[i], &y = g.tensors[i];
    if (p.name(x.name) != g.name(y.name) || x.dtype != y.dtype || x.placement != y.placement || x.param != y.param || x.uneven != y.uneven ||
        !same_shape(p, x.shape, pv, g, y.shape, gv))
      return false;
  }
  for (std::size_t i = 0; i < p.outputs.size(); ++i) {
    const OutputDecl &x = p.outputs[i], &y = g.outputs[i];
    if (p.name(x.name) != g.name(y.name) || x.has_placement != y.has_placement || (x.has_placement && x.placement != y.placement) ||
        x.has_shape != y.has_shape || !same_shape(p, x.shape, pv, g, y.shape, gv))
      return false;
  }
  if (p.local_view != g.local_view || p.per_rank != g.per_rank || p.schedule.present != g.schedule.present || p.train != g.train ||
      p.has_backward != g.has_backward || p.has_grad_sync != g.has_grad_sync || p.has_spec != g.has_spec || (p.loss < 0) != (g.loss < 0))
    return false;
  if (p.loss >= 0 && p.name(p.loss) != g.name(g.loss)) return false;
  if (p.has_optimizer != g.has_optimizer || p.has_spec_optimizer != g.has_spec_optimizer) return false;
  // a pipelined schedule: its stages, microbatches and merges (a mutant may edit any of them)
  const ScheduleSpec &ps = p.schedule, &gs = g.schedule;
  if (ps.kind != gs.kind || ps.csv != gs.csv || ps.axis != gs.axis || ps.ranks != gs.ranks || ps.microbatches != gs.microbatches ||
      ps.virtual_stages != gs.virtual_stages || ps.steps != gs.steps || ps.scale_grads != gs.scale_grads || ps.stages.size() != gs.stages.size() ||
      ps.batch.size() != gs.batch.size() || ps.merge.size() != gs.merge.size())
    return false;
  for (std::size_t k = 0; k < ps.stages.size(); ++k)
    if (!same_names(p, ps.stages[k].ins, g, gs.stages[k].ins) || !same_names(p, ps.stages[k].outs, g, gs.stages[k].outs) ||
        !same_ops(p, ps.stages[k].ops, pv, g, gs.stages[k].ops, gv))
      return false;
  for (std::size_t k = 0; k < ps.batch.size(); ++k)
    if (p.name(ps.batch[k].name) != g.name(gs.batch[k].name) || ps.batch[k].dim != gs.batch[k].dim || ps.batch[k].order != gs.batch[k].order) return false;
  for (std::size_t k = 0; k < ps.merge.size(); ++k)
    if (p.name(ps.merge[k].name) != g.name(gs.merge[k].name) || ps.merge[k].kind != gs.merge[k].kind || ps.merge[k].dim != gs.merge[k].dim) return false;
  return same_ops(p, p.ops, pv, g, g.ops, gv) && same_ops(p, p.spec_ops, pv, g, g.spec_ops, gv) && same_ops(p, p.backward, pv, g, g.backward, gv) &&
         same_ops(p, p.grad_sync, pv, g, g.grad_sync, gv) && same_ops(p, p.optimizer, pv, g, g.optimizer, gv) &&
         same_ops(p, p.spec_optimizer, pv, g, g.spec_optimizer, gv) && same_links(p, p.spec_outputs, g, g.spec_outputs) &&
         same_links(p, p.lineage, g, g.lineage);
}

std::vector<std::vector<std::vector<std::int64_t>>> real_shapes(const Program& rp, const std::vector<Op>& run, const TypedOps& typed,
                                                                const std::vector<std::int64_t>& real, std::vector<std::int64_t>* written) {
  std::vector<std::vector<std::vector<std::int64_t>>> out(run.size());
  if (written) written->assign(rp.names.size(), -1);
  if (!typed.types) return out;
  const SpatialTypes& st = *typed.types;
  auto eval_type = [&](const ValueType& t) {
    std::vector<std::int64_t> s;
    if (!t.ok) return s;
    for (int d = 0; d < t.rank; ++d) {
      auto v = ev(st.exprs, t.shape[static_cast<std::size_t>(d)], real);
      if (!v) return std::vector<std::int64_t>{};
      s.push_back(*v);
    }
    return s;
  };
  std::vector<std::vector<std::int64_t>> env(rp.names.size());
  for (std::size_t i = 0; i < typed.program->tensors.size() && i < st.decls.size(); ++i) {
    auto n = rp.name_ids.find(typed.program->name(typed.program->tensors[i].name));
    if (n != rp.name_ids.end()) env[static_cast<std::size_t>(n->second)] = eval_type(st.decls[i]);
  }
  // the typed ops by their place in the operands (copies of an op keep it)
  std::map<std::pair<std::uint32_t, int>, std::size_t> where;
  for (std::size_t i = 0; i < typed.ops->size() && i < st.out_base.size(); ++i)
    where[{(*typed.ops)[i].first, static_cast<int>((*typed.ops)[i].kind)}] = i;
  for (std::size_t oi = 0; oi < run.size(); ++oi) {
    const Op& op = run[oi];
    for (NameId n : rp.ins(op)) out[oi].push_back(env[static_cast<std::size_t>(n)]);
    auto outs = rp.outs(op);
    auto it = where.find({op.first, static_cast<int>(op.kind)});
    for (std::size_t k = 0; k < outs.size(); ++k) {
      auto& e = env[static_cast<std::size_t>(outs[k])];
      if (it != where.end())
        e = eval_type(st.out(it->second, static_cast<int>(k)));
      else
        e = out[oi].empty() ? std::vector<std::int64_t>{} : out[oi][0];
      if (!written) continue;
      std::int64_t n = -1;  // (an evaluated type has one extent per dim)
      if (it != where.end())
        if (const ValueType& t = st.out(it->second, static_cast<int>(k)); t.ok && e.size() == t.rank) {
          n = 1;
          for (auto x : e) n *= x;
        }
      (*written)[static_cast<std::size_t>(outs[k])] = n;
    }
  }
  return out;
}

}  // namespace spmd::equiv_detail
