"""How fast the autoscaler of a launched cluster adds and removes an instance process.

One invocation starts `troupe launch` on examples/topologies/local-cpu-autoscale.toml changed
to decide every --interval seconds with no margin, a decode pool of one to two instances and a
scale-down after --down-after seconds, with one request per decode instance (--max-batch 1),
on a model directory. Each round opens two greedy Chat Completions streams at once (max_tokens
--tokens): two requests need two instances, so the launcher starts a decode process; once
both streams have ended the pool is idle and the process is removed. From the launcher's and
the processes' stderr lines, timed as they arrive, per round:

  ordered      streams sent → "the autoscaler orders decode/<i>" (up to one interval of
               waiting for the next decision, plus the decision's gathering);
  serving      order → the new process's "model loaded; serving in the decode pool" (process
               start, joining the control process, loading the model, announcing its engine):
               capacity added;
  removed      "the autoscaler removes decode/<i>" → "decode/<i> (pid …) exited …; removed":
               the drain (the pool's grace, 1 s, then what the process still holds is
               forwarded with its KV to decode/0 and pulled) and the exit. The order comes
               once fewer instances have sufficed for --down-after seconds, which may be
               while the process still holds the later stream.

Every stream must complete with completion_tokens == --tokens. It prints min and median over
the rounds with the 1-minute load average of each round (a figure taken under load is not a
figure), beside what the peers publish: SGLang's elastic EP adds or replaces a rank in ~6-7 s
on GPUs; DeepSeek describes bringing up an inference instance as taking minutes (its weights
over the network).

    python3 bench/launch_autoscale.py [--troupe build/troupe] [--model DIR] [--rounds 3]
        [--tokens 64] [--interval 1] [--down-after 3] [--threads 1]

Without --model it writes the small preset (`troupe model init --preset small --seed 1`) to a
temporary directory. The standard library only.
"""
import argparse
import http.client
import json
import os
import pathlib
import re
import signal
import statistics
import subprocess
import tempfile
import threading
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent


def topology(path, interval, down_after):
    text = (ROOT / "examples/topologies/local-cpu-autoscale.toml").read_text()
    for old, new in (('interval = "10s"', f'interval = "{interval}s"'),
                     ('scale_down_after = "30s"', f'scale_down_after = "{down_after}s"'),
                     ("over_provision = 0.25", "over_provision = 0"),
                     ("max = 3 }", "max = 2 }"), ('grace = "5s"', 'grace = "1s"')):
        assert old in text, old
        text = text.replace(old, new)
    path.write_text(text)


class Launch:
    def __init__(self, args, work):
        state = work / "state.json"
        self.proc = subprocess.Popen(
            [args.troupe, "launch", str(work / "topology.toml"), "--model", args.model,
             "--engram-map", "identity", "--listen", "127.0.0.1:0", "--grace", "1",
             "--threads", str(args.threads), "--kv-dir", str(work / "kv"), "--state", str(state),
             "--max-batch", "1"], stderr=subprocess.PIPE, text=True)
        self.lines = []  # (monotonic time, line)
        self.lock = threading.Lock()
        threading.Thread(target=self._read, daemon=True).start()
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            try:
                http_addr = json.loads(state.read_text()).get("http")
            except (OSError, ValueError):
                http_addr = None
            if http_addr and self.first("orders instances here"):
                self.host, port = http_addr.rsplit(":", 1)
                self.port = int(port)
                return
            if self.proc.poll() is not None:
                break
            time.sleep(0.2)
        self.stop()
        raise SystemExit("troupe launch did not start serving:\n" + "".join(l for _, l in self.lines))

    def _read(self):
        for line in self.proc.stderr:
            with self.lock:
                self.lines.append((time.monotonic(), line))

    def first(self, pattern, after=0.0):
        with self.lock:
            for t, line in self.lines:
                if t >= after and re.search(pattern, line):
                    return t, line
        return None

    def wait(self, pattern, after, limit=300):
        deadline = time.monotonic() + limit
        while time.monotonic() < deadline:
            if hit := self.first(pattern, after):
                return hit
            time.sleep(0.02)
        raise SystemExit(f"no line /{pattern}/ within {limit} s:\n" + "".join(l for _, l in self.lines))

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(timeout=180)


def stream(host, port, tokens, i, out):
    body = json.dumps({"model": "deepseek-v4.1-flash", "max_tokens": tokens, "temperature": 0,
                       "stream": True, "stream_options": {"include_usage": True},
                       "messages": [{"role": "user", "content": f"Round stream {i}: why scale?"}]})
    conn = http.client.HTTPConnection(host, port, timeout=600)
    conn.request("POST", "/v1/chat/completions", body, {"content-type": "application/json"})
    usage = None
    for raw in conn.getresponse():
        line = raw.decode().strip()
        if line.startswith("data: {"):
            chunk = json.loads(line[6:])
            usage = chunk.get("usage") or usage
    out[i] = usage["completion_tokens"] if usage else None


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--troupe", default=str(ROOT / "build/troupe"))
    p.add_argument("--model")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--interval", type=int, default=1)
    p.add_argument("--down-after", type=int, default=3)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="troupe-autoscale-") as tmp:
        work = pathlib.Path(tmp)
        if not args.model:
            args.model = str(work / "small")
            subprocess.run([args.troupe, "model", "init", "--preset", "small", "--seed", "1",
                            "--out", args.model], check=True, capture_output=True)
        topology(work / "topology.toml", args.interval, args.down_after)
        launch = Launch(args, work)
        rows = []
        try:
            for r in range(args.rounds):
                sent = time.monotonic()
                done = [None, None]
                threads = [threading.Thread(target=stream, args=(launch.host, launch.port,
                                                                  args.tokens, i, done))
                           for i in range(2)]
                for t in threads:
                    t.start()
                ordered, line = launch.wait(r"the autoscaler orders decode/(\d+)", sent)
                name = "decode/" + re.search(r"decode/(\d+)", line).group(1)
                serving, _ = launch.wait(re.escape(f"troupe node[{name}]: model loaded"), ordered)
                for t in threads:
                    t.join()
                if done != [args.tokens, args.tokens]:
                    raise SystemExit(f"round {r}: streams ended with {done} tokens")
                leaving, _ = launch.wait(re.escape(f"the autoscaler removes {name}"), serving)
                removed, _ = launch.wait(re.escape(f"troupe launch: {name} (pid") + r".*removed",
                                         leaving)
                rows.append((ordered - sent, serving - ordered, removed - leaving,
                             os.getloadavg()[0]))
                print(f"round {r}: {name} ordered {rows[-1][0]:.2f} s after the streams, serving "
                      f"{rows[-1][1]:.2f} s after the order, removed {rows[-1][2]:.2f} s after "
                      f"its removal order (load average {rows[-1][3]:.2f})", flush=True)
        finally:
            launch.stop()
    for k, label in enumerate(("ordered", "serving", "removed")):
        values = [row[k] for row in rows]
        print(f"{label:8} min {min(values):6.2f} s   median {statistics.median(values):6.2f} s")
    print(f"(decisions every {args.interval} s, scale-down after {args.down_after} s idle, "
          f"grace 1 s; load averages {', '.join(f'{row[3]:.2f}' for row in rows)})")


if __name__ == "__main__":
    main()
