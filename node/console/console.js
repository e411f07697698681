// The DSM web console: polls the JSON API of the dsmd that serves it and
// draws members, regions, the page map, rates and the miss latency
// histogram. Plain JavaScript, no dependencies.
"use strict";

const POLL_MS = 2000;
const MAX_CELLS = 4096; // cells asked for at a time
// One color per owner node of Modified pages, in node order.
const OWNER_COLORS = ["#d62728", "#1f77b4", "#9467bd", "#ff7f0e", "#17becf", "#8c564b", "#e377c2", "#bcbd22"];
const MULTI_M = "#4a4a4a";
const INVALID = "#eceff2";
const UNKNOWN = "#ffffff";

const $ = (id) => document.getElementById(id);

const view = {
  region: "", // selected region name
  first: 0, // first page shown
  count: 0, // pages shown (0: to the end)
  pages: null, // the last /api/pages answer
  local: false,
};
let lastStats = null;
let pagesSeq = 0;

// The view lives in the address's fragment (#region=NAME&first=N&count=N&local=1),
// so that a zoomed view can be bookmarked and shared.
function loadView() {
  const h = new URLSearchParams(location.hash.slice(1));
  view.region = h.get("region") || "";
  view.first = Math.max(0, parseInt(h.get("first"), 10) || 0);
  view.count = Math.max(0, parseInt(h.get("count"), 10) || 0);
  view.local = h.get("local") === "1";
}

function saveView() {
  const h = new URLSearchParams();
  if (view.region) h.set("region", view.region);
  if (view.first) h.set("first", view.first);
  if (view.count) h.set("count", view.count);
  if (view.local) h.set("local", "1");
  history.replaceState(null, "", "#" + h);
}
let regions = [];

function fmtBytes(n) {
  const units = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return (i === 0 ? n : n.toFixed(n < 10 ? 1 : 0)) + " " + units[i];
}

function fmtNs(ns) {
  if (ns < 1e3) return ns + " ns";
  if (ns < 1e6) return (ns / 1e3).toFixed(ns < 1e4 ? 1 : 0) + " µs";
  if (ns < 1e9) return (ns / 1e6).toFixed(ns < 1e7 ? 1 : 0) + " ms";
  return (ns / 1e9).toFixed(2) + " s";
}

function fmtRate(v) {
  if (v >= 1e6) return (v / 1e6).toFixed(1) + " M/s";
  if (v >= 1e3) return (v / 1e3).toFixed(1) + " k/s";
  return v.toFixed(v < 10 ? 1 : 0) + " /s";
}

async function getJSON(path) {
  const resp = await fetch(path, { cache: "no-store" });
  const body = await resp.json();
  if (!resp.ok) throw new Error(path.split("?")[0] + ": " + (body.error || resp.status));
  return body;
}

function showError(err) {
  const e = $("error");
  if (err) {
    e.textContent = String(err.message || err);
    e.hidden = false;
  } else {
    e.hidden = true;
  }
}

function cell(tr, text, cls) {
  const td = document.createElement("td");
  td.textContent = text;
  if (cls) td.className = cls;
  tr.appendChild(td);
  return td;
}

function renderOverview(o) {
  $("node").textContent = `n${o.node_id} · ${o.version} · leader n${o.leader_id} · term ${o.term} · epoch ${o.epoch}`;
  const h = $("health");
  h.textContent = o.health;
  h.dataset.health = o.health;
  const reasons = $("reasons");
  reasons.replaceChildren(...o.reasons.map((r) => {
    const li = document.createElement("li");
    li.textContent = r;
    return li;
  }));

  const mb = $("members").tBodies[0];
  mb.replaceChildren(...o.members.map((m) => {
    const tr = document.createElement("tr");
    tr.dataset.node = m.node_id;
    tr.dataset.state = m.state;
    cell(tr, "n" + m.node_id);
    cell(tr, m.state, "state-" + m.state);
    cell(tr, [m.leader ? "leader" : "", m.voter ? "voter" : "nonvoter"].filter(Boolean).join(", "));
    cell(tr, m.addr);
    cell(tr, m.homed_shards, "num");
    cell(tr, m.error ? m.error : `${fmtBytes(m.cache_bytes)} of ${fmtBytes(m.cache_capacity_bytes)}`);
    cell(tr, m.error ? "" : m.dirty_pages, "num");
    return tr;
  }));

  regions = o.regions;
  const rb = $("regions").tBodies[0];
  rb.replaceChildren(...o.regions.map((r) => {
    const tr = document.createElement("tr");
    tr.dataset.region = r.name;
    if (r.name === view.region) tr.className = "selected";
    cell(tr, r.name);
    cell(tr, "r" + r.id);
    cell(tr, fmtBytes(r.size_bytes), "num");
    cell(tr, fmtBytes(r.page_size), "num");
    cell(tr, r.pages, "num");
    cell(tr, r.shards, "num");
    cell(tr, r.durability);
    tr.addEventListener("click", () => selectRegion(r.name));
    return tr;
  }));
  $("noregions").hidden = o.regions.length > 0;

  const sel = $("regionselect");
  const names = o.regions.map((r) => r.name);
  if ([...sel.options].map((x) => x.value).join("\n") !== names.join("\n")) {
    sel.replaceChildren(...names.map((n) => new Option(n, n)));
  }
  if (!names.includes(view.region)) {
    view.region = names.length ? names[0] : "";
    view.first = 0;
    view.count = 0;
  }
  sel.value = view.region;
}

function selectRegion(name) {
  if (name !== view.region) {
    view.region = name;
    view.first = 0;
    view.count = 0;
  }
  saveView();
  refreshPages();
}

// ownerColor gives each owner node its color.
function ownerColor(id) {
  return OWNER_COLORS[(id - 1) % OWNER_COLORS.length];
}

// sharedColor darkens with the number of sharers.
const SHARED_SHADES = ["#b7e4c7", "#74c69d", "#40916c", "#2d6a4f", "#1b4332"];

function sharedColor(k) {
  return SHARED_SHADES[Math.min(Math.max(k, 1), SHARED_SHADES.length) - 1];
}

function cellColor(c) {
  switch (c.state) {
    case "M": return ownerColor(c.owners[0]);
    case "M*": return MULTI_M;
    case "S": return sharedColor(c.max_sharers);
    case "I": return INVALID;
  }
  return UNKNOWN;
}

function cellSymbol(c) {
  switch (c.state) {
    case "M": return "M";
    case "M*": return "*";
    case "S": return "S";
    case "I": return ".";
  }
  return "?";
}

// layout says how the cells of p sit on the canvas: cols per row, size
// pixels a side.
function layout(p) {
  const n = p.cells.length;
  const cols = n > 1024 ? 128 : Math.max(1, Math.min(64, n));
  return { cols: cols, size: Math.floor(1024 / Math.max(cols, 64)) };
}

function renderPages(p) {
  view.pages = p;
  const canvas = $("pagemap");
  const { cols, size } = layout(p);
  canvas.width = cols * size;
  canvas.height = Math.max(1, Math.ceil(p.cells.length / cols)) * size;
  const ctx = canvas.getContext("2d");
  ctx.fillStyle = "#ffffff";
  ctx.fillRect(0, 0, canvas.width, canvas.height);
  const gap = size > 4 ? 1 : 0;
  p.cells.forEach((c, i) => {
    ctx.fillStyle = cellColor(c);
    ctx.fillRect((i % cols) * size, Math.floor(i / cols) * size, size - gap, size - gap);
  });
  // What the picture shows, for tools and tests that read the page.
  canvas.dataset.region = p.region.name;
  canvas.dataset.first = p.first_page;
  canvas.dataset.count = p.page_count;
  canvas.dataset.group = p.group;
  canvas.dataset.states = p.cells.map(cellSymbol).join("");
  canvas.dataset.owners = p.cells.map((c) => c.owners.join("+")).join(",");

  $("pageregion").textContent = `${p.region.name} (r${p.region.id})`;
  const last = p.first_page + p.page_count - 1;
  $("pagerange").textContent = `pages ${p.first_page}–${last} of ${p.region.pages} · 1 cell = ${p.group} page${p.group > 1 ? "s" : ""} · ${p.cluster ? "cluster view" : "local view"} from n${p.node_id}`;
  const t = p.totals;
  $("pagetotals").textContent = `M ${t.modified} · S ${t.shared} · I ${t.invalid} · dirty on n${p.node_id} ${t.dirty}`;

  const owners = [...new Set(p.cells.filter((c) => c.state === "M").map((c) => c.owners[0]))].sort((a, b) => a - b);
  const items = owners.map((id) => [ownerColor(id), `M at n${id}`]);
  items.push([MULTI_M, "M at several nodes"]);
  for (let k = 1; k <= SHARED_SHADES.length; k++) {
    items.push([sharedColor(k), `S at ${k}${k === SHARED_SHADES.length ? "+" : ""} node${k > 1 ? "s" : ""}`]);
  }
  items.push([INVALID, "I: no copy"]);
  $("legend").replaceChildren(...items.map(([color, text]) => {
    const s = document.createElement("span");
    const i = document.createElement("i");
    i.style.background = color;
    s.append(i, text);
    return s;
  }));
}

function cellAt(ev) {
  const canvas = $("pagemap");
  const p = view.pages;
  if (!p) return null;
  const r = canvas.getBoundingClientRect();
  const x = (ev.clientX - r.left) * canvas.width / r.width;
  const y = (ev.clientY - r.top) * canvas.height / r.height;
  const { cols, size } = layout(p);
  const i = Math.floor(y / size) * cols + Math.floor(x / size);
  return i >= 0 && i < p.cells.length ? p.cells[i] : null;
}

function describeCell(c) {
  const range = c.pages > 1 ? `pages ${c.first_page}–${c.first_page + c.pages - 1}` : `page ${c.first_page}`;
  const parts = [range];
  if (c.modified) parts.push(`M ${c.modified}` + (c.owners.length ? " at " + c.owners.map((o) => "n" + o).join(", ") : ""));
  if (c.shared) parts.push(`S ${c.shared} (up to ${c.max_sharers} node${c.max_sharers > 1 ? "s" : ""})`);
  if (c.invalid) parts.push(`I ${c.invalid}`);
  if (c.dirty) parts.push(`dirty here ${c.dirty}`);
  return parts.join(" · ");
}

function zoomTo(first, count) {
  const p = view.pages;
  if (!p) return;
  const total = p.region.pages;
  count = Math.max(1, Math.min(total, Math.round(count)));
  first = Math.max(0, Math.min(total - count, Math.round(first)));
  view.first = first;
  view.count = count === total ? 0 : count;
  saveView();
  refreshPages();
}

async function refreshPages() {
  if (!view.region) {
    $("pagesection").hidden = true;
    return;
  }
  $("pagesection").hidden = false;
  const q = new URLSearchParams({ region: view.region, first: view.first, cells: MAX_CELLS });
  if (view.count) q.set("count", view.count);
  if (view.local) q.set("local", "true");
  // Only the answer to the latest request is drawn: a poll that was
  // under way when the view changed must not draw the old view.
  const seq = ++pagesSeq;
  try {
    const p = await getJSON("api/pages?" + q);
    if (seq === pagesSeq) {
      renderPages(p);
      showError(null);
    }
  } catch (err) {
    if (seq === pagesSeq) showError(err);
  }
}

function renderStats(s) {
  const rows = [];
  if (lastStats) {
    const dt = (s.time_unix_nano - lastStats.time_unix_nano) / 1e9;
    if (dt > 0) {
      const r = (a, b) => Math.max(0, a - b) / dt;
      const f = (k) => r(s.faults[k] || 0, lastStats.faults[k] || 0);
      rows.push(
        ["misses", fmtRate(r(s.misses, lastStats.misses))],
        ["· read", fmtRate(f("read"))],
        ["· write", fmtRate(f("write"))],
        ["· upgrade", fmtRate(f("upgrade"))],
        ["local resolves", fmtRate(r(s.hits, lastStats.hits))],
        ["invalidations sent", fmtRate(r(s.invalidations_sent, lastStats.invalidations_sent))],
        ["invalidations received", fmtRate(r(s.invalidations_received, lastStats.invalidations_received))],
        ["evictions", fmtRate(r(s.evictions, lastStats.evictions))],
        ["writebacks", fmtRate(r(s.writebacks, lastStats.writebacks))],
        ["bytes in", fmtBytes(r(s.bytes_in, lastStats.bytes_in)) + "/s"],
        ["bytes out", fmtBytes(r(s.bytes_out, lastStats.bytes_out)) + "/s"],
      );
    }
  }
  rows.push(["cache", `${fmtBytes(s.cache_bytes)} of ${fmtBytes(s.cache_capacity_bytes)}`], ["dirty pages", String(s.dirty_pages)]);
  lastStats = s;
  $("rates").tBodies[0].replaceChildren(...rows.map(([k, v]) => {
    const tr = document.createElement("tr");
    cell(tr, k);
    cell(tr, v, "num");
    return tr;
  }));
  renderHistogram(s.miss_latency);
}

// renderHistogram draws the non-cumulative bucket counts as bars.
function renderHistogram(h) {
  const svg = $("histogram");
  const ns = "http://www.w3.org/2000/svg";
  const W = +svg.getAttribute("width"), H = +svg.getAttribute("height");
  const pad = { l: 40, r: 40, t: 8, b: 46 };
  const bars = [];
  let prev = 0;
  for (const b of h.buckets) {
    bars.push({ le: b.le_ns, n: b.count - prev });
    prev = b.count;
  }
  if (h.count > prev) bars.push({ le: Infinity, n: h.count - prev });
  const max = Math.max(1, ...bars.map((b) => b.n));
  const bw = bars.length ? (W - pad.l - pad.r) / bars.length : 0;
  const kids = [];
  const el = (name, attrs, text) => {
    const e = document.createElementNS(ns, name);
    for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
    if (text !== undefined) e.textContent = text;
    kids.push(e);
    return e;
  };
  el("text", { x: 2, y: pad.t + 8 }, String(max));
  el("text", { x: 2, y: H - pad.b }, "0");
  bars.forEach((b, i) => {
    const bh = (H - pad.t - pad.b) * b.n / max;
    const x = pad.l + i * bw;
    const rect = el("rect", { x: x + 1, y: H - pad.b - bh, width: Math.max(1, bw - 2), height: bh });
    const title = document.createElementNS(ns, "title");
    title.textContent = `≤ ${b.le === Infinity ? "∞" : fmtNs(b.le)}: ${b.n}`;
    rect.appendChild(title);
    if (i % Math.max(1, Math.ceil(bars.length / 10)) === 0) {
      el("text", { x: x, y: H - pad.b + 12, transform: `rotate(40 ${x} ${H - pad.b + 12})` }, b.le === Infinity ? "+∞" : fmtNs(b.le));
    }
  });
  svg.replaceChildren(...kids);
  svg.dataset.count = h.count;
  $("latency").textContent = h.count
    ? `${h.count} miss${h.count === 1 ? "" : "es"} · p50 ${fmtNs(h.p50_ns)} · p99 ${fmtNs(h.p99_ns)} · max ${fmtNs(h.max_ns)}`
    : "no misses yet";
}

async function poll() {
  try {
    const [o, s] = await Promise.all([getJSON("api/overview"), getJSON("api/stats")]);
    renderOverview(o);
    renderStats(s);
    showError(null);
    $("updated").textContent = "updated " + new Date().toLocaleTimeString();
    document.body.dataset.loaded = "true";
  } catch (err) {
    showError(err);
  }
  await refreshPages();
}

function start() {
  $("regionselect").addEventListener("change", (ev) => selectRegion(ev.target.value));
  loadView();
  $("localview").checked = view.local;
  $("localview").addEventListener("change", (ev) => { view.local = ev.target.checked; saveView(); refreshPages(); });
  window.addEventListener("hashchange", () => { loadView(); $("localview").checked = view.local; refreshPages(); });
  const canvas = $("pagemap");
  canvas.addEventListener("mousemove", (ev) => {
    const c = cellAt(ev);
    $("cellinfo").textContent = c ? describeCell(c) : "\u00a0";
  });
  // A click zooms in 8 times around the cell (down to one page a cell).
  canvas.addEventListener("click", (ev) => {
    const c = cellAt(ev);
    const p = view.pages;
    if (!c || !p) return;
    const count = Math.max(Math.min(p.region.pages, 64), Math.ceil(p.page_count / 8));
    zoomTo(c.first_page + c.pages / 2 - count / 2, count);
  });
  $("zoomout").addEventListener("click", () => {
    const p = view.pages;
    if (!p) return;
    const count = p.page_count * 8;
    zoomTo(p.first_page + p.page_count / 2 - count / 2, count);
  });
  $("zoomall").addEventListener("click", () => {
    view.first = 0;
    view.count = 0;
    saveView();
    refreshPages();
  });
  // The next poll starts POLL_MS after one ends: a slow cluster is never
  // asked twice at once.
  const loop = async () => {
    await poll();
    setTimeout(loop, POLL_MS);
  };
  loop();
}

start();
