// beam dashboard: a hash-routed single page over /observability/*.
import { stackedBars, latencyLines } from "./chart.js";
import { waterfall, retryFailure, foldOutboxRetries } from "./trace.js";
import { pager, PAGE } from "./pager.js";
import { renderPipelines, renderPipeline } from "./mesh.js";
import { rel, fmtTime, fmtClock } from "./fmt.js";
import { labelCells } from "./cells.js";

const CSRF = document.querySelector('meta[name="csrf-token"]').content;
const ROLE = document.querySelector('meta[name="beam-role"]').content;
const content = document.getElementById("content");
const FEED_MAX = 200;

// ---------- DOM and formatting helpers ----------

function h(tag, attrs, ...kids) {
  const e = document.createElement(tag);
  if (attrs) {
    for (const [k, v] of Object.entries(attrs)) {
      if (v === undefined || v === null || v === false) continue;
      if (k === "class") e.className = v;
      else if (k === "text") e.textContent = v;
      else if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
      else if (k === "dataset") Object.assign(e.dataset, v);
      else e.setAttribute(k, v === true ? "" : String(v));
    }
  }
  for (const kid of kids.flat()) {
    if (kid === undefined || kid === null || kid === false) continue;
    e.append(kid instanceof Node ? kid : document.createTextNode(String(kid)));
  }
  return e;
}

const svgNS = "http://www.w3.org/2000/svg";
function icon(path) {
  const s = document.createElementNS(svgNS, "svg");
  s.setAttribute("viewBox", "0 0 24 24");
  s.setAttribute("aria-hidden", "true");
  const p = document.createElementNS(svgNS, "path");
  p.setAttribute("d", path);
  s.append(p);
  return s;
}
const ICONS = {
  search: "M11 4a7 7 0 1 0 0 14 7 7 0 0 0 0-14zM20 20l-3.5-3.5",
  info: "M12 8h.01M11 12h1v5h1M12 3a9 9 0 1 0 0 18 9 9 0 0 0 0-18z",
  inbox: "M4 4h16v16H4zM4 14h5l1 3h4l1-3h5",
  globe: "M12 3a9 9 0 1 0 0 18 9 9 0 0 0 0-18zM3 12h18M12 3c2.5 2.6 3.8 5.6 3.8 9s-1.3 6.4-3.8 9c-2.5-2.6-3.8-5.6-3.8-9S9.5 5.6 12 3z",
  pulse: "M3 12h4l3 8 4-16 3 8h4",
  alert: "M12 9v4M12 17h.01M10.3 3.9 2 18a2 2 0 0 0 1.7 3h16.6a2 2 0 0 0 1.7-3L13.7 3.9a2 2 0 0 0-3.4 0z",
  users: "M9 11.5a3.5 3.5 0 1 0 0-7 3.5 3.5 0 0 0 0 7zM2.5 20c.8-3.6 3.4-5.5 6.5-5.5s5.7 1.9 6.5 5.5",
  link: "M10 14a4 4 0 0 0 5.7 0l3-3a4 4 0 0 0-5.7-5.7l-1 1M14 10a4 4 0 0 0-5.7 0l-3 3a4 4 0 0 0 5.7 5.7l1-1",
  copy: "M9 9h11v11H9zM5 15H4V4h11v1",
};

const nf = new Intl.NumberFormat();
const fmtInt = (n) => (n === null || n === undefined ? "—" : nf.format(n));
function fmtMs(ms) {
  if (ms === null || ms === undefined) return "—";
  if (ms < 1) return "<1 ms";
  if (ms < 1000) return `${Math.round(ms)} ms`;
  if (ms < 60000) return `${(ms / 1000).toFixed(2)} s`;
  return `${(ms / 60000).toFixed(1)} min`;
}
function fmtDelta(ms) {
  if (ms === null || ms === undefined) return "";
  if (ms < 1000) return `+${ms.toFixed(ms < 10 ? 2 : 0)} ms`;
  return `+${(ms / 1000).toFixed(2)} s`;
}
function fmtRate(perMin) {
  if (!perMin) return "no traffic";
  if (perMin >= 10) return `${Math.round(perMin)} per minute`;
  if (perMin >= 1) return `${perMin.toFixed(1)} per minute`;
  const perHour = perMin * 60;
  return `${perHour >= 10 ? Math.round(perHour) : perHour.toFixed(1)} per hour`;
}
const fmtPct = (r) => (r === null || r === undefined ? "—" : `${(r * 100).toFixed(r >= 0.9995 || r === 0 ? 0 : 1)}%`);
const timeEl = (iso) => h("time", { datetime: iso || "", title: fmtTime(iso), dataset: { rel: iso || "" } }, rel(iso));
const stateLabel = (s) => (s || "").replace(/_/g, " ");
const chip = (state) => h("span", { class: `chip s-${state}` }, stateLabel(state));
// statusChip shows an intent's state; a queued intent that carries an error
// is a failed attempt waiting for its retry, not a fresh queue entry.
const statusChip = (v) => (v.status === "queued" && v.errorCode
  ? h("span", { class: "chip s-retry", title: `last attempt failed: ${v.errorCode}` }, "retry wait")
  : chip(v.status));
const bucketChip = (b, text) => h("span", { class: `chip b-${b}` }, text || stateLabel(b));

function route(from, to) {
  return h("span", { class: "route", title: `${from} → ${to}` },
    h("span", { class: "id" }, from || "—"), h("span", { class: "arrow", "aria-hidden": "true" }, "→"), h("span", { class: "id" }, to || "—"));
}

function jsonPre(value) {
  const pre = h("pre", { class: "json", tabindex: "0" });
  const text = JSON.stringify(value, null, 2) ?? "null";
  const re = /("(\\u[a-fA-F0-9]{4}|\\[^u]|[^\\"])*"(\s*:)?|\b(true|false|null)\b|-?\d+(?:\.\d+)?(?:[eE][+-]?\d+)?)/g;
  let last = 0;
  for (const m of text.matchAll(re)) {
    pre.append(text.slice(last, m.index));
    let cls = "n";
    if (m[0].startsWith('"')) cls = m[3] ? "k" : "s";
    else if (/true|false|null/.test(m[0])) cls = "b";
    pre.append(h("span", { class: cls }, m[0]));
    last = m.index + m[0].length;
  }
  pre.append(text.slice(last));
  return pre;
}

// put replaces el's children, skipping null, undefined and false.
function put(el, ...kids) {
  el.replaceChildren(...kids.flat().filter((k) => k !== null && k !== undefined && k !== false));
}

function emptyState(iconPath, title, text, ...extra) {
  return h("div", { class: "empty" }, icon(iconPath), h("h3", null, title), text ? h("p", null, text) : null, ...extra);
}
// showError shows one error banner at the top of a view.
function showError(root, err) {
  root.querySelector(":scope > .view-error")?.remove();
  const box = errorBox(err);
  box.classList.add("view-error");
  root.prepend(box);
}
const errorBox = (err) => h("div", { class: "error-box", role: "alert" }, `Could not load: ${err.message || err}`);

let toastTimer;
function toast(msg) {
  const t = document.getElementById("toast");
  t.textContent = msg;
  t.hidden = false;
  clearTimeout(toastTimer);
  toastTimer = setTimeout(() => { t.hidden = true; }, 3500);
}

// ---------- API ----------

async function api(path, opts = {}) {
  const headers = { Accept: "application/json" };
  const method = opts.method || "GET";
  if (method !== "GET") headers["X-CSRF-Token"] = CSRF;
  const res = await fetch(path, { method, headers, credentials: "same-origin", signal: opts.signal });
  if (res.status === 401) {
    location.assign("/dashboard/login");
    throw new Error("signed out");
  }
  let body = null;
  try { body = await res.json(); } catch { /* empty body */ }
  if (!res.ok) {
    const e = new Error((body && body.error) || `${res.status} ${res.statusText}`);
    e.status = res.status;
    e.code = body && body.errorCode;
    throw e;
  }
  return body;
}

// ---------- live stream ----------

const live = document.getElementById("live");
const liveText = document.getElementById("live-text");
function setLive(state, text) {
  live.dataset.state = state;
  liveText.textContent = text;
}

// openStream follows /observability/stream after seq `after` (null: from
// now on), calling
// onBatch with the events of each animation frame. It resumes exactly after
// the last event it saw, on the browser's own reconnects (Last-Event-ID) and
// on its own when the browser gives up.
function openStream(after, onBatch) {
  let lastSeq = after;
  let es = null;
  let closed = false;
  let retry = null;
  let pending = [];
  let raf = 0;
  const flush = () => {
    raf = 0;
    const batch = pending;
    pending = [];
    if (batch.length) onBatch(batch);
  };
  const connect = () => {
    if (closed) return;
    setLive("connecting", "Connecting");
    es = new EventSource(lastSeq === null ? "/observability/stream" : `/observability/stream?after=${encodeURIComponent(lastSeq)}`);
    es.addEventListener("open", () => setLive("live", "Live"));
    es.addEventListener("intent", (m) => {
      const ev = JSON.parse(m.data);
      if (lastSeq !== null && ev.seq <= lastSeq) return;
      lastSeq = ev.seq;
      pending.push(ev);
      if (!raf) raf = requestAnimationFrame(flush);
    });
    es.addEventListener("error", async () => {
      if (closed) return;
      if (es.readyState === EventSource.CONNECTING) {
        setLive("connecting", "Reconnecting");
        return;
      }
      es.close();
      setLive("error", "Disconnected");
      try { await api("/dashboard/session"); } catch { return; }
      retry = setTimeout(connect, 3000);
    });
  };
  connect();
  return () => {
    closed = true;
    clearTimeout(retry);
    if (raf) cancelAnimationFrame(raf);
    if (es) es.close();
    setLive("idle", "Idle");
  };
}

// ---------- router ----------

const VIEWS = {
  overview: { title: "Overview", render: renderOverview },
  intents: { title: "Intents", render: renderIntents },
  trace: { title: "Trace", nav: "intents", render: renderTrace },
  "dead-letters": { title: "Dead letters", render: renderDeadLetters },
  agents: { title: "Agents", render: renderAgents },
  federation: { title: "Federation", render: renderFederation },
  jobs: { title: "Jobs", render: renderJobs },
  pipelines: { title: "Pipelines", render: renderPipelines },
  pipeline: { title: "Envelope", nav: "pipelines", render: renderPipeline },
};

let cleanup = null;
let navToken = 0;

function parseHash() {
  const raw = location.hash.replace(/^#\/?/, "");
  const [path, query] = raw.split("?");
  const parts = path.split("/").filter(Boolean).map(decodeURIComponent);
  const params = new URLSearchParams(query || "");
  let view = parts[0] || "overview";
  let arg = parts.slice(1).join("/");
  if (view === "intents" && arg) view = "trace";
  if (view === "pipelines" && arg) view = "pipeline";
  if (!VIEWS[view]) view = "overview";
  return { view, arg, params };
}

function navigate() {
  const { view, arg, params } = parseHash();
  if (cleanup) { try { cleanup(); } catch { /* ignore */ } }
  cleanup = null;
  const def = VIEWS[view];
  const navName = def.nav || view;
  document.querySelectorAll(".nav a").forEach((a) => {
    if (a.dataset.view === navName) a.setAttribute("aria-current", "page");
    else a.removeAttribute("aria-current");
  });
  document.getElementById("crumb-title").textContent = view === "trace" ? `Trace ${arg.slice(0, 18)}${arg.length > 18 ? "…" : ""}` : def.title;
  document.title = `${def.title} · Beam directory`;
  put(content);
  const token = ++navToken;
  const res = def.render(content, { arg, params, isCurrent: () => token === navToken });
  cleanup = typeof res === "function" ? res : null;
}

function setHashQuery(view, params) {
  const q = params.toString();
  history.replaceState(null, "", `#/${view}${q ? "?" + q : ""}`);
}

window.addEventListener("hashchange", navigate);

// Keyboard: "/" focuses the intent search, "g" then a letter switches view.
let gPending = 0;
document.addEventListener("keydown", (e) => {
  const t = e.target;
  const typing = t && (t.tagName === "INPUT" || t.tagName === "SELECT" || t.tagName === "TEXTAREA" || t.isContentEditable);
  if (e.key === "Escape" && typing) { t.blur(); return; }
  if (typing || e.metaKey || e.ctrlKey || e.altKey) return;
  if (e.key === "/") {
    e.preventDefault();
    const s = document.getElementById("q");
    if (s) s.focus();
    else { pendingFocus = true; location.hash = "#/intents"; }
    return;
  }
  if (e.key === "g") { gPending = Date.now(); return; }
  if (gPending && Date.now() - gPending < 1200) {
    const to = { o: "overview", i: "intents", d: "dead-letters", a: "agents", f: "federation" }[e.key];
    gPending = 0;
    if (to) location.hash = `#/${to}`;
  }
});
let pendingFocus = false;

// Relative times tick.
setInterval(() => {
  document.querySelectorAll("time[data-rel]").forEach((t) => { if (t.dataset.rel) t.textContent = rel(t.dataset.rel); });
}, 10000);

// The logout form posts with the CSRF field; fetch keeps the JSON path.
document.getElementById("logout-form").addEventListener("submit", async (e) => {
  e.preventDefault();
  try {
    const r = await api("/dashboard/logout", { method: "POST" });
    location.assign(r.redirect || "/dashboard/login");
  } catch {
    location.assign("/dashboard/login");
  }
});

function pageHead(title, sub, ...actions) {
  return h("div", { class: "page-head" },
    h("div", null, h("h1", null, title), sub ? h("p", null, sub) : null),
    actions.length ? h("div", { class: "actions" }, ...actions) : null);
}

function segmented(options, current, onPick, label) {
  const wrap = h("div", { class: "segmented", role: "group", "aria-label": label });
  for (const [value, text] of options) {
    wrap.append(h("button", {
      type: "button", "aria-pressed": String(String(value) === String(current)),
      onclick: () => onPick(value),
    }, text));
  }
  return wrap;
}

function metric(label, id, hint) {
  return h("div", { class: "card metric", id: `m-${id}` },
    h("div", { class: "label" }, label),
    h("div", { class: "value skeleton sk-value" }, "0"),
    h("div", { class: "hint" }, hint || "\u00a0"));
}
function setMetric(id, value, hint, tone) {
  const card = document.getElementById(`m-${id}`);
  if (!card) return;
  const v = card.querySelector(".value");
  v.className = "value";
  put(v, ...(Array.isArray(value) ? value : [value]));
  if (hint !== undefined) card.querySelector(".hint").textContent = hint;
  card.classList.remove("tone-ok", "tone-err", "tone-warn");
  if (tone) card.classList.add(`tone-${tone}`);
}

// ---------- overview ----------

const OVERVIEW_WINDOWS = [["0.25", "15m"], ["1", "1h"], ["6", "6h"], ["24", "24h"], ["168", "7d"]];

function renderOverview(root, { params, isCurrent }) {
  // Without a chosen window the server picks one from the data's age.
  let hours = OVERVIEW_WINDOWS.some(([v]) => v === params.get("hours")) ? params.get("hours") : "auto";
  const windowName = (hrs) => ({ 0.25: "last 15 minutes", 1: "last hour", 6: "last 6 hours", 24: "last 24 hours", 168: "last 7 days" }[hrs] || `last ${hrs} hours`);
  const headSub = h("p", { id: "overview-window" }, "Intent outcomes, latency and directory health.");
  const windowPick = h("div");
  const drawWindowPick = (current) => put(windowPick, segmented(OVERVIEW_WINDOWS, current, (v) => {
    params.set("hours", v);
    setHashQuery("overview", params);
    navigate();
  }, "Time window"));
  drawWindowPick(hours);
  root.append(h("div", { class: "page-head" }, h("div", null, h("h1", null, "Overview"), headSub), h("div", { class: "actions" }, windowPick)));
  root.append(h("div", { class: "grid metrics" },
    metric("Intents", "total"), metric("Success rate", "success"), metric("p95 latency", "p95"),
    metric("Connected agents", "agents"), metric("Queue depth", "queue"), metric("Dead letters", "dead")));

  const outcome = h("div", { class: "card-body" },
    h("div", { class: "outcome-bar", id: "outcome-bar", role: "img", "aria-label": "Outcome buckets" }),
    h("div", { class: "legend", id: "outcome-legend" }, "\u00a0"));
  const tput = document.createElementNS(svgNS, "svg");
  tput.setAttribute("class", "chart");
  const lat = document.createElementNS(svgNS, "svg");
  lat.setAttribute("class", "chart");
  const tputBody = h("div", { class: "card-body" }, tput);
  const latBody = h("div", { class: "card-body" }, lat);

  const left = h("div", { class: "stack" },
    h("section", { class: "card", "aria-labelledby": "h-outcomes" },
      h("div", { class: "card-head" }, h("h2", { id: "h-outcomes" }, "Outcome buckets"), h("span", { class: "sub", id: "outcome-sub" }, "")),
      outcome),
    h("section", { class: "card", "aria-labelledby": "h-tput" },
      h("div", { class: "card-head" }, h("h2", { id: "h-tput" }, "Throughput"),
        h("div", { class: "right legend" },
          h("span", null, h("i", { class: "seg-success" }), "acked"),
          h("span", null, h("i", { class: "seg-error" }), "failed"),
          h("span", null, h("i", { class: "seg-inflight" }), "in flight"))),
      tputBody),
    h("section", { class: "card", "aria-labelledby": "h-lat" },
      h("div", { class: "card-head" }, h("h2", { id: "h-lat" }, "Latency"), h("span", { class: "sub", id: "lat-sub" }, ""),
        h("div", { class: "right legend" },
          h("span", { id: "lat-owner" }),
          h("span", null, h("i", { class: "leg-p50" }), "p50"),
          h("span", null, h("i", { class: "leg-p95" }), "p95"))),
      latBody));
  const alerts = h("div", { class: "card-body", id: "alerts" }, h("div", { class: "skeleton sk-line" }), h("div", { class: "skeleton sk-line" }));
  const tops = h("div", { class: "card-body", id: "top-intents" }, h("div", { class: "skeleton sk-line" }), h("div", { class: "skeleton sk-line" }));
  const errs = h("div", { class: "card-body", id: "top-errors" }, h("div", { class: "skeleton sk-line" }));
  const fed = h("div", { class: "card-body", id: "fed-card" }, h("div", { class: "skeleton sk-line" }));
  const right = h("div", { class: "stack" },
    h("section", { class: "card" }, h("div", { class: "card-head" }, h("h2", null, "Alerts")), alerts),
    h("section", { class: "card" }, h("div", { class: "card-head" }, h("h2", null, "Top intents")), tops),
    h("section", { class: "card" }, h("div", { class: "card-head" }, h("h2", null, "Error pressure"),
      h("a", { class: "right", href: "#/intents?status=error" }, "View failures")), errs),
    h("section", { class: "card" }, h("div", { class: "card-head" }, h("h2", null, "Federation"),
      h("a", { class: "right", href: "#/federation" }, "Details")), fed));
  root.append(h("div", { class: "grid cols-main" }, left, right));

  let data = null;
  // Directory intents finish in milliseconds, bus messages can wait minutes
  // for retries: the latency chart shows one owner at a time.
  let latOwner = params.get("latency") === "bus" ? "bus" : "directory";
  const ownerSeries = (tl, owner) => tl.map((b) => {
    const o = (b.latencyByOwner || {})[owner];
    return { ...b, p50LatencyMs: o ? o.p50LatencyMs : null, p95LatencyMs: o ? o.p95LatencyMs : null };
  });
  const drawCharts = () => {
    if (!data || !isCurrent()) return;
    const tl = data.timeline || [];
    if (!data.summary.totalIntents) {
      put(tputBody, h("div", { class: "chart-empty" }, "No intents in this window yet."));
      put(latBody, h("div", { class: "chart-empty" }, "Latency appears once intents complete."));
      return;
    }
    if (!tputBody.contains(tput)) put(tputBody, tput);
    if (!latBody.contains(lat)) put(latBody, lat);
    stackedBars(tput, tl, data.bucketSeconds, "Intents per time bucket by outcome");
    const owners = data.summary.latencyByOwner || {};
    if (!owners[latOwner] && owners[latOwner === "bus" ? "directory" : "bus"]) latOwner = latOwner === "bus" ? "directory" : "bus";
    put(document.getElementById("lat-owner"), segmented([["directory", "Direct"], ["bus", "Bus"]].filter(([o]) => owners[o] || o === latOwner), latOwner, (o) => {
      latOwner = o;
      params.set("latency", o);
      setHashQuery("overview", params);
      drawCharts();
    }, "Latency of"));
    lat.dataset.owner = latOwner;
    latencyLines(lat, ownerSeries(tl, latOwner), data.bucketSeconds, `p50 and p95 latency of ${latOwner === "bus" ? "bus messages" : "direct intents"} per time bucket`);
  };

  let linkHours = "24";
  const fill = (d) => {
    data = d;
    // The intents list offers 1 h, 24 h, 7 d and 30 d.
    linkHours = String([1, 24, 168, 720].find((x) => x >= d.windowHours) || 720);
    const s = d.summary;
    setMetric("total", fmtInt(s.totalIntents), fmtRate(s.throughputPerMin));
    setMetric("success", fmtPct(s.successRate), `${fmtInt(s.successCount)} acked · ${fmtInt(s.errorCount)} failed`,
      s.successRate === null ? null : s.successRate >= 0.95 ? "ok" : s.successRate >= 0.8 ? "warn" : "err");
    const lo = s.latencyByOwner || {};
    const dl = lo.directory;
    const bl = lo.bus;
    if (dl || !bl) setMetric("p95", fmtMs(dl ? dl.p95LatencyMs : null), `direct intents · p50 ${fmtMs(dl ? dl.p50LatencyMs : null)}${bl ? ` · bus p95 ${fmtMs(bl.p95LatencyMs)}` : ""}`);
    else setMetric("p95", fmtMs(bl.p95LatencyMs), `bus messages · p50 ${fmtMs(bl.p50LatencyMs)}`);
    if (hours === "auto" || String(d.windowHours) !== hours) {
      drawWindowPick(String(d.windowHours));
    }
    headSub.textContent = `Intent outcomes, latency and directory health over the ${windowName(d.windowHours)}${d.autoWindow ? " (chosen from the age of the data)" : ""}.`;
    setMetric("agents", [fmtInt(s.connectedAgents), h("small", null, `/ ${fmtInt(s.totalAgents)}`)], `${fmtInt(s.staleAgents)} not seen for 24 h`);
    setMetric("queue", fmtInt(s.queueDepth), "bus messages queued or dispatched");
    setMetric("dead", fmtInt(s.deadLetters), s.deadLetters ? "need an operator" : "nothing waiting", s.deadLetters ? "err" : null);
    setNavDead(s.deadLetters);

    const total = s.totalIntents || 0;
    const bar = document.getElementById("outcome-bar");
    put(bar);
    const segs = [["success", s.successCount, "seg-success", "acked"], ["error", s.errorCount, "seg-error", "failed · dead letter"],
      ["in_flight", s.inFlightCount, "seg-inflight", "in flight"]];
    for (const [, n, cls] of segs) {
      if (!total || !n) continue;
      const sp = h("span", { class: cls });
      sp.style.width = `${(n / total) * 100}%`;
      bar.append(sp);
    }
    put(document.getElementById("outcome-legend"), ...segs.map(([b, n, cls, label]) =>
      h("a", { href: `#/intents?status=${b}&hours=${linkHours}` }, h("i", { class: cls }), label, h("b", null, fmtInt(n)))),
    h("span", { class: "muted" }, `${fmtInt(s.inFlightOlderThan15m)} in flight for over 15 min`));
    document.getElementById("outcome-sub").textContent = `${fmtInt(total)} intents`;
    document.getElementById("lat-sub").textContent = s.latencySampled ? "sampled" : "";
    drawCharts();

    put(alerts, ...(d.alerts.length ? d.alerts.map((a) => h("div", { class: "alert-item", dataset: { sev: a.severity } },
      h("div", { class: "sev" }), h("div", null, h("strong", null, a.title), h("span", null, a.message))))
      : [h("div", { class: "notice" }, icon(ICONS.info), "No alerts. Error rate, latency and backlog are within thresholds.")]));

    const maxCount = Math.max(1, ...d.topIntents.map((t) => t.count));
    put(tops, d.topIntents.length ? h("ul", { class: "rank" }, ...d.topIntents.map((t) => {
      const bar = h("span");
      bar.style.width = `${(t.count / maxCount) * 100}%`;
      return h("li", null,
        h("a", { class: "name", href: `#/intents?intentType=${encodeURIComponent(t.intentType)}&hours=${linkHours}` }, t.intentType || "(none)"),
        h("span", { class: "num" }, `${fmtInt(t.count)} · ${fmtMs(t.avgLatencyMs)}`),
        h("div", { class: "bar" }, bar));
    })) : h("p", { class: "muted" }, "No intents in this window."));

    const maxErr = Math.max(1, ...d.topErrors.map((t) => t.count));
    put(errs, d.topErrors.length ? h("ul", { class: "rank" }, ...d.topErrors.map((t) => {
      const bar = h("span");
      bar.style.width = `${(t.count / maxErr) * 100}%`;
      return h("li", null,
        h("a", { class: "name mono", href: `#/intents?errorCode=${encodeURIComponent(t.errorCode)}&hours=${linkHours}` }, t.errorCode),
        h("span", { class: "num" }, fmtInt(t.count)),
        h("div", { class: "bar err" }, bar));
    })) : h("p", { class: "muted" }, "No failures in this window."));

    put(fed, federationSummary(d.federation));
  };

  const load = async () => {
    try {
      const d = await api(`/observability/overview?hours=${hours}`);
      if (isCurrent()) fill(d);
      return d;
    } catch (err) {
      if (isCurrent()) showError(root, err);
      return null;
    }
  };

  let stop = null;
  let timer = null;
  let refreshQueued = false;
  const ro = new ResizeObserver(() => drawCharts());
  ro.observe(tputBody);
  load().then((d) => {
    if (!d || !isCurrent()) return;
    // Refresh on live traffic, at most every 2 s.
    stop = openStream(d.lastSeq, () => {
      if (refreshQueued) return;
      refreshQueued = true;
      timer = setTimeout(async () => { refreshQueued = false; await load(); }, 2000);
    });
  });
  document.addEventListener("beam-theme", drawCharts);
  return () => {
    ro.disconnect();
    clearTimeout(timer);
    document.removeEventListener("beam-theme", drawCharts);
    if (stop) stop();
  };
}

function federationSummary(f) {
  if (!f || !f.configured) {
    return h("div", { class: "notice" }, icon(ICONS.globe), f && f.message ? f.message : "Federation is not configured on this directory.");
  }
  if (f.error) return h("div", { class: "error-box" }, `Federation status unavailable: ${f.error}`);
  const st = f.status || {};
  const peers = Array.isArray(st.peers) ? st.peers : null;
  const items = [h("div", null, bucketChip("success", "configured"))];
  if (peers) items.push(h("p", null, `${peers.length} peer${peers.length === 1 ? "" : "s"}`));
  if (st.outbox && typeof st.outbox === "object") {
    items.push(h("dl", { class: "kv" }, ...Object.entries(st.outbox).slice(0, 6).flatMap(([k, v]) => [h("dt", null, k), h("dd", null, typeof v === "object" ? JSON.stringify(v) : String(v))])));
  }
  return h("div", null, ...items);
}

let navDead = null;
function setNavDead(n) {
  navDead = n;
  document.getElementById("nav-dead").textContent = n ? fmtInt(n) : "";
}

// ---------- intents ----------

const STATUS_OPTIONS = [["", "All states"], ["success", "Success (acked)"], ["error", "Error (failed, dead letter)"], ["in_flight", "In flight"],
  ["received", "received"], ["validated", "validated"], ["queued", "queued"], ["dispatched", "dispatched"], ["delivered", "delivered"],
  ["acked", "acked"], ["failed", "failed"], ["dead_letter", "dead letter"]];
const BUCKET_STATES = {
  success: ["acked"], error: ["failed", "dead_letter"],
  in_flight: ["received", "validated", "queued", "dispatched", "delivered"],
};

function renderIntents(root, { params, isCurrent }) {
  const f = {
    q: params.get("q") || "", beamId: params.get("beamId") || "", intentType: params.get("intentType") || "",
    status: params.get("status") || "", hours: params.get("hours") || "24", errorCode: params.get("errorCode") || "",
  };
  const rows = new Map(); // nonce → { tr, data }
  let pendingNew = [];
  let total = 0;
  let stop = null;
  let offset = Math.max(0, Number(params.get("offset")) || 0);
  const pagerSlot = h("div");

  root.append(pageHead("Intents", "Every intent this directory handled, newest first. New intents stream in live."));

  const input = (id, label, value, placeholder) => h("div", { class: "field" },
    h("label", { for: id }, label),
    h("input", { class: "input", id, value, placeholder, autocomplete: "off", spellcheck: "false" }));
  const search = h("div", { class: "field" }, h("label", { for: "q" }, "Search"),
    h("div", { class: "search" }, icon(ICONS.search),
      h("input", { class: "input", id: "q", type: "search", value: f.q, placeholder: "Nonce, Beam ID, intent, error code", autocomplete: "off", spellcheck: "false" }),
      h("span", { class: "kbd", "aria-hidden": "true" }, "/")));
  const statusSel = h("select", { class: "input", id: "f-status" }, ...STATUS_OPTIONS.map(([v, t]) => h("option", { value: v, selected: v === f.status }, t)));
  const hoursSel = h("select", { class: "input", id: "f-hours" }, ...[["1", "Last hour"], ["24", "Last 24 h"], ["168", "Last 7 days"], ["720", "Last 30 days"]]
    .map(([v, t]) => h("option", { value: v, selected: v === f.hours }, t)));
  const form = h("form", { class: "filters", role: "search", onsubmit: (e) => { e.preventDefault(); apply(); } },
    search,
    input("f-beam", "Beam ID (from or to)", f.beamId, "alice@acme.beam.directory"),
    input("f-type", "Intent type", f.intentType, "task.run"),
    h("div", { class: "field" }, h("label", { for: "f-status" }, "State or bucket"), statusSel),
    h("div", { class: "field" }, h("label", { for: "f-hours" }, "Time"), hoursSel),
    h("div", { class: "field" }, h("label", { class: "sr-only" }, "Apply"), h("button", { class: "btn", type: "submit" }, "Apply")));
  statusSel.addEventListener("change", () => apply());
  hoursSel.addEventListener("change", () => apply());

  const statsEl = h("div", { class: "stats-inline" }, h("span", null, "Loading…"));
  const newPill = h("button", { class: "new-pill", type: "button", hidden: true, onclick: () => showPending(true) }, "");
  const bar = h("div", { class: "feed-bar" }, statsEl, newPill, h("div", { class: "right muted", id: "feed-note" }, ""));
  const tbody = h("tbody", { id: "intent-rows" });
  const table = h("table", { class: "data", id: "intents-table" },
    h("thead", null, h("tr", null,
      ...[["Status", "150px"], ["Intent", "16%"], ["Nonce", "190px"], ["Route", ""], ["Transport", "110px"], ["Latency", "96px"], ["Requested", "120px"]]
        .map(([t, w]) => { const th = h("th", { scope: "col", class: t === "Latency" ? "num" : null }, t); if (w) th.style.width = w; return th; }))),
    tbody);
  const bodyWrap = h("div", { class: "table-wrap" }, table);
  const empty = h("div", { hidden: true });
  root.append(h("section", { class: "card", "aria-label": "Intent feed" }, form, bar, bodyWrap, empty, pagerSlot));

  // Reserve space while loading.
  for (let i = 0; i < 8; i++) {
    tbody.append(h("tr", { class: "sk" }, ...Array.from({ length: 7 }, () => h("td", null, h("div", { class: "skeleton sk-line" })))));
  }

  function matches(v) {
    if (!v) return false;
    if (f.status) {
      const set = BUCKET_STATES[f.status] || [f.status];
      if (!set.includes(v.status)) return false;
    }
    if (f.beamId && v.from !== f.beamId && v.to !== f.beamId) return false;
    if (f.intentType && v.intentType !== f.intentType) return false;
    if (f.errorCode && v.errorCode !== f.errorCode) return false;
    if (f.q) {
      const q = f.q.toLowerCase();
      if (![v.nonce, v.from, v.to, v.intentType, v.errorCode].some((x) => (x || "").toLowerCase().includes(q))) return false;
    }
    const since = Date.now() - Number(f.hours) * 3600 * 1000;
    return new Date(v.requestedAt).getTime() >= since;
  }

  function rowFor(v) {
    const tr = h("tr", {
      class: "row-link", tabindex: "0", dataset: { nonce: v.nonce },
      onclick: (e) => { if (!e.target.closest("a")) openTrace(v.nonce); },
      onkeydown: (e) => {
        if (e.key === "Enter") { e.preventDefault(); openTrace(v.nonce); }
        if (e.key === "ArrowDown" && tr.nextElementSibling) { e.preventDefault(); tr.nextElementSibling.focus(); }
        if (e.key === "ArrowUp" && tr.previousElementSibling) { e.preventDefault(); tr.previousElementSibling.focus(); }
      },
    });
    fillRow(tr, v);
    return tr;
  }
  function fillRow(tr, v) {
    tr.dataset.status = v.status;
    put(tr, 
      h("td", null, statusChip(v), v.errorCode ? h("span", { class: "sr-only" }, ` ${v.errorCode}`) : null),
      h("td", { title: v.intentType }, v.intentType || "—"),
      h("td", null, h("a", { class: "nonce", href: `#/intents/${encodeURIComponent(v.nonce)}`, title: v.nonce, tabindex: "-1" }, v.nonce)),
      h("td", null, route(v.from, v.to)),
      h("td", { class: "muted" }, v.transport || "—"),
      h("td", { class: "num" }, v.errorCode && v.roundTripLatencyMs === null ? h("span", { class: "chip code" }, v.errorCode) : fmtMs(v.roundTripLatencyMs)),
      h("td", null, timeEl(v.requestedAt)));
  }
  function openTrace(nonce) { location.hash = `#/intents/${encodeURIComponent(nonce)}`; }

  function updateStats() {
    const vals = [...rows.values()].map((r) => r.data);
    const inflight = vals.filter((v) => BUCKET_STATES.in_flight.includes(v.status)).length;
    const failed = vals.filter((v) => BUCKET_STATES.error.includes(v.status)).length;
    const lats = vals.map((v) => v.roundTripLatencyMs).filter((x) => x !== null && x !== undefined).sort((a, b) => a - b);
    const p95 = lats.length ? lats[Math.max(0, Math.ceil(0.95 * lats.length) - 1)] : null;
    put(statsEl, 
      h("span", null, "Showing ", h("b", null, fmtInt(rows.size)), " of ", h("b", null, fmtInt(total))),
      h("span", null, "In flight ", h("b", null, fmtInt(inflight))),
      h("span", null, "Failures ", h("b", null, fmtInt(failed))),
      h("span", null, "p95 ", h("b", null, fmtMs(p95))));
    const none = rows.size === 0;
    empty.hidden = !none;
    bodyWrap.hidden = none;
  }

  function trim() {
    while (tbody.children.length > FEED_MAX) {
      const tr = tbody.lastElementChild;
      rows.delete(tr.dataset.nonce);
      tr.remove();
    }
  }

  function showPending(scroll) {
    const list = pendingNew;
    pendingNew = [];
    newPill.hidden = true;
    for (const v of list) insertTop(v);
    trim();
    updateStats();
    if (scroll) window.scrollTo({ top: 0, behavior: "smooth" });
  }
  function insertTop(v) {
    if (rows.has(v.nonce)) { const r = rows.get(v.nonce); r.data = v; fillRow(r.tr, v); return; }
    const tr = rowFor(v);
    tr.classList.add("fresh");
    tbody.prepend(tr);
    rows.set(v.nonce, { tr, data: v });
    total++;
  }

  function onBatch(events) {
    // Keep the newest summary per nonce of this batch.
    const latest = new Map();
    for (const ev of events) if (ev.intent) latest.set(ev.nonce, ev.intent);
    const fresh = [];
    for (const v of latest.values()) {
      const r = rows.get(v.nonce);
      if (r) { r.data = v; fillRow(r.tr, v); continue; }
      const p = pendingNew.findIndex((x) => x.nonce === v.nonce);
      if (p >= 0) { pendingNew[p] = v; continue; }
      if (matches(v)) { if (offset) total++; else fresh.push(v); }
    }
    fresh.sort((a, b) => a.requestedAt.localeCompare(b.requestedAt));
    if (fresh.length) {
      if (window.scrollY > 80) {
        pendingNew.push(...fresh);
        newPill.hidden = false;
        newPill.textContent = `${pendingNew.length} new intent${pendingNew.length === 1 ? "" : "s"} ↑`;
      } else {
        for (const v of fresh) insertTop(v);
        trim();
      }
    }
    document.getElementById("feed-note").textContent = `Latest event ${fmtClock(events[events.length - 1].at)}`;
    updateStats();
  }

  async function load() {
    const q = new URLSearchParams();
    for (const [k, v] of Object.entries(f)) if (v) q.set(k, v);
    if (offset) q.set("offset", String(offset));
    setHashQuery("intents", new URLSearchParams([...q].filter(([k, v]) => !(k === "hours" && v === "24"))));
    q.set("limit", String(PAGE));
    if (stop) { stop(); stop = null; }
    try {
      const d = await api(`/observability/intents?${q}`);
      if (!isCurrent()) return;
      rows.clear();
      put(tbody);
      pendingNew = [];
      newPill.hidden = true;
      total = d.total;
      for (const v of d.intents) {
        const tr = rowFor(v);
        tbody.append(tr);
        rows.set(v.nonce, { tr, data: v });
      }
      const filtered = Object.entries(f).some(([k, v]) => v && !(k === "hours" && v === "24"));
      put(empty, filtered
        ? emptyState(ICONS.search, "No intents match these filters", "Clear a filter or widen the time window. Matching intents will appear here as they arrive.")
        : emptyState(ICONS.pulse, "No intents yet", "Intents appear here the moment an agent sends one. Try sending to echo@beam.directory."));
      updateStats();
      put(pagerSlot, pager("intents-pager", d.total, offset, d.intents.length, (o) => { offset = o; load(); window.scrollTo({ top: 0 }); }));
      stop = openStream(d.lastSeq, onBatch);
    } catch (err) {
      if (isCurrent()) { put(tbody); showError(root, err); }
    }
  }

  function apply() {
    f.q = document.getElementById("q").value.trim();
    f.beamId = document.getElementById("f-beam").value.trim();
    f.intentType = document.getElementById("f-type").value.trim();
    f.status = statusSel.value;
    f.hours = hoursSel.value;
    offset = 0;
    load();
  }
  let debounce = 0;
  document.getElementById("q").addEventListener("input", () => { clearTimeout(debounce); debounce = setTimeout(apply, 300); });

  load();
  if (pendingFocus) { pendingFocus = false; document.getElementById("q").focus(); }
  const onScroll = () => { if (window.scrollY < 10 && pendingNew.length) showPending(false); };
  window.addEventListener("scroll", onScroll, { passive: true });
  return () => {
    clearTimeout(debounce);
    window.removeEventListener("scroll", onScroll);
    if (stop) stop();
  };
}

// ---------- trace ----------

const FACT_KEYS = [
  ["errorCode", "Error code"], ["error", "Error"], ["retryable", "Retryable"], ["retryCount", "Retry count"],
  ["nextRetryAt", "Next retry"], ["recoveryAction", "Recovery action"], ["fallbackReason", "Fallback"],
  ["legacyStage", "Legacy stage"], ["legacyStatus", "Legacy status"], ["peer", "Federation peer"],
  ["peerUrl", "Federation peer"], ["peerDirectory", "Federation peer"], ["hopCount", "Hop count"], ["hop", "Hop"],
  ["requeued", "Requeued"], ["previousState", "Previous state"], ["waitingFor", "Waiting for"], ["lateResult", "Late result"], ["timeoutMs", "Timeout"], ["latencyMs", "Latency"], ["leaseOwner", "Lease owner"],
];

// outboxGroupItem is one timeline entry for a run of federation outbox
// retries (see foldOutboxRetries): how many, since when, the last error.
function outboxGroupItem(g, n) {
  const first = g.stages[0];
  const last = g.stages[g.stages.length - 1];
  const tries = g.attempts || g.stages.length;
  return h("li", { class: "tl-group", dataset: { state: first.state, seq: String(first.seq), count: String(g.stages.length) } },
    h("div", { class: `tl-dot s-${g.gaveUp ? "dead_letter" : "retry"}`, "aria-hidden": "true" }),
    h("div", { class: "tl-card b-in_flight" },
      h("div", { class: "tl-top" },
        h("span", { class: "idx" }, `Stages ${first.index}–${last.index} of ${n}`),
        h("h3", { class: "stage-name" }, g.label),
        h("span", { class: "chip s-retry outbox-count" }, `× ${tries} attempt${tries === 1 ? "" : "s"}`),
        h("span", { class: "when" }, h("time", { datetime: first.at, title: fmtTime(first.at) }, fmtClock(first.at)), " – ",
          h("time", { datetime: last.at, title: fmtTime(last.at) }, fmtClock(last.at)))),
      h("div", { class: "tl-meta" },
        g.peer ? h("span", { class: "chip muted plain" }, `peer: ${g.peer}`) : null,
        h("span", { class: "chip muted plain" }, `${g.stages.length} outbox steps folded`),
        h("span", { class: "chip muted plain" }, `seq ${first.seq}–${last.seq}`)),
      g.lastError ? h("div", { class: "tl-facts" }, h("div", { class: "fact" }, h("b", null, "Last error"), g.lastError)) : null,
      h("p", { class: "reason" }, g.gaveUp
        ? "The relay gave up on this peer: beam peer outbox --state DEAD lists the row, beam peer replay ROW-ID sends it again."
        : "The federation outbox keeps the message and retries with a backoff until the peer is back; nothing is lost.")));
}

// takenOverChip names where an event came from when it was written by
// another node whose log this one took over (details.takenOver), or which
// node's log an adopted item was taken over from (details.adoptedFrom, the
// takeover's marker); null for an event of this node's own.
function takenOverChip(details) {
  const from = details.takenOver || details.adoptedFrom;
  if (!from || typeof from !== "object") return null;
  const what = details.takenOver ? "written on" : "taken over from";
  return h("span", { class: "chip link-failing taken-over", title: `log ${from.log || "?"}`, dataset: { node: from.node || "", log: from.log || "" } },
    `${what} ${from.node || "another node"} · log ${String(from.log || "?").slice(0, 12)}`);
}

function renderTrace(root, { arg, isCurrent }) {
  const nonce = arg;
  const head = h("section", { class: "card trace-head" },
    h("div", null, h("div", { class: "eyebrow" }, "Intent trace"), h("h1", { class: "skeleton" }, "Loading trace"),
      h("div", { class: "nonce-line" }, h("span", { class: "nonce" }, nonce))),
    h("div", null));
  const body = h("div", null, h("div", { class: "card card-body" }, ...Array.from({ length: 5 }, () => h("div", { class: "skeleton sk-line" }))));
  root.append(h("div", { class: "back-row" }, h("a", { class: "btn ghost small", href: "#/intents" }, "← Back to intents")), head, body);

  let stop = null;
  let timer = null;
  let lastSeq = 0;

  const draw = (t) => {
    const it = t.intent;
    lastSeq = Math.max(lastSeq, ...t.stages.map((s) => s.seq), it.lastSeq || 0);
    const transports = [...new Set(t.stages.map((s) => s.transport).filter(Boolean))];
    const attempts = Math.max(0, ...t.stages.map((s) => s.attempt || 0));
    put(head, 
      h("div", null,
        h("div", { class: "eyebrow" }, "Intent trace"),
        h("h1", null, it.intentType || "Intent"),
        h("div", { class: "nonce-line" }, h("span", null, "Nonce"), h("span", { class: "nonce", id: "trace-nonce" }, it.nonce),
          h("button", { class: "btn ghost small", type: "button", onclick: () => navigator.clipboard?.writeText(it.nonce).then(() => toast("Nonce copied")) }, "Copy")),
        h("div", { class: "chips" }, statusChip(it), bucketChip(it.bucket, it.bucket === "in_flight" ? "in flight" : it.bucket),
          it.errorCode ? h("span", { class: "chip code" }, it.errorCode) : null,
          h("span", { class: "chip muted plain" }, `owner: ${it.owner}`))),
      h("dl", { class: "trace-stats" },
        h("div", null, h("dt", null, "Latency"), h("dd", null, fmtMs(it.roundTripLatencyMs))),
        h("div", null, h("dt", null, "Stages"), h("dd", null, String(t.stages.length))),
        h("div", null, h("dt", null, "Attempts"), h("dd", null, String(attempts || 1))),
        h("div", null, h("dt", null, "Transport"), h("dd", null, transports.join(", ") || "—"))));

    const summary = h("section", { class: "card" }, h("div", { class: "card-head" }, h("h2", null, "Summary")),
      h("div", { class: "card-body" }, h("dl", { class: "kv" },
        h("dt", null, "From"), h("dd", { class: "mono" }, h("a", { href: `#/intents?beamId=${encodeURIComponent(it.from)}` }, it.from || "—")),
        h("dt", null, "To"), h("dd", { class: "mono" }, h("a", { href: `#/intents?beamId=${encodeURIComponent(it.to)}` }, it.to || "—")),
        h("dt", null, "Requested"), h("dd", null, fmtTime(it.requestedAt)),
        h("dt", null, "Client timestamp"), h("dd", null, it.timestamp || "—"),
        h("dt", null, "Completed"), h("dd", null, it.completedAt ? fmtTime(it.completedAt) : "not yet"),
        h("dt", null, "Timeout"), h("dd", null, it.timeoutMs ? fmtMs(it.timeoutMs) : "—"),
        h("dt", null, "Log position"), h("dd", null, `seq ${it.lastSeq}`))));

    const linkCards = [];
    for (const l of t.links) {
      linkCards.push(h("div", { class: "link-card" }, icon(ICONS.link),
        h("div", null, h("strong", null, "Federation hop"), h("div", { class: "muted" }, `${l.peer}${l.hopCount !== undefined && l.hopCount !== null ? ` · hop ${l.hopCount}` : ""}`)),
        l.href ? h("a", { class: "btn small", href: l.href, target: "_blank", rel: "noopener", "data-peer-link": l.peer }, "Open peer trace")
          : h("a", { class: "btn small", href: "#/federation", "data-peer-link": l.peer, title: "The peer's dashboard address is not known here; see the pinned peer" }, "View peer")));
    }
    if (t.message) {
      const m = t.message;
      linkCards.push(h("div", { class: "link-card" }, icon(ICONS.inbox),
        h("div", null, h("strong", null, "Bus message"), h("div", { class: "muted mono" }, `${m.id} · retries ${m.retryCount}/${m.maxRetries}`)),
        m.status === "dead_letter" ? h("a", { class: "btn small", href: `#/dead-letters/${encodeURIComponent(m.id)}` }, "Open dead letter") : chip(m.status)));
    }
    const related = h("section", { class: "card" }, h("div", { class: "card-head" }, h("h2", null, "Related")),
      h("div", { class: "card-body stack" }, ...(linkCards.length ? linkCards : [h("p", { class: "muted" }, "No federation hop or bus message for this intent.")])));

    const n = t.stages.length;
    const timeline = h("ol", { class: "timeline", id: "timeline" }, ...foldOutboxRetries(t.stages).map((s) => {
      if (s.group) return outboxGroupItem(s, n);
      let details = {};
      try { details = s.details || {}; } catch { details = {}; }
      const facts = FACT_KEYS.filter(([k]) => details[k] !== undefined && details[k] !== null && details[k] !== "")
        .map(([k, label]) => {
          let v = details[k];
          if (k === "timeoutMs" || k === "latencyMs") v = fmtMs(v);
          else if (k === "nextRetryAt") v = fmtTime(new Date(v).toISOString());
          else if (typeof v === "object") v = JSON.stringify(v);
          return h("div", { class: "fact" }, h("b", null, label), String(v));
        });
      const rest = Object.keys(details).length;
      const retry = retryFailure(s);
      return h("li", { dataset: { state: s.state, seq: String(s.seq) } },
        h("div", { class: `tl-dot s-${retry ? "retry" : s.state}`, "aria-hidden": "true" }),
        h("div", { class: `tl-card b-${s.bucket}` },
          h("div", { class: "tl-top" },
            h("span", { class: "idx" }, `Stage ${s.index} of ${n}`),
            h("h3", { class: "stage-name" }, retry ? `attempt ${s.attempt || ""} failed` : stateLabel(s.state)),
            retry ? h("span", { class: "chip s-retry" }, "failed · retry queued") : chip(s.state),
            s.annotation ? h("span", { class: "chip muted plain", title: "Same state again: an annotation, not a lifecycle move" }, "annotation") : null,
            h("span", { class: "when" }, h("time", { datetime: s.at, title: fmtTime(s.at) }, fmtClock(s.at)), " ",
              h("span", { class: "delta" }, s.index === 1 ? "start" : fmtDelta(s.deltaMs)))),
          h("div", { class: "tl-meta" },
            s.transport ? h("span", { class: "chip muted plain" }, `transport: ${s.transport}`) : null,
            s.attempt ? h("span", { class: "chip muted plain" }, `attempt ${s.attempt}`) : null,
            takenOverChip(details),
            h("span", { class: "chip muted plain" }, `seq ${s.seq}`),
            h("span", { class: "chip muted plain" }, `${fmtMs(s.sinceStartMs)} since received`)),
          facts.length ? h("div", { class: "tl-facts" }, ...facts) : null,
          rest ? h("details", { class: "raw" }, h("summary", null, "Details JSON"), jsonPre(details)) : null));
    }));

    const frames = h("div", { class: "grid frames" },
      h("section", { class: "card" }, h("div", { class: "card-head" }, h("h2", null, "Request frame")),
        h("div", { class: "card-body" }, t.request ? jsonPre(t.request) : h("p", { class: "muted" }, "The received event carries no frame."))),
      h("section", { class: "card" }, h("div", { class: "card-head" }, h("h2", null, "Result frame")),
        h("div", { class: "card-body" }, t.result ? jsonPre(t.result) : h("p", { class: "muted" }, it.bucket === "in_flight" ? "No result yet: the intent is still in flight." : "No result frame was recorded."))));

    const pick = (seq) => {
      document.querySelectorAll("#timeline > li.picked, .wf-stage.picked").forEach((e) => e.classList.remove("picked"));
      const li = document.querySelector(`#timeline > li[data-seq="${seq}"]`);
      document.querySelector(`.wf-stage[data-seq="${seq}"]`)?.classList.add("picked");
      if (li) { li.classList.add("picked"); li.scrollIntoView({ block: "nearest", behavior: "smooth" }); }
    };
    const wf = h("section", { class: "card", id: "waterfall-card" },
      h("div", { class: "card-head" }, h("h2", null, "Waterfall"), h("span", { class: "sub" }, "spans on a proportional time axis; choose one for its details below")),
      h("div", { class: "card-body" }, n ? waterfall(t, pick) : h("p", { class: "muted" }, "No events recorded.")));
    put(body, wf, h("div", { class: "grid-gap" }), h("div", { class: "grid cols-main" },
      h("section", { class: "card" }, h("div", { class: "card-head" }, h("h2", null, "Lifecycle"), h("span", { class: "sub" }, `${n} event${n === 1 ? "" : "s"} in log order`)),
        h("div", { class: "card-body" }, n ? timeline : h("p", { class: "muted" }, "No events recorded."))),
      h("div", { class: "stack" }, summary, related)),
    h("div", { class: "grid-gap" }), frames);
  };

  const load = async () => {
    try {
      const t = await api(`/observability/intents/${encodeURIComponent(nonce)}`);
      if (isCurrent()) draw(t);
      return t;
    } catch (err) {
      if (!isCurrent()) return null;
      put(head);
      head.hidden = true;
      put(body, err.status === 404
        ? h("div", { class: "card" }, emptyState(ICONS.search, "No such intent", `The log has no events for nonce ${nonce}.`, h("a", { class: "btn", href: "#/intents" }, "Back to intents")))
        : errorBox(err));
      return null;
    }
  };
  load().then((t) => {
    if (!t || !isCurrent()) return;
    stop = openStream(lastSeq, (events) => {
      if (!events.some((e) => e.nonce === nonce)) return;
      clearTimeout(timer);
      timer = setTimeout(load, 150);
    });
  });
  return () => { clearTimeout(timer); if (stop) stop(); };
}

// ---------- dead letters ----------

function renderDeadLetters(root, { arg, isCurrent }) {
  root.append(pageHead("Dead letters", "Bus messages that exhausted their retries or hit a terminal failure."));
  root.append(h("div", { class: "grid metrics four" }, metric("Dead letters", "dl-total"), metric("Unique senders", "dl-senders"),
    metric("Unique recipients", "dl-recipients"), metric("Max retry count", "dl-retries")));
  const notice = h("div", { id: "requeue-notice" });
  const tbody = h("tbody");
  const panel = h("div", { class: "detail-panel", id: "dl-detail", hidden: true });
  const selectAll = h("input", { type: "checkbox", id: "dl-select-all", "aria-label": "Select all dead letters on this page" });
  const table = h("table", { class: "data" }, h("thead", null, h("tr", null,
    ...[[selectAll, "44px"], ["Nonce", "160px"], ["Route", ""], ["Intent", "130px"], ["Retries", "80px"], ["Error", "18%"], ["Failed", "110px"], ["", "110px"]]
      .map(([t, w]) => { const th = h("th", { scope: "col" }, t); if (w) th.style.width = w; return th; }))), tbody);
  const wrap = h("div", { class: "table-wrap" }, table);
  const pagerSlot = h("div");
  const bulkBar = h("div", { class: "bulk-bar", id: "dl-bulk", hidden: true });
  let offset = 0;
  const chosen = new Set();
  const card = h("section", { class: "card", "aria-label": "Dead letters" }, bulkBar, wrap, pagerSlot, panel);
  root.append(notice, card);
  for (let i = 0; i < 4; i++) tbody.append(h("tr", null, ...Array.from({ length: 8 }, () => h("td", null, h("div", { class: "skeleton sk-line" })))));
  let selected = arg || "";

  // Bulk requeue: operators tick several dead letters and requeue them in
  // one go, each through the same CSRF-protected endpoint as one.
  function drawBulk() {
    bulkBar.hidden = chosen.size === 0;
    if (!chosen.size) { put(bulkBar); return; }
    let armed = false;
    const go = h("button", { class: "btn small brand", type: "button", id: "dl-bulk-requeue" }, `Requeue ${chosen.size}`);
    go.addEventListener("click", async () => {
      if (!armed) { armed = true; go.textContent = `Confirm requeue of ${chosen.size}`; return; }
      go.disabled = true;
      let ok = 0;
      const failed = [];
      for (const id of [...chosen]) {
        try {
          await api(`/observability/dead-letters/${encodeURIComponent(id)}/requeue`, { method: "POST" });
          ok++;
          chosen.delete(id);
        } catch (err) {
          failed.push(`${id}: ${err.message}`);
        }
      }
      toast(failed.length ? `Requeued ${ok}; ${failed.length} failed (${failed[0]})` : `Requeued ${ok} message${ok === 1 ? "" : "s"}`);
      load();
    });
    put(bulkBar, h("span", { id: "dl-bulk-count" }, `${chosen.size} selected`), go,
      h("button", { class: "btn small ghost", type: "button", onclick: () => { chosen.clear(); load(); } }, "Clear"));
  }
  selectAll.addEventListener("change", () => {
    tbody.querySelectorAll("input[data-pick]:not(:disabled)").forEach((c) => {
      c.checked = selectAll.checked;
      if (c.checked) chosen.add(c.dataset.pick); else chosen.delete(c.dataset.pick);
    });
    drawBulk();
  });

  function requeueButton(m, rq, onDone) {
    if (m.status && m.status !== "dead_letter") return null;
    if (!rq.available || !rq.allowed) {
      return h("span", { class: "requeue-wrap" },
        h("button", { class: "btn small", type: "button", disabled: true, "aria-disabled": "true", title: rq.reason, "data-requeue": m.id }, "Requeue"));
    }
    let armed = false;
    const b = h("button", { class: "btn small", type: "button", "data-requeue": m.id }, "Requeue");
    b.addEventListener("click", async (e) => {
      e.stopPropagation();
      if (!armed) { armed = true; b.textContent = "Confirm"; b.classList.add("brand"); setTimeout(() => { armed = false; b.textContent = "Requeue"; b.classList.remove("brand"); }, 4000); return; }
      b.disabled = true;
      try {
        const r = await api(`/observability/dead-letters/${encodeURIComponent(m.id)}/requeue`, { method: "POST" });
        toast(`Requeued ${m.id}: now ${r.status}`);
        onDone();
      } catch (err) {
        toast(`Requeue failed: ${err.message}`);
        b.disabled = false;
      }
    });
    return b;
  }

  async function showDetail(id) {
    selected = id;
    history.replaceState(null, "", `#/dead-letters/${encodeURIComponent(id)}`);
    tbody.querySelectorAll("tr").forEach((tr) => tr.classList.toggle("selected", tr.dataset.id === id));
    panel.hidden = false;
    put(panel, h("div", { class: "skeleton sk-line" }), h("div", { class: "skeleton sk-line" }));
    try {
      const d = await api(`/observability/dead-letters/${encodeURIComponent(id)}`);
      if (!isCurrent()) return;
      const m = d.message;
      const dead = m.status === "dead_letter";
      put(panel, 
        h("div", { class: "detail-head" }, h("h2", null, `Message ${m.id}`), h("span", { id: "dl-status", dataset: { status: m.status } }, chip(m.status)),
          h("div", { class: "right" }, h("a", { class: "btn small", href: `#/intents/${encodeURIComponent(m.nonce)}` }, "Open trace"), requeueButton(m, d.requeue, load))),
        !d.requeue.allowed && m.status === "dead_letter" ? h("p", { class: "reason", id: "requeue-reason" }, d.requeue.reason) : null,
        m.status !== "dead_letter" ? h("div", { class: "notice notice-gap", id: "requeued-note", role: "note" }, icon(ICONS.info),
          `Requeued: this message is now ${stateLabel(m.status)}. It has left the dead-letter list; its trace shows every attempt.`) : null,
        h("div", { class: "grid cols-2" },
          h("dl", { class: "kv" },
            h("dt", null, "Nonce"), h("dd", { class: "mono" }, m.nonce),
            h("dt", null, "Sender"), h("dd", { class: "mono" }, m.sender),
            h("dt", null, "Recipient"), h("dd", { class: "mono" }, m.recipient),
            h("dt", null, "Intent"), h("dd", null, m.intent),
            h("dt", null, "Retries"), h("dd", null, `${m.retryCount} of ${m.maxRetries}`),
            h("dt", null, "Error code"), h("dd", { id: "dl-error-code" }, d.intent && d.intent.errorCode ? h("span", { class: "chip code" }, d.intent.errorCode) : "—"),
            h("dt", null, dead ? "Error" : "Last error"), h("dd", null, m.error || "—"),
            h("dt", null, "Created"), h("dd", null, fmtTime(m.createdAt)),
            h("dt", null, dead ? "Failed" : "Dead-lettered"), h("dd", null, fmtTime(m.failedAt)),
            dead ? null : h("dt", null, "Updated"), dead ? null : h("dd", null, fmtTime(m.updatedAt))),
          h("div", null, h("div", { class: "eyebrow" }, "Payload"), jsonPre(d.payload))));
    } catch (err) {
      put(panel, errorBox(err));
    }
  }

  async function load() {
    try {
      const d = await api(`/observability/dead-letters?limit=${PAGE}&offset=${offset}`);
      if (!isCurrent()) return;
      const canPick = d.requeue.available && d.requeue.allowed;
      selectAll.disabled = !canPick;
      selectAll.checked = false;
      selectAll.title = canPick ? "Select all on this page" : d.requeue.reason || "";
      for (const id of [...chosen]) if (!d.deadLetters.some((m) => m.id === id)) chosen.delete(id);
      drawBulk();
      put(pagerSlot, pager("dl-pager", d.total, offset, d.deadLetters.length, (o) => { offset = o; chosen.clear(); load(); }));
      setMetric("dl-total", fmtInt(d.total), d.total ? "terminal until requeued" : "nothing waiting", d.total ? "err" : null);
      setMetric("dl-senders", fmtInt(d.summary.uniqueSenders));
      setMetric("dl-recipients", fmtInt(d.summary.uniqueRecipients));
      setMetric("dl-retries", fmtInt(d.summary.maxRetryCount));
      setNavDead(d.total);
      put(notice, !d.requeue.allowed
        ? h("div", { class: "notice warn", id: "requeue-unavailable", role: "note" }, icon(ICONS.info), h("span", null, h("strong", null, "Requeue is unavailable. "), d.requeue.reason))
        : h("div", { class: "notice", role: "note" }, icon(ICONS.info), "Requeue moves a message back to queued with the same nonce; the bus then retries it."));
      notice.classList.add("notice-gap");
      put(tbody, ...d.deadLetters.map((m) => {
        const tr = h("tr", {
          class: "row-link", tabindex: "0", dataset: { id: m.id },
          onclick: (e) => { if (!e.target.closest("a,button,input,label")) showDetail(m.id); },
          onkeydown: (e) => { if (e.key === "Enter" && e.target.tagName !== "INPUT") { e.preventDefault(); showDetail(m.id); } },
        },
        h("td", { class: "pick" }, h("input", { type: "checkbox", "data-pick": m.id, "aria-label": `Select ${m.id}`, checked: chosen.has(m.id),
          disabled: !canPick, title: canPick ? null : d.requeue.reason,
          onchange: (e) => { if (e.target.checked) chosen.add(m.id); else chosen.delete(m.id); drawBulk(); } })),
        h("td", null, h("a", { class: "nonce", href: `#/intents/${encodeURIComponent(m.nonce)}`, title: m.nonce }, m.nonce)),
        h("td", null, route(m.sender, m.recipient)),
        h("td", { title: m.intent }, m.intent),
        h("td", { class: "num" }, `${m.retryCount} / ${m.maxRetries}`),
        h("td", { title: m.error }, m.error || "—"),
        h("td", null, timeEl(m.failedAt)),
        h("td", null, requeueButton(m, d.requeue, load)));
        return tr;
      }));
      put(wrap, d.deadLetters.length ? table
        : emptyState(ICONS.inbox, "No dead letters", "Messages land here when the bus exhausts their retries. Nothing needs an operator right now."));
      if (selected) showDetail(selected);
    } catch (err) {
      if (isCurrent()) { put(tbody); showError(root, err); }
    }
  }
  load();
  return refreshOnTraffic(load);
}

// ---------- jobs (Intent Protocol v2.1) ----------

const JOB_TONE = { open: "queued", claimed: "dispatched", fulfilled: "acked", dead: "dead_letter" };
const jobChip = (st) => h("span", { class: `chip s-${JOB_TONE[st] || st}` }, st);

// jobCard is one section of the Jobs page: a heading row (with a count)
// and a body.
function jobCard(id, title) {
  const sub = h("span", { class: "sub" });
  const body = h("div");
  const card = h("section", { class: "card", "aria-label": title, id }, h("div", { class: "card-head" }, h("h2", null, title), sub), body);
  return { card, sub, body };
}

function renderJobs(root, { isCurrent }) {
  root.append(pageHead("Jobs", "Intent Protocol v2.1 queues: intents published by pull workers' publishers, by namespace and status."));
  root.append(h("div", { class: "grid metrics four" }, metric("Open", "jobs-open"), metric("Claimed", "jobs-claimed"),
    metric("Fulfilled", "jobs-fulfilled"), metric("Dead", "jobs-dead")));
  const queues = jobCard("jobs-queues", "Queues");
  const recent = jobCard("jobs-recent", "Recent intents");
  const dead = jobCard("jobs-dead-list", "Dead letters");
  root.append(h("div", { class: "stack" }, queues.card, recent.card, dead.card));

  // table builds a table; cols are [title, width, numeric].
  function table(cols, rows) {
    const t = h("table", { class: "data" },
      h("thead", null, h("tr", null, ...cols.map(([c, w, num]) => {
        const th = h("th", { scope: "col", class: num ? "num" : null }, c);
        if (w) th.style.width = w;
        return th;
      }))), h("tbody", null, ...rows));
    return h("div", { class: "table-wrap" }, labelCells(t));
  }
  const empty = (title, text) => h("div", { class: "card-body" }, emptyState(ICONS.inbox, title, text));
  function action(j, op, label) {
    const b = h("button", { class: "btn small", type: "button", dataset: { job: j.id, op } }, label);
    b.addEventListener("click", async () => {
      b.disabled = true;
      try {
        const r = await api(`/observability/jobs/${encodeURIComponent(j.id)}/${op}`, { method: "POST" });
        toast(`${label} ${j.id}: now ${r.status}`);
        load();
      } catch (err) {
        toast(`${label} failed: ${err.message}`);
        b.disabled = false;
      }
    });
    return b;
  }
  const traceLink = (j) => h("a", { class: "nonce", href: `#/intents/${encodeURIComponent(j.nonce)}`, title: j.nonce }, j.id);
  const STATUSES = ["open", "claimed", "fulfilled", "dead"];

  async function load() {
    try {
      const d = await api("/observability/jobs");
      if (!isCurrent()) return;
      if (!d.enabled) {
        put(queues.body, empty("The intent bus is off", "Start beam serve with --intent-listen to serve the Intent Protocol."));
        put(recent.body); put(dead.body);
        return;
      }
      const tot = { open: 0, claimed: 0, fulfilled: 0, dead: 0 };
      d.queues.forEach((q) => { for (const k in tot) tot[k] += q[k]; });
      setMetric("jobs-open", fmtInt(tot.open), "waiting for a worker");
      setMetric("jobs-claimed", fmtInt(tot.claimed), "held by a worker's lease");
      setMetric("jobs-fulfilled", fmtInt(tot.fulfilled), "done, result stored", tot.fulfilled ? "ok" : null);
      setMetric("jobs-dead", fmtInt(tot.dead), tot.dead ? "retry or cancel below" : "nothing waiting", tot.dead ? "err" : null);
      queues.sub.textContent = `${fmtInt(d.queues.length)} namespace${d.queues.length === 1 ? "" : "s"}`;
      put(queues.body, d.queues.length ? table([["Namespace"], ["Open", "110px", true], ["Claimed", "110px", true], ["Fulfilled", "110px", true], ["Dead", "110px", true]],
        d.queues.map((q) => h("tr", { dataset: { ns: q.namespace } }, h("td", { class: "mono" }, q.namespace),
          ...STATUSES.map((k) => h("td", { class: "num", dataset: { status: k } }, fmtInt(q[k]))))))
        : empty("No jobs yet", "Publish with POST /intent on the intent bus listener."));
      recent.sub.textContent = `newest ${fmtInt(d.recent.length)}`;
      put(recent.body, d.recent.length ? table([["Id", "150px"], ["Namespace", "110px"], ["Goal"], ["Status", "110px"], ["Priority", "90px", true],
        ["Attempts", "100px", true], ["Updated", "110px"], ["", "90px"]],
      d.recent.map((j) => h("tr", { dataset: { id: j.id, status: j.status } }, h("td", null, traceLink(j)), h("td", { class: "mono" }, j.namespace), h("td", null, j.goal),
        h("td", null, jobChip(j.status)), h("td", { class: "num" }, String(j.priority)),
        h("td", { class: "num" }, `${j.claimAttempts} / ${j.maxAttempts}`), h("td", null, timeEl(j.updatedAt)),
        h("td", null, d.canAct && (j.status === "open" || j.status === "claimed") ? action(j, "cancel", "Cancel") : null))))
        : empty("No jobs yet", "Jobs show here as soon as one is published."));
      dead.sub.textContent = d.dead.length ? `${fmtInt(d.dead.length)} waiting` : "";
      put(dead.body, d.dead.length ? table([["Id", "150px"], ["Namespace", "110px"], ["Goal", "140px"], ["Attempts", "100px", true], ["Reason"], ["Dead since", "110px"], ["", "90px"]],
        d.dead.map((j) => h("tr", { dataset: { id: j.id } }, h("td", null, traceLink(j)), h("td", { class: "mono" }, j.namespace),
          h("td", null, j.goal), h("td", { class: "num" }, String(j.claimAttempts)), h("td", { title: j.reason }, j.reason || "—"),
          h("td", null, timeEl(j.updatedAt)),
          h("td", null, d.canAct ? action(j, "retry", "Retry") : null))))
        : empty("No dead jobs", "Jobs land here when their attempts run out or an admin cancels them."));
    } catch (err) {
      if (isCurrent()) showError(root, err);
    }
  }
  load();
  return refreshOnTraffic(load);
}

// refreshOnTraffic reloads a view when the log moves, at most every 2 s.
function refreshOnTraffic(load) {
  let timer = null;
  const stop = openStream(null, () => {
    if (timer) return;
    timer = setTimeout(() => { timer = null; load(); }, 2000);
  });
  return () => { clearTimeout(timer); stop(); };
}

// ---------- agents ----------

function renderAgents(root, { params, isCurrent }) {
  root.append(pageHead("Agents", "Registered agents, who is connected right now, and the policy that protects each one."));
  root.append(h("div", { class: "grid metrics four" }, metric("Registered", "ag-total"), metric("Connected", "ag-conn"), metric("Direct HTTP", "ag-http"),
    metric("With ACL rules", "ag-acl")));
  const q = h("input", { class: "input", id: "agent-q", type: "search", placeholder: "Filter by Beam ID, name or org", value: params.get("q") || "", autocomplete: "off" });
  const onlyConn = h("input", { type: "checkbox", id: "agent-conn", checked: params.get("connected") === "1" });
  const tbody = h("tbody");
  const table = h("table", { class: "data" }, h("thead", null, h("tr", null,
    ...[["Agent", ""], ["Org", "120px"], ["Delivery", "110px"], ["Inbox", "110px"], ["Visibility", "100px"], ["Last seen", "120px"], ["Policy", "180px"], ["Trust", "70px"]]
      .map(([t, w]) => { const th = h("th", { scope: "col", class: t === "Trust" || t === "Inbox" ? "num" : null }, t); if (w) th.style.width = w; return th; }))), tbody);
  const wrap = h("div", { class: "table-wrap" }, table);
  const pagerSlot = h("div");
  let offset = 0;
  root.append(h("section", { class: "card" },
    h("div", { class: "feed-bar" }, h("div", { class: "search" }, icon(ICONS.search), q),
      h("label", { class: "check" }, onlyConn, " Connected only"), h("span", { class: "right muted", id: "agents-count" }, "")),
    wrap, pagerSlot));
  for (let i = 0; i < 6; i++) tbody.append(h("tr", null, ...Array.from({ length: 8 }, () => h("td", null, h("div", { class: "skeleton sk-line" })))));

  async function load() {
    const p = new URLSearchParams();
    if (q.value.trim()) p.set("q", q.value.trim());
    if (onlyConn.checked) p.set("connected", "1");
    setHashQuery("agents", p);
    p.set("limit", String(PAGE));
    p.set("offset", String(offset));
    try {
      const d = await api(`/observability/agents?${p}`);
      if (!isCurrent()) return;
      put(pagerSlot, pager("agents-pager", d.total, offset, d.agents.length, (o) => { offset = o; load(); }));
      setMetric("ag-total", fmtInt(d.registered));
      setMetric("ag-conn", fmtInt(d.connected), "WebSocket sessions on this directory", d.connected ? "ok" : null);
      setMetric("ag-http", fmtInt(d.agents.filter((a) => a.delivery === "direct-http").length), "in this list");
      setMetric("ag-acl", fmtInt(d.agents.filter((a) => a.policy.rules > 0).length), "in this list");
      document.getElementById("agents-count").textContent = `${fmtInt(d.agents.length)} of ${fmtInt(d.total)}`;
      put(tbody, ...d.agents.map((a) => h("tr", { class: "row-link", tabindex: "0",
        onclick: () => { location.hash = `#/intents?beamId=${encodeURIComponent(a.beamId)}`; },
        onkeydown: (e) => { if (e.key === "Enter") location.hash = `#/intents?beamId=${encodeURIComponent(a.beamId)}`; } },
      h("td", null, h("div", { class: "agent-cell" },
        h("span", { class: `presence ${a.connected ? "on" : ""}`, title: a.connected ? "connected" : "not connected" }),
        h("div", { class: "agent-names" }, h("div", { class: "agent-name" }, a.displayName || a.beamId), h("div", { class: "mono muted" }, a.beamId)))),
      h("td", null, a.org),
      h("td", null, h("span", { class: "chip muted plain" }, a.delivery)),
      h("td", { class: "num inbox", dataset: { queued: String(a.inbox.queued), dispatched: String(a.inbox.dispatched) },
        title: `${a.inbox.queued} queued, ${a.inbox.dispatched} being delivered` },
      a.inbox.queued + a.inbox.dispatched
        ? h("a", { href: `#/intents?beamId=${encodeURIComponent(a.beamId)}&status=in_flight`, class: "inbox-depth" },
          h("b", null, fmtInt(a.inbox.queued)), " queued", a.inbox.dispatched ? ` · ${fmtInt(a.inbox.dispatched)} out` : "")
        : h("span", { class: "muted" }, "empty")),
      h("td", { class: "muted" }, a.visibility),
      h("td", null, a.connected ? bucketChip("success", "online") : timeEl(a.lastSeen)),
      h("td", { title: a.policy.intentTypes.join(", ") }, a.policy.summary),
      h("td", { class: "num" }, a.trustScore.toFixed(2)))));
      if (!d.agents.length) {
        put(tbody, h("tr", null, h("td", { colspan: "8" }, emptyState(ICONS.users, q.value || onlyConn.checked ? "No agents match" : "No agents registered",
          "Agents appear here after POST /agents/register."))));
      }
    } catch (err) {
      if (isCurrent()) { put(tbody); showError(root, err); }
    }
  }
  let t = 0;
  q.addEventListener("input", () => { clearTimeout(t); t = setTimeout(() => { offset = 0; load(); }, 250); });
  onlyConn.addEventListener("change", () => { offset = 0; load(); });
  load();
  // Presence changes without log traffic: poll, and refresh on traffic.
  const iv = setInterval(load, 15000);
  const stop = refreshOnTraffic(load);
  return () => { clearTimeout(t); clearInterval(iv); stop(); };
}

// ---------- federation ----------

// clusterSection renders the cluster's nodes, where each agent is
// connected, the homes of the services that run on one node and the
// takeovers of lost nodes' logs (beam serve --cluster) into el; nothing on
// a single node.
function clusterSection(el, c) {
  if (!c || !c.configured) { put(el); return; }
  if (c.error) { put(el, errorBox(new Error(c.error))); return; }
  const st = c.status || {};
  const nodes = Array.isArray(st.nodes) ? st.nodes : [];
  const sessions = Array.isArray(st.sessions) ? st.sessions : [];
  const homes = Array.isArray(st.homes) ? st.homes : [];
  const takeovers = Array.isArray(st.takeovers) ? st.takeovers : [];
  put(el, h("section", { class: "card", id: "cluster-nodes" },
    h("div", { class: "card-head" }, h("h2", null, `Cluster: ${nodes.length} node${nodes.length === 1 ? "" : "s"} (this one: ${st.node || "—"})`)),
    h("div", { class: "table-wrap" }, h("table", { class: "data" },
      h("thead", null, h("tr", null, h("th", null, "Node"), h("th", null, "Address"), h("th", null, "Sessions"), h("th", null, "Registry seq"), h("th", null, "Seen"))),
      h("tbody", null, ...nodes.map((n) => h("tr", { "data-node": n.nodeId },
        h("td", { class: "mono" }, n.nodeId), h("td", { class: "mono" }, n.url || "—"), h("td", null, fmtInt(n.sessions)),
        h("td", null, fmtInt(n.registrySeq)), h("td", null, timeEl(n.seen))))))),
    h("div", { class: "table-wrap" }, h("table", { class: "data", id: "cluster-sessions" },
      h("thead", null, h("tr", null, h("th", null, "Agent"), h("th", null, "Connected to"))),
      h("tbody", null, ...sessions.map((x) => h("tr", null, h("td", { class: "mono" }, x.beamId), h("td", { class: "mono" }, x.node)))))),
    homes.length ? h("div", { class: "table-wrap" }, h("table", { class: "data", id: "cluster-homes" },
      h("thead", null, h("tr", null, h("th", null, "Home"), h("th", null, "Node"), h("th", null, "Log"), h("th", null, "Live"))),
      h("tbody", null, ...homes.map((x) => h("tr", { "data-home": x.name },
        h("td", { class: "mono" }, x.name), h("td", { class: "mono" }, x.node), h("td", { class: "mono muted" }, x.log || "—"),
        h("td", null, h("span", { class: `chip ${x.live ? "link-up" : "link-down"}` }, x.live ? "live" : "down"))))))) : null,
    takeovers.length ? h("div", { class: "table-wrap" }, h("table", { class: "data", id: "cluster-takeovers" },
      h("thead", null, h("tr", null, ...["Log taken over", "Node", "Taker", "State", "Started", "Duration", "Adopted"].map((x) => h("th", null, x)))),
      h("tbody", null, ...takeovers.map((x) => h("tr", { dataset: { log: x.log, state: x.state } },
        h("td", { class: "mono muted" }, x.log), h("td", { class: "mono" }, x.node || "—"), h("td", { class: "mono" }, x.taker),
        h("td", null, h("span", { class: `chip ${x.state === "done" ? "link-up" : "link-failing"}` }, x.state)), h("td", null, timeEl(x.started)),
        h("td", null, x.durationMs ? fmtMs(x.durationMs) : "—"),
        h("td", { dataset: { col: "adopted" } }, Object.entries(x.adopted || {}).map(([k, v]) => `${k} ${fmtInt(v)}`).join(", ") || "none")))))) : null));
}

function renderFederation(root, { isCurrent }) {
  root.append(pageHead("Federation", "Peer directories, pinned keys and the outbox relay; in cluster mode, the nodes serving this domain. Link state refreshes every 5 seconds."));
  const cluster = h("div");
  root.append(cluster);
  const body = h("div", null, h("div", { class: "card card-body" }, h("div", { class: "skeleton sk-line" }), h("div", { class: "skeleton sk-line" })));
  root.append(body);
  const load = () => api("/observability/cluster").then((c) => { if (isCurrent()) clusterSection(cluster, c); }).catch(() => {})
    .then(() => api("/observability/federation")).then((f) => {
    if (!isCurrent()) return;
    root.querySelector(":scope > .view-error")?.remove();
    if (!f.configured) {
      put(body, h("section", { class: "card", id: "federation-empty" }, emptyState(ICONS.globe, "Federation is not configured",
        "This directory runs alone: intents are only delivered to agents registered here. Configure peers (NATS federation) to relay intents to other directories; their health and the outbox will show up here.")));
      return;
    }
    if (f.error) { put(body, errorBox(new Error(f.error))); return; }
    const st = f.status || {};
    const known = new Set(["links"]);
    const parts = [];
    const links = new Map((Array.isArray(st.links) ? st.links : []).map((l) => [l.peer, l]));
    let metricsRow = null;
    const peers = Array.isArray(st.peers) ? st.peers : null;
    const outbox = st.outbox && typeof st.outbox === "object" ? st.outbox : null;
    const dead = Array.isArray(st.dead) ? st.dead : null;
    const when = (iso) => (iso && !iso.startsWith("0001-") ? timeEl(iso) : h("span", { class: "muted" }, "—"));

    if (peers || outbox) {
      const n = (k) => Number((outbox || {})[k] || 0);
      const waiting = n("PENDING") + n("CLAIMED");
      metricsRow = h("div", { class: "grid metrics four" },
        metric("Peers", "fed-peers"), metric("Outbox waiting", "fed-waiting"), metric("Published", "fed-published"), metric("Dead", "fed-dead"));
      queueMicrotask(() => {
        const up = (peers || []).filter((p) => linkState(p, links.get(p.domain)).state === "up").length;
        const count = peers ? peers.length : 0;
        setMetric("fed-peers", fmtInt(peers ? count : null), peers ? `${fmtInt(up)} link${up === 1 ? "" : "s"} up` : "\u00a0", count ? (up === count ? "ok" : "warn") : null);
        const down = (peers || []).some((p) => ["down", "failing"].includes(linkState(p, links.get(p.domain)).state));
        setMetric("fed-waiting", fmtInt(waiting), waiting ? (down ? "peer down, retrying" : "pending or claimed") : "nothing waiting", waiting ? "warn" : null);
        setMetric("fed-published", fmtInt(n("PUBLISHED")), "confirmed by the peer");
        setMetric("fed-dead", fmtInt(n("DEAD")), n("DEAD") ? "gave up; resend with beam peer replay ROW-ID" : "none", n("DEAD") ? "err" : null);
      });
      known.add("outbox");
    }

    if (st.self && typeof st.self === "object" && st.self.domain) {
      known.add("self");
      parts.push(h("section", { class: "card", id: "federation-self" }, h("div", { class: "card-head" }, h("h2", null, "This directory")),
        h("div", { class: "card-body" }, h("dl", { class: "kv" },
          h("dt", null, "Domain"), h("dd", { class: "mono" }, st.self.domain),
          h("dt", null, "NATS address"), h("dd", { class: "mono" }, st.self.url || "—")))));
    }

    if (peers) {
      known.add("peers");
      known.add("backlog"); // shown per peer in the table
      const custom = peers.every((p) => p && typeof p === "object" && p.domain);
      let table;
      if (custom) {
        table = h("table", { class: "data", id: "federation-peers" },
          h("thead", null, h("tr", null, ...["Peer directory", "Link", "Outbox", "Lag", "Last error", "NATS address", "Pinned", "Last contact"].map((t) => h("th", { scope: "col", class: t === "Outbox" || t === "Lag" ? "num" : null }, t)))),
          h("tbody", null, ...peers.map((p) => {
            const ls = linkState(p, links.get(p.domain));
            const bl = (st.backlog && st.backlog[p.domain]) || null;
            const lag = bl && bl.oldest ? Math.max(0, Date.now() - Date.parse(bl.oldest)) : 0;
            return h("tr", { dataset: { peer: p.domain, link: ls.state } },
            h("td", null, h("div", { class: "agent-cell" }, h("span", { class: `presence link-${ls.state}`, title: ls.text }),
              h("span", { class: "mono" }, p.domain))),
            h("td", { title: ls.detail || ls.text, dataset: { col: "link" } }, h("span", { class: `chip link-${ls.state}` }, ls.text),
              bl && bl.depth && (ls.state === "down" || ls.state === "failing") ? h("div", { class: "reason retrying" }, "peer down, retrying") : null),
            h("td", { class: "num", dataset: { col: "depth" } }, fmtInt(bl ? bl.depth : 0)),
            h("td", { class: "num", dataset: { col: "lag" } }, bl ? `${Math.round(lag / 1000)} s` : "—"),
            h("td", { dataset: { col: "lastError" }, title: (bl && bl.lastError) || "" }, (bl && bl.lastError) || "—"),
            h("td", { class: "mono muted", title: p.url || "" }, p.url || "—"),
            h("td", null, when(p.addedAt)),
            h("td", null, p.lastContact ? when(p.lastContact) : h("span", { class: "chip muted plain" }, "never")));
          })));
      } else {
        const keys = peers.length ? Object.keys(peers[0]).slice(0, 7) : [];
        table = h("table", { class: "data", id: "federation-peers" },
          h("thead", null, h("tr", null, ...keys.map((k) => h("th", { scope: "col" }, k)))),
          h("tbody", null, ...peers.map((p) => h("tr", null, ...keys.map((k) => h("td", { title: String(p[k] ?? "") },
            typeof p[k] === "object" ? JSON.stringify(p[k]) : String(p[k] ?? "—")))))));
      }
      parts.push(h("section", { class: "card" }, h("div", { class: "card-head" }, h("h2", null, "Peers"), h("span", { class: "sub" }, `${peers.length} pinned`)),
        peers.length ? h("div", { class: "table-wrap" }, labelCells(table))
          : emptyState(ICONS.globe, "No peers yet", "Pin a peer directory (beam peer add) to start relaying.")));
    }

    if (dead) {
      known.add("dead");
      parts.push(h("section", { class: "card" }, h("div", { class: "card-head" }, h("h2", null, "Dead outbox rows"), h("span", { class: "sub" }, `${dead.length}`)),
        dead.length ? h("p", { class: "card-note muted", id: "federation-replay-hint" }, "The relay gave up on these. List them with ",
          h("code", null, "beam peer outbox --state DEAD"), " and send one again with ", h("code", null, "beam peer replay ROW-ID"), ".") : null,
        dead.length ? h("div", { class: "table-wrap" }, labelCells(h("table", { class: "data", id: "federation-dead" },
          h("thead", null, h("tr", null, ...["Nonce", "Peer", "Kind", "Attempts", "Last error", "Updated", "Replay"].map((t) => h("th", { scope: "col", class: t === "Attempts" ? "num" : null }, t)))),
          h("tbody", null, ...dead.map((r) => h("tr", null,
            h("td", null, r.nonce ? h("a", { class: "nonce", href: `#/intents/${encodeURIComponent(r.nonce)}`, title: r.nonce }, r.nonce) : "—"),
            h("td", { class: "mono" }, r.peer || "—"),
            h("td", null, r.kind || "—"),
            h("td", { class: "num" }, `${r.attempts ?? "—"} / ${r.maxAttempts ?? "—"}`),
            h("td", { title: r.lastError || "" }, r.lastError || "—"),
            h("td", null, when(r.updatedAt)),
            h("td", { class: "mono", title: "run on the directory's host" }, r.id !== undefined ? `beam peer replay ${r.id}` : "—")))))))
          : h("div", { class: "card-body" }, h("p", { class: "muted" }, "No dead outbox rows: every relayed event reached its peer or is still being retried."))));
    }

    const rest = Object.fromEntries(Object.entries(st).filter(([k]) => !known.has(k)));
    if (Object.keys(rest).length) {
      parts.push(h("section", { class: "card" }, h("div", { class: "card-head" }, h("h2", null, "Status")), h("div", { class: "card-body" }, jsonPre(rest))));
    }
    put(body, metricsRow, h("div", { class: "stack" }, ...parts));
  }).catch((err) => { if (isCurrent()) showError(root, err); });
  load();
  // Link state changes without log traffic (a peer goes away): poll.
  const iv = setInterval(load, 5000);
  return () => clearInterval(iv);
}

// PEER_QUIET is how long after its last message a peer without a link
// signal of its own still counts as up.
const PEER_QUIET_MS = 5 * 60 * 1000;

// linkState judges the link to a peer from its NATS connection, the
// relay's publish failures and its last contact, worst first.
function linkState(p, l) {
  l = l || {};
  if (l.connected === false) return { state: "down", text: "disconnected", detail: l.lastError || "the NATS connection to this peer is down" };
  if (l.failing > 0) return { state: "failing", text: `${l.failing} failing`, detail: `${l.lastError || "publish failed"} (${rel(l.lastErrorAt)})` };
  if (l.connected === true) return { state: "up", text: "connected" };
  const age = p.lastContact ? Date.now() - new Date(p.lastContact).getTime() : Infinity;
  if (age < PEER_QUIET_MS) return { state: "up", text: "heard from recently" };
  return { state: "quiet", text: p.lastContact ? "no recent contact" : "never heard from" };
}

// ---------- start ----------

api("/observability/dead-letters?limit=1").then((d) => setNavDead(d.total)).catch(() => {});
navigate();
