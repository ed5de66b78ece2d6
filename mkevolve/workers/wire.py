"""Values between trusted and candidate processes as raw bytes: nothing a candidate writes is unpickled.

A value file is `MKV1`, a 4-byte header length, a JSON header, then the raw bytes of every tensor:

    MKV1 | u32 n | header (n bytes of JSON) | tensor 0 bytes | tensor 1 bytes | ...

The header describes one value tree: plain scalars, strings, None, lists and tuples of them, and
tensors as {"t": "tensor", "dtype", "shape", "offset", "nbytes"} pointing into the data section.
Every field is checked before a byte is trusted, so a file from a candidate process can be wrong but
cannot run code or make the reader allocate more than the file holds.

The writing side runs in a candidate process after its code was imported, so it calls only what it
bound at import: torch's C tensor methods (with Python overrides off), OpenSSL's hashes, the C JSON
encoder, `_thread`'s threads and locks, and its own copies of the builtins (see verify/harness.py for why).

The writer pads the header and every tensor to 64 bytes, so the reader makes tensors that point into
the one buffer it read the file into: a KernelBench output of 32 MB is copied once from the page cache,
then once to the GPU.

A candidate's report is JSON signed with an HMAC key the candidate's code never sees: a report that
code forged on its own does not verify.
"""

from __future__ import annotations

import _hashlib
import _json
import _thread
import hmac
import json
import math
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from mkevolve.workers.harden import own_builtins

MAGIC = b"MKV1"
_LENGTH = struct.Struct("!I")
MAX_HEADER_BYTES = 4 << 20
MAX_REPORT_BYTES = 16 << 20
_MAX_DEPTH = 8
_ALIGN = 64  # bytes; the data section and every tensor start on this boundary

# dtype names on the wire: torch's own, limited to those a KernelBench-style model passes around.
DTYPES = {name: getattr(torch, name) for name in (
    "float64", "float32", "float16", "bfloat16", "int64", "int32", "int16", "int8", "uint8", "bool",
    "complex64", "complex128", "float8_e4m3fn", "float8_e5m2",
) if hasattr(torch, name)}
_DTYPE_NAMES = {dtype: name for name, dtype in DTYPES.items()}

# Bound at import, before any candidate code runs (see the module docstring).
_Tensor, _TensorBase, _UINT8 = torch.Tensor, torch._C.TensorBase, torch.uint8
_dtype_of, _shape_of = _TensorBase.__dict__["dtype"].__get__, _TensorBase.__dict__["shape"].__get__
_numel, _element_size = _TensorBase.numel, _TensorBase.element_size
_detach, _contiguous, _cpu, _view, _reshape, _numpy = (_TensorBase.detach, _TensorBase.contiguous, _TensorBase.cpu,
                                                       _TensorBase.view, _TensorBase.reshape, _TensorBase.numpy)
_no_torch_function, _no_torch_dispatch = torch._C.DisableTorchFunction, torch._C._DisableTorchDispatch
_sha256, _hmac_digest, _compare_digest = _hashlib.openssl_sha256, _hashlib.hmac_digest, hmac.compare_digest
_start_thread, _allocate_lock = _thread.start_new_thread, _thread.allocate_lock


def _unencodable(value: Any) -> Any:
    raise WireError("only JSON values can be written")  # never names the value: its methods are foreign


_encode_json = _json.make_encoder(None, _unencodable, _json.encode_basestring_ascii, None, ":", ",",
                                  True, False, True)  # sorted keys, compact, NaN allowed: one canonical form


def _dumps(value: Any) -> bytes:
    return "".join(_encode_json(value, 0)).encode()


class WireError(ValueError):
    """A value file or report that does not follow the layout; the message says where it breaks."""


# ---- value files --------------------------------------------------------------------------------------


def write_values(path: str | Path, values: Any) -> str:
    """Write a value tree (tensors are copied to the host); returns the file's sha256, computed from the bytes
    in memory (not read back from the file) by a thread of its own while they are written: both let go of
    the GIL, so a full-size output costs the longer of the two rather than their sum."""
    tensors: list = []
    header = {"value": _describe(values, tensors, [0])}
    blob = _dumps(header)
    blob += b" " * (-(8 + len(blob)) % _ALIGN)  # JSON allows trailing spaces; the data starts aligned
    chunks = [MAGIC, _LENGTH.pack(len(blob)), blob]
    for tensor in tensors:
        with _no_torch_function(), _no_torch_dispatch():
            host = _cpu(_contiguous(_detach(tensor)))
            data = _numpy(_view(_reshape(host, (-1,)), _UINT8)).data   # flat first: a 0-d tensor has no last dim
        chunks += [data, b"\0" * (-len(data) % _ALIGN)]
    digest = _SideHash(chunks)
    with open(path, "wb") as out:
        for chunk in chunks:
            out.write(chunk)
    return digest.hexdigest()


class _SideHash:
    """The sha256 of `chunks` in order, computed by a thread started at once; hexdigest() waits for it.
    A thread from `_thread`, bound at import, as the harness's are (see the module docstring)."""

    def __init__(self, chunks: list):
        self._chunks, self._hex = chunks, None
        self._done = _allocate_lock()
        self._done.acquire()
        _start_thread(self._run, ())

    def _run(self) -> None:
        try:
            digest = _sha256()
            for chunk in self._chunks:
                digest.update(chunk)
            self._hex = digest.hexdigest()
        finally:
            self._done.release()

    def hexdigest(self) -> str:
        self._done.acquire()
        self._done.release()
        if self._hex is None:
            raise WireError("the written bytes could not be hashed")
        return self._hex


def _describe(value: Any, tensors: list, offset: list[int]) -> dict:
    """The header entry of one value; exact types only (a subclass's methods are foreign code)."""
    kind = type(value)
    if kind is _Tensor:
        dtype = _dtype_of(value)
        if dtype not in _DTYPE_NAMES:
            raise WireError(f"tensor dtype {dtype} cannot be sent")
        nbytes = _numel(value) * _element_size(value)
        spec = {"t": "tensor", "dtype": _DTYPE_NAMES[dtype], "shape": list(_shape_of(value)),
                "offset": offset[0], "nbytes": nbytes}
        tensors.append(value)
        offset[0] += nbytes + (-nbytes % _ALIGN)
        return spec
    if kind is list or kind is tuple:
        return {"t": "list" if kind is list else "tuple", "items": [_describe(v, tensors, offset) for v in value]}
    if value is None or kind is bool or kind is int or kind is float or kind is str:  # `is`: no foreign __eq__
        return {"t": "scalar", "v": value}
    if kind is torch.dtype and value in _DTYPE_NAMES:
        return {"t": "dtype", "v": _DTYPE_NAMES[value]}
    raise WireError("only plain tensors, scalars, strings, None, dtypes and lists or tuples of them can "
                    "be sent")


def read_values(path: Path, device: str | torch.device = "cpu") -> Any:
    """Read a value file written by `write_values`, checking every field; tensors land on `device`.

    On the "meta" device only the header is read: the value's structure, shapes and dtypes, no data."""
    path = Path(path)
    if torch.device(device).type == "meta":
        with open(path, "rb") as stream:
            head = stream.read(8 + MAX_HEADER_BYTES)
        return parse_values(head, device, path.name, file_size=path.stat().st_size)
    return parse_values(read_file(path), device, path.name)


def read_file(path: Path) -> bytearray:
    """The whole file in one writable buffer (tensors are made over it without a further copy)."""
    with open(path, "rb") as stream:
        size = os.fstat(stream.fileno()).st_size
        data = bytearray(size)
        if stream.readinto(data) != size:
            raise WireError(f"{Path(path).name}: changed while it was read")
    return data


def parse_values(data: bytearray | bytes, device: str | torch.device, name: str,
                 file_size: int | None = None) -> Any:
    """The value tree in `data` (a value file's bytes; only its head when `device` is "meta", with
    the whole file's size in `file_size`)."""
    if data[:4] != MAGIC or len(data) < 8:
        raise WireError(f"{name}: not a value file")
    (length,) = _LENGTH.unpack(data[4:8])
    size = len(data) if file_size is None else file_size
    if length > MAX_HEADER_BYTES or 8 + length > min(size, len(data)):
        raise WireError(f"{name}: header length {length} does not fit the file")
    try:
        header = json.loads(bytes(data[8:8 + length]))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise WireError(f"{name}: header is not JSON ({err})") from None
    if not isinstance(header, dict) or "value" not in header:
        raise WireError(f"{name}: header has no value")
    body = _Body(data, 8 + length, size - 8 - length)
    return _rebuild(header["value"], body, torch.device(device), 0, name)


@dataclass(frozen=True)
class _Body:
    """The data section: where it starts in the buffer, and how many bytes the file holds there."""

    data: bytearray | bytes
    start: int
    size: int


def _rebuild(spec: Any, body: _Body, device: torch.device, depth: int, where: str) -> Any:
    if depth > _MAX_DEPTH or not isinstance(spec, dict):
        raise WireError(f"{where}: malformed value description")
    kind = spec.get("t")
    if kind == "tensor":
        return _tensor(spec, body, device, where)
    if kind in ("list", "tuple"):
        items = spec.get("items")
        if not isinstance(items, list):
            raise WireError(f"{where}: {kind} without items")
        values = [_rebuild(item, body, device, depth + 1, where) for item in items]
        return values if kind == "list" else tuple(values)
    if kind == "scalar":
        value = spec.get("v")
        if value is not None and not isinstance(value, (bool, int, float, str)):
            raise WireError(f"{where}: scalar of type {type(value).__name__}")
        return value
    if kind == "dtype" and spec.get("v") in DTYPES:
        return DTYPES[spec["v"]]
    raise WireError(f"{where}: unknown value kind {kind!r}")


def _tensor(spec: dict, body: _Body, device: torch.device, where: str) -> torch.Tensor:
    dtype = DTYPES.get(spec.get("dtype"))
    shape, offset, nbytes = spec.get("shape"), spec.get("offset"), spec.get("nbytes")
    if dtype is None:
        raise WireError(f"{where}: unknown dtype {spec.get('dtype')!r}")
    if not (isinstance(shape, list) and all(isinstance(n, int) and not isinstance(n, bool) and n >= 0
                                            for n in shape)):
        raise WireError(f"{where}: bad shape {shape!r}")
    itemsize = torch.empty((), dtype=dtype).element_size()
    if not (isinstance(offset, int) and isinstance(nbytes, int) and offset >= 0
            and nbytes == math.prod(shape) * itemsize and offset + nbytes <= body.size):
        raise WireError(f"{where}: tensor bytes [{offset}, +{nbytes}) do not match its shape or the file")
    if nbytes == 0 or device.type == "meta":
        return torch.empty(shape, dtype=dtype, device=device)
    start = body.start + offset
    if isinstance(body.data, bytearray) and start % itemsize == 0:
        raw = torch.frombuffer(body.data, dtype=torch.uint8, count=nbytes, offset=start)
    else:  # read-only bytes, or a file from a writer that did not align: one more copy
        raw = torch.frombuffer(bytearray(body.data[start:start + nbytes]), dtype=torch.uint8)
    return raw.view(dtype).reshape(shape).to(device)


def file_digest(path: Path) -> str:
    return _sha256(read_file(path)).hexdigest()


# ---- signed reports -------------------------------------------------------------------------------------


def sign_report(body: dict, key: bytes) -> bytes:
    mac = _hmac_digest(key, _dumps(body), "sha256").hex()
    return _dumps({"body": body, "mac": mac})


def verify_report(data: bytes, key: bytes) -> dict:
    """The report's body when its signature holds; WireError otherwise (forged, garbage, truncated)."""
    if len(data) > MAX_REPORT_BYTES:
        raise WireError(f"report of {len(data)} bytes is larger than any the harness writes")
    try:
        envelope = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise WireError("the report is not JSON") from None
    if not isinstance(envelope, dict) or not isinstance(envelope.get("body"), dict):
        raise WireError("the report has no body")
    expected = _hmac_digest(key, _dumps(envelope["body"]), "sha256").hex()
    if not isinstance(envelope.get("mac"), str) or not _compare_digest(expected, envelope["mac"]):
        raise WireError("the report's signature does not verify")
    return envelope["body"]


own_builtins(globals())
