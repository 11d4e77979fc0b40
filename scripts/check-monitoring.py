#!/usr/bin/env python3
"""Checks that the Grafana dashboard and the Prometheus alert rules in deploy/ only use metrics
an idemraft node really exports, then runs promtool on the rules and their unit tests.

    scripts/check-monitoring.py [--metrics FILE] [--require-promtool]

Without --metrics it starts one node from $IDEMRAFT_BIN (default target/debug) on free
loopback ports and a temporary data directory, drives a claim, a completion, a replay, a
takeover and a stale-token write through idemctl (so every family, histograms and the
families that only appear after their first event included, has samples), scrapes /metrics
and stops the node again, whatever happens. With --metrics it reads a saved scrape instead.

Checked in the dashboard: every panel has a unique id and a datasource that is the templated
Prometheus datasource ${DS_PROMETHEUS} (every target too, where one is given); every query,
variable query and annotation query names only metrics of the scrape (a histogram only with
its _bucket, _sum or _count suffix), with label names those metrics carry. In the rules:
the same for every expression, plus a `for`, a severity and summary/description annotations
per alert, docs/operations.md anchors that exist, and a firing and a non-firing unit test per
alert. Metrics Prometheus or node_exporter provide are listed in EXTERNAL, since no node
exports them.

promtool (Debian package `prometheus`) then runs `check rules`, `test rules`, and `check
rules` on the dashboard's queries turned into recording rules, which catches PromQL syntax
errors in the dashboard. Without promtool those steps are reported as not run; with
--require-promtool or CI=1 in the environment a missing promtool is an error.

Stdlib only, Python 3.9+. Exit status 1 on any problem, each printed with where it is.
"""
import argparse
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
DASHBOARD = os.path.join(ROOT, "deploy", "grafana", "idemraft.json")
RULES = os.path.join(ROOT, "deploy", "prometheus", "idemraft-alerts.yml")
RULE_TESTS = os.path.join(ROOT, "deploy", "prometheus", "idemraft-alerts.test.yml")
DOCS = os.path.join(ROOT, "docs", "operations.md")

DS_VAR = "DS_PROMETHEUS"
DS_UIDS = {"${DS_PROMETHEUS}", "$DS_PROMETHEUS"}
# Not exported by a node: Prometheus adds `up` to every target, node_exporter the filesystems.
EXTERNAL = {"up", "node_filesystem_avail_bytes", "node_filesystem_size_bytes"}
# Prometheus attaches these to every scraped series.
TARGET_LABELS = {"job", "instance"}
# The node creates every value of these labels at zero (node/src/ops/metrics), so a value
# missing from a scrape is a typo, not a value that has not happened yet.
CLOSED_LABELS = {"outcome", "role", "state", "via"}
SEVERITIES = {"critical", "warning", "info"}
KEYWORDS = {
    "and", "or", "unless", "by", "without", "on", "ignoring", "group_left", "group_right",
    "bool", "offset", "inf", "nan", "atan2",
}
NODE_START_SECS = 90

problems = []


def problem(where, msg):
    problems.append(f"{where}: {msg}")


def shown(path):
    rel = os.path.relpath(os.path.abspath(path), ROOT)
    return path if rel.startswith("..") else rel


# --- the scrape -------------------------------------------------------------------------


class Scrape:
    def __init__(self, text):
        self.samples = {}  # sample name -> {label name -> set of values}
        self.types = {}  # family name -> type
        for line in text.splitlines():
            if line.startswith("# TYPE "):
                parts = line.split()
                if len(parts) >= 4:
                    self.types[parts[2]] = parts[3]
                continue
            if not line.strip() or line.startswith("#"):
                continue
            m = re.match(r"([A-Za-z_:][A-Za-z0-9_:]*)(\{(.*?)\})?\s", line)
            if not m:
                continue
            labels = self.samples.setdefault(m.group(1), {})
            for k, v in re.findall(r'([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"', m.group(3) or ""):
                labels.setdefault(k, set()).add(v)

    def has(self, name):
        return name in self.samples


def free_ports(n):
    # Held open together so the kernel hands out n different ports.
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


# The node is on loopback: an http_proxy from the environment must not be asked for it.
LOCAL = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def http_get(url, timeout=2.0):
    try:
        with LOCAL.open(url, timeout=timeout) as r:
            return r.status, r.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as e:
        return e.code, ""
    except (urllib.error.URLError, OSError):
        return None, ""


def scrape_from_node(bin_dir):
    node = os.path.join(bin_dir, "idemraft")
    ctl = os.path.join(bin_dir, "idemctl")
    for b in (node, ctl):
        if not os.access(b, os.X_OK):
            raise SystemExit(f"check-monitoring: {b} is missing; build it (cargo build --bins) or set IDEMRAFT_BIN")
    client, peer, http = free_ports(3)
    data = tempfile.mkdtemp(prefix="idemraft-monitoring-")
    log_path = os.path.join(data, "node.log")
    log = open(log_path, "wb")
    proc = None
    keep = False
    try:
        # A group of its own: a Ctrl-C reaches only the checker, which then stops the node
        # through the finally below, the same way as on every other exit.
        proc = subprocess.Popen(
            [node, "--id", "1", "--initial-cluster", f"1=127.0.0.1:{peer}",
             "--client-addr", f"127.0.0.1:{client}", "--http-addr", f"127.0.0.1:{http}",
             "--data-dir", os.path.join(data, "node-1")],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        base = f"http://127.0.0.1:{http}"
        deadline = time.monotonic() + NODE_START_SECS
        while http_get(base + "/readyz")[0] != 200:
            if proc.poll() is not None:
                raise RuntimeError(f"the node exited with status {proc.returncode} before it was ready")
            if time.monotonic() > deadline:
                raise RuntimeError(f"the node was not ready within {NODE_START_SECS} s")
            time.sleep(0.2)

        def idemctl(*args, expect=(0,)):
            cmd = [ctl, "--endpoints", f"127.0.0.1:{client}", "--timeout", "10s", "-w", "json", *args]
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
            if r.returncode not in expect:
                raise RuntimeError(f"idemctl {' '.join(args)} exited {r.returncode}: {r.stderr.strip() or r.stdout.strip()}")
            return r.stdout

        def token(out):
            return str(json.loads(out)["token"])

        scope = "monitoring.check"
        k1, k2 = "monitoring-key-000001", "monitoring-key-000002"
        t1 = token(idemctl("claim", scope, k1, "--owner", "checker-a"))
        idemctl("complete", scope, k1, t1, "--body", "done")
        idemctl("claim", scope, k1, "--owner", "checker-b")  # a replay
        t2 = token(idemctl("claim", scope, k2, "--owner", "checker-a"))
        idemctl("takeover", scope, k2, "--force", "--owner", "checker-b")
        # Exit 3: the stale token is refused, which is the point.
        idemctl("complete", scope, k2, t2, expect=(3,))
        status, text = http_get(base + "/metrics", timeout=10)
        if status != 200 or not text:
            raise RuntimeError(f"GET /metrics answered {status}")
        return text
    except (RuntimeError, subprocess.TimeoutExpired, OSError, ValueError, KeyError) as e:
        keep = True
        log.flush()
        tail = open(log_path, encoding="utf-8", errors="replace").read().splitlines()[-20:]
        raise SystemExit("check-monitoring: starting a node to scrape failed: {}\n  node log (last lines):\n    {}".format(
            e, "\n    ".join(tail) or "(empty)"))
    finally:
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        log.close()
        # Kept after a failed start, for its log; an interrupted run leaves nothing behind.
        if keep:
            print(f"check-monitoring: the node's data directory and log are kept in {data}", file=sys.stderr)
        else:
            shutil.rmtree(data, ignore_errors=True)


# --- PromQL -----------------------------------------------------------------------------

STRING = r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`'


def metric_names(expr):
    """Metric names in a PromQL expression: identifiers outside strings, label matchers,
    ranges and label lists that are neither functions nor keywords."""
    s = re.sub(STRING, '""', expr)
    s = re.sub(r"\{[^}]*\}", " ", s)
    s = re.sub(r"\[[^\]]*\]", " ", s)
    s = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", s)
    s = re.sub(r"\$\{[^}]*\}|\$\w+", " ", s)
    names = []
    for m in re.finditer(r"\d[\w.]*|[A-Za-z_:][A-Za-z0-9_:]*", s):
        tok = m.group(0)
        if tok[0].isdigit() or tok.lower() in KEYWORDS:
            continue
        if re.match(r"\s*\(", s[m.end():]):
            continue
        names.append(tok)
    return names


def selectors(expr):
    """(metric name, [(label, op, value)]) for every `name{...}` selector."""
    out = []
    for m in re.finditer(r"([A-Za-z_:][A-Za-z0-9_:]*)\s*\{((?:" + STRING + r"|[^}\"'`])*)\}", expr):
        matchers = re.findall(r"([A-Za-z_][A-Za-z0-9_]*)\s*(=~|!~|!=|=)\s*(" + STRING + ")", m.group(2))
        out.append((m.group(1), [(k, op, v[1:-1]) for k, op, v in matchers]))
    return out


def check_expr(where, expr, scrape, used):
    if not expr or not expr.strip():
        problem(where, "empty query")
        return
    names = metric_names(expr)
    if not names:
        problem(where, f"no metric name found in {expr!r}")
    for name in names:
        used.add(name)
        if name in EXTERNAL:
            continue
        if not name.startswith("idemraft_"):
            problem(where, f"{name}: neither an idemraft metric nor one of the external metrics {sorted(EXTERNAL)}")
        elif not scrape.has(name):
            kind = scrape.types.get(name)
            if kind in ("histogram", "summary"):
                problem(where, f"{name} is a {kind}: query its _bucket, _sum or _count series")
            else:
                problem(where, f"{name} is not in the node's /metrics")
    for name, matchers in selectors(expr):
        if name not in scrape.samples:
            continue
        known = scrape.samples[name]
        for label, op, value in matchers:
            if label in TARGET_LABELS:
                continue
            if label not in known:
                problem(where, f"{name} has no label {label!r} (it has {sorted(known) or 'none'})")
            elif label in CLOSED_LABELS and op in ("=", "!=") and value not in known[label]:
                problem(where, f"{name}{{{label}{op}{value!r}}}: {label} takes only {sorted(known[label])}")


# --- the dashboard ----------------------------------------------------------------------


def refers_to_ds(ds):
    if isinstance(ds, dict):
        return ds.get("uid") in DS_UIDS and ds.get("type", "prometheus") == "prometheus"
    return ds in DS_UIDS


def walk_panels(panels):
    for p in panels:
        yield p
        yield from walk_panels(p.get("panels") or [])


def check_dashboard(path, scrape, used):
    rel = shown(path)
    try:
        dash = json.load(open(path, encoding="utf-8"))
    except (OSError, ValueError) as e:
        problem(rel, f"cannot be read as JSON: {e}")
        return []
    variables = (dash.get("templating") or {}).get("list") or []
    ds_vars = [v for v in variables if v.get("name") == DS_VAR]
    if not ds_vars or ds_vars[0].get("type") != "datasource" or ds_vars[0].get("query") != "prometheus":
        problem(rel, f"no templated Prometheus datasource variable named {DS_VAR}")
    for v in variables:
        if v.get("type") != "query":
            continue
        where = f"{rel}: variable {v.get('name')!r}"
        if not refers_to_ds(v.get("datasource")):
            problem(where, f"datasource {v.get('datasource')!r} is not ${{{DS_VAR}}}")
        q = v.get("query")
        q = q.get("query", "") if isinstance(q, dict) else (q or "")
        m = re.match(r"\s*label_values\((.*),\s*[A-Za-z_][A-Za-z0-9_]*\s*\)\s*$", q, re.S)
        check_expr(where, m.group(1) if m else q, scrape, used)
    for a in (dash.get("annotations") or {}).get("list") or []:
        if a.get("builtIn"):
            continue
        where = f"{rel}: annotation {a.get('name')!r}"
        if not refers_to_ds(a.get("datasource")):
            problem(where, f"datasource {a.get('datasource')!r} is not ${{{DS_VAR}}}")
        check_expr(where, a.get("expr", ""), scrape, used)

    seen = {}
    queries = []
    panels = list(walk_panels(dash.get("panels") or []))
    if not panels:
        problem(rel, "no panels")
    for p in panels:
        pid = p.get("id")
        where = f"{rel}: panel {pid} {p.get('title')!r}"
        if not isinstance(pid, int):
            problem(where, "has no integer id")
        elif pid in seen:
            problem(where, f"repeats the id of panel {seen[pid]!r}")
        else:
            seen[pid] = p.get("title")
        if p.get("type") == "row":
            if p.get("targets"):
                problem(where, "a row with queries")
            continue
        if not refers_to_ds(p.get("datasource")):
            problem(where, f"datasource {p.get('datasource')!r} is not ${{{DS_VAR}}}")
        targets = p.get("targets") or []
        if not targets and p.get("type") != "text":
            problem(where, "has no query")
        for t in targets:
            twhere = f"{where} target {t.get('refId')}"
            if "datasource" in t and not refers_to_ds(t["datasource"]):
                problem(twhere, f"datasource {t['datasource']!r} is not ${{{DS_VAR}}}")
            check_expr(twhere, t.get("expr", ""), scrape, used)
            queries.append((pid, t.get("refId", "X"), t.get("expr", "")))
    return queries


# --- the rules (a reader for the block layout of our rule and test files, not general YAML) --


def block_scalar(lines, i, indent):
    """The folded or literal block starting after line i, and the index after it."""
    out = []
    j = i + 1
    while j < len(lines) and (not lines[j].strip() or len(lines[j]) - len(lines[j].lstrip()) > indent):
        out.append(lines[j].strip())
        j += 1
    return "\n".join(out).strip(), j


def parse_rules(path):
    lines = open(path, encoding="utf-8").read().splitlines()
    rules = []
    cur = None
    i = 0
    while i < len(lines):
        line = lines[i]
        m = re.match(r"^(\s*)(- )?([A-Za-z_]+):\s*(.*?)\s*$", line)
        if not m or line.lstrip().startswith("#"):
            i += 1
            continue
        indent = len(m.group(1)) + (2 if m.group(2) else 0)
        key, value = m.group(3), m.group(4)
        if key in ("alert", "record") and m.group(2):
            cur = {"kind": key, "name": value, "line": i + 1, "labels": {}, "annotations": {}}
            rules.append(cur)
            cur["_indent"] = indent
        elif cur is not None:
            if value in ("|", "|-", ">", ">-"):
                value, i = block_scalar(lines, i, indent)
                i -= 1
            value = value.strip().strip('"')
            if key in ("expr", "for") and indent == cur["_indent"]:
                cur[key] = value
            elif key in ("labels", "annotations"):
                cur["_section"] = key
            elif indent > cur["_indent"] and cur.get("_section"):
                cur[cur["_section"]][key] = value
        i += 1
    return rules


def anchors(path):
    slugs = set()
    for line in open(path, encoding="utf-8"):
        m = re.match(r"^#{1,6}\s+(.*?)\s*$", line)
        if m:
            s = re.sub(r"[^\w\- ]", "", m.group(1).lower()).replace(" ", "-")
            slugs.add(s)
    return slugs


def rule_tests(path):
    """alert name -> [number of firing cases, number of non-firing cases]."""
    counts = {}
    lines = open(path, encoding="utf-8").read().splitlines()
    for i, line in enumerate(lines):
        m = re.match(r"^\s*alertname:\s*(\S+)\s*$", line)
        if not m:
            continue
        nxt = next((l.strip() for l in lines[i + 1:] if l.strip()), "")
        c = counts.setdefault(m.group(1), [0, 0])
        if re.match(r"exp_alerts:\s*\[\]\s*$", nxt):
            c[1] += 1
        elif nxt.startswith("exp_alerts:"):
            c[0] += 1
    return counts


def check_rules(scrape, used):
    rel = os.path.relpath(RULES, ROOT)
    rules = parse_rules(RULES)
    alerts = [r for r in rules if r["kind"] == "alert"]
    if not alerts:
        problem(rel, "no alerting rule found")
    docs = anchors(DOCS)
    tests = rule_tests(RULE_TESTS)
    names = set()
    for r in rules:
        where = f"{rel}:{r['line']} {r['name']}"
        if r["name"] in names:
            problem(where, "a second rule of this name")
        names.add(r["name"])
        check_expr(where, r.get("expr", ""), scrape, used)
        if r["kind"] != "alert":
            continue
        if "for" not in r:
            problem(where, "no `for:`")
        if r["labels"].get("severity") not in SEVERITIES:
            problem(where, f"severity {r['labels'].get('severity')!r} is not one of {sorted(SEVERITIES)}")
        for a in ("summary", "description"):
            if not r["annotations"].get(a):
                problem(where, f"no {a} annotation")
        text = " ".join(r["annotations"].values())
        links = re.findall(r"docs/operations\.md#([\w-]+)", text)
        if not links:
            problem(where, "the description names no docs/operations.md section")
        for a in links:
            if a not in docs:
                problem(where, f"docs/operations.md has no section #{a}")
        firing, quiet = tests.get(r["name"], [0, 0])
        if not firing or not quiet:
            problem(f"{os.path.relpath(RULE_TESTS, ROOT)}",
                    f"{r['name']} needs a firing and a non-firing case (has {firing} and {quiet})")
    return alerts


# --- promtool ---------------------------------------------------------------------------


def run_promtool(args, cwd, what):
    print(f"$ promtool {' '.join(args)}")
    r = subprocess.run(["promtool", *args], cwd=cwd, capture_output=True, text=True)
    out = (r.stdout + r.stderr).rstrip()
    if out:
        print("  " + out.replace("\n", "\n  "))
    if r.returncode != 0:
        problem(f"promtool {args[0]} {args[1]} ({what})", f"exited {r.returncode}; its output is above")


def dashboard_as_rules(queries, path):
    # Grafana's variables become values PromQL accepts, so promtool can parse the queries.
    with open(path, "w", encoding="utf-8") as f:
        f.write("groups:\n  - name: dashboard-queries\n    rules:\n")
        for pid, ref, expr in queries:
            e = re.sub(r"\$\{__\w+\}|\$__\w+", "5m", expr)
            e = re.sub(r"\$\{\w+\}|\$\w+", ".*", e)
            f.write(f"      - record: dashboard_panel_{pid}_{ref}\n        expr: {json.dumps(e)}\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--metrics", metavar="FILE", help="a saved /metrics scrape instead of starting a node")
    ap.add_argument("--bin", default=os.environ.get("IDEMRAFT_BIN", os.path.join(ROOT, "target", "debug")),
                    help="directory of the idemraft and idemctl binaries [env IDEMRAFT_BIN, default target/debug]")
    ap.add_argument("--dashboard", default=DASHBOARD, help="dashboard JSON [default deploy/grafana/idemraft.json]")
    ap.add_argument("--require-promtool", action="store_true",
                    help="fail when promtool is missing (also with CI=1 in the environment)")
    args = ap.parse_args()
    require = args.require_promtool or os.environ.get("CI", "").lower() in ("1", "true", "yes")

    # A SIGTERM (a CI timeout) must still stop the node started below.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    if args.metrics:
        text = open(args.metrics, encoding="utf-8").read()
        source = args.metrics
    else:
        text = scrape_from_node(os.path.abspath(args.bin))
        source = f"a node started from {shown(args.bin)}"
    scrape = Scrape(text)
    if not any(n.startswith("idemraft_") for n in scrape.samples):
        raise SystemExit(f"check-monitoring: no idemraft_ metric in the scrape from {source}")
    print(f"scrape: {len(scrape.samples)} sample names from {source}")

    used = set()
    queries = check_dashboard(args.dashboard, scrape, used)
    print(f"dashboard: {len(queries)} queries in {shown(args.dashboard)}")
    alerts = check_rules(scrape, used)
    print(f"rules: {len(alerts)} alerts in {shown(RULES)}")
    exported = {n for n in scrape.samples if n.startswith("idemraft_")}
    print(f"metrics used: {len(used & set(scrape.samples))} of the node's, external (not exported by a node): "
          f"{', '.join(sorted(used & EXTERNAL)) or 'none'}")
    families = {re.sub(r"_(bucket|sum|count)$", "", n) for n in exported}
    unused = sorted(f for f in families if not any(u == f or u.startswith(f + "_") for u in used))
    if unused:
        print(f"exported but on no panel and in no rule: {', '.join(unused)}")

    promtool_ran = False
    if shutil.which("promtool"):
        promtool_ran = True
        prom_dir = os.path.dirname(RULES)
        run_promtool(["check", "rules", os.path.basename(RULES)], prom_dir, "the alert rules")
        run_promtool(["test", "rules", os.path.basename(RULE_TESTS)], prom_dir, "the rules' unit tests")
        with tempfile.TemporaryDirectory(prefix="idemraft-dashboard-") as tmp:
            path = os.path.join(tmp, "dashboard-queries.yml")
            dashboard_as_rules(queries, path)
            run_promtool(["check", "rules", path], tmp, "the dashboard's queries as recording rules")
    elif require:
        problem("promtool", "not found; install the Debian package `prometheus` (it is required here: "
                "--require-promtool or CI=1)")
    else:
        print("promtool: NOT RUN, not installed: the rules' syntax, their unit tests and the dashboard's "
              "PromQL were not checked (install the Debian package `prometheus`)")

    for p in problems:
        print(f"error: {p}")
    if problems:
        print(f"check-monitoring: FAILED, {len(problems)} problem(s)")
        return 1
    print("check-monitoring: ok" + ("" if promtool_ran else " (without promtool)"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
