"""Chapter 2's helpers (utils/training.py): accumulation, compiled steps equal to eager, MFU, regional compile."""
import logging

import pytest
import torch
from torch._dynamo.testing import CompileCounter, CompileCounterWithBackend

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


def test_time_optimizer_step_reports_times():
    model = tiny_gpt()
    training.fill_grads(model)
    result = training.time_optimizer_step(model.optimizer.step, min_run_time=0.05)
    assert result["p10_ms"] <= result["median_ms"] <= result["p90_ms"]


def test_optimizer_step_row_times_each_variant_and_reports_failures(monkeypatch):
    from functools import partial

    monkeypatch.setattr(torch, "compile", partial(torch.compile, backend="eager"))  # no Inductor in a unit test
    rows = {v: training.optimizer_step_row(tiny_gpt(), v, min_run_time=0.05) for v in training.OPTIMIZER_VARIANTS}
    for variant in ("eager foreach", "compiled"):
        assert rows[variant]["status"] == "ok" and rows[variant]["median_ms"] > 0
    assert rows["eager foreach"]["compile_s"] == 0.0 and rows["compiled"]["compile_s"] > 0
    assert rows["fused=True"]["status"] == "ok" or rows["fused=True"]["status"].startswith("failed: ")
    failed = training.optimizer_step_row(tiny_gpt(), "no such variant", min_run_time=0.05)
    assert failed["status"].startswith("failed: KeyError")


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
    monkeypatch.setattr(training, "add_and_show", lambda rows, new, title: rows.extend(new))
    panel = training.training_panel({"tiny": (tiny_gpt, tokens())}, device="cpu",
                                    modes=["default", "reduce-overhead"], min_run_time=0.05)
    panel.children[0].children[2].click()  # the Run button
    assert [r["variant"] for r in panel.rows] == ["eager", "default"]
    assert all(r["status"] == "ok" and r["workload"] == "tiny" for r in panel.rows)
    assert panel.rows[1]["max_abs_err"] < 1e-3


@pytest.mark.filterwarnings("ignore:dynamo_pgo force disabled")
def test_cold_start_reports_compile_and_step_times():
    model = training.regional_compile(tiny_gpt(), backend="aot_eager")
    result = training.cold_start(model, tokens(), min_run_time=0.05)
    assert result["compile_s"] > 0 and result["p10_ms"] <= result["median_ms"] <= result["p90_ms"]
    assert result["peak_mem_gb"] is None  # no GPU here
