// frontends/dims.h - named sizes for an imported program: every dim and size literal of the lowered ops written as
// a product of named sizes, found by unifying the shapes the ops relate (a MatMul's contracted dims, broadcast
// dims, a reshape's groups, a slice's length). A program with named sizes can be checked at smaller sizes (the
// value check's shape reduction) without the frontend guessing which literal is which size.
#pragma once
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "frontends/lower.h"

namespace spmd::frontends {

struct InputDecl {
  std::string name;
  std::vector<std::int64_t> shape;  // global
  int shard_dim = -1;               // S(d) over the mesh axis: the plan's local dim is global / TP
};

struct Symbolized {
  bool ok = false;
  std::string why;                                           // when not ok: what could not be named (the ops keep literals)
  std::vector<std::pair<std::string, std::int64_t>> sizes;   // the named sizes, TP first
  std::map<std::string, std::string> shapes;                 // declared input -> its shape as text
  std::size_t literals = 0;                                  // literals written as expressions
  // With `reduce`: the smallest values (in the order of `sizes`) under which every dim stays a positive integer and
  // every slice offset an integer on every rank, each size shrunk to a divisor of its value (at least 2, 4 for sizes
  // of 64 and more): a stand-in for the value check's automatic shape reduction (issue 20).
  std::vector<std::int64_t> reduced;
};

// Rewrites the shape and size attributes of `spec` (single device) and `plans` (local view, TP ranks on `axis`) in
// named sizes; on failure leaves every op as it was.
Symbolized symbolize(const std::vector<InputDecl>& inputs, std::vector<EOp>& spec, std::vector<std::vector<EOp>>& plans, std::int64_t tp, const std::string& axis,
                     bool reduce = false);

// Removes ops whose results nothing reads (the roots and collectives, which every rank must issue, stay).
void drop_dead_ops(std::vector<EOp>& ops, const std::set<std::string>& roots);

}  // namespace spmd::frontends
