"""Chapter 7's server: a FastAPI app that serves chapter 7's LM eagerly, compiled (with or without CUDA graphs), or
from an AOTInductor package.

    python -m utils.serve_app --mode compiled --port 8000 --preset smoke --workdir /tmp/serve

POST /predict {"tokens": [[...], ...]} -> {"next_token": [...]}, one greedy next token per row; GET
/health; GET /stats (requests, bad requests, batches run, graphs compiled after warm-up: the
recompiles). The lifespan warms every batch bucket before the first request: the compiled modes load
the Mega-Cache artifacts left in --workdir by an earlier start (and save them after their first
warm-up), then set torch.compiler.set_stance("fail_on_recompile"); aoti mode loads the package from
--workdir, building it first if it is missing, with the load's CPU check skipped. One thread runs the
model, warm-up included (CUDA graphs are recorded per thread): it gathers the requests waiting for it
into one batch, up to the largest bucket, so that concurrent clients share a forward pass.
"""
import time

STARTED = time.time()

import argparse  # noqa: E402
import asyncio  # noqa: E402
import concurrent.futures  # noqa: E402
import contextlib  # noqa: E402
import json  # noqa: E402
import queue  # noqa: E402
import threading  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402

MODES = ("eager", "compiled", "cudagraphs", "aoti")
COMPILED = {"compiled": None, "cudagraphs": "reduce-overhead"}  # mode -> torch.compile(mode=...)


class BadRequest(Exception):
    """A request the server refuses, with its HTTP status and a message for the client (chapter 7)."""

    def __init__(self, status, message):
        super().__init__(message)
        self.status, self.message = status, message


def parse_tokens(body, seq_len, vocab, max_batch):
    """The request's token rows, checked: 400 malformed JSON, 422 wrong dtype or shape, 413 oversized batch (chapter 7)."""
    try:
        payload = json.loads(body)
    except (ValueError, UnicodeDecodeError) as error:
        raise BadRequest(400, f"malformed JSON: {error}") from None
    rows = payload.get("tokens") if isinstance(payload, dict) else None
    if not isinstance(rows, list) or not rows or not all(isinstance(r, list) for r in rows):
        raise BadRequest(422, 'wrong shape: expected {"tokens": [[token, ...], ...]}, a non-empty list of rows')
    if len(rows) > max_batch:
        raise BadRequest(413, f"batch of {len(rows)} rows is larger than the largest bucket, {max_batch}")
    if not all(type(t) is int for r in rows for t in r):  # bool is not int here; floats and strings are refused
        raise BadRequest(422, "wrong dtype: tokens must be integers")
    if any(len(r) != seq_len for r in rows):
        raise BadRequest(422, f"wrong shape: every row must have {seq_len} tokens")
    if any(not 0 <= t < vocab for r in rows for t in r):
        raise BadRequest(422, f"token out of range: tokens must be in [0, {vocab})")
    return rows


def bucket_for(n, buckets):
    """The smallest batch bucket that holds n rows (chapter 7)."""
    return next(b for b in sorted(buckets) if b >= n)


class Engine:
    """The model readied one way, padded to batch buckets, called one batch at a time (chapter 7)."""

    def __init__(self, mode, preset, workdir, buckets, device=None):
        from utils import cold_start
        from utils.env import pick_dtype

        self.mode, self.buckets, self.workdir = mode, sorted(buckets), Path(workdir)
        self.device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        self.sizes = cold_start.SIZES[preset]["lm"]
        self.served, self.example = cold_start.build("lm", preset, self.device, pick_dtype(self.device))
        self.lock, self.waiting, self.ready, self.failed = threading.Lock(), queue.Queue(), threading.Event(), None
        self.stats = {"requests": 0, "bad_requests": 0, "errors": 0, "batches": 0, "batched_rows": 0}
        self.fn = self._ready(cold_start)

    def _ready(self, cold_start):
        """The callable for this mode, with its artifacts loaded (or built on a first start)."""
        mega = self.workdir / "mega.bin"
        if self.mode == "eager":
            return self.served
        if self.mode in COMPILED:
            self.stats["mega_loaded"] = mega.exists()
            if mega.exists():
                torch.compiler.load_cache_artifacts(mega.read_bytes())
            # one graph per bucket, no dynamic shapes; "reduce-overhead" also records a CUDA graph per bucket
            return torch.compile(self.served, dynamic=False, mode=COMPILED[self.mode])
        package = self.workdir / "lm.pt2"
        self.stats["package_built"] = not package.exists()
        if not package.exists():
            with torch.inference_mode():
                cold_start.aoti_build(self.served, self.example, package, max(self.buckets))
        return cold_start.load_package(package, skip_cpu_check=True)  # the CPU check's probes: chapter 7, section 1

    def graphs(self):
        """Graphs Dynamo has compiled in this process (chapter 7)."""
        from torch._dynamo.utils import counters

        return counters["stats"]["unique_graphs"]

    def warm_up(self):
        """Call every bucket once; compiled, save Mega-Cache artifacts once, then refuse recompiles (chapter 7)."""
        started = time.perf_counter()
        for b in self.buckets:
            self.infer([[0] * self.sizes["seq_len"]] * b)
        mega = self.workdir / "mega.bin"
        if self.mode in COMPILED:
            if not mega.exists():
                artifacts = torch.compiler.save_cache_artifacts()
                if artifacts:
                    mega.write_bytes(artifacts[0])
            torch.compiler.set_stance("fail_on_recompile")
        self.stats.update(warmup_s=time.perf_counter() - started, graphs_at_ready=self.graphs(),
                          ready_s=time.time() - STARTED)

    def infer(self, rows):
        """Greedy next token of each row, the batch padded to its bucket (chapter 7)."""
        n, size = len(rows), bucket_for(len(rows), self.buckets)
        tokens = torch.zeros(size, self.sizes["seq_len"], dtype=torch.long)
        tokens[:n] = torch.tensor(rows, dtype=torch.long)
        with self.lock, torch.inference_mode():
            logits = self.fn(tokens.to(self.device))
            return logits[:n].argmax(-1).tolist()

    def submit(self, rows):
        """Queue one request's rows for the model's thread; a future of their next tokens (chapter 7)."""
        answer = concurrent.futures.Future()
        self.waiting.put((rows, answer))
        return answer

    def next_batch(self, held=None):
        """The waiting requests, oldest first, up to the largest bucket; (batch, a request held over) (chapter 7)."""
        batch = [held or self.waiting.get()]
        rows = len(batch[0][0])
        while True:
            try:
                request = self.waiting.get_nowait()
            except queue.Empty:
                return batch, None
            if rows + len(request[0]) > self.buckets[-1]:
                return batch, request
            batch.append(request)
            rows += len(request[0])

    def serve(self):
        """The model's thread: warm up, then run batches (CUDA graphs are the recording thread's) (chapter 7)."""
        try:
            self.warm_up()
        except Exception as error:  # the lifespan raises it, and the server does not start
            self.failed = error
        finally:
            self.ready.set()
        if not self.failed:
            self.run_batches()

    def run_batches(self):
        """The model's thread: run the waiting requests as one padded batch, answer each its own rows (chapter 7)."""
        held = None
        while True:
            batch, held = self.next_batch(held)
            rows = [row for request_rows, _ in batch for row in request_rows]
            try:
                tokens = self.infer(rows)
            except Exception as error:  # every request of the batch gets the error
                for _, answer in batch:
                    answer.set_exception(error)
                continue
            self.stats["batches"] += 1
            self.stats["batched_rows"] += len(rows)
            start = 0
            for request_rows, answer in batch:
                answer.set_result(tokens[start:start + len(request_rows)])
                start += len(request_rows)

    def report(self):
        """Counters for GET /stats: recompiles are graphs compiled after warm-up, and calls refused for one (chapter 7)."""
        graphs = self.graphs()
        return {**self.stats, "mode": self.mode, "buckets": self.buckets, "graphs": graphs,
                "recompiles": graphs - self.stats.get("graphs_at_ready", graphs) + self.stats.get("recompile_errors", 0)}


def create_app(mode, preset, workdir, buckets, device=None):
    """The FastAPI app, its engine readied and warmed in the lifespan, before the first request (chapter 7)."""
    from fastapi import FastAPI, Request
    from fastapi.responses import JSONResponse

    state = {}

    @contextlib.asynccontextmanager
    async def lifespan(app):
        engine = Engine(mode, preset, workdir, buckets, device)
        threading.Thread(target=engine.serve, daemon=True).start()
        await asyncio.to_thread(engine.ready.wait)
        if engine.failed:
            raise engine.failed
        state["engine"] = engine
        yield

    app = FastAPI(lifespan=lifespan)

    @app.get("/health")
    def health():
        return {"ready": "engine" in state}

    @app.get("/stats")
    def stats():
        return state["engine"].report()

    @app.post("/predict")
    async def predict(request: Request):
        engine = state["engine"]
        try:
            s = engine.sizes
            rows = parse_tokens(await request.body(), s["seq_len"], s["vocab"], max(engine.buckets))
        except BadRequest as error:
            engine.stats["bad_requests"] += 1
            return JSONResponse({"error": error.message}, status_code=error.status)
        try:
            tokens = await asyncio.wrap_future(engine.submit(rows))
        except Exception as error:  # a recompile refused by fail_on_recompile, or a failure of the model
            key = "recompile_errors" if "recompil" in str(error).lower() else "errors"
            engine.stats[key] = engine.stats.get(key, 0) + 1
            return JSONResponse({"error": f"{type(error).__name__}: {str(error)[:200]}"}, status_code=500)
        engine.stats["requests"] += 1
        return {"next_token": tokens}

    return app


def main(argv=None):
    """Serve on 127.0.0.1 with uvicorn (chapter 7)."""
    import faulthandler

    import uvicorn

    faulthandler.enable()  # a crash in compiled code prints the Python stack it happened under, in the server's log

    p = argparse.ArgumentParser(prog="python -m utils.serve_app", description=__doc__.splitlines()[0])
    p.add_argument("--mode", choices=MODES, required=True)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--preset", choices=("smoke", "full"), default="smoke")
    p.add_argument("--workdir", required=True, help="where the Mega-Cache artifacts and the AOTInductor package live")
    p.add_argument("--buckets", default="1,2,4,8")
    p.add_argument("--device", choices=("cpu", "cuda"), default=None)
    args = p.parse_args(argv)
    Path(args.workdir).mkdir(parents=True, exist_ok=True)
    buckets = [int(b) for b in args.buckets.split(",")]
    app = create_app(args.mode, args.preset, args.workdir, buckets, args.device)
    uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning", access_log=False)


if __name__ == "__main__":
    main()
