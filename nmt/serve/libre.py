"""LibreTranslate's API on `nmt serve`, so that its clients work unchanged: POST /translate with "q" (JSON or a
form; each line of a text is a sentence, the translations joined with "\n" again) and GET /languages. Its error
shape {"error": ...} is the server's too; `api_key` is accepted and not needed, `alternatives` above 0 refused.
"""

from __future__ import annotations

from typing import Any

from nmt.serve.batcher import RequestError

LANGUAGE_NAMES = {"ar": "Arabic", "cs": "Czech", "de": "German", "en": "English", "es": "Spanish", "fr": "French",
                  "it": "Italian", "ja": "Japanese", "nl": "Dutch", "pl": "Polish", "pt": "Portuguese",
                  "ro": "Romanian", "ru": "Russian", "tr": "Turkish", "uk": "Ukrainian", "zh": "Chinese"}
KEYS = {"q", "source", "target", "format", "api_key", "apiKey", "alternatives"}


def languages_list(languages: dict[str, str]) -> list[dict[str, Any]]:
    """The model's source language with its one target, and the target language."""
    src, tgt = languages.get("src"), languages.get("tgt")
    listed = [(code, [tgt] if code == src and tgt else []) for code in (src, tgt) if code]
    return [{"code": code, "name": LANGUAGE_NAMES.get(code, code), "targets": targets} for code, targets in listed]


def form_fields(fields: list[tuple[str, Any]]) -> dict[str, Any]:
    """A form's fields as the JSON object they stand for (text only, each once); raises RequestError(400)."""
    payload: dict[str, Any] = {}
    for key, value in fields:
        shown = key[:40]
        if key in payload:
            raise RequestError(400, f"Invalid request: {shown!r} given more than once; send a JSON body with q a "
                                    "list for several texts")
        if not isinstance(value, str):
            raise RequestError(400, f"Invalid request: {shown!r} is a file; send it as a form field")
        payload[key] = value.replace("\r\n", "\n") if key == "q" else value     # a form's line break is CRLF
    return payload


def _language(payload: dict[str, Any], key: str, expected: str | None, auto: bool) -> None:
    if key not in payload:
        raise RequestError(400, f"Invalid request: missing {key} parameter")
    value = payload[key]
    if not isinstance(value, str):
        raise RequestError(400, f"Invalid request: {key} must be a language code (a string)")
    if expected is not None and value != expected and not (auto and value == "auto"):
        shown = value if len(value) <= 20 else value[:20] + "..."
        raise RequestError(400, f"{shown} is not supported; this model translates {key} language {expected}")


def parse_libre(payload: dict[str, Any], languages: dict[str, str], max_sentences: int
                ) -> tuple[list[str], list[int], bool]:
    """-> (the lines to translate, how many lines each text of q has, whether q was one string); raises
    RequestError(400 or 413)."""
    unknown = sorted(set(payload) - KEYS)
    if unknown:
        raise RequestError(400, f"Invalid request: unknown parameter {unknown[0][:40]!r}")
    if "q" not in payload:                              # a form without it (a JSON body without it is nmt's own)
        raise RequestError(400, "Invalid request: missing q parameter")
    q = payload["q"]
    single = isinstance(q, str)
    texts = [q] if single else q
    if not isinstance(texts, list) or not all(isinstance(text, str) for text in texts):
        raise RequestError(400, "Invalid request: q must be a string or a list of strings")
    _language(payload, "source", languages.get("src"), auto=True)
    _language(payload, "target", languages.get("tgt"), auto=False)
    text_format = payload.get("format", "text")
    if text_format != "text":
        shown = text_format if isinstance(text_format, str) and len(text_format) <= 20 else "that"
        raise RequestError(400, f"format {shown} is not supported; this server translates plain text "
                                "(format: text)")
    alternatives = payload.get("alternatives", 0)
    if isinstance(alternatives, str):                   # a form's fields are text (LibreTranslate: int(value))
        try:
            alternatives = int(alternatives)
        except ValueError:
            raise RequestError(400, "Invalid request: alternatives parameter is not a number") from None
    if alternatives not in (0, None) or isinstance(alternatives, bool):
        raise RequestError(400, "alternatives are not supported here; use nmt's own request "
                                "{\"sentences\": [...], \"n_best\": k}")
    lines: list[str] = []
    counts: list[int] = []
    for i, text in enumerate(texts):
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            raise RequestError(400, f"q[{i}] is not valid Unicode (a lone surrogate)") from None
        parts = text.split("\n")
        lines.extend(parts)
        counts.append(len(parts))
        if len(lines) > max_sentences:
            raise RequestError(413, f"more than {max_sentences} lines in one request; the limit is {max_sentences}")
    return lines, counts, single


def libre_response(translations: list[str], cut: list[bool], counts: list[int], single: bool) -> dict[str, Any]:
    """{"translatedText": ...}, and "truncated" in the same shape when a line (`cut`: a flag per line) was cut."""
    texts, truncated, start = [], [], 0
    for count in counts:
        texts.append("\n".join(translations[start:start + count]))
        truncated.append(any(cut[start:start + count]))
        start += count
    response: dict[str, Any] = {"translatedText": texts[0] if single else texts}
    if any(truncated):
        response["truncated"] = truncated[0] if single else truncated
    return response


_STRINGS = {"type": "array", "items": {"type": "string"}}
_LIBRE_FIELDS = {"source": {"type": "string"}, "target": {"type": "string"},
                 "format": {"type": "string", "enum": ["text", "html"]}, "api_key": {"type": "string"},
                 "alternatives": {"type": "integer"}}
_LIBRE_FORM = {"schema": {"type": "object", "required": ["q", "source", "target"], "additionalProperties": False,
                          "properties": {"q": {"type": "string"}, **_LIBRE_FIELDS}}}
TRANSLATE_BODY = {  # /translate's request body in the OpenAPI schema (GET /openapi.json): nmt's shapes and this one
    "requestBody": {"required": True, "content": {
        "application/json": {"schema": {"oneOf": [
            _STRINGS,
            {"type": "object", "required": ["sentences"], "additionalProperties": False, "properties": {
                "sentences": _STRINGS, "beam_size": {"type": "integer"}, "n_best": {"type": "integer"},
                "attention": {"type": "boolean"}}},
            {"type": "object", "required": ["q", "source", "target"], "additionalProperties": False, "properties": {
                "q": {"oneOf": [{"type": "string"}, _STRINGS]}, **_LIBRE_FIELDS}},
        ]}},
        "application/x-www-form-urlencoded": _LIBRE_FORM,
        "multipart/form-data": _LIBRE_FORM,
    }},
}
