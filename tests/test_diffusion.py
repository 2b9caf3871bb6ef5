"""Chapter 5's helpers (utils/diffusion.py): SD 1.5 built from configs, offline loading, regional compilation,
LoRA hotswap without recompiles; and chapter 5c's committed results (test_notebooks runs every chapter)."""
import json
import re

import pytest
import torch

from conftest import REPO

pytest.importorskip("diffusers")
pytest.importorskip("peft")

import diffusers  # noqa: E402

import utils  # noqa: E402
from utils import diffusion  # noqa: E402

diffusers.utils.logging.set_verbosity_error()

TINY = diffusion.TINY


@pytest.fixture(scope="module")
def pipe():
    return diffusion.build_pipeline(TINY, "cpu", torch.float32)


@pytest.fixture(scope="module")
def inputs(pipe):
    return diffusion.unet_inputs(pipe.unet, *diffusion.text_embeddings(pipe), 64, pipe.vae_scale_factor)


@pytest.fixture(scope="module")
def adapters(pipe, tmp_path_factory):
    root = tmp_path_factory.mktemp("lora")
    return [diffusion.make_lora(pipe.unet, rank, root / f"rank-{rank}", seed=i) for i, rank in enumerate([4, 8])]


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def fresh_unet():
    return diffusion.build_unet(TINY["unet"], "cpu", torch.float32)


def classes(model):
    return [type(m).__name__ for m in model.modules()]


# --- the architecture -----------------------------------------------------------------------------

def test_sd15_configs_build_the_sd15_architecture():
    unet = diffusion.build_unet(diffusion.SD15_UNET, "meta", torch.bfloat16)
    vae = diffusion.build_vae(diffusion.SD15_VAE, "meta", torch.bfloat16)
    text = diffusion.build_text_encoder(diffusion.SD15_TEXT, "meta", torch.bfloat16)
    assert (type(unet).__name__, type(vae).__name__, type(text).__name__) == (
        "UNet2DConditionModel", "AutoencoderKL", "CLIPTextModel")
    # the parameter counts of the SD 1.5 checkpoint's unet/, vae/ and text_encoder/
    assert utils.count_params(unet) == 859_520_964
    assert utils.count_params(vae) == 83_653_863
    assert utils.count_params(text) == 123_060_480
    assert unet.dtype == vae.dtype == text.dtype == torch.bfloat16
    assert torch.get_default_dtype() == torch.float32, "building must not leave the default dtype changed"
    assert tuple(unet.config.block_out_channels) == (320, 640, 1280, 1280)
    assert unet.config.cross_attention_dim == text.config.hidden_size == 768
    names = classes(unet)
    assert (names.count("BasicTransformerBlock"), names.count("ResnetBlock2D"), names.count("Transformer2DModel"),
            names.count("Downsample2D"), names.count("Upsample2D")) == (16, 22, 16, 3, 3)
    assert type(unet)._repeated_blocks == ["BasicTransformerBlock"]


def test_tiny_pipeline_generates_an_image_of_the_asked_size(pipe, inputs):
    sample, timestep, context = inputs
    assert sample.shape == (2, 4, 8, 8) and context.shape == (2, 77, 32) and timestep.ndim == 0
    assert pipe.vae_scale_factor == 8 and pipe.tokenizer is None
    embeds = diffusion.text_embeddings(pipe)
    image = diffusion.generate(pipe, *embeds, 64, steps=2)
    assert image.shape == (1, 3, 64, 64) and 0 <= image.min() and image.max() <= 1
    assert torch.equal(image, diffusion.generate(pipe, *embeds, 64, steps=2)), "same seed, same image"
    assert diffusion.unet_step(pipe.unet, *inputs).shape == sample.shape
    latents = diffusion.decode_inputs(pipe, 96)
    assert diffusion.vae_decode(pipe.vae, latents).shape == (1, 3, 96, 96)


def test_save_pretrained_round_trip_offline(pipe, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    pipe.save_pretrained(tmp_path)
    loaded = diffusion.load_pipeline(tmp_path, "cpu", torch.float32)
    assert type(loaded.unet).__name__ == "UNet2DConditionModel" and loaded.safety_checker is None
    embeds = diffusion.text_embeddings(pipe)
    assert torch.equal(diffusion.text_embeddings(loaded)[0], embeds[0])
    assert torch.equal(diffusion.generate(loaded, *embeds, 64, steps=2), diffusion.generate(pipe, *embeds, 64, steps=2))


def test_missing_checkpoint_folder_says_what_is_expected(tmp_path):
    with pytest.raises(FileNotFoundError, match="save_pretrained"):
        diffusion.load_pipeline(tmp_path / "nowhere", "cpu", torch.float32)


@pytest.mark.parametrize("resolution", [500, 0, -8, 512.0, "512"])
def test_resolution_not_a_multiple_of_8_is_rejected(resolution):
    with pytest.raises(ValueError, match="multiple of 8"):
        diffusion.latent_size(resolution)


def test_resolutions_and_presets(pipe):
    assert [diffusion.latent_size(r) for r in (512, 768, 1024)] == [64, 96, 128]
    with pytest.raises(ValueError, match="multiple of 8"):
        diffusion.generate(pipe, *diffusion.text_embeddings(pipe), 60, steps=1)
    with pytest.raises(ValueError, match="Unknown preset 'huge'"):
        utils.resolve_preset("huge", {"smoke": {}, "full": {}})


def test_inductor_options_exist_in_this_torch():
    present, missing = diffusion.inductor_options()
    assert present == diffusion.DIFFUSERS_INDUCTOR and missing == []
    present, missing = diffusion.inductor_options({"epilogue_fusion": False, "no_such_setting": 1})
    assert present == {"epilogue_fusion": False} and missing == ["no_such_setting"]


# --- regional compilation -------------------------------------------------------------------------

def test_repeated_blocks_compile_only_the_transformer_blocks(inputs):
    reference = diffusion.unet_step(fresh_unet(), *inputs)
    unet = fresh_unet()
    names = diffusion.compile_repeated(unet, backend="eager", fullgraph=True)
    assert names and all(n.endswith("transformer_blocks.0") for n in names)
    assert diffusion.region_classes(unet, names) == {"BasicTransformerBlock": classes(unet).count("BasicTransformerBlock")}
    census = {(r["block"], r["where"]): r for r in diffusion.module_census(unet)}
    assert {where for (_, where) in census if _ == "ResnetBlock2D"} == {"eager"}
    assert census[("BasicTransformerBlock", "compiled")]["instances"] == len(names)
    assert sum(r["params"] for r in census.values()) == utils.count_params(unet)
    torch.testing.assert_close(diffusion.unet_step(unet, *inputs), reference)
    assert diffusion.graphs_compiled() >= 1


def test_blocks_by_hand_compile_one_static_graph_per_shape(inputs):
    eager = fresh_unet()
    calls = diffusion.capture_calls(eager, diffusion.BY_HAND_CLASSES, lambda: diffusion.unet_step(eager, *inputs))
    needed = diffusion.graphs_needed(eager, calls)
    assert set(needed) == set(diffusion.BY_HAND_CLASSES)
    unet = fresh_unet()
    names = diffusion.compile_blocks(unet, diffusion.BY_HAND_CLASSES, backend="eager", fullgraph=True, dynamic=False)
    assert not any(n.startswith(m + ".") for n in names for m in names), "only the outermost blocks are compiled"
    assert diffusion.region_classes(unet, names) == {c: classes(unet).count(c) for c in diffusion.BY_HAND_CLASSES}
    assert len(names) == len(calls), "each block is called once per step"
    from torch._dynamo.utils import counters

    counters.clear()
    with torch._dynamo.config.patch(recompile_limit=max(needed.values()) + 1):
        torch.testing.assert_close(diffusion.unet_step(unet, *inputs), diffusion.unet_step(eager, *inputs))
    assert diffusion.graphs_compiled() == sum(needed.values())
    eager_left = {r["block"] for r in diffusion.module_census(unet) if r["where"] == "eager"}
    assert eager_left == {"TimestepEmbedding", "(top level)"}
    with pytest.raises(ValueError, match="no submodule"):
        diffusion.compile_blocks(fresh_unet(), ["NoSuchBlock"])


def test_captured_calls_replay_and_time(pipe, inputs):
    calls = diffusion.capture_calls(pipe.unet, diffusion.BLOCK_CLASSES, lambda: diffusion.unet_step(pipe.unet, *inputs))
    btb = diffusion.select_calls(pipe.unet, calls, ["BasicTransformerBlock"])
    assert len(btb) == classes(pipe.unet).count("BasicTransformerBlock")
    assert all(not m._forward_pre_hooks for m in pipe.unet.modules()), "the hooks are removed"
    module, args, kwargs = btb[0][0], btb[0][1], btb[0][2]
    assert "encoder_hidden_states" in kwargs and torch.is_tensor(args[0])
    timing = diffusion.time_calls(pipe.unet, btb, min_run_time=0.05)
    assert timing.median_ms > 0


def test_amdahl():
    assert diffusion.amdahl_speedup(0.85, 2.5) == pytest.approx(1 / 0.49)
    assert diffusion.amdahl_speedup(0.0, 10.0) == 1.0 and diffusion.amdahl_speedup(1.0, 3.0) == pytest.approx(3.0)


def test_compare_prepared_times_each_prepared_model_against_eager_in_rounds(inputs):
    """Eager against a regionally compiled UNet and a broken one: rows with rounds, compile s, graphs, error; a failure is a row."""
    def repeated():
        unet = fresh_unet()
        diffusion.compile_repeated(unet, backend="eager", fullgraph=True)
        return unet

    def broken():
        raise RuntimeError("no such model")

    rows = diffusion.compare_prepared(fresh_unet, {"repeated": (repeated, None), "broken": (broken, None)}, (inputs,),
                                      workload="unet_step", run=lambda unet, x: diffusion.run_unet_step(unet, *x),
                                      min_run_time=0.05, extra={"resolution": 64})
    eager, rep, bad = rows
    assert (eager["variant"], eager["speedup"], eager["graphs"], eager["resolution"]) == ("eager", 1.0, 0, 64)
    assert rep["status"] == "ok" and rep["workload"] == "unet_step" and rep["resolution"] == 64
    assert rep["graphs"] >= 1 and rep["compile_s"] > 0 and rep["rounds"] == 7
    assert rep["speedup_lo"] <= rep["speedup"] <= rep["speedup_hi"] and rep["eager_ms"] > 0
    assert rep["rel_err"] < 1e-4, "the eager backend computes what eager does"
    assert bad["status"] == "failed" and "no such model" in bad["reason"]


def test_decoder_and_generation_rounds(pipe):
    latents = diffusion.decode_inputs(pipe, 64)
    decoder = diffusion.Decoder(pipe.vae)
    assert torch.allclose(diffusion.run_decode(decoder, (latents,)), diffusion.vae_decode(pipe.vae, latents), atol=1e-5)
    embeds = diffusion.text_embeddings(pipe)
    other = diffusion.pipeline_with_unet(pipe, fresh_unet(), vae=diffusion.build_vae(TINY["vae"], "cpu", torch.float32))
    assert other.vae is not pipe.vae and other.text_encoder is pipe.text_encoder
    rows = diffusion.generation_rounds({"eager": lambda: diffusion.generate(pipe, *embeds, 64, 2),
                                        "same weights": lambda: diffusion.generate(other, *embeds, 64, 2)}, rounds=3)
    base, same = rows
    assert base["variant"] == "eager" and base["speedup"] == base["speedup_lo"] == 1.0 and base["rel_err"] == 0.0
    assert same["workload"] == "generation" and same["rounds"] == 3 and same["median_ms"] > 0
    assert same["rel_err"] < 1e-4, "the same seed and weights give the same image"
    assert same["first_s"] > 0 and same["compile_s"] >= 0


def test_first_and_steady_counts_compiles():
    from torch._dynamo.utils import counters

    counters.clear()
    fn = torch.compile(lambda x: torch.sin(x) * 2, backend="eager")
    x = torch.randn(8)
    first, out = diffusion.first_and_steady(lambda: fn(x), min_run_time=0.02, blocks=3, min_blocks=3)
    assert first["new_graphs"] == 1 and first["compile_s"] > 0 and torch.equal(out, torch.sin(x) * 2)
    again, _ = diffusion.first_and_steady(lambda: fn(x), min_run_time=0.02, blocks=3, min_blocks=3)
    assert again["new_graphs"] == 0 and again["compile_s"] == 0.0
    assert diffusion.relative_error(torch.tensor([1.0, 2.0]), torch.tensor([1.0, 4.0])) == pytest.approx(0.5)
    assert diffusion.count_kernels(lambda: fn(x)) is None or torch.cuda.is_available()


# --- chapter 5b: one compiled UNet called at several resolutions in turn ------------------------------

def test_5b_resolution_sweep_counts_new_graphs_per_resolution_and_times_against_eager(pipe):
    embeds = diffusion.text_embeddings(pipe)
    by_res = {res: diffusion.unet_inputs(pipe.unet, *embeds, res, pipe.vae_scale_factor) for res in (64, 96, 128)}
    step = lambda unet, x: diffusion.unet_step(unet, *x)
    eager = fresh_unet()
    static = diffusion.resolution_sweep(eager, diffusion.compile_whole(fresh_unet(), backend="eager", dynamic=False),
                                        by_res, step, min_run_time=0.05, rounds=3)
    assert [p["resolution"] for p in static] == [64, 96, 128]  # called in the dict's order
    assert [p["new_graphs"] for p in static] == [1, 1, 1]  # static: a graph per resolution
    for p in static:
        assert p["compile_s"] > 0 and p["first_s"] >= p["compile_s"]
        assert p["median_ms"] > 0 and p["eager_ms"] > 0 and p["speedup_lo"] <= p["speedup"] <= p["speedup_hi"]
        assert p["rel_err_vs_eager"] < 1e-5  # the same weights compute the same step
    torch._dynamo.reset()
    dynamic = diffusion.resolution_sweep(eager, diffusion.compile_whole(fresh_unet(), backend="eager", dynamic=True),
                                         by_res, step, min_run_time=0.05, rounds=3)
    assert [p["new_graphs"] for p in dynamic] == [1, 0, 0]  # symbolic sizes: one graph serves all
    assert dynamic[1]["compile_s"] == dynamic[2]["compile_s"] == 0.0
    torch._dynamo.reset()
    other = diffusion.build_unet(TINY["unet"], "cpu", torch.float32, seed=1)  # other weights: the error shows it
    assert diffusion.resolution_sweep(eager, other, {64: by_res[64]}, step, min_run_time=0.05,
                                      rounds=3)[0]["rel_err_vs_eager"] > 1e-3


# --- LoRA -----------------------------------------------------------------------------------------

def lora_swap(pipe, adapters, inputs, how):
    """Load adapter 0, compile the repeated blocks, step; swap to adapter 1; step: (new graphs, before, after)."""
    lora_pipe = diffusion.pipeline_with_unet(pipe, fresh_unet())
    if how == "hotswap":
        lora_pipe.enable_lora_hotswap(target_rank=8)
    lora_pipe.load_lora_weights(adapters[0], adapter_name="style")
    diffusion.compile_repeated(lora_pipe.unet, backend="eager", fullgraph=True)
    before = diffusion.unet_step(lora_pipe.unet, *inputs)
    graphs = diffusion.graphs_compiled()
    diffusion.swap_adapter(lora_pipe, adapters[1], how)
    after = diffusion.unet_step(lora_pipe.unet, *inputs)
    return diffusion.graphs_compiled() - graphs, before, after


def test_lora_adapters_are_made_offline_and_change_the_output(pipe, adapters, inputs):
    assert [sorted(p.name for p in a.iterdir()) for a in adapters] == [["pytorch_lora_weights.safetensors"]] * 2
    state, _ = diffusers.StableDiffusionPipeline.lora_state_dict(str(adapters[1]))
    assert any(".to_q." in k for k in state) and all("lora" in k for k in state)
    ranks = {v.shape[0] for k, v in state.items() if "lora.down" in k or "lora_A" in k}
    assert ranks == {8}
    plain = diffusion.unet_step(pipe.unet, *inputs)
    with_lora = diffusion.pipeline_with_unet(pipe, fresh_unet())
    with_lora.load_lora_weights(adapters[1], adapter_name="x")
    assert diffusion.relative_error(diffusion.unet_step(with_lora.unet, *inputs), plain) > 1e-3


@pytest.mark.filterwarnings("ignore:Already found a `peft_config`:UserWarning")  # the plain swap loads a second adapter
def test_hotswap_does_not_recompile_and_a_plain_swap_does(pipe, adapters, inputs):
    reference_pipe = diffusion.pipeline_with_unet(pipe, fresh_unet())
    reference_pipe.load_lora_weights(adapters[1], adapter_name="style")
    reference = diffusion.unet_step(reference_pipe.unet, *inputs)
    new_graphs, before, after = lora_swap(pipe, adapters, inputs, "hotswap")
    assert new_graphs == 0
    assert diffusion.relative_error(after, before) > 1e-3, "the swap changed the output"
    torch.testing.assert_close(after, reference, atol=1e-5, rtol=1e-4)
    torch._dynamo.reset()
    new_graphs, before, after = lora_swap(pipe, adapters, inputs, "new adapter")
    assert new_graphs > 0
    torch.testing.assert_close(after, reference, atol=1e-5, rtol=1e-4)
    with pytest.raises(ValueError, match="unknown swap"):
        diffusion.swap_adapter(pipe, adapters[0], "sideways")


# --- plots, panel ---------------------------------------------------------------------------------

def test_plot_and_panel_build():
    import matplotlib

    matplotlib.use("Agg")
    rows = [{"label": "a", "median_ms": 2.0, "compile_s": 10.0}, {"label": "b", "median_ms": 1.0, "compile_s": None}]
    axes = diffusion.plot_step_and_compile(rows, eager_ms=4.0)
    assert [t.get_text() for t in axes[0].get_yticklabels()] == ["a", "b"]
    calls = []

    def run(mode, scope, resolution):
        calls.append((mode, scope, resolution))
        return {"median_ms": 1.0, "compile_s": 2.0, "eager_ms": 3.0}

    panel = diffusion.diffusion_panel(run, {"default": {}}, ["whole UNet", "blocks by hand"], [64, 96])
    assert len(panel.children) == 3
    button = [c for box in panel.children[:2] for c in getattr(box, "children", []) if getattr(c, "description", "")
              == "Run"][0]
    button.click()
    assert calls == [("default", "whole UNet", 64)] and len(panel.rows) == 1


# --- the published chapter (5 and 5b; test_notebooks runs both in the smoke preset) ----------------

CHAPTERS = [REPO / "notebooks" / name for name in ("05_diffusion.ipynb", "05b_diffusion_serving.ipynb")]


@pytest.mark.parametrize("notebook", CHAPTERS, ids=lambda p: p.stem)
def test_chapter_has_the_shape_and_is_in_the_book(notebook, repository_url):
    cells = json.loads(notebook.read_text())["cells"]
    code = [c for c in cells if c["cell_type"] == "code"]
    first = "".join(code[0]["source"])
    assert "google.colab" in first and f"!git clone --depth 1 {repository_url}" in first
    assert '%pip install -q "diffusers==0.42.1" peft' in first
    tagged = [c for c in code if "parameters" in c["metadata"].get("tags", [])]
    assert len(tagged) == 1 and re.search(r'^PRESET = "auto"', "".join(tagged[0]["source"]), re.M)
    prose = "".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")
    assert "{exercise}" in prose and "{solution}" in prose and ":class: dropdown" in prose
    assert f"notebooks/{notebook.stem}" in (REPO / "_toc.yml").read_text()


@pytest.mark.parametrize("notebook", CHAPTERS, ids=lambda p: p.stem)
def test_committed_run_has_no_failed_measurement(notebook):
    nb = json.loads(notebook.read_text())
    text = "".join("".join(o.get("text", "")) for c in nb["cells"] if c["cell_type"] == "code"
                   for o in c.get("outputs", []) if o.get("output_type") == "stream" and o.get("name") == "stdout")
    assert "gpu: NVIDIA" in text
    failures = re.findall(r".*: failed: .*", text)
    assert not failures, f"measurements failed in the committed run: {failures}"


def complete_full_run(chapter):
    """The measurements of the chapter's one results file (one GPU's run, the page's), checked complete."""
    (path,) = (REPO / "results").glob(f"*/{chapter}.json")
    data = json.loads(path.read_text())
    assert data["provenance"]["preset"] == "full" and data["provenance"]["gpu"].startswith("NVIDIA")
    rows = data["measurements"]
    assert all(r["status"] == "ok" for r in rows), "every part of the chapter finished"
    return rows


def test_committed_results_hold_the_goal_measurements():
    rows = complete_full_run("05_diffusion")
    unet = {r["variant"]: r for r in rows if r["workload"] == "unet_step"}
    assert unet["eager"]["speedup"] == 1.0 and any(r.get("compile_s", 0) > 0 for r in unet.values())
    for r in unet.values():  # every compiled step against eager in the same rounds
        assert r["variant"] in ("eager", "floor") or r["speedup_lo"] <= r["speedup"] <= r["speedup_hi"]
    best = min((r for r in unet.values() if r.get("compile_s", 0) > 0), key=lambda r: r["median_ms"])
    assert unet["floor"]["floor_of"] == best["variant"] and 0 < best["floor_frac"] <= 1.05
    assert {r["variant"] for r in rows if r["workload"] == "generation"} == {"eager", "compiled"}
    regional = [r for r in rows if r["workload"] == "unet_regional" and r["status"] == "ok" and r.get("scope") != "whole"]
    assert regional and all(r["cold_start_ratio"] > 0 and r["speedup_kept"] > 0 for r in regional)


def test_5b_committed_results_hold_the_swaps_and_every_resolution():
    rows = complete_full_run("05b_diffusion_serving")
    lora = {r["variant"]: r for r in rows if r["workload"] == "lora_swap"}
    assert lora["hotswap"]["recompiles"] == 0 < lora["new adapter"]["recompiles"]
    compiled = [r for r in rows if r["workload"] == "resolution" and r["variant"] != "eager"]
    by_recipe = {}
    for r in compiled:  # each against eager at its resolution, in the same rounds
        assert r["speedup_lo"] <= r["speedup"] <= r["speedup_hi"] and r["compile_s"] >= 0
        by_recipe.setdefault(r["variant"], []).append(r["resolution"])
    assert set(by_recipe) == {"whole UNet, static", "repeated blocks, dynamic=None (default)",
                              "repeated blocks, dynamic=True"}
    assert len({tuple(v) for v in by_recipe.values()}) == 1, "every recipe called at the same resolutions"
    assert len(by_recipe["whole UNet, static"]) == 3 and by_recipe["whole UNet, static"] == sorted(by_recipe["whole UNet, static"])
    assert all(r["warm_first_s"] < r["compile_s"] for r in compiled if r["variant"] == "whole UNet, static")


def test_5b_has_no_run_window_plumbing():
    from test_notebooks import assert_no_plumbing

    code = "".join("".join(c["source"]) for c in json.loads(CHAPTERS[1].read_text())["cells"] if c["cell_type"] == "code")
    assert 'utils.Run("05b_diffusion_serving", PRESET_NAME, P)' in code and "run.part(" in code
    assert_no_plumbing(code)


# --- chapter 5c: the repeated blocks compiled three ways, each against eager in alternating rounds ---------

CHAPTER_5C = REPO / "notebooks" / "05c_diffusion_tuning.ipynb"


def test_5c_break_even_images():
    assert diffusion.break_even_images(300, 20.0, 18.0, 50) == pytest.approx(3000)
    assert diffusion.break_even_images(300, 18.0, 20.0, 50) is None  # not faster: never repaid
    assert diffusion.break_even_images(-5, 20.0, 21.0, 50) == 0.0  # no extra compile: nothing to repay


def test_5c_has_no_run_window_plumbing():
    from test_notebooks import assert_no_plumbing

    code = "".join("".join(c["source"]) for c in json.loads(CHAPTER_5C.read_text())["cells"] if c["cell_type"] == "code")
    assert 'utils.Run("05c_diffusion_tuning", PRESET_NAME, P)' in code and "run.part(" in code
    assert "diffusion.compile_repeated(unet, fullgraph=True, **compile_args)" in code  # every variant regional
    assert_no_plumbing(code)


def test_5c_committed_results_hold_each_variant_against_eager_with_its_gpu_time():
    rows = complete_full_run("05c_diffusion_tuning")
    blocks = {r["variant"]: r for r in rows if r["workload"] == "unet_blocks"}
    assert set(blocks) == {"eager", "default", "diffusers settings", "max-autotune-no-cudagraphs"}
    for r in blocks.values():
        assert r["scope"] == "repeated blocks" and 0 < r["gpu_ms"] < r["median_ms"], f"{r['variant']}: GPU time per step"
        if r["variant"] == "eager":
            continue
        assert r["speedup_lo"] <= r["speedup"] <= r["speedup_hi"], f"{r['variant']}: its ratio lies in its rounds' range"
        assert r["compile_s"] > 0
    assert blocks["diffusers settings"]["compile_s"] > blocks["default"]["compile_s"], "the settings cost compile time"
