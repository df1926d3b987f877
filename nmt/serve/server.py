"""HTTP server over a translator (the `serve` extra: FastAPI on uvicorn): POST /translate (nmt's shapes and
LibreTranslate's, nmt.serve.libre), GET /languages, /health, the page and /card (nmt.serve.page), /openapi.json.
The README's "Serve over HTTP" describes the requests, the limits and the answers to each; batching is
nmt.serve.batcher's.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
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
from nmt.fs.text import printable
from nmt.serve.batcher import Batcher, Job, RequestError
from nmt.serve.libre import TRANSLATE_BODY, languages_list, libre_response, parse_libre
from nmt.serve.page import add_page, model_card
from nmt.serve.requests import Options, format_response, parse_body, parse_request, read_body
from nmt.serve.settings import ServeSettings

if TYPE_CHECKING:                    # or nmt.runtime's: an ONNX folder is served without torch
    from nmt.decode.translator import Translator

__all__ = ["Batcher", "Job", "RequestError", "ServeSettings", "create_app", "format_response", "run_server"]

log = logging.getLogger("nmt.serve")


def create_app(translator: Translator, settings: ServeSettings, *, card: dict[str, Any] | None = None) -> FastAPI:
    """The ASGI app; its model thread starts and stops with the app's lifespan. `card`: what the page shows
    (nmt.serve.page.model_card). A `max_beam` below the model's beam size is a ConfigError: every request
    without beam_size would be refused."""
    settings.check()
    beam_size, languages = translator.decoding.beam_size, translator.languages
    sampling = translator.sampling
    if beam_size > settings.max_beam:
        raise ConfigError(f"--max-beam {settings.max_beam} is below the model's beam size {beam_size} "
                          f"(decoding.beam_size), which requests without beam_size use; raise --max-beam to at "
                          f"least {beam_size}")
    batcher = Batcher(translator, settings)
    state = {"accepting": False}

    @contextlib.asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        batcher.start()
        state["accepting"] = True
        yield
        state["accepting"] = False
        await asyncio.to_thread(batcher.stop)          # answer what is queued

    # No redirect from "/card/" to "/card": Starlette builds it from the client's Host header (an open redirect).
    app = FastAPI(title="nmt", lifespan=lifespan, docs_url=None, redoc_url=None, redirect_slashes=False)
    app.state.batcher = batcher

    @app.middleware("http")
    async def log_requests(request: Request, call_next: Any) -> Any:
        start = time.perf_counter()
        request.state.sentences = 0
        response = await call_next(request)
        path = printable(request.url.path[:200])          # a client's path: one printable line, bounded
        log.info("%s %s %d %d sentences %.1f ms", request.method, path, response.status_code,
                 request.state.sentences, (time.perf_counter() - start) * 1000)
        return response

    add_error_handlers(app, settings.retry_after)

    @app.get("/health")
    async def health() -> JSONResponse:
        status = "failed" if batcher.failure is not None else "ok" if state["accepting"] else "shutting down"
        return JSONResponse({"status": status, "languages": languages, "queued": batcher.waiting},
                            status_code=200 if status == "ok" else 503)

    @app.get("/languages")
    async def list_languages() -> JSONResponse:
        return JSONResponse(languages_list(languages))

    @app.post("/translate", openapi_extra=TRANSLATE_BODY)
    async def translate(request: Request) -> JSONResponse:
        if not state["accepting"]:
            raise RequestError(503, "the server is shutting down")
        body = await read_body(request, settings.max_body_bytes, settings.body_timeout)
        payload, form = await parse_body(request.headers, body, request.query_params.multi_items())
        libre = form or (isinstance(payload, dict) and "q" in payload)     # LibreTranslate's request
        if libre:
            sentences, counts, single = parse_libre(payload, languages, settings.max_sentences)
            options = Options(beam_size, 1)
        else:
            sentences, options = parse_request(payload, settings, beam_size, sampling)
        request.state.sentences = len(sentences)
        results: list[Translation] = []
        if sentences:
            loop = asyncio.get_running_loop()
            job = Job(sentences, options.beam_size, options.n_best, loop, loop.create_future(), options.attention)
            batcher.submit(job)
            try:
                results = await job.future
            except RequestError:              # refused after all (the server stopped): its own status
                raise
            except Exception as exc:
                return JSONResponse({"error": f"translation failed: {str(exc)[:200]}"}, status_code=500)
        if libre:
            return JSONResponse(libre_response([r.text for r in results], [r.truncated for r in results], counts,
                                               single))
        vocabs = (translator.src_vocab, translator.tgt_vocab) if options.attention else None
        return JSONResponse(format_response(results, options.n_best, vocabs))

    add_page(app, card or {"languages": languages}, beam_size, settings)
    return app


def add_error_handlers(app: FastAPI, retry_after: int) -> None:
    """Every refusal in the server's one error shape, {"error": message} (LibreTranslate's too)."""

    @app.exception_handler(StarletteHTTPException)      # 404, 405 and the like
    async def unrouted(_request: Request, exc: StarletteHTTPException) -> JSONResponse:
        return JSONResponse({"error": str(exc.detail)}, status_code=exc.status_code, headers=exc.headers)

    @app.exception_handler(RequestError)
    async def refuse(_request: Request, exc: RequestError) -> JSONResponse:
        headers = {"Retry-After": str(retry_after)} if exc.status == 503 else None
        return JSONResponse({"error": str(exc)}, status_code=exc.status, headers=headers)


def run_server(model: str | Path, settings: ServeSettings, device: str = "auto", precision: str | None = None,
               threads: int = 0, quantize: str | None = None) -> int:
    """Serve until SIGTERM or Ctrl-C; returns the exit code. The address is logged as "nmt serve: listening on
    http://HOST:PORT", with the real port for `port` 0."""
    from nmt.api import load_translator

    settings.check()                            # before minutes of loading a model
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", stream=sys.stderr)
    translator = load_translator(model, device, threads=threads, precision=precision, quantize=quantize)
    app = create_app(translator, settings, card=model_card(model))
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
        A second one: exit now. (uvicorn's force_exit does not: from Python 3.12.1 asyncio's Server.wait_closed,
        which it awaits, waits for every open connection, one stalled in its body included.)"""
        received.append(sig)
        if len(received) > 1:
            log.info("nmt serve: stopped at a second signal, without waiting for open connections")
            sys.stderr.flush()
            os._exit(130 if signal.SIGINT in received else 143)
        app.state.batcher.drain(settings.shutdown_timeout)
        original(sig, frame)

    server.handle_exit = handle_exit          # type: ignore[method-assign]
    previous = signal.getsignal(signal.SIGTERM)
    signal.signal(signal.SIGTERM, lambda *_: None)   # uvicorn re-raises the signal after its graceful shutdown
    try:
        with contextlib.suppress(KeyboardInterrupt):
            server.run(sockets=[sock])
    finally:
        signal.signal(signal.SIGTERM, previous)
        sock.close()
    log.info("nmt serve: stopped")
    return 130 if signal.SIGINT in received else 143 if signal.SIGTERM in received else 0
