#!/usr/bin/env bash
# Builds the troupe Python package's wheel from this checkout as a user's `pip install .` would
# (pip fetches the build requirements pinned in pyproject.toml, scikit-build-core runs CMake with
# TROUPE_PYTHON_ONLY) and installs it into a venv holding the pinned test packages of
# requirements.txt. The CMake build stays in BUILD_DIR, so a rerun only rebuilds what changed,
# and it goes through ccache when ccache is installed.
#
#   tests/python/package/setup-venv.sh [VENV_DIR] [BUILD_DIR]
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../../.." && pwd)"
venv="${1:-$root/build/python-package-venv}"
build="${2:-$root/build/python-wheel}"
requirements="$here/requirements.txt"
stamp="$venv/.troupe-requirements.sha256"
want="$(sha256sum "$requirements" | cut -d' ' -f1)"

if ! [ -x "$venv/bin/python" ] || ! [ -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  if ! python3 -c "import venv, ensurepip" 2>/dev/null; then
    echo "setup-venv: python3 with venv and ensurepip is needed (Debian: python3-venv)" >&2
    exit 1
  fi
  echo "setup-venv: creating $venv"
  rm -rf "$venv"
  python3 -m venv "$venv"
  "$venv/bin/python" -m pip install --disable-pip-version-check --quiet -r "$requirements"
  echo "$want" > "$stamp"
fi

# Through ccache, and with the main build's build type (the library objects are then the
# main build's, answered by ccache: `make` compiles through it too) instead of the package's
# Release. The build directory is not hashed (CCACHE_NOHASHDIR), so objects match across the two.
launcher=()
if command -v ccache >/dev/null; then
  export CCACHE_NOHASHDIR="${CCACHE_NOHASHDIR:-1}"
  launcher=(-C cmake.define.CMAKE_C_COMPILER_LAUNCHER=ccache -C cmake.define.CMAKE_CXX_COMPILER_LAUNCHER=ccache
            -C cmake.build-type=RelWithDebInfo)
  # ... and the main build's compilers (ctest passes them): ccache hashes the compiler's name.
  if [ -n "${CC:-}" ]; then launcher+=(-C "cmake.define.CMAKE_C_COMPILER=$CC"); fi
  if [ -n "${CXX:-}" ]; then launcher+=(-C "cmake.define.CMAKE_CXX_COMPILER=$CXX"); fi
fi
start=$(date +%s)
rm -rf "$build/dist"
"$venv/bin/python" -m pip wheel --disable-pip-version-check --quiet --no-deps \
  -C build-dir="$build" "${launcher[@]}" -w "$build/dist" "$root"
"$venv/bin/python" -m pip install --disable-pip-version-check --quiet --force-reinstall \
  --no-deps "$build"/dist/troupe-*.whl
echo "setup-venv: built and installed $(basename "$build"/dist/troupe-*.whl) in $(( $(date +%s) - start )) s"
