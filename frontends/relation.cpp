// frontends/relation.cpp - the relation file (yaml-cpp, located errors) and placement inference from shapes.
#include "frontends/relation.h"

#include <yaml-cpp/yaml.h>

#include <fstream>
#include <set>
#include <sstream>

#include "frontends/yaml_util.h"

namespace spmd::frontends {

namespace {

double number(const YAML::Node& n, const std::string& file, const std::string& what) {
  std::string s = scalar(n, file, what);
  char* end = nullptr;
  double d = std::strtod(s.c_str(), &end);
  if (s.empty() || end != s.c_str() + s.size()) throw ImportError(file, loc_of(n), what + " must be a number, got '" + s + "'");
  return d;
}

std::int64_t integer(const YAML::Node& n, const std::string& file, const std::string& what) {
  std::string s = scalar(n, file, what);
  char* end = nullptr;
  long long v = std::strtoll(s.c_str(), &end, 10);
  if (s.empty() || end != s.c_str() + s.size()) throw ImportError(file, loc_of(n), what + " must be an integer, got '" + s + "'");
  return v;
}

bool valid_placement(const std::string& s) {
  if (s == "R" || s == "P" || s == "P(sum)" || s == "P(avg)" || s == "P(max)" || s == "P(min)") return true;
  if (s.size() >= 4 && s.rfind("S(", 0) == 0 && s.back() == ')') {
    std::string d = s.substr(2, s.size() - 3);
    char* end = nullptr;
    std::strtol(d.c_str(), &end, 10);
    return !d.empty() && end == d.c_str() + d.size();
  }
  return false;
}

}  // namespace

Relation load_relation(const std::string& path) {
  Relation r;
  r.file = path;
  std::ifstream in(path, std::ios::binary);
  if (!in) throw ImportError(path, {}, "cannot read the relation file");
  std::ostringstream ss;
  ss << in.rdbuf();
  YAML::Node root;
  try {
    root = YAML::Load(ss.str());
  } catch (const YAML::Exception& e) {
    throw ImportError(path, {static_cast<std::uint32_t>(e.mark.line + 1), static_cast<std::uint32_t>(e.mark.column + 1)}, "invalid YAML: " + e.msg);
  }
  if (root.IsNull()) return r;
  if (!root.IsMap()) throw ImportError(path, {1, 1}, "a relation file is a YAML mapping (docs/import.md, \"The relation\")");
  static const std::set<std::string> keys = {"graph", "axis", "axes", "groups", "inputs", "rank_inputs", "blocked", "cuts", "outputs", "constants", "description", "devices"};
  for (const auto& kv : root) {
    std::string k = kv.first.Scalar();
    if (!keys.count(k))
      throw ImportError(path, loc_of(kv.first), "unknown key '" + k + "' in a relation file (graph, axis, axes, groups, inputs, rank_inputs, blocked, cuts, outputs, constants, devices)");
  }
  if (auto g = root["graph"]) r.graph = scalar(g, path, "`graph`");
  if (auto d = root["devices"]) {
    r.devices = integer(d, path, "`devices`");
    if (r.devices < 1 || r.devices > 4096) throw ImportError(path, loc_of(d), "`devices` must be between 1 and 4096");
  }
  if (auto a = root["axis"]) r.axis = scalar(a, path, "`axis`");
  if (auto a = root["axes"]) {
    r.axes_loc = loc_of(a);
    if (!a.IsMap()) throw ImportError(path, loc_of(a), "`axes` maps further mesh axes to their sizes, e.g. {dp: 1}");
    for (const auto& kv : a) {
      std::int64_t n = integer(kv.second, path, "a mesh axis size");
      if (n != 1)
        throw ImportError(path, loc_of(kv.second), "mesh axis " + kv.first.Scalar() + " of size " + std::to_string(n) +
                                                       ": further axes of one rank each are supported (the ranks' graphs are all on `axis`); more is not supported yet");
      if (kv.first.Scalar() == r.axis) throw ImportError(path, loc_of(kv.first), "axis " + r.axis + " is the ranks' axis; `axes` names further ones");
      r.extra_axes.emplace_back(kv.first.Scalar(), n);
    }
  }
  if (auto g = root["groups"]) {
    if (!g.IsMap()) throw ImportError(path, loc_of(g), "`groups` maps a process group name to a mesh axis, e.g. {'12': tp}");
    for (const auto& kv : g) r.groups[kv.first.Scalar()] = scalar(kv.second, path, "a mesh axis");
  }
  if (auto i = root["inputs"]) {
    if (!i.IsMap()) throw ImportError(path, loc_of(i), "`inputs` maps a sequential input to its placement on the ranks, e.g. {primals_4: S(0)}");
    for (const auto& kv : i) {
      std::string pl = scalar(kv.second, path, "a placement");
      if (!valid_placement(pl)) throw ImportError(path, loc_of(kv.second), "placement '" + pl + "' is not R, S(d) or P");
      r.placements[kv.first.Scalar()] = pl;
      r.placement_locs[kv.first.Scalar()] = loc_of(kv.second);
    }
  }
  if (auto ri = root["rank_inputs"]) {
    if (!ri.IsMap()) throw ImportError(path, loc_of(ri), "`rank_inputs` maps a ranks' input to {slice: SEQ_INPUT, dim: D, start: A, end: B}");
    for (const auto& kv : ri) {
      const YAML::Node& d = kv.second;
      if (!d.IsMap() || !d["slice"]) throw ImportError(path, loc_of(d), "a rank input is defined as {slice: SEQ_INPUT, dim: D, start: A, end: B}");
      for (const auto& f : d) {
        std::string k = f.first.Scalar();
        if (k != "slice" && k != "dim" && k != "start" && k != "end") throw ImportError(path, loc_of(f.first), "unknown key '" + k + "' in a rank input (slice, dim, start, end)");
      }
      RankInput x;
      x.of = scalar(d["slice"], path, "`slice`");
      x.dim = d["dim"] ? static_cast<int>(integer(d["dim"], path, "`dim`")) : 0;
      if (!d["start"] || !d["end"]) throw ImportError(path, loc_of(d), "a rank input needs `start` and `end`");
      x.start = integer(d["start"], path, "`start`");
      x.end = integer(d["end"], path, "`end`");
      x.loc = loc_of(kv.first);
      r.rank_inputs[kv.first.Scalar()] = x;
    }
  }
  if (auto b = root["blocked"]) {
    if (!b.IsSequence()) throw ImportError(path, loc_of(b), "`blocked` is a list of {shape: [...], dim: D, sizes: [...]} (a fused weight sharded block by block)");
    for (const auto& x : b) {
      if (!x.IsMap() || !x["shape"] || !x["sizes"]) throw ImportError(path, loc_of(x), "a blocked weight is {shape: [...], dim: D, sizes: [...]}");
      Blocked k;
      k.loc = loc_of(x);
      for (const auto& f : x) {
        std::string key = f.first.Scalar();
        if (key != "shape" && key != "dim" && key != "sizes") throw ImportError(path, loc_of(f.first), "unknown key '" + key + "' in a blocked weight (shape, dim, sizes)");
      }
      auto ints = [&](const YAML::Node& n, const char* what) {
        std::vector<std::int64_t> v;
        if (!n.IsSequence()) throw ImportError(path, loc_of(n), std::string(what) + " must be a list of integers");
        for (const auto& e : n) v.push_back(integer(e, path, what));
        return v;
      };
      k.shape = ints(x["shape"], "`shape`");
      k.sizes = ints(x["sizes"], "`sizes`");
      k.dim = x["dim"] ? static_cast<int>(integer(x["dim"], path, "`dim`")) : 0;
      if (k.dim < 0 || k.dim >= static_cast<int>(k.shape.size())) throw ImportError(path, loc_of(x), "`dim` is out of range for the shape");
      std::int64_t sum = 0;
      for (auto s : k.sizes) sum += s;
      if (sum != k.shape[static_cast<std::size_t>(k.dim)]) throw ImportError(path, loc_of(x["sizes"]), "the blocks' sizes do not add up to the dim");
      r.blocked.push_back(std::move(k));
    }
  }
  if (auto c = root["cuts"]) {
    if (!c.IsMap()) throw ImportError(path, loc_of(c), "`cuts` maps a sequential node to {ranks: RANKS_NODE, placement: S(d)} (or to its placement)");
    for (const auto& kv : c) {
      Cut x;
      x.loc = loc_of(kv.first);
      x.ranks = kv.first.Scalar();
      const YAML::Node& d = kv.second;
      if (d.IsScalar()) {
        x.placement = d.Scalar();
      } else if (d.IsMap()) {
        for (const auto& f : d) {
          std::string k = f.first.Scalar();
          if (k == "ranks") x.ranks = scalar(f.second, path, "`ranks`");
          else if (k == "placement") x.placement = scalar(f.second, path, "`placement`");
          else throw ImportError(path, loc_of(f.first), "unknown key '" + k + "' in a cut (ranks, placement)");
        }
      } else if (!d.IsNull()) {
        throw ImportError(path, loc_of(d), "a cut is a placement or {ranks: NODE, placement: S(d)}");
      }
      if (!x.placement.empty() && !valid_placement(x.placement)) throw ImportError(path, loc_of(d), "placement '" + x.placement + "' is not R, S(d) or P");
      r.cuts[kv.first.Scalar()] = x;
    }
  }
  if (auto o = root["outputs"]) {
    r.outputs_loc = loc_of(o);
    if (o.IsSequence()) {
      for (const auto& x : o) r.outputs.emplace_back(scalar(x, path, "an output"), scalar(x, path, "an output"));
    } else if (o.IsMap()) {
      for (const auto& kv : o) r.outputs.emplace_back(kv.first.Scalar(), scalar(kv.second, path, "the ranks' output"));
    } else {
      throw ImportError(path, loc_of(o), "`outputs` is a list of names (the same in both graphs) or a map {sequential: ranks'}");
    }
  }
  if (auto c = root["constants"]) {
    if (c.IsScalar()) {
      r.default_constant = number(c, path, "`constants`");
    } else if (c.IsMap()) {
      for (const auto& kv : c) {
        std::string k = kv.first.Scalar();
        if (k == "default") r.default_constant = number(kv.second, path, "a constant");
        else r.constants[k] = number(kv.second, path, "a constant");
      }
    } else {
      throw ImportError(path, loc_of(c), "`constants` is a number (every lifted constant) or a map {_tensor_constant0: 0, default: 0}");
    }
  }
  return r;
}

std::optional<std::string> infer_placement(const std::vector<std::int64_t>& global, const std::vector<std::vector<std::int64_t>>& local) {
  bool equal = true;
  for (const auto& l : local) equal &= l == global;
  if (equal) return std::string("R");
  auto n = static_cast<std::int64_t>(local.size());
  int found = -1;
  for (std::size_t d = 0; d < global.size(); ++d) {
    bool cut = true;
    std::int64_t sum = 0, chunk = (global[d] + n - 1) / n;  // torch.chunk: ceil-div pieces, the last ranks get fewer
    for (std::int64_t r = 0; r < n; ++r) {
      const auto& l = local[static_cast<std::size_t>(r)];
      if (l.size() != global.size()) return std::nullopt;
      for (std::size_t e = 0; e < global.size(); ++e)
        if (e != d && l[e] != global[e]) cut = false;
      std::int64_t want = std::clamp<std::int64_t>(global[d] - r * chunk, 0, chunk);
      if (l[d] != want) cut = false;
      sum += l[d];
    }
    if (cut && sum == global[d]) {
      if (found >= 0) return std::nullopt;  // two dims fit (a dim of size 1 per rank...): ambiguous
      found = static_cast<int>(d);
    }
  }
  if (found < 0) return std::nullopt;
  return "S(" + std::to_string(found) + ")";
}

}  // namespace spmd::frontends
