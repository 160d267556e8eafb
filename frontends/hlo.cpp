// frontends/hlo.cpp - the parser of HLO module text (as_text(), XLA dumps).
#include "frontends/graph.h"

namespace spmd::frontends {

std::string hlo_dtype(const std::string& s) {
  static const std::pair<const char*, const char*> map[] = {{"f32", "f32"}, {"f64", "f64"}, {"f16", "f16"}, {"bf16", "bf16"}, {"s64", "i64"}, {"s32", "i32"},
                                                            {"s16", "i32"}, {"s8", "i8"},   {"u8", "i8"},   {"u32", "i64"},   {"pred", "bool"}};
  for (const auto& [k, v] : map)
    if (s == k) return v;
  return {};
}

Graph parse_hlo(const std::string&, const std::string& file) { throw ImportError(file, {1, 1}, "HLO import is not implemented yet"); }

}  // namespace spmd::frontends
