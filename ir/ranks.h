// ir/ranks.h - the ranks a program runs on and the static matching of its communication.
//
// Representatives: only the mesh axes named by a `programs:` selector or a point-to-point `peer`
// can make two ranks behave differently; every other axis is symmetric, so coordinate 0 stands for
// all of its coordinates. A representative is a point of the relevant axes (one rank for a plain
// SPMD program, however large the mesh). Point-to-point ops pair per (src, dst) in FIFO order and
// collectives per (group, sequence number), as NCCL and Flight Recorder do; both pairings are
// static (explicit peers, no wildcards), so the spatial checker (types) and the temporal checker
// (order, deadlock) share them.
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "ir/program.h"

namespace spmd {

// The most representatives a program may distinguish (the product of the sizes of the axes named by
// selectors and peers): one program per rank on 65,536 ranks is accepted.
inline constexpr int kMaxRepresentatives = 65536;

// The programs of `p`: its `programs:` list (per_rank), or one program over every op for a plain
// `ops:` list (also when code appends ops to it, as the derived backward does).
std::vector<RankProgram> rank_programs(const Program& p);

struct RankSpace {
  std::vector<int> axes;            // the relevant mesh axes, in mesh order
  std::vector<std::int64_t> sizes;  // their sizes
  std::vector<std::int64_t> stride; // mixed-radix strides (last relevant axis fastest)
  std::vector<RankProgram> programs;
  std::vector<int> program;         // representative -> index into `programs`
  int count() const { return static_cast<int>(program.size()); }

  std::int64_t coord(int rep, int mesh_axis) const;
  // The representative at `rep` with the given coordinates replaced (a peer).
  int with(int rep, std::span<const std::pair<int, std::int64_t>> coords) const;
  // The collective group of `rep` over the mesh axes in `mask`: (key, number of representative members).
  std::pair<std::int64_t, int> group(int rep, std::uint32_t mask) const;
  // The representatives of that group, in increasing order (linear in its size).
  std::vector<int> members(int rep, std::uint32_t mask) const;
  // "{pp: 1}" (relevant axes only); "{}" for a one-rank space.
  std::string label(const Program& p, int rep) const;
};

// Throws LoadError when a selector names an axis of symbolic size, a rank runs no program or
// several, or there are more than kMaxRepresentatives representatives.
RankSpace make_rank_space(const Program& p);

// A Send and the Recv it pairs with (FIFO per (src, dst)).
struct P2PMatch {
  int src, send_op, dst, recv_op;
};
// A Send or Recv with no partner by the end of the programs.
struct P2PLeftover {
  int rank, op, peer;
  bool is_send;
};
void match_p2p(const Program& p, const RankSpace& s, std::vector<P2PMatch>& matches, std::vector<P2PLeftover>& leftovers);

// Collectives (and the async ones) issued by the members of one group. `pairs` compares each
// member's i-th collective with the first member's i-th where the two are different ops (members
// running one program issue the same op and need no comparison); `counts` lists members that issue
// a different number of collectives in the group than its first member.
struct CollectivePair {
  int rank_a, op_a, rank_b, op_b, seq;
};
struct CollectiveCount {
  int rank_a, n_a, rank_b, n_b;
  int last_op_a, last_op_b;  // each one's last collective in the group (-1: none)
  std::uint32_t mask;
};
void match_collectives(const Program& p, const RankSpace& s, std::vector<CollectivePair>& pairs, std::vector<CollectiveCount>& counts);

// The ordinal of `n` in English ("1st", "2nd", ...), for messages.
std::string ordinal(int n);

}  // namespace spmd
