"""Shared fixtures of the Python package's tests: the repository, its goldens, and the troupe CLI
(`$TROUPE`, set by the ctest entry python_package) that the bindings are compared with."""

import gzip
import json
import os
import pathlib
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[3]
GOLDEN = ROOT / "tests" / "recipe" / "golden"


def golden_lines(name):
    with gzip.open(GOLDEN / name, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


@pytest.fixture(scope="session")
def troupe_cli():
    """Runs the troupe CLI: cli(*args, input=None) -> CompletedProcess (stdout and stderr as
    str, the exit status not checked)."""
    exe = os.environ.get("TROUPE")
    if not exe:
        pytest.skip("$TROUPE (the troupe CLI) is not set")

    def run(*args, input=None):
        # Bytes in and out: text mode would turn the CLI's "\r" into "\n".
        r = subprocess.run([exe, *map(str, args)], capture_output=True, timeout=600,
                           input=None if input is None else input.encode("utf-8"))
        r.stdout, r.stderr = r.stdout.decode("utf-8"), r.stderr.decode("utf-8")
        return r

    return run


@pytest.fixture(scope="session")
def tok():
    from troupe.recipe import Tokenizer
    return Tokenizer.default()
