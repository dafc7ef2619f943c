// The streaming-attention page: the memory calculator and "walk it", both computed by the server's code.
"use strict";
let walkData = null, walkShown = 0, memoryAsked = 0;

async function updateMemory() {
  const asked = ++memoryAsked;  // answers may come back out of order: only the latest question's is shown
  const q = new URLSearchParams({
    heads: $("#heads").value, context: $("#context").value, head_dim: $("#head-dim").value,
    tile: $("#tile").value, dtype: $("#dtype").value, query_block: $("#query-mode").value,
  });
  try {
    const r = await call("GET", `/api/attention-memory?${q}`);
    if (asked !== memoryAsked) return;
    showError("#memory-error", null);
    $("#full-bytes").textContent = fmtInt(r.full); $("#full-human").textContent = human(r.full);
    $("#stream-bytes").textContent = fmtInt(r.streaming); $("#stream-human").textContent = human(r.streaming);
    $("#tile-bytes").textContent = fmtInt(r.tile_scores);
    $("#ratio").textContent = r.ratio.toFixed(1);
    drawBars(r);
    $("#memory-note").textContent =
      `${fmtInt(r.n_ctx)} positions, ${fmtInt(r.n_query)} queries; the table is ${r.ratio.toFixed(1)} times the streaming working set.`;
    document.body.dataset.memoryReady = `${r.n_ctx}:${$("#heads").value}:${r.full}`;
  } catch (e) { if (asked === memoryAsked) showError("#memory-error", e); }
}

// A linear scale, so that the table's growth with the context shows as it is; the model's weights for scale.
// Each track's width stands for the axis's top (data-axis-bytes); each bar's width for its data-bytes.
let lastMemory = null;

function niceAxis(top) {
  const units = [["B", 1], ["KiB", 1024], ["MiB", 1024 ** 2], ["GiB", 1024 ** 3], ["TiB", 1024 ** 4]];
  let [unit, size] = units[0];
  for (const [u, s] of units) if (top >= s) [unit, size] = [u, s];
  const raw = top / size / 4, pow = 10 ** Math.floor(Math.log10(raw));
  const step = [1, 2, 2.5, 5, 10].map((m) => m * pow).find((m) => m >= raw);
  const ticks = Math.max(1, Math.ceil(top / size / step - 1e-9));
  return { unit, size, step, ticks, bytes: ticks * step * size };
}

function drawBars(r) {
  lastMemory = r;
  const w = r.weights, axis = niceAxis(Math.max(r.full, r.streaming, w.bytes, 1));
  $("#weights-name").textContent = `${w.name}'s weights (${(w.parameters / 1e6).toFixed(0)}M parameters, ${w.dtype})`;
  const bars = [["#full-bar", "#full-label", r.full], ["#stream-bar", "#stream-label", r.streaming],
    ["#weights-bar", "#weights-label", w.bytes]];
  const width = $("#full-bar").parentElement.clientWidth;
  for (const [bar, label, bytes] of bars) {
    $(bar).dataset.bytes = bytes;
    $(bar).style.width = `${Math.max(1, width * bytes / axis.bytes)}px`;  // 1 px: a tiny set stays visible
    $(label).textContent = `: ${human(bytes)}`;
  }
  document.querySelectorAll("#chart .track").forEach((t) => { t.dataset.axisBytes = axis.bytes; });
  const ax = $("#axis");
  ax.textContent = "";
  for (let i = 0; i <= axis.ticks; i++) {
    const tick = document.createElement("span");
    const value = +(i * axis.step).toFixed(6);
    tick.textContent = i === 0 ? "0" : `${value} ${axis.unit}`;
    tick.dataset.bytes = value * axis.size;
    tick.style.left = `${(width * i) / axis.ticks}px`;
    tick.className = i === 0 ? "first" : i === axis.ticks ? "last" : "";
    ax.appendChild(tick);
  }
}

window.addEventListener("resize", () => { if (lastMemory) drawBars(lastMemory); });

// /attention?scores=1.5,-0.3,2.8&tile=2 walks those scores: the link an attention view of the playground makes
async function walkFromAddress() {
  const q = new URLSearchParams(location.search);
  if (!q.get("scores")) return;
  $("#scores").value = q.get("scores").split(",").join(" ");
  if (q.get("tile")) $("#walk-tile").value = q.get("tile");
  await startWalk();
  stepWalk();
  $("#walk-it").scrollIntoView();
}

// the slider moves along log2(context), so 1 to 131,072 positions all get room
function fromSlider() { $("#context").value = Math.round(2 ** Number($("#context-slider").value)); updateMemory(); }
function fromBox() { $("#context-slider").value = Math.log2(Math.max(1, Number($("#context").value))); updateMemory(); }

async function startWalk() {
  try {
    walkData = await call("POST", "/api/softmax-walk", { scores: $("#scores").value, tile: Number($("#walk-tile").value) });
    showError("#walk-error", null);
  } catch (e) { walkData = null; showError("#walk-error", e); return; }
  walkShown = 0;
  $("#walk tbody").textContent = ""; $("#walk-weights").textContent = "";
  $("#walk-step").disabled = $("#walk-all").disabled = false;
}

function stepWalk() {
  if (!walkData || walkShown >= walkData.steps.length) return;
  const s = walkData.steps[walkShown++];
  const [a, b] = s.positions;
  const tr = document.createElement("tr");
  tr.dataset.step = walkShown;
  const cells = [walkShown, b - a === 1 ? a : `${a}-${b - 1}`, s.tile_max, s.running_max, s.rescale, s.running_total];
  const names = ["step", "positions", "tile-max", "running-max", "rescale", "running-total"];
  cells.forEach((c, i) => {
    const td = document.createElement("td");
    td.dataset.field = names[i];
    if (i >= 2) td.dataset.value = c === null ? "" : String(c);
    td.textContent = i >= 2 ? fmtNum(c, 8) : c;
    tr.appendChild(td);
  });
  $("#walk tbody").appendChild(tr);
  if (walkShown === walkData.steps.length) finishWalk();
}

function finishWalk() {
  $("#walk-step").disabled = $("#walk-all").disabled = true;
  const w = walkData;
  $("#walk-weights").innerHTML = "";
  const t = document.createElement("table");
  t.innerHTML = "<tr><th>position</th><th>score</th><th>streaming weight</th><th>plain softmax</th></tr>";
  w.scores.forEach((s, i) => {
    const tr = t.insertRow();
    [i, fmtNum(s), w.weights[i].toFixed(10), w.plain[i].toFixed(10)].forEach((c) => { tr.insertCell().textContent = c; });
  });
  $("#walk-weights").appendChild(t);
  const p = document.createElement("p");
  p.textContent = `max |streaming - plain| = ${w.max_abs_diff.toPrecision(3)}; weights sum to ${w.weights_sum}`;
  $("#walk-weights").appendChild(p);
}

$("#context-slider").addEventListener("input", fromSlider);
$("#context").addEventListener("input", fromBox);
for (const id of ["#heads", "#head-dim", "#dtype", "#tile", "#query-mode"]) $(id).addEventListener("input", updateMemory);
$("#walk-start").addEventListener("click", startWalk);
$("#walk-step").addEventListener("click", stepWalk);
$("#walk-all").addEventListener("click", () => { while (walkData && walkShown < walkData.steps.length) stepWalk(); });
updateMemory();
walkFromAddress().finally(() => { document.body.dataset.ready = "1"; });
