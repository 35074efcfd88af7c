"""Text files -> train_sdc token shards (formats in docs/formats.md, written with dev/tsdc_io.py).

Reads UTF-8 text files, tokenizes them with a HuggingFace `tokenizers` tokenizer and writes, into
the output directory:

  train.bin, val.bin (and test.bin with --test_input)   token shards
  tokenizer.bin                                          decode table: the raw bytes of every token id
  tokenizer.json                                         the tokenizer used (trained or copied)
  meta.json                                              vocab size, token counts, sources, origin

The tokenizer is either a given tokenizer.json (e.g. Llama 3.2, Qwen3, SmolLM2) or a byte-level
BPE trained here on the training text: ByteLevel pre-tokenizer and decoder, all 256 bytes in the
initial alphabet (any text encodes), one special token <|endoftext|> with id 0. Training is
deterministic: the same text gives the same tokenizer.json bytes (for one `tokenizers` version;
versions before 0.20 write the same merges in another JSON layout).

Each input file is one document; documents are separated by the EOS token when the tokenizer has
one. Without --val_input, validation is the last --val_fraction of the training text, cut at a line
boundary. Text is encoded in pieces of about CHUNK_CHARS characters cut after a newline, so a
whitespace run at a cut may tokenize differently than in one pass; files smaller than that are
encoded whole. The shards are checked against the decode table: for byte-level tokenizers, decoding
reproduces the input byte for byte (meta.json records "lossless" per split).

    python dev/data/prepare.py --input a.txt [--input b.txt] --out data/mine [--vocab_size 8192]
    python dev/data/prepare.py --input a.txt --val_input b.txt --tokenizer llama/tokenizer.json --out D
"""
import argparse
import hashlib
import json
import os
import re
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import tsdc_io  # noqa: E402

EOT = "<|endoftext|>"
EOS_NAMES = ("<|end_of_text|>", "<|endoftext|>", "<|im_end|>", "</s>")
BOS_NAMES = ("<|begin_of_text|>", "<s>")
MIN_VOCAB = 257         # 256 byte tokens + <|endoftext|>
CHUNK_CHARS = 1 << 20   # characters an encoding piece (cut after a newline)
BATCH_CHUNKS = 16       # pieces encoded in parallel at a time (bounds memory)


class PrepareError(Exception):
    """A user-facing problem, reported as one line."""


def log(msg):
    print(msg, flush=True)


# ---------------------------------------------------------------- input text
def read_text(path):
    p = Path(path)
    if not p.is_file():
        raise PrepareError(f"{path}: no such file")
    try:
        data = p.read_bytes()
    except OSError as e:
        raise PrepareError(f"{path}: cannot read ({e.strerror})")
    if not data:
        raise PrepareError(f"{path}: empty file")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise PrepareError(f"{path}: not UTF-8 text (invalid byte at offset {e.start})")
    log(f"read {path}: {len(data):,} bytes")
    return text, {"path": str(p.resolve()), "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def split_tail(docs, fraction):
    """Cut the concatenated documents at a line boundary (or a document boundary) so that about
    `fraction` of the characters come after the cut. Returns (head, tail, cut position), head and
    tail as lists of (document index, start, end) character ranges."""
    starts = np.cumsum([0] + [len(d) for d in docs]).tolist()
    total = starts[-1]
    text = "".join(docs)
    target = total - int(round(fraction * total))
    inner = starts[1:-1]  # boundaries between documents
    nl = text.find("\n", max(target - 1, 0))
    cut = min([nl + 1 if nl >= 0 else total] + [b for b in inner if b >= target])
    if cut >= total:  # no boundary after the target: take the last one before it
        nl = text.rfind("\n", 0, max(target - 1, 0))
        cut = max([nl + 1] + [b for b in inner if b < target])
    if cut <= 0 or cut >= total:
        raise PrepareError("cannot split the text into train and validation at a line boundary "
                           "(one line only?); pass --val_input")

    def ranges(lo, hi):
        out = []
        for i, d in enumerate(docs):
            s, e = max(lo, starts[i]), min(hi, starts[i + 1])
            if s < e:
                out.append((i, s - starts[i], e - starts[i]))
        return out
    return ranges(0, cut), ranges(cut, total), cut


def chunks(text):
    """Pieces of about CHUNK_CHARS characters, each but the last ending with a newline."""
    i = 0
    while i < len(text):
        nl = text.find("\n", i + CHUNK_CHARS - 1)
        j = len(text) if nl < 0 else nl + 1
        yield text[i:j]
        i = j


# ---------------------------------------------------------------- tokenizer
def train_bpe(docs, vocab_size):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[EOT], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator((c for d in docs for c in chunks(d)), trainer=trainer)
    return tok


def load_tokenizer(path):
    from tokenizers import Tokenizer
    if not Path(path).is_file():
        raise PrepareError(f"{path}: no such tokenizer file")
    try:
        return Tokenizer.from_file(str(path))
    except Exception as e:  # tokenizers raises plain Exception for bad JSON or unknown fields
        first = (str(e).strip().splitlines() or ["unknown error"])[0]
        raise PrepareError(f"{path}: not a readable tokenizer.json ({first})")


def gpt2_byte_decoder():
    """Inverse of GPT-2's bytes_to_unicode: the printable character standing for each byte."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


def _json_types(node):
    """Every "type" value in a tokenizer.json subtree (decoders and pre-tokenizers nest)."""
    if isinstance(node, dict):
        return {v for k, v in node.items() if k == "type" and isinstance(v, str)} | \
            set().union(*(_json_types(v) for v in node.values()))
    if isinstance(node, list):
        return set().union(*(_json_types(v) for v in node))
    return set()


def token_style(tok):
    """How model tokens spell bytes: 'bytelevel' (GPT-2 byte->unicode map), 'sentencepiece'
    ('▁' for space, '<0xNN>' byte fallback) or 'text' (the token is its UTF-8 text)."""
    spec = json.loads(tok.to_str())
    types = _json_types(spec.get("decoder")) | _json_types(spec.get("pre_tokenizer"))
    if "ByteLevel" in types:
        return "bytelevel"
    if types & {"Metaspace", "ByteFallback"} or (spec.get("model") or {}).get("byte_fallback"):
        return "sentencepiece"
    return "text"


def decode_table(tok):
    """Raw bytes of every token id: [bytes] indexed by id; ids without a token get b''."""
    vocab = tok.get_vocab(with_added_tokens=True)
    size = max(tok.get_vocab_size(with_added_tokens=True), max(vocab.values()) + 1)
    added = {i: t.content for i, t in tok.get_added_tokens_decoder().items()}
    style = token_style(tok)
    byte_of = gpt2_byte_decoder()
    table = [b""] * size
    for token, i in vocab.items():
        if i in added:
            table[i] = added[i].encode("utf-8")
        elif style == "bytelevel" and all(c in byte_of for c in token):
            table[i] = bytes(byte_of[c] for c in token)
        elif style == "sentencepiece":
            m = re.fullmatch(r"<0x([0-9A-Fa-f]{2})>", token)
            table[i] = bytes([int(m.group(1), 16)]) if m else token.replace("▁", " ").encode("utf-8")
        else:
            table[i] = token.encode("utf-8")
    return table, style


def special_id(tok, names):
    for name in names:
        i = tok.token_to_id(name)
        if i is not None:
            return i, name
    return None, None


# ---------------------------------------------------------------- encoding
def encode_docs(tok, docs, eos_id, table):
    """Token ids (uint32) of the documents, EOS between them when there is one, and whether the
    decode table turns every encoded piece back into exactly its text."""
    parts, lossless = [], True
    for k, doc in enumerate(docs):
        if k and eos_id is not None:
            parts.append(np.array([eos_id], dtype=np.uint32))
        pieces = list(chunks(doc))
        for b in range(0, len(pieces), BATCH_CHUNKS):
            batch = pieces[b:b + BATCH_CHUNKS]
            for piece, enc in zip(batch, tok.encode_batch(batch, add_special_tokens=False)):
                parts.append(np.array(enc.ids, dtype=np.uint32))
                lossless = lossless and b"".join(map(table.__getitem__, enc.ids)) == piece.encode("utf-8")
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.uint32), lossless


# ---------------------------------------------------------------- main logic
def prepare(inputs, out, val_inputs=None, test_inputs=None, val_fraction=None, tokenizer=None,
            vocab_size=None):
    """Write the shards, decode table, tokenizer.json and meta.json for the given files into `out`.
    Raises PrepareError on bad input. Returns the meta dictionary."""
    t_start = time.time()
    if not inputs:
        raise PrepareError("no --input file given")
    if tokenizer is not None and vocab_size is not None:
        raise PrepareError("--vocab_size applies to a trained tokenizer; not with --tokenizer")
    if vocab_size is None:
        vocab_size = 8192
    if tokenizer is None and vocab_size < MIN_VOCAB:
        raise PrepareError(f"--vocab_size {vocab_size} is too small: need at least {MIN_VOCAB} "
                           f"(256 bytes + {EOT})")
    if val_inputs and val_fraction is not None:
        raise PrepareError("give either --val_input or --val_fraction, not both")
    if val_fraction is None:
        val_fraction = 0.1
    if not val_inputs and not 0.0 < val_fraction < 1.0:
        raise PrepareError(f"--val_fraction {val_fraction} must be between 0 and 1 (exclusive)")

    # read everything first, so that a bad file fails before any work
    train_docs, train_src = zip(*[read_text(p) for p in inputs])
    val_read = [read_text(p) for p in val_inputs or []]
    test_read = [read_text(p) for p in test_inputs or []]
    tok = load_tokenizer(tokenizer) if tokenizer is not None else None
    out = Path(out)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise PrepareError(f"{out}: cannot create output directory ({e.strerror})")

    splits = {}  # name -> (documents, sources)
    if val_read:
        splits["train"] = (list(train_docs), list(train_src))
        splits["val"] = ([d for d, _ in val_read], [s for _, s in val_read])
        val_note = "--val_input"
    else:
        head, tail, cut = split_tail(train_docs, val_fraction)
        for name, ranges in (("train", head), ("val", tail)):
            splits[name] = ([train_docs[i][s:e] for i, s, e in ranges],
                            [dict(train_src[i], chars=[s, e]) for i, s, e in ranges])
        val_note = (f"last {val_fraction:.1%} of the training text, cut at a line boundary "
                    f"(character {cut:,} of {sum(map(len, train_docs)):,})")
        log(f"validation: {val_note}")
    if test_read:
        splits["test"] = ([d for d, _ in test_read], [s for _, s in test_read])

    # tokenizer: given or trained on the training split
    from tokenizers import __version__ as tokenizers_version
    if tokenizer is not None:
        tok_json = Path(tokenizer).read_bytes()
        origin = {"origin": "file", "path": str(Path(tokenizer).resolve()),
                  "sha256": hashlib.sha256(tok_json).hexdigest()}
        log(f"tokenizer: {tokenizer}")
    else:
        t = time.time()
        n_chars = sum(map(len, splits["train"][0]))
        log(f"training byte-level BPE, vocab {vocab_size}, on {n_chars:,} characters ...")
        tok = train_bpe(splits["train"][0], vocab_size)
        tok_json = tok.to_str(pretty=True).encode("utf-8")
        origin = {"origin": "trained", "algorithm": "byte-level BPE", "requested_vocab_size": vocab_size,
                  "special_tokens": [EOT]}
        log(f"trained: vocab {tok.get_vocab_size(with_added_tokens=True)} in {time.time() - t:.1f} s")
    origin["tokenizers_version"] = tokenizers_version

    table, style = decode_table(tok)
    vocab = len(table)
    eos_id, eos_name = special_id(tok, EOS_NAMES)
    bos_id, bos_name = special_id(tok, BOS_NAMES)
    log(f"vocab {vocab:,} ({style} tokens), {2 if vocab <= 65536 else 4}-byte ids, "
        f"EOS {f'{eos_name} = {eos_id}' if eos_name else 'none'}, "
        f"BOS {f'{bos_name} = {bos_id}' if bos_name else 'none'}")

    tok_path = out / "tokenizer.json"
    if not (tok_path.exists() and tokenizer is not None and os.path.samefile(tokenizer, tok_path)):
        tsdc_io._atomic_write(tok_path, tok_json)
    tsdc_io.write_vocab(out / "tokenizer.bin", table, bos_id=bos_id, eos_id=eos_id)

    meta_splits = {}
    for name, (docs, sources) in splits.items():
        t = time.time()
        n_chars = sum(map(len, docs))
        ids, lossless = encode_docs(tok, docs, eos_id, table)
        secs = time.time() - t
        tsdc_io.write_shard(out / f"{name}.bin", ids, vocab)
        log(f"{name}: {len(docs)} document(s), {n_chars:,} characters -> {len(ids):,} tokens "
            f"in {secs:.1f} s ({len(ids) / max(secs, 1e-9):,.0f} tokens/s) -> {out / (name + '.bin')}")
        if not lossless:
            log(f"note: decoding {name}.bin does not reproduce the text exactly (the tokenizer "
                f"normalizes or adds text)")
        meta_splits[name] = {"file": f"{name}.bin", "tokens": int(len(ids)), "characters": n_chars,
                             "lossless": lossless, "sources": sources}

    meta = {"format": "train_sdc token shards, docs/formats.md", "vocab_size": vocab,
            "token_bytes": 2 if vocab <= 65536 else 4, "bos_id": bos_id, "eos_id": eos_id,
            "document_separator": eos_name, "validation": val_note, "tokenizer": origin,
            "splits": meta_splits}
    tsdc_io._atomic_write(out / "meta.json", (json.dumps(meta, indent=2) + "\n").encode("utf-8"))
    log(f"wrote {', '.join(f'{n}.bin' for n in splits)}, tokenizer.bin, tokenizer.json, meta.json "
        f"to {out} in {time.time() - t_start:.1f} s")
    return meta


def run(**kwargs):
    """prepare(**kwargs) for command-line tools: returns the exit status, errors as one line."""
    try:
        prepare(**kwargs)
        return 0
    except PrepareError as e:
        print(f"error: {e}", file=sys.stderr, flush=True)
    except OSError as e:  # writing the outputs: permissions, disk full
        print(f"error: {e.filename}: {e.strerror}", file=sys.stderr, flush=True)
    return 1


def fetch(urls, dest, local_flags="--input"):
    """Download the first of `urls` that works to `dest` (atomically). Raises PrepareError, whose
    message points to `local_flags` for passing a local copy instead."""
    import urllib.request
    errors = []
    for url in urls:
        log(f"downloading {url} ...")
        try:
            with urllib.request.urlopen(url, timeout=60) as r:
                data = r.read()
        except Exception as e:  # URLError, HTTPError, timeouts, connection resets
            errors.append(f"{url}: {e}")
            continue
        Path(dest).parent.mkdir(parents=True, exist_ok=True)
        tsdc_io._atomic_write(dest, data)
        log(f"saved {dest} ({len(data):,} bytes)")
        return
    raise PrepareError(f"download failed ({'; '.join(errors)}); pass a local copy with {local_flags}")


def add_shard_arguments(ap, default_out, val_fraction_help):
    """the options of a data set's script (tinyshakespeare.py, wikitext2.py) after its source files: --out,
    --tokenizer, --vocab_size, --val_fraction"""
    ap.add_argument("--out", default=str(default_out), metavar="DIR", help=f"output directory ({default_out})")
    ap.add_argument("--tokenizer", metavar="PATH", help="use this tokenizer.json instead of training one")
    ap.add_argument("--vocab_size", type=int, metavar="N", help="vocabulary of the trained BPE (default 8192)")
    ap.add_argument("--val_fraction", type=float, metavar="F", help=val_fraction_help)


def main(argv=None):
    ap = argparse.ArgumentParser(description="Text files -> train_sdc token shards.")
    ap.add_argument("--input", action="append", required=True, metavar="FILE",
                    help="training text file (repeatable; each file is one document)")
    ap.add_argument("--val_input", action="append", metavar="FILE",
                    help="validation text file (repeatable); default: the end of the training text")
    ap.add_argument("--val_fraction", type=float, metavar="F",
                    help="fraction of the training text taken from its end for validation (default 0.1)")
    ap.add_argument("--test_input", action="append", metavar="FILE",
                    help="test text file (repeatable), written to test.bin")
    ap.add_argument("--tokenizer", metavar="PATH", help="use this tokenizer.json instead of training one")
    ap.add_argument("--vocab_size", type=int, metavar="N",
                    help=f"vocabulary of the trained BPE (default 8192, at least {MIN_VOCAB})")
    ap.add_argument("--out", required=True, metavar="DIR", help="output directory")
    a = ap.parse_args(argv)
    return run(inputs=a.input, out=a.out, val_inputs=a.val_input, test_inputs=a.test_input,
               val_fraction=a.val_fraction, tokenizer=a.tokenizer, vocab_size=a.vocab_size)


if __name__ == "__main__":
    sys.exit(main())
