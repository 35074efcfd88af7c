"""Tiny Shakespeare (1.1 MB, Karpathy's char-rnn corpus) -> token shards in data/tinyshakespeare.

Downloads the text (kept as OUT/tinyshakespeare.txt and reused) or takes a local copy with --input,
then runs dev/data/prepare.py's logic: validation is the last --val_fraction of the text.

    python dev/data/tinyshakespeare.py                                   # download, BPE vocab 8192
    python dev/data/tinyshakespeare.py --input /path/tinyshakespeare.txt --tokenizer tokenizer.json
"""
import argparse
import sys
from pathlib import Path

import prepare

URL = "https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt"
DEFAULT_OUT = Path(__file__).resolve().parents[2] / "data" / "tinyshakespeare"


def main(argv=None):
    ap = argparse.ArgumentParser(description="Tiny Shakespeare -> train_sdc token shards.")
    ap.add_argument("--input", metavar="FILE", help="local copy of the text (default: download it)")
    prepare.add_shard_arguments(ap, DEFAULT_OUT, "fraction of the text taken from its end for validation (default 0.1)")
    a = ap.parse_args(argv)
    text = a.input
    if text is None:
        text = Path(a.out) / "tinyshakespeare.txt"
        if text.is_file():
            print(f"using the downloaded {text}", flush=True)
        else:
            try:
                prepare.fetch([URL], text)
            except prepare.PrepareError as e:
                print(f"error: {e}", file=sys.stderr, flush=True)
                return 1
    return prepare.run(inputs=[str(text)], out=a.out, tokenizer=a.tokenizer, vocab_size=a.vocab_size,
                       val_fraction=a.val_fraction)


if __name__ == "__main__":
    sys.exit(main())
