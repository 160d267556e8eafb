// schedules/schedule.h - pipeline schedules: the action grid, PyTorch CSV import, generators,
// validation, lowering to per-rank programs, and the terminal / Chrome-trace views.
//
// A schedule is one row of actions per pipeline rank, in the order the rank runs them (the PyTorch
// pipelining CSV format: `{stage}{TYPE}{microbatch}`, `(A;B)OVERLAP_F_B`, empty cell = bubble).
// validate_schedule checks coverage and order (schedule-invalid) and the data-parallel gradient
// reduction (grad-sync-early); lower_schedule turns it into a per-rank Program (mesh {pp: ranks})
// whose Send/Recv the temporal checker simulates (deadlock, unmatched-p2p, p2p-mismatch by FIFO).
#pragma once
#include <iosfwd>
#include <optional>
#include <string>
#include <vector>

#include "ir/diagnostic.h"
#include "ir/program.h"

namespace spmd {

// Lowering makes about four ops per action, and checking a lowered schedule takes about 1 KB per action: at
// most 500,000 actions keeps a schedule from a two-line program under 1 GiB (2,500,000 took 2.3 GiB). Checked
// before anything is allocated: by the generators from their parameters, by the CSV reader per cell (and at
// most 4 cells per action, bubbles included).
inline constexpr std::size_t kMaxScheduleActions = 500'000;
inline constexpr std::size_t kMaxScheduleCells = 4 * kMaxScheduleActions;
// The deadlock check's vector clocks: along a pipeline each rank hears of every rank before it, so checking
// costs about 3.5 bytes per (rank, action) pair (GPipe on 8,192 ranks, 3 microbatches: 4 x 10^8 pairs, 1.4 GiB;
// on 65,536 ranks it ran out of memory). At most 2 x 10^8 pairs keeps it under 1 GiB.
inline constexpr std::int64_t kMaxScheduleRankActions = 200'000'000;
// The same clocks are dense once a rank has heard of every rank (the backward half of a pipeline), so they
// also take about 16-27 bytes per (rank, rank) pair: GPipe on 10,000 ranks with 1 microbatch took 1.6 GiB,
// 6,000 ranks 600-720 MiB. At most 4,096 pipeline ranks (a CSV's rows) keeps that part under 500 MiB.
inline constexpr int kMaxScheduleRanks = 4096;

enum class ActionType : std::uint8_t { F, I, W, B, SendF, RecvF, SendB, RecvB, Unshard, Reshard, ReduceGrad, OverlapFB };

struct Action {
  ActionType type;
  int stage = -1, mb = -1;    // mb -1: UNSHARD / RESHARD / REDUCE_GRAD
  int stage2 = -1, mb2 = -1;  // OVERLAP_F_B: the backward half (type2)
  ActionType type2 = ActionType::B;
  Loc loc;                    // CSV: (row, column of the cell); generated: (rank + 1, position + 1)
};

struct Schedule {
  std::string source;                            // file name, or "generated 1F1B ..." for reports
  std::vector<std::vector<std::optional<Action>>> rows;  // per rank; nullopt = bubble
  bool has_comms = false;                        // SEND/RECV actions present (lowered)
  int stages = 0, microbatches = 0;              // derived (max + 1)
};

// Reads a PyTorch pipelining CSV. Throws LoadError at (row, column) for a malformed action
// (e.g. the legacy `BW` token), an empty file, or numbers out of range.
Schedule parse_schedule_csv(const std::string& text, const std::string& source);
Schedule load_schedule_csv(const std::string& path);

// Generators. kind: GPipe, 1F1B, Interleaved1F1B (virtual > 1), ZBH1 (also ZeroBubble, ZB-H1).
// Throws std::invalid_argument with a clear message for impossible parameters (Megatron's
// constraint: interleaving needs microbatches to be a multiple of stages).
Schedule generate_schedule(const std::string& kind, int ranks, int microbatches, int virtual_stages = 1);
std::vector<std::string> schedule_kinds();

// Coverage, order, stage/rank map, UNSHARD/RESHARD, REDUCE_GRAD after the last backward.
std::vector<Diagnostic> validate_schedule(const Schedule& s);

// The same schedule with a RECV before and a SEND after each compute step whose neighbour stage runs
// on another rank (identity for a schedule that already has them).
Schedule with_comms(const Schedule& s);

// Stage -> rank: the first rank whose row computes the stage (-1: none).
std::vector<int> stage_owners(const Schedule& s);

// What a lowered op stands for: its action's type, stage and microbatch (mb -1: UNSHARD, RESHARD, REDUCE_GRAD). A
// Send or Recv (and a Wait of a receive) carries the activation (SendF / RecvF) or the input gradient (SendB / RecvB)
// of `stage`.
struct LoweredStep {
  ActionType type;
  int stage = -1, mb = -1;
};

// Per-rank programs: compute-only schedules get a RECV before and a SEND after each compute step
// whose neighbour stage runs on another rank; every Recv names the tensor it expects (`matches`).
// With `steps`, receives per op what it stands for.
Program lower_schedule(const Schedule& s, P2PModel model, std::vector<LoweredStep>* steps = nullptr);

// The schedule of a program's `schedule:`: generated, or read from its CSV (relative to `path`, the program's file).
// Throws LoadError at the schedule's keys.
Schedule program_schedule(const Program& p, const std::string& path);

// The action grid in the terminal, one line per rank, folded into bands of steps at most 100 columns wide;
// `blocked` cells (by Loc) are marked and each row stops after its blocked cell (schedules/grid.cpp).
std::string schedule_grid(const Schedule& s, const std::vector<Loc>& blocked = {});
// The CSV form of a schedule (as PyTorch writes it).
std::string schedule_csv(const Schedule& s);
// A Chrome / Perfetto trace (JSON): one track per rank, unit-time slices, flows from each send to
// its receive.
std::string schedule_trace(const Schedule& s);

std::string action_text(const Action& a);

}  // namespace spmd
