// Attention and the logit lens of a clicked token (GET /api/texts/{id}/attention/{position}): the token is read
// again by the server, as the text read it, writing nothing. A summary per head (its most attended positions),
// the heatmap (a row per layer and head, positions across, in a scrolling box) and the lens (each layer's top 5
// tokens, each a top-k search of the token table).
"use strict";
const INSPECT_ALL_CELLS = 40000;  // above this many cells the heatmap draws one layer at a time (a select)
let inspected = null;  // the last answer shown, and the text it belongs to
let keptPolicy = { attention_top_k: 8 };  // the policy whose kept keys the heatmap marks (a text's own: its own)

function inspectTextId() { return new URLSearchParams(location.search).get("text"); }

// `where`: the box holding the token (#text, or #topk-text for the policy box's text, whose id is `id`).
async function inspectAt(position, id = inspectTextId(), where = "#text") {
  const box = $("#inspect");
  if (!box || !id) return;
  document.querySelectorAll(".inspected").forEach((el) => el.classList.remove("inspected"));
  const el = document.querySelector(`${where} [data-position="${position}"]`);
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
  inspected = { id, a, where };
  if (policyActive(a.policy)) keptPolicy = { ...a.policy };  // a policy's text: what its own searches kept
  renderInspection(box, a);
  document.body.dataset.inspected = `${id}:${position}`;
}

function renderInspection(box, a) {
  box.innerHTML = "";
  const h = document.createElement("h3");
  const whose = inspected.where === "#text" ? "" : ` of the ${policyText(a.policy)} text`;
  h.textContent = `Position ${a.position} ${JSON.stringify(a.token.text)}${whose}: attention and logit lens`;
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

// Attention policies (vecgpt/policy.py): a policy as the API spells it, {attention_top_k, attention_threshold,
// attention_sinks, attention_window}, null where unset. The heatmap marks the keys a policy keeps for each head:
// the text's own policy, the keys its searches returned (their q.k shown, the rest weight 0), or any other policy,
// what it would keep of this read; and per head the share of the weight they hold.
const POLICY_FIELDS = ["attention_top_k", "attention_threshold", "attention_sinks", "attention_window"];
const POLICY_NAMES = { attention_top_k: "K", attention_threshold: "\u03b2", attention_sinks: "S", attention_window: "W" };
const POLICY_IDS = { attention_top_k: "inspect-k", attention_threshold: "inspect-beta",
  attention_sinks: "inspect-sinks", attention_window: "inspect-window" };

function policyOf(settings) { return Object.fromEntries(POLICY_FIELDS.map((f) => [f, (settings || {})[f] ?? null])); }
function policyActive(p) { return Boolean(p) && POLICY_FIELDS.some((f) => p[f] !== null && p[f] !== undefined); }
function policyLabel(p) {  // K alone: "K"; else "K,beta,S,W" with unset fields empty, trailing ones dropped
  const v = POLICY_FIELDS.map((f) => String(p[f] ?? ""));
  while (v.length && v[v.length - 1] === "") v.pop();
  return v.join(",");
}
function policyText(p) {
  const set = POLICY_FIELDS.filter((f) => p && p[f] !== null && p[f] !== undefined);
  return set.length ? `policy ${set.map((f) => `${POLICY_NAMES[f]} = ${p[f]}`).join(", ")}` : "full attention";
}

// [a, b): the positions a query at position i chooses between (Policy.middle); before a: sinks, from b: window.
function policyMiddle(p, i) {
  const a = Math.min(p.attention_sinks ?? 0, i);
  return [a, Math.max(a, i - (p.attention_window ?? 0))];
}

function why(j, i, a, b) { return j === i ? "own" : j < a ? "sink" : j >= b ? "window" : "between"; }

// What policy p keeps of a query at position i (Policy.kept): position -> why, from the q.k shown (x scale).
function policyKept(p, scores, i, scale) {
  const [a, b] = policyMiddle(p, i), kept = new Map();
  for (let j = 0; j <= i; j++) if (j < a || j >= b) kept.set(j, why(j, i, a, b));
  const between = [];
  for (let j = a; j < b; j++) between.push([(scores[j] ?? -Infinity) * scale, j]);
  let chosen = [];
  if (between.length && p.attention_top_k !== null && p.attention_top_k !== undefined) {
    chosen = between.sort((x, y) => (y[0] === x[0] ? x[1] - y[1] : y[0] - x[0])).slice(0, p.attention_top_k);
  } else if (between.length && p.attention_threshold !== null && p.attention_threshold !== undefined) {
    const best = Math.max(...between.map(([x]) => x));
    chosen = between.filter(([x]) => x >= best - p.attention_threshold);
  }
  chosen.forEach(([, j]) => kept.set(j, "between"));
  return kept;
}

// What the text's own policy kept: the keys its searches returned (a q.k), each with why.
function textKept(a, r) {
  const [s, b] = policyMiddle(a.policy, a.position), kept = new Map();
  r.scores.forEach((x, j) => { if (x !== null) kept.set(j, why(j, a.position, s, b)); });
  return kept;
}

const ownMarks = (a) => policyActive(a.policy) && policyLabel(keptPolicy) === policyLabel(a.policy);

function keptControls() {
  const wrap = document.createElement("div");
  wrap.className = "scroll";
  const p = document.createElement("p");
  p.append("Kept keys: ");
  for (const f of POLICY_FIELDS) {
    const input = document.createElement("input");
    input.id = POLICY_IDS[f]; input.type = "number"; input.min = f === "attention_top_k" ? "1" : "0";
    if (f === "attention_threshold") input.step = "0.5";
    input.value = keptPolicy[f] ?? "";
    input.addEventListener("input", readKeptPolicy);
    const label = document.createElement("label");
    label.append(`${POLICY_NAMES[f]} `, input);
    p.append(label);
  }
  const bad = document.createElement("span");
  bad.className = "error"; bad.id = "inspect-policy-error";
  p.append(bad);
  const legend = document.createElement("p");
  legend.className = "muted";
  legend.innerHTML = "Outlined in the heatmap: <span class='swatch kept-sink'></span> the first S positions, "
    + "<span class='swatch kept-window'></span> the last W and the position itself, <span class='swatch kept'></span> "
    + "between them the K best by q.k or every key within &beta; of the best (K or &beta;, not both; empty: unset). "
    + "Below: the share of each head's weight they hold, and under &beta; the most the dropped keys could hold.";
  const note = document.createElement("p");
  note.className = "muted"; note.id = "kept-note";
  const t = document.createElement("table");
  t.id = "topk-mass";
  wrap.append(p, legend, note, t);
  return wrap;
}

function readKeptPolicy() {
  const next = {}, whole = (x) => Number.isInteger(x) && x >= 0;
  for (const f of POLICY_FIELDS) {
    const raw = $(`#${POLICY_IDS[f]}`).value.trim(), x = Number(raw);
    if (raw === "") { next[f] = null; continue; }
    const ok = f === "attention_threshold" ? Number.isFinite(x) && x >= 0 : whole(x) && (f !== "attention_top_k" || x >= 1);
    if (!ok) return;  // being typed
    next[f] = x;
  }
  const both = next.attention_top_k !== null && next.attention_threshold !== null;
  $("#inspect-policy-error").textContent = both ? " K or \u03b2, not both" : "";
  if (both || !inspected) return;
  keptPolicy = next;
  showKept(inspected.a);
}

function showKept(a) {
  const t = $("#topk-mass"), rows = {}, sums = {}, own = ownMarks(a), beta = keptPolicy.attention_threshold;
  const heads = Array.from({ length: a.n_head }, (_, i) => `<th>${headName(a, i)}</th>`).join("");
  t.innerHTML = `<tr><th>layer</th>${heads}<th>mean</th></tr>`;
  for (const r of a.attention) {
    const kept = own ? textKept(a, r) : policyKept(keptPolicy, r.scores, a.position, a.scale);
    const mass = r.weights.reduce((m, w, j) => (kept.has(j) ? m + w : m), 0);
    if (!rows[r.layer]) { rows[r.layer] = t.insertRow(); rows[r.layer].insertCell().textContent = r.layer; sums[r.layer] = []; }
    sums[r.layer].push(mass);
    massCell(rows[r.layer].insertCell(), a, r, kept, mass, beta);
    document.querySelectorAll(`#heatmap .hm-cell[data-layer="${r.layer}"][data-head="${r.head}"]`).forEach((cell) => {
      markCell(cell, kept.get(Number(cell.dataset.keyPosition)));
    });
  }
  for (const [layer, masses] of Object.entries(sums)) {
    const td = rows[layer].insertCell(), mean = masses.reduce((x, y) => x + y, 0) / masses.length;
    td.dataset.massMean = mean; td.dataset.massLayer = layer;
    td.textContent = mean.toFixed(4);
  }
  keptNote(a, own);
  document.body.dataset.kept = `${a.position}:${policyLabel(keptPolicy)}`;
}

function markCell(cell, kind) {
  cell.classList.remove("kept", "kept-sink", "kept-window", "kept-between");
  delete cell.dataset.kept; delete cell.dataset.keptAs;
  if (!kind) return;
  cell.classList.add("kept", `kept-${kind === "own" ? "window" : kind}`);
  cell.dataset.kept = "1"; cell.dataset.keptAs = kind;
}

// A head's share of the weight held by its kept keys; under beta, the most its dropped keys could hold at this
// query: n e^-beta / (1 + n e^-beta) of n dropped (vecgpt.policy.dropped_bound).
function massCell(td, a, r, kept, mass, beta) {
  const count = (k) => [...kept.values()].filter((x) => x === k).length;
  const [s, b] = policyMiddle(keptPolicy, a.position), dropped = b - s - count("between");
  td.dataset.massLayer = r.layer; td.dataset.massHead = r.head; td.dataset.mass = mass;
  td.textContent = mass.toFixed(4);
  td.title = `layer ${r.layer} head ${r.head}: ${kept.size} of ${r.weights.length} positions kept: `
    + `${count("sink")} sinks, ${count("window")} window and its own, ${count("between")} between; `
    + `${dropped} dropped`;
  if (beta === null || beta === undefined) return;
  const worst = dropped * Math.exp(-beta), bound = worst / (1 + worst);
  td.dataset.bound = bound;
  td.append(document.createElement("br"), `dropped \u2264 ${weightText(bound)}`);
}

function keptNote(a, own) {
  const c = a.cost || {}, per = c.kept_per_head;
  const kept = per ? per.reduce((x, y) => x + y, 0) / per.length : null;
  $("#kept-note").textContent = (own
    ? `Marked: the keys this text's ${policyText(a.policy)} kept, as its searches returned them (a key left out has `
      + "no q.k and weight 0, so they hold all of a head's weight)."
    : `Marked: what ${policyText(keptPolicy)} would keep of this read; the weight they hold is their share of it.`)
    + (kept === null ? "" : ` The text's searches so far kept ${kept.toFixed(2)} earlier keys per head and query`)
    + (c.dropped_bound === undefined ? (kept === null ? "" : ".")
      : `; its dropped keys held at most ${weightText(c.dropped_bound)} of any query's weight (dropped_bound).`);
  if (c.dropped_bound !== undefined) $("#kept-note").dataset.droppedBound = c.dropped_bound;
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
  const heads = Array.from({ length: a.n_head }, (_, i) => `<th>${headName(a, i)}</th>`).join("");
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
  const kept = r.scores.filter((x) => x !== null);  // a policy's text: the keys its policy kept
  return `/attention?${new URLSearchParams({ scores: kept.map((x) => String(x * a.scale)).join(",") })}#walk-it`;
}

function heatmapRow(a, r) {
  const row = document.createElement("div");
  row.className = r.head === 0 ? "hm-row hm-layer" : "hm-row";
  row.appendChild(hmLabel(`L${r.layer} ${headName(a, r.head, true)}`, walkHref(a, r)));
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

// A query head's name; where query heads share key heads (a Llama's grouped-query attention), the key head it reads.
function headName(a, h, short) {
  const grouped = a.key_heads && new Set(a.key_heads).size < a.n_head;
  if (!grouped) return short ? `H${h}` : `head ${h}`;
  return short ? `H${h}/K${a.key_heads[h]}` : `head ${h} (key head ${a.key_heads[h]})`;
}

function cellText(a, r, j) {
  return `layer ${r.layer} ${headName(a, r.head)}, position ${j} ${JSON.stringify(a.keys[j].text)}: `
    + `q.k ${r.scores[j] === null ? "none: the text's attention policy left it out" : r.scores[j].toPrecision(6)}, `
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
// A new text, a step back past the inspected position, the policy box's text gone: what is shown no longer belongs.
function inspectedGone() {
  const mine = inspected.where === "#text" ? inspectTextId() : topk && topk.view && topk.view.id;
  return inspected.id !== mine || !document.querySelector(`${inspected.where} [data-position="${inspected.a.position}"]`);
}
const inspectWatch = new MutationObserver(() => {
  if (inspected && inspectedGone()) { $("#inspect").textContent = ""; inspected = null; }
});
for (const sel of ["#text", "#topk-text"]) if ($(sel)) inspectWatch.observe($(sel), { childList: true });
