"""Reading and answering `nmt serve`'s requests: bounded bodies, JSON or forms, nmt's own shapes.

A body is JSON whatever its Content-Type says (`curl -d` labels JSON a form), except that LibreTranslate's
clients may send a form: multipart/form-data always is one, and form-urlencoded that is not JSON is read as one.
LibreTranslate also reads its fields from the query string (`POST /translate?q=...`): they join a form's
fields, or make the form when the body is empty.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl

from starlette import formparsers
from starlette.datastructures import Headers
from starlette.requests import ClientDisconnect, Request

from nmt.data.tokenizer import Vocab
from nmt.decode.outputs import Translation, attention_record, nbest_json
from nmt.fs.bounded import loads_json
from nmt.serve.batcher import RequestError
from nmt.serve.libre import KEYS as LIBRE_KEYS
from nmt.serve.libre import form_fields
from nmt.serve.settings import ServeSettings

MAX_FORM_FIELDS = 2 * len(LIBRE_KEYS)     # more is no LibreTranslate request: refused before it is all read


@dataclass
class Options:
    beam_size: int
    n_best: int
    attention: bool = False


async def read_body(request: Request, limit: int, timeout: float) -> bytes:
    """The body, refused (413) as soon as it is known to exceed `limit` bytes, not waited for beyond `timeout`."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise RequestError(413, f"request body of {declared} bytes; the limit is {limit}")
    body = bytearray()
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    stream = request.stream()
    while True:
        try:
            chunk = await asyncio.wait_for(anext(stream), max(0.0, deadline - loop.time()))
        except StopAsyncIteration:
            return bytes(body)
        except TimeoutError:
            raise RequestError(408, f"the request body did not arrive within {timeout:g} s") from None
        except ClientDisconnect:
            raise RequestError(400, "the client disconnected before the end of the request body") from None
        body += chunk
        if len(body) > limit:
            raise RequestError(413, f"request body over {limit} bytes")


async def parse_body(headers: Headers, body: bytes, query: list[tuple[str, str]] | None = None) -> tuple[Any, bool]:
    """(JSON's value, False), or (a LibreTranslate form, with the `query` string's fields, as the object it stands
    for, True); RequestError(400, 415)."""
    query = query or []
    if len(query) > MAX_FORM_FIELDS:
        raise RequestError(400, f"Invalid request: more than {MAX_FORM_FIELDS} query-string fields")
    media_type = headers.get("content-type", "").split(";")[0].strip().lower()
    if media_type == "multipart/form-data":
        return form_fields(query + await parse_multipart(headers, body)), True
    if query and not body.strip():
        return form_fields(query), True
    try:
        payload = loads_json(body)
    except (ValueError, RecursionError) as exc:   # JSONDecodeError and UnicodeDecodeError are ValueErrors
        reason = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
        if media_type != "application/x-www-form-urlencoded":
            raise RequestError(400, f"the request body is not valid JSON ({reason})") from None
    else:
        if query:
            raise RequestError(400, f"Invalid request: query-string field {query[0][0][:40]!r} with a JSON body; "
                                    "send every field in the JSON body, or all as a form")
        return payload, False
    try:                                          # UTF-8, as browsers send forms
        fields = parse_qsl(body.decode("utf-8"), keep_blank_values=True, encoding="utf-8", errors="strict",
                           max_num_fields=MAX_FORM_FIELDS)
    except UnicodeDecodeError:
        raise RequestError(400, "Invalid request: the form is not valid UTF-8") from None
    except ValueError:                            # max_num_fields
        raise RequestError(400, f"Invalid request: more than {MAX_FORM_FIELDS} form fields") from None
    if not any(key in LIBRE_KEYS for key, _ in query + fields):
        raise RequestError(400, "the request body is neither valid JSON nor a LibreTranslate form (q, source, "
                                "target)")
    return form_fields(query + fields), True


async def parse_multipart(headers: Headers, body: bytes) -> list[tuple[str, Any]]:
    """A multipart/form-data body's fields, by python-multipart through Starlette's parser; RequestError(400, 415)."""
    if formparsers.multipart is None:
        raise RequestError(415, "this server cannot read multipart/form-data: python-multipart is not installed "
                                "(pip install 'nmt[serve]'); send JSON or a form-urlencoded body")

    async def chunks() -> Any:
        yield body

    parser = formparsers.MultiPartParser(headers, chunks(), max_files=MAX_FORM_FIELDS, max_fields=MAX_FORM_FIELDS,
                                         max_part_size=max(len(body), 1))
    try:
        form = await parser.parse()
    except formparsers.MultiPartException as exc:
        raise RequestError(400, f"Invalid request: the multipart body cannot be read ({exc.message[:200]})") from None
    fields = list(form.multi_items())
    await form.close()                                # files: closed now; nmt.serve.libre refuses them
    return fields


def parse_request(payload: Any, settings: ServeSettings, default_beam: int,
                  sampling: bool = False) -> tuple[list[str], Options]:
    """A /translate body of nmt's own shape -> (sentences, options); raises RequestError(400 or 413). `sampling`:
    the model samples, so a beam_size of its own would be ignored."""
    options: dict[str, Any] = {}
    if isinstance(payload, dict):
        unknown = sorted(set(payload) - {"sentences", "beam_size", "n_best", "attention"})
        if unknown:
            raise RequestError(400, f"unknown key {unknown[0]!r}; expected sentences, beam_size, n_best, attention")
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
    if sampling and beam_size != default_beam:
        raise RequestError(400, "beam_size does not apply: this server's model samples (decoding.sampling); "
                                "leave it out")
    n_best = _int_option(options, "n_best", 1, 1, beam_size)
    attention = options.get("attention", False)
    if not isinstance(attention, bool):
        raise RequestError(400, f"attention must be true or false, got {_shown(attention)}")
    return payload, Options(beam_size, n_best, attention)


def _int_option(options: dict[str, Any], key: str, default: int, low: int, high: int) -> int:
    value = options.get(key, default)
    if value is None:
        return default
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        limit = f"{low}..{high}" + (" (at most beam_size)" if key == "n_best" else "")
        raise RequestError(400, f"{key} must be an integer in {limit}, got {_shown(value)}")
    return value


def _shown(value: Any) -> str:
    shown = json.dumps(value)
    return shown if len(shown) <= 40 else shown[:40] + "..."      # not a large body echoed back


def format_response(results: list[Translation], n_best: int, vocabs: tuple[Vocab, Vocab] | None = None
                    ) -> dict[str, Any]:
    """{"translations": [...]}, "n_best" lists when n_best > 1 (as `nmt translate --n-best`), "attention" records
    when `vocabs` (source, target) are given, "truncated": the sentences cut to the model's input length."""
    response: dict[str, Any] = {"translations": [r.text for r in results]}
    if n_best > 1:
        response["n_best"] = [nbest_json(r) for r in results]
    if vocabs is not None:
        response["attention"] = [attention_json(i, r, *vocabs) for i, r in enumerate(results)]
    truncated = [i for i, r in enumerate(results) if r.truncated]
    if truncated:
        response["truncated"] = truncated
    return response


def attention_json(number: int, result: Translation, src_vocab: Vocab, tgt_vocab: Vocab) -> dict[str, Any]:
    """The best hypothesis's attention as `nmt translate --attention-out` writes it."""
    hyp = result.hypotheses[0] if result.hypotheses else None
    src_pieces = src_vocab.to_pieces(result.src_ids.tolist())
    tgt_pieces = tgt_vocab.to_pieces(hyp.tokens) if hyp else []
    return json.loads(attention_record(number, src_pieces, tgt_pieces, hyp))
