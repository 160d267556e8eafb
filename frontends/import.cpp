// frontends/import.cpp - import_program: reads the sequential and the ranks' graphs, relates their inputs, lowers
// both through the op tables and writes one spmdcheck program (plan + spec).
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>

#include "frontends/custom_ops.h"
#include "frontends/dims.h"
#include "frontends/frontends.h"
#include "frontends/lower.h"
#include "frontends/relation.h"
#include "ir/source_file.h"

namespace spmd::frontends {

namespace {

namespace fs = std::filesystem;

constexpr std::size_t kMaxGraphBytes = std::size_t{256} << 20;
constexpr std::size_t kMaxRanks = 1024;

std::string read_text(const std::string& path) {
  try {
    return read_input_file(path, kMaxGraphBytes);
  } catch (const std::exception& e) {
    throw ImportError(path, {}, e.what());
  }
}

// The graph files of a folder, in rank order: FX dumps are <kind>.g<gid>.r<rank>.py (or one .py file), HLO dumps
// one .hlo file (an SPMD module: one program for every device).
std::vector<std::string> graph_files(const std::string& path, const std::string& format, const std::string& sel, const char* role) {
  std::error_code ec;
  if (!fs::exists(path, ec)) throw ImportError(path, {}, std::string("the ") + role + " folder does not exist");
  if (!fs::is_directory(path, ec)) return {path};
  std::string ext = format == "hlo" ? ".hlo" : ".py";
  std::vector<std::string> all;
  for (const auto& e : fs::directory_iterator(path, ec))
    if (e.is_regular_file() && e.path().extension() == ext) all.push_back(e.path().string());
  std::sort(all.begin(), all.end());
  if (all.empty()) throw ImportError(path, {}, std::string("no ") + (format == "hlo" ? ".hlo" : ".py") + " graph dump in the " + role + " folder");
  if (format == "hlo") {
    if (all.size() > 1) throw ImportError(path, {}, "the " + std::string(role) + " folder holds several .hlo modules; name one file instead");
    return all;
  }
  static const std::regex re(R"(^(.*)\.g(\d+)\.r(\d+)\.py$)");
  std::map<std::string, std::map<int, std::string>> groups;  // kind.gN -> rank -> file
  std::vector<std::string> loose;
  for (const auto& f : all) {
    std::smatch m;
    std::string name = fs::path(f).filename().string();
    if (std::regex_match(name, m, re) && (m[2].length() > 6 || m[3].length() > 6)) throw ImportError(f, {}, "graph or rank number out of range in the file name");
    if (std::regex_match(name, m, re)) groups[m[1].str() + ".g" + m[2].str()][std::stoi(m[3].str())] = f;
    else loose.push_back(f);
  }
  if (groups.empty()) {
    if (loose.size() == 1) return loose;
    throw ImportError(path, {}, "the " + std::string(role) + " folder holds several .py files that are not named <kind>.g<N>.r<rank>.py; name one file instead");
  }
  std::vector<std::string> keys;
  for (const auto& [k, v] : groups) {
    std::string kind = k.substr(0, k.rfind(".g"));
    if (sel.empty() || sel == k || sel == kind) keys.push_back(k);
  }
  if (keys.size() > 1 && sel.find(".g") == std::string::npos) {  // several graph ids: the first (g0) is the model
    std::string kind = keys[0].substr(0, keys[0].rfind(".g"));
    bool one_kind = std::all_of(keys.begin(), keys.end(), [&](const std::string& k) { return k.substr(0, k.rfind(".g")) == kind; });
    if (one_kind) keys.resize(1);
  }
  if (keys.empty()) throw ImportError(path, {}, "no graph '" + sel + "' in the " + std::string(role) + " folder");
  if (keys.size() > 1) {
    std::string list;
    for (const auto& k : keys) list += (list.empty() ? "" : ", ") + k;
    throw ImportError(path, {}, "the " + std::string(role) + " folder holds several graphs (" + list + "): choose one with --graph (e.g. --graph " + keys[0] + ")");
  }
  const auto& ranks = groups[keys[0]];
  std::vector<std::string> out;
  for (const auto& [r, f] : ranks) {
    if (r != static_cast<int>(out.size())) throw ImportError(path, {}, "rank " + std::to_string(out.size()) + " of graph " + keys[0] + " is missing from the " + role + " folder");
    out.push_back(f);
  }
  if (out.size() > kMaxRanks) throw ImportError(path, {}, "more than 1024 ranks");
  return out;
}

Graph parse(const std::string& file, const std::string& format) {
  std::string text = read_text(file);
  return format == "hlo" ? parse_hlo(text, file) : parse_fx(text, file);
}

// ---- aligning the ranks' graphs ---------------------------------------------------------------------

struct Aligner {
  const std::vector<Graph>& gs;
  std::string axis;
  std::string why;  // why the graphs are not one local-view program

  std::string affine(const std::vector<std::int64_t>& v) {
    std::int64_t a = v[0], b = v.size() > 1 ? v[1] - v[0] : 0;
    for (std::size_t r = 0; r < v.size(); ++r)
      if (v[r] != a + b * static_cast<std::int64_t>(r)) return {};
    std::string ix = "axis_index(" + axis + ")";
    std::string bt = b == 1 ? ix : b == -1 ? "-" + ix : std::to_string(b) + "*" + ix;
    if (a == 0) return bt;
    return b < 0 ? std::to_string(a) + " - " + (b == -1 ? ix : std::to_string(-b) + "*" + ix) : std::to_string(a) + " + " + bt;
  }

  // Compares the k-th value of every rank; integers that differ become an affine expression in the first.
  bool same(PyVal& v0, const std::vector<const PyVal*>& vs, const std::string& where) {
    for (const PyVal* v : vs)
      if (v->k != v0.k || v->items.size() != v0.items.size() || v->kw.size() != v0.kw.size()) return why = where + ": different arguments", false;
    if (v0.k == PyVal::K::Int) {
      std::vector<std::int64_t> xs = {v0.i};
      bool differ = false;
      for (const PyVal* v : vs) xs.push_back(v->i), differ |= v->i != v0.i;
      if (differ) {
        v0.expr = affine(xs);
        if (v0.expr.empty()) return why = where + ": an integer that is not affine in the rank", false;
      }
      return true;
    }
    for (const PyVal* v : vs) {
      bool eq = v->s == v0.s && v->b == v0.b && (v->f == v0.f || (v->f != v->f && v0.f != v0.f));
      if (!eq) return why = where + ": a value that differs between ranks (" + (v0.k == PyVal::K::Str ? "'" + v0.s + "'" : v0.s) + ")", false;
    }
    for (std::size_t i = 0; i < v0.items.size(); ++i) {
      std::vector<const PyVal*> sub;
      for (const PyVal* v : vs) sub.push_back(&v->items[i]);
      if (!same(v0.items[i], sub, where)) return false;
    }
    for (std::size_t i = 0; i < v0.kw.size(); ++i) {
      std::vector<const PyVal*> sub;
      for (const PyVal* v : vs) {
        if (v->kw[i].first != v0.kw[i].first) return why = where + ": different keyword arguments", false;
        sub.push_back(&v->kw[i].second);
      }
      if (!same(v0.kw[i].second, sub, where)) return false;
    }
    return true;
  }

  std::optional<Graph> run() {
    Graph g = gs[0];
    for (std::size_t r = 1; r < gs.size(); ++r) {
      const Graph& h = gs[r];
      if (h.inputs.size() != g.inputs.size() || h.nodes.size() != g.nodes.size()) return why = "the ranks' graphs have different numbers of inputs or nodes", std::nullopt;
      for (std::size_t i = 0; i < g.inputs.size(); ++i)
        if (h.inputs[i].name != g.inputs[i].name || h.inputs[i].type->shape != g.inputs[i].type->shape)
          return why = "input " + g.inputs[i].name + " differs between ranks (uneven shards?)", std::nullopt;
    }
    for (std::size_t k = 0; k < g.nodes.size(); ++k) {
      Node& n = g.nodes[k];
      std::string where = "node " + n.name;
      for (std::size_t r = 1; r < gs.size(); ++r) {
        const Node& m = gs[r].nodes[k];
        if (m.name != n.name || m.target != n.target || m.args.size() != n.args.size() || m.kwargs.size() != n.kwargs.size())
          return why = "node " + n.name + " of rank 0 is " + m.name + " (" + m.target + ") on rank " + std::to_string(r), std::nullopt;
        if ((m.type.has_value() != n.type.has_value()) || (m.type && m.type->shape != n.type->shape))
          return why = where + ": a shape that differs between ranks", std::nullopt;
      }
      for (std::size_t i = 0; i < n.args.size(); ++i) {
        std::vector<const PyVal*> vs;
        for (std::size_t r = 1; r < gs.size(); ++r) vs.push_back(&gs[r].nodes[k].args[i]);
        if (!same(n.args[i], vs, where)) return std::nullopt;
      }
      for (std::size_t i = 0; i < n.kwargs.size(); ++i) {
        std::vector<const PyVal*> vs;
        for (std::size_t r = 1; r < gs.size(); ++r) {
          if (gs[r].nodes[k].kwargs[i].first != n.kwargs[i].first) return why = where + ": different keyword arguments", std::nullopt;
          vs.push_back(&gs[r].nodes[k].kwargs[i].second);
        }
        if (!same(n.kwargs[i].second, vs, where)) return std::nullopt;
      }
    }
    return g;
  }
};

// ---- writing YAML -----------------------------------------------------------------------------------

std::string quoted(const std::string& s) {
  std::string o = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') o += '\\';
    if (c == '\n') {
      o += "\\n";
      continue;
    }
    o += c;
  }
  return o + "\"";
}

std::string scalar_text(const std::string& v) {
  if (v.empty()) return "''";
  if (v.front() == '[') return v;
  if (v.find_first_of(" :#,{}&*!|>'\"%@`") != std::string::npos) return "'" + v + "'";
  return v;
}

std::string names_text(const std::vector<std::string>& ns) {
  if (ns.size() == 1) return ns[0];
  std::string s = "[";
  for (std::size_t i = 0; i < ns.size(); ++i) s += (i ? ", " : "") + ns[i];
  return s + "]";
}

void write_ops(std::ostringstream& o, const std::vector<EOp>& ops, const char* indent) {
  for (const auto& e : ops) {
    o << indent << "- {op: " << e.op;
    if (!e.in.empty()) o << ", in: " << (e.in.size() == 1 ? e.in[0] : names_text(e.in));
    if (!e.out.empty()) o << ", out: " << names_text(e.out);
    for (const auto& [k, v] : e.attrs) o << ", " << k << ": " << scalar_text(v);
    if (!e.at.empty()) o << ", at: " << quoted(e.at);
    o << "}\n";
  }
}

std::string shape_yaml(const std::vector<std::int64_t>& s) { return ints_text(s); }

// The process group argument of a collective node (FX: `group_name`, its last string argument), or null.
PyVal* group_arg(Node& n) {
  if (n.target.rfind("_c10d_functional.", 0) != 0 || n.target == "_c10d_functional.wait_tensor.default") return nullptr;
  for (auto& [k, v] : n.kwargs)
    if (k == "group_name" && v.k == PyVal::K::Str) return &v;
  for (auto it = n.args.rbegin(); it != n.args.rend(); ++it)
    if (it->k == PyVal::K::Str) return &*it;
  return nullptr;
}

std::set<std::string> group_names(Graph& g) {
  std::set<std::string> out;
  for (auto& n : g.nodes)
    if (PyVal* a = group_arg(n)) out.insert(a->s);
  return out;
}

}  // namespace

ImportResult import_program(const ImportOptions& opt) {
  Relation rel;
  if (!opt.relation.empty()) rel = load_relation(opt.relation);
  std::string sel = opt.graph.empty() ? rel.graph : opt.graph;
  auto seq_files = graph_files(opt.seq, opt.format, sel, "sequential");
  if (seq_files.size() != 1) throw ImportError(opt.seq, {}, "the sequential folder holds " + std::to_string(seq_files.size()) + " ranks' graphs; it must hold one");
  auto rank_files = graph_files(opt.ranks, opt.format, sel, "ranks'");
  Graph seq = parse(seq_files[0], opt.format);
  std::vector<Graph> ranks;
  for (const auto& f : rank_files) ranks.push_back(parse(f, opt.format));
  std::size_t n_ranks = ranks.size();
  if (opt.format == "hlo") {  // one SPMD module: its replica groups give the number of devices
    std::size_t n = 1;
    for (const auto& g : ranks[0].replica_groups) n = std::max(n, g.size());
    n = std::max(n, static_cast<std::size_t>(ranks[0].devices));
    if (rel.devices && n > 1 && static_cast<std::size_t>(rel.devices) != n)
      throw ImportError(rel.file, {}, "`devices: " + std::to_string(rel.devices) + "` contradicts the module, whose collectives or header name " + std::to_string(n) + " devices");
    if (rel.devices) n = static_cast<std::size_t>(rel.devices);
    n_ranks = n;
    ranks.resize(1);
  }

  // Cuts: a node of each graph becomes an input (its annotated type), named as in the sequential graph.
  std::map<std::string, std::string> cut_ir;  // ranks' node -> the sequential name
  auto cut_node = [&](Graph& g, const std::string& name, const Loc& at) {
    for (auto it = g.nodes.begin(); it != g.nodes.end(); ++it)
      if (it->name == name) {
        if (!it->type || !it->type->symbolic.empty())
          throw ImportError(rel.file, at, "node " + name + " of " + g.file + " has no static type annotation, so it cannot be cut");
        Node in = *it;
        in.target = "placeholder";
        in.args.clear(), in.kwargs.clear();
        g.inputs.push_back(std::move(in));
        g.nodes.erase(it);
        return;
      }
    throw ImportError(rel.file, at, "the cut '" + name + "' is not a node of " + g.file);
  };
  for (const auto& [s, c] : rel.cuts) {
    cut_node(seq, s, c.loc);
    for (auto& g : ranks) cut_node(g, c.ranks, c.loc);
    if (c.ranks != s) cut_ir[c.ranks] = s;
    if (!c.placement.empty()) rel.placements[s] = c.placement, rel.placement_locs[s] = c.loc;
  }

  CustomOps custom = default_custom_ops();
  for (const auto& f : opt.ops_files) custom.load_file(f);

  // ---- mesh and process groups ----
  std::set<std::string> groups;
  for (auto& g : ranks)
    for (const auto& n : group_names(g)) groups.insert(n);
  std::size_t unmapped = 0;
  for (const auto& gname : groups) unmapped += !rel.groups.count(gname);
  if (unmapped > 1) {
    std::string list;
    for (const auto& gname : groups) list += (list.empty() ? "'" : ", '") + gname + "'";
    throw ImportError(rank_files[0], {}, "the ranks' graphs use process groups " + list + ": name the mesh axis of each in a relation file (groups: {'" + *groups.begin() + "': tp, ...})");
  }
  std::string axis = rel.axis;
  for (const auto& [gname, ax] : rel.groups) {
    const std::string& on = ax;  // (a structured binding is not captured by clang 14's lambdas)
    bool known = ax == axis || std::any_of(rel.extra_axes.begin(), rel.extra_axes.end(), [&](const auto& e) { return e.first == on; });
    if (!known) throw ImportError(rel.file, {}, "process group '" + gname + "' is on mesh axis '" + ax + "', which is neither `axis` (" + axis + ") nor in `axes:`");
  }
  // Collectives name their axis from here on: ranks may call one axis' groups differently (each rank's own
  // data-parallel group), and the local-view plan needs the same op on every rank.
  for (auto& g : ranks)
    for (auto& n : g.nodes)
      if (PyVal* a = group_arg(n)) {
        auto it = rel.groups.find(a->s);
        a->s = "axis:" + (it == rel.groups.end() ? axis : it->second);
      }

  // ---- inputs: the sequential graph's, with their placements on the ranks ----
  std::map<std::string, std::vector<std::vector<std::int64_t>>> local;  // rank input -> its shape on each rank
  for (const auto& g : ranks)
    for (const auto& in : g.inputs) {
      auto c = cut_ir.find(in.name);
      if (!rel.rank_inputs.count(in.name)) local[c == cut_ir.end() ? in.name : c->second].push_back(in.type->shape);  // (a relation's rank input is cut from a sequential one)
    }
  if (opt.format == "hlo")
    for (auto& [k, v] : local) v.assign(n_ranks, v[0]);
  std::map<std::string, const Node*> seq_inputs;
  for (const auto& in : seq.inputs) seq_inputs[in.name] = &in;
  std::map<std::string, std::string> placement;
  // fused weights sharded block by block: the ranks' input is cut from the whole sequential one
  std::map<std::string, const Blocked*> blocked;
  for (const auto& in : seq.inputs) {
    auto l = local.find(in.name);
    for (const auto& b : rel.blocked)
      if (b.shape == in.type->shape && l != local.end()) {
        std::int64_t want = 0;
        for (auto s : b.sizes) want += s / static_cast<std::int64_t>(n_ranks);
        for (const auto& ls : l->second)
          if (ls.size() != b.shape.size() || ls[static_cast<std::size_t>(b.dim)] != want)
            throw ImportError(rel.file, b.loc, "input " + in.name + " has the blocked shape, but the ranks hold " + shape_text(ls) + " of it, not a chunk of each block");
        blocked[in.name] = &b;
      }
  }
  for (const auto& in : seq.inputs) {
    auto given = rel.placements.find(in.name);
    auto l = local.find(in.name);
    if (blocked.count(in.name)) {
      placement[in.name] = "R";  // every rank reads it whole and cuts its blocks
      continue;
    }
    if (given != rel.placements.end()) {
      placement[in.name] = given->second;
      if (l != local.end() && given->second.rfind("S(", 0) == 0) {  // the given shard must fit the ranks' shapes
        int d = std::stoi(given->second.substr(2));
        auto want = infer_placement(in.type->shape, l->second);
        if (d < 0 || d >= static_cast<int>(in.type->shape.size()) || (want && *want != given->second))
          throw ImportError(rel.file, rel.placement_locs[in.name],
                            "placement " + given->second + " of " + in.name + " does not fit its shapes: " + type_text(*in.type) + " in the sequential graph, " +
                                shape_text(l->second[0]) + " on rank 0");
      }
      continue;
    }
    if (l == local.end()) {
      placement[in.name] = "R";  // the ranks do not read it
      continue;
    }
    auto p = infer_placement(in.type->shape, l->second);
    if (!p) {
      std::string shapes;
      for (std::size_t r = 0; r < l->second.size() && r < 4; ++r) shapes += (r ? ", " : "") + shape_text(l->second[r]);
      throw ImportError(seq.file, in.loc,
                        "cannot infer how input " + in.name + " relates to the ranks' inputs: it is " + type_text(*in.type) + " here and " + shapes +
                            (l->second.size() > 4 ? ", ..." : "") + " on the ranks, which is neither equal (R) nor one dim cut into " + std::to_string(n_ranks) +
                            " chunks (S(d)); give its placement in a relation file (inputs: {" + in.name + ": S(0)}) or define the ranks' input (rank_inputs:)");
    }
    placement[in.name] = *p;
  }
  std::map<std::string, std::string> rank_input_ir;  // ranks' inputs defined by the relation -> IR name
  for (const auto& in : ranks[0].inputs) {
    if (blocked.count(in.name)) {
      rank_input_ir[in.name] = in.name + "~r";
      continue;
    }
    if (cut_ir.count(in.name)) {
      rank_input_ir[in.name] = cut_ir[in.name];
      continue;
    }
    if (rel.rank_inputs.count(in.name)) {
      const RankInput& ri = rel.rank_inputs[in.name];
      if (!seq_inputs.count(ri.of)) throw ImportError(rel.file, ri.loc, "rank input " + in.name + " is a slice of '" + ri.of + "', which is not an input of the sequential graph");
      rank_input_ir[in.name] = in.name + "~r";
      continue;
    }
    if (!seq_inputs.count(in.name))
      throw ImportError(ranks[0].file, in.loc,
                        "the ranks' input " + in.name + " has no input of the same name in the sequential graph: say how it relates in a relation file (rank_inputs: {" +
                            in.name + ": {slice: SEQ_INPUT, dim: 0, start: A, end: B}})");
  }

  // ---- outputs compared ----
  std::vector<std::pair<std::string, std::string>> outs = rel.outputs;
  if (outs.empty() && opt.format == "hlo") {  // default (HLO): every value the module returns, by position
    if (seq.outputs.size() != ranks[0].outputs.size())
      throw ImportError(ranks[0].file, ranks[0].return_loc,
                        "the module returns " + std::to_string(ranks[0].outputs.size()) + " values and the sequential one " + std::to_string(seq.outputs.size()) +
                            ": name the compared ones in the relation file (outputs: {SEQ: RANKS})");
    for (std::size_t i = 0; i < seq.outputs.size(); ++i)
      if (seq.outputs[i].k == PyVal::K::Name && ranks[0].outputs[i].k == PyVal::K::Name) outs.emplace_back(seq.outputs[i].s, ranks[0].outputs[i].s);
  }
  if (outs.empty()) {  // default (FX): the first value each graph returns (the rest are saved for the backward)
    auto first = [](const Graph& g) -> std::string {
      for (const auto& v : g.outputs)
        if (v.k == PyVal::K::Name) return v.s;
      throw ImportError(g.file, g.return_loc, "the graph returns no tensor");
    };
    outs.emplace_back(first(seq), first(ranks[0]));
  }
  auto defined = [](const Graph& g, const std::string& n) {
    for (const auto& x : g.inputs)
      if (x.name == n) return true;
    for (const auto& x : g.nodes)
      if (x.name == n) return true;
    return false;
  };
  for (const auto& [s, r] : outs) {
    if (!defined(seq, s)) throw ImportError(rel.file.empty() ? seq.file : rel.file, rel.outputs_loc, "output '" + s + "' is not a value of the sequential graph " + seq.file);
    if (!defined(ranks[0], r)) throw ImportError(rel.file.empty() ? ranks[0].file : rel.file, rel.outputs_loc, "output '" + r + "' is not a value of the ranks' graph " + ranks[0].file);
  }

  // ---- lowering ----
  LowerOptions so;
  so.prefix = "seq_";
  so.default_axis = axis;
  so.constants = rel.constants;
  so.default_constant = rel.default_constant;
  so.custom = &custom;
  so.graph_label = seq.file;
  // With cuts, only what the compared outputs need is imported: the collectives above a cut are not checked.
  so.keep_collectives = rel.cuts.empty();
  for (const auto& [s, r] : outs) so.roots.push_back(s);
  Lowered spec = lower_graph(seq, so);

  LowerOptions po = so;
  po.prefix.clear();
  po.groups = rel.groups;
  po.default_axis = unmapped || opt.format == "hlo" ? axis : "";  // (an HLO module's replica groups are the ranks)
  po.roots.clear();
  for (const auto& [s, r] : outs) po.roots.push_back(r);
  po.input_ir = rank_input_ir;
  ImportResult res;
  res.ranks = n_ranks;
  std::vector<Lowered> plans;
  std::vector<EOp> prologue;  // the relation's rank inputs, cut from the sequential inputs
  std::vector<EOp> spec_blocks;  // the same blocks in the spec, every rank's in rank order (what the ranks' input reads as S(d))
  for (const auto& [name, ir] : rank_input_ir) {
    if (auto b = blocked.find(name); b != blocked.end()) {  // rank r: chunk r of each block, concatenated
      std::vector<std::string> parts;
      std::int64_t at = 0, n = static_cast<std::int64_t>(n_ranks);
      const std::string dim = std::to_string(b->second->dim);
      for (std::size_t k = 0; k < b->second->sizes.size(); ++k) {
        std::int64_t len = b->second->sizes[k] / n;
        std::string ix = "axis_index(" + axis + ")";
        std::string lo = std::to_string(at) + " + " + std::to_string(len) + "*" + ix, hi = std::to_string(at + len) + " + " + std::to_string(len) + "*" + ix;
        parts.push_back(name + "~b" + std::to_string(k));
        prologue.push_back({"Slice", {name}, {parts.back()}, {{"dim", dim}, {"start", lo}, {"end", hi}}, ""});
        at += b->second->sizes[k];
      }
      prologue.push_back({"Concat", parts, {ir}, {{"dim", dim}}, ""});
      // in the spec: [Q0 K0 V0 | Q1 K1 V1 | ...], so localization finds the ranks' input matched (read as S(d)) and
      // blames the first op after it that goes wrong
      if (n_ranks <= 8 && b->second->sizes.size() <= 8) {
        std::vector<std::string> whole;  // block k whole (what the ranks' chunks of it read as S(d))
        std::int64_t a = 0;
        for (std::size_t k = 0; k < b->second->sizes.size(); ++k) {
          whole.push_back("seq_" + name + "~b" + std::to_string(k));
          spec_blocks.push_back({"Slice", {name}, {whole.back()}, {{"dim", dim}, {"start", std::to_string(a)}, {"end", std::to_string(a + b->second->sizes[k])}}, ""});
          a += b->second->sizes[k];
        }
        std::vector<std::string> ranks_parts;
        for (std::int64_t r = 0; r < n; ++r) {
          std::vector<std::string> ps;
          for (std::size_t k = 0; k < b->second->sizes.size(); ++k) {
            std::int64_t len = b->second->sizes[k] / n;
            ps.push_back("seq_" + name + "~b" + std::to_string(k) + "_" + std::to_string(r));
            spec_blocks.push_back({"Slice", {whole[k]}, {ps.back()}, {{"dim", dim}, {"start", std::to_string(len * r)}, {"end", std::to_string(len * (r + 1))}}, ""});
          }
          ranks_parts.push_back("seq_" + name + "~r" + std::to_string(r));
          spec_blocks.push_back({"Concat", ps, {ranks_parts.back()}, {{"dim", dim}}, ""});
        }
        spec_blocks.push_back({"Concat", ranks_parts, {"seq_" + name + "~blocks"}, {{"dim", dim}}, ""});
      }
      continue;
    }
    if (!rel.rank_inputs.count(name)) continue;  // a cut: an input of its own
    const RankInput& ri = rel.rank_inputs[name];
    prologue.push_back({"Slice", {ri.of}, {ir}, {{"dim", std::to_string(ri.dim)}, {"start", std::to_string(ri.start)}, {"end", std::to_string(ri.end)}}, ""});
  }
  std::string not_local;
  if (n_ranks == 1 || opt.format == "hlo") {
    po.local_view = true;
    po.graph_label = ranks[0].file;
    plans.push_back(lower_graph(ranks[0], po));
  } else {
    Aligner al{ranks, axis, {}};
    auto merged = al.run();
    if (merged) {
      po.local_view = true;
      po.graph_label = ranks[0].file;
      try {
        plans.push_back(lower_graph(*merged, po));
      } catch (const RankVarying& e) {
        not_local = e.what();
      }
    } else {
      not_local = al.why;
    }
    if (plans.empty()) {
      res.local_view = false;
      for (const auto& g : ranks) {
        po.graph_label = g.file;
        plans.push_back(lower_graph(g, po));
      }
    }
  }

  // ---- outputs: which plan value is compared with which spec value, read by which placement ----
  struct Out {
    std::string plan, spec, placement;
  };
  std::vector<Out> links;
  std::set<std::string> seen;
  for (const auto& [s, r] : outs) {
    const Value& sv = spec.values.at(s);
    std::string plan_name = plans[0].values.at(r).ir;
    for (const auto& p : plans)
      if (p.values.at(r).ir != plan_name) throw ImportError(rank_files[0], {}, "output '" + r + "' is a different value on different ranks");
    if (!seen.insert(plan_name).second) continue;
    std::vector<std::vector<std::int64_t>> ls;
    for (std::size_t k = 0; k < n_ranks; ++k) ls.push_back(plans[plans.size() == 1 ? 0 : k].values.at(r).type.shape);
    auto pl = infer_placement(sv.type.shape, ls);
    if (!pl)
      throw ImportError(rel.file.empty() ? ranks[0].file : rel.file, rel.outputs_loc,
                        "cannot relate output '" + r + "' (" + shape_text(ls[0]) + " on rank 0) to the sequential '" + s + "' (" + type_text(sv.type) + ")");
    links.push_back({plan_name, sv.ir, *pl});
  }

  // ---- only what the compared outputs need, then named sizes ----
  std::set<std::string> spec_roots, plan_roots;
  for (const auto& l : links) spec_roots.insert(l.spec), plan_roots.insert(l.plan);
  drop_dead_ops(spec.ops, spec_roots);
  spec.ops.insert(spec.ops.begin(), spec_blocks.begin(), spec_blocks.end());  // (read by nothing: kept for localization)
  std::vector<std::vector<EOp>> plan_ops;
  for (auto& p : plans) {
    std::vector<EOp> ops = prologue;
    ops.insert(ops.end(), p.ops.begin(), p.ops.end());
    drop_dead_ops(ops, plan_roots);
    plan_ops.push_back(std::move(ops));
  }
  std::vector<InputDecl> decls;
  for (const auto& in : seq.inputs) {
    const std::string& pl = placement[in.name];
    decls.push_back({in.name, in.type->shape, pl.rfind("S(", 0) == 0 ? std::stoi(pl.substr(2)) : -1});
  }
  Symbolized sym = symbolize(decls, spec.ops, plan_ops, static_cast<std::int64_t>(n_ranks), axis, opt.reduce);

  std::ostringstream o;
  o << "# Imported by `spmdcheck import " << opt.format << "` (docs/import.md): the plan is the ranks' graphs\n";
  o << "#   " << opt.ranks << "\n# and `spec:` is the sequential graph\n#   " << opt.seq << "\n";
  if (!rel.file.empty()) o << "# relation: " << rel.file << "\n";
  if (!res.local_view) o << "# per-rank programs: the ranks' graphs are not one local-view program (" << not_local << ")\n";
  o << "# Dropout is the identity here: the value check assumes each rank's masks are the sequential model's.\n";
  if (!sym.ok) o << "# The sizes are not named (" << sym.why << "): the program keeps the graphs' literals.\n";
  o << "name: " << quoted(fs::path(opt.ranks).filename().string() + " vs " + fs::path(opt.seq).filename().string()) << "\n";
  if (sym.ok) {
    o << "sizes:   # every dim and size literal of the graphs as a product of these (docs/import.md, \"Named sizes\")\n";
    if (!sym.reduced.empty()) o << "  # --reduce: small values that keep every division exact; the graphs' own values are in the comments\n";
    for (std::size_t i = 0; i < sym.sizes.size(); ++i) {
      const auto& [n, v] = sym.sizes[i];
      if (sym.reduced.empty()) o << "  " << n << ": " << v << "\n";
      else o << "  " << n << ": " << sym.reduced[i] << (sym.reduced[i] == v ? "" : "   # " + std::to_string(v)) << "\n";
    }
  }
  o << "mesh: {";
  for (const auto& [ax, n] : rel.extra_axes) o << ax << ": " << n << ", ";
  o << axis << ": " << (sym.ok ? std::string("TP") : std::to_string(n_ranks)) << "}\n";
  o << "view: local\n";
  o << "tensors:\n";
  for (const auto& in : seq.inputs) {
    o << "  " << in.name << ": {shape: " << (sym.ok ? sym.shapes[in.name] : shape_yaml(in.type->shape)) << ", dtype: " << in.type->dtype;
    const std::string& pl = placement[in.name];
    if (pl != "R") o << ", placement: {" << axis << ": " << pl << "}";
    o << "}\n";
  }
  if (res.local_view) {
    o << "ops:\n";
    write_ops(o, plan_ops[0], "  ");
  } else {
    o << "programs:\n";
    for (std::size_t r = 0; r < plan_ops.size(); ++r) {
      o << "  - ranks: {" << axis << ": " << r << "}\n    ops:\n";
      write_ops(o, plan_ops[r], "      ");
    }
  }
  o << "outputs:\n";
  for (const auto& l : links) o << "  " << l.plan << ": {placement: {" << (l.placement == "R" ? "" : axis + ": " + l.placement) << "}}\n";
  o << "spec:\n  ops:\n";
  write_ops(o, spec.ops, "    ");
  o << "  outputs: {";
  for (std::size_t i = 0; i < links.size(); ++i) o << (i ? ", " : "") << links[i].plan << ": " << links[i].spec;
  o << "}\n";
  res.yaml = o.str();
  for (const auto& p : plan_ops) res.plan_ops += p.size();
  res.spec_ops = spec.ops.size();
  return res;
}

}  // namespace spmd::frontends
