"""The generated file's `if __name__ == "__main__":` block: check against the reference, time, roofline.

Run as a script, a generated file builds the subproblem's Model and its own ModelNew with the same seeds,
compares their outputs under every input config, and on a GPU times the forward (triton.testing.do_bench)
and places the time on the roofline: the achieved TFLOP/s (kernels that call tl.dot) or GB/s (the others),
and the fraction of the floor max(FLOPs / peak FLOP/s, bytes / peak bytes/s). The work per config is
counted here (work.py) and written into the file, with the peaks of mkevolve/gpu_peaks.py, so that the file
runs anywhere. Without CUDA it still checks, and says the GPU numbers are unknown.
"""

from __future__ import annotations

from enum import Enum

from mkevolve.config import TOLERANCE
from mkevolve.gpu_peaks import PEAKS

from .work import Work


class Metric(Enum):
    """What the self-check reports besides the time: the rate of the resource the kernels are built for.

    `rate` is the generated roofline()'s expression for it: `ms` the median time in milliseconds,
    `flops` and `min_bytes` the config's work."""

    TFLOPS = ("TFLOP/s", "the kernels multiply matrix tiles (tl.dot)",
              'f"{flops / ms / 1e9:.2f} TFLOP/s ({flops / 1e9:.3g} GFLOP)"')
    # a file without tl.dot must not name it, even in a comment (test_kernels_without_tl_dot_report_no_precision)
    GBPS = ("GB/s", "no kernel multiplies matrix tiles: memory sets the pace",
            'f"{min_bytes / ms / 1e6:.1f} GB/s ({min_bytes / 1e6:.3g} MB at least)"')

    def __init__(self, unit: str, why: str, rate: str):
        self.unit, self.why, self.rate = unit, why, rate


def metric_for(uses_dot: bool) -> Metric:
    return Metric.TFLOPS if uses_dot else Metric.GBPS


def main_block(stem: str, work: list[Work], metric: Metric) -> str:
    return f'''if __name__ == "__main__":
    # Check against the subproblem's reference, then time on a GPU and place the time on the roofline
    # (set TRITON_INTERPRET=1 to run the check on a CPU).
    import importlib.util
    import sys
    from pathlib import Path

{_constants(work, metric)}

    def roofline(i, shapes, ms, gpu):
        """Config i's achieved {metric.unit} and its fraction of the roofline floor on `gpu`."""
        if i >= len(WORK) or WORK[i][0] != shapes:
            return "{metric.unit} and roofline fraction unknown: the work was counted for other input shapes"
        _, min_bytes, flops = WORK[i]
        # {metric.unit}: {metric.why}
        rate = {metric.rate}
        peaks = [(peak_flops, peak_bytes) for name, peak_flops, peak_bytes in GPU_PEAKS if name in gpu]
        if not peaks:
            return f"{{rate}}; roofline fraction unknown: no peak rates for {{gpu}} in mkevolve/gpu_peaks.py"
        floor_ms = 1e3 * max(flops / peaks[0][0], min_bytes / peaks[0][1])
        return f"{{rate}}; {{floor_ms / ms:.1%}} of the roofline floor ({{floor_ms:.4f}} ms on {{gpu}})"

    default = Path(__file__).resolve().parent / "../subkernel_problems/{stem}.py"
    reference_path = Path(sys.argv[1]) if len(sys.argv) > 1 else default
    if not reference_path.is_file():  # e.g. a `solve` result, which has no subkernel_problems/ beside it
        sys.exit(f"usage: python {{sys.argv[0]}} PROBLEM.py (the reference; {{reference_path}} does not exist)")
    spec = importlib.util.spec_from_file_location("reference", reference_path)
    reference = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(reference)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    if hasattr(reference, "get_input_configs"):
        configs = reference.get_input_configs()
    else:
        configs = [{{"get_init_inputs": reference.get_init_inputs, "get_inputs": reference.get_inputs}}]
    for i, config in enumerate(configs):
        init = config["get_init_inputs"]()
        torch.manual_seed(0)
        model = reference.Model(*init).to(device)
        torch.manual_seed(0)
        candidate = ModelNew(*init).to(device)
        torch.manual_seed(1)
        inputs = [t.to(device) if isinstance(t, torch.Tensor) else t for t in config["get_inputs"]()]
        with torch.no_grad():
            expected = model(*inputs)
            actual = candidate(*inputs)
        torch.testing.assert_close(actual, expected, atol={TOLERANCE:g}, rtol={TOLERANCE:g})
        print(f"config {{i}}: matches the reference")
        if device.type != "cuda":
            print(f"config {{i}}: GPU time, {metric.unit} and roofline fraction unknown: no CUDA device")
            continue
        with torch.no_grad():
            median, p20, p80 = triton.testing.do_bench(lambda: candidate(*inputs), quantiles=[0.5, 0.2, 0.8])
        print(f"config {{i}}: median {{median:.4f}} ms, p20 {{p20:.4f}} ms, p80 {{p80:.4f}} ms")
        shapes = [tuple(t.shape) for t in inputs if isinstance(t, torch.Tensor)]
        print(f"config {{i}}: {{roofline(i, shapes, median, torch.cuda.get_device_name())}}")'''


def _constants(work: list[Work], metric: Metric) -> str:
    """WORK and GPU_PEAKS, indented into the block."""
    rows = "".join(f"        ({list(w.input_shapes)!r}, {w.min_bytes:_}, {w.flops:_}),\n" for w in work)
    peaks = ", ".join(f'("{p.name}", {p.fp32_flops_per_s / 1e12:g}e12, {p.bytes_per_s / 1e12:g}e12)' for p in PEAKS)
    return f'''    # The least work of one forward per input config, counted by the generator from the traced shapes:
    # (tensor input shapes, bytes with every input and parameter read once and every output written once,
    # FLOPs of the GEMMs, convolutions and attention at 2 per multiply-add; elementwise work not counted).
    WORK = [
{rows}    ]
    # (name in torch.cuda.get_device_name(), FP32 FLOP/s without tensor cores, HBM bytes/s): mkevolve/gpu_peaks.py
    GPU_PEAKS = [{peaks}]'''
