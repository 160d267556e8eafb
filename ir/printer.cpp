// ir/printer.cpp - Program -> YAML text.
#include "ir/printer.h"

#include <cmath>
#include <optional>
#include <sstream>

namespace spmd {

namespace {

std::string placements_map(const Program& p, const Placements& pl) { return "{" + placements_text(p, pl, true) + "}"; }

// The axes that cut dim d, major first ("tp, dp"); empty when they cut it in mesh order.
std::string order_of_dim(const Program& p, const Placements& pl, int d) {
  int axes[kMaxAxes];
  int n = shard_order(pl.data(), p.axis_count(), d, axes);
  if (n < 2 || !pl[static_cast<std::size_t>(axes[0])].ord) return "";
  std::string o;
  for (int k = 0; k < n; ++k) o += (o.empty() ? "" : ", ") + p.mesh[static_cast<std::size_t>(axes[k])].name;
  return o;
}

std::string names_list(const Program& p, std::span<const NameId> names) {
  std::string s = "[";
  for (std::size_t i = 0; i < names.size(); ++i) s += (i ? ", " : "") + p.name(names[i]);
  return s + "]";
}

std::string number(double d) {
  std::ostringstream o;
  o.precision(17);
  o << d;
  std::string s = o.str();
  if (s.find_first_of(".eE") == std::string::npos && std::isfinite(d)) s += ".0";
  return s;
}

// The value of one attribute of `op`, or nullopt when it was not given (has its default).
std::optional<std::string> attr_value(const Program& p, const Op& op, const AttrSpec& spec) {
  const OpAttrs& a = op.attrs;
  const std::string& n = spec.name;
  switch (spec.type) {
    case AttrType::Axes: {
      if (!a.axes && a.bad_axis == kNoIndex) return std::nullopt;
      std::vector<std::string> names;
      for (int i = 0; i < p.axis_count(); ++i)
        if (a.axes & (1u << i)) names.push_back(p.mesh[static_cast<std::size_t>(i)].name);
      if (a.bad_axis != kNoIndex) names.push_back(p.bad_axes[a.bad_axis].name);
      if (names.size() == 1) return names[0];
      std::string s;
      for (const auto& x : names) s += (s.empty() ? "" : ", ") + x;
      return "[" + s + "]";
    }
    case AttrType::Int:
      if (n == "src" || n == "dst") return a.rank >= 0 ? std::optional(std::to_string(a.rank)) : std::nullopt;
      if (n == "step") return op.kind == OpKind::AdamWUpdate && a.k == 0 ? std::nullopt : std::optional(std::to_string(a.k));  // AdamW: 0 = not given (1)
      if (n == "concat_dim") return a.dim2 != kUnset ? std::optional(std::to_string(a.dim2)) : std::nullopt;
      return a.dim != kUnset ? std::optional(std::to_string(a.dim)) : std::nullopt;
    case AttrType::Ints: {
      if (a.dims == kNoIndex) return std::nullopt;
      std::string s;
      for (int d : p.int_lists[a.dims]) s += (s.empty() ? "" : ", ") + std::to_string(d);
      return "[" + s + "]";
    }
    case AttrType::Number:
      if (a.scalar_expr) return p.expr_str(p.scalar_expr(op));
      if (Program::several_numbers(op.kind)) {  // the optimizer ops keep theirs in number_lists
        double v = p.number_attr(op, n, std::nan(""));
        return std::isnan(v) ? std::nullopt : std::optional(number(v));
      }
      return a.has_number ? std::optional(number(a.number)) : std::nullopt;
    case AttrType::Bool: {
      bool v = n == "keepdim" ? a.keepdim : n == "causal" ? a.causal : n == "dropless" ? a.dropless : n == "inverse" ? a.inverse : n == "uneven" ? a.uneven : n == "reverse" ? a.reverse : a.vocab_parallel;
      return v ? std::optional<std::string>("true") : std::nullopt;
    }
    case AttrType::Placement:
      if (n == "to") return a.has_to ? std::optional(to_string(a.to)) : std::nullopt;
      return a.has_from ? std::optional(to_string(a.from)) : std::nullopt;
    case AttrType::Placements: return a.placements != kNoIndex ? std::optional(placements_map(p, p.placement_maps[a.placements])) : std::nullopt;
    case AttrType::Reduce: return a.rop != ReduceOp::Sum ? std::optional(std::string(reduce_name(a.rop))) : std::nullopt;
    case AttrType::DType: return a.has_dtype ? std::optional(std::string(dtype_name(a.dtype))) : std::nullopt;
    case AttrType::Shape: return a.shape != kNoIndex ? std::optional(p.shape_str(p.shapes[a.shape])) : std::nullopt;
    case AttrType::Name: {
      if (n == "at") return a.at != kNoIndex ? std::optional("\"" + p.origins[a.at] + "\"") : std::nullopt;
      NameId id = n == "handle" ? a.handle : n == "group" ? a.group : n == "matches" ? a.matches : n == "label" ? a.label : n == "for" || n == "event" ? a.sync : a.stream;
      return id >= 0 ? std::optional(p.name(id)) : std::nullopt;
    }
    case AttrType::Names: return a.handles != kNoIndex ? std::optional(names_list(p, p.name_lists[a.handles])) : std::nullopt;
    case AttrType::Coords: {
      if (a.coords == kNoIndex) return std::nullopt;
      std::string s;
      for (auto [axis, c] : p.coords[a.coords]) s += (s.empty() ? "" : ", ") + p.mesh[static_cast<std::size_t>(axis)].name + ": " + std::to_string(c);
      return "{" + s + "}";
    }
    case AttrType::Size: {
      ExprId e = p.size_attr(op, n);
      return e >= 0 ? std::optional(p.expr_str(e)) : std::nullopt;
    }
    case AttrType::Enum:
      if (n == "dst") return a.dst_invariant ? std::optional<std::string>("I") : std::nullopt;
      if (n == "rng") return a.rng_per_rank ? std::optional<std::string>("per_rank") : std::nullopt;
      if (n == "reduction")
        return a.reduction == Reduction::Mean ? std::nullopt : std::optional<std::string>(a.reduction == Reduction::Sum ? "sum" : "none");
      if (n == "order") return a.order ? std::optional<std::string>("zigzag") : std::nullopt;
      if (n == "layout")
        return a.layout == AttnLayout::BHSD ? std::nullopt : std::optional<std::string>(a.layout == AttnLayout::BSHD ? "bshd" : "sbhd");
      return a.choice < spec.choices.size() ? std::optional(spec.choices[a.choice]) : std::nullopt;
  }
  return std::nullopt;
}

void print_ops(std::ostringstream& o, const Program& p, const char* key, const std::vector<Op>& ops, const char* indent = "") {
  o << indent << key << ":" << (ops.empty() ? " []" : "") << "\n";
  for (const auto& op : ops) o << indent << "  - " << print_op(p, op) << "\n";
}

// `schedule:` with its stages written out (their ops as expanded, so the names stay as they are).
void print_schedule(std::ostringstream& o, const Program& p) {
  const ScheduleSpec& sp = p.schedule;
  o << "schedule:\n";
  if (!sp.kind.empty()) {
    o << "  kind: " << sp.kind << "\n  microbatches: " << sp.microbatches << "\n";
    if (sp.virtual_stages != 1) o << "  virtual_stages: " << sp.virtual_stages << "\n";
  } else {
    o << "  csv: " << sp.csv << "\n";
  }
  o << "  axis: " << p.mesh[static_cast<std::size_t>(sp.axis)].name << "\n";
  if (sp.steps != 1) o << "  steps: " << sp.steps << "\n";
  if (sp.scale_grads) o << "  scale_grads: true\n";
  if (!sp.batch.empty()) {
    o << "  batch: {";
    for (std::size_t i = 0; i < sp.batch.size(); ++i) {
      const BatchSplit& b = sp.batch[i];
      o << (i ? ", " : "") << p.name(b.name) << ": ";
      if (b.order.empty()) {
        o << b.dim;
      } else {
        o << "{dim: " << b.dim << ", order: [";
        for (std::size_t k = 0; k < b.order.size(); ++k) o << (k ? ", " : "") << b.order[k];
        o << "]}";
      }
    }
    o << "}\n";
  }
  if (!sp.stages.empty()) {
    o << "  stages:\n";
    for (const auto& st : sp.stages) {
      o << "    - in: " << names_list(p, st.ins) << "\n      out: " << names_list(p, st.outs) << "\n";
      print_ops(o, p, "ops", st.ops, "      ");
    }
  }
  if (!sp.merge.empty()) {
    o << "  merge: {";
    for (std::size_t i = 0; i < sp.merge.size(); ++i) {
      const MergeSpec& m = sp.merge[i];
      o << (i ? ", " : "") << p.name(m.name) << ": ";
      if (m.kind == MergeSpec::Concat) o << m.dim;
      else o << (m.kind == MergeSpec::Sum ? "sum" : "mean");
    }
    o << "}\n";
  }
}

}  // namespace

std::string print_op(const Program& p, const Op& op, int rename_in, const std::string& new_name) {
  std::ostringstream o;
  const OpInfo& info = op_info(op.kind);
  o << "{op: " << info.name;
  if (op.n_in) {
    if (rename_in < 0) {
      o << ", in: " << names_list(p, p.ins(op));
    } else {
      auto ins = p.ins(op);
      o << ", in: [";
      for (std::size_t k = 0; k < ins.size(); ++k)
        o << (k ? ", " : "") << (static_cast<int>(k) == rename_in ? new_name : p.name(ins[k]));
      o << "]";
    }
  }
  if (op.n_out == 1) o << ", out: " << p.name(p.outs(op)[0]);
  else if (op.n_out > 1) o << ", out: " << names_list(p, p.outs(op));
  for (const auto& spec : info.attrs)
    if (auto v = attr_value(p, op, spec)) o << ", " << spec.name << ": " << *v;
  o << "}";
  return o.str();
}

std::string print_program(const Program& p) {
  std::ostringstream o;
  if (!p.title.empty()) o << "name: " << p.title << "\n";
  if (!p.vars.empty()) {
    o << "sizes:\n";
    for (const auto& v : p.vars) {
      if (v.general && v.in.size() == 1) {  // a concrete size loaded as a variable (shape reduction): as it was written
        o << "  " << v.name << ": " << v.in.front() << "\n";
        continue;
      }
      o << "  " << v.name << ": {min: " << v.min << ", max: " << v.max;
      if (v.multiple_of > 1) o << ", multiple_of: " << v.multiple_of;
      if (!v.in.empty()) {
        o << ", in: [";
        for (std::size_t i = 0; i < v.in.size(); ++i) o << (i ? ", " : "") << v.in[i];
        o << "]";
      }
      o << "}\n";
    }
  }
  o << "mesh: {";
  for (std::size_t i = 0; i < p.mesh.size(); ++i) o << (i ? ", " : "") << p.mesh[i].name << ": " << p.expr_str(p.mesh[i].size);
  o << "}\n";
  if (p.local_view) o << "view: local\n";
  if (!p.tensors.empty()) {
    o << "tensors:\n";
    for (const auto& t : p.tensors) {
      o << "  " << p.name(t.name) << ": {shape: " << p.shape_str(t.shape);
      std::string pl = placements_map(p, t.placement);
      if (pl != "{}") o << ", placement: " << pl;
      if (t.dtype != DType::F32) o << ", dtype: " << dtype_name(t.dtype);
      if (t.param) o << ", param: true";
      if (t.uneven) o << ", uneven: true";
      o << "}\n";
    }
  }
  if (p.schedule.present) {
    print_schedule(o, p);
  } else if (!p.per_rank) {
    print_ops(o, p, "ops", p.ops);
  } else {
    o << "programs:\n";
    for (const auto& rp : p.programs) {
      o << "  - ranks: {";
      for (std::size_t i = 0; i < rp.selector.size(); ++i)
        o << (i ? ", " : "") << p.mesh[static_cast<std::size_t>(rp.selector[i].first)].name << ": " << rp.selector[i].second;
      o << "}\n";
      std::vector<Op> ops(p.ops.begin() + rp.first_op, p.ops.begin() + rp.first_op + rp.n_ops);
      print_ops(o, p, "ops", ops, "    ");
    }
  }
  if (p.has_p2p_model) o << "p2p_model: " << (p.p2p_model == P2PModel::Eager ? "eager" : "rendezvous") << "\n";
  if (!p.outputs.empty()) {
    o << "outputs:\n";
    for (const auto& od : p.outputs) {
      o << "  " << p.name(od.name) << ": {";
      std::string sep;
      if (od.has_placement) o << "placement: " << placements_map(p, od.placement), sep = ", ";
      if (od.has_shape) o << sep << "shape: " << p.shape_str(od.shape), sep = ", ";
      if (!od.ranks.empty()) {
        o << sep << "ranks: {";
        for (std::size_t i = 0; i < od.ranks.size(); ++i) o << (i ? ", " : "") << p.mesh[static_cast<std::size_t>(od.ranks[i].first)].name << ": " << od.ranks[i].second;
        o << "}";
      }
      o << "}\n";
    }
  }
  if (p.loss >= 0) o << "loss: " << p.name(p.loss) << "\n";
  if (p.train) o << "train: true\n";
  if (p.has_backward) print_ops(o, p, "backward", p.backward);
  if (p.has_grad_sync) print_ops(o, p, "grad_sync", p.grad_sync);
  if (p.has_optimizer) print_ops(o, p, "optimizer", p.optimizer);
  if (p.has_spec) {  // the map forms say everything the list forms can
    o << "spec:\n";
    print_ops(o, p, "ops", p.spec_ops, "  ");
    if (p.has_spec_optimizer) print_ops(o, p, "optimizer", p.spec_optimizer, "  ");
    auto links = [&](const char* key, const std::vector<Program::SpecLink>& v) {
      o << "  " << key << ": {";
      for (std::size_t i = 0; i < v.size(); ++i) o << (i ? ", " : "") << p.name(v[i].plan) << ": " << p.name(v[i].spec);
      o << "}\n";
    };
    links("outputs", p.spec_outputs);
    if (!p.lineage.empty()) links("lineage", p.lineage);
  }
  if (p.has_expect) {
    o << "expect: [";
    for (std::size_t i = 0; i < p.expect.size(); ++i) o << (i ? ", " : "") << p.expect[i];
    o << "]\n";
  }
  return o.str();
}

std::string placements_text(const Program& p, const Placements& pl, bool skip_r) {
  std::string s;
  for (int a = 0; a < p.axis_count(); ++a) {
    if (skip_r && pl[static_cast<std::size_t>(a)].is_r()) continue;
    s += (s.empty() ? "" : ", ") + p.mesh[static_cast<std::size_t>(a)].name + ": " + to_string(pl[static_cast<std::size_t>(a)]);
  }
  if (has_strided(pl.data(), p.axis_count())) {  // the shard order of each dim cut out of mesh order, one list
    std::string o;
    for (int d = 0; d < kMaxRank; ++d)
      if (std::string od = order_of_dim(p, pl, d); !od.empty()) o += (o.empty() ? "" : ", ") + od;
    s += ", order: [" + o + "]";
  }
  return s;
}

std::string axis_placement_text(const Program& p, const Placements& pl, int axis) {
  const Placement& x = pl[static_cast<std::size_t>(axis)];
  std::string s = to_string(x);
  if (x.is_s() && x.ord)
    if (std::string od = order_of_dim(p, pl, x.dim); !od.empty()) s += " (order [" + od + "])";
  return s;
}

}  // namespace spmd
