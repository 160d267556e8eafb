// cli/sarif.h - diagnostics as SARIF 2.1.0 (`spmdcheck check --format sarif`), for GitHub code scanning.
//
// One run per invocation; the tool driver lists a rule for every check ID of ir/checks.def (and
// `invalid-input` for files that cannot be read), so a viewer can show each result's rule text.
#pragma once
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "ir/diagnostic.h"

namespace spmd {

struct SarifFile {
  std::string file;                  // as shown to the user (a relative path stays relative)
  const std::vector<Diagnostic>* diags = nullptr;
  const LoadError* load_error = nullptr;  // set when the file could not be read
};

// The rule metadata of every check ID, in ir/checks.def order, then `invalid-input`.
nlohmann::json sarif_rules();
nlohmann::json render_sarif(const std::vector<SarifFile>& files, const std::string& version);

}  // namespace spmd
