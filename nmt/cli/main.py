"""The `nmt` command line: the process around the commands (signals, closed descriptors, exit codes).
Importing this module registers the commands of nmt.cli's modules on `app`, in the order `--help` lists."""

from __future__ import annotations

import contextlib
import errno
import gc
import importlib
import io
import os
import select
import signal
import sys

import typer

from nmt import __version__
from nmt.cli.common import app, error_line, fail, is_user_error, one_line
from nmt.process import configure_process

__all__ = ["app", "fail", "main", "one_line"]

for _module in ("stages", "decoding", "reports", "models"):   # registers their commands, in --help's order
    importlib.import_module(f"nmt.cli.{_module}")


class Interrupted(BaseException):
    """SIGINT or SIGTERM arrived: unwind (temporary files are removed on the way) and exit 128 + signal."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.exit_code = 128 + signum


def _interrupt(signum: int, _frame: object) -> None:
    for sig in (signal.SIGINT, signal.SIGTERM):     # a second signal must not interrupt the cleanup
        signal.signal(sig, signal.SIG_IGN)
    raise Interrupted(signum)


class ClosedStdout(io.TextIOBase):
    """Stands in for a stdout the shell closed (`nmt translate >&-`): writing to it is an error, as in a shell."""

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        raise OSError(errno.EBADF, "stdout is closed (>&-); leave it open, or write to a file where the "
                                   "command has an option for one")


def _occupy_closed_descriptors() -> None:
    """/dev/null on a closed stdin, stdout or stderr (`>&-`), so that no file nmt opens later gets descriptor
    0, 1 or 2 and receives what a library prints; writing to the closed stdout stays an error."""
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:                     # the lowest free descriptor is `fd` (those below are open); stdout
            os.open(os.devnull, os.O_RDONLY if fd == 1 else os.O_RDWR)   # read-only: `-o /dev/stdout` is refused
    if sys.stdout is None:                  # Python's stand-in for a descriptor 1 closed at start
        sys.stdout = ClosedStdout()
    if sys.stderr is None:                  # messages and progress bars go where the user sent them: nowhere
        sys.stderr = open(2, "w", encoding="utf-8", errors="backslashreplace", closefd=False)  # noqa: SIM115


FULL_INSTALL_ONLY = ("torch", "sacrebleu", "safetensors")    # what nmt-runtime (./runtime-dist) does not install


def _reader_gone() -> bool:
    """stdout is a pipe whose reading end is closed (`| head` has exited): poll reports an error on it."""
    try:
        poller = select.poll()
        poller.register(1, select.POLLOUT)
        return any(events & select.POLLERR for _, events in poller.poll(0))
    except (OSError, ValueError, AttributeError):          # no poll() on this system
        return False


def _end_as_sigpipe_does() -> None:
    """End silently, killed by SIGPIPE, as `cat` does when `head` stops reading (Python ignores SIGPIPE: the write
    failed with EPIPE, and the `with` blocks on the way here removed what was half-written)."""
    with contextlib.suppress(OSError, ValueError):
        os.dup2(os.open(os.devnull, os.O_WRONLY), 1)   # nothing more reaches the pipe, not even a flush
        sys.stderr.flush()
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGPIPE)
    os._exit(128 + signal.SIGPIPE)                     # where the signal is not delivered at once


def _version(value: bool) -> None:
    if value:
        typer.echo(f"nmt {__version__}")
        raise typer.Exit()


@app.callback()
def root(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Show the version."),
) -> None:
    """RNN-attention NMT toolkit."""


def main() -> None:
    """Run a command; every failure is one `error:` line (exit 2), a signal exits 128 + its number."""
    try:                                 # typer >= 0.20 carries its own copy of click
        from typer._click.exceptions import ClickException, NoArgsIsHelpError
    except ImportError:
        from click.exceptions import ClickException, NoArgsIsHelpError  # type: ignore[assignment]

    configure_process()              # before torch's first oneDNN call; imports no torch
    _occupy_closed_descriptors()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, _interrupt)
    code = 0
    try:
        code = app(prog_name="nmt", standalone_mode=False) or 0
    except NoArgsIsHelpError as exc:
        exc.show()
        code = 2
    except ClickException as exc:
        typer.echo(f"{error_line(exc.format_message())} (see --help)", err=True)
        code = 2
    except Interrupted as exc:
        print(f"interrupted ({exc})", file=sys.stderr)
        with contextlib.suppress(OSError):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(exc.exit_code)      # cleanup is done; do not wait for a worker thread still in C++
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        code = 130
    except SystemExit as exc:                    # click exits 1 when a write to stdout fails with EPIPE
        if exc.code != 1 or not _reader_gone():
            raise
        _end_as_sigpipe_does()
    except BrokenPipeError:                      # the reader went away (`nmt translate | head`)
        _end_as_sigpipe_does()
    except OSError as exc:
        where = f"{exc.filename}: " if exc.filename else ""
        typer.echo(error_line(f"{where}{exc.strerror or exc}"), err=True)
        code = 2
    except typer.Abort:
        code = 1
    except Exception as exc:
        if is_user_error(exc):
            typer.echo(error_line(exc), err=True)
            code = 2
        elif isinstance(exc, ModuleNotFoundError) and exc.name in FULL_INSTALL_ONLY:
            typer.echo(error_line(f"this needs {exc.name}, which this install lacks: nmt without PyTorch "
                                  "(./runtime-dist) translates and serves ONNX model folders only; install nmt "
                                  "itself for the rest"), err=True)
            code = 2
        else:
            typer.echo(error_line(f"internal error ({type(exc).__name__}: {one_line(str(exc))[:300]}); "
                                  "please report it"), err=True)
            code = 1
    finally:
        # Exit without a last garbage-collector walk over torch's objects (0.3 s of every command), except once
        # triton is loaded (torch._dynamo, which torch's optimisers import, loads it in CUDA builds): from 3.9
        # its nanobind bindings print dozens of "leaked instance" lines for what a frozen heap keeps alive.
        if "triton" not in sys.modules:
            gc.freeze()
    sys.exit(code)
