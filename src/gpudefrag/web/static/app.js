// gpudefrag dashboard. Plain JS, no build step, no CDN. Every piece of cluster data (workload and node names,
// reasons, summaries) reaches the page through textContent or attributes via el(): never innerHTML.
"use strict";

const $ = (id) => document.getElementById(id);
const SVG = "http://www.w3.org/2000/svg";

const ui = {
  config: null,
  summary: null,
  workloads: new Map(), // id -> info (for names and the detail panel)
  selectedPending: null,
  selectedWorkload: null,
  planVersion: null,
  offset: 0,
  limit: 500,
  refreshing: null, // the refresh in flight (a promise), or null
  refreshAgain: false, // asked for while one was in flight: run once more after it
};

// ------------------------------------------------------------------------------------------ DOM helpers
function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k === "class") node.className = v;
    else if (k === "dataset") Object.assign(node.dataset, v);
    else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else node.setAttribute(k, v === true ? "" : String(v));
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined || c === false) continue;
    node.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return node;
}

function svg(tag, attrs, text) {
  const node = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, String(v));
  if (text !== undefined) node.textContent = text;
  return node;
}

function clear(node) {
  while (node.firstChild) node.removeChild(node.firstChild);
  return node;
}

function status(message, isError) {
  const s = $("status");
  s.textContent = message || "";
  s.classList.toggle("error", Boolean(isError));
}

// A stable colour per workload id, so the before/after maps and every refresh agree.
function colour(id) {
  let h = 2166136261;
  for (let i = 0; i < id.length; i++) h = Math.imul(h ^ id.charCodeAt(i), 16777619);
  const hue = (h >>> 0) % 360;
  const light = 38 + ((h >>> 9) % 3) * 8;
  return `hsl(${hue}, 62%, ${light}%)`;
}

function fmtNum(v, digits) {
  if (v === null || v === undefined) return "—";
  return Number(v).toLocaleString(undefined, { maximumFractionDigits: digits ?? 1 });
}

function fmtTime(v) {
  if (v === null || v === undefined || v === "") return "—";
  const d = typeof v === "number" ? new Date(v * 1000) : new Date(v);
  return isNaN(d.getTime()) ? String(v) : d.toISOString().replace("T", " ").replace(/\.\d+Z$/, "Z");
}

// ------------------------------------------------------------------------------------------ API
async function api(path, options) {
  const res = await fetch(path, Object.assign({ headers: { Accept: "application/json" } }, options || {}));
  let body = null;
  try { body = await res.json(); } catch (e) { body = null; }
  if (!res.ok) {
    const detail = body && body.detail ? (typeof body.detail === "string" ? body.detail : JSON.stringify(body.detail)) : res.statusText;
    const err = new Error(`${res.status}: ${detail}`);
    err.status = res.status;
    throw err;
  }
  return body;
}

function actionError(what, e) {
  const hint = e.status === 401 ? " (enter the bearer token under Actions)" : "";
  status(`${what} failed: ${e.message}${hint}`, true);
}

async function post(path) {
  const token = $("token").value.trim();
  const headers = { Accept: "application/json" };
  if (token) headers.Authorization = `Bearer ${token}`;
  return api(path, { method: "POST", headers });
}

// ------------------------------------------------------------------------------------------ summary
function renderSummary(s) {
  ui.summary = s;
  $("cluster-name").textContent = s.cluster;
  const stats = [
    ["nodes", s.nodes], ["GPUs", s.gpus], ["free GPUs", s.free_gpus], ["whole-free nodes", s.whole_free_nodes],
    [`stranded for ${s.request}`, s.stranded_gpus], ["largest placeable", s.largest_placeable],
    ["FGD", `${fmtNum(s.fgd_ratio * 100)}%`], ["running", s.running], ["pending", s.pending],
  ];
  clear($("summary")).append(...stats.map(([k, v]) => el("span", { class: "stat", "data-stat": k }, `${k} `, el("b", {}, String(v)))));
  const sel = $("f-model");
  const current = sel.value;
  clear(sel).append(el("option", { value: "" }, "all"), ...s.models.map((m) => el("option", { value: m }, m)));
  sel.value = s.models.includes(current) ? current : "";
}

// ------------------------------------------------------------------------------------------ map
function cellNode(cell, gpuIndex, nodeName, stranded) {
  const c = el("span", { class: "cell", "data-gpu": gpuIndex });
  const owners = cell.shares;
  let title = `${nodeName} GPU ${gpuIndex}: `;
  if (cell.free_milli < 0) {
    c.classList.add("missing");
    title += "not advertised by the device plugin";
  } else if (owners.length === 0) {
    c.classList.add("free");
    if (stranded) c.classList.add("stranded");
    title += stranded ? "free but stranded for the request" : "free";
  } else {
    c.classList.add("owned");
    const parts = [];
    for (const [wid, milli] of owners) {
      const bar = el("span", { class: "share", "data-workload": wid });
      bar.style.width = `${Math.max(6, (milli / 1000) * 100)}%`;
      bar.style.background = colour(wid);
      c.append(bar);
      const w = ui.workloads.get(wid);
      parts.push(`${w ? w.name : wid} (${milli >= 1000 ? "whole GPU" : (milli / 1000).toFixed(2) + " GPU"})`);
    }
    if (cell.free_milli > 0) parts.push(`${(cell.free_milli / 1000).toFixed(2)} GPU free`);
    title += parts.join(", ");
    c.dataset.workload = owners[0][0];
    c.addEventListener("click", () => selectWorkload(owners[0][0]));
  }
  c.setAttribute("title", title);
  return c;
}

function rowNode(row) {
  const r = el("div", {
    class: "node-row" + (row.fits ? " fits" : "") + (row.schedulable ? "" : " unschedulable"),
    "data-node": row.name,
    "data-free": row.free_gpus,
  });
  r.append(
    el("span", { class: "node-name", title: `${row.name} (${row.model})` }, row.name),
    el("span", { class: "cells" }, row.cells.map((cell, g) => cellNode(cell, g, row.name, !row.fits))),
    el("span", { class: "node-free", title: "wholly free / usable GPUs" }, `${row.free_gpus}/${row.usable}`),
  );
  return r;
}

function renderRows(container, rows) {
  clear(container).append(...rows.map(rowNode));
}

function mapQuery() {
  const p = new URLSearchParams();
  const q = $("f-q").value.trim();
  if (q) p.set("q", q);
  if ($("f-model").value) p.set("model", $("f-model").value);
  p.set("only", $("f-only").value);
  p.set("sort", $("f-sort").value);
  const gpus = parseInt($("f-gpus").value, 10);
  if (gpus >= 1) p.set("gpus", String(gpus));
  p.set("offset", String(ui.offset));
  p.set("limit", String(ui.limit));
  return p.toString();
}

async function loadMap() {
  const m = await api(`/api/map?${mapQuery()}`);
  for (const w of m.workloads) ui.workloads.set(w.id, w);
  $("map-request").textContent = `— stranded GPUs highlighted for a ${m.request} request`;
  const map = clear($("map"));
  for (const g of m.groups) {
    const group = el("div", { class: "group", "data-model": g.model });
    group.append(el("h3", {}, `${g.model} · ${g.rows.length} node(s) shown`));
    const rows = el("div", { class: "rows" });
    renderRows(rows, g.rows);
    group.append(rows);
    map.append(group);
  }
  const end = Math.min(m.offset + m.limit, m.matching_nodes);
  $("page-info").textContent = m.matching_nodes === 0 ? "no nodes match"
    : `${m.offset + 1}–${end} of ${m.matching_nodes} (${m.total_nodes} nodes)`;
  $("page-prev").disabled = m.offset === 0;
  $("page-next").disabled = end >= m.matching_nodes;
  const legend = clear($("workload-legend"));
  for (const w of m.workloads) {
    const sw = el("span", { class: "swatch" });
    sw.style.background = colour(w.id);
    legend.append(el("span", { class: "item", "data-workload": w.id, onclick: () => selectWorkload(w.id) },
      sw, el("span", { class: "wname" }, w.name), el("span", { class: "muted" }, ` ${w.request}`)));
  }
  // an open workload panel (and its highlighted GPUs on the new map) shows the state just read
  if (ui.selectedWorkload && !$("workload-detail").hidden) selectWorkload(ui.selectedWorkload);
}

function selectWorkload(id) {
  ui.selectedWorkload = id;
  document.querySelectorAll(".cell.selected").forEach((c) => c.classList.remove("selected"));
  document.querySelectorAll(`#map .cell`).forEach((c) => { if (c.dataset.workload === id) c.classList.add("selected"); });
  const w = ui.workloads.get(id);
  const box = clear($("workload-detail"));
  box.hidden = false;
  if (!w) { box.append(el("p", {}, id)); return; }
  const age = w.last_checkpoint_at === null || !ui.summary ? "never" : `${fmtNum(ui.summary.now - w.last_checkpoint_at, 0)} s ago`;
  box.append(
    el("h3", {}, "workload ", el("span", { class: "wname", "data-testid": "workload-name" }, w.name)),
    el("p", {}, `${w.request} on ${w.nodes.join(", ")} · namespace ${w.namespace} · last checkpoint ${age} · ` +
      `${fmtNum(w.checkpoint_bytes / 2 ** 30)} GiB`),
  );
  if (ui.config && ui.config.can_checkpoint) {
    box.append(el("button", { type: "button", "data-testid": "checkpoint", onclick: () => checkpoint(id) }, "Trigger checkpoint"));
  }
}

async function checkpoint(id) {
  try {
    const r = await post(`/api/workloads/${encodeURIComponent(id)}/checkpoint`);
    await refresh();
    status(r.mode === "signalled" ? `checkpoint requested from ${id}'s wrapper (USR2 sent)`
      : `checkpoint recorded for ${id} (version ${r.version})`);
  } catch (e) {
    actionError("checkpoint", e);
  }
}

// ------------------------------------------------------------------------------------------ pending + plan
async function loadPending() {
  const jobs = await api("/api/pending");
  const list = clear($("pending"));
  if (jobs.length === 0) list.append(el("li", { class: "muted" }, "no pending GPU jobs"));
  for (const j of jobs) {
    const d = j.diagnosis;
    const li = el("li", { "data-job": j.id, class: j.id === ui.selectedPending ? "selected" : "", onclick: () => selectPending(j.id) },
      el("b", { class: "jname" }, j.name), " ", el("span", { class: "muted" }, j.request), " ",
      el("span", { class: `cause ${d.primary}` }, d.primary),
      el("div", { class: "muted" }, d.causes[0].summary));
    list.append(li);
  }
  if (ui.selectedPending && jobs.some((j) => j.id === ui.selectedPending)) await loadPlan(ui.selectedPending);
  else if (ui.selectedPending) { $("plan").hidden = true; ui.selectedPending = null; }
}

async function selectPending(id) {
  ui.selectedPending = id;
  document.querySelectorAll("#pending li").forEach((li) => li.classList.toggle("selected", li.dataset.job === id));
  await loadPlan(id);
}

function miniMap(title, rows, testid) {
  const box = el("div", { "data-testid": testid }, el("h3", {}, title));
  const container = el("div", {});
  renderRows(container, rows);
  box.append(container);
  return box;
}

async function loadPlan(id) {
  const p = await api(`/api/pending/${encodeURIComponent(id)}/plan`);
  ui.planVersion = p.version;
  const box = clear($("plan"));
  box.hidden = false;
  const d = p.workload.diagnosis;
  box.append(el("h3", {}, "diagnosis of ", el("span", { class: "jname" }, p.workload.name), ` (${p.workload.request})`));
  if (d.scheduler_reason) box.append(el("p", { class: "muted" }, `scheduler says: ${d.scheduler_reason}`));
  box.append(el("ol", { "data-testid": "diagnosis" },
    d.causes.map((c) => el("li", {}, el("span", { class: `cause ${c.code}` }, c.code), " ", c.summary))));
  if (!p.available) {
    box.append(el("p", { class: "muted", "data-testid": "plan-unavailable" }, p.message));
    return;
  }
  const plan = p.plan;
  const head = el("div", { "data-testid": "plan-summary" });
  if (!plan.feasible) head.append(el("p", {}, `no plan: ${plan.reason}`));
  else if (plan.moves.length === 0) head.append(el("p", {}, "the job fits now: nothing to move"));
  else head.append(el("p", {},
    `${plan.moves.length} move(s) make `, el("b", { "data-testid": "target-node" }, plan.target_node || "?"),
    ` whole · total ${fmtNum(plan.total_cost_s)} s, ${fmtNum(plan.total_gpu_s)} GPU-s · solver ${plan.solver}` +
      (plan.optimal ? " (optimal)" : "")));
  box.append(head);
  if (plan.moves.length) {
    const table = el("table", { "data-testid": "moves" },
      el("thead", {}, el("tr", {}, ["workload", "GPUs", "from", "to", "GPUs there", "cost"].map((h) => el("th", {}, h)))));
    const body = el("tbody");
    for (const m of plan.moves) {
      const c = m.cost;
      const cost = `${fmtNum(c.total_s)} s · ${fmtNum(c.gpu_s)} GPU-s` + (c.lost_work_s ? ` · ${fmtNum(c.lost_work_s)} s work lost` : "");
      const costTitle = Object.entries(c).filter(([, v]) => typeof v === "number").map(([k, v]) => `${k} ${fmtNum(v)}`).join(", ");
      const sw = el("span", { class: "swatch" });
      sw.style.background = colour(m.workload_id);
      body.append(el("tr", { "data-move": m.workload_id },
        el("td", {}, sw, " ", el("span", { class: "wname" }, m.workload_name)), el("td", {}, String(m.gpus)),
        el("td", {}, m.source), el("td", {}, m.target), el("td", {}, m.target_gpus.join(",")), el("td", { title: costTitle }, cost)));
    }
    table.append(body);
    box.append(table);
  }
  if (plan.explain.length) box.append(el("ul", { class: "muted" }, plan.explain.map((x) => el("li", {}, x))));
  if (p.after.length) {
    box.append(el("div", { class: "maps" }, miniMap("before", p.before, "plan-before"), miniMap("after", p.after, "plan-after")));
  }
  if (p.message) box.append(el("p", { class: "status error" }, p.message));
  if (ui.config && ui.config.can_apply && plan.feasible && plan.moves.length) {
    box.append(el("button", { type: "button", "data-testid": "apply-plan", onclick: () => applyPlan(id) }, "Apply plan"));
  }
}

async function applyPlan(id) {
  try {
    const q = ui.planVersion === null ? "" : `?version=${ui.planVersion}`;
    const r = await post(`/api/pending/${encodeURIComponent(id)}/apply${q}`);
    await refresh();
    status(`applied ${r.moves} move(s); ${r.summary.whole_free_nodes} whole-free node(s) now`);
  } catch (e) {
    actionError("apply", e);
  }
}

// ------------------------------------------------------------------------------------------ trend + history
async function loadTrend() {
  const samples = await api("/api/timeseries");
  const box = clear($("trend"));
  if (samples.length === 0) { box.append(el("p", { class: "muted" }, "no samples yet")); return; }
  const W = 600, H = 160, P = 28;
  const maxY = Math.max(1, ...samples.map((s) => Math.max(s.free_gpus, s.stranded_gpus)));
  const t0 = samples[0].at, t1 = samples[samples.length - 1].at, span = Math.max(1, t1 - t0);
  const x = (s, i) => samples.length === 1 ? P + (W - 2 * P) / 2 : P + ((s.at - t0) / span) * (W - 2 * P);
  const y = (v) => H - P + 4 - (v / maxY) * (H - 2 * P);
  const yr = (v) => H - P + 4 - v * (H - 2 * P);
  const chart = svg("svg", { viewBox: `0 0 ${W} ${H}`, role: "img", "aria-label": "free and stranded GPUs over time" });
  chart.append(svg("line", { class: "axis", x1: P, y1: H - P + 4, x2: W - P, y2: H - P + 4 }));
  const line = (cls, f) => svg("polyline", { class: cls, points: samples.map((s, i) => `${x(s, i)},${f(s)}`).join(" ") });
  chart.append(line("free", (s) => y(s.free_gpus)), line("stranded", (s) => y(s.stranded_gpus)), line("fgd", (s) => yr(s.fgd_ratio)));
  for (const s of samples.length === 1 ? samples : [samples[0], samples[samples.length - 1]]) {
    chart.append(svg("circle", { cx: x(s), cy: y(s.stranded_gpus), r: 3, fill: "#e5484d" }));
  }
  chart.append(svg("text", { x: 2, y: 12 }, `${maxY} GPUs`), svg("text", { x: 2, y: H - P + 4 }, "0"),
    svg("text", { x: P, y: H - 4 }, fmtTime(t0)), svg("text", { x: W - P - 110, y: H - 4 }, fmtTime(t1)));
  const last = samples[samples.length - 1];
  box.append(chart, el("p", { class: "muted" },
    `green: free GPUs (${last.free_gpus}) · red: stranded for ${last.request} (${last.stranded_gpus}) · ` +
    `blue dashed: FGD ratio (${fmtNum(last.fgd_ratio * 100)}%) · ${samples.length} sample(s), one per observation`));
}

async function loadHistory() {
  const h = await api("/api/history");
  $("history-note").textContent = h.note;
  const body = clear(document.querySelector("#history tbody"));
  if (h.moves.length === 0) body.append(el("tr", {}, el("td", { colspan: 7, class: "muted" }, "no migrations yet")));
  for (const m of h.moves) {
    body.append(el("tr", { "data-history": m.workload_id },
      el("td", {}, fmtTime(m.updated_at ?? m.created_at)), el("td", {}, m.workload_id), el("td", {}, m.source),
      el("td", {}, m.target), el("td", {}, m.state), el("td", {}, m.reason || ""),
      el("td", {}, m.steps.map((s) => s.state).join(" → ") + (m.origin === "dashboard" ? " (dashboard)" : ""))));
  }
}

// ------------------------------------------------------------------------------------------ wiring
// A refresh asked for while one is in flight (the 15 s tick, an action's own) is not dropped: the one in flight
// runs once more when it ends, and every caller waits for that, so an action's status line never stands beside
// the state from before the action.
function refresh() {
  if (ui.refreshing) {
    ui.refreshAgain = true;
    return ui.refreshing;
  }
  ui.refreshing = (async () => {
    try {
      do {
        ui.refreshAgain = false;
        await loadAll();
      } while (ui.refreshAgain);
    } finally {
      ui.refreshing = null;
    }
  })();
  return ui.refreshing;
}

async function loadAll() {
  try {
    ui.config = await api("/api/config");
    $("engine").textContent = `engine: ${ui.config.engine}`;
    $("actions-off").hidden = ui.config.actions_enabled;
    $("token-label").hidden = !ui.config.actions_enabled;
    renderSummary(await api("/api/summary"));
    await loadMap();
    await loadPending();
    await Promise.all([loadTrend(), loadHistory()]);
    document.body.dataset.version = String(ui.config.version);
    document.body.dataset.ready = "1";
  } catch (e) {
    status(`could not load the dashboard: ${e.message}`, true);
  }
}

function mapChanged() {
  ui.offset = 0;
  loadMap().catch((e) => status(e.message, true));
}

document.addEventListener("DOMContentLoaded", () => {
  $("map-controls").addEventListener("submit", (e) => { e.preventDefault(); mapChanged(); });
  for (const id of ["f-model", "f-only", "f-sort", "f-gpus"]) $(id).addEventListener("change", mapChanged);
  let t = null;
  $("f-q").addEventListener("input", () => { clearTimeout(t); t = setTimeout(mapChanged, 250); });
  $("page-prev").addEventListener("click", () => { ui.offset = Math.max(0, ui.offset - ui.limit); loadMap(); });
  $("page-next").addEventListener("click", () => { ui.offset += ui.limit; loadMap(); });
  $("refresh").addEventListener("click", () => refresh());
  refresh();
  setInterval(() => { if (!document.hidden) refresh(); }, 15000);
});
