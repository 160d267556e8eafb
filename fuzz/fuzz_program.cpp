// fuzz/fuzz_program.cpp - libFuzzer target: the YAML loader, every check and the numeric oracle on arbitrary bytes.
//
// Bad input must be a LoadError (exit 2 in the CLI); anything else that escapes, and any crash, hang, leak or
// sanitizer report, is a bug. Built only with -DSPMD_FUZZ=ON and clang (scripts/fuzz.sh).
#include <cstddef>
#include <cstdint>
#include <string>

#include "interp/interp.h"
#include "ir/loader.h"
#include "spatial/spatial.h"
#include "temporal/temporal.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size > (1u << 16)) return 0;
  std::string text(reinterpret_cast<const char*>(data), size);
  spmd::Program p;
  try {
    p = spmd::load_program_string(text, "fuzz.yaml");
  } catch (const spmd::LoadError&) {
    return 0;
  }
  spmd::SpatialOptions so;
  so.z3_timeout_ms = 200;
  spmd::check_spatial(p, so);
  spmd::check_temporal(p, {});
  spmd::OracleOptions oo;
  oo.max_elements = 1 << 12;
  oo.max_work = 1 << 20;
  oo.max_ranks = 16;
  spmd::run_oracle(p, oo);
  return 0;
}
