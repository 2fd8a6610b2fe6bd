// The fleet console: plain JavaScript, no build step. Every read and write
// goes to the API with the operator's token, so the console can do exactly
// what the token's scopes allow; the live feed is /api/v1/events/status/.
"use strict";

const $ = (sel, el = document) => el.querySelector(sel);
const esc = (v) => String(v ?? "").replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" }[c]));
const state = { token: localStorage.getItem("fleetToken") || "", scopes: [], openapi: null, rerender: null };
const COLORS = { available: "#2e9d57", in_use: "#1f7a44", healthy: "#2e9d57", quarantine: "#c8921a", failed: "#d0453a",
  critical: "#d0453a", degraded: "#e0883a", validation: "#2f6fd6", unknown: "#9aa3b5", drained: "#7a5bd0" };
const colorOf = (k, i) => COLORS[k] || `hsl(${(i * 67) % 360} 45% 55%)`;

class ApiError extends Error {
  constructor(status, body) {
    const e = (body && body.error) || {};
    super(`${status} ${e.code || ""}: ${e.message || "request failed"}`);
    this.status = status; this.code = e.code;
  }
}

async function api(path, opts = {}) {
  const r = await fetch(path, {
    ...opts,
    headers: { Authorization: `Bearer ${state.token}`, "Content-Type": "application/json", ...(opts.headers || {}) },
  });
  const text = await r.text();
  let body = null;
  try { body = text ? JSON.parse(text) : null; } catch (_) { body = { error: { message: text } }; }
  if (!r.ok) throw new ApiError(r.status, body);
  return body;
}

function showError(e) {
  const box = $("#error");
  if (!e) { box.hidden = true; box.textContent = ""; return; }
  box.hidden = false; box.textContent = e.message || String(e);
}

const can = (scope) => state.scopes.includes(scope) || state.scopes.includes("admin");

// ---- routing ----
function route() {
  const h = location.hash.replace(/^#/, "") || "/";
  const [path, query] = h.split("?");
  const parts = path.split("/").filter(Boolean);
  document.querySelectorAll("header nav a").forEach((a) => a.classList.toggle("on",
    a.dataset.nav === (parts[0] === "device" ? "devices" : parts[0] || "overview")));
  if (!state.token) { $("#view").innerHTML = "<p>Paste an API token to start.</p>"; return; }
  const params = new URLSearchParams(query || "");
  const view = parts[0] === "devices" ? () => devices(params)
    : parts[0] === "device" ? () => device(decodeURIComponent(parts[1] || ""))
    : parts[0] === "racks" ? () => racks(parts[1] ? decodeURIComponent(parts[1]) : "", params)
    : () => overview();
  state.rerender = view;
  showError(null);
  view().catch(showError);
}

// ---- overview ----
function bar(dist) {
  const total = Object.values(dist).reduce((a, b) => a + b, 0) || 1;
  const keys = Object.keys(dist).sort();
  return `<div class="bar">${keys.map((k, i) => `<span title="${esc(k)}: ${dist[k]}" style="width:${(100 * dist[k]) / total}%;background:${colorOf(k, i)}"></span>`).join("")}</div>
    <div class="dist">${keys.map((k) => `${esc(k)} <b>${dist[k]}</b>`).join(" · ")}</div>`;
}

async function allPages(path, limit = 200) {
  const out = [];
  let cursor = "";
  for (let i = 0; i < 50; i++) {
    const sep = path.includes("?") ? "&" : "?";
    const p = await api(`${path}${sep}limit=${limit}${cursor ? `&cursor=${encodeURIComponent(cursor)}` : ""}`);
    out.push(...p.items);
    if (!p.next_cursor) break;
    cursor = p.next_cursor;
  }
  return out;
}

async function overview() {
  const sites = await allPages("/api/v1/sites/");
  const summaries = await Promise.all(sites.map((s) => api(`/api/v1/sites/${encodeURIComponent(s.id)}/summary`)));
  $("#view").innerHTML = `<h2>Fleet overview</h2><div class="cards">${summaries.map((s) => `
    <div class="card" data-site="${esc(s.site_id)}">
      <h3>${esc(s.site_id)} <span class="muted">${s.total} devices</span></h3>
      <div>operational_status</div>${bar(s.operational_status)}
      <div>health_status</div>${bar(s.health_status)}
      <div>capacity_bucket</div>${bar(s.capacity_bucket)}
      <div class="dist">customer_ready <b>${s.customer_ready}</b> · in_triage <b>${s.in_triage}</b> · cordoned <b>${s.cordoned}</b> · maintenance <b>${s.maintenance}</b></div>
      <p><a href="#/devices?site=${encodeURIComponent(s.site_id)}">devices</a> · <a href="#/racks/${encodeURIComponent(s.site_id)}">Operational Racks</a></p>
    </div>`).join("")}</div>`;
}

// ---- devices: a filter for every filter the API documents ----
async function devices(params) {
  if (!state.openapi) state.openapi = await api("/api/v1/openapi.json");
  const filters = state.openapi.paths["/api/v1/devices/"].get.parameters.filter((p) => !["limit", "cursor"].includes(p.name));
  const input = (p) => {
    const v = params.get(p.name) || "";
    const en = p.schema.enum || (p.schema.items && p.schema.items.enum);
    if (en) return `<select name="${p.name}"><option value=""></option>${en.map((e) => `<option ${e === v ? "selected" : ""}>${esc(e)}</option>`).join("")}</select>`;
    if (p.schema.type === "boolean") return `<select name="${p.name}"><option value=""></option>${["true", "false"].map((e) => `<option ${e === v ? "selected" : ""}>${e}</option>`).join("")}</select>`;
    return `<input name="${p.name}" value="${esc(v)}" size="12">`;
  };
  const q = new URLSearchParams(params);
  q.set("limit", "50");
  const page = await api(`/api/v1/devices/?${q}`);
  const cols = ["name", "site_id", "rack", "device_class", "operational_status", "health_status", "provision_state", "capacity_bucket", "no_schedule_reasons"];
  $("#view").innerHTML = `<h2>Devices</h2>
    <form class="filters" id="filters">${filters.map((p) => `<label>${esc(p.name)}${input(p)}</label>`).join("")}
      <button type="submit">Filter</button></form>
    <table><thead><tr>${cols.map((c) => `<th>${c}</th>`).join("")}</tr></thead><tbody>
    ${page.items.map((d) => `<tr>${cols.map((c) => c === "name" ? `<td><a href="#/device/${encodeURIComponent(d.id)}">${esc(d.name)}</a></td>`
      : `<td>${esc(Array.isArray(d[c]) ? d[c].join(", ") : d[c])}</td>`).join("")}</tr>`).join("")}
    </tbody></table>
    <div class="pager">${params.get("cursor") ? `<a href="#/devices?${new URLSearchParams([...params].filter(([k]) => k !== "cursor"))}">first page</a>` : ""}
    ${page.next_cursor ? `<a id="next" href="#/devices?${(() => { const n = new URLSearchParams(params); n.set("cursor", page.next_cursor); return n; })()}">next page</a>` : ""}</div>`;
  $("#filters").addEventListener("submit", (ev) => {
    ev.preventDefault();
    const n = new URLSearchParams();
    for (const [k, v] of new FormData(ev.target)) if (v) n.set(k, v);
    location.hash = `#/devices?${n}`;
  });
}

// ---- the Operational Racks matrix ----
async function racks(site, params) {
  if (!site) {
    const sites = await allPages("/api/v1/sites/");
    if (!sites.length) { $("#view").innerHTML = "<p>No sites.</p>"; return; }
    location.hash = `#/racks/${encodeURIComponent(sites[0].id)}`;
    return;
  }
  const cursor = params.get("cursor") || "";
  const page = await api(`/api/v1/sites/${encodeURIComponent(site)}/standup-pipeline/?limit=20${cursor ? `&cursor=${encodeURIComponent(cursor)}` : ""}`);
  const actions = can("jobs:write");
  const chip = (c) => {
    const gates = (c.acceptance_gates || []).map((g) => `${g.name} (${g.stage}, ${g.scope}): ${g.outcome}`);
    const why = [
      ...c.action_suppression_reasons.map((r) => `suppressed: ${r}`),
      ...gates,
      c.placed_by && c.placed_by.failure_code ? `failure: ${c.placed_by.failure_code} ${c.placed_by.failure_message || ""}` : "",
      c.latest_in_sequence_workflow ? `latest: ${c.latest_in_sequence_workflow.workflow} ${c.latest_in_sequence_workflow.status || "pending"} (job ${c.latest_in_sequence_workflow.job_id})` : "",
    ].filter(Boolean).join("\n");
    const buttons = actions ? c.available_actions.map((w) => `<button data-device="${esc(c.device_id)}" data-workflow="${esc(w)}">${esc(w)}</button>`).join("") : "";
    return `<span class="cell ${c.status}" data-device-id="${esc(c.device_id)}" data-status="${c.status}" data-stage="${c.stage}" title="${esc(`${c.name}: ${c.status}\n${why}`)}"><a href="#/device/${encodeURIComponent(c.device_id)}">${esc(c.name)}</a>${buttons}</span>`;
  };
  $("#view").innerHTML = `<h2>Operational Racks — ${esc(site)}</h2>
    <p class="muted">Each device sits in the stage it is at or awaiting; hover a device for why it offers no action and how its acceptance gates evaluate.${actions ? "" : " This token has no jobs:write scope: no actions."}</p>
    <table class="matrix"><thead><tr><th>rack</th>${page.stages.map((s) => `<th>${s}</th>`).join("")}</tr></thead><tbody>
    ${page.racks.map((r) => `<tr data-rack="${esc(r.rack)}"><th>${esc(r.rack || "(no rack)")}</th>${page.stages.map((s) => `<td data-stage="${s}">
      <div class="counts">${Object.entries(r.cells[s] || {}).map(([k, n]) => `${k} ${n}`).join(" · ")}</div>
      ${r.devices.filter((c) => c.stage === s).map(chip).join("")}</td>`).join("")}</tr>`).join("")}
    </tbody></table>
    <div class="pager">${cursor ? `<a href="#/racks/${encodeURIComponent(site)}">first page</a>` : ""}
    ${page.next_cursor ? `<a href="#/racks/${encodeURIComponent(site)}?cursor=${encodeURIComponent(page.next_cursor)}">next racks</a>` : ""}</div>`;
  $("#view").querySelectorAll("button[data-workflow]").forEach((b) => b.addEventListener("click", async () => {
    b.disabled = true;
    try {
      const job = await api("/api/v1/jobs/", { method: "POST", body: JSON.stringify({ workflow: b.dataset.workflow, device_ids: [b.dataset.device] }) });
      showError(null);
      // The job the API accepted is the cell's state until the next read.
      const cell = b.closest(".cell");
      cell.className = `cell ${job.status}`;
      cell.dataset.status = job.status;
      cell.title = `${cell.title.split("\n")[0].split(":")[0]}: ${job.status}\njob ${job.id} (${job.workflow})`;
      cell.querySelectorAll("button").forEach((x) => x.remove());
      clearTimeout(state.inflight);
      state.inflight = setTimeout(() => { if (state.rerender) state.rerender().catch(showError); }, 1000);
    } catch (e) { showError(e); b.disabled = false; }
  }));
  // While anything on the page is in flight, read the page again: job
  // progress is not a status change.
  clearTimeout(state.inflight);
  if (page.racks.some((r) => r.devices.some((c) => c.status === "pending" || c.status === "running" ||
      c.action_suppression_reasons.includes("concurrent_workflow_running")))) {
    state.inflight = setTimeout(() => { if (state.rerender) state.rerender().catch(showError); }, 2000);
  }
}

// ---- a device ----
function kv(obj) {
  return `<table class="kv">${Object.entries(obj).filter(([, v]) => v === null || typeof v !== "object" || Array.isArray(v) && v.every((x) => typeof x !== "object"))
    .map(([k, v]) => `<tr><td>${esc(k)}</td><td>${esc(Array.isArray(v) ? v.join(", ") : v)}</td></tr>`).join("")}</table>`;
}

function rows(items, cols, fmt = {}) {
  if (!items.length) return `<p class="muted">none</p>`;
  return `<table><thead><tr>${cols.map((c) => `<th>${c}</th>`).join("")}</tr></thead><tbody>${items.map((it) =>
    `<tr>${cols.map((c) => `<td>${fmt[c] ? fmt[c](it[c], it) : esc(Array.isArray(it[c]) ? it[c].join(", ") : typeof it[c] === "object" && it[c] !== null ? JSON.stringify(it[c]) : it[c])}</td>`).join("")}</tr>`).join("")}</tbody></table>`;
}

async function device(id) {
  const enc = encodeURIComponent(id);
  const [d, conds, life, jobs] = await Promise.all([
    api(`/api/v1/devices/${enc}/`),
    api(`/api/v1/device-conditions/?device=${enc}&limit=200`),
    api(`/api/v1/devices/${enc}/lifecycle-events/?limit=100`),
    api(`/api/v1/jobs/?device=${enc}&limit=20`),
  ]);
  const details = await Promise.all(jobs.items.map((j) => api(`/api/v1/jobs/${encodeURIComponent(j.id)}/`).catch(() => j)));
  const mine = details.map((j) => ({ ...j, run: (j.devices || []).find((x) => x.device_id === id) || {} }));
  $("#view").innerHTML = `<h2>${esc(d.name)} <span class="muted">${esc(d.id)}</span></h2>
    <p><b>no_schedule_reasons</b>: ${d.no_schedule_reasons.length ? d.no_schedule_reasons.map(esc).join(", ") : "<span class='muted'>none (schedulable)</span>"}</p>
    <div class="cards"><div class="card"><h3>Axes and identity</h3>${kv(d)}</div>
    <div class="card"><h3>Conditions</h3>${rows(conds.items, ["type", "status", "reason", "source", "decisive", "stale", "condition_of", "observed_at", "message"],
      { decisive: (v) => v ? `<span class="decisive">decisive</span>` : "", stale: (v) => v ? "stale" : "fresh" })}</div></div>
    <h3>Jobs</h3>${rows(mine, ["id", "workflow", "status", "created_at", "run"], {
      run: (r) => esc([r.status, r.step, r.failure_code, r.failure_message].filter(Boolean).join(" · ")) })}
    <h3>Lifecycle</h3>${rows(life.items, ["created_at", "kind", "value", "cause", "ended_at"])}`;
}

// ---- live: STATUS as server-sent events over fetch (it carries the token) ----
async function follow() {
  let backoff = 500;
  for (;;) {
    if (!state.token) { await new Promise((r) => setTimeout(r, 1000)); continue; }
    try {
      const r = await fetch("/api/v1/events/status/", { headers: { Authorization: `Bearer ${state.token}` } });
      if (!r.ok) throw new Error(`live feed: ${r.status}`);
      $("#live").textContent = "● live"; $("#live").className = "on";
      backoff = 500;
      const reader = r.body.getReader();
      const dec = new TextDecoder();
      let buf = "";
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buf += dec.decode(value, { stream: true });
        let i;
        while ((i = buf.indexOf("\n\n")) >= 0) {
          const block = buf.slice(0, i); buf = buf.slice(i + 2);
          const data = block.split("\n").filter((l) => l.startsWith("data:")).map((l) => l.slice(5)).join("\n");
          if (data) changed(JSON.parse(data));
        }
      }
    } catch (e) {
      $("#live").textContent = "● offline"; $("#live").className = "";
      await new Promise((r) => setTimeout(r, backoff));
      backoff = Math.min(backoff * 2, 10000);
    }
  }
}

let pending = null;
function changed(ev) {
  window.dispatchEvent(new CustomEvent("fleet-status", { detail: ev }));
  clearTimeout(pending);
  pending = setTimeout(() => { if (state.rerender) state.rerender().catch(showError); }, 500);
}

async function login(token) {
  state.token = token.trim();
  localStorage.setItem("fleetToken", state.token);
  try {
    const me = await api("/api/v1/whoami/");
    state.scopes = me.scopes;
    $("#who").textContent = me.scopes.join(" ");
    showError(null);
  } catch (e) { state.scopes = []; $("#who").textContent = ""; showError(e); }
  route();
}

$("#login").addEventListener("submit", (ev) => { ev.preventDefault(); login($("#token").value); });
window.addEventListener("hashchange", route);
if (state.token) login(state.token); else route();
follow();
