#!/usr/bin/env bash
# Creates bench_grammar's peer venv (default: bench/.venv-grammar) with the pinned packages of
# bench/requirements-grammar.txt (llguidance); with --xgrammar also XGrammar 0.2.9 and the pins of
# bench/requirements-grammar-xgrammar.txt (torch included: about 5 GB). Not used by make test.
#
#   bench/setup-grammar-venv.sh [--xgrammar] [VENV_DIR]
#   build/bench/bench_grammar --peer bench/.venv-grammar/bin/python
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
xgrammar=0
if [[ "${1:-}" == "--xgrammar" ]]; then
  xgrammar=1
  shift
fi
venv="${1:-$here/.venv-grammar}"
python3 -m venv "$venv"
"$venv/bin/python" -m pip install --disable-pip-version-check --quiet -r "$here/requirements-grammar.txt"
if [[ $xgrammar == 1 ]]; then
  "$venv/bin/python" -m pip install --disable-pip-version-check --quiet -r "$here/requirements-grammar-xgrammar.txt"
  "$venv/bin/python" -m pip install --disable-pip-version-check --quiet --no-deps xgrammar==0.2.9
fi
echo "setup-grammar-venv: $venv ready"
