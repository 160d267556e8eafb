// bench/ranks.h - per-rank programs with rank-local names on many ranks (issue 14: 1,024 ranks end to
// end, 65,536 ranks accepted).
#pragma once
#include <string>

#include "bench/generator.h"

namespace spmd::bench {

// `ranks` programs on mesh {r: ranks}, one per rank, every tensor name local to its rank (a_5, b_5, ...).
// Per layer each rank computes, exchanges with its ring neighbours by rank parity (even ranks send
// first, odd ranks receive first) and, with `collective`, all-reduces a gradient over r (the same
// logical tensor on every rank: `matches: g_sum`). About 7 ops per layer per rank; correct.
inline Program make_rank_local(int ranks, int layers, bool collective) {
  Program p;
  p.file = "ranks.yaml";
  p.per_rank = true;
  p.mesh.push_back({"r", p.exprs.constant(ranks), {}});
  Builder b(p);
  Placements rr{};
  Placements part{Placement::p()};
  b.tensor("x", {16, 64}, rr);
  b.tensor("w", {64, 64}, rr);
  b.tensor("g", {64, 64}, part);
  NameId g_sum = b.name("g_sum");
  auto peer = [&](int s) {
    p.coords.push_back({{0, s}});
    return static_cast<std::uint32_t>(p.coords.size() - 1);
  };
  for (int k = 0; k < ranks; ++k) {
    RankProgram rp;
    rp.selector = {{0, k}};
    rp.first_op = static_cast<std::uint32_t>(p.ops.size());
    std::string K = "_" + std::to_string(k);
    std::uint32_t next = peer((k + 1) % ranks), prev = peer((k + ranks - 1) % ranks);
    NameId in = b.name("x");
    for (int l = 0; l < layers; ++l) {
      std::string L = std::to_string(l) + K;
      NameId a = b.name("a" + L), h = b.name("h" + L), c = b.name("c" + L), o = b.name("o" + L);
      b.op(OpKind::MatMul, {in, b.name("w")}, {a});
      b.op(OpKind::GELU, {a}, {h});
      auto send = [&] { b.op(OpKind::Send, {h}, {}).attrs.coords = next; };
      auto recv = [&] { b.op(OpKind::Recv, {}, {c}).attrs.coords = prev; };
      if (ranks > 1 && k % 2 == 0) send(), recv();
      else if (ranks > 1) recv(), send();
      else b.op(OpKind::GELU, {h}, {c});
      b.op(OpKind::Add, {c, h}, {o});
      if (collective) {
        NameId gl = b.name("g" + L);
        Op& m = b.op(OpKind::Multiply, {b.name("g")}, {gl});
        m.attrs.number = 2;
        m.attrs.has_number = true;
        Op& ar = b.op(OpKind::AllReduce, {gl}, {b.name("gs" + L)});
        ar.attrs.axes = 1;
        ar.attrs.matches = g_sum;
      }
      in = o;
    }
    rp.n_ops = static_cast<std::uint32_t>(p.ops.size()) - rp.first_op;
    p.programs.push_back(rp);
  }
  return p;
}

}  // namespace spmd::bench
