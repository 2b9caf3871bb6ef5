"""Chapter 3's helpers: a causal LM built from its config, static-cache greedy decoding, the bandwidth roofline.

Works with transformers 5.17 to 5.24 (the forward's cache argument was renamed from `past_key_values` to `cache`).
"""
import inspect
import os
import re
from pathlib import Path

import torch

from .compare import failure_reason as failure  # noqa: F401 (re-exported for chapter 3)
from .compiler import compile_cache, free_compiled, is_oom  # noqa: F401 (re-exported for chapter 3)
from .glue import glue_num  # noqa: F401 (re-exported for chapter 3)
from .kernels import (KERNEL_CATEGORIES, TRAINING_CATEGORIES, gpu_kernels, kernel_category,  # noqa: F401 (re-exported
                      time_by_category)  # for chapters 3 and 2)
from .timing import quantiles, time_fn, time_interleaved

# The Gemma-2B architecture (google/gemma-2b's config.json), for GemmaConfig(**GEMMA_2B).
GEMMA_2B = dict(hidden_size=2048, num_hidden_layers=18, num_attention_heads=8, num_key_value_heads=1,
                head_dim=256, intermediate_size=16384, vocab_size=256000, max_position_embeddings=8192)

# The Llama-3-8B architecture (meta-llama/Meta-Llama-3-8B's config.json), for LlamaConfig(**LLAMA3_8B), and the
# smaller Llama-3.2-1B (its embedding tied to the output layer), for GPUs of 16-24 GB.
LLAMA3_8B = dict(hidden_size=4096, num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                 head_dim=128, intermediate_size=14336, vocab_size=128256, max_position_embeddings=8192)
LLAMA32_1B = dict(hidden_size=2048, num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=8,
                  head_dim=64, intermediate_size=8192, vocab_size=128256, max_position_embeddings=8192,
                  tie_word_embeddings=True)

# NVIDIA's H200 data sheet (https://www.nvidia.com/en-us/data-center/h200/): dense bf16 arithmetic, HBM3e bandwidth.
H200_BF16_FLOPS = 989e12
H200_MEMORY_BYTES_S = 4.8e12


def gemma_config(**sizes):
    """A GemmaConfig from sizes (hidden_size, num_hidden_layers, ...), eager-friendly SDPA attention (chapter 3)."""
    from transformers import GemmaConfig

    config = GemmaConfig(**sizes)
    config._attn_implementation = "sdpa"
    return config


def llama_config(**sizes):
    """A LlamaConfig from sizes (hidden_size, num_hidden_layers, ...), SDPA attention (chapter 3b)."""
    from transformers import LlamaConfig

    config = LlamaConfig(**sizes)
    config._attn_implementation = "sdpa"
    return config


def _quiet_generation_config(model):
    """No end-of-sequence token: every generation runs its full length, whatever random weights say (chapter 3)."""
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = model.config.pad_token_id or 0
    return model


def build_model(config, device, dtype, seed=0):
    """A causal LM of config's class with random weights, built on device in dtype, in eval mode (chapter 3)."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    return _quiet_generation_config(model.to(device=device, dtype=dtype).eval())


def load_model(path, device, dtype):
    """A causal LM from a local checkpoint folder (save_pretrained's layout), never touching the network (chapter 3)."""
    from transformers import AutoModelForCausalLM

    path = Path(path)
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"No checkpoint at {path}: expected a folder written by save_pretrained "
                                "(config.json and *.safetensors).")
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, local_files_only=True)
    return _quiet_generation_config(model.to(device).eval())


def cache_kwarg(model):
    """The forward's name for the KV cache: 'cache' (transformers >= 5.2x) or 'past_key_values' (chapter 3)."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def static_cache(model, max_len):
    """An empty transformers StaticCache of max_len positions, allocated by the first prefill (chapter 3)."""
    from transformers import StaticCache

    return StaticCache(config=model.config, max_cache_len=max_len)


def make_prompt(batch, length, vocab_size, seed=0, device="cpu"):
    """Random prompt token ids of shape (batch, length), the same for a given seed (chapter 3)."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(2, vocab_size, (batch, length), generator=generator).to(device)


def make_prefill(model):
    """prefill(prompt, cache) -> logits at the last position, filling the cache (chapter 3)."""
    key = cache_kwarg(model)

    def prefill(prompt, cache):
        out = model(input_ids=prompt, use_cache=True, logits_to_keep=1, **{key: cache})
        return out.logits[:, -1]
    return prefill


def make_step(model):
    """step(token, cache) -> (next greedy token, logits): one decode step, ready for torch.compile (chapter 3)."""
    key = cache_kwarg(model)

    def step(token, cache):
        out = model(input_ids=token, use_cache=True, **{key: cache})
        logits = out.logits[:, -1]
        return logits.argmax(dim=-1, keepdim=True), logits
    return step


def greedy_decode(prefill, step, prompt, cache, new_tokens):
    """Greedy decoding with a static cache: prefill, then new_tokens - 1 steps, no host sync in the loop (chapter 3)."""
    cache.reset()
    token = prefill(prompt, cache).argmax(dim=-1, keepdim=True)
    tokens = [token]
    for _ in range(new_tokens - 1):
        torch.compiler.cudagraph_mark_step_begin()  # a new CUDA-graph iteration: the last outputs may be reused
        token, _ = step(token, cache)
        token = token.clone()  # the next replay overwrites the graph's output buffer
        tokens.append(token)
    return torch.cat(tokens, dim=1)


def first_step_logits(prefill, step, prompt, cache):
    """Logits of the first decode step after the prompt (a copy), to compare variants numerically (chapter 3)."""
    cache.reset()
    token = prefill(prompt, cache).argmax(dim=-1, keepdim=True)
    torch.compiler.cudagraph_mark_step_begin()
    _, logits = step(token, cache)
    return logits.float().clone()


def forced_step_logits(prefill, step, prompt, cache, tokens):
    """fp32 copies of the logits of decode steps fed `tokens` (batch, n) one at a time after the prompt (chapter 3)."""
    cache.reset()
    prefill(prompt, cache)
    out = []
    for i in range(tokens.shape[1]):  # teacher forcing: every variant sees the same inputs, whatever it predicts
        torch.compiler.cudagraph_mark_step_begin()
        _, logits = step(tokens[:, i:i + 1].clone(), cache)
        out.append(logits.to(torch.float32, copy=True))
    return torch.stack(out)


def logit_errors(logits, reference):
    """Max and mean |logits - reference|, the max relative to max |reference|, share of equal argmaxes (chapter 3)."""
    diff = (logits.float() - reference.float()).abs()
    return {"max_abs_err": diff.max().item(), "mean_abs_err": diff.mean().item(),
            "rel_err": diff.max().item() / reference.abs().max().item(),
            "top1_agree": (logits.argmax(-1) == reference.argmax(-1)).float().mean().item()}


def leading_agreement(tokens, reference):
    """How many leading tokens equal the reference's (batch, n), the fewest over the batch (chapter 3)."""
    return int((tokens == reference).long().cumprod(dim=1).sum(dim=1).min())


class FusedLayer(torch.nn.Module):
    """One decoder layer with a transformers layer's weights, q/k/v and gate/up each fused into one matrix (chapter 3)."""

    def __init__(self, layer, batch, max_len):
        super().__init__()
        attn, mlp = layer.self_attn, layer.mlp
        fuse = lambda *linears: torch.nn.Parameter(torch.cat([m.weight for m in linears]).detach(), requires_grad=False)
        self.wqkv = fuse(attn.q_proj, attn.k_proj, attn.v_proj)  # one matrix-vector product instead of three
        self.w13 = fuse(mlp.gate_proj, mlp.up_proj)                # one instead of two
        self.wo, self.w2 = attn.o_proj.weight, mlp.down_proj.weight
        self.norm1, self.norm2, self.act = layer.input_layernorm, layer.post_attention_layernorm, mlp.act_fn
        self.head_dim, self.scale = attn.head_dim, attn.scaling
        self.n_heads = attn.q_proj.out_features // self.head_dim
        self.n_kv = attn.k_proj.out_features // self.head_dim
        cache = torch.zeros(batch, self.n_kv, max_len, self.head_dim, dtype=self.wqkv.dtype, device=self.wqkv.device)
        self.register_buffer("k_cache", cache, persistent=False)
        self.register_buffer("v_cache", cache.clone(), persistent=False)

    def forward(self, x, cos, sin, pos, mask):
        batch, length, _ = x.shape
        q_size, kv_size = self.n_heads * self.head_dim, self.n_kv * self.head_dim
        q, k, v = torch.nn.functional.linear(self.norm1(x), self.wqkv).split([q_size, kv_size, kv_size], dim=-1)
        q = rotate(q.view(batch, length, self.n_heads, self.head_dim).transpose(1, 2), cos, sin)
        k = rotate(k.view(batch, length, self.n_kv, self.head_dim).transpose(1, 2), cos, sin)
        self.k_cache[:, :, pos] = k  # write this step's keys and values in place: the cache never moves
        self.v_cache[:, :, pos] = v.view(batch, length, self.n_kv, self.head_dim).transpose(1, 2)
        out = torch.nn.functional.scaled_dot_product_attention(q, self.k_cache, self.v_cache, attn_mask=mask,
                                                               scale=self.scale, enable_gqa=True)
        x = x + torch.nn.functional.linear(out.transpose(1, 2).reshape(batch, length, q_size), self.wo)
        gate, up = torch.nn.functional.linear(self.norm2(x), self.w13).chunk(2, dim=-1)
        return x + torch.nn.functional.linear(self.act(gate) * up, self.w2)


def rotate(x, cos, sin):
    """Rotary position embedding of x (batch, heads, positions, head_dim), as transformers' Llama and Gemma do it (chapter 3)."""
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


class FusedDecoder(torch.nn.Module):
    """A Llama/Gemma-style causal LM's forward, written out, on the weights of a transformers model (chapter 3)."""

    def __init__(self, model, batch, max_len):
        super().__init__()
        inner = model.model
        self.embed, self.norm, self.lm_head = inner.embed_tokens, inner.norm, model.lm_head
        self.layers = torch.nn.ModuleList(FusedLayer(layer, batch, max_len) for layer in inner.layers)
        weight = self.lm_head.weight
        positions = torch.arange(max_len, device=weight.device)[None]
        cos, sin = inner.rotary_emb(torch.zeros(1, dtype=weight.dtype, device=weight.device), positions)
        self.register_buffer("cos", cos[0], persistent=False)  # (max_len, head_dim), transformers' own values
        self.register_buffer("sin", sin[0], persistent=False)
        causal = torch.ones(max_len, max_len, dtype=torch.bool, device=weight.device).tril()
        self.register_buffer("causal", causal, persistent=False)

    def forward(self, ids, pos):
        """Logits at the last of the positions `pos` (a tensor) for tokens ids (batch, len(pos))."""
        x = self.embed(ids)
        cos, sin, mask = self.cos[pos], self.sin[pos], self.causal[pos]
        for layer in self.layers:
            x = layer(x, cos, sin, pos, mask)
        return self.lm_head(self.norm(x[:, -1]))


def make_fused_step(decoder):
    """step(token, pos) -> (next greedy token, logits) of a FusedDecoder, ready for torch.compile (chapter 3)."""
    def step(token, pos):
        logits = decoder(token, pos)
        return logits.argmax(dim=-1, keepdim=True), logits
    return step


def fused_greedy_decode(decoder, step, prompt, new_tokens):
    """Greedy decoding with a FusedDecoder: eager prefill, then compiled steps, no host sync in the loop (chapter 3)."""
    length = prompt.shape[1]
    token = decoder(prompt, torch.arange(length, device=prompt.device)).argmax(dim=-1, keepdim=True)
    pos = torch.tensor([length], device=prompt.device)  # lives on the GPU; advanced in place after each step
    tokens = [token]
    for _ in range(new_tokens - 1):
        torch.compiler.cudagraph_mark_step_begin()
        token, _ = step(token, pos)
        token = token.clone()
        pos += 1
        tokens.append(token)
    return torch.cat(tokens, dim=1)


def fused_first_step_logits(decoder, step, prompt):
    """Logits of a FusedDecoder's first decode step after the prompt (a copy), to compare with eager (chapter 3)."""
    length = prompt.shape[1]
    token = decoder(prompt, torch.arange(length, device=prompt.device)).argmax(dim=-1, keepdim=True)
    torch.compiler.cudagraph_mark_step_begin()
    _, logits = step(token, torch.tensor([length], device=prompt.device))
    return logits.float().clone()


def make_forward_last(model):
    """forward(ids, last) -> logits at position(s) `last` (a tensor), no cache: a prefill's work (chapter 3)."""
    def forward(ids, last):
        return model(input_ids=ids, use_cache=False, logits_to_keep=last).logits[:, -1]
    return forward


def pad_to_bucket(ids, buckets, pad_id=0):
    """Right-pad ids to the smallest bucket that holds them; returns (padded ids, last real position) (chapter 3)."""
    # With causal attention no real position attends to the padding after it, so no attention mask is needed.
    length = ids.shape[1]
    fits = [b for b in sorted(buckets) if b >= length]
    if not fits:
        raise ValueError(f"a prompt of {length} tokens is longer than the largest bucket ({max(buckets)}).")
    padded = torch.nn.functional.pad(ids, (0, fits[0] - length), value=pad_id)
    return padded, torch.tensor([length - 1], device=ids.device)


def hf_generate(model, prompt, new_tokens, *, static=False, compiled=False, compile_config=None, **kwargs):
    """transformers' generate, greedy, exactly new_tokens new tokens; eager unless compiled=True (chapter 3)."""
    if compiled and not static:
        raise ValueError("transformers only compiles generate's forward with a static cache: pass static=True.")
    options = dict(max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False,
                   attention_mask=torch.ones_like(prompt), **kwargs)
    if static:
        options["cache_implementation"] = "static"
    if compiled:
        if compile_config is not None:
            options["compile_config"] = compile_config
    else:
        options["disable_compile"] = True
    with torch.no_grad():
        return model.generate(prompt, **options)


def weight_bytes(model):
    """Bytes of the model's parameters and buffers, a tied tensor (embedding = lm_head) counted once (chapter 3)."""
    tensors = list(model.parameters()) + list(model.buffers())  # both skip a tensor met before
    return sum(t.numel() * t.element_size() for t in tensors)


def linear_weight_bytes(model):
    """Bytes of every nn.Linear weight, a tied lm_head included: what a decode step's matmuls read (chapter 3)."""
    return sum(m.weight.numel() * m.weight.element_size() for m in model.modules() if isinstance(m, torch.nn.Linear))


class Int8Linear(torch.nn.Module):
    """nn.Linear with int8 weights and one scale per output row: weight-only quantization, as gpt-fast does it (chapter 3b)."""

    def __init__(self, linear):
        super().__init__()
        weight = linear.weight.detach().float()
        scale = weight.abs().amax(dim=1).clamp(min=1e-12) / 127  # symmetric: the row's largest |w| becomes 127
        self.register_buffer("weight", torch.round(weight / scale[:, None]).to(torch.int8))
        self.register_buffer("scale", scale.to(linear.weight.dtype))
        self.bias = linear.bias

    def forward(self, x):
        out = torch.nn.functional.linear(x, self.weight.to(x.dtype)) * self.scale  # dequantize, multiply, rescale
        return out if self.bias is None else out + self.bias


class Int8KernelLinear(Int8Linear):
    """Int8Linear's weights and scales, multiplied by PyTorch's dedicated int8 kernel, aten._weight_int8pack_mm (chapter 3b)."""

    def forward(self, x):
        # The kernel takes a 2-D input, the int8 weight [N, K] and one scale per row [N] in the input's dtype.
        out = torch.ops.aten._weight_int8pack_mm(x.reshape(-1, x.shape[-1]), self.weight, self.scale.to(x.dtype))
        out = out.reshape(*x.shape[:-1], out.shape[-1])
        return out if self.bias is None else out + self.bias


def int4_group_quantize(weight, group_size):
    """Asymmetric 4-bit groups along each row of weight [N, K]: (q int32 in 0..15, scales_and_zeros [K/g, N, 2]) (chapter 3b).

    The convention of PyTorch's tinygemm kernels (aten/src/ATen/native/cuda/int4mm.cu, and
    _group_quantize_tensor in test/test_linalg.py): w = (q - 8) * scale + zero, with zero = min + 8 * scale.
    """
    rows, cols = weight.shape
    if cols % group_size:
        raise ValueError(f"int4 groups of {group_size} do not divide the {cols} input features of a weight")
    groups = weight.detach().float().reshape(rows, cols // group_size, group_size)
    low, high = groups.amin(dim=-1, keepdim=True), groups.amax(dim=-1, keepdim=True)
    scale = (high - low).clamp(min=1e-6) / 15  # 16 levels from the group's smallest to its largest weight
    q = ((groups - low) / scale).round().clamp(0, 15).to(torch.int32).reshape(rows, cols)
    scales_and_zeros = torch.cat([scale, low + 8 * scale], dim=-1).transpose(0, 1).contiguous()
    return q, scales_and_zeros.to(weight.dtype)


def int4_dequantize(q, scales_and_zeros, group_size):
    """The weight [N, K] that int4 codes and their scales_and_zeros stand for, (q - 8) * scale + zero, in fp32 (chapter 3b)."""
    rows, cols = q.shape
    scale, zero = scales_and_zeros.float().transpose(0, 1).unsqueeze(-1).unbind(dim=-2)  # each [N, K/g, 1]
    groups = (q.float().reshape(rows, cols // group_size, group_size) - 8) * scale + zero
    return groups.reshape(rows, cols)


class Int4Linear(torch.nn.Module):
    """nn.Linear with 4-bit weights in groups along K, multiplied by tinygemm (aten._weight_int4pack_mm) (chapter 3b).

    Packed for the device the weight is on when quantized (CUDA: _convert_weight_to_int4pack; CPU:
    _convert_weight_to_int4pack_for_cpu, a layout of its own): quantize the model where it runs.
    """

    def __init__(self, linear, group_size=128, inner_k_tiles=8):
        super().__init__()
        q, scales_and_zeros = int4_group_quantize(linear.weight, group_size)
        self.group_size, self.out_features = group_size, linear.out_features
        self.on_cuda = linear.weight.device.type == "cuda"
        if self.on_cuda:  # uint8 [N, K/2], the even column in the high nibble; packed into int32 tiles
            packed = torch.ops.aten._convert_weight_to_int4pack(
                (q[:, ::2] << 4 | q[:, 1::2]).to(torch.uint8), inner_k_tiles)
        else:  # int32 [N, K], one code a value; packed into uint8 [N, K/2]
            packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, inner_k_tiles)
        self.register_buffer("weight", packed)
        self.register_buffer("scales_and_zeros", scales_and_zeros)
        self.bias = linear.bias

    def forward(self, x):
        mm = torch.ops.aten._weight_int4pack_mm if self.on_cuda else torch.ops.aten._weight_int4pack_mm_for_cpu
        out = mm(x.reshape(-1, x.shape[-1]), self.weight, self.group_size, self.scales_and_zeros)
        out = out.reshape(*x.shape[:-1], self.out_features)
        return out if self.bias is None else out + self.bias


def quantize_linears(model, make):
    """Replace every nn.Linear of model (in place) by make(linear); returns model (chapter 3b)."""
    for name, child in model.named_children():
        if isinstance(child, torch.nn.Linear):
            setattr(model, name, make(child))
        else:
            quantize_linears(child, make)
    return model


def quantize_int8(model):
    """Replace every nn.Linear of model (in place) by an Int8Linear; returns model (chapter 3b)."""
    return quantize_linears(model, Int8Linear)


def quantize_int8_kernel(model):
    """Replace every nn.Linear of model (in place) by an Int8KernelLinear; returns model (chapter 3b)."""
    return quantize_linears(model, Int8KernelLinear)


def quantize_int4(model, group_size=128):
    """Replace every nn.Linear of model (in place) by an Int4Linear of group_size; returns model (chapter 3b)."""
    return quantize_linears(model, lambda linear: Int4Linear(linear, group_size))


QUANTIZED_LINEARS = (Int8Linear, Int4Linear)  # Int8KernelLinear is an Int8Linear


def matmul_weight_bytes(model):
    """Bytes of the weights a decode step's products read: linear_weight_bytes plus quantized linears' buffers (chapter 3b)."""
    quantized = sum(t.numel() * t.element_size() for m in model.modules() if isinstance(m, QUANTIZED_LINEARS)
                    for t in m.buffers(recurse=False))  # codes, scales (and zeros)
    return linear_weight_bytes(model) + quantized


WEIGHT_ONLY_CALL = re.compile(r"(?:extern_kernels|torch\.ops\.\w+)\.\w*(?:int8pack_mm|int4pack_mm|int4mm)\w*(?:\.default)?\(")


def generated_code_summary(code):
    """How Inductor lowered a graph, from its generated code: Triton kernels, external matmuls, weight-only kernels (chapter 3b)."""
    return {"triton_kernels": code.count("@triton.jit"),
            "extern_matmuls": sum(code.count(f"extern_kernels.{op}(") for op in ("mm", "addmm", "bmm")),
            "weight_only_kernels": len(WEIGHT_ONLY_CALL.findall(code))}  # PyTorch's int8 and int4 kernels, called


def triton_sources(code):
    """Inductor's Triton kernels in its generated code: {kernel name: source from @triton.jit on} (chapter 7)."""
    found = re.findall(r"async_compile\.triton\('(\w+)', '{3}(.*?)'{3}", code, flags=re.S)
    return {name: source[source.find("@triton.jit"):].strip() for name, source in found}


def kernel_times_us(fn, calls=50):
    """Mean GPU microseconds per call of each kernel fn launches, from a torch.profiler trace (chapter 7)."""
    import tempfile

    fn()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as profile:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as folder:
        profile.export_chrome_trace(str(Path(folder) / "trace.json"))
        kernels = gpu_kernels(Path(folder) / "trace.json")
    times = {}
    for name, _, us in kernels:
        times[name] = times.get(name, 0.0) + us / calls
    return times


def kv_cache_bytes(config, batch, length, dtype):
    """Bytes of keys and values for `length` positions of `batch` sequences, over all layers (chapter 3)."""
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    itemsize = torch.empty((), dtype=dtype).element_size()
    return 2 * config.num_hidden_layers * config.num_key_value_heads * head_dim * length * batch * itemsize


def bytes_per_step(model, batch, context, dtype):
    """Bytes a decode step must read at least: every weight once, plus the KV cache at `context` (chapter 3)."""
    return weight_bytes(model) + kv_cache_bytes(model.config, batch, context, dtype)


def roofline_tok_s(bandwidth, bytes_step, batch=1):
    """The memory-bandwidth ceiling on decode tokens/s: batch tokens per step, bytes_step read per step (chapter 3)."""
    return batch * bandwidth / bytes_step


def decode_tok_s(full_ms, prefill_ms, new_tokens, batch=1):
    """Decode tokens/s: batch*(new_tokens-1) step tokens over (whole generation - prefill alone) (chapter 3)."""
    step_ms = full_ms - prefill_ms
    return batch * (new_tokens - 1) / (step_ms / 1e3) if step_ms > 0 else None


def copy_bandwidth(device, megabytes=1024, min_run_time=0.5):
    """Bandwidth of a large device-to-device copy, bytes read + written per second: (B/s, Timing) (chapter 3)."""
    n = megabytes * 2**20 // 4
    src = torch.ones(n, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    timing = time_fn(lambda: dst.copy_(src), min_run_time=min_run_time)
    return 2 * src.nbytes / (timing.median_ms / 1e3), timing


def free_memory(device):
    """Bytes of memory free on device: the GPU's free memory, or the machine's available RAM for 'cpu' (chapter 3)."""
    if str(device).startswith("cuda"):
        return torch.cuda.mem_get_info()[0]
    try:
        with open("/proc/meminfo") as f:
            info = dict(line.split(":", 1) for line in f)
        return int(info["MemAvailable"].split()[0]) * 1024
    except (OSError, KeyError, ValueError):
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def check_fits(model, batch, max_len, free_bytes, dtype=None):
    """Raise a clear MemoryError when a KV cache of batch x max_len (plus logits) exceeds free_bytes (chapter 3)."""
    dtype = dtype or model.dtype
    itemsize = torch.empty((), dtype=dtype).element_size()
    need = kv_cache_bytes(model.config, batch, max_len, dtype) + 2 * batch * model.config.vocab_size * itemsize
    if need > free_bytes:
        raise MemoryError(f"batch {batch} x {max_len} positions needs {need / 1e9:.1f} GB for its KV cache and "
                          f"logits, but only {free_bytes / 1e9:.1f} GB is free: use a smaller batch or shorter "
                          "sequences.")
    return need


def roofline_panel(controls, run, ceiling, label, describe):
    """A run_panel whose Run adds tok/s = run(values) as a bar under its roofline ceiling(values) (chapters 3, 3b)."""
    import matplotlib.pyplot as plt

    from .widgets import run_panel

    rows = []

    def work(v, out):
        tok_s = run(v)
        rows.append({"label": label(v), "tok_s": tok_s, "ceiling": ceiling(v)})
        out.clear_output(wait=True)
        plot_vs_roofline(rows)
        plt.show()
        print(f"{tok_s:,.0f} tok/s = {tok_s / rows[-1]['ceiling']:.2f} of the roofline")

    return run_panel(controls, work, describe)


def decode_panel(run, ceiling, modes, batches, prompt_lens):
    """Dropdowns for mode, batch, prompt length; Run measures decode tok/s and plots it by its roofline (chapter 3)."""
    # run(mode, batch, prompt_len) -> tok/s (or raises); ceiling(batch, prompt_len) -> the roofline's tok/s.
    import ipywidgets as w

    controls = {"mode": w.Dropdown(options=list(modes), value=list(modes)[0], description="mode"),
                "batch": w.Dropdown(options=list(batches), value=list(batches)[0], description="batch"),
                "prompt": w.Dropdown(options=list(prompt_lens), value=list(prompt_lens)[0], description="prompt")}
    return roofline_panel(controls, lambda v: run(v["mode"], v["batch"], v["prompt"]),
                          lambda v: ceiling(v["batch"], v["prompt"]), lambda v: f"{v['mode']}\nb{v['batch']} p{v['prompt']}",
                          lambda v: f"compiling and timing {v['mode']}, batch {v['batch']}, prompt {v['prompt']} ...")


def weights_panel(run, ceilings, weights, recipes):
    """Dropdowns for the copy of the weights and the recipe; Run measures decode tok/s against that copy's roofline (chapter 3b)."""
    # run(weights, recipe) -> tok/s (or raises); ceilings: {weights: the roofline's tok/s}.
    import ipywidgets as w

    controls = {"weights": w.Dropdown(options=list(weights), description="weights"),
                "recipe": w.Dropdown(options=list(recipes), description="recipe")}
    return roofline_panel(controls, lambda v: run(v["weights"], v["recipe"]), lambda v: ceilings[v["weights"]],
                          lambda v: f"{v['weights']}\n{v['recipe']}",
                          lambda v: f"compiling the {v['recipe']} loop on the {v['weights']} weights and timing it ...")


def plot_vs_roofline(rows, ax=None, title="decode tokens/s against the memory-bandwidth roofline"):
    """Bars of tok_s per row, each with its roofline ceiling drawn as a dashed line across it (chapter 3)."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(8, 3.8))
    xs = range(len(rows))
    bars = ax.bar(xs, [r["tok_s"] for r in rows], color="tab:blue")
    for x, row in zip(xs, rows):
        ax.hlines(row["ceiling"], x - 0.4, x + 0.4, colors="tab:red", linestyles="--",
                  label="roofline (bandwidth / bytes per token)" if x == 0 else None)
    for bar, row in zip(bars, rows):
        ax.annotate(f"{row['tok_s'] / row['ceiling']:.0%}", (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                    ha="center", va="bottom", fontsize="small")
    ax.set_xticks(list(xs))
    ax.set_xticklabels([r["label"] for r in rows], rotation=15, ha="right", fontsize="small")
    ax.set_ylabel("tokens / s")
    ax.set_title(title)
    ax.legend(fontsize="small", loc="upper left")
    ax.figure.tight_layout()
    return ax


def reset_counts():
    """Clear Dynamo's and Inductor's counters before a compile whose graphs are counted (chapter 3)."""
    from torch._dynamo.utils import counters

    counters.clear()


def compile_counts():
    """Graphs compiled, graph breaks and CUDA-graph skips since reset_counts() (chapter 3)."""
    from torch._dynamo.utils import counters

    return {"graphs": counters["stats"]["unique_graphs"], "graph_breaks": sum(counters["graph_break"].values()),
            "cudagraph_skips": counters["inductor"]["cudagraph_skips"]}


def decode_rounds(runs, new_tokens, *, rounds=5, min_run_time=1.0, batch=1):
    """Decode tok/s of several run(n) timed in alternating rounds, each as a whole generation and as its prefill (chapter 3).

    runs: {name: run}, run(n) generating n new tokens. For each name: the medians of the whole generation and of
    the prefill alone (n = 1), decode tok/s from them, and the per-round milliseconds of one decode step
    ((whole - prefill) / (new_tokens - 1)), from which round_speedup takes per-round ratios.
    """
    fns = {}
    for name, run in runs.items():
        fns[name] = lambda run=run: run(new_tokens)
        fns[f"{name} (prefill)"] = lambda run=run: run(1)
    timed = time_interleaved(fns, rounds=rounds, min_run_time=min_run_time, warmup=1)
    out = {}
    for name in runs:
        full, pre = timed.median_ms(name), timed.median_ms(f"{name} (prefill)")
        steps = [(f - p) / (new_tokens - 1) for f, p in zip(timed.ms[name], timed.ms[f"{name} (prefill)"])]
        out[name] = {"median_ms": full, "prefill_ms": pre, "tok_s": decode_tok_s(full, pre, new_tokens, batch),
                     "step_ms_rounds": steps}
    return out


def round_speedup(slow_steps, fast_steps):
    """(median, min, max) of the per-round ratios slow / fast; rounds with a step time <= 0 are left out (chapter 3)."""
    ratios = [s / f for s, f in zip(slow_steps, fast_steps) if s > 0 and f > 0]
    if not ratios:
        return None, None, None
    return quantiles(ratios, (0.5,))[0], min(ratios), max(ratios)
