#!/usr/bin/env bash
# Creates bench_grammar's peer venv (default: bench/.venv-grammar) with the pinned packages of
# bench/requirements-grammar.txt (llguidance). Not used by make test.
#
#   bench/setup-grammar-venv.sh [VENV_DIR]; then build/bench/bench_grammar --peer bench/.venv-grammar/bin/python
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
venv="${1:-$here/.venv-grammar}"
python3 -m venv "$venv"
"$venv/bin/python" -m pip install --disable-pip-version-check --quiet -r "$here/requirements-grammar.txt"
echo "setup-grammar-venv: $venv ready"
