"""Modules, names and attributes a solution may not reach, wherever they appear: other kernel libraries and
compilers, threads and processes, the reference and the interpreter's internals, and patches of either."""

from __future__ import annotations

from dataclasses import dataclass

from mkevolve.verify.cheating.rules import Rule

# Top-level modules of other kernel libraries; importing one means someone else's kernels run.
KERNEL_LIBRARIES = frozenset({
    "cupy", "cupyx", "apex", "flash_attn", "flash_attn_interface", "xformers", "tilelang",
    "thunderkittens", "pycuda", "numba", "cuda", "nvidia", "cutlass", "nvmath", "cudnn",
    "jax", "jaxlib", "tensorflow", "tvm", "deepspeed", "bitsandbytes", "transformer_engine",
    "liger_kernel", "flashinfer", "vllm", "sgl_kernel", "torchao", "triton_kernels", "mlx",
    "quack", "onnxruntime", "tensorrt", "torch_tensorrt", "sageattention", "fbgemm_gpu",
    "megablocks", "kernels",
})
THREAD_MODULES = frozenset({"threading", "_thread", "concurrent", "multiprocessing", "asyncio",
                            "subprocess"})
REFERENCE_MODULES = frozenset({"gc", "inspect", "importlib", "ctypes", "__main__", "runpy",
                               "builtins", "traceback"})
REFERENCE_MODULE_PARTS = frozenset({"reference", "problem", "problems", "model"})
INPUT_FUNCTIONS = frozenset({"get_inputs", "get_init_inputs", "get_input_configs"})
REFERENCE_IMPORTED_NAMES = INPUT_FUNCTIONS | {"Model"}
REFERENCE_BUILTINS = frozenset({"exec", "eval", "compile", "__import__", "globals",
                                "__builtins__"})
# Attributes that walk to frames, globals or live objects of other code.
REFERENCE_ATTRIBUTES = frozenset({
    "f_back", "f_locals", "f_globals", "f_builtins", "tb_frame", "gi_frame", "cr_frame",
    "ag_frame", "_getframe", "_current_frames", "settrace", "setprofile", "__globals__",
    "__builtins__", "__code__", "__closure__", "__subclasses__", "get_referrers",
    "get_referents", "get_objects", "currentframe",
})


@dataclass(frozen=True)
class _DottedRule:
    """A dotted name (and everything under it) that is rejected wherever it appears."""

    prefix: str
    rule: Rule
    why: str


DOTTED_RULES = (
    _DottedRule("torch.compile", Rule.TORCH_COMPUTE,
                "torch.compile generates the kernels for you; write them in Triton"),
    _DottedRule("torch._dynamo", Rule.TORCH_COMPUTE, "torch._dynamo compiles PyTorch code"),
    _DottedRule("torch._inductor", Rule.TORCH_COMPUTE, "torch._inductor generates kernels"),
    _DottedRule("torch.export", Rule.TORCH_COMPUTE, "torch.export compiles PyTorch code"),
    _DottedRule("torch.jit", Rule.TORCH_COMPUTE, "TorchScript runs PyTorch kernels"),
    _DottedRule("torch.ops", Rule.TORCH_COMPUTE, "torch.ops calls ATen or library kernels directly"),
    _DottedRule("torch._C", Rule.TORCH_COMPUTE, "torch._C calls ATen kernels directly"),
    _DottedRule("torch._ops", Rule.TORCH_COMPUTE, "torch._ops calls ATen kernels directly"),
    _DottedRule("torch._refs", Rule.TORCH_COMPUTE, "torch._refs runs PyTorch reference math"),
    _DottedRule("torch._prims", Rule.TORCH_COMPUTE, "torch._prims runs PyTorch primitives"),
    _DottedRule("torch._decomp", Rule.TORCH_COMPUTE, "torch._decomp runs PyTorch decompositions"),
    _DottedRule("torch.library", Rule.TORCH_COMPUTE, "torch.library registers or calls other kernels"),
    _DottedRule("torch.utils.cpp_extension", Rule.TORCH_COMPUTE,
                "cpp_extension builds CUDA/C++ kernels instead of Triton ones"),
    _DottedRule("triton.ops", Rule.TORCH_COMPUTE, "triton.ops is a library of ready-made kernels"),
    *(_DottedRule(f"torch.cuda.{name}", Rule.TORCH_COMPUTE, "CUDA graphs and runtime-compiled CUDA "
                  "run kernels out of sight of the launch checks")
      for name in ("graph", "graphs", "CUDAGraph", "make_graphed_callables", "jiterator", "cudart")),
    *(_DottedRule(f"operator.{name}", Rule.TORCH_COMPUTE, "it is the `@` operator: a PyTorch matmul")
      for name in ("matmul", "imatmul", "__matmul__", "__imatmul__")),
    _DottedRule("torch.overrides", Rule.TENSOR_SUBCLASS,
                "torch function overrides change what tensor operations do"),
    _DottedRule("torch.utils._python_dispatch", Rule.TENSOR_SUBCLASS,
                "dispatch modes change what tensor operations do"),
    _DottedRule("torch._make_subclass", Rule.TENSOR_SUBCLASS, "it builds a tensor subclass"),
    _DottedRule("torch.multiprocessing", Rule.THREADS, "it runs work in other processes"),
    _DottedRule("os.fork", Rule.THREADS, "it runs work in another process"),
    _DottedRule("os.forkpty", Rule.THREADS, "it runs work in another process"),
    _DottedRule("os.system", Rule.THREADS, "it runs work in another process"),
    _DottedRule("os.popen", Rule.THREADS, "it runs work in another process"),
    _DottedRule("os.posix_spawn", Rule.THREADS, "it runs work in another process"),
    _DottedRule("os.sys", Rule.REFERENCE_ACCESS, "it reaches the interpreter's module table"),
    _DottedRule("sys.modules", Rule.REFERENCE_ACCESS,
                "it reaches every loaded module, the reference problem included"),
    *(_DottedRule(f"os.{name}", Rule.MONKEYPATCH, "the environment configures Triton and the "
                  "verifier; leave it unchanged")
      for name in ("putenv", "unsetenv", "environ.update", "environ.setdefault", "environ.pop",
                   "environ.popitem", "environ.clear", "environ.__setitem__", "environ.__delitem__")),
    _DottedRule("torch.set_float32_matmul_precision", Rule.PRECISION,
                "it lets PyTorch lower fp32 matmul precision"),
    _DottedRule("torch.autocast", Rule.PRECISION, "autocast runs fp32 math in fp16/bf16"),
    _DottedRule("torch.amp", Rule.PRECISION, "autocast runs fp32 math in fp16/bf16"),
    _DottedRule("torch.cuda.amp", Rule.PRECISION, "autocast runs fp32 math in fp16/bf16"),
    _DottedRule("torch.cpu.amp", Rule.PRECISION, "autocast runs fp32 math in fp16/bf16"),
    _DottedRule("triton.language.dot_scaled", Rule.PRECISION,
                "dot_scaled multiplies in fp8/fp4 formats"),
    _DottedRule("contextlib.suppress", Rule.TRY_EXCEPT,
                "suppressing exceptions hides a failing kernel; let errors surface"),
    _DottedRule("unittest.mock", Rule.MONKEYPATCH, "mock patches other modules"),
)
