// tests/test_temporal.cpp - every temporal check ID implemented so far: a program that triggers it and a
// near-identical one that does not; the happens-before dump.
#include <doctest/doctest.h>

#include <set>
#include <sstream>

#include "ir/loader.h"
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
