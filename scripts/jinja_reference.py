#!/usr/bin/env python3
"""Renders tests/data/jinja/cases.json with Python's jinja2, configured as HF transformers
configures its chat-template environment, and writes the expected outputs.

    scripts/jinja_reference.py [--cases tests/data/jinja/cases.json] [--out tests/data/jinja/expected.json]

Each case is {"name", "template", "context", optional "options": {"trim_blocks", "lstrip_blocks"}}.
The output maps each name to {"output": str} or {"error": str} (jinja2 raised).
The C++ differential test (tests/unit/tokenizer_jinja_diff_test.cpp) compares against this file
and, when jinja2 is installed, reruns this script to check the committed file is current.
"""
import argparse
import json
import os
import sys

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment


def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    # HF's override of jinja2's tojson: plain json.dumps, no HTML escaping, keys unsorted.
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def make_env(trim_blocks=True, lstrip_blocks=True):
    env = ImmutableSandboxedEnvironment(trim_blocks=trim_blocks, lstrip_blocks=lstrip_blocks,
                                        extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    return env


def render_case(case):
    options = case.get("options", {})
    env = make_env(options.get("trim_blocks", True), options.get("lstrip_blocks", True))
    try:
        return {"output": env.from_string(case["template"]).render(**case.get("context", {}))}
    except Exception as e:  # noqa: BLE001 - any failure is the expected outcome of an error case
        return {"error": f"{type(e).__name__}: {e}"}


def main():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default=os.path.join(root, "tests", "data", "jinja", "cases.json"))
    parser.add_argument("--out", default=os.path.join(root, "tests", "data", "jinja", "expected.json"))
    args = parser.parse_args()
    with open(args.cases, encoding="utf-8") as f:
        cases = json.load(f)
    names = [c["name"] for c in cases]
    if len(names) != len(set(names)):
        sys.exit("duplicate case names in " + args.cases)
    expected = {c["name"]: render_case(c) for c in cases}
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(expected, f, ensure_ascii=False, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
