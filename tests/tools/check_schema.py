#!/usr/bin/env python3
"""tests/tools/check_schema.py - every example validates against `spmdcheck schema`; malformed ones do not.

Usage: check_schema.py SPMDCHECK SOURCE_DIR. The schema is generated from the op table, so this test
also catches drift between the loader and the schema: a file the loader accepts (every example, golden
program and tutorial file) must validate, and each bad input listed in tests/bad_input/schema_rejects.txt
(the malformed inputs whose fault is visible to a schema: an unknown key or op, a wrong value type, a
bad placement, a missing required key or attribute) must be rejected.
"""
import glob
import json
import os
import subprocess
import sys

import jsonschema
import yaml


def load(path):
    with open(path) as f:
        return yaml.safe_load(f)


def main():
    exe, src = sys.argv[1], sys.argv[2]
    run = subprocess.run([exe, "schema"], capture_output=True, text=True, check=True)
    schema = json.loads(run.stdout)
    jsonschema.Draft7Validator.check_schema(schema)
    v = jsonschema.Draft7Validator(schema)
    good = []
    for pat in ("examples/**/*.yaml", "tests/programs/**/*.yaml", "docs/tutorial/*.yaml"):
        good += sorted(glob.glob(os.path.join(src, pat), recursive=True))
    bad_good = 0
    for f in good:
        errs = list(v.iter_errors(load(f)))
        if errs:
            bad_good += 1
            e = errs[0]
            print(f"FAIL {os.path.relpath(f, src)}: rejected at {'/'.join(map(str, e.path))}: {e.message[:200]}")
    listed = [l.strip() for l in open(os.path.join(src, "tests/bad_input/schema_rejects.txt")) if l.strip() and not l.startswith("#")]
    bad_bad = 0
    for name in listed:
        path = os.path.join(src, "tests/bad_input", name)
        try:
            doc = load(path)
        except yaml.YAMLError:
            continue  # not even YAML: nothing for a schema to see
        if v.is_valid(doc):
            bad_bad += 1
            print(f"FAIL tests/bad_input/{name}: malformed, but the schema accepts it")
    print(f"{len(good) - bad_good} of {len(good)} programs validate; {len(listed) - bad_bad} of {len(listed)} malformed inputs rejected")
    if bad_good or bad_bad or len(good) < 50 or len(listed) < 10:
        sys.exit(1)


main()
