// cli/explain.cpp - per-op explanation of shapes and placements, and the layout picture of one tensor.
#include "cli/explain.h"

#include <fmt/format.h>

#include <algorithm>
#include <unordered_map>

#include "cli/layout.h"
#include "ir/op_table.h"
#include "ir/printer.h"
#include "ir/ranks.h"

namespace spmd {

namespace {

constexpr int kMaxChain = 12;  // steps of one placement's explanation

struct Walker {
  const Program& p;
  const SpatialTypes& t;
  const Explanation& e;

  const ValueType* type(ValueRef r) const {
    if (r.op == -1) return r.k < static_cast<int>(t.decls.size()) ? &t.decls[static_cast<std::size_t>(r.k)] : nullptr;
    if (r.op < 0 || static_cast<std::size_t>(r.op) >= t.out_base.size()) return nullptr;
    std::size_t i = t.out_base[static_cast<std::size_t>(r.op)] + static_cast<std::size_t>(r.k);
    return i < t.outs.size() ? &t.outs[i] : nullptr;
  }
  // The checker's record of where r's placement on axis a arose (nullptr when not recorded).
  const PlacementOrigin* origin(ValueRef r, int a) const {
    const AxisOrigins* o = nullptr;
    if (r.op == -1 && static_cast<std::size_t>(r.k) < t.decl_origins.size()) o = &t.decl_origins[static_cast<std::size_t>(r.k)];
    if (r.op >= 0 && static_cast<std::size_t>(r.op) < t.out_base.size()) {
      std::size_t i = t.out_base[static_cast<std::size_t>(r.op)] + static_cast<std::size_t>(r.k);
      if (i < t.out_origins.size()) o = &t.out_origins[i];
    }
    if (!o || !(*o)[static_cast<std::size_t>(a)].known) return nullptr;
    return &(*o)[static_cast<std::size_t>(a)];
  }
  std::string name(ValueRef r) const {
    if (r.op == -1) return p.name(p.tensors[static_cast<std::size_t>(r.k)].name);
    return p.name(p.outs(p.ops[static_cast<std::size_t>(r.op)])[static_cast<std::size_t>(r.k)]);
  }
  const ExplainOp* op_of(int op) const {
    auto it = std::lower_bound(e.ops.begin(), e.ops.end(), op, [](const ExplainOp& x, int o) { return x.op < o; });
    return it != e.ops.end() && it->op == op ? &*it : nullptr;
  }

  // One step of how value `r` came to have its placement on axis `a`: its text, and the input it kept the
  // placement from (the next step), if any.
  WhyStep step(ValueRef r, int a) const {
    WhyStep w;
    const ValueType* vt = type(r);
    if (!vt) return w;
    Placement pl = vt->pl[static_cast<std::size_t>(a)];
    if (r.op == -1) {
      const TensorDecl& d = p.tensors[static_cast<std::size_t>(r.k)];
      bool written = d.placement_loc.line != d.loc.line || d.placement_loc.col != d.loc.col;
      w.text = fmt::format("{} {} at line {}", name(r), written ? "declared " + axis_placement_text(p, vt->pl, a) : "R by default", d.loc.line);
      w.brief = fmt::format("{} at line {}", written ? "declared" : "R by default", d.loc.line);
      return w;
    }
    const Op& op = p.ops[static_cast<std::size_t>(r.op)];
    const ExplainOp* eo = op_of(r.op);
    // The input it kept the placement from, if one has the same placement on this axis.
    std::optional<ValueRef> from;
    std::string ins, from_name;
    if (eo)
      for (std::size_t i = 0; i < eo->in_refs.size(); ++i) {
        const ValueType* it = eo->in_refs[i].op >= -1 ? type(eo->in_refs[i]) : nullptr;
        if (!it || !it->ok) continue;
        ins += fmt::format("{}{} {}", ins.empty() ? "" : ", ", eo->ins[i], axis_placement_text(p, it->pl, a));
        if (!from && it->pl[static_cast<std::size_t>(a)] == pl) from = eo->in_refs[i], from_name = eo->ins[i];
      }
    std::string at = fmt::format("{} (line {})", op_name(op.kind), op.loc.line);
    if (from && !(pl.is_r())) {
      w.text = fmt::format("{} {} via {}", name(r), axis_placement_text(p, vt->pl, a), at);
      w.brief = "via " + at;
      w.from = *from;
      w.from_name = from_name;
      return w;
    }
    w.text = fmt::format("{} became {} at {}{}", name(r), axis_placement_text(p, vt->pl, a), at, ins.empty() ? "" : " from " + ins);
    w.brief = fmt::format("arose at {}{}", at, ins.empty() ? "" : " from " + ins);
    // The rule's own reason, when the checker recorded that the placement arose at this op.
    if (const PlacementOrigin* o = origin(r, a); o && !o->why.empty() && o->loc.line == op.loc.line && o->loc.col == op.loc.col) {
      w.text += ": " + o->why;
      w.brief += ": " + o->why;
    }
    return w;
  }

  // The whole chain, newest step first.
  std::string chain(ValueRef r, int a) const {
    std::string s;
    for (int k = 0; k < kMaxChain; ++k) {
      WhyStep w = step(r, a);
      if (w.text.empty()) return s;
      s += (s.empty() ? "" : " <- ") + w.text;
      if (!w.from) return s;
      r = *w.from;
    }
    return s + " <- ...";
  }
};

std::string bold(const std::string& s, bool color) { return color ? "\x1b[1m" + s + "\x1b[0m" : s; }
std::string red(const std::string& s, bool color) { return color ? "\x1b[1;31m" + s + "\x1b[0m" : s; }

std::string value_line(const Program& p, const SpatialTypes& t, const ExplainValue& v, std::size_t name_w, bool color) {
  if (!v.type || !v.type->ok) return fmt::format("  {:<{}}  (no type: undefined, or an earlier error)\n", v.name, name_w);
  std::string shape = "[";
  for (int d = 0; d < v.type->rank; ++d) shape += (d ? ", " : "") + t.exprs.str(v.type->shape[static_cast<std::size_t>(d)], p.vars);
  shape += "]";
  std::string zz = zigzag_text(p, *v.type);
  std::string s = fmt::format("  {:<{}}  {} {}  {}{}  local {}\n", bold(v.name, color), name_w + (color ? 8 : 0), shape, dtype_name(v.type->dtype),
                              placements_text(p, v.type->pl), zz.empty() ? "" : "  " + zz, local_shape(p, t.exprs, *v.type));
  for (const auto& w : v.why) s += fmt::format("  {:<{}}    why {}\n", "", name_w, w);
  return s;
}

}  // namespace

Explanation explain_program(const Program& p, const SpatialTypes& types) {
  Explanation e;
  for (std::size_t i = 0; i < p.tensors.size(); ++i) {
    ExplainValue v{p.name(p.tensors[i].name), {-1, static_cast<int>(i)}, i < types.decls.size() ? &types.decls[i] : nullptr, {}, {}};
    e.decls.push_back(std::move(v));
  }
  std::unordered_map<NameId, ValueRef> base;
  for (std::size_t i = 0; i < p.tensors.size(); ++i) base[p.tensors[i].name] = {-1, static_cast<int>(i)};
  for (const RankProgram& rp : rank_programs(p)) {
    auto env = base;
    for (std::uint32_t i = rp.first_op; i < rp.first_op + rp.n_ops && i < p.ops.size(); ++i) {
      const Op& op = p.ops[i];
      ExplainOp eo;
      eo.op = static_cast<int>(i);
      for (NameId n : p.ins(op)) {
        eo.ins.push_back(p.name(n));
        auto it = env.find(n);
        eo.in_refs.push_back(it == env.end() ? ValueRef{-2, 0} : it->second);
      }
      int k = 0;
      for (NameId n : p.outs(op)) {
        ValueRef r{static_cast<int>(i), k};
        const ValueType* vt = nullptr;
        if (i < types.out_base.size() && types.out_base[i] + static_cast<std::size_t>(k) < types.outs.size()) vt = &types.outs[types.out_base[i] + static_cast<std::size_t>(k)];
        eo.outs.push_back({p.name(n), r, vt, {}, {}});
        env[n] = r;
        ++k;
      }
      e.ops.push_back(std::move(eo));
    }
  }
  std::sort(e.ops.begin(), e.ops.end(), [](const ExplainOp& a, const ExplainOp& b) { return a.op < b.op; });
  Walker w{p, types, e};
  auto fill = [&](ExplainValue& v) {
    if (!v.type || !v.type->ok) return;
    for (int a = 0; a < p.axis_count(); ++a)
      if (!v.type->pl[static_cast<std::size_t>(a)].is_r()) {
        std::string head = fmt::format("{} {}", p.mesh[static_cast<std::size_t>(a)].name, axis_placement_text(p, v.type->pl, a));
        v.why.push_back(head + ": " + w.chain(v.ref, a));
        WhyStep first = w.step(v.ref, a);
        first.text = head;  // the report writes "tp S(1)", the brief step, and a link to the input's own row
        v.why_step.push_back(std::move(first));
      }
  };
  for (auto& v : e.decls) fill(v);
  for (auto& o : e.ops)
    for (auto& v : o.outs) fill(v);
  return e;
}

std::string explain_text(const std::string& file, const Program& p, const SpatialTypes& t, const Explanation& e, const std::vector<Diagnostic>& diags,
                         const ExplainFilter& f, bool color) {
  std::string mesh;
  for (const auto& ax : p.mesh) mesh += fmt::format("{}{}: {}", mesh.empty() ? "" : ", ", ax.name, p.exprs.str(ax.size, p.vars));
  std::string s = fmt::format("{}: mesh {{{}}}, {} ops\n", file, mesh, p.ops.size());
  std::size_t w = 4;
  for (const auto& v : e.decls) w = std::max(w, v.name.size());
  for (const auto& o : e.ops)
    for (const auto& v : o.outs) w = std::max(w, v.name.size());
  auto diag_lines = [&](int op) {
    std::string d;
    for (const auto& x : diags)
      if (x.op == op) d += fmt::format("    {}: {}\n", red(fmt::format("error[{}]", check_name(x.id)), color), x.message);
    return d;
  };
  auto op_block = [&](const ExplainOp& o) {
    const Op& op = p.ops[static_cast<std::size_t>(o.op)];
    std::string ins;
    for (const auto& n : o.ins) ins += (ins.empty() ? "" : ", ") + n;
    std::string outs;
    for (const auto& v : o.outs) outs += (outs.empty() ? "" : ", ") + v.name;
    std::string r = bold(fmt::format("op {} (line {}): {}({}){}", o.op, op.loc.line, op_name(op.kind), ins, outs.empty() ? "" : " -> " + outs), color) + "\n";
    for (const auto& v : o.outs) r += value_line(p, t, v, w, color);
    return r + diag_lines(o.op);
  };
  if (f.op) {
    if (*f.op < 0 || static_cast<std::size_t>(*f.op) >= p.ops.size())
      throw LoadError({}, fmt::format("--op {}: the program has ops 0..{}", *f.op, p.ops.size() ? p.ops.size() - 1 : 0));
    for (const auto& o : e.ops)
      if (o.op == *f.op) {
        s += op_block(o);
        s += "  inputs:\n";
        Walker wk{p, t, e};
        for (std::size_t i = 0; i < o.in_refs.size(); ++i) {
          if (o.in_refs[i].op < -1) {
            s += fmt::format("  {:<{}}  (undefined)\n", o.ins[i], w);
            continue;
          }
          ExplainValue v{o.ins[i], o.in_refs[i], wk.type(o.in_refs[i]), {}, {}};
          const ExplainValue* src = nullptr;
          if (v.ref.op == -1) src = &e.decls[static_cast<std::size_t>(v.ref.k)];
          else if (const ExplainOp* d = wk.op_of(v.ref.op)) src = &d->outs[static_cast<std::size_t>(v.ref.k)];
          s += value_line(p, t, src ? *src : v, w, color);
        }
      }
    return s;
  }
  if (!f.tensor.empty()) {
    const ExplainValue* last = nullptr;
    std::string found;
    for (const auto& v : e.decls)
      if (v.name == f.tensor) last = &v, found += "declared:\n" + value_line(p, t, v, w, color);
    for (const auto& o : e.ops)
      for (const auto& v : o.outs)
        if (v.name == f.tensor) last = &v, found += op_block(o);
    if (!last) {
      std::vector<std::string> names;
      for (const auto& v : e.decls) names.push_back(v.name);
      for (const auto& o : e.ops)
        for (const auto& v : o.outs) names.push_back(v.name);
      auto dym = did_you_mean(f.tensor, names);
      throw LoadError({}, fmt::format("--tensor {}: no declaration or op output has this name{}", f.tensor, dym ? "; did you mean '" + *dym + "'?" : ""));
    }
    s += found + "\n";
    if (last->type && last->type->ok) s += layout_text(tensor_layout(p, t.exprs, *last->type, last->name), color);
    return s;
  }
  if (!e.decls.empty()) s += bold("declared", color) + "\n";
  for (const auto& v : e.decls) s += value_line(p, t, v, w, color);
  s += diag_lines(-1);
  for (const auto& o : e.ops) s += op_block(o);
  return s;
}

}  // namespace spmd
