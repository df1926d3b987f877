"""scripts/setup_venv.sh, which the README's main command (quickstart.sh) sources on a fresh machine.

The scripts run in a fake virtual environment whose `python` and `pip` only record their calls, so
the tests check what gets installed without installing anything.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _executable(path: Path, text: str) -> None:
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


def _fake_checkout(root: Path) -> Path:
    """A repository root with the script, an importable `nmt/` package and a .venv whose tools log calls."""
    (root / "scripts").mkdir(parents=True)
    shutil.copy(REPO / "scripts" / "setup_venv.sh", root / "scripts")
    (root / "nmt").mkdir()
    (root / "nmt" / "__init__.py").write_text("")
    bin_dir = root / ".venv" / "bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "activate").write_text(f'export PATH="{bin_dir}:$PATH"\n')
    _executable(bin_dir / "python", f'#!/bin/sh\necho "python $*" >> "{root}/calls.log"\nexit 0\n')
    _executable(bin_dir / "pip", f'#!/bin/sh\necho "pip $*" >> "{root}/calls.log"\nexit 0\n')
    return root


def _source(root: Path) -> list[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("NMT_SKIP_VENV", "MULTI30K_MIRROR", "VIRTUAL_ENV")}
    subprocess.run(["bash", "-c", "set -euo pipefail; source scripts/setup_venv.sh"], cwd=root, env=env, check=True)
    log = root / "calls.log"
    return log.read_text().splitlines() if log.exists() else []


def test_installs_nmt_when_its_command_is_missing_even_though_the_package_imports_from_the_root(tmp_path):
    # From the repository root `import nmt` works without an install; quickstart.sh then found no `nmt` command.
    calls = _source(_fake_checkout(tmp_path))
    assert "pip install -q -e ." in calls


def test_leaves_an_installed_nmt_alone(tmp_path):
    root = _fake_checkout(tmp_path)
    _executable(root / ".venv" / "bin" / "nmt", "#!/bin/sh\nexit 0\n")
    calls = _source(root)
    assert not [call for call in calls if call.startswith("pip install") and "-e ." in call]
    assert any(call.startswith("python -c") for call in calls)      # it still checked for torch
