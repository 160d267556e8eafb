#!/usr/bin/env python3
"""tests/tools/check_report.py - `spmdcheck report` pages, opened in headless Chromium.

Usage: check_report.py SPMDCHECK SOURCE_DIR OUT_DIR [CHROMIUM]. For a few programs (a sharding bug, a
deadlocked ring, pipeline schedules, a training step, a strided FSDP2 shard, a zigzag sequence) it writes the
report, checks that the page loads nothing from elsewhere, opens it in Debian's chromium (--dump-dom with
console logging to stderr), and requires: the page's own self-check verdict `ok` in <body data-selfcheck>,
the expected sections and elements in the DOM, what the case's own check asks of the DOM (which rank a
layout draws in which block, the gradients' cards, the filter), and no console message at all (the page
logs only on failure, so any message is an error).
It saves a screenshot of the first report as OUT_DIR/report-screenshot.png (the test artifact; the
README's docs/report.png is a copy). Two broken copies of a report (an element removed, a script error)
must be caught, so a check that stopped seeing failures fails the test.
"""
import html.parser
import os
import re
import shutil
import subprocess
import sys
import tempfile

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--disable-extensions", "--hide-scrollbars", "--mute-audio"]


class Dom(html.parser.HTMLParser):
    def __init__(self):
        super().__init__()
        self.ids, self.classes, self.selfcheck, self.text = set(), {}, None, ""

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if "id" in a:
            self.ids.add(a["id"])
        for c in (a.get("class") or "").split():
            self.classes[(tag, c)] = self.classes.get((tag, c), 0) + 1
        if tag == "body":
            self.selfcheck = a.get("data-selfcheck")


def chromium(browser, args, timeout=120):
    with tempfile.TemporaryDirectory(prefix="spmd-chromium-") as profile:
        run = subprocess.run([browser] + FLAGS + [f"--user-data-dir={profile}"] + args, capture_output=True, text=True, timeout=timeout)
    return run


def open_page(browser, path, fragment=""):
    """(problems, dom) for one page (opened at #fragment when given)."""
    run = chromium(browser, ["--enable-logging=stderr", "--v=0", "--virtual-time-budget=5000", "--dump-dom",
                             "file://" + os.path.abspath(path) + fragment])
    problems = []
    console = [l for l in run.stderr.splitlines() if ":CONSOLE" in l or "Uncaught" in l]
    problems += [f"console: {l.strip()}" for l in console]
    if run.returncode != 0 or "<body" not in run.stdout:
        problems.append(f"chromium exited with {run.returncode} and no DOM: {run.stderr[-400:]}")
    dom = Dom()
    dom.feed(run.stdout)
    dom.text = run.stdout
    if dom.selfcheck != "ok":
        problems.append(f"page self-check: {dom.selfcheck}")
    return problems, dom


def static_problems(text):
    p = []
    for m in re.finditer(r'(?:src|href)\s*=\s*"([^"#][^"]*)"', text):
        p.append(f"external reference {m.group(1)}")
    if re.search(r"@import|url\((?!#|data:)", text):
        p.append("a style loads a resource")
    return p


def need(dom, ids=(), classes=()):
    p = [f"missing #{i}" for i in ids if i not in dom.ids]
    p += [f"missing {t}.{c}" for t, c in classes if dom.classes.get((t, c), 0) == 0]
    return p


def figures(text):
    """[(names, hidden, [svg texts in order])] for every layout card of a page's DOM."""
    out = []
    for m in re.finditer(r'<figure class="layout-fig[^"]*" data-names="([^"]*)"( hidden="")?>(.*?)</figure>', text, re.S):
        texts = [html.unescape(t) for t in re.findall(r"<text[^>]*>([^<]*)</text>", m.group(3))]
        out.append((html.unescape(m.group(1)).split(), bool(m.group(2)), texts))
    return out


def cards(text):
    """{name: (hidden, [svg texts])}: the card each tensor is drawn on."""
    return {n: (hidden, texts) for names, hidden, texts in figures(text) for n in names}


def drawn(name, want):
    """A case check: the card of `name` draws these texts in this order (row heads and the ranks in each block)."""
    def check(text):
        got = cards(text).get(name)
        if got is None:
            return [f"no layout card for {name}"]
        return [] if got[1] == want else [f"layout of {name} draws {got[1]}, not {want}"]
    return check


def training_step(text):
    """A training program's page shows the gradients, groups equal layouts, and writes each why-chain once."""
    p = []
    c = cards(text)
    for g in ("ln_w.grad", "w1.grad", "w2.grad", "x.grad"):
        if g not in c:
            p.append(f"no layout card for the gradient {g}")
    if not re.search(r'<figure class="layout-fig group', text):
        p.append("no card groups tensors with the same layout")
    if not re.search(r'<figure class="layout-fig[^"]*flagged[^"]*" data-names="[^"]*\bln_w\.grad\b', text):
        p.append("the card of ln_w.grad, which the error is about, is not flagged")
    whys = re.findall(r'<td class="why">(.*?)</td>', text, re.S)
    if any(" &lt;- " in w or " <- " in w for w in whys):
        p.append("a why cell repeats the whole chain")
    if 'class="ref"' not in text:
        p.append("no why cell links to the row it continues from")
    if 'class="backward"' not in text:
        p.append("no placement row of the backward")
    return p


def main():
    exe, src, out = sys.argv[1], sys.argv[2], sys.argv[3]
    browser = sys.argv[4] if len(sys.argv) > 4 else (shutil.which("chromium") or "/usr/bin/chromium")
    if not os.path.exists(browser):
        sys.exit("chromium is not installed: run scripts/setup.sh (it installs Debian's chromium)")
    os.makedirs(out, exist_ok=True)
    cases = [
        ("examples/mesh2d/mlp_dp_tp_allreduce_wrong_axis.yaml", ["program", "placements", "layouts"],
         [("div", "diag"), ("table", "placements"), ("svg", "layout"), ("g", "block")], None),
        ("docs/tutorial/02_tp_mlp_bias_bug.yaml", ["program", "placements", "layouts"], [("div", "diag"), ("svg", "layout"), ("span", "pl-P")], None),
        ("examples/temporal/ring_send_first.yaml", ["program", "timeline"], [("g", "blocked"), ("path", "p2p"), ("path", "cycle"), ("div", "diag")], None),
        ("examples/temporal/tp_overlap.yaml", ["program", "timeline"], [("g", "async"), ("path", "inflight")], None),
        ("examples/pipeline/1f1b_4stages.yaml", ["program", "pipeline"], [("table", "pipeline"), ("td", "action")], None),
        # Two ranks of the cycle and two that are "also blocked": all four rows stop at their red cell.
        ("examples/pipeline/1f1b_4stages_rendezvous.yaml", ["pipeline"], [("td", "blocked"), ("span", "swatch")],
         lambda t: [] if len(re.findall(r'<td class="action [^"]* blocked"', t)) == 4 else ["not every blocked rank is marked"]),
        ("examples/autograd/sp_layernorm_grad_missing.yaml", ["placements", "layouts", "layout-filter"], [("a", "ref")], training_step),
        # FSDP2 + TP: w2's dim 0 is cut tp-major (order: [tp, dp]), so dp1 tp0 holds rows 8:16.
        ("examples/fsdp/fsdp2_tp_dp_outer.yaml", ["layouts"], [],
         drawn("w2", ["0:8", "dp0 tp0", "8:16", "dp1 tp0", "16:24", "dp0 tp1", "24:32", "dp1 tp1"])),
        # Zigzag over cp = 4: rank i holds chunks i and 7-i.
        ("examples/cp/llama3_cp_allgather_kv_zigzag.yaml", ["layouts"], [],
         drawn("xs", [x for i, r in enumerate([0, 1, 2, 3, 3, 2, 1, 0]) for x in (f"{i * 1024}:{(i + 1) * 1024}", f"cp{r}")])),
    ]
    failed = 0
    pages = []
    for rel, ids, classes, check in cases:
        page = os.path.join(out, os.path.splitext(os.path.basename(rel))[0] + ".html")
        gen = subprocess.run([exe, "report", rel, "-o", page], cwd=src, capture_output=True, text=True)
        if gen.returncode not in (0, 1) or not os.path.exists(page):
            print(f"FAIL {rel}: spmdcheck report exited with {gen.returncode}: {gen.stderr}")
            failed += 1
            continue
        text = open(page, encoding="utf-8").read()
        problems, dom = open_page(browser, page)
        problems = static_problems(text) + problems + need(dom, ids, classes) + (check(dom.text) if check else [])
        print(("FAIL " if problems else "PASS ") + rel + "".join("\n  " + p for p in problems))
        failed += bool(problems)
        pages.append(page)
    # The layout filter, given in the address: only the cards with a matching name stay shown.
    training = [p for p in pages if p.endswith("sp_layernorm_grad_missing.html")]
    if training:
        problems, dom = open_page(browser, training[0], "#filter=.grad")
        figs = figures(dom.text)
        problems += [f"the filter .grad {'hides' if hidden else 'shows'} the card of {names}" for names, hidden, _ in figs
                     if hidden == any(".grad" in n for n in names)]
        shown = sum(not hidden for _, hidden, _ in figs)
        if not 0 < shown < len(figs):
            problems.append(f"the filter .grad shows {shown} of {len(figs)} cards")
        print(("FAIL " if problems else "PASS ") + "layout filter #filter=.grad" + "".join("\n  " + p for p in problems))
        failed += bool(problems)
    if pages:
        shot = os.path.join(out, "report-screenshot.png")
        if os.path.exists(shot):
            os.remove(shot)
        chromium(browser, ["--virtual-time-budget=5000", "--window-size=1280,1500", f"--screenshot={shot}", "file://" + os.path.abspath(pages[0])])
        ok = os.path.exists(shot) and open(shot, "rb").read(8) == b"\x89PNG\r\n\x1a\n" and os.path.getsize(shot) > 20000
        print(("PASS" if ok else "FAIL") + f" screenshot {shot}")
        failed += not ok
    # Negative controls: a broken page must fail this check.
    if len(pages) >= 3:
        base = open(pages[2], encoding="utf-8").read()
        broken = {
            "timeline removed": re.sub(r'<svg id="timeline".*?</svg>', "", base, flags=re.S),
            "script error": base.replace('<p id="selfcheck"></p>', '<p id="selfcheck"></p><script>document.body.dataset.x = undefinedName.y;</script>'),
        }
        for what, text in broken.items():
            if text == base:
                print(f"FAIL negative control '{what}': could not break the page")
                failed += 1
                continue
            bad = os.path.join(out, "broken.html")
            open(bad, "w", encoding="utf-8").write(text)
            problems, dom = open_page(browser, bad)
            problems += need(dom, ["timeline"], [])
            print(("PASS" if problems else "FAIL") + f" negative control '{what}' is caught" + (f": {problems[0]}" if problems else " (it is not)"))
            failed += not problems
    if failed:
        sys.exit(f"{failed} report checks failed")


main()
