"""Python side of train_sdc's file formats (docs/formats.md): checksum, token shards, decode table,
checkpoints, and the learning-rate schedule. numpy only, so every tool that needs it runs without
PyTorch. The C side is llmc/host/checksum.h, llmc/host/dataloader.h, llmc/host/tokenizer.h, llmc/checkpoint.h."""
import math
import os
import struct

import numpy as np

G = np.uint64(0x9E3779B97F4A7C15)
M1 = np.uint64(0xBF58476D1CE4E5B9)
M2 = np.uint64(0x94D049BB133111EB)
MASK = (1 << 64) - 1


def _fin(z):
    z = z ^ (z >> np.uint64(30))
    z = z * M1
    z = z ^ (z >> np.uint64(27))
    z = z * M2
    return z ^ (z >> np.uint64(31))


def checksum(data) -> int:
    """tsdc_checksum of a bytes-like object (see docs/formats.md)."""
    b = bytes(data) if not isinstance(data, (bytes, bytearray, memoryview)) else data
    b = memoryview(b).cast("B")
    n = len(b)
    pad = (-n) % 8
    buf = bytes(b) + b"\0" * pad
    total = (n * 0x9E3779B97F4A7C15) & MASK
    chunk = 1 << 22  # words a chunk, to bound memory
    words_all = np.frombuffer(buf, dtype="<u8")
    with np.errstate(over="ignore"):
        for s in range(0, len(words_all), chunk):
            w = words_all[s:s + chunk].astype(np.uint64)
            idx = np.arange(s + 1, s + 1 + len(w), dtype=np.uint64)
            t = _fin(w + idx * G)
            # sum mod 2^64 without overflow warnings: numpy uint64 sum wraps
            total = (total + int(t.sum(dtype=np.uint64))) & MASK
    return total


# ---------------------------------------------------------------- token shards
SHARD_MAGIC = b"TSDCTOK\0"
SHARD_HEADER = 256


def write_shard(path, tokens, vocab_size, row=0):
    """A token shard; row > 0 writes a row shard of independent rows of `row` tokens (docs/formats.md)."""
    tokens = np.asarray(tokens).reshape(-1)
    if row and (row < 2 or tokens.size == 0 or tokens.size % row):
        raise ValueError(f"{path}: {tokens.size} tokens are not rows of {row} tokens")
    width = 2 if vocab_size <= 65536 else 4
    if tokens.size and int(tokens.max()) >= vocab_size:
        raise ValueError(f"{path}: token id {int(tokens.max())} >= vocab size {vocab_size}")
    if tokens.size and int(tokens.min()) < 0:
        raise ValueError(f"{path}: negative token id {int(tokens.min())}")
    arr = tokens.astype("<u2" if width == 2 else "<u4")
    body = arr.tobytes()
    hdr = bytearray(SHARD_HEADER)
    struct.pack_into("<8sIIIIQQ", hdr, 0, SHARD_MAGIC, 1, width, vocab_size, row, arr.size, checksum(body))
    _atomic_write(path, bytes(hdr) + body)


def read_shard(path):
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < SHARD_HEADER:
        raise ValueError(f"{path}: truncated header")
    magic, ver, width, vocab, _, n, chk = struct.unpack_from("<8sIIIIQQ", data, 0)
    if magic != SHARD_MAGIC or ver != 1:
        raise ValueError(f"{path}: not a train_sdc token shard (magic/version)")
    if width not in (2, 4):
        raise ValueError(f"{path}: bad token width {width} (expected 2 or 4)")
    if len(data) != SHARD_HEADER + n * width:
        raise ValueError(f"{path}: size mismatch")
    body = data[SHARD_HEADER:]
    if checksum(body) != chk:
        raise ValueError(f"{path}: checksum mismatch")
    return np.frombuffer(body, dtype="<u2" if width == 2 else "<u4").astype(np.int64), vocab


# ---------------------------------------------------------------- decode table
VOCAB_MAGIC = b"TSDCVOC\0"
NONE_ID = 0xFFFFFFFF


def write_vocab(path, token_bytes, bos_id=None, eos_id=None):
    """token_bytes: list of bytes, index = token id."""
    body = bytearray()
    for tb in token_bytes:
        body += struct.pack("<I", len(tb)) + bytes(tb)
    hdr = bytearray(64)
    struct.pack_into("<8sIIIIQ", hdr, 0, VOCAB_MAGIC, 1, len(token_bytes),
                     NONE_ID if bos_id is None else bos_id, NONE_ID if eos_id is None else eos_id,
                     checksum(bytes(body)))
    _atomic_write(path, bytes(hdr) + bytes(body))


def read_vocab(path):
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < 64:
        raise ValueError(f"{path}: truncated header")
    magic, ver, V, bos, eos, chk = struct.unpack_from("<8sIIIIQ", data, 0)
    if magic != VOCAB_MAGIC or ver != 1:
        raise ValueError(f"{path}: not a train_sdc decode table")
    body = data[64:]
    if checksum(body) != chk:
        raise ValueError(f"{path}: checksum mismatch")
    out, off = [], 0
    for i in range(V):
        if off + 4 > len(body):
            raise ValueError(f"{path}: entry {i} runs past the end of the file")
        (n,) = struct.unpack_from("<I", body, off)
        if off + 4 + n > len(body):
            raise ValueError(f"{path}: entry {i} runs past the end of the file")
        out.append(body[off + 4:off + 4 + n])
        off += 4 + n
    if off != len(body):
        raise ValueError(f"{path}: {len(body) - off} bytes after the last entry")
    return out, (None if bos == NONE_ID else bos), (None if eos == NONE_ID else eos)


# ---------------------------------------------------------------- model config / parameter layout
CONFIG_FIELDS_I = ["n_layer", "d_model", "n_head", "n_kv_head", "head_dim", "ffn_dim", "vocab_size",
                   "seq_len", "mlp", "norm_weighted", "qk_norm", "rope_style", "rope_llama3", "tied",
                   "embed_norm"]
CONFIG_FIELDS_D = ["rope_theta", "norm_eps", "softcap", "rope_factor", "rope_low", "rope_high",
                   "rope_orig"]


def param_layout(cfg):
    """[(name, shape)] in checkpoint order (docs/formats.md)."""
    d, V, hd, F = cfg["d_model"], cfg["vocab_size"], cfg["head_dim"], cfg["ffn_dim"]
    H, KV = cfg["n_head"], cfg["n_kv_head"]
    out = [("wte", (V, d))]
    if cfg["embed_norm"] and cfg["norm_weighted"]:
        out.append(("embed_norm_w", (d,)))
    for l in range(cfg["n_layer"]):
        p = f"layers.{l}."
        if cfg["norm_weighted"]:
            out.append((p + "attn_norm_w", (d,)))
        out += [(p + "wq", (H * hd, d)), (p + "wk", (KV * hd, d)), (p + "wv", (KV * hd, d))]
        if cfg["qk_norm"] == 1:
            out += [(p + "q_norm_w", (hd,)), (p + "k_norm_w", (hd,))]
        out.append((p + "wo", (d, H * hd)))
        if cfg["norm_weighted"]:
            out.append((p + "mlp_norm_w", (d,)))
        if cfg["mlp"] == 0:
            out += [(p + "w_gate", (F, d)), (p + "w_up", (F, d))]
        else:
            out.append((p + "w_fc", (F, d)))
        out.append((p + "w_down", (d, F)))
    if cfg["norm_weighted"]:
        out.append(("final_norm_w", (d,)))
    if not cfg["tied"]:
        out.append(("lm_head", (V, d)))
    return out


# ---------------------------------------------------------------- checkpoints
CKPT_MAGIC = b"TSDCCKPT"
CKPT_HEADER = 4096


def write_checkpoint(path, preset, cfg, params):
    """Write a weights-only checkpoint (step 0, no optimizer state). params: dict name -> array in
    the shapes of param_layout(cfg)."""
    layout = param_layout(cfg)
    chunks = []
    for name, shape in layout:
        a = np.asarray(params[name], dtype=np.float32)
        if a.shape != shape:
            raise ValueError(f"{name}: shape {a.shape}, expected {shape}")
        chunks.append(np.ascontiguousarray(a).astype("<f4").tobytes())
    body = b"".join(chunks)
    n_params = len(body) // 4
    hdr = bytearray(CKPT_HEADER)
    struct.pack_into("<8sII", hdr, 0, CKPT_MAGIC, 1, CKPT_HEADER)
    struct.pack_into("<32s", hdr, 16, preset.encode()[:31])
    struct.pack_into("<15i", hdr, 48, *[int(cfg[k]) for k in CONFIG_FIELDS_I])
    struct.pack_into("<7d", hdr, 112, *[float(cfg[k]) for k in CONFIG_FIELDS_D])
    struct.pack_into("<Q", hdr, 168, n_params)
    struct.pack_into("<i", hdr, 228, 1)
    struct.pack_into("<Q", hdr, 312, checksum(body))
    data = bytes(hdr) + body
    _atomic_write(path, data + struct.pack("<Q", checksum(data)))


def read_checkpoint(path):
    """Returns (preset, cfg, header_dict, params dict, m, v) ; m, v None without optimizer state."""
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < CKPT_HEADER + 8:
        raise ValueError(f"{path}: truncated")
    magic, ver, hb = struct.unpack_from("<8sII", data, 0)
    if magic != CKPT_MAGIC or ver != 1 or hb != CKPT_HEADER:
        raise ValueError(f"{path}: not a train_sdc checkpoint (magic/version)")
    (chk,) = struct.unpack_from("<Q", data, len(data) - 8)
    if checksum(data[:-8]) != chk:
        raise ValueError(f"{path}: checksum mismatch")
    preset = struct.unpack_from("<32s", data, 16)[0].split(b"\0")[0].decode()
    cfg = dict(zip(CONFIG_FIELDS_I, struct.unpack_from("<15i", data, 48)))
    cfg.update(zip(CONFIG_FIELDS_D, struct.unpack_from("<7d", data, 112)))
    (n_params,) = struct.unpack_from("<Q", data, 168)
    (step,) = struct.unpack_from("<q", data, 176)
    (has_opt,) = struct.unpack_from("<i", data, 224)
    hdr = {"n_params": n_params, "step": step, "has_opt": has_opt}
    flat = np.frombuffer(data, dtype="<f4", count=n_params * (3 if has_opt else 1), offset=CKPT_HEADER)
    def unflat(vec):
        out, off = {}, 0
        for name, shape in param_layout(cfg):
            n = int(np.prod(shape))
            out[name] = vec[off:off + n].reshape(shape)
            off += n
        return out
    params = unflat(flat[:n_params])
    m = unflat(flat[n_params:2 * n_params]) if has_opt else None
    v = unflat(flat[2 * n_params:]) if has_opt else None
    return preset, cfg, hdr, params, m, v


# ---------------------------------------------------------------- schedule (llmc/host/schedule.h)
def lr_at(step, max_lr, warmup, total, final_frac):
    """Learning rate of update number `step` (0-based)."""
    if step < warmup:
        return max_lr * (step + 1) / warmup
    if total <= warmup:
        return max_lr
    progress = min(1.0, (step - warmup) / (total - warmup))
    lo = final_frac * max_lr
    return lo + 0.5 * (max_lr - lo) * (1.0 + math.cos(math.pi * progress))


def _atomic_write(path, data):
    tmp = str(path) + ".tmp"
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
