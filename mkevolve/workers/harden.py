"""Confine a candidate process with an audit hook, installed before the candidate's code is imported.

A candidate process runs exactly one candidate's code (its harness is mkevolve/verify/harness.py). `confine`
installs a `sys.addaudithook` hook that judges every audited operation by what it is and by who asked
for it, the *caller*: walking out from the operation, past this module's frames and Python's own
standard library, the first frame left (none at all, as on a thread running only library code,
counts as the candidate). Code from the candidate's folder or the scratch folder, and code with no
real file behind it ("<string>"), is candidate code. A denial raises `Denied` and is recorded where
only the caller of `confine` can read it, so a candidate that swallows the exception still leaves
the record.

The policy:

- Never, whoever asks: forking, exec, os.system, spawning except as below, signals to other
  processes, sockets, cffi, subinterpreters, trace/profile/monitoring functions, new audit hooks,
  the garbage collector's object lists, other threads' frames.
- Processes only for Triton, which runs ptxas, the C compiler for its launcher stubs, ldconfig, and
  `file` (through platform.architecture). A "subprocess.Popen" passes when the first non-stdlib
  frame is Triton code, the innermost run of Triton frames was entered through a launch entry
  point (jit, autotuner, driver, compiler), the frame that calls subprocess does so on that very
  source line, and the program is one of Triton's tools as found when `confine` ran. The spawn
  (`os.posix_spawn`, `_posixsubprocess.fork_exec`) must then come from inside that Popen call.
- ctypes only for torch.cuda's NVML helpers (they count devices after confinement).
- Files, for every caller: writes go to the scratch folder only, and Triton's cache folder (even
  inside scratch) takes writes from Triton code only. Reads stay inside the candidate's folder,
  scratch, `readable_roots`, the standard library, site-packages / the Python prefix, the mkevolve,
  torch and Triton packages, /dev/null and /dev/urandom. Library code may also read /sys and this
  process's /proc entries; candidate code may not, nor open a directory as a file (a directory
  descriptor would let later relative paths escape these checks), nor climb with "..", nor make
  links. Native extensions load only from the installed roots, or from Triton's cache by Triton.
- Candidate code may not read frames (`sys._getframe`, `tb_frame`, `gi_frame`, ...; their f_back
  and f_locals reach the harness), read `__code__` itself, make code or functions (`code.__new__`,
  `function.__new__`, assigning `__code__`, `_imp._fix_co_filename`), load bytecode other than the
  import system's own .pyc files, compile text, or exec anything itself. Library helpers that exec
  for it (importlib, dataclasses, namedtuple, typing) still work when what they run is
  candidate-named or is exactly the module its file name claims, so nothing can pass for Triton.

`open` of an integer descriptor is allowed: it wraps a descriptor the process already holds, and
`os.read`/`os.write` on one are not audited anyway (the parent must not leave secrets open).

Some C functions act without an audit event (`_posixsubprocess.fork_exec`, `_imp._fix_co_filename`,
`_imp.create_builtin`, which would make fresh copies of the others). `confine` replaces them, in
every module that refers to them, by stand-ins that raise an event; the hook calls the originals,
which live only in its closure. The hook itself runs in a private copy of this module's globals and
of builtins, built from functions captured at import, so candidate code that monkeypatches this
module, `builtins`, `os` or `os.path` does not change its decisions. It never calls a method of an
object candidate code could have made (no `repr`, `os.fspath`, attribute reads on arguments), since
that would run candidate code while the hook is busy and every event passes.

Residual risks. Audit hooks are not a security boundary (PEP 578 says so); this is one layer, next to
the process boundary, the stripped environment and the worker's own comparison of outputs.

- Triton's build helpers are trusted by where they are called from. A candidate that reconfigures
  Triton (`triton.knobs`, `os.environ._data`, Triton's module state) or hands Triton a C-level
  callable (a `functools.partial` has no frame) for a hook it calls during a real launch could
  steer a compiler run: the program must be one of Triton's tools, but its arguments are not
  checked, and a C compiler given chosen flags can run other programs.
- Anything that corrupts memory in-process undoes every check here: the Triton interpreter's
  `tl.load`/`tl.store` on host addresses, numpy stride tricks, crafted objects in C extensions.
- Not audited by Python: `signal.pidfd_send_signal` with `os.pidfd_open` (signals other processes
  of the same user), file access from C (`torch.from_file`, `numpy.fromfile`), `os.read`/`os.write`.
- Library code may hand frames to its callers (a `sys._getframe` that torch makes for the candidate
  passes); code generated by libraries ("<string>", as Triton's argument binder) counts as the
  candidate's; dataclasses' private helpers can exec candidate text (named as candidate code, so
  it gains nothing but hiding from the static checks); the import system may list any directory on
  `sys.path` (names only).
- A check-then-use race with another candidate thread renaming paths inside scratch remains;
  candidate code cannot make links and may not climb with "..", which bounds where it leads.
"""

from __future__ import annotations

import _imp
import builtins
import importlib.machinery
import io
import marshal
import os
import re
import shutil
import stat
import sys
import sysconfig
import threading
import types
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from importlib.util import find_spec
from pathlib import Path


@dataclass(frozen=True)
class Confinement:
    """Where one candidate process may read and write."""

    candidate_dir: Path          # the solution's folder: readable (recursively); code there is candidate code
    scratch_dir: Path            # readable and writable; code there is candidate code too
    triton_cache_dir: Path       # inside or beside scratch; writable only by Triton's own code
    readable_roots: tuple[Path, ...] = ()   # extra readable roots (the stdlib, site-packages, ... always are)


class Denied(PermissionError):
    """An operation the sandbox refused; the message names what and the audit event."""


# -- what the hook needs, captured at import, before any candidate code could replace it ---------

_lstat, _readlink, _getcwd, _getpid = os.lstat, os.readlink, os.getcwd, os.getpid
_getframe = sys._getframe
_open_file = io.open
_marshal_loads = marshal.loads
_get_frozen_object = _imp.get_frozen_object
_S_ISLNK, _S_ISDIR, _S_ISREG = stat.S_ISLNK, stat.S_ISDIR, stat.S_ISREG
_FS_ENCODING = sys.getfilesystemencoding()
_CACHE_TAG = sys.implementation.cache_tag
_OPT_TAG = f".opt-{sys.flags.optimize}" if sys.flags.optimize else ""
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
_CodeType = types.CodeType

# The kinds of code a frame can run.
_CANDIDATE, _STDLIB, _TRITON, _TRUSTED = "candidate", "stdlib", "triton", "trusted"

# C functions that act without an audit event of their own. `confine` replaces every reference to
# each by a stand-in that raises the event named here; the hook calls the original only when it
# allows the call, so the originals live only in the hook's closure (see `_install_guards`).
_SPAWN_EVENT = "mkevolve.sandbox.fork_exec"
_GUARDED = {
    _SPAWN_EVENT: ("_posixsubprocess", "fork_exec"),                    # starts a process
    "mkevolve.sandbox.fix_co_filename": ("_imp", "_fix_co_filename"),  # renames a code object
    "mkevolve.sandbox.create_builtin": ("_imp", "create_builtin"),     # a fresh, unguarded `_imp`
}
_ModuleSpec = importlib.machinery.ModuleSpec
_spec_dict = _ModuleSpec.__dict__["__dict__"].__get__  # reads a spec's fields without running its code

_ALWAYS_DENIED = {
    "os.fork": "forking", "os.forkpty": "forking", "os.exec": "replacing the process (exec)",
    "os.spawn": "spawning a process", "os.system": "running a shell command",
    "os.startfile": "starting a program", "pty.spawn": "spawning a process",
    "os.killpg": "signalling a process group",
    "sys.addaudithook": "adding an audit hook", "sys.settrace": "setting a trace function",
    "sys.setprofile": "setting a profile function", "sys._current_frames": "reading other threads' frames",
    "sys._current_exceptions": "reading other threads' exceptions",
    "sys.monitoring.register_callback": "registering a monitoring callback",
    "gc.get_objects": "listing live objects", "gc.get_referrers": "listing an object's referrers",
    "gc.get_referents": "listing an object's referents",
    "cpython.PyInterpreterState_New": "creating a subinterpreter",
}
# ctypes: denied, except to torch.cuda's NVML helpers, which count devices with ctypes.CDLL after
# confinement. Nothing broader: library code that calls a callable it was handed (torch's
# tree_map, torch.cuda's queued lazy calls) would run ctypes.memmove for the candidate.
_CTYPES_USERS = {"torch": ("cuda/__init__.py", "nvml")}  # package -> (file, part of the function's name)
_CTYPES = {
    "ctypes.dlopen": "loading a shared library with ctypes", "ctypes.dlsym": "looking up a C symbol",
    "ctypes.dlsym/handle": "looking up a C symbol", "ctypes.cdata": "reading memory at an address",
    "ctypes.cdata/buffer": "mapping ctypes data onto a buffer",
    "ctypes.call_function": "calling a C function through ctypes",
    "ctypes.string_at": "reading memory at an address", "ctypes.wstring_at": "reading memory at an address",
}
# Denied only when the caller is candidate code.
_CANDIDATE_DENIED = {
    "code.__new__": "making a code object", "function.__new__": "making a function from a code object",
    "marshal.load": "loading bytecode", "resource.setrlimit": "changing resource limits",
    "resource.prlimit": "changing resource limits",
}
_FRAME_EVENTS = ("sys._getframe", "sys._getframemodulename")
# Modules nobody may load (again) after confinement: unguarded copies of the functions above,
# unaudited process creation, raw memory access.
_UNSAFE_MODULES = frozenset({"_imp", "_posixsubprocess", "_cffi_backend", "cffi", "_testcapi", "_testinternalcapi",
                             "_testbuffer", "_testmultiphase", "_ctypes_test", "_xxsubinterpreters",
                             "_xxinterpchannels"})
# Attributes that hand out a frame (whose f_back and f_locals reach the harness), and code objects.
_FRAME_ATTRIBUTES = frozenset({"tb_frame", "gi_frame", "cr_frame", "ag_frame"})
# Standard-library files that exec generated code on the candidate's behalf (dataclass methods,
# namedtuple, typing's forward references), and those that read the calling frame only for a module
# name or a warning's location. The import system is always allowed to exec.
_STDLIB_EXECUTORS = frozenset({"dataclasses.py", "collections/__init__.py", "typing.py"})
_STDLIB_FRAME_USERS = frozenset({"collections/__init__.py", "dataclasses.py", "typing.py", "enum.py",
                                 "warnings.py", "logging/__init__.py"})
# Triton files that candidate code may call into for Triton to compile and launch a kernel.
_TRITON_ENTRIES = frozenset({"runtime/jit.py", "runtime/autotuner.py", "runtime/driver.py",
                             "compiler/compiler.py"})
_TRITON_TOOLS = ("gcc", "cc", "clang", "g++", "c++", "clang++", "ldconfig", "file")
# Standard-library files that start a program for Triton: platform.architecture() runs `file` on the
# interpreter (Triton keys its launcher cache by it).
_STDLIB_SPAWNERS = frozenset({"platform.py"})
_MUTATIONS = {  # event -> ((index of a path argument, index of its dir_fd argument or None), ...)
    "os.remove": ((0, 1),), "os.rmdir": ((0, 1),), "os.mkdir": ((0, 2),), "os.chmod": ((0, 2),),
    "os.chown": ((0, 3),), "os.utime": ((0, 3),), "os.truncate": ((0, None),),
    "os.setxattr": ((0, None),), "os.removexattr": ((0, None),), "os.rename": ((0, 2), (1, 3)),
    "os.link": ((1, 3),), "os.symlink": ((1, 2),),
}


# -- confine --------------------------------------------------------------------------------------

def confine(c: Confinement) -> Callable[[], list[str]]:
    """Install the audit hook (irreversible). Returns a reader of the denials recorded so far,
    held only by the caller (a closure, never a module global), so candidate code that swallows
    the PermissionError still leaves the record. Keep the reader in a local variable."""
    places = _places(c)
    denials: list[str] = []
    state = threading.local()     # per thread: busy (in the hook), popen (a permitted Popen), pyc (just opened)
    results = threading.local()   # what a guarded original returned; candidate code may read it, harmlessly
    originals = _install_guards(results)
    sys.dont_write_bytecode = True  # a .pyc write next to an installed module would be denied and recorded
    import tempfile
    tempfile.tempdir = places.scratch  # a zygote may have cached /tmp before the fork
    hook = _sealed_namespace()["_make_hook"](places, denials, state, results, originals)
    sys.addaudithook(hook)
    return lambda: list(denials)


def own_builtins(namespace: dict) -> None:
    """Give a module its own references to the builtins (`isinstance`, `open`, `len`, ...).

    A function finds a name in its module's globals before `builtins`, so candidate code that later
    replaces `builtins.isinstance` does not reach the code of a module that called this at import.
    Names the module defines itself are kept."""
    for name, value in vars(builtins).items():
        if not name.startswith("_"):
            namespace.setdefault(name, value)


def _places(c: Confinement) -> types.SimpleNamespace:
    """Every root and tool the policy needs, resolved once. (A SimpleNamespace: its type is built in,
    so candidate code cannot put a property on it.)"""
    def real(path) -> str:
        return os.path.realpath(path)

    paths = sysconfig.get_paths()
    site = {real(p) for p in (paths["purelib"], paths["platlib"])}
    stdlib = {real(paths["stdlib"]), real(paths["platstdlib"])}
    triton, torch = _package_dir("triton"), _package_dir("torch")
    installed = stdlib | site | {real(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)}
    installed |= {d for d in (triton, torch, real(Path(__file__).parents[1])) if d}
    installed.discard("/")  # a prefix of "/" would make everything readable
    owned = (real(c.candidate_dir), real(c.scratch_dir))
    readable = set(owned) | installed | {real(p) for p in c.readable_roots}
    return types.SimpleNamespace(
        candidate=owned[0], scratch=owned[1], cache=real(c.triton_cache_dir), triton=triton, torch=torch,
        stdlib=tuple(stdlib), site=tuple(site), installed=tuple(installed), readable=tuple(readable),
        owned=owned, devices=frozenset({"/dev/null", "/dev/urandom"}), tools=_triton_tools(triton),
        path_dirs=tuple(d for d in os.environ.get("PATH", "").split(os.pathsep) if d),
        this_file=_make_hook.__code__.co_filename, subprocess_file=_subprocess_file(),
        kinds={}, lines={},
    )


def _package_dir(name: str) -> str | None:
    spec = find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        return None
    return os.path.realpath(list(spec.submodule_search_locations)[0])


def _triton_tools(triton: str | None) -> frozenset[str]:
    """The programs Triton runs besides those in its own package: the C compiler and ldconfig."""
    found = [shutil.which(name) for name in _TRITON_TOOLS] + ["/sbin/ldconfig"]
    found += [os.environ.get(name) for name in ("CC", "CXX")]
    found += [v for k, v in os.environ.items() if re.fullmatch(r"TRITON_\w+_PATH", k)]  # ptxas overrides
    return frozenset(os.path.realpath(p) for p in found if p and os.path.isfile(p))


def _subprocess_file() -> str:
    import subprocess

    return subprocess.Popen._execute_child.__code__.co_filename


def _install_guards(results: threading.local) -> dict:
    """Put a stand-in wherever a `_GUARDED` function is referenced (module and class dicts); return
    the originals by event. A stand-in raises its event and returns what the hook's call gave."""
    import gc
    import subprocess  # noqa: F401  (it holds its own reference, `subprocess._fork_exec`)

    originals = {}
    for event, (module_name, name) in _GUARDED.items():
        module = sys.modules.get(module_name)
        if module is None:
            try:
                module = __import__(module_name)
            except ImportError:
                continue  # not on this platform: nothing to guard
        original = getattr(module, name)
        stand_in = _stand_in(event, results)
        for holder in gc.get_referrers(original):
            if isinstance(holder, dict):
                for key in [k for k, v in holder.items() if v is original]:
                    holder[key] = stand_in
        originals[event] = original
    return originals


def _stand_in(event: str, results: threading.local):
    def guarded(*args):
        sys.audit(event, args)
        return results.value

    return guarded


def _sealed_namespace() -> dict:
    """A private copy of this module's globals, with a private copy of builtins and every function
    of this module re-bound to it: later assignments to this module, to `builtins` or to anything
    captured above do not reach the hook. Nothing outside the hook's closure refers to it."""
    namespace = dict(globals())
    namespace["__builtins__"] = dict(vars(builtins))
    for name, value in list(namespace.items()):
        if isinstance(value, types.FunctionType) and value.__module__ == __name__:
            namespace[name] = types.FunctionType(value.__code__, namespace, value.__name__,
                                                 value.__defaults__, value.__closure__)
    return namespace


# -- the hook (runs in the sealed namespace) ------------------------------------------------------

def _make_hook(p, denials, state, results, originals):
    rules = {"open": _on_open, "os.listdir": _on_listing, "os.scandir": _on_listing,
             "import": _on_import, "compile": _on_compile, "exec": _on_exec,
             "marshal.loads": _on_marshal, "object.__getattr__": _on_introspection,
             "object.__setattr__": _on_code_assignment, "object.__delattr__": _on_code_assignment,
             "subprocess.Popen": _on_popen, "os.posix_spawn": _on_spawn, _SPAWN_EVENT: _on_spawn,
             "mkevolve.sandbox.fix_co_filename": _on_fix_co_filename,
             "mkevolve.sandbox.create_builtin": _on_create_builtin, "os.kill": _on_kill}
    rules.update(dict.fromkeys(_ALWAYS_DENIED, _on_always))
    rules.update(dict.fromkeys(_CANDIDATE_DENIED, _on_candidate_only))
    rules.update(dict.fromkeys(_CTYPES, _on_ctypes))
    rules.update(dict.fromkeys(_FRAME_EVENTS, _on_frame))
    rules.update(dict.fromkeys(_MUTATIONS, _on_mutation))

    def hook(event, args):
        rule = rules.get(event)
        if rule is None:
            if not event.startswith("socket."):
                return
            rule = _on_socket
        if getattr(state, "busy", False):
            return  # an event raised by the hook's own work
        state.busy = True
        try:
            what = rule(event, args, _getframe(1), p, state)
        except Exception as error:  # a bug here must fail closed, and visibly
            what = f"an operation the sandbox could not judge ({type(error).__qualname__}: {error})"
        finally:
            state.busy = False
        if what is None:
            original = originals.get(event)
            if original is not None:
                results.value = original(*args[0])  # a guarded call the rule allowed
            return
        message = f"sandbox: {what} is denied in a candidate process ({event})"
        denials.append(message)
        raise Denied(message)

    return hook


# -- who is asking --------------------------------------------------------------------------------

def _walk(frame, p) -> list:
    """(kind, filename, frame) for every Python frame from `frame` outward, this module's excluded."""
    stack = []
    while frame is not None:
        filename = frame.f_code.co_filename
        if filename != p.this_file:
            stack.append((_kind(filename, p), filename, frame))
        frame = frame.f_back
    return stack


def _kind(filename: str, p) -> str:
    kind = p.kinds.get(filename)
    if kind is None:
        kind = p.kinds[filename] = _classify(filename, p)
    return kind


def _classify(filename: str, p) -> str:
    if filename.startswith("<frozen "):
        return _STDLIB  # importlib and the modules Python freezes (os, posixpath, ...)
    if not filename.startswith("/"):
        return _CANDIDATE  # "<string>", "<stdin>", a relative name: no real file vouches for it
    path = _resolve(filename, "/")
    if _under_any(path, p.owned):
        return _CANDIDATE
    if p.triton and _under(path, p.triton):
        return _TRITON
    if _under_any(path, p.stdlib) and not _under_any(path, p.site):
        return _STDLIB
    return _TRUSTED


def _caller(stack) -> tuple:
    """The first frame outside the standard library; candidate when there is none (a thread or
    atexit callback that runs only library code was started by someone, maybe the candidate)."""
    for entry in stack:
        if entry[0] != _STDLIB:
            return entry
    return (_CANDIDATE, "", None)


def _immediate(stack) -> tuple:
    return stack[0] if stack else (_CANDIDATE, "", None)


def _from_candidate(frame, p) -> bool:
    return _caller(_walk(frame, p))[0] == _CANDIDATE


def _stdlib_name(filename: str, p) -> str:
    """"dataclasses.py", "collections/__init__.py": a stdlib file relative to the stdlib root."""
    path = _resolve(filename, "/")
    for root in p.stdlib:
        if _under(path, root):
            return path[len(root) + 1:]
    return ""


def _from_import_system(stack) -> bool:
    filename = _immediate(stack)[1]
    return filename.startswith("<frozen importlib") or filename == "<frozen zipimport>"


def _triton_launched(stack, p) -> bool:
    """Triton code asked (the first non-stdlib frame), and the innermost run of Triton frames was
    entered through a launch entry point, not by calling a build helper directly."""
    run = []
    for kind, filename, _ in stack:
        if kind == _STDLIB:
            continue
        if kind != _TRITON:
            break
        run.append(filename)
    if not run:
        return False
    entry = _resolve(run[-1], "/")[len(p.triton) + 1:]
    return entry in _TRITON_ENTRIES


# -- rules: each returns what is denied, or None --------------------------------------------------

def _on_always(event, args, frame, p, state):
    return _ALWAYS_DENIED[event]


def _on_socket(event, args, frame, p, state):
    return "network access"


def _on_candidate_only(event, args, frame, p, state):
    return _CANDIDATE_DENIED[event] if _from_candidate(frame, p) else None


def _on_ctypes(event, args, frame, p, state):
    kind, filename, caller = _caller(_walk(frame, p))
    package, (file, function) = p.torch, _CTYPES_USERS["torch"]
    if kind == _TRUSTED and package and _resolve(filename, "/") == f"{package}/{file}":
        if function in caller.f_code.co_name:
            return None
    return _CTYPES[event]


def _on_kill(event, args, frame, p, state):
    pid = args[0]
    return None if type(pid) is int and pid == _getpid() else "signalling another process"


def _on_frame(event, args, frame, p, state):
    stack = _walk(frame, p)
    if _caller(stack)[0] != _CANDIDATE:
        return None
    kind, filename, _ = _immediate(stack)
    if kind == _STDLIB and _stdlib_name(filename, p) in _STDLIB_FRAME_USERS:
        return None  # namedtuple, typing, enum, warnings, logging: a module name or a line number
    return "reading the call stack"


def _on_introspection(event, args, frame, p, state):
    """Code objects only through the library (dataclasses asks inspect for a signature, which
    reads `__code__`); frames never, since their f_back leads to the harness's frames and locals."""
    name = args[1] if len(args) > 1 and type(args[1]) is str else "?"
    stack = _walk(frame, p)
    if _caller(stack)[0] != _CANDIDATE:
        return None
    if name in _FRAME_ATTRIBUTES:
        return f"reading `{name}` (a frame)"
    return f"reading `{name}` (a code object)" if _immediate(stack)[0] == _CANDIDATE else None


def _on_code_assignment(event, args, frame, p, state):
    if len(args) > 1 and type(args[1]) is str and args[1] == "__code__" and _from_candidate(frame, p):
        return "replacing a function's code"
    return None


def _on_compile(event, args, frame, p, state):
    """Direct compiling only: what library code compiles for the candidate (dataclass methods,
    namedtuple, typing's forward references, ast.parse, the traceback printer's caret parsing) is
    a code object that runs only through `exec`, judged below, or `function.__new__`, denied."""
    stack = _walk(frame, p)
    if _caller(stack)[0] == _CANDIDATE and _immediate(stack)[0] == _CANDIDATE:
        return "compiling source text"
    return None


def _on_exec(event, args, frame, p, state):
    """exec through the import system or a stdlib helper, of candidate-named code or of code that is
    exactly the module it names: a code object relabelled into Triton's folder never runs."""
    stack = _walk(frame, p)
    if _caller(stack)[0] != _CANDIDATE:
        return None
    refused = _helper_refusal(stack, p, "running a code object with exec or eval")
    if refused:
        return refused
    code = args[0]
    if type(code) is not _CodeType:
        return "running something that is not a code object"
    if _kind(code.co_filename, p) == _CANDIDATE or _is_genuine(code, p):
        return None  # candidate-named code, or a module the import system loaded for the candidate
    return f"running code under the name {code.co_filename!r}"


def _helper_refusal(stack, p, what: str):
    """Candidate code may exec only through the import system or the stdlib helpers above."""
    kind, filename, _ = _immediate(stack)
    if kind == _CANDIDATE:
        return what
    if _from_import_system(stack) or (kind == _STDLIB and _stdlib_name(filename, p) in _STDLIB_EXECUTORS):
        return None
    return f"{what} through {filename}"


def _on_marshal(event, args, frame, p, state):
    """Bytecode is not checked by Python; candidate code gets it only as the import system reading
    the cached .pyc it just opened, outside scratch (crafted bytecode corrupts memory)."""
    stack = _walk(frame, p)
    pyc, state.pyc, state.loaded = getattr(state, "pyc", None), None, None
    if _caller(stack)[0] != _CANDIDATE:
        return None
    data = args[0]
    if type(data) is memoryview:
        data = data.tobytes()  # importlib passes a view of the file's bytes
    cached = _read(pyc) if pyc else None
    if _from_import_system(stack) and cached is not None and type(data) is bytes and cached[16:] == data:
        state.loaded = pyc  # importlib now names the code after its source (_on_fix_co_filename)
        return None
    return "loading bytecode"


def _on_fix_co_filename(event, args, frame, p, state):
    """importlib renames the code it just unmarshalled after the source file beside that .pyc."""
    loaded, state.loaded = getattr(state, "loaded", None), None
    if not _guarded_call(args, 2):
        return "renaming a code object"
    stack = _walk(frame, p)
    if _caller(stack)[0] != _CANDIDATE:
        return None
    source = args[0][1]
    if _from_import_system(stack) and type(source) is str and loaded and loaded == _pyc_of(source):
        return None
    return "renaming a code object"


def _on_create_builtin(event, args, frame, p, state):
    """A fresh copy of a built-in module would hold unguarded originals of `_GUARDED`."""
    if not _guarded_call(args, 1):
        return "making a built-in module"
    spec = args[0][0]
    fields = _spec_dict(spec) if type(spec) is _ModuleSpec else None
    name = fields.get("name") if type(fields) is dict else None
    if type(name) is not str:
        return "making a built-in module from an unusual spec" if _from_candidate(frame, p) else None
    return f"making a fresh copy of the module {name!r}" if name in _UNSAFE_MODULES else None


def _guarded_call(args, count: int) -> bool:
    return len(args) == 1 and type(args[0]) is tuple and len(args[0]) == count


def _on_import(event, args, frame, p, state):
    name = args[0] if args and type(args[0]) is str else ""
    filename = _text(args[1]) if len(args) > 1 else None
    if name.partition(".")[0] in _UNSAFE_MODULES:
        return f"loading the module {name!r}"
    if filename is None:
        return None  # the `import` statement itself; only native extensions name a file
    path = _resolve(filename, _getcwd())
    if _under(path, p.cache):
        return None if _triton_launched(_walk(frame, p), p) else "loading a native extension from Triton's cache"
    if _under_any(path, p.owned) or not _under_any(path, p.installed):
        return f"loading the native extension {filename!r}"
    return None


def _on_open(event, args, frame, p, state):
    path, flags = args[0], args[2] if len(args) > 2 else 0
    if type(path) is int:
        return None  # wraps a descriptor already held (see the module docstring)
    text = _text(path)
    if text is None:
        return "opening a file named by an unusual object"
    writing = type(flags) is not int or flags & _WRITE_FLAGS
    resolved = _resolve(text, _getcwd())
    if resolved.endswith(".pyc") and _under_any(resolved, (p.scratch, p.cache)):
        return f"loading bytecode from {text!r}"
    if writing:
        if resolved == p.scratch:
            return None  # tempfile's open(folder, opener=...): the opener's own open is judged too
        return _write_refusal(resolved, text, frame, p)
    if _from_candidate(frame, p):
        refused = _read_refusal(resolved, text, p)
    else:
        refused = _library_read_refusal(resolved, text, p)
    if refused:
        return refused
    if resolved.endswith(".pyc"):
        state.pyc = resolved  # for the marshal.loads that follows
    return None


def _read_refusal(resolved: str, text: str, p):
    if not text.startswith("/") and ".." in text.split("/"):
        return f"reading {text!r} (relative paths may not climb)"
    if resolved in p.devices:
        return None
    if not _under_any(resolved, p.readable):
        return f"reading {text!r}"
    if _is_dir(resolved):
        return f"opening the directory {text!r}"
    return None


def _library_read_refusal(resolved: str, text: str, p):
    """Library code reads the same roots, plus system information: /sys, and /proc except other
    processes' entries (the worker's environ holds credentials). Without this limit, torch.load or
    numpy.load called by the candidate would read the problem or the reference outputs for it."""
    if resolved in p.devices or _under_any(resolved, p.readable) or _under(resolved, "/sys"):
        return None
    if _under(resolved, "/proc"):
        entry = resolved[len("/proc/"):].partition("/")[0]
        if not entry.isdigit() or entry == str(_getpid()):
            return None
    return f"reading {text!r}"


def _write_refusal(resolved: str, text: str, frame, p):
    if resolved == "/dev/null":
        return None
    if _under(resolved, p.cache):
        return None if _triton_launched(_walk(frame, p), p) else f"writing {text!r} in Triton's cache"
    if resolved != p.scratch and _under(resolved, p.scratch):
        return None
    return f"writing {text!r} outside the scratch folder"


def _on_listing(event, args, frame, p, state):
    path = args[0] if args else None
    if type(path) is int:
        return None
    text = "." if path is None else _text(path)
    if text is None:
        return "listing a directory named by an unusual object"
    stack = _walk(frame, p)
    if _caller(stack)[0] != _CANDIDATE or _from_import_system(stack):
        return None  # the import system lists sys.path entries (names only)
    if not text.startswith("/") and ".." in text.split("/"):
        return f"listing {text!r} (relative paths may not climb)"
    if _under_any(_resolve(text, _getcwd()), p.readable):
        return None
    return f"listing {text!r}"


def _on_mutation(event, args, frame, p, state):
    from_candidate = _from_candidate(frame, p)
    if from_candidate and event in ("os.link", "os.symlink"):
        return "making a link"  # links would let a checked path lead somewhere else
    for index, dir_fd_index in _MUTATIONS[event]:
        target = args[index]
        if type(target) is int:
            if from_candidate:
                return "changing a file through a descriptor"
            continue
        text = _text(target)
        if text is None:
            return "changing a file named by an unusual object"
        if from_candidate and not text.startswith("/") and ".." in text.split("/"):
            return f"changing {text!r} (relative paths may not climb)"
        dir_fd = args[dir_fd_index] if dir_fd_index is not None else -1
        if type(dir_fd) is not int and dir_fd is not None:
            return "changing a file relative to an unusual directory"
        base = _getcwd() if dir_fd is None or dir_fd == -1 else _readlink(f"/proc/self/fd/{dir_fd}")
        refused = _write_refusal(_resolve(text, base), text, frame, p)
        if refused:
            return refused
    return None


def _on_popen(event, args, frame, p, state):
    state.popen = None
    stack = _walk(frame, p)
    program = _text(args[0])
    if not _triton_launched(stack, p):
        if _caller(stack)[0] == _TRITON:
            return f"starting {program!r} from Triton code not entered through a kernel launch"
        return f"starting the program {program!r}" if program else "starting a program"
    calling = _subprocess_caller(stack, p)
    if calling is None or "subprocess" not in _source_line(calling, p):
        return "starting a program from Triton code that does not call subprocess there"
    found = _which(program, p) if program else None
    if found is None or not (found in p.tools or _under(found, p.triton)):
        return f"starting {program!r}, which is not one of Triton's tools"
    state.popen = _immediate(stack)[2]  # the Popen.__init__ frame this permit belongs to
    return None


def _subprocess_caller(stack, p):
    """The frame that called into subprocess: Triton code, or a stdlib spawner working for Triton."""
    for entry in stack:
        kind, filename, _ = entry
        if filename == p.subprocess_file:
            continue
        if kind == _TRITON or (kind == _STDLIB and _stdlib_name(filename, p) in _STDLIB_SPAWNERS):
            return entry
        return None
    return None


def _on_spawn(event, args, frame, p, state):
    """The spawn must come from subprocess.py, inside the Popen call the hook just permitted."""
    permit, state.popen = getattr(state, "popen", None), None
    if event == _SPAWN_EVENT and not (len(args) == 1 and type(args[0]) is tuple):
        return "starting a process directly"
    stack = _walk(frame, p)
    if permit is not None and _immediate(stack)[1] == p.subprocess_file:
        if any(entry[2] is permit for entry in stack):
            return None
    return "starting a process directly"


# -- paths and files ------------------------------------------------------------------------------

def _text(value):
    """A path argument as str; None for anything but str and bytes (never call its methods)."""
    if type(value) is str:
        return value
    if type(value) is bytes:
        return value.decode(_FS_ENCODING, "surrogateescape")
    return None


def _resolve(path: str, base: str) -> str:
    """The absolute path with every symbolic link followed, like os.path.realpath, but built only
    from primitives captured at import (os.path's helpers are module attributes anyone can replace)."""
    if not path.startswith("/"):
        path = base + "/" + path
    parts = [part for part in path.split("/") if part and part != "."]
    parts.reverse()  # a stack: the next component is at the end
    resolved, links = "", 0
    while parts:
        part = parts.pop()
        if part == "..":
            resolved = resolved[:resolved.rfind("/")] if resolved else ""
            continue
        here = resolved + "/" + part
        try:
            is_link = _S_ISLNK(_lstat(here).st_mode)
        except OSError:
            is_link = False  # missing: what follows is taken as written
        if not is_link:
            resolved = here
            continue
        links += 1
        if links > 40:
            raise OSError(f"too many symbolic links in {path!r}")
        target = _readlink(here)
        if target.startswith("/"):
            resolved = ""
        parts.extend(reversed([t for t in target.split("/") if t and t != "."]))
    return resolved or "/"


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root + "/")


def _under_any(path: str, roots) -> bool:
    for root in roots:
        if _under(path, root):
            return True
    return False


def _is_dir(path: str) -> bool:
    try:
        return _S_ISDIR(_lstat(path).st_mode)
    except OSError:
        return False


def _read(path: str):
    """The file's bytes, or None when it cannot be read."""
    try:
        with _open_file(path, "rb") as handle:
            return handle.read()
    except OSError:
        return None


def _which(program: str, p):
    """The resolved file `program` names, searching PATH as it was at confine for a bare name."""
    if "/" in program:
        return _resolve(program, _getcwd())
    for directory in p.path_dirs:
        path = _resolve(directory + "/" + program, _getcwd())
        try:
            if _S_ISREG(_lstat(path).st_mode):
                return path
        except OSError:
            continue
    return None


def _source_line(entry, p) -> str:
    """The source line a frame is executing, read from its file by the hook (not linecache, whose
    cache anyone can fill)."""
    _, filename, frame = entry
    if frame is None:
        return ""
    lines = p.lines.get(filename)
    if lines is None:
        lines = p.lines[filename] = (_read(filename) or b"").decode("utf-8", "replace").splitlines()
    number = frame.f_lineno
    return lines[number - 1] if number and 0 < number <= len(lines) else ""


def _pyc_of(source: str) -> str:
    """Where importlib caches the bytecode of `source` (importlib.util.cache_from_source, by hand)."""
    directory, _, name = source.rpartition("/")
    return f"{directory}/__pycache__/{name.rpartition('.')[0]}.{_CACHE_TAG}{_OPT_TAG}.pyc"


def _is_genuine(code, p) -> bool:
    """True when `code` equals the code compiled from the file its co_filename names (its cached
    .pyc, else its source), or the frozen module it claims to be: nothing forged its name."""
    filename = code.co_filename
    if filename.startswith("<frozen ") and filename.endswith(">"):
        try:
            return _get_frozen_object(filename[8:-1]) == code
        except ImportError:
            return False
    if not filename.startswith("/") or not filename.endswith(".py"):
        return False
    cached = _read(_pyc_of(filename))
    if cached is not None and len(cached) > 16:
        try:
            if _marshal_loads(cached[16:]) == code:
                return True
        except (ValueError, EOFError, TypeError):
            pass  # a broken cache file: compare with the source instead
    source = _read(filename)  # no cached bytecode: importlib compiled the source (maybe empty)
    try:
        return source is not None and compile(source, filename, "exec", dont_inherit=True) == code
    except (SyntaxError, ValueError):
        return False


# -- the environment ------------------------------------------------------------------------------

_ENV_KEEP = frozenset({"PATH", "LANG", "LANGUAGE", "TERM", "TZ", "PYTHONPATH", "PYTHONHASHSEED",
                       "PYTHONUNBUFFERED", "LD_LIBRARY_PATH", "CUDA_HOME", "CUDA_PATH",
                       "CUDA_VISIBLE_DEVICES", "TRITON_INTERPRET", "OMP_NUM_THREADS"})
_ENV_KEEP_PREFIXES = ("LC_", "TRITON_", "CUDA_")
_ENV_SECRET = re.compile(r"KEY|TOKEN|SECRET|PASSW|CREDENTIAL|AUTH|COOKIE|SESSION", re.IGNORECASE)


def candidate_env(base: Mapping[str, str], scratch: Path) -> dict[str, str]:
    """A whitelist environment: no credentials (no *_KEY, *_TOKEN, *_SECRET, AWS_*, ...), HOME=scratch.

    Kept: PATH, locale, PYTHONPATH, the CUDA and Triton settings (TRITON_PTXAS_PATH and friends),
    LD_LIBRARY_PATH. TRITON_CACHE_DIR is dropped: the caller sets it to the confined cache folder.
    HOME and the temp folders point at scratch, and Python writes no bytecode there or elsewhere.
    """
    env = {
        key: value for key, value in base.items()
        if (key in _ENV_KEEP or key.startswith(_ENV_KEEP_PREFIXES))
        and not _ENV_SECRET.search(key) and key != "TRITON_CACHE_DIR"
    }
    home = str(scratch)
    env.update(HOME=home, TMPDIR=home, TMP=home, TEMP=home, PYTHONDONTWRITEBYTECODE="1")
    return env
