"""Chapter 7's client side: start and stop the server (utils/serve_app.py), send it bad requests, load it on loopback."""
import os
import random
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from .env import REPO_ROOT, child_python_path

SITE_PACKAGES = re.compile(r'File "[^"]*/site-packages/')  # a frame's path, from the package's folder on

HOST = "127.0.0.1"  # loopback only: the load generator never leaves this machine


def free_port():
    """A TCP port free on 127.0.0.1 now (chapter 7)."""
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


@dataclass
class Server:
    """A server process started by `start`: its URL, process, log, and how long it took to answer (chapter 7)."""
    mode: str
    url: str
    proc: subprocess.Popen
    log: Path
    args: tuple
    ready_s: float = None


def start(mode, workdir, preset="smoke", buckets=(1, 2, 4, 8), cache_dir=None, timeout=600, device=None):
    """Start `python -m utils.serve_app` on a free loopback port; return once /health says ready (chapter 7)."""
    import httpx

    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    cmd = [sys.executable, "-m", "utils.serve_app", "--mode", mode, "--port", str(port), "--preset", preset,
           "--workdir", str(workdir), "--buckets", ",".join(map(str, buckets))] + (["--device", device] if device else [])
    cache = Path(cache_dir or workdir / "inductor")
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(cache), "TRITON_CACHE_DIR": str(cache / "triton"),
           "PYTHONPATH": child_python_path()}
    log = workdir / f"{mode}-{port}.log"
    started = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=REPO_ROOT, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT)
    server = Server(mode, f"http://{HOST}:{port}", proc, log, (mode, workdir, preset, buckets, cache_dir, timeout, device))
    while time.perf_counter() - started < timeout:
        if proc.poll() is not None:
            raise RuntimeError(f"the {mode} server exited with {proc.returncode}: {tail(log)}")
        try:
            if httpx.get(server.url + "/health", timeout=2).json().get("ready"):
                server.ready_s = time.perf_counter() - started
                return server
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    stop(server)
    raise RuntimeError(f"the {mode} server was not ready after {timeout} s: {tail(log)}")


def tail(log, lines=3):
    """The last lines of a server's log, or where it crashed when faulthandler reported a fatal error (chapter 7)."""
    return last_words(Path(log).read_text(errors="replace") if Path(log).exists() else "", lines)


def last_words(output, lines=3):
    """The last lines of a process's output, or faulthandler's fatal error and the innermost frames (chapter 7)."""
    text = output.strip().splitlines()
    fatal = next((i for i, line in enumerate(text) if line.startswith("Fatal Python error")), None)
    if fatal is not None:  # the error, then the crashed thread's innermost frames (faulthandler lists them first)
        current = next((i for i in range(fatal, len(text)) if text[i].startswith("Current thread")), fatal)
        frames = [SITE_PACKAGES.sub('File "', line.strip()) for line in text[current + 1:]
                  if line.strip().startswith("File ")]
        return " | ".join([text[fatal], *frames[:3]])
    return " | ".join(text[-lines:]) or "no output"


def stop(server, kill=False):
    """Stop a server: SIGTERM (uvicorn shuts down cleanly) or SIGKILL (a crash); wait for it (chapter 7)."""
    if server.proc.poll() is None:
        server.proc.send_signal(signal.SIGKILL if kill else signal.SIGTERM)
        try:
            server.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.proc.kill()
            server.proc.wait()


def restart(server):
    """Start the same server again, on a new port, with the same work folder and cache (chapter 7)."""
    stop(server)
    return start(*server.args)


def good_payload(batch, seq_len, vocab, seed=0):
    """A valid request body: `batch` rows of seq_len random tokens (chapter 7)."""
    rng = random.Random(seed)
    return {"tokens": [[rng.randrange(vocab) for _ in range(seq_len)] for _ in range(batch)]}


def bad_requests(seq_len, max_batch):
    """(name, raw body) of each kind of bad request the server must refuse with a 4xx (chapter 7)."""
    row = [1] * seq_len
    return [("malformed JSON", b'{"tokens": [[1, 2'),
            ("wrong shape", f'{{"tokens": [{row[:-1]}]}}'.encode()),
            ("oversized batch", f'{{"tokens": {[row] * (max_batch + 1)}}}'.encode()),
            ("wrong dtype", f'{{"tokens": [{[0.5] * seq_len}]}}'.encode())]


def post(url, body, client=None):
    """POST a body (dict as JSON, or raw bytes) to /predict; (status, JSON answer) (chapter 7)."""
    import httpx

    send = client or httpx
    kwargs = {"content": body, "headers": {"content-type": "application/json"}} if isinstance(body, bytes) else {"json": body}
    r = send.post(url + "/predict", timeout=60, **kwargs)
    return r.status_code, r.json()


def load(url, payloads, concurrency, max_requests, max_seconds):
    """Send requests from `concurrency` threads until max_requests or max_seconds; latencies and throughput (chapter 7)."""
    import httpx

    latencies, failures, lock = [], [], threading.Lock()
    deadline, sent = time.perf_counter() + max_seconds, [0]

    def worker(k):
        with httpx.Client(timeout=60) as client:
            while time.perf_counter() < deadline:
                with lock:
                    if sent[0] >= max_requests:
                        return
                    sent[0] += 1
                    body = payloads[sent[0] % len(payloads)]
                t = time.perf_counter()
                try:
                    status, _ = post(url, body, client)
                except httpx.HTTPError as error:
                    status = type(error).__name__
                with lock:
                    (latencies if status == 200 else failures).append(time.perf_counter() - t)

    started = time.perf_counter()
    threads = [threading.Thread(target=worker, args=(k,)) for k in range(concurrency)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    return summarize(latencies, len(failures), time.perf_counter() - started)


def summarize(latencies_s, failures, seconds):
    """p50 and p99 latency (ms), requests per second, counts (chapter 7)."""
    from .timing import quantiles

    if not latencies_s:
        return {"p50_ms": None, "p99_ms": None, "rps": 0.0, "ok": 0, "failed": failures}
    p50, p99 = quantiles([s * 1e3 for s in latencies_s], (0.5, 0.99)) if len(latencies_s) > 1 else [latencies_s[0] * 1e3] * 2
    return {"p50_ms": p50, "p99_ms": p99, "rps": len(latencies_s) / seconds, "ok": len(latencies_s), "failed": failures}


def stats(server):
    """The server's counters (GET /stats) (chapter 7)."""
    import httpx

    return httpx.get(server.url + "/stats", timeout=10).json()


def compare(servers, payloads, levels, rounds=3, max_requests=200, max_seconds=5.0):
    """Load each server in alternating rounds at each concurrency; a row per server and level (chapter 7).

    p50, p99 and requests/s are medians over the rounds; `speedup` is the median over rounds of eager's
    p50 / this server's p50 in the same round (speedup_lo, speedup_hi: their range); `rows_per_batch`
    is how many rows the server ran per forward pass at this level; `recompiles` is what the server
    counted after the level.
    """
    from .timing import quantiles

    rows = []
    for c in levels:
        per, before = {s.mode: [] for s in servers}, {s.mode: stats(s) for s in servers}
        for _ in range(rounds):
            for s in servers:
                per[s.mode].append(load(s.url, payloads, c, max_requests, max_seconds))
        for s in servers:
            runs, after = per[s.mode], stats(s)
            batches, batched = (after[k] - before[s.mode][k] for k in ("batches", "batched_rows"))
            med = {k: quantiles([r[k] for r in runs], (0.5,))[0] if all(r[k] is not None for r in runs) else None
                   for k in ("p50_ms", "p99_ms", "rps")}
            row = {"workload": "serving", "variant": s.mode, "concurrency": c, "status": "ok", **med,
                   "requests": sum(r["ok"] for r in runs), "failed": sum(r["failed"] for r in runs),
                   "rows_per_batch": batched / batches if batches else None,
                   "recompiles": after["recompiles"]}
            if "eager" in per and med["p50_ms"]:
                ratios = [e["p50_ms"] / r["p50_ms"] for e, r in zip(per["eager"], runs)]
                row.update(speedup=quantiles(ratios, (0.5,))[0], speedup_lo=min(ratios), speedup_hi=max(ratios))
            rows.append(row)
    return rows


def kill_mid_load(server, payloads, concurrency=2, after_s=1.0, max_seconds=10.0):
    """SIGKILL a server while it is under load, start it again; seconds to ready and to the first answer (chapter 7)."""
    result = {}
    loader = threading.Thread(target=lambda: result.update(load(server.url, payloads, concurrency, 10**6, max_seconds)))
    loader.start()
    time.sleep(after_s)
    stop(server, kill=True)
    loader.join()
    started = time.perf_counter()
    again = start(*server.args)
    status, _ = post(again.url, payloads[0])
    return again, {"variant": server.mode, "served_before_kill": result.get("ok", 0), "ready_s": again.ready_s,
                   "first_answer_s": time.perf_counter() - started, "first_status": status,
                   "mega_loaded": stats(again).get("mega_loaded"), "package_built": stats(again).get("package_built")}
