// interp/ops_optim.cpp - the numeric oracle: the optimizer ops.
//
// AdamWUpdate and SGDUpdate are torch.optim.AdamW's and SGD's update of one parameter, element by element, on the
// rank's pieces (the operands are whole or sharded alike: each rank updates its shard); ClipCoef is clip_grad_norm_'s
// coefficient; GradNormSq runs across a group (step_group) and counts every element of every gradient once. In the
// field lanes (docs/equivalence.md, "The number domain") they are their formulas: sqrt is the random function S,
// division is the field's, min is the symmetric random function of min2.
#include "interp/runner.h"

namespace spmd::interp {

// Optimizer states read under a square root (AdamW's exp_avg_sq) are drawn non-negative, as they are in training.
std::vector<char> nonnegative_inputs(const Program& p) {
  std::vector<char> out(p.names.size(), 0);
  for (const auto* list : {&p.ops, &p.spec_ops})
    for (const auto& op : *list)
      if (op.kind == OpKind::AdamWUpdate) out[static_cast<std::size_t>(p.ins(op)[3])] = 1;
  return out;
}

// AdamWUpdate (param, grad, exp_avg, exp_avg_sq) and SGDUpdate (param, grad, [buffer]): the operands' pieces aligned
// to their common layout, then the update of each element.
void Runner::optimizer_update(int oi, std::int64_t r, const std::vector<std::int64_t>& c, const std::string& taint) {
  const Op& op = p_.ops[static_cast<std::size_t>(oi)];
  auto ins = p_.ins(op);
  const int n = op.n_in;
  const Val& p0 = in(oi, r, 0);
  std::vector<std::uint32_t> mask(p0.gshape.size(), 0);
  for (int i = 0; i < n; ++i) {
    const Val& x = in(oi, r, i);
    if (x.gshape != p0.gshape)
      throw InterpError(std::string(op_name(op.kind)) + ": " + p_.name(ins[static_cast<std::size_t>(i)]) + " has shape " + shape_text(x.gshape) + ", " +
                        p_.name(ins[0]) + " " + shape_text(p0.gshape));
    for (std::size_t d = 0; d < mask.size(); ++d) mask[d] |= x.mask[d];
  }
  std::vector<Tensor> t;
  const Val* layout = &p0;  // an operand with the common layout (its shard order is the result's)
  for (int i = 0; i < n; ++i) {
    const Val& x = in(oi, r, i);
    if (x.mask == mask) layout = &x;
    t.push_back(align(x, mask, c, p_.name(ins[static_cast<std::size_t>(i)])));
  }
  const std::size_t count = t[0].data.size();
  std::vector<Tensor> res(static_cast<std::size_t>(op.n_out), Tensor(t[0].shape, 0.0));
  const double lr = p_.number_attr(op, "lr", 0);
  if (op.kind == OpKind::AdamWUpdate) {
    const double b1 = p_.number_attr(op, "beta1", 0.9), b2 = p_.number_attr(op, "beta2", 0.999), eps = p_.number_attr(op, "eps", 1e-8),
                 wd = p_.number_attr(op, "weight_decay", 0.01);
    const int step = op.attrs.k > 0 ? op.attrs.k : 1;
    // torch.optim.AdamW (single tensor): param *= 1 - lr wd; m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g^2;
    // param -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)
    const Num decay = 1 - lr * wd, c1 = b1, c1c = 1 - b1, c2 = b2, c2c = 1 - b2, e = eps;
    const Num step_size = lr / (1 - std::pow(b1, step)), bc2_sqrt = std::sqrt(1 - std::pow(b2, step));
    std::vector<Num> moved(count), denom(count);  // (the quotients share one field inverse: div_many)
    for (std::size_t k = 0; k < count; ++k) {
      const Num& g = t[1].data[k];
      Num m = c1 * t[2].data[k] + c1c * g;
      Num v = c2 * t[3].data[k] + c2c * g * g;
      denom[k] = sqrt(v) / bc2_sqrt + e;
      moved[k] = step_size * m;
      res[1].data[k] = m;
      res[2].data[k] = v;
    }
    div_many(moved.data(), denom.data(), moved.data(), count);
    for (std::size_t k = 0; k < count; ++k) res[0].data[k] = t[0].data[k] * decay - moved[k];
  } else {
    const double mom = p_.number_attr(op, "momentum", 0), wd = p_.number_attr(op, "weight_decay", 0), damp = p_.number_attr(op, "dampening", 0);
    // torch.optim.SGD: g += wd param; buf = momentum buf + (1 - dampening) g, g = buf; param -= lr g
    const Num cl = lr, cw = wd, cm = mom, cd = 1 - damp;
    for (std::size_t k = 0; k < count; ++k) {
      Num g = t[1].data[k];
      if (wd != 0) g = g + cw * t[0].data[k];
      if (n > 2) {
        g = cm * t[2].data[k] + cd * g;
        res[1].data[k] = g;
      }
      res[0].data[k] = t[0].data[k] - cl * g;
    }
  }
  charge(static_cast<std::int64_t>(count) * (n + op.n_out));
  std::vector<const Tensor*> all;
  for (const auto& x : t) all.push_back(&x);
  for (int j = 0; j < op.n_out; ++j) {
    Val v;
    v.gshape = p0.gshape;
    v.mask = mask;
    v.ord = layout->ord;
    v.t = std::move(res[static_cast<std::size_t>(j)]);
    std::string tj = taint;
    if (global_) {  // a state outside the reals (a negative exp_avg_sq) leaves the comparison, as any such value
      bool finite = std::all_of(v.t.data.begin(), v.t.data.end(), [](const Num& x) { return std::isfinite(x.d); });
      bool ins_finite = std::all_of(all.begin(), all.end(), [](const Tensor* x) {
        return std::all_of(x->data.begin(), x->data.end(), [](const Num& y) { return std::isfinite(y.d); });
      });
      if (!finite && ins_finite) tj = std::string(1, kExcluded) + "its value leaves the reals (the square root of a negative exp_avg_sq)";
    }
    set_out(oi, r, j, std::move(v), tj);
  }
}

// ClipCoef: min(1, max_norm / (sqrt(norm_sq) + eps)), elementwise.
void Runner::clip_coef(int oi, std::int64_t r, const std::string& taint) {
  const Op& op = p_.ops[static_cast<std::size_t>(oi)];
  Val v = in(oi, r, 0);
  const Num one = 1.0, max_norm = p_.number_attr(op, "max_norm", 1.0), eps = p_.number_attr(op, "eps", 1e-6);
  v.t = unary(v.t, [&](const Num& x) { return min2(one, max_norm / (sqrt(x) + eps)); });
  set_out(oi, r, 0, std::move(v), taint);
}

// GradNormSq over the group `members` (the ranks that differ only on the listed axes): each member's sum of the
// squares of its pieces, summed over the members (a gradient replicated over a listed axis is counted once per rank,
// as Megatron's all-reduce of local norms counts it; the type rule rejects that). Every member gets the total.
void Runner::grad_norm_sq(int oi, const std::vector<std::int64_t>& members) {
  const Op& op = p_.ops[static_cast<std::size_t>(oi)];
  std::string taint = global_ ? taint_of(oi, members[0]) : "";
  Num total = 0.0;
  std::int64_t work = 0;
  // Across per-rank programs each member's op lists the gradients that member holds (a pipeline stage's own).
  for (std::size_t k = 0; k < members.size(); ++k) {
    int mo = member_op(oi, k);
    for (int i = 0; i < p_.ops[static_cast<std::size_t>(mo)].n_in; ++i) {
      const Val& x = in(mo, members[k], i);
      for (const auto& e : x.t.data) total += e * e;
      work += x.t.numel();
    }
  }
  charge(work + 1);
  vlabel_in_ &= ~op.attrs.axes;
  for (std::size_t k = 0; k < members.size(); ++k) {
    Val v;
    v.gshape = {};
    v.t = Tensor(Shape{}, 0.0);
    v.t.data[0] = total;
    set_out(member_op(oi, k), members[k], 0, std::move(v), taint);
  }
}

}  // namespace spmd::interp
