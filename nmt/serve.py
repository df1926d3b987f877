"""HTTP server over the translator (the `serve` extra: FastAPI on uvicorn).

    nmt serve --model model.nmt --port 8000

    POST /translate   ["Ein Hund läuft.", ...]                       -> {"translations": [...]}
                      {"sentences": [...], "beam_size": 5, "n_best": 3} -> {"translations": [...],
                                                                          "n_best": [[{"text", "score"}, ...], ...]}
                      {"q": ..., "source": "de", "target": "en"}     -> {"translatedText": ...} (LibreTranslate)
    GET  /languages   [{"code", "name", "targets"}, ...]              (LibreTranslate; nmt.serve_libre)
    GET  /health      {"status": "ok", "languages": {...}, "queued": N}
    GET  /openapi.json  the OpenAPI schema of these routes

Requests from concurrent clients are translated together: one model thread takes the first
waiting request, then up to `max_wait` seconds more to collect others with the same search
options, until `max_batch_sentences`; their sentences are decoded as one length-sorted batch and
each request gets its own results, in its own order. A request that finds `max_queue` requests
waiting is answered 503 with Retry-After instead of hanging. Bodies over `max_body_bytes` and
requests over `max_sentences` get 413; anything malformed gets 400 with a message. A request
whose translation fails gets 500 with the reason, and the requests batched with it are translated
again on their own; should the model thread itself stop, every waiting request gets 500 and
`/health` and new requests 503 ("failed"), so a supervisor can restart the server. On SIGTERM
(or Ctrl-C) the server stops accepting connections, translates the queued requests that start
within `shutdown_timeout` (10 s), answers the rest 503, and exits; a second signal exits at once.
A body that has not arrived within `body_timeout` gets 408.
One log line per request on stderr: method, path, status, sentences, latency.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import signal
import socket
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from nmt.bounded import loads_json
from nmt.config import ConfigError
from nmt.decode.outputs import Translation, nbest_json
from nmt.decode.translator import Translator
from nmt.serve_batcher import Batcher, Job, RequestError
from nmt.serve_libre import TRANSLATE_BODY, is_libre, languages_list, libre_response, parse_libre
from nmt.serve_settings import ServeSettings

__all__ = ["Batcher", "Job", "RequestError", "ServeSettings", "create_app", "format_response", "run_server"]

log = logging.getLogger("nmt.serve")


# ---------------------------------------------------------------------------------------------
# Requests


def parse_json(body: bytes) -> Any:
    """A request body as JSON; raises RequestError(400)."""
    try:
        return loads_json(body)
    except (ValueError, RecursionError) as exc:   # JSONDecodeError and UnicodeDecodeError are ValueErrors
        reason = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
        raise RequestError(400, f"the request body is not valid JSON ({reason})") from None


def parse_request(payload: Any, settings: ServeSettings, default_beam: int) -> tuple[list[str], int, int]:
    """A parsed /translate body of nmt's own shape -> (sentences, beam_size, n_best); raises RequestError(400
    or 413)."""
    options: dict[str, Any] = {}
    if isinstance(payload, dict):
        unknown = sorted(set(payload) - {"sentences", "beam_size", "n_best"})
        if unknown:
            raise RequestError(400, f"unknown key {unknown[0]!r}; expected sentences, beam_size, n_best")
        if "sentences" not in payload:
            raise RequestError(400, "missing key 'sentences': a list of strings to translate")
        options, payload = payload, payload["sentences"]
    if not isinstance(payload, list):
        raise RequestError(400, "expected a JSON list of sentences, or an object {\"sentences\": [...], "
                                "\"beam_size\": k, \"n_best\": n}")
    if len(payload) > settings.max_sentences:
        raise RequestError(413, f"{len(payload)} sentences in one request; the limit is {settings.max_sentences}")
    for i, sentence in enumerate(payload):
        if not isinstance(sentence, str):
            raise RequestError(400, f"sentences[{i}] is {type(sentence).__name__}, not a string")
        try:
            sentence.encode("utf-8")
        except UnicodeEncodeError:
            raise RequestError(400, f"sentences[{i}] is not valid Unicode (a lone surrogate)") from None
        if "\n" in sentence:                 # as in `nmt translate`, where \n ends a line and nothing else does
            raise RequestError(400, f"sentences[{i}] contains a line break (\\n); send each line as its own "
                                    "sentence")
    beam_size = _int_option(options, "beam_size", default_beam, 1, settings.max_beam)
    n_best = _int_option(options, "n_best", 1, 1, beam_size)
    return payload, beam_size, n_best


def _int_option(options: dict[str, Any], key: str, default: int, low: int, high: int) -> int:
    value = options.get(key, default)
    if value is None:
        return default
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        limit = f"{low}..{high}" + (" (at most beam_size)" if key == "n_best" else "")
        shown = json.dumps(value)
        shown = shown if len(shown) <= 40 else shown[:40] + "..."      # not a large body echoed back
        raise RequestError(400, f"{key} must be an integer in {limit}, got {shown}")
    return value


def format_response(results: list[Translation], n_best: int) -> dict[str, Any]:
    """{"translations": [...]}, with "n_best" lists when n_best > 1 (exactly n_best entries each, by the rule
    of nmt.decode.outputs that `nmt translate --n-best` follows too) and, when a sentence was over the
    model's input length and translated cut short, "truncated": the indices of those sentences."""
    response: dict[str, Any] = {"translations": [r.text for r in results]}
    if n_best > 1:
        response["n_best"] = [nbest_json(r) for r in results]
    truncated = [i for i, r in enumerate(results) if r.truncated]
    if truncated:
        response["truncated"] = truncated
    return response


async def read_body(request: Request, limit: int, timeout: float) -> bytes:
    """The request body, refused with 413 as soon as it is known to exceed `limit` bytes, with 408 if it
    has not all arrived within `timeout` seconds, and with 400 if the client goes away before the end."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise RequestError(413, f"request body of {declared} bytes; the limit is {limit}")
    chunks, size = [], 0
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    stream = request.stream()
    while True:
        try:
            chunk = await asyncio.wait_for(anext(stream), max(0.0, deadline - loop.time()))
        except StopAsyncIteration:
            return b"".join(chunks)
        except asyncio.TimeoutError:
            raise RequestError(408, f"the request body did not arrive within {timeout:g} s") from None
        except ClientDisconnect:
            raise RequestError(400, "the client disconnected before the end of the request body") from None
        size += len(chunk)
        if size > limit:
            raise RequestError(413, f"request body over {limit} bytes")
        chunks.append(chunk)


# ---------------------------------------------------------------------------------------------
# The application


def create_app(translator: Translator, settings: ServeSettings, languages: dict[str, str] | None = None) -> FastAPI:
    """The ASGI app; its model thread starts and stops with the app's lifespan. Raises ConfigError for a
    `max_beam` below the model's beam size, which every request without beam_size would be refused."""
    settings.check()
    if translator.decoding.beam_size > settings.max_beam:
        raise ConfigError(f"--max-beam {settings.max_beam} is below the model's beam size "
                          f"{translator.decoding.beam_size} (decoding.beam_size), which requests without "
                          f"beam_size use; raise --max-beam to at least {translator.decoding.beam_size}")
    batcher = Batcher(translator, settings)
    state = {"accepting": False}

    @contextlib.asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        batcher.start()
        state["accepting"] = True
        yield
        state["accepting"] = False
        await asyncio.to_thread(batcher.stop)          # answer what is queued

    app = FastAPI(title="nmt", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url="/openapi.json")
    app.state.batcher = batcher

    @app.middleware("http")
    async def log_requests(request: Request, call_next: Any) -> Any:
        start = time.perf_counter()
        request.state.sentences = 0
        response = await call_next(request)
        log.info("%s %s %d %d sentences %.1f ms", request.method, request.url.path, response.status_code,
                 request.state.sentences, (time.perf_counter() - start) * 1000)
        return response

    @app.exception_handler(StarletteHTTPException)
    async def unrouted(_request: Request, exc: StarletteHTTPException) -> JSONResponse:
        """404, 405 and the like in the server's one error shape."""
        return JSONResponse({"error": str(exc.detail)}, status_code=exc.status_code, headers=exc.headers)

    @app.exception_handler(RequestError)
    async def refuse(_request: Request, exc: RequestError) -> JSONResponse:
        headers = {"Retry-After": str(settings.retry_after)} if exc.status == 503 else None
        return JSONResponse({"error": str(exc)}, status_code=exc.status, headers=headers)

    @app.get("/health")
    async def health() -> JSONResponse:
        status = ("failed" if batcher.failure is not None else
                  "ok" if state["accepting"] else "shutting down")
        return JSONResponse({"status": status, "languages": languages or {}, "queued": batcher.waiting},
                            status_code=200 if status == "ok" else 503)

    @app.get("/languages")
    async def list_languages() -> JSONResponse:
        """LibreTranslate's language list (nmt.serve_libre)."""
        return JSONResponse(languages_list(languages or {}))

    @app.post("/translate", openapi_extra=TRANSLATE_BODY)
    async def translate(request: Request) -> JSONResponse:
        if not state["accepting"]:
            raise RequestError(503, "the server is shutting down")
        payload = parse_json(await read_body(request, settings.max_body_bytes, settings.body_timeout))
        libre = is_libre(payload)
        if libre:
            sentences, counts, single = parse_libre(payload, languages or {}, settings.max_sentences)
            beam_size, n_best = translator.decoding.beam_size, 1
        else:
            sentences, beam_size, n_best = parse_request(payload, settings, translator.decoding.beam_size)
        request.state.sentences = len(sentences)
        results: list[Translation] = []
        if sentences:
            loop = asyncio.get_running_loop()
            job = Job(sentences, beam_size, n_best, loop, loop.create_future())
            batcher.submit(job)
            try:
                results = await job.future
            except RequestError:              # refused after all (the server stopped): its own status
                raise
            except Exception as exc:
                return JSONResponse({"error": f"translation failed: {str(exc)[:200]}"}, status_code=500)
        if libre:
            return JSONResponse(libre_response([r.text for r in results], counts, single))
        return JSONResponse(format_response(results, n_best))

    return app


def run_server(model: str | Path, settings: ServeSettings, device: str = "auto", precision: str | None = None,
               threads: int = 0, quantize: str | None = None) -> int:
    """Load the model, listen on settings.host:port and serve until SIGTERM or Ctrl-C; returns the exit code.

    The listening address is logged as "nmt serve: listening on http://HOST:PORT" (the real port
    when `port` is 0). Raises ModelFileError/ConfigError for a model that cannot be loaded.
    """
    import torch

    from nmt.device import reuse_freed_memory

    settings.check()                            # before minutes of loading a model
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", stream=sys.stderr)
    if threads:
        torch.set_num_threads(threads)
    reuse_freed_memory()
    translator = Translator.load(model, device, precision=precision, quantize=quantize)
    app = create_app(translator, settings, translator.languages)
    family = socket.AF_INET6 if ":" in settings.host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((settings.host, settings.port))
    except OSError as exc:
        sock.close()
        raise OSError(f"cannot listen on {settings.host}:{settings.port} ({exc.strerror})") from None
    sock.listen(2048)                         # connections wait in the backlog until uvicorn accepts them
    host, port = sock.getsockname()[:2]
    # After the drain (see handle_exit), a little longer for the last batch's answers to go out.
    config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="on",
                            timeout_graceful_shutdown=math.ceil(settings.shutdown_timeout) + 5)
    server = uvicorn.Server(config)
    log.info("nmt serve: listening on http://%s:%d", f"[{host}]" if family == socket.AF_INET6 else host, port)
    received: list[int] = []
    original = server.handle_exit

    def handle_exit(sig: int, frame: Any) -> None:
        """The first signal: stop accepting, answer what can start within shutdown_timeout, 503 the rest.
        A second one: exit now, without waiting for open connections."""
        if received:
            server.force_exit = True
        else:
            app.state.batcher.drain(settings.shutdown_timeout)
        received.append(sig)
        original(sig, frame)

    server.handle_exit = handle_exit          # type: ignore[method-assign]
    previous = signal.getsignal(signal.SIGTERM)
    signal.signal(signal.SIGTERM, lambda *_: None)   # uvicorn re-raises the signal after its graceful shutdown
    try:
        server.run(sockets=[sock])
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGTERM, previous)
        sock.close()
    log.info("nmt serve: stopped")
    if signal.SIGINT in received:
        return 130
    return 143 if signal.SIGTERM in received else 0
