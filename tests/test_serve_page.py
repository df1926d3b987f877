"""The page of `nmt serve` in a real headless Chromium (Debian's `chromium`, driven by Playwright), against a
running server with its default settings: type sentences, get each translation, see the attention drawn,
all from the keyboard, with nothing fetched from elsewhere."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from nmt.decode.translator import Translator

from .conftest import read_gz
from .serve_process import Server

pytest.importorskip("fastapi", reason="the serve extra is not installed (pip install -e '.[serve]')")
pytest.importorskip("python_multipart", reason="the serve extra is not installed (pip install -e '.[serve]')")
sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (pip install -e '.[dev]')")

CHROMIUM = next((found for found in (os.environ.get("NMT_CHROMIUM"), shutil.which("chromium"),
                                     shutil.which("chromium-browser"), shutil.which("google-chrome")) if found), None)
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="no Chromium found (apt-get install chromium, or set "
                                                         "NMT_CHROMIUM to its path; .ci/run installs it)")

PIXELS = """(name) => {
  const canvas = document.getElementById(name), ctx = canvas.getContext("2d");
  const data = ctx.getImageData(0, 0, canvas.width, canvas.height).data, colours = new Set();
  for (let i = 0; i < data.length; i += 4) colours.add((data[i] << 16) | (data[i + 1] << 8) | data[i + 2]);
  return colours.size;
}"""
CELL = """([i, j]) => {
  const canvas = document.getElementById("heatmap"), box = canvas.dataset;
  const x = Math.floor((+box.left + (j + 0.5) * +box.cell) * devicePixelRatio);
  const y = Math.floor((+box.top + (i + 0.5) * +box.cell) * devicePixelRatio);
  const [r, g, b] = canvas.getContext("2d").getImageData(x, y, 1, 1).data;
  return `rgb(${r},${g},${b})`;
}"""


@pytest.fixture(scope="module")
def server(model_file: Path):
    server = Server(model_file)                      # the default limits, as a user starts it
    yield server
    server.stop()


def test_typing_sentences_shows_each_translation_and_draws_its_attention(server, model_file):
    sentences = read_gz("test_2016_flickr.de", 2)
    offline = Translator.load(model_file, device="cpu", precision="fp32")
    expected = offline.translate(sentences, n_best=2, beam_size=2, return_attention=True)
    base = f"http://127.0.0.1:{server.port}"
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM)
        try:
            page = browser.new_page(viewport={"width": 1100, "height": 760})
            elsewhere, problems = [], []
            page.on("request", lambda r: None if r.url.startswith(base) else elsewhere.append(r.url))
            page.on("pageerror", lambda error: problems.append(str(error)))
            page.on("console", lambda m: problems.append(m.text) if m.type == "error" else None)
            page.goto(base + "/")
            sync_api.expect(page.locator("#card-list")).to_contain_text("de → en")
            sync_api.expect(page.locator("#beam")).to_have_value(str(offline.decoding.beam_size))  # the model's

            page.keyboard.type("\n".join(sentences))            # the text area has the focus when the page opens
            for field, value in (("#beam", "2"), ("#nbest", "2")):
                page.keyboard.press("Tab")
                assert page.evaluate("document.activeElement.id") == field[1:]
                page.keyboard.press("Control+A")
                page.keyboard.type(value)
            page.keyboard.press("Tab")
            page.keyboard.press("Enter")                            # on the Translate button
            lines = page.locator("#results .line")
            sync_api.expect(lines.nth(1)).to_be_enabled(timeout=120_000)
            assert lines.locator(".tgt").all_text_contents() == [t.text for t in expected]
            assert [entry.split("  (")[0] for entry in lines.nth(0).locator("ol li").all_text_contents()] == [
                text for text, _ in expected[0].nbest]

            heatmap = page.locator("#heatmap")
            weights = expected[0].hypotheses[0].attention                    # (tgt pieces + 1, src pieces + 1)
            sync_api.expect(heatmap).to_have_attribute("data-line", "1")
            assert (int(heatmap.get_attribute("data-rows")), int(heatmap.get_attribute("data-cols"))) == \
                tuple(weights.shape)
            assert page.evaluate(PIXELS, "heatmap") > 50                    # cells, labels, colour bar
            for i, j in ((0, 0), (weights.shape[0] - 1, weights.shape[1] - 1)):  # each cell the colour of its α
                assert page.evaluate(CELL, [i, j]) == page.evaluate("(w) => colour(w)", round(float(weights[i, j]), 4))

            page.keyboard.press("Tab")                               # to the first line, then the second
            page.keyboard.press("Tab")
            page.keyboard.press("Enter")
            sync_api.expect(heatmap).to_have_attribute("data-line", "2")
            assert int(heatmap.get_attribute("data-rows")) == expected[1].hypotheses[0].attention.shape[0]
            assert lines.nth(1).get_attribute("aria-pressed") == "true"
        finally:
            browser.close()
    assert not elsewhere and not problems, (elsewhere, problems)
