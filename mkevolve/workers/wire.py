"""Values between trusted and candidate processes as raw bytes: nothing a candidate writes is unpickled.

A value file is `MKV1`, a 4-byte header length, a JSON header, then the raw bytes of every tensor:

    MKV1 | u32 n | header (n bytes of JSON) | tensor 0 bytes | tensor 1 bytes | ...

The header describes one value tree: plain scalars, strings, None, lists and tuples of them, and
tensors as {"t": "tensor", "dtype", "shape", "offset", "nbytes"} pointing into the data section.
Every field is checked before a byte is trusted, so a file from a candidate process can be wrong but
cannot run code or make the reader allocate more than the file holds.

A candidate's report is JSON signed with an HMAC key the candidate's code never sees: a report that
code forged on its own does not verify.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import math
import struct
from pathlib import Path
from typing import Any

import torch

MAGIC = b"MKV1"
_LENGTH = struct.Struct("!I")
MAX_HEADER_BYTES = 4 << 20
MAX_REPORT_BYTES = 16 << 20
_MAX_DEPTH = 8

# dtype names on the wire: torch's own, limited to those a KernelBench-style model passes around.
DTYPES = {name: getattr(torch, name) for name in (
    "float64", "float32", "float16", "bfloat16", "int64", "int32", "int16", "int8", "uint8", "bool",
    "complex64", "complex128", "float8_e4m3fn", "float8_e5m2",
) if hasattr(torch, name)}
_DTYPE_NAMES = {dtype: name for name, dtype in DTYPES.items()}


class WireError(ValueError):
    """A value file or report that does not follow the layout; the message says where it breaks."""


# ---- value files --------------------------------------------------------------------------------------


def write_values(path: Path, values: Any) -> str:
    """Write a value tree (tensors are copied to the host); returns the file's sha256."""
    tensors: list[torch.Tensor] = []
    header = {"value": _describe(values, tensors, [0])}
    blob = json.dumps(header, allow_nan=True).encode()
    digest = hashlib.sha256()
    with open(path, "wb") as out:
        for chunk in (MAGIC, _LENGTH.pack(len(blob)), blob):
            out.write(chunk)
            digest.update(chunk)
        for tensor in tensors:
            data = tensor.detach().contiguous().cpu().view(torch.uint8).reshape(-1).numpy().data
            out.write(data)
            digest.update(data)
    return digest.hexdigest()


def _describe(value: Any, tensors: list[torch.Tensor], offset: list[int]) -> dict:
    if isinstance(value, torch.Tensor):
        if value.dtype not in _DTYPE_NAMES:
            raise WireError(f"tensor dtype {value.dtype} cannot be sent")
        nbytes = value.numel() * value.element_size()
        spec = {"t": "tensor", "dtype": _DTYPE_NAMES[value.dtype], "shape": list(value.shape),
                "offset": offset[0], "nbytes": nbytes}
        tensors.append(value)
        offset[0] += nbytes
        return spec
    if isinstance(value, (list, tuple)):
        kind = "list" if isinstance(value, list) else "tuple"
        return {"t": kind, "items": [_describe(v, tensors, offset) for v in value]}
    if value is None or isinstance(value, (bool, int, float, str)):
        return {"t": "scalar", "v": value}
    if isinstance(value, torch.dtype) and value in _DTYPE_NAMES:
        return {"t": "dtype", "v": _DTYPE_NAMES[value]}
    raise WireError(f"a {type(value).__name__} cannot be sent; only tensors, scalars, strings, None, "
                    "dtypes and lists or tuples of them")


def read_values(path: Path, device: str | torch.device = "cpu") -> Any:
    """Read a value file written by `write_values`, checking every field; tensors land on `device`."""
    path = Path(path)
    data = path.read_bytes()
    if data[:4] != MAGIC or len(data) < 8:
        raise WireError(f"{path.name}: not a value file")
    (length,) = _LENGTH.unpack(data[4:8])
    if length > MAX_HEADER_BYTES or 8 + length > len(data):
        raise WireError(f"{path.name}: header length {length} does not fit the file")
    try:
        header = json.loads(data[8:8 + length])
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise WireError(f"{path.name}: header is not JSON ({err})") from None
    if not isinstance(header, dict) or "value" not in header:
        raise WireError(f"{path.name}: header has no value")
    body = memoryview(data)[8 + length:]
    return _rebuild(header["value"], body, torch.device(device), 0, path.name)


def _rebuild(spec: Any, body: memoryview, device: torch.device, depth: int, where: str) -> Any:
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


def _tensor(spec: dict, body: memoryview, device: torch.device, where: str) -> torch.Tensor:
    dtype = DTYPES.get(spec.get("dtype"))
    shape, offset, nbytes = spec.get("shape"), spec.get("offset"), spec.get("nbytes")
    if dtype is None:
        raise WireError(f"{where}: unknown dtype {spec.get('dtype')!r}")
    if not (isinstance(shape, list) and all(isinstance(n, int) and not isinstance(n, bool) and n >= 0
                                            for n in shape)):
        raise WireError(f"{where}: bad shape {shape!r}")
    itemsize = torch.empty((), dtype=dtype).element_size()
    if not (isinstance(offset, int) and isinstance(nbytes, int) and offset >= 0
            and nbytes == math.prod(shape) * itemsize and offset + nbytes <= len(body)):
        raise WireError(f"{where}: tensor bytes [{offset}, +{nbytes}) do not match its shape or the file")
    if nbytes == 0:
        return torch.empty(shape, dtype=dtype, device=device)
    raw = torch.frombuffer(bytearray(body[offset:offset + nbytes]), dtype=torch.uint8)
    return raw.view(dtype).reshape(shape).to(device)


def file_digest(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as stream:
        for chunk in iter(lambda: stream.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


# ---- signed reports -------------------------------------------------------------------------------------


def _canonical(body: dict) -> bytes:
    return json.dumps(body, sort_keys=True, separators=(",", ":"), allow_nan=True).encode()


def sign_report(body: dict, key: bytes) -> bytes:
    mac = hmac.new(key, _canonical(body), hashlib.sha256).hexdigest()
    return json.dumps({"body": body, "mac": mac}, allow_nan=True).encode()


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
    expected = hmac.new(key, _canonical(envelope["body"]), hashlib.sha256).hexdigest()
    if not isinstance(envelope.get("mac"), str) or not hmac.compare_digest(expected, envelope["mac"]):
        raise WireError("the report's signature does not verify")
    return envelope["body"]
