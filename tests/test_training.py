"""Chapter 2's helpers (utils/training.py): accumulation, compiled steps equal to eager, MFU, the optimizer step,
regional compile, profiles of the training step; and the chapter (its smoke run is in test_notebooks)."""
import json
import logging

import pytest
import torch
from torch._dynamo.testing import CompileCounter, CompileCounterWithBackend

from conftest import REPO

logging.getLogger("torch.utils.cpp_extension").setLevel(logging.ERROR)

from utils import training  # noqa: E402

SIZES = dict(vocab=64, seq_len=8, n_layers=2, d_model=32, n_heads=4)


def tiny_gpt(seed=0, **kwargs):
    torch.manual_seed(seed)
    return training.make_gpt(**SIZES, device="cpu", **kwargs)


def tokens(batch=4, seed=0):
    return training.token_batch(batch, SIZES["seq_len"], SIZES["vocab"], "cpu", seed=seed)


def grads(model):
    return [p.grad.clone() for p in model.parameters()]


# --- models and batches ---------------------------------------------------------------------------

def test_gpt_shapes_and_tied_head():
    model = tiny_gpt()
    x, y = tokens()
    assert x.shape == y.shape == (4, SIZES["seq_len"])
    assert torch.equal(x[:, 1:], y[:, :-1])  # targets are the next tokens
    assert model(x).shape == (4, SIZES["seq_len"], SIZES["vocab"])
    assert model.head.weight is model.tok.weight
    assert isinstance(model.optimizer, torch.optim.AdamW)


def test_small_resnet_is_channels_last_with_sgd_momentum():
    model = training.make_resnet([1, 1, 1, 1], 5, "cpu")
    images, labels = training.image_batch(2, 32, 5, "cpu")
    assert images.is_contiguous(memory_format=torch.channels_last)
    assert model.conv1.weight.is_contiguous(memory_format=torch.channels_last)
    assert model.optimizer.defaults["momentum"] == 0.9
    assert model(images).shape == (2, 5) and labels.max() < 5


def test_resnet50_is_torchvisions():
    model = training.make_resnet([3, 4, 6, 3], 1000, "cpu")
    assert sum(p.numel() for p in model.parameters()) == 25_557_032  # torchvision's ResNet-50


# --- accumulation ---------------------------------------------------------------------------------

def test_accumulation_equals_one_big_batch():
    batch = tokens(8)
    big = tiny_gpt()
    big.zero_grad()
    loss_big = training.loss_of(big, *batch)
    loss_big.backward()
    acc = tiny_gpt()
    loss_acc = training.accumulate_grads(acc, training.split_batch(batch, 4))
    assert torch.allclose(loss_acc, loss_big.detach(), atol=1e-6)
    for g_acc, g_big in zip(grads(acc), grads(big)):
        assert torch.allclose(g_acc, g_big, atol=1e-6)


def test_accumulation_resets_gradients_between_steps():
    model = tiny_gpt()
    micro = training.split_batch(tokens(8), 2)
    training.accumulate_grads(model, micro)
    first = grads(model)
    training.accumulate_grads(model, micro)
    for a, b in zip(first, grads(model)):
        assert torch.allclose(a, b)


def test_split_batch_refuses_uneven_micro_batches():
    with pytest.raises(ValueError, match="equal micro-batches"):
        training.split_batch(tokens(6), 4)


def test_compiled_accumulation_matches_eager_without_recompiles():
    torch._dynamo.reset()
    micro = training.split_batch(tokens(8), 4)
    eager = tiny_gpt()
    loss_eager = training.accumulate_grads(eager, micro)
    counter = CompileCounterWithBackend("aot_eager")
    compiled = tiny_gpt()
    compiled.compile(backend=counter)
    for _ in range(2):
        loss_compiled = training.accumulate_grads(compiled, micro)
    assert counter.frame_count == 1
    assert abs(loss_compiled.item() - loss_eager.item()) < 1e-5
    for a, b in zip(grads(compiled), grads(eager)):
        assert torch.allclose(a, b, atol=1e-5)


# --- compiled training step -------------------------------------------------------------------------

def test_compiled_training_steps_track_eager_losses():
    batches = [tokens(4, seed=s) for s in range(2)]
    torch._dynamo.reset()
    eager = training.loss_curve(tiny_gpt(), batches, 4)
    model = tiny_gpt()
    model.compile()  # inductor: real generated code
    compiled = training.loss_curve(model, batches, 4)
    assert eager[-1] < eager[0]  # it learns
    assert max(abs(a - b) for a, b in zip(eager, compiled)) < 1e-3


def test_loss_backward_module_gives_the_same_gradients():
    batch = tokens()
    ref = tiny_gpt()
    ref.zero_grad()
    training.loss_of(ref, *batch).backward()
    module = training.LossBackward(tiny_gpt())
    module.optimizer.zero_grad()
    module(*batch)
    for a, b in zip(grads(module.model), grads(ref)):
        assert torch.allclose(a, b)


# --- FLOPs and MFU --------------------------------------------------------------------------------

def test_mfu_arithmetic():
    assert training.mfu(1e12, 0.01, 2e14) == pytest.approx(0.5)
    assert training.mfu(6e9, 1.0, 6e9) == pytest.approx(1.0)


def test_gpt_train_flops_formula():
    model = tiny_gpt()
    v, s, n, d = SIZES["vocab"], SIZES["seq_len"], SIZES["n_layers"], SIZES["d_model"]
    block = 12 * d * d + 13 * d  # qkv, proj, fc1, fc2 weights and biases, two LayerNorms
    non_embedding = n * block + 2 * d  # + final LayerNorm
    expected = 6 * (non_embedding + v * d) * 100 + 12 * n * d * s * 100
    assert training.gpt_train_flops(model, 100) == expected


def test_matmul_rate_is_positive_and_finite():
    rate = training.matmul_flops_per_s(64, "cpu", torch.float32, min_run_time=0.05)
    assert 1e6 < rate < 1e15


# --- optimizer --------------------------------------------------------------------------------------

def test_compiled_optimizer_step_matches_eager():
    torch._dynamo.reset()
    eager, compiled = tiny_gpt(), tiny_gpt()
    training.fill_grads(eager)
    training.fill_grads(compiled)
    eager.optimizer.step()
    torch.compile(compiled.optimizer.step, backend="aot_eager")()
    for a, b in zip(eager.parameters(), compiled.parameters()):
        assert torch.allclose(a, b, atol=1e-6)


def test_tensor_lr_compiles_one_graph_while_the_schedule_changes_it():
    tensor_graphs = training.lr_schedule_graphs(tiny_gpt(), torch.tensor(3e-4), steps=4)
    float_graphs = training.lr_schedule_graphs(tiny_gpt(), 3e-4, steps=4)
    assert tensor_graphs == 1 and float_graphs > tensor_graphs  # a float lr is guarded on: a changed value recompiles


# --- regional compilation ---------------------------------------------------------------------------

def test_regional_compile_compiles_each_block_once_for_all():
    torch._dynamo.reset()
    counter = CompileCounter()
    model = training.regional_compile(tiny_gpt(), backend=counter)
    assert all(block._compiled_call_impl is not None for block in model.blocks)
    assert model._compiled_call_impl is None  # the rest stays eager
    x, _ = tokens()
    out = model(x)
    assert counter.frame_count == 1  # one graph, reused by every block
    torch._dynamo.reset()
    assert torch.allclose(out, tiny_gpt()(x), atol=1e-5)


def test_recount_model_breaks_counts_the_model_alone():
    rows = [{"variant": "eager", "status": "ok", "graph_breaks": 0},
            {"variant": "default", "status": "ok", "graph_breaks": 5}]
    training.recount_model_breaks(rows, tiny_gpt, (tokens()[0],))
    assert rows[1]["graph_breaks"] == 0 and rows[0]["graph_breaks"] == 0


def test_initial_loss_is_near_log_vocab():
    model = tiny_gpt()
    loss = training.loss_of(model, *tokens(16))
    assert abs(loss.item() - torch.log(torch.tensor(float(SIZES["vocab"]))).item()) < 0.5


def test_training_panel_run_adds_a_measured_row(monkeypatch):
    from utils import widgets

    monkeypatch.setattr(widgets, "add_and_show", lambda rows, new, title: rows.extend(new))
    panel = training.training_panel({"tiny": (tiny_gpt, tokens())}, device="cpu",
                                    modes=["default", "reduce-overhead"], min_run_time=0.05)
    buttons = [c for box in panel.children for c in getattr(box, "children", ()) if getattr(c, "description", "") == "Run"]
    assert len(buttons) == 1
    buttons[0].click()
    assert [r["variant"] for r in panel.rows] == ["eager", "default"]
    assert all(r["status"] == "ok" and r["workload"] == "tiny" for r in panel.rows)
    assert panel.rows[1]["max_abs_err"] < 1e-3


# --- profiles of the training step: kernels by category and phase --------------------------------

def test_training_kernel_categories_add_loss_and_optimizer():
    from utils import llm

    names = {"void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, c10::BFloat16, float, float, "
             "at::native::(anonymous namespace)::LogSoftMaxForwardEpilogue>": "loss",
             "void at::native::(anonymous namespace)::nll_loss_forward_reduce_cuda_kernel_2d<float, float, long>": "loss",
             "aten::_log_softmax_backward_data": "loss", "triton_red_fused__log_softmax_0": "loss",
             "void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::(anonymous namespace)::"
             "TensorListMetadata<4>, at::native::(anonymous namespace)::FusedAdamMathFunctor<float, 4>>": "optimizer",
             "Optimizer.step#AdamW.step": "optimizer", "aten::_foreach_lerp_": "optimizer",
             "void pytorch_flash::flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel<Flash_bwd_kernel_traits>": "attention",
             "triton_red_fused__softmax_bmm_5": "attention", "nvjet_hsh_64x8_64x16_2x1_v_bz_splitK_TNT": "matmul (library)",
             "triton_per_fused_native_layer_norm_backward_3": "Triton fused"}
    for name, category in names.items():
        assert llm.kernel_category(name, training=True) == category, name
    # without training=True nothing changes for chapter 3: no new categories, the same answers
    assert llm.kernel_category("aten::_foreach_lerp_") == "other"
    assert set(llm.time_by_category([("aten::mm", 1.0)])) == set(llm.KERNEL_CATEGORIES)
    totals = llm.time_by_category([("aten::nll_loss_forward", 2.0), ("aten::_fused_adamw_", 3.0), ("aten::mm", 1.0)],
                                  training=True)
    assert set(totals) == set(llm.KERNEL_CATEGORIES + llm.TRAINING_CATEGORIES)
    assert totals["loss"] == 2 and totals["optimizer"] == 3 and totals["matmul (library)"] == 1


def test_kernel_phases_follow_each_launch_into_its_range():
    def launch(ts, corr, cat="cuda_runtime"):
        return {"ph": "X", "cat": cat, "name": "cudaLaunchKernel", "ts": ts, "dur": 1, "tid": 2, "args": {"correlation": corr}}

    def kernel(name, ts, dur, corr, cat="kernel"):
        return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "args": {"correlation": corr}}

    trace = {"traceEvents": [
        {"ph": "X", "cat": "user_annotation", "name": "step: forward + loss", "ts": 0, "dur": 10},
        {"ph": "X", "cat": "user_annotation", "name": "step: backward", "ts": 10, "dur": 10},
        {"ph": "X", "cat": "user_annotation", "name": "step: optimizer", "ts": 20, "dur": 10},
        {"ph": "X", "cat": "gpu_user_annotation", "name": "step: backward", "ts": 40, "dur": 50},  # GPU side: ignored
        launch(1, 1), launch(12, 2, cat="cuda_driver"), launch(21, 3), launch(35, 4),  # the 4th outside every range
        kernel("gemm_a", 30, 5.0, 1), kernel("triton_b", 40, 7.0, 2), kernel("multi_tensor_apply_kernel", 50, 2.0, 3),
        kernel("Memset (Device)", 60, 1.0, 4, cat="gpu_memset")]}
    assert training.kernel_phases(trace) == [("gemm_a", 5.0, "forward + loss"), ("triton_b", 7.0, "backward"),
                                             ("multi_tensor_apply_kernel", 2.0, "optimizer"),
                                             ("Memset (Device)", 1.0, "unattributed")]
    assert [p for _, _, p in training.phase_ranges(trace)] == list(training.PHASES)
    trace["traceEvents"] += [{"ph": "X", "cat": "user_annotation", "name": "## Call CompiledFxGraph f00 ##", "ts": 2, "dur": 1},
                             {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 3, "dur": 4}]  # CPU side: no kernel
    summary = training.step_summary(trace, steps=1)  # a GPU profile: kernels, phases, span
    assert summary["kernels_per_step"] == 4 and summary["graph_calls_per_step"] == 1
    assert summary["phase_us"] == {"forward + loss": 5.0, "backward": 7.0, "optimizer": 2.0, "unattributed": 1.0}
    assert summary["host_us"] == {p: 10.0 for p in training.PHASES} and summary["gpu_span_us"] == 31.0
    assert summary["category_us"]["matmul (library)"] == 5.0 and summary["category_us"]["optimizer"] == 2.0
    assert sum(summary["category_us"].values()) == 15.0


def test_profile_train_steps_on_cpu_reports_phases_and_categories():
    from utils import llm

    result = training.profile_train_steps(tiny_gpt(), tokens(), steps=2)
    assert result["kernels_per_step"] is None and result["phase_us"] is None  # no GPU: no kernels
    assert set(result["category_us"]) == set(llm.KERNEL_CATEGORIES + llm.TRAINING_CATEGORIES)
    assert all(result["host_us"][p] > 0 for p in training.PHASES)
    assert result["category_us"]["matmul (library)"] > 0 and result["category_us"]["loss"] > 0
    assert result["graph_calls_per_step"] == 0  # eager: no compiled graph was called


# --- measured in parts: against eager in rounds, the optimizer in rounds, profiles, MFU ------------

def test_spec_peak_by_gpu_name():
    assert training.spec_bf16_flops("NVIDIA H200") == 989e12
    assert training.spec_bf16_flops("NVIDIA H100 80GB HBM3") == 989e12
    assert training.spec_bf16_flops("NVIDIA H100 PCIe") == 756e12  # not the SXM part's
    assert training.spec_bf16_flops("NVIDIA A100-SXM4-80GB") == 312e12
    assert training.spec_bf16_flops("cpu") is None


def test_with_mfu_divides_by_the_measured_rate_and_the_spec_peak():
    rows = [{"status": "ok", "median_ms": 100.0}, {"status": "failed", "reason": "x"}]
    out = training.with_mfu(rows, step_flops=50e12, matmul_rate=1000e12, spec_peak=500e12)
    assert out[0]["mfu"] == pytest.approx(0.5) and out[0]["mfu_spec"] == pytest.approx(1.0)
    assert out[1] == rows[1]
    assert training.with_mfu(rows[:1], 50e12, 1000e12)[0]["mfu_spec"] is None


def test_against_eager_times_a_compiled_step_in_rounds():
    torch.manual_seed(0)
    inputs = tokens()


    def compiled_model():
        model = tiny_gpt()
        model.compile()
        return model

    rows = training.against_eager(tiny_gpt, {"default": (compiled_model, None)}, inputs, min_run_time=0.05)
    eager, default = rows
    assert eager["variant"] == "eager" and default["variant"] == "default" and default["status"] == "ok"
    assert default["speedup_lo"] <= default["speedup"] <= default["speedup_hi"] and default["rounds"] >= 5
    assert default["graphs"] >= 1 and default["compile_s"] > 0
    assert default["max_abs_err"] < 1e-3  # the first step's loss, same weights


def test_optimizer_rounds_compares_variants_in_the_same_rounds(monkeypatch):
    model = tiny_gpt()
    rows = training.optimizer_rounds(model, rounds=3, min_run_time=0.05)
    assert [r["variant"] for r in rows] == list(training.OPTIMIZER_VARIANTS)
    first = rows[0]
    assert first["speedup"] == first["speedup_lo"] == first["speedup_hi"] == 1.0  # against itself
    compiled = rows[-1]
    assert compiled["status"] == "ok" and compiled["compile_s"] > 0 and compiled["median_ms"] > 0
    assert compiled["speedup_lo"] <= compiled["speedup"] <= compiled["speedup_hi"]
    # a variant that cannot be built is a failed row with its reason, and the others are still timed
    monkeypatch.setitem(training.OPTIMIZER_VARIANTS, "fused=True", {"no_such_argument": True})
    rows = training.optimizer_rounds(model, rounds=3, min_run_time=0.05)
    by = {r["variant"]: r for r in rows}
    assert by["fused=True"]["status"] == "failed" and "no_such_argument" in by["fused=True"]["reason"]
    assert by["compiled"]["status"] == "ok" and by["eager foreach"]["speedup"] == 1.0


def test_profile_row_on_cpu_times_and_profiles_the_step():
    row = training.profile_row(tiny_gpt(), tokens(), steps=2, min_run_time=0.05)
    assert row["median_ms"] > 0 and row["kernel_ms"] > 0 and row["gap_ms"] is None  # no GPU, no gap
    assert row["activity"].startswith("CPU") and row["profiled_steps"] == 2
    assert {f"phase_host_ms_{p}" for p in training.PHASES} <= set(row)
    json.dumps(row)  # a part's result must be JSON data


def test_verdict_reads_the_range_of_the_rounds():
    assert training.verdict({"speedup": 1.5, "speedup_lo": 1.2, "speedup_hi": 1.8}) == "faster than"
    assert training.verdict({"speedup": 0.8, "speedup_lo": 0.7, "speedup_hi": 0.9}) == "slower than"
    assert training.verdict({"speedup": 1.1, "speedup_lo": 0.9, "speedup_hi": 1.3}) == "about as fast as"
    assert training.verdict({"speedup": 1.3}) == "faster than"
    assert training.verdict(None) == "not measured against"


# --- the chapter: its notebook and its committed run ----------------------------------------------

CHAPTER_2 = REPO / "notebooks" / "02_training.ipynb"


def chapter_presets():
    """The chapter's PRESETS, as its parameters cell defines them (RESNET_50 spread into some)."""
    import ast

    from test_notebooks import code_cells, load

    source = next("".join(c["source"]) for c in code_cells(load(CHAPTER_2)) if "PRESETS = {" in "".join(c["source"]))
    tree = ast.parse(source)
    wanted = [n for n in tree.body if isinstance(n, ast.Assign) and getattr(n.targets[0], "id", None) in
              ("RESNET_50", "PRESETS")]
    namespace = {}
    exec(compile(ast.Module(body=wanted, type_ignores=[]), str(CHAPTER_2), "exec"), namespace)
    return namespace["PRESETS"]


def test_2_has_no_run_window_plumbing():
    from test_notebooks import assert_no_plumbing

    nb = json.loads(CHAPTER_2.read_text())
    code = "".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code")
    prose = "".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "markdown")
    assert 'utils.Run("02_training", PRESET_NAME, P)' in code and "run.part(" in code
    assert_no_plumbing(code + prose)
    for word in ("n/a", "unfinished", "did not run"):  # every part finishes: nothing to say it did not
        assert word not in code + prose


NOT_COMPILED = ("eager", "eager foreach", "fused=True")  # the baselines and the hand-written fused AdamW


def test_2_committed_results_hold_each_variant_against_eager_in_its_rounds():
    from test_diffusion import complete_full_run

    rows = complete_full_run("02_training")
    floors = {r["workload"]: r for r in rows if r["variant"] == "floor"}  # best step's GPU time; GPT FLOPs at peak
    rows = [r for r in rows if r["variant"] != "floor"]
    large = max(chapter_presets()["full"]["resnet_batches"])
    assert set(floors) == {f"resnet batch {large}", "gpt_train"}
    for workload, floor in floors.items():  # below the recipe it bounds
        recipe = next(r for r in rows if r["workload"] == workload and r["variant"] == floor["floor_of"])
        assert 0 < floor["median_ms"] < recipe["median_ms"], workload
    for r in rows:  # every ratio is the median of its rounds, and a compiled variant's first step compiled
        if r["variant"] == "eager" or r.get("speedup") is None:
            continue
        assert r["speedup_lo"] <= r["speedup"] <= r["speedup_hi"], f"{r['workload']}, {r['variant']}: its rounds"
        if r["variant"] not in NOT_COMPILED:
            assert r["compile_s"] > 0, f"{r['workload']}, {r['variant']}: no compile time"
        if r.get("gpu_ms") is not None:
            assert 0 < r["gpu_ms"] < r["median_ms"], f"{r['workload']}, {r['variant']}: GPU time per step"
    full = chapter_presets()["full"]
    by = {}
    for r in rows:
        by.setdefault(r["workload"], {})[r["variant"]] = r
    for batch in full["resnet_batches"]:
        assert set(by[f"resnet batch {batch}"]) == {"eager", "default", "reduce-overhead"}, batch
        assert all(r["batch"] == batch for r in by[f"resnet batch {batch}"].values())
    for batch in full["autotune_batches"]:
        assert set(by[f"resnet batch {batch}, autotune part"]) == {"eager", "max-autotune-no-cudagraphs"}, batch
    for r in by["gpt_train"].values():  # the measured matmul rate is below the data sheet's peak
        assert 0 < r["mfu_spec"] < r["mfu"] < 1
    accumulation = by["gpt_accumulation"]["default"]
    assert accumulation["graphs"] == 1 and accumulation["recompiles"] == 0
    assert accumulation["micro_batches"] == full["micro_batches"]
    assert set(by["optimizer_step"]) == set(training.OPTIMIZER_VARIANTS)
    assert by["optimizer_step"]["compiled"]["compile_s"] > 0 and by["optimizer_step"]["fused=True"]["compile_s"] == 0
    lr = by["lr_schedule"]
    assert lr["tensor lr"]["graphs"] == 1 and lr["float lr"]["graphs"] > lr["tensor lr"]["graphs"]
    assert {True, False} == {r["compiled_autograd"] for w in ("compiled_autograd=True", "compiled_autograd=False")
                             for r in by[w].values()}
    assert by["gpt whole-model"]["whole-model"]["graphs"] >= 1 and by["gpt regional"]["regional"]["graphs"] >= 1
    profiles = by["gpt_regional_profile"]
    assert set(profiles) == {"eager", "whole-model", "regional"}
    for r in profiles.values():
        assert r["activity"] == "CUDA kernels" and r["kernels_per_step"] > 0
        assert 0 < r["kernel_ms"] < r["median_ms"], f"{r['variant']}: its kernels fill less than the step's wall time"
        assert r["kernel_ms"] == pytest.approx(sum(v for k, v in r.items() if k.startswith("kernel_ms_")))
        assert r["gap_ms"] == pytest.approx(r["median_ms"] - r["kernel_ms"])
    assert profiles["regional"]["graph_calls_per_step"] > profiles["whole-model"]["graph_calls_per_step"] > 0
