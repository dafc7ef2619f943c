// Shared helpers of both pages: JSON calls that turn a server's {"error": ...} into one line on the page.
"use strict";
const $ = (sel) => document.querySelector(sel);
const fmtInt = (n) => Number(n).toLocaleString("en-US");
const fmtNum = (x, d = 6) => (x === null || x === undefined ? "-" : Number(x).toPrecision(d));

function human(n) {
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (Math.abs(n) >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return i === 0 ? `${n.toFixed(0)} B` : `${n.toFixed(1)} ${units[i]}`;
}

async function call(method, url, body) {
  const init = { method, headers: {} };
  if (method !== "GET") { init.body = JSON.stringify(body ?? {}); init.headers["Content-Type"] = "application/json"; }
  let response;
  try { response = await fetch(url, init); } catch (e) { throw new Error("the server cannot be reached"); }
  const data = await response.json().catch(() => ({ error: `the server answered ${response.status}` }));
  if (!response.ok) throw new Error(data.error || `the server answered ${response.status}`);
  return data;
}

function showError(id, e) { $(id).textContent = e ? (e.message || String(e)) : ""; }
