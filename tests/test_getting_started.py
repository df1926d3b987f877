"""The commands a new user runs first: configs/smoke.yaml's installation check and the README's step by
step section, run as written in a copy of the repository's layout (data from a local Multi30k mirror)."""

from __future__ import annotations

import gzip
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from .conftest import MULTI30K, REPO, SMOKE_CONFIG, read_gz

README = REPO / "README.md"


def checkout(tmp_path: Path, *configs: Path) -> Path:
    """A folder laid out like the repository: configs/ with copies of `configs`, scripts/ linked."""
    root = tmp_path / "checkout"
    (root / "configs").mkdir(parents=True)
    for config in configs:
        shutil.copy(config, root / "configs" / config.name)
    (root / "scripts").symlink_to(REPO / "scripts")
    return root


def shell(script: str, cwd: Path, **env: str) -> subprocess.CompletedProcess:
    """bash -euo pipefail with this Python's `nmt` first on PATH. One thread per process: these models are
    tiny, and on cores that other tests share, torch's spinning threads made training 9x slower (145 s)."""
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"
    return subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=cwd, capture_output=True, text=True,
                          env={**os.environ, "PATH": path, "OMP_NUM_THREADS": "1", **env}, timeout=900)


def smoke_commands() -> list[str]:
    """The commands configs/smoke.yaml's header gives (comment lines indented under it)."""
    lines = SMOKE_CONFIG.read_text(encoding="utf-8").splitlines()
    return [line[1:].strip() for line in lines if line.startswith("#   ")]


@pytest.mark.slow
def test_the_smoke_config_runs_end_to_end_on_the_data_its_header_fetches(tmp_path):
    read_gz("train.de", 1)                                   # skips without the Multi30k mirror
    commands = smoke_commands()
    assert commands[0].startswith("scripts/get_multi30k.sh && nmt preprocess -c configs/smoke.yaml")
    root = checkout(tmp_path, SMOKE_CONFIG)
    result = shell("\n".join(commands), root, MULTI30K_MIRROR=str(MULTI30K))
    assert result.returncode == 0, result.stderr[-3000:]
    config = yaml.safe_load(SMOKE_CONFIG.read_text(encoding="utf-8"))
    assert config["data"]["train"] == "../data/multi30k/train"   # what scripts/get_multi30k.sh writes
    assert (root / "data" / "multi30k" / "train.de.gz").is_file() and (root / "runs" / "smoke" / "best.pt").is_file()
    translations = result.stdout.split("\n")
    assert len(translations) == 2 and translations[0] and translations[1] == ""   # one line out for one in


def readme_steps(title: str = "Step by step") -> str:
    """The bash block of a README section."""
    text = README.read_text(encoding="utf-8")
    section = text.split(f"## {title}", 1)[1].split("\n## ", 1)[0]
    match = re.search(r"```bash\n(.*?)```", section, re.S)
    assert match, f"README has no bash block under '## {title}'"
    return match.group(1)


def write_mirror(folder: Path) -> Path:
    """A small Multi30k mirror: every file get_multi30k.sh needs, with few lines."""
    folder.mkdir()
    for split, n in (("train", 400), ("val", 20), ("test_2016_flickr", 20)):
        for lang in ("de", "en", "fr"):
            lines = read_gz(f"{split}.{lang}", n) if lang != "fr" else ["x"] * n
            with gzip.open(folder / f"{split}.{lang}.gz", "wt", encoding="utf-8") as handle:
                handle.write("".join(f"{line}\n" for line in lines))
    return folder


# The step-by-step commands run as written, with the model and data made small: `nmt` is a shell function
# that adds these settings to preprocess and train (train checks that its data folder was made with its own).
SMALL_DATA = ["data.vocab_size=200", "data.spm_sample_sentences=800", "data.shortlist_pairs=400"]
SMALL_MODEL = ["model.embedding_dim=16", "model.encoder_hidden=16", "model.decoder_hidden=32",
               "model.attention_dim=16", "training.max_updates=3", "training.validate_every=3",
               "training.val_max_sentences=5", "training.log_examples=0", "training.device=cpu"]


def small_nmt() -> str:
    data = " ".join(f"--set {s}" for s in SMALL_DATA)
    model = " ".join(f"--set {s}" for s in SMALL_MODEL)
    return ("nmt() { case \"$1\" in\n"
            f"  preprocess) command nmt \"$@\" {data} ;;\n"
            f"  train) command nmt \"$@\" {data} {model} ;;\n"
            "  *) command nmt \"$@\" ;;\nesac; }\n")


@pytest.mark.slow
def test_readme_step_by_step_runs_as_written(tmp_path):
    steps = readme_steps()
    configs = sorted(set(re.findall(r"--config (configs/\S+\.yaml)", steps)))
    assert configs == ["configs/multi30k_de_en_bahdanau.yaml"]
    mirror = write_mirror(tmp_path / "mirror")
    root = checkout(tmp_path, *(REPO / c for c in configs))
    script = small_nmt() + steps.replace("/path/to/copy", str(mirror))
    result = shell(script, root, MULTI30K_MIRROR=str(mirror))
    assert result.returncode == 0, result.stderr[-3000:]
    config = yaml.safe_load((REPO / configs[0]).read_text(encoding="utf-8"))
    run_dir = (root / "configs" / config["training"]["run_dir"]).resolve()
    for named in re.findall(r"(runs/\S+?\.pt)", steps):              # every checkpoint named exists now
        assert (root / named).resolve() == run_dir / "best.pt" and (root / named).is_file(), named
    scores = (root / "scores.json").read_text(encoding="utf-8")
    assert '"sentences": 20' in scores and "nrefs:1|case:mixed|eff:no|tok:13a" in scores
    assert len((root / "hyp.en").read_text(encoding="utf-8").split("\n")) == 21

    # The fine-tuning recipe, after the step by step, on a "domain" of pairs from the mirror.
    (root / "my_domain").mkdir()
    for name, split, n in (("train", "train", 60), ("val", "val", 10), ("test", "test_2016_flickr", 10)):
        for lang in ("de", "en"):
            lines = read_gz(f"{split}.{lang}", 100)[-n:]                 # pairs the parent did not see
            (root / "my_domain" / f"{name}.{lang}").write_text("".join(f"{x}\n" for x in lines), encoding="utf-8")
    result = shell(small_nmt() + readme_steps("Fine-tune on your domain"), root)
    assert result.returncode == 0, result.stderr[-3000:]
    tuned = yaml.safe_load((root / "runs" / "my_domain" / "config.yaml").read_text(encoding="utf-8"))
    assert tuned["training"]["init_from"] == str(run_dir / "best.pt")
    for name in ("before.json", "after.json"):
        assert '"sentences": 10' in (root / name).read_text(encoding="utf-8")


@pytest.mark.slow
def test_the_quickstart_runs_again_in_the_same_checkout(tmp_path):
    """A second run starts the run over, the first run's evaluation (the script's own files) included; a file
    of the user's in the run folder stops it, named, and stays."""
    mirror = write_mirror(tmp_path / "mirror")
    root = checkout(tmp_path, REPO / "configs" / "multi30k_de_en_bahdanau.yaml")
    script = small_nmt() + "export -f nmt\nbash scripts/quickstart.sh\n"
    env = {"MULTI30K_MIRROR": str(mirror), "NMT_SKIP_VENV": "1", "THREADS": "1"}
    run = root / quickstart_run()
    for _ in range(2):
        result = shell(script, root, **env)
        assert result.returncode == 0, result.stderr[-3000:]
        assert '"sentences": 20' in (run / "eval" / "scores.json").read_text(encoding="utf-8")
    (run / "eval" / "notes.txt").write_text("mine\n", encoding="utf-8")
    result = shell(script, root, **env)
    assert result.returncode == 2 and "(eval)" in result.stderr.splitlines()[-1], result.stderr[-3000:]
    assert (run / "eval" / "notes.txt").read_text(encoding="utf-8") == "mine\n"


def quickstart_run() -> str:
    """The run folder scripts/quickstart.sh trains by default: runs/quickstart_<config name>."""
    script = (REPO / "scripts" / "quickstart.sh").read_text(encoding="utf-8")
    config = re.search(r'^CONFIG="\$\{CONFIG:-(\S+?)\}"', script, re.M).group(1)
    run = re.search(r'^RUN="\$\{RUN:-runs/quickstart_\$\(basename "\$CONFIG" \.yaml\)\}"', script, re.M)
    assert run, "quickstart.sh's default RUN changed; update this test and the README"
    return f"runs/quickstart_{Path(config).stem}"


def test_the_readme_names_the_checkpoints_the_quickstart_and_the_steps_write():
    """Every `runs/.../best.pt` the README names is the quickstart's run, the step-by-step config's, or the
    fine-tuning recipe's (whose commands `test_readme_step_by_step_runs_as_written` runs)."""
    config = yaml.safe_load((REPO / "configs" / "multi30k_de_en_bahdanau.yaml").read_text(encoding="utf-8"))
    step_run = os.path.normpath(os.path.join("configs", config["training"]["run_dir"]))
    known = {quickstart_run(), step_run, "runs/my_domain"}
    text = README.read_text(encoding="utf-8")
    start, end = text.index("## Step by step"), text.index("## Python API")    # steps, safety, ship a model
    named = set(re.findall(r"\b(runs/[\w.-]+)/best\.pt", text[start:end]))
    assert named and named <= known, named - known
    assert quickstart_run() in text[start:end]


def test_shell_completion_is_offered_for_nmt():
    """`nmt --show-completion bash` prints the script that `--install-completion` installs; it completes the
    `nmt` command (not `python -m nmt`), and the command answers its completion requests."""
    env = {**os.environ, "_TYPER_COMPLETE_TEST_DISABLE_SHELL_DETECTION": "1"}   # the shell given, not detected
    shown = subprocess.run([sys.executable, "-m", "nmt", "--show-completion", "bash"], capture_output=True,
                           text=True, env=env, timeout=120)
    assert shown.returncode == 0, shown.stderr
    assert "complete -o default -F _nmt_completion nmt" in shown.stdout
    assert "_NMT_COMPLETE=complete_bash" in shown.stdout
    asked = subprocess.run([sys.executable, "-m", "nmt"], capture_output=True, text=True, timeout=120,
                           env={**os.environ, "_NMT_COMPLETE": "complete_bash", "COMP_WORDS": "nmt translate --beam",
                                "COMP_CWORD": "2"})
    assert asked.returncode == 0 and asked.stdout.split() == ["--beam-size"], (asked.stdout, asked.stderr)
    listed = subprocess.run([sys.executable, "-m", "nmt", "--help"], capture_output=True, text=True, timeout=120)
    assert "--install-completion" in listed.stdout
