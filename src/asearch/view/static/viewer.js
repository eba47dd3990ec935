// asearch view: live SVG line charts fed by /api/metrics, run-state polling, click-to-open
// trajectories and the turn stepper. Plain browser JavaScript: no build step, no dependencies.
// Text from runs is only ever set with textContent here; HTML fragments come escaped from the server.
(() => {
  "use strict";

  const SVG_NS = "http://www.w3.org/2000/svg";
  const POLL_MS = Number(document.body.dataset.pollMs) || 2000;
  const COLORS = ["#2563eb", "#dc2626", "#16a34a", "#d97706", "#7c3aed",
                  "#0891b2", "#db2777", "#65a30d", "#475569", "#ea580c"];
  const W = 460, H = 220, M = { l: 52, r: 14, t: 12, b: 30 };

  function el(tag, cls, text) {
    const e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined) e.textContent = text;
    return e;
  }

  function svgEl(tag, attrs) {
    const e = document.createElementNS(SVG_NS, tag);
    for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, String(v));
    return e;
  }

  function setLive(ok) {
    const dot = document.getElementById("live");
    if (dot) {
      dot.classList.toggle("down", !ok);
      dot.title = ok ? "live: polling the run files" : "the viewer server does not answer";
    }
  }

  async function getJSON(url) {
    const resp = await fetch(url, { cache: "no-store" });
    if (!resp.ok) throw new Error(url + ": HTTP " + resp.status);
    return resp.json();
  }

  // ------------------------------------------------------------------ metric store

  // run id -> {name, cursor, generation, series: Map(key -> Map(step -> {step, wall, v}))}
  const runs = new Map();

  function ingest(run, row) {
    const step = row.step;
    if (typeof step !== "number") return;
    const wall = typeof row.wall_s === "number" ? row.wall_s : null;
    for (const [key, v] of Object.entries(row)) {
      if (key === "step" || key === "wall_s" || typeof v !== "number" || !isFinite(v)) continue;
      if (!run.series.has(key)) run.series.set(key, new Map());
      run.series.get(key).set(step, { step, wall, v }); // a step logged again (resume) replaces the old
    }
  }

  async function pollMetrics() {
    let changed = false;
    for (const [id, run] of runs) {
      let url = "/api/metrics?run=" + encodeURIComponent(id) + "&cursor=" + run.cursor;
      if (run.generation !== null) url += "&generation=" + run.generation;
      const data = await getJSON(url);
      if (data.reset) { run.series.clear(); changed = true; }
      run.cursor = data.cursor;
      run.generation = data.generation;
      for (const row of data.rows) ingest(run, row);
      if (data.rows.length) changed = true;
    }
    return changed;
  }

  // ------------------------------------------------------------------ charts

  function niceStep(span, n) {
    const raw = span / Math.max(n, 1);
    const mag = Math.pow(10, Math.floor(Math.log10(raw)));
    const f = raw / mag;
    return (f < 1.5 ? 1 : f < 3 ? 2 : f < 7 ? 5 : 10) * mag;
  }

  function ticks(lo, hi, n) {
    const step = niceStep(hi - lo, n);
    const out = [];
    for (let t = Math.ceil(lo / step) * step; t <= hi + step * 1e-9; t += step) out.push(+t.toPrecision(12));
    return out;
  }

  function fmt(v) {
    const a = Math.abs(v);
    if (a !== 0 && (a >= 1e5 || a < 1e-3)) return v.toExponential(1);
    return String(+v.toPrecision(4));
  }

  function keysFor(fig) {
    if (fig.classList.contains("chart-any")) {
      const sel = document.getElementById("any-metric");
      return sel && sel.value ? [sel.value] : [];
    }
    return (fig.dataset.keys || "").split(",").filter(Boolean);
  }

  function matching(spec, series) {
    const out = [];
    for (const want of spec) {
      if (want.endsWith("/")) {
        for (const k of [...series.keys()].sort()) if (k.startsWith(want) && !out.includes(k)) out.push(k);
      } else if (series.has(want) && !out.includes(want)) {
        out.push(want);
      }
    }
    return out;
  }

  function linesFor(fig) {
    const xmode = (document.getElementById("x-axis") || {}).value || "step";
    const alpha = Number((document.getElementById("smooth") || {}).value || 0);
    const spec = keysFor(fig);
    const lines = [];
    let ri = 0;
    for (const [, run] of runs) {
      for (const key of matching(spec, run.series)) {
        let pts = [...run.series.get(key).values()].sort((a, b) => a.step - b.step)
          .map((p) => ({ x: xmode === "step" ? p.step : (p.wall === null ? NaN : p.wall / 60), y: p.v, step: p.step }))
          .filter((p) => isFinite(p.x));
        if (alpha > 0) {
          let m = null;
          pts = pts.map((p) => { m = m === null ? p.y : alpha * m + (1 - alpha) * p.y; return { ...p, y: m }; });
        }
        if (pts.length) lines.push({ run: run.name, key, pts, color: COLORS[lines.length % COLORS.length], ri });
      }
      ri += 1;
    }
    return lines;
  }

  function drawChart(fig) {
    const lines = linesFor(fig);
    for (const old of fig.querySelectorAll("svg, .legend, .empty, .tip")) old.remove();
    if (!lines.length) {
      fig.appendChild(el("p", "empty", "no data yet"));
      return;
    }
    const xs = lines.flatMap((l) => l.pts.map((p) => p.x));
    const ys = lines.flatMap((l) => l.pts.map((p) => p.y));
    let x0 = Math.min(...xs), x1 = Math.max(...xs), y0 = Math.min(...ys), y1 = Math.max(...ys);
    if (x0 === x1) { x0 -= 1; x1 += 1; }
    if (y0 === y1) {
      if (y0 === 0) y1 = 1; // a flat zero (no errors) sits at the bottom
      else { y0 -= Math.abs(y0) * 0.1; y1 += Math.abs(y1) * 0.1; }
    }
    if (y0 > 0 && y0 < 0.35 * y1) y0 = 0; // anchor mostly-positive curves at zero
    const pad = (y1 - y0) * 0.06;
    y1 += pad; if (y0 !== 0) y0 -= pad;
    const sx = (x) => M.l + ((x - x0) / (x1 - x0)) * (W - M.l - M.r);
    const sy = (y) => H - M.b - ((y - y0) / (y1 - y0)) * (H - M.t - M.b);

    const svg = svgEl("svg", { viewBox: `0 0 ${W} ${H}`, class: "plot", role: "img" });
    const grid = svgEl("g", { class: "grid" });
    for (const t of ticks(y0, y1, 4)) {
      grid.appendChild(svgEl("line", { x1: M.l, x2: W - M.r, y1: sy(t), y2: sy(t) }));
      const label = svgEl("text", { x: M.l - 6, y: sy(t) + 4, "text-anchor": "end" });
      label.textContent = fmt(t);
      grid.appendChild(label);
    }
    for (const t of ticks(x0, x1, 5)) {
      grid.appendChild(svgEl("line", { x1: sx(t), x2: sx(t), y1: M.t, y2: H - M.b, class: "v" }));
      const label = svgEl("text", { x: sx(t), y: H - M.b + 16, "text-anchor": "middle" });
      label.textContent = fmt(t);
      grid.appendChild(label);
    }
    svg.appendChild(grid);
    svg.appendChild(svgEl("rect", { x: M.l, y: M.t, width: W - M.l - M.r, height: H - M.t - M.b, class: "frame" }));
    const dash = ["", "5 3", "2 3", "8 3 2 3"];
    for (const line of lines) {
      const d = line.pts.map((p, i) => (i ? "L" : "M") + sx(p.x).toFixed(1) + " " + sy(p.y).toFixed(1)).join(" ");
      svg.appendChild(svgEl("path", {
        d, class: "series", stroke: line.color, "data-points": line.pts.length, "data-key": line.key,
        "stroke-dasharray": dash[line.ri % dash.length],
      }));
      if (line.pts.length < 40) {
        for (const p of line.pts) svg.appendChild(svgEl("circle", { cx: sx(p.x), cy: sy(p.y), r: 2.2, fill: line.color }));
      }
    }
    const xmode = (document.getElementById("x-axis") || {}).value || "step";
    const xl = svgEl("text", { x: W - M.r, y: H - 2, "text-anchor": "end", class: "axis-label" });
    xl.textContent = xmode === "step" ? "step" : "wall time (min)";
    svg.appendChild(xl);
    const cursor = svgEl("line", { class: "cursor", y1: M.t, y2: H - M.b, x1: -10, x2: -10 });
    svg.appendChild(cursor);
    fig.appendChild(svg);

    const legend = el("div", "legend");
    const several = runs.size > 1;
    for (const line of lines) {
      const item = el("span", "item");
      const sw = el("i", "swatch");
      sw.style.background = line.color;
      item.appendChild(sw);
      item.appendChild(document.createTextNode((several ? line.run + " · " : "") + line.key));
      legend.appendChild(item);
    }
    fig.appendChild(legend);

    const tip = el("div", "tip");
    tip.hidden = true;
    fig.appendChild(tip);
    svg.addEventListener("mousemove", (ev) => {
      const box = svg.getBoundingClientRect();
      const x = x0 + ((ev.clientX - box.left) / box.width * W - M.l) / (W - M.l - M.r) * (x1 - x0);
      let best = null;
      for (const line of lines) for (const p of line.pts) {
        if (best === null || Math.abs(p.x - x) < Math.abs(best - x)) best = p.x;
      }
      if (best === null) return;
      cursor.setAttribute("x1", sx(best)); cursor.setAttribute("x2", sx(best));
      tip.textContent = "";
      tip.appendChild(el("b", "", (xmode === "step" ? "step " : "min ") + fmt(best)));
      for (const line of lines) {
        const p = line.pts.find((q) => q.x === best);
        if (p) tip.appendChild(el("div", "", (several ? line.run + " · " : "") + line.key + ": " + fmt(p.y)));
      }
      tip.hidden = false;
      const left = (sx(best) / W) * box.width;
      tip.style.left = Math.min(left + 12, box.width - 180) + "px";
    });
    svg.addEventListener("mouseleave", () => { tip.hidden = true; cursor.setAttribute("x1", -10); cursor.setAttribute("x2", -10); });
  }

  function refreshAnyMetric() {
    const sel = document.getElementById("any-metric");
    if (!sel) return;
    const keys = new Set();
    for (const [, run] of runs) for (const k of run.series.keys()) keys.add(k);
    const sorted = [...keys].sort();
    if (sorted.length === sel.options.length) return;
    const keep = sel.value;
    sel.textContent = "";
    for (const k of sorted) { const o = el("option", "", k); o.value = k; sel.appendChild(o); }
    if (keep && keys.has(keep)) sel.value = keep;
    else {
      const covered = [...document.querySelectorAll("figure.chart[data-keys]")].flatMap((f) => keysFor(f));
      const free = sorted.find((k) => !covered.some((c) => k === c || (c.endsWith("/") && k.startsWith(c))));
      if (free) sel.value = free;
    }
  }

  // ------------------------------------------------------------------ histograms over steps (the staleness lab)

  // A figure with data-bins is a histogram logged as one key per bin (data-keys + label). Each run gets a
  // panel of stacked bands, bottom to top in the bins' order: a band's height at a step is that bin's share
  // of the step's total.
  // Diverging for the 9 ratio bins (blue below 1, green around it, red above); fresh to stale for the 5
  // versions-behind bins.
  const BIN_COLORS = ["#1e3a8a", "#2563eb", "#0891b2", "#16a34a", "#84cc16",
                      "#eab308", "#f97316", "#dc2626", "#7f1d1d"];
  const FEW_BIN_COLORS = ["#1e3a8a", "#0891b2", "#eab308", "#f97316", "#dc2626"];
  const binColor = (i, n) => (n <= FEW_BIN_COLORS.length ? FEW_BIN_COLORS : BIN_COLORS)[i % BIN_COLORS.length];

  function shareRows(run, prefix, bins, xmode) {
    const steps = new Map(); // step -> {step, wall, counts}
    bins.forEach((bin, i) => {
      const series = run.series.get(prefix + bin);
      if (!series) return;
      for (const p of series.values()) {
        if (!steps.has(p.step)) steps.set(p.step, { step: p.step, wall: p.wall, counts: bins.map(() => 0) });
        steps.get(p.step).counts[i] = p.v;
      }
    });
    const rows = [];
    for (const r of [...steps.values()].sort((a, b) => a.step - b.step)) {
      const total = r.counts.reduce((a, b) => a + b, 0);
      const x = xmode === "step" ? r.step : (r.wall === null ? NaN : r.wall / 60);
      if (total > 0 && isFinite(x)) rows.push({ x, step: r.step, total, shares: r.counts.map((c) => c / total) });
    }
    return rows;
  }

  function drawShares(fig) {
    const xmode = (document.getElementById("x-axis") || {}).value || "step";
    const prefix = fig.dataset.keys, bins = fig.dataset.bins.split("|");
    for (const old of fig.querySelectorAll("svg, .legend, .empty, .tip, .run-label")) old.remove();
    const panels = [];
    for (const [, run] of runs) {
      const rows = shareRows(run, prefix, bins, xmode);
      if (rows.length) panels.push({ run, rows });
    }
    if (!panels.length) {
      fig.appendChild(el("p", "empty", "no data yet"));
      return;
    }
    const tip = el("div", "tip");
    tip.hidden = true;
    for (const { run, rows } of panels) {
      if (runs.size > 1) fig.appendChild(el("div", "run-label muted", run.name));
      const x0 = rows[0].x, x1 = rows.length > 1 ? rows[rows.length - 1].x : rows[0].x + 1;
      const sx = (x) => M.l + ((x - x0) / (x1 - x0)) * (W - M.l - M.r);
      const sy = (y) => H - M.b - y * (H - M.t - M.b);
      const svg = svgEl("svg", { viewBox: `0 0 ${W} ${H}`, class: "plot", role: "img" });
      const grid = svgEl("g", { class: "grid" });
      for (const t of [0, 0.25, 0.5, 0.75, 1]) {
        const label = svgEl("text", { x: M.l - 6, y: sy(t) + 4, "text-anchor": "end" });
        label.textContent = Math.round(t * 100) + "%";
        grid.appendChild(label);
      }
      for (const t of ticks(x0, x1, 5)) {
        const label = svgEl("text", { x: sx(t), y: H - M.b + 16, "text-anchor": "middle" });
        label.textContent = fmt(t);
        grid.appendChild(label);
      }
      svg.appendChild(grid);
      const xs = rows.length > 1 ? rows.map((r) => r.x) : [x0, x1]; // one step: a full-width column
      const at = (j) => (rows.length > 1 ? rows[j] : rows[0]);
      let below = xs.map(() => 0);
      bins.forEach((bin, i) => {
        const above = xs.map((_, j) => below[j] + at(j).shares[i]);
        const top = xs.map((x, j) => sx(x).toFixed(1) + " " + sy(above[j]).toFixed(1));
        const bottom = xs.map((x, j) => sx(x).toFixed(1) + " " + sy(below[j]).toFixed(1)).reverse();
        svg.appendChild(svgEl("path", {
          d: "M" + top.join(" L") + " L" + bottom.join(" L") + " Z", class: "band",
          fill: binColor(i, bins.length), "data-bin": bin,
        }));
        below = above;
      });
      svg.appendChild(svgEl("rect", { x: M.l, y: M.t, width: W - M.l - M.r, height: H - M.t - M.b, class: "frame" }));
      const cursor = svgEl("line", { class: "cursor", y1: M.t, y2: H - M.b, x1: -10, x2: -10 });
      svg.appendChild(cursor);
      svg.addEventListener("mousemove", (ev) => {
        const box = svg.getBoundingClientRect();
        const x = x0 + ((ev.clientX - box.left) / box.width * W - M.l) / (W - M.l - M.r) * (x1 - x0);
        const row = rows.reduce((a, b) => (Math.abs(b.x - x) < Math.abs(a.x - x) ? b : a));
        cursor.setAttribute("x1", sx(row.x)); cursor.setAttribute("x2", sx(row.x));
        tip.textContent = "";
        tip.appendChild(el("b", "", run.name + " · step " + row.step + " · " + fmt(row.total) + " tokens"));
        bins.forEach((bin, i) => tip.appendChild(el("div", "", bin + ": " + (100 * row.shares[i]).toFixed(1) + "%")));
        tip.hidden = false;
        tip.style.left = Math.min((sx(row.x) / W) * box.width + 12, box.width - 180) + "px";
      });
      svg.addEventListener("mouseleave", () => { tip.hidden = true; cursor.setAttribute("x1", -10); cursor.setAttribute("x2", -10); });
      fig.appendChild(svg);
    }
    const legend = el("div", "legend");
    bins.forEach((bin, i) => {
      const item = el("span", "item");
      const sw = el("i", "swatch");
      sw.style.background = binColor(i, bins.length);
      item.appendChild(sw);
      item.appendChild(document.createTextNode(bin));
      legend.appendChild(item);
    });
    fig.appendChild(legend);
    fig.appendChild(tip);
  }

  function drawAll() {
    refreshAnyMetric();
    const lab = document.getElementById("staleness");
    if (lab) { // shown once some run logs one of its histograms
      const wanted = (lab.dataset.prefixes || "").split("|").filter(Boolean);
      lab.hidden = ![...runs.values()].some((run) => [...run.series.keys()].some((k) => wanted.some((w) => k.startsWith(w))));
    }
    for (const fig of document.querySelectorAll("#curves figure.chart")) {
      if (fig.dataset.bins) drawShares(fig);
      else drawChart(fig);
    }
  }

  // ------------------------------------------------------------------ run states

  function ago(s) {
    if (s === null || s === undefined) return "–";
    if (s < 90) return Math.round(s) + "s ago";
    if (s < 5400) return Math.round(s / 60) + " min ago";
    return (s / 3600).toFixed(1) + " h ago";
  }

  function showStates(data) {
    for (const info of data.runs) {
      const cell = document.querySelector('td.status[data-status="' + CSS.escape(info.id) + '"]');
      if (cell) {
        cell.textContent = "";
        if (info.state) {
          cell.appendChild(el("span", "state state-" + info.state, info.state));
          cell.appendChild(document.createTextNode(" "));
        }
        cell.appendChild(el("span", "muted", "updated " + ago(info.updated_s_ago)));
        cell.appendChild(el("br"));
        const counts = Object.entries(info.counts).map(([k, v]) => v + " " + k.replace(/_/g, " ")).join(", ");
        cell.appendChild(el("span", "muted", counts));
        if (info.bad_lines) {
          const b = el("span", "badge warn", " " + info.bad_lines + " bad lines skipped");
          b.title = info.problems.join("\n");
          cell.appendChild(b);
        }
      }
      const notice = document.getElementById("new-trajectories");
      if (notice && notice.dataset.run === info.id && info.counts.trajectories !== undefined) {
        const extra = info.counts.trajectories - Number(notice.dataset.total);
        notice.textContent = "";
        if (extra > 0) {
          const a = el("a", "", "· " + extra + " new, reload");
          a.href = location.href;
          notice.appendChild(a);
        }
      }
    }
  }

  // ------------------------------------------------------------------ trajectories

  let current = null; // the trajectory article the arrow keys step through

  function initStepper(article) {
    if (!article) return;
    current = article;
    const turns = [...article.querySelectorAll("li.turn")];
    const bar = article.querySelector(".stepper");
    if (!bar || turns.length < 2) return;
    bar.hidden = false;
    const all = bar.querySelector(".all");
    all.checked = localStorage.getItem("asearch-view-all-turns") === "1";
    let at = 0;
    const chips = bar.querySelector(".chips");
    const chipButtons = turns.map((t, i) => {
      const b = el("button", "chip chip-" + (t.dataset.label || "act"), (i + 1) + " " + (t.dataset.label || ""));
      b.type = "button";
      b.addEventListener("click", () => { all.checked = false; at = i; show(); });
      if (chips) chips.appendChild(b);
      return b;
    });
    const show = () => {
      turns.forEach((t, i) => { t.hidden = !all.checked && i !== at; });
      chipButtons.forEach((b, i) => b.classList.toggle("on", !all.checked && i === at));
      bar.querySelector(".pos").textContent = all.checked ? turns.length + " turns" : "Turn " + (at + 1) + " / " + turns.length;
      bar.querySelector(".prev").disabled = all.checked || at === 0;
      bar.querySelector(".next").disabled = all.checked || at === turns.length - 1;
    };
    article.step = (d) => { at = Math.max(0, Math.min(turns.length - 1, at + d)); show(); };
    bar.querySelector(".prev").addEventListener("click", () => article.step(-1));
    bar.querySelector(".next").addEventListener("click", () => article.step(1));
    all.addEventListener("change", () => { localStorage.setItem("asearch-view-all-turns", all.checked ? "1" : "0"); show(); });
    show();
  }

  document.addEventListener("keydown", (ev) => {
    if (!current || !current.step || ev.altKey || ev.ctrlKey || ev.metaKey) return;
    if (ev.target.closest && ev.target.closest("input, select, textarea")) return;
    if (ev.key === "ArrowRight") current.step(1);
    if (ev.key === "ArrowLeft") current.step(-1);
  });

  document.addEventListener("click", async (ev) => {
    const a = ev.target.closest && ev.target.closest("a.traj-link");
    const detail = document.getElementById("detail");
    if (!a || !detail || ev.button !== 0 || ev.ctrlKey || ev.metaKey || ev.shiftKey) return;
    ev.preventDefault();
    const url = "/fragment/trajectory?run=" + encodeURIComponent(a.dataset.run) + "&i=" +
      encodeURIComponent(a.dataset.index) + "&id=" + encodeURIComponent(a.dataset.id || "");
    try {
      const resp = await fetch(url, { cache: "no-store" });
      const body = await resp.text();
      detail.innerHTML = resp.ok ? body : ""; // server-rendered and escaped
      if (!resp.ok) detail.appendChild(el("p", "error", "could not open: HTTP " + resp.status + " " + body));
    } catch (err) {
      detail.textContent = "";
      detail.appendChild(el("p", "error", String(err)));
      return;
    }
    for (const li of document.querySelectorAll(".traj-item.active")) li.classList.remove("active");
    a.parentElement.classList.add("active");
    history.pushState(null, "", a.href);
    initStepper(detail.querySelector("article.trajectory"));
    if (detail.getBoundingClientRect().top < 0) detail.scrollIntoView({ block: "start" });
  });

  window.addEventListener("popstate", () => location.reload());

  // ------------------------------------------------------------------ start

  async function tick() {
    try {
      const [states, changed] = await Promise.all([getJSON("/api/runs"), runs.size ? pollMetrics() : false]);
      showStates(states);
      if (changed) drawAll();
      setLive(true);
    } catch (err) {
      setLive(false);
    }
    setTimeout(tick, document.hidden ? POLL_MS * 5 : POLL_MS);
  }

  function start() {
    const charts = document.getElementById("charts");
    if (charts) {
      for (const r of JSON.parse(charts.dataset.runs || "[]")) {
        runs.set(r.id, { name: r.name, cursor: 0, generation: null, series: new Map() });
      }
      for (const id of ["x-axis", "smooth", "any-metric"]) {
        const sel = document.getElementById(id);
        if (sel) sel.addEventListener("change", drawAll);
      }
      drawAll();
    }
    initStepper(document.querySelector("#detail article.trajectory"));
    tick();
  }

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
  else start();
})();
