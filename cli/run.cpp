// cli/run.cpp - the checker's verdict and the numeric oracle on one program (`spmdcheck run`).
#include "cli/run.h"

#include "ir/source_file.h"

#include <fmt/format.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <numeric>
#include <sstream>

#include "cli/render.h"
#include "interp/scale.h"
#include "ir/loader.h"
#include "spatial/spatial.h"

namespace spmd {

namespace {

// For every value and dim cut by mesh axes: whether the dim divides evenly among its shards and whether every
// shard holds an element. A scaled copy must keep this pattern: one whose dim no longer divides by its axis is
// another program (torch.chunk's padded layout), whatever the checker says of it.
std::vector<std::uint8_t> shard_pattern(const Program& p, const SpatialTypes& t) {
  std::vector<std::uint8_t> out;
  auto add = [&](const ValueType& v) {
    if (!v.ok) return out.push_back(8);
    for (int d = 0; d < v.rank; ++d) {
      std::int64_t shards = 1;
      for (std::size_t a = 0; a < p.mesh.size(); ++a)
        if (v.pl[a].is_s(d)) shards *= p.exprs.is_const(p.mesh[a].size) ? p.exprs.value(p.mesh[a].size) : 0;
      ExprId e = v.shape[static_cast<std::size_t>(d)];
      if (shards <= 1 || !t.exprs.is_const(e)) continue;
      std::int64_t n = t.exprs.value(e);
      out.push_back(static_cast<std::uint8_t>(d << 2 | (n % shards == 0) << 1 | (n >= shards)));
    }
  };
  for (const auto& v : t.decls) add(v);
  for (const auto& v : t.outs) add(v);
  return out;
}

std::set<std::string> spatial_ids(const Program& p, const RunOptions& o, std::vector<std::optional<Placements>>* inferred,
                                  std::string* first_op = nullptr, std::vector<std::uint8_t>* pattern = nullptr) {
  SpatialOptions so;
  SpatialTypes types;
  so.z3_timeout_ms = o.z3_timeout_ms;
  so.inferred_outputs = inferred;
  if (pattern) so.types = &types;
  std::set<std::string> ids;
  for (const auto& d : check_spatial(p, so))
    if (d.severity == Severity::Error) {
      if (first_op && ids.empty()) *first_op = d.op >= 0 ? std::string(op_name(p.ops[static_cast<std::size_t>(d.op)].kind)) : "a declaration or output";
      ids.insert(std::string(check_name(d.id)));
    }
  if (pattern) *pattern = shard_pattern(p, types);
  return ids;
}

// Divisors of g above 1, largest first (at most 16).
std::vector<std::int64_t> factors(std::int64_t g) {
  std::vector<std::int64_t> f;
  for (std::int64_t d = 1; d * d <= g; ++d)
    if (g % d == 0) {
      if (d > 1) f.push_back(d);
      if (g / d != d) f.push_back(g / d);
    }
  std::sort(f.rbegin(), f.rend());
  if (f.size() > 16) f.resize(16);
  return f;
}

}  // namespace

RunReport run_program_text(const std::string& text, const std::string& filename, const RunOptions& opt) {
  RunReport rep;
  Program prog;
  try {
    prog = load_program_string(text, filename);
  } catch (const LoadError& e) {
    rep.load_error = e;
    return rep;
  }
  std::vector<std::optional<Placements>> inferred;
  std::vector<std::uint8_t> pattern;
  rep.checker_ids = spatial_ids(prog, opt, &inferred, &rep.first_op, opt.scale ? &pattern : nullptr);
  Program* run = &prog;
  Program scaled;
  if (opt.scale) {
    // First one factor for every named size (keeps relations such as F = 4 * H), then each size on its own.
    auto sizes = named_sizes(text);
    auto try_sizes = [&](const std::map<std::string, std::int64_t>& vals) {
      auto t = with_sizes(text, vals);
      if (!t) return false;
      Program cand;
      try {
        cand = load_program_string(*t, filename);
      } catch (const LoadError&) {
        return false;
      }
      std::vector<std::optional<Placements>> inf2;
      std::vector<std::uint8_t> pattern2;
      if (spatial_ids(cand, opt, &inf2, nullptr, &pattern2) != rep.checker_ids || pattern2 != pattern) return false;
      scaled = std::move(cand);
      inferred = std::move(inf2);
      run = &scaled;
      return true;
    };
    // No size goes below `floor` (each rank should keep a few elements per sharded dim).
    std::int64_t floor = 8;
    {
      std::int64_t ranks = 1;
      for (const auto& ax : prog.mesh) ranks *= prog.exprs.is_const(ax.size) ? prog.exprs.value(ax.size) : 1;
      floor = std::clamp<std::int64_t>(ranks, 8, 32);
    }
    std::int64_t g = 0;
    for (const auto& [k, v] : sizes)
      if (v > floor) g = std::gcd(g, v);
    for (std::int64_t f : factors(g)) {
      auto vals = sizes;
      bool ok = true;
      for (auto& [k, v] : vals)
        if (v > floor) ok &= v / f >= floor, v /= f;
      if (ok && try_sizes(vals)) {
        sizes = vals;
        rep.scale = f;
        break;
      }
    }
    std::vector<std::pair<std::int64_t, std::string>> order;
    for (const auto& [k, v] : sizes) order.emplace_back(-v, k);
    std::sort(order.begin(), order.end());
    for (const auto& [neg, k] : order) {
      for (std::int64_t f : factors(sizes[k])) {
        if (sizes[k] / f < floor) continue;
        auto vals = sizes;
        vals[k] /= f;
        if (try_sizes(vals)) {
          sizes = vals;
          rep.scaled_each = true;
          break;
        }
      }
    }
    for (const auto& [k, v] : sizes) rep.run_sizes += (rep.run_sizes.empty() ? "" : ", ") + k + " = " + std::to_string(v);
    if (run != &scaled) rep.run_sizes.clear();
  }
  OracleOptions oo;
  oo.seed = opt.seed;
  // An output with no declared placement claims one value: it is assembled by the inferred placement, with
  // any P or V axis read as R (so a missing reduction or per-rank values show up as ranks that disagree).
  for (std::size_t k = 0; k < run->outputs.size(); ++k) {
    std::optional<Placements> pl;
    if (!run->outputs[k].has_placement && k < inferred.size() && inferred[k]) {
      pl = *inferred[k];
      for (auto& x : *pl)
        if (x.is_p() || x.is_v()) x = Placement::r();
    }
    oo.assemble.push_back(pl);
  }
  rep.oracle = run_oracle(*run, oo);
  return rep;
}

RunReport run_program_file(const std::string& path, const RunOptions& opt) {
  std::string text;
  try {
    text = read_input_file(path);
  } catch (const LoadError& e) {
    RunReport rep;
    rep.load_error = e;
    return rep;
  }
  return run_program_text(text, path, opt);
}

std::string render_run(const std::string& file, const RunReport& r) {
  if (r.load_error) return render_load_error(file, *r.load_error);
  const OracleResult& o = r.oracle;
  std::string s = fmt::format("{}: {}: {}\n", file, verdict_name(o.verdict), o.message);
  std::string ids;
  for (const auto& id : r.checker_ids) ids += (ids.empty() ? "" : ", ") + id;
  s += fmt::format("  checker: {}\n", ids.empty() ? "pass" : ids);
  std::vector<std::string> parts;
  if (!o.sizes.empty()) parts.push_back("sizes " + o.sizes);
  if (!r.run_sizes.empty()) parts.push_back("scaled copy with " + r.run_sizes);
  if (o.verdict == OracleVerdict::Agree || o.verdict == OracleVerdict::Differ) parts.push_back(fmt::format("largest difference {:.3g}", o.max_diff));
  if (!parts.empty()) {
    std::string t;
    for (const auto& p : parts) t += (t.empty() ? "" : "; ") + p;
    s += "  run: " + t + "\n";
  }
  for (const auto& n : o.notes) s += "  note: " + n + "\n";
  return s;
}

}  // namespace spmd
