// equiv/reduce_check.cpp - the value check's use of shape reduction (equiv/reduce.h): the program read again with
// its sizes as variables, the reduction chosen from its typed facts and checked by typing it again at the reduced
// sizes, and the real extents the value-using kernels read.
#include <algorithm>
#include <tuple>

#include "equiv/equiv_impl.h"
#include "ir/loader.h"
#include "spatial/spatial.h"

namespace spmd::equiv_detail {

std::optional<Program> generalized(const Program& p, const EquivOptions& opt, std::vector<std::int64_t>& base) {
  std::optional<Program> g;
  if (p.generalized) {
    g = p;
  } else {
    if (!p.source) return std::nullopt;
    try {
      LoadOptions lo;
      lo.generalize_sizes = true;
      g = load_program_string(*p.source, p.file, lo);
    } catch (const std::exception&) {
      return std::nullopt;
    }
  }
  if (std::none_of(g->vars.begin(), g->vars.end(), [](const SizeVar& v) { return v.general; })) return std::nullopt;
  OracleOptions any;
  any.seed = opt.seed;
  any.max_elements = kMaxValue;
  auto insts = instantiations(*g, any);
  if (insts.empty()) return std::nullopt;
  base = insts[opt.seed % insts.size()].vars;
  if (!p.generalized && !same_program(p, *g, base)) return std::nullopt;
  return g;
}

namespace {

// Every value typed alike (placements, rank, whether it has a type) in two checks of one op list.
bool same_types(const SpatialTypes& a, const SpatialTypes& b) {
  auto same = [](const ValueType& x, const ValueType& y) { return x.ok == y.ok && x.rank == y.rank && x.pl == y.pl && x.uneven == y.uneven; };
  if (a.decls.size() != b.decls.size() || a.outs.size() != b.outs.size()) return false;
  for (std::size_t i = 0; i < a.decls.size(); ++i)
    if (!same(a.decls[i], b.decls[i])) return false;
  for (std::size_t i = 0; i < a.outs.size(); ++i)
    if (!same(a.outs[i], b.outs[i])) return false;
  return true;
}

}  // namespace

bool prepare_reduction(const Program& g, const std::vector<std::int64_t>& base, const TrainingPair* tp, Reduced& red) {
  Program model = model_of(g);
  SpatialTypes pt, mt;
  std::vector<ShapeClaim> pc, mc;
  std::vector<TypedOps> lists;
  bool plan_typed = !g.local_view;
  std::vector<Diagnostic> pd, md;
  try {
    if (plan_typed) {
      SpatialOptions so;
      so.types = &pt;
      so.claims = &pc;
      pd = check_spatial(g, so);
      lists.push_back({&g, &g.ops, &pt, &pc});
    } else {
      lists.push_back({&g, &g.ops, nullptr, nullptr});
    }
    if (g.has_spec) {
      SpatialOptions so;
      so.types = &mt;
      so.claims = &mc;
      md = check_spatial(model, so);
      lists.push_back({&model, &model.ops, &mt, &mc});
    }
    red.r = choose_reduction(g, base, lists);
    if (!red.r.applied) return false;
    // The reduced program must type-check exactly as the declared one.
    auto recheck = [&](const Program& q, const std::vector<Diagnostic>& before, const SpatialTypes& types) {
      Program at = at_sizes(q, red.r.vars);
      SpatialTypes t2;
      SpatialOptions so;
      so.types = &t2;
      auto d2 = check_spatial(at, so);
      auto key = [](const std::vector<Diagnostic>& ds) {
        std::vector<std::tuple<int, std::uint32_t, std::uint32_t>> k;
        for (const auto& d : ds) k.emplace_back(static_cast<int>(d.id), d.loc.line, d.loc.col);
        std::sort(k.begin(), k.end());
        return k;
      };
      return key(d2) == key(before) && same_types(types, t2);
    };
    if (plan_typed && !recheck(g, pd, pt)) return false;
    if (g.has_spec && !recheck(model, md, mt)) return false;
  } catch (const std::exception&) {
    return false;
  }
  // The real shapes the value-using kernels read.
  if (tp) {
    const Program& c = tp->program;
    Program cm = model_of(c);
    red.plan_real = real_shapes(c, c.ops, {&c, &tp->plan_typed, &tp->plan_types, nullptr}, base);
    red.model_real = real_shapes(cm, cm.ops, {&c, &tp->spec_typed, &tp->spec_types, nullptr}, base);
  } else {
    if (plan_typed) red.plan_real = real_shapes(g, g.ops, lists[0], base);
    if (g.has_spec)
      red.model_real = real_shapes(model, model.ops, lists.back(), base);
    else if (plan_typed)
      red.model_real = real_shapes(model, model.ops, {&g, &g.ops, &pt, nullptr}, base);
  }
  return true;
}

}  // namespace spmd::equiv_detail
