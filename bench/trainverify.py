#!/usr/bin/env python3
"""bench/trainverify.py PLAN [BUG] > plan.yaml: one of TrainVerify's production plans (SOSP'25, Table 2) as a
spmdcheck program - the whole training step at the model's published dims and the plan's parallel degrees, with
its single-device spec - for `spmdcheck equiv` (bench/trainverify.sh runs them all).

Plans:
  llama3_8b         32 layers, dp 512 (global view: every rank runs the step; no pipeline)
  llama3_70b        80 layers, dp 16 x tp 8 x pp 4, 32 microbatches, 1F1B
  llama3_405b       126 layers, dp 64 x tp 8 x pp 16, 16 microbatches, 1F1B
  deepseek_v3_16b   27 layers (1 dense), 64 experts top-6, dp 16 x tp 4 x pp 2, 16 microbatches, EP 4 over tp
  deepseek_v3_236b  60 layers (1 dense), 160 experts top-6, dp 16 x tp 8 x pp 4, 16 microbatches, EP 8 over tp
  deepseek_v3_671b  61 layers (3 dense), 256 experts top-8, dp 32 x tp 8 x pp 8, 16 microbatches, EP 8 over tp

The DeepSeek-V3 plans (at DeepSeek-V2-Lite's, V2's and V3's published dims) replace a layer's MLP by the MoE block:
a softmax top-k router, routed SwiGLU experts with expert parallelism over the tensor-parallel ranks (EP = TP, as in
the paper: each tp rank holds E/tp experts; the layer's tokens are split over tp for a dropless all-to-all dispatch
and gathered back after the combine) and shared experts as a tensor-parallel SwiGLU. The spec computes the routed
experts densely on one device (every token through every expert, weighted by its gate weights scattered with a
one-hot), so it shares no dispatch or combine with the plan. Attention is multi-head (MLA's low-rank projections
are not modelled) and the router a softmax top-k (not V3's sigmoid with bias).

Each layer is Llama's: RMSNorm, GQA attention with RoPE (causal FlashAttention), SwiGLU MLP, residuals, with
Megatron's tensor parallelism (column-parallel q/k/v/gate/up, row-parallel o/down with an all-reduce; the residual
stream invariant over tp, entered with its f operator). The last stage adds the final norm, a vocab-parallel LM head
and cross-entropy normalized by the global token count. Gradients are all-reduced over dp (summed: the loss is already
divided by every token of the batch) and AdamW updates every parameter (fp32 states beside it, as placed).

BUG (one per run):
  constant     one layer's attention scale written as 1/D instead of 1/sqrt(D) (one wrong constant in one stage)
  dropped_mb   the data loader hands the last microbatch the one before it (a dropped microbatch; pipelined plans)
  sync_avg     one parameter's gradient averaged over dp instead of summed (the grad sync's reduce op)
  adamw_lr     one parameter's AdamW step with another learning rate (an optimizer state updated wrongly)
  sync_early   stage 0's gradient sync (REDUCE_GRAD in PyTorch's pipelining CSV) runs before the backward of its last
               microbatch (TrainVerify's "grad sync before the last microbatch"; pipelined plans): the schedule is
               written as a CSV beside the program, so give `-o FILE`
  wrong_shard  one parameter's optimizer sharded ZeRO-1 style (states by one dim over dp, a dim tp leaves whole) while
               its gradient is reduce-scattered by another: each rank updates its states from another rank's gradient
               shard (karpathy/llm.c#524's mistake). A dense weight under tp has one such dim, so its gradient is
               scattered along the tp-sharded dim, a layout the type checker refuses at the reduce-scatter
"""
import os
import sys

PLANS = {
    # name: (layers, dp, tp, pp, microbatches, dims)
    "llama3_8b": (32, 512, 1, 1, 1, dict(H=4096, NH=32, NKV=8, D=128, F=14336, V=128256, S=8192)),
    "llama3_70b": (80, 16, 8, 4, 32, dict(H=8192, NH=64, NKV=8, D=128, F=28672, V=128256, S=8192)),
    "llama3_405b": (126, 64, 8, 16, 16, dict(H=16384, NH=128, NKV=8, D=128, F=53248, V=128256, S=8192)),
    "deepseek_v3_16b": (27, 16, 4, 2, 16, dict(H=2048, NH=16, NKV=16, D=128, F=10944, V=102400, S=4096,
                                                E=64, K=6, FE=1408, FS=2816, DENSE=1)),
    "deepseek_v3_236b": (60, 16, 8, 4, 16, dict(H=5120, NH=128, NKV=128, D=128, F=12288, V=102400, S=4096,
                                                 E=160, K=6, FE=1536, FS=3072, DENSE=1)),
    "deepseek_v3_671b": (61, 32, 8, 8, 16, dict(H=7168, NH=128, NKV=128, D=128, F=18432, V=129280, S=4096,
                                                 E=256, K=8, FE=2048, FS=2048, DENSE=3)),
}
BUGS = ("constant", "dropped_mb", "sync_avg", "adamw_lr", "wrong_shard", "sync_early")


def one_f_one_b_csv(pp, mbs, early_stage=None):
    """PyTorch's pipelining CSV of a 1F1B schedule: rank r runs pp - 1 - r warm-up forwards, then one forward and one
    backward at a time, then the remaining backwards, then its stage's REDUCE_GRAD (`early_stage`: before its last
    backward instead)."""
    rows = []
    for r in range(pp):
        warm = min(pp - 1 - r, mbs)
        acts = ["%dF%d" % (r, m) for m in range(warm)]
        for i in range(mbs - warm):
            acts += ["%dF%d" % (r, warm + i), "%dB%d" % (r, i)]
        acts += ["%dB%d" % (r, m) for m in range(mbs - warm, mbs)]
        acts.append("%dREDUCE_GRAD" % r)
        if r == early_stage:  # BUG: the gradient all-reduce before the last microbatch's backward
            acts.remove("%dREDUCE_GRAD" % r)
            acts.insert(acts.index("%dB%d" % (r, mbs - 1)), "%dREDUCE_GRAD" % r)
        rows.append(",".join(acts))
    return "\n".join(rows) + "\n"
WEIGHTS = ("ga", "wq", "wk", "wv", "wo", "gm", "wg", "wu", "wd")
MOE_WEIGHTS = ("ga", "wq", "wk", "wv", "wo", "gm", "rt", "eg", "eu", "ed", "sg", "su", "sd")


def generate(plan, bug=None, layers=None, csv_name=None):
    """The program's text; with bug sync_early, (text, the CSV's text) and the program names the CSV `csv_name`."""
    default_layers, dp, tp, pp, mbs, d = PLANS[plan]
    layers = layers or default_layers
    out = []
    w = out.append
    w("# Generated by `bench/trainverify.py %s%s` (TrainVerify's %s plan: %d layers, dp %d x tp %d x pp %d, %d microbatches)."
      % (plan, " " + bug if bug else "", plan, layers, dp, tp, pp, mbs))
    if bug:
        w("# BUG: %s" % bug)
    w("name: trainverify_%s%s" % (plan, "_" + bug if bug else ""))
    axes = (["pp: %d" % pp] if pp > 1 else []) + ["dp: %d" % dp] + (["tp: %d" % tp] if tp > 1 else [])
    w("mesh: {%s}" % ", ".join(axes))
    B = dp * mbs  # one sequence per rank per microbatch
    moe = "E" in d
    # (multi-head attention writes its kv heads NH, and the shared experts' width a multiple of FE: fewer sizes to
    # keep apart in the shape reduction)
    mha = d["NKV"] == d["NH"]
    nkv = "NH" if mha else "NKV"
    fs = ("FE" if d["FS"] == d["FE"] else "%d*FE" % (d["FS"] // d["FE"])) if moe else "FS"
    assert not moe or d["FS"] % d["FE"] == 0
    w("sizes: {B: %d, S: %d, H: %d, NH: %d, %sD: %d, F: %d, V: %d%s}" % (B, d["S"], d["H"], d["NH"], "" if mha else "NKV: %d, " % d["NKV"],
      d["D"], d["F"], d["V"], ", E: %d, K: %d, FE: %d" % (d["E"], d["K"], d["FE"]) if moe else ""))
    is_moe = lambda l: moe and l > d["DENSE"]
    weights = lambda l: MOE_WEIGHTS if is_moe(l) else WEIGHTS
    inv = ", tp: I" if tp > 1 else ""
    col = "placement: {tp: S(1)}, " if tp > 1 else ""
    row = "placement: {tp: S(0)}, " if tp > 1 else ""
    rep = ("placement: {tp: I}, " if tp > 1 else "")
    shapes = {"ga": ("[H]", rep), "wq": ("[H, NH*D]", col), "wk": ("[H, %s*D]" % nkv, col), "wv": ("[H, %s*D]" % nkv, col),
              "wo": ("[NH*D, H]", row), "gm": ("[H]", rep), "wg": ("[H, F]", col), "wu": ("[H, F]", col), "wd": ("[F, H]", row),
              # MoE: the router replicated (its gradient summed over the tp ranks' tokens too), the routed experts split
              # over tp (EP = TP), the shared experts column / row parallel
              "rt": ("[H, E]", ""), "eg": ("[E, H, FE]", row), "eu": ("[E, H, FE]", row), "ed": ("[E, FE, H]", row),
              "sg": ("[H, %s]" % fs, col), "su": ("[H, %s]" % fs, col), "sd": ("[%s, H]" % fs, row)}
    params = []
    w("tensors:")
    w("  x0: {shape: [B, S, H], placement: {dp: S(0)%s}}" % inv)
    w("  labels: {shape: [B, S], dtype: i64, placement: {dp: S(0)}}")
    for l in range(1, layers + 1):
        for n in weights(l):
            shp, pl = shapes[n]
            w("  %s%d: {shape: %s, %sparam: true}" % (n, l, shp, pl))
            params.append(("%s%d" % (n, l), shp, pl))
    w("  gf: {shape: [H], %sparam: true}" % rep)
    w("  w_lm: {shape: [H, V], %sparam: true}" % col)
    params += [("gf", "[H]", rep), ("w_lm", "[H, V]", col)]
    sync_bug = params[len(params) // 2][0]
    # wrong_shard: a parameter from the middle on whose optimizer states are partitioned ZeRO-1 style over dp along a
    # dim tp leaves whole, while its gradient is reduce-scattered along another dim (one tp leaves whole if it has
    # one, else the tp dim itself)
    def dims_free_of_tp(shp, pl):
        tp_dim = int(pl.split("S(")[1][0]) if "S(" in pl else None
        return [k for k in range(shp.count(",") + 1) if k != tp_dim], tp_dim
    shard_param = state_dim = grad_dim = None
    if bug == "wrong_shard":
        later = [q for q in params[len(params) // 2:] if not q[0].startswith("rt")]  # (the router's sync is over tp too)
        pick = next((q for q in later if len(dims_free_of_tp(q[1], q[2])[0]) >= 2), None) or \
            next(q for q in later if q[1].count(",") >= 1)
        shard_param = pick[0]
        free, tp_dim = dims_free_of_tp(pick[1], pick[2])
        state_dim, grad_dim = free[0], free[1] if len(free) >= 2 else tp_dim
    for name, shp, pl in params:  # AdamW's fp32 states, placed as their parameter
        if name == shard_param:
            tp_part = pl[len("placement: {"):-len("}, ")] if pl else ""  # (the parameter's own tp placement, kept)
            pl = "placement: {dp: S(%d)%s}, " % (state_dim, ", " + tp_part if tp_part else "")  # ZeRO-1 over dp
        w("  %s_m: {shape: %s%s}" % (name, shp, (", " + pl.rstrip(", ")) if pl else ""))
        w("  %s_v: {shape: %s%s}" % (name, shp, (", " + pl.rstrip(", ")) if pl else ""))

    bug_layer = max(1, layers // 2)

    def layer(l, plan_side, ind, pos="pos", b="B"):  # b: the batch a stage runs on (a microbatch)
        i, p = str(l), str(l - 1)
        o = []
        op = lambda body: o.append(ind + "- {" + body + "}")

        def enter(name):  # Megatron's f: the residual stream (I over tp) enters the column-parallel region as R
            if not plan_side or tp == 1:
                return name
            op("op: Convert, in: [%s], out: %sr, axis: tp, to: R" % (name, name))
            return name + "r"

        def swiglu(x, wg, wu, wd, g, u, sg, a, out):  # silu(x wg) * (x wu), then the row-parallel wd
            op("op: MatMul, in: [%s, %s], out: %s" % (x, wg, g))
            op("op: MatMul, in: [%s, %s], out: %s" % (x, wu, u))
            op("op: SiLU, in: [%s], out: %s" % (g, sg))
            op("op: Multiply, in: [%s, %s], out: %s" % (sg, u, a))
            row_parallel(a, wd, out)

        def row_parallel(x, wt, out):
            if not plan_side or tp == 1:
                op("op: MatMul, in: [%s, %s], out: %s" % (x, wt, out))
                return
            op("op: MatMul, in: [%s, %s], out: %sp" % (x, wt, out))
            op("op: AllReduce, in: [%sp], out: %s, axis: tp, dst: I" % (out, out))

        op("op: RMSNorm, in: [x%s, ga%s], out: n%s" % (p, i, i))
        n = enter("n" + i)
        op("op: MatMul, in: [%s, wq%s], out: q2_%s" % (n, i, i))
        op("op: MatMul, in: [%s, wk%s], out: k2_%s" % (n, i, i))
        op("op: MatMul, in: [%s, wv%s], out: v2_%s" % (n, i, i))
        op("op: Reshape, in: [q2_%s], out: q%s, shape: [%s, S, NH, D]" % (i, i, b))
        op("op: Reshape, in: [k2_%s], out: k%s, shape: [%s, S, %s, D]" % (i, i, b, nkv))
        op("op: Reshape, in: [v2_%s], out: v%s, shape: [%s, S, %s, D]" % (i, i, b, nkv))
        op("op: RoPE, in: [q%s, %s], out: qr%s" % (i, pos, i))
        op("op: RoPE, in: [k%s, %s], out: kr%s" % (i, pos, i))
        scale = ""
        if plan_side and bug == "constant" and l == bug_layer:
            scale = ", scale: %r" % (1.0 / d["D"])  # BUG: 1/D, not 1/sqrt(D)
        op("op: FlashAttention, in: [qr%s, kr%s, v%s], out: c%s, causal: true, layout: bshd%s" % (i, i, i, i, scale))
        op("op: Reshape, in: [c%s], out: c2_%s, shape: [%s, S, NH*D]" % (i, i, b))
        row_parallel("c2_" + i, "wo" + i, "o" + i)
        op("op: Add, in: [x%s, o%s], out: h%s" % (p, i, i))
        op("op: RMSNorm, in: [h%s, gm%s], out: m%s" % (i, i, i))
        if is_moe(l):
            moe_block(l, plan_side, op, enter, swiglu, b)
            op("op: Add, in: [h%s, mo%s], out: x%s" % (i, i, i))
            return o
        swiglu(enter("m" + i), *[n + i for n in ("wg", "wu", "wd", "g", "u", "sg", "a", "d")])
        op("op: Add, in: [h%s, d%s], out: x%s" % (i, i, i))
        return o

    def moe_block(l, plan_side, op, enter, swiglu, b):
        """The MoE FFN of layer l on m<l>: mo<l> = routed + shared experts."""
        i = str(l)
        m = tokens = enter("m" + i)
        if plan_side and tp > 1:  # the layer's tokens split over tp for the expert-parallel all-to-all (EP = TP)
            op("op: Convert, in: [%s], out: ms%s, axis: tp, to: \"S(1)\"" % (m, i))
            tokens = "ms" + i
        op("op: MatMul, in: [%s, rt%s], out: lg%s" % (tokens, i, i))
        op("op: TopKGate, in: [lg%s], out: [gw%s, gi%s], k: K" % (i, i, i))
        if plan_side:
            op("op: MoEDispatch, in: [%s, gi%s], out: buf%s, axis: tp, buffer: [E, S], dropless: true" % (tokens, i, i))
            op("op: ExpertCompute, in: [buf%s, eg%s], out: eh%s" % (i, i, i))
            op("op: ExpertCompute, in: [buf%s, eu%s], out: ev%s" % (i, i, i))
            op("op: SiLU, in: [eh%s], out: es%s" % (i, i))
            op("op: Multiply, in: [es%s, ev%s], out: ea%s" % (i, i, i))
            op("op: ExpertCompute, in: [ea%s, ed%s], out: eo%s" % (i, i, i))
            if tp > 1:
                op("op: MoECombine, in: [eo%s, gi%s, gw%s], out: rs%s, axis: tp" % (i, i, i, i))
                op("op: AllGather, in: [rs%s], out: ro%s, axis: tp, dim: 1, dst: I" % (i, i))
            else:
                op("op: MoECombine, in: [eo%s, gi%s, gw%s], out: ro%s, axis: tp" % (i, i, i, i))
        else:  # dense: every token through every expert, weighted by its gate weights scattered by a one-hot
            op("op: OneHot, in: [gi%s], out: oh%s, classes: E, dtype: f32" % (i, i))
            op("op: Reshape, in: [gw%s], out: gw4_%s, shape: [%s, S, K, 1]" % (i, i, b))
            op("op: Multiply, in: [oh%s, gw4_%s], out: ohw%s" % (i, i, i))
            op("op: Sum, in: [ohw%s], out: gd%s, dims: [2]" % (i, i))
            for wn, hn in (("eg", "eh2_"), ("eu", "ev2_")):
                op("op: Transpose, in: [%s%s], out: %st%s, dims: [0, 1]" % (wn, i, wn, i))
                op("op: Reshape, in: [%st%s], out: %s2_%s, shape: [H, E*FE]" % (wn, i, wn, i))
                op("op: MatMul, in: [%s, %s2_%s], out: %s%s" % (m, wn, i, hn, i))
            op("op: SiLU, in: [eh2_%s], out: es2_%s" % (i, i))
            op("op: Multiply, in: [es2_%s, ev2_%s], out: ea2_%s" % (i, i, i))
            op("op: Reshape, in: [ea2_%s], out: ea3_%s, shape: [(%s)*S, E, FE]" % (i, i, b))
            op("op: Transpose, in: [ea3_%s], out: eat%s, dims: [0, 1]" % (i, i))
            op("op: MatMul, in: [eat%s, ed%s], out: eo2_%s" % (i, i, i))
            op("op: Transpose, in: [eo2_%s], out: eot%s, dims: [0, 1]" % (i, i))
            op("op: Reshape, in: [gd%s], out: gd3_%s, shape: [(%s)*S, 1, E]" % (i, i, b))
            op("op: MatMul, in: [gd3_%s, eot%s], out: ro3_%s" % (i, i, i))
            op("op: Reshape, in: [ro3_%s], out: ro%s, shape: [%s, S, H]" % (i, i, b))
        swiglu(m, *[n + i for n in ("sg", "su", "sd", "sgh", "suh", "ss", "sa", "so")])  # the shared experts
        op("op: Add, in: [ro%s, so%s], out: mo%s" % (i, i, i))

    def head(plan_side, ind):
        o = []
        op = lambda body: o.append(ind + "- {" + body + "}")
        op("op: RMSNorm, in: [x%d, gf], out: nf" % layers)
        x = "nf"
        if plan_side and tp > 1:
            op("op: Convert, in: [nf], out: nfr, axis: tp, to: R")
            x = "nfr"
        op("op: MatMul, in: [%s, w_lm], out: logits" % x)
        vp = ", vocab_parallel: true, axis: tp, dst: I" if plan_side and tp > 1 else ""
        op("op: CrossEntropyLoss, in: [logits, labels], out: ce, reduction: sum%s" % vp)
        op("op: LossScale, in: [ce], out: loss, scale: 1/(B*S)")  # every token of the global batch
        return o

    positions = "- {op: Arange, out: pos, end: S}"
    if pp == 1:
        w("ops:")
        w("  " + positions)
        for l in range(1, layers + 1):
            out.extend(layer(l, True, "  "))
        out.extend(head(True, "  "))
    else:
        # stages: layers split as evenly as the count allows (the first stages take one more), the head on the last
        per, extra = divmod(layers, pp)
        bounds, at = [], 1
        for s in range(pp):
            n = per + (1 if s < extra else 0)
            bounds.append((at, at + n - 1))
            at += n
        w("schedule:")
        if bug == "sync_early":
            w("  csv: %s   # 1F1B, stage 0's REDUCE_GRAD before its last backward" % csv_name)
        else:
            w("  kind: 1F1B")
        w("  axis: pp")
        if bug != "sync_early":  # (a CSV's microbatches are its own)
            w("  microbatches: %d" % mbs)
        if bug == "dropped_mb":
            order = list(range(mbs))
            order[-1] = mbs - 2  # BUG: the last microbatch's data is the one before it
            o = "[%s]" % ", ".join(map(str, order))
            w("  batch: {x0: {dim: 0, order: %s}, labels: {dim: 0, order: %s}}" % (o, o))
        else:
            w("  batch: {x0: 0, labels: 0}")
        w("  stages:")
        for s, (lo, hi) in enumerate(bounds):
            ins = ["x%d" % (lo - 1)] + (["labels"] if s == pp - 1 else [])
            for l in range(lo, hi + 1):
                ins += ["%s%d" % (n, l) for n in weights(l)]
            if s == pp - 1:
                ins += ["gf", "w_lm"]
            outs = ["loss"] if s == pp - 1 else ["x%d" % hi]
            w("    - in: [%s]" % ", ".join(ins))
            w("      out: [%s]" % ", ".join(outs))
            w("      ops:")
            w("        - {op: Arange, out: pos_s%d, end: S}" % s)  # each stage's own positions
            for l in range(lo, hi + 1):
                out.extend(layer(l, True, "        ", "pos_s%d" % s, "B/%d" % mbs))
            if s == pp - 1:
                out.extend(head(True, "        "))
        w("  merge: {loss: sum}")
    w("loss: loss")
    if pp == 1:
        w("train: true")
    w("grad_sync:")
    for name, _, _ in params:
        avg = ", reduce: avg" if bug == "sync_avg" and name == sync_bug else ""
        if name == shard_param:  # BUG: reduce-scattered along another dim than the states are partitioned along
            w("  - {op: ReduceScatter, in: [%s.grad], out: %s.grad, axis: dp, dim: %d}" % (name, name, grad_dim))
            continue
        ax = "[dp, tp]" if name.startswith("rt") and tp > 1 else "dp"  # the router: every tp rank's tokens too
        w("  - {op: AllReduce, in: [%s.grad], out: %s.grad, axis: %s%s}" % (name, name, ax, avg))

    def adamw(ind, plan_side):
        for name, _, _ in params:
            if plan_side and name == shard_param:  # each rank updates its part, then gathers the parameter
                w("%s- {op: Convert, in: [%s], out: %s_shard, axis: dp, to: \"S(%d)\"}" % (ind, name, name, state_dim))
                w("%s- {op: AdamWUpdate, in: [%s_shard, %s.grad, %s_m, %s_v], out: [%s_shard, %s_m, %s_v], lr: 0.0003, weight_decay: 0.1}"
                  % (ind, name, name, name, name, name, name, name))
                w("%s- {op: AllGather, in: [%s_shard], out: %s, axis: dp, dim: %d}" % (ind, name, name, state_dim))
                continue
            lr = 0.0006 if plan_side and bug == "adamw_lr" and name == sync_bug else 0.0003
            w("%s- {op: AdamWUpdate, in: [%s, %s.grad, %s_m, %s_v], out: [%s, %s_m, %s_v], lr: %s, weight_decay: 0.1}"
              % (ind, name, name, name, name, name, name, name, lr))

    w("optimizer:")
    adamw("  ", True)
    w("outputs:")
    w("  loss: {placement: {dp: P%s}}" % inv)
    w("spec:")
    w("  ops:")
    w("    " + positions)
    for l in range(1, layers + 1):
        out.extend(layer(l, False, "    "))
    out.extend(head(False, "    "))
    w("  outputs: [loss]")
    w("  optimizer:")
    adamw("    ", False)
    text = "\n".join(out) + "\n"
    if bug == "sync_early":
        return text, one_f_one_b_csv(pp, mbs, early_stage=0)
    return text


def main(argv):
    args, out_file = list(argv[1:]), None
    if "-o" in args:
        i = args.index("-o")
        out_file = args[i + 1] if i + 1 < len(args) else None
        del args[i:i + 2]
    if not args or args[0] not in PLANS or (len(args) > 1 and args[1] not in BUGS) or len(args) > 2 or ("-o" in argv and not out_file):
        sys.stderr.write("usage: trainverify.py {%s} [%s] [-o FILE]\n" % ("|".join(PLANS), "|".join(BUGS)))
        return 2
    plan, bug = args[0], args[1] if len(args) > 1 else None
    if bug == "sync_early" and (PLANS[plan][3] == 1 or not out_file):
        sys.stderr.write("trainverify.py: sync_early needs a pipelined plan and -o FILE (its schedule is a CSV beside it)\n")
        return 2
    layers = int(os.environ.get("TRAINVERIFY_LAYERS", "0")) or None  # fewer layers, to try the generator quickly
    csv_name = os.path.splitext(os.path.basename(out_file))[0] + ".csv" if out_file else None
    text = generate(plan, bug, layers, csv_name)
    if isinstance(text, tuple):
        text, csv_text = text
        with open(os.path.join(os.path.dirname(out_file) or ".", csv_name), "w") as f:
            f.write(csv_text)
    if out_file:
        with open(out_file, "w") as f:
            f.write(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
