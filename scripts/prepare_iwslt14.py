"""Extract and clean IWSLT14 de-en as fairseq's `prepare-iwslt14.sh` does, for raw-text SentencePiece.

Steps, as in fairseq (https://github.com/facebookresearch/fairseq, examples/translation):
* train: `train.tags.de-en.{de,en}` without the lines holding `<url>`, `<talkid>` or `<keywords>`,
  with the `<title>`/`<description>` tags (not their text) removed; then `clean-corpus-n.perl
  -ratio 1.5 ... 1 175` (whitespace squeezed; pairs with a side of 0 or more than 175 words,
  or a word-count ratio above 1.5, dropped); then lowercased.
* dev/test: the `<seg id=...>` lines of the `IWSLT14.TED*.xml` files, `’` -> `'`, lowercased.
* valid = every 23rd cleaned training pair, train = the others; test = dev2010 + dev2012
  (TEDX) + tst2010 + tst2011 + tst2012, in that order.

Two differences, because nmt trains SentencePiece on raw text: no Moses tokenisation (words
are counted on the raw text) and XML entities in dev/test (`&amp;`) are unescaped.

    python scripts/prepare_iwslt14.py ORIG_DE_EN_FOLDER DEST
"""

from __future__ import annotations

import html
import re
import sys
from pathlib import Path

LANGS = ("de", "en")
TEST_SETS = ("IWSLT14.TED.dev2010", "IWSLT14.TEDX.dev2012", "IWSLT14.TED.tst2010", "IWSLT14.TED.tst2011",
             "IWSLT14.TED.tst2012")
DROP_TAGS = ("<url>", "<talkid>", "<keywords>")
STRIP_TAGS = re.compile(r"</?(title|description)>")
SEG = re.compile(r'<seg id="?\d*"?>\s*(.*?)\s*</seg>')
MAX_WORDS, MAX_RATIO = 175, 1.5


def read(path: Path) -> list[str]:
    """Lines of a UTF-8 file; only '\\n' ends a line, one '\\r' before it is dropped."""
    text = path.read_bytes().decode("utf-8")
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return [line[:-1] if line.endswith("\r") else line for line in lines]


def write(path: Path, lines: list[str]) -> None:
    tmp = path.with_name(path.name + ".part")
    tmp.write_text("".join(f"{line}\n" for line in lines), encoding="utf-8", newline="\n")
    tmp.replace(path)


def train_lines(path: Path) -> list[str]:
    return [STRIP_TAGS.sub("", line) for line in read(path) if not any(tag in line for tag in DROP_TAGS)]


def clean(src: list[str], tgt: list[str]) -> tuple[list[str], list[str]]:
    """clean-corpus-n.perl -ratio 1.5, min 1, max 175 words: whitespace squeezed, bad pairs dropped."""
    if len(src) != len(tgt):
        raise SystemExit(f"error: the training files have {len(src)} and {len(tgt)} lines after tag removal")
    kept_src, kept_tgt = [], []
    for s, t in zip(src, tgt, strict=True):
        s_words, t_words = s.split(), t.split()
        if not (1 <= len(s_words) <= MAX_WORDS and 1 <= len(t_words) <= MAX_WORDS):
            continue
        if len(s_words) / len(t_words) > MAX_RATIO or len(t_words) / len(s_words) > MAX_RATIO:
            continue
        kept_src.append(" ".join(s_words))
        kept_tgt.append(" ".join(t_words))
    return kept_src, kept_tgt


def segments(path: Path) -> list[str]:
    lines = []
    for line in read(path):
        if "<seg id" in line:
            match = SEG.search(line)
            text = match.group(1) if match else ""
            lines.append(html.unescape(text).replace("\u2019", "'").lower())
    return lines


def main(orig: Path, dest: Path) -> None:
    src, tgt = clean(*(train_lines(orig / f"train.tags.de-en.{lang}") for lang in LANGS))
    train = {lang: [line.lower() for line in lines] for lang, lines in zip(LANGS, (src, tgt), strict=True)}
    for lang in LANGS:
        lines = train[lang]
        write(dest / f"valid.{lang}", lines[22::23])                 # awk NR%23 == 0
        write(dest / f"train.{lang}", [x for i, x in enumerate(lines, 1) if i % 23])
        test = []
        for name in TEST_SETS:
            test.extend(segments(orig / f"{name}.de-en.{lang}.xml"))
        write(dest / f"test.{lang}", test)
    counts = {split: len(read(dest / f"{split}.de")) for split in ("train", "valid", "test")}
    print(", ".join(f"{split} {n} pairs" for split, n in counts.items()), file=sys.stderr)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit(__doc__.strip().splitlines()[-1].strip())
    main(Path(sys.argv[1]), Path(sys.argv[2]))
