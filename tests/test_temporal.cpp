// tests/test_temporal.cpp - every temporal check ID implemented so far: a program that triggers it and a
// near-identical one that does not; the happens-before dump.
#include <doctest/doctest.h>

#include <optional>
#include <set>
#include <sstream>

#include "ir/loader.h"
#include "spatial/spatial.h"
#include "temporal/temporal.h"

using namespace spmd;

namespace {

std::set<std::string> tids(const std::string& ops) {
  std::string yaml = "mesh: {dp: 2}\ntensors:\n  g: {shape: [8, 8], placement: {dp: P}}\n  x: {shape: [8, 8]}\nops:\n" + ops;
  std::set<std::string> out;
  for (const auto& d : check_temporal(load_program_string(yaml, "t.yaml"))) out.insert(std::string(check_name(d.id)));
  return out;
}

const std::set<std::string> kNone;

}  // namespace

TEST_CASE("missing-wait: reading an async result before its Wait") {
  CHECK(tids("  - {op: AllReduce, in: [g], out: r, axis: dp, handle: h}\n  - {op: Wait, handle: h}\n  - {op: GELU, in: [r], out: y}\n") == kNone);
  CHECK(tids("  - {op: AllReduce, in: [g], out: r, axis: dp, handle: h}\n  - {op: GELU, in: [r], out: y}\n  - {op: Wait, handle: h}\n") ==
        std::set<std::string>{"missing-wait"});
  // A Wait on another stream does not order the compute stream.
  CHECK(tids("  - {op: AllReduce, in: [g], out: r, axis: dp, handle: h}\n  - {op: Wait, handle: h, stream: side}\n  - {op: GELU, in: [r], out: y}\n") ==
        std::set<std::string>{"missing-wait"});
  CHECK(tids("  - {op: AllReduce, in: [g], out: r, axis: dp, handle: h}\n  - {op: Wait, handle: h, stream: side}\n"
             "  - {op: GELU, in: [r], out: y, stream: side}\n") == kNone);
  // Overwriting an async op's output before its Wait is also an access without the Wait.
  CHECK(tids("  - {op: AllReduce, in: [g], out: r, axis: dp, handle: h}\n  - {op: GELU, in: [x], out: r}\n  - {op: Wait, handle: h}\n") ==
        std::set<std::string>{"missing-wait"});
}

TEST_CASE("data-race: overwriting the input of an in-flight op, unordered streams") {
  CHECK(tids("  - {op: AllReduce, in: [g], out: r, axis: dp, handle: h}\n  - {op: Wait, handle: h}\n  - {op: GELU, in: [x], out: g}\n") == kNone);
  CHECK(tids("  - {op: AllReduce, in: [g], out: r, axis: dp, handle: h}\n  - {op: GELU, in: [x], out: g}\n  - {op: Wait, handle: h}\n") ==
        std::set<std::string>{"data-race"});
  CHECK(tids("  - {op: GELU, in: [x], out: t, stream: a}\n  - {op: GELU, in: [t], out: u, stream: a}\n") == kNone);
  CHECK(tids("  - {op: GELU, in: [x], out: t, stream: a}\n  - {op: GELU, in: [t], out: u, stream: b}\n") == std::set<std::string>{"data-race"});
  // Reads never race with reads; an in-place async op does not race with itself.
  CHECK(tids("  - {op: GELU, in: [x], out: t, stream: a}\n  - {op: GELU, in: [x], out: u, stream: b}\n") == kNone);
  CHECK(tids("  - {op: AllReduce, in: [g], out: g, axis: dp, handle: h}\n  - {op: Wait, handle: h}\n") == kNone);
}

TEST_CASE("buffer-aliasing: two in-flight async writes to one buffer") {
  CHECK(tids("  - {op: AllReduce, in: [g], out: r1, axis: dp, handle: a}\n  - {op: AllReduce, in: [g], out: r2, axis: dp, handle: b}\n"
             "  - {op: WaitAll, handles: [a, b]}\n") == kNone);
  CHECK(tids("  - {op: AllReduce, in: [g], out: r, axis: dp, handle: a}\n  - {op: AllReduce, in: [g], out: r, axis: dp, handle: b}\n"
             "  - {op: WaitAll, handles: [a, b]}\n") == std::set<std::string>{"buffer-aliasing"});
  CHECK(tids("  - {op: AllReduce, in: [g], out: r, axis: dp, handle: a}\n  - {op: Wait, handle: a}\n"
             "  - {op: AllReduce, in: [g], out: r, axis: dp, handle: b}\n  - {op: Wait, handle: b}\n") == kNone);
}

TEST_CASE("orphaned-handle and invalid-wait") {
  CHECK(tids("  - {op: AllReduce, in: [g], out: r, axis: dp, handle: h}\n") == std::set<std::string>{"orphaned-handle"});
  CHECK(tids("  - {op: AllReduce, in: [g], out: r, axis: dp, handle: h}\n  - {op: Wait, handle: h}\n  - {op: Wait, handle: h}\n") ==
        std::set<std::string>{"invalid-wait"});
  auto d = check_temporal(load_program_string(
      "mesh: {dp: 2}\ntensors:\n  g: {shape: [8], placement: {dp: P}}\nops:\n  - {op: AllReduce, in: [g], out: r, axis: dp, handle: grads}\n"
      "  - {op: Wait, handle: grad}\n  - {op: Wait, handle: grads}\n",
      "t.yaml"));
  REQUIRE(d.size() == 1);
  CHECK(check_name(d[0].id) == "invalid-wait");
  CHECK(d[0].message.find("did you mean grads?") != std::string::npos);
  CHECK(d[0].loc.line == 6);
}

TEST_CASE("diagnostics name both ops, the handle and the missing Wait") {
  auto d = check_temporal(load_program_string(
      "mesh: {dp: 2}\ntensors:\n  g: {shape: [8], placement: {dp: P}}\nops:\n  - {op: AllReduce, in: [g], out: r, axis: dp, handle: h1}\n"
      "  - {op: AllReduce, in: [g], out: s, axis: dp, handle: h2}\n  - {op: Wait, handle: h2}\n  - {op: GELU, in: [r], out: y}\n  - {op: Wait, handle: h1}\n",
      "t.yaml"));
  REQUIRE(d.size() == 1);
  CHECK(d[0].loc.line == 8);
  CHECK(d[0].message.find("no Wait(h1) on stream compute before this read") != std::string::npos);
  CHECK(d[0].tensor == "r");
  bool wrong_handle_note = false;
  for (const auto& n : d[0].notes) wrong_handle_note |= n.message.find("completes h2, not h1") != std::string::npos;
  CHECK(wrong_handle_note);
}

TEST_CASE("the happens-before graph dumps as DOT with a cluster per stream") {
  Program p = load_program_string("mesh: {dp: 2}\ntensors:\n  g: {shape: [8], placement: {dp: P}}\nops:\n"
                                  "  - {op: AllReduce, in: [g], out: r, axis: dp, handle: h}\n  - {op: Wait, handle: h}\n",
                                  "t.yaml");
  std::ostringstream out;
  write_hb_dot(p, out);
  std::string dot = out.str();
  CHECK(dot.rfind("digraph hb {", 0) == 0);
  CHECK(dot.find("stream comm") != std::string::npos);
  CHECK(dot.find("stream compute") != std::string::npos);
  CHECK(dot.find("e0 -> e1") != std::string::npos);  // completion of the AllReduce -> its Wait
}

TEST_CASE("a handle name may be reused once waited; accesses keep their own issue") {
  const char* first = "  - {op: AllReduce, in: [g], out: r, axis: dp, handle: h}\n  - {op: Wait, handle: h}\n";
  CHECK(tids(std::string(first) + "  - {op: AllReduce, in: [g], out: r2, axis: dp, handle: h}\n  - {op: GELU, in: [r], out: y}\n"
                                  "  - {op: Wait, handle: h}\n") == kNone);
  CHECK(tids(std::string(first) + "  - {op: AllReduce, in: [g], out: r2, axis: dp, handle: h}\n  - {op: GELU, in: [r2], out: y}\n"
                                  "  - {op: Wait, handle: h}\n") == std::set<std::string>{"missing-wait"});
  // Reusing a name while its op is still unwaited is reported once, at the reuse.
  auto d = check_temporal(load_program_string("mesh: {dp: 2}\ntensors:\n  g: {shape: [8], placement: {dp: P}}\nops:\n"
                                              "  - {op: AllReduce, in: [g], out: r, axis: dp, handle: h}\n"
                                              "  - {op: AllReduce, in: [g], out: s, axis: dp, handle: h}\n  - {op: Wait, handle: h}\n",
                                              "t.yaml"));
  REQUIRE(d.size() == 1);
  CHECK(check_name(d[0].id) == "orphaned-handle");
  CHECK(d[0].loc.line == 6);
  CHECK(tids("  - {op: AllReduce, in: [g], out: r, axis: dp, handle: a}\n  - {op: WaitAll, handles: [a, a]}\n") ==
        std::set<std::string>{"invalid-wait"});
}

TEST_CASE("WaitAll is one event after every handle it completes") {
  Program p = load_program_string("mesh: {dp: 2}\ntensors:\n  g: {shape: [8], placement: {dp: P}}\nops:\n"
                                  "  - {op: AllReduce, in: [g], out: r, axis: dp, handle: a}\n"
                                  "  - {op: AllReduce, in: [g], out: s, axis: dp, handle: b}\n  - {op: WaitAll, handles: [a, b]}\n",
                                  "t.yaml");
  std::ostringstream out;
  write_hb_dot(p, out);
  std::string dot = out.str();
  CHECK(dot.find("e0 -> e2") != std::string::npos);
  CHECK(dot.find("e1 -> e2") != std::string::npos);
  CHECK(dot.find("e3") == std::string::npos);  // three ops, three events
}

// ---- per-rank programs: point-to-point, collectives across programs, deadlocks ----------------
namespace {

// Runs every check (spatial types included: p2p-mismatch on declared Recv types is a type check).
std::set<std::string> all_ids(const std::string& yaml, std::optional<P2PModel> model = std::nullopt) {
  Program p = load_program_string(yaml, "t.yaml");
  std::set<std::string> out;
  for (const auto& d : check_spatial(p)) out.insert(std::string(check_name(d.id)));
  TemporalOptions o;
  o.p2p_model = model;
  for (const auto& d : check_temporal(p, o)) out.insert(std::string(check_name(d.id)));
  return out;
}

// Two ranks on pp: rank 0 runs `a`, rank 1 runs `b` (each a list of op lines).
std::string two(const std::string& a, const std::string& b, const std::string& extra = "") {
  return "mesh: {pp: 2}\ntensors:\n  x: {shape: [4, 8]}\n" + extra + "programs:\n  - ranks: {pp: 0}\n    ops:\n" + a +
         "  - ranks: {pp: 1}\n    ops:\n" + b;
}

const std::string kSend0 = "      - {op: Send, in: [x], peer: {pp: 1}}\n";
const std::string kRecv0 = "      - {op: Recv, out: y, peer: {pp: 1}}\n";
const std::string kSend1 = "      - {op: Send, in: [x], peer: {pp: 0}}\n";
const std::string kRecv1 = "      - {op: Recv, out: y, peer: {pp: 0}}\n";

}  // namespace

TEST_CASE("unmatched-p2p: a Send or Recv with no partner (FIFO per pair)") {
  CHECK(all_ids(two(kSend0, kRecv1)) == kNone);
  CHECK(all_ids(two(kSend0 + kSend0, kRecv1)) == std::set<std::string>{"unmatched-p2p"});
  CHECK(all_ids(two("      - {op: GELU, in: [x], out: z}\n", kRecv1)) == std::set<std::string>{"unmatched-p2p"});
  // A Recv with no Send must not also be called a deadlock (the peer finished).
  Program p = load_program_string(two("      - {op: GELU, in: [x], out: z}\n", kRecv1), "t.yaml");
  auto d = check_temporal(p);
  REQUIRE(d.size() == 1);
  CHECK(d[0].message.find("has no matching Send") != std::string::npos);
  CHECK(d[0].ranks == std::vector<std::string>{"{pp: 0}", "{pp: 1}"});
}

TEST_CASE("p2p-mismatch: a Recv declares another shape, dtype or placement than its Send sends") {
  CHECK(all_ids(two(kSend0, "      - {op: Recv, out: y, peer: {pp: 0}, shape: [4, 8], dtype: f32}\n")) == kNone);
  CHECK(all_ids(two(kSend0, "      - {op: Recv, out: y, peer: {pp: 0}, shape: [8, 4]}\n")) == std::set<std::string>{"p2p-mismatch"});
  CHECK(all_ids(two(kSend0, "      - {op: Recv, out: y, peer: {pp: 0}, dtype: bf16}\n")) == std::set<std::string>{"p2p-mismatch"});
  CHECK(all_ids(two(kSend0, "      - {op: Recv, out: y, peer: {pp: 0}, placement: [R]}\n")) == kNone);
  CHECK(all_ids(two(kSend0, "      - {op: Recv, out: y, peer: {pp: 0}, placement: [S(0)]}\n")) == std::set<std::string>{"p2p-mismatch"});
  // FIFO: the second Recv gets the second Send's tensor, whatever the Recv expects.
  std::string sends = "      - {op: Send, in: [x], peer: {pp: 1}}\n      - {op: Send, in: [w], peer: {pp: 1}}\n";
  std::string w = "  w: {shape: [16]}\n";
  std::string yaml_ok = "mesh: {pp: 2}\ntensors:\n  x: {shape: [4, 8]}\n" + w + "programs:\n  - ranks: {pp: 0}\n    ops:\n" + sends +
                        "  - ranks: {pp: 1}\n    ops:\n      - {op: Recv, out: a, peer: {pp: 0}, shape: [4, 8]}\n"
                        "      - {op: Recv, out: b, peer: {pp: 0}, shape: [16]}\n";
  CHECK(all_ids(yaml_ok) == kNone);
  std::string swapped = "mesh: {pp: 2}\ntensors:\n  x: {shape: [4, 8]}\n" + w + "programs:\n  - ranks: {pp: 0}\n    ops:\n" + sends +
                        "  - ranks: {pp: 1}\n    ops:\n      - {op: Recv, out: b, peer: {pp: 0}, shape: [16]}\n"
                        "      - {op: Recv, out: a, peer: {pp: 0}, shape: [4, 8]}\n";
  CHECK(all_ids(swapped) == std::set<std::string>{"p2p-mismatch"});
  // The received value carries the Send's type downstream: a nonlinear op on a P value is caught.
  std::string partial = "mesh: {pp: 2, tp: 2}\ntensors:\n  x: {shape: [4, 8], placement: {tp: P}}\nprograms:\n  - ranks: {pp: 0}\n    ops:\n" +
                        kSend0 + "  - ranks: {pp: 1}\n    ops:\n" + kRecv1 + "      - {op: GELU, in: [y], out: z}\n";
  CHECK(all_ids(partial) == std::set<std::string>{"partial-misuse"});
}

TEST_CASE("collective-mismatch: order, kind, count and shape across programs") {
  std::string ar = "      - {op: AllReduce, in: [g], out: r, axis: pp}\n";
  std::string ag = "      - {op: AllGather, in: [s], out: t, axis: pp, dim: 0}\n";
  std::string decl = "mesh: {pp: 2}\ntensors:\n  g: {shape: [4, 8], placement: {pp: P}}\n  s: {shape: [4, 8], placement: {pp: S(0)}}\n";
  auto prog = [&](const std::string& a, const std::string& b) {
    return decl + "programs:\n  - ranks: {pp: 0}\n    ops:\n" + a + "  - ranks: {pp: 1}\n    ops:\n" + b;
  };
  CHECK(all_ids(prog(ar + ag, ar + ag)) == kNone);
  CHECK(all_ids(prog(ar + ag, ag + ar)) == std::set<std::string>{"collective-mismatch"});
  CHECK(all_ids(prog(ar + ag, ar)) == std::set<std::string>{"collective-mismatch"});
  CHECK(all_ids(prog(ar, "      - {op: GELU, in: [s], out: q}\n")) == std::set<std::string>{"collective-mismatch"});
  CHECK(all_ids(decl + "  m: {shape: [4, 8], placement: {pp: P(max)}}\nprograms:\n  - ranks: {pp: 0}\n    ops:\n" + ar +
                "  - ranks: {pp: 1}\n    ops:\n      - {op: AllReduce, in: [m], out: r, axis: pp, reduce: max}\n") ==
        std::set<std::string>{"collective-mismatch"});
  // Same kind and axis, different shapes.
  std::string decl2 = decl + "  h: {shape: [4, 16], placement: {pp: P}}\n";
  CHECK(all_ids(decl2 + "programs:\n  - ranks: {pp: 0}\n    ops:\n" + ar + "  - ranks: {pp: 1}\n    ops:\n      - {op: AllReduce, in: [h], out: r, axis: pp}\n") ==
        std::set<std::string>{"collective-mismatch"});
  // Collectives over an axis no program distinguishes are always matched (symmetric ranks).
  CHECK(all_ids("mesh: {pp: 2, dp: 4}\ntensors:\n  g: {shape: [4, 8], placement: {dp: P}}\nprograms:\n  - ranks: {pp: 0}\n    ops:\n"
                "      - {op: AllReduce, in: [g], out: r, axis: dp}\n  - ranks: {pp: 1}\n    ops: []\n") == kNone);
}

TEST_CASE("deadlock: blocking sends under rendezvous, not under eager; batched groups and isend avoid it") {
  std::string send_first = two(kSend0 + kRecv0, kSend1 + kRecv1);
  CHECK(all_ids(send_first, P2PModel::Rendezvous) == std::set<std::string>{"deadlock"});
  CHECK(all_ids(send_first, P2PModel::Eager) == kNone);
  CHECK(all_ids(two(kSend0 + kRecv0, kRecv1 + kSend1), P2PModel::Rendezvous) == kNone);
  // Receive first on both sides deadlocks under both models.
  std::string recv_first = two(kRecv0 + kSend0, kRecv1 + kSend1);
  CHECK(all_ids(recv_first, P2PModel::Rendezvous) == std::set<std::string>{"deadlock"});
  CHECK(all_ids(recv_first, P2PModel::Eager) == std::set<std::string>{"deadlock"});
  // The YAML key chooses the model; the option overrides it.
  CHECK(all_ids(two(kSend0 + kRecv0, kSend1 + kRecv1, "p2p_model: eager\n")) == kNone);
  CHECK(all_ids(two(kSend0 + kRecv0, kSend1 + kRecv1, "p2p_model: eager\n"), P2PModel::Rendezvous) == std::set<std::string>{"deadlock"});
  // A batched group posts both at once.
  std::string g0 = "      - {op: Send, in: [x], peer: {pp: 1}, group: g}\n      - {op: Recv, out: y, peer: {pp: 1}, group: g}\n";
  std::string g1 = "      - {op: Send, in: [x], peer: {pp: 0}, group: g}\n      - {op: Recv, out: y, peer: {pp: 0}, group: g}\n";
  CHECK(all_ids(two(g0, g1), P2PModel::Rendezvous) == kNone);
  // isend: the send does not block at issue; its Wait does, after the receive.
  std::string i0 = "      - {op: Send, in: [x], peer: {pp: 1}, handle: s}\n" + kRecv0 + "      - {op: Wait, handle: s}\n";
  std::string i1 = "      - {op: Send, in: [x], peer: {pp: 0}, handle: s}\n" + kRecv1 + "      - {op: Wait, handle: s}\n";
  CHECK(all_ids(two(i0, i1), P2PModel::Rendezvous) == kNone);
  // Waiting for the isend before the receive brings the cycle back.
  std::string w0 = "      - {op: Send, in: [x], peer: {pp: 1}, handle: s}\n      - {op: Wait, handle: s}\n" + kRecv0;
  std::string w1 = "      - {op: Send, in: [x], peer: {pp: 0}, handle: s}\n      - {op: Wait, handle: s}\n" + kRecv1;
  CHECK(all_ids(two(w0, w1), P2PModel::Rendezvous) == std::set<std::string>{"deadlock"});
  // The report names the cycle and each rank's blocked op.
  auto d = check_temporal(load_program_string(send_first, "t.yaml"));
  REQUIRE(d.size() == 1);
  CHECK(d[0].message.find("{pp: 0} -> {pp: 1} -> {pp: 0}") != std::string::npos);
  CHECK(d[0].ranks == std::vector<std::string>{"{pp: 0}", "{pp: 1}"});
  int blocked = 0;
  for (const auto& n : d[0].notes) blocked += n.message.find("is blocked here: Send to") != std::string::npos;
  CHECK(blocked == 2);
}

TEST_CASE("pipelines: forward 0 -> 1 and backward 1 -> 0 are not a deadlock") {
  std::string s0 = kSend0 + "      - {op: Recv, out: dy, peer: {pp: 1}}\n";
  std::string s1 = kRecv1 + "      - {op: Send, in: [y], peer: {pp: 0}}\n";
  CHECK(all_ids(two(s0, s1), P2PModel::Rendezvous) == kNone);
  CHECK(all_ids(two(s0, s1), P2PModel::Eager) == kNone);
  // Four microbatches, all forwards then all backwards (GPipe) on 2 stages.
  std::string a, b;
  for (int m = 0; m < 4; ++m) a += kSend0, b += kRecv1;
  for (int m = 0; m < 4; ++m) b += "      - {op: Send, in: [y], peer: {pp: 0}}\n", a += "      - {op: Recv, out: dy, peer: {pp: 1}}\n";
  CHECK(all_ids(two(a, b), P2PModel::Rendezvous) == kNone);
}

TEST_CASE("per-rank order checks: an async Recv read before its Wait, on the rank that does it") {
  std::string r1 = "      - {op: Recv, out: y, peer: {pp: 0}, handle: h}\n      - {op: GELU, in: [y], out: z}\n      - {op: Wait, handle: h}\n";
  std::string ok1 = "      - {op: Recv, out: y, peer: {pp: 0}, handle: h}\n      - {op: Wait, handle: h}\n      - {op: GELU, in: [y], out: z}\n";
  CHECK(all_ids(two(kSend0, ok1)) == kNone);
  auto d = check_temporal(load_program_string(two(kSend0, r1), "t.yaml"));
  REQUIRE(d.size() == 1);
  CHECK(check_name(d[0].id) == "missing-wait");
  CHECK(d[0].ranks == std::vector<std::string>{"{pp: 1}"});
  CHECK(d[0].message.find("(on rank {pp: 1})") != std::string::npos);
  // The Recv's Wait orders the data after the Send: reading after it is fine even across streams of the sender.
}

TEST_CASE("OverlapRegion: compute that runs while named async ops are in flight") {
  std::string pre = "  - {op: AllReduce, in: [g], out: r, axis: dp, handle: h}\n";
  CHECK(tids(pre + "  - {op: OverlapRegion, in: [x], out: [x], handles: [h]}\n  - {op: Wait, handle: h}\n") == kNone);
  // Reading the in-flight result inside the region is a missing Wait.
  CHECK(tids(pre + "  - {op: OverlapRegion, in: [r], out: [x], handles: [h]}\n  - {op: Wait, handle: h}\n") == std::set<std::string>{"missing-wait"});
  // A region that names a completed op overlaps nothing.
  CHECK(tids(pre + "  - {op: Wait, handle: h}\n  - {op: OverlapRegion, in: [x], out: [x], handles: [h]}\n") == std::set<std::string>{"invalid-wait"});
  CHECK(tids(pre + "  - {op: OverlapRegion, in: [x], out: [x], handles: [k]}\n  - {op: Wait, handle: h}\n") == std::set<std::string>{"invalid-wait"});
}

TEST_CASE("review regressions: roots must agree, a self-send is unmatched not a deadlock, a Wait on another stream is moved") {
  std::string b0 = "      - {op: Broadcast, in: [x], out: a, axis: pp, src: 0}\n";
  CHECK(all_ids(two(b0, b0)) == kNone);
  CHECK(all_ids(two(b0, "      - {op: Broadcast, in: [x], out: a, axis: pp, src: 1}\n")) == std::set<std::string>{"collective-mismatch"});
  CHECK(all_ids("mesh: {cp: 2}\ntensors: {x: {shape: [4]}}\nops: [{op: Send, in: [x], peer: {}}]\n") == std::set<std::string>{"unmatched-p2p"});
  auto d = check_temporal(load_program_string(two("      - {op: Send, in: [x], peer: {pp: 1}, handle: s}\n      - {op: Wait, handle: s, stream: side}\n"
                                                  "      - {op: GELU, in: [x], out: x}\n",
                                                  kRecv1),
                                              "t.yaml"));
  REQUIRE(d.size() == 1);
  CHECK(check_name(d[0].id) == "data-race");
  CHECK(d[0].notes.back().message.find("move the Wait of s (line 8) to stream compute") != std::string::npos);
}
