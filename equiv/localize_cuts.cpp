// equiv/localize_cuts.cpp - where to look when recording every value is too large: the first stage cut point that
// differs (first_cut_failure), or the ops from the cut points to a compared output (way_to), and a recording of those
// ops alone (record_around) for the localization search (docs/equivalence.md, "What a mismatch says").
#include <algorithm>

#include "equiv/equiv_impl.h"

namespace spmd::equiv_detail {

namespace {

// The cut point plan op `oi` writes (its program's last write of the name; the last such output), when the switches
// `off` cut it; -1: none. (A received value is its Send's, cut on the sender.)
int cut_written(const Setup& s, const std::vector<char>& off, std::size_t oi) {
  const Op& op = s.p.ops[oi];
  if (op.kind == OpKind::Recv) return -1;
  int c = -1;
  auto outs = s.p.outs(op);
  for (std::size_t k = 0; k < outs.size(); ++k)
    if (int cu = s.plan_cut[static_cast<std::size_t>(outs[k])]; cu >= 0 && s.plan_final[op.first + op.n_in + k] && !off[static_cast<std::size_t>(cu)])
      c = cu;
  return c;
}

}  // namespace

CutCulprit first_cut_failure(const Setup& s, const Run& run) {
  const Program& p = s.p;
  CutCulprit c;
  std::vector<int> op_cut(p.ops.size());
  for (std::size_t oi = 0; oi < p.ops.size(); ++oi) op_cut[oi] = cut_written(s, s.cut_off, oi);
  auto held = [&](int cu) {
    auto u = static_cast<std::size_t>(cu);
    if (run.cut_ok[u]) return true;
    // (a point only some ranks write is checked after the run)
    return run.cut_left[u] != 0 && !(u < s.cut_mb.size() && s.cut_mb[u]) && cut_holds(s, run.plan_cut[u], run.model_cut[u]);
  };
  const std::vector<std::vector<int>> producers = equiv_detail::plan_producers(p);
  std::vector<int> seen(p.ops.size(), -1);  // the candidate whose walk last visited an op
  for (std::size_t oi = 0; oi < p.ops.size(); ++oi) {
    const int cu = op_cut[oi];
    if (cu < 0 || held(cu) || generated_op(s, static_cast<int>(oi))) continue;
    // the ops it is computed by from cut points (and inputs): every point on the way must hold
    bool tainted = false;
    std::vector<int> way;
    std::vector<int> stack(producers[oi].begin(), producers[oi].end());
    while (!stack.empty() && !tainted) {
      const int q = stack.back();
      stack.pop_back();
      if (q < 0 || seen[static_cast<std::size_t>(q)] == static_cast<int>(oi)) continue;
      seen[static_cast<std::size_t>(q)] = static_cast<int>(oi);
      if (int qc = op_cut[static_cast<std::size_t>(q)]; qc >= 0) {
        tainted = !held(qc);
        continue;
      }
      const auto& pq = producers[static_cast<std::size_t>(q)];
      const bool constant = std::all_of(pq.begin(), pq.end(), [](int r) { return r < 0; }) && p.ins(p.ops[static_cast<std::size_t>(q)]).empty();
      if (!generated_op(s, q) && !received_copy(s, q) && !constant) way.push_back(q);
      for (int r : pq) stack.push_back(r);
    }
    if (tainted) continue;
    std::sort(way.begin(), way.end());
    c.op = static_cast<int>(oi), c.way = std::move(way);
    for (NameId n : p.outs(p.ops[oi]))
      if (s.plan_cut[static_cast<std::size_t>(n)] == cu) c.plan = n;
    for (std::size_t n = 0; n < s.model_cut.size(); ++n)
      if (s.model_cut[n] == cu) c.spec = static_cast<NameId>(n);
    return c;
  }
  return c;
}

void record_around(Setup& s, const CutCulprit& c) {
  const Program& p = s.p;
  s.record_plan.assign(p.ops.size(), 0);
  s.record_model.assign(s.model.ops.size(), 0);
  std::vector<int> plan_ops = c.way;
  plan_ops.push_back(c.op);
  std::vector<char> families(p.ops.size(), 0);
  auto family = [&](std::size_t o) { return s.pair && o < s.pair->family.size() && s.pair->mb[o] >= 0 ? s.pair->family[o] : -1; };
  for (int o : plan_ops) {
    s.record_plan[static_cast<std::size_t>(o)] = 1;
    if (int f = family(static_cast<std::size_t>(o)); f >= 0 && static_cast<std::size_t>(f) < families.size())
      families[static_cast<std::size_t>(f)] = 1;
  }
  for (std::size_t o = 0; o < p.ops.size(); ++o)
    if (int f = family(o); f >= 0 && static_cast<std::size_t>(f) < families.size() && families[static_cast<std::size_t>(f)]) s.record_plan[o] = 1;
  // the spec: from the point's writer back to the spec's cut points (recorded too: the values the way starts from)
  if (c.spec < 0) return;
  const std::vector<std::vector<int>> producers = equiv_detail::plan_producers(s.model);
  std::vector<int> stack{s.model_last[static_cast<std::size_t>(c.spec)]};
  while (!stack.empty()) {
    const int q = stack.back();
    stack.pop_back();
    if (q < 0 || s.record_model[static_cast<std::size_t>(q)]) continue;
    s.record_model[static_cast<std::size_t>(q)] = 1;
    const Op& op = s.model.ops[static_cast<std::size_t>(q)];
    bool at_cut = false;
    for (NameId n : s.model.outs(op))
      at_cut |= s.model_cut[static_cast<std::size_t>(n)] >= 0 && s.model_last[static_cast<std::size_t>(n)] == q && n != c.spec;
    if (!at_cut)
      for (int r : producers[static_cast<std::size_t>(q)]) stack.push_back(r);
  }
}

CutCulprit way_to(const Setup& s, const std::vector<char>& off, NameId plan, NameId spec) {
  const Program& p = s.p;
  CutCulprit c;
  c.op = s.plan_last[static_cast<std::size_t>(plan)], c.plan = plan, c.spec = spec;
  if (c.op < 0) return c;
  const std::vector<std::vector<int>> producers = equiv_detail::plan_producers(p);
  std::vector<char> seen(p.ops.size(), 0);
  std::vector<int> stack;
  // every op writing the output (a gradient accumulated over microbatches, then all-reduced), and their way back
  for (std::size_t o = 0; o < p.ops.size(); ++o)
    for (NameId n : p.outs(p.ops[o]))
      if (n == plan) stack.push_back(static_cast<int>(o));
  while (!stack.empty()) {
    const int q = stack.back();
    stack.pop_back();
    if (q < 0 || seen[static_cast<std::size_t>(q)]) continue;
    seen[static_cast<std::size_t>(q)] = 1;
    if (cut_written(s, off, static_cast<std::size_t>(q)) >= 0) continue;  // (a point that holds)
    if (q != c.op) c.way.push_back(q);
    for (int r : producers[static_cast<std::size_t>(q)]) stack.push_back(r);
  }
  std::sort(c.way.begin(), c.way.end());
  return c;
}

}  // namespace spmd::equiv_detail
