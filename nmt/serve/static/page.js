// The page of `nmt serve` (nmt/serve/page.py): each line of the text is its own POST /translate with
// attention, so translations appear one by one; the chosen line's attention is drawn on a canvas.
"use strict";

const $ = (id) => document.getElementById(id);
const VIRIDIS = ["#440154", "#482475", "#414487", "#355f8d", "#2a788e", "#21918c",
                 "#22a884", "#44bf70", "#7ad151", "#bddf26", "#fde725"];   // matplotlib's, as --plot-attention
let run = 0;               // the current translation run: a newer one stops an older one
let shown = null;          // the attention record on the canvas and its geometry

function rgb(hex) { return [1, 3, 5].map((i) => parseInt(hex.slice(i, i + 2), 16)); }
const STOPS = VIRIDIS.map(rgb);

function colour(weight) {
  const x = Math.min(1, Math.max(0, weight)) * (STOPS.length - 1);
  const i = Math.min(STOPS.length - 2, Math.floor(x));
  const t = x - i;
  const c = STOPS[i].map((v, k) => Math.round(v + t * (STOPS[i + 1][k] - v)));
  return `rgb(${c[0]},${c[1]},${c[2]})`;
}

function text(tag, content, className) {
  const node = document.createElement(tag);
  node.textContent = content;
  if (className) node.className = className;
  return node;
}

// ---------------------------------------------------------------------------- the model card

function megabytes(bytes) { return `${(bytes / 2 ** 20).toFixed(1)} MB`; }

function cardRows(card) {
  const a = card.architecture, v = card.vocabulary, dev = card.dev, rows = [];
  rows.push(["Languages", `${card.languages.src} → ${card.languages.tgt}`]);
  rows.push(["Dev BLEU", dev ? `${dev.bleu.toFixed(2)} (${dev.search || "greedy"} search` +
                             `${dev.sentences ? ` on ${dev.sentences} sentences` : ""}, update ${dev.step})`
                             : "not recorded"]);
  rows.push(["Parameters", card.parameters.toLocaleString("en")]);
  rows.push(["Size", `${megabytes(card.size_bytes)} (${card.name}, ${card.dtype})`]);
  rows.push(["Model", `${a.bidirectional ? "bi-" : ""}${a.rnn_type.toUpperCase()} encoder ` +
                      `${a.encoder_layers}×${a.encoder_hidden}, decoder ${a.decoder_layers}×${a.decoder_hidden}, ` +
                      `${a.attention} attention`]);
  rows.push(["Vocabulary", `${v.joint_sentencepiece ? "joint" : "separate"} SentencePiece, ` +
                           `${v.src_size} / ${v.tgt_size} pieces`]);
  if (card.training && card.training.step !== undefined) rows.push(["Training", `${card.training.step} updates`]);
  return rows;
}

async function loadCard() {
  const list = $("card-list");
  try {
    const response = await fetch("/card");
    const data = await response.json();
    if (!response.ok) throw new Error(data.error || response.statusText);
    const { card, server } = data;
    if (card.languages && card.languages.src) $("pair").textContent = `${card.languages.src} → ${card.languages.tgt}`;
    list.replaceChildren();
    for (const [name, value] of card.parameters === undefined ? [] : cardRows(card)) {
      list.append(text("dt", name), text("dd", value));
    }
    const beam = $("beam");
    beam.max = server.max_beam;
    beam.value = server.beam_size;
    limitNbest();
  } catch (error) {
    list.replaceChildren(text("dt", "Error"), text("dd", `the model card did not load (${error.message})`));
  }
}

function limitNbest() {
  const beam = Math.max(1, parseInt($("beam").value, 10) || 1);
  const nbest = $("nbest");
  nbest.max = beam;
  if ((parseInt(nbest.value, 10) || 1) > beam) nbest.value = beam;
}

// ---------------------------------------------------------------------------- translating, line by line

function lineItem(number, source) {
  const item = document.createElement("li");
  const button = document.createElement("button");
  button.type = "button";
  button.className = "line";
  button.setAttribute("aria-pressed", "false");
  button.disabled = true;
  button.append(text("span", source, "src"), text("span", "…", "tgt"));
  button.dataset.line = number;
  item.append(button);
  $("results").append(item);
  return button;
}

function fill(button, data) {
  button.querySelector(".tgt").textContent = data.translations[0];
  if (data.n_best) {
    const list = document.createElement("ol");
    list.setAttribute("aria-label", "n-best list");
    for (const entry of data.n_best[0]) {
      list.append(text("li", `${entry.text}  (${entry.score === null ? "–" : entry.score.toFixed(3)})`));
    }
    button.append(list);
  }
  if (data.truncated) {
    button.append(text("span", "This line was over the model's input length and was translated cut short.",
                       "note"));
  }
  const record = data.attention[0];
  button.disabled = false;
  button.addEventListener("click", () => select(button, record));
}

async function translateAll(event) {
  event.preventDefault();
  const id = ++run;
  const lines = $("source").value.split("\n");                 // only \n ends a line, as in nmt translate
  const todo = lines.map((line, i) => [i, line]).filter(([, line]) => line.trim() !== "");
  const beam = parseInt($("beam").value, 10), nbest = parseInt($("nbest").value, 10);
  $("results").replaceChildren();
  let done = 0, failed = 0, first = true;
  for (const [number, line] of todo) {
    if (id !== run) return;
    $("status").textContent = `Translating line ${done + 1} of ${todo.length}…`;
    const button = lineItem(number + 1, line);
    try {
      const response = await fetch("/translate", {
        method: "POST", headers: { "Content-Type": "application/json" },
        body: JSON.stringify({ sentences: [line], beam_size: beam, n_best: nbest, attention: true }),
      });
      const data = await response.json();
      if (!response.ok) throw new Error(data.error || response.statusText);
      if (id !== run) return;
      fill(button, data);
      if (first) { select(button, data.attention[0]); first = false; }
    } catch (error) {
      failed += 1;
      button.classList.add("error");
      button.querySelector(".tgt").textContent = `error: ${error.message}`;
    }
    done += 1;
  }
  if (id !== run) return;
  $("status").textContent = todo.length === 0 ? "Nothing to translate: type or paste some text."
    : `${done - failed} of ${todo.length} line${todo.length === 1 ? "" : "s"} translated` +
      (failed ? `, ${failed} failed` : "") + ". Choose a line to see its attention.";
}

// ---------------------------------------------------------------------------- the heatmap

function select(button, record) {
  for (const other of document.querySelectorAll(".line")) other.setAttribute("aria-pressed", "false");
  button.setAttribute("aria-pressed", "true");
  draw(record, parseInt(button.dataset.line, 10));
}

function draw(record, number) {
  const canvas = $("heatmap"), ctx = canvas.getContext("2d");
  const rows = record.tgt.length, cols = record.src.length;
  const font = "12px system-ui, sans-serif";
  ctx.font = font;
  const widest = (pieces) => Math.max(0, ...pieces.map((p) => ctx.measureText(p).width));
  const left = Math.ceil(widest(record.tgt)) + 10, top = Math.ceil(widest(record.src)) + 10;
  const room = canvas.parentElement.clientWidth - left - 70;
  const cell = Math.max(12, Math.min(30, Math.floor(room / Math.max(cols, 1))));
  const width = left + cols * cell + 70, height = top + Math.max(rows * cell, 120) + 10;
  const scale = window.devicePixelRatio || 1;
  canvas.width = Math.round(width * scale);
  canvas.height = Math.round(height * scale);
  canvas.style.width = `${width}px`;
  canvas.style.height = `${height}px`;
  ctx.setTransform(scale, 0, 0, scale, 0, 0);
  ctx.fillStyle = "#fff";
  ctx.fillRect(0, 0, width, height);
  record.attention.forEach((row, i) => row.forEach((weight, j) => {
    ctx.fillStyle = colour(weight);
    ctx.fillRect(left + j * cell, top + i * cell, cell, cell);
  }));
  ctx.font = font;
  ctx.fillStyle = "#1d1f24";
  ctx.textBaseline = "middle";
  ctx.textAlign = "right";
  record.tgt.forEach((piece, i) => ctx.fillText(piece, left - 6, top + (i + 0.5) * cell));
  ctx.save();
  ctx.rotate(-Math.PI / 2);
  ctx.textAlign = "left";
  record.src.forEach((piece, j) => ctx.fillText(piece, -top + 6, left + (j + 0.5) * cell));
  ctx.restore();
  colourBar(ctx, left + cols * cell + 20, top, Math.max(rows * cell, 120));
  shown = { record, left, top, cell, rows, cols };
  Object.assign(canvas.dataset, { rows, cols, line: number, left, top, cell });   // for a reader or a test
  canvas.setAttribute("aria-label", `Attention of line ${number}: ${rows} output pieces (rows) by ${cols} ` +
                                    `source pieces (columns)`);
  $("attention-caption").textContent = `Line ${number}: ${record.tgt.length - 1} output pieces (down) by ` +
    `${record.src.length - 1} source pieces (across), each with </s>. Rows are the weights α of one output step.`;
  $("cell").textContent = "";
}

function colourBar(ctx, x, y, height) {
  for (let k = 0; k < height; k += 1) {
    ctx.fillStyle = colour(1 - k / (height - 1));
    ctx.fillRect(x, y + k, 12, 1);
  }
  ctx.fillStyle = "#1d1f24";
  ctx.textAlign = "left";
  ctx.fillText("1", x + 16, y + 4);
  ctx.fillText("0.5", x + 16, y + height / 2);
  ctx.fillText("0 α", x + 16, y + height - 4);
}

function describeCell(event) {
  if (!shown) return;
  const box = event.target.getBoundingClientRect();
  const j = Math.floor((event.clientX - box.left - shown.left) / shown.cell);
  const i = Math.floor((event.clientY - box.top - shown.top) / shown.cell);
  const inside = i >= 0 && j >= 0 && i < shown.rows && j < shown.cols;
  $("cell").textContent = inside ? `${shown.record.tgt[i]} ← ${shown.record.src[j]}: ` +
    `α = ${shown.record.attention[i][j].toFixed(3)}` : "";
}

// ---------------------------------------------------------------------------- start

document.addEventListener("DOMContentLoaded", () => {
  $("form").addEventListener("submit", translateAll);
  $("beam").addEventListener("input", limitNbest);
  $("source").addEventListener("keydown", (event) => {
    if (event.key === "Enter" && (event.ctrlKey || event.metaKey)) $("form").requestSubmit();
  });
  $("heatmap").addEventListener("mousemove", describeCell);
  loadCard();
});
