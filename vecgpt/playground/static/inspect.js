// Attention and the logit lens of a clicked token (GET /api/texts/{id}/attention/{position}): the token is read
// again by the server, as the text read it, writing nothing. A summary per head (its most attended positions),
// the heatmap (a row per layer and head, positions across, in a scrolling box) and the lens (each layer's top 5
// tokens, each a top-k search of the token table).
"use strict";
const INSPECT_ALL_CELLS = 40000;  // above this many cells the heatmap draws one layer at a time (a select)
let inspected = null;  // the last answer shown, and the text it belongs to
let keptK = 8;  // the K whose top-K keys the heatmap marks

function inspectTextId() { return new URLSearchParams(location.search).get("text"); }

async function inspectAt(position) {
  const box = $("#inspect"), id = inspectTextId();
  if (!box || !id) return;
  document.querySelectorAll("#text .inspected").forEach((el) => el.classList.remove("inspected"));
  const el = document.querySelector(`#text [data-position="${position}"]`);
  if (el) el.classList.add("inspected");
  box.innerHTML = `<h3>Position ${position}: attention and logit lens</h3><p class="muted">reading it again&hellip;</p>`;
  delete document.body.dataset.inspected;
  let a;
  try {
    a = await call("GET", `/api/texts/${encodeURIComponent(id)}/attention/${position}`);
  } catch (e) {
    box.innerHTML = `<div class="error" id="inspect-error" role="alert"></div>`;
    showError("#inspect-error", e);
    document.body.dataset.inspected = `error:${position}`;
    return;
  }
  inspected = { id, a };
  if (a.attention_top_k) keptK = a.attention_top_k;  // a top-k text: what its own searches kept
  renderInspection(box, a);
  document.body.dataset.inspected = `${id}:${position}`;
}

function renderInspection(box, a) {
  box.innerHTML = "";
  const h = document.createElement("h3");
  h.textContent = `Position ${a.position} ${JSON.stringify(a.token.text)}: attention and logit lens`;
  const cost = document.createElement("p");
  cost.className = "muted"; cost.id = "inspect-cost";
  const c = a.cost || {}, kinds = c.by_kind || {};
  cost.textContent = `read again, nothing written: ${c.total ?? 0} requests in ${c.round_trips ?? 0} rounds `
    + `(${kinds.key_search ?? 0} key searches; the lens: ${a.lens_searches} token searches, top 5 each, in one round)`;
  box.append(h, cost, lensTable(a), summaryTable(a), keptControls(), heatmapControls(a));
  const hover = document.createElement("p");
  hover.id = "inspect-hover"; hover.className = "muted";
  hover.textContent = "hover a cell: the key's position and token, q.k and the weight";
  const scroll = document.createElement("div");
  scroll.id = "heatmap-box";
  box.append(hover, scroll);
  drawHeatmap(a, defaultLayer(a));
  showKept(a);
}

// Top-k attention: the positions a top-K key search keeps for each head (its K best earlier positions by the q.k
// shown, and the position itself) and the share of the head's weight they hold.
function keptControls() {
  const wrap = document.createElement("div");
  wrap.className = "scroll";
  const p = document.createElement("p");
  const input = document.createElement("input");
  input.id = "inspect-k"; input.type = "number"; input.min = "1"; input.value = String(keptK);
  input.addEventListener("input", () => {
    const k = Number(input.value);
    if (!Number.isInteger(k) || k < 1 || !inspected) return;
    keptK = k;
    showKept(inspected.a);
  });
  const label = document.createElement("label");
  label.append("Top-K keys: K ", input);
  p.append(label, "marked in the heatmap: each head's K best earlier positions by q.k and the position itself; "
    + "below, the share of the head's weight they hold, and the mean over a layer's heads.");
  const t = document.createElement("table");
  t.id = "topk-mass";
  wrap.append(p, t);
  return wrap;
}

function keptPositions(r, k, position) {
  const earlier = r.scores.slice(0, position).map((x, j) => [x ?? -Infinity, j])
    .sort((x, y) => (y[0] === x[0] ? x[1] - y[1] : y[0] - x[0]));
  return new Set(earlier.slice(0, k).map(([, j]) => j).concat([position]));
}

function showKept(a) {
  const t = $("#topk-mass"), rows = {};
  const heads = Array.from({ length: a.n_head }, (_, i) => `<th>head ${i}</th>`).join("");
  t.innerHTML = `<tr><th>layer</th>${heads}<th>mean</th></tr>`;
  const sums = {};
  for (const r of a.attention) {
    const kept = keptPositions(r, keptK, a.position);
    const mass = r.weights.reduce((m, w, j) => (kept.has(j) ? m + w : m), 0);
    if (!rows[r.layer]) { rows[r.layer] = t.insertRow(); rows[r.layer].insertCell().textContent = r.layer; sums[r.layer] = []; }
    sums[r.layer].push(mass);
    const td = rows[r.layer].insertCell();
    td.dataset.massLayer = r.layer; td.dataset.massHead = r.head; td.dataset.mass = mass;
    td.textContent = mass.toFixed(4);
    td.title = `layer ${r.layer} head ${r.head}: ${kept.size} positions kept of ${r.weights.length}`;
    document.querySelectorAll(`#heatmap .hm-cell[data-layer="${r.layer}"][data-head="${r.head}"]`).forEach((cell) => {
      const on = kept.has(Number(cell.dataset.keyPosition));
      cell.classList.toggle("kept", on);
      if (on) cell.dataset.kept = "1"; else delete cell.dataset.kept;
    });
  }
  for (const [layer, masses] of Object.entries(sums)) {
    const td = rows[layer].insertCell(), mean = masses.reduce((x, y) => x + y, 0) / masses.length;
    td.dataset.massMean = mean; td.dataset.massLayer = layer;
    td.textContent = mean.toFixed(4);
  }
  document.body.dataset.kept = `${a.position}:${keptK}`;
}

function lensTable(a) {
  const wrap = document.createElement("div");
  wrap.className = "scroll";
  const t = document.createElement("table");
  t.id = "lens";
  t.innerHTML = "<tr><th>after layer</th><th class='txt' colspan=5>top 5 next tokens of ln_f(residual) (logit)</th></tr>";
  for (const row of a.lens) {
    const tr = t.insertRow();
    tr.dataset.lensLayer = row.layer;
    tr.dataset.lensTop = row.tokens[0].id;
    tr.insertCell().textContent = row.layer;
    for (const [i, tok] of row.tokens.entries()) {
      const td = tr.insertCell();
      td.className = i === 0 ? "txt top" : "txt";
      td.dataset.token = tok.id;
      td.textContent = `${JSON.stringify(tok.text)} ${tok.logit.toFixed(2)}`;
      td.title = `token ${tok.id}, logit ${tok.logit}`;
    }
  }
  const note = document.createElement("p");
  note.className = "muted"; note.id = "lens-next";
  const last = a.lens[a.lens.length - 1].tokens[0];
  note.textContent = a.next
    ? `The text's own top candidate for position ${a.position + 1}: ${JSON.stringify(a.next.text)}`
      + (a.next.id === last.id ? " (the last layer's lens token)" : ` (the last layer's lens says ${JSON.stringify(last.text)})`)
    : `After the last layer the lens is the model's own next-token search (top ${JSON.stringify(last.text)}).`;
  wrap.append(t, note);
  return wrap;
}

// For each head, its three most attended positions: readable at any length.
function summaryTable(a) {
  const t = document.createElement("table");
  t.id = "attention-summary";
  const heads = Array.from({ length: a.n_head }, (_, i) => `<th>head ${i}</th>`).join("");
  t.innerHTML = `<tr><th>layer</th>${heads}</tr>`;
  const rows = {};
  for (const r of a.attention) {
    if (!rows[r.layer]) { rows[r.layer] = t.insertRow(); rows[r.layer].insertCell().textContent = r.layer; }
    const td = rows[r.layer].insertCell();
    td.className = "txt";
    td.dataset.summaryLayer = r.layer; td.dataset.summaryHead = r.head;
    const top = r.weights.map((w, j) => [w, j]).sort((x, y) => y[0] - x[0]).slice(0, 3);
    td.dataset.top = top.map(([, j]) => j).join(",");
    td.textContent = top.map(([w, j]) => `${j} ${JSON.stringify(a.keys[j].text)} ${weightText(w)}`).join("\n");
  }
  const wrap = document.createElement("div");
  wrap.className = "scroll";
  const p = document.createElement("p");
  p.className = "muted";
  p.textContent = "Each head's three most attended positions: position, token, weight.";
  wrap.append(p, t);
  return wrap;
}

const weightText = (w) => (w >= 0.01 ? w.toFixed(2) : w.toPrecision(2));

function defaultLayer(a) {
  return a.attention.length * a.keys.length <= INSPECT_ALL_CELLS ? "all" : "0";
}

function heatmapControls(a) {
  const p = document.createElement("p");
  const select = document.createElement("select");
  select.id = "heatmap-layer";
  select.add(new Option("every layer", "all"));
  for (let l = 0; l < a.n_layer; l++) select.add(new Option(`layer ${l}`, String(l)));
  select.value = defaultLayer(a);
  select.addEventListener("change", () => { drawHeatmap(inspected.a, select.value); showKept(inspected.a); });
  const label = document.createElement("label");
  label.append("Heatmap ", select);
  p.append(label, " a row per layer and head, a column per position; shade: the weight over the head's largest. ");
  return p;
}

function drawHeatmap(a, layer) {
  const box = $("#heatmap-box"), n = a.keys.length, wide = n <= 48;
  box.textContent = "";
  const grid = document.createElement("div");
  grid.id = "heatmap";
  grid.className = wide ? "wide" : "narrow";
  const head = document.createElement("div");
  head.className = "hm-row hm-keys";
  head.appendChild(hmLabel(""));
  for (const k of a.keys) {
    const s = document.createElement("span");
    s.className = "hm-key";
    s.textContent = wide ? k.text.replace(/\n/g, "\u21b5") : (k.position % 16 === 0 ? String(k.position) : "");
    s.title = `${k.position} ${JSON.stringify(k.text)}`;
    head.appendChild(s);
  }
  grid.appendChild(head);
  for (const r of a.attention) {
    if (layer !== "all" && String(r.layer) !== layer) continue;
    grid.appendChild(heatmapRow(a, r));
  }
  box.appendChild(grid);
}

function hmLabel(text, href) {
  const s = document.createElement(href ? "a" : "span");
  s.className = "hm-label";
  s.textContent = text;
  if (href) { s.href = href; s.title = "walk this head's softmax step by step on the attention page"; }
  return s;
}

function walkHref(a, r) {  // the head's softmax inputs, q.k x scale, on the streaming-attention page
  const kept = r.scores.filter((x) => x !== null);  // a top-k text's head: the keys its search returned
  return `/attention?${new URLSearchParams({ scores: kept.map((x) => String(x * a.scale)).join(",") })}#walk-it`;
}

function heatmapRow(a, r) {
  const row = document.createElement("div");
  row.className = r.head === 0 ? "hm-row hm-layer" : "hm-row";
  row.appendChild(hmLabel(`L${r.layer} H${r.head}`, walkHref(a, r)));
  const most = Math.max(...r.weights) || 1;
  r.weights.forEach((w, j) => {
    const s = document.createElement("span");
    s.className = "hm-cell";
    s.dataset.layer = r.layer; s.dataset.head = r.head; s.dataset.keyPosition = j; s.dataset.weight = w;
    s.style.backgroundColor = `rgba(42, 91, 215, ${(w / most).toFixed(3)})`;
    s.title = cellText(a, r, j);
    row.appendChild(s);
  });
  return row;
}

function cellText(a, r, j) {
  return `layer ${r.layer} head ${r.head}, position ${j} ${JSON.stringify(a.keys[j].text)}: `
    + `q.k ${r.scores[j] === null ? "not returned (top-k attention)" : r.scores[j].toPrecision(6)}, `
    + `weight ${r.weights[j].toPrecision(6)}`;
}

document.addEventListener("click", (e) => {
  const el = e.target.closest && e.target.closest("#text [data-position]");
  if (el) inspectAt(Number(el.dataset.position));
});
document.addEventListener("mouseover", (e) => {
  const cell = e.target.closest && e.target.closest("#heatmap .hm-cell");
  if (!cell || !inspected) return;
  const r = inspected.a.attention.find((x) => x.layer === Number(cell.dataset.layer) && x.head === Number(cell.dataset.head));
  $("#inspect-hover").textContent = cellText(inspected.a, r, Number(cell.dataset.keyPosition));
});
// A new text, or a step back past the inspected position: what is shown no longer belongs to the page.
new MutationObserver(() => {
  if (!inspected) return;
  const gone = !document.querySelector(`#text [data-position="${inspected.a.position}"]`);
  if (inspected.id !== inspectTextId() || gone) { $("#inspect").textContent = ""; inspected = null; }
}).observe($("#text"), { childList: true });
