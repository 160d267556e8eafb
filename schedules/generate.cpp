// schedules/generate.cpp - GPipe, 1F1B, interleaved 1F1B and ZB-H1 schedule generators.
//
// Each generator returns compute-only rows (F/B or F/I/W per rank, in run order); lowering adds the
// sends and receives. Pictures: ranks down, time across, Fm / Bm = forward / backward of microbatch m.
#include <fmt/format.h>

#include <stdexcept>

#include "schedules/schedule.h"

#include "ir/ranks.h"

namespace spmd {

namespace {

Action act(ActionType t, int stage, int mb) {
  Action a;
  a.type = t;
  a.stage = stage;
  a.mb = mb;
  return a;
}

// GPipe (Huang et al. 2019; torch.distributed.pipelining.ScheduleGPipe): all forwards, then all
// backwards, in microbatch order. Timeline, 4 ranks, 4 microbatches (time across, . = bubble):
//   rank 0: F0 F1 F2 F3 .  .  .  .  .  .  B0 B1 B2 B3
//   rank 1: .  F0 F1 F2 F3 .  .  .  .  B0 B1 B2 B3
//   rank 2: .  .  F0 F1 F2 F3 .  .  B0 B1 B2 B3
//   rank 3: .  .  .  F0 F1 F2 F3 B0 B1 B2 B3
// (docs/schedules.md shows the action order per rank, as `spmdcheck schedule show` prints it.)
std::vector<Action> gpipe(int r, int, int m) {
  std::vector<Action> row;
  for (int i = 0; i < m; ++i) row.push_back(act(ActionType::F, r, i));
  for (int i = 0; i < m; ++i) row.push_back(act(ActionType::B, r, i));
  return row;
}

// 1F1B (PipeDream-flush, Narayanan et al. 2021; Megatron-LM forward_backward_pipelining_without_
// interleaving; ScheduleOneFOneB): rank r warms up with min(P - r - 1, M) forwards, then alternates
// one forward and one backward, then drains the remaining backwards. 4 ranks, 6 microbatches:
//   rank 0: F0 F1 F2 F3 .  B0 F4 .  B1 F5 .  B2 .  B3 .  B4 .  B5
//   rank 3: .  .  .  F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5
std::vector<Action> one_f_one_b(int r, int p, int m) {
  int warm = std::min(p - r - 1, m);
  std::vector<Action> row;
  for (int i = 0; i < warm; ++i) row.push_back(act(ActionType::F, r, i));
  for (int i = 0; i < m - warm; ++i) {
    row.push_back(act(ActionType::F, r, warm + i));
    row.push_back(act(ActionType::B, r, i));
  }
  for (int i = m - warm; i < m; ++i) row.push_back(act(ActionType::B, r, i));
  return row;
}

// Interleaved 1F1B (Narayanan et al. 2021; Megatron-LM forward_backward_pipelining_with_interleaving;
// ScheduleInterleaved1F1B): each rank holds V model chunks (stage v*P + r). Microbatches go through
// the chunks in groups of P: forward microstep k runs chunk (k / P) % V on microbatch
// (k / (P V)) P + k % P; backward microsteps run the chunks in reverse. Warmup is
// (P - r - 1) * 2 + (V - 1) * P microsteps (capped at M V). Megatron requires M to be a multiple of P.
// 2 ranks, V = 2 (stages 0,2 on rank 0; 1,3 on rank 1), 2 microbatches:
//   rank 0: 0F0 0F1 2F0 2F1 .   .   .   2B0 2B1 0B0 0B1
//   rank 1: .   1F0 1F1 3F0 3B0 3F1 3B1 1B0 1B1
std::vector<Action> interleaved(int r, int p, int m, int v) {
  int total = m * v;
  auto chunk_f = [&](int k) { return (k / p) % v; };
  auto mb_of = [&](int k) { return (k / (p * v)) * p + k % p; };
  auto fwd = [&](int k) { return act(ActionType::F, chunk_f(k) * p + r, mb_of(k)); };
  auto bwd = [&](int k) { return act(ActionType::B, (v - 1 - chunk_f(k)) * p + r, mb_of(k)); };
  int warm = std::min((p - r - 1) * 2 + (v - 1) * p, total);
  std::vector<Action> row;
  for (int k = 0; k < warm; ++k) row.push_back(fwd(k));
  for (int i = 0; i < total - warm; ++i) {
    row.push_back(fwd(warm + i));
    row.push_back(bwd(i));
  }
  for (int k = total - warm; k < total; ++k) row.push_back(bwd(k));
  return row;
}

// ZB-H1 (Qi et al. 2024, "Zero Bubble Pipeline Parallelism", handcrafted schedule 1): 1F1B with each
// backward split into I (input gradient, on the critical path) and W (weight gradient, deferrable);
// rank r defers its W by P - r - 1 backward steps, so the W fill the drain bubbles while the memory
// held stays that of 1F1B. Action order, 4 ranks, 4 microbatches:
//   rank 0: F0 F1 F2 F3 I0 I1 I2 I3 W0 W1 W2 W3
//   rank 1: F0 F1 F2 I0 F3 I1 I2 W0 I3 W1 W2 W3
//   rank 3: F0 I0 W0 F1 I1 W1 F2 I2 W2 F3 I3 W3
std::vector<Action> zb_h1(int r, int p, int m) {
  std::vector<Action> base = one_f_one_b(r, p, m), row;
  int delay = p - r - 1, next_w = 0, done_i = 0;
  for (const Action& a : base) {
    if (a.type != ActionType::B) {
      row.push_back(a);
      continue;
    }
    row.push_back(act(ActionType::I, r, a.mb));
    ++done_i;
    if (done_i > delay && next_w < done_i - delay) row.push_back(act(ActionType::W, r, next_w++));
  }
  while (next_w < m) row.push_back(act(ActionType::W, r, next_w++));
  return row;
}

}  // namespace

std::vector<std::string> schedule_kinds() { return {"GPipe", "1F1B", "Interleaved1F1B", "ZBH1"}; }

Schedule generate_schedule(const std::string& kind, int p, int m, int v) {
  if (p < 1 || p > kMaxRepresentatives)
    throw std::invalid_argument(fmt::format("stages must be between 1 and {}, got {}", kMaxRepresentatives, p));
  if (m < 1 || m > (1 << 20)) throw std::invalid_argument(fmt::format("microbatches must be between 1 and 2^20, got {}", m));
  if (v < 1 || v > 64) throw std::invalid_argument(fmt::format("virtual stages must be between 1 and 64, got {}", v));
  std::string k = kind;
  if (k == "ZeroBubble" || k == "ZB-H1" || k == "ZBH1") k = "ZBH1";
  if (k == "Interleaved1F1B" && v == 1) k = "1F1B";
  if (k != "Interleaved1F1B" && v != 1)
    throw std::invalid_argument(fmt::format("{} has one stage per rank; `virtual_stages: {}` needs Interleaved1F1B", kind, v));
  if (k == "Interleaved1F1B" && m % p != 0)
    throw std::invalid_argument(fmt::format("Interleaved1F1B needs the number of microbatches ({}) to be a multiple of the pipeline size ({}), "
                                            "as Megatron-LM requires; use {} or {} microbatches",
                                            m, p, std::max(p, m / p * p), (m / p + 1) * p));
  if (k != "GPipe" && k != "1F1B" && k != "Interleaved1F1B" && k != "ZBH1") {
    std::vector<std::string> kinds = schedule_kinds();
    auto best = did_you_mean(kind, kinds);
    throw std::invalid_argument(fmt::format("unknown schedule kind '{}'{} (kinds: GPipe, 1F1B, Interleaved1F1B, ZBH1)", kind,
                                            best ? fmt::format("; did you mean '{}'?", *best) : ""));
  }
  // Bound the schedule before building it: F and B (and W for ZBH1) per microbatch and stage.
  std::int64_t actions = std::int64_t{p} * v * m * (k == "ZBH1" ? 3 : 2);
  if (actions > static_cast<std::int64_t>(kMaxScheduleActions))
    throw std::invalid_argument(
        fmt::format("{} with {} stages, {} microbatches{} has {} actions, more than the {} a schedule may have (each is "
                    "lowered to about 4 ops and checked in about 1 KB); use fewer microbatches or stages",
                    k, p * v, m, v > 1 ? fmt::format(" ({} virtual per rank)", v) : "", actions, kMaxScheduleActions));
  if (actions * p > kMaxScheduleRankActions)
    throw std::invalid_argument(
        fmt::format("{} on {} ranks with {} microbatches has {} ranks x {} actions = {}, more than the {} the deadlock check "
                    "can afford (its vector clocks grow with both: each rank hears of every rank before it); use fewer "
                    "ranks or microbatches",
                    k, p, m, p, actions, actions * p, kMaxScheduleRankActions));
  if (p > kMaxScheduleRanks)
    throw std::invalid_argument(
        fmt::format("{} on {} ranks: the deadlock check affords at most {} pipeline ranks (once a rank has heard of every "
                    "rank, its vector clock holds them all: memory grows with the square of the ranks); use fewer ranks",
                    k, p, kMaxScheduleRanks));
  Schedule s;
  s.source = fmt::format("{} ({} ranks, {} microbatches{})", k, p, m, v > 1 ? fmt::format(", {} virtual stages", v) : "");
  for (int r = 0; r < p; ++r) {
    std::vector<Action> row = k == "GPipe" ? gpipe(r, p, m) : k == "1F1B" ? one_f_one_b(r, p, m) : k == "ZBH1" ? zb_h1(r, p, m) : interleaved(r, p, m, v);
    std::vector<std::optional<Action>> cells;
    for (std::size_t i = 0; i < row.size(); ++i) {
      row[i].loc = {static_cast<std::uint32_t>(r + 1), static_cast<std::uint32_t>(i + 1)};
      cells.push_back(row[i]);
    }
    s.rows.push_back(std::move(cells));
  }
  s.stages = p * v;
  s.microbatches = m;
  return s;
}

}  // namespace spmd
