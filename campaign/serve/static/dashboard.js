// The dashboard's live parts: status and curves kept current by polling /api/live with the
// cursor the server returned last time, so each poll carries only what is new.
// Every ledger string reaches the page through textContent (never as markup).
"use strict";

(function () {
  const PAGE = JSON.parse(document.getElementById("page-data").textContent);
  const PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
                   "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"];
  const ENDED_BADLY = new Set(["diverged", "failed", "oom", "lost", "interrupted"]);
  const COUNTED = new Set(["completed", "stopped", "running"]);
  const TERMINAL = new Set(["completed", "stopped", "diverged", "failed", "oom", "withdrawn"]);
  const POLL_MS = 2000;

  const state = {
    runs: new Map(),        // run id -> {variant, is_control, seed, status, original, ...}
    points: new Map(),      // key -> Map(run id -> {steps: [], values: []})
    cursor: null,
    keys: PAGE.kind === "campaign" ? PAGE.keys.slice() : null,  // null: every key (run page)
    pendingKeys: [],
    charts: new Map(),      // key -> {plot, signature, box, range, markers, zoom}
    dirty: true,
  };

  function make(tag, className, text) {
    const node = document.createElement(tag);
    if (className) node.className = className;
    if (text !== undefined && text !== null) node.textContent = String(text);
    return node;
  }

  function runLink(id) {
    const link = make("a", "", id);
    link.href = "/r/" + encodeURIComponent(id);
    return link;
  }

  // ---- polling ---------------------------------------------------------------------------

  async function fetchLive(keys, cursor) {
    const params = new URLSearchParams({campaign: PAGE.campaign});
    if (PAGE.run) params.set("run", PAGE.run);
    for (const key of keys || []) params.append("key", key);
    if (cursor) params.set("cursor", cursor);
    const response = await fetch("/api/live?" + params.toString(),
                                 {credentials: "same-origin", cache: "no-store"});
    const text = await response.text();
    let reply = null;
    try { reply = JSON.parse(text); } catch (error) { reply = null; }
    if (!response.ok || reply === null) {
      throw new Error((reply && reply.error) || text.slice(0, 200) || response.statusText);
    }
    return reply;
  }

  async function poll() {
    const connection = document.getElementById("connection");
    try {
      while (state.pendingKeys.length) {  // a key just chosen: all its points once
        const key = state.pendingKeys[0];
        const reply = await fetchLive([key], null);  // on failure: tried again next poll
        state.pendingKeys.shift();
        if (state.keys.includes(key)) mergePoints(reply.points);
      }
      apply(await fetchLive(state.keys, state.cursor));
      connection.textContent = "· live, updated " + new Date().toLocaleTimeString();
      connection.className = "meta";
    } catch (error) {
      connection.textContent = "· cannot reach the server (" + error.message + "): retrying";
      connection.className = "meta error";
    }
    setTimeout(poll, POLL_MS);
  }

  function apply(reply) {
    state.cursor = reply.cursor;
    if (reply.runs) {
      state.runs = new Map(reply.runs.map((run) => [run.id, run]));
      state.dirty = true;
    }
    applyResets(reply.reset);
    mergePoints(reply.points);
    showStatus(reply.status);
    if (state.dirty) drawCharts();
  }

  function applyResets(reset) {
    for (const [run, start] of Object.entries(reset || {})) {
      for (const byRun of state.points.values()) {
        const line = byRun.get(run);
        if (!line) continue;
        let keep = line.steps.length;
        while (keep > 0 && line.steps[keep - 1] > start) keep--;
        line.steps.length = keep;
        line.values.length = keep;
        state.dirty = true;
      }
    }
  }

  // Points come as {s: steps, v: values}: values base64 little-endian float64 (exact, NaN
  // and infinities kept); steps [first, stride, count] when evenly spaced, else base64 int32.
  function bytes(text) {
    const binary = atob(text);
    const out = new Uint8Array(binary.length);
    for (let i = 0; i < binary.length; i++) out[i] = binary.charCodeAt(i);
    return out.buffer;
  }

  function decodeSteps(steps) {
    if (!Array.isArray(steps)) return Array.from(new Int32Array(bytes(steps)));
    const [first, stride, count] = steps;
    const out = new Array(count);
    for (let i = 0; i < count; i++) out[i] = first + i * stride;
    return out;
  }

  function mergePoints(points) {
    for (const [key, byRun] of Object.entries(points || {})) {
      if (!state.points.has(key)) state.points.set(key, new Map());
      const lines = state.points.get(key);
      for (const [run, pair] of Object.entries(byRun)) {
        if (!lines.has(run)) lines.set(run, {steps: [], values: []});
        const line = lines.get(run);
        const steps = decodeSteps(pair.s);
        const values = new Float64Array(bytes(pair.v));
        for (let i = 0; i < steps.length; i++) {
          const last = line.steps.length ? line.steps[line.steps.length - 1] : -Infinity;
          if (steps[i] > last) {
            line.steps.push(steps[i]);
            line.values.push(values[i]);
            state.dirty = true;
          }
        }
      }
    }
  }

  // ---- status ----------------------------------------------------------------------------

  function showStatus(status) {
    const summary = document.getElementById("summary");
    if (summary) summary.textContent = status.summary;
    const eta = document.getElementById("eta");
    if (eta) {
      eta.textContent = status.eta_s === null ? "ETA unknown until a run has ended"
        : "ETA " + duration(status.eta_s) + (status.updates_per_s
          ? " at " + status.updates_per_s.toFixed(2) + " updates/s per worker" : "");
    }
    const table = document.getElementById("running");
    if (table) {
      const body = table.tBodies[0];
      body.replaceChildren();
      for (const run of status.running) {
        const row = make("tr");
        const first = make("td");
        first.appendChild(runLink(run.run_id));
        row.appendChild(first);
        row.appendChild(make("td", "", run.variant));
        row.appendChild(make("td", "n", run.seed));
        row.appendChild(make("td", "", run.worker || ""));
        const update = make("td", "n");
        const bar = make("progress");
        bar.max = Math.max(1, run.updates);
        bar.value = Math.min(run.step, bar.max);
        update.append(bar, " " + run.step + (run.updates ? "/" + run.updates : ""));
        row.appendChild(update);
        row.appendChild(make("td", "n", run.heartbeat_age_s === null ? ""
          : run.heartbeat_age_s.toFixed(0) + " s ago"));
        body.appendChild(row);
      }
      table.hidden = status.running.length === 0;
    }
    const stale = document.getElementById("stale");
    if (stale && PAGE.ended_at_load !== undefined) {
      let ended = 0;
      for (const [name, count] of Object.entries(status.counts)) {
        if (TERMINAL.has(name)) ended += count;
      }
      const more = ended - PAGE.ended_at_load;
      stale.hidden = more <= 0;
      stale.textContent = more + " run" + (more === 1 ? "" : "s") + " ended since this page was"
        + " loaded: reload it for the conclusion and the balance sheet as they stand now.";
    }
    if (PAGE.kind === "run") {
      const run = state.runs.get(PAGE.run);
      const badge = document.getElementById("run-status");
      if (run && badge) {
        badge.textContent = run.status;
        badge.className = "status " + run.status;
      }
      const progress = document.getElementById("run-progress");
      const mine = status.running.find((r) => r.run_id === PAGE.run);
      if (progress) {
        progress.textContent = mine ? mine.step + "/" + mine.updates + " (heartbeat "
          + (mine.heartbeat_age_s === null ? "?" : mine.heartbeat_age_s.toFixed(0)) + " s ago)"
          : (run && run.stop_step !== null ? String(run.stop_step) : "");
      }
    }
  }

  function duration(seconds) {
    const whole = Math.round(seconds);
    const hours = Math.floor(whole / 3600);
    const minutes = Math.floor((whole % 3600) / 60);
    const secs = whole % 60;
    if (hours) return hours + "h" + String(minutes).padStart(2, "0") + "m";
    return minutes ? minutes + "m" + String(secs).padStart(2, "0") + "s" : secs + "s";
  }

  // ---- charts ----------------------------------------------------------------------------

  function orderedRuns(lines) {
    const variants = PAGE.variants ? PAGE.variants.slice() : [];
    for (const run of state.runs.values()) {
      if (!variants.includes(run.variant)) variants.push(run.variant);
    }
    const rank = new Map(variants.map((v, i) => [v, i]));
    return [...lines.keys()]
      .map((id) => state.runs.get(id))
      .filter((run) => run && run.status !== "withdrawn")
      .sort((a, b) => (rank.get(a.variant) - rank.get(b.variant)) || (a.seed - b.seed)
        || (a.id < b.id ? -1 : 1));
  }

  function drawCharts() {
    state.dirty = false;
    const box = document.getElementById("curves");
    if (!box || typeof uPlot === "undefined") return;
    const keys = state.keys || [...state.points.keys()].sort();
    let drawn = 0;
    for (const key of keys) drawn += drawChart(box, key);
    for (const [key, chart] of state.charts) {
      if (!keys.includes(key)) {
        chart.plot && chart.plot.destroy();
        chart.box.remove();
        state.charts.delete(key);
      }
    }
    box.dataset.points = String(drawn);
  }

  function chartBox(box, key) {
    if (state.charts.has(key)) return state.charts.get(key);
    const section = make("div", "chart");
    section.dataset.key = key;
    section.appendChild(make("h3", "", key));
    const canvas = make("div", "plot");
    const legend = make("p", "legend");
    const markers = make("ul", "markers");
    const empty = make("p", "why");
    section.append(canvas, legend, markers, empty);
    box.appendChild(section);
    const chart = {box: section, canvas, legend, markers, empty, plot: null, signature: "",
                   range: [0, 1], drawMarks: [], zoom: null};
    state.charts.set(key, chart);
    return chart;
  }

  function drawChart(box, key) {
    const chart = chartBox(box, key);
    const lines = state.points.get(key) || new Map();
    const runs = orderedRuns(lines);
    if (!runs.length) {
      chart.empty.textContent = state.runs.size
        ? "No " + key + " point yet: it appears here as soon as a run logs one."
        : "Reading…";
      chart.empty.hidden = false;
      return 0;
    }
    chart.empty.hidden = true;
    // x: every step any run logged under this key
    const stepSet = new Set();
    for (const run of runs) for (const s of lines.get(run.id).steps) stepSet.add(s);
    const xs = Float64Array.from(stepSet).sort();
    const at = new Map();
    xs.forEach((s, i) => at.set(s, i));
    // the healthy range: original runs that did not end badly
    let low = Infinity, high = -Infinity, anyLow = Infinity, anyHigh = -Infinity;
    for (const run of runs) {
      const healthy = run.original && !ENDED_BADLY.has(run.status);
      for (const v of lines.get(run.id).values) {
        if (v === null || !isFinite(v)) continue;
        anyLow = Math.min(anyLow, v); anyHigh = Math.max(anyHigh, v);
        if (healthy) { low = Math.min(low, v); high = Math.max(high, v); }
      }
    }
    if (low === Infinity) { low = anyLow; high = anyHigh; }
    if (low === Infinity) { low = 0; high = 1; }
    const log = key.endsWith("loss") && low > 0 && high / low > 20;
    const margin = (high - low) * 0.05 || Math.abs(high) * 0.05 || 0.05;
    chart.range = log ? [low / 1.3, high * 1.3] : [low - margin, high + margin];

    const colour = new Map();
    const variants = [...new Set(runs.filter((r) => r.original).map((r) => r.variant))];
    variants.forEach((v, i) => colour.set(v, PALETTE[i % PALETTE.length]));
    const data = [Array.from(xs)];
    const series = [{label: "update"}];
    const marks = [];
    chart.markers.replaceChildren();
    let drawn = 0;
    for (const run of runs) {
      const line = lines.get(run.id);
      const column = new Array(xs.length).fill(null);
      const bad = ENDED_BADLY.has(run.status);
      let left = null;
      for (let i = 0; i < line.steps.length; i++) {
        let v = line.values[i];
        if (bad) {
          const outside = v === null || !isFinite(v) || v < low || v > high;
          if (outside && left === null) left = {x: line.steps[i], y: v !== null && v < low ? low : high,
                                                 up: !(v !== null && v < low)};
          v = v === null || !isFinite(v) ? high : Math.min(high, Math.max(low, v));
        }
        column[at.get(line.steps[i])] = isFinite(v) ? v : null;  // a gap, never a NaN path
        drawn++;
      }
      data.push(column);
      const tint = run.original ? colour.get(run.variant) : "#737373";
      series.push({label: run.id, stroke: run.original ? tint + "73" : tint, width: run.original ? 0.8 : 1,
                   dash: run.original ? undefined : [6, 4], spanGaps: true,
                   points: {show: line.steps.length === 1}});  // pruned at its first rung: a dot
      if (bad && line.steps.length) {
        const lastValue = line.values[line.values.length - 1];
        const lastY = lastValue === null || !isFinite(lastValue) ? high : Math.min(high, Math.max(low, lastValue));
        if (left) marks.push({x: left.x, y: left.y, kind: left.up ? "up" : "down", colour: tint});
        marks.push({x: line.steps[line.steps.length - 1], y: lastY, kind: "stop", colour: tint});
        const item = make("li", "marker " + run.status);
        item.dataset.run = run.id;
        item.textContent = (left ? (left.up ? "▲" : "▼") + " left the range at update " + left.x + ", " : "")
          + "✕ stopped at update " + line.steps[line.steps.length - 1] + ": " + run.status + " — "
          + run.variant + " seed " + run.seed + " (" + run.id + ")";
        chart.markers.appendChild(item);
      }
    }
    // per variant: mean and min-max band over the seeds that count
    const bands = [];
    chart.legend.replaceChildren();
    // a search counts its confirmation runs alone (PAGE.confirm_seeds), as its tables do
    const confirming = (r) => !PAGE.confirm_seeds || PAGE.confirm_seeds.includes(r.seed);
    for (const variant of variants) {
      const counted = runs.filter((r) => r.variant === variant && r.original && COUNTED.has(r.status)
        && confirming(r));
      const tint = colour.get(variant);
      const isControl = runs.some((r) => r.variant === variant && r.is_control);
      // a search's variant with confirmation runs planned (or its control): they will count
      const pending = isControl || runs.some((r) => r.variant === variant && confirming(r));
      const swatch = make("span", "swatch");
      swatch.style.background = tint;
      const entry = make("span", "entry");
      entry.append(swatch, variant + (isControl ? " (control)" : "") + ": "
        + (counted.length ? "mean of " + counted.length + (PAGE.confirm_seeds ? " confirmation runs" : "")
          : PAGE.confirm_seeds ? (pending ? "search runs, confirmation pending" : "search runs only")
          : "no seed that counts (none completed, stopped or running)"));
      chart.legend.appendChild(entry);
      if (!counted.length) continue;
      const lo = new Array(xs.length).fill(null), hi = new Array(xs.length).fill(null);
      const mean = new Array(xs.length).fill(null);
      const sum = new Float64Array(xs.length), n = new Uint32Array(xs.length);
      for (const run of counted) {
        const line = lines.get(run.id);
        for (let i = 0; i < line.steps.length; i++) {
          const v = line.values[i];
          if (v === null || !isFinite(v)) continue;
          const j = at.get(line.steps[i]);
          sum[j] += v; n[j]++;
          lo[j] = lo[j] === null ? v : Math.min(lo[j], v);
          hi[j] = hi[j] === null ? v : Math.max(hi[j], v);
        }
      }
      for (let j = 0; j < xs.length; j++) if (n[j]) mean[j] = sum[j] / n[j];
      const base = series.length;
      data.push(hi, lo, mean);
      series.push({label: variant + " max", stroke: "transparent", width: 0, spanGaps: true, points: {show: false}},
                  {label: variant + " min", stroke: "transparent", width: 0, spanGaps: true, points: {show: false}},
                  {label: variant + " mean", stroke: tint, width: 2.2, spanGaps: true, points: {show: false}});
      bands.push({series: [base, base + 1], fill: tint + "26"});
    }
    const relaunches = runs.filter((r) => !r.original).length;
    if (relaunches) chart.legend.appendChild(make("span", "entry relaunch", "- - relaunches (" + relaunches + ", never pooled)"));
    chart.drawMarks = marks;
    const signature = series.map((s) => s.label).join("|") + (log ? "|log" : "");
    if (chart.plot && chart.signature === signature) {
      chart.plot.setData(data, chart.zoom === null);
      if (chart.zoom) chart.plot.setScale("x", chart.zoom);
      return drawn;
    }
    chart.plot && chart.plot.destroy();
    chart.signature = signature;
    chart.plot = new uPlot({
      width: Math.max(480, chart.canvas.clientWidth || 900), height: 320,
      scales: {x: {time: false}, y: {distr: log ? 3 : 1, range: () => chart.range}},
      axes: [{label: "update"}, {label: key}],
      legend: {show: false},
      cursor: {drag: {x: true, y: false}, points: {show: false}},
      series, bands,
      hooks: {
        draw: [(u) => drawMarks(u, chart.drawMarks)],
        setSelect: [(u) => {
          if (u.select.width > 0) {
            chart.zoom = {min: u.posToVal(u.select.left, "x"), max: u.posToVal(u.select.left + u.select.width, "x")};
          }
        }],
      },
    }, data, chart.canvas);
    chart.canvas.ondblclick = () => { chart.zoom = null; };
    return drawn;
  }

  function drawMarks(u, marks) {
    const ctx = u.ctx;
    const size = 6 * devicePixelRatio;
    ctx.save();
    for (const mark of marks) {
      const x = u.valToPos(mark.x, "x", true);
      const y = u.valToPos(mark.y, "y", true);
      ctx.strokeStyle = mark.kind === "stop" ? mark.colour : "#000";
      ctx.fillStyle = mark.colour;
      ctx.lineWidth = 2 * devicePixelRatio;
      ctx.beginPath();
      if (mark.kind === "stop") {
        ctx.moveTo(x - size, y - size); ctx.lineTo(x + size, y + size);
        ctx.moveTo(x + size, y - size); ctx.lineTo(x - size, y + size);
        ctx.stroke();
      } else {
        const dir = mark.kind === "up" ? -1 : 1;
        ctx.moveTo(x, y + dir * size); ctx.lineTo(x - size, y - dir * size); ctx.lineTo(x + size, y - dir * size);
        ctx.closePath(); ctx.fill(); ctx.lineWidth = devicePixelRatio; ctx.stroke();
      }
    }
    ctx.restore();
  }

  // ---- the campaigns page ------------------------------------------------------------------

  async function pollCampaigns() {
    try {
      const response = await fetch("/api/campaigns", {credentials: "same-origin", cache: "no-store"});
      const rows = await response.json();
      const table = document.getElementById("campaigns");
      if (table && response.ok) {
        const body = table.tBodies[0];
        body.replaceChildren();
        for (const c of rows) {
          const row = make("tr");
          row.dataset.campaign = c.name;
          const name = make("td");
          const link = make("a", "", c.name);
          link.href = "/c/" + encodeURIComponent(c.name);
          name.appendChild(link);
          const counts = make("td", "counts");
          for (const [status, n] of Object.entries(c.counts)) {
            counts.append(make("span", "status " + status, status + " " + n), " ");
          }
          row.append(name, make("td", "", c.question), make("td", "", c.task),
                     make("td", "n runs", c.runs), counts,
                     make("td", "n last", c.last_activity.replace("T", " ").slice(0, 19) + " UTC"));
          body.appendChild(row);
        }
      }
    } catch (error) {
      document.getElementById("connection").textContent = "· cannot reach the server: retrying";
    }
    setTimeout(pollCampaigns, 5000);
  }

  function start() {
    if (PAGE.kind === "campaigns") { setTimeout(pollCampaigns, 5000); return; }
    if (PAGE.kind !== "campaign" && PAGE.kind !== "run") return;
    const choice = document.getElementById("key-choice");
    if (choice) {
      choice.addEventListener("change", (event) => {
        const key = event.target.value;
        if (event.target.checked) {
          state.keys.push(key);
          state.pendingKeys.push(key);
        } else {
          state.keys = state.keys.filter((k) => k !== key);
          state.points.delete(key);
        }
        state.dirty = true;
        drawCharts();
      });
    }
    if (PAGE.initial) {  // the campaign page arrives with its first poll done
      apply(PAGE.initial);
      delete PAGE.initial;
      setTimeout(poll, POLL_MS);
    } else {
      poll();
    }
  }

  document.addEventListener("DOMContentLoaded", start);
})();
