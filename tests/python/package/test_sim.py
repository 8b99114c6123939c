"""troupe.sim against `troupe sim` and `troupe swarm`: the same topology, workload and seed give
the same report from Python as from the CLI, whether the topology is a file or a dict."""

import json
import tomllib

import pytest

from conftest import ROOT
from troupe import sim

SMALL = ROOT / "examples/topologies/small.toml"
TRACE = ROOT / "examples/traces/mooncake_fast25_conversation_trace.jsonl"


def without_host_lines(summary):
    # The summary's `simulated` line has wall time and peak RSS, which differ between runs.
    return [line for line in summary.splitlines() if not line.lstrip().startswith("simulated")]


def test_a_trace_replay_gives_the_cli_s_report(troupe_cli, tmp_path):
    r = troupe_cli("sim", SMALL, "--trace", TRACE, "--limit", 60, "--seed", 3, "--quiet",
                   "--report", tmp_path / "cli")
    assert r.returncode == 0, r.stderr
    res = sim.run(SMALL, TRACE, limit=60, seed=3)
    assert res.ok and res.violations == []
    assert res.report == json.loads((tmp_path / "cli/report.json").read_text())
    assert res.report["requests"]["completed"] == 60
    cli_summary = r.stdout.split("  report      ")[0]
    assert without_host_lines(res.summary) == without_host_lines(cli_summary)
    assert isinstance(res.run, dict) and res.run  # the host figures of run.json


def test_a_synthetic_workload_gives_the_cli_s_json(troupe_cli):
    r = troupe_cli("sim", SMALL, "--workload", "agent", "--rate", 2, "--duration", "1min",
                   "--seed", 7, "--quiet", "--json")
    assert r.returncode == 0, r.stderr
    res = sim.run(SMALL, workload="agent", rate=2, duration="1min", seed=7)
    assert res.report == json.loads(r.stdout)
    other = sim.run(SMALL, workload="agent", rate=2, duration="1min", seed=8)
    assert other.report != res.report  # the seed matters


def test_a_topology_dict_and_trace_records_run_as_the_files(tmp_path):
    topo = tomllib.loads(SMALL.read_text())
    records = [json.loads(line) for line in TRACE.read_text().splitlines()[:40]]
    from_files = sim.run(SMALL, TRACE, limit=40, seed=1)
    from_python = sim.run(topo, records, seed=1, report_dir=tmp_path / "rep")
    assert from_python.report == from_files.report
    assert (tmp_path / "rep/report.html").is_file() and from_python.report_dir == str(tmp_path / "rep")


def test_a_bad_topology_dict_names_the_key():
    topo = tomllib.loads(SMALL.read_text())
    topo["pool"][1]["ep_szie"] = 16
    with pytest.raises(sim.SimError, match=r"pool\[1\]\.ep_szie: unknown key"):
        sim.run(topo, workload="chat", duration="1min")
    with pytest.raises(sim.SimError, match="--workload must be chat, agent or mixed"):
        sim.run(SMALL, workload="banana")


def test_the_series_frame_holds_the_report_s_series():
    pandas = pytest.importorskip("pandas")
    res = sim.run(SMALL, workload="chat", rate=1, duration="1min", seed=2)
    df = res.series_frame()
    assert isinstance(df, pandas.DataFrame)
    series = res.report["series"]
    assert list(df.index) == series["t_s"]
    assert list(df["requests_in_flight"]) == series["requests_in_flight"]
    assert list(df["instance_busy.decode/0"]) == series["instance_busy"]["decode/0"]


def test_the_swarm_agrees_with_the_cli_and_does_not_depend_on_jobs(troupe_cli):
    r = troupe_cli("swarm", SMALL, "--seeds", "0..5", "--quiet")
    assert r.returncode == 0, r.stderr
    one = sim.swarm(SMALL, range(0, 6), jobs=1)
    two = sim.swarm(tomllib.loads(SMALL.read_text()), range(0, 6), jobs=2)
    assert r.stdout.startswith(f"{one.passed} passed, {one.failed} failed")
    assert one.seeds == two.seeds and [s.seed for s in one.seeds] == list(range(6))
    assert all(s.requests > 0 for s in one.seeds) and sum(s.faults for s in one.seeds) > 0
    assert one.replay(4) == f"troupe sim {SMALL} --swarm-seed 4"


def test_a_swarm_seed_replays_as_the_cli(troupe_cli):
    r = troupe_cli("sim", SMALL, "--swarm-seed", 5, "--quiet", "--json")
    assert r.returncode == 0, r.stderr
    assert sim.run(SMALL, swarm_seed=5).report == json.loads(r.stdout)
