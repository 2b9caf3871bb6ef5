"""Chapter 7's cold-start worker: one fresh process builds a model, readies it one way, times each phase.

    python -m utils.cold_start --model resnet --path compile --preset smoke

prints one JSON line: import_s, load_s, prepare_s, first_call_s, first_result_s, steady_ms and the
cache counters. `measure(...)` (below) starts it in a new process with its own inductor cache folder
and reads that line; `sequence(...)` runs the chapter's paths one after another.
"""
import time

_LOADED = time.time()  # when this module started loading (run by hand, without --t0: a late start)

import argparse  # noqa: E402
import faulthandler  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import signal  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parent.parent
PATHS = ("eager", "compile", "mega", "aoti_build", "aoti", "precompile_build", "precompile")
MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")  # torch.compile's modes
# model sizes per preset: a ResNet (torchvision, random weights) and a GPT-style LM (chapter 2's GPT)
SIZES = {
    "smoke": {"resnet": dict(layers=[1, 1, 1, 1], image=32, classes=10, batch=2),
              "lm": dict(vocab=256, seq_len=16, n_layers=1, d_model=32, n_heads=2, batch=2)},
    "workshop": {"resnet": dict(layers="resnet50", image=224, classes=1000, batch=8),
                 "lm": dict(vocab=32000, seq_len=256, n_layers=4, d_model=1024, n_heads=16, batch=8)},
    "full": {"resnet": dict(layers="resnet50", image=224, classes=1000, batch=8),
             "lm": dict(vocab=32000, seq_len=256, n_layers=16, d_model=2048, n_heads=16, batch=8)},
}


class Served(torch.nn.Module):
    """What a service runs: the model's logits (of the last position, for an LM), or probabilities after an edit (chapter 7)."""

    def __init__(self, model, last_position=False, probabilities=False):
        super().__init__()
        self.model, self.last_position, self.probabilities = model, last_position, probabilities

    def forward(self, x):
        out = self.model(x)
        if self.last_position:
            out = out[:, -1]
        return out.softmax(-1) if self.probabilities else out  # the "edit": one line of the model's code


def build(name, preset, device, dtype, edit=False, batch=None):
    """(Served module in eval mode, example input) for 'resnet' or 'lm' at a preset's sizes, random weights (chapter 7)."""
    s = SIZES[preset][name]
    batch = batch or s["batch"]
    torch.manual_seed(0)
    with torch.device(device):
        if name == "resnet":
            import torchvision
            from torchvision.models.resnet import BasicBlock, ResNet

            model = (torchvision.models.resnet50(weights=None) if s["layers"] == "resnet50"
                     else ResNet(BasicBlock, s["layers"], num_classes=s["classes"]))
            x = torch.randn(batch, 3, s["image"], s["image"])
        elif name == "lm":
            from utils.models import GPT

            model = GPT(s["vocab"], s["seq_len"], s["n_layers"], s["d_model"], s["n_heads"])
            x = torch.randint(0, s["vocab"], (batch, s["seq_len"]))
        else:
            raise ValueError(f"Unknown model {name!r}: choose resnet or lm.")
    served = Served(model, last_position=name == "lm", probabilities=edit).to(device=device, dtype=dtype).eval()
    return served, (x.to(dtype) if x.is_floating_point() else x)


def sync(device):
    """Wait for the device's queued work (chapter 7)."""
    if device == "cuda":
        torch.cuda.synchronize()


def cache_counters():
    """Hits and misses of the FX graph and AOTAutograd caches, and Dynamo's graph count, in this process (chapter 7)."""
    from torch._dynamo.utils import counters

    return {"fx_hit": counters["inductor"]["fxgraph_cache_hit"], "fx_miss": counters["inductor"]["fxgraph_cache_miss"],
            "aot_hit": counters["aot_autograd"]["autograd_cache_hit"],
            "aot_miss": counters["aot_autograd"]["autograd_cache_miss"], "graphs": counters["stats"]["unique_graphs"]}


def batch_dim(max_batch):
    """The dynamic batch dimension an exported program accepts: 1..max_batch (chapter 7)."""
    return torch.export.Dim("batch", min=1, max=max_batch)


def aoti_build(served, x, package, max_batch):
    """Export (non-strict, dynamic batch) and compile an AOTInductor package to `package` (chapter 7)."""
    program = torch.export.export(served, (x,), dynamic_shapes={"x": {0: batch_dim(max_batch)}}, strict=False)
    return torch._inductor.aoti_compile_and_package(program, package_path=str(package))


def precompile_available():
    """None when torch.compile(...).aot_compile exists here, else why not (chapter 7; experimental in torch 2.11 and 2.14)."""
    if hasattr(torch._dynamo.config, "enable_aot_compile"):
        torch._dynamo.config.enable_aot_compile = True  # off by default in some releases
    probe = torch.compile(lambda t: t + 1, fullgraph=True)
    if not hasattr(probe, "aot_compile") or not hasattr(torch.compiler, "load_compiled_function"):
        return f"torch {torch.__version__} has no torch.compile(...).aot_compile / torch.compiler.load_compiled_function"
    return None


def load_package(package, skip_cpu_check=False):
    """Load an AOTInductor package; skip_cpu_check: no probes of the CPU's vector instructions (chapter 7)."""
    skip = {"cpp.vec_isa_ok": False} if skip_cpu_check else {}  # every ISA answers "no", without a probe
    with torch._inductor.config.patch(skip):
        return torch._inductor.aoti_load_package(str(package))


def prepare(path, served, x, args):
    """Ready `served` the path's way: (callable on x, or None for a build path; extra fields) (chapter 7)."""
    if path == "eager":
        return served, {}
    if path in ("compile", "mega"):
        extra = {}
        if path == "mega":
            info = torch.compiler.load_cache_artifacts(Path(args.artifact).read_bytes())
            extra["mega_entries"] = sum(len(v) for v in info.artifacts.values()) if info else 0
        return torch.compile(served, mode=None if args.mode == "default" else args.mode), extra
    if path == "aoti_build":
        aoti_build(served, x, args.artifact, args.max_batch)
        return None, {"artifact_mb": Path(args.artifact).stat().st_size / 2**20}
    if path == "aoti":
        return load_package(args.artifact, skip_cpu_check=args.skip_cpu_check), {}
    why = precompile_available()
    if why:
        raise NotImplementedError(why)
    if path == "precompile_build":
        compiled = torch.compile(served.forward, fullgraph=True).aot_compile(((x,), {}))
        compiled.save_compiled_function(str(args.artifact))
        return None, {"artifact_mb": Path(args.artifact).stat().st_size / 2**20}
    with open(args.artifact, "rb") as f:
        fn = torch.compiler.load_compiled_function(f)
    return (lambda t: fn(served, t)), {}


def run(args):
    """One cold start, phase by phase; a dict of seconds and counters (chapter 7)."""
    from utils.env import pick_dtype

    started = args.t0 or _LOADED  # the parent's clock just before it started this process
    import_s = time.time() - started  # Python's start and the imports: torch, torchvision, the book's helpers

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    dtype = pick_dtype(device)
    t = time.perf_counter()
    served, x = build(args.model, args.preset, device, dtype, edit=args.edit)
    sync(device)
    load_s = time.perf_counter() - t
    with torch.inference_mode():
        t = time.perf_counter()
        fn, extra = prepare(args.path, served, x, args)
        prepare_s = time.perf_counter() - t
        row = {"model": args.model, "path": args.path, "mode": args.mode, "edit": args.edit, "device": device, "dtype": str(dtype),
               "import_s": import_s, "load_s": load_s, "prepare_s": prepare_s, **extra}
        if fn is None:  # a build: what it cost is its compile time
            return {**row, "first_call_s": None, "first_result_s": None, "compile_s": prepare_s, **cache_counters()}
        t = time.perf_counter()
        out = fn(x)
        sync(device)
        first_call_s = time.perf_counter() - t
        first_result_s = time.time() - started
        out = out.clone()  # under CUDA graphs (max-autotune) the next replay overwrites the output
        from utils.timing import time_fn  # after the first result: the book's timer is not part of it

        steady = time_fn(lambda: fn(x), min_run_time=args.min_run_time, warmup=2)
        err = (out.float() - served(x).float()).abs().max().item()
    if args.save_mega:
        artifacts = torch.compiler.save_cache_artifacts()
        Path(args.save_mega).write_bytes(artifacts[0] if artifacts else b"")
    return {**row, "first_call_s": first_call_s, "first_result_s": first_result_s, "steady_ms": steady.median_ms,
            "steady_p90_ms": steady.p90_ms, "max_abs_err": err, **cache_counters()}


def parse(argv=None):
    """The worker's command line (chapter 7)."""
    p = argparse.ArgumentParser(prog="python -m utils.cold_start", description=__doc__.splitlines()[0])
    p.add_argument("--model", choices=("resnet", "lm"), required=True)
    p.add_argument("--path", choices=PATHS, required=True)
    p.add_argument("--preset", choices=tuple(SIZES), default="smoke")
    p.add_argument("--device", choices=("cpu", "cuda"), default=None)
    p.add_argument("--artifact", help="the AOTInductor package, precompiled function or Mega-Cache file")
    p.add_argument("--save-mega", help="after the run, write torch.compiler.save_cache_artifacts() here")
    p.add_argument("--mode", choices=MODES, default="default", help="torch.compile's mode (compile and mega paths)")
    p.add_argument("--edit", action="store_true", help="serve probabilities instead of logits (a code change)")
    p.add_argument("--skip-cpu-check", action="store_true",
                   help="aoti path: skip the load's probes of the CPU's vector instructions (cpp.vec_isa_ok = False)")
    p.add_argument("--max-batch", type=int, default=16)
    p.add_argument("--min-run-time", type=float, default=0.5)
    p.add_argument("--t0", type=float, default=None, help="time.time() when the parent started this process")
    args = p.parse_args(argv)
    if args.path in ("mega", "aoti_build", "aoti", "precompile_build", "precompile") and not args.artifact:
        p.error(f"--path {args.path} needs --artifact")
    if args.skip_cpu_check and args.path != "aoti":
        p.error("--skip-cpu-check is for --path aoti: only the package's load checks the CPU")
    return args


def main(argv=None):
    """Run one cold start and print its row as one JSON line; exit 3 (with the reason) when the path is unsupported."""
    faulthandler.enable()  # a crash in compiled code prints the Python stack it happened under
    args = parse(argv)
    try:
        row = run(args)
    except NotImplementedError as error:
        print(json.dumps({"model": args.model, "path": args.path, "status": "skipped", "reason": str(error)}))
        return 3
    print(json.dumps({**row, "status": "ok", "torch": torch.__version__}))
    return 0


# --- the parent's side: a fresh process per measurement -------------------------------------------------

def measure(model, path, preset, cache_dir, artifact=None, timeout=600, **options):
    """Run the worker in a new process with its own inductor cache folder; its row, with process_s (chapter 7)."""
    from utils.env import child_python_path

    cache_dir = Path(cache_dir)
    cache_dir.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "utils.cold_start", "--model", model, "--path", path, "--preset", preset]
    cmd += ["--artifact", str(artifact)] if artifact else []
    for key, value in options.items():
        flag = "--" + key.replace("_", "-")
        cmd += [flag] if value is True else [] if value in (False, None) else [flag, str(value)]
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(cache_dir), "TRITON_CACHE_DIR": str(cache_dir / "triton"),
           "PYTHONPATH": child_python_path()}
    t = time.perf_counter()
    cmd += ["--t0", repr(time.time())]
    try:
        proc = subprocess.run(cmd, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"model": model, "path": path, "status": "failed", "reason": f"timed out after {timeout} s"}
    process_s = time.perf_counter() - t
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if not lines:
        return {"model": model, "path": path, "status": "failed", "reason": exit_reason(proc.returncode, proc.stderr)}
    return {**json.loads(lines[-1]), "process_s": process_s}


def exit_reason(returncode, stderr):
    """Why a worker gave no row: its exit (a signal by name) and its last words (chapter 7)."""
    from utils.serving import last_words

    how = f"killed by {signal.Signals(-returncode).name}" if returncode < 0 else f"exited with {returncode}"
    return f"{how}: {last_words(stderr, lines=1)}"[:300]


def sequence(model, preset, workdir, paths="jit", timeout=600):
    """The chapter's cold starts of one model, each in a fresh process, in the order their caches need (chapter 7).

    "jit": eager; compile with an empty cache (it saves Mega-Cache artifacts); compile again with that
    cache warm; Mega-Cache into an empty cache; the warm cache after a code change. "aot": the
    AOTInductor package and the precompiled function, each built in one process and loaded in another;
    the package is loaded three times: with an empty cache folder, with the folder that load left (the load
    checks the CPU's vector instructions by compiling probes into the cache folder), and with an empty
    folder and that check skipped.
    """
    work = Path(workdir)
    rows = []

    def add(label, cache, path, **kw):
        rows.append({**measure(model, path, preset, work / cache, timeout=timeout, **kw), "variant": label})

    if paths == "jit":
        add("eager", "eager", "eager")
        add("compile, empty cache", "jit", "compile", save_mega=work / "mega.bin")
        add("compile, warm cache", "jit", "compile")
        add("Mega-Cache, empty cache", "mega", "mega", artifact=work / "mega.bin")
        add("warm cache, code changed", "jit", "compile", edit=True)
    elif paths == "max-autotune":
        add("max-autotune, empty cache", "tuned", "compile", mode=paths, save_mega=work / "mega-tuned.bin")
        add("max-autotune, warm cache", "tuned", "compile", mode=paths)
        add("max-autotune Mega-Cache, empty cache", "tuned-mega", "mega", mode=paths, artifact=work / "mega-tuned.bin")
    elif paths == "aot":
        add("AOTInductor build", "aoti_build", "aoti_build", artifact=work / "model.pt2")
        add("AOTInductor package", "aoti", "aoti", artifact=work / "model.pt2")
        add("AOTInductor package, warm cache", "aoti", "aoti", artifact=work / "model.pt2")
        add("AOTInductor package, CPU check skipped", "aoti_nocheck", "aoti", artifact=work / "model.pt2",
            skip_cpu_check=True)
        add("precompile build", "pre_build", "precompile_build", artifact=work / "model.aot")
        if rows[-1]["status"] == "ok":
            add("precompiled function", "pre", "precompile", artifact=work / "model.aot")
    else:
        raise ValueError(f"Unknown group of paths {paths!r}: choose jit, max-autotune or aot.")
    return [{"workload": model, **r} for r in rows]


if __name__ == "__main__":
    sys.exit(main())
