"""troupe's simulated cluster from Python: ``troupe sim`` and ``troupe swarm``.

:func:`run` replays a workload (a trace file, trace records, or a seeded synthetic workload)
through the simulated cluster of a topology (a TOML file or a dict of the same shape) and returns
the run's report as Python objects; it is ``troupe sim`` itself, so the report equals the CLI's
for the same inputs and seed. :func:`swarm` runs the fault swarm. The GIL is released while they
run. With pandas installed, :meth:`SimResult.series_frame` and :meth:`SwarmResult.to_frame` give
DataFrames::

    from troupe import sim
    r = sim.run("examples/topologies/small.toml", workload="chat", rate=2, duration="2min", seed=7)
    print(r.summary)
    r.report["latency_ms"]["ttft"]["p99"]
"""

from __future__ import annotations

import json
import os
import pathlib
import tempfile
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Iterable, Mapping, Union

from . import _core

if TYPE_CHECKING:
    import pandas

__all__ = ["SimError", "SimResult", "SwarmResult", "SwarmSeed", "run", "swarm"]

PathLike = Union[str, "os.PathLike[str]"]

# The perf model's HF model configs ship in the package; $TROUPE_MODELS_DIR, when set, wins.
_MODELS = pathlib.Path(__file__).resolve().parent / "data" / "models"
if _MODELS.is_dir():
    os.environ.setdefault("TROUPE_MODELS_DIR", str(_MODELS))


class SimError(Exception):
    """A run that could not start or failed: a bad topology, trace, fault plan or option (the
    message is what ``troupe sim`` prints, ``file:line:col: key: what`` for files)."""


@dataclass
class SimResult:
    """What a run produced.

    ``report``: the reproducible report (``report.json``: requests, latency percentiles,
    throughput, KV cache, load balancers, GPUs, invariants, time series; it depends only on the
    topology, workload and seed); ``run``: host figures (``run.json``: wall time, events/s, peak
    RSS); ``summary``: the terminal summary; ``violations``: the invariant violations, one line
    each (``exit_status`` 2 when there are any); ``report_dir``: where the report files are, when
    asked for.
    """

    report: dict[str, Any]
    run: dict[str, Any]
    summary: str
    exit_status: int
    violations: list[str] = field(default_factory=list)
    report_dir: str | None = None

    @property
    def ok(self) -> bool:
        """The run finished and kept every invariant."""
        return self.exit_status == 0

    def series_frame(self) -> pandas.DataFrame:
        """The report's time series as a DataFrame indexed by virtual time (``t_s``), one column
        per series (per-instance series as ``instance_busy.decode/0``). Needs pandas."""
        import pandas

        s = self.report.get("series", {})
        t = s.get("t_s", [])
        cols: dict[str, list[Any]] = {}
        for k, v in s.items():
            if k == "t_s":
                continue
            if isinstance(v, list) and len(v) == len(t):
                cols[k] = v
            elif isinstance(v, dict):
                for kk, vv in v.items():
                    if isinstance(vv, list) and len(vv) == len(t):
                        cols[f"{k}.{kk}"] = vv
        return pandas.DataFrame(cols, index=pandas.Index(t, name="t_s"))


def _topology_file(topology: PathLike | Mapping[str, Any], tmp: pathlib.Path) -> str:
    if isinstance(topology, Mapping):
        path = tmp / "topology.toml"
        path.write_text(_core.toml_text(dict(topology)))
        return str(path)
    return os.fspath(topology)


def _trace_file(trace: PathLike | Iterable[Mapping[str, Any]] | None, tmp: pathlib.Path) -> str:
    if trace is None:
        return ""
    if isinstance(trace, (str, os.PathLike)):
        return os.fspath(trace)
    path = tmp / "trace.jsonl"
    with path.open("w") as f:
        for record in trace:
            f.write(json.dumps(dict(record)) + "\n")
    return str(path)


def run(topology: PathLike | Mapping[str, Any],
        trace: PathLike | Iterable[Mapping[str, Any]] | None = None, *,
        workload: str = "chat", rate: float = 1.0, duration: str = "10min",
        speedup: float = 1.0, seed: int = 0, until: str | None = None, limit: int | None = None,
        faults: PathLike | None = None, swarm_seed: int | None = None, strict: bool = False,
        report_dir: PathLike | None = None) -> SimResult:
    """Runs ``troupe sim`` (docs/cli.md has every option).

    ``topology``: a topology TOML file, or a dict of the same shape (``{"cluster": {...},
    "pool": [{...}, ...]}``). ``trace``: a Mooncake ``.jsonl`` or Azure ``.csv`` file, or Mooncake
    records (dicts with ``timestamp``, ``input_length``, ``output_length``, ``hash_ids``);
    without one, the seeded synthetic ``workload`` (chat, agent or mixed) at ``rate`` requests/s
    for ``duration``. ``report_dir``: also write report.json, run.json and report.html there.

    Raises :class:`SimError` when the run cannot start or fails; a run that breaks an invariant
    returns with ``exit_status`` 2 and the ``violations``.
    """
    with tempfile.TemporaryDirectory(prefix="troupe-sim-") as tmp_name:
        tmp = pathlib.Path(tmp_name)
        out_dir = os.fspath(report_dir) if report_dir is not None else str(tmp / "report")
        rc, out, err = _core.run_sim(
            _topology_file(topology, tmp), _trace_file(trace, tmp), workload, float(rate), duration,
            float(speedup), seed, until or "", limit, out_dir, strict,
            os.fspath(faults) if faults is not None else "", swarm_seed)
        if rc == 1:
            raise SimError(err.strip())
        d = pathlib.Path(out_dir)
        report = json.loads((d / "report.json").read_text())
        host = json.loads((d / "run.json").read_text())
    summary = out if report_dir is not None else out.split("  report      ")[0]
    violations = [line for line in err.splitlines() if line.startswith(("request ", "autoscaler: "))]
    return SimResult(report, host, summary, rc, violations,
                     os.fspath(report_dir) if report_dir is not None else None)


@dataclass(frozen=True)
class SwarmSeed:
    """One swarm seed's verdict: its problems (empty: passed), requests and injected faults."""

    seed: int
    problems: list[str]
    requests: int
    faults: int

    @property
    def passed(self) -> bool:
        return not self.problems


@dataclass
class SwarmResult:
    """Every seed's verdict, in seed order."""

    seeds: list[SwarmSeed]
    topology: str

    @property
    def passed(self) -> int:
        return sum(s.passed for s in self.seeds)

    @property
    def failed(self) -> int:
        return len(self.seeds) - self.passed

    @property
    def failures(self) -> list[SwarmSeed]:
        return [s for s in self.seeds if not s.passed]

    def replay(self, seed: int) -> str:
        """The command that replays ``seed`` (``troupe sim TOPOLOGY --swarm-seed S``)."""
        return f"troupe sim {self.topology} --swarm-seed {seed}"

    def to_frame(self) -> pandas.DataFrame:
        """One row per seed: seed, passed, requests, faults, problems. Needs pandas."""
        import pandas

        return pandas.DataFrame(
            [{"seed": s.seed, "passed": s.passed, "requests": s.requests, "faults": s.faults,
              "problems": s.problems} for s in self.seeds]).set_index("seed")


def swarm(topology: PathLike | Mapping[str, Any], seeds: range | int = range(100),
          jobs: int = 1) -> SwarmResult:
    """The fault swarm (``troupe swarm``): each seed draws a fault plan and a short workload,
    runs, and is checked (invariants, and every request ended by the liveness bound).
    ``seeds``: a ``range`` of consecutive seeds or one seed; ``jobs``: threads (results do not
    depend on it). Raises ``ValueError`` for an invalid topology."""
    if isinstance(seeds, int):
        seeds = range(seeds, seeds + 1)
    if seeds.step != 1 or len(seeds) == 0:
        raise ValueError("seeds must be a non-empty range of consecutive seeds")
    if isinstance(topology, Mapping):
        text, name = _core.toml_text(dict(topology)), "<dict>"
    else:
        name = os.fspath(topology)
        text = pathlib.Path(name).read_text()
    rows = _core.run_swarm(text, name, seeds.start, seeds.stop - 1, jobs)
    return SwarmResult([SwarmSeed(*row) for row in rows], name)
