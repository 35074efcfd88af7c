"""Tests of the data pipeline: dev/data/prepare.py, the corpus scripts dev/data/tinyshakespeare.py and
dev/data/wikitext2.py, and dev/tsdc_io.py's checksum, token shard and decode table functions.

Runs on small slices of the shared corpora, never downloads. The corpora are read from
$TSDC_DATA_DIR (default <repo>/../shared/data). Run: python3 -m pytest -q tests/test_data.py
"""
import json
import os
import random
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "dev"))
sys.path.insert(0, str(REPO / "dev" / "data"))
import prepare  # noqa: E402
import tinyshakespeare  # noqa: E402
import tsdc_io  # noqa: E402
import wikitext2  # noqa: E402

DATA = Path(os.environ.get("TSDC_DATA_DIR", REPO.parent / "shared" / "data"))
PREPARE = REPO / "dev" / "data" / "prepare.py"
OUTPUTS = ("train.bin", "val.bin", "tokenizer.bin", "tokenizer.json", "meta.json")
EOT = b"<|endoftext|>"


def corpus_slice(name, start, nbytes, dest):
    """Bytes [start, start + nbytes) of a shared corpus, trimmed to whole UTF-8 characters, saved
    to `dest`. Returns the bytes."""
    src = DATA / name
    if not src.is_file():
        pytest.fail(f"{src} not found: set TSDC_DATA_DIR to the directory with the shared corpora")
    data = src.read_bytes()[start:start + nbytes].decode("utf-8", errors="ignore").encode("utf-8")
    dest.write_bytes(data)
    return data


def run_prepare(*args, env=None):
    return subprocess.run([sys.executable, str(PREPARE), *map(str, args)], capture_output=True,
                          text=True, env=env)


def decode(shard, table):
    ids, _ = tsdc_io.read_shard(shard)
    return b"".join(table[i] for i in ids.tolist())


def checksum_ref(data):
    """docs/formats.md's checksum in plain integer arithmetic, independent of tsdc_io."""
    mask, g = (1 << 64) - 1, 0x9E3779B97F4A7C15
    padded = bytes(data) + bytes(-len(data) % 8)
    total = (len(data) * g) & mask
    for i in range(len(padded) // 8):
        z = (int.from_bytes(padded[8 * i:8 * i + 8], "little") + (i + 1) * g) & mask
        z ^= z >> 30
        z = (z * 0xBF58476D1CE4E5B9) & mask
        z ^= z >> 27
        z = (z * 0x94D049BB133111EB) & mask
        z ^= z >> 31
        total = (total + z) & mask
    return total


@pytest.fixture(scope="module")
def shakespeare(tmp_path_factory):
    """The first 50 KB of Tiny Shakespeare prepared twice (BPE vocab 512) in separate processes,
    the second with one tokenizer thread, so that determinism does not hang on the thread count."""
    tmp = tmp_path_factory.mktemp("shakespeare")
    text = corpus_slice("tinyshakespeare.txt", 0, 50_000, tmp / "ts.txt")
    runs = []
    for name, threads in (("a", None), ("b", "1")):
        env = dict(os.environ, **({"RAYON_NUM_THREADS": threads} if threads else {}))
        r = run_prepare("--input", tmp / "ts.txt", "--vocab_size", 512, "--out", tmp / name, env=env)
        assert r.returncode == 0, r.stderr
        runs.append(tmp / name)
    return text, tmp / "ts.txt", runs[0], runs[1]


# ---------------------------------------------------------------- prepare.py
def test_roundtrip_train_and_val(shakespeare):
    """decode(train) + decode(val) is the input byte for byte, the split falls after a newline near 10 %, meta's
    token counts are the shards', BPE compresses. Catches: text lost or duplicated at the split or in encoding, a
    split in mid-line, a wrong validation fraction, meta out of step with the shards, an untrained (byte-level)
    tokenizer."""
    text, _, out, _ = shakespeare
    table, bos, eos = tsdc_io.read_vocab(out / "tokenizer.bin")
    assert len(table) == 512 and eos == 0 and table[0] == EOT and bos is None
    train, val = decode(out / "train.bin", table), decode(out / "val.bin", table)
    assert train + val == text, "decoding train.bin + val.bin does not reproduce the input"
    assert train.endswith(b"\n"), "the validation split does not start at a line boundary"
    assert 0.08 < len(val) / len(text) < 0.12, f"validation is {len(val) / len(text):.3f} of the text"
    meta = json.loads((out / "meta.json").read_text())
    for split in ("train", "val"):
        ids, vocab = tsdc_io.read_shard(out / f"{split}.bin")
        assert vocab == 512 and meta["splits"][split]["tokens"] == len(ids)
        assert meta["splits"][split]["lossless"] is True
    assert len(tsdc_io.read_shard(out / "train.bin")[0]) < len(train) / 2, "BPE barely compresses"


def test_trained_tokenizer_has_every_byte(shakespeare):
    """the trained tokenizer has the asked 512 ids, <|endoftext|> at 0, and all 256 single bytes. Catches: a byte
    alphabet with holes (text outside the training slice cannot be encoded), EOT at another id."""
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(str(shakespeare[2] / "tokenizer.json"))
    assert tok.get_vocab_size(with_added_tokens=True) == 512
    assert tok.token_to_id("<|endoftext|>") == 0
    table, _, _ = tsdc_io.read_vocab(shakespeare[2] / "tokenizer.bin")
    assert {t for t in table if len(t) == 1} == {bytes([b]) for b in range(256)}


def test_deterministic(shakespeare):
    """two prepare runs (default threads, then 1 tokenizer thread) write identical files. Catches: output that
    depends on the thread count or on hash or dict order."""
    _, _, a, b = shakespeare
    for name in OUTPUTS:
        assert (a / name).read_bytes() == (b / name).read_bytes(), f"{name} differs between two runs"


def test_shard_and_table_headers_match_the_spec(shakespeare):
    """Read the files by the layout in docs/formats.md, not through tsdc_io.
    Catches: tsdc_io drifting from docs/formats.md (field order or width, reserved bytes not zero, the checksum over
    the wrong range), which a tsdc_io round trip cannot see."""
    out = shakespeare[2]
    data = (out / "train.bin").read_bytes()
    magic, ver, width, vocab, reserved, n, chk = struct.unpack_from("<8sIIIIQQ", data, 0)
    assert (magic, ver, width, vocab, reserved) == (b"TSDCTOK\0", 1, 2, 512, 0)
    assert len(data) == 256 + 2 * n and data[40:256] == bytes(216) and chk == checksum_ref(data[256:])
    data = (out / "tokenizer.bin").read_bytes()
    magic, ver, vocab, bos, eos, chk = struct.unpack_from("<8sIIIIQ", data, 0)
    assert (magic, ver, vocab, bos, eos) == (b"TSDCVOC\0", 1, 512, 0xFFFFFFFF, 0)
    assert data[32:64] == bytes(32) and chk == checksum_ref(data[64:])


def test_given_tokenizer_json(shakespeare, tmp_path):
    """The first run's tokenizer.json given back: same decode table and shards for the same text,
    and text it never saw (non-ASCII WikiText) still round-trips through the byte alphabet.
    Catches: --tokenizer retrained or altered instead of reused, bytes outside the training text lost, --val_input
    ignored."""
    _, ts, a, _ = shakespeare
    r = run_prepare("--input", ts, "--tokenizer", a / "tokenizer.json", "--out", tmp_path / "same")
    assert r.returncode == 0, r.stderr
    for name in ("train.bin", "val.bin", "tokenizer.bin", "tokenizer.json"):
        assert (tmp_path / "same" / name).read_bytes() == (a / name).read_bytes(), name
    wiki = corpus_slice("wikitext2_valid.txt", 0, 30_000, tmp_path / "wiki.txt")
    assert any(b >= 0x80 for b in wiki), "the WikiText slice should contain non-ASCII text"
    r = run_prepare("--input", tmp_path / "wiki.txt", "--val_input", ts, "--tokenizer",
                    a / "tokenizer.json", "--out", tmp_path / "wiki")
    assert r.returncode == 0, r.stderr
    table, _, _ = tsdc_io.read_vocab(tmp_path / "wiki" / "tokenizer.bin")
    assert decode(tmp_path / "wiki" / "train.bin", table) == wiki
    assert decode(tmp_path / "wiki" / "val.bin", table) == ts.read_bytes()
    meta = json.loads((tmp_path / "wiki" / "meta.json").read_text())
    assert meta["tokenizer"]["origin"] == "file" and meta["validation"] == "--val_input"


def test_several_inputs_split_across_documents(tmp_path):
    """Two files are two documents joined by <|endoftext|>; the validation cut (30%) falls inside
    the first file, so validation is its tail, the separator, then the whole second file.
    Catches: inputs joined without the separator, a validation cut made per file or off the line boundary, wrong
    source ranges in meta."""
    first = corpus_slice("tinyshakespeare.txt", 0, 20_000, tmp_path / "a.txt")
    second = corpus_slice("tinyshakespeare.txt", 100_000, 4_000, tmp_path / "b.txt")
    meta = prepare.prepare(inputs=[tmp_path / "a.txt", tmp_path / "b.txt"], out=tmp_path / "out",
                           vocab_size=300, val_fraction=0.3)
    table, _, _ = tsdc_io.read_vocab(tmp_path / "out" / "tokenizer.bin")
    train, val = decode(tmp_path / "out" / "train.bin", table), decode(tmp_path / "out" / "val.bin", table)
    cut = len(train)
    assert train == first[:cut] and val == first[cut:] + EOT + second
    assert first[cut - 1:cut] == b"\n" and abs(len(first[cut:]) + len(second) - 0.3 * 24_000) < 200
    assert [s["chars"] for s in meta["splits"]["val"]["sources"]] == [[cut, len(first)], [0, len(second)]]


def test_chunked_encoding_round_trips(tmp_path, monkeypatch):
    """Text longer than one encoding piece: pieces end after a newline and still round-trip.
    Catches: a chunk boundary inside a line (BPE merges across it differ) or text dropped or repeated where chunks
    join."""
    text = corpus_slice("tinyshakespeare.txt", 0, 30_000, tmp_path / "ts.txt").decode()
    monkeypatch.setattr(prepare, "CHUNK_CHARS", 2_000)
    monkeypatch.setattr(prepare, "BATCH_CHUNKS", 3)
    pieces = list(prepare.chunks(text))
    assert "".join(pieces) == text and len(pieces) > 10 and all(p.endswith("\n") for p in pieces[:-1])
    meta = prepare.prepare(inputs=[tmp_path / "ts.txt"], out=tmp_path / "out", vocab_size=400)
    table, _, _ = tsdc_io.read_vocab(tmp_path / "out" / "tokenizer.bin")
    decoded = decode(tmp_path / "out" / "train.bin", table) + decode(tmp_path / "out" / "val.bin", table)
    assert decoded == text.encode() and meta["splits"]["train"]["lossless"]


def test_normalizing_tokenizer_is_reported_lossy(shakespeare, tmp_path):
    """a lowercasing tokenizer: meta reports both splits lossless false. Catches: a lossless flag set without
    checking the round trip."""
    from tokenizers import Tokenizer, normalizers
    tok = Tokenizer.from_file(str(shakespeare[2] / "tokenizer.json"))
    tok.normalizer = normalizers.Lowercase()
    tok.save(str(tmp_path / "lower.json"))
    meta = prepare.prepare(inputs=[shakespeare[1]], out=tmp_path / "out", tokenizer=tmp_path / "lower.json")
    assert meta["splits"]["train"]["lossless"] is False and meta["splits"]["val"]["lossless"] is False


def llama3_like_tokenizer(path, n_filler=69_744):
    """A tokenizer.json shaped like Llama 3's (regex Split + ByteLevel, a BOS template,
    <|begin_of_text|>/<|end_of_text|> added tokens) whose 256 byte tokens have ids above 65535."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors
    vocab = {f"f{i}": i for i in range(n_filler)}
    vocab.update({c: n_filler + b for c, b in sorted(prepare.gpt2_byte_decoder().items(), key=lambda x: x[1])})
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    pattern = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
               r"|\s*[\r\n]+|\s+(?!\S)|\s+")
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(pattern), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken("<|begin_of_text|>", special=True), AddedToken("<|end_of_text|>", special=True)])
    bos = tok.token_to_id("<|begin_of_text|>")
    tok.post_processor = processors.TemplateProcessing(single="<|begin_of_text|> $A",
                                                       special_tokens=[("<|begin_of_text|>", bos)])
    tok.save(str(path))
    return n_filler + 256


def test_large_vocab_tokenizer_gives_4_byte_shards(tmp_path):
    """a Llama 3-like tokenizer whose byte tokens lie above 65535: 4-byte shards, BOS/EOS from its added tokens, the
    text round-trips. Catches: ids truncated to 16 bits, the BOS template's token written into the shard, BOS/EOS
    not found."""
    first_special = llama3_like_tokenizer(tmp_path / "tokenizer.json")
    wiki = corpus_slice("wikitext2_valid.txt", 0, 5_000, tmp_path / "wiki.txt")
    prepare.prepare(inputs=[tmp_path / "wiki.txt"], out=tmp_path / "out", tokenizer=tmp_path / "tokenizer.json")
    table, bos, eos = tsdc_io.read_vocab(tmp_path / "out" / "tokenizer.bin")
    assert (len(table), bos, eos) == (first_special + 2, first_special, first_special + 1)
    ids, vocab = tsdc_io.read_shard(tmp_path / "out" / "train.bin")
    assert vocab == first_special + 2 and ids.min() > 65535, "byte tokens sit above 65535 here"
    assert struct.unpack_from("<I", (tmp_path / "out" / "train.bin").read_bytes(), 12)[0] == 4
    assert decode(tmp_path / "out" / "train.bin", table) + decode(tmp_path / "out" / "val.bin", table) == wiki


def test_sentencepiece_decode_table():
    """a SentencePiece-style tokenizer (byte fallback <0xNN>, U+2581 for a space): the decode table's bytes, <s> and
    </s> found. Catches: byte-fallback tokens decoded as their names, U+2581 not turned into a space, BOS/EOS lookup
    without the SentencePiece names."""
    from tokenizers import Tokenizer, decoders, models, normalizers
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{f"<0x{b:02X}>": 3 + b for b in range(256)},
             "▁": 259, "▁the": 260, "é": 261}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>", byte_fallback=True))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()])
    tok.add_special_tokens(["<unk>", "<s>", "</s>"])
    table, style = prepare.decode_table(tok)
    assert style == "sentencepiece" and len(table) == 262
    assert table[3 + 0x41] == b"A" and table[3 + 0xE9] == b"\xe9" and table[259] == b" "
    assert table[260] == b" the" and table[261] == "é".encode() and table[1] == b"<s>"
    assert prepare.special_id(tok, prepare.BOS_NAMES)[0] == 1
    assert prepare.special_id(tok, prepare.EOS_NAMES)[0] == 2


@pytest.mark.parametrize("case", ["missing input", "unreadable tokenizer", "empty text", "vocab 256",
                                  "val fraction 1.5", "one line", "not utf-8", "both val options"])
def test_bad_input_is_one_line_error(case, tmp_path):
    """each bad input: non-zero exit, one stderr line naming the culprit, no train.bin written. Catches: a traceback
    instead of a message, a half-written output directory."""
    good = tmp_path / "good.txt"
    good.write_text("first line\nsecond line\nthird line\n")
    args, named = {
        "missing input": (["--input", tmp_path / "nope.txt"], "nope.txt"),
        "unreadable tokenizer": (["--input", good, "--tokenizer", good], "good.txt"),
        "empty text": (["--input", tmp_path / "empty.txt"], "empty.txt"),
        "vocab 256": (["--input", good, "--vocab_size", 256], "256"),
        "val fraction 1.5": (["--input", good, "--val_fraction", 1.5], "1.5"),
        "one line": (["--input", tmp_path / "line.txt"], "--val_input"),
        "not utf-8": (["--input", tmp_path / "latin1.txt"], "latin1.txt"),
        "both val options": (["--input", good, "--val_input", good, "--val_fraction", 0.2], "--val_fraction"),
    }[case]
    (tmp_path / "empty.txt").write_bytes(b"")
    (tmp_path / "line.txt").write_text("one line without a newline")
    (tmp_path / "latin1.txt").write_bytes("café\n".encode("latin-1"))
    r = run_prepare(*args, "--out", tmp_path / "out")
    lines = r.stderr.strip().splitlines()
    assert r.returncode != 0 and len(lines) == 1 and named in lines[0], r.stderr
    assert not (tmp_path / "out" / "train.bin").exists()


# ---------------------------------------------------------------- corpus scripts
def test_tinyshakespeare_script(tmp_path):
    """dev/data/tinyshakespeare.py end to end: train + val decode to the input. Catches: the wrapper passing wrong
    options to prepare or dropping text."""
    text = corpus_slice("tinyshakespeare.txt", 0, 20_000, tmp_path / "ts.txt")
    assert tinyshakespeare.main(["--input", str(tmp_path / "ts.txt"), "--vocab_size", "300",
                                 "--out", str(tmp_path / "out")]) == 0
    table, _, _ = tsdc_io.read_vocab(tmp_path / "out" / "tokenizer.bin")
    assert decode(tmp_path / "out" / "train.bin", table) + decode(tmp_path / "out" / "val.bin", table) == text


def test_wikitext2_script(tmp_path):
    """wikitext2.py: train, val and test each decode to their own input file. Catches: splits swapped, or a split
    not written from its own file."""
    parts = {s: corpus_slice(f, 0, n, tmp_path / f"{s}.txt") for s, f, n in
             (("train", "wikitext2_valid.txt", 20_000), ("val", "wikitext2_test.txt", 5_000),
              ("test", "wikitext2_test.txt", 8_000))}
    assert wikitext2.main(["--train", str(tmp_path / "train.txt"), "--val", str(tmp_path / "val.txt"),
                           "--test", str(tmp_path / "test.txt"), "--vocab_size", "300",
                           "--out", str(tmp_path / "out")]) == 0
    table, _, _ = tsdc_io.read_vocab(tmp_path / "out" / "tokenizer.bin")
    for split, text in parts.items():
        assert decode(tmp_path / "out" / f"{split}.bin", table) == text, split


# ---------------------------------------------------------------- tsdc_io
def test_4_byte_tokens_above_65535(tmp_path):
    """write_shard: 2-byte ids up to vocab 65536, 4-byte above, read back exactly; an id >= vocab or negative
    raises. Catches: an off-by-one at the width threshold, ids truncated, out-of-range ids written."""
    rng = np.random.default_rng(0)
    ids = np.concatenate([[0, 65535, 65536, 99_999], rng.integers(0, 100_000, 1000)])
    tsdc_io.write_shard(tmp_path / "big.bin", ids, 100_000)
    data = (tmp_path / "big.bin").read_bytes()
    assert struct.unpack_from("<II", data, 12) == (4, 100_000) and len(data) == 256 + 4 * len(ids)
    back, vocab = tsdc_io.read_shard(tmp_path / "big.bin")
    assert vocab == 100_000 and np.array_equal(back, ids)
    tsdc_io.write_shard(tmp_path / "edge.bin", [0, 65535], 65536)  # the largest 2-byte vocabulary
    assert struct.unpack_from("<I", (tmp_path / "edge.bin").read_bytes(), 12)[0] == 2
    assert tsdc_io.read_shard(tmp_path / "edge.bin")[0].tolist() == [0, 65535]
    tsdc_io.write_shard(tmp_path / "edge.bin", [65536], 65537)  # the smallest 4-byte vocabulary
    assert struct.unpack_from("<I", (tmp_path / "edge.bin").read_bytes(), 12)[0] == 4
    for bad in ([100_000], [-1]):
        with pytest.raises(ValueError):
            tsdc_io.write_shard(tmp_path / "bad.bin", bad, 100_000)


def test_checksum_matches_the_formula():
    """tsdc_io.checksum equals docs/formats.md's formula written independently (checksum_ref), at lengths around the
    8-byte padding and on all-ones words; the input type does not matter; one flipped bit or one more zero byte
    changes it. Catches: the padding or the length left out, 64-bit overflow handled unlike the C code."""
    rng = random.Random(1)
    for n in (0, 1, 7, 8, 9, 15, 64, 1000, 4099):
        buf = bytes(rng.randrange(256) for _ in range(n))
        assert tsdc_io.checksum(buf) == checksum_ref(buf), f"length {n}"
        assert tsdc_io.checksum(bytearray(buf)) == tsdc_io.checksum(np.frombuffer(buf, np.uint8))
    ones = b"\xff" * 4099  # every word and product overflows
    assert tsdc_io.checksum(ones) == checksum_ref(ones)
    flipped = bytearray(ones)
    flipped[1234] ^= 0x10
    assert tsdc_io.checksum(bytes(flipped)) != tsdc_io.checksum(ones)
    assert tsdc_io.checksum(b"\0") != tsdc_io.checksum(b"\0\0"), "zero padding must not hide the length"


def test_readers_reject_damaged_files(tmp_path):
    """read_shard and read_vocab raise ValueError naming the damage (checksum, size, token width, magic, truncated
    header, trailing bytes under a valid checksum). Catches: a reader that accepts a damaged file or names the wrong
    cause."""
    tsdc_io.write_shard(tmp_path / "s.bin", np.arange(100), 512)
    tsdc_io.write_vocab(tmp_path / "v.bin", [b"a", b"bc", b""], eos_id=0)
    damaged = {
        "checksum mismatch": lambda d: d[:300] + bytes([d[300] ^ 1]) + d[301:],
        "size mismatch": lambda d: d[:-2],
        "bad token width": lambda d: d[:12] + struct.pack("<I", 3) + d[16:],
        "magic": lambda d: b"X" + d[1:],
    }
    for what, damage in damaged.items():
        (tmp_path / "d.bin").write_bytes(damage((tmp_path / "s.bin").read_bytes()))
        with pytest.raises(ValueError, match=what):
            tsdc_io.read_shard(tmp_path / "d.bin")
    v = (tmp_path / "v.bin").read_bytes()
    for what, data in {"checksum mismatch": v[:-1] + b"x", "truncated header": v[:40]}.items():
        (tmp_path / "d.bin").write_bytes(data)
        with pytest.raises(ValueError, match=what):
            tsdc_io.read_vocab(tmp_path / "d.bin")
    body = v[64:] + b"zz"  # a valid checksum over trailing garbage
    (tmp_path / "d.bin").write_bytes(v[:24] + struct.pack("<Q", checksum_ref(body)) + v[32:64] + body)
    with pytest.raises(ValueError, match="after the last entry"):
        tsdc_io.read_vocab(tmp_path / "d.bin")
