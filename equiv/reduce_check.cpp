// equiv/reduce_check.cpp - the value check's use of shape reduction (equiv/reduce.h): the program read again with
// its sizes as variables, the reduction chosen from its typed facts and checked by typing it again at the reduced
// sizes, and the real extents the value-using kernels read.
#include <fmt/format.h>

#include <algorithm>
#include <tuple>

#include "equiv/equiv_impl.h"
#include "equiv/pipeline.h"
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
  any.max_ranks = kMaxValue;  // (a mesh the interpreter cannot run may still be reduced: choose_mesh)
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

// The findings of a check, as (check, line, column), sorted.
std::vector<std::tuple<int, std::uint32_t, std::uint32_t>> diag_key(const std::vector<Diagnostic>& ds) {
  std::vector<std::tuple<int, std::uint32_t, std::uint32_t>> k;
  for (const auto& d : ds) k.emplace_back(static_cast<int>(d.id), d.loc.line, d.loc.col);
  std::sort(k.begin(), k.end());
  return k;
}

// `q` typed into `t` (its shape claims into `c`, when given): its findings.
std::vector<Diagnostic> typed(const Program& q, SpatialTypes& t, std::vector<ShapeClaim>* c = nullptr) {
  SpatialOptions so;
  so.types = &t;
  so.claims = c;
  return check_spatial(q, so);
}

// Whether `q` types as a program did that gave `before` and `types`: the same findings, every value the same placement.
bool types_as(const Program& q, const std::vector<Diagnostic>& before, const SpatialTypes& types, SpatialTypes& t,
              std::vector<ShapeClaim>* c = nullptr) {
  return diag_key(typed(q, t, c)) == diag_key(before) && same_types(types, t);
}

// The mesh (choose_mesh) and the sizes (choose_reduction) of the plan `g` (typed unless `plan_typed` is false: a
// local-view plan) and its `model` (typed when `has_spec`), checked: both must type at the reduced mesh and sizes
// exactly as declared (the same findings, the same placement for every value). `op_lists`: the ops a reduced axis
// must treat symmetrically. On return `pt` / `pc` hold g's types and claims at the declared sizes (for real_shapes),
// `mt` / `mc` the model's. False: nothing to reduce, or the reduction does not hold.
bool choose_checked(const Program& g, const Program& model, bool plan_typed, bool has_spec, const std::vector<OpList>& op_lists,
                    const std::vector<std::int64_t>& base, Reduced& red, SpatialTypes& pt, std::vector<ShapeClaim>& pc, SpatialTypes& mt,
                    std::vector<ShapeClaim>& mc) {
  std::vector<TypedOps> lists;
  std::vector<Diagnostic> pd, md;
  const Program* on = &g;  // the plan on the mesh the run uses
  Program gm;
  SpatialTypes gmt;
  std::vector<ShapeClaim> gmc;
  try {
    if (plan_typed) {
      pd = typed(g, pt, &pc);
      lists.push_back({&g, &g.ops, &pt, &pc});
    } else {
      lists.push_back({&g, &g.ops, nullptr, nullptr});
    }
    if (has_spec) {
      md = typed(model, mt, &mc);
      lists.push_back({&model, &model.ops, &mt, &mc});
    }
    // Mesh reduction (choose_mesh): the program on the reduced mesh must type at the declared sizes as on the declared
    // mesh (the same findings, the same placement for every value), and its facts are the ones the sizes keep.
    const std::vector<std::int64_t> declared = mesh_sizes(g);
    std::vector<std::string> mesh_kept;
    std::vector<std::int64_t> mesh = plan_typed ? choose_mesh(g, op_lists, mesh_kept) : declared;
    if (mesh != declared) {
      gm = at_mesh(g, mesh);
      if (types_as(gm, pd, pt, gmt, &gmc)) {
        on = &gm;
        lists[0] = {&gm, &gm.ops, &gmt, &gmc};
      } else {
        mesh = declared;
        mesh_kept.push_back("the mesh: the program types differently with 2 ranks an axis");
      }
    }
    red.r = choose_reduction(*on, base, lists, mesh != declared ? declared : std::vector<std::int64_t>{});
    for (std::size_t a = 0; a < mesh.size(); ++a)
      if (mesh[a] != declared[a]) red.r.text += fmt::format("{}{} {} -> {} ranks", red.r.text.empty() ? "" : ", ", g.mesh[a].name, declared[a], mesh[a]);
    if (mesh != declared) red.r.mesh = mesh, red.r.applied = true;
    for (auto& k : mesh_kept) red.r.kept.push_back(std::move(k));
    if (!red.r.applied) return false;
    // The reduced program must type-check exactly as the declared one.
    SpatialTypes pt2, mt2;
    if (plan_typed && !types_as(at_sizes(*on, red.r.vars), pd, pt, pt2)) return false;
    if (has_spec && !types_as(at_sizes(model, red.r.vars), md, mt, mt2)) return false;
  } catch (const std::exception&) {
    return false;
  }
  return true;
}

}  // namespace

bool prepare_reduction(const Program& g, const std::vector<std::int64_t>& base, const TrainingPair* tp, Reduced& red) {
  Program model = model_of(g);
  SpatialTypes pt, mt;
  std::vector<ShapeClaim> pc, mc;
  bool plan_typed = !g.local_view;
  std::vector<OpList> op_lists{{&g, &g.ops}, {&g, &g.backward}, {&g, &g.grad_sync}, {&g, &g.optimizer}};
  if (tp) op_lists.push_back({&tp->program, &tp->program.ops});
  if (!choose_checked(g, model, plan_typed, g.has_spec, op_lists, base, red, pt, pc, mt, mc)) return false;
  // The real shapes the value-using kernels read.
  if (tp) {
    const Program& c = tp->program;
    Program cm = model_of(c);
    red.plan_real = real_shapes(c, c.ops, {&c, &tp->plan_typed, &tp->plan_types, nullptr}, base);
    red.model_real = real_shapes(cm, cm.ops, {&c, &tp->spec_typed, &tp->spec_types, nullptr}, base);
  } else {
    if (plan_typed) red.plan_real = real_shapes(g, g.ops, {&g, &g.ops, &pt, &pc}, base);
    if (g.has_spec)
      red.model_real = real_shapes(model, model.ops, {&model, &model.ops, &mt, &mc}, base);
    else if (plan_typed)
      red.model_real = real_shapes(model, model.ops, {&g, &g.ops, &pt, nullptr}, base);
  }
  return true;
}

bool prepare_pipeline_reduction(const Program& g, const std::vector<std::int64_t>& base, const TrainingPair& tp, Reduced& red) {
  if (!g.has_spec || tp.family.size() != tp.program.ops.size()) return false;
  const int axis = g.schedule.axis;
  Program step, model = model_of(g);
  model.schedule = ScheduleSpec{};
  try {
    step = pipeline_step_forward(g);
  } catch (const std::exception&) {
    return false;
  }
  SpatialTypes pt, mt;
  std::vector<ShapeClaim> pc, mc;
  if (!choose_checked(step, model, true, true, {{&step, &step.ops}, {&step, &step.grad_sync}, {&step, &step.optimizer}}, base, red, pt, pc, mt, mc)) return false;
  if (!red.r.mesh.empty())  // the pipeline axis is the stages: kept
    red.r.mesh.insert(red.r.mesh.begin() + axis, g.exprs.value(g.mesh[static_cast<std::size_t>(axis)].size));
  // Each lowered op reads the real extents of the step op it is an instance of; the ops the lowering adds (gradient
  // accumulation, merges, transfers) use none.
  const Program& c = tp.program;
  Program cm = model_of(c);
  auto step_real = real_shapes(c, tp.plan_typed, {&c, &tp.plan_typed, &tp.plan_types, nullptr}, base);
  red.plan_real.assign(c.ops.size(), {});
  for (std::size_t i = 0; i < c.ops.size(); ++i)
    if (int f = tp.family[i]; f >= 0 && static_cast<std::size_t>(f) < step_real.size()) red.plan_real[i] = step_real[static_cast<std::size_t>(f)];
  red.model_real = real_shapes(cm, cm.ops, {&c, &tp.spec_typed, &tp.spec_types, nullptr}, base);
  red.model_run = real_shapes(cm, cm.ops, {&c, &tp.spec_typed, &tp.spec_types, nullptr}, red.r.vars, &red.model_elems);
  return true;
}

}  // namespace spmd::equiv_detail
