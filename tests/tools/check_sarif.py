#!/usr/bin/env python3
"""tests/tools/check_sarif.py - `spmdcheck check --format sarif` validates against the SARIF 2.1.0 schema.

Usage: check_sarif.py SPMDCHECK SOURCE_DIR. Runs the checker on every example, golden program and bad
input in one invocation (so the log has results of every kind, and invalid-input results), validates
the log against the SARIF 2.1.0 JSON Schema (not kept in the repository: scripts/sarif-schema.sh takes it
from the npm registry package @microsoft/sarif-multitool-linux into a cache, once), and checks that every
check ID of ir/checks.def has rule metadata and that every result's ruleId/ruleIndex point at its rule.
"""
import glob
import json
import os
import re
import subprocess
import sys

import jsonschema


def main():
    exe, src = sys.argv[1], sys.argv[2]
    files = sorted(glob.glob(os.path.join(src, "examples/**/*.yaml"), recursive=True))
    files += sorted(glob.glob(os.path.join(src, "tests/programs/**/*.yaml"), recursive=True))
    files += sorted(glob.glob(os.path.join(src, "tests/bad_input/*.yaml")))[:10]
    rel = [os.path.relpath(f, src) for f in files]
    run = subprocess.run([exe, "check", "--format", "sarif"] + rel, cwd=src, capture_output=True, text=True)
    if run.returncode not in (0, 1, 2):
        sys.exit(f"spmdcheck exited with {run.returncode}: {run.stderr}")
    log = json.loads(run.stdout)
    got = subprocess.run(["bash", os.path.join(src, "scripts/sarif-schema.sh")], capture_output=True, text=True)
    if got.returncode != 0:
        sys.exit(f"cannot get the SARIF schema (scripts/sarif-schema.sh): {got.stderr}")
    with open(got.stdout.strip()) as f:
        schema = json.load(f)
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    validator = cls(schema)
    errors = sorted(validator.iter_errors(log), key=lambda e: list(e.path))
    for e in errors[:10]:
        print("schema violation at", "/".join(map(str, e.path)), ":", e.message)
    if errors:
        sys.exit(f"{len(errors)} SARIF schema violations")
    ids = re.findall(r'^CHECK_ID\(\w+, "([a-z0-9-]+)"', open(os.path.join(src, "ir/checks.def")).read(), re.M)
    run0 = log["runs"][0]
    rules = run0["tool"]["driver"]["rules"]
    rule_ids = [r["id"] for r in rules]
    missing = [i for i in ids if i not in rule_ids]
    if missing:
        sys.exit(f"check IDs without SARIF rule metadata: {missing}")
    for r in rules:
        if not r.get("shortDescription", {}).get("text") or not r.get("fullDescription", {}).get("text") or not r.get("help", {}).get("text"):
            sys.exit(f"rule {r['id']} lacks a description or help text")
    kinds = set()
    for res in run0["results"]:
        if rules[res["ruleIndex"]]["id"] != res["ruleId"]:
            sys.exit(f"result {res['ruleId']} points at rule {res['ruleIndex']}")
        loc = res["locations"][0]["physicalLocation"]
        if loc["artifactLocation"]["uri"].startswith("/"):
            sys.exit("a relative path must stay a relative URI")
        kinds.add(res["ruleId"])
    if "invalid-input" not in kinds or len(kinds) < 10:
        sys.exit(f"expected results of many rules and invalid-input, got {sorted(kinds)}")
    print(f"SARIF log of {len(files)} files: {len(run0['results'])} results of {len(kinds)} rules, valid against SARIF 2.1.0; "
          f"{len(rules)} rules cover all {len(ids)} check IDs")


main()
