"""Peak rates of the GPUs the project times kernels on, and the roofline floor they put under a workload.

A forward that must move `bytes` through HBM and compute `flops` takes at least
max(flops / peak FLOP/s, bytes / peak bytes/s): its roofline floor. floor / measured time is the fraction
of the roofline a kernel reaches. Kernels here run fp32 with TF32 off, so the FLOP/s is the FP32 rate
without tensor cores. scripts/bench_builtin.py and the self-check of every builtin-generated kernel file
read their peaks from here.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GpuPeaks:
    name: str                    # found in torch.cuda.get_device_name(), e.g. "NVIDIA H200"
    fp32_flops_per_s: float      # FP32 FMAs x 2, tensor cores off
    bytes_per_s: float           # HBM bandwidth

    def floor_s(self, flops: float, min_bytes: float) -> float:
        """Seconds that no implementation can beat: the slower of computing and moving the work."""
        return max(flops / self.fp32_flops_per_s, min_bytes / self.bytes_per_s)


H200 = GpuPeaks("H200", fp32_flops_per_s=67e12, bytes_per_s=4.3e12)

PEAKS: tuple[GpuPeaks, ...] = (H200,)


def peaks_for(device_name: str) -> GpuPeaks | None:
    """The peaks of the GPU named `device_name`; None for a GPU not in PEAKS (its floor is unknown)."""
    return next((p for p in PEAKS if p.name in device_name), None)
