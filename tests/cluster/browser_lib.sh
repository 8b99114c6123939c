# Shared by the headless-Chromium report checks (check_*_dom.sh), sourced after they set
# `name` (for messages) and `out` (their output folder).
#   fail MESSAGE       print "<name>: FAIL: MESSAGE" and exit 1
#   find_chromium      set $chromium ($CHROMIUM, else the first on PATH), or exit 77 (ctest:
#                      skipped) when there is none (scripts/install-deps.sh installs it)
#   browse ARGS...     run it on $out/report.html with ARGS (e.g. --dump-dom)

fail() { echo "$name: FAIL: $*" >&2; exit 1; }

find_chromium() {
  chromium=${CHROMIUM:-}
  if [ -z "$chromium" ]; then
    for c in chromium chromium-browser google-chrome; do
      if command -v "$c" >/dev/null 2>&1; then chromium=$(command -v "$c"); break; fi
    done
  fi
  if [ -z "$chromium" ]; then
    echo "$name: no chromium on PATH (scripts/install-deps.sh installs it); skipped"
    exit 77
  fi
}

# Headless, no display, possibly root (hence --no-sandbox), possibly a small /dev/shm; its
# own profile and HOME inside the output folder so nothing outside it is touched.
browse() {
  mkdir -p "$out/chromium-home"
  HOME="$out/chromium-home" timeout 120 "$chromium" --headless --no-sandbox --disable-gpu \
    --disable-dev-shm-usage --no-first-run --no-default-browser-check --hide-scrollbars \
    --user-data-dir="$out/chromium-profile" "$@" "file://$out/report.html"
}
