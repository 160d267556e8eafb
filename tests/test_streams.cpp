// tests/test_streams.cpp - stream-to-stream order (WaitStream, CUDA events), serialized streams in the
// deadlock simulation, collectives matched by the tensor they combine, and the schedule size bounds.
#include <doctest/doctest.h>

#include <optional>
#include <set>
#include <stdexcept>

#include "ir/loader.h"
#include "schedules/schedule.h"
#include "spatial/spatial.h"
#include "temporal/temporal.h"

using namespace spmd;

namespace {

std::set<std::string> ids(const std::string& yaml, std::optional<P2PModel> model = std::nullopt) {
  Program p = load_program_string(yaml, "t.yaml");
  std::set<std::string> out;
  for (const auto& d : check_spatial(p)) out.insert(std::string(check_name(d.id)));
  TemporalOptions o;
  o.p2p_model = model;
  for (const auto& d : check_temporal(p, o)) out.insert(std::string(check_name(d.id)));
  return out;
}

const std::set<std::string> kNone;

std::string one(const std::string& ops) {
  return "mesh: {dp: 2}\ntensors:\n  x: {shape: [8, 8]}\n  g: {shape: [8, 8], placement: {dp: P}}\nops:\n" + ops;
}

std::string two(const std::string& a, const std::string& b, const std::string& decl = "  x: {shape: [4, 8]}\n") {
  return "mesh: {cp: 2}\ntensors:\n" + decl + "programs:\n  - ranks: {cp: 0}\n    ops:\n" + a + "  - ranks: {cp: 1}\n    ops:\n" + b;
}

}  // namespace

TEST_CASE("WaitStream orders the other stream's work so far before later work on this stream") {
  std::string w = "  - {op: GELU, in: [x], out: t, stream: side}\n";
  std::string r = "  - {op: ReLU, in: [t], out: u}\n";
  CHECK(ids(one(w + r)) == std::set<std::string>{"data-race"});
  CHECK(ids(one(w + "  - {op: WaitStream, for: side}\n" + r)) == kNone);
  // Only the work issued before the WaitStream: a later write on side is not ordered.
  CHECK(ids(one("  - {op: WaitStream, for: side}\n" + w + r)) == std::set<std::string>{"data-race"});
  // The other direction: side waits for compute.
  CHECK(ids(one("  - {op: GELU, in: [x], out: t}\n  - {op: WaitStream, stream: side, for: compute}\n  - {op: ReLU, in: [t], out: u, stream: side}\n")) ==
        kNone);
  // Waiting on a stream with no work yet, or on itself, orders nothing and is not an error.
  CHECK(ids(one("  - {op: WaitStream, for: nothing_yet}\n  - {op: WaitStream, for: compute}\n")) == kNone);
  // It completes no async op: the result of an async AllReduce still needs its Wait.
  std::string ar = "  - {op: AllReduce, in: [g], out: y, axis: dp, handle: h}\n";
  CHECK(ids(one(ar + "  - {op: WaitStream, for: comm}\n  - {op: ReLU, in: [y], out: z}\n  - {op: Wait, handle: h}\n")) ==
        std::set<std::string>{"missing-wait"});
  // The data-race fix names the WaitStream to insert, and inserting it passes.
  Program p = load_program_string(one(w + r), "t.yaml");
  auto d = check_temporal(p);
  REQUIRE(d.size() == 1);
  CHECK(d[0].notes.back().message.find("{op: WaitStream, for: side}") != std::string::npos);
}

TEST_CASE("RecordEvent / WaitEvent: the wait joins the latest record of the event") {
  std::string w = "  - {op: GELU, in: [x], out: t, stream: side}\n";
  std::string rec = "  - {op: RecordEvent, event: e, stream: side}\n";
  std::string wait = "  - {op: WaitEvent, event: e}\n";
  std::string r = "  - {op: ReLU, in: [t], out: u}\n";
  CHECK(ids(one(w + rec + wait + r)) == kNone);
  CHECK(ids(one(rec + w + wait + r)) == std::set<std::string>{"data-race"});
  // Re-recording moves the point: the wait orders what precedes the latest record, as CUDA does.
  CHECK(ids(one(rec + w + rec + wait + r)) == kNone);
  // A wait issued before the record orders nothing (and the event was never recorded then).
  CHECK(ids(one(w + wait + rec + r)) == std::set<std::string>{"invalid-wait", "data-race"});
  auto d = check_temporal(load_program_string(one(w + "  - {op: RecordEvent, event: ready, stream: side}\n  - {op: WaitEvent, event: raedy}\n" + r), "t.yaml"));
  bool named = false;
  for (const auto& x : d) named |= x.id == CheckId::InvalidWait && x.message.find("did you mean ready?") != std::string::npos;
  CHECK(named);
  // Events are per rank: rank 1 cannot wait for rank 0's record.
  std::string a = "      - {op: RecordEvent, event: e}\n";
  std::string b = "      - {op: WaitEvent, event: e}\n";
  CHECK(ids(two(a, b)) == std::set<std::string>{"invalid-wait"});
  CHECK(ids(two(a + b, a + b)) == kNone);
}

TEST_CASE("serialized streams: ops on one explicit stream start after the previous one completes") {
  std::string s0 = "      - {op: Send, in: [x], peer: {cp: 1}, handle: s, stream: nccl}\n";
  std::string r0 = "      - {op: Recv, out: y, peer: {cp: 1}, handle: r, stream: nccl}\n";
  std::string s1 = "      - {op: Send, in: [x], peer: {cp: 0}, handle: s, stream: nccl}\n";
  std::string r1 = "      - {op: Recv, out: y, peer: {cp: 0}, handle: r, stream: nccl}\n";
  std::string w = "      - {op: WaitAll, handles: [s, r]}\n";
  CHECK(ids(two(s0 + r0 + w, s1 + r1 + w), P2PModel::Rendezvous) == std::set<std::string>{"deadlock"});
  CHECK(ids(two(s0 + r0 + w, s1 + r1 + w), P2PModel::Eager) == kNone);
  CHECK(ids(two(s0 + r0 + w, r1 + s1 + w), P2PModel::Rendezvous) == kNone);  // parity order
  // On the default comm stream (the process group's own streams) the same order completes.
  auto on_comm = [](std::string t) {
    for (std::size_t k; (k = t.find(", stream: nccl")) != std::string::npos;) t.erase(k, 14);
    return t;
  };
  CHECK(ids(on_comm(two(s0 + r0 + w, s1 + r1 + w)), P2PModel::Rendezvous) == kNone);
  // One batched group starts as a unit on its stream.
  std::string g0 = "      - {op: Send, in: [x], peer: {cp: 1}, group: g, stream: nccl}\n      - {op: Recv, out: y, peer: {cp: 1}, group: g, stream: nccl}\n";
  std::string g1 = "      - {op: Send, in: [x], peer: {cp: 0}, group: g, stream: nccl}\n      - {op: Recv, out: y, peer: {cp: 0}, group: g, stream: nccl}\n";
  CHECK(ids(two(g0, g1), P2PModel::Rendezvous) == kNone);
  // The report says the op is queued behind another on its stream.
  auto d = check_temporal(load_program_string(two(s0 + r0 + w, s1 + r1 + w), "t.yaml"));
  REQUIRE(d.size() == 1);
  bool queued = false;
  for (const auto& n : d[0].notes) queued |= n.message.find("is queued on stream nccl behind Send") != std::string::npos;
  CHECK(queued);
  // Collectives: async all-reduces over tp then dp on one stream, in the other order on the other ranks,
  // deadlock although the CPU never blocks before the WaitAll; on comm they complete.
  std::string decl = "mesh: {dp: 2, tp: 2}\ntensors:\n  x: {shape: [8], placement: {tp: P}}\n  y: {shape: [8], placement: {dp: P}}\nprograms:\n";
  std::string xy = "      - {op: AllReduce, in: [x], out: xs, axis: tp, handle: a, stream: nccl}\n"
                   "      - {op: AllReduce, in: [y], out: ys, axis: dp, handle: b, stream: nccl}\n      - {op: WaitAll, handles: [a, b]}\n";
  std::string yx = "      - {op: AllReduce, in: [y], out: ys, axis: dp, handle: b, stream: nccl}\n"
                   "      - {op: AllReduce, in: [x], out: xs, axis: tp, handle: a, stream: nccl}\n      - {op: WaitAll, handles: [a, b]}\n";
  std::string cross = decl + "  - ranks: {dp: 0, tp: 0}\n    ops:\n" + xy + "  - ranks: {dp: 1, tp: 1}\n    ops:\n" + xy +
                      "  - ranks: {dp: 0, tp: 1}\n    ops:\n" + yx + "  - ranks: {dp: 1, tp: 0}\n    ops:\n" + yx;
  CHECK(ids(cross) == std::set<std::string>{"deadlock"});
  CHECK(ids(on_comm(cross)) == kNone);
  // A synchronous collective on a stream waits there too: behind an isend its peer never receives first.
  std::string sync0 = s0 + "      - {op: AllReduce, in: [x], out: z, axis: cp, stream: nccl}\n" + r0 + w;
  std::string sync1 = s1 + "      - {op: AllReduce, in: [x], out: z, axis: cp, stream: nccl}\n" + r1 + w;
  CHECK(ids(two(sync0, sync1, "  x: {shape: [4, 8], placement: {cp: P}}\n"), P2PModel::Rendezvous) == std::set<std::string>{"deadlock"});
}

TEST_CASE("WaitStream and WaitEvent hold a serialized stream until the other stream's communication completes") {
  std::string s0 = "      - {op: Send, in: [x], peer: {cp: 1}, handle: s, stream: a}\n";
  std::string r0 = "      - {op: Recv, out: y, peer: {cp: 1}, handle: r, stream: b}\n";
  std::string s1 = "      - {op: Send, in: [x], peer: {cp: 0}, handle: s, stream: a}\n";
  std::string r1 = "      - {op: Recv, out: y, peer: {cp: 0}, handle: r, stream: b}\n";
  std::string w = "      - {op: WaitAll, handles: [s, r]}\n";
  std::string ws = "      - {op: WaitStream, stream: b, for: a}\n";
  CHECK(ids(two(s0 + r0 + w, s1 + r1 + w), P2PModel::Rendezvous) == kNone);
  CHECK(ids(two(s0 + ws + r0 + w, s1 + ws + r1 + w), P2PModel::Rendezvous) == std::set<std::string>{"deadlock"});
  std::string ev = "      - {op: RecordEvent, event: e, stream: a}\n      - {op: WaitEvent, event: e, stream: b}\n";
  CHECK(ids(two(s0 + ev + r0 + w, s1 + ev + r1 + w), P2PModel::Rendezvous) == std::set<std::string>{"deadlock"});
  // Recorded before the isend: nothing pending then, so nothing to wait for.
  std::string early = "      - {op: RecordEvent, event: e, stream: a}\n";
  std::string late = "      - {op: WaitEvent, event: e, stream: b}\n";
  CHECK(ids(two(early + s0 + late + r0 + w, early + s1 + late + r1 + w), P2PModel::Rendezvous) == kNone);
}

TEST_CASE("collective-mismatch: ranks must combine the same tensor (or say they do with `matches:`)") {
  std::string decl = "  a: {shape: [16], placement: {cp: P}}\n  b: {shape: [16], placement: {cp: P}}\n";
  std::string ab = "      - {op: AllReduce, in: [a], out: a, axis: cp}\n      - {op: AllReduce, in: [b], out: b, axis: cp}\n";
  std::string ba = "      - {op: AllReduce, in: [b], out: b, axis: cp}\n      - {op: AllReduce, in: [a], out: a, axis: cp}\n";
  CHECK(ids(two(ab, ab, decl)) == kNone);
  CHECK(ids(two(ab, ba, decl)) == std::set<std::string>{"collective-mismatch"});
  // Local names of one logical tensor: `matches:` on one side or both.
  std::string l0 = "      - {op: Multiply, in: [a], scalar: 2, out: emb_g}\n      - {op: AllReduce, in: [emb_g], out: emb_g, axis: cp, matches: tied}\n";
  std::string l1 = "      - {op: Multiply, in: [a], scalar: 2, out: head_g}\n      - {op: AllReduce, in: [head_g], out: head_g, axis: cp, matches: tied}\n";
  CHECK(ids(two(l0, l1, decl)) == kNone);
  std::string l1_named = "      - {op: Multiply, in: [a], scalar: 2, out: tied}\n      - {op: AllReduce, in: [tied], out: tied, axis: cp}\n";
  CHECK(ids(two(l0, l1_named, decl)) == kNone);
  std::string l1_other = "      - {op: Multiply, in: [a], scalar: 2, out: head_g}\n      - {op: AllReduce, in: [head_g], out: head_g, axis: cp, matches: other}\n";
  CHECK(ids(two(l0, l1_other, decl)) == std::set<std::string>{"collective-mismatch"});
  // The message names both tensors, and the fix with `matches:` makes it pass.
  auto d = check_temporal(load_program_string(two(ab, ba, decl), "t.yaml"));
  REQUIRE(!d.empty());
  CHECK(d[0].message.find("a and b would be combined") != std::string::npos);
}

TEST_CASE("schedule sizes are bounded before anything is allocated") {
  CHECK_THROWS_AS(generate_schedule("1F1B", 4, 1 << 20), std::invalid_argument);
  CHECK_THROWS_AS(generate_schedule("Interleaved1F1B", 4096, 1 << 20, 64), std::invalid_argument);
  CHECK(generate_schedule("Interleaved1F1B", 64, 1024, 2).rows.size() == 64);
  try {
    generate_schedule("1F1B", 4, 1 << 20);
  } catch (const std::invalid_argument& e) {
    CHECK(std::string(e.what()).find("8388608 actions") != std::string::npos);
  }
  // A CSV with more rows (ranks) than the deadlock check affords (4,096), or with sparse huge stage/microbatch numbers.
  std::string rows;
  for (int r = 0; r < 4097; ++r) rows += "0F0\n";
  CHECK_THROWS_AS(parse_schedule_csv(rows, "big.csv"), LoadError);
  try {
    parse_schedule_csv(rows, "big.csv");
  } catch (const LoadError& e) {
    CHECK(e.loc.line == 4097);
  }
  CHECK_THROWS_AS(parse_schedule_csv("0F0,1048575F1048575\n", "sparse.csv"), LoadError);
}

TEST_CASE("representatives: 65,536 ranks are accepted, one more is a located error") {
  // One program per rank, each exchanging with its ring neighbours by parity (rank-local names).
  auto ring = [](int n) {
    std::string y = "mesh: {r: " + std::to_string(n) + "}\ntensors:\n  x: {shape: [4]}\nprograms:\n";
    for (int k = 0; k < n; ++k) {
      std::string K = std::to_string(k), next = std::to_string((k + 1) % n), prev = std::to_string((k + n - 1) % n);
      std::string send = "      - {op: Send, in: [x], peer: {r: " + next + "}}\n";
      std::string recv = "      - {op: Recv, out: y_" + K + ", peer: {r: " + prev + "}}\n";
      y += "  - ranks: {r: " + K + "}\n    ops:\n" + (k % 2 ? recv + send : send + recv);
    }
    return y;
  };
  Program p = load_program_string(ring(5000), "t.yaml");  // more than the old cap of 4,096
  CHECK(check_temporal(p).empty());
  CHECK_THROWS_AS(load_program_string("mesh: {a: 256, b: 257}\ntensors:\n  x: {shape: [4]}\nprograms:\n  - ranks: {a: 0, b: 0}\n    ops: []\n", "t.yaml"),
                  LoadError);
}
