"""The limits of `nmt serve` (nmt.serve.server), apart from the server so that they are checked without its extra."""

from __future__ import annotations

from dataclasses import dataclass

from nmt.config import ConfigError


@dataclass
class ServeSettings:
    host: str = "127.0.0.1"
    port: int = 8000
    max_batch_sentences: int = 128     # sentences translated together (a larger single request is not split)
    max_wait: float = 0.005            # seconds a batch waits for more requests once the model is free
    max_queue: int = 256               # requests waiting for the model; more are refused with 503
    max_sentences: int = 100           # sentences per request; more are refused with 413
    max_body_bytes: int = 256 * 1024   # request body; larger is refused with 413
    body_timeout: float = 30.0         # seconds for a request body to arrive; slower is refused with 408
    max_beam: int = 16                 # largest beam_size a request may ask for
    retry_after: int = 1               # seconds, in the Retry-After header of a 503
    shutdown_timeout: float = 10.0     # seconds after SIGTERM in which queued requests may still start

    def check(self) -> None:
        """Every limit within what one machine can hold (ConfigError naming the option otherwise)."""
        for key, (option, unit, high) in SETTING_BOUNDS.items():
            value = getattr(self, key)
            if not 1 <= value <= high * unit:
                raise ConfigError(f"{option} must be in 1..{high}, got {value / unit:g}")


SETTING_BOUNDS = {"max_batch_sentences": ("--max-batch-sentences", 1, 10_000), "max_queue": ("--max-queue", 1, 100_000),
                  "max_sentences": ("--max-sentences", 1, 10_000), "max_body_bytes": ("--max-body-kb", 1024, 65_536)}
