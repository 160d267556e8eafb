// fuzz/fuzz_import.cpp - libFuzzer target: the captured-graph parsers (FX print_readable text, HLO module text) and
// their lowering through the op tables, on arbitrary bytes.
//
// Bad input must be an ImportError (exit 2 in the CLI); anything else that escapes, and any crash, hang, leak or
// sanitizer report, is a bug. Built only with -DSPMD_FUZZ=ON and clang (scripts/fuzz.sh import MINUTES).
#include <cstddef>
#include <cstdint>
#include <string>

#include "frontends/lower.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size > (1u << 16)) return 0;
  std::string text(reinterpret_cast<const char*>(data), size);
  using namespace spmd::frontends;
  try {
    Graph g = text.rfind("HloModule", 0) == 0 ? parse_hlo(text, "fuzz.hlo") : parse_fx(text, "fuzz.py");
    LowerOptions o;
    o.default_axis = "tp";
    o.default_constant = 0;
    for (const auto& v : g.outputs)
      if (v.k == PyVal::K::Name) o.roots.push_back(v.s);
    lower_graph(g, o);
  } catch (const ImportError&) {
  }
  return 0;
}
