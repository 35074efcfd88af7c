#!/usr/bin/env python3
"""Writer, reader and verifier of the debug reference state format (docs/formats.md,
"Debug reference state"). numpy only.

    python dev/reference/check_state.py [STATE ...]     (default: dev/reference/states/*.state)

verifies magic, version, size, checksum, finite values, that the first of the recorded losses equals
the loss, and, when states/<preset>/ holds the model, that n_params matches its parameter layout."""
import glob
import os
import struct
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, HERE)
import tsdc_io  # noqa: E402

STATE_MAGIC = b"TSDCREF\0"
STATE_HEADER = 256
HYPER = ["max_lr", "final_frac", "beta1", "beta2", "adam_eps", "weight_decay", "grad_clip"]


def state_bytes(tokens, logits, loss, grads, losses, warmup, hyper):
    """The full file contents. tokens (B, T+1) int; logits (B, T, V); grads flat (n_params,);
    losses (n_steps,); hyper: dict with the HYPER keys."""
    tokens = np.asarray(tokens)
    B, T1 = tokens.shape
    T = T1 - 1
    logits = np.asarray(logits, dtype=np.float32)
    V = logits.shape[-1]
    assert logits.shape == (B, T, V)
    grads = np.asarray(grads, dtype=np.float32).reshape(-1)
    losses = np.asarray(losses, dtype=np.float32).reshape(-1)
    hdr = bytearray(STATE_HEADER)
    struct.pack_into("<8sIiiiiiQ", hdr, 0, STATE_MAGIC, 1, B, T, V, len(losses), warmup, grads.size)
    struct.pack_into("<7f", hdr, 40, *[float(hyper[k]) for k in HYPER])
    body = b"".join([bytes(hdr), tokens.astype("<i4").tobytes(), logits.astype("<f4").tobytes(),
                     struct.pack("<f", float(loss)), grads.astype("<f4").tobytes(),
                     losses.astype("<f4").tobytes()])
    return body + struct.pack("<Q", tsdc_io.checksum(body))


def write_state(path, *args, **kw):
    tsdc_io._atomic_write(path, state_bytes(*args, **kw))


def read_state(path):
    """Parse and validate (magic, version, size, checksum); returns a dict of numpy arrays/scalars."""
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < STATE_HEADER + 8:
        raise ValueError(f"{path}: truncated")
    magic, ver, B, T, V, n_steps, warmup, n_params = struct.unpack_from("<8sIiiiiiQ", data, 0)
    if magic != STATE_MAGIC or ver != 1:
        raise ValueError(f"{path}: not a train_sdc reference state (magic/version)")
    want = STATE_HEADER + 4 * (B * (T + 1) + B * T * V + 1 + n_params + n_steps) + 8
    if len(data) != want:
        raise ValueError(f"{path}: size {len(data)}, expected {want}")
    (chk,) = struct.unpack_from("<Q", data, len(data) - 8)
    if tsdc_io.checksum(data[:-8]) != chk:
        raise ValueError(f"{path}: checksum mismatch")
    hyper = dict(zip(HYPER, struct.unpack_from("<7f", data, 40)))
    if any(data[68:STATE_HEADER]):
        raise ValueError(f"{path}: reserved header bytes not zero")
    off = STATE_HEADER
    def take(dtype, n):
        nonlocal off
        a = np.frombuffer(data, dtype=dtype, count=n, offset=off)
        off += 4 * n
        return a
    tokens = take("<i4", B * (T + 1)).reshape(B, T + 1).astype(np.int64)
    logits = take("<f4", B * T * V).reshape(B, T, V)
    loss = take("<f4", 1)[0]
    grads = take("<f4", n_params)
    losses = take("<f4", n_steps)
    return dict(B=B, T=T, V=V, n_steps=n_steps, warmup=warmup, n_params=n_params, hyper=hyper,
                tokens=tokens, logits=logits, loss=loss, grads=grads, losses=losses)


def unflatten(flat, cfg):
    """Flat vector in checkpoint parameter order -> {name: array}."""
    out, off = {}, 0
    for name, shape in tsdc_io.param_layout(cfg):
        n = int(np.prod(shape))
        out[name] = flat[off:off + n].reshape(shape)
        off += n
    assert off == flat.size, (off, flat.size)
    return out


def verify(path, cfg=None):
    """Raise ValueError on any problem; returns the parsed state."""
    st = read_state(path)
    if not ((st["tokens"] >= 0) & (st["tokens"] < st["V"])).all():
        raise ValueError(f"{path}: token id out of range")
    for k in ("logits", "grads", "losses"):
        if not np.all(np.isfinite(st[k])):
            raise ValueError(f"{path}: non-finite {k}")
    if st["losses"][0] != st["loss"]:
        raise ValueError(f"{path}: first recorded loss {st['losses'][0]} != loss {st['loss']}")
    if cfg is not None:
        n = sum(int(np.prod(s)) for _, s in tsdc_io.param_layout(cfg))
        if n != st["n_params"] or cfg["vocab_size"] != st["V"]:
            raise ValueError(f"{path}: n_params {st['n_params']} / V {st['V']} do not match the model "
                             f"({n} / {cfg['vocab_size']})")
    return st


def main(argv):
    paths = argv or sorted(glob.glob(os.path.join(HERE, "states", "*.state")))
    if not paths:
        print("check_state: no states found", file=sys.stderr)
        return 1
    bad = 0
    for p in paths:
        cfg = None
        model_dir = p[:-len(".state")]
        if os.path.isdir(model_dir):
            from hf_to_ckpt import convert
            cfg = convert(model_dir)[0]
        try:
            st = verify(p, cfg)
        except ValueError as e:
            print(f"check_state: {e}", file=sys.stderr)
            bad += 1
            continue
        print(f"{p}: ok  B={st['B']} T={st['T']} V={st['V']} n_params={st['n_params']:,} "
              f"loss {st['loss']:.6f} -> {st['losses'][-1]:.6f} over {st['n_steps']} steps "
              f"({os.path.getsize(p):,} bytes)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
