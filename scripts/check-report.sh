#!/usr/bin/env bash
# Renders a run's report.html in headless Chromium and checks that what a reader would see is
# there: the verdict, the latency chart with its points, the throughput and availability
# charts, and at least one fault band. The DOM is read after the browser parsed the page, so a
# broken tag or stray markup that loses an element fails the check.
#   scripts/check-report.sh target/jepsen/run-42/report.html
# Exit 0: all there; 1: something is missing or the page did not render; 2: bad usage, or no
# browser (installed from Debian's chromium package when running as root with apt-get).
set -euo pipefail
if [ $# -ne 1 ]; then
  echo "usage: $0 REPORT.html" >&2
  exit 2
fi
report=$1
if [ ! -f "$report" ]; then
  echo "$report: no such file" >&2
  exit 2
fi
browser=${CHROMIUM:-}
if [ -z "$browser" ]; then
  for b in chromium chromium-browser; do
    if command -v "$b" >/dev/null 2>&1; then browser=$b; break; fi
  done
fi
if [ -z "$browser" ] && [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "check-report: installing chromium" >&2
  { apt-get update -q && apt-get install -y -q chromium; } >&2
  browser=chromium
fi
if [ -z "$browser" ] || ! command -v "$browser" >/dev/null 2>&1; then
  echo "check-report: no chromium (apt-get install -y chromium, or set CHROMIUM)" >&2
  exit 2
fi

profile=$(mktemp -d)
dom=$(mktemp)
trap 'rm -rf "$profile" "$dom"' EXIT
url="file://$(cd "$(dirname "$report")" && pwd)/$(basename "$report")"
# A throwaway profile and no background traffic: the page needs no network and gets none.
if ! timeout 120 "$browser" --headless --no-sandbox --disable-gpu --disable-background-networking \
  --disable-component-update --disable-sync --no-first-run --user-data-dir="$profile" \
  --dump-dom "$url" >"$dom" 2>/dev/null; then
  echo "check-report: $browser could not render $report" >&2
  exit 1
fi

missing=()
grep -q 'id="verdict"' "$dom" || missing+=("the verdict header")
for chart in latency-chart throughput-chart availability-chart; do
  grep -Eq "<svg[^>]* id=\"$chart\"" "$dom" || missing+=("svg#$chart")
done
grep -q '<path class="pts"' "$dom" || missing+=("latency points")
bands=$({ grep -o '<rect class="nemesis-band"' "$dom" || true; } | wc -l)
[ "$bands" -ge 1 ] || missing+=("a nemesis-band")
if [ ${#missing[@]} -gt 0 ]; then
  printf 'check-report: %s: missing %s\n' "$report" "$(IFS=,; echo "${missing[*]}" | sed 's/,/, /g')" >&2
  exit 1
fi
echo "check-report: $report ok: 3 charts, $bands fault bands"
