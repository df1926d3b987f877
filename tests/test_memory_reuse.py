"""`nmt translate` and `nmt serve` ask glibc to keep freed blocks for reuse (nmt.device.reuse_freed_memory)."""

import ctypes
import os

import pytest

from nmt import device


class FakeLibc:
    def __init__(self) -> None:
        self.calls: list[tuple[int, int]] = []

    def mallopt(self, parameter: int, value: int) -> int:
        self.calls.append((parameter, value))
        return 1


@pytest.fixture
def libc(monkeypatch):
    fake = FakeLibc()
    monkeypatch.setattr(ctypes, "CDLL", lambda name: fake)
    for name in [n for n in os.environ if n.startswith("MALLOC_") or n == "GLIBC_TUNABLES"]:
        monkeypatch.delenv(name)
    return fake


def test_sets_glibcs_mmap_and_trim_thresholds(libc):
    device.reuse_freed_memory()
    settings = dict(libc.calls)
    assert settings[-3] == 32 << 20                 # M_MMAP_THRESHOLD: glibc's maximum
    assert settings[-1] >= 1 << 30                  # M_TRIM_THRESHOLD: freed heap tops stay mapped
    assert -2 in settings                           # M_TOP_PAD


@pytest.mark.parametrize("variable", ["MALLOC_ARENA_MAX", "MALLOC_TRIM_THRESHOLD_", "GLIBC_TUNABLES"])
def test_leaves_malloc_alone_when_the_user_tuned_it(libc, monkeypatch, variable):
    monkeypatch.setenv(variable, "8")
    device.reuse_freed_memory()
    assert libc.calls == []


def test_a_c_library_without_mallopt_is_a_no_op(monkeypatch):
    monkeypatch.setattr(ctypes, "CDLL", lambda name: object())
    device.reuse_freed_memory()                     # no AttributeError


def test_not_on_other_platforms(libc, monkeypatch):
    monkeypatch.setattr("sys.platform", "win32")                    # where CDLL(None) raises TypeError
    device.reuse_freed_memory()
    assert libc.calls == []
