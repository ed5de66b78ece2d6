import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """A LLaMA attention block: RMSNorm, q/k/v projections with fewer key/value heads, rotary embedding,
    heads repeated for the queries, causal SDPA, output projection, residual."""

    def __init__(self, dim, heads, kv_heads, seq):
        super().__init__()
        self.heads, self.kv_heads, self.hd = heads, kv_heads, dim // heads
        self.norm = nn.RMSNorm(dim)
        self.wq = nn.Linear(dim, dim, bias=False)
        self.wk = nn.Linear(dim, kv_heads * self.hd, bias=False)
        self.wv = nn.Linear(dim, kv_heads * self.hd, bias=False)
        self.wo = nn.Linear(dim, dim, bias=False)
        inv = 1.0 / (10000 ** (torch.arange(0, self.hd, 2).float() / self.hd))
        freqs = torch.outer(torch.arange(seq).float(), inv)
        emb = torch.cat([freqs, freqs], dim=-1)
        self.register_buffer("cos", emb.cos())
        self.register_buffer("sin", emb.sin())

    def rope(self, t):
        half = t.shape[-1] // 2
        return t * self.cos + torch.cat([-t[..., half:], t[..., :half]], dim=-1) * self.sin

    def forward(self, x):
        b, t, _ = x.shape
        h = self.norm(x)
        q = self.wq(h).view(b, t, self.heads, self.hd).transpose(1, 2)
        k = self.wk(h).view(b, t, self.kv_heads, self.hd).transpose(1, 2)
        v = self.wv(h).view(b, t, self.kv_heads, self.hd).transpose(1, 2)
        q, k = self.rope(q), self.rope(k)
        rep = self.heads // self.kv_heads
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return x + self.wo(y.transpose(1, 2).reshape(b, t, -1))


def get_inputs():
    return [torch.randn(2, 16, 32)]


def get_init_inputs():
    return [32, 4, 2, 16]
