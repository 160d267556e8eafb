// autograd/loss_scaling.cpp - pieces of the training step's loss-scaling findings (autograd/loss_scaling.h).
#include "autograd/loss_scaling.h"

#include <fmt/format.h>

#include <algorithm>
#include <bit>

#include "ir/op_table.h"

namespace spmd {

ValueType final_type(const Program& p, const SpatialTypes& ty, NameId n, std::size_t n_ops) {
  for (std::size_t i = n_ops; i-- > 0;) {
    auto outs = p.outs(p.ops[i]);
    for (std::size_t k = 0; k < outs.size(); ++k)
      if (outs[k] == n) return ty.out(i, static_cast<int>(k));
  }
  for (std::size_t d = 0; d < ty.decls.size(); ++d)  // the forward's declarations (a step has the seed after them)
    if (p.tensors[d].name == n) return ty.decls[d];
  return {};
}

std::string axis_list(const Program& p, std::uint32_t m, const char* sep) {
  std::string s;
  for (int a = 0; a < p.axis_count(); ++a)
    if (m & (1u << a)) s += (s.empty() ? "" : sep) + p.mesh[static_cast<std::size_t>(a)].name;
  return s;
}
std::string axis_attr(const Program& p, std::uint32_t m) {
  std::string s = axis_list(p, m, ", ");
  return std::popcount(m) > 1 ? "[" + s + "]" : s;
}

std::string scale_text(const Program& t, std::uint32_t axes) {
  double n = 1;
  bool concrete = true;
  std::string prod;
  for (int b = 0; b < t.axis_count(); ++b) {
    if (!(axes & (1u << b))) continue;
    ExprId e = t.mesh[static_cast<std::size_t>(b)].size;
    if (t.exprs.is_const(e))
      n *= static_cast<double>(t.exprs.value(e));
    else
      concrete = false;
    prod += (prod.empty() ? "" : "*") + t.mesh[static_cast<std::size_t>(b)].name;
  }
  return concrete ? fmt::format("{}", 1.0 / n) : std::popcount(axes) > 1 ? "1/(" + prod + ")" : "1/" + prod;
}

std::string grads_text(const std::vector<FoldedGrad>& f) {
  std::string s;
  for (std::size_t i = 0; i < f.size(); ++i)
    s += (i == 0 ? "" : i + 1 == f.size() ? " and " : ", ") + fmt::format("{} ({} over that axis)", f[i].grad, f[i].have);
  return s;
}

std::optional<double> sync_scale(const Program& t, std::size_t first_sync, std::size_t end, NameId g) {
  double f = 1;
  NameId n = g;
  for (std::size_t j = first_sync; j < end; ++j) {
    const Op& op = t.ops[j];
    auto ins = t.ins(op);
    if (std::find(ins.begin(), ins.end(), n) == ins.end()) continue;
    if (op.n_out != 1 || ins.size() != 1) return std::nullopt;
    bool scalar = op.attrs.has_number && (op.kind == OpKind::Multiply || op.kind == OpKind::Div || (op.kind == OpKind::LossScale && !op.attrs.axes));
    if (scalar)
      f *= op.kind == OpKind::Div ? 1 / op.attrs.number : op.attrs.number;
    else if (!(op_info(op.kind).category == OpCategory::collective || op.kind == OpKind::Convert))
      return std::nullopt;
    n = t.outs(op)[0];
  }
  if (n != g) return std::nullopt;
  return f;
}

std::vector<std::string> replicated_after(const Program& p, const SpatialTypes& ft, std::size_t n_ops, int w, std::uint32_t axes) {
  std::vector<char> from(p.names.size(), 0);
  for (NameId n : p.outs(p.ops[static_cast<std::size_t>(w)])) from[static_cast<std::size_t>(n)] = 1;
  std::vector<std::string> names;
  for (std::size_t i = static_cast<std::size_t>(w) + 1; i < n_ops; ++i) {
    const Op& op = p.ops[i];
    auto ins = p.ins(op);
    if (std::none_of(ins.begin(), ins.end(), [&](NameId n) { return from[static_cast<std::size_t>(n)] != 0; })) continue;
    for (NameId n : ins) {
      if (from[static_cast<std::size_t>(n)]) continue;
      ValueType ty = final_type(p, ft, n, i);
      bool flt = !(ty.dtype == DType::I64 || ty.dtype == DType::I32 || ty.dtype == DType::I8 || ty.dtype == DType::Bool);
      bool repl = false;
      for (int a = 0; a < p.axis_count(); ++a) repl |= ((axes >> a) & 1u) && ty.pl[static_cast<std::size_t>(a)].is_r();
      if (flt && repl && std::find(names.begin(), names.end(), p.name(n)) == names.end()) names.push_back(p.name(n));
    }
    for (NameId n : p.outs(op)) from[static_cast<std::size_t>(n)] = 1;
  }
  return names;
}

}  // namespace spmd
