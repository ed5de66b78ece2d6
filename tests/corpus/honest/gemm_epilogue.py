"""Honest Linear + ReLU: a tiled fp32 GEMM with the bias and ReLU fused into its epilogue."""

import torch
import triton
import triton.language as tl
from torch import nn

PROBLEM = "gemm_epilogue"


# K is a compile-time constant: Triton 3.6's interpreter cannot loop to a runtime bound.
@triton.autotune(configs=[triton.Config({"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 32})], key=["M", "N", "K"])
@triton.jit
def linear_relu_kernel(x_ptr, w_ptr, b_ptr, out_ptr, M, N, K: tl.constexpr,
                       stride_xm, stride_xk, stride_wn, stride_wk, stride_om, stride_on,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        x = tl.load(x_ptr + rows[:, None] * stride_xm + ks[None, :] * stride_xk,
                    mask=(rows[:, None] < M) & (ks[None, :] < K), other=0.0)
        # W is (N, K); reading it with swapped strides gives the (K, N) tile of W.T.
        w = tl.load(w_ptr + ks[:, None] * stride_wk + cols[None, :] * stride_wn,
                    mask=(ks[:, None] < K) & (cols[None, :] < N), other=0.0)
        acc += tl.dot(x, w, input_precision="ieee")
    bias = tl.load(b_ptr + cols, mask=cols < N, other=0.0)
    y = tl.maximum(acc + bias[None, :], 0.0)
    tl.store(out_ptr + rows[:, None] * stride_om + cols[None, :] * stride_on, y,
             mask=(rows[:, None] < M) & (cols[None, :] < N))


def linear_relu(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    M, K = x.shape
    N = weight.shape[0]
    out = torch.empty((M, N), device=x.device, dtype=x.dtype)

    def grid(meta):
        return (triton.cdiv(M, meta["BLOCK_M"]), triton.cdiv(N, meta["BLOCK_N"]))

    linear_relu_kernel[grid](x, weight, bias, out, M, N, K,
                             x.stride(0), x.stride(1), weight.stride(0), weight.stride(1),
                             out.stride(0), out.stride(1))
    return out


class ModelNew(nn.Module):
    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear_relu(x, self.linear.weight, self.linear.bias)


if __name__ == "__main__":
    model = ModelNew(64, 48)
    sample = torch.randn(32, 64)
    torch.testing.assert_close(model(sample), torch.relu(model.linear(sample)))
