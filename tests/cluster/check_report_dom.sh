#!/usr/bin/env bash
# Renders a simulation's report.html in headless Chromium and checks what it shows.
#
#   check_report_dom.sh TROUPE SOURCE_DIR OUT_DIR
#
# Runs `troupe sim` (small topology, 300 requests of the Mooncake trace, one decode GPU failing
# at 30 s) with --report OUT_DIR,
# has Chromium dump the rendered DOM (OUT_DIR/report.dom.html) and take a screenshot
# (OUT_DIR/report.png), then asserts on them:
#   - the summary table is there and says how many requests were admitted and completed;
#   - every chart is an <svg id=...> with at least one <polyline> of two or more points,
#     and no coordinate is NaN or infinite;
#   - the fault timeline: a table of its events, and markers on the charts (the failure, the
#     restart and the EP resize);
#   - the page has no error text and Chromium exited cleanly;
#   - the screenshot is a PNG of more than 20 KB (a blank page compresses to a few KB).
# Exits 77 (ctest: skipped) when no Chromium is installed (`make deps` installs it).
set -euo pipefail

troupe=$1
src=$2
out=$3

name=check_report_dom
source "$(dirname "$0")/browser_lib.sh"
find_chromium

rm -rf "$out"
mkdir -p "$out"
printf '[[fault]]\nat = "30s"\nkind = "fail"\ngpu = "decode/0/3"\n' > "$out/plan.toml"
"$troupe" sim "$src/examples/topologies/small.toml" \
  --trace "$src/examples/traces/mooncake_fast25_conversation_trace.jsonl" \
  --limit 300 --faults "$out/plan.toml" --quiet --report "$out" > "$out/sim.txt"
[ -s "$out/report.html" ] || fail "troupe sim wrote no report.html"

browse --dump-dom > "$out/report.dom.html" 2> "$out/chromium-dom.log" \
  || fail "chromium --dump-dom failed (see $out/chromium-dom.log)"
browse --screenshot="$out/report.png" --window-size=900,2400 > "$out/chromium-shot.log" 2>&1 \
  || fail "chromium --screenshot failed (see $out/chromium-shot.log)"

rm -rf "$out/chromium-profile" "$out/chromium-home"

dom="$out/report.dom.html"
[ -s "$dom" ] || fail "empty DOM"
grep -q '<title>troupe sim: small</title>' "$dom" || fail "no page title"
grep -q '</html>' "$dom" || fail "DOM is truncated"

# The summary table, with the run's request counts.
grep -q '<table id="summary">' "$dom" || fail "no summary table"
grep -q '300 admitted, 300 completed, 0 failed' "$dom" || fail "summary lacks the request counts"
for row in 'ttft (ms)' 'tbt (ms)' 'e2e (ms)' 'throughput (tokens/s)' 'KV hit rate' \
           'GPU busy share' 'output tokens per GPU-hour' 'decode occupancy'; do
  grep -qF "<th>$row</th>" "$dom" || fail "summary lacks the row '$row'"
done
grep -q '<table id="instances">' "$dom" || fail "no per-instance busy share table"

# Every chart: its own <svg>, with at least one polyline of two or more finite points.
charts=(throughput ttft in-flight hit-rate prefill-load decode-load utilization)
for id in "${charts[@]}"; do
  svg=$(perl -0777 -ne 'print $1 if m{(<svg id="\Q'"$id"'\E".*?</svg>)}s' "$dom")
  [ -n "$svg" ] || fail "chart <svg id=\"$id\"> missing"
  lines=$(printf '%s' "$svg" \
    | perl -ne 'while (/<polyline[^>]*\bpoints="\s*-?[0-9.]+,-?[0-9.]+\s+-?[0-9.]+,-?[0-9.]+/g) { $n++ } END { print $n + 0 }')
  [ "$lines" -ge 1 ] || fail "chart '$id' has no polyline with points"
  if printf '%s' "$svg" | grep -qiE 'nan|inf[^o]'; then fail "chart '$id' has NaN/inf"; fi
  echo "check_report_dom: chart $id: $lines line(s)"
done

# The fault timeline: its table, and markers on the charts (fail, restart, EP resize).
grep -q '<table id="timeline">' "$dom" || fail "no fault timeline table"
for event in fail restart ep_resize; do
  grep -qF "<th>" "$dom" && grep -qE "<th>[0-9.]+ s $event</th>" "$dom" \
    || fail "the timeline table lacks a '$event' event"
done
svg=$(perl -0777 -ne 'print $1 if m{(<svg id="throughput".*?</svg>)}s' "$dom")
marks=$(printf '%s' "$svg" | grep -o 'class="marker"' | wc -l)
[ "$marks" -ge 3 ] || fail "the throughput chart has $marks timeline markers, expected 3 or more"
echo "check_report_dom: $marks timeline markers per chart"

# No error text anywhere on the page.
if grep -qiE 'error|exception|undefined|nan[,< ]' "$dom"; then
  grep -oiE '.{40}(error|exception|undefined|nan[,< ]).{40}' "$dom" | head -3 >&2
  fail "error text on the page"
fi

# The screenshot: a PNG, and not a blank one.
png="$out/report.png"
[ -f "$png" ] || fail "no screenshot"
[ "$(head -c 8 "$png" | od -An -tx1 | tr -d ' \n')" = "89504e470d0a1a0a" ] || fail "not a PNG"
size=$(stat -c %s "$png")
[ "$size" -gt 20000 ] || fail "screenshot is only $size bytes"
echo "check_report_dom: OK: ${#charts[@]} charts, summary table, screenshot $png ($size bytes)"
