"""scripts/get_iwslt14.sh on a small fake mirror in the release's own format."""

import os
import subprocess
import sys
import tarfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

HEADER = {
    "de": ["<url>http://www.ted.com/talks/lang/de/x.html</url>", "<keywords>talks, Wissenschaft</keywords>",
           "<speaker>Jane Doe</speaker>", "<talkid>1</talkid>",
           "<title>Jane Doe: Über Korallen</title>", "<description>TED Talk Untertitel</description>"],
    "en": ["<url>http://www.ted.com/talks/x.html</url>", "<keywords>talks, science</keywords>",
           "<speaker>Jane Doe</speaker>", "<talkid>1</talkid>",
           "<title>Jane Doe: On corals</title>", "<description>TED Talk Subtitles</description>"],
}


def xml(lang: str, name: str, segs: list[str]) -> str:
    kind = "srcset" if lang == "de" else "refset"
    body = "\n".join(f'<seg id="{i}"> {text} </seg>' for i, text in enumerate(segs, 1))
    return (f'<?xml version="1.0" encoding="UTF-8"?>\n<mteval>\n<{kind} setid="{name}" srclang="german">\n'
            f'<doc docid="1" genre="lectures">\n<url>http://x</url>\n<talkid>1</talkid>\n<title>T</title>\n'
            f"{body}\n</doc>\n</{kind}>\n</mteval>\n")


def make_mirror(root: Path) -> Path:
    release = root / "build" / "de-en"
    release.mkdir(parents=True)
    body = {"de": [f"Satz Nummer {i} ist Hier ." for i in range(50)],
            "en": [f"Sentence Number {i} ." for i in range(50)]}
    body["de"][3], body["en"][3] = "ein  Satz   mit Leerraum", "a sentence  with space"   # squeezed
    body["de"][5], body["en"][5] = "viel zu lang " * 10, "short"                        # ratio > 1.5: dropped
    body["de"][7], body["en"][7] = "wort " * 176, "word " * 176                         # > 175 words: dropped
    body["de"][9], body["en"][9] = "   ", "nothing"                                     # empty side: dropped
    for lang in ("de", "en"):
        lines = HEADER[lang] + body[lang]
        (release / f"train.tags.de-en.{lang}").write_text("\n".join(lines) + "\n", encoding="utf-8")
        for n, name in enumerate(("IWSLT14.TED.dev2010", "IWSLT14.TEDX.dev2012", "IWSLT14.TED.tst2010",
                                  "IWSLT14.TED.tst2011", "IWSLT14.TED.tst2012")):
            segs = [f"{name} {lang} Erste’s &amp; Zeile", f"{name} {lang} zweite"] if n != 1 else [f"{name} {lang} X"]
            (release / f"{name}.de-en.{lang}.xml").write_text(xml(lang, name, segs), encoding="utf-8")
    mirror = root / "mirror"
    mirror.mkdir()
    with tarfile.open(mirror / "de-en.tgz", "w:gz") as tar:
        tar.add(release, arcname="de-en")
    return mirror


def test_get_iwslt14_extracts_and_cleans_like_fairseq(tmp_path):
    mirror = make_mirror(tmp_path)
    dest = tmp_path / "iwslt14"
    result = subprocess.run(["bash", str(REPO / "scripts" / "get_iwslt14.sh"), "--mirror", str(mirror), str(dest)],
                            capture_output=True, text=True, env={**os.environ, "PYTHON": sys.executable})
    assert result.returncode == 0, result.stderr
    read = lambda name: (dest / name).read_text(encoding="utf-8").split("\n")[:-1]  # noqa: E731
    train_de, valid_de, train_en, valid_en = read("train.de"), read("valid.de"), read("train.en"), read("valid.en")
    # Header lines: <url>, <keywords>, <talkid> dropped; speaker kept; title/description text kept without tags.
    cleaned_de = ["<speaker>jane doe</speaker>", "jane doe: über korallen", "ted talk untertitel"]
    kept = [i for i in range(50) if i not in (5, 7, 9)]
    cleaned_de += ["ein satz mit leerraum" if i == 3 else f"satz nummer {i} ist hier ." for i in kept]
    assert len(cleaned_de) == 50
    assert valid_de == cleaned_de[22::23] and train_de == [x for i, x in enumerate(cleaned_de, 1) if i % 23]
    assert len(train_en) == len(train_de) and len(valid_en) == len(valid_de)
    assert "a sentence with space" in train_en
    test_de = read("test.de")
    assert test_de == ["iwslt14.ted.dev2010 de erste's & zeile", "iwslt14.ted.dev2010 de zweite",
                       "iwslt14.tedx.dev2012 de x",
                       "iwslt14.ted.tst2010 de erste's & zeile", "iwslt14.ted.tst2010 de zweite",
                       "iwslt14.ted.tst2011 de erste's & zeile", "iwslt14.ted.tst2011 de zweite",
                       "iwslt14.ted.tst2012 de erste's & zeile", "iwslt14.ted.tst2012 de zweite"]
    assert len(read("test.en")) == len(test_de)


def test_get_iwslt14_names_a_missing_mirror_file(tmp_path):
    result = subprocess.run(["bash", str(REPO / "scripts" / "get_iwslt14.sh"), "--mirror", str(tmp_path),
                             str(tmp_path / "out")], capture_output=True, text=True)
    assert result.returncode != 0
    assert f"error: {tmp_path}/de-en.tgz does not exist" in result.stderr
