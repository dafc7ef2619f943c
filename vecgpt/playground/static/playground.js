// The playground: start a text, watch its tokens arrive (server-sent events), click one for its candidates,
// step back, branch, retry, export; requests per token; the text's id in the URL so a reload finds it again.
// Ctrl+Enter (Cmd+Enter) generates; a progress bar counts the tokens while they arrive.
"use strict";
const KINDS = ["open", "lookup", "matrix", "key_write", "key_search", "token_search", "wait"];
let stores = [], view = null, costs = {}, checks = {}, compares = {}, source = null, changedFrom = null;

let charging = true;  // until the server says none of its stores charges

async function showSpending() {
  if (!charging) return;
  try {
    const s = await call("GET", "/api/spending");
    charging = s.charging;
    $("#spending").textContent = charging ? `spent $${s.spent.toFixed(4)} of $${s.limit.toFixed(2)} this hour` : "";
  } catch (e) { showError("#error", e); }
}

async function loadStores() {
  stores = (await call("GET", "/api/stores")).stores;
  $("#store").innerHTML = "";
  for (const s of stores) $("#store").add(new Option(`${s.label} (${s.location.backend})`, s.index));
  fillModels();
}

function fillModels() {
  const s = stores[Number($("#store").value)] || stores[0];
  $("#model").innerHTML = "";
  if (!s) return;
  for (const m of s.models) $("#model").add(new Option(`${m.source.split("/").pop()} ${m.key.slice(0, 12)}`, m.key));
  const where = Object.entries(s.location).filter(([k]) => k !== "backend").map(([k, v]) => `${k} ${v}`).join(", ");
  $("#store-info").textContent = `${fmtInt(s.documents)} documents, ${human(s.bytes)} (${fmtInt(s.bytes)} bytes); ${s.location.backend}${where ? ": " + where : ""}`;
  if (!s.models.length) showError("#error", new Error("this store holds no model: run `vecgpt load` with its config"));
  if (!view) fillCompare();
}

// "Compare with": the server's other stores, each saying whether it holds the text's model (the weights, in any
// encoding; a comparison loads them into a store whose loads are not billed); with none, how to add one.
function fillCompare() {
  const index = view ? view.store : Number($("#store").value), key = view ? view.model : $("#model").value;
  const mine = (stores[index] || { models: [] }).models.find((m) => m.key === key) || {};
  const select = $("#compare-store");
  select.innerHTML = "";
  for (const s of stores.filter((s) => s.index !== index)) {
    const holds = s.models.some((m) => m.model_fingerprint === mine.model_fingerprint);
    const note = holds ? "holds the model" : s.loads ? "loads the model first" : "no model: `vecgpt load` it there";
    const o = new Option(`${s.label} (${s.location.backend}, ${s.metric}): ${note}`, s.label);
    o.disabled = !holds && !s.loads;
    select.add(o);
  }
  const usable = [...select.options].find((o) => !o.disabled);
  if (usable) select.value = usable.value;
  select.hidden = !select.options.length;
  $("#compare").disabled = !view || !usable;
  $("#compare-info").textContent = select.options.length ? "" : "this server has one store: to compare, serve two, " +
    "e.g. vecgpt serve --config configs/faiss.toml --config configs/faiss-l2.toml (docs/playground.md)";
}

function settingsBody() {
  return {
    store: Number($("#store").value), model: $("#model").value || null, prompt: $("#prompt").value,
    temperature: Number($("#temperature").value), top_k: Number($("#top-k").value), seed: Number($("#seed").value),
  };
}

function setView(v, fresh) {
  view = v;
  if (fresh) { costs = {}; checks = {}; compares = {}; }
  Object.assign(costs, v.costs || {});  // what the server measured drawing each token (a reopened text too)
  const url = new URL(location.href);
  url.searchParams.set("text", v.id);
  history.replaceState(null, "", url);
  $("#text-id").textContent = `text ${v.id}`;
  // the fields say the text's settings (a retry moves its seed)
  $("#temperature").value = v.settings.temperature; $("#top-k").value = v.settings.top_k; $("#seed").value = v.settings.seed;
  $("#continue").disabled = $("#export").disabled = false;
  if (fresh) fillCompare();
  renderText();
  renderRequests();
}

function tokenSpan(t, prompt) {
  const span = document.createElement("span");
  span.textContent = t.text;
  span.dataset.position = t.position;
  if (prompt) { span.className = "prompt"; return span; }
  if (t.text.includes("\n")) span.textContent = t.text.replace(/\n/g, "\u21b5\n");  // a line break you can click
  span.dataset.token = t.id;
  if (changedFrom !== null && t.position >= changedFrom) span.classList.add("changed");
  span.addEventListener("click", () => showCandidates(t.position));
  return span;
}

function renderText() {
  $("#text").textContent = "";
  view.tokens.forEach((t) => $("#text").appendChild(tokenSpan(t, t.position < view.prompt_len)));
  const s = view.spent || {}, spent = s.requests === undefined ? "" :
    `; spent so far ${fmtInt(s.requests)} requests, ${fmtInt(s.round_trips)} round trips, ${fmtInt(s.positions_read)} positions read`;
  $("#status").textContent = `${view.tokens.length - view.prompt_len} generated after a ${view.prompt_len}-token prompt; context ${view.n_ctx}${spent}`;
  $("#status").dataset.spentRequests = s.requests ?? "";
}

async function generate() {
  showError("#error", null);
  changedFrom = null;
  try { setView(await call("POST", "/api/texts", settingsBody()), true); } catch (e) { showError("#error", e); return; }
  $("#details").innerHTML = "";
  stream();
}

function progress(done, n) {
  const busy = n !== null;
  $("#progress-line").hidden = !busy;
  $("#text").classList.toggle("busy", busy);
  $("#generate").disabled = $("#continue").disabled = busy;
  if (!busy) { delete document.body.dataset.generating; return; }
  $("#progress").max = n; $("#progress").value = done;
  $("#progress-text").textContent = `generating: ${done} of ${n} tokens`;
  document.body.dataset.generating = `${done}/${n}`;
}

function stream() {
  if (source) source.close();
  showError("#error", null);
  const n = Number($("#n").value);
  let done = 0;
  progress(0, n);
  source = new EventSource(`/api/texts/${view.id}/generate?n=${n}`);
  source.addEventListener("token", (ev) => {
    const t = JSON.parse(ev.data);
    costs[t.position] = t.cost;
    view.tokens = view.tokens.slice(0, t.position).concat([t]);
    $("#text").appendChild(tokenSpan(t, false));
    progress(++done, n);
    renderRequests();
  });
  const end = () => { if (!source) return; source.close(); source = null; progress(0, null); showSpending(); };
  source.addEventListener("done", () => { end(); refresh(); });
  $("#stop").onclick = () => { end(); refresh(); };  // the server stops once it sees the stream closed
  source.addEventListener("error", (ev) => {
    let message = "the server stopped the stream";
    try { message = JSON.parse(ev.data).error; } catch (_) { /* a dropped connection has no data */ }
    showError("#error", new Error(message));
    end();
  });
}

async function refresh() {
  try { setView(await call("GET", `/api/texts/${view.id}`), false); } catch (e) { showError("#error", e); }
  if ($("#check").checked) runCheck();
}

function costLine(c) {
  if (!c) return "";
  const parts = [`${c.total ?? 0} requests`, `${c.round_trips ?? 0} rounds`];
  if (c.positions_read !== undefined) parts.push(`${c.positions_read} positions read`);
  if (c.dollars !== undefined && c.dollars !== null) parts.push(`$${Number(c.dollars).toPrecision(3)}`);
  return parts.join(", ");
}

async function showCandidates(position) {
  document.querySelectorAll("#text .selected").forEach((el) => el.classList.remove("selected"));
  const el = document.querySelector(`#text [data-token][data-position="${position}"]`);
  if (el) el.classList.add("selected");
  let c;
  try { c = await call("GET", `/api/texts/${view.id}/candidates/${position}`); } catch (e) { showError("#error", e); return; }
  const d = $("#details");
  d.innerHTML = `<h3>Position ${position}: ${c.rows.length} candidates</h3>
    <p class="muted">temperature ${c.temperature}, top-k ${c.top_k}; probability after both</p>
    <div><button id="step-back">step back to here</button><span class="cost" id="step-back-cost"></span>
    <button id="retry">retry here</button><span class="cost" id="retry-cost"></span></div>`;
  const table = document.createElement("table");
  table.id = "candidates";
  table.innerHTML = "<tr><th>token</th><th>text</th><th>logit</th><th>probability</th><th></th><th></th></tr>";
  for (const r of c.rows) {
    const tr = table.insertRow();
    tr.dataset.candidate = r.id;
    tr.dataset.logit = r.logit;
    tr.dataset.probability = r.probability;
    if (r.chosen) tr.classList.add("chosen");
    tr.innerHTML = `<td>${r.id}</td><td class="txt"></td><td>${r.logit.toFixed(4)}</td><td>${r.probability.toFixed(4)}</td>
      <td class="txt"><span class="bar" style="width:${Math.round(80 * r.probability)}px"></span>${r.chosen ? " chosen" : ""}</td>
      <td><button class="branch" aria-label="branch with this candidate" title="branch with this candidate">branch</button></td>`;
    tr.cells[1].textContent = JSON.stringify(r.text);
    tr.querySelector(".branch").addEventListener("click", () => act("branch", { position, token: r.id }, position));
  }
  d.appendChild(table);
  const p = document.createElement("p");
  p.className = "cost"; p.id = "action-cost";
  d.appendChild(p);
  d.appendChild(walkLink(c));
  $("#step-back").addEventListener("click", () => act("step-back", { position }, null));
  $("#retry").addEventListener("click", () => act("retry", { position, seed: Number($("#seed").value) + 1 }, position));
}

// The probabilities above are a softmax of logit / temperature: the attention page walks that same softmax.
function walkLink(c) {
  const drawn = c.rows.slice(0, c.temperature > 0 ? c.top_k : 1);
  const scores = drawn.map((r) => (c.temperature > 0 ? r.logit / c.temperature : r.logit));
  const p = document.createElement("p");
  p.className = "muted";
  const a = document.createElement("a");
  a.id = "walk-link";
  a.href = `/attention?${new URLSearchParams({ scores: scores.join(",") })}#walk-it`;
  a.textContent = "walk this softmax step by step";
  p.append("The probabilities are softmax(logit / temperature): ", a, " (the streaming softmax attention uses).");
  return p;
}

async function exportText() {
  showError("#error", null);
  let data;
  try { data = await call("GET", `/api/texts/${view.id}/export`); } catch (e) { showError("#error", e); return; }
  const a = document.createElement("a");
  a.href = URL.createObjectURL(new Blob([JSON.stringify(data, null, 2)], { type: "application/json" }));
  a.download = `vecgpt-text-${data.id}.json`;
  document.body.appendChild(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(a.href), 10000);
}

async function act(kind, body, from) {
  showError("#error", null);
  let v;
  try { v = await call("POST", `/api/texts/${view.id}/${kind}`, body); } catch (e) { showError("#error", e); return; }
  changedFrom = from;
  const line = `${kind}: ${costLine(v.cost)}`;
  for (const p of Object.keys(costs)) if (Number(p) >= body.position) delete costs[p];
  for (const p of Object.keys(compares)) if (Number(p) >= body.position) delete compares[p];
  setView(v, kind === "branch");
  showSpending();
  $("#details").innerHTML = "";
  const p = document.createElement("p");
  p.className = "cost"; p.id = "action-cost"; p.textContent = line;
  $("#details").appendChild(p);
  if ($("#check").checked) runCheck();
}

function waterfall(c) {
  const f = document.createElement("span");
  f.className = "fall";
  const secs = c.seconds_by_kind || {}, rounds = c.round_trips_by_kind || {};
  const total = Object.values(secs).reduce((a, b) => a + b, 0) || 1;
  const waits = (c.by_kind || {}).wait || 0;  // a search waited for a write to land: time, but no round trip
  for (const k of KINDS) {
    if (!rounds[k] && !(k === "wait" && waits)) continue;
    const s = document.createElement("span");
    s.className = `k-${k}`;
    s.style.width = `${Math.max(2, Math.round(90 * (secs[k] || 0) / total))}px`;
    const what = k === "wait" ? `${waits} waits for a write` : `${rounds[k]} rounds`;
    s.title = `${k}: ${what}, ${(1000 * (secs[k] || 0)).toFixed(1)} ms`;
    f.appendChild(s);
  }
  return f;
}

function renderRequests() {
  const body = $("#requests tbody");
  body.textContent = "";
  if (!view) return;
  for (const t of view.tokens.slice(view.prompt_len)) {
    const c = costs[t.position], tr = body.insertRow();
    tr.dataset.requestsPosition = t.position;
    const kinds = c ? Object.entries(c.by_kind || {}).map(([k, n]) => `${k} ${n}`).join(", ") : "";
    const scores = (c && c.scores) || {};
    const cells = [t.position, JSON.stringify(t.text), c ? c.total : "", c ? c.subqueries : "", c ? c.round_trips : "",
      c ? `${scores.store ?? 0} / ${scores.memory ?? 0}` : "",
      c ? (1000 * c.seconds).toFixed(1) : "", "", c && c.dollars != null ? Number(c.dollars).toPrecision(3) : "",
      checks[t.position] != null ? checks[t.position].toExponential(2) : "", compareCell(compares[t.position])];
    cells.forEach((x) => { tr.insertCell().textContent = x; });
    tr.cells[1].title = cells[1];
    tr.cells[2].title = kinds;
    if (c) {
      tr.dataset.scoresStore = scores.store ?? 0;
      tr.dataset.scoresMemory = scores.memory ?? 0;
      tr.cells[5].title = "q.k products: from a key search of the store / from memory (each position's own key)";
      tr.cells[7].appendChild(waterfall(c));
    }
    tr.cells[8].className = "dollars";
    tr.cells[9].className = "check";
    tr.cells[10].className = "compare";
    if (compares[t.position]) {
      tr.dataset.compareDiff = compares[t.position].max_abs_diff ?? "";
      tr.dataset.compareOrder = compares[t.position].order_differs ? "differs" : "same";
    }
  }
  const table = $("#requests");  // a column shows once it has something to say
  table.classList.toggle("no-dollars", !Object.values(costs).some((c) => c && c.dollars != null));
  table.classList.toggle("no-check", !Object.keys(checks).length);
  table.classList.toggle("no-compare", !Object.keys(compares).length);
}

async function runCheck() {
  if (!view) return;
  try {
    const r = await call("GET", `/api/texts/${view.id}/check`);
    checks = {};
    for (const row of r.positions) checks[row.position] = row.max_abs_diff;
    renderRequests();
    document.body.dataset.checked = view.id;
  } catch (e) { showError("#error", e); }
}

function compareCell(r) {
  if (!r) return "";
  return `${r.max_abs_diff == null ? "-" : r.max_abs_diff.toExponential(2)}${r.order_differs ? " *" : ""}`;
}

const encoding = (e) => `${e.label} (${e.metric}, ${e.layout})`;

// The text's tokens read again on another store (or encoding): per token, how far its candidates' logits moved.
async function runCompare() {
  if (!view) return;
  showError("#error", null);
  try {
    const r = await call("GET", `/api/texts/${view.id}/compare?${new URLSearchParams({ store: $("#compare-store").value })}`);
    compares = {};
    for (const row of r.positions) compares[row.position] = row;
    const moved = r.positions.filter((row) => row.order_differs).length;
    $("#compare-info").textContent = `${encoding(r.this)} vs ${encoding(r.other)}: order differs at ${moved} of ${r.positions.length} tokens; ${costLine(r.cost)}`;
    renderRequests();
    document.body.dataset.compared = view.id;
  } catch (e) { showError("#error", e); }
}

async function main() {
  try { await loadStores(); } catch (e) { showError("#error", e); }
  await showSpending();
  const id = new URLSearchParams(location.search).get("text");
  if (id) {
    try {
      const v = await call("GET", `/api/texts/${encodeURIComponent(id)}`);
      $("#store").value = v.store; fillModels(); $("#model").value = v.model;
      $("#prompt").value = v.tokens.slice(0, v.prompt_len).map((t) => t.text).join("");
      setView(v, true);
    } catch (e) { showError("#error", e); }
  } else {
    $("#seed").value = Math.floor(Math.random() * 2 ** 31);  // sampling by default: a new seed, shown, to repeat
  }
  document.body.dataset.ready = "1";
}

$("#store").addEventListener("change", fillModels);
$("#model").addEventListener("change", () => { if (!view) fillCompare(); });
$("#generate").addEventListener("click", generate);
$("#continue").addEventListener("click", stream);
$("#export").addEventListener("click", exportText);
$("#compare").addEventListener("click", runCompare);
document.addEventListener("keydown", (e) => {
  if ((e.ctrlKey || e.metaKey) && e.key === "Enter" && !$("#generate").disabled) { e.preventDefault(); generate(); }
});
$("#check").addEventListener("change", () => { if ($("#check").checked) runCheck(); else { checks = {}; renderRequests(); } });
main();
