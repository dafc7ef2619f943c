// The "Top-k attention" box: the page's text begun again (its prompt, temperature, Top-k and seed) with each query
// attending to its own key and its K best earlier keys (POST /api/texts/{id}/top-k), generated to as many tokens
// through the same event stream as any text (so it steps with the other texts in flight), shown beside the text
// with the positions where they differ marked; its requests per token with keys returned and values read.
"use strict";
let topk = null;  // {basis: the text's id and generated ids, view: the top-k text's view, k, costs, source}

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
  delete document.body.dataset.topk;
}

async function runTopk() {
  showError("#topk-error", null);
  closeTopk();
  delete document.body.dataset.topk;
  const k = Number($("#topk-k").value), n = view.tokens.length - view.prompt_len;
  if (n < 1) { showError("#topk-error", new Error("generate some tokens first")); return; }
  const mine = { basis: { id: view.id, ids: generatedIds(view) }, view: null, k, costs: {}, source: null };
  topk = mine;
  $("#topk-run").disabled = true;
  try {
    mine.view = await call("POST", `/api/texts/${view.id}/top-k`, { attention_top_k: Number.isInteger(k) ? k : $("#topk-k").value });
  } catch (e) {
    if (topk === mine) topk = null;
    showError("#topk-error", e);
    document.body.dataset.topk = "error";
    $("#topk-run").disabled = false;
    return;
  }
  if (topk !== mine) { call("DELETE", `/api/texts/${mine.view.id}`).catch(() => {}); return; }
  renderTopk();
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
    document.body.dataset.topk = `${mine.view.id}:${mine.k}`;
  });
  source.addEventListener("error", (ev) => {
    let message = "the server stopped the stream";
    try { message = JSON.parse(ev.data).error; } catch (_) { /* a dropped connection has no data */ }
    end();
    if (topk !== mine) return;
    showError("#topk-error", new Error(message));
    document.body.dataset.topk = "error";
  });
}

function topkSpans(box, v, other) {
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
    box.appendChild(s);
  }
}

function renderTopk() {
  const mine = topk.view, full = generatedIds(view), ids = generatedIds(mine);
  $("#topk-cols").hidden = $("#topk-requests").hidden = false;
  const k = view.settings.attention_top_k;
  $("#topk-full-title").textContent = k ? `the text (top-k, K = ${k})` : "full attention";
  $("#topk-title").textContent = `top-k attention, K = ${topk.k}`;
  topkSpans($("#topk-full"), view, ids);
  topkSpans($("#topk-text"), mine, full);
  const differ = ids.filter((id, i) => id !== full[i]).length, at = ids.findIndex((id, i) => id !== full[i]);
  const sum = (f) => Object.values(topk.costs).reduce((a, c) => a + ((c.scores || {})[f] || 0), 0);
  $("#topk-info").textContent = `${ids.length} of ${full.length} tokens: ${differ} differ`
    + (at >= 0 ? `, first at position ${mine.prompt_len + at}` : "")
    + `; ${fmtInt(sum("returned"))} keys returned, ${fmtInt(sum("values"))} values read`;
  $("#topk-info").dataset.differ = differ;
  topkRequests();
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
