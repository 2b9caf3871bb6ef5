"""Chapter 3's helpers (utils/llm.py): roofline arithmetic, offline loading, greedy decoding against generate."""
import json
import os
from pathlib import Path

import pytest
import torch

from utils import llm

TINY = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=1, head_dim=8,
            intermediate_size=64, vocab_size=128, max_position_embeddings=256)


def gemma_params(c):
    """Gemma's parameter count by hand: tied embedding, per-layer attention, gated MLP and two norms, final norm."""
    h, hd, i = c["hidden_size"], c["head_dim"], c["intermediate_size"]
    heads, kv = c["num_attention_heads"], c["num_key_value_heads"]
    layer = h * heads * hd + 2 * h * kv * hd + heads * hd * h + 3 * h * i + 2 * h
    return c["vocab_size"] * h + c["num_hidden_layers"] * layer + h


@pytest.fixture(scope="module")
def tiny():
    return llm.build_model(llm.gemma_config(**TINY, initializer_range=0.3), "cpu", torch.float32)


def test_gemma_2b_weight_bytes():
    model = llm.build_model(llm.gemma_config(**llm.GEMMA_2B), "meta", torch.bfloat16)
    n = sum(p.numel() for p in model.parameters())
    assert n == gemma_params(llm.GEMMA_2B) == 2_506_172_416  # about 2.5 B
    buffers = sum(b.numel() * b.element_size() for b in model.buffers())
    assert llm.weight_bytes(model) == 2 * n + buffers  # the tied lm_head counted once
    assert 5.0e9 < llm.weight_bytes(model) < 5.1e9


def test_kv_cache_and_roofline_arithmetic():
    config = llm.gemma_config(**llm.GEMMA_2B)
    # 2 (K and V) x 18 layers x 1 KV head x 256 dims x 2 bytes per position and sequence
    assert llm.kv_cache_bytes(config, 1, 1, torch.bfloat16) == 18_432
    assert llm.kv_cache_bytes(config, 4, 100, torch.float32) == 2 * 18 * 256 * 400 * 4
    model = llm.build_model(config, "meta", torch.bfloat16)
    step = llm.bytes_per_step(model, 2, 50, torch.bfloat16)
    assert step == llm.weight_bytes(model) + 2 * 50 * 18_432
    assert llm.roofline_tok_s(4.3e12, 5.0e9) == pytest.approx(860.0)
    assert llm.roofline_tok_s(4.3e12, 5.0e9, batch=8) == pytest.approx(6880.0)
    # 10 new tokens: 9 decode steps in 1000 ms - 100 ms of prefill
    assert llm.decode_tok_s(1000.0, 100.0, 10) == pytest.approx(10.0)
    assert llm.decode_tok_s(1000.0, 100.0, 10, batch=4) == pytest.approx(40.0)
    assert llm.decode_tok_s(100.0, 100.0, 10) is None


def test_save_pretrained_round_trip_offline(tiny, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    tiny.save_pretrained(tmp_path)
    loaded = llm.load_model(tmp_path, "cpu", torch.float32)
    ids = llm.make_prompt(1, 6, TINY["vocab_size"])
    with torch.no_grad():
        assert torch.equal(loaded(ids).logits, tiny(ids).logits)
    assert loaded.generation_config.eos_token_id is None


def test_load_model_missing_folder_says_what_is_expected(tmp_path):
    with pytest.raises(FileNotFoundError, match="save_pretrained"):
        llm.load_model(tmp_path / "nowhere", "cpu", torch.float32)


def test_cache_kwarg_names_a_forward_argument(tiny):
    import inspect

    assert llm.cache_kwarg(tiny) in inspect.signature(tiny.forward).parameters


def test_decode_loop_matches_generate(tiny):
    prompt = llm.make_prompt(2, 7, TINY["vocab_size"], seed=3)
    new = 12
    reference = llm.hf_generate(tiny, prompt, new)[:, 7:]
    assert len(set(reference.flatten().tolist())) > 3, "the random model should not repeat one token"
    assert torch.equal(llm.hf_generate(tiny, prompt, new, static=True), llm.hf_generate(tiny, prompt, new))
    prefill, step = llm.make_prefill(tiny), llm.make_step(tiny)
    cache = llm.static_cache(tiny, 7 + new)
    torch._dynamo.reset()
    compiled = torch.compile(step, fullgraph=True)
    with torch.no_grad():
        assert torch.equal(llm.greedy_decode(prefill, step, prompt, cache, new), reference)
        assert torch.equal(llm.greedy_decode(prefill, compiled, prompt, cache, new), reference)
        assert torch.equal(llm.greedy_decode(prefill, compiled, prompt, cache, new), reference)  # cache reset
        eager_logits = llm.first_step_logits(prefill, step, prompt, cache)
        compiled_logits = llm.first_step_logits(prefill, compiled, prompt, cache)
    assert eager_logits.shape == (2, TINY["vocab_size"])
    torch.testing.assert_close(compiled_logits, eager_logits, atol=1e-4, rtol=1e-4)
    torch._dynamo.reset()


@pytest.mark.parametrize("kv_heads", [1, 2])
def test_fused_decoder_matches_generate(kv_heads):
    config = llm.gemma_config(**{**TINY, "num_key_value_heads": kv_heads}, initializer_range=0.3)
    model = llm.build_model(config, "cpu", torch.float32)
    prompt = llm.make_prompt(2, 7, TINY["vocab_size"], seed=4)
    new = 10
    with torch.no_grad():
        reference = llm.hf_generate(model, prompt, new)[:, 7:]
        decoder = llm.FusedDecoder(model, batch=2, max_len=7 + new)
        step = llm.make_fused_step(decoder)
        assert decoder.layers[0].wqkv.shape[0] == (TINY["num_attention_heads"] + 2 * kv_heads) * TINY["head_dim"]
        assert torch.equal(llm.fused_greedy_decode(decoder, step, prompt, new), reference)
        assert torch.equal(llm.fused_greedy_decode(decoder, step, prompt, new), reference)  # stale cache is masked
        hf_logits = llm.first_step_logits(llm.make_prefill(model), llm.make_step(model), prompt,
                                          llm.static_cache(model, 7 + new))
        fused_logits = llm.fused_first_step_logits(decoder, step, prompt)
    torch.testing.assert_close(fused_logits, hf_logits, atol=1e-4, rtol=1e-4)


def test_compiled_generate_needs_static_cache(tiny):
    with pytest.raises(ValueError, match="static"):
        llm.hf_generate(tiny, llm.make_prompt(1, 4, TINY["vocab_size"]), 2, compiled=True)


def test_too_large_size_gives_clear_error(tiny):
    with pytest.raises(MemoryError, match=r"needs .* GB .* smaller batch"):
        llm.check_fits(tiny, 10**6, 10**6, llm.free_memory("cpu"))
    assert llm.check_fits(tiny, 1, 16, llm.free_memory("cpu")) > 0
    assert llm.is_oom(MemoryError("x")) and llm.is_oom(RuntimeError("CUDA out of memory.")) and not llm.is_oom(
        ValueError("x"))


def test_pad_to_bucket_keeps_last_logits(tiny):
    ids = llm.make_prompt(1, 9, TINY["vocab_size"])
    padded, last = llm.pad_to_bucket(ids, [16, 32, 8])
    assert padded.shape == (1, 16) and last.tolist() == [8] and torch.equal(padded[:, :9], ids)
    forward = llm.make_forward_last(tiny)
    with torch.no_grad():
        torch.testing.assert_close(forward(padded, last), forward(ids, torch.tensor([8])), atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="longer than the largest bucket"):
        llm.pad_to_bucket(llm.make_prompt(1, 40, 10), [16, 32])


def test_copy_bandwidth_is_positive():
    bandwidth, timing = llm.copy_bandwidth("cpu", megabytes=8, min_run_time=0.05)
    assert bandwidth > 1e8 and timing.median_ms > 0


def test_compile_cache_sets_and_restores_folders(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", "/somewhere/else")
    monkeypatch.delenv("TRITON_CACHE_DIR", raising=False)
    with llm.compile_cache(tmp_path / "c") as folder:
        assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(folder) and folder.is_dir()
        assert os.environ["TRITON_CACHE_DIR"] == str(folder / "triton")
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == "/somewhere/else" and "TRITON_CACHE_DIR" not in os.environ


def test_round_speedup_is_the_median_of_per_round_ratios():
    speedup, lo, hi = llm.round_speedup([10.0, 12.0, 9.0, -1.0], [5.0, 4.0, 4.5, 2.0])  # a round <= 0 is left out
    assert (speedup, lo, hi) == (pytest.approx(2.0), pytest.approx(2.0), pytest.approx(3.0))
    assert llm.round_speedup([0.0], [1.0]) == (None, None, None)


def test_decode_rounds_times_each_run_as_generation_and_prefill(tiny):
    prompt = llm.make_prompt(1, 5, TINY["vocab_size"])
    calls = []

    def run(n):
        calls.append(n)
        return llm.hf_generate(tiny, prompt, n)

    timed = llm.decode_rounds({"eager": run}, 4, rounds=3, min_run_time=0.05)
    assert set(calls) == {1, 4}
    row = timed["eager"]
    assert len(row["step_ms_rounds"]) == 3 and row["median_ms"] > 0 and row["prefill_ms"] > 0
    assert row["tok_s"] == llm.decode_tok_s(row["median_ms"], row["prefill_ms"], 4)


def test_compile_counts_count_graphs_and_breaks():
    def f(x):
        x = x + 1
        torch._dynamo.graph_break()
        return x * 2

    torch._dynamo.reset()
    llm.reset_counts()
    torch.compile(f, backend="eager")(torch.ones(3))
    counts = llm.compile_counts()
    assert counts["graphs"] == 2 and counts["graph_breaks"] >= 1
    llm.reset_counts()
    assert llm.compile_counts()["graphs"] == 0
    torch._dynamo.reset()


def test_h200_ridge_point():
    ridge = llm.H200_BF16_FLOPS / llm.H200_MEMORY_BYTES_S  # FLOP per byte
    assert 200 < ridge < 210 and 100 < ridge / 2 < 105  # about a hundred multiply-adds per byte


def test_plot_and_panel_build():
    import matplotlib

    matplotlib.use("Agg")
    ax = llm.plot_vs_roofline([{"label": "a", "tok_s": 50.0, "ceiling": 100.0},
                               {"label": "b", "tok_s": 80.0, "ceiling": 100.0}])
    assert [t.get_text() for t in ax.get_xticklabels()] == ["a", "b"]
    panel = llm.decode_panel(lambda m, b, p: 1.0, lambda b, p: 2.0, {"eager": None}, [1, 2], [8])
    assert len(panel.children) == 3


def test_weights_panel_runs_the_chosen_copy_and_recipe_against_its_own_roofline(capsys):
    import matplotlib

    matplotlib.use("Agg")
    asked = []

    def run(weights, recipe):
        asked.append((weights, recipe))
        return 150.0

    panel = llm.weights_panel(run, {"original": 200.0, "int8": 400.0}, ["original", "int8"], ["CUDA graphs", "tuned"])
    weights, recipe = panel.children[0].children
    button = panel.children[1].children[0]
    weights.value, recipe.value = "int8", "tuned"
    button.click()
    assert asked == [("int8", "tuned")]
    shown = capsys.readouterr().out  # outside a kernel, the panel's output area prints to stdout
    assert "150 tok/s = 0.38 of the roofline" in shown, shown  # against the int8 ceiling, not the original's


def test_forced_step_logits_follow_greedy_decoding(tiny):
    prompt = llm.make_prompt(2, 5, TINY["vocab_size"], seed=5)
    prefill, step = llm.make_prefill(tiny), llm.make_step(tiny)
    cache = llm.static_cache(tiny, 5 + 6)
    with torch.no_grad():
        tokens = llm.greedy_decode(prefill, step, prompt, cache, 6)
        logits = llm.forced_step_logits(prefill, step, prompt, cache, tokens[:, :-1])  # fed its own greedy tokens
        first = llm.first_step_logits(prefill, step, prompt, cache)
    assert logits.shape == (5, 2, TINY["vocab_size"]) and logits.dtype == torch.float32
    assert torch.equal(logits.argmax(-1).t(), tokens[:, 1:])  # each step's argmax is the next greedy token
    torch.testing.assert_close(logits[0], first)
    errors = llm.logit_errors(logits, logits)
    assert errors["max_abs_err"] == 0 and errors["top1_agree"] == 1.0
    shifted = llm.logit_errors(logits + 0.5, logits)
    assert shifted["max_abs_err"] == pytest.approx(0.5) and shifted["mean_abs_err"] == pytest.approx(0.5)
    assert shifted["rel_err"] == pytest.approx(0.5 / logits.abs().max().item())
    assert llm.leading_agreement(tokens, tokens) == 6
    other = tokens.clone()
    other[1, 2] += 1
    assert llm.leading_agreement(other, tokens) == 2


def test_linear_weight_bytes_counts_tied_lm_head():
    c = llm.GEMMA_2B
    model = llm.build_model(llm.gemma_config(**c), "meta", torch.bfloat16)
    h, hd, i, heads, kv = c["hidden_size"], c["head_dim"], c["intermediate_size"], c["num_attention_heads"], \
        c["num_key_value_heads"]
    per_layer = 2 * h * heads * hd + 2 * h * kv * hd + 3 * h * i
    assert llm.linear_weight_bytes(model) == 2 * (c["num_hidden_layers"] * per_layer + c["vocab_size"] * h)
    assert llm.linear_weight_bytes(model) > llm.weight_bytes(model) - 2 * c["vocab_size"] * h  # lm_head counted


def test_kernel_categories_and_trace_parsing(tmp_path):
    import json

    names = {"triton_red_fused__to_copy_mm_mul_sum_3": "matmul (Triton)",
             "triton_per_fused__to_copy_add_embedding_mean_mul_pow_rsqrt_0": "Triton fused",
             "nvjet_hsh_64x8_64x16_2x1_v_bz_splitK_TNT": "matmul (library)",
             "void gemv2T_kernel_val<int, int, __nv_bfloat16, __nv_bfloat16, float, 128, 16, 4, 4>": "matmul (library)",
             "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize64x64x64": "matmul (library)",
             "fmha_cutlassF_bf16_aligned_64x128_rf_sm80(PyTorchMemEffAttention::AttentionKernel)": "attention",
             "void pytorch_flash::flash_fwd_splitkv_kernel<Flash_fwd_kernel_traits>": "attention",
             "triton_red_fused__softmax_bmm_5": "attention",
             "aten::mm": "matmul (library)", "aten::_scaled_dot_product_flash_attention_for_cpu": "attention",
             "## Call CompiledFxGraph fabc123 ##": "Inductor C++", "Memcpy DtoD (Device -> Device)": "other",
             "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>>": "other"}
    for name, category in names.items():
        assert llm.kernel_category(name) == category, name
    trace = {"traceEvents": [
        {"ph": "X", "cat": "kernel", "name": "triton_red_fused_mm_0", "ts": 100.0, "dur": 30.0},
        {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy DtoD (Device -> Device)", "ts": 140, "dur": 2},
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 90, "dur": 50},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaGraphLaunch", "ts": 95, "dur": 5},
        {"ph": "X", "cat": "Kernel", "name": "fmha_cutlassF_bf16", "ts": 150, "dur": 8}]}
    path = tmp_path / "trace.json"
    path.write_text(json.dumps(trace))
    kernels = llm.gpu_kernels(path)
    assert kernels == llm.gpu_kernels(trace) and [k[0] for k in kernels] == [
        "triton_red_fused_mm_0", "Memcpy DtoD (Device -> Device)", "fmha_cutlassF_bf16"]
    totals = llm.time_by_category([(name, dur) for name, _, dur in kernels])
    assert set(totals) == set(llm.KERNEL_CATEGORIES)
    assert totals["matmul (Triton)"] == 30 and totals["other"] == 2 and totals["attention"] == 8
    assert sum(totals.values()) == 40


# --- 3b: weight-only int8 and the Llama shapes -------------------------------------------------------

LLAMA_TINY = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                  intermediate_size=64, vocab_size=128, max_position_embeddings=256)


def test_llama_3_8b_shape_has_eight_billion_parameters():
    model = llm.build_model(llm.llama_config(**llm.LLAMA3_8B), "meta", torch.bfloat16)
    assert sum(p.numel() for p in model.parameters()) == 8_030_261_248  # Meta-Llama-3-8B's count
    embedding = llm.LLAMA3_8B["vocab_size"] * llm.LLAMA3_8B["hidden_size"]
    norms = (2 * llm.LLAMA3_8B["num_hidden_layers"] + 1) * llm.LLAMA3_8B["hidden_size"]
    assert llm.matmul_weight_bytes(model) == 2 * (8_030_261_248 - embedding - norms)  # untied: the table is not read
    tied = llm.build_model(llm.llama_config(**llm.LLAMA32_1B), "meta", torch.bfloat16)
    assert tied.lm_head.weight is tied.model.embed_tokens.weight


def test_int8_linear_is_close_to_the_linear_it_replaces():
    torch.manual_seed(0)
    linear = torch.nn.Linear(64, 48, bias=True)
    quantized = llm.Int8Linear(linear)
    assert quantized.weight.dtype == torch.int8 and quantized.scale.shape == (48,)
    assert quantized.weight.abs().amax(dim=1).eq(127).all()  # every row uses the full range
    x = torch.randn(5, 64)
    error = (quantized(x) - linear(x)).abs().max() / linear(x).abs().max()
    assert 0 < error < 0.02


def test_quantize_int8_replaces_every_linear_and_halves_the_bytes():
    model = llm.build_model(llm.llama_config(**LLAMA_TINY, initializer_range=0.3), "cpu", torch.bfloat16)
    original = llm.matmul_weight_bytes(model)
    llm.quantize_int8(model)
    assert not any(isinstance(m, torch.nn.Linear) for m in model.modules())
    assert sum(isinstance(m, llm.Int8Linear) for m in model.modules()) == 7 * LLAMA_TINY["num_hidden_layers"] + 1
    rows = sum(m.weight.shape[0] for m in model.modules() if isinstance(m, llm.Int8Linear))
    assert llm.matmul_weight_bytes(model) == original // 2 + 2 * rows  # one byte a weight, a bf16 scale a row


def test_int8_kernel_linear_is_the_int8_product_through_aten():
    torch.manual_seed(0)
    linear = torch.nn.Linear(64, 48, bias=True)
    quantized = llm.Int8KernelLinear(linear)
    assert torch.equal(quantized.weight, llm.Int8Linear(linear).weight)  # the same int8 codes and scales
    x = torch.randn(2, 5, 64)  # a 3-D input, as the decoder gives it: the kernel itself takes 2-D
    reference = torch.nn.functional.linear(x, quantized.weight.float() * quantized.scale[:, None], linear.bias)
    out = quantized(x)
    assert out.shape == (2, 5, 48)
    # fp32 both ways, only the order of a 64-term sum differs: far below the int8 rounding (about 1e-2 of the range)
    assert (out - reference).abs().max() <= 1e-5 * reference.abs().max()


def test_int4_group_quantize_rounds_each_group_to_the_nearest_of_sixteen_levels():
    torch.manual_seed(0)
    weight = torch.randn(48, 256)
    q, scales_and_zeros = llm.int4_group_quantize(weight, 64)
    assert q.dtype == torch.int32 and q.min() >= 0 and q.max() <= 15 and scales_and_zeros.shape == (4, 48, 2)
    dequantized = llm.int4_dequantize(q, scales_and_zeros, 64)
    groups, steps = weight.reshape(48, 4, 64), scales_and_zeros[..., 0].T[..., None]
    error = (dequantized.reshape(48, 4, 64) - groups).abs()
    assert (error <= steps / 2 + 1e-6).all()  # the nearest level: never more than half a step away
    assert torch.allclose(dequantized.reshape(48, 4, 64).amin(-1), groups.amin(-1), atol=1e-6)  # q = 0 is the minimum
    assert torch.allclose(dequantized.reshape(48, 4, 64).amax(-1), groups.amax(-1), atol=1e-5)  # q = 15 the maximum
    with pytest.raises(ValueError, match="do not divide"):
        llm.int4_group_quantize(torch.randn(16, 96), 64)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_int4_linear_computes_the_product_of_its_dequantized_weights(dtype):
    torch.manual_seed(0)
    linear = torch.nn.Linear(256, 48, bias=True).to(dtype)
    quantized = llm.Int4Linear(linear, group_size=64)  # on a CPU: _convert_weight_to_int4pack_for_cpu
    assert quantized.weight.nbytes == 48 * 256 // 2  # half a byte a weight
    x = torch.randn(1, 3, 256, dtype=dtype)
    out = quantized(x)
    q, scales_and_zeros = llm.int4_group_quantize(linear.weight, 64)
    dequantized = llm.int4_dequantize(q, scales_and_zeros, 64)
    reference = torch.nn.functional.linear(x.float(), dequantized, linear.bias.float())
    assert out.shape == (1, 3, 48) and out.dtype == dtype
    # fp32: the kernel dequantizes exactly as int4_dequantize and only a 256-term sum's order differs (1e-5);
    # bf16: the output is rounded to 8 bits of mantissa (2**-9 relative) after an fp32 sum (1e-2 leaves room for both).
    # A wrong nibble order or zero point is off by whole quantization steps, about 1e-1 of the range.
    tolerance = 1e-5 if dtype == torch.float32 else 1e-2
    assert (out.float() - reference).abs().max() <= tolerance * reference.abs().max()
    error = (out.float() - linear(x).float()).abs().max() / linear(x).float().abs().max()
    assert 0 < error < 0.15  # 16 levels a group: close to the original weights, not equal


def test_quantize_int4_and_int8_kernel_replace_every_linear_at_about_half_the_int8_bytes():
    sizes = dict(LLAMA_TINY, hidden_size=256, head_dim=64, intermediate_size=512)  # room for groups of 128
    build = lambda: llm.build_model(llm.llama_config(**sizes, initializer_range=0.3), "cpu", torch.bfloat16)
    linears = 7 * sizes["num_hidden_layers"] + 1
    shapes = [m.weight.shape for m in build().modules() if isinstance(m, torch.nn.Linear)]
    int8, kernel, int4 = llm.quantize_int8(build()), llm.quantize_int8_kernel(build()), llm.quantize_int4(build(), 128)
    for model, cls in ((int8, llm.Int8Linear), (kernel, llm.Int8KernelLinear), (int4, llm.Int4Linear)):
        assert not any(isinstance(m, torch.nn.Linear) for m in model.modules())
        assert sum(type(m) is cls for m in model.modules()) == linears
    assert llm.matmul_weight_bytes(kernel) == llm.matmul_weight_bytes(int8)
    # half a byte a weight, plus a bf16 scale and zero for every 128 weights of a row
    assert llm.matmul_weight_bytes(int4) == sum(n * k // 2 + 2 * 2 * n * k // 128 for n, k in shapes)
    assert 0.5 < llm.matmul_weight_bytes(int4) / llm.matmul_weight_bytes(int8) < 0.55


@pytest.mark.parametrize("quantize", ["quantize_int8", "quantize_int8_kernel", "quantize_int4"])
def test_quantized_models_decode_with_the_compiled_loop(quantize):
    model = llm.build_model(llm.llama_config(**LLAMA_TINY, initializer_range=0.3), "cpu", torch.float32)
    reference_model = llm.build_model(llm.llama_config(**LLAMA_TINY, initializer_range=0.3), "cpu", torch.float32)
    make = getattr(llm, quantize)
    quantized = make(model, 32) if quantize == "quantize_int4" else make(model)
    prompt = llm.make_prompt(1, 6, LLAMA_TINY["vocab_size"], seed=2)
    with torch.no_grad():
        eager = llm.greedy_decode(llm.make_prefill(quantized), llm.make_step(quantized), prompt,
                                  llm.static_cache(quantized, 16), 8)
        step = torch.compile(llm.make_step(quantized), fullgraph=True, backend="aot_eager")
        compiled = llm.greedy_decode(llm.make_prefill(quantized), step, prompt, llm.static_cache(quantized, 16), 8)
        reference = llm.hf_generate(reference_model, prompt, 8)[:, 6:]
    assert torch.equal(compiled, eager)
    assert llm.leading_agreement(eager, reference) >= 1  # starts where the original weights do
    torch._dynamo.reset()


def test_fused_decoder_matches_generate_on_llama():
    model = llm.build_model(llm.llama_config(**LLAMA_TINY, initializer_range=0.3), "cpu", torch.float32)
    prompt = llm.make_prompt(1, 5, LLAMA_TINY["vocab_size"], seed=1)
    with torch.no_grad():
        reference = llm.hf_generate(model, prompt, 8)[:, 5:]
        decoder = llm.FusedDecoder(model, batch=1, max_len=13)
        assert torch.equal(llm.fused_greedy_decode(decoder, llm.make_fused_step(decoder), prompt, 8), reference)


def test_generated_code_summary_counts_kernels_and_external_matmuls():
    code = ("@triton.jit\ndef triton_poi_fused__to_copy_0(...):\n    ...\n"
            "@triton.jit\ndef triton_red_fused_mul_sum_1(...):\n    ...\n"
            "        extern_kernels.mm(buf0, reinterpret_tensor(arg1_1, (64, 48)), out=buf1)\n"
            "        extern_kernels.addmm(arg2_1, buf1, arg3_1, alpha=1, beta=1, out=buf2)\n"
            "        buf3 = extern_kernels._weight_int8pack_mm(arg0_1, arg1_1, arg2_1)\n"
            "        buf4 = torch.ops.aten._weight_int4pack_mm.default(buf3, arg4_1, 128, arg5_1)\n"
            "        buf5 = torch.ops.quantized.int4mm_packed_weight_cpu.default(buf4, arg6_1, constant0, arg7_1)\n"
            "        assert_tensor_metadata(buf5, (1, 256), (256, 1), torch.float32, "
            "'torch.ops.aten._weight_int4pack_mm_for_cpu.default')\n")
    assert llm.generated_code_summary(code) == {"triton_kernels": 2, "extern_matmuls": 2, "weight_only_kernels": 3}
    assert llm.generated_code_summary("") == {"triton_kernels": 0, "extern_matmuls": 0, "weight_only_kernels": 0}


CHAPTER_3B = Path(__file__).resolve().parents[1] / "notebooks" / "03b_quantized_decode.ipynb"


def test_3b_has_no_run_window_plumbing():
    from test_notebooks import assert_no_plumbing

    code = "".join("".join(c["source"]) for c in json.loads(CHAPTER_3B.read_text())["cells"] if c["cell_type"] == "code")
    assert 'utils.Run("03b_quantized_decode", PRESET_NAME, P)' in code and "run.part(" in code
    assert_no_plumbing(code)


def test_3b_committed_results_hold_every_recipe_against_its_baseline_in_the_same_rounds():
    from test_diffusion import complete_full_run

    rows = complete_full_run("03b_quantized_decode")
    decode = {r["variant"]: r for r in rows if r["workload"] == "decode_b1"}
    weights = {r["weights"] for r in decode.values()}
    assert weights == {"original", "int8", "int8 kernel", "int4"}, "a decode row for each copy of the weights"
    for r in decode.values():
        if r["variant"] == "floor":
            continue
        key = "speedup" if r["weights"] == "original" else "speedup_vs_original"
        assert r[f"{key}_lo"] <= r[key] <= r[f"{key}_hi"], f"{r['variant']}: its ratio lies in its rounds' range"
        assert 0 < r["roofline_frac"] <= 1.05 and r["compile_s"] > 0
    assert decode["floor"]["best_variant"] in decode and decode["floor"]["floor_frac"] == max(
        r["roofline_frac"] for r in decode.values() if r["weights"] == "original" and r["variant"] != "floor")
    products = {r["variant"]: r for r in rows if r["workload"] == "product"}
    assert products["int8, not tuned"]["extern_matmuls"] >= 1 and products["int8, tuned"]["extern_matmuls"] == 0
    for variant in ("int8 kernel", "int4 tinygemm"):  # the product PyTorch's kernel computes, not Inductor
        assert products[variant]["weight_only_kernels"] >= 1 and products[variant]["triton_kernels"] == 0
    errors = {r["weights"] for r in rows if r["workload"] == "quantization_error"}
    assert errors == {"int8", "int8 kernel", "int4"}
