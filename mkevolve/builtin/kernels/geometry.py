"""Output sizes of sliding windows, as PyTorch computes them: one source for the shapes the builders trace and
for the launchers, which compute the same sizes from each call's input shape (module_source copies these
functions into the generated file as `_sliding_windows` and `_transposed_size`)."""

from __future__ import annotations


def sliding_windows(size, kernel, stride, padding, dilation, ceil_mode=False):
    """Where a window of `kernel` taps spaced by `dilation` stops as it slides by `stride` over `size` values
    padded by `padding` at each end: a convolution's or a pool's output size along one dim. With `ceil_mode`
    (pools) a last window that runs past the end counts too, unless it would start in the right padding."""
    room = size + 2 * padding - dilation * (kernel - 1) - 1
    count = (-(-room // stride) if ceil_mode else room // stride) + 1
    if ceil_mode and (count - 1) * stride >= size + padding:
        count -= 1
    return count


def transposed_size(size, kernel, stride, padding, dilation, output_padding):
    """A transposed convolution's output size along one dim: the size whose sliding windows are `size`, the
    smallest such plus `output_padding`."""
    return (size - 1) * stride - 2 * padding + dilation * (kernel - 1) + output_padding + 1
