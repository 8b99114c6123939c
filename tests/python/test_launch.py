"""`troupe launch`: the serving graph as OS processes, with real process faults.

`troupe launch examples/topologies/local-cpu-3.toml` runs a control process (KV CHECK role,
balancers, HTTP entrypoint), the block store's process, one prefill and two decode instance
processes and the prefill's block fetcher process, joined by CAF's middleman; the module's
cluster runs that topology with its store
in two shards (`storage.shards = 2`: two store processes), on a random small-preset model (the CPU engine computes
every token). The tests drive it with the official OpenAI SDK and check what a cluster must
get right: served greedy tokens equal `troupe generate`'s; a decode process killed with
SIGKILL in the middle of 64 streams loses no request and changes no token (the request
actors reroute to the other decode process, which recomputes the context), and the launcher
restarts the process; a store process killed under load loses no request either (the
blocks it cannot serve are recomputed) and serves its blocks again once restarted; a block
fetcher killed with SIGKILL is restarted and its instance reads through it again; SIGTERM
stops the cluster cleanly. Every call has a bounded timeout and retries are off.

Run: TROUPE=build/troupe build/python-venv/bin/python -m pytest tests/python/test_launch.py
(ctest -L sdk does both steps).
"""

import concurrent.futures
import json
import os
import re
import signal
import subprocess
import threading
import time
import urllib.request

import openai
import pytest

from test_serve import CHAT_MODE, chat_body, generated_text, model_dir, troupe  # noqa: F401 (a fixture)

MODEL = "deepseek-v4.1-flash"
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOPOLOGY = os.path.join(ROOT, "examples/topologies/local-cpu-3.toml")


def sharded_topology(directory, shards, replicas=1):
    """local-cpu-3 with its block store in `shards` shards, each block in `replicas` of them,
    written under `directory`."""
    store = f"shards = {shards}" + (f"\nreplicas = {replicas}" if replicas > 1 else "")
    text = open(TOPOLOGY).read().replace('capacity = "16GiB"', f'capacity = "16GiB"\n{store}')
    assert store in text
    path = os.path.join(directory, f"local-cpu-3-{shards}-shards-{replicas}-copies.toml")
    with open(path, "w") as f:
        f.write(text)
    return path


class Cluster:
    def __init__(self, model_dir, kv_dir, state_file, extra=(), topology=TOPOLOGY):
        self.state_file = state_file
        self.proc = subprocess.Popen(
            [troupe(), "launch", topology, "--model", model_dir, "--engram-map", "identity",
             "--listen", "127.0.0.1:0", "--grace", "1", "--threads", "1", "--kv-dir", kv_dir,
             "--state", state_file, "--restart-period", "60", "--max-restarts", "5", *extra],
            stderr=subprocess.PIPE, text=True)
        self.log = []
        threading.Thread(target=self._read, daemon=True).start()
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            s = self.state()
            if s and s.get("http"):
                self.url = "http://" + s["http"]
                return
            if self.proc.poll() is not None:
                break
            time.sleep(0.2)
        self.stop()
        raise RuntimeError("troupe launch did not start serving:\n" + "".join(self.log))

    def _read(self):
        for line in self.proc.stderr:
            self.log.append(line)

    def state(self):
        try:
            with open(self.state_file) as f:
                return json.load(f)
        except (OSError, ValueError):
            return None

    def process(self, name):
        return next(p for p in self.state()["processes"] if p["name"] == name)

    def openai(self):
        return openai.OpenAI(api_key="unused", base_url=self.url + "/v1", max_retries=0,
                             timeout=600)

    def answer(self, body):
        """The text (reasoning, then content) of a non-streamed chat completion."""
        r = self.openai().chat.completions.create(**body)
        return (getattr(r.choices[0].message, "reasoning_content", None) or "") + (
            r.choices[0].message.content or "")

    def wait_for(self, name, what, cond):
        """Process `name`'s state once cond(state) holds (within 120 s)."""
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            p = self.process(name)
            if cond(p):
                return p
            time.sleep(0.05)
        pytest.fail(name + " never " + what + ":\n" + "".join(self.log))

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)


def run_streams(cluster, bodies, ready_chars, fault):
    """Streams every body at once; when each stream has more than `ready_chars` characters,
    calls fault(); returns each stream's (text, usage)."""
    client = cluster.openai()
    started = [threading.Event() for _ in bodies]

    def one(i):
        text, usage = "", None
        for chunk in client.chat.completions.create(**bodies[i], stream=True,
                                                     stream_options={"include_usage": True}):
            if chunk.usage:
                usage = chunk.usage
            for c in chunk.choices:
                text += (getattr(c.delta, "reasoning_content", None) or "") + (c.delta.content or "")
                if len(text) > ready_chars:
                    started[i].set()
        return text, usage

    with concurrent.futures.ThreadPoolExecutor(max_workers=len(bodies)) as pool:
        futures = [pool.submit(one, i) for i in range(len(bodies))]
        for e in started:
            assert e.wait(timeout=600)
        fault()
        return [f.result(timeout=900) for f in futures]


@pytest.fixture(scope="module")
def cluster(model_dir, tmp_path_factory):
    state = tmp_path_factory.mktemp("launch") / "state.json"
    topology = sharded_topology(str(tmp_path_factory.mktemp("topology")), 2, replicas=2)
    # Every engine process re-places its experts every second (--eplb): the module's token
    # comparisons hold through every switch.
    c = Cluster(model_dir, str(tmp_path_factory.mktemp("kv")), str(state),
                ("--check-history", "--eplb", "4", "--eplb-interval", "1s"), topology)
    yield c
    pids = [p["pid"] for p in c.state()["processes"] if p["pid"]]
    c.stop()
    assert c.proc.returncode == 0, "troupe launch did not stop cleanly:\n" + "".join(c.log)
    # Every process left on its own SIGTERM, none killed after its grace (a prefill's block
    # writer, once it had written to the store process, kept its process alive).
    assert not any("did not stop; killing it" in l for l in c.log), "".join(c.log)
    # --check-history: the control process checked what its requests, KV index and decode_lb
    # recorded through every test of this module (decode processes killed, stopped, drained).
    assert any(re.match(r"troupe node\[control\]: history: .* facts: no violations", l) for l in c.log), \
        "".join(c.log)
    # The prompts' KV crossed from the prefill process to the decode processes over the fabric
    # link (and, in the drain test, from decode/0 to decode/1), none of it lost on the way.
    fabric = {}
    for l in c.log:
        m = re.match(r"troupe node\[(\S+)\]: KV over the fabric: (\d+) offered .* (\d+) pulled "
                     r".* (\d+) failed pull", l)
        if m:
            fabric.setdefault(m.group(1), []).append(tuple(int(x) for x in m.group(2, 3, 4)))
    assert sum(o for o, _, _ in fabric.get("prefill/0", [])) > 0, "".join(c.log)
    assert sum(p for k in ("decode/0", "decode/1") for _, p, _ in fabric.get(k, [])) > 0
    assert sum(f for v in fabric.values() for _, _, f in v) == 0, "".join(c.log)
    assert sum(o for o, _, _ in fabric.get("decode/0", [])) > 0  # the drain's forwards
    # prefill/0 read the cached prompts' blocks through its block fetcher process, in shared
    # memory.
    through = [int(m.group(1)) for l in c.log
               if (m := re.match(r"troupe node\[prefill/0\]: cached blocks read: (\d+) through fetcher/0", l))]
    assert sum(through) > 0, "".join(c.log)
    for pid in pids:  # every node process is gone
        assert not os.path.exists(f"/proc/{pid}") or open(f"/proc/{pid}/stat").read().split()[2] == "Z"


def test_dry_run_prints_every_process_with_its_command_line(model_dir):
    out = subprocess.run([troupe(), "launch", TOPOLOGY, "--model", model_dir, "--engram-map",
                          "identity", "--control", "127.0.0.1:7100", "--compile-threads", "3",
                          "--max-context", "8192", "--kv-tokens", "8192",
                          "--gpu-memory-utilization", "0.45", "--dry-run"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    rows = [l.split() for l in out.stdout.splitlines() if not l.startswith("#")]
    for r in rows[0], rows[2], rows[4], rows[5]:  # decode_lb's KV limit, the devices' pools
        assert r[r.index("--kv-tokens") + 1] == "8192"
        assert r[r.index("--gpu-memory-utilization") + 1] == "0.45"
    assert [(r[0], r[1], r[2]) for r in rows] == [
        ("control", "local", "control"), ("store", "local", "store"),
        ("prefill/0", "local", "prefill"), ("fetcher/0", "local", "fetcher"),
        ("decode/0", "local", "decode"), ("decode/1", "local", "decode")]
    for r in rows:
        assert r[4] == "node" and "--control" in r and r[r.index("--control") + 1] == "127.0.0.1:7100"
    assert rows[4][rows[4].index("--index") + 1] == "0" and rows[5][rows[5].index("--index") + 1] == "1"
    # prefill/0's block fetcher: no model, its instance's index.
    assert rows[3][rows[3].index("--index") + 1] == "0" and "--model" not in rows[3]
    assert rows[0][rows[0].index("--compile-threads") + 1] == "3"  # the entrypoint's compile pool
    # The topology's store (a posix directory) is the store process's: the control process
    # waits for it instead of opening the directory.
    assert "--external-store" in rows[0] and "--index" not in rows[1]
    off = subprocess.run([troupe(), "launch", TOPOLOGY, "--model", model_dir, "--engram-map",
                          "identity", "--block-fetchers", "off", "--dry-run"],
                         capture_output=True, text=True, timeout=120)
    assert off.returncode == 0, off.stderr
    assert "fetcher" not in off.stdout


AUTOSCALED = os.path.join(ROOT, "examples/topologies/local-cpu-autoscale.toml")


def test_dry_run_says_which_ranks_an_instance_process_starts_processes_for(model_dir):
    out = subprocess.run([troupe(), "launch",
                          os.path.join(ROOT, "examples/topologies/local-cpu-ep-processes.toml"),
                          "--model", model_dir, "--engram-map", "identity", "--dry-run"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert ("# each decode process runs ranks 0-1 of its 4 and starts 1 troupe ep-rank "
            "process(es) for ranks 2-3 (ranks_per_process = 2)\n") in out.stdout
    assert "each prefill process" not in out.stdout  # its 2 ranks are threads


def test_a_launch_runs_the_autoscaler_and_a_slurm_job_says_it_does_not(model_dir):
    # local-cpu-autoscale.toml's decode pool may grow to 3: a launch starts the initial
    # instances, and its control process runs the autoscaler (below); a Slurm job keeps the
    # pools at their initial sizes, and says so.
    out = subprocess.run([troupe(), "launch", AUTOSCALED, "--model", model_dir, "--engram-map",
                          "identity", "--dry-run"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "[autoscaler]" not in out.stderr
    assert [l.split()[0] for l in out.stdout.splitlines() if not l.startswith("#")] == [
        "control", "store", "prefill/0", "fetcher/0", "decode/0"]
    assert ("# the autoscaler keeps decode at 1 to 3 instance(s): those it orders run as "
            "decode/<i> with decode/0's command line and --index <i>\n") in out.stdout
    assert "autoscaler keeps prefill" not in out.stdout  # one prefill instance, fixed
    # The Slurm job and the Kubernetes manifests do not scale: they say so.
    for command in ("k8s", "slurm"):
        made = subprocess.run([troupe(), command, AUTOSCALED], capture_output=True, text=True,
                              timeout=120)
        assert made.returncode == 0, made.stderr
        assert (f"troupe {command}: warning: [autoscaler] is on, but "
                f"{'these manifests keep' if command == 'k8s' else 'this job keeps'} the pools "
                "at their initial sizes") in made.stderr
        plain = subprocess.run([troupe(), command, TOPOLOGY], capture_output=True, text=True,
                               timeout=120)
        assert plain.returncode == 0 and "[autoscaler]" not in plain.stderr, plain.stderr
    slurm = subprocess.run([troupe(), "launch", AUTOSCALED, "--model", model_dir, "--engram-map",
                            "identity", "--slurm", "--dry-run"], capture_output=True, text=True,
                           timeout=120)
    assert slurm.returncode == 0, slurm.stderr
    assert ("troupe launch: warning: [autoscaler] is on, but a Slurm job keeps its pools at their "
            "initial sizes") in slurm.stderr


def quick_autoscaled_topology(path, *changes):
    """local-cpu-autoscale.toml deciding every second, with no margin and a 2 s scale-down
    delay, and `changes` ((old, new) pairs), written to `path`."""
    text = open(AUTOSCALED).read()
    for old, new in (('interval = "10s"', 'interval = "1s"'),
                     ('scale_down_after = "30s"', 'scale_down_after = "2s"'),
                     ("over_provision = 0.25", "over_provision = 0"), *changes):
        assert old in text
        text = text.replace(old, new)
    path.write_text(text)
    return str(path)


def test_the_autoscaler_grows_a_launched_decode_pool_and_drains_what_it_removes(model_dir,
                                                                                 tmp_path):
    # Decode instances hold two requests each (--max-batch 2), the autoscaler decides every
    # second with no margin. Two short streams fill decode/0, two long ones wait for room: the
    # demand of four needs two instances, and the launcher starts decode/1 as an OS process,
    # which takes the long ones. Once the short ones are done, two requests need one instance:
    # two seconds later decode/1 is drained (grace 1 s), forwards the long streams with their
    # KV to decode/0, and its process is removed. Every stream ends with exactly its
    # undisturbed greedy tokens.
    topology = quick_autoscaled_topology(tmp_path / "autoscaled.toml", ("max = 3 }", "max = 2 }"),
                                         ('grace = "5s"', 'grace = "1s"'))
    short, long = 280, 480
    bodies = [chat_body(f"Scale {i}: why do pools grow?", max_tokens=n, temperature=0)
              for i, n in enumerate((short, short, long, long))]
    wants = [generated_text(model_dir, b, b["max_tokens"])[0] for b in bodies]
    c = Cluster(model_dir, str(tmp_path / "kv"), str(tmp_path / "state.json"),
                ("--max-batch", "2"), topology)
    try:
        client = c.openai()

        def one(body):
            out, usage = "", None
            for chunk in client.chat.completions.create(**body, stream=True,
                                                         stream_options={"include_usage": True}):
                usage = chunk.usage or usage
                for ch in chunk.choices:
                    out += (getattr(ch.delta, "reasoning_content", None) or "") + (ch.delta.content or "")
            return out, usage

        with concurrent.futures.ThreadPoolExecutor(max_workers=4) as pool:
            futures = []
            for b in bodies:  # the short ones first: they take decode/0's two places
                futures.append(pool.submit(one, b))
                time.sleep(0.3)
            results = [f.result(timeout=900) for f in futures]
        for (got, usage), want, b in zip(results, wants, bodies):
            assert usage is not None and usage.completion_tokens == b["max_tokens"]
            assert got == want
        deadline = time.monotonic() + 120
        while any(p["name"] == "decode/1" for p in c.state()["processes"]):
            assert time.monotonic() < deadline, "decode/1 was not removed:\n" + "".join(c.log)
            time.sleep(0.2)
        metrics = urllib.request.urlopen(c.url + "/metrics", timeout=30).read().decode()
    finally:
        c.stop()
    assert c.proc.returncode == 0, "".join(c.log)
    log = "".join(c.log)
    assert "troupe launch: the autoscaler orders decode/1\n" in log, log
    assert "troupe node[decode/1]: model loaded; serving in the decode pool" in log, log
    assert "troupe launch: the autoscaler removes decode/1\n" in log, log
    assert re.search(r"troupe launch: decode/1 \(pid \d+\) exited with status 0; removed\n", log), log
    # decode/1 held the long streams: it forwarded them, with their KV, to decode/0.
    drained = re.findall(r"troupe node\[decode/1\]: drained; (\d+) request", log)
    assert drained == ["2"], log
    assert not any(p["name"] == "decode/2" for p in c.state()["processes"])
    # The control process's /metrics has the autoscaler's decisions: one instance up, one down.
    for direction in ("up", "down"):
        m = re.search(r'^troupe_autoscaler_scaled_total\{pool="decode",direction="%s"\} (\S+)$'
                      % direction, metrics, re.M)
        assert m and float(m.group(1)) == 1, metrics


def test_the_autoscaler_grows_a_launched_prefill_pool_and_removes_it_with_its_fetcher(model_dir,
                                                                                     tmp_path):
    # The prefill pool may grow to two, the decode pool stays at one. Once a prompt has given
    # the prefill engine a second of device time (its capacity is then measured), a burst of
    # long prompts is more than one instance computes in a second: the launcher starts
    # prefill/1 and its block fetcher fetcher/1. Idle, the pool shrinks: prefill/1 is taken
    # out of its balancer, stopped once it has no job left, and removed with its fetcher.
    topology = quick_autoscaled_topology(
        tmp_path / "prefill-autoscaled.toml",
        ("instances = { min = 1, initial = 1, max = 3 }", "instances = 1"),
        ('role = "prefill"\ninstances = 1',
         'role = "prefill"\ninstances = { min = 1, initial = 1, max = 2 }'))
    c = Cluster(model_dir, str(tmp_path / "kv"), str(tmp_path / "state.json"), (), topology)
    try:
        client = c.openai()
        first = client.chat.completions.create(**long_prompt("measure"))
        assert first.usage.prompt_tokens > 400
        try:
            with concurrent.futures.ThreadPoolExecutor(max_workers=4) as pool:
                burst = list(pool.map(
                    lambda i: client.chat.completions.create(**long_prompt(f"b{i}-")), range(4)))
        except openai.APIError as e:  # what the processes said, to tell why
            raise AssertionError(f"the burst failed: {e}\n" + "".join(c.log)) from e
        assert all(r.usage.completion_tokens == 4 for r in burst)
        deadline = time.monotonic() + 120
        while True:
            names = [p["name"] for p in c.state()["processes"]]
            if "prefill/1" not in names and "fetcher/1" not in names and any(
                    "removes prefill/1" in l for l in c.log):
                break
            assert time.monotonic() < deadline, "prefill/1 was not removed:\n" + "".join(c.log)
            time.sleep(0.2)
        # The pool serves on with its first instance (a short prompt: a long one would be a
        # second of prefill work again, and the pool would grow again).
        again = client.chat.completions.create(**chat_body("Still there?", max_tokens=4,
                                                           temperature=0))
        assert again.usage.completion_tokens == 4
    finally:
        c.stop()
    assert c.proc.returncode == 0, "".join(c.log)
    log = "".join(c.log)
    assert "troupe launch: the autoscaler orders prefill/1\n" in log, log
    assert re.search(r"troupe launch: started fetcher/1 \(pid \d+\)\n", log), log
    # (It may be removed before its main loop prints "model loaded": the autoscaler acts once
    # its engine has announced itself.)
    assert "troupe node[prefill/1]: joined the control process" in log, log
    assert "troupe launch: the autoscaler removes prefill/1\n" in log, log
    assert re.search(r"troupe launch: prefill/1 \(pid \d+\) exited with status 0; removed\n", log), log
    assert re.search(r"troupe launch: fetcher/1 \(pid \d+\) exited with status 0; removed\n", log), log
    assert "orders prefill/2" not in log and "orders decode/" not in log, log


def test_dry_run_places_one_store_process_per_shard(model_dir, tmp_path):
    # storage.shards = 3: three store processes, shard i told by --index i, spread over the
    # hosts that take the store role.
    hosts = tmp_path / "hosts.toml"
    hosts.write_text('[[host]]\nname = "a"\nagent = "10.0.0.1:7000"\nroles = ["control", "prefill", "decode"]\n'
                     '[[host]]\nname = "b"\nagent = "10.0.0.2:7000"\nroles = ["store"]\n'
                     '[[host]]\nname = "c"\nagent = "10.0.0.3:7000"\nroles = ["store"]\n')
    out = subprocess.run([troupe(), "launch", sharded_topology(str(tmp_path), 3), "--model", model_dir,
                          "--engram-map", "identity", "--hosts", str(hosts), "--dry-run"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    rows = [l.split() for l in out.stdout.splitlines() if not l.startswith("#")]
    stores = [r for r in rows if r[2] == "store"]
    assert [(r[0], r[1]) for r in stores] == [("store/0", "b"), ("store/1", "c"), ("store/2", "b")]
    for i, r in enumerate(stores):
        assert r[r.index("--index") + 1] == str(i) and "--model" not in r
    assert "--external-store" in rows[0]


def test_hosts_devices_bound_where_instances_go(model_dir, tmp_path):
    # A host's `devices` is how many instance processes it takes: local-cpu-3's two decode
    # instances skip host a, whose one device prefill/0 took, and go to b and c; its fetcher
    # stays beside prefill/0. More instances than devices is refused before anything starts,
    # and the autoscaler's room is said.
    hosts = tmp_path / "hosts.toml"
    def write(a, b, c):
        hosts.write_text(
            f'[[host]]\nname = "a"\nagent = "10.0.0.1:7000"\nroles = ["control", "prefill", "decode"]\n{a}'
            f'[[host]]\nname = "b"\nagent = "10.0.0.2:7000"\nroles = ["decode"]\n{b}'
            f'[[host]]\nname = "c"\nagent = "10.0.0.3:7000"\nroles = ["decode"]\n{c}')
    def launch(topology=TOPOLOGY):
        return subprocess.run([troupe(), "launch", topology, "--model", model_dir, "--engram-map",
                               "identity", "--hosts", str(hosts), "--dry-run"],
                              capture_output=True, text=True, timeout=120)
    write("devices = 1\n", "devices = 1\n", "devices = 2\n")
    out = launch()
    assert out.returncode == 0, out.stderr
    rows = {l.split()[0]: l.split()[1] for l in out.stdout.splitlines() if not l.startswith("#")}
    assert rows == {"control": "a", "store": "a", "prefill/0": "a", "fetcher/0": "a",
                    "decode/0": "b", "decode/1": "c"}, out.stdout
    assert "# host a: 1 of 1 device(s) taken\n" in out.stdout
    assert "# host c: 1 of 2 device(s) taken\n" in out.stdout
    # Without `devices` a host takes any number: decode/1 goes round-robin to host a.
    write("", "devices = 1\n", "devices = 1\n")
    out = launch()
    rows = {l.split()[0]: l.split()[1] for l in out.stdout.splitlines() if not l.startswith("#")}
    assert out.returncode == 0 and rows["decode/0"] == "a" and rows["decode/1"] == "b", out.stdout
    # Three instances, two devices.
    write("devices = 1\n", "devices = 1\n", "")
    hosts.write_text(hosts.read_text().replace('"c"\nagent = "10.0.0.3:7000"\nroles = ["decode"]',
                                               '"c"\nagent = "10.0.0.3:7000"\nroles = ["store"]'))
    out = launch()
    assert out.returncode == 1 and out.stdout == "", out.stdout
    assert ("no host has a free device for decode/1: the hosts that take the decode role have "
            "2 device(s)") in out.stderr, out.stderr
    # The autoscaler may want three decode instances where two fit.
    write("devices = 1\n", "devices = 1\n", "devices = 1\n")
    out = launch(AUTOSCALED)
    assert out.returncode == 0, out.stderr
    assert ("troupe launch: warning: the autoscaler may grow decode to 3 instance(s), but the "
            "hosts that take the role have 1 free device(s)") in out.stderr, out.stderr
    for bad in ("0", '"2"', "1.5"):
        write(f"devices = {bad}\n", "", "")
        out = launch()
        assert out.returncode == 1, out.stderr
        assert "host 1: devices: expected a whole number from 1 to 65536" in out.stderr, out.stderr


def test_slurm_dry_run_prints_the_job_with_absolute_paths(model_dir):
    # `launch --slurm` turns the launch options into the heterogeneous job's: paths relative to
    # here become absolute (the job's machines see a shared file system), the control listens
    # on every interface, the entrypoint's options reach the nodes.
    parent, name = os.path.split(model_dir)
    out = subprocess.run([os.path.abspath(troupe()), "launch", TOPOLOGY, "--model", name, "--engram-map",
                          "identity", "--compile-threads", "3", "--slurm", "--partition", "gpu",
                          "--time", "1:00:00", "--dry-run"],
                         capture_output=True, text=True, timeout=120, cwd=parent)
    assert out.returncode == 0, out.stderr
    script = out.stdout
    assert script.startswith("#!/bin/bash\n") and "#SBATCH --partition=gpu" in script
    assert script.count("#SBATCH --time=1:00:00") == 3  # control, prefill and decode components
    nodes = [l for l in script.splitlines() if '"$troupe" node' in l]
    assert len(nodes) == 5  # control, store, prefill/0, decode/0, decode/1
    assert "--listen 0.0.0.0:8000" in nodes[0] and "--control 0.0.0.0:4242" in nodes[0]
    assert "--external-store" in nodes[0] and "--role store" in nodes[1]
    for l in nodes:
        assert (f"--model {model_dir} " in l) == ("--role store" not in l)
        assert "--compile-threads 3" in l
    assert f"topology={os.path.abspath(TOPOLOGY)}" in script
    # prefill/0's step starts its block fetcher (no model), then becomes the prefill process.
    prefill = [l for l in nodes if "--role prefill" in l]
    assert len(prefill) == 1 and prefill[0].startswith("  bash -c 'troupe_respawn fetcher/0 ")
    fetcher, engine = prefill[0].split(" & exec ")
    assert "--role fetcher --index 0 " in fetcher and "--model" not in fetcher
    assert "\ntroupe_respawn() {\n" in script and "\nexport -f troupe_respawn\n" in script
    assert "--role prefill --index 0 " in engine
    off = subprocess.run([os.path.abspath(troupe()), "launch", TOPOLOGY, "--model", name,
                          "--engram-map", "identity", "--slurm", "--block-fetchers", "off",
                          "--dry-run"], capture_output=True, text=True, timeout=120, cwd=parent)
    assert off.returncode == 0, off.stderr
    assert "--role fetcher" not in off.stdout and "bash -c" not in off.stdout
    assert "troupe_respawn" not in off.stdout


@pytest.mark.parametrize("args,why", [
    (["--slurm", "--hosts", "hosts.toml"], "--hosts excludes --slurm"),
    (["--partition", "gpu"], "--partition requires --slurm"),
])
def test_slurm_options_are_refused_where_they_do_not_apply(model_dir, args, why):
    out = subprocess.run([troupe(), "launch", TOPOLOGY, "--model", model_dir, *args, "--dry-run"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode != 0 and why in out.stderr, out.stderr


def test_the_processes_tls_files_need_the_launcher_s_own(model_dir, tmp_path):
    # --node-tls-* (the processes' files, apart from the launcher's) without --tls-*, or
    # incomplete, is refused before anything starts.
    base = [troupe(), "launch", TOPOLOGY, "--model", model_dir, "--engram-map", "identity",
            "--dry-run"]
    out = subprocess.run(base + ["--node-tls-ca", str(tmp_path / "ca.pem")], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 1 and ("--node-tls-ca, --node-tls-cert and --node-tls-key need "
                                    "--tls-ca, --tls-cert and --tls-key") in out.stderr, out.stderr
    certs = tmp_path / "certs"
    made = subprocess.run([troupe(), "certs", "--out", str(certs), "--nodes", "launcher"],
                          capture_output=True, text=True, timeout=120)
    assert made.returncode == 0, made.stderr
    own = ["--tls-ca", str(certs / "ca.pem"), "--tls-cert", str(certs / "launcher.pem"),
           "--tls-key", str(certs / "launcher.key")]
    out = subprocess.run(base + own + ["--node-tls-cert", str(certs / "launcher.pem")],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 1 and "the processes' TLS (--node-tls-*): " in out.stderr, out.stderr
    out = subprocess.run(base + own + ["--node-tls-ca", str(certs / "ca.pem"), "--node-tls-cert",
                                       str(certs / "launcher.pem"), "--node-tls-key",
                                       str(certs / "launcher.key")],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr


def test_slurm_tls_needs_all_three_files(tmp_path):
    out = subprocess.run([troupe(), "slurm", TOPOLOGY, "--tls-ca", str(tmp_path / "ca.pem")],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 1
    assert "TLS needs --tls-ca, --tls-cert and --tls-key together" in out.stderr
    assert out.stdout == ""


def test_bad_input_is_refused_before_any_process_starts(model_dir):
    out = subprocess.run([troupe(), "launch", TOPOLOGY, "--model", model_dir, "--engram-map",
                          "identity", "--control", "nowhere"], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 1
    assert "--control 'nowhere': expected HOST:PORT" in out.stderr
    assert "started" not in out.stderr


@pytest.mark.parametrize("gpus,why", [
    ("3", "--gpus: 1 healthy GPU(s) of 4 cannot form an EP group (it needs 2)"),
    ("0,5", "--gpus: expected ascending GPUs of the instance's 4 (0..3), each once"),
    ("2,1", "--gpus: expected ascending GPUs of the instance's 4 (0..3), each once"),
])
def test_an_instance_process_refuses_gpus_that_cannot_form_its_ep_group(model_dir, gpus, why):
    # What the launcher passes after GPU faults (--gpus, the healthy ones), checked before the
    # process reaches for the control process.
    out = subprocess.run([troupe(), "node", os.path.join(ROOT, "examples/topologies/local-cpu-ep.toml"),
                          "--role", "decode", "--index", "0", "--control", "127.0.0.1:1",
                          "--model", model_dir, "--engram-map", "identity", "--gpus", gpus,
                          "--connect-timeout", "1"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 1
    assert why in out.stderr
    assert "cannot reach the control process" not in out.stderr


def test_a_link_fault_is_carried_out_between_hosts_and_not_executed_on_one(model_dir, tmp_path):
    # A link fault names pools or instances; with --hosts a partition becomes a cut, a slowdown
    # a slowdown, between the hosts of each pair of its ends' processes (hosts_netns.sh and
    # hosts_slow_link_netns.sh carry them out); on one host, where the processes share the
    # loopback, neither is executed, and the launcher says why.
    plan = tmp_path / "plan.toml"
    plan.write_text('[[fault]]\nat = "3s"\nkind = "partition"\nlink = ["prefill/0", "decode"]\n'
                    'duration = "2s"\n'
                    '[[fault]]\nat = "9s"\nkind = "slow"\nlink = ["decode/1", "prefill"]\n'
                    'factor = 2.5\nduration = "4s"\n')
    hosts = tmp_path / "hosts.toml"
    hosts.write_text('[[host]]\nname = "a"\nagent = "10.0.0.1:7000"\nroles = ["control", "prefill"]\n'
                     '[[host]]\nname = "b"\nagent = "10.0.0.2:7000"\nroles = ["decode"]\n')
    base = [troupe(), "launch", TOPOLOGY, "--model", model_dir, "--engram-map", "identity",
            "--faults", str(plan), "--dry-run"]
    out = subprocess.run(base + ["--hosts", str(hosts)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert [l for l in out.stdout.splitlines() if l.startswith("# 3.0")] == [
        "# 3.0 cut prefill/0 <-> decode/0 for 2.0 s (fault 0)",
        "# 3.0 cut prefill/0 <-> decode/1 for 2.0 s (fault 0)"]
    assert [l for l in out.stdout.splitlines() if l.startswith("# 9.0")] == [
        "# 9.0 slow decode/1 <-> prefill/0 by 2.5x for 4.0 s (fault 1)"]
    assert "not executed" not in out.stderr
    local = subprocess.run(base, capture_output=True, text=True, timeout=120)
    assert local.returncode == 0, local.stderr
    assert "cut" not in local.stdout and "slow" not in local.stdout
    assert ("fault not executed: 3.0s partition link prefill/0 <-> decode: a link partition "
            "needs hosts of their own (--hosts)") in local.stderr
    assert ("fault not executed: 9.0s slow link decode/1 <-> prefill: a link slowdown "
            "needs hosts of their own (--hosts)") in local.stderr


def test_a_fault_plan_is_executed_on_the_processes(model_dir, tmp_path):
    # The simulator's plan format, for real: decode/0's GPU fails 1 s after the cluster
    # serves and comes back 4 s later (SIGKILL, held down, restarted); a surge has no real
    # counterpart and is reported as not executed.
    plan = tmp_path / "plan.toml"
    plan.write_text('[[fault]]\nat = "1s"\nkind = "fail"\ngpu = "decode/0/0"\nduration = "4s"\n'
                    '[[fault]]\nat = "2s"\nkind = "surge"\nfactor = 2\nduration = "1s"\n')
    events = tmp_path / "events.jsonl"
    c = Cluster(model_dir, str(tmp_path / "kv"), str(tmp_path / "state.json"),
                ["--faults", str(plan), "--events", str(events)])
    try:
        first = c.process("decode/0")["pid"]
        deadline = time.monotonic() + 120
        seen_down = False
        while time.monotonic() < deadline:
            p = c.process("decode/0")
            seen_down = seen_down or p["state"] == "down"
            if seen_down and p["state"] == "running" and p["pid"] != first:
                break
            time.sleep(0.05)
        else:
            pytest.fail("decode/0 did not go down and come back:\n" + "".join(c.log))
        assert p["restarts"] == 0  # a fault's restart is not a crash
        body = chat_body("After the fault.", max_tokens=4, temperature=0)
        r = c.openai().chat.completions.create(**body)
        assert r.usage.completion_tokens == 4
    finally:
        c.stop()
    assert c.proc.returncode == 0
    assert any("fault not executed: 2.0s surge" in l for l in c.log)
    log = [json.loads(l) for l in events.read_text().splitlines()]
    faults = [(e["action"], e["process"]) for e in log if e["event"] == "fault"]
    assert faults == [("kill", "decode/0"), ("release", "decode/0")]
    kill = next(e for e in log if e["event"] == "fault" and e["action"] == "kill")
    release = next(e for e in log if e["event"] == "fault" and e["action"] == "release")
    assert 3.5 <= release["t"] - kill["t"] <= 6
    exits = [e for e in log if e["event"] == "exit" and e["process"] == "decode/0"]
    assert exits[0]["pid"] == first and exits[0]["status"] == "killed by SIGKILL"
    starts = [e for e in log if e["event"] == "start" and e["process"] == "decode/0"]
    assert len(starts) >= 2 and starts[1]["t"] >= release["t"]


def test_a_failed_gpu_of_an_ep_group_re_forms_its_instance_on_the_gpus_left(model_dir, tmp_path):
    # examples/topologies/local-cpu-ep.toml: decode/0 is an EP group of 4 rank threads. GPU 2
    # fails 1 s after the cluster serves: the process is killed and restarts at once on GPUs
    # 0,1 (3 healthy, rounded down to the EP size rule's 2), answering the same greedy tokens
    # as the full group; then GPUs 0 and 1 fail too, and with one healthy GPU of 4 it stays
    # down until GPU 1 recovers and it can form a group of 2 again.
    plan = tmp_path / "plan.toml"
    plan.write_text('[[fault]]\nat = "1s"\nkind = "fail"\ngpu = "decode/0/2"\n'
                    '[[fault]]\nat = "12s"\nkind = "fail"\ngpu = "decode/0/0"\n'
                    '[[fault]]\nat = "12s"\nkind = "fail"\ngpu = "decode/0/1"\n'
                    '[[fault]]\nat = "15s"\nkind = "recover"\ngpu = "decode/0/1"\n')
    events = tmp_path / "events.jsonl"
    body = chat_body("An expert-parallel group of four.", max_tokens=8, temperature=0)
    want, _ = generated_text(model_dir, body, 8)
    c = Cluster(model_dir, str(tmp_path / "kv"), str(tmp_path / "state.json"),
                ["--faults", str(plan), "--events", str(events)],
                topology=os.path.join(ROOT, "examples/topologies/local-cpu-ep.toml"))

    try:
        first = c.process("decode/0")["pid"]
        p = c.wait_for("decode/0", "re-formed on 2 GPUs", lambda p: p["state"] == "running"
                     and p["pid"] != first and p.get("ep") == 2)
        assert p["failed_gpus"] == [2] and p["restarts"] == 0
        deadline = time.monotonic() + 120
        while not any("decode pool as an EP group of 2 rank(s) on GPU(s) 0,1 (EP 4 -> 2)" in l
                      for l in c.log):
            assert time.monotonic() < deadline, "".join(c.log)
            time.sleep(0.1)
        assert c.answer(body) == want
        c.wait_for("decode/0", "went down with one GPU of 4",
                   lambda p: p["state"] == "down" and p["ep"] == 0)
        p = c.wait_for("decode/0", "came back on GPUs 1 and 3", lambda p: p["state"] == "running"
                     and p["ep"] == 2 and p["failed_gpus"] == [0, 2])
        assert c.answer(body) == want
    finally:
        c.stop()
    assert c.proc.returncode == 0
    log = [json.loads(l) for l in events.read_text().splitlines()]
    faults = [(e["action"], e["gpu"], e["healthy_gpus"], e["ep"]) for e in log
              if e["event"] == "fault"]
    assert faults == [("fail_gpu", 2, [0, 1, 3], 2), ("fail_gpu", 0, [1, 3], 2),
                      ("fail_gpu", 1, [3], 0), ("heal_gpu", 1, [1, 3], 2)]
    assert any("too few for an EP group (2 needed): down until enough recover" in l
               for l in c.log)


def test_a_slowed_or_failed_gpu_of_a_rank_process_takes_that_process_alone(model_dir, tmp_path):
    # examples/topologies/local-cpu-ep-processes.toml: decode/0 is an EP group of 4 ranks, 2-3
    # in a rank process of its own. GPU 3 is slowed 4x for 4 s 1 s after the cluster serves:
    # its rank process alone is stopped and resumed (a straggler the group waits for). Then it
    # fails: only that rank process is killed, decode/0's process stays and re-forms on ranks
    # 0-1, and says so (the state's ep_now); GPU 2 failing at 30 s is not in that group:
    # nothing stops. Killed, the process restarts on its healthy GPUs 0,1, as a group of 2
    # from the start.
    plan = tmp_path / "plan.toml"
    plan.write_text('[[fault]]\nat = "1s"\nkind = "slow"\ngpu = "decode/0/3"\nfactor = 4\n'
                    'duration = "4s"\n'
                    '[[fault]]\nat = "6s"\nkind = "fail"\ngpu = "decode/0/3"\n'
                    '[[fault]]\nat = "30s"\nkind = "fail"\ngpu = "decode/0/2"\n')
    events = tmp_path / "events.jsonl"
    body = chat_body("Ranks in processes of their own.", max_tokens=8, temperature=0)
    want, _ = generated_text(model_dir, body, 8)
    c = Cluster(model_dir, str(tmp_path / "kv"), str(tmp_path / "state.json"),
                ["--faults", str(plan), "--events", str(events)],
                topology=os.path.join(ROOT, "examples/topologies/local-cpu-ep-processes.toml"))

    def rank_processes(parent):
        out = []
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                with open(f"/proc/{pid}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
                with open(f"/proc/{pid}/cmdline") as f:
                    argv = f.read().split("\0")
            except (OSError, IndexError):
                continue
            if ppid == parent and argv[1:2] == ["ep-rank"]:
                out.append(int(pid))
        return out

    try:
        first = c.process("decode/0")["pid"]
        ranks = rank_processes(first)
        assert len(ranks) == 1
        time.sleep(1.5)
        assert c.answer(body) == want  # while its rank process is slowed
        p = c.wait_for("decode/0", "re-formed on 2 ranks", lambda p: p.get("ep_now") == 2)
        assert p["pid"] == first and p["restarts"] == 0 and p["state"] == "running"
        assert p["failed_gpus"] == [3] and p["ep"] == 2
        assert rank_processes(first) == []
        assert c.answer(body) == want
        p = c.wait_for("decode/0", "took GPU 2's failure", lambda p: p["failed_gpus"] == [2, 3])
        assert p["pid"] == first and p["ep_now"] == 2
        assert c.answer(body) == want
        os.kill(first, signal.SIGKILL)
        p = c.wait_for("decode/0", "restarted",
                       lambda p: p["state"] == "running" and p["pid"] != first)
        assert "ep_now" not in p and p["ep"] == 2 and p["restarts"] == 1
        assert c.answer(body) == want
    finally:
        c.stop()
    assert c.proc.returncode == 0
    log = [json.loads(l) for l in events.read_text().splitlines()]
    slowed = [(e["action"], e["gpu"], e["rank_process"]) for e in log
              if e["event"] == "fault" and e["action"] in ("stop", "resume")]
    assert len(slowed) >= 30 and set(slowed) == {("stop", 3, ranks[0]), ("resume", 3, ranks[0])}
    faults = [(e["action"], e["gpu"], e["healthy_gpus"], e["ep"], e.get("rank_process"))
              for e in log if e["event"] == "fault" and e["action"] not in ("stop", "resume")]
    assert faults == [("fail_gpu", 3, [0, 1, 2], 2, ranks[0]), ("fail_gpu", 2, [0, 1], 2, None)]
    assert [(e["process"], e["pid"], e["ep"]) for e in log if e["event"] == "reform"] == [
        ("decode/0", first, 2)]
    assert any("the process of its rank 3 (pid %d) is killed" % ranks[0] in l for l in c.log)
    assert any("its running EP group of 2 does not use it" in l for l in c.log)


def test_with_tls_a_process_without_the_cluster_s_certificate_cannot_join(model_dir, tmp_path):
    # Mutual TLS between the processes: every process presents a certificate of the cluster's
    # CA (`troupe certs`). A decode process with another CA's certificate, or with none, is
    # refused by the control process.
    certs, other = tmp_path / "certs", tmp_path / "other"
    for out, node in ((certs, "cluster"), (other, "intruder")):
        subprocess.run([troupe(), "certs", "--out", str(out), "--nodes", node], check=True,
                       capture_output=True, timeout=120)
    tls = ["--tls-ca", str(certs / "ca.pem"), "--tls-cert", str(certs / "cluster.pem"),
           "--tls-key", str(certs / "cluster.key")]
    c = Cluster(model_dir, str(tmp_path / "kv"), str(tmp_path / "state.json"), tls)
    try:
        r = c.openai().chat.completions.create(**chat_body("Over TLS.", max_tokens=4,
                                                            temperature=0))
        assert r.usage.completion_tokens == 4
        join = [troupe(), "node", TOPOLOGY, "--role", "decode", "--index", "1", "--control",
                c.state()["control"], "--model", model_dir, "--engram-map", "identity",
                "--connect-timeout", "3", "--fabric", "none"]
        for creds in (["--tls-ca", str(other / "ca.pem"), "--tls-cert",
                       str(other / "intruder.pem"), "--tls-key", str(other / "intruder.key")], []):
            out = subprocess.run(join + creds, capture_output=True, text=True, timeout=180)
            assert out.returncode == 1, out.stderr
            assert "cannot reach the control process" in out.stderr
        # The refusals disturbed nobody: the cluster serves on with every process as it was
        # (docs/tls.md: a failed peer no longer takes the others' links down).
        r = c.openai().chat.completions.create(**chat_body("Still over TLS.", max_tokens=4,
                                                            temperature=0))
        assert r.usage.completion_tokens == 4
        assert all(p["restarts"] == 0 for p in c.state()["processes"]), "".join(c.log)
        # SIGTERM to the control process alone: before it stops it tells every instance
        # process (over TLS), which stop with status 0 as from an orderly stop, not as from a
        # lost control (status 3, restarted); the launcher then ends, status 0.
        os.kill(c.process("control")["pid"], signal.SIGTERM)
        c.proc.wait(timeout=120)
    finally:
        c.stop()
    assert c.proc.returncode == 0, "".join(c.log)
    assert "troupe launch: the control process ended; stopping the cluster\n" in c.log
    for name in ("prefill/0", "decode/0", "decode/1"):
        assert f"troupe node[{name}]: the control process is stopping the cluster\n" in c.log, \
            "".join(c.log)
    assert not any("lost the control process" in l for l in c.log), "".join(c.log)


def two_prefill_topology(directory):
    """local-cpu-3 with two prefill instances, in a bucket of prompts with under 200 tokens to
    compute and one of the rest, and one decode instance, written under `directory`."""
    text = open(TOPOLOGY).read()
    for old, new in (('instances = 1\ngpus_per_instance = 1\nbuckets = [4096]',
                      'instances = 2\ngpus_per_instance = 1\nbuckets = [200]'),
                     ('instances = 2\ngpus_per_instance = 1\ngrace',
                      'instances = 1\ngpus_per_instance = 1\ngrace')):
        assert old in text
        text = text.replace(old, new)
    path = os.path.join(directory, "local-cpu-3-two-prefill.toml")
    with open(path, "w") as f:
        f.write(text)
    return path


def restores(cluster, outcome):
    """The control's /metrics count of prefix restores with `outcome` over every prefill
    device (mirrored from the instance processes each second)."""
    text = urllib.request.urlopen(cluster.url + "/metrics", timeout=30).read().decode()
    return sum(float(l.split()[-1]) for l in text.splitlines()
               if l.startswith('troupe_kv_restores_total{device="prefill/')
               and f'outcome="{outcome}"' in l)


def test_a_window_state_one_prefill_process_kept_is_pulled_by_another(model_dir, tmp_path):
    # Two prefill processes, one per length bucket. A long prompt is computed in the bucket of
    # long ones, whose device keeps the prompt's window state at its last block boundary. The
    # same prompt again computes only its tail, short, so the other process takes it: it
    # restores the cached prefix with the window state it pulls from the first process (over
    # the fabric, bridge to bridge), not by bounded replay, and answers the same greedy text.
    c = Cluster(model_dir, str(tmp_path / "kv"), str(tmp_path / "state.json"), (),
                two_prefill_topology(str(tmp_path)))
    try:
        body = long_prompt("window")
        first = c.openai().chat.completions.create(**body)
        again = until_cached(c, body)
        assert again.usage.prompt_tokens_details.cached_tokens >= 512
        assert again.usage.prompt_tokens - again.usage.prompt_tokens_details.cached_tokens < 200
        for _ in range(50):
            if restores(c, "pulled") >= 1:
                break
            time.sleep(0.2)
        assert restores(c, "pulled") == 1, "".join(c.log)
        assert restores(c, "replayed") == 0
        assert again.choices[0].message.content == first.choices[0].message.content
    finally:
        c.stop()
    assert c.proc.returncode == 0, "".join(c.log)
    assert not any("could not be pulled" in l for l in c.log), "".join(c.log)


def test_the_launcher_runs_one_process_per_role_and_instance(cluster):
    procs = cluster.state()["processes"]
    assert [p["name"] for p in procs] == ["control", "store/0", "store/1", "prefill/0",
                                          "fetcher/0", "decode/0", "decode/1"]
    assert all(p["state"] == "running" and p["pid"] > 0 for p in procs)
    assert len({p["pid"] for p in procs}) == 7


def test_a_next_turn_pulls_the_window_state_a_decode_process_kept_at_its_reply(cluster,
                                                                                 model_dir):
    # A 255-token prompt: the decode process's first step feeds the prompt's first token at
    # position 255 and ends on the block boundary at 256, where its device keeps the window
    # state (and its block writer persists the block). The next turn's prompt holds the prompt
    # and the reply, so its cached prefix ends there: the prefill process pulls the state from
    # the decode process (over the fabric, bridge to bridge), not by bounded replay, and
    # answers what computing the whole prompt answers.
    kw = dict(max_tokens=2, temperature=0, extra_body={"thinking": {"type": "disabled"}})
    first = chat_body("sea" + " sea" * 250, **kw)
    blocks = store_metric(cluster, "troupe_store_blocks", 0)
    pulled, replayed = restores(cluster, "pulled"), restores(cluster, "replayed")
    r1 = cluster.openai().chat.completions.create(**first)
    assert r1.usage.prompt_tokens == 255
    # Two copies (replicas = 2) of blocks 0 (prefill's) and 1 (decode's).
    assert store_metric(cluster, "troupe_store_blocks", blocks + 4) >= blocks + 4
    second = dict(first)
    second["messages"] = first["messages"] + [
        {"role": "assistant", "content": r1.choices[0].message.content},
        {"role": "user", "content": "And then?"}]
    r2 = cluster.openai().chat.completions.create(**second)
    # (A reply whose text tokenizes other than it was generated would end the match earlier.)
    assert r2.usage.prompt_tokens_details.cached_tokens == 256
    for _ in range(50):
        if restores(cluster, "pulled") > pulled:
            break
        time.sleep(0.2)
    assert restores(cluster, "pulled") == pulled + 1, "".join(cluster.log)
    assert restores(cluster, "replayed") == replayed
    body = {k: v for k, v in second.items() if k != "extra_body"} | second["extra_body"]
    assert r2.choices[0].message.content == generated_text(model_dir, body, 2)[0]


def test_every_node_process_runs_its_heap_on_huge_pages(cluster):
    # A troupe node re-executes itself once with glibc.malloc.hugetlb=1 (the fabric's shm copy
    # runs ~2x as fast on huge pages); the launcher itself does not.
    def tunables(pid):
        env = open(f"/proc/{pid}/environ", "rb").read().split(b"\0")
        return [e.decode() for e in env if e.startswith(b"GLIBC_TUNABLES=")]
    assert tunables(cluster.proc.pid) == []
    for p in cluster.state()["processes"]:
        assert tunables(p["pid"]) == ["GLIBC_TUNABLES=glibc.malloc.hugetlb=1"], p["name"]


def long_prompt(tag):
    return chat_body(" ".join(f"{tag}{i} of the store" for i in range(160)), max_tokens=4,
                     temperature=0, extra_body={"thinking": {"type": "disabled"}})


def until_cached(cluster, body, tries=20):
    """The response to `body` once its prompt is a prefix hit (the blocks are committed
    shortly after the hand-off), or the last one after `tries`."""
    for _ in range(tries):
        r = cluster.openai().chat.completions.create(**body)
        if r.usage.prompt_tokens_details.cached_tokens > 0:
            return r
        time.sleep(0.5)
    return r


def store_metric(cluster, name, at_least):
    """The control's /metrics value of `name` once it reaches `at_least` (the store's figures
    are mirrored from the store process every second), or the last one read."""
    for _ in range(50):
        text = urllib.request.urlopen(cluster.url + "/metrics", timeout=30).read().decode()
        value = sum(float(l.split()[-1]) for l in text.splitlines() if l.startswith(name))
        if value >= at_least:
            break
        time.sleep(0.2)
    return value


def test_the_store_process_holds_the_block_store_of_the_whole_cluster(cluster):
    # The instance processes persist a long prompt's blocks into the store processes (each
    # block into its shard's) and read them back, the payloads over the fabric: a repeat of
    # the prompt is a prefix hit with the same greedy tokens, and the control's /metrics counts
    # the blocks and the reads of each shard (the store's figures are the cluster's).
    body = long_prompt("block")
    first = cluster.openai().chat.completions.create(**body)
    assert first.usage.prompt_tokens >= 512
    again = until_cached(cluster, body)
    assert again.usage.prompt_tokens_details.cached_tokens >= 512
    assert again.choices[0].message.content == first.choices[0].message.content
    assert store_metric(cluster, "troupe_store_blocks", 4) >= 4
    assert store_metric(cluster, 'troupe_store_reads_total{outcome="hit"', 4) >= 4
    for shard in ("0", "1"):  # a prompt's blocks spread over both shards
        assert store_metric(cluster, f'troupe_store_blocks{{shard="{shard}"}}', 1) >= 1


def test_a_store_process_killed_under_load_loses_no_request(cluster):
    # kill -9 of a store process (shard 1 of 2, every block copied on both: storage.replicas
    # = 2) while eight streams decode and four long prompts are being read back from the
    # store: every request completes with the tokens of a run without the fault, the prompts
    # asked while it is down are still hits (served by the other copy), the launcher restarts
    # it, and its blocks are hits again.
    cached = [long_prompt(f"kept{k}_") for k in range(4)]
    want_cached = [cluster.openai().chat.completions.create(**b).choices[0].message.content
                   for b in cached]
    for b in cached:
        until_cached(cluster, b)
    streams = [chat_body(f"Store fault stream {i}: tell a long story.", max_tokens=48,
                         temperature=0) for i in range(8)]
    want_streams = [cluster.openai().chat.completions.create(**b) for b in streams]
    store = cluster.process("store/1")
    restarts = store["restarts"]

    def kill_store():
        os.kill(store["pid"], signal.SIGKILL)
        # Prompts whose blocks are in the dead store: asked while it is down or restarting.
        with concurrent.futures.ThreadPoolExecutor(max_workers=len(cached)) as pool:
            got = list(pool.map(lambda b: cluster.openai().chat.completions.create(**b), cached))
        assert [r.choices[0].message.content for r in got] == want_cached
        hits = [r.usage.prompt_tokens_details.cached_tokens for r in got]
        assert all(h >= 512 for h in hits), (hits, "".join(cluster.log))

    results = run_streams(cluster, streams, 8, kill_store)
    for (text, usage), want in zip(results, want_streams):
        assert usage.completion_tokens == want.usage.completion_tokens
        assert text == (getattr(want.choices[0].message, "reasoning_content", None) or "") + (
            want.choices[0].message.content or "")
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        p = cluster.process("store/1")
        if p["state"] == "running" and p["pid"] != store["pid"] and p["restarts"] == restarts + 1:
            break
        time.sleep(0.2)
    else:
        pytest.fail("store/1 was not restarted:\n" + "".join(cluster.log))
    # Back: the blocks written before the kill are on its disk, and hits again.
    for b, want in zip(cached, want_cached):
        r = until_cached(cluster, b)
        assert r.usage.prompt_tokens_details.cached_tokens >= 512, "".join(cluster.log)
        assert r.choices[0].message.content == want
    assert sum("troupe node[store]: serving shard 1 of 2 of the block store" in l
               for l in cluster.log) == 2 + restarts, "".join(cluster.log)


def test_blocks_a_stopped_store_shard_missed_are_copied_to_it_once_it_answers(cluster):
    # SIGSTOP of store/1 (every block on both shards): a new prompt's blocks reach shard 0,
    # and their puts to shard 1 fail when its proxy gives up on it (30 s). After SIGCONT the
    # next put shard 1 answers makes the prefill process's store router copy the blocks it
    # missed (hinted repair): both shards hold every block again.
    def blocks(shard):
        return store_metric(cluster, f'troupe_store_blocks{{shard="{shard}"}}', 0)
    store = cluster.process("store/1")
    os.kill(store["pid"], signal.SIGSTOP)
    try:
        cluster.openai().chat.completions.create(**long_prompt("missed_"))
        time.sleep(32)
    finally:
        os.kill(store["pid"], signal.SIGCONT)
    time.sleep(2)  # the control mirrors the store's figures every second
    missed = blocks("0") - blocks("1")
    assert missed > 0, "".join(cluster.log)
    until_cached(cluster, long_prompt("after_stop_"))
    # Stopped for 32 s, store/1 was cut off (8 s without a heartbeat) and restarts once
    # resumed; when that prompt's puts came before the new process joined, they were missed
    # too, so a fresh prompt every 5 s gives the shard the put that starts the repair.
    deadline = time.monotonic() + 90
    next_prompt, fresh = time.monotonic() + 5, 0
    while blocks("1") < blocks("0") and time.monotonic() < deadline:
        if time.monotonic() >= next_prompt:
            fresh += 1
            cluster.openai().chat.completions.create(**long_prompt(f"after_stop_{fresh}_"))
            next_prompt = time.monotonic() + 5
        time.sleep(0.5)
    assert blocks("1") == blocks("0"), "".join(cluster.log)


def test_a_killed_block_fetcher_is_restarted_and_its_instance_reads_through_it_again(cluster):
    # kill -9 of fetcher/0 right after prefill/0 read a cached prompt through it: the prompt
    # asked again meanwhile is still a hit (read from the store), the launcher restarts the
    # fetcher, prefill/0 maps the new fetcher's segment (named after its pid), and a new
    # prompt's cached blocks come through it, each within two minutes (gets the dead fetcher
    # never answers go to the store once the new one registers: none waits its 90 s out).
    def mapped_segments():
        prefill = cluster.process("prefill/0")
        return open(f"/proc/{prefill['pid']}/maps").read()
    client = cluster.openai().with_options(timeout=120)
    body = long_prompt("fetched_")
    client.chat.completions.create(**body)
    assert until_cached(cluster, body).usage.prompt_tokens_details.cached_tokens >= 512
    fetcher = cluster.process("fetcher/0")
    assert f"/troupe-fetch-{fetcher['pid']}-" in mapped_segments(), "".join(cluster.log)
    os.kill(fetcher["pid"], signal.SIGKILL)
    r = client.chat.completions.create(**body)
    assert r.usage.prompt_tokens_details.cached_tokens >= 512, "".join(cluster.log)
    again = wait_restarted(cluster, "fetcher/0", fetcher["pid"], fetcher["restarts"] + 1)
    deadline = time.monotonic() + 60
    while f"/troupe-fetch-{again['pid']}-" not in mapped_segments():
        assert time.monotonic() < deadline, "".join(cluster.log)
        time.sleep(0.2)
    fresh = long_prompt("refetched_")
    first = client.chat.completions.create(**fresh)
    for _ in range(20):
        r = client.chat.completions.create(**fresh)
        if r.usage.prompt_tokens_details.cached_tokens > 0:
            break
        time.sleep(0.5)
    assert r.usage.prompt_tokens_details.cached_tokens >= 512, "".join(cluster.log)
    assert r.choices[0].message.content == first.choices[0].message.content
    assert sum("troupe node[fetcher/0]: fetching blocks for prefill/0" in l
               for l in cluster.log) == 2 + fetcher["restarts"], "".join(cluster.log)


def test_the_control_process_shows_the_instance_processes_device_metrics(cluster):
    # Each instance process's devices count into its own registry; the control process asks
    # every joined process for its metrics each second and shows them on /metrics.
    cluster.openai().chat.completions.create(**chat_body("Count my tokens.", max_tokens=8,
                                                         temperature=0))
    prefilled = 'troupe_device_tokens_total{device="prefill/0",phase="prefill"}'
    assert store_metric(cluster, prefilled, 1) >= 1
    decoded = 'troupe_device_tokens_total{device="decode/'  # either decode instance
    assert store_metric(cluster, decoded, 1) >= 1
    text = urllib.request.urlopen(cluster.url + "/metrics", timeout=30).read().decode()
    assert 'troupe_device_sequences{device="prefill/0"}' in text
    assert text.count("# TYPE troupe_device_tokens_total counter") == 1
    # The engine processes' expert balancers: a placement made from one request's load is
    # switched to at the next step (bounded).
    applied = 'troupe_device_expert_placements_total{device="prefill/0",outcome="applied"}'
    for i in range(10):
        if store_metric(cluster, applied, 2) >= 2:
            break
        cluster.openai().chat.completions.create(**chat_body(f"Balance {i}.", max_tokens=2,
                                                             temperature=0))
    assert store_metric(cluster, applied, 2) >= 2


def kv_imports(cluster):
    """The decode devices' hand-off imports on the control's /metrics, by outcome, and the
    runs of blocks the decode processes pulled while their prefill computed."""
    text = urllib.request.urlopen(cluster.url + "/metrics", timeout=30).read().decode()
    out = {"imported": 0.0, "refused": 0.0, "early": 0.0}
    for m in re.finditer(r'^troupe_kv_imports_total\{device="decode/\d+",outcome="(\w+)"\} (\S+)$',
                         text, re.M):
        out[m.group(1)] += float(m.group(2))
    for m in re.finditer(r'^troupe_kv_runs_pulled_early_total\{instance="decode/\d+"\} (\S+)$',
                         text, re.M):
        out["early"] += float(m.group(1))
    return out


def test_a_long_prompt_s_blocks_cross_while_its_prefill_computes(cluster, model_dir):
    # local-cpu-3 prefills in 512-token chunks: this prompt's full blocks stream to the decode
    # process its request booked as the prefill began, which pulls them while it computes; its
    # device imports them joined to the rest: the tokens are troupe generate's, with no
    # recompute.
    before = kv_imports(cluster)
    prompt = "Stream this. " + " ".join(f"Row {i} holds item {i * 7 % 101}." for i in range(260))
    body = chat_body(prompt, max_tokens=4, temperature=0)
    want, tokens = generated_text(model_dir, body, 4)
    r = cluster.openai().chat.completions.create(**body)
    assert r.usage.prompt_tokens > 1536, r.usage  # four chunks or more
    text = (getattr(r.choices[0].message, "reasoning_content", None) or "") + (
        r.choices[0].message.content or "")
    assert text == want
    for _ in range(50):  # the instances' metrics are mirrored every second
        after = kv_imports(cluster)
        if after["imported"] > before["imported"] and after["early"] >= before["early"] + 3:
            break
        time.sleep(0.2)
    assert after["imported"] > before["imported"], after
    assert after["refused"] == before["refused"], after
    assert after["early"] >= before["early"] + 3, after  # runs after chunks 1, 2 and 3 at least


def test_served_greedy_tokens_equal_troupe_generate(cluster, model_dir):
    body = chat_body("Tell me about actors.", max_tokens=10, temperature=0)
    want, tokens = generated_text(model_dir, body, 10)
    r = cluster.openai().chat.completions.create(**body)
    assert r.usage.completion_tokens == len(tokens) == 10
    text = (getattr(r.choices[0].message, "reasoning_content", None) or "") + (
        r.choices[0].message.content or "")
    assert text == want


def test_structured_output_is_enforced_by_the_instance_processes(cluster):
    # The control process compiles the format; the prefill process draws the first token and
    # a decode process the rest, each under the constraint rebuilt in its own table.
    pattern = "[A-Z]{3}-[0-9]{2}(x|yz)?"
    for seed in (5, 6, 7):
        r = cluster.openai().chat.completions.create(
            **chat_body("A code, please.", max_tokens=40, temperature=1.0, seed=seed,
                        extra_body=CHAT_MODE, response_format={"type": "regex", "regex": pattern}))
        assert r.choices[0].finish_reason == "stop"
        assert re.fullmatch(pattern, r.choices[0].message.content), r.choices[0].message.content
    # An EBNF grammar (our extension) travels the same way.
    grammar = 'root ::= "<" pair ">"\npair ::= item "," item\nitem ::= [0-9] | "(" [a-c]{1,2} ")"'
    r = cluster.openai().chat.completions.create(
        **chat_body("A pair, please.", max_tokens=40, temperature=1.0, seed=7,
                    extra_body={**CHAT_MODE, "response_format": {"type": "grammar",
                                                                  "grammar": grammar}}))
    assert r.choices[0].finish_reason == "stop"
    assert re.fullmatch(r"<([0-9]|\([a-c]{1,2}\)),([0-9]|\([a-c]{1,2}\))>",
                        r.choices[0].message.content), r.choices[0].message.content
    # And a Lark grammar: the instance processes compile it while the job runs.
    lark = 'start: "<" PAIR ">"\nPAIR: /[0-9]{1,2},[a-c]{1,2}/\n'
    r = cluster.openai().chat.completions.create(
        **chat_body("A pair, please.", max_tokens=40, temperature=1.0, seed=8,
                    extra_body={**CHAT_MODE, "response_format": {"type": "grammar",
                                                                  "grammar": lark}}))
    assert r.choices[0].finish_reason == "stop"
    assert re.fullmatch(r"<[0-9]{1,2},[a-c]{1,2}>", r.choices[0].message.content), \
        r.choices[0].message.content


def test_a_killed_decode_process_loses_no_request_and_changes_no_token(cluster, model_dir):
    # Under load from 64 SDK streams (issue 13 §5): a fault-free run of the 64 first, whose
    # tokens are the engine's (troupe generate, checked for four of them); then the same 64
    # again, with decode/0 killed once every stream has its first tokens. Every stream
    # completes, each with exactly its fault-free tokens (greedy, batch-invariant).
    n, max_tokens = 64, 24
    bodies = [chat_body(f"Stream {i}: tell me about supervision trees.", max_tokens=max_tokens,
                        temperature=0) for i in range(n)]
    fault_free = run_streams(cluster, bodies, 0, lambda: None)
    for body, (text, usage) in zip(bodies[:4], fault_free):
        assert text == generated_text(model_dir, body, max_tokens)[0]
    assert all(u is not None and u.completion_tokens == max_tokens for _, u in fault_free)
    victim = cluster.process("decode/0")
    # Kill once every stream has tokens: the requests on decode/0 are mid-generation.
    results = run_streams(cluster, bodies, 0, lambda: os.kill(victim["pid"], signal.SIGKILL))
    for (text, usage), (want, _) in zip(results, fault_free):
        assert usage is not None and usage.completion_tokens == max_tokens
        assert text == want
    # The launcher restarted the process.
    wait_restarted(cluster, "decode/0", victim["pid"], 1)
    assert any("decode/0 (pid %d) killed by SIGKILL" % victim["pid"] in l for l in cluster.log)


def wait_restarted(cluster, name, old_pid, restarts):
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        p = cluster.process(name)
        if p["restarts"] == restarts and p["state"] == "running" and p["pid"] != old_pid:
            return p
        time.sleep(0.2)
    pytest.fail(f"{name} was not restarted:\n" + "".join(cluster.log))


def test_a_stopped_decode_process_is_cut_off_and_its_streams_go_on(cluster, model_dir):
    # SIGSTOP: the process neither exits nor closes its links, it just stops answering. Its
    # links' heartbeats stop, the control process closes them after runtime::link_timeout
    # (8 s), and the requests it held reroute as after a crash, tokens unchanged. Resumed, it
    # finds itself cut off, exits, and the launcher restarts it.
    n, max_tokens = 4, 40
    bodies = [chat_body(f"Pause {i}: tell me about heartbeats.", max_tokens=max_tokens,
                        temperature=0) for i in range(n)]
    wants = [generated_text(model_dir, b, max_tokens)[0] for b in bodies]
    victim = cluster.process("decode/0")
    results = run_streams(cluster, bodies, 20, lambda: os.kill(victim["pid"], signal.SIGSTOP))
    try:
        for (text, usage), want in zip(results, wants):
            assert usage is not None and usage.completion_tokens == max_tokens
            assert text == want
    finally:
        os.kill(victim["pid"], signal.SIGCONT)
    wait_restarted(cluster, "decode/0", victim["pid"], victim["restarts"] + 1)
    assert any("troupe node[decode/0]: lost the control process" in l for l in cluster.log)
    for name in ("control", "prefill/0", "decode/1"):  # nobody else was cut off
        assert cluster.process(name)["restarts"] == 0, "".join(cluster.log)


def test_a_draining_decode_process_hands_its_streams_on(cluster, model_dir):
    # SIGTERM to a decode process: it leaves its balancer, serves for the grace period (1 s
    # here), then forwards the requests it still holds, with their KV; they continue on the
    # other decode process without a gap or a repeat, even when that one pulls the KV late
    # (module teardown: no failed pull). (Runs last: decode/0 stays down, exited cleanly.)
    # decode_lb keeps long and short requests apart: of two instances, decode/1 is reserved
    # for long contexts, so these short requests all run on decode/0 until it leaves.
    # Two of them are constrained: their matchers are rebuilt on decode/1 from the tokens drawn
    # on decode/0, so their greedy output equals the same request's undisturbed one.
    n, max_tokens = 6, 240
    bodies = [chat_body(f"Drain {i}: explain graceful shutdown.", max_tokens=max_tokens,
                        temperature=0) for i in range(n)]
    wants = [generated_text(model_dir, b, max_tokens)[0] for b in bodies]
    # (Never complete within max_tokens: they run to the end, as the others do.)
    words = {"type": "regex", "regex": "((yes|no) ){200}"}
    for i in range(2):
        bodies.append(chat_body(f"Drain {i}: yes or no?", max_tokens=max_tokens, temperature=0,
                                extra_body=CHAT_MODE, response_format=words))
        r = cluster.openai().chat.completions.create(**bodies[-1])
        wants.append(r.choices[0].message.content)
        assert set(wants[-1]) <= set("yesno ") and len(wants[-1]) > 100, wants[-1]
    leaving, taking = cluster.process("decode/0"), cluster.process("decode/1")

    def leave():
        # SIGTERM once every stream has filled a block, which decode/0 then writes to the
        # store over its fabric link; decode/1 stops for 3 s around the hand-off (the grace is
        # 1 s), so it pulls the forwarded KV late, and decode/0 must stay until it has.
        os.kill(leaving["pid"], signal.SIGTERM)
        os.kill(taking["pid"], signal.SIGSTOP)
        threading.Timer(3.0, os.kill, (taking["pid"], signal.SIGCONT)).start()

    results = run_streams(cluster, bodies, 200, leave)
    for (text, usage), want in zip(results, wants):
        assert usage is not None and usage.completion_tokens == max_tokens
        assert text == want
    deadline = time.monotonic() + 120
    while cluster.process("decode/0")["state"] != "exited" and time.monotonic() < deadline:
        time.sleep(0.2)
    p = cluster.process("decode/0")
    assert p["state"] == "exited" and p["restarts"] == leaving["restarts"]
    forwarded = [l for l in cluster.log if "troupe node[decode/0]: drained;" in l]
    assert len(forwarded) == 1 and not forwarded[0].startswith(
        "troupe node[decode/0]: drained; 0 "), "".join(cluster.log)
