// tests/equiv_pipeline.cpp - random pipelined training programs and their ground truth (see equiv_pipeline.h).
#include "tests/equiv_pipeline.h"

#include <fmt/format.h>

#include <algorithm>
#include <random>
#include <vector>

#include "equiv/pipeline.h"
#include "interp/assembly.h"
#include "interp/runner.h"
#include "schedules/schedule.h"

namespace spmd::test {

namespace {

// A schedule as PyTorch's CSV, with each stage's REDUCE_GRAD after its last backward (or, `early`, stage 0's before
// it) and, with `comms`, its SEND / RECV (`swap`: rank 0's first two SEND_F exchanged).
std::string schedule_text(const std::string& kind, int ranks, int microbatches, int virt, bool early, bool comms, bool swap) {
  Schedule s = generate_schedule(kind, ranks, microbatches, virt);
  if (comms) s = with_comms(s);
  for (auto& row : s.rows) {
    // the last backward (B or W) of each stage on this row
    std::vector<std::pair<int, std::size_t>> last;
    for (std::size_t k = 0; k < row.size(); ++k)
      if (row[k] && (row[k]->type == ActionType::B || row[k]->type == ActionType::W)) {
        auto it = std::find_if(last.begin(), last.end(), [&](const auto& x) { return x.first == row[k]->stage; });
        if (it == last.end()) last.push_back({row[k]->stage, k});
        else it->second = k;
      }
    std::sort(last.begin(), last.end(), [](const auto& a, const auto& b) { return a.second > b.second; });
    for (auto [stage, k] : last) {
      Action a;
      a.type = ActionType::ReduceGrad;
      a.stage = stage;
      std::size_t at = early && stage == 0 ? k : k + 1;
      row.insert(row.begin() + static_cast<std::ptrdiff_t>(at), a);
    }
  }
  if (swap) {
    auto& row = s.rows[0];
    std::vector<std::size_t> sends;
    for (std::size_t k = 0; k < row.size(); ++k)
      if (row[k] && row[k]->type == ActionType::SendF) sends.push_back(k);
    if (sends.size() >= 2) std::swap(row[sends[0]], row[sends[1]]);
  }
  return schedule_csv(s);
}

}  // namespace

PipelineCase generate_pipeline(std::uint64_t seed, bool bug) {
  std::mt19937_64 rng(seed * 0x9e3779b97f4a7c15ULL + 17);
  auto pick = [&](int n) { return static_cast<int>(rng() % static_cast<std::uint64_t>(n)); };
  PipelineCase c;
  int P = 2 + pick(2), dp = pick(2) ? 2 : 1;
  if (dp == 2 && pick(3) == 0) dp = 4;  // (a mesh reduction runs dp 4 at 2 ranks, equiv/reduce.h)
  static const char* kKinds[] = {"GPipe", "1F1B", "ZBH1", "Interleaved1F1B"};
  std::string kind = kKinds[pick(4)];
  int V = kind == "Interleaved1F1B" ? 2 : 1;
  int M = kind == "Interleaved1F1B" ? P * (1 + pick(2)) : 1 + pick(4);
  int K = 1 + pick(2);
  int H = 2 + pick(3), O = 3 + pick(2), per = 2 + pick(2);
  int loss_kind = pick(4);  // 0: squared error / T, 1: cross-entropy sum / T, 2: mean / (K M), 3: mean with scale_grads
  if (loss_kind == 3) K = 1;
  int csv_mode = pick(4);  // 0: a CSV with REDUCE_GRAD, 1: with SEND / RECV too, else generated
  // The mistake (the same draws with and without it).
  std::vector<std::string> can;
  int N = K * M;
  if (N >= 2) can.insert(can.end(), {"dropped microbatch", "shuffled targets"});
  if ((loss_kind == 2 && N >= 2) || loss_kind <= 1) can.push_back("normalization");
  if (loss_kind == 3) can.push_back("scale_grads under accumulation");
  if (dp >= 2 && M >= 2) can.push_back("grad sync before the last backward");
  if (M >= 2) can.push_back("sends swapped");
  if (dp >= 2) can.push_back("reduce op");
  // The optimizer step (its own stream, so the rest of the program is drawn as without it): 0 none, 1 SGD with
  // momentum, 2 AdamW; with a global-norm clip over the stages or not.
  std::mt19937_64 orng(seed * 0xbf58476d1ce4e5b9ULL + 29);
  int optim = static_cast<int>(orng() % 3);
  bool clip = optim && orng() % 2;
  // (a clip norm over each stage only is not drawn as a mistake: on the value check's inputs the clip is often
  // inactive, and the check then says value-unproved - never equivalent - where the ground truth's inputs differ;
  // examples/pipeline/pp_clip_grad_norm_*.yaml and the mutation test cover it)
  if (optim) can.push_back("optimizer lr of one stage");
  std::string mistake = can.empty() ? "" : can[static_cast<std::size_t>(pick(static_cast<int>(can.size())))];
  if (!bug) mistake.clear();
  c.mistake = mistake;
  if (mistake == "scale_grads under accumulation") K = 2, N = K * M;
  bool early = mistake == "grad sync before the last backward";
  if (early || mistake == "sends swapped") csv_mode = mistake == "sends swapped" ? 1 : 0;
  int T = dp * N * per;
  int S = P * V;
  // Layers: per stage 1-2, each MatMul with an activation, a residual or a scale.
  struct Layer {
    int act, extra;  // act: 0 none, 1 GELU, 2 SiLU; extra: 0 none, 1 residual, 2 scale
  };
  std::vector<std::vector<Layer>> layers(static_cast<std::size_t>(S));
  for (auto& st : layers) {
    int n = 1 + pick(2);
    for (int j = 0; j < n; ++j) st.push_back({pick(3), pick(3)});
  }
  std::string y = loss_kind == 0 ? "y" : "labels";
  std::string out;
  out += fmt::format("name: pipeline_gen\nmesh: {{pp: {}{}}}\nsizes: {{T: {}, H: {}, O: {}}}\ntensors:\n", P, dp >= 2 ? fmt::format(", dp: {}", dp) : "", T, H, O);
  std::string shard = dp >= 2 ? ", placement: {dp: S(0)}" : "";
  out += fmt::format("  x: {{shape: [T, H]{}}}\n", shard);
  out += loss_kind == 0 ? fmt::format("  y: {{shape: [T, O]{}}}\n", shard) : fmt::format("  labels: {{shape: [T], dtype: i64{}}}\n", shard);
  for (int st = 0; st < S; ++st)
    for (std::size_t j = 0; j < layers[static_cast<std::size_t>(st)].size(); ++j) out += fmt::format("  w{}_{}: {{shape: [H, H], param: true}}\n", st, j);
  out += "  w_out: {shape: [H, O], param: true}\n";
  std::vector<std::pair<std::string, std::string>> params;  // name, shape
  for (int st = 0; st < S; ++st)
    for (std::size_t j = 0; j < layers[static_cast<std::size_t>(st)].size(); ++j) params.push_back({fmt::format("w{}_{}", st, j), "[H, H]"});
  params.push_back({"w_out", "[H, O]"});
  if (optim)
    for (const auto& [w, shape] : params) {
      out += fmt::format("  {}.m: {{shape: {}}}\n", w, shape);
      if (optim == 2) out += fmt::format("  {}.v: {{shape: {}}}\n", w, shape);
    }
  // One layer's ops (module-local names, or prefixed for the spec).
  auto layer_ops = [&](const Layer& l, const std::string& in, const std::string& w, const std::string& pre, const std::string& res, const std::string& ind) {
    std::string s, cur = pre + "m";
    s += fmt::format("{}- {{op: MatMul, in: [{}, {}], out: {}}}\n", ind, in, w, cur);
    if (l.act) {
      s += fmt::format("{}- {{op: {}, in: [{}], out: {}a}}\n", ind, l.act == 1 ? "GELU" : "SiLU", cur, pre);
      cur = pre + "a";
    }
    if (l.extra == 1) s += fmt::format("{}- {{op: Add, in: [{}, {}], out: {}}}\n", ind, in, cur, res), cur = res;
    else if (l.extra == 2) s += fmt::format("{}- {{op: Multiply, in: [{}], out: {}, scalar: 0.5}}\n", ind, cur, res), cur = res;
    else s += fmt::format("{}- {{op: Add, in: [{}], out: {}, scalar: 0}}\n", ind, cur, res), cur = res;
    return s;
  };
  std::string norm = loss_kind <= 1 ? (mistake == "normalization" ? "1/(T/2)" : "1/T")
                     : loss_kind == 2 ? (mistake == "normalization" ? fmt::format("1/{}", K) : fmt::format("1/{}", K * M))
                                      : fmt::format("1/{}", K);
  auto head_ops = [&](const std::string& h, const std::string& pre, const std::string& ind, const std::string& scale) {
    std::string s = fmt::format("{}- {{op: MatMul, in: [{}, w_out], out: {}logits}}\n", ind, h, pre);
    if (loss_kind == 0)
      s += fmt::format("{0}- {{op: Sub, in: [{1}logits, y], out: {1}e}}\n{0}- {{op: Multiply, in: [{1}e, {1}e], out: {1}e2}}\n"
                       "{0}- {{op: Sum, in: [{1}e2], out: {1}s, dims: [0, 1]}}\n",
                       ind, pre);
    else if (loss_kind == 1) s += fmt::format("{0}- {{op: CrossEntropyLoss, in: [{1}logits, labels], out: {1}s, reduction: sum}}\n", ind, pre);
    else s += fmt::format("{0}- {{op: CrossEntropyLoss, in: [{1}logits, labels], out: {1}s}}\n", ind, pre);
    s += fmt::format("{}- {{op: LossScale, in: [{}s], out: loss, scale: {}}}\n", ind, pre, scale);
    return s;
  };
  out += "modules:\n";
  for (int st = 0; st < S; ++st) {
    bool last = st == S - 1;
    std::string ins = "x";
    for (std::size_t j = 0; j < layers[static_cast<std::size_t>(st)].size(); ++j) ins += fmt::format(", w{}", j);
    if (last) ins += ", w_out, " + y;
    out += fmt::format("  stage{}:\n    in: [{}]\n    out: [{}]\n    ops:\n", st, ins, last ? "loss" : "h");
    std::string cur = "x";
    for (std::size_t j = 0; j < layers[static_cast<std::size_t>(st)].size(); ++j) {
      std::string res = !last && j + 1 == layers[static_cast<std::size_t>(st)].size() ? "h" : fmt::format("r{}", j);
      out += layer_ops(layers[static_cast<std::size_t>(st)][j], cur, fmt::format("w{}", j), fmt::format("l{}", j), res, "      ");
      cur = res;
    }
    if (last) out += head_ops(cur, "", "      ", norm);
  }
  out += fmt::format("schedule:\n");
  if (csv_mode <= 1) {
    c.csv = schedule_text(kind, P, M, V, early, csv_mode == 1, mistake == "sends swapped");
    out += "  csv: pipe.csv\n";
  } else {
    out += fmt::format("  kind: {}\n  microbatches: {}\n", kind, M);
    if (V > 1) out += fmt::format("  virtual_stages: {}\n", V);
  }
  out += "  axis: pp\n";
  if (K > 1) out += fmt::format("  steps: {}\n", K);
  if (loss_kind == 3) out += "  scale_grads: true\n";
  std::string order;
  if (mistake == "dropped microbatch" || mistake == "shuffled targets") {
    order = "[";
    for (int k = 0; k < N; ++k) {
      int part = mistake == "dropped microbatch" ? (k == 1 ? 0 : k) : (k + 1) % N;
      order += (k ? ", " : "") + std::to_string(part);
    }
    order += "]";
  }
  auto split = [&](const std::string& name, bool target) {
    bool ordered = !order.empty() && (mistake == "dropped microbatch" || target);
    return ordered ? fmt::format("{}: {{dim: 0, order: {}}}", name, order) : name + ": 0";
  };
  out += fmt::format("  batch: {{{}, {}}}\n  stages:\n", split("x", false), split(y, true));
  for (int st = 0; st < S; ++st) {
    bool last = st == S - 1;
    std::string ins = st == 0 ? "x" : fmt::format("h{}", st - 1);
    for (std::size_t j = 0; j < layers[static_cast<std::size_t>(st)].size(); ++j) ins += fmt::format(", w{}_{}", st, j);
    if (last) ins += ", w_out, " + y;
    out += fmt::format("    - {{use: stage{}, in: [{}], out: [{}]}}\n", st, ins, last ? "loss" : fmt::format("h{}", st));
  }
  out += fmt::format("  merge: {{loss: {}}}\nloss: loss\n", loss_kind == 3 ? "mean" : "sum");
  if (dp >= 2) {
    bool avg = loss_kind >= 2;
    out += "grad_sync:\n";
    bool first = true;
    for (int st = 0; st < S; ++st)
      for (std::size_t j = 0; j < layers[static_cast<std::size_t>(st)].size(); ++j) {
        bool a = avg != (mistake == "reduce op" && first);
        first = false;
        out += fmt::format("  - {{op: AllReduce, in: [w{0}_{1}.grad], out: w{0}_{1}.grad, axis: dp{2}}}\n", st, j, a ? ", reduce: avg" : "");
      }
    out += fmt::format("  - {{op: AllReduce, in: [w_out.grad], out: w_out.grad, axis: dp{}}}\n", avg ? ", reduce: avg" : "");
  }
  // The optimizer: each stage's parameters updated on its ranks; the clip's squared norm summed over pp.
  std::string plan_opt, spec_opt;
  if (optim) {
    std::string gs;
    for (const auto& pw : params) gs += (gs.empty() ? "" : ", ") + pw.first + ".grad";
    auto both = [&](const std::string& pl, const std::string& sp) { plan_opt += "  - {" + pl + "}\n", spec_opt += "    - {" + sp + "}\n"; };
    if (clip) {
      both(fmt::format("op: GradNormSq, in: [{}], out: nsq, axis: pp", gs),
           fmt::format("op: GradNormSq, in: [{}], out: nsq", gs));
      both("op: ClipCoef, in: [nsq], out: coef, max_norm: 0.01", "op: ClipCoef, in: [nsq], out: coef, max_norm: 0.01");
    }
    bool first = true;
    for (const auto& pw : params) {
      const std::string& w = pw.first;
      std::string g = w + ".grad";
      if (clip) {
        std::string m = fmt::format("op: Multiply, in: [{0}.grad, coef], out: {0}.gc", w);
        both(m, m);
        g = w + ".gc";
      }
      double lr = optim == 1 ? 0.1 : 0.01;
      double plr = first && mistake == "optimizer lr of one stage" ? 2 * lr : lr;
      first = false;
      auto upd = [&](double r) {
        return optim == 1 ? fmt::format("op: SGDUpdate, in: [{0}, {1}, {0}.m], out: [{0}, {0}.m], lr: {2}, momentum: 0.9", w, g, r)
                          : fmt::format("op: AdamWUpdate, in: [{0}, {1}, {0}.m, {0}.v], out: [{0}, {0}.m, {0}.v], lr: {2}, weight_decay: 0.1", w, g, r);
      };
      both(upd(plr), upd(lr));
    }
    out += "optimizer:\n" + plan_opt;
  }
  out += fmt::format("outputs:\n  loss: {{placement: {}}}\n", dp >= 2 ? (loss_kind >= 2 ? "{dp: P(avg)}" : "{dp: P}") : "{}");
  out += "spec:\n  ops:\n";
  std::string cur = "x";
  for (int st = 0; st < S; ++st)
    for (std::size_t j = 0; j < layers[static_cast<std::size_t>(st)].size(); ++j) {
      std::string pre = fmt::format("s{}_{}_", st, j);
      out += layer_ops(layers[static_cast<std::size_t>(st)][j], cur, fmt::format("w{}_{}", st, j), pre, pre + "r", "    ");
      cur = pre + "r";
    }
  out += head_ops(cur, "spec_", "    ", loss_kind == 0 || loss_kind == 1 ? "1/T" : "1");
  out += "  outputs: [loss]\n";
  if (optim) out += "  optimizer:\n" + spec_opt;
  c.yaml = out;
  return c;
}

Truth pipeline_truth(const Program& p, std::size_t max_elements) {
  Truth tr;
  PipelineLowering pl;
  try {
    pl = lower_pipeline(p, program_schedule(p, p.file));
  } catch (const LoadError& e) {
    return tr.failed = true, tr.what = e.what(), tr;
  }
  if (!pl.built) return tr.failed = true, tr.what = pl.why.empty() ? "the stages have findings" : pl.why, tr;
  const Program& L = pl.program;
  OracleOptions oo;
  oo.seed = 5;
  auto insts = interp::instantiations(L, oo);
  if (insts.empty()) return tr.failed = true, tr.what = "no instantiation", tr;
  const auto& inst = insts[0];
  auto held = [&](NameId n) {
    for (const auto& od : L.outputs)
      if (od.name == n) return od.ranks;
    for (std::size_t i = 0; i < pl.grads.size(); ++i)
      if (pl.grads[i].name == n) return pl.grads[i].ranks;
    if (static_cast<std::size_t>(n) < pl.optim_ranks.size()) return pl.optim_ranks[static_cast<std::size_t>(n)];  // an updated parameter or state
    return std::vector<std::pair<int, std::int64_t>>{};
  };
  // Two draws of the inputs (integer ones: labels in [0, 3), at most the classes the generator uses): a shuffled
  // target equals the right one by chance more often with one draw of few small labels.
  for (std::uint64_t draw : {7, 8}) {
    std::int64_t work = 0;
    interp::Runner dist(L, inst.vars, inst.mesh, false, oo, work);
    auto plan_value = [&](NameId n, const Placements& placement, std::string& prob) {
      interp::Assembled a = interp::assemble(L, dist, n, placement, oo, held(n));
      if (!a.ok) prob = a.undefined ? "undefined" : a.problem;
      return a.t;
    };
    std::vector<std::pair<NameId, interp::Tensor>> inputs;
    try {
      for (const auto& d : L.tensors) dist.declare(d, 3, draw);
      for (std::int64_t r = 0; r < dist.ranks(); ++r)
        for (auto& e : dist.at(r, pl.seed).t.data) e = interp::Num(1.0);  // each microbatch: loss.backward()
      for (const auto& mb : pl.meta.microbatches)
        for (std::int64_t r = 0; r < dist.ranks(); ++r) {
          const interp::Tensor& src = dist.at(r, mb.source).t;
          std::int64_t n = src.shape[static_cast<std::size_t>(mb.dim)];
          dist.at(r, mb.name).t = interp::slice(src, mb.dim, n * mb.part / mb.parts, n * (mb.part + 1) / mb.parts);
        }
      for (const auto& d : p.tensors) {
        interp::Assembled a = interp::assemble(L, dist, d.name, d.placement, oo);
        if (!a.ok) return tr.failed = true, tr.what = "inputs: " + a.problem, tr;
        inputs.push_back({d.name, a.t});
      }
      dist.run(draw);
    } catch (const std::runtime_error& e) {
      return tr.failed = true, tr.differs = true, tr.what = std::string("the plan's step fails: ") + e.what(), tr;
    }
    Truth t = compare_with_spec(p, L, inst, inputs, plan_value, max_elements);
    tr.compared += t.compared;
    if (t.differs || t.failed) return t.compared = tr.compared, t;
  }
  return tr;
}

}  // namespace spmd::test
