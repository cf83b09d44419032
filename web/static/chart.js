// Small SVG charts for the overview: stacked outcome bars and latency lines.
// They draw at the container's pixel width so text is never stretched.

const NS = "http://www.w3.org/2000/svg";

function el(tag, attrs = {}, text) {
  const e = document.createElementNS(NS, tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v !== undefined && v !== null) e.setAttribute(k, String(v));
  }
  if (text !== undefined) e.textContent = text;
  return e;
}

// niceMax returns a top for the axis so that its 4 steps are round numbers
// (1, 2 or 5 times a power of ten; whole numbers for counts).
function niceMax(v, integer) {
  if (!(v > 0)) return 4;
  const raw = v / 4;
  const p = Math.pow(10, Math.floor(Math.log10(raw)));
  let step = 10 * p;
  for (const m of [1, 2, 5, 10]) {
    if (raw <= m * p) { step = m * p; break; }
  }
  if (integer) step = Math.max(1, Math.ceil(step));
  return step * 4;
}

function fmtAxis(v, unit) {
  if (unit === "ms") {
    if (v >= 1000) return (v / 1000).toFixed(v % 1000 === 0 ? 0 : 1) + " s";
    return Math.round(v) + " ms";
  }
  if (v >= 1000) return (v / 1000).toFixed(v % 1000 === 0 ? 0 : 1) + "k";
  return String(Math.round(v * 10) / 10);
}

function fmtTick(iso, bucketSeconds) {
  const d = new Date(iso);
  if (bucketSeconds >= 6 * 3600) {
    return d.toLocaleDateString(undefined, { month: "short", day: "numeric" }) +
      (bucketSeconds < 86400 ? " " + String(d.getHours()).padStart(2, "0") + "h" : "");
  }
  return String(d.getHours()).padStart(2, "0") + ":" + String(d.getMinutes()).padStart(2, "0");
}

function frame(svg, height) {
  const width = Math.max(160, Math.floor(svg.parentElement.clientWidth || 600));
  svg.replaceChildren();
  svg.setAttribute("viewBox", `0 0 ${width} ${height}`);
  svg.setAttribute("width", width);
  svg.setAttribute("height", height);
  return { width, height, left: 48, right: 12, top: 12, bottom: 26 };
}

function axes(svg, f, max, unit, buckets, bucketSeconds, xOf) {
  const plotH = f.height - f.top - f.bottom;
  for (let i = 0; i <= 4; i++) {
    const v = (max / 4) * i;
    const y = f.top + plotH - (plotH * i) / 4;
    svg.append(el("line", { x1: f.left, x2: f.width - f.right, y1: y, y2: y, class: "grid-line" }));
    svg.append(el("text", { x: f.left - 8, y: y + 4, "text-anchor": "end" }, fmtAxis(v, unit)));
  }
  const n = buckets.length;
  const every = Math.max(1, Math.ceil(n / 7));
  for (let i = 0; i < n; i += every) {
    svg.append(el("text", { x: xOf(i), y: f.height - 8, "text-anchor": "middle" }, fmtTick(buckets[i].bucketStart, bucketSeconds)));
  }
}

// stackedBars draws one bar per bucket, stacked success / error / in flight.
export function stackedBars(svg, buckets, bucketSeconds, label) {
  const f = frame(svg, 220);
  const n = buckets.length || 1;
  const plotW = f.width - f.left - f.right;
  const plotH = f.height - f.top - f.bottom;
  const slot = plotW / n;
  const barW = Math.max(2, Math.min(28, slot * 0.68));
  const max = niceMax(Math.max(0, ...buckets.map((b) => b.total)), true);
  const xOf = (i) => f.left + slot * i + slot / 2;
  axes(svg, f, max, "", buckets, bucketSeconds, xOf);
  svg.setAttribute("role", "img");
  svg.setAttribute("aria-label", label);
  buckets.forEach((b, i) => {
    const g = el("g");
    let y = f.top + plotH;
    for (const [key, cls] of [["success", "bar-success"], ["error", "bar-error"], ["inFlight", "bar-inflight"]]) {
      const v = b[key] || 0;
      if (!v) continue;
      const hgt = Math.max(1, (v / max) * plotH);
      y -= hgt;
      g.append(el("rect", { x: xOf(i) - barW / 2, y, width: barW, height: hgt, class: cls, rx: 2 }));
    }
    const t = new Date(b.bucketStart).toLocaleString();
    g.append(el("title", {}, `${t}\n${b.total} intents · ${b.success} acked · ${b.error} failed · ${b.inFlight} in flight\n${(b.throughput || 0).toFixed(2)} / min`));
    // An invisible full-height target makes the tooltip easy to hit.
    g.append(el("rect", { x: f.left + slot * i, y: f.top, width: slot, height: plotH, fill: "transparent" }));
    svg.append(g);
  });
}

// latencyLines draws p50 and p95 latency per bucket (gaps where no intent
// completed).
export function latencyLines(svg, buckets, bucketSeconds, label) {
  const f = frame(svg, 220);
  const n = buckets.length || 1;
  const plotW = f.width - f.left - f.right;
  const plotH = f.height - f.top - f.bottom;
  const slot = plotW / n;
  const vals = buckets.flatMap((b) => [b.p50LatencyMs, b.p95LatencyMs]).filter((v) => v !== null && v !== undefined);
  const max = niceMax(Math.max(1, ...vals), true);
  const xOf = (i) => f.left + slot * i + slot / 2;
  const yOf = (v) => f.top + plotH - (v / max) * plotH;
  axes(svg, f, max, "ms", buckets, bucketSeconds, xOf);
  svg.setAttribute("role", "img");
  svg.setAttribute("aria-label", label);
  for (const [key, cls, pt] of [["p50LatencyMs", "line-p50", "pt-p50"], ["p95LatencyMs", "line-p95", "pt-p95"]]) {
    let d = "";
    let pen = false;
    buckets.forEach((b, i) => {
      const v = b[key];
      if (v === null || v === undefined) { pen = false; return; }
      d += `${pen ? "L" : "M"}${xOf(i).toFixed(1)},${yOf(v).toFixed(1)}`;
      pen = true;
    });
    if (d) svg.append(el("path", { d, class: cls }));
    buckets.forEach((b, i) => {
      const v = b[key];
      if (v === null || v === undefined) return;
      const c = el("circle", { cx: xOf(i), cy: yOf(v), r: n > 40 ? 1.5 : 2.5, class: pt });
      c.append(el("title", {}, `${new Date(b.bucketStart).toLocaleString()}\n${key.startsWith("p50") ? "p50" : "p95"}: ${v} ms`));
      svg.append(c);
    });
  }
}
