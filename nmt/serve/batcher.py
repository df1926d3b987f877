"""The model thread of `nmt serve`: it takes the first waiting request, then up to `max_wait` seconds more to
collect others with the same search options (until `max_batch_sentences`), decodes their sentences as one batch
and answers each request with its own results. A failed batch's requests are retried one by one; should the
thread itself stop, every waiting request gets the error.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from nmt.serve.settings import ServeSettings

if TYPE_CHECKING:                    # or nmt.runtime's, which serves an ONNX folder without torch
    from nmt.decode.translator import Translator

log = logging.getLogger("nmt.serve")


class RequestError(Exception):
    """A request the server refuses with HTTP `status`; the message goes to the client."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass
class Job:
    sentences: list[str]
    beam_size: int
    n_best: int
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future = field(repr=False)
    attention: bool = False               # keep the attention weights (the page's heatmap)

    @property
    def options(self) -> tuple[int, int, bool]:
        return self.beam_size, self.n_best, self.attention


_STOP = object()


class Batcher:
    def __init__(self, translator: Translator, settings: ServeSettings) -> None:
        self.translator, self.settings = translator, settings
        self.jobs: queue.Queue = queue.Queue()
        self.thread = threading.Thread(target=self._run, name="nmt-model", daemon=True)
        self.held: deque = deque()            # jobs taken while batching other options: they go next
        self.failure: str | None = None       # why the model thread stopped, if it did
        self.closed = False                   # the model thread has ended: jobs are refused
        self.waiting = 0                      # jobs submitted and not yet in a batch (queued or held)
        self.drain_deadline: float | None = None   # time.monotonic() after which queued jobs are refused
        self._submitting = threading.Lock()   # a job is queued before a failure or refused after it

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        """Answer every job already queued, then end the thread."""
        if self.thread.is_alive():
            self.jobs.put(_STOP)
            self.thread.join()

    def drain(self, seconds: float) -> None:
        """Shutting down: jobs that have not started within `seconds` from now are answered 503."""
        self.drain_deadline = time.monotonic() + seconds

    def submit(self, job: Job) -> None:
        """Queue a job; RequestError(503) when `max_queue` jobs (held ones too) are waiting or the thread stopped."""
        with self._submitting:
            if self.failure is not None:
                raise RequestError(503, f"the model thread stopped ({self.failure}); restart the server")
            if self.closed:
                raise RequestError(503, "the server is shutting down; retry shortly")
            if self.waiting >= self.settings.max_queue:
                raise RequestError(503, f"the server is busy ({self.settings.max_queue} requests queued); "
                                        "retry shortly")
            self.waiting += 1
            self.jobs.put_nowait(job)

    def _run(self) -> None:
        try:
            self._serve_jobs()
        except BaseException as exc:
            log.exception("the model thread stopped")
            self._close(exc, f"{type(exc).__name__}: {exc}"[:200])
        else:                                 # stopped: a job that slipped in after the last one is refused
            self._close(RequestError(503, "the server is shutting down; retry shortly"))

    def _close(self, answer: BaseException, failure: str | None = None) -> None:
        """Refuse new jobs from now on and answer every waiting one with `answer`."""
        with self._submitting:
            self.closed = True
            self.failure = failure
            waiting = list(self.held)
            self.held.clear()
            while not self.jobs.empty():
                waiting.append(self.jobs.get_nowait())
            self.waiting = 0
        for job in waiting:
            if job is not _STOP:
                _fail(job, answer)

    def _serve_jobs(self) -> None:
        stopping = False
        while self.held or not stopping:
            first = self.held.popleft() if self.held else self.jobs.get()
            if first is _STOP:
                stopping = True
                continue
            batch, others = self._collect(first, self.held)
            if _STOP in others:
                stopping = True
                others.remove(_STOP)
            self.held.extend(others)
            with self._submitting:
                self.waiting -= len(batch)
            batch = [job for job in batch if not job.future.done()]   # not for clients that went away
            if self.drain_deadline is not None and time.monotonic() > self.drain_deadline:
                for job in batch:
                    _fail(job, RequestError(503, "the server is shutting down; retry shortly"))
            elif batch:
                self._translate(batch)

    def _collect(self, first: Job, held: deque) -> tuple[list[Job], list]:
        """`first` plus queued jobs with its options, waiting at most `max_wait` for more; the others taken.
        Should this fail, the jobs it took go back to the front of `held`, where `_close` answers them."""
        batch: list[Job] = [first]
        others: list = []
        try:
            self._gather(batch, others, held)
        except BaseException:
            held.extendleft(reversed(batch + others))
            raise
        return batch, others

    def _gather(self, batch: list[Job], others: list, held: deque) -> None:
        first = batch[0]
        size = len(first.sentences)
        limit = self.settings.max_batch_sentences     # only a single larger request goes over it
        for job in list(held):                # jobs held back earlier come first, in arrival order
            if job.options == first.options:
                if size + len(job.sentences) > limit:
                    break
                held.remove(job)
                batch.append(job)
                size += len(job.sentences)
        deadline = time.monotonic() + self.settings.max_wait
        while size < limit:
            try:                              # timeout 0: a job already queued, else none
                job = self.jobs.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                break
            if job is _STOP or job.options != first.options or size + len(job.sentences) > limit:
                others.append(job)
                if job is _STOP or job.options == first.options:     # the batch is full (or stopping)
                    break
                continue
            batch.append(job)
            size += len(job.sentences)

    def _translate(self, batch: list[Job]) -> None:
        sentences = [s for job in batch for s in job.sentences]
        beam_size, n_best, attention = batch[0].options
        try:
            results = self.translator.translate(sentences, n_best=n_best, beam_size=beam_size,
                                                return_attention=attention)
        except Exception as exc:              # the client gets a 500 with the reason; the server keeps running
            if len(batch) == 1:
                log.exception("translation failed")
            error = exc.with_traceback(None)  # its frames hold the failed search's tensors: free them first
        except BaseException as exc:          # the thread ends (see _run); this batch's clients hear why
            for job in batch:
                _fail(job, exc)
            raise
        else:
            start = 0
            for job in batch:
                job.loop.call_soon_threadsafe(_settle, job.future, results[start:start + len(job.sentences)])
                start += len(job.sentences)
            return
        if len(batch) == 1:
            _fail(batch[0], error)
            return
        for i, job in enumerate(batch):       # one request's failure (say, out of memory) is not the others'
            try:
                self._translate([job])
            except BaseException as ended:    # the thread ends: the rest of the batch hear why
                for rest in batch[i + 1:]:
                    _fail(rest, ended)
                raise


def _fail(job: Job, exc: BaseException) -> None:
    """Answer the job with `exc`; one that is not an Exception (it would end the event loop) as a RuntimeError."""
    if not isinstance(exc, Exception):
        exc = RuntimeError(f"the model thread stopped ({type(exc).__name__}: {exc})"[:200])
    job.loop.call_soon_threadsafe(_settle, job.future, exc)


def _settle(future: asyncio.Future, value: Any) -> None:
    """Set the results, or the exception `value` is, unless a client that went away cancelled the future."""
    if future.done():
        return
    if isinstance(value, BaseException):
        future.set_exception(value)
    else:
        future.set_result(value)
