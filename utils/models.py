"""Small models the chapters compile, built from sizes alone (random weights)."""
import torch
import torch.nn.functional as F
from torch import nn


class Block(nn.Module):
    """A GPT-style transformer block: pre-norm causal attention and an MLP (chapter 1)."""

    def __init__(self, d_model, n_heads):
        super().__init__()
        self.n_heads = n_heads
        self.ln1 = nn.LayerNorm(d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.ln2 = nn.LayerNorm(d_model)
        self.fc1 = nn.Linear(d_model, 4 * d_model)
        self.fc2 = nn.Linear(4 * d_model, d_model)

    def forward(self, x):
        batch, seq, d_model = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d_model, dim=2)
        q, k, v = (t.view(batch, seq, self.n_heads, -1).transpose(1, 2) for t in (q, k, v))
        attn = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(attn.transpose(1, 2).reshape(batch, seq, d_model))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x)), approximate="tanh"))


class BlockStack(nn.Module):
    """n_layers GPT blocks and a final LayerNorm, on embeddings of shape (batch, seq, d_model) (chapter 1)."""

    def __init__(self, n_layers, d_model, n_heads):
        super().__init__()
        self.blocks = nn.ModuleList(Block(d_model, n_heads) for _ in range(n_layers))
        self.ln_f = nn.LayerNorm(d_model)

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return self.ln_f(x)


class GPT(nn.Module):
    """A GPT-style decoder: token and position embeddings, Blocks, final LayerNorm, tied LM head (chapter 2)."""

    def __init__(self, vocab, seq_len, n_layers, d_model, n_heads):
        super().__init__()
        self.tok = nn.Embedding(vocab, d_model)
        self.pos = nn.Embedding(seq_len, d_model)
        self.blocks = nn.ModuleList(Block(d_model, n_heads) for _ in range(n_layers))
        self.ln_f = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab, bias=False)
        self.head.weight = self.tok.weight  # tied, as in GPT-2
        nn.init.normal_(self.tok.weight, std=0.02)  # GPT-2's scale: the first loss is near log(vocab)
        nn.init.normal_(self.pos.weight, std=0.02)

    def forward(self, tokens):
        x = self.tok(tokens) + self.pos(torch.arange(tokens.shape[1], device=tokens.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


def block_stack(n_layers, d_model, n_heads, device, dtype):
    """A BlockStack in inference mode on device and dtype (chapter 1)."""
    return BlockStack(n_layers, d_model, n_heads).to(device=device, dtype=dtype).eval()


def count_params(model):
    """Number of parameters (chapter 1)."""
    return sum(p.numel() for p in model.parameters())
