// frontends/yaml_util.h - YAML helpers shared by the mapping files (custom_ops.cpp) and relation files
// (relation.cpp): a node's position, a scalar or a located error.
#pragma once
#include <yaml-cpp/yaml.h>

#include <string>

#include "frontends/graph.h"

namespace spmd::frontends {

inline Loc loc_of(const YAML::Node& n) {
  auto m = n.Mark();
  return {static_cast<std::uint32_t>(m.line + 1), static_cast<std::uint32_t>(m.column + 1)};
}

inline std::string scalar(const YAML::Node& n, const std::string& file, const std::string& what) {
  if (!n.IsScalar()) throw ImportError(file, loc_of(n), what + " must be a scalar");
  return n.Scalar();
}

}  // namespace spmd::frontends
