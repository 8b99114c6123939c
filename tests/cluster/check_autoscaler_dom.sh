#!/usr/bin/env bash
# Renders the report of an autoscaling run in headless Chromium and checks its Autoscaler
# section (docs/report.md, "report.html").
#
#   check_autoscaler_dom.sh TROUPE SOURCE_DIR OUT_DIR
#
# Runs `troupe sim` on small-autoscale.toml with the surge plan and --report OUT_DIR, dumps the
# rendered DOM and asserts: the chart <svg id="scale-instances"> has an online and a target
# line per pool (four polylines of two or more finite points), scale-ups and scale-downs are
# marked (green and red marker lines), and <table id="scale-events"> lists the decisions that
# changed a pool with their reasons. Exits 77 (ctest: skipped) without Chromium.
set -euo pipefail

troupe=$1
src=$2
out=$3

name=check_autoscaler_dom
source "$(dirname "$0")/browser_lib.sh"
find_chromium

rm -rf "$out"
mkdir -p "$out"
"$troupe" sim "$src/examples/topologies/small-autoscale.toml" --workload chat --rate 4 \
  --duration 8min --seed 1 --faults "$src/examples/faults/surge.toml" --quiet \
  --report "$out" > "$out/sim.txt" 2> "$out/sim.log"
[ -s "$out/report.html" ] || fail "troupe sim wrote no report.html"
browse --dump-dom > "$out/report.dom.html" 2> "$out/chromium-dom.log" \
  || fail "chromium --dump-dom failed (see $out/chromium-dom.log)"
rm -rf "$out/chromium-profile" "$out/chromium-home"

dom="$out/report.dom.html"
grep -q '</html>' "$dom" || fail "DOM is truncated"
grep -q '<h2>Autoscaler</h2>' "$dom" || fail "no Autoscaler section"
svg=$(perl -0777 -ne 'print $1 if m{(<svg id="scale-instances".*?</svg>)}s' "$dom")
[ -n "$svg" ] || fail "chart <svg id=\"scale-instances\"> missing"
lines=$(printf '%s' "$svg" \
  | perl -ne 'while (/<polyline[^>]*\bpoints="\s*-?[0-9.]+,-?[0-9.]+\s+-?[0-9.]+,-?[0-9.]+/g) { $n++ } END { print $n + 0 }')
[ "$lines" -eq 4 ] || fail "chart 'scale-instances' has $lines lines, expected 4 (online and target per pool)"
for label in 'prefill online' 'prefill target' 'decode online' 'decode target'; do
  printf '%s' "$svg" | grep -qF ">$label</text>" || fail "legend lacks '$label'"
done
if printf '%s' "$svg" | grep -qiE 'nan|inf[^o]'; then fail "chart has NaN/inf"; fi
ups=$(printf '%s' "$svg" | grep -oE 'class="marker"[^>]*stroke="#2ca02c"' | wc -l)
downs=$(printf '%s' "$svg" | grep -oE 'class="marker"[^>]*stroke="#d62728"' | wc -l)
[ "$ups" -ge 1 ] || fail "no scale-up marked"
[ "$downs" -ge 1 ] || fail "no scale-down marked"
table=$(perl -0777 -ne 'print $1 if m{(<table id="scale-events">.*?</table>)}s' "$dom")
rows=$(printf '%s' "$table" | grep -o '<tr>' | wc -l)
[ "$rows" -eq $((ups + downs)) ] || fail "scale-events has $rows rows for $ups + $downs marks"
printf '%s' "$table" | grep -qE 'up [1-9]+ \([0-9]+ from the inventory\)' || fail "no scale-up reason"
printf '%s' "$table" | grep -qE 'down [1-9]' || fail "no scale-down reason"
echo "check_autoscaler_dom: OK: 4 lines, $ups scale-ups and $downs scale-downs marked, $rows decisions listed"
