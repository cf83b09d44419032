// beam dashboard: the pipeline view (envelopes routed through agents).
// Each envelope's route is a timeline of hops with status, attempts,
// progress and the payload each hop produced; fan-out children form a
// tree; dead envelopes can be requeued by an admin. Views reload when the
// log moves (the dashboard's own event stream).

import { rel, fmtTime, fmtClock } from "./fmt.js";
import { labelCells } from "./cells.js";
import { waterfall, fmtSpan } from "./trace.js";

const CSRF = document.querySelector('meta[name="csrf-token"]')?.content || "";

function el(tag, attrs, ...kids) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
    else if (k === "dataset") Object.assign(e.dataset, v);
    else e.setAttribute(k, v === true ? "" : v);
  }
  for (const k of kids.flat()) if (k !== null && k !== undefined && k !== false) e.append(k.nodeType ? k : String(k));
  return e;
}

async function call(path, method = "GET") {
  const headers = { Accept: "application/json" };
  if (method !== "GET") headers["X-CSRF-Token"] = CSRF;
  const res = await fetch(path, { method, headers, credentials: "same-origin" });
  if (res.status === 401) { location.assign("/dashboard/login"); throw new Error("signed out"); }
  let body = null;
  try { body = await res.json(); } catch { /* empty */ }
  if (!res.ok) throw new Error((body && body.error) || `${res.status} ${res.statusText}`);
  return body;
}

const STATUS_CLASS = { succeeded: "s-acked", failed: "s-failed", canceled: "s-dead_letter", running: "s-delivered", retrying: "s-delivered", unknown: "s-queued", paused: "s-queued", pending: "s-received" };

function statusChip(s, id) {
  return el("span", { class: `chip ${STATUS_CLASS[s] || ""}`, id, dataset: { status: s } }, s);
}

function bar(p) {
  const pct = Math.max(0, Math.min(100, p || 0));
  const fill = el("span");
  fill.style.width = `${pct}%`; // CSSOM, allowed by the style-src CSP
  return el("span", { class: "mesh-bar", role: "progressbar", "aria-valuenow": pct.toFixed(0), "aria-valuemin": "0", "aria-valuemax": "100", title: `${pct.toFixed(0)}%` }, fill);
}

function pre(raw) {
  let text = "";
  try { text = JSON.stringify(raw, null, 2); } catch { text = String(raw); }
  return el("pre", { class: "json" }, text);
}

function shortID(id) { return id.length > 13 ? id.slice(0, 13) + "…" : id; }

// liveReload runs load now and again whenever the log moves, until the
// returned function is called. The stream reports only events after it
// opened, so load runs again once it is open (and after each reconnect):
// what happened between the first load and the stream is not missed.
// Loads never overlap: one asked for while another runs follows it, so the
// page always ends with a load started after the last event it was told of.
function liveReload(load) {
  let timer = null;
  let closed = false;
  let running = false;
  let again = false;
  const run = async () => {
    if (closed) return;
    if (running) { again = true; return; }
    running = true;
    try { await load(); } finally { running = false; }
    if (again) { again = false; run(); }
  };
  const es = new EventSource("/observability/stream");
  es.addEventListener("open", () => run());
  es.addEventListener("intent", () => {
    if (timer) return;
    timer = setTimeout(() => { timer = null; run(); }, 300);
  });
  run();
  return () => { closed = true; clearTimeout(timer); es.close(); };
}

// actorName is the local part of an actor's Beam ID, its full ID in the
// title.
function actorName(id) {
  const at = id.indexOf("@");
  return el("span", { class: "actor", title: id }, at > 0 ? id.slice(0, at) : id);
}

// routeLine draws an envelope's route: the hops done, the current actor
// (emphasised) and the ones still to come.
function routeLine(env, id) {
  const r = (env && env.route) || {};
  const parts = [];
  for (const a of r.prev || []) parts.push(el("span", { class: "hop-done" }, actorName(a)));
  if (r.curr) parts.push(el("strong", { class: "hop-curr" }, actorName(r.curr)));
  for (const a of r.next || []) parts.push(el("span", { class: "hop-next" }, actorName(a)));
  if (!parts.length) return el("span", { class: "muted", id }, "—");
  const line = el("span", { class: "mesh-route", id });
  parts.forEach((p, i) => { if (i) line.append(" ", el("span", { class: "arrow", "aria-hidden": "true" }, "→"), " "); line.append(p); });
  return line;
}

// startedBy names the protocol that created an envelope: an A2A task or an
// MCP tool call (with its pipeline), else the gateway.
function startedBy(env) {
  const h = env.headers || {};
  const p = h["x-beam-protocol"];
  if (p === "a2a" || p === "mcp") return `${p === "a2a" ? "A2A task" : "MCP tool call"} · pipeline ${h["x-beam-pipeline"] || "?"}`;
  return "the gateway (POST /api/v1/mesh)";
}

// routeText is an envelope's whole route as one line of Beam IDs.
function routeText(env) {
  const r = (env && env.route) || {};
  return [...(r.prev || []), r.curr, ...(r.next || [])].filter(Boolean).join(" → ");
}

// microsTime shows a unix-microseconds time as "3 min ago", the full time
// in its title.
function microsTime(us) {
  if (!us) return el("span", { class: "muted" }, "—");
  const iso = new Date(us / 1000).toISOString();
  return el("time", { datetime: iso, title: fmtTime(iso) }, rel(iso));
}

// card is a section with a heading row and a padded body.
function card(title, attrs, ...body) {
  return el("section", { class: "card", "aria-label": title, ...attrs },
    el("div", { class: "card-head" }, el("h2", null, title)), el("div", { class: "card-body" }, ...body));
}

// renderPipelines lists envelopes (#/pipelines?status=S&dead=1).
export function renderPipelines(root, { params, isCurrent }) {
  const status = params.get("status") || "";
  const dead = params.get("dead") === "1";
  const filters = el("div", { class: "segmented", role: "group", "aria-label": "Status filter" },
    ...[["", "All"], ["running", "Running"], ["retrying", "Retrying"], ["unknown", "Unknown"], ["paused", "Paused"], ["succeeded", "Succeeded"], ["failed", "Failed"], ["canceled", "Canceled"]].map(([v, t]) =>
      el("button", { type: "button", "aria-pressed": String(v === status && !dead), onclick: () => { location.hash = v ? `#/pipelines?status=${v}` : "#/pipelines"; } }, t)),
    el("button", { type: "button", id: "mesh-dead-filter", "aria-pressed": String(dead), onclick: () => { location.hash = "#/pipelines?dead=1"; } }, "Dead letters"));
  root.append(el("div", { class: "page-head" },
    el("div", null, el("h1", null, "Pipelines"), el("p", null, "Envelopes routed hop by hop through agents; x-sink holds every finished one, x-sump the dead.")),
    el("div", { class: "actions" }, filters)));
  const tbody = el("tbody");
  const cols = [["Envelope", "115px"], ["Status", "112px"], ["Progress", "150px"], ["Route", ""], ["Creator", "115px"], ["Created", "90px"], ["Reason", "130px"]];
  const table = el("table", { class: "data", id: "mesh-table" }, el("thead", null, el("tr", null,
    ...cols.map(([t, w]) => { const th = el("th", { scope: "col" }, t); if (w) th.style.width = w; return th; }))), tbody);
  const total = el("span", { class: "right muted", id: "mesh-total" });
  root.append(el("section", { class: "card", "aria-label": "Envelopes" },
    el("div", { class: "feed-bar" }, el("span", null, "Newest first; choose one for its hops, waterfall and payload."), total),
    el("div", { class: "table-wrap" }, table)));

  async function load() {
    try {
      const q = new URLSearchParams({ limit: "200" });
      if (status) q.set("status", status);
      if (dead) q.set("dead", "1");
      const d = await call(`/observability/mesh?${q}`);
      if (!isCurrent()) return;
      tbody.replaceChildren(...d.envelopes.map((e) => {
        const env = e.envelope || {};
        const hops = (env.route?.prev?.length || 0) + (env.route?.curr ? 1 : 0) + (env.route?.next?.length || 0);
        return el("tr", {
          class: "row-link", tabindex: "0", dataset: { id: e.id, status: e.status },
          onclick: () => { location.hash = `#/pipelines/${encodeURIComponent(e.id)}`; },
          onkeydown: (ev) => { if (ev.key === "Enter") location.hash = `#/pipelines/${encodeURIComponent(e.id)}`; },
        },
        el("td", { class: "mono", title: e.parentId ? `${e.id} (fan-out of ${e.parentId})` : e.id }, shortID(e.id)),
        el("td", null, statusChip(e.status)),
        el("td", { class: "mesh-progress-cell" }, bar(e.progress), ` ${Math.round(e.progress)}%`,
          el("span", { class: "muted", title: "hops done of the route's hops" }, hops ? ` · ${Math.min(e.hop, hops)}/${hops}` : "")),
        el("td", { class: "route-cell", title: routeText(env) }, routeLine(env)),
        el("td", { class: "mono", title: e.creator }, actorName(e.creator || "—")),
        el("td", null, microsTime(e.createdAt)),
        el("td", { title: e.error || e.reason || "" }, e.reason || "—"));
      }));
      if (!d.envelopes.length) {
        tbody.replaceChildren(el("tr", null, el("td", { colspan: String(cols.length), class: "empty-cell" },
          el("p", { class: "muted" }, status || dead ? "No envelope matches this filter." : "No pipelines yet: create one with beam mesh create --route A,B,C or POST /api/v1/mesh."))));
      }
      labelCells(table);
      total.textContent = `${d.total} envelope${d.total === 1 ? "" : "s"}`;
    } catch (err) {
      if (isCurrent()) total.textContent = `Could not load envelopes: ${err.message}`;
    }
  }
  return liveReload(load);
}

// hopTimes says when a hop started and how long it took (or has run).
function hopTimes(h) {
  if (!h.at) return null;
  const start = new Date(h.at).getTime();
  const end = h.endedAt ? new Date(h.endedAt).getTime() : Date.now();
  return el("span", { class: "hop-time" },
    el("time", { datetime: h.at, title: fmtTime(h.at) }, `started ${fmtClock(h.at)}`),
    h.endedAt ? ` · took ${fmtSpan(end - start)}` : ` · running for ${fmtSpan(end - start)}`);
}

// renderPipeline shows one envelope (#/pipelines/ID).
export function renderPipeline(root, { arg, isCurrent }) {
  const body = el("div", { id: "mesh-detail" });
  root.append(el("div", { class: "back-row" }, el("a", { class: "btn ghost small", href: "#/pipelines" }, "← Back to pipelines")),
    el("div", { class: "page-head" }, el("div", null, el("h1", null, "Envelope"), el("p", { class: "mono envelope-id" }, arg))), body);

  async function childTree(id, depth) {
    const d = await call(`/observability/mesh?parent=${encodeURIComponent(id)}&limit=200`);
    const items = [];
    for (const c of d.envelopes) {
      const li = el("li", { dataset: { id: c.id, status: c.status } },
        el("a", { href: `#/pipelines/${encodeURIComponent(c.id)}`, class: "mono" }, shortID(c.id)), " ", statusChip(c.status), " ", `${Math.round(c.progress)}%`);
      if (depth < 3) {
        const sub = await childTree(c.id, depth + 1);
        if (sub) li.append(sub);
      }
      items.push(li);
    }
    return items.length ? el("ul", { class: "mesh-tree" }, ...items) : null;
  }

  async function load() {
    try {
      const d = await call(`/observability/mesh/${encodeURIComponent(arg)}`);
      if (!isCurrent()) return;
      const e = d.envelope;
      const env = e.envelope || {};
      const hops = el("ol", { class: "mesh-timeline", id: "mesh-hops" }, ...d.hops.map((h, i) => el("li", { class: `hop hop-${h.outcome}`, dataset: { actor: h.actor, outcome: h.outcome } },
        el("div", { class: "hop-head" }, el("strong", null, `${i + 1}.`), el("span", { class: "mono hop-actor", title: h.actor }, h.actor), statusChip(h.outcome === "done" ? "succeeded" : h.outcome)),
        el("div", { class: "hop-meta muted" }, hopTimes(h), ` · ${h.attempts} attempt${h.attempts === 1 ? "" : "s"} · progress ${Math.round(h.progress)}%`),
        h.error ? el("p", { class: "reason" }, h.error) : null,
        h.payload ? pre(h.payload) : null)));
      let requeue = null;
      if (d.requeue.allowed) {
        requeue = el("button", { class: "btn small", type: "button", id: "mesh-requeue", onclick: async () => {
          requeue.disabled = true;
          try {
            const r = await call(`/observability/mesh/${encodeURIComponent(e.id)}/requeue`, "POST");
            location.hash = `#/pipelines/${encodeURIComponent(r.id)}`;
          } catch (err) { requeue.disabled = false; requeue.textContent = `Requeue failed: ${err.message}`; }
        } }, "Requeue");
      }
      const children = await childTree(e.id, 0);
      // The envelope's trace as a waterfall, each row named by its actor.
      let trace = null;
      try { trace = await call(`/observability/intents/${encodeURIComponent(e.nonce)}`); } catch { trace = null; }
      if (!isCurrent()) return;
      const pick = (seq) => {
        const s = trace && trace.stages.find((x) => x.seq === seq);
        const actor = s && s.details && s.details.mesh && s.details.mesh.actor;
        const li = actor && document.querySelector(`#mesh-hops li[data-actor="${CSS.escape(actor)}"]`);
        if (li) li.scrollIntoView({ block: "nearest", behavior: "smooth" });
      };
      body.replaceChildren(
        el("section", { class: "card card-body" },
          el("div", { class: "detail-head" }, statusChip(e.status, "mesh-status"), bar(e.progress),
            el("span", { id: "mesh-progress" }, ` ${Math.round(e.progress)}%`), requeue),
          el("dl", { class: "kv" },
            el("dt", null, "Route"), el("dd", null, routeLine(env, "mesh-route")),
            el("dt", null, "Creator"), el("dd", { class: "mono", id: "mesh-creator" }, e.creator),
            el("dt", null, "Started by"), el("dd", { id: "mesh-protocol" }, startedBy(env)),
            el("dt", null, "Created"), el("dd", { id: "mesh-created" }, e.createdAt ? fmtTime(new Date(e.createdAt / 1000).toISOString()) : "—"),
            el("dt", null, "Finished"), el("dd", null, e.completedAt ? fmtTime(new Date(e.completedAt / 1000).toISOString()) : "not yet"),
            el("dt", null, "Hop"), el("dd", null, `${e.hop} done${e.actor && e.status === "running" ? ` · now at ${e.actor}` : ""}`),
            el("dt", null, "Attempt"), el("dd", null, e.attempt),
            el("dt", null, "Parent"), el("dd", { class: "mono" }, e.parentId ? el("a", { href: `#/pipelines/${encodeURIComponent(e.parentId)}` }, e.parentId) : "—"),
            el("dt", null, "x-sink / x-sump"), el("dd", { id: "mesh-sinks" }, `${e.sink ? "sink" : "—"} / ${e.sump ? "sump" : "—"}`),
            el("dt", null, "Reason"), el("dd", null, e.reason || "—"),
            el("dt", null, "Error"), el("dd", null, e.error || "—"),
            el("dt", null, "Trace"), el("dd", null, el("a", { class: "mono", href: `#/intents/${encodeURIComponent(e.nonce)}` }, e.nonce)))),
        el("div", { class: "grid-gap" }),
        trace && trace.stages.length ? card("Waterfall", { id: "mesh-waterfall" }, waterfall(trace, pick)) : null,
        trace && trace.stages.length ? el("div", { class: "grid-gap" }) : null,
        el("div", { class: "grid cols-2" },
          card("Hops", null, d.hops.length ? hops : el("p", { class: "muted" }, "No hop yet.")),
          el("div", { class: "stack" },
            card("Fan-out children", { id: "mesh-children" }, children || el("p", { class: "muted" }, "None.")),
            card("Current payload", null, pre(env.payload)))));
    } catch (err) {
      if (isCurrent()) body.replaceChildren(el("p", { class: "reason" }, `Could not load envelope: ${err.message}`));
    }
  }
  return liveReload(load);
}
