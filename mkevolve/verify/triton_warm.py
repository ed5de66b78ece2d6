"""Triton's warm state for candidate processes, built by trusted code only.

A candidate process is fresh, and its Triton cache starts empty, so nothing one candidate compiled can be
loaded by another. Left at that, every candidate's first call pays, on an H200 (Triton 3.6):

    0.57 s   Triton's first launch in a process (driver, CUDA helper module, first module load)
    0.35 s   the compiler's first compile in a process (MLIR and LLVM set up once)
    0.27 s   per kernel signature, gcc building Triton's C launcher (one per argument-type list)

Trusted code takes all three off the candidate's path. The zygote builds the CUDA helper module into the
warm cache (`zygote_warmup`). Each standby child, before its candidate is known (`warm_process`),
compiles and launches the kernel of warm_kernel.py and builds the launchers of the signatures recent
candidates used into the warm cache. A candidate process copies the warm cache into its own before it is
confined; it cannot write the warm cache. The signatures come from candidate reports, so they are
untrusted text: only lists of Triton type names are kept (`learn`), and a launcher's C source is generated
by Triton from them.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
import tempfile
from pathlib import Path

WARM_DIR_ENV = "MKEVOLVE_TRITON_WARM"   # where the warm cache is, set by the trusted worker for its zygote
SIGNATURES_FILE = "launcher-signatures.json"
CHOICES_FILE = "autotune-choices.json"     # autotune_memory's store
MAX_SIGNATURES = 64                      # kept in the store, most recent first
MAX_REPORTED = 16                        # taken from one candidate's report
# The trusted stores in the warm folder and their temporaries while written: never copied into a candidate's cache
_STORES = (SIGNATURES_FILE, f".{SIGNATURES_FILE}.*", CHOICES_FILE, f".{CHOICES_FILE}.*")
# A signature as the harness records it: Triton's type names ("*fp32", "i32", "constexpr"), comma-joined.
_SIGNATURE = re.compile(r"[*a-z][a-z0-9]{0,15}(,[*a-z][a-z0-9]{0,15}){0,127}")
_TRITON_TEMP = "tmp.*"                   # Triton writes an entry in such a folder, then renames it


# ---- trusted side: where the warm cache is, and what it should hold ----------------------------------------


def warm_dir() -> Path:
    """This user's warm cache, kept across runs so that later runs start warm; a fresh folder of this
    process when the shared name is taken by something that is not ours alone."""
    shared = Path(tempfile.gettempdir()) / f"mkevolve-triton-warm-{os.getuid()}"
    try:
        shared.mkdir(mode=0o700, exist_ok=True)
        info = shared.lstat()
        if shared.is_dir() and not shared.is_symlink() and info.st_uid == os.getuid() and not info.st_mode & 0o077:
            return shared
    except OSError:
        pass
    return Path(tempfile.mkdtemp(prefix="mkevolve-triton-warm-"))


def valid_signatures(reported: object) -> list[str]:
    """The launcher signatures of a candidate's report that are lists of type names; anything else in the
    field is dropped (the field is a hint for the cache, never part of the verdict)."""
    if not isinstance(reported, list):
        return []
    return [s for s in reported[:MAX_REPORTED] if isinstance(s, str) and _SIGNATURE.fullmatch(s)]


def learn(signatures: list[str], warm: Path) -> None:
    """Put the signatures first in the store the standby children read; called by the trusted worker."""
    if not signatures:
        return
    known = read_signatures(warm)
    merged = list(dict.fromkeys([*signatures, *known]))[:MAX_SIGNATURES]
    if merged == known:
        return
    # Written whole and renamed into place: a reader sees the old list or the new one. Two workers that
    # learn at once may drop each other's news, which only costs a later candidate one launcher build.
    temporary = warm / f".{SIGNATURES_FILE}.{os.getpid()}"
    temporary.write_text(json.dumps(merged))
    temporary.replace(warm / SIGNATURES_FILE)


def read_signatures(warm: Path) -> list[str]:
    try:
        stored = json.loads((warm / SIGNATURES_FILE).read_text())
    except (OSError, ValueError):
        return []
    return [s for s in stored if isinstance(s, str) and _SIGNATURE.fullmatch(s)] if isinstance(stored, list) else []


# ---- zygote and standby child: build the warm state -------------------------------------------------------


def gpu_process() -> bool:
    """Whether this process's candidates run compiled Triton on a GPU (not the CPU interpreter)."""
    return bool(os.environ.get("CUDA_VISIBLE_DEVICES")) and os.environ.get("TRITON_INTERPRET") != "1"


def zygote_warmup() -> None:
    """Called by the zygote once (mkevolve.workers.zygote): build Triton's CUDA helper module into the warm
    cache (no CUDA context needed)."""
    warm = os.environ.get(WARM_DIR_ENV)
    if not warm or not gpu_process():
        return
    os.environ["TRITON_CACHE_DIR"] = warm
    try:
        from triton.backends.nvidia.driver import CudaUtils
    except ImportError:  # a Triton without the NVIDIA backend: nothing to prepare
        return
    CudaUtils()


def warm_process() -> None:
    """In a standby child, CUDA context open, candidate not yet known: compile once (into a folder thrown
    away, so the compiler really runs), launch once (from the warm cache), build the known launchers.

    Warming only saves time: a step that fails is logged to this process's log and the candidate pays
    for it as it would have without this."""
    warm = os.environ.get(WARM_DIR_ENV)
    if not warm:
        return
    for step in (_warm_compiler, _warm_launch):
        try:
            step()
        except Exception as err:  # noqa: BLE001 - see the docstring
            print(f"Triton warm-up: {step.__name__} failed: {err!r}", file=sys.stderr)
    build_launchers(read_signatures(Path(warm)))


def _warm_compiler() -> None:
    import triton

    from mkevolve.verify import warm_kernel

    cache = os.environ["TRITON_CACHE_DIR"]
    with tempfile.TemporaryDirectory(prefix="mkevolve-triton-compile-") as throwaway:
        os.environ["TRITON_CACHE_DIR"] = throwaway
        try:
            source = triton.compiler.ASTSource(fn=warm_kernel.scale, signature=warm_kernel.SIGNATURE,
                                               constexprs=warm_kernel.CONSTEXPRS)
            triton.compile(source, target=triton.runtime.driver.active.get_current_target())
        finally:
            os.environ["TRITON_CACHE_DIR"] = cache


def _warm_launch() -> None:
    import torch

    from mkevolve.verify import warm_kernel

    warm_kernel.launch(torch.device("cuda"))


def build_launchers(signatures: list[str]) -> None:
    """Build Triton's C launcher for each signature into the current Triton cache (a cached one only loads).
    Triton versions whose launcher is generic (no per-signature build) have nothing to build."""
    try:
        from triton.backends.nvidia import driver
        from triton.runtime.build import compile_module_from_src
    except ImportError:
        return
    make_launcher = getattr(driver, "make_launcher", None)
    if make_launcher is None:
        return
    for signature in signatures:
        try:
            source = make_launcher({}, dict(enumerate(signature.split(","))), None)
            compile_module_from_src(src=source, name="__triton_launcher", library_dirs=driver.library_dirs(),
                                    include_dirs=driver.include_dirs, libraries=driver.libraries)
        except Exception as err:  # noqa: BLE001 - a type this Triton does not know: the candidate builds it
            print(f"Triton warm-up: no launcher for {signature}: {err!r}", file=sys.stderr)


# ---- candidate process, before the confinement ------------------------------------------------------------


def copy_warm_cache(triton_cache: Path) -> None:
    """Start the candidate's own cache as a copy of the warm one (a copy: a link would let the candidate
    write into the shared files). A standby child may be adding entries meanwhile; Triton writes each in a
    temporary folder first, which is skipped, and an entry copied half is rebuilt by Triton."""
    warm = os.environ.get(WARM_DIR_ENV)
    if warm and Path(warm).is_dir():
        try:
            shutil.copytree(warm, triton_cache, dirs_exist_ok=True,
                            ignore=shutil.ignore_patterns(_TRITON_TEMP, *_STORES))
        except shutil.Error as err:  # a temporary file renamed away mid-copy
            print(f"Triton warm cache copied in part: {str(err)[:300]}", file=sys.stderr)
    triton_cache.mkdir(parents=True, exist_ok=True)


def record_launchers() -> list[str]:
    """Wrap Triton's launcher generator so the signatures this process builds launchers for are listed (the
    trusted side learns them for later candidates). The list is filled by code the candidate can reach, so
    the trusted side checks each entry."""
    seen: list[str] = []
    try:
        from triton.backends.nvidia import driver
    except ImportError:
        return seen
    make_launcher = getattr(driver, "make_launcher", None)
    if make_launcher is None:
        return seen

    def recording(constants, signature, tensordesc_meta, *args, **kwargs):
        types = list(signature.values())
        if not tensordesc_meta and all(isinstance(t, str) for t in types) and len(seen) < MAX_REPORTED:
            seen.append(",".join(types))
        return make_launcher(constants, signature, tensordesc_meta, *args, **kwargs)

    driver.make_launcher = recording
    return seen
