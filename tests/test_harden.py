"""The candidate-process audit hook (mkevolve/workers/harden.py).

Each scenario runs in a fresh Python process: a small trusted driver imports torch and triton (as
the zygote does), confines itself, imports a candidate module from tmp/candidate/ and calls the
module's attempts one by one, reporting for each whether it passed, was denied (and how), and how
many denials the reader gained. One process serves many attempts; each test reads its own line.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from mkevolve.workers.harden import candidate_env

ROOT = Path(__file__).resolve().parents[1]

DRIVER = textwrap.dedent('''
    import json, os, sys
    from pathlib import Path

    import torch, triton  # imported before confinement, as in the zygote

    from mkevolve.workers.harden import Confinement, Denied, confine

    tmp = Path(sys.argv[1])
    read = confine(Confinement(tmp / "candidate", tmp / "scratch", tmp / "scratch" / "triton-cache"))
    sys.path.insert(0, str(tmp / "candidate"))
    import cand

    results = {}
    for name, attempt in cand.ATTEMPTS.items():
        before = len(read())
        try:
            attempt()
            outcome = "ok"
        except Denied as error:
            outcome = "denied: " + str(error)
        except BaseException as error:
            outcome = f"error: {type(error).__name__}: {error}"
        results[name] = {"outcome": outcome, "recorded": read()[before:]}
    # The driver is trusted harness code: the policy judges the caller, not the process.
    results["driver reads /proc/self/status"] = {"outcome": Path("/proc/self/status").read_text()[:5]}
    print("RESULTS " + json.dumps(results))
''')

HONEST = textwrap.dedent('''
    import collections, dataclasses, enum, inspect, logging, os, sys, tempfile, typing, warnings
    from pathlib import Path

    import torch
    import triton
    import triton.language as tl

    HERE = Path(__file__).resolve().parent
    SCRATCH = HERE.parent / "scratch"


    @dataclasses.dataclass(frozen=True)
    class Shape:
        rows: int
        cols: int = 4
        tags: list = dataclasses.field(default_factory=list)


    Point = collections.namedtuple("Point", "x y")


    class Pair(typing.NamedTuple):
        a: int
        b: str = "b"


    class Color(enum.Enum):
        RED = 1


    @triton.jit
    def add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
        offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offsets < n
        tl.store(out_ptr + offsets, tl.load(x_ptr + offsets, mask=mask) + tl.load(y_ptr + offsets, mask=mask),
                 mask=mask)


    def data_classes():
        assert Shape(2).cols == 4 and Point(1, 2).y == 2 and Pair(1).b == "b" and Color(1) is Color.RED
        Dynamic = dataclasses.make_dataclass("Dynamic", ["a", ("b", int, 0)])
        assert Dynamic(1).b == 0
        assert list(inspect.signature(data_classes).parameters) == []


    def scratch_files():
        path = SCRATCH / "out.txt"
        path.write_text("hello")
        assert path.read_text() == "hello"
        (SCRATCH / "sub").mkdir()
        os.replace(path, SCRATCH / "sub" / "moved.txt")
        os.remove(SCRATCH / "sub" / "moved.txt")
        with tempfile.NamedTemporaryFile(mode="w") as handle:  # lands in scratch
            handle.write("x")
            assert handle.name.startswith(str(SCRATCH))


    def own_folder():
        assert (HERE / "notes.txt").read_text() == "notes"
        assert "cand.py" in os.listdir(HERE)
        assert "def own_folder" in (HERE / "cand.py").read_text()


    def late_imports():
        import graphlib, json.tool  # stdlib modules not loaded before confinement
        import triton.language.extra.libdevice  # noqa: F401
        import torch.utils.benchmark  # noqa: F401
        assert graphlib.TopologicalSorter({1: [2]}).static_order()


    def torch_ops():
        x = torch.arange(12.0).reshape(3, 4)
        assert torch.allclose((x @ x.T).diagonal(), (x * x).sum(1))


    def triton_kernel():
        x, y = torch.rand(1000), torch.rand(1000)
        out = torch.empty_like(x)
        add_kernel[(triton.cdiv(1000, 256),)](x, y, out, 1000, BLOCK=256)
        assert torch.allclose(out, x + y)


    def logging_and_warnings():
        logging.getLogger("cand").warning("a warning through logging")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            warnings.warn("a warning")


    def signal_itself():
        os.kill(os.getpid(), 0)


    ATTEMPTS = {name: globals()[name] for name in (
        "data_classes", "scratch_files", "own_folder", "late_imports", "torch_ops", "triton_kernel",
        "logging_and_warnings", "signal_itself")}
''')

ATTACKS = textwrap.dedent('''
    import _imp, builtins, ctypes, gc, importlib.machinery, importlib.util, inspect, marshal, os
    import socket, subprocess, sys, threading
    from pathlib import Path

    HERE = Path(__file__).resolve().parent
    TMP = HERE.parent
    SCRATCH = TMP / "scratch"


    def torch_tree_map(function, tree):
        from torch.utils._pytree import tree_map
        return tree_map(function, tree)


    def torch_load(path):
        import torch
        return torch.load(path, weights_only=True)


    def own_code():
        """This module's code object, by the import system's own loader (no __code__ read)."""
        return importlib.machinery.SourceFileLoader("cand", __file__).get_code("cand")


    def traceback_frame():
        try:
            1 / 0
        except ZeroDivisionError as error:
            return error.__traceback__.tb_frame


    def swallowed():
        try:
            os.system("true")
        except PermissionError:
            pass  # the record keeps it anyway


    def thread_of_library_code():
        thread = threading.Thread(target=subprocess.run, args=(["true"],))
        thread.start()
        thread.join()


    def triton_build_helper():
        from triton.runtime import build
        src = SCRATCH / "evil.c"
        src.write_text("int x;")
        try:
            build._build("evil", str(src), str(SCRATCH), [], [], [], [])
        except TypeError:  # older Triton: no ccflags
            build._build("evil", str(src), str(SCRATCH), [], [], [])


    def tampered():
        """Replace what the hook is made of; the sealed hook does not notice."""
        import mkevolve.workers.harden as harden
        saved = dict(vars(harden)), os.path.realpath, os.lstat, builtins.getattr
        for name, value in list(vars(harden).items()):
            if name.startswith("_") and callable(value) and not isinstance(value, type):
                setattr(harden, name, lambda *args, **kwargs: None)
        harden._ALWAYS_DENIED.clear()
        os.path.realpath = lambda path, **kwargs: str(SCRATCH)
        os.lstat = lambda path, **kwargs: saved[2](SCRATCH)
        real_getattr = saved[3]
        # An unsealed hook would read its "busy" flag through this and let everything pass.
        builtins.getattr = lambda obj, name, *rest: True if name == "busy" else real_getattr(obj, name, *rest)
        try:
            (TMP / "other" / "problem.py").read_text()
        finally:
            builtins.getattr = real_getattr
            vars(harden).update(saved[0])
            os.path.realpath, os.lstat = saved[1], saved[2]


    def another_audit_hook():
        events = []
        sys.addaudithook(lambda event, args: events.append(event))  # Python swallows the denial here
        sys.audit("mkevolve.test")
        assert events == [], "the candidate's hook was added"


    ATTEMPTS = {
        "subprocess.run": lambda: subprocess.run(["true"]),
        "os.system": lambda: os.system("true"),
        "signal the parent": lambda: os.kill(os.getppid(), 0),
        "socket": lambda: socket.socket(),
        "ctypes.CDLL": lambda: ctypes.CDLL(None),
        "sys._getframe": lambda: sys._getframe(),
        "inspect.currentframe": lambda: inspect.currentframe(),
        "traceback frame": traceback_frame,
        "gc.get_objects": lambda: gc.get_objects(),
        "sys._current_frames": lambda: sys._current_frames(),
        "sys.settrace": lambda: sys.settrace(lambda *args: None),
        "sys.addaudithook": another_audit_hook,
        "exec of a string": lambda: exec("1 + 1"),
        "compile of a string": lambda: compile("1 + 1", "<x>", "eval"),
        "exec of a code object": lambda: exec(own_code(), {}),
        "function __code__": lambda: own_code.__code__,
        "code.replace": lambda: own_code().replace(co_filename="/fake/triton/runtime/jit.py"),
        "_imp._fix_co_filename": lambda: _imp._fix_co_filename(own_code(), "/fake/jit.py"),
        "marshal.loads": lambda: marshal.loads(marshal.dumps(1)),
        "read the problem": lambda: (TMP / "other" / "problem.py").read_text(),
        "read by a climbing relative path": lambda: open("../other/problem.py").read(),
        "read /proc/self/environ": lambda: open("/proc/self/environ", "rb").read(),
        "read /proc/self/status": lambda: open("/proc/self/status").read(),
        "open a directory": lambda: os.open(HERE, os.O_RDONLY),
        "list another folder": lambda: os.listdir(TMP / "other"),
        "write outside scratch": lambda: (TMP / "other" / "x.txt").write_text("x"),
        "write in its own folder": lambda: (HERE / "x.txt").write_text("x"),
        "write in Triton's cache": lambda: (SCRATCH / "triton-cache" / "x.so").write_bytes(b"x"),
        "symlink in scratch": lambda: os.symlink(TMP / "other", SCRATCH / "link"),
        "fork_exec directly": lambda: subprocess._fork_exec(*[None] * 23),
        "a fresh _posixsubprocess": lambda: importlib.util.module_from_spec(
            importlib.util.find_spec("_posixsubprocess")),
        "a fresh _imp": lambda: _imp.create_builtin(importlib.machinery.ModuleSpec("_imp", None)),
        "swallowed denial": swallowed,
        "library code on a thread": thread_of_library_code,
        "Triton's build helper": triton_build_helper,
        "ctypes through torch's tree_map": lambda: torch_tree_map(ctypes.string_at, [id(1)]),
        "read the problem through torch.load": lambda: torch_load(TMP / "other" / "problem.py"),
        "read the parent's environ through torch.load": lambda: torch_load(f"/proc/{os.getppid()}/environ"),
        "tampering with the hook": tampered,
    }
''')

DENIED = {  # attempt -> the audit event its denial names
    "subprocess.run": "subprocess.Popen",
    "os.system": "os.system",
    "signal the parent": "os.kill",
    "socket": "socket.__new__",
    "ctypes.CDLL": "ctypes.dlopen",
    "sys._getframe": "sys._getframe",
    "inspect.currentframe": "sys._getframe",
    "traceback frame": "object.__getattr__",
    "gc.get_objects": "gc.get_objects",
    "sys._current_frames": "sys._current_frames",
    "sys.settrace": "sys.settrace",
    "exec of a string": "compile",
    "compile of a string": "compile",
    "exec of a code object": "exec",
    "function __code__": "object.__getattr__",
    "code.replace": "code.__new__",
    "_imp._fix_co_filename": "mkevolve.sandbox.fix_co_filename",
    "marshal.loads": "marshal.loads",
    "read the problem": "open",
    "read by a climbing relative path": "open",
    "read /proc/self/environ": "open",
    "open a directory": "open",
    "list another folder": "os.listdir",
    "write outside scratch": "open",
    "write in its own folder": "open",
    "write in Triton's cache": "open",
    "symlink in scratch": "os.symlink",
    "fork_exec directly": "mkevolve.sandbox.fork_exec",
    "a fresh _posixsubprocess": ("import", "mkevolve.sandbox.create_builtin"),  # a .so, or built in
    "a fresh _imp": "mkevolve.sandbox.create_builtin",
    "Triton's build helper": "subprocess.Popen",
    "ctypes through torch's tree_map": "ctypes.string_at",
    "read the problem through torch.load": "open",
    "read the parent's environ through torch.load": "open",
    "tampering with the hook": "open",
}


def _run_candidate(tmp_path: Path, source: str, interpret: bool = True) -> dict:
    for folder in ("candidate", "scratch", "other"):
        (tmp_path / folder).mkdir()
    (tmp_path / "candidate" / "cand.py").write_text(source)
    (tmp_path / "candidate" / "notes.txt").write_text("notes")
    (tmp_path / "other" / "problem.py").write_text("SECRET = 42\n")
    (tmp_path / "driver.py").write_text(DRIVER)
    env = candidate_env(os.environ, tmp_path / "scratch")
    env.update(PYTHONPATH=str(ROOT), TRITON_CACHE_DIR=str(tmp_path / "scratch" / "triton-cache"))
    if interpret:
        env.update(TRITON_INTERPRET="1", CUDA_VISIBLE_DEVICES="")
    else:
        env.pop("TRITON_INTERPRET", None)
    proc = subprocess.run([sys.executable, str(tmp_path / "driver.py"), str(tmp_path)], env=env,
                          cwd=tmp_path / "scratch", capture_output=True, text=True, timeout=120)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULTS ")]
    assert proc.returncode == 0 and lines, f"driver failed ({proc.returncode}):\n{proc.stderr[-3000:]}"
    return json.loads(lines[-1][len("RESULTS "):])


@pytest.fixture(scope="module")
def attacks(tmp_path_factory) -> dict:
    return _run_candidate(tmp_path_factory.mktemp("attacks"), ATTACKS)


@pytest.fixture(scope="module")
def honest(tmp_path_factory) -> dict:
    return _run_candidate(tmp_path_factory.mktemp("honest"), HONEST)


@pytest.mark.parametrize("name", list(DENIED))
def test_attempt_is_denied_and_recorded(attacks, name):
    compiler = shutil.which("gcc") or shutil.which("clang") or os.environ.get("CC")
    if name == "Triton's build helper" and not compiler:
        pytest.skip("no C compiler: Triton fails before it would start one")
    result = attacks[name]
    events = DENIED[name] if isinstance(DENIED[name], tuple) else (DENIED[name],)
    assert result["outcome"].startswith("denied: sandbox: "), result
    assert result["outcome"].endswith(tuple(f"is denied in a candidate process ({e})" for e in events)), result
    assert result["recorded"] == [result["outcome"][len("denied: "):]], result


def test_swallowed_denial_is_still_recorded(attacks):
    result = attacks["swallowed denial"]
    assert result["outcome"] == "ok"
    assert result["recorded"] == ["sandbox: running a shell command is denied in a candidate process (os.system)"]


def test_another_audit_hook_is_refused_and_recorded(attacks):
    result = attacks["sys.addaudithook"]
    assert result["outcome"] == "ok"  # sys.addaudithook swallows an Exception from existing hooks
    assert result["recorded"] == [
        "sandbox: adding an audit hook is denied in a candidate process (sys.addaudithook)"]


def test_library_code_on_a_thread_counts_as_the_candidate(attacks):
    result = attacks["library code on a thread"]
    assert result["outcome"] == "ok"  # the denial was raised on the thread, not here
    assert result["recorded"][0] == ("sandbox: starting the program 'true' is denied in a candidate process "
                                     "(subprocess.Popen)")


def test_library_code_reads_system_information_candidate_code_may_not(attacks):
    assert attacks["driver reads /proc/self/status"]["outcome"] == "Name:"
    assert attacks["read /proc/self/status"]["outcome"].endswith("(open)")


@pytest.mark.parametrize("name", ["data_classes", "scratch_files", "own_folder", "late_imports", "torch_ops",
                                  "triton_kernel", "logging_and_warnings", "signal_itself"])
def test_honest_candidate_code_works(honest, name):
    assert honest[name] == {"outcome": "ok", "recorded": []}


def test_candidate_env_keeps_a_whitelist(tmp_path):
    base = {"PATH": "/usr/bin", "LANG": "C.UTF-8", "LC_ALL": "C", "PYTHONPATH": "/repo",
            "CUDA_VISIBLE_DEVICES": "1", "TRITON_INTERPRET": "1", "TRITON_PTXAS_PATH": "/opt/ptxas",
            "TRITON_CACHE_DIR": "/shared/cache", "TRITON_API_TOKEN": "t", "OPENAI_API_KEY": "k",
            "AWS_SECRET_ACCESS_KEY": "s", "AWS_REGION": "us", "GITHUB_TOKEN": "g", "HOME": "/root",
            "LD_PRELOAD": "/evil.so", "SSH_AUTH_SOCK": "/tmp/agent", "CUDA_API_KEY": "c"}
    env = candidate_env(base, tmp_path)
    assert env == {"PATH": "/usr/bin", "LANG": "C.UTF-8", "LC_ALL": "C", "PYTHONPATH": "/repo",
                   "CUDA_VISIBLE_DEVICES": "1", "TRITON_INTERPRET": "1", "TRITON_PTXAS_PATH": "/opt/ptxas",
                   "HOME": str(tmp_path), "TMPDIR": str(tmp_path), "TMP": str(tmp_path),
                   "TEMP": str(tmp_path), "PYTHONDONTWRITEBYTECODE": "1"}


GPU_KERNEL = textwrap.dedent('''
    import torch, triton
    import triton.language as tl

    @triton.jit
    def double_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
        offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offsets < n
        tl.store(out_ptr + offsets, tl.load(x_ptr + offsets, mask=mask) * 2, mask=mask)

    @triton.autotune(configs=[triton.Config({"BLOCK": 256}), triton.Config({"BLOCK": 512})], key=["n"])
    @triton.jit
    def tuned_double_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
        offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offsets < n
        tl.store(out_ptr + offsets, tl.load(x_ptr + offsets, mask=mask) * 2, mask=mask)

    def compile_and_launch():
        x = torch.rand(5000, device="cuda")
        for _ in range(2):  # the second launch finds the kernel compiled
            out = torch.empty_like(x)
            double_kernel[(triton.cdiv(5000, 1024),)](x, out, 5000, BLOCK=1024)
            torch.cuda.synchronize()
            assert torch.equal(out, x * 2)

    def autotune():
        x = torch.rand(5000, device="cuda")
        out = torch.empty_like(x)
        tuned_double_kernel[lambda meta: (triton.cdiv(5000, meta["BLOCK"]),)](x, out, 5000)
        torch.cuda.synchronize()
        assert torch.equal(out, x * 2)

    ATTEMPTS = {"compile_and_launch": compile_and_launch, "autotune": autotune}
''')


@pytest.mark.gpu
def test_triton_compiles_and_launches_on_gpu_under_confinement(tmp_path):
    """A fresh Triton cache: ptxas, the C compiler for the launcher, the cache and the autotuner
    all run confined, and the candidate leaves no denial."""
    result = _run_candidate(tmp_path, GPU_KERNEL, interpret=False)
    assert result["compile_and_launch"] == {"outcome": "ok", "recorded": []}
    assert result["autotune"] == {"outcome": "ok", "recorded": []}
    assert any((tmp_path / "scratch" / "triton-cache").rglob("*.cubin"))
