"""Chapter 5's helpers: a Stable Diffusion 1.5-architecture pipeline built from configs, UNet steps, regional
compilation (which blocks, what stays eager), LoRA adapters made offline and swapped, and the chapter's panel.

Works with diffusers 0.42, transformers 5.17 to 5.24 and peft >= 0.17; never touches the network.
"""
import contextlib
import copy
import statistics
import time
from collections import Counter
from pathlib import Path

import torch

from .compare import break_even_calls
from .timing import time_first_call, time_fn

# The Stable Diffusion 1.5 architecture, from the unet/, vae/, text_encoder/ and scheduler/ configs of its checkpoint.
SD15_UNET = dict(sample_size=64, in_channels=4, out_channels=4, layers_per_block=2,
                 block_out_channels=(320, 640, 1280, 1280), cross_attention_dim=768, attention_head_dim=8,
                 norm_num_groups=32,
                 down_block_types=("CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D",
                                   "DownBlock2D"),
                 up_block_types=("UpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D"))
SD15_VAE = dict(in_channels=3, out_channels=3, latent_channels=4, layers_per_block=2, sample_size=512,
                block_out_channels=(128, 256, 512, 512), norm_num_groups=32,
                down_block_types=("DownEncoderBlock2D",) * 4, up_block_types=("UpDecoderBlock2D",) * 4)
SD15_TEXT = dict(hidden_size=768, intermediate_size=3072, num_attention_heads=12, num_hidden_layers=12,
                 max_position_embeddings=77, vocab_size=49408, projection_dim=768, hidden_act="quick_gelu")
SD15_SCHEDULER = dict(num_train_timesteps=1000, beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear",
                      skip_prk_steps=True, steps_offset=1, set_alpha_to_one=False)
SD15 = {"unet": SD15_UNET, "vae": SD15_VAE, "text": SD15_TEXT, "scheduler": SD15_SCHEDULER}

# The smoke presets' pipeline (chapter 5): the same classes as Stable Diffusion 1.5, a few channels and blocks.
TINY = {
    "unet": dict(sample_size=8, in_channels=4, out_channels=4, layers_per_block=1, block_out_channels=(32, 64),
                 cross_attention_dim=32, attention_head_dim=8, norm_num_groups=8,
                 down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
                 up_block_types=("UpBlock2D", "CrossAttnUpBlock2D")),
    "vae": dict(in_channels=3, out_channels=3, latent_channels=4, layers_per_block=1, sample_size=64,
                block_out_channels=(8, 8, 16, 16), norm_num_groups=4,
                down_block_types=("DownEncoderBlock2D",) * 4, up_block_types=("UpDecoderBlock2D",) * 4),
    "text": dict(hidden_size=32, intermediate_size=64, num_attention_heads=4, num_hidden_layers=2,
                 max_position_embeddings=77, vocab_size=1000, projection_dim=32, hidden_act="quick_gelu"),
    "scheduler": SD15_SCHEDULER,
}

# The inductor settings diffusers' docs (optimization/fp16.md, "torch.compile") recommend for UNets.
DIFFUSERS_INDUCTOR = {"conv_1x1_as_mm": True, "coordinate_descent_tuning": True, "epilogue_fusion": False,
                      "coordinate_descent_check_all_directions": True}
# The attention projections of every BasicTransformerBlock: where diffusers' LoRA training scripts put adapters.
LORA_TARGETS = ["to_q", "to_k", "to_v", "to_out.0"]
# The module classes the chapter's census and regional recipes talk about, innermost first.
BLOCK_CLASSES = ("BasicTransformerBlock", "Transformer2DModel", "ResnetBlock2D", "Downsample2D", "Upsample2D",
                 "TimestepEmbedding")
BY_HAND_CLASSES = ("ResnetBlock2D", "Transformer2DModel", "Downsample2D", "Upsample2D")


# --- building the pipeline ------------------------------------------------------------------------

@contextlib.contextmanager
def _building(device, dtype, seed):
    """Create modules on device in dtype (no later cast: diffusers warns about casts), with a fixed seed (chapter 5)."""
    saved = torch.get_default_dtype()
    torch.manual_seed(seed)
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            yield
    finally:
        torch.set_default_dtype(saved)


def build_unet(config, device, dtype, seed=0):
    """A UNet2DConditionModel from a config dict, random weights (the same for a seed), on device in dtype (chapter 5)."""
    from diffusers import UNet2DConditionModel

    with _building(device, dtype, seed):
        return UNet2DConditionModel(**config).eval()


def build_vae(config, device, dtype, seed=0):
    """An AutoencoderKL from a config dict with random weights, on device in dtype (chapter 5)."""
    from diffusers import AutoencoderKL

    with _building(device, dtype, seed):
        return AutoencoderKL(**config).eval()


def build_text_encoder(config, device, dtype, seed=0):
    """A CLIPTextModel from CLIPTextConfig sizes with random weights, on device in dtype (chapter 5)."""
    from transformers import CLIPTextConfig, CLIPTextModel

    special = dict(bos_token_id=0, eos_token_id=2, pad_token_id=1) if config["vocab_size"] < 49408 else {}
    with _building(device, dtype, seed):
        return CLIPTextModel(CLIPTextConfig(**{**special, **config})).eval()


def build_pipeline(sizes, device, dtype, seed=0):
    """A StableDiffusionPipeline from config dicts {unet, vae, text, scheduler}: random weights, no tokenizer (chapter 5).

    Prompts are given as embeddings (`prompt_embeds`), so the pipeline needs no tokenizer files, and it has no
    safety checker (it would classify random images; its time is not the subject here).
    """
    from diffusers import PNDMScheduler, StableDiffusionPipeline

    pipe = StableDiffusionPipeline(
        vae=build_vae(sizes["vae"], device, dtype, seed), text_encoder=build_text_encoder(sizes["text"], device, dtype,
                                                                                          seed),
        tokenizer=None, unet=build_unet(sizes["unet"], device, dtype, seed),
        scheduler=PNDMScheduler(**sizes["scheduler"]), safety_checker=None, feature_extractor=None,
        requires_safety_checker=False)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def load_pipeline(path, device, dtype):
    """A StableDiffusionPipeline from a local folder (save_pretrained's layout), never touching the network (chapter 5)."""
    from diffusers import StableDiffusionPipeline

    path = Path(path)
    if not (path / "model_index.json").is_file():
        raise FileNotFoundError(f"No pipeline at {path}: expected a folder written by save_pretrained "
                                "(model_index.json, unet/, vae/, text_encoder/, scheduler/).")
    absent = {name: None for name in ("tokenizer", "feature_extractor", "image_encoder") if not (path / name).is_dir()}
    pipe = StableDiffusionPipeline.from_pretrained(path, dtype=dtype, local_files_only=True,
                                                   safety_checker=None, requires_safety_checker=False, **absent)
    pipe.set_progress_bar_config(disable=True)
    return pipe.to(device)


def text_embeddings(pipe, seed=0):
    """(prompt_embeds, negative_prompt_embeds) of batch 1: random token ids and padding through the text encoder (chapter 5)."""
    encoder = pipe.text_encoder
    length, vocab = encoder.config.max_position_embeddings, encoder.config.vocab_size
    ids = torch.randint(3, vocab, (1, length), generator=torch.Generator().manual_seed(seed)).to(encoder.device)
    with torch.no_grad():
        prompt = encoder(ids)[0]
        negative = encoder(torch.full_like(ids, encoder.config.pad_token_id or 0))[0]
    return prompt, negative


def latent_size(resolution, vae_scale_factor=8):
    """The latent's side for an image side `resolution`; a clear error unless it divides by the VAE's factor (chapter 5)."""
    if not isinstance(resolution, int) or resolution <= 0 or resolution % vae_scale_factor:
        raise ValueError(f"resolution {resolution!r} must be a positive whole multiple of {vae_scale_factor}: the VAE "
                         f"turns each {vae_scale_factor}x{vae_scale_factor} pixels into one latent position.")
    return resolution // vae_scale_factor


def unet_inputs(unet, prompt_embeds, negative_embeds, resolution, vae_scale_factor=8, seed=0):
    """(sample, timestep, encoder_hidden_states) of one guided step: batch 2 (unconditional + conditional) (chapter 5)."""
    side = latent_size(resolution, vae_scale_factor)
    generator = torch.Generator().manual_seed(seed)
    sample = torch.randn(2, unet.config.in_channels, side, side, generator=generator)
    timestep = torch.tensor(981, device=unet.device)  # a timestep as the pipeline passes it: a tensor
    context = torch.cat([negative_embeds, prompt_embeds])
    return sample.to(unet.device, unet.dtype), timestep, context.to(unet.dtype)


def unet_step(unet, sample, timestep, context):
    """One UNet call: the noise prediction for both halves of the guided batch (chapter 5)."""
    with torch.no_grad():
        return unet(sample, timestep, encoder_hidden_states=context, return_dict=False)[0]


def generate(pipe, prompt_embeds, negative_embeds, resolution, steps, seed=0, guidance_scale=7.5):
    """A whole generation: `steps` guided UNet steps and the VAE decode; the image as a tensor (chapter 5)."""
    latent_size(resolution, pipe.vae_scale_factor)
    generator = torch.Generator(pipe.device).manual_seed(seed)
    with torch.no_grad():
        return pipe(prompt_embeds=prompt_embeds, negative_prompt_embeds=negative_embeds, height=resolution,
                    width=resolution, num_inference_steps=steps, guidance_scale=guidance_scale, generator=generator,
                    output_type="pt").images


def decode_inputs(pipe, resolution, seed=0):
    """Random latents of an image of side `resolution`, scaled as the pipeline scales them for the decoder (chapter 5)."""
    side = latent_size(resolution, pipe.vae_scale_factor)
    latents = torch.randn(1, pipe.vae.config.latent_channels, side, side, generator=torch.Generator().manual_seed(seed))
    return latents.to(pipe.device, pipe.vae.dtype) / pipe.vae.config.scaling_factor


def vae_decode(vae, latents, seed=0):
    """The VAE's decode of latents to an image tensor, called as the pipeline calls it (with a generator) (chapter 5)."""
    generator = torch.Generator(latents.device).manual_seed(seed)
    with torch.no_grad():
        return vae.decode(latents, return_dict=False, generator=generator)[0]


def pipeline_with_unet(pipe, unet, vae=None):
    """A pipeline sharing pipe's text encoder and scheduler config (and VAE, unless given), with another UNet (chapter 5)."""
    from diffusers import StableDiffusionPipeline

    new = StableDiffusionPipeline(vae=vae or pipe.vae, text_encoder=pipe.text_encoder, tokenizer=pipe.tokenizer,
                                  unet=unet,
                                  scheduler=pipe.scheduler.__class__.from_config(pipe.scheduler.config),
                                  safety_checker=None, feature_extractor=None, requires_safety_checker=False)
    new.set_progress_bar_config(disable=True)
    return new


# --- compile settings -----------------------------------------------------------------------------

def inductor_options(wanted=None):
    """The inductor settings diffusers recommends, split into (options this torch has, names it lacks) (chapter 5)."""
    import torch._inductor.config as inductor_config

    wanted = DIFFUSERS_INDUCTOR if wanted is None else wanted
    present = {k: v for k, v in wanted.items() if hasattr(inductor_config, k)}
    return present, sorted(set(wanted) - set(present))


def compile_whole(unet, channels_last=False, **compile_kwargs):
    """Compile the whole UNet in place (`unet.compile`), optionally in channels_last layout; returns unet (chapter 5)."""
    if channels_last:
        unet.to(memory_format=torch.channels_last)
    unet.compile(**compile_kwargs)
    return unet


def compile_blocks(model, class_names, **compile_kwargs):
    """Compile in place every submodule whose class is named in class_names (outermost only); their names (chapter 5)."""
    names = []
    for name, module in model.named_modules():
        inside = any(name.startswith(done + ".") for done in names)
        if type(module).__name__ in class_names and not inside:
            module.compile(**compile_kwargs)
            names.append(name)
    if not names:
        raise ValueError(f"no submodule of {type(model).__name__} is a {', '.join(class_names)}")
    return names


def compile_repeated(model, **compile_kwargs):
    """diffusers' regional compilation (`compile_repeated_blocks`); the names of the submodules it compiled (chapter 5)."""
    model.compile_repeated_blocks(**compile_kwargs)
    return compiled_regions(model)


def compiled_regions(model):
    """Names of the submodules compiled in place (`module.compile()`), '' for the model itself (chapter 5)."""
    return [name for name, m in model.named_modules() if getattr(m, "_compiled_call_impl", None) is not None]


def region_classes(model, names):
    """How many compiled regions of each class: {'BasicTransformerBlock': 16, ...} (chapter 5)."""
    modules = dict(model.named_modules())
    return dict(Counter(type(modules[n]).__name__ for n in names))


def module_census(model, block_classes=BLOCK_CLASSES):
    """Parameters by innermost block class and by compiled/eager: rows of block, where, instances, params (chapter 5)."""
    regions = set(compiled_regions(model))
    modules = dict(model.named_modules())
    rows = {}
    for name, module in modules.items():
        own = sum(p.numel() for p in module.parameters(recurse=False))
        if not own:
            continue
        parts = name.split(".")
        prefixes = [".".join(parts[:i]) for i in range(len(parts), -1, -1)]  # the module, its parent, ... the root
        block = next((p for p in prefixes if type(modules[p]).__name__ in block_classes), None)
        where = "compiled" if any(p in regions for p in prefixes) else "eager"
        key = (type(modules[block]).__name__ if block is not None else "(top level)", where)
        row = rows.setdefault(key, {"block": key[0], "where": where, "instances": set(), "params": 0})
        row["instances"].add(block)
        row["params"] += own
    out = [{**r, "instances": len(r["instances"])} for r in rows.values()]
    return sorted(out, key=lambda r: (r["where"], -r["params"]))


# --- where the time goes ----------------------------------------------------------------------------

def capture_calls(model, class_names, run):
    """Run run() once and record (module name, args, kwargs) of each call of a submodule of class_names (chapter 5)."""
    calls, handles = [], []
    for name, module in model.named_modules():
        if type(module).__name__ in class_names:
            hook = lambda _module, args, kwargs, name=name: calls.append((name, args, dict(kwargs)))
            handles.append(module.register_forward_pre_hook(hook, with_kwargs=True))
    try:
        run()
    finally:
        for handle in handles:
            handle.remove()
    return calls


def replay_calls(model, calls):
    """Call model's submodules again on the recorded inputs (model may be a compiled copy of the recorded one) (chapter 5)."""
    modules = dict(model.named_modules())
    with torch.no_grad():
        for name, args, kwargs in calls:
            modules[name](*args, **kwargs)


def time_calls(model, calls, min_run_time=0.5):
    """Time of one replay of recorded calls: the step time spent inside those submodules (chapter 5)."""
    return time_fn(lambda: replay_calls(model, calls), min_run_time=min_run_time, warmup=1)


def select_calls(model, calls, class_names):
    """The recorded calls of submodules whose class is named in class_names (chapter 5)."""
    modules = dict(model.named_modules())
    return [call for call in calls if type(modules[call[0]]).__name__ in class_names]


def graphs_needed(model, calls):
    """Different (input shapes, weight shapes) per class among recorded calls: the static graphs each needs (chapter 5)."""
    modules = dict(model.named_modules())

    def shapes(values):
        return tuple(tuple(v.shape) for v in values if torch.is_tensor(v))

    keys = {(type(modules[n]).__name__, shapes(a), shapes(k.values()), shapes(modules[n].parameters()))
            for n, a, k in calls}
    return dict(Counter(key[0] for key in keys))


def amdahl_speedup(share, region_speedup):
    """Whole-step speedup when a `share` of the step runs region_speedup times faster and the rest as before (chapter 5)."""
    return 1.0 / ((1.0 - share) + share / region_speedup)


# --- measuring a compiled callable -------------------------------------------------------------------

def graphs_compiled():
    """Graphs Dynamo has compiled since counters were last cleared (chapter 5)."""
    from torch._dynamo.utils import counters

    return counters["stats"]["unique_graphs"]


def first_and_steady(fn, min_run_time=1.0, warmup=2, blocks=20, min_blocks=5):
    """Time fn's first call (compiles), then its steady state; dict of first_s, compile_s, median/p10/p90 ms, graphs (chapter 5)."""
    before = graphs_compiled()
    first_s, out = time_first_call(fn)
    new_graphs = graphs_compiled() - before
    timing = time_fn(fn, min_run_time=min_run_time, warmup=warmup, blocks=blocks, min_blocks=min_blocks)
    return {"first_s": first_s, "compile_s": max(first_s - timing.median_ms / 1e3, 0.0) if new_graphs else 0.0,
            "median_ms": timing.median_ms, "p10_ms": timing.p10_ms, "p90_ms": timing.p90_ms, "runs": timing.runs,
            "new_graphs": new_graphs}, out


def count_kernels(fn):
    """GPU kernels (and copies) one call of fn launches, from the profiler; None without a GPU (chapter 5)."""
    if not torch.cuda.is_available():
        return None
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return sum(1 for event in prof.events() if event.device_type == torch.autograd.DeviceType.CUDA)


def relative_error(out, ref):
    """max |out - ref| / max |ref|, in float32 (chapter 5)."""
    ref = ref.float()
    return ((out.float() - ref).abs().max() / ref.abs().max().clamp_min(1e-12)).item()


# --- chapter 5c: what a tuned compile's extra seconds must repay ------------------------------------------

def break_even_images(extra_compile_s, baseline_ms, tuned_ms, steps):
    """Chapter 5c: images of `steps` UNet steps that repay extra compile seconds; 0 if none extra, None if not faster."""
    if extra_compile_s <= 0:
        return 0.0
    steps_to_repay = break_even_calls(extra_compile_s, baseline_ms, tuned_ms)  # None if not faster
    return None if steps_to_repay is None else steps_to_repay / steps


# --- LoRA adapters, made offline -------------------------------------------------------------------

def make_lora(unet, rank, folder, seed=0, targets=LORA_TARGETS):
    """A random LoRA adapter of `rank` on the UNet's attention projections, saved with save_lora_weights; its folder (chapter 5).

    Made as diffusers' LoRA training scripts save theirs: peft's LoraConfig on a copy of the UNet, its state
    dict from get_peft_model_state_dict, written by StableDiffusionPipeline.save_lora_weights. The up
    matrices are random too (init_lora_weights=False), so the adapter changes the UNet's output.
    """
    from diffusers import StableDiffusionPipeline
    from diffusers.utils import convert_state_dict_to_diffusers
    from peft import LoraConfig, get_peft_model_state_dict

    config = LoraConfig(r=rank, lora_alpha=rank, target_modules=list(targets), init_lora_weights=False)
    donor = copy.deepcopy(unet)
    torch.manual_seed(seed)
    donor.add_adapter(config)
    state = convert_state_dict_to_diffusers(get_peft_model_state_dict(donor))
    del donor
    folder = Path(folder)
    StableDiffusionPipeline.save_lora_weights(folder, unet_lora_layers=state, unet_lora_adapter_metadata=config.to_dict())
    return folder


def swap_adapter(pipe, folder, how, adapter_name="style"):
    """Replace the active LoRA adapter by the one in folder: 'hotswap' in place, or 'new adapter' + set_adapters (chapter 5)."""
    start = time.perf_counter()
    if how == "hotswap":
        pipe.load_lora_weights(folder, adapter_name=adapter_name, hotswap=True)
    elif how == "new adapter":
        name = f"{adapter_name}-{len(pipe.unet.peft_config)}"
        pipe.load_lora_weights(folder, adapter_name=name)
        pipe.set_adapters(name)
    else:
        raise ValueError(f"unknown swap {how!r}: 'hotswap' or 'new adapter'")
    return time.perf_counter() - start


# --- plots and the panel ---------------------------------------------------------------------------

def plot_step_and_compile(rows, eager_ms=None, title="", axes=None, floor_ms=None):
    """Two bar charts per row label: steady UNet step in ms (eager dashed, the floor dotted) and compile seconds (chapter 5).

    Each bar is labelled with its row's speedup (measured in rounds against eager) where it has one.
    """
    import matplotlib.pyplot as plt

    if axes is None:
        _, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    labels = [r["label"] for r in rows]
    ys = range(len(rows))
    axes[0].barh(ys, [r["median_ms"] for r in rows], color="tab:blue")
    if eager_ms:
        axes[0].axvline(eager_ms, color="grey", ls="--", lw=1, label="eager")
    if floor_ms:
        axes[0].axvline(floor_ms, color="black", ls=":", lw=1.2, label="floor: the GPU's own time")
    if eager_ms or floor_ms:
        axes[0].legend(fontsize="small", loc="lower right")
    axes[0].set_xlabel("ms per UNet step (lower is better)")
    axes[1].barh(ys, [r.get("compile_s") or 0.0 for r in rows], color="tab:orange")
    axes[1].set_xlabel("compile seconds (first call)")
    for ax in axes:
        ax.set_yticks(list(ys))
        ax.invert_yaxis()
    axes[0].set_yticklabels(labels, fontsize="small")
    axes[1].set_yticklabels([])
    for y, r in zip(ys, rows):
        ratio = r.get("speedup") or (eager_ms / r["median_ms"] if eager_ms else None)
        if ratio:
            axes[0].annotate(f" {ratio:.2f}x", (r["median_ms"], y), va="center", fontsize="small")
    axes[0].figure.suptitle(title, fontsize="medium")
    axes[0].figure.tight_layout()
    return axes


def diffusion_panel(run, modes, scopes, resolutions, rows=None):
    """Dropdowns for mode, scope (whole or regional) and resolution; Run compiles a fresh UNet, times it, plots (chapter 5)."""
    # run(mode, scope, resolution) -> {"median_ms", "compile_s", "eager_ms"} (or raises).
    import ipywidgets as w
    import matplotlib.pyplot as plt

    from .widgets import run_panel

    controls = {"mode": w.Dropdown(options=list(modes), value=list(modes)[0], description="mode"),
                "scope": w.Dropdown(options=list(scopes), value=list(scopes)[0], description="compile"),
                "resolution": w.Dropdown(options=list(resolutions), value=list(resolutions)[0],
                                         description="resolution")}
    rows = rows if rows is not None else []

    def work(v, out):
        result = run(v["mode"], v["scope"], v["resolution"])
        rows.append({"label": f"{v['mode']}, {v['scope']}, {v['resolution']}", **result})
        out.clear_output(wait=True)
        axes = plot_step_and_compile(rows, title="your runs")
        for y, r in enumerate(rows):
            axes[0].plot([r["eager_ms"]], [y], "k|", markersize=14)
        plt.show()
        print(f"{result['median_ms']:.2f} ms per step ({result['eager_ms'] / result['median_ms']:.2f}x eager, "
              f"| marks eager at that resolution), compile {result['compile_s']:.1f} s")

    panel = run_panel(controls, work, lambda v: f"compiling and timing {v['mode']}, {v['scope']}, "
                                                f"{v['resolution']}x{v['resolution']} ...")
    panel.rows = rows
    return panel


# --- chapter 5 measured in parts: eager against a prepared model, in alternating rounds ---------------------

def run_unet_step(unet, inputs):
    """The UNet workload for utils.compare: one guided step, a new CUDA-graph iteration marked first (chapter 5)."""
    from .compiler import cudagraph_step_begin

    cudagraph_step_begin()
    return unet_step(unet, *inputs)


def run_decode(decoder, inputs):
    """The VAE-decode workload for utils.compare: the decoder on the latents, without gradients (chapter 5)."""
    with torch.no_grad():
        return decoder(*inputs)


class Decoder(torch.nn.Module):
    """The VAE's decode as a module, so that it is compiled and timed like any model (chapter 5)."""

    def __init__(self, vae):
        super().__init__()
        self.vae = vae

    def forward(self, latents):
        return self.vae.decode(latents, return_dict=False)[0]


def compare_prepared(make_eager, variants, inputs, *, workload, run, min_run_time=1.0, extra=None):
    """Eager against models their own functions prepared (compiled whole, by region, or re-laid out), in alternating rounds (chapter 5).

    `variants` maps a name to (make_prepared, mode): make_prepared() returns the model ready to call,
    mode is the torch.compile mode it used (a CUDA-graph mode is timed by its own replays). Rows as
    utils.compare gives them: speedup with the range of its rounds, compile seconds (the first call),
    GPU ms, graphs compiled, error against eager; a failure (an error, out of memory) is a row too.
    """
    from .compare import EAGER, failure_reason, max_abs_error, measure_against, measure_eager, row
    from .compiler import free_compiled

    fields = {"workload": workload, **(extra or {})}
    eager_model, eager_out, eager_row = measure_eager(make_eager, inputs, run=run, min_run_time=min_run_time)
    rows = [row("ok", variant="eager", **fields, graphs=0, **eager_row)]
    for variant, (make_prepared, mode) in variants.items():
        try:
            result, out, graphs = measure_against(eager_model, make_prepared, inputs, {**EAGER, "mode": mode},
                                                  run=run, min_run_time=min_run_time)
        except Exception as error:  # a failed variant is a result: report it and go on
            free_compiled()
            rows.append(row("failed", failure_reason(error), variant=variant, **fields))
            continue
        rows.append(row("ok", variant=variant, **fields, mode=mode, **result, graphs=graphs,
                        max_abs_err=max_abs_error(out, eager_out),
                        rel_err=relative_error(out, eager_out)))
        del out
        free_compiled()
    del eager_model
    free_compiled()
    return rows


def generation_rounds(generate_fns, rounds=5):
    """Whole images from each generate function in alternating rounds: ms per image, speedup over the first, image error (chapter 5).

    The first image of each is timed alone (it compiles whatever is compiled): `first_s`, and
    `compile_s` (that first image less a steady one).
    """
    from .timing import quantiles, time_first_call, time_interleaved

    images, first_s = {}, {}
    for name, fn in generate_fns.items():
        first_s[name], images[name] = time_first_call(fn)
    timed = time_interleaved(generate_fns, rounds=rounds, min_run_time=0.0, warmup=1)
    base = next(iter(generate_fns))
    rows = []
    for name in generate_fns:
        ratios = timed.ratios(base, name)
        p10, median, p90 = quantiles(timed.ms[name])
        rows.append({"workload": "generation", "variant": name, "status": "ok", "median_ms": median, "p10_ms": p10,
                     "p90_ms": p90, "first_s": first_s[name], "compile_s": max(first_s[name] - median / 1e3, 0.0),
                     "speedup": statistics.median(ratios), "speedup_lo": min(ratios), "speedup_hi": max(ratios),
                     "rounds": rounds, "rel_err": relative_error(images[name], images[base])})
    return rows


# --- chapter 5b: one compiled UNet called at several resolutions in turn ------------------------------

def resolution_sweep(eager, compiled, inputs_by_resolution, step, min_run_time=1.0, rounds=5):
    """Chapter 5b: call `compiled` at each resolution in turn: new graphs, compile s, then ms against eager in alternating rounds.

    `step(model, inputs)` runs one UNet step; the resolutions are called in the dict's order, so a
    recompile (or none) at each is what a service meeting them in that order pays. Per resolution:
    new_graphs, compile_s (the first call less a steady step, 0 when nothing compiled), median_ms,
    eager_ms, speedup with its spread over the rounds, and the output's error relative to eager.
    """
    from .timing import time_interleaved

    per = []
    for resolution, x in inputs_by_resolution.items():
        before = graphs_compiled()
        first_s, out = time_first_call(lambda: step(compiled, x))
        new_graphs = graphs_compiled() - before
        out = out.detach().clone()
        timed = time_interleaved({"eager": lambda: step(eager, x), "compiled": lambda: step(compiled, x)},
                                 rounds=rounds, min_run_time=min_run_time)
        ratios, median_ms = timed.ratios("eager", "compiled"), timed.median_ms("compiled")
        per.append({"resolution": resolution, "new_graphs": new_graphs, "first_s": first_s,
                    "compile_s": max(first_s - median_ms / 1e3, 0.0) if new_graphs else 0.0,
                    "median_ms": median_ms, "eager_ms": timed.median_ms("eager"),
                    "speedup": statistics.median(ratios), "speedup_lo": min(ratios), "speedup_hi": max(ratios),
                    "rel_err_vs_eager": relative_error(out, step(eager, x))})
    return per
