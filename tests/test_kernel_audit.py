"""Tests for mkevolve.verify.kernel_audit: GPU activity accounting and TTIR precision checks."""

import json
from pathlib import Path

import pytest
import torch
import triton
import triton.language as tl
from triton.runtime.jit import JITFunction

from mkevolve.verify import kernel_audit
from mkevolve.verify.cheating.rules import Rule
from mkevolve.verify.kernel_audit import (
    ActivityRecorder,
    DeviceActivity,
    activities_from_profiler_names,
    activity_violations,
    compiled_precision_violations,
    triton_kernel_names,
    ttir_precision_findings,
)

# ---------------------------------------------------------------------------------------------
# Kernel names as the profiler reported them on an H200 (torch 2.11, CUDA 13, triton 3.6)
# ---------------------------------------------------------------------------------------------

FILL = ("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, "
        "std::array<char*, 1ul> >(int, at::native::FillFunctor<float>, std::array<char*, 1ul>)")
STRIDED_COPY = (
    "void at::native::elementwise_kernel<128, 2, at::native::gpu_kernel_impl_nocast<at::native::"
    "direct_copy_kernel_cuda(at::TensorIteratorBase&)::{lambda()#3}::operator()() const::{lambda()#7}"
    "::operator()() const::{lambda(float)#1}>(at::TensorIteratorBase&, at::native::direct_copy_kernel_"
    "cuda(at::TensorIteratorBase&)::{lambda()#3}::operator()() const::{lambda()#7}::operator()() const"
    "::{lambda(float)#1} const&)::{lambda(int)#1}>(int, ...)")
CAST_COPY = (
    "void at::native::unrolled_elementwise_kernel<at::native::direct_copy_kernel_cuda(at::TensorIterator"
    "Base&)::{lambda()#3}::operator()() const::{lambda()#3}::operator()() const::{lambda(int)#1}, "
    "std::array<char*, 2ul>, 4, TrivialOffsetCalculator<1, unsigned int>, TrivialOffsetCalculator<1, "
    "unsigned int>, at::native::memory::LoadWithCast<1>, at::native::memory::StoreWithCast<1> >(int, ...)")
HALF_COPY = ("void at::native::vectorized_elementwise_kernel<8, at::native::float16_copy_kernel_cuda("
             "at::TensorIteratorBase&)::{lambda(float)#1}, std::array<char*, 2ul> >(int, ...)")
ARANGE = ("void (anonymous namespace)::elementwise_kernel_with_index<int, at::native::arange_cuda_out("
          "c10::Scalar const&, c10::Scalar const&, c10::Scalar const&, at::Tensor&)::{lambda()#1}::"
          "operator()() const::{lambda()#4}::operator()() const::{lambda(long)#1}>(int, ...)")
ALLOWED_ATEN = [FILL, STRIDED_COPY, CAST_COPY, HALF_COPY, ARANGE]

CAT = ("void at::native::(anonymous namespace)::CatArrayBatchedCopy_vectorized<at::native::(anonymous "
       "namespace)::OpaqueType<4u>, unsigned int, 1, 128, 1, 16, 4>(char*, ...)")
ADD = ("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>, "
       "std::array<char*, 3ul> >(int, at::native::CUDAFunctor_add<float>, std::array<char*, 3ul>)")
MUL = ("void at::native::vectorized_elementwise_kernel<4, at::native::AUnaryFunctor<float, float, float, "
       "at::native::binary_internal::MulFunctor<float> >, std::array<char*, 2ul> >(int, ...)")
RELU = ("void at::native::vectorized_elementwise_kernel<4, at::native::(anonymous namespace)::launch_"
        "clamp_scalar(at::TensorIteratorBase&, c10::Scalar, c10::Scalar, at::native::detail::ClampLimits)"
        "::{lambda()#1}::operator()() const::{lambda()#7}::operator()() const::{lambda(float)#1}, "
        "std::array<char*, 2ul> >(int, ...)")
EXP = ("void at::native::vectorized_elementwise_kernel<4, at::native::exp_kernel_cuda(at::TensorIterator"
       "Base&)::{lambda()#2}::operator()() const::{lambda()#2}::operator()() const::{lambda(float)#1}, "
       "std::array<char*, 2ul> >(int, ...)")
SUM = ("void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::func_wrapper_t<"
       "float, at::native::sum_functor<float, float, float>::operator()(at::TensorIterator&)::{lambda("
       "float, float)#1}>, unsigned int, float, 4, 4> >(...)")
SOFTMAX = ("void (anonymous namespace)::softmax_warp_forward<float, float, float, 8, false, false>(float*, "
           "float const*, int, int, int, bool const*, int, bool)")
LAYER_NORM = ("void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<float, float, false>("
              "int, float, float const*, float const*, float const*, float*, float*, float*)")
CUMSUM = ("void at::native::tensor_kernel_scan_outer_dim<float, unsigned int, std::plus<float> >(float*, "
          "float const*, unsigned int, unsigned int, unsigned int, float, std::plus<float>)")
ATEN_COMPUTE = [CAT, ADD, MUL, RELU, EXP, SUM, SOFTMAX, LAYER_NORM, CUMSUM]

CUBLAS_FP32 = ("sm80_xmma_gemm_f32f32_f32f32_f32_nn_n_tilesize32x32x8_stage3_warpsize1x2x1_ffma_aligna4_"
               "alignc4_execute_kernel__5x_cublas")
CUBLAS_SPLIT_K = ("sm80_xmma_gemm_f32f32_f32f32_f32_nn_n_tilesize32x32x8_stage3_warpsize1x2x1_ffma_"
                  "aligna4_alignc4_execute_split_k_kernel__5x_cublas")
CUTLASS_TF32 = ("void cutlass::Kernel2<cutlass_80_tensorop_s1688gemm_64x64_32x6_nn_align4>("
                "cutlass_80_tensorop_s1688gemm_64x64_32x6_nn_align4::Params)")
NVJET = "nvjet_sm90_hsh_64x8_64x16_1x2_h_bz_NNT"
CUDNN_CONV = ("sm80_xmma_fprop_implicit_gemm_f32f32_f32f32_f32_nchwkcrs_nchw_tilesize32x32x8_stage3_"
              "warpsize1x2x1_g1_ffma_aligna4_alignc4_execute_kernel__5x_cudnn")
CUDNN_NAMESPACED = "void cudnn::cnn::conv2d_grouped_direct_kernel<false, true, false, float, float>(...)"
LIBRARY = [CUBLAS_FP32, CUBLAS_SPLIT_K, CUTLASS_TF32, NVJET, CUDNN_CONV, CUDNN_NAMESPACED,
           "ampere_sgemm_128x64_nn", "volta_sgemm_64x32_sliced1x4_nn", "turing_fp16_s1688gemm_fp16_"
           "128x128_ldg8_f2f_nn", "cutlass_80_tensorop_s1688gemm_64x64_32x6_nn_align4"]

TRITON_KERNELS = {"add_kernel", "matmul_kernel", "gemm_kernel"}
HTOD = "Memcpy HtoD (Pageable -> Device)"
DTOD = "Memcpy DtoD (Device -> Device)"
DTOH = "Memcpy DtoH (Device -> Pageable)"
DTOH_PINNED = "Memcpy DtoH (Device -> Pinned)"
MEMSET = "Memset (Device)"


def _kernels(*names: str) -> list[DeviceActivity]:
    return [DeviceActivity(name, "kernel") for name in names]


def _rules(violations) -> list[Rule]:
    return [v.rule for v in violations]


# ---------------------------------------------------------------------------------------------
# Naming what ran
# ---------------------------------------------------------------------------------------------

def test_profiler_names_are_classified_by_kind_and_direction():
    names = [HTOD, DTOD, DTOH, DTOH_PINNED, "Memcpy PtoP (Device -> Device)", "Memcpy HtoH (Pinned -> "
             "Pageable)", MEMSET, "add_kernel", FILL, "", "Memcpy Unknown (Unknown -> Unknown)"]
    found = [(a.kind, a.direction) for a in activities_from_profiler_names(names)]
    assert found == [("memcpy", "HtoD"), ("memcpy", "DtoD"), ("memcpy", "DtoH"), ("memcpy", "DtoH"),
                     ("memcpy", "DtoD"), ("memcpy", "HtoH"), ("memset", ""), ("kernel", ""),
                     ("kernel", ""), ("memcpy", "")]


def test_a_triton_kernel_named_memcpy_is_still_a_kernel():
    assert activities_from_profiler_names(["Memcpy", "Memset"])[0].kind == "kernel"
    assert activities_from_profiler_names(["Memset"])[0].kind == "kernel"


def test_own_triton_kernels_and_aten_fill_copy_arange_are_accepted():
    activities = _kernels("add_kernel", "matmul_kernel", *ALLOWED_ATEN)
    activities += activities_from_profiler_names([HTOD, DTOD, MEMSET])
    assert activity_violations(activities, TRITON_KERNELS) == []


@pytest.mark.parametrize("name", ATEN_COMPUTE + LIBRARY)
def test_aten_compute_and_library_kernels_are_rejected(name):
    violations = activity_violations(_kernels("add_kernel", name), TRITON_KERNELS)
    assert _rules(violations) == [Rule.NON_TRITON_KERNEL]
    assert violations[0].message.startswith("forward ran the GPU kernel `")


def test_long_kernel_names_are_shortened_in_messages():
    message = activity_violations(_kernels("add_kernel", RELU), TRITON_KERNELS)[0].message
    quoted = message.split("`")[1]
    assert len(quoted) == kernel_audit.SHOWN_NAME_CHARS and quoted.endswith("...")
    assert RELU.startswith(quoted[:-3])


def test_one_violation_per_distinct_name():
    activities = _kernels("add_kernel", ADD, ADD, SUM, ADD) + activities_from_profiler_names([DTOH, DTOH])
    violations = activity_violations(activities, TRITON_KERNELS)
    assert _rules(violations) == [Rule.NON_TRITON_KERNEL, Rule.NON_TRITON_KERNEL, Rule.HOST_COPY]


@pytest.mark.parametrize("name", [CUBLAS_FP32, NVJET, "cutlass_80_tensorop_s1688gemm_64x64_32x6_nn_align4",
                                  "sm90_xmma_gemm_f32f32_tf32f32_f32_tn_n_tilesize128x128x32",
                                  "ampere_sgemm_128x64_nn", "cudnn_conv_kernel", "my_gemm_cublas"])
def test_a_triton_function_cannot_whitelist_a_library_kernel_by_its_name(name):
    # The candidate names a @triton.jit function after the cuBLAS kernel torch.matmul launches.
    names = triton_kernel_names([f"import triton\n@triton.jit\ndef {name}(x):\n    pass\n"
                                 "@triton.jit\ndef add_kernel(x):\n    pass\n"])
    assert name in names
    violations = activity_violations(_kernels("add_kernel", name), names)
    assert _rules(violations) == [Rule.NON_TRITON_KERNEL]
    assert "named like a GPU library kernel" in violations[0].message


def test_a_library_named_triton_function_is_rejected_even_when_it_did_not_run():
    violations = activity_violations(_kernels("add_kernel"), {"add_kernel", NVJET})
    assert _rules(violations) == [Rule.NON_TRITON_KERNEL] and NVJET in violations[0].message


def test_ordinary_triton_names_are_not_library_names():
    for name in ("gemm_kernel", "matmul_kernel", "sgemm", "fused_conv_relu", "kernel", "_fwd"):
        assert not kernel_audit.is_library_name(name), name


def test_aten_helper_match_is_anchored_on_the_op():
    # A name that merely mentions FillFunctor or a copy further in is some other op.
    assert not kernel_audit.is_aten_helper(SUM + " at::native::FillFunctor<float>")
    assert not kernel_audit.is_aten_helper("at::native::FillFunctor<float>")
    assert not kernel_audit.is_aten_helper("void at::native::vectorized_elementwise_kernel<4, "
                                           "at::native::index_copy_kernel_cuda(at::TensorIteratorBase&)")
    assert all(kernel_audit.is_aten_helper(name) for name in ALLOWED_ATEN)


@pytest.mark.parametrize("name", [DTOH, DTOH_PINNED, "Memcpy AtoH (Array -> Pageable)",
                                  "Memcpy Unknown (Unknown -> Unknown)"])
def test_copies_to_the_host_or_of_unknown_direction_are_host_copies(name):
    violations = activity_violations(_kernels("add_kernel") + activities_from_profiler_names([name]),
                                     TRITON_KERNELS)
    assert _rules(violations) == [Rule.HOST_COPY]
    assert name in violations[0].message


def test_copies_to_the_device_and_memsets_are_allowed():
    names = [HTOD, DTOD, "Memcpy PtoP (Device -> Device)", "Memcpy HtoH (Pinned -> Pageable)", MEMSET]
    activities = _kernels("add_kernel") + activities_from_profiler_names(names)
    assert activity_violations(activities, TRITON_KERNELS) == []


def test_a_forward_without_any_own_triton_kernel_is_no_launch():
    assert _rules(activity_violations(_kernels(FILL), TRITON_KERNELS)) == [Rule.NO_LAUNCH]
    assert _rules(activity_violations([], TRITON_KERNELS)) == [Rule.NO_LAUNCH]
    assert activity_violations([], TRITON_KERNELS, require_launch=False) == []
    assert kernel_audit.accepted_triton_kernels(_kernels("add_kernel", NVJET, ADD),
                                                {"add_kernel", NVJET}) == {"add_kernel"}


# ---------------------------------------------------------------------------------------------
# The report from the candidate process
# ---------------------------------------------------------------------------------------------

def test_device_activity_is_classified_from_its_name_on_the_trusted_side():
    names = [HTOD, DTOH, MEMSET, RELU, "add_kernel"]
    wire = json.loads(json.dumps(names))
    assert [DeviceActivity.from_report(name) for name in wire] == activities_from_profiler_names(names)
    assert DeviceActivity.from_report(DTOH).direction == "DtoH"
    assert DeviceActivity.from_report("k") == DeviceActivity("k", "kernel")


@pytest.mark.parametrize("junk", [
    None, [], 3, {"name": "k", "kind": "kernel"}, ["k"], "", True,
    "x" * (kernel_audit.MAX_NAME_CHARS + 1), "x" * 10_000_000,
])
def test_device_activity_rejects_junk(junk):
    with pytest.raises(ValueError):
        DeviceActivity.from_report(junk)


def test_profiler_names_are_cut_to_what_a_report_may_carry():
    activity = activities_from_profiler_names(["void f<" + "x" * 100_000])[0]
    assert len(activity.name) == kernel_audit.MAX_NAME_CHARS
    assert DeviceActivity.from_report(activity.name) == activity


# ---------------------------------------------------------------------------------------------
# The candidate's kernel names, from its source
# ---------------------------------------------------------------------------------------------

SOURCE = '''
import triton
import triton.language as tl
from triton import jit
from triton import autotune as tune
import triton as tr


@triton.jit
def plain(x_ptr):
    pass


@jit
def imported_jit(x_ptr):
    pass


@triton.autotune(configs=[triton.Config({"BLOCK": 64})], key=["n"])
@triton.jit
def tuned(x_ptr, n, BLOCK: tl.constexpr):
    pass


@tune(configs=[], key=[])
@tr.jit(do_not_specialize=["n"])
def aliased(x_ptr, n):
    pass


def helper(x):
    return x


def factory():
    @triton.jit
    def nested(x_ptr):
        pass
    return nested


called = triton.jit(helper)


class ModelNew:
    def forward(self, x):
        plain[(1,)](x)


if __name__ == "__main__":
    @triton.jit
    def never_run(x_ptr):
        pass
'''


def test_triton_kernel_names_reads_every_jit_function():
    assert triton_kernel_names([SOURCE]) == {"plain", "imported_jit", "tuned", "aliased", "nested",
                                             "helper"}


def test_triton_kernel_names_joins_several_files_and_names_call_forms_after_the_function():
    other = "import triton\nimport kernels\n\nk = triton.jit(kernels.softmax_kernel)\n"
    assert triton_kernel_names([SOURCE, other]) >= {"plain", "softmax_kernel"}
    assert triton_kernel_names(["def f():\n    pass\n"]) == set()


def test_triton_kernel_names_ignores_jit_from_other_packages():
    source = "import numba\n@numba.jit\ndef fast(x):\n    return x\n"
    assert triton_kernel_names([source]) == set()


# ---------------------------------------------------------------------------------------------
# Precision from TTIR: literal samples of what Triton 3.6 and 3.9 print
# ---------------------------------------------------------------------------------------------

def _ttir(dot_line: str, arg_type: str = "f32") -> str:
    return f'''#loc = loc("/tmp/solution.py":6:1)
module {{
  tt.func public @mm(%a_ptr: !tt.ptr<{arg_type}> loc("a_ptr"(#loc)), %c_ptr: !tt.ptr<f32> loc("c_ptr"(#loc))) attributes {{noinline = false}} {{
    %c = arith.constant dense<0.000000e+00> : tensor<32x32xf32> loc(#loc15)
    {dot_line}
    tt.return loc(#loc)
  }} loc(#loc)
}} loc(#loc)
#loc15 = loc("c"(#loc1))
'''


F32 = "tensor<32x32xf32> * tensor<32x32xf32> -> tensor<32x32xf32>"
IEEE = f"%c_12 = tt.dot %a_7, %b_11, %c : {F32} loc(#loc15)"
TF32X3 = f"%c_12 = tt.dot %a_7, %b_11, %c, inputPrecision = tf32x3 : {F32} loc(#loc15)"
TF32 = f"%c_12 = tt.dot %a_7, %b_11, %c, inputPrecision = tf32 : {F32} loc(#loc15)"
BF16X3 = f"%c_12 = tt.dot %a_7, %b_11, %c, inputPrecision = bf16x3 : {F32} loc(#loc15)"
OLD_ALLOW_TF32 = f"%c_12 = tt.dot %a_7, %b_11, %c {{allowTF32 = true, maxNumImpreciseAcc = 0 : i32}} : {F32}"
OLD_NO_TF32 = f"%c_12 = tt.dot %a_7, %b_11, %c {{allowTF32 = false, maxNumImpreciseAcc = 0 : i32}} : {F32}"
FP16 = ("%c_14 = tt.dot %a_8, %b_13, %c : tensor<32x32xf16> * tensor<32x32xf16> -> tensor<32x32xf32> "
        "loc(#loc15)")
BF16 = ("%c_14 = tt.dot %a_8, %b_13, %c : tensor<32x32xbf16> * tensor<32x32xbf16> -> tensor<32x32xf32> "
        "loc(#loc15)")
FP8 = ("%c_14 = tt.dot %a_8, %b_13, %c {maxNumImpreciseAcc = 1073741824 : i32} : tensor<32x32xf8E4M3FN> "
       "* tensor<32x32xf8E4M3FN> -> tensor<32x32xf32> loc(#loc15)")
FP8_E5 = ("%c_14 = tt.dot %a_8, %b_13, %c {maxNumImpreciseAcc = 1073741824 : i32} : tensor<32x32xf8E5M2> "
          "* tensor<32x32xf8E5M2> -> tensor<32x32xf32> loc(#loc15)")
INT8 = "%c_14 = tt.dot %a_8, %b_13, %c : tensor<32x32xi8> * tensor<32x32xi8> -> tensor<32x32xi32>"
BATCHED_IEEE = "%c = tt.dot %a, %b, %acc : tensor<2x32x32xf32> * tensor<2x32x32xf32> -> tensor<2x32x32xf32>"
DOT_SCALED = ("%d = tt.dot_scaled %a scale %sa, %b scale %sb, %c lhs = e4m3 rhs = e4m3 {fastMath = false} "
              ": tensor<128x64xf8E4M3FN>, tensor<128x2xi8> * tensor<64x128xf8E4M3FN>, tensor<128x2xi8> "
              "-> tensor<128x128xf32>")


@pytest.mark.parametrize("line", [IEEE, TF32X3, OLD_NO_TF32, BATCHED_IEEE])
def test_fp32_accurate_dots_pass(line):
    assert ttir_precision_findings(_ttir(line)) == []


@pytest.mark.parametrize("line, expected", [
    (TF32, "input precision tf32"), (BF16X3, "input precision bf16x3"),
    (OLD_ALLOW_TF32, "input precision tf32"),
    (FP16, "f16 operands"), (BF16, "bf16 operands"), (FP8, "f8E4M3FN operands"), (FP8_E5, "f8E5M2 operands"),
    (INT8, "i8 operands"), (DOT_SCALED, "dot_scaled"),
])
def test_lower_precision_dots_are_found(line, expected):
    findings = ttir_precision_findings(_ttir(line))
    assert len(findings) == 1 and expected in findings[0]


def test_non_fp32_problems_only_reject_fp8_and_fp4_products():
    assert ttir_precision_findings(_ttir(TF32), reference_is_fp32=False) == []
    assert ttir_precision_findings(_ttir(FP16, "f16"), reference_is_fp32=False) == []
    assert "f8E4M3FN" in ttir_precision_findings(_ttir(FP8), reference_is_fp32=False)[0]


def test_low_precision_values_outside_dots_are_found_on_fp32_problems():
    truncate = "%h = arith.truncf %x : tensor<128xf32> to tensor<128xf16> loc(#loc3)"
    findings = ttir_precision_findings(_ttir(truncate))
    assert len(findings) == 1 and "handles f16 values" in findings[0]
    assert "handles f16 values" in ttir_precision_findings(_ttir(IEEE, arg_type="f16"))[0]
    assert ttir_precision_findings(_ttir(truncate), reference_is_fp32=False) == []


def test_names_and_locations_that_spell_low_precision_types_are_not_findings():
    line = '%f16 = arith.addf %bf16, %x : tensor<128xf32> loc("f16"(#loc3))'
    text = _ttir(IEEE) + '#loc3 = loc("/tmp/f16 bf16.py":3:4)\n' + line + "\n"
    assert ttir_precision_findings(text) == []


def test_an_unreadable_dot_fails_closed():
    assert "could not be read" in ttir_precision_findings(_ttir("%c = tt.dot %a, %b, %c"))[0]


# ---------------------------------------------------------------------------------------------
# Reading the Triton cache
# ---------------------------------------------------------------------------------------------

def _cache_entry(cache: Path, folder: str, name: str, ttir: str, metadata: dict | None = None) -> Path:
    entry = cache / folder
    entry.mkdir(parents=True)
    (entry / f"{name}.ttir").write_text(ttir)
    (entry / f"{name}.json").write_text(json.dumps(metadata or {"name": name, "ir_override": None}))
    return entry


def test_every_compiled_variant_of_a_launched_kernel_is_checked(tmp_path):
    _cache_entry(tmp_path, "A", "mm", _ttir(IEEE))
    _cache_entry(tmp_path, "B", "mm", _ttir(TF32))   # another autotune config of the same kernel
    _cache_entry(tmp_path, "C", "unused", _ttir(FP16))  # compiled but never launched: not judged
    violations = compiled_precision_violations(tmp_path, {"mm"})
    assert _rules(violations) == [Rule.PRECISION]
    assert violations[0].message.startswith("kernel `mm` runs tl.dot with input precision tf32")


def test_a_launched_kernel_without_compiled_ir_was_not_compiled_by_triton(tmp_path):
    _cache_entry(tmp_path, "A", "mm", _ttir(IEEE))
    violations = compiled_precision_violations(tmp_path, {"mm", "loaded_cubin", "../../etc/passwd"})
    assert _rules(violations) == [Rule.NON_TRITON_KERNEL, Rule.NON_TRITON_KERNEL]
    assert "ran but Triton compiled no kernel of that name" in violations[1].message
    assert compiled_precision_violations(tmp_path / "missing", {"mm"})[0].rule is Rule.NON_TRITON_KERNEL


def test_ir_override_is_rejected(tmp_path):
    _cache_entry(tmp_path, "A", "mm", _ttir(IEEE), {"name": "mm", "ir_override": "/scratch/fast.ptx"})
    violations = compiled_precision_violations(tmp_path, {"mm"})
    assert _rules(violations) == [Rule.NON_TRITON_KERNEL] and "ir_override" in violations[0].message


def test_symlinks_in_the_cache_are_not_followed(tmp_path):
    outside = tmp_path / "outside.ttir"
    outside.write_text(_ttir(IEEE))
    (tmp_path / "cache" / "A").mkdir(parents=True)
    (tmp_path / "cache" / "A" / "mm.ttir").symlink_to(outside)
    (tmp_path / "cache" / "B").symlink_to(tmp_path / "cache" / "A")
    violations = compiled_precision_violations(tmp_path / "cache", {"mm"})
    assert _rules(violations) == [Rule.NON_TRITON_KERNEL]


def test_oversized_ir_fails_closed(tmp_path, monkeypatch):
    monkeypatch.setattr(kernel_audit, "MAX_IR_BYTES", 1000)
    _cache_entry(tmp_path, "A", "mm", _ttir(IEEE) + "// padding\n" * 200)
    violations = compiled_precision_violations(tmp_path, {"mm"})
    assert _rules(violations) == [Rule.PRECISION] and "could not be checked" in violations[0].message


def test_too_many_compiled_variants_fail_closed(tmp_path, monkeypatch):
    monkeypatch.setattr(kernel_audit, "MAX_IR_FILES", 3)
    for index in range(5):
        _cache_entry(tmp_path, f"H{index}", "mm", _ttir(IEEE))
    violations = compiled_precision_violations(tmp_path, {"mm"})
    assert _rules(violations) == [Rule.PRECISION] and "could not be checked" in violations[0].message


def test_long_kernel_names_use_tritons_truncated_file_names(tmp_path):
    name = "k" * 200
    _cache_entry(tmp_path, "A", name[:kernel_audit.TRITON_FILE_NAME_CHARS], _ttir(TF32))
    violations = compiled_precision_violations(tmp_path, {name})
    assert _rules(violations) == [Rule.PRECISION]


# ---------------------------------------------------------------------------------------------
# Precision from TTIR that this Triton compiles on CPU (no GPU needed up to the cubin)
# ---------------------------------------------------------------------------------------------
# Plain functions, made JITFunctions at test time: on CPU the test set-up turns on the Triton
# interpreter, under which @triton.jit would not give a compilable function.

def dot_kernel(a_ptr, b_ptr, c_ptr, BLOCK: tl.constexpr, PREC: tl.constexpr, DT: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    a = tl.load(a_ptr + offs[:, None] * BLOCK + offs[None, :]).to(DT)
    b = tl.load(b_ptr + offs[:, None] * BLOCK + offs[None, :]).to(DT)
    c = tl.dot(a, b, input_precision=PREC)
    tl.store(c_ptr + offs[:, None] * BLOCK + offs[None, :], c)


def allow_tf32_kernel(a_ptr, b_ptr, c_ptr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    a = tl.load(a_ptr + offs[:, None] * BLOCK + offs[None, :])
    b = tl.load(b_ptr + offs[:, None] * BLOCK + offs[None, :])
    c = tl.dot(a, b, allow_tf32=False)
    tl.store(c_ptr + offs[:, None] * BLOCK + offs[None, :], c)


def hidden_dot_kernel(a_ptr, b_ptr, c_ptr, BLOCK: tl.constexpr):
    # What the IR check exists for: nothing here names fp16 or tf32 for a source reader.
    offs = tl.arange(0, BLOCK)
    a = tl.load(a_ptr + offs[:, None] * BLOCK + offs[None, :]).to(tl.dtype("fp" + "16"))
    b = tl.load(b_ptr + offs[:, None] * BLOCK + offs[None, :]).to(tl.dtype("fp" + "16"))
    tl.store(c_ptr + offs[:, None] * BLOCK + offs[None, :], tl.core.dot(a, b))


def default_dot_kernel(a_ptr, b_ptr, c_ptr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    a = tl.load(a_ptr + offs[:, None] * BLOCK + offs[None, :])
    b = tl.load(b_ptr + offs[:, None] * BLOCK + offs[None, :])
    tl.store(c_ptr + offs[:, None] * BLOCK + offs[None, :], tl.core.dot(a, b))


def _compile(fn, **constexprs) -> None:
    """Compile for sm_90 into TRITON_CACHE_DIR, as a launch would; skip when this Triton cannot."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    signature = {"a_ptr": "*fp32", "b_ptr": "*fp32", "c_ptr": "*fp32", "BLOCK": "constexpr",
                 **{name: "constexpr" for name in constexprs}}
    source = ASTSource(fn=JITFunction(fn), signature=signature, constexprs={"BLOCK": 32, **constexprs})
    try:
        triton.compile(source, target=GPUTarget("cuda", 90, 32))
    except Exception as error:  # noqa: BLE001 - any failure means this build cannot compile offline
        pytest.skip(f"this Triton cannot compile for sm_90 without a GPU: {type(error).__name__}: {error}")


@pytest.fixture
def triton_cache(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("TRITON_DEFAULT_FP_FUSION", "1")  # quiets Triton 3.9's warning only
    return tmp_path


@pytest.mark.parametrize("precision, dtype, expected", [
    ("ieee", tl.float32, None), ("tf32x3", tl.float32, None), ("tf32", tl.float32, "input precision tf32"),
    ("ieee", tl.float16, "f16 operands"), ("ieee", tl.bfloat16, "bf16 operands"),
    ("ieee", tl.float8e4nv, "f8E4M3FN operands"), ("ieee", tl.float8e5, "f8E5M2 operands"),
])
def test_real_ttir_dot_precision(triton_cache, precision, dtype, expected):
    _compile(dot_kernel, PREC=precision, DT=dtype)
    assert list(triton_cache.glob("*/dot_kernel.ttir")), "Triton wrote no TTIR where expected"
    violations = compiled_precision_violations(triton_cache, {"dot_kernel"})
    if expected is None:
        assert violations == []
    else:
        assert _rules(violations) == [Rule.PRECISION] and expected in violations[0].message


def test_real_ttir_allow_tf32_false_is_ieee(triton_cache):
    _compile(allow_tf32_kernel)
    assert compiled_precision_violations(triton_cache, {"allow_tf32_kernel"}) == []


def test_real_ttir_catches_what_the_source_hides(triton_cache):
    _compile(hidden_dot_kernel)
    _compile(default_dot_kernel)
    violations = compiled_precision_violations(triton_cache, {"hidden_dot_kernel", "default_dot_kernel"})
    messages = sorted(v.message for v in violations)
    assert _rules(violations) == [Rule.PRECISION, Rule.PRECISION]
    assert "default_dot_kernel` runs tl.dot with input precision tf32" in messages[0]
    assert "hidden_dot_kernel` multiplies f16 operands" in messages[1]


# ---------------------------------------------------------------------------------------------
# On the GPU: what the profiler records
# ---------------------------------------------------------------------------------------------

def test_recorder_needs_cuda(monkeypatch):
    monkeypatch.setattr(kernel_audit, "_cuda_available", lambda: False)
    with pytest.raises(RuntimeError, match="needs CUDA"):
        with ActivityRecorder():
            pass


def test_recorder_keeps_the_profiler_it_found_at_import():
    assert kernel_audit._PROFILE is torch.profiler.profile
    assert kernel_audit._CUDA_ACTIVITY == torch.profiler.ProfilerActivity.CUDA


def add_kernel(a_ptr, b_ptr, c_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    tl.store(c_ptr + offsets, tl.load(a_ptr + offsets, mask=mask) + tl.load(b_ptr + offsets, mask=mask),
             mask=mask)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="records CUDA activity; needs a GPU")
def test_recorder_sees_triton_cublas_and_host_copy(tmp_path, monkeypatch):
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))
    jitted = triton.jit(add_kernel)  # the CUDA kernel is named after the function: add_kernel
    a = torch.randn(4096, device="cuda")
    b = torch.randn(4096, device="cuda")
    c = torch.empty_like(a)
    x = torch.randn(256, 256, device="cuda")
    jitted[(32,)](a, b, c, 4096, BLOCK=128)  # compile outside the record
    # A candidate swapping the profiler after import does not blind the recorder.
    monkeypatch.setattr(torch.profiler, "profile", None)
    with ActivityRecorder() as recorder:
        jitted[(32,)](a, b, c, 4096, BLOCK=128)
        torch.matmul(x, x)
        c.cpu()
        torch.zeros(16, device="cuda")
    kinds = {(a.kind, a.direction) for a in recorder.activities}
    assert ("kernel", "") in kinds and ("memcpy", "DtoH") in kinds
    names = [a.name for a in recorder.activities if a.kind == "kernel"]
    assert "add_kernel" in names
    violations = activity_violations(recorder.activities, {"add_kernel"})
    rules = _rules(violations)
    assert Rule.HOST_COPY in rules and Rule.NON_TRITON_KERNEL in rules and Rule.NO_LAUNCH not in rules
    rejected = [v.message for v in violations if v.rule is Rule.NON_TRITON_KERNEL]
    assert all("add_kernel" not in message and "FillFunctor" not in message for message in rejected)
    launched = kernel_audit.accepted_triton_kernels(recorder.activities, {"add_kernel"})
    assert launched == {"add_kernel"}
    assert compiled_precision_violations(tmp_path, launched) == []
