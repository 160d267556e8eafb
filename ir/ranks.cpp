// ir/ranks.cpp - representatives, peers, groups, and FIFO / sequence-number matching.
#include "ir/ranks.h"

#include <algorithm>
#include <unordered_map>

namespace spmd {

std::vector<RankProgram> rank_programs(const Program& p) {
  // An `ops:` program is every op (programs built in code may append ops after loading).
  if (p.per_rank && !p.programs.empty()) return p.programs;
  return {RankProgram{Loc{}, {}, 0, static_cast<std::uint32_t>(p.ops.size())}};
}

std::int64_t RankSpace::coord(int rep, int mesh_axis) const {
  for (std::size_t i = 0; i < axes.size(); ++i)
    if (axes[i] == mesh_axis) return (rep / stride[i]) % sizes[i];
  return 0;
}

int RankSpace::with(int rep, std::span<const std::pair<int, std::int64_t>> coords) const {
  std::int64_t r = rep;
  for (auto [axis, v] : coords)
    for (std::size_t i = 0; i < axes.size(); ++i)
      if (axes[i] == axis) r += (v - (rep / stride[i]) % sizes[i]) * stride[i];
  return static_cast<int>(r);
}

std::pair<std::int64_t, int> RankSpace::group(int rep, std::uint32_t mask) const {
  std::int64_t base = rep;
  int members = 1;
  for (std::size_t i = 0; i < axes.size(); ++i)
    if (mask & (1u << axes[i])) {
      base -= ((rep / stride[i]) % sizes[i]) * stride[i];
      members *= static_cast<int>(sizes[i]);
    }
  return {static_cast<std::int64_t>(mask) * kMaxRepresentatives + base, members};
}

std::vector<int> RankSpace::members(int rep, std::uint32_t mask) const {
  // The group's base (coordinate 0 on the masked axes), then every combination of the masked axes.
  std::int64_t base = rep;
  std::vector<std::size_t> free;
  for (std::size_t i = 0; i < axes.size(); ++i)
    if (mask & (1u << axes[i])) {
      base -= ((rep / stride[i]) % sizes[i]) * stride[i];
      free.push_back(i);
    }
  std::vector<int> out{static_cast<int>(base)};
  for (std::size_t i : free) {
    std::size_t n = out.size();
    for (std::int64_t v = 1; v < sizes[i]; ++v)
      for (std::size_t k = 0; k < n; ++k) out.push_back(static_cast<int>(out[k] + v * stride[i]));
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::string RankSpace::label(const Program& p, int rep) const {
  if (axes.empty()) return "{}";
  std::string s = "{";
  for (std::size_t i = 0; i < axes.size(); ++i)
    s += (i ? ", " : "") + p.mesh[static_cast<std::size_t>(axes[i])].name + ": " + std::to_string((rep / stride[i]) % sizes[i]);
  return s + "}";
}

RankSpace make_rank_space(const Program& p) {
  RankSpace s;
  s.programs = rank_programs(p);
  std::uint32_t relevant = 0;
  std::vector<Loc> first_use(p.mesh.size());
  auto use = [&](int axis, Loc l) {
    if (!(relevant & (1u << axis))) first_use[static_cast<std::size_t>(axis)] = l;
    relevant |= 1u << axis;
  };
  for (const auto& rp : s.programs)
    for (auto [axis, v] : rp.selector) use(axis, rp.loc);
  for (const auto& op : p.ops)
    if (op.attrs.coords != kNoIndex)
      for (auto [axis, v] : p.coords[op.attrs.coords]) use(axis, op.loc);
  std::int64_t total = 1;
  for (int a = 0; a < p.axis_count(); ++a) {
    if (!(relevant & (1u << a))) continue;
    const MeshAxis& ax = p.mesh[static_cast<std::size_t>(a)];
    if (!p.exprs.is_const(ax.size))
      throw LoadError(first_use[static_cast<std::size_t>(a)],
                      "mesh axis " + ax.name + " selects programs or peers here, so it needs a concrete size (it is " +
                          p.exprs.str(ax.size, p.vars) +
                          "); give it a number in `mesh`");
    s.axes.push_back(a);
    s.sizes.push_back(p.exprs.value(ax.size));
    total *= s.sizes.back();
    if (total > kMaxRepresentatives)
      throw LoadError(ax.loc, "the programs distinguish more than " + std::to_string(kMaxRepresentatives) +
                                  " ranks (the product of the sizes of the axes named in `ranks:` selectors and peers)");
  }
  s.stride.assign(s.axes.size(), 1);
  for (std::size_t i = s.axes.size(); i-- > 1;) s.stride[i - 1] = s.stride[i] * s.sizes[i];
  s.program.assign(static_cast<std::size_t>(total), -1);
  // Each program claims the ranks its selector matches (enumerated over the axes it leaves free), so
  // the work is the number of ranks, not ranks x programs.
  for (std::size_t k = 0; k < s.programs.size(); ++k) {
    std::int64_t base = 0;
    std::uint32_t named = 0;
    bool in_range = true;
    for (auto [axis, v] : s.programs[k].selector)
      for (std::size_t i = 0; i < s.axes.size(); ++i)
        if (s.axes[i] == axis) {
          in_range &= v >= 0 && v < s.sizes[i];
          base += v * s.stride[i];
          named |= 1u << axis;
        }
    if (!in_range) continue;
    std::uint32_t free = 0;
    for (int a : s.axes)
      if (!(named & (1u << a))) free |= 1u << a;
    for (int r : s.members(static_cast<int>(base), free)) {
      int& slot = s.program[static_cast<std::size_t>(r)];
      if (slot >= 0)
        throw LoadError(s.programs[k].loc, "rank " + s.label(p, r) + " matches this program and the one at line " +
                                               std::to_string(s.programs[static_cast<std::size_t>(slot)].loc.line) +
                                               ": every rank must run exactly one program");
      slot = static_cast<int>(k);
    }
  }
  for (int r = 0; r < static_cast<int>(total); ++r)
    if (s.program[static_cast<std::size_t>(r)] < 0)
      throw LoadError(s.programs.front().loc, "rank " + s.label(p, r) + " runs no program: every rank must match exactly one `ranks:` selector");
  return s;
}

void match_p2p(const Program& p, const RankSpace& s, std::vector<P2PMatch>& matches, std::vector<P2PLeftover>& leftovers) {
  struct Channel {
    std::vector<int> sends, recvs;  // op indices, in program order
  };
  std::unordered_map<std::int64_t, Channel> channels;
  std::vector<std::int64_t> order;  // channels in first-use order (deterministic output)
  for (int r = 0; r < s.count(); ++r) {
    const RankProgram& rp = s.programs[static_cast<std::size_t>(s.program[static_cast<std::size_t>(r)])];
    for (std::uint32_t i = rp.first_op; i < rp.first_op + rp.n_ops; ++i) {
      const Op& op = p.ops[i];
      if (op.kind != OpKind::Send && op.kind != OpKind::Recv) continue;
      int peer = s.with(r, p.coords[op.attrs.coords]);
      bool send = op.kind == OpKind::Send;
      std::int64_t key = send ? std::int64_t{r} * kMaxRepresentatives + peer : std::int64_t{peer} * kMaxRepresentatives + r;
      auto [it, fresh] = channels.try_emplace(key);
      if (fresh) order.push_back(key);
      (send ? it->second.sends : it->second.recvs).push_back(static_cast<int>(i));
    }
  }
  for (std::int64_t key : order) {
    const Channel& c = channels[key];
    int src = static_cast<int>(key / kMaxRepresentatives), dst = static_cast<int>(key % kMaxRepresentatives);
    std::size_t n = std::min(c.sends.size(), c.recvs.size());
    for (std::size_t k = 0; k < n; ++k) matches.push_back({src, c.sends[k], dst, c.recvs[k]});
    for (std::size_t k = n; k < c.sends.size(); ++k) leftovers.push_back({src, c.sends[k], dst, true});
    for (std::size_t k = n; k < c.recvs.size(); ++k) leftovers.push_back({dst, c.recvs[k], src, false});
  }
}

void match_collectives(const Program& p, const RankSpace& s, std::vector<CollectivePair>& pairs, std::vector<CollectiveCount>& counts) {
  struct Member {
    int rank;
    std::vector<int> ops;
  };
  struct Group {
    std::uint32_t mask;
    std::vector<Member> members;
  };
  std::unordered_map<std::int64_t, Group> groups;
  std::vector<std::int64_t> order;
  std::uint32_t relevant = 0;
  for (int a : s.axes) relevant |= 1u << a;
  for (int r = 0; r < s.count(); ++r) {
    const RankProgram& rp = s.programs[static_cast<std::size_t>(s.program[static_cast<std::size_t>(r)])];
    for (std::uint32_t i = rp.first_op; i < rp.first_op + rp.n_ops; ++i) {
      const Op& op = p.ops[i];
      // Groups over symmetric axes only hold copies of this rank: they always agree.
      if (op_info(op.kind).category != OpCategory::collective || !(op.attrs.axes & relevant)) continue;
      auto [key, n] = s.group(r, op.attrs.axes);
      auto [it, fresh] = groups.try_emplace(key);
      if (fresh) {
        order.push_back(key);
        it->second.mask = op.attrs.axes;
      }
      auto& ms = it->second.members;
      if (ms.empty() || ms.back().rank != r) ms.push_back({r, {}});
      ms.back().ops.push_back(static_cast<int>(i));
    }
  }
  for (std::int64_t key : order) {
    const Group& g = groups[key];
    const Member& a = g.members.front();
    // Members of the group that issue no collective in it at all also count.
    int expected = s.group(a.rank, g.mask).second;
    if (static_cast<int>(g.members.size()) < expected) {
      std::vector<int> present;
      for (const auto& m : g.members) present.push_back(m.rank);
      std::sort(present.begin(), present.end());
      for (int r : s.members(a.rank, g.mask))
        if (!std::binary_search(present.begin(), present.end(), r)) counts.push_back({a.rank, static_cast<int>(a.ops.size()), r, 0, a.ops.back(), -1, g.mask});
    }
    for (std::size_t m = 1; m < g.members.size(); ++m) {
      const Member& b = g.members[m];
      std::size_t n = std::min(a.ops.size(), b.ops.size());
      for (std::size_t k = 0; k < n; ++k)
        if (a.ops[k] != b.ops[k]) pairs.push_back({a.rank, a.ops[k], b.rank, b.ops[k], static_cast<int>(k)});
      if (a.ops.size() != b.ops.size())
        counts.push_back({a.rank, static_cast<int>(a.ops.size()), b.rank, static_cast<int>(b.ops.size()), a.ops.back(), b.ops.back(), g.mask});
    }
  }
}

std::string ordinal(int n) {
  const char* suf = "th";
  if (n % 100 < 11 || n % 100 > 13) {
    if (n % 10 == 1) suf = "st";
    else if (n % 10 == 2) suf = "nd";
    else if (n % 10 == 3) suf = "rd";
  }
  return std::to_string(n) + suf;
}

}  // namespace spmd
