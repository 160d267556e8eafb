#!/usr/bin/env python3
"""tests/tools/check_report.py - `spmdcheck report` pages, opened in headless Chromium.

Usage: check_report.py SPMDCHECK SOURCE_DIR OUT_DIR [CHROMIUM]. For a few programs (a sharding bug, a
deadlocked ring, a pipeline schedule) it writes the report, checks that the page loads nothing from
elsewhere, opens it in Debian's chromium (--dump-dom with console logging to stderr), and requires:
the page's own self-check verdict `ok` in <body data-selfcheck>, the expected sections and elements in
the DOM, and no console message at all (the page logs only on failure, so any message is an error).
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
        self.ids, self.classes, self.selfcheck = set(), {}, None

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


def open_page(browser, path):
    """(problems, dom) for one page."""
    run = chromium(browser, ["--enable-logging=stderr", "--v=0", "--virtual-time-budget=5000", "--dump-dom", "file://" + os.path.abspath(path)])
    problems = []
    console = [l for l in run.stderr.splitlines() if ":CONSOLE" in l or "Uncaught" in l]
    problems += [f"console: {l.strip()}" for l in console]
    if run.returncode != 0 or "<body" not in run.stdout:
        problems.append(f"chromium exited with {run.returncode} and no DOM: {run.stderr[-400:]}")
    dom = Dom()
    dom.feed(run.stdout)
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


def main():
    exe, src, out = sys.argv[1], sys.argv[2], sys.argv[3]
    browser = sys.argv[4] if len(sys.argv) > 4 else (shutil.which("chromium") or "/usr/bin/chromium")
    if not os.path.exists(browser):
        sys.exit("chromium is not installed: run scripts/setup.sh (it installs Debian's chromium)")
    os.makedirs(out, exist_ok=True)
    cases = [
        ("examples/mesh2d/mlp_dp_tp_allreduce_wrong_axis.yaml", ["program", "placements", "layouts"],
         [("div", "diag"), ("table", "placements"), ("svg", "layout"), ("g", "block")]),
        ("docs/tutorial/02_tp_mlp_bias_bug.yaml", ["program", "placements", "layouts"], [("div", "diag"), ("svg", "layout"), ("span", "pl-P")]),
        ("examples/temporal/ring_send_first.yaml", ["program", "timeline"], [("g", "blocked"), ("path", "p2p"), ("path", "cycle"), ("div", "diag")]),
        ("examples/temporal/tp_overlap.yaml", ["program", "timeline"], [("g", "async"), ("path", "inflight")]),
        ("examples/pipeline/1f1b_4stages.yaml", ["program", "pipeline"], [("table", "pipeline"), ("td", "action")]),
    ]
    failed = 0
    pages = []
    for rel, ids, classes in cases:
        page = os.path.join(out, os.path.splitext(os.path.basename(rel))[0] + ".html")
        gen = subprocess.run([exe, "report", rel, "-o", page], cwd=src, capture_output=True, text=True)
        if gen.returncode not in (0, 1) or not os.path.exists(page):
            print(f"FAIL {rel}: spmdcheck report exited with {gen.returncode}: {gen.stderr}")
            failed += 1
            continue
        text = open(page, encoding="utf-8").read()
        problems, dom = open_page(browser, page)
        problems = static_problems(text) + problems + need(dom, ids, classes)
        print(("FAIL " if problems else "PASS ") + rel + "".join("\n  " + p for p in problems))
        failed += bool(problems)
        pages.append(page)
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
