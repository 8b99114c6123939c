#!/usr/bin/env bash
# Creates the Python venv of the Kubernetes manifest test (default: build/k8s-venv) with the
# pinned packages of tests/python/k8s/requirements.txt. Idempotent: when the venv exists, was
# made from the same requirements file and its packages import, it does nothing.
#
#   tests/python/k8s/setup-venv.sh [VENV_DIR]
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../../.." && pwd)"
venv="${1:-$root/build/k8s-venv}"
requirements="$here/requirements.txt"
stamp="$venv/.troupe-requirements.sha256"
want="$(sha256sum "$requirements" | cut -d' ' -f1)"

if [ -x "$venv/bin/python" ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] \
    && "$venv/bin/python" -c "import kubernetes_validate, yaml, pytest" 2>/dev/null; then
  echo "setup-venv: $venv is up to date"
  exit 0
fi

if ! python3 -c "import venv, ensurepip" 2>/dev/null; then
  echo "setup-venv: python3 with venv and ensurepip is needed (Debian: python3-venv)" >&2
  exit 1
fi
echo "setup-venv: creating $venv"
python3 -m venv "$venv"
"$venv/bin/python" -m pip install --disable-pip-version-check --quiet -r "$requirements"
echo "$want" > "$stamp"
echo "setup-venv: installed $(grep -cv '^#' "$requirements") pinned packages"
