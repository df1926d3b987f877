"""HTTP server over the translator (the `serve` extra: FastAPI on uvicorn).

    nmt serve --model model.nmt --port 8000

    POST /translate   ["Ein Hund läuft.", ...]                       -> {"translations": [...]}
                      {"sentences": [...], "beam_size": 5, "n_best": 3} -> {"translations": [...],
                                                                          "n_best": [[{"text", "score"}, ...], ...]}
                      {"sentences": [...], "attention": true}        -> {"translations": [...],
                                                                          "attention": [{"src", "tgt", ...}, ...]}
                      {"q": ..., "source": "de", "target": "en"}     -> {"translatedText": ...} (LibreTranslate,
                                                                        also as a form; nmt.serve.libre)
    GET  /languages   [{"code", "name", "targets"}, ...]              (LibreTranslate; nmt.serve.libre)
    GET  /health      {"status": "ok", "languages": {...}, "queued": N}
    GET  /            a page to translate in a browser (nmt.serve.page), GET /card its model card
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
import logging
import math
import signal
import socket
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from nmt.config import ConfigError
from nmt.decode.outputs import Translation
from nmt.serve.batcher import Batcher, Job, RequestError
from nmt.serve.libre import TRANSLATE_BODY, form_fields, is_libre, languages_list, libre_response, parse_libre
from nmt.serve.page import add_page, model_card
from nmt.serve.requests import Options, format_response, parse_body, parse_request, read_body
from nmt.serve.settings import ServeSettings

if TYPE_CHECKING:                    # or nmt.runtime's: an ONNX folder is served without torch
    from nmt.decode.translator import Translator

__all__ = ["Batcher", "Job", "RequestError", "ServeSettings", "create_app", "format_response", "run_server"]

log = logging.getLogger("nmt.serve")


# ---------------------------------------------------------------------------------------------
# The application


def create_app(translator: Translator, settings: ServeSettings, languages: dict[str, str] | None = None,
               card: dict[str, Any] | None = None) -> FastAPI:
    """The ASGI app; its model thread starts and stops with the app's lifespan. `card`: the model card the
    page shows (nmt.serve.page.model_card). Raises ConfigError for a `max_beam` below the model's beam
    size, which every request without beam_size would be refused."""
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

    add_error_handlers(app, settings.retry_after)

    @app.get("/health")
    async def health() -> JSONResponse:
        status = ("failed" if batcher.failure is not None else
                  "ok" if state["accepting"] else "shutting down")
        return JSONResponse({"status": status, "languages": languages or {}, "queued": batcher.waiting},
                            status_code=200 if status == "ok" else 503)

    @app.get("/languages")
    async def list_languages() -> JSONResponse:
        """LibreTranslate's language list (nmt.serve.libre)."""
        return JSONResponse(languages_list(languages or {}))

    @app.post("/translate", openapi_extra=TRANSLATE_BODY)
    async def translate(request: Request) -> JSONResponse:
        if not state["accepting"]:
            raise RequestError(503, "the server is shutting down")
        body = await parse_body(request.headers, await read_body(request, settings.max_body_bytes,
                                                                 settings.body_timeout))
        payload = form_fields(body.payload) if body.form else body.payload
        libre = body.form or is_libre(payload)
        if libre:
            sentences, counts, single = parse_libre(payload, languages or {}, settings.max_sentences)
            options = Options(translator.decoding.beam_size, 1)
        else:
            sentences, options = parse_request(payload, settings, translator.decoding.beam_size)
        request.state.sentences = len(sentences)
        try:
            results = await translated(batcher, sentences, options)
        except RequestError:                  # refused after all (the server stopped): its own status
            raise
        except Exception as exc:
            return JSONResponse({"error": f"translation failed: {str(exc)[:200]}"}, status_code=500)
        if libre:
            return JSONResponse(libre_response([r.text for r in results], [r.truncated for r in results], counts,
                                               single))
        vocabs = (translator.src_vocab, translator.tgt_vocab) if options.attention else None
        return JSONResponse(format_response(results, options.n_best, vocabs))

    add_page(app, card or {"languages": languages or {}}, translator.decoding.beam_size, settings)
    return app


def add_error_handlers(app: FastAPI, retry_after: int) -> None:
    """Every refusal in the server's one error shape, {"error": message} (LibreTranslate's too)."""

    @app.exception_handler(StarletteHTTPException)
    async def unrouted(_request: Request, exc: StarletteHTTPException) -> JSONResponse:
        """404, 405 and the like."""
        return JSONResponse({"error": str(exc.detail)}, status_code=exc.status_code, headers=exc.headers)

    @app.exception_handler(RequestError)
    async def refuse(_request: Request, exc: RequestError) -> JSONResponse:
        headers = {"Retry-After": str(retry_after)} if exc.status == 503 else None
        return JSONResponse({"error": str(exc)}, status_code=exc.status, headers=headers)


async def translated(batcher: Batcher, sentences: list[str], options: Options) -> list[Translation]:
    """The sentences' translations from the model thread (none to make for no sentences)."""
    if not sentences:
        return []
    loop = asyncio.get_running_loop()
    job = Job(sentences, options.beam_size, options.n_best, loop, loop.create_future(), options.attention)
    batcher.submit(job)
    return await job.future


def run_server(model: str | Path, settings: ServeSettings, device: str = "auto", precision: str | None = None,
               threads: int = 0, quantize: str | None = None) -> int:
    """Load the model, listen on settings.host:port and serve until SIGTERM or Ctrl-C; returns the exit code.

    The listening address is logged as "nmt serve: listening on http://HOST:PORT" (the real port
    when `port` is 0). Raises ModelFileError/ConfigError for a model that cannot be loaded.
    """
    from nmt.api import load_translator

    settings.check()                            # before minutes of loading a model
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", stream=sys.stderr)
    translator = load_translator(model, device, threads=threads, precision=precision, quantize=quantize)
    app = create_app(translator, settings, translator.languages, model_card(model))
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
