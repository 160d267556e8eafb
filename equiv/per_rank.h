// equiv/per_rank.h - what the value check needs to run per-rank plans (`programs:`, and the programs a pipeline
// schedule lowers to): the ranks that hold a value, each program's last writes, and the data flow across programs
// (a Recv reads its Send, a collective its group's inputs on every program).
#pragma once
#include <cstdint>
#include <vector>

#include "interp/runner.h"
#include "ir/program.h"

namespace spmd::equiv_detail {

// The pieces of a value some ranks hold, from one Val per rank of `mesh` (undefined on the ranks that never compute
// it): the pieces of the defined ranks in row-major order and the mesh sizes with the axes those ranks share one
// coordinate of set to 1 (the ranks of a program: its selector fixes coordinates). False when the defined ranks are
// not such a sub-mesh (or none is defined). `first` receives the first defined Val.
bool held_pieces(const std::vector<std::int64_t>& mesh, const std::vector<interp::Val>& ranks, std::vector<interp::Tensor>& pieces,
                 std::vector<std::int64_t>& sizes, const interp::Val** first = nullptr);

// Per operand slot (Program::operands index) of an op's output: 1 when that op is the last writer of the name in its
// program (per-rank programs each have their own buffers; an `ops:` program is one program).
std::vector<char> final_writes(const Program& p);

// Per op: the ops whose values it reads. Within its program, the last writer before it of each input (-1 for a
// declared tensor); a Recv also reads the Send it pairs with (FIFO per (src, dst)); a collective whose group spans
// programs also reads what its partners on the other programs read.
std::vector<std::vector<int>> plan_producers(const Program& p);

// Per op of a per-rank plan: the ops of the other programs that write the same name as its first output, as the same
// write of that name in their program (the same value, computed by other ranks: an imported per-rank graph names
// its values alike on every rank). Their values are read together.
std::vector<std::vector<int>> name_peers(const Program& p);

}  // namespace spmd::equiv_detail
