#!/usr/bin/env python3
"""bench/reduce_sizes.py IN.yaml OUT.yaml: a copy of an imported program (named `sizes:`, docs/import.md) with every
named size shrunk greedily to its smallest divisor (at least 2; 4 for sizes of 64 or more) under which every size
expression of the program (shapes, slice bounds, split sizes, Arange bounds, on every rank) is still an exact
positive integer. A stand-in for the value check's automatic shape reduction (issue 20) until it lands: exact
divisions are what keep the partition structure (a shard per rank, a head split, a vocab range per rank)."""
import re
import sys
from fractions import Fraction

EXPR = re.compile(r"(?:shape|sizes): \[([^\]]*)\]|(?:start|end): '([^']*)'|(?:start|end): ([A-Za-z0-9_*/()+ -]+?)(?=[,}])")


def sizes_of(text):
    m = re.search(r'^sizes:.*\n((?:  \w+: \d+\n)+)', text, re.M)
    return [(k, int(v)) for k, v in re.findall(r'^  (\w+): (\d+)$', m.group(1), re.M)] if m else []


def with_sizes(text, vals):
    for k, v in vals.items():
        text = re.sub(r'^  %s: \d+$' % re.escape(k), '  %s: %d' % (k, v), text, count=1, flags=re.M)
    return text


def expressions(text):
    out = set()
    for lst, q, plain in EXPR.findall(text):
        if lst:
            out.update(e.strip() for e in lst.split(',') if e.strip())
        for e in (q, plain):
            if e and e.strip():
                out.add(e.strip())
    return sorted(out)


def value(expr, env, rank):
    e = re.sub(r'axis_index\(\w+\)', str(rank), expr)
    e = re.sub(r'\b([A-Za-z_]\w*)\b', lambda m: 'F(%d)' % env[m.group(1)], e)
    e = re.sub(r'(?<![\w)])(\d+)', r'F(\1)', e)
    return eval(e, {'F': Fraction})


def valid(exprs, env):
    for r in range(env.get('TP', 1)):
        for e in exprs:
            v = value(e, env, r)
            if v.denominator != 1 or v < 0:
                return False
    return True


def main():
    src, dst = sys.argv[1:3]
    text = open(src).read()
    exprs = expressions(text)
    orig = dict(sizes_of(text))
    vals = dict(orig)
    changed = True
    while changed:  # until no size shrinks further (one size's divisibility may wait for another's)
        changed = False
        for k, v in sorted(orig.items(), key=lambda kv: -kv[1]):
            if k == 'TP':
                continue
            floor = 2 if v < 64 else 4
            for d in sorted(x for x in range(1, v + 1) if v % x == 0):
                if d < min(floor, v) or d >= vals[k]:
                    continue
                trial = dict(vals, **{k: d})
                if valid(exprs, trial):
                    vals, changed = trial, True
                    break
    open(dst, 'w').write(with_sizes(text, vals))
    print(', '.join('%s %d -> %d' % (k, v, vals[k]) for k, v in orig.items() if vals[k] != v))


main()
