"""Minimal safetensors reader and writer in numpy (no torch, no safetensors package).

File layout (https://github.com/huggingface/safetensors): an 8-byte little-endian u64 N, then N bytes
of JSON header {name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {...}}, then
the raw little-endian tensor bytes; offsets are relative to the end of the header.

Reading returns float32 arrays for F32, BF16 and F16 tensors (bf16 -> fp32 is exact: the 16 bits
become the top half of the fp32 bit pattern). Writing supports F32 and BF16 (fp32 -> bf16 with
round-to-nearest-even; exact for bf16-representable values)."""
import json
import struct

import numpy as np


class SafetensorsError(ValueError):
    pass


def bf16_bits_to_f32(u16):
    """uint16 bf16 bit patterns -> float32 (exact)."""
    return (np.asarray(u16, dtype=np.uint16).astype(np.uint32) << np.uint32(16)).view(np.float32)


def f32_to_bf16_bits(x):
    """float32 -> uint16 bf16 bit patterns, round-to-nearest-even (NaN kept quiet NaN)."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    with np.errstate(over="ignore"):
        rounded = (u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)
    nan = np.isnan(np.asarray(x, dtype=np.float32))
    out = rounded.astype(np.uint16)
    out[nan] = ((u[nan] >> np.uint32(16)) | np.uint32(0x0040)).astype(np.uint16)
    return out


def round_to_bf16(x):
    """float32 array -> float32 array of the nearest bf16 values (round-to-nearest-even)."""
    return bf16_bits_to_f32(f32_to_bf16_bits(x))


def read_header(path):
    """(header dict without __metadata__, metadata dict, data start offset)."""
    with open(path, "rb") as f:
        raw = f.read(8)
        if len(raw) != 8:
            raise SafetensorsError(f"{path}: truncated safetensors header length")
        (n,) = struct.unpack("<Q", raw)
        if n > 100_000_000:
            raise SafetensorsError(f"{path}: implausible safetensors header length {n}")
        hj = f.read(n)
        if len(hj) != n:
            raise SafetensorsError(f"{path}: truncated safetensors header")
    try:
        header = json.loads(hj.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise SafetensorsError(f"{path}: bad safetensors JSON header ({e})")
    meta = header.pop("__metadata__", {}) or {}
    return header, meta, 8 + n


_DT = {"F32": ("<f4", 4), "BF16": ("<u2", 2), "F16": ("<f2", 2)}


def read_safetensors(path):
    """{name: float32 ndarray} for every tensor of a .safetensors file; dtypes F32, BF16, F16."""
    header, _meta, start = read_header(path)
    with open(path, "rb") as f:
        data = f.read()
    nbody = len(data) - start
    out = {}
    for name, info in header.items():
        dt = info.get("dtype")
        shape = tuple(int(s) for s in info.get("shape", []))
        b, e = info.get("data_offsets", [0, 0])
        if dt not in _DT:
            raise SafetensorsError(f"{path}: tensor {name}: unsupported dtype {dt} (F32, BF16, F16 only)")
        npdt, size = _DT[dt]
        count = int(np.prod(shape)) if shape else 1
        if e - b != count * size or b < 0 or e > nbody:
            raise SafetensorsError(f"{path}: tensor {name}: data_offsets {b}..{e} do not match "
                                   f"shape {list(shape)} {dt} (data {nbody} bytes)")
        a = np.frombuffer(data, dtype=npdt, count=count, offset=start + b)
        if dt == "BF16":
            a = bf16_bits_to_f32(a)
        else:
            a = a.astype(np.float32)
        out[name] = a.reshape(shape)
    return out


def write_safetensors(path, tensors, dtype="F32", metadata=None):
    """Write {name: array} as a .safetensors file, every tensor in `dtype` ("F32" or "BF16").
    Tensors are stored in sorted-name order (as the safetensors library does)."""
    if dtype not in ("F32", "BF16"):
        raise ValueError("dtype must be F32 or BF16")
    header, blobs, off = {}, [], 0
    for name in sorted(tensors):
        a = np.asarray(tensors[name], dtype=np.float32)
        if dtype == "F32":
            blob = np.ascontiguousarray(a).astype("<f4").tobytes()
        else:
            blob = f32_to_bf16_bits(a).astype("<u2").tobytes()
        header[name] = {"dtype": dtype, "shape": list(a.shape), "data_offsets": [off, off + len(blob)]}
        blobs.append(blob)
        off += len(blob)
    full = {"__metadata__": dict(metadata or {"format": "pt"})}
    full.update(header)
    hj = json.dumps(full, separators=(",", ":")).encode("utf-8")
    hj += b" " * ((-len(hj)) % 8)  # pad so the data starts 8-byte aligned
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hj)))
        f.write(hj)
        for blob in blobs:
            f.write(blob)
