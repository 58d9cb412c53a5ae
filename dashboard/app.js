// queen-broker dashboard. Plain JavaScript, no dependencies: every figure comes from the
// broker's own HTTP API with the caller's token, so the page shows nothing an API user could
// not see. The token lives in sessionStorage (this tab only, gone when it closes). Actions are
// offered only when GET /api/v1/access says the token's roles allow them.
"use strict";

const TOKEN_KEY = "queen.token";
const PARTITIONS_PER_PAGE = 50;
// Rows per page of the overview's, the groups page's and the Kafka page's lists: each is read
// a page at a time from the broker (limit/offset/search), never whole.
const LIST_PAGE = 25;
const DLQ_PER_PAGE = 50;
const RECENT_MESSAGES = 25;
const PREVIEW_CHARS = 160;
const PAYLOAD_CHARS = 20000;
const QUEUE_MODE = "__QUEUE_MODE__";

const params = new URLSearchParams(location.search);
// Seconds between refreshes of the overview; `/?refresh=N` changes it, 0 stops it.
const REFRESH_SECS = Math.max(0, Number(params.get("refresh") ?? 5) || 0);

let access = null; // {authEnabled, sub, capabilities}
let refreshTimer = null;
let lastSample = null; // {at, queues: Map(name -> {total, done})} for the rates

class AuthNeeded extends Error {}

// ---------------------------------------------------------------- small DOM helpers

function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else if (k === "class") el.className = v;
    else el.setAttribute(k, v === true ? "" : String(v));
  }
  for (const c of children.flat(Infinity)) {
    if (c === null || c === undefined || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}

function table(caption, headers, rows, empty) {
  if (!rows.length) return h("p", { class: "empty" }, empty);
  const head = h("tr", {}, headers.map((x) =>
    h("th", { scope: "col", class: NUMERIC.has(x) ? "num" : null }, x)));
  return h("div", { class: "table-wrap" },
    h("table", {}, h("caption", { class: "note" }, caption),
      h("thead", {}, head), h("tbody", {}, rows)));
}

// Column headers whose cells are numbers (right-aligned).
const NUMERIC = new Set(["Partitions", "Total", "Pending", "Processing", "Completed", "Dead", "In/s", "Out/s",
  "Members", "Backlog (messages)", "Oldest unconsumed", "Partitions with lag", "Retries",
  "Keys", "Bytes", "With expiry", "Expiring within 1 min", "Slot", "Token", "Late", "Refused",
  "State keys", "State bytes", "Largest partition", "Cycles", "Depth", "Pushed",
  "Dropped (TTL)", "Dropped (policy)", "Dropped (retries)", "Records", "Partition", "Committed", "End", "Lag"]);

const num = (v) => h("td", { class: "num" }, fmtNum(v));

function fmtNum(v) {
  if (v === null || v === undefined || Number.isNaN(v)) return "—";
  if (typeof v !== "number") return String(v);
  return Number.isInteger(v) ? v.toLocaleString("en-US") : v.toLocaleString("en-US", { maximumFractionDigits: 1 });
}

function fmtDuration(secs) {
  if (secs === null || secs === undefined) return "—";
  secs = Math.max(0, Math.round(secs));
  const d = Math.floor(secs / 86400), hh = Math.floor((secs % 86400) / 3600);
  const m = Math.floor((secs % 3600) / 60), s = secs % 60;
  if (d) return `${d}d ${hh}h`;
  if (hh) return `${hh}h ${m}m`;
  if (m) return `${m}m ${s}s`;
  return `${s}s`;
}

function fmtBytes(b) {
  if (!b) return "0 B";
  const units = ["B", "KB", "MB", "GB", "TB"];
  let i = 0;
  while (b >= 1024 && i < units.length - 1) { b /= 1024; i++; }
  return `${b.toFixed(i ? 1 : 0)} ${units[i]}`;
}

function fmtTime(iso) {
  if (!iso) return "—";
  const t = new Date(iso);
  return Number.isNaN(t.getTime()) ? iso : t.toISOString().replace("T", " ").replace("Z", " UTC");
}

function groupName(g) {
  return g === QUEUE_MODE ? "(queue mode)" : g;
}

function preview(value) {
  const text = JSON.stringify(value);
  if (text === undefined) return "";
  return text.length > PREVIEW_CHARS ? `${text.slice(0, PREVIEW_CHARS)}… (${text.length} chars)` : text;
}

function can(capability) {
  return !!access && access.capabilities.includes(capability);
}

function setStatus(text) {
  document.getElementById("status").textContent = text;
}

function alertBox(text) {
  return h("p", { class: "alert", role: "alert" }, text);
}

function qs(obj) {
  const p = new URLSearchParams();
  for (const [k, v] of Object.entries(obj)) if (v !== undefined && v !== null && v !== "") p.set(k, v);
  const s = p.toString();
  return s ? `?${s}` : "";
}

const enc = encodeURIComponent;

// What was typed into a search box and not yet submitted, kept across the overview's refreshes.
const drafts = new Map();

/** The current page's hash with `updates` applied to its query (empty values removed). */
function hashWith(updates) {
  const { parts, query } = parseHash();
  for (const [k, v] of Object.entries(updates)) {
    if (v === undefined || v === null || v === "") query.delete(k); else query.set(k, v);
  }
  const s = query.toString();
  return `#/${parts.map(enc).join("/")}${s ? `?${s}` : ""}`;
}

/** A search box over a list: submitting it goes to the list's first page for that text. */
function searchBox(id, label, value, pageKey, searchKey) {
  const input = h("input", {
    id, name: id, type: "search", value: drafts.get(id) ?? value, autocomplete: "off",
    oninput: (ev) => drafts.set(id, ev.target.value),
  });
  return h("form", {
    class: "inline", role: "search", "aria-label": label,
    onsubmit: (ev) => {
      ev.preventDefault();
      drafts.delete(id);
      location.hash = hashWith({ [searchKey]: input.value.trim(), [pageKey]: "" });
    },
  }, h("label", { for: id }, label, input), h("button", { type: "submit", id: `${id}-go` }, "Search"));
}

/** Previous/next links of a paged list; `pages` is null when only "is there more" is known. */
function pager(id, label, page, pages, hasNext, pageKey, what) {
  const link = (n, text, rel) => {
    const ok = n >= 1 && n !== page && (rel === "prev" || hasNext);
    return ok ? h("a", { href: hashWith({ [pageKey]: n > 1 ? n : "" }), rel, id: `${id}-${rel}` }, text)
      : h("span", { class: "note" }, text);
  };
  return h("nav", { class: "pager", id, "aria-label": label },
    link(page - 1, "← Previous", "prev"),
    h("span", {}, pages === null ? `page ${page}` : `page ${page} of ${pages}`, what ? ` (${what})` : ""),
    link(page + 1, "Next →", "next"));
}

const pageOf = (query, key) => Math.max(1, Math.floor(Number(query.get(key))) || 1);

// ---------------------------------------------------------------- the API

async function api(path, { method = "GET", body, allow = [] } = {}) {
  const headers = { Accept: "application/json" };
  const token = sessionStorage.getItem(TOKEN_KEY);
  if (token) headers.Authorization = `Bearer ${token}`;
  if (body !== undefined) headers["Content-Type"] = "application/json";
  let res;
  try {
    res = await fetch(path, { method, headers, body: body === undefined ? undefined : JSON.stringify(body) });
  } catch (e) {
    throw new Error(`the broker does not answer (${e.message})`);
  }
  if (res.status === 401) throw new AuthNeeded("this page needs a token");
  const text = await res.text();
  let data = null;
  try { data = text ? JSON.parse(text) : null; } catch { data = null; }
  if (!res.ok && !allow.includes(res.status)) {
    const why = (data && (data.error || data.message)) || text || res.statusText;
    const err = new Error(`${method} ${path}: ${res.status} ${why}`);
    err.status = res.status;
    throw err;
  }
  return data;
}

// ---------------------------------------------------------------- sign-in

function renderSession() {
  const box = document.getElementById("session");
  box.replaceChildren();
  if (!access || !access.authEnabled) return;
  const who = access.sub ? `signed in as ${access.sub}` : "signed in";
  box.append(
    h("span", {}, `${who} (${access.capabilities.join(", ") || "no rights"})`),
    h("button", { type: "button", onclick: signOut }, "Sign out"),
  );
}

function signOut() {
  sessionStorage.removeItem(TOKEN_KEY);
  access = null;
  renderSession();
  renderLogin("Signed out.");
}

function renderLogin(message) {
  stopRefresh();
  const main = document.getElementById("main");
  const input = h("input", { id: "token", name: "token", type: "password", autocomplete: "off", required: true, size: 60 });
  const form = h("form", {
    class: "inline", id: "login",
    onsubmit: async (ev) => {
      ev.preventDefault();
      sessionStorage.setItem(TOKEN_KEY, input.value.trim());
      await boot();
    },
  },
  h("label", { for: "token" }, "Bearer token", input),
  h("button", { type: "submit", class: "primary" }, "Sign in"));
  main.replaceChildren(
    h("h1", {}, "Sign in"),
    message ? h("p", { class: message.startsWith("Signed out") ? "note" : "alert", role: "alert" }, message) : null,
    h("p", {}, "Authentication is on. Paste a JWT; it is kept for this tab only and sent to this broker alone."),
    form,
  );
  input.focus();
}

async function boot() {
  try {
    access = await api("/api/v1/access");
  } catch (e) {
    if (e instanceof AuthNeeded) {
      const had = sessionStorage.getItem(TOKEN_KEY);
      sessionStorage.removeItem(TOKEN_KEY);
      renderSession();
      return renderLogin(had ? "The broker refused this token (invalid or expired)." : null);
    }
    if (e.status === 403) {
      sessionStorage.removeItem(TOKEN_KEY);
      return renderLogin("This token may not read the broker's state (it needs a role with read access).");
    }
    document.getElementById("main").replaceChildren(h("h1", {}, "queen-broker"), alertBox(e.message));
    return;
  }
  renderSession();
  await route();
}

// ---------------------------------------------------------------- routing

function stopRefresh() {
  if (refreshTimer) clearTimeout(refreshTimer);
  refreshTimer = null;
}

function parseHash() {
  const raw = location.hash.replace(/^#\/?/, "");
  const [path, query] = raw.split("?");
  // A malformed escape (`#/queues/%E0`) is kept as typed rather than leaving the page on
  // "Loading…" with an uncaught URIError.
  const decode = (part) => { try { return decodeURIComponent(part); } catch { return part; } };
  const parts = path.split("/").filter(Boolean).map(decode);
  return { parts, query: new URLSearchParams(query || "") };
}

// Each render's number: a slow answer for a page already left is dropped.
let renders = 0;

async function route() {
  stopRefresh();
  const mine = ++renders;
  if (!access) return boot();
  const { parts, query } = parseHash();
  const section = parts[0] || "overview";
  for (const a of document.querySelectorAll("nav a")) {
    const current = a.dataset.nav === section || (section === "queues" && a.dataset.nav === "overview")
      || (section === "messages" && a.dataset.nav === "overview");
    if (current) a.setAttribute("aria-current", "page"); else a.removeAttribute("aria-current");
  }
  const views = {
    overview: () => overview(query),
    queues: () => queuePage(parts[1], query),
    messages: () => messagePage(parts[1], parts[2]),
    dlq: () => dlqPage(query),
    groups: () => groupsPage(query),
    kafka: () => kafkaPage(query),
    maintenance: () => maintenancePage(),
    state: () => statePage(),
  };
  const view = views[section];
  const main = document.getElementById("main");
  if (!view) {
    main.replaceChildren(h("h1", {}, "Not found"), h("p", {}, "No such page. ", h("a", { href: "#/" }, "Back to the overview")));
    return;
  }
  try {
    const content = await view();
    if (mine !== renders) return;
    if (content) {
      const focused = document.activeElement && document.activeElement.id;
      main.replaceChildren(...content.filter((c) => c !== null && c !== undefined));
      if (focused) document.getElementById(focused)?.focus();
    }
    setStatus(`Updated ${new Date().toLocaleTimeString()}`);
  } catch (e) {
    if (mine !== renders) return;
    if (e instanceof AuthNeeded) {
      sessionStorage.removeItem(TOKEN_KEY);
      access = null;
      renderSession();
      return renderLogin("The token is no longer accepted; sign in again.");
    }
    main.replaceChildren(h("h1", {}, "Error"), alertBox(e.message));
  }
  if (section === "overview" && REFRESH_SECS > 0) {
    refreshTimer = setTimeout(route, REFRESH_SECS * 1000);
  }
}

// ---------------------------------------------------------------- charts (SVG drawn here)

const SVG_NS = "http://www.w3.org/2000/svg";
// Line colours: distinct, and each at least 4.5:1 against the white chart background.
const COLOURS = ["#0b4f9c", "#a10d0d", "#0a5c2b", "#7a4a00", "#6a1b9a", "#00606b", "#444444", "#8a2a5a"];
const CHART_W = 560, CHART_H = 170, PAD_L = 56, PAD_R = 10, PAD_T = 10, PAD_B = 24;

function svg(tag, attrs, ...children) {
  const el = document.createElementNS(SVG_NS, tag);
  for (const [k, v] of Object.entries(attrs || {})) if (v !== null && v !== undefined) el.setAttribute(k, String(v));
  for (const c of children.flat(Infinity)) if (c !== null && c !== undefined) el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  return el;
}

/** A round upper bound for the y axis: 1, 2 or 5 times a power of ten, at least `max`. */
function niceMax(max) {
  if (!(max > 0)) return 1;
  const p = 10 ** Math.floor(Math.log10(max));
  for (const m of [1, 2, 5, 10]) if (m * p >= max) return m * p;
  return 10 * p;
}

function fmtClock(ms) {
  return new Date(ms).toISOString().slice(11, 16);
}

/**
 * A line chart: `at` (Unix ms) against each series' values (null breaks the line). `fmt`
 * formats a value. Without two points with data, the figure says why instead (`empty`).
 */
function lineChart(id, title, at, series, fmt, empty, floor = 0) {
  const withData = series.filter((s) => s.values.some((v) => v !== null && v !== undefined));
  const points = withData.reduce((n, s) => n + s.values.filter((v) => v !== null && v !== undefined).length, 0);
  const fig = h("figure", { class: "chart", id, "data-points": points });
  fig.append(h("figcaption", {}, title));
  if (at.length < 2 || !withData.length) {
    fig.append(h("p", { class: "empty chart-empty" }, empty || "No data yet."));
    return fig;
  }
  const t0 = at[0], t1 = at[at.length - 1];
  const span = Math.max(1, t1 - t0);
  // `floor`: the least top of the y axis (a spool of 0 bytes reads 0 B … 1 KB, not 0.5 B).
  const max = niceMax(Math.max(floor, ...withData.flatMap((s) => s.values.filter((v) => v !== null && v !== undefined))));
  const x = (t) => PAD_L + ((t - t0) / span) * (CHART_W - PAD_L - PAD_R);
  const y = (v) => PAD_T + (1 - v / max) * (CHART_H - PAD_T - PAD_B);
  const grid = [0, 0.5, 1].map((f) => [
    svg("line", { x1: PAD_L, x2: CHART_W - PAD_R, y1: y(max * f), y2: y(max * f), stroke: "#c8ccd2", "stroke-width": 1 }),
    svg("text", { x: PAD_L - 6, y: y(max * f) + 4, "text-anchor": "end", "font-size": 11, fill: "#444" }, fmt(max * f)),
  ]);
  const lines = withData.map((s, i) => {
    // One path; a null value lifts the pen.
    let d = "", pen = false;
    s.values.forEach((v, k) => {
      if (v === null || v === undefined) { pen = false; return; }
      d += `${pen ? "L" : "M"}${x(at[k]).toFixed(1)},${y(v).toFixed(1)}`;
      pen = true;
    });
    const lone = s.values.filter((v) => v !== null && v !== undefined).length === 1;
    const colour = COLOURS[i % COLOURS.length];
    if (lone) {
      const k = s.values.findIndex((v) => v !== null && v !== undefined);
      return svg("circle", { cx: x(at[k]), cy: y(s.values[k]), r: 2.5, fill: colour, class: "series" });
    }
    return svg("path", { d, fill: "none", stroke: colour, "stroke-width": 1.8, "stroke-linejoin": "round", class: "series" });
  });
  const axis = [
    svg("line", { x1: PAD_L, x2: CHART_W - PAD_R, y1: y(0), y2: y(0), stroke: "#444", "stroke-width": 1 }),
    svg("text", { x: PAD_L, y: CHART_H - 6, "font-size": 11, fill: "#444" }, fmtClock(t0)),
    svg("text", { x: CHART_W - PAD_R, y: CHART_H - 6, "font-size": 11, fill: "#444", "text-anchor": "end" }, `${fmtClock(t1)} UTC`),
  ];
  const latest = (s) => { for (let k = s.values.length - 1; k >= 0; k--) if (s.values[k] !== null && s.values[k] !== undefined) return s.values[k]; return null; };
  const summary = withData.map((s) => `${s.name}: ${fmt(latest(s))}`).join("; ");
  fig.append(svg("svg", {
    viewBox: `0 0 ${CHART_W} ${CHART_H}`, role: "img", "aria-label": `${title}, ${fmtClock(t0)}–${fmtClock(t1)} UTC; latest ${summary}`,
  }, svg("title", {}, title), grid, axis, lines));
  fig.append(h("ul", { class: "legend" }, withData.map((s, i) =>
    h("li", {}, h("span", { class: `swatch swatch-${i % COLOURS.length}`, "aria-hidden": "true" }), `${s.name} `, h("strong", {}, fmt(latest(s)))))));
  return fig;
}

const fmtRate = (v) => v === null ? "—" : `${fmtNum(v >= 100 ? Math.round(v) : Math.round(v * 10) / 10)}/s`;
const fmtMs = (v) => v === null ? "—" : `${fmtNum(v * 1000 >= 10 ? Math.round(v * 1000) : Math.round(v * 10000) / 10)} ms`;
const fmtCount = (v) => v === null ? "—" : fmtNum(Math.round(v));
const fmtAge = (v) => v === null ? "—" : fmtDuration(v);

/** Why a history is not there, or null when it is. */
function historyGap(hist) {
  if (!hist) return "History unavailable.";
  if (hist.error) return `History unavailable: ${hist.error}`;
  if (!hist.enabled) return "History is off on this broker (QUEEN_HISTORY_INTERVAL_MS=0).";
  if ((hist.at || []).length < 2) return `Collecting: a sample every ${fmtNum(hist.intervalSeconds)} s; the charts start with the second.`;
  return null;
}

function pairLabel(p, withQueue) {
  return withQueue ? `${p.queue} · ${groupName(p.consumerGroup)}` : groupName(p.consumerGroup);
}

/** The backlog and age charts of the (queue, group) pairs in `hist` (at most 8 lines each). */
function backlogCharts(hist, withQueue, idPrefix) {
  const gap = historyGap(hist);
  const pairs = (hist && hist.queues || []).slice(0, COLOURS.length);
  const why = gap || (hist.queuesError ? `Backlog not read: ${hist.queuesError}` : "Nothing unconsumed in the last hour.");
  return [
    lineChart(`${idPrefix}-backlog`, "Backlog (messages)", hist?.at || [], pairs.map((p) => ({ name: pairLabel(p, withQueue), values: p.backlog })), fmtCount, why),
    lineChart(`${idPrefix}-age`, "Oldest unconsumed message", hist?.at || [], pairs.map((p) => ({ name: pairLabel(p, withQueue), values: p.oldestSeconds })), fmtAge, why),
  ];
}

function overviewCharts(hist) {
  const gap = historyGap(hist);
  const at = hist?.at || [];
  const unrecorded = hist && !hist.recording ? "Not recorded: QUEEN_METRICS=false on this broker." : null;
  const rates = lineChart("chart-rates", "Messages per second", at, [
    { name: "pushed", values: hist?.pushedPerSecond || [] },
    { name: "popped", values: hist?.poppedPerSecond || [] },
    { name: "acked", values: hist?.ackedPerSecond || [] },
  ], fmtRate, gap || unrecorded || "No traffic in the last hour.");
  const latency = lineChart("chart-commit", "Commit latency", at, [
    { name: "p50", values: hist?.commitP50Seconds || [] },
    { name: "p99", values: hist?.commitP99Seconds || [] },
  ], fmtMs, gap || unrecorded || "No commits in the last hour.", 0.01);
  const spool = lineChart("chart-spool", "Spool", at, [{ name: "bytes", values: hist?.spoolBytes || [] }], fmtBytes, gap, 1000);
  return h("div", { class: "charts" }, rates, ...backlogCharts(hist, true, "chart"), latency, spool);
}

// ---------------------------------------------------------------- overview

function maintenanceToggles(flags) {
  if (!can("admin")) return null;
  const toggle = (id, label, on, path) => h("button", {
    type: "button", id, class: "toggle", "aria-pressed": on ? "true" : "false",
    onclick: async (ev) => {
      ev.currentTarget.disabled = true;
      try {
        await api(path, { method: "POST", body: { enabled: !on } });
        setStatus(`${label} turned ${on ? "off" : "on"}`);
      } catch (e) {
        setStatus(e.message);
      }
      await route();
      document.getElementById(id)?.focus();
    },
  }, `${label}: ${on ? "on" : "off"}`);
  return h("div", { class: "actions", role: "group", "aria-label": "Maintenance toggles" },
    toggle("toggle-maintenance", "Push maintenance", flags.maintenance, "/api/v1/system/maintenance"),
    toggle("toggle-pop-maintenance", "Pop maintenance", flags.pop, "/api/v1/system/maintenance/pop"));
}

/** Where a lag figure comes from (`X-Lag-Measured-At`, the overview's `lag.measuredAt`): nothing
 * when measured for this answer, else when the broker's background lag pass ran
 * (docs/operations.md, "Lag at scale"). */
function lagMeasured(at) {
  if (!at || at === "request") return "";
  if (at === "pending") return " · first lag pass running";
  const t = new Date(at);
  return Number.isNaN(t.getTime()) ? "" : ` · as of ${t.toLocaleTimeString()}`;
}

/** Backlog per (group, queue) from the lagging route: {`${group}\u0000${queue}`: messages}. */
function backlogs(lagging) {
  const out = new Map();
  for (const r of lagging || []) {
    const key = `${r.consumer_group}\u0000${r.queue_name}`;
    out.set(key, (out.get(key) || 0) + (r.offset_lag || 0));
  }
  return out;
}

function queueRates(queues) {
  const now = Date.now();
  const sample = new Map(queues.map((q) => {
    const m = q.messages || {};
    return [q.name, { total: m.total || 0, done: (m.total || 0) - (m.pending || 0) - (m.processing || 0) }];
  }));
  const prev = lastSample;
  lastSample = { at: now, queues: sample };
  const rates = new Map();
  if (!prev || now - prev.at < 500) return rates;
  const dt = (now - prev.at) / 1000;
  for (const [name, s] of sample) {
    const p = prev.queues.get(name);
    if (!p) continue;
    rates.set(name, { in: Math.max(0, s.total - p.total) / dt, out: Math.max(0, s.done - p.done) / dt });
  }
  return rates;
}

/** The database tile's second line: connections in use per pool, or why they are not known. */
function poolText(metrics) {
  if (metrics.error) return `pools unknown: ${metrics.error}`;
  const pools = metrics.database?.pools;
  if (!pools) {
    const size = metrics.database?.poolSize, idle = metrics.database?.idleConnections;
    return size === undefined ? "pools unknown: /metrics has no database figures" : `pool ${size} (idle ${idle})`;
  }
  const order = ["shared", "lease", "claims", "acks"];
  const names = [...order.filter((n) => pools[n]), ...Object.keys(pools).filter((n) => !order.includes(n))];
  return "in use: " + names.map((n) => `${n} ${pools[n].size - pools[n].idle}/${pools[n].size}`).join(" · ");
}

/** One page of the (group, queue) pairs: the rows, and whether a next page exists. */
async function groupPage(search, page) {
  const rows = await api(`/api/v1/consumer-groups${qs({ limit: LIST_PAGE + 1, offset: (page - 1) * LIST_PAGE, search })}`);
  // A broker before paging answers every pair: cut here, and read the backlog from /lagging.
  const paged = rows.slice((rows.length > LIST_PAGE + 1 ? (page - 1) * LIST_PAGE : 0));
  const groups = paged.slice(0, LIST_PAGE);
  if (groups.some((g) => g.backlog === undefined)) {
    const lag = backlogs(await api("/api/v1/consumer-groups/lagging?minLagSeconds=0"));
    for (const g of groups) g.backlog = lag.get(`${g.name}\u0000${g.queueName}`) || 0;
  }
  return { groups, hasNext: paged.length > LIST_PAGE };
}

async function overview(query) {
  const qSearch = query.get("qs") || "", qPage = pageOf(query, "qp");
  const gSearch = query.get("gs") || "", gPage = pageOf(query, "gp");
  const [health, metrics, list, summary, groupList, maint, hist] = await Promise.all([
    api("/health", { allow: [503] }).catch((e) => ({ status: "unreachable", database: e.message })),
    api("/metrics").catch((e) => { if (e instanceof AuthNeeded) throw e; return { error: e.message }; }),
    api(`/api/v1/resources/queues${qs({ limit: LIST_PAGE, offset: (qPage - 1) * LIST_PAGE, search: qSearch })}`),
    api("/api/v1/resources/overview"),
    groupPage(gSearch, gPage),
    can("admin") ? api("/api/v1/system/maintenance") : Promise.resolve(null),
    api("/api/v1/system/history").catch((e) => { if (e instanceof AuthNeeded) throw e; return { error: e.message }; }),
  ]);
  const { groups, hasNext: groupsNext } = groupList;
  const queueTotal = list.total ?? list.queues.length;
  const queuePages = Math.max(1, Math.ceil(queueTotal / LIST_PAGE));
  const spool = metrics.spool || {};
  const flags = {
    maintenance: maint ? maint.maintenanceMode : !!spool.maintenanceMode,
    pop: maint ? maint.popMaintenanceMode : !!spool.popMaintenanceMode,
  };
  const healthy = health.status === "healthy";
  const rates = queueRates(list.queues);
  const msgs = summary.messages || {};
  const partial = summary.messagesExact === false;

  const card = (id, label, value, extra) =>
    h("div", { class: "card", id }, h("dt", {}, label), h("dd", {}, value, extra ? h("br") : null, extra ? h("small", {}, extra) : null));
  const cards = h("dl", { class: "cards" },
    card("card-database", "Database", h("span", { class: healthy ? "state-ok" : "state-bad" }, healthy ? "healthy" : String(health.status || "unhealthy")),
      poolText(metrics)),
    metrics.error
      ? card("card-spool", "Spool", h("span", { id: "spool-records" }, "—"), `unknown: ${metrics.error}`)
      : card("card-spool", "Spool", h("span", { id: "spool-records" }, fmtNum(spool.records ?? 0)),
      `${fmtBytes(spool.bytes)} · ${spool.dbUnreachableSeconds ? `database away ${fmtDuration(spool.dbUnreachableSeconds)}` : "replayed " + fmtNum(spool.replayed ?? 0)}` +
      (spool.oldestSeconds ? ` · oldest ${fmtDuration(spool.oldestSeconds)}` : "")),
    !maint && metrics.error
      ? card("card-maintenance", "Maintenance", h("span", { id: "maintenance-state" }, "—"), `unknown: ${metrics.error}`)
      : card("card-maintenance", "Maintenance",
      h("span", { id: "maintenance-state", class: flags.maintenance || flags.pop ? "state-on" : "state-ok" },
        flags.maintenance && flags.pop ? "push + pop" : flags.maintenance ? "push" : flags.pop ? "pop" : "off"),
      flags.maintenance ? "pushes are spooled, replay paused" : flags.pop ? "pops answer empty" : "normal operation"),
    card("card-messages", "Messages", `${partial ? "≥ " : ""}${fmtNum(msgs.total ?? 0)}`,
      `${fmtNum(msgs.pending ?? 0)} pending · ${fmtNum(msgs.processing ?? 0)} processing · ${fmtNum(msgs.deadLetter ?? 0)} dead` +
      (partial ? ` · over the first ${fmtNum(summary.messagesPartitions)} partitions holding messages` : "")),
    card("card-rate", "Ingest", `${fmtNum(summary.throughput?.ingestedPerSecond ?? 0)}/s`, "last minute"),
    card("card-lag", "Max lag", fmtDuration(summary.lag?.time?.max ?? 0), `${fmtNum(summary.lag?.offset?.max ?? 0)} message${summary.lag?.offset?.max === 1 ? "" : "s"} behind` +
      lagMeasured(summary.lag?.measuredAt)),
    card("card-queues", "Queues", fmtNum(summary.queues ?? 0),
      `${summary.partitionsExact === false ? "about " : ""}${fmtNum(summary.partitions ?? 0)} partitions`),
    card("card-broker", "Broker", health.version ? `v${health.version}` : "—",
      [health.version ? null : `version unknown (health: ${health.database || health.status})`,
        metrics.error ? "uptime unknown" : `up ${fmtDuration(metrics.uptime)}`].filter(Boolean).join(" · ")),
  );

  const queueRows = list.queues.map((q) => {
    const r = rates.get(q.name);
    return h("tr", { "data-queue": q.name },
      h("th", { scope: "row" }, h("a", { href: `#/queues/${enc(q.name)}` }, q.name)),
      h("td", {}, q.namespace || ""),
      num(q.partitions), num(q.messages.total), num(q.messages.pending), num(q.messages.processing),
      num(r ? r.in : null), num(r ? r.out : null));
  });
  const groupRows = groups.map((g) => {
    const backlog = g.backlog;
    return h("tr", { "data-group": g.name, "data-queue": g.queueName },
      h("th", { scope: "row" }, groupName(g.name)),
      h("td", {}, h("a", { href: `#/queues/${enc(g.queueName)}` }, g.queueName)),
      num(g.members), h("td", { class: "num", "data-backlog": backlog }, fmtNum(backlog)),
      h("td", { class: "num" }, fmtDuration(g.maxTimeLag)), h("td", {}, g.state));
  });
  return [
    h("h1", {}, "Overview"),
    cards,
    maintenanceToggles(flags),
    h("h2", {}, "Last hour"),
    overviewCharts(hist),
    h("h2", {}, "Queues"),
    searchBox("queue-search", "Find queues", qSearch, "qp", "qs"),
    table("Queues with their backlog; rates are measured by this page between refreshes.",
      ["Queue", "Namespace", "Partitions", "Total", "Pending", "Processing", "In/s", "Out/s"],
      queueRows, qSearch ? `No queue name contains “${qSearch}”.` : "No queues yet."),
    pager("queue-pages", "Queue pages", qPage, queuePages, qPage < queuePages, "qp",
      `${fmtNum(queueTotal)} queue${queueTotal === 1 ? "" : "s"}${qSearch ? " found" : ""}`),
    h("h2", {}, "Consumer groups"),
    searchBox("group-search", "Find groups", gSearch, "gp", "gs"),
    table("Lag per consumer group and queue.",
      ["Group", "Queue", "Members", "Backlog (messages)", "Oldest unconsumed", "State"],
      groupRows, gSearch ? `No group or queue name contains “${gSearch}”.` : "No consumer groups yet."),
    pager("group-pages", "Consumer group pages", gPage, null, groupsNext, "gp"),
    h("p", { class: "note" }, REFRESH_SECS ? `Refreshes every ${REFRESH_SECS} s.` : "Automatic refresh is off.",
      " ", h("button", { type: "button", id: "refresh", onclick: () => route() }, "Refresh now")),
  ];
}

// ---------------------------------------------------------------- one queue

async function queuePage(name, query) {
  const wanted = Math.max(1, Number(query.get("page")) || 1);
  const [q, groups, recent, hist] = await Promise.all([
    api(`/api/v1/resources/queues/${enc(name)}${qs({ limit: PARTITIONS_PER_PAGE, offset: (wanted - 1) * PARTITIONS_PER_PAGE })}`),
    api(`/api/v1/consumer-groups${qs({ search: name })}`),
    api(`/api/v1/messages${qs({ queue: name, limit: RECENT_MESSAGES, from: new Date(Date.now() - 7 * 86400e3).toISOString() })}`),
    api(`/api/v1/system/history${qs({ queue: name })}`).catch((e) => { if (e instanceof AuthNeeded) throw e; return { error: e.message }; }),
  ]);
  const mine = groups.filter((g) => g.queueName === name);
  const details = await Promise.all(mine.map((g) => api(`/api/v1/consumer-groups/${enc(g.name)}${qs({ queue: name })}`)));

  const options = h("dl", { class: "fields", id: "queue-options" },
    Object.entries(q.options || {}).map(([k, v]) => [h("dt", {}, k), h("dd", {}, typeof v === "object" ? JSON.stringify(v) : String(v))]));

  const groupRows = mine.map((g, i) => {
    const parts = (details[i][name] && details[i][name].partitions) || [];
    const backlog = parts.reduce((s, p) => s + (p.offsetLag || 0), 0);
    const holders = [...new Set(parts.filter((p) => p.leaseActive).map((p) => `${p.workerId || "?"} on ${p.partition}`))];
    return h("tr", { "data-group": g.name },
      h("th", { scope: "row" }, groupName(g.name)),
      num(backlog), num(parts.filter((p) => p.offsetLag > 0).length),
      h("td", { class: "num" }, fmtDuration(g.maxTimeLag)),
      h("td", {}, holders.length ? holders.slice(0, 10).join(", ") + (holders.length > 10 ? ` … (+${holders.length - 10})` : "") : "none"));
  });

  // The broker answers one page of partitions (`partitionCount` in all); one before paging
  // answers every partition, cut here.
  const paged = q.partitionCount !== undefined;
  const count = paged ? q.partitionCount : (q.partitions || []).length;
  const pages = Math.max(1, Math.ceil(count / PARTITIONS_PER_PAGE));
  const page = Math.min(pages, wanted);
  const shown = paged ? q.partitions || []
    : (q.partitions || []).slice((page - 1) * PARTITIONS_PER_PAGE, page * PARTITIONS_PER_PAGE);
  const partRows = shown.map((p) => h("tr", {},
    h("th", { scope: "row" }, p.name),
    num(p.stats.total), num(p.stats.pending), num(p.stats.processing), num(p.stats.completed), num(p.stats.deadLetter),
    h("td", {}, fmtTime(p.oldestMessage)), h("td", {}, fmtTime(p.newestMessage))));
  const pageLink = (n, label) => n < 1 || n > pages || n === page
    ? h("span", { class: "note" }, label)
    : h("a", { href: `#/queues/${enc(name)}?page=${n}` }, label);
  const pager = h("nav", { class: "pager", "aria-label": "Partition pages" },
    pageLink(page - 1, "← Previous"), h("span", {}, `page ${page} of ${pages} (${fmtNum(count)} partitions)`), pageLink(page + 1, "Next →"));

  const msgRows = (recent.messages || []).map((m) => h("tr", {},
    h("td", {}, fmtTime(m.createdAt)), h("td", {}, m.partition),
    h("td", {}, h("a", { href: `#/messages/${enc(m.partitionId)}/${enc(m.transactionId)}` }, h("code", {}, m.transactionId))),
    h("td", {}, m.status), h("td", { class: "preview" }, h("code", {}, preview(m.payload)))));

  const t = q.totals || {};
  return [
    h("p", {}, h("a", { href: "#/" }, "← Overview")),
    h("h1", {}, `Queue ${q.name}`),
    h("dl", { class: "cards" },
      ...[["Total", t.total], ["Pending", t.pending], ["Processing", t.processing], ["Completed", t.completed], ["Dead letters", t.deadLetter], ["Partitions", count]]
        .map(([k, v]) => h("div", { class: "card" }, h("dt", {}, k), h("dd", {}, fmtNum(v ?? 0))))),
    h("h2", {}, "Last hour"),
    h("div", { class: "charts" }, ...backlogCharts(hist, false, "queue-chart")),
    h("h2", {}, "Options"), options,
    h("h2", {}, "Consumer groups"),
    table("Per-group lag on this queue and who holds leases now.",
      ["Group", "Backlog (messages)", "Partitions with lag", "Oldest unconsumed", "Lease holders"], groupRows, "No consumer group has read this queue."),
    h("h2", {}, "Partitions"), pager,
    table(`Partitions ${(page - 1) * PARTITIONS_PER_PAGE + 1}–${(page - 1) * PARTITIONS_PER_PAGE + shown.length}.`,
      ["Partition", "Total", "Pending", "Processing", "Completed", "Dead", "Oldest", "Newest"], partRows, "No partitions."),
    h("h2", {}, "Recent messages"),
    table("Newest first, from the last 7 days; payloads truncated.", ["Created", "Partition", "Transaction id", "Status", "Payload"], msgRows, "No messages in the last 7 days."),
  ];
}

// ---------------------------------------------------------------- one message

async function messagePage(partitionId, transactionId) {
  const m = await api(`/api/v1/messages/${enc(partitionId)}/${enc(transactionId)}`);
  let pretty = JSON.stringify(m.payload, null, 2) ?? "";
  const cut = pretty.length > PAYLOAD_CHARS;
  if (cut) pretty = pretty.slice(0, PAYLOAD_CHARS);
  const field = (k, v) => [h("dt", {}, k), h("dd", {}, v === null || v === undefined ? "—" : v)];
  return [
    h("p", {}, h("a", { href: `#/queues/${enc(m.queue)}` }, `← Queue ${m.queue}`)),
    h("h1", {}, "Message"),
    h("dl", { class: "fields", id: "message-fields" },
      field("Queue / partition", `${m.queue} / ${m.partition}`),
      field("Transaction id", h("code", {}, m.transactionId)),
      field("Message id", h("code", {}, m.id)),
      field("Status", m.status),
      field("Created", fmtTime(m.createdAt)),
      field("Lease expires", m.leaseExpiresAt ? fmtTime(m.leaseExpiresAt) : null),
      field("Retries", String(m.retryCount ?? 0)),
      field("Error", m.errorMessage),
      field("Trace id", m.traceId),
      field("Producer", m.producerSub),
      field("Consumer groups", (m.consumerGroups || []).map((g) => `${groupName(g.name)}: ${g.consumed ? "consumed" : "not yet"}`).join("; ") || "none")),
    h("h2", {}, "Payload"),
    h("pre", { class: "payload", id: "payload", tabindex: "0" }, pretty),
    cut ? h("p", { class: "note" }, `Shown: the first ${fmtNum(PAYLOAD_CHARS)} characters; the whole payload is at the API route.`) : null,
  ];
}

// ---------------------------------------------------------------- dead letters

async function dlqPage(query) {
  const queue = query.get("queue") || "";
  const group = query.get("consumerGroup") || "";
  const page = Math.max(1, Number(query.get("page")) || 1);
  const data = await api(`/api/v1/dlq${qs({ queue, consumerGroup: group, limit: DLQ_PER_PAGE, offset: (page - 1) * DLQ_PER_PAGE })}`);
  const rows = data.messages.map((m) => h("tr", {},
    h("td", {}, fmtTime(m.failedAt)),
    h("td", {}, h("a", { href: `#/queues/${enc(m.queue)}` }, m.queue), ` / ${m.partition}`),
    h("td", {}, groupName(m.consumerGroup)),
    h("td", { class: "reason" }, m.errorMessage || "—"),
    num(m.retryCount),
    h("td", { class: "preview" }, h("code", {}, preview(m.data))),
    h("td", {}, h("a", { href: `#/messages/${enc(m.partitionId)}/${enc(m.transactionId)}` }, "Details"))));
  const pages = Math.max(1, Math.ceil(data.total / DLQ_PER_PAGE));
  const link = (n, label) => n < 1 || n > pages || n === page
    ? h("span", { class: "note" }, label)
    : h("a", { href: `#/dlq${qs({ queue, consumerGroup: group, page: n })}` }, label);
  const qIn = h("input", { id: "dlq-queue", name: "queue", value: queue });
  const gIn = h("input", { id: "dlq-group", name: "consumerGroup", value: group });
  return [
    h("h1", {}, "Dead letters"),
    h("form", {
      class: "inline", role: "search",
      onsubmit: (ev) => { ev.preventDefault(); location.hash = `#/dlq${qs({ queue: qIn.value.trim(), consumerGroup: gIn.value.trim() })}`; },
    }, h("label", { for: "dlq-queue" }, "Queue", qIn), h("label", { for: "dlq-group" }, "Consumer group", gIn),
    h("button", { type: "submit" }, "Filter")),
    h("p", {}, `${fmtNum(data.total)} dead letter(s).`),
    table("Newest failure first. A dead letter stays readable here and through the message route; the consumer group's cursor has moved past it.",
      ["Failed", "Queue / partition", "Group", "Reason", "Retries", "Payload", ""], rows, "No dead letters."),
    h("nav", { class: "pager", "aria-label": "Dead letter pages" }, link(page - 1, "← Previous"), h("span", {}, `page ${page} of ${pages}`), link(page + 1, "Next →")),
  ];
}

// ---------------------------------------------------------------- consumer groups

function confirmDialog(text, confirmLabel) {
  return new Promise((resolve) => {
    const dlg = h("dialog", { id: "confirm", "aria-labelledby": "confirm-text" },
      h("p", { id: "confirm-text" }, text),
      h("form", { method: "dialog", class: "actions" },
        h("button", { value: "cancel", id: "confirm-cancel" }, "Cancel"),
        h("button", { value: "ok", class: "danger primary", id: "confirm-ok" }, confirmLabel)));
    dlg.addEventListener("close", () => { resolve(dlg.returnValue === "ok"); dlg.remove(); });
    document.body.append(dlg);
    dlg.showModal();
    dlg.querySelector("#confirm-cancel").focus();
  });
}

async function groupsPage(query) {
  const search = query.get("s") || "", page = pageOf(query, "p");
  const { groups, hasNext } = await groupPage(search, page);
  const act = async (what, fn) => {
    try {
      const r = await fn();
      setStatus(`${what}: done${r && r.partitionsUpdated !== undefined ? ` (${r.partitionsUpdated} partition(s))` : ""}`);
    } catch (e) {
      setStatus(`${what}: ${e.message}`);
    }
    await route();
  };
  const rows = groups.map((g, i) => {
    const base = `/api/v1/consumer-groups/${enc(g.name)}/queues/${enc(g.queueName)}`;
    const label = `${groupName(g.name)} on ${g.queueName}`;
    const when = h("input", { type: "datetime-local", id: `seek-time-${i}`, "aria-label": `Seek time for ${label} (UTC)`, step: 1 });
    const actions = h("td", {}, h("div", { class: "actions" },
      can("configure") ? [
        h("button", { type: "button", "aria-label": `Seek ${label} to the end`, onclick: () => act(`Seek ${label} to end`, () => api(`${base}/seek`, { method: "POST", body: { toEnd: true } })) }, "Seek to end"),
        when,
        h("button", {
          type: "button", "aria-label": `Seek ${label} to the time`,
          onclick: () => {
            if (!when.value) return setStatus("Choose a time to seek to.");
            return act(`Seek ${label}`, () => api(`${base}/seek`, { method: "POST", body: { timestamp: `${when.value}Z` } }));
          },
        }, "Seek to time"),
      ] : null,
      can("admin") ? h("button", {
        type: "button", class: "danger", "aria-label": `Delete ${label}`,
        onclick: async () => {
          if (await confirmDialog(`Delete consumer group ${label}? Its cursors and leases on this queue are removed; it starts over as a new group.`, "Delete")) {
            await act(`Delete ${label}`, () => api(base, { method: "DELETE" }));
          }
        },
      }, "Delete") : null));
    return h("tr", { "data-group": g.name, "data-queue": g.queueName },
      h("th", { scope: "row" }, groupName(g.name)),
      h("td", {}, h("a", { href: `#/queues/${enc(g.queueName)}` }, g.queueName)),
      num(g.members), num(g.backlog), num(g.partitionsWithLag), h("td", { class: "num" }, fmtDuration(g.maxTimeLag)),
      h("td", {}, g.state), h("td", {}, g.subscriptionMode || ""),
      can("configure") || can("admin") ? actions : null);
  });
  const headers = ["Group", "Queue", "Members", "Backlog (messages)", "Partitions with lag", "Oldest unconsumed", "State", "Subscription"];
  if (can("configure") || can("admin")) headers.push("Actions");
  return [
    h("h1", {}, "Consumer groups"),
    searchBox("groups-search", "Find groups", search, "p", "s"),
    table("Lag per group and queue. Seek times are UTC.", headers, rows,
      search ? `No group or queue name contains “${search}”.` : "No consumer groups yet."),
    pager("groups-pages", "Consumer group pages", page, null, hasNext, "p"),
  ];
}

// ---------------------------------------------------------------- Kafka topics and groups

async function kafkaPage(query) {
  const tSearch = query.get("ts") || "", tPage = pageOf(query, "tp");
  const gSearch = query.get("gs") || "", gPage = pageOf(query, "gp");
  const [topics, groups] = await Promise.all([
    api(`/api/v1/kafka/topics${qs({ limit: LIST_PAGE, offset: (tPage - 1) * LIST_PAGE, search: tSearch })}`),
    api(`/api/v1/kafka/groups${qs({ limit: LIST_PAGE, offset: (gPage - 1) * LIST_PAGE, search: gSearch })}`),
  ]);
  const topicRows = topics.topics.map((t) => {
    const records = t.offsets.reduce((s, o) => s + o.records, 0);
    const ends = t.offsets.map((o) => `${o.partition}: ${fmtNum(o.logStartOffset)}–${fmtNum(o.endOffset)}`);
    return h("tr", { "data-topic": t.name },
      h("th", { scope: "row" }, h("a", { href: `#/queues/${enc(t.name)}` }, t.name)),
      num(t.partitions), num(records),
      h("td", { class: "offsets" }, ends.length ? ends.join(" · ") : "nothing written"));
  });
  const groupRows = groups.groups.flatMap((g) => {
    const members = g.members.map((m) => {
      const parts = m.assigned.map(([topic, ps]) => `${topic} ${ps.join(",")}`).join("; ");
      return `${m.instanceId || m.memberId}${parts ? ` (${parts})` : ""}`;
    });
    const head = h("tr", { "data-kafka-group": g.group },
      h("th", { scope: "row", rowspan: Math.max(1, g.offsets.length) }, g.group),
      h("td", { rowspan: Math.max(1, g.offsets.length) }, g.state,
        g.coordinator ? h("span", { class: "note" }, ` coordinator: node ${g.coordinator.nodeId} (${g.coordinator.host}:${g.coordinator.port})`) : ""),
      h("td", { rowspan: Math.max(1, g.offsets.length) }, members.length ? members.join(", ")
        : groups.membersKnown ? "none on this broker" : "unknown (Kafka listener off here)"),
      ...(g.offsets.length ? offsetCells(g.offsets[0]) : [h("td", { colspan: 5 }, "no committed offsets")]));
    return [head, ...g.offsets.slice(1).map((o) => h("tr", { "data-kafka-group": g.group }, ...offsetCells(o)))];
  });
  const topicPages = Math.max(1, Math.ceil(topics.total / LIST_PAGE));
  const groupPages = Math.max(1, Math.ceil(groups.total / LIST_PAGE));
  return [
    h("h1", {}, "Kafka"),
    h("p", { class: "note" }, "Topics made over Kafka (CreateTopics or auto-create) and the groups with committed offsets on them. Members are known only to the broker the group's members use."),
    h("h2", {}, "Topics"),
    searchBox("topic-search", "Find topics", tSearch, "tp", "ts"),
    table("Each partition's log start and end offsets.", ["Topic", "Partitions", "Records", "Offsets (partition: start–end)"],
      topicRows, tSearch ? `No topic name contains “${tSearch}”.` : "No Kafka topics yet."),
    pager("topic-pages", "Topic pages", tPage, topicPages, tPage < topicPages, "tp", `${fmtNum(topics.total)} topics`),
    h("h2", {}, "Groups"),
    searchBox("kafka-group-search", "Find groups", gSearch, "gp", "gs"),
    table("Committed offset and lag per partition.", ["Group", "State", "Members here (assigned partitions)", "Topic", "Partition", "Committed", "End", "Lag"],
      groupRows, gSearch ? `No group name contains “${gSearch}”.` : "No Kafka groups yet."),
    pager("kafka-group-pages", "Kafka group pages", gPage, groupPages, gPage < groupPages, "gp", `${fmtNum(groups.total)} groups`),
  ];
}

function offsetCells(o) {
  return [h("td", {}, o.topic), num(o.partition), num(o.committedOffset), num(o.endOffset), num(o.lag)];
}

// ---------------------------------------------------------------- KV, locks, timers, streams

async function statePage() {
  const [ns, locks, timers, streams, eph] = await Promise.all([
    api("/api/v1/kv/namespaces"),
    api("/api/v1/locks"),
    api("/api/v1/timers"),
    api("/streams/v1/queries"),
    api("/api/v1/ephemeral/queues"),
  ]);
  const ephShown = eph.queues.slice(0, 100);
  const ephRows = ephShown.map((q) => h("tr", { "data-ephemeral": q.queue },
    h("th", { scope: "row" }, q.queue), num(q.length), h("td", { class: "num" }, fmtBytes(q.bytes)),
    num(q.partitions), num(q.pushed), num(q.dropped.ttl), num(q.dropped.policy), num(q.dropped.retries)));
  const more = (body) => body.truncated ? h("p", { class: "note" }, "The first 100 are shown; there are more.") : null;
  const nsRows = ns.namespaces.map((n) => h("tr", { "data-namespace": n.namespace },
    h("th", { scope: "row" }, n.namespace), num(n.keys), h("td", { class: "num" }, fmtBytes(n.bytes)),
    num(n.expiring), num(n.expiringSoon), h("td", {}, fmtTime(n.lastWrite))));
  const lockRows = locks.locks.map((l) => h("tr", { "data-lock": l.name },
    h("th", { scope: "row" }, l.name), num(l.slot), h("td", {}, l.owner ?? "—"), num(l.token),
    h("td", {}, l.expiresAt ? fmtTime(l.expiresAt) : "never"), h("td", {}, fmtTime(l.renewedAt))));
  const timerRows = timers.queues.map((t) => h("tr", { "data-timers": t.queue },
    h("th", { scope: "row" }, t.queue), num(t.pending), h("td", {}, fmtTime(t.nextDue)),
    h("td", { class: "num" }, t.lateSeconds > 0 ? fmtDuration(t.lateSeconds) : "on time"), num(t.refused)));
  const streamRows = streams.queries.map((q) => h("tr", { "data-query": q.name },
    h("th", { scope: "row" }, q.name), h("td", {}, q.sourceQueue), h("td", {}, q.sinkQueue ?? "—"),
    num(q.partitions), num(q.stateKeys), h("td", { class: "num" }, fmtBytes(q.stateBytes)),
    h("td", { class: "num" }, fmtBytes(q.largestPartitionBytes)), num(q.cycles),
    h("td", {}, q.lastCycle ? fmtTime(q.lastCycle) : "no cycle yet")));
  return [
    h("h1", {}, "KV, locks, timers, streams and ephemeral queues"),
    h("h2", {}, "KV namespaces"),
    table("Live keys per namespace, most first; bytes are keys plus values as JSON text. Lock permits are the queen-locks namespace.",
      ["Namespace", "Keys", "Bytes", "With expiry", "Expiring within 1 min", "Last write"], nsRows, "No KV keys."),
    more(ns),
    h("h2", {}, "Locks and semaphores"),
    table("Live permits, the soonest to expire first. The token is the fencing token.",
      ["Lock", "Slot", "Holder", "Token", "Expires", "Taken or renewed"], lockRows, "No lock is held."),
    more(locks),
    h("h2", {}, "Timers"),
    table("Pending timers per queue, the soonest due first. Late: how long the earliest is past due; refused: fires the queue refused.",
      ["Queue", "Pending", "Next due", "Late", "Refused"], timerRows, "No pending timers."),
    more(timers),
    h("h2", {}, "Stream queries"),
    table("State per query over its partitions; the largest partition's state beside the total.",
      ["Query", "Source", "Sink", "Partitions", "State keys", "State bytes", "Largest partition", "Cycles", "Last cycle"], streamRows, "No stream queries."),
    more(streams),
    h("h2", {}, "Ephemeral queues (this broker)"),
    h("p", { id: "ephemeral-memory" }, `Memory: ${fmtBytes(eph.usedBytes)} of ${fmtBytes(eph.budgetBytes)} (QUEEN_EPHEMERAL_MAX_BYTES).`),
    table("Rings in this broker's memory: depth, bytes, messages pushed and dropped unconsumed (past their TTL, by the drop policy, past the retry limit).",
      ["Queue", "Depth", "Bytes", "Partitions", "Pushed", "Dropped (TTL)", "Dropped (policy)", "Dropped (retries)"], ephRows, "No ephemeral queues on this broker."),
    eph.queues.length > ephShown.length ? h("p", { class: "note" }, `The first 100 of ${fmtNum(eph.queues.length)} are shown.`) : null,
  ];
}

// ---------------------------------------------------------------- maintenance

async function maintenancePage() {
  const metrics = await api("/metrics");
  const spool = metrics.spool || {};
  let flags = { maintenance: !!spool.maintenanceMode, pop: !!spool.popMaintenanceMode };
  let buffered = spool.records ?? 0;
  if (can("admin")) {
    const m = await api("/api/v1/system/maintenance");
    flags = { maintenance: m.maintenanceMode, pop: m.popMaintenanceMode };
    buffered = m.bufferedMessages;
  }
  return [
    h("h1", {}, "Maintenance"),
    h("dl", { class: "fields" },
      h("dt", {}, "Push maintenance"), h("dd", { id: "push-maintenance" }, flags.maintenance ? "on: every push is spooled to disk and replay is paused" : "off"),
      h("dt", {}, "Pop maintenance"), h("dd", { id: "pop-maintenance" }, flags.pop ? "on: every pop answers empty" : "off"),
      h("dt", {}, "Spooled items"), h("dd", { id: "spool-count" }, fmtNum(buffered)),
      h("dt", {}, "Spool size"), h("dd", {}, fmtBytes(spool.bytes)),
      h("dt", {}, "Replayed since start"), h("dd", {}, fmtNum(spool.replayed ?? 0)),
      h("dt", {}, "Database unreachable for"), h("dd", {}, spool.dbUnreachableSeconds ? fmtDuration(spool.dbUnreachableSeconds) : "—")),
    maintenanceToggles(flags) || h("p", { class: "note" }, "Changing maintenance mode needs the admin role."),
  ];
}

// ---------------------------------------------------------------- start

window.addEventListener("hashchange", () => { route(); document.getElementById("main").focus({ preventScroll: true }); });
boot();
