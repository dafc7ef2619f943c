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
    const scale = (b) => Math.max(1, 40 * Math.log10(Math.max(b, 1))) + "px";  // log scale: both stay visible
    $("#full-bar").style.width = scale(r.full); $("#stream-bar").style.width = scale(r.streaming);
    $("#memory-note").textContent =
      `${fmtInt(r.n_ctx)} positions, ${fmtInt(r.n_query)} queries; the table is ${r.ratio.toFixed(1)} times the streaming working set.`;
    document.body.dataset.memoryReady = `${r.n_ctx}:${$("#heads").value}:${r.full}`;
  } catch (e) { if (asked === memoryAsked) showError("#memory-error", e); }
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
