"""`nmt serve` over loopback: results equal offline translation, limits, malformed requests, 503, SIGTERM."""

from __future__ import annotations

import asyncio
import http.client
import json
import queue
import random
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import weakref
from pathlib import Path
from types import SimpleNamespace
from urllib.parse import quote, urlencode

import pytest

pytest.importorskip("fastapi", reason="the serve extra is not installed (pip install -e '.[serve]')")
pytest.importorskip("uvicorn", reason="the serve extra is not installed (pip install -e '.[serve]')")
pytest.importorskip("python_multipart", reason="the serve extra is not installed (pip install -e '.[serve]')")

from nmt.decode.translator import Translator
from nmt.serve.server import Batcher, Job, RequestError, ServeSettings, format_response

from .conftest import MULTI30K, nmt_server, read_gz
from .serve_process import REPO, Server


@pytest.fixture(scope="module")
def offline(model_file: Path) -> Translator:
    return Translator.load(model_file, device="cpu", precision="fp32")


@pytest.fixture(scope="module")
def server(model_file: Path):
    server = Server(model_file, "--max-sentences", "20", "--max-body-kb", "4", "--max-beam", "8", "--body-timeout", "2")
    yield server
    server.stop()


@pytest.fixture(scope="module")
def sources() -> list[str]:
    return read_gz("test_2016_flickr.de", 60)


def test_translations_equal_offline_translation(server, offline, sources):
    status, _, body = server.translate(sources[:12])
    assert status == 200
    assert body == {"translations": [t.text for t in offline.translate(sources[:12])]}
    status, _, body = server.translate({"sentences": ["", sources[0]], "beam_size": 1})
    assert status == 200 and body["translations"] == [t.text for t in offline.translate(["", sources[0]],
                                                                                          beam_size=1)]


def test_n_best_with_scores(server, offline, sources):
    status, _, body = server.translate({"sentences": sources[:3], "beam_size": 4, "n_best": 3})
    assert status == 200
    expected = offline.translate(sources[:3], beam_size=4, n_best=3)
    assert body["translations"] == [t.text for t in expected]
    for lists, result in zip(body["n_best"], expected, strict=True):
        assert [entry["text"] for entry in lists] == [text for text, _ in result.nbest]
        scores = [entry["score"] for entry in lists]
        assert scores == sorted(scores, reverse=True)


def test_an_empty_sentence_gets_n_best_empty_entries_like_the_command_line(server):
    status, _, body = server.translate({"sentences": ["Ein Hund.", ""], "beam_size": 3, "n_best": 3})
    assert status == 200 and body["translations"][1] == ""
    assert len(body["n_best"][0]) == 3
    assert body["n_best"][1] == [{"text": "", "score": 0.0}] * 3


def test_concurrent_clients_each_get_their_own_results(server, offline, sources):
    expected = dict(zip(sources, (t.text for t in offline.translate(sources)), strict=True))
    rng = random.Random(1)
    requests = [rng.sample(sources, rng.randint(1, 10)) for _ in range(48)]
    answers: dict[int, tuple[int, dict]] = {}

    def client(indices: list[int]) -> None:
        for i in indices:
            status, _, body = server.translate(requests[i])
            answers[i] = (status, body)

    threads = [threading.Thread(target=client, args=(list(range(k, 48, 12)),)) for k in range(12)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(answers) == 48
    for i, request in enumerate(requests):
        assert answers[i] == (200, {"translations": [expected[s] for s in request]}), i


@pytest.mark.parametrize(("body", "status", "message"), [
    (b'["Ein Hund"', 400, "not valid JSON"),
    (b"", 400, "not valid JSON"),
    (b"\xff\xfe[]", 400, "not valid JSON"),
    (b'{"sentences": "Ein Hund"}', 400, "expected a JSON list"),
    (b'"Ein Hund"', 400, "expected a JSON list"),
    (b"42", 400, "expected a JSON list"),
    (b"null", 400, "expected a JSON list"),
    (b'["Ein Hund", 3]', 400, "sentences[1] is int"),
    (b'[["Ein Hund"]]', 400, "sentences[0] is list"),
    (b'[null]', 400, "sentences[0] is NoneType"),
    (b'["\\ud800"]', 400, "not valid Unicode"),
    (b'["Ein Hund", "Ein\\nHund"]', 400, "sentences[1] contains a line break"),
    (b'{"sentence": ["Ein Hund"]}', 400, "unknown key 'sentence'"),
    (b'{"beam_size": 2}', 400, "missing key 'sentences'"),
    (b'{"sentences": ["a"], "beam_size": 0}', 400, "beam_size must be an integer in 1..8"),
    (b'{"sentences": ["a"], "beam_size": 9}', 400, "beam_size must be an integer in 1..8"),
    (b'{"sentences": ["a"], "beam_size": "5"}', 400, "beam_size must be an integer"),
    (b'{"sentences": ["a"], "beam_size": true}', 400, "beam_size must be an integer"),
    (b'{"sentences": ["a"], "beam_size": 2.5}', 400, "beam_size must be an integer"),
    (b'{"sentences": ["a"], "beam_size": 2, "n_best": 3}', 400, "n_best must be an integer in 1..2"),
    (json.dumps({"sentences": ["a"], "beam_size": [1] * 1000}).encode(), 400, "got [1, 1, 1"),
    (b"[" * 100000 + b"]" * 100000, 413, "request body"),
    (json.dumps(["ein Hund"] * 21).encode(), 413, "21 sentences in one request; the limit is 20"),
    (json.dumps(["x" * 5000]).encode(), 413, "request body of"),
])
def test_bad_requests_get_a_status_and_a_message(server, body, status, message):
    got, _, payload = server.request("POST", "/translate", body, {"Content-Type": "application/json"})
    assert got == status and message in payload["error"], payload
    assert list(payload) == ["error"] and len(payload["error"]) < 300     # one short message, never the body


def test_deeply_nested_json_is_a_400_not_a_crash(server):
    got, _, payload = server.request("POST", "/translate", b"[" * 1500 + b"]" * 1500)
    assert got == 400 and "error" in payload
    assert server.translate(["Ein Hund."])[0] == 200            # still serving


def test_body_without_content_length_is_limited_too(server):
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
    conn.putrequest("POST", "/translate")
    conn.putheader("Transfer-Encoding", "chunked")
    conn.endheaders()
    chunk = json.dumps(["ein Hund"] * 400).encode()                # 4.8 KB > the 4 KB limit
    conn.send(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n0\r\n\r\n")
    response = conn.getresponse()
    assert response.status == 413 and "request body over" in json.loads(response.read())["error"]
    conn.close()


def test_carriage_returns_and_unicode_separators_are_content_as_in_nmt_translate(server, offline):
    sentences = ["Ein Hund\rläuft.", "Ein Hund\u2028läuft.", "Ein Hund\x85läuft."]
    status, _, body = server.translate(sentences)
    assert status == 200 and body["translations"] == [t.text for t in offline.translate(sentences)]


def read_reply(sock: socket.socket) -> str:
    """One HTTP response from a raw socket: its head and, by Content-Length, its whole body."""
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
        head, blank, body = data.partition(b"\r\n\r\n")
        length = re.search(rb"content-length: (\d+)", head, re.IGNORECASE)
        if blank and length and len(body) >= int(length.group(1)):
            break
    return data.decode()


def test_a_stalled_or_abandoned_body_is_answered_and_logged_without_a_traceback(server):
    before = len(server.log)
    head = b"POST /translate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n"
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as stalled:
        stalled.sendall(head + b'["Ein')
        start = time.monotonic()
        reply = read_reply(stalled)
        waited = time.monotonic() - start
    assert reply.startswith("HTTP/1.1 408") and "did not arrive within 2 s" in reply, reply
    assert 1.5 < waited < 20
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as gone:
        gone.sendall(head + b'["Ein')
    deadline = time.monotonic() + 30
    while not any("POST /translate 400" in line for line in server.log[before:]):
        assert time.monotonic() < deadline, server.log[before:]
        time.sleep(0.05)
    assert not any("Traceback" in line or "Exception" in line for line in server.log[before:]), server.log[before:]
    assert server.translate(["Ein Hund."])[0] == 200            # still serving


def test_sentences_cut_to_the_input_length_are_named_in_the_response(server, offline):
    limit = offline.decoding.max_input_len
    long = " ".join(["Hund"] * (limit + 10))
    assert len(long.encode()) < 4000 and offline.translate([long])[0].truncated    # under --max-body-kb 4
    status, _, body = server.translate(["Ein Hund.", long])
    assert status == 200 and body["truncated"] == [1] and len(body["translations"]) == 2
    assert "truncated" not in server.translate(["Ein Hund."])[2]


def test_empty_list_health_and_unknown_routes(server):
    status, _, body = server.translate([])
    assert status == 200 and body == {"translations": []}
    status, _, body = server.request("GET", "/health")
    assert status == 200 and body["status"] == "ok" and body["languages"] == {"src": "de", "tgt": "en"}
    status, _, body = server.request("GET", "/translate")
    assert status == 405 and body == {"error": "Method Not Allowed"}
    status, _, body = server.request("POST", "/nothing", b"[]")
    assert status == 404 and body == {"error": "Not Found"}
    for method, path in (("GET", "/card/"), ("POST", "/translate/")):     # no redirect built from the Host header
        status, headers, _ = server.raw(method, path, b"[]", {"Host": "attacker.test"})
        assert status == 404 and "location" not in headers, (method, path, headers)


def test_one_log_line_per_request_with_latency(server):
    health_lines = sum("GET /health" in line for line in server.log)
    assert server.request("GET", "/health")[0] == 200
    deadline = time.monotonic() + 60
    while sum("GET /health" in line for line in server.log) == health_lines:   # the reader has caught up
        assert time.monotonic() < deadline, server.log[-5:]
        time.sleep(0.05)
    before = len(server.log)
    server.translate(["Ein Hund.", "Eine Katze."])
    server.request("POST", "/translate", b"{")
    ours = re.compile(r"POST /translate (200 2|400 0) sentences [\d.]+ ms$")
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        lines = [line for line in server.log[before:] if ours.search(line)]
        if len(lines) >= 2:
            break
        time.sleep(0.05)
    time.sleep(0.2)                                    # a duplicate line would arrive by now
    lines = [line for line in server.log[before:] if ours.search(line)]
    assert len(lines) == 2, server.log[before:]
    assert "200 2 sentences" in lines[0] and "400 0 sentences" in lines[1], lines


def test_a_request_path_cannot_forge_or_flood_log_lines(server):
    """The path is logged decoded: its control characters are escaped and it is cut, so one request is one line
    that cannot drive a terminal (ESC) or split in a log viewer (VT, NEL, U+2028)."""
    before = len(server.log)
    forged = "/x" + quote("\x1b[2J\x0b\x85\u2028 GET /health 200") + "y" * 5000
    assert server.request("GET", forged)[0] == 404
    deadline = time.monotonic() + 60
    while not any("GET /x" in line for line in server.log[before:]):
        assert time.monotonic() < deadline, server.log[before:]
        time.sleep(0.05)
    time.sleep(0.2)
    ours = [line for line in server.log[before:] if "GET /x" in line]
    assert len(ours) == 1 and "/x\\x1b[2J\\x0b\\x85\\u2028 GET /health 200yyy" in ours[0], ours
    assert len(ours[0]) < 300 and ours[0].rstrip("\n").isprintable()


def test_full_queue_is_503_and_sigterm_finishes_in_flight_requests(model_file, offline, sources):
    server = Server(model_file, "--max-queue", "1", "--max-batch-sentences", "1", "--max-wait-ms", "0")
    try:
        heavy = {"sentences": sources[:60], "beam_size": 16}
        results: list[tuple[int, dict, dict]] = []
        threads = [threading.Thread(target=lambda: results.append(server.translate(heavy))) for _ in range(6)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        statuses = sorted(status for status, _, _ in results)
        assert 503 in statuses and 200 in statuses, statuses
        expected = [t.text for t in offline.translate(sources[:60], beam_size=16)]
        for status, headers, body in results:
            if status == 503:
                assert headers["retry-after"] == "1" and "busy" in body["error"]
            else:
                assert status == 200 and body["translations"] == expected

        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=300)
        conn.request("POST", "/translate", json.dumps(heavy).encode())   # sent, not yet answered
        assert server.request("GET", "/health")[0] == 200                # so the server has read it
        time.sleep(0.2)
        server.proc.send_signal(signal.SIGTERM)
        response = conn.getresponse()
        assert response.status == 200 and json.loads(response.read())["translations"] == expected
        conn.close()
        assert server.proc.wait(timeout=60) == 143
        with pytest.raises(OSError):
            server.request("GET", "/health")
    finally:
        server.stop()


def test_a_second_signal_exits_at_once_even_with_a_connection_open(model_file):
    server = Server(model_file, "--body-timeout", "600")
    try:
        with socket.create_connection(("127.0.0.1", server.port), timeout=30) as stalled:
            stalled.sendall(b"POST /translate HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n[")
            assert server.request("GET", "/health")[0] == 200              # so the server has read it
            server.proc.send_signal(signal.SIGTERM)
            time.sleep(1.0)
            assert server.proc.poll() is None        # the first waits for open connections (up to 15 s)
            start = time.monotonic()
            server.proc.send_signal(signal.SIGTERM)
            assert server.proc.wait(timeout=10) == 143 and time.monotonic() - start < 5
    finally:
        server.stop()


def test_bad_startup_options_are_one_error_line(model_file, offline):
    beam = offline.decoding.beam_size
    assert beam > 1
    for options, message in [
        (["--max-beam", str(beam - 1)], f"error: --max-beam {beam - 1} is below the model's beam size {beam} "),
        (["--max-wait-ms", "inf"], "error: Invalid value for '--max-wait-ms'"),    # a queue timeout overflows
    ]:
        result = nmt_server().run("serve", "--model", str(model_file), "--port", "0", "--device", "cpu",
                                  "--threads", "1", *options, text=True, timeout=120)
        assert result.returncode == 2 and result.stderr.startswith(message), result.stderr
        assert len(result.stderr.strip().splitlines()) == 1, result.stderr


def test_a_score_that_is_not_a_number_is_sent_as_null():
    result = SimpleNamespace(text="a", nbest=[("a", -1.23456), ("b", float("-inf")), ("c", float("nan"))],
                             truncated=False)
    response = format_response([result], n_best=3)
    assert json.loads(json.dumps(response, allow_nan=False))["n_best"] == [
        [{"text": "a", "score": -1.2346}, {"text": "b", "score": None}, {"text": "c", "score": None}]]


class ScriptedTranslator:
    """Stands in for a Translator in the model thread: "BOOM" raises an error, "EXIT" a SystemExit."""

    def __init__(self) -> None:
        self.calls: list[list[str]] = []

    def translate(self, sentences: list[str], n_best: int = 1, beam_size: int | None = None,
                  return_attention: bool = False) -> list[str]:
        self.calls.append(sentences)
        if "BOOM" in sentences:
            raise RuntimeError("boom")
        if "EXIT" in sentences:
            raise SystemExit("exit")
        return [s.upper() for s in sentences]


def run_jobs(translator: ScriptedTranslator, requests: list[list[str]], settings: ServeSettings | None = None,
             jobs_queue: queue.Queue | None = None) -> tuple[Batcher, list[object]]:
    """Queue `requests` before the model thread starts (so they are batched together), then await each.
    `jobs_queue` replaces the batcher's job queue."""
    async def main() -> tuple[Batcher, list[object]]:
        loop = asyncio.get_running_loop()
        batcher = Batcher(translator, settings or ServeSettings(max_wait=0.5))
        if jobs_queue is not None:
            batcher.jobs = jobs_queue
        jobs = [Job(sentences, 1, 1, loop, loop.create_future()) for sentences in requests]
        for job in jobs:
            batcher.submit(job)
        batcher.start()
        results = await asyncio.wait_for(asyncio.gather(*(job.future for job in jobs), return_exceptions=True), 60)
        await asyncio.to_thread(batcher.stop)
        return batcher, results
    return asyncio.run(main())


def test_a_failing_request_does_not_fail_the_requests_batched_with_it():
    translator = ScriptedTranslator()
    batcher, results = run_jobs(translator, [["a"], ["BOOM"], ["b", "c"]])
    assert translator.calls[0] == ["a", "BOOM", "b", "c"]              # they were one batch
    assert results[0] == ["A"] and results[2] == ["B", "C"]
    assert isinstance(results[1], RuntimeError) and str(results[1]) == "boom"
    assert batcher.failure is None


def test_a_stopped_model_thread_answers_every_request_and_refuses_new_ones():
    translator = ScriptedTranslator()
    batcher, results = run_jobs(translator, [["EXIT"], ["a"]])
    assert all(isinstance(r, RuntimeError) and "model thread stopped" in str(r) for r in results), results
    assert batcher.failure == "SystemExit: exit" and not batcher.thread.is_alive()
    loop = asyncio.new_event_loop()
    try:
        with pytest.raises(RequestError, match="model thread stopped") as refused:
            batcher.submit(Job(["b"], 1, 1, loop, loop.create_future()))
    finally:
        loop.close()
    assert refused.value.status == 503


def test_a_thread_ending_while_retrying_a_batch_answers_the_rest_of_it():
    translator = ScriptedTranslator()
    batcher, results = run_jobs(translator, [["BOOM"], ["EXIT"], ["c"]])
    assert translator.calls == [["BOOM", "EXIT", "c"], ["BOOM"], ["EXIT"]]     # one batch, then one by one
    assert str(results[0]) == "boom"
    assert all(isinstance(r, RuntimeError) and "model thread stopped" in str(r) for r in results[1:]), results
    assert batcher.failure == "SystemExit: exit"


def test_batches_keep_to_max_batch_sentences():
    requests = [[f"{i}{j}" for j in range(3)] for i in range(4)] + [[f"big{j}" for j in range(9)]]
    for limit, sizes in [(4, [3, 3, 3, 3, 9]), (6, [6, 6, 9])]:          # one larger request goes alone
        translator = ScriptedTranslator()
        _, results = run_jobs(translator, requests, ServeSettings(max_wait=0.5, max_batch_sentences=limit))
        assert results == [[s.upper() for s in sentences] for sentences in requests]
        assert [len(call) for call in translator.calls] == sizes


class GatedTranslator(ScriptedTranslator):
    """Blocks in `translate` until `gate` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = threading.Event()

    def translate(self, sentences: list[str], n_best: int = 1, beam_size: int | None = None,
                  return_attention: bool = False) -> list[str]:
        self.calls.append(sentences)
        self.gate.wait(20)
        return [s.upper() for s in sentences]


def test_requests_held_back_for_other_options_count_against_max_queue():
    async def main() -> None:
        loop = asyncio.get_running_loop()
        translator = GatedTranslator()
        batcher = Batcher(translator, ServeSettings(max_wait=1.0, max_queue=3))
        jobs = [Job(["a"], 1, 1, loop, loop.create_future())]
        batcher.submit(jobs[0])
        batcher.start()
        for text in "bc":                      # other options: taken off the queue while "a" collects, held
            jobs.append(Job([text], 2, 1, loop, loop.create_future()))
            batcher.submit(jobs[-1])
        while not translator.calls:
            await asyncio.sleep(0.01)
        assert translator.calls == [["a"]] and batcher.jobs.empty() and batcher.waiting == 2
        jobs.append(Job(["d"], 1, 1, loop, loop.create_future()))
        batcher.submit(jobs[-1])               # the third waiting job
        with pytest.raises(RequestError, match="busy") as refused:
            batcher.submit(Job(["e"], 1, 1, loop, loop.create_future()))
        assert refused.value.status == 503
        translator.gate.set()
        results = await asyncio.wait_for(asyncio.gather(*(job.future for job in jobs)), 20)
        assert results == [["A"], ["B"], ["C"], ["D"]]
        assert batcher.waiting == 0
        await asyncio.to_thread(batcher.stop)
    asyncio.run(main())


def test_a_draining_batcher_answers_jobs_that_did_not_start_in_time_with_503():
    async def main() -> list[object]:
        loop = asyncio.get_running_loop()
        translator = GatedTranslator()
        batcher = Batcher(translator, ServeSettings(max_wait=0.0))
        jobs = [Job(["a"], 1, 1, loop, loop.create_future())]
        batcher.submit(jobs[0])
        batcher.start()
        while not translator.calls:
            await asyncio.sleep(0.01)
        for text in "bc":
            jobs.append(Job([text], 1, 1, loop, loop.create_future()))
            batcher.submit(jobs[-1])
        batcher.drain(0.0)                     # SIGTERM: nothing more may start
        translator.gate.set()
        results = await asyncio.wait_for(asyncio.gather(*(job.future for job in jobs), return_exceptions=True), 20)
        await asyncio.to_thread(batcher.stop)
        assert translator.calls == [["a"]]
        return results
    results = asyncio.run(main())
    assert results[0] == ["A"]
    assert all(isinstance(r, RequestError) and r.status == 503 and "shutting down" in str(r) for r in results[1:])


class FailingQueue(queue.Queue):
    """A job queue whose `fail_at`-th get raises MemoryError (once), as a failure inside batching would."""

    def __init__(self, fail_at: int) -> None:
        super().__init__()
        self.gets, self.fail_at = 0, fail_at

    def get(self, block: bool = True, timeout: float | None = None) -> object:
        self.gets += 1
        if self.gets == self.fail_at:
            raise MemoryError("scripted")
        return super().get(block, timeout)


def test_jobs_taken_into_a_batch_are_answered_when_batching_fails():
    # get 1: the first job, 2: the second, joining its batch, 3: fails
    batcher, results = run_jobs(ScriptedTranslator(), [["a"], ["b"], ["c"]], jobs_queue=FailingQueue(fail_at=3))
    assert all(isinstance(r, MemoryError) and str(r) == "scripted" for r in results), results
    assert batcher.failure == "MemoryError: scripted"


class Tracked:
    pass


class FrameHoldingTranslator(ScriptedTranslator):
    """Its failing call keeps an object in its frame (as a failed search keeps its tensors); every call
    records whether that object is still alive."""

    def __init__(self) -> None:
        super().__init__()
        self.held: weakref.ref | None = None
        self.alive: list[bool] = []

    def translate(self, sentences: list[str], n_best: int = 1, beam_size: int | None = None,
                  return_attention: bool = False) -> list[str]:
        self.alive.append(self.held is not None and self.held() is not None)
        if "BOOM" in sentences:
            tensors = Tracked()
            self.held = weakref.ref(tensors)
        return super().translate(sentences, n_best, beam_size, return_attention)


def test_a_failed_batch_is_let_go_before_its_requests_are_retried():
    translator = FrameHoldingTranslator()
    _, results = run_jobs(translator, [["a"], ["BOOM"]])
    assert translator.calls == [["a", "BOOM"], ["a"], ["BOOM"]]
    assert translator.alive == [False, False, False]       # the failed call's frame was freed before the retry
    assert results[0] == ["A"] and str(results[1]) == "boom"


def test_a_stopped_batcher_refuses_new_jobs():
    async def main() -> RequestError:
        loop = asyncio.get_running_loop()
        batcher = Batcher(ScriptedTranslator(), ServeSettings())
        batcher.start()
        await asyncio.to_thread(batcher.stop)
        with pytest.raises(RequestError, match="shutting down") as refused:
            batcher.submit(Job(["a"], 1, 1, loop, loop.create_future()))
        return refused.value
    assert asyncio.run(main()).status == 503


def test_load_test_script_small(model_file, tmp_path):
    """On the corpus the repository ships (tests/data/multi30k), not the full one beside a checkout."""
    report = tmp_path / "load.json"
    result = subprocess.run([sys.executable, "-m", "bench.load_test", "--model", str(model_file),
                             "--multi30k", str(MULTI30K), "--clients", "4", "--requests", "24", "--threads", "1",
                             "--json-out", str(report)],
                            capture_output=True, text=True, timeout=600, cwd=REPO)
    assert result.returncode == 0, result.stderr[-3000:] + result.stdout
    figures = json.loads(report.read_text())
    assert figures["answered"] == 24 and figures["mismatches_or_failures"] == 0
    assert figures["server_exit_code"] == 143 and figures["request_log_lines"] == 25
    assert figures["sentences_per_s"] > 0 and figures["latency_p99_ms"] >= figures["latency_p50_ms"]


def test_libretranslate_languages_and_translate(server, offline, sources):
    """LibreTranslate's API: its clients list the languages, then send {q, source, target, format}."""
    status, _, body = server.request("GET", "/languages")
    assert status == 200 and body == [{"code": "de", "name": "German", "targets": ["en"]},
                                      {"code": "en", "name": "English", "targets": []}]
    status, _, body = server.translate({"q": sources[0], "source": "de", "target": "en", "format": "text",
                                        "api_key": ""})
    assert status == 200 and body == {"translatedText": offline.translate([sources[0]])[0].text}
    expected = [t.text for t in offline.translate(sources[1:4])]
    status, _, body = server.translate({"q": [sources[1], f"{sources[2]}\n{sources[3]}", ""], "source": "auto",
                                        "target": "en"})
    assert status == 200 and body == {"translatedText": [expected[0], f"{expected[1]}\n{expected[2]}", ""]}


@pytest.mark.parametrize("payload, status, message", [
    ({"q": "Hund", "source": "fr", "target": "en"}, 400, "fr is not supported"),
    ({"q": "Hund", "source": "de", "target": "fr"}, 400, "fr is not supported"),
    ({"q": "Hund", "source": "de", "target": "en", "format": "html"}, 400, "format html is not supported"),
    ({"q": "Hund", "target": "en"}, 400, "missing source parameter"),
    ({"q": 3, "source": "de", "target": "en"}, 400, "q must be a string or a list of strings"),
    ({"q": "Hund", "source": "de", "target": "en", "alternatives": 3}, 400, "alternatives are not supported"),
    ({"q": "Hund", "source": "de", "target": "en", "speed": 1}, 400, "unknown parameter 'speed'"),
    ({"q": "\n".join(["Hund"] * 21), "source": "de", "target": "en"}, 413, "the limit is 20"),
])
def test_libretranslate_errors_have_its_shape(server, payload, status, message):
    got, _, body = server.translate(payload)
    assert got == status and list(body) == ["error"] and message in body["error"], body


def test_fuzzing_the_openapi_schema_finds_no_server_error(server):
    """Schemathesis sends what the schema allows and what it does not: never a 5xx, never a traceback."""
    schemathesis = pytest.importorskip("schemathesis", reason="schemathesis is not installed (pip install -e '.[dev]')")
    from hypothesis import HealthCheck, given, settings
    from schemathesis import GenerationMode

    base = f"http://127.0.0.1:{server.port}"
    schema = schemathesis.openapi.from_url(f"{base}/openapi.json")
    cases = schema.as_strategy(GenerationMode.POSITIVE) | schema.as_strategy(GenerationMode.NEGATIVE)

    @settings(max_examples=80, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(case=cases)
    def fuzz(case) -> None:
        response = case.call(base_url=base, timeout=120)
        assert response.status_code < 500, (case.method, case.path, case.body, response.text)
        assert "Traceback" not in response.text

    fuzz()
    assert not any("Traceback" in line for line in server.log), "".join(server.log)


def multipart(fields: list[tuple[str, str, str | None]]) -> tuple[bytes, dict]:
    """A multipart/form-data body of (name, value, filename or None) parts, CRLF as the format has it."""
    boundary = "nmt-test-boundary"
    parts = []
    for name, value, filename in fields:
        disposition = f'form-data; name="{name}"' + (f'; filename="{filename}"' if filename else "")
        parts.append(f"--{boundary}\r\nContent-Disposition: {disposition}\r\n\r\n{value}\r\n")
    body = ("".join(parts) + f"--{boundary}--\r\n").encode()
    return body, {"Content-Type": f"multipart/form-data; boundary={boundary}"}


FORM = {"Content-Type": "application/x-www-form-urlencoded"}


def test_libretranslate_forms_are_read_as_libretranslate_reads_them(server, offline, sources):
    """LibreTranslate's page and several clients send forms: urlencoded and multipart bodies get what JSON gets,
    a form's CRLF line breaks are lines, and alternatives may be a number in text."""
    expected = [t.text for t in offline.translate(sources[:2])]
    body = urlencode({"q": sources[0], "source": "de", "target": "en", "format": "text", "api_key": ""}).encode()
    assert server.request("POST", "/translate", body, FORM)[::2] == (200, {"translatedText": expected[0]})
    body, headers = multipart([("q", f"{sources[0]}\r\n{sources[1]}", None), ("source", "auto", None),
                               ("target", "en", None), ("alternatives", "0", None)])
    status, _, answer = server.request("POST", "/translate", body, headers)
    assert status == 200 and answer == {"translatedText": "\n".join(expected)}
    status, _, answer = server.request("POST", "/translate", json.dumps(["Ein Hund."]).encode(), FORM)   # curl -d
    assert status == 200 and answer == {"translations": [offline.translate(["Ein Hund."])[0].text]}


def test_libretranslate_fields_in_the_query_string_are_read_as_a_form(server, offline, sources):
    """LibreTranslate reads `request.values`: the query string's fields with a form's, or alone."""
    expected = offline.translate(sources[:1])[0].text
    query = "/translate?" + urlencode({"q": sources[0], "source": "de", "target": "en"})
    assert server.request("POST", query, b"", FORM)[::2] == (200, {"translatedText": expected})
    assert server.request("POST", query, b"")[::2] == (200, {"translatedText": expected})
    split = "/translate?" + urlencode({"source": "de", "target": "en"})
    body = urlencode({"q": sources[0]}).encode()
    assert server.request("POST", split, body, FORM)[::2] == (200, {"translatedText": expected})
    body, headers = multipart([("q", sources[0], None)])
    assert server.request("POST", split, body, headers)[::2] == (200, {"translatedText": expected})
    twice = server.request("POST", query, urlencode({"q": "Katze"}).encode(), FORM)
    assert twice[0] == 400 and "'q' given more than once" in twice[2]["error"]
    twice = server.request("POST", "/translate", b'{"q": "Hund", "source": "de", "target": "en", "q": "Katze"}')
    assert twice[0] == 400 and "the key 'q' is given twice" in twice[2]["error"]
    with_json = server.request("POST", "/translate?beam_size=2", json.dumps({"sentences": ["Hund"]}).encode())
    assert with_json[0] == 400 and "query-string field 'beam_size' with a JSON body" in with_json[2]["error"]


@pytest.mark.parametrize(("fields", "status", "message"), [
    ([("q", "Hund", None), ("q", "Katze", None), ("source", "de", None), ("target", "en", None)], 400,
     "'q' given more than once"),
    ([("q", "Hund", "hund.txt"), ("source", "de", None), ("target", "en", None)], 400, "'q' is a file"),
    ([("q", "Hund", None), ("source", "de", None), ("target", "en", None), ("alternatives", "x", None)], 400,
     "alternatives parameter is not a number"),
    ([("q", "Hund", None), ("source", "de", None), ("target", "en", None), ("alternatives", "2", None)], 400,
     "alternatives are not supported"),
    ([("source", "de", None), ("target", "en", None)], 400, "missing q parameter"),
    ([("q", "x" * 5000, None), ("source", "de", None), ("target", "en", None)], 413, "the limit is 4096"),
])
def test_libretranslate_forms_that_cannot_be_served_are_refused(server, fields, status, message):
    for body, headers in (multipart(fields), (urlencode([(k, v) for k, v, _ in fields]).encode(), FORM)):
        if any(filename for _, _, filename in fields) and headers is FORM:
            continue                                   # a urlencoded form has no files
        got, _, answer = server.request("POST", "/translate", body, headers)
        assert got == status and list(answer) == ["error"] and message in answer["error"], (headers, answer)


@pytest.mark.parametrize(("body", "headers", "message"), [
    (b"q=%ff&source=de&target=en", FORM, "not valid UTF-8"),
    (b"foo=bar", FORM, "neither valid JSON nor a LibreTranslate form"),
    (b"--x\r\nContent-Disposition: form-data\r\n\r\nHund\r\n--x--\r\n", {"Content-Type": "multipart/form-data; "
     "boundary=x"}, "multipart body cannot be read"),                            # a part without a name
    (b"q=Hund", {"Content-Type": "multipart/form-data"}, "multipart body cannot be read"),
])
def test_malformed_forms_are_a_400(server, body, headers, message):
    got, _, answer = server.request("POST", "/translate", body, headers)
    assert got == 400 and message in answer["error"], answer


def test_without_python_multipart_a_multipart_body_is_a_415_that_says_what_to_install(monkeypatch):
    from starlette import formparsers
    from starlette.datastructures import Headers

    from nmt.serve.requests import parse_body

    body, headers = multipart([("q", "Hund", None)])
    monkeypatch.setattr(formparsers, "multipart", None)
    installing = r"python-multipart is not installed \(pip install 'nmt\[serve\]'\)"
    with pytest.raises(RequestError, match=installing) as refused:
        asyncio.run(parse_body(Headers(headers), body))
    assert refused.value.status == 415


def test_libretranslate_says_which_texts_were_cut_to_the_input_length(server, offline):
    long = " ".join(["Hund"] * (offline.decoding.max_input_len + 10))
    assert offline.translate([long])[0].truncated
    status, _, body = server.translate({"q": long, "source": "de", "target": "en"})
    assert status == 200 and body["truncated"] is True
    status, _, body = server.translate({"q": ["Ein Hund.", f"Ein Hund.\n{long}"], "source": "de", "target": "en"})
    assert status == 200 and body["truncated"] == [False, True] and len(body["translatedText"]) == 2
    status, _, body = server.request("POST", "/translate", urlencode({"q": long, "source": "de", "target": "en"})
                                     .encode(), FORM)
    assert status == 200 and body["truncated"] is True
    assert "truncated" not in server.translate({"q": "Ein Hund.", "source": "de", "target": "en"})[2]


def test_attention_is_what_nmt_translate_attention_out_writes(server, model_file, sources, tmp_path):
    out = tmp_path / "attention.jsonl"
    result = nmt_server().run("translate", "--model", str(model_file), "--device", "cpu", "--precision", "fp32",
                              "--beam-size", "2", "--attention-out", str(out), "-q",
                              stdin="".join(f"{s}\n" for s in [*sources[:3], ""]), text=True)
    assert result.returncode == 0, result.stderr
    status, _, body = server.translate({"sentences": [*sources[:3], ""], "beam_size": 2, "attention": True})
    assert status == 200
    assert body["attention"] == [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert body["translations"] == result.stdout.split("\n")[:-1]
    assert "attention" not in server.translate([sources[0]])[2]
    status, _, body = server.translate({"sentences": ["a"], "attention": "yes"})
    assert status == 400 and "attention must be true or false" in body["error"]


def test_the_page_and_its_model_card_are_served(server, model_file):
    status, headers, raw = server.raw("GET", "/")
    assert status == 200 and headers["content-type"].startswith("text/html")
    assert headers["content-security-policy"].startswith("default-src 'self'")      # nothing from elsewhere
    page = raw.decode()
    for asset in re.findall(r'(?:src|href)="([^"]+)"', page):
        assert asset.startswith(("/", "data:")), asset
        if asset.startswith("/"):
            assert server.raw("GET", asset)[0] == 200, asset
    result = nmt_server().run("info", str(model_file), "--json", text=True)
    info = json.loads(result.stdout)
    status, _, body = server.request("GET", "/card")
    assert status == 200
    card = body["card"]
    assert card["name"] == model_file.name and card["size_bytes"] == model_file.stat().st_size
    assert "file" not in card                                          # not the server's own paths
    assert {k: v for k, v in card.items() if k not in ("name", "size_bytes")} == {
        k: v for k, v in info.items() if k != "file"}
    assert body["server"] == {"beam_size": info["decoding"]["beam_size"], "max_beam": 8, "max_sentences": 20,
                              "max_body_bytes": 4096}


def asgi_get(app, path: str) -> tuple[int, bytes]:
    """One GET through an ASGI app, without a server or an HTTP client library."""
    messages: list[dict] = []

    async def receive() -> dict:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict) -> None:
        messages.append(message)

    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "GET", "scheme": "http",
             "path": path, "raw_path": path.encode(), "root_path": "", "query_string": b"", "headers": [],
             "server": ("test", 80), "client": ("test", 1)}
    asyncio.run(app(scope, receive, send))
    return messages[0]["status"], b"".join(message.get("body", b"") for message in messages[1:])


def test_the_page_is_served_where_its_app_is_mounted():
    from importlib import resources

    from fastapi import FastAPI

    from nmt.serve.page import add_page

    page = FastAPI()
    add_page(page, {}, 5, ServeSettings())
    outer = FastAPI()
    outer.mount("/nmt", page)
    static = resources.files("nmt.serve").joinpath("static")
    assert asgi_get(outer, "/nmt/page.js") == (200, static.joinpath("page.js").read_bytes())
    assert asgi_get(outer, "/nmt/") == (200, static.joinpath("index.html").read_bytes())
    assert asgi_get(page, "/page.css") == (200, static.joinpath("page.css").read_bytes())


def test_a_sampling_model_refuses_a_requested_beam_size():
    """Its samples ignore a beam: a request for one is a 400, the server's own (sent with every request) is not."""
    from nmt.serve.requests import parse_request

    settings = ServeSettings()
    with pytest.raises(RequestError) as refused:
        parse_request({"sentences": ["Ein Hund."], "beam_size": 8}, settings, 5, sampling=True)
    assert refused.value.status == 400 and "model samples" in str(refused.value)
    assert parse_request({"sentences": ["Ein Hund."], "beam_size": 5}, settings, 5, sampling=True)[1].beam_size == 5
    assert parse_request({"sentences": ["Ein Hund."], "beam_size": 8}, settings, 5)[1].beam_size == 8
