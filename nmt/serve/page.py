"""The page of `nmt serve`: GET / (static/index.html, page.js, page.css) translates in a browser, line by line,
and draws the chosen line's attention; GET /card is {"card": as `nmt info --json`, "server": the search limits}.
Nothing is fetched from elsewhere (a Content-Security-Policy of 'self' says so), so that it works offline.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Any

from fastapi import FastAPI
from fastapi.responses import JSONResponse, Response

from nmt.serve.settings import ServeSettings

STATIC = {"/": ("index.html", "text/html; charset=utf-8"), "/page.js": ("page.js", "text/javascript; charset=utf-8"),
          "/page.css": ("page.css", "text/css; charset=utf-8")}
HEADERS = {"Content-Security-Policy": "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'",
           "X-Content-Type-Options": "nosniff", "Cache-Control": "no-cache"}


def model_card(model: str | Path) -> dict[str, Any]:
    """The card of `nmt info`, with the file's name and size instead of its path on the server."""
    from nmt.modelfile.onnx_folder import is_onnx_folder
    from nmt.runtime.folder import read_manifest

    if is_onnx_folder(model):                  # exported with its card; no torch
        card = dict(read_manifest(model).card)
        card["file"] = str(model)
    else:
        from nmt.modelfile.card import describe
        from nmt.modelfile.file import load_model

        card = describe(load_model(model))
    path = Path(card.pop("file"))
    files = [path] if path.is_file() else [f for f in path.rglob("*") if f.is_file()]
    card["name"] = path.name
    card["size_bytes"] = sum(f.stat().st_size for f in files)
    return card


def add_page(app: FastAPI, card: dict[str, Any], beam_size: int, settings: ServeSettings) -> None:
    """The page's routes on `app`; `beam_size` is what a request without one gets."""
    pages = {route: (resources.files("nmt.serve").joinpath("static").joinpath(name).read_bytes(), media_type)
             for route, (name, media_type) in STATIC.items()}        # read once: a missing file fails at start
    server = {"beam_size": beam_size, "max_beam": settings.max_beam, "max_sentences": settings.max_sentences,
              "max_body_bytes": settings.max_body_bytes}

    def static(content: bytes, media_type: str) -> Any:     # by route, not by URL: the app may be mounted
        async def serve_file() -> Response:
            return Response(content, media_type=media_type, headers=HEADERS)
        return serve_file

    for route, (content, media_type) in pages.items():
        app.add_api_route(route, static(content, media_type), methods=["GET"], include_in_schema=False)

    @app.get("/card")
    async def model_card_route() -> JSONResponse:
        return JSONResponse({"card": card, "server": server})
