"""WikiText-2 (raw, Merity et al. 2016) -> token shards in data/wikitext2.

Downloads wikitext-2-raw-v1.zip and keeps its wiki.{train,valid,test}.raw in OUT (reused on later
runs), or takes local copies: --train FILE [--val FILE] [--test FILE]. Then runs dev/data/prepare.py's
logic: train.bin from the train text, val.bin from the validation text (without --val, the last
--val_fraction of the train text), test.bin from the test text when there is one.

    python dev/data/wikitext2.py                                          # download, BPE vocab 8192
    python dev/data/wikitext2.py --train wiki.train.raw --val wiki.valid.raw --test wiki.test.raw \\
        --tokenizer llama/tokenizer.json --out data/wikitext2-llama
"""
import argparse
import sys
import zipfile
from pathlib import Path

import prepare

URLS = ["https://huggingface.co/datasets/ggml-org/ci/resolve/main/wikitext-2-raw-v1.zip",
        "https://s3.amazonaws.com/research.metamind.io/wikitext/wikitext-2-raw-v1.zip"]
SPLITS = ("train", "valid", "test")
DEFAULT_OUT = Path(__file__).resolve().parents[2] / "data" / "wikitext2"


def download(out):
    """The three raw files in `out`, downloaded and extracted unless already there."""
    files = [out / f"wiki.{s}.raw" for s in SPLITS]
    if all(f.is_file() for f in files):
        print(f"using the downloaded {', '.join(map(str, files))}", flush=True)
        return files
    archive = out / "wikitext-2-raw-v1.zip"
    prepare.fetch(URLS, archive, local_flags="--train/--val/--test")
    try:
        with zipfile.ZipFile(archive) as z:
            for f in files:
                prepare.tsdc_io._atomic_write(f, z.read(f"wikitext-2-raw/{f.name}"))
    except (zipfile.BadZipFile, KeyError) as e:
        raise prepare.PrepareError(f"{archive}: not the expected WikiText-2 archive ({e}); "
                                   f"pass local copies with --train/--val/--test")
    archive.unlink()
    return files


def main(argv=None):
    ap = argparse.ArgumentParser(description="WikiText-2 -> train_sdc token shards.")
    ap.add_argument("--train", metavar="FILE", help="local wiki.train.raw (default: download all three)")
    ap.add_argument("--val", metavar="FILE", help="local wiki.valid.raw")
    ap.add_argument("--test", metavar="FILE", help="local wiki.test.raw")
    prepare.add_shard_arguments(ap, DEFAULT_OUT, "without --val: fraction of the train text taken from its end (default 0.1)")
    a = ap.parse_args(argv)
    if a.train is None:
        if a.val or a.test:
            ap.error("--val and --test need --train")
        try:
            train, val, test = map(str, download(Path(a.out)))
        except prepare.PrepareError as e:
            print(f"error: {e}", file=sys.stderr, flush=True)
            return 1
    else:
        train, val, test = a.train, a.val, a.test
    return prepare.run(inputs=[train], val_inputs=[val] if val else None, test_inputs=[test] if test else None,
                       out=a.out, tokenizer=a.tokenizer, vocab_size=a.vocab_size, val_fraction=a.val_fraction)


if __name__ == "__main__":
    sys.exit(main())
