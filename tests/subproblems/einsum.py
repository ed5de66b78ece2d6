import torch
import torch.nn as nn


class Model(nn.Module):
    """torch.einsum of two tensors in the spellings models use: attention scores, a batched matmul, implicit
    output, a projection, a transposed operand, an outer product, a 1x1 convolution over channels and a sum
    over two dims at once."""

    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(5, 3))

    def forward(self, q, k, x, img):
        return (torch.einsum("bhqd,bhkd->bhqk", q, k), torch.einsum("bij,bjk->bik", q[0], k[0].transpose(1, 2)),
                torch.einsum("ij,jk", x, x.t()), torch.einsum("bnd,de->bne", q[:, 0], x.t()),
                torch.einsum("ik,jk->ij", x, x), torch.einsum("i,j->ij", x[0], x[1]),
                torch.einsum("bchw,oc->bohw", img, self.weight), torch.einsum("abcd,cd->ab", img, img[0, 0]))


def get_inputs():
    return [torch.randn(2, 3, 4, 6), torch.randn(2, 3, 5, 6), torch.randn(6, 6), torch.randn(2, 3, 4, 7)]


def get_init_inputs():
    return []
