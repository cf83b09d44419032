// The trace waterfall: every lifecycle event of one intent as a span on a
// proportional time axis, attempts grouped, failed attempts and the waits
// before their retries drawn as what they are.

function h(tag, attrs, ...kids) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k === "class") e.className = v;
    else if (k === "dataset") Object.assign(e.dataset, v);
    else if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
    else e.setAttribute(k, v === true ? "" : String(v));
  }
  for (const kid of kids.flat()) {
    if (kid === undefined || kid === null || kid === false) continue;
    e.append(kid instanceof Node ? kid : document.createTextNode(String(kid)));
  }
  return e;
}

// fmtSpan formats a duration in milliseconds for the axis and the bars.
export function fmtSpan(ms) {
  if (!(ms > 0)) return "0 ms";
  if (ms < 1) return "<1 ms";
  if (ms < 1000) return `${Math.round(ms)} ms`;
  if (ms < 10000) return `${(ms / 1000).toFixed(ms % 1000 === 0 ? 0 : 1)} s`;
  if (ms < 120000) return `${Math.round(ms / 1000)} s`;
  const m = Math.floor(ms / 60000);
  const s = Math.round((ms % 60000) / 1000);
  if (m < 120) return s ? `${m} min ${s} s` : `${m} min`;
  return `${(ms / 3600000).toFixed(1)} h`;
}

// niceStep picks an axis step of 1, 2 or 5 times a power of ten (or a
// round number of seconds and minutes) giving at most `max` intervals.
function niceStep(total, max) {
  const raw = total / max;
  const steps = [];
  for (let p = 0.001; p < 1e9; p *= 10) for (const m of [1, 2, 5]) steps.push(m * p);
  steps.push(15000, 30000, 60000, 120000, 300000, 600000, 900000, 1800000, 3600000);
  steps.sort((a, b) => a - b);
  return steps.find((s) => s >= raw) || raw;
}

// retryFailure reports whether a stage is a failed attempt that the bus
// rescheduled: a queued event that carries the attempt's error.
export function retryFailure(s) {
  const d = s.details || {};
  return s.state === "queued" && !!(d.errorCode || d.error);
}

// stageKind classifies a stage for its colour.
export function stageKind(s) {
  if (retryFailure(s)) return "retry";
  if (s.state === "acked") return "success";
  if (s.state === "failed" || s.state === "dead_letter") return "error";
  if (s.state === "queued") return "wait";
  return "active";
}

// stageActor names the pipeline actor a stage of an envelope's trace
// belongs to: the actor its mesh step names (on a queued hop step, the
// actor it waits for), the creator on the created step, x-sink on the
// sink step, else the actor of the step before (the directory's own
// delivered event names none). "" outside pipelines.
function stageActors(stages) {
  let last = "";
  return stages.map((s) => {
    const m = (s.details && s.details.mesh) || null;
    if (m && m.kind === "created") { last = m.actor || last; return m.creator || last; }
    if (m && m.kind === "sink") return "x-sink";
    if (m && m.actor) last = m.actor;
    return last;
  });
}

// localName is the part of a Beam ID before the @.
const localName = (id) => (id.indexOf("@") > 0 ? id.slice(0, id.indexOf("@")) : id);

// foldOutboxRetries groups runs of two or more consecutive federation
// outbox annotations (a durable cross-directory send claimed and retried
// while its peer is down) into one item: {group: true, stages, attempts,
// lastError, peer, gaveUp, label}. Every other stage stays itself.
export function foldOutboxRetries(stages) {
  const out = [];
  let run = [];
  const flush = () => {
    if (run.length >= 2) {
      const steps = run.map((s) => s.details.outbox);
      const lastError = [...steps].reverse().find((o) => o.lastError)?.lastError || "";
      const gaveUp = steps.some((o) => o.state === "DEAD");
      out.push({
        group: true, stages: run, lastError, gaveUp,
        attempts: Math.max(0, ...steps.map((o) => Number(o.attempts) || 0)),
        peer: steps.find((o) => o.peer)?.peer || "",
        label: gaveUp ? "peer down, gave up" : lastError ? "peer down, retrying" : "relaying to the peer",
      });
    } else out.push(...run);
    run = [];
  };
  for (const s of stages) {
    if (s.annotation && s.details && s.details.outbox && typeof s.details.outbox === "object") { run.push(s); continue; }
    flush();
    out.push(s);
  }
  flush();
  return out;
}

const KIND_LABEL = {
  active: "in progress", wait: "waiting in queue", retry: "failed attempt, waiting to retry", success: "acked", error: "failed",
};

// waterfall builds the waterfall element for a trace from
// /observability/intents/{nonce}. onPick(seq) is called when a row is
// chosen, to show that event's details.
export function waterfall(t, onPick) {
  const stages = t.stages || [];
  const times = stages.map((s) => new Date(s.at).getTime());
  const t0 = times.length ? Math.min(...times) : 0;
  let tEnd = times.length ? Math.max(...times) : 0;
  const last = stages[stages.length - 1];
  // A failed attempt still waiting shows its wait up to the next retry.
  if (last && retryFailure(last) && last.details && last.details.nextRetryAt) {
    tEnd = Math.max(tEnd, Number(last.details.nextRetryAt));
  }
  // An intent still in flight runs until now: its last state is ongoing.
  const ongoing = t.intent && t.intent.bucket === "in_flight" && last && !retryFailure(last);
  if (ongoing) tEnd = Math.max(tEnd, Date.now());
  const total = Math.max(1, tEnd - t0);
  const pct = (ms) => `${((ms / total) * 100).toFixed(4)}%`;

  const rows = [];
  const bar = (kind, start, end, label, attrs) => {
    const b = h("div", { class: `wf-bar k-${kind}`, dataset: { startMs: String(start), endMs: String(end) }, title: label, ...attrs });
    b.style.left = pct(start);
    b.style.width = pct(end - start);
    return b;
  };
  const durLabel = (start, end, text) => {
    const l = h("span", { class: "wf-dur" }, text);
    // Near the right edge the label sits left of the bar, never past it.
    const s = (start / total) * 100;
    const e = (end / total) * 100;
    if (e <= 80) l.style.left = `calc(${e.toFixed(4)}% + 6px)`;
    else if (e - s >= 40) { l.style.right = `calc(${(100 - e).toFixed(4)}% + 6px)`; l.classList.add("inside"); }
    else { l.style.right = `calc(${(100 - s).toFixed(4)}% + 6px)`; l.classList.add("left"); }
    return l;
  };
  const row = (cls, labelKids, trackKids, attrs) => h("div", { class: `wf-row ${cls}`, role: "listitem", ...attrs },
    h("div", { class: "wf-label" }, labelKids), h("div", { class: "wf-track" }, trackKids));

  // The whole intent.
  const bucket = (t.intent && t.intent.bucket) || "in_flight";
  const overallKind = bucket === "success" ? "success" : bucket === "error" ? "error" : "active";
  rows.push(row("wf-total", [h("strong", null, (t.intent && t.intent.intentType) || "intent")],
    [bar(overallKind, 0, tEnd - t0, `whole intent: ${fmtSpan(tEnd - t0)}`, { id: "wf-total-bar" }), durLabel(0, tEnd - t0, fmtSpan(tEnd - t0))]));

  // Attempts: from their first to their last event.
  const attempts = new Map();
  stages.forEach((s, i) => {
    if (!s.attempt) return;
    const a = attempts.get(s.attempt) || { first: times[i], last: times[i], kinds: new Set(), firstIndex: i };
    a.last = Math.max(a.last, times[i]);
    a.kinds.add(stageKind(s));
    attempts.set(s.attempt, a);
  });

  let shownAttempt = 0;
  const actors = stageActors(stages);
  const indexOf = new Map(stages.map((s, i) => [s, i]));
  const actorLabel = (a) => (a ? h("span", { class: "wf-actor", title: a }, localName(a)) : null);
  for (const item of foldOutboxRetries(stages)) {
    if (item.group) {
      // Retries of a relay to a peer that is down: one row, with a count.
      const first = indexOf.get(item.stages[0]);
      const lastIdx = indexOf.get(item.stages[item.stages.length - 1]);
      const start = times[first] - t0;
      const end = lastIdx + 1 < stages.length ? times[lastIdx + 1] - t0 : (ongoing ? tEnd - t0 : times[lastIdx] - t0);
      const count = `${item.attempts || item.stages.length} attempt${(item.attempts || item.stages.length) === 1 ? "" : "s"}`;
      rows.push(row("wf-stage wf-outbox rk-retry", [h("span", { class: "wf-dot k-retry" }), h("span", { class: "wf-name" }, item.label)],
        [bar("retry", start, end, `${item.label}${item.peer ? ` (${item.peer})` : ""}: ${count} in ${fmtSpan(end - start)}${item.lastError ? ` · ${item.lastError}` : ""}`),
          durLabel(start, end, `×${item.attempts || item.stages.length} · ${fmtSpan(end - start)}`)],
        { tabindex: "0", dataset: { seq: String(item.stages[0].seq), state: item.stages[0].state, kind: "outbox-retry", count: String(item.stages.length) },
          title: `${item.label}: ${count}${item.lastError ? `, last error: ${item.lastError}` : ""}`,
          onclick: () => onPick && onPick(item.stages[0].seq),
          onkeydown: (e) => { if (e.key === "Enter") onPick && onPick(item.stages[0].seq); } }));
      continue;
    }
    const s = item;
    const i = indexOf.get(s);
    if (s.attempt && s.attempt !== shownAttempt && attempts.has(s.attempt) && attempts.get(s.attempt).firstIndex === i && attempts.size > 1) {
      shownAttempt = s.attempt;
      const a = attempts.get(s.attempt);
      const kind = a.kinds.has("retry") || a.kinds.has("error") ? "error" : a.kinds.has("success") ? "success" : "active";
      const start = a.first - t0;
      const end = a.last - t0;
      rows.push(row("wf-attempt", [h("span", null, `Attempt ${s.attempt}`)],
        [bar(kind, start, end, `attempt ${s.attempt}: ${fmtSpan(end - start)}`, { dataset: { attempt: String(s.attempt) } }), durLabel(start, end, fmtSpan(end - start))],
        { dataset: { attempt: String(s.attempt) } }));
    }
    const kind = stageKind(s);
    const start = times[i] - t0;
    let end = i + 1 < stages.length ? times[i + 1] - t0 : (ongoing ? tEnd - t0 : start);
    if (kind === "retry" && i + 1 === stages.length && s.details && s.details.nextRetryAt) end = Number(s.details.nextRetryAt) - t0;
    const d = s.details || {};
    const name = kind === "retry" ? "failed → retry wait" : s.state.replace(/_/g, " ");
    const label = [h("span", { class: `wf-dot k-${kind}` }), actorLabel(actors[i]), h("span", { class: "wf-name" }, name)];
    const parts = [];
    if (kind === "retry") {
      // The failed attempt as a mark, the wait until the retry as a span.
      parts.push(h("div", { class: "wf-mark k-error", title: `attempt ${s.attempt || "?"} failed: ${d.errorCode || d.error}` }));
      parts[0].style.left = pct(start);
      parts.push(bar("retry", start, end, `waited ${fmtSpan(end - start)} before the next attempt`));
      parts.push(durLabel(start, end, `${d.errorCode || "error"} · wait ${fmtSpan(end - start)}`));
    } else {
      parts.push(bar(kind, start, end, `${name}: ${fmtSpan(end - start)}${d.errorCode ? ` · ${d.errorCode}` : ""}`));
      const isLast = i === stages.length - 1;
      const text = isLast && ongoing ? `${fmtSpan(end - start)} so far` : end > start ? fmtSpan(end - start) : (d.errorCode || (isLast ? "end" : "0 ms"));
      parts.push(durLabel(start, end, text));
    }
    rows.push(row(`wf-stage rk-${kind}`, label, parts, {
      tabindex: "0", dataset: actors[i] ? { seq: String(s.seq), state: s.state, kind, actor: actors[i] } : { seq: String(s.seq), state: s.state, kind },
      title: `${actors[i] ? `${actors[i]}: ` : ""}${name} at +${fmtSpan(start)}${s.transport ? ` via ${s.transport}` : ""}`,
      onclick: () => onPick && onPick(s.seq),
      onkeydown: (e) => { if (e.key === "Enter") onPick && onPick(s.seq); },
    }));
  }

  // The time axis.
  const axis = h("div", { class: "wf-track wf-axis-track" });
  const step = niceStep(total, 6);
  for (let v = 0; v <= total + 1e-6; v += step) {
    const tick = h("span", { class: "wf-tick", dataset: { ms: String(v) } }, h("span", null, v === 0 ? "0" : fmtSpan(v)));
    tick.style.left = pct(v);
    if (v / total > 0.85) tick.classList.add("end");
    axis.append(tick);
  }
  const grid = h("div", { class: "wf-grid", "aria-hidden": "true" });
  for (let v = step; v < total; v += step) {
    const g = h("span");
    g.style.left = pct(v);
    grid.append(g);
  }

  const legend = h("div", { class: "legend wf-legend" }, ...["active", "wait", "retry", "error", "success"].map((k) =>
    h("span", null, h("i", { class: `wf-swatch k-${k}` }), KIND_LABEL[k])));

  return h("div", { class: "waterfall", id: "waterfall", dataset: { totalMs: String(total), t0: new Date(t0).toISOString() } },
    h("div", { class: "wf-row wf-axis" }, h("div", { class: "wf-label muted" }, "Time since received"), axis),
    h("div", { class: "wf-body", role: "list" }, h("div", { class: "wf-row wf-gridrow", "aria-hidden": "true" }, h("div", { class: "wf-label" }), grid), ...rows),
    legend);
}
