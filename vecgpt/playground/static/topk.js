// The "Attention policy" box: the page's text begun again (its prompt, temperature, Top-k and seed) under a policy
// (POST /api/texts/{id}/policy: K or beta between the first S positions and the last W, each query's own key
// always kept), generated to as many tokens through the same event stream as any text (so it steps with the other
// texts in flight), shown beside the text with the positions where they differ marked; its requests per token with
// keys returned and values read, the keys kept per head and (beta) the most weight the dropped keys could hold.
// A token of the policy text clicked: its inspection (inspect.js), the keys its policy kept marked.
"use strict";
let topk = null;  // {basis: the text's id and generated ids, view: the policy text's view, policy, costs, source}
const POLICY_INPUTS = { attention_top_k: "#topk-k", attention_threshold: "#topk-beta",
  attention_sinks: "#topk-sinks", attention_window: "#topk-window" };

function generatedIds(v) { return v.tokens.slice(v.prompt_len).map((t) => t.id); }

function sameBasis(b) {
  return view && b.id === view.id && b.ids.join(",") === generatedIds(view).join(",");
}

function closeTopk() {
  if (!topk) return;
  if (topk.source) topk.source.close();
  if (topk.view) call("DELETE", `/api/texts/${topk.view.id}`).catch(() => {});  // an idle text is closed anyway
  topk = null;
  $("#topk-cols").hidden = $("#topk-requests").hidden = true;
  $("#topk-info").textContent = $("#topk-text").textContent = "";  // an inspection of its tokens goes too
  delete document.body.dataset.topk;
}

// The box's fields as the route takes them: an empty field left out (unset); a number as a number, anything
// else as typed, for the server to name.
function policyBody() {
  const out = {};
  for (const [name, sel] of Object.entries(POLICY_INPUTS)) {
    const raw = $(sel).value.trim();
    if (raw !== "") out[name] = Number.isFinite(Number(raw)) ? Number(raw) : raw;
  }
  return out;
}

function topkFailed(mine, e) {
  if (topk === mine) topk = null;
  showError("#topk-error", e);
  document.body.dataset.topk = "error";
}

async function runTopk() {
  showError("#topk-error", null);
  closeTopk();
  delete document.body.dataset.topk;
  const n = view.tokens.length - view.prompt_len;
  if (n < 1) { showError("#topk-error", new Error("generate some tokens first")); return; }
  const mine = { basis: { id: view.id, ids: generatedIds(view) }, view: null, policy: null, costs: {}, source: null };
  topk = mine;
  $("#topk-run").disabled = true;
  try {
    mine.view = await call("POST", `/api/texts/${view.id}/policy`, policyBody());
  } catch (e) {
    topkFailed(mine, e);
    $("#topk-run").disabled = false;
    return;
  }
  if (topk !== mine) { call("DELETE", `/api/texts/${mine.view.id}`).catch(() => {}); return; }
  mine.policy = policyOf(mine.view.settings);
  renderTopk();
  streamTopk(mine, n);
}

function streamTopk(mine, n) {
  const source = new EventSource(`/api/texts/${mine.view.id}/generate?n=${n}`);
  mine.source = source;
  source.addEventListener("token", (ev) => {
    const t = JSON.parse(ev.data);
    mine.costs[t.position] = t.cost;
    mine.view.tokens = mine.view.tokens.slice(0, t.position).concat([t]);
    if (topk === mine) renderTopk();
  });
  const end = () => { source.close(); mine.source = null; $("#topk-run").disabled = !view; };
  source.addEventListener("done", () => {
    end();
    if (topk !== mine) return;
    renderTopk();
    document.body.dataset.topk = `${mine.view.id}:${policyLabel(mine.policy)}`;
  });
  source.addEventListener("error", (ev) => {
    let message = "the server stopped the stream";
    try { message = JSON.parse(ev.data).error; } catch (_) { /* a dropped connection has no data */ }
    end();
    if (topk === mine) topkFailed(mine, new Error(message));
  });
}

function topkSpans(box, v, other, inspectable) {
  box.textContent = "";
  const prompt = document.createElement("span");
  prompt.className = "prompt";
  prompt.textContent = v.tokens.slice(0, v.prompt_len).map((t) => t.text).join("");
  box.appendChild(prompt);
  let first = true;
  for (const t of v.tokens.slice(v.prompt_len)) {
    const s = document.createElement("span");
    s.textContent = t.text.replace(/\n/g, "\u21b5\n");
    s.dataset.position = t.position; s.dataset.token = t.id;
    const theirs = other[t.position - v.prompt_len];
    if (theirs !== undefined && theirs !== t.id) {
      s.classList.add("differs");
      if (first) { s.classList.add("first-diff"); first = false; }
    }
    if (inspectable) s.addEventListener("click", () => inspectAt(t.position, v.id, "#topk-text"));
    box.appendChild(s);
  }
}

function renderTopk() {
  const mine = topk.view, full = generatedIds(view), ids = generatedIds(mine);
  $("#topk-cols").hidden = $("#topk-requests").hidden = false;
  const own = policyOf(view.settings);
  $("#topk-full-title").textContent = policyActive(own) ? `the text (${policyText(own)})` : "full attention";
  $("#topk-title").textContent = policyText(topk.policy);
  topkSpans($("#topk-full"), view, ids, false);
  topkSpans($("#topk-text"), mine, full, true);
  const differ = ids.filter((id, i) => id !== full[i]).length, at = ids.findIndex((id, i) => id !== full[i]);
  const sum = (f) => Object.values(topk.costs).reduce((a, c) => a + ((c.scores || {})[f] || 0), 0);
  $("#topk-info").textContent = `${ids.length} of ${full.length} tokens: ${differ} differ`
    + (at >= 0 ? `, first at position ${mine.prompt_len + at}` : "")
    + `; ${fmtInt(sum("returned"))} keys returned, ${fmtInt(sum("values"))} values read` + keptSoFar();
  $("#topk-info").dataset.differ = differ;
  topkRequests();
}

// The text's searches so far, as the meter sums them (the last token's cost): the earlier keys each head's queries
// kept on average, and under a threshold the most weight its dropped keys could have held in any query.
function keptSoFar() {
  const last = Object.keys(topk.costs).map(Number).sort((x, y) => y - x)[0], c = topk.costs[last] || {};
  const kept = c.kept_per_head ? c.kept_per_head.reduce((x, y) => x + y, 0) / c.kept_per_head.length : null;
  if (kept !== null) $("#topk-info").dataset.keptPerHead = kept;
  if (c.dropped_bound !== undefined) $("#topk-info").dataset.droppedBound = c.dropped_bound;
  return (kept === null ? "" : `; earlier keys kept per head and query: ${kept.toFixed(2)} on average`)
    + (c.dropped_bound === undefined ? "" : `; the dropped keys held at most ${weightText(c.dropped_bound)} of a query's weight`);
}

function topkRequests() {
  const body = $("#topk-requests tbody"), v = topk.view;
  body.textContent = "";
  for (const t of v.tokens.slice(v.prompt_len)) {
    const c = topk.costs[t.position], s = (c && c.scores) || {}, tr = body.insertRow();
    tr.dataset.requestsPosition = t.position;
    const cells = [t.position, JSON.stringify(t.text), c ? c.total : "", c ? c.round_trips : "",
      c ? `${s.store ?? 0} / ${s.memory ?? 0}` : "", c ? s.returned ?? 0 : "", c ? s.values ?? 0 : "",
      c ? (1000 * c.seconds).toFixed(1) : ""];
    cells.forEach((x) => { tr.insertCell().textContent = x; });
    if (c) { tr.dataset.returned = s.returned ?? 0; tr.dataset.values = s.values ?? 0; }
  }
}

// The text changed (a new one, more tokens, a step back): the comparison no longer holds.
new MutationObserver(() => {
  if (topk && !sameBasis(topk.basis)) closeTopk();
  $("#topk-run").disabled = !view || view.tokens.length <= view.prompt_len || Boolean(topk && topk.source)
    || Boolean(document.body.dataset.generating);
}).observe($("#text"), { childList: true });
$("#topk-run").addEventListener("click", runTopk);
