// tests/equiv_train_optim.cpp - the optimizer step of the random training programs (equiv_train.h): drawn after
// grad_sync with its mistakes, and its ground truth (the spec's optimizer in doubles on finite-difference gradients).
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>

#include "tests/equiv_train.h"

namespace spmd::test {
using interp::Tensor;

// The optimizer step of `c` (SGD with momentum or AdamW on every parameter, after global-norm clipping or not) and
// its spec, added to the program text `text` (with its grad_sync); the case's optimizer mistake when `bug`. The
// states are declared with their parameter's placement; each gradient's squared norm is summed over the axes its
// parameter is sharded over. False when the mistake has nothing to apply to.
bool with_optimizer(const TrainCase& c, bool bug, std::string& text) {
  struct Param {
    std::string name, shape, pl;
  };
  std::vector<Param> params;
  for (std::size_t at = 0; (at = text.find("param: true}", at)) != std::string::npos; ++at) {
    std::size_t line = text.rfind('\n', at) + 1;
    std::string l = text.substr(line, at - line);
    auto colon = l.find(':'), sh = l.find("shape: "), pl = l.find("placement: {");
    if (colon == std::string::npos || sh == std::string::npos || pl == std::string::npos) continue;
    params.push_back({l.substr(2, colon - 2), l.substr(sh + 7, l.find(']', sh) + 1 - sh - 7), l.substr(pl + 12, l.find('}', pl) - pl - 12)});
  }
  std::vector<std::string> mesh;
  for (const char* a : {"dp", "cp", "tp"})
    if (text.find(fmt::format("{}: ", a), text.find("mesh:")) < text.find('\n', text.find("mesh:"))) mesh.push_back(a);
  int m = bug ? c.optim_mistake : -1;
  bool applied = m < 0;
  std::string decls, plan, spec;
  auto op = [&](std::string& out, const std::string& body) { out += "  - {" + body + "}\n"; };
  std::vector<std::string> gs;
  std::string nsq;
  for (std::size_t i = 0; i < params.size(); ++i) {
    const Param& w = params[i];
    std::string g = w.name + ".grad";
    if (c.clip) {
      std::string axes;
      for (const auto& a : mesh)
        if (w.pl.find(a + ": S(") != std::string::npos) axes += (axes.empty() ? "" : ", ") + a;
      std::string bad;  // the double count: an axis the gradient is whole on
      if (m == 0 && !applied)
        for (const auto& a : mesh)
          if (w.pl.find(a + ": S(") == std::string::npos && bad.empty()) bad = a;
      if (!bad.empty()) axes += (axes.empty() ? "" : ", ") + bad, applied = true;
      op(plan, fmt::format("op: GradNormSq, in: [{}], out: {}.nsq{}", g, w.name, axes.empty() ? "" : ", axis: [" + axes + "]"));
      op(spec, fmt::format("op: GradNormSq, in: [{}], out: {}.nsq", g, w.name));
      if (!nsq.empty()) {
        op(plan, fmt::format("op: Add, in: [{}, {}.nsq], out: {}.nsq_sum", nsq, w.name, w.name));
        op(spec, fmt::format("op: Add, in: [{}, {}.nsq], out: {}.nsq_sum", nsq, w.name, w.name));
        nsq = w.name + ".nsq_sum";
      } else {
        nsq = w.name + ".nsq";
      }
    }
    gs.push_back(g);
  }
  if (c.clip) {
    op(plan, fmt::format("op: ClipCoef, in: [{}], out: clip_coef, max_norm: 0.5", nsq));
    op(spec, fmt::format("op: ClipCoef, in: [{}], out: clip_coef, max_norm: 0.5", nsq));
    for (auto& g : gs) {
      std::string gc = g + "c";
      op(plan, fmt::format("op: Multiply, in: [{}, clip_coef], out: {}", g, gc));
      op(spec, fmt::format("op: Multiply, in: [{}, clip_coef], out: {}", g, gc));
      g = gc;
    }
  }
  for (std::size_t i = 0; i < params.size(); ++i) {
    const Param& w = params[i];
    std::string spl = w.pl;
    if (m == 1 && !applied && (spl.find("S(0)") != std::string::npos || spl.find("S(1)") != std::string::npos) &&
        std::count(w.shape.begin(), w.shape.end(), ',') == 1) {  // the state sharded along the other dim
      spl = spl.find("S(0)") != std::string::npos ? spl.replace(spl.find("S(0)"), 4, "S(1)") : spl.replace(spl.find("S(1)"), 4, "S(0)");
      applied = true;
    }
    decls += fmt::format("  {}.m: {{shape: {}, placement: {{{}}}}}\n", w.name, w.shape, spl);
    if (c.optim == 2) decls += fmt::format("  {}.v: {{shape: {}, placement: {{{}}}}}\n", w.name, w.shape, w.pl);
    double lr = c.optim == 1 ? 0.1 : 0.01;
    std::string plr = fmt::format("{}", lr);
    if (m == 2 && !applied) plr = fmt::format("{}", 2 * lr), applied = true;
    std::string mout = w.name + ".m";
    if (m == 3 && !applied) mout = w.name + ".m_lost", applied = true;
    auto upd = [&](const std::string& r, const std::string& mo) {
      return c.optim == 1 ? fmt::format("op: SGDUpdate, in: [{0}, {1}, {0}.m], out: [{0}, {2}], lr: {3}, momentum: 0.9", w.name, gs[i], mo, r)
                          : fmt::format("op: AdamWUpdate, in: [{0}, {1}, {0}.m, {0}.v], out: [{0}, {2}, {0}.v], lr: {3}, weight_decay: 0.1", w.name,
                                        gs[i], mo, r);
    };
    op(plan, upd(plr, mout));
    op(spec, upd(fmt::format("{}", lr), w.name + ".m"));
  }
  if (!applied) return false;
  text.insert(text.find("\nops:\n") + 1, decls);
  text.insert(text.find("outputs:\n"), "optimizer:\n" + plan);
  std::string sp;
  for (std::size_t at = 0, nl; at < spec.size(); at = nl + 1) nl = spec.find('\n', at), sp += "  " + spec.substr(at, nl - at + 1);
  text += "  optimizer:\n" + sp;
  return true;
}


// The spec's optimizer step (`spec.optimizer`) evaluated here in doubles, on the global inputs and the
// finite-difference gradients, with torch.optim's formulas written out (independent of interp/ops_optim.cpp); each
// declared tensor it writes is compared with the plan's, read by its declared placement. Programs whose spec
// optimizer uses other ops, or whose gradients were sampled, are left to the other checks (no verdict from here).
void optimizer_truth(const Program& p, const std::vector<std::pair<NameId, Tensor>>& inputs, const std::map<NameId, std::vector<double>>& fd_grads,
                     const std::function<Tensor(NameId, const Placements&, std::string&)>& plan_value, Truth& tr) {
  if (tr.differs || !p.has_spec_optimizer) return;
  std::map<NameId, std::vector<double>> val;
  for (const auto& [n, v] : inputs) {
    auto& x = val[n];
    for (const auto& e : v.data) x.push_back(e.d);
  }
  for (const auto& [n, g] : fd_grads) val[n] = g;
  auto num = [&](const Op& op, const char* a, double dflt) { return p.number_attr(op, a, dflt); };
  for (const Op& op : p.spec_optimizer) {
    auto ins = p.ins(op);
    auto outs = p.outs(op);
    std::vector<std::vector<double>> x;
    for (NameId n : ins) {
      auto it = val.find(n);
      if (it == val.end()) return;  // a value this evaluator does not have (a gradient sampled, a forward value)
      x.push_back(it->second);
    }
    std::vector<std::vector<double>> y;
    switch (op.kind) {
      case OpKind::GradNormSq: {
        double sq = 0;
        for (const auto& v : x)
          for (double e : v) sq += e * e;
        y = {{sq}};
        break;
      }
      case OpKind::ClipCoef:
        y = {{std::min(1.0, num(op, "max_norm", 1.0) / (std::sqrt(x[0][0]) + num(op, "eps", 1e-6)))}};
        break;
      case OpKind::Cast:
        y = {x[0]};
        break;
      case OpKind::Add:
      case OpKind::Multiply: {
        if (x.size() == 1 && !op.attrs.has_number) return;
        std::vector<double> a = x[0];
        for (std::size_t k = 0; k < a.size(); ++k) {
          double b = x.size() == 1 ? op.attrs.number : x[1].size() == 1 ? x[1][0] : x[1].size() == a.size() ? x[1][k] : std::nan("");
          if (std::isnan(b)) return;  // a broadcast this evaluator does not do
          a[k] = op.kind == OpKind::Add ? a[k] + b : a[k] * b;
        }
        y = {a};
        break;
      }
      case OpKind::SGDUpdate: {
        double lr = num(op, "lr", 0), mom = num(op, "momentum", 0), wd = num(op, "weight_decay", 0), damp = num(op, "dampening", 0);
        y.assign(static_cast<std::size_t>(op.n_out), x[0]);
        for (std::size_t k = 0; k < x[0].size(); ++k) {
          double g = x[1][k] + wd * x[0][k];
          if (x.size() > 2) g = mom * x[2][k] + (1 - damp) * g, y[1][k] = g;
          y[0][k] = x[0][k] - lr * g;
        }
        break;
      }
      case OpKind::AdamWUpdate: {
        double lr = num(op, "lr", 0), b1 = num(op, "beta1", 0.9), b2 = num(op, "beta2", 0.999), eps = num(op, "eps", 1e-8), wd = num(op, "weight_decay", 0.01);
        int step = op.attrs.k > 0 ? op.attrs.k : 1;
        y.assign(3, x[0]);
        for (std::size_t k = 0; k < x[0].size(); ++k) {
          double g = x[1][k], m = b1 * x[2][k] + (1 - b1) * g, v = b2 * x[3][k] + (1 - b2) * g * g;
          y[0][k] = x[0][k] * (1 - lr * wd) - lr / (1 - std::pow(b1, step)) * m / (std::sqrt(v) / std::sqrt(1 - std::pow(b2, step)) + eps);
          y[1][k] = m, y[2][k] = v;
        }
        break;
      }
      default:
        return;  // an op this evaluator does not know: no verdict
    }
    for (std::size_t j = 0; j < outs.size() && j < y.size(); ++j) val[outs[j]] = y[j];
  }
  for (const auto& d : p.tensors) {
    bool written = false;
    for (const Op& op : p.spec_optimizer)
      for (NameId o : p.outs(op)) written |= o == d.name;
    if (!written) continue;
    std::string prob;
    Tensor w = plan_value(d.name, d.placement, prob);
    const auto& want = val[d.name];
    if (!prob.empty() || w.data.size() != want.size()) continue;  // not by its declared placement: the value check's business
    double scale = 1;
    for (double e : want) scale = std::max(scale, std::abs(e));
    for (std::size_t k = 0; k < want.size(); ++k) {
      ++tr.compared;
      if (std::abs(w.data[k].d - want[k]) > 1e-5 * scale)
        return void((tr.differs = true, tr.what = fmt::format("{}[{}] is {} after the plan's optimizer, {} by the spec's update of the finite-difference gradients",
                                                              p.name(d.name), k, w.data[k].d, want[k])));
    }
  }
}

}  // namespace spmd::test
