// The observer's page: polls the JSON API once a second and redraws the page the address names
// (#/ overview, #/process/<pid>, #/app/<name>, #/ets, #/charts). Actions (kill, restart a child,
// scale the dirty pool) show only when the node allows them; they send the token given in the
// address (#token=...) or typed in the header, kept for this tab only (sessionStorage).
"use strict";
const seen = new Map();      // child path -> last pid drawn
const flashed = new Map();   // child path -> until when it shows as restarted (ms)
const handled = new Map();   // pid -> [time, messages handled] (for msgs/s)
const FLASH_MS = 4000;
let sortKey = "message_queue_len";
let actions = { enabled: false, actions: [] };

function el(tag, attrs, text) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  if (text !== undefined) e.textContent = text;
  return e;
}

async function getJSON(path) {
  const r = await fetch(path);
  return [r.status, await r.json()];
}

function pidLink(pid) {
  if (typeof pid !== "string" || !pid.startsWith("<")) return el("span", {}, String(pid ?? ""));
  return el("a", { href: "#/process/" + encodeURIComponent(pid), class: "pid" }, pid);
}

// --- actions --------------------------------------------------------------------------------

function token() { return sessionStorage.getItem("observerToken") || ""; }

function takeTokenFromAddress() {
  const m = location.hash.match(/^#token=([^&]+)/);
  if (m) {
    sessionStorage.setItem("observerToken", decodeURIComponent(m[1]));
    history.replaceState(null, "", location.pathname + "#/");
  }
}

function showResult(text, ok) {
  const box = document.getElementById("action-result");
  box.textContent = text;
  box.className = ok ? "ok" : "refused";
  box.hidden = false;
}

async function act(name, body, what) {
  if (!confirm(what + "?")) return;
  const r = await fetch("/api/actions/" + name, {
    method: "POST",
    headers: { "content-type": "application/json", authorization: "Bearer " + token() },
    body: JSON.stringify(body),
  });
  const answer = await r.json();
  showResult(r.ok ? `${what}: done` : `${what}: refused (${r.status}): ${answer.message}`, r.ok);
  await refresh();
}

function actionButton(label, name, body, what) {
  const b = el("button", { type: "button", class: "action", "data-action": name, title: what }, label);
  b.addEventListener("click", (ev) => { ev.preventDefault(); ev.stopPropagation(); act(name, body, what); });
  return b;
}

function drawActionsState() {
  const box = document.getElementById("actions-state");
  if (!actions.enabled) { box.replaceChildren(el("span", { title: actions.message || "" }, "read-only")); return; }
  if (box.querySelector("input")) return;
  const form = el("form", { id: "token-form" });
  const input = el("input", { type: "password", placeholder: "actions token", id: "token", size: "14",
    autocomplete: "off" });
  input.value = token();
  input.addEventListener("change", () => sessionStorage.setItem("observerToken", input.value.trim()));
  form.addEventListener("submit", (ev) => { ev.preventDefault(); input.blur(); });
  form.append(el("span", {}, "actions on "), input);
  box.replaceChildren(form);
}

// --- overview: the tree and the process table ------------------------------------------------

function drawSupervisor(view, path) {
  const ul = el("ul", { class: "tree" });
  const now = performance.now();
  view.children.forEach((child, index) => {
    const dynamic = child.id === null;  // (a dynamic supervisor's children have no id)
    const key = path + "/" + (dynamic ? "#" + index : child.id);
    const li = el("li");
    const running = typeof child.pid === "string" && child.pid.startsWith("<");
    const before = seen.get(key);
    if (before !== undefined && before !== child.pid) flashed.set(key, now + FLASH_MS);
    seen.set(key, child.pid);
    const restarted = (flashed.get(key) || 0) > now;
    const label = el("span", {
      class: "node " + child.type + (running ? "" : " down") + (restarted ? " flash" : ""),
      "data-child": key, "data-pid": String(child.pid),
    });
    if (restarted) label.dataset.restarted = "1";
    label.append(el("span", { class: "id" }, (dynamic ? "(dynamic child)" : String(child.id)) + " "),
      pidLink(child.pid));
    if (child.restarts) label.append(el("span", { class: "restarts" }, ` restarted ${child.restarts}×`));
    li.append(label);
    if (actions.enabled && !dynamic) {
      li.append(actionButton("restart", "restart_child", { supervisor: view.pid, child: String(child.id) },
        `restart ${key}`));
    }
    if (child.supervisor) li.append(drawSupervisor(child.supervisor, key));
    ul.append(li);
  });
  return ul;
}

function drawTree(tree) {
  const root = el("ul", { class: "tree" });
  for (const app of tree.applications) {
    const li = el("li");
    const r = app.root;
    const label = el("a", { class: "node supervisor", "data-app": app.name, href: "#/app/" + encodeURIComponent(app.name) },
      r ? `${app.name} (${r.strategy}, restarts ${r.restarts_total})` : app.name);
    li.append(label);
    if (r) li.append(drawSupervisor(r, app.name));
    root.append(li);
  }
  document.getElementById("tree").replaceChildren(root);
}

async function drawProcesses() {
  const now = performance.now() / 1000;
  const rows = (await getJSON("/api/processes"))[1].processes;
  for (const p of rows) {
    const last = handled.get(p.pid);
    p.rate = last ? (p.messages_handled - last[1]) / Math.max(now - last[0], 1e-3) : 0;
    handled.set(p.pid, [now, p.messages_handled]);
  }
  rows.sort((a, b) => {
    const x = a[sortKey], y = b[sortKey];
    return typeof x === "number" ? y - x : String(x ?? "").localeCompare(String(y ?? ""));
  });
  const body = document.querySelector("#processes tbody");
  body.replaceChildren(...rows.map((p) => {
    const tr = el("tr", { "data-pid": p.pid });
    tr.append(el("td").appendChild(pidLink(p.pid)).parentNode);
    for (const v of [p.registered_name ?? "", p.behaviour ?? p.initial_call ?? "", p.message_queue_len,
                     p.rate.toFixed(1), p.memory]) tr.append(el("td", {}, String(v)));
    tr.addEventListener("click", () => { location.hash = "#/process/" + encodeURIComponent(p.pid); });
    return tr;
  }));
}

// --- one process ---------------------------------------------------------------------------

const FIELDS = ["pid", "registered_name", "status", "message_queue_len", "messages_handled", "trap_exit",
  "behaviour", "initial_call", "parent", "start_time", "memory"];

function pidList(items) {
  const ul = el("ul", { class: "pids" });
  for (const item of items) {
    const li = el("li");
    li.append(typeof item === "string" ? pidLink(item) : el("span", {}, JSON.stringify(item)));
    ul.append(li);
  }
  if (!items.length) ul.append(el("li", { class: "none" }, "none"));
  return ul;
}

async function drawProcess(pid) {
  const box = document.getElementById("process-detail");
  const [status, p] = await getJSON("/api/processes/" + encodeURIComponent(pid));
  box.dataset.pid = pid;
  if (status !== 200) {
    box.replaceChildren(el("h2", {}, `process ${pid}`), el("p", { class: "gone", "data-error": p.error }, p.message));
    return;
  }
  const title = el("h2", {}, `process ${p.pid} ${p.registered_name ?? ""}`);
  if (actions.enabled) title.append(actionButton("kill", "kill", { pid: p.pid }, `kill ${p.pid}`));
  const table = el("table", { class: "fields" });
  for (const f of FIELDS) {
    const tr = el("tr", { "data-field": f });
    tr.append(el("th", {}, f.replaceAll("_", " ")));
    const td = el("td");
    td.append(f === "pid" || f === "parent" ? pidLink(p[f]) : el("span", {}, String(p[f] ?? "")));
    tr.append(td);
    table.append(tr);
  }
  const mailbox = el("ol", { class: "mailbox" });
  for (const m of p.mailbox_head) mailbox.append(el("li").appendChild(el("code", {}, m)).parentNode);
  if (!p.mailbox_head.length) mailbox.append(el("li", { class: "none" }, "empty"));
  const links = pidList(p.links); links.id = "links";
  const monitors = pidList(p.monitors); monitors.id = "monitors";
  const monitoredBy = pidList(p.monitored_by); monitoredBy.id = "monitored-by";
  box.replaceChildren(title, table,
    el("h3", {}, "links"), links, el("h3", {}, "monitors"), monitors,
    el("h3", {}, "monitored by"), monitoredBy,
    el("h3", {}, `mailbox head (${p.mailbox_head.length} of ${p.message_queue_len})`), mailbox);
}

// --- applications: their trees' roots and their own views, drawn generically ----------------

function isObj(v) { return v !== null && typeof v === "object" && !Array.isArray(v); }

function cell(v) {
  if (v === null || v === undefined) return el("span", { class: "none" }, "–");
  if (typeof v === "string" && v.startsWith("<") && v.endsWith(">")) return pidLink(v);
  if (Array.isArray(v) && !v.length) return el("span", { class: "none" }, "none");
  if (Array.isArray(v) && v.every((x) => !isObj(x) && !Array.isArray(x))) return el("span", {}, v.join(", "));
  if (isObj(v) || Array.isArray(v)) return renderValue(v);
  return el("span", {}, typeof v === "number" && !Number.isInteger(v) ? v.toFixed(3) : String(v));
}

function tableOf(rows, firstColumn) {
  const columns = [];
  for (const [, row] of rows) for (const k of Object.keys(row)) if (!columns.includes(k)) columns.push(k);
  const table = el("table", { class: "view" });
  const head = el("tr");
  if (firstColumn) head.append(el("th", {}, firstColumn));
  for (const c of columns) head.append(el("th", {}, c.replaceAll("_", " ")));
  table.append(el("thead").appendChild(head).parentNode);
  const body = el("tbody");
  for (const [key, row] of rows) {
    const tr = el("tr");
    if (firstColumn) tr.append(el("td", {}, key));
    for (const c of columns) tr.append(el("td").appendChild(cell(row[c])).parentNode);
    body.append(tr);
  }
  table.append(body);
  return table;
}

// Lists of records and maps of records become tables; other maps become key/value tables.
function renderValue(v) {
  if (Array.isArray(v)) {
    if (v.length && v.every(isObj)) return tableOf(v.map((r, i) => [String(i), r]), null);
    return cell(v);
  }
  if (isObj(v)) {
    const entries = Object.entries(v);
    if (entries.length && entries.every(([, x]) => isObj(x))) return tableOf(entries, "name");
    const table = el("table", { class: "fields" });
    for (const [k, x] of entries) {
      const tr = el("tr", { "data-key": k });
      tr.append(el("th", {}, k.replaceAll("_", " ")), el("td").appendChild(cell(x)).parentNode);
      table.append(tr);
    }
    if (!entries.length) table.append(el("tr").appendChild(el("td", { class: "none" }, "none")).parentNode);
    return table;
  }
  return cell(v);
}

function drawApp(name, tree) {
  const box = document.getElementById("app-detail");
  box.dataset.app = name;
  const app = tree.applications.find((a) => a.name === name);
  if (!app) { box.replaceChildren(el("h2", {}, name), el("p", { class: "gone" }, `no application ${name} runs`)); return; }
  const parts = [el("h2", {}, `${app.name} ${app.version}`), el("p", {}, app.description)];
  const r = app.root;
  if (r) {
    parts.push(el("h3", {}, "root supervisor"), renderValue({
      pid: r.pid, strategy: r.strategy, intensity: `${r.intensity} restarts in ${r.period} s`,
      children: r.children.length, restarts_in_window: r.restarts_in_window, restarts_total: r.restarts_total,
      last_restart_reason: r.last_restart_reason,
    }));
  }
  if (app.name === "dirty" && actions.enabled) {
    parts.push(el("p", { class: "scale" }, "workers: "),);
    parts[parts.length - 1].append(
      actionButton("+1 worker", "scale_dirty", { change: "add", count: 1 }, "add a dirty worker (TTIN)"),
      actionButton("−1 worker", "scale_dirty", { change: "remove", count: 1 }, "remove a dirty worker (TTOU)"));
  }
  const view = app.view;
  if (view === null) parts.push(el("p", { class: "none" }, "this application shows no view of its own"));
  else {
    for (const [k, v] of Object.entries(view)) {
      const section = el("div", { class: "view-part", "data-view": k });
      section.append(el("h3", {}, k.replaceAll("_", " ")));
      section.append(k === "calls" && isObj(v) ? drawCalls(v) : renderValue(v));
      parts.push(section);
    }
  }
  box.replaceChildren(...parts);
}

// The dirty pool's call counters: totals, errors by kind, and the latency histogram's quantiles.
function quantile(hist, q) {
  const want = q * hist.count;
  for (const [le, n] of hist.buckets) if (n >= want) return typeof le === "string" ? Infinity : le;
  return null;
}

function drawCalls(calls) {
  const h = calls.latency_seconds || { buckets: [], sum: 0, count: 0 };
  const last = h.buckets.filter(([le]) => typeof le === "number").pop();
  const ms = (s) => (s === null || s === undefined ? "–"
    : isFinite(s) ? `≤ ${short(s * 1000)} ms` : `> ${last ? short(last[0] * 1000) : "?"} ms`);
  return renderValue({
    total: calls.total, errors: calls.errors || {},
    latency_mean: h.count ? `${short((h.sum / h.count) * 1000)} ms` : "–",
    latency_p50: h.count ? ms(quantile(h, 0.5)) : "–",
    latency_p99: h.count ? ms(quantile(h, 0.99)) : "–",
  });
}

// --- ETS tables and charts -------------------------------------------------------------------

async function drawTables() {
  const tables = (await getJSON("/api/tables"))[1].tables;
  tables.sort((a, b) => b.memory - a.memory);
  document.querySelector("#ets tbody").replaceChildren(...tables.map((t) => {
    const tr = el("tr", { "data-table": t.name });
    for (const v of [t.name, t.type, t.access]) tr.append(el("td", {}, String(v)));
    tr.append(el("td").appendChild(pidLink(t.owner)).parentNode);
    for (const v of [t.size, t.memory]) tr.append(el("td", {}, String(v)));
    tr.append(el("td").appendChild(pidLink(t.heir)).parentNode);
    tr.append(el("td", {}, t.expire_after === null ? "" : `${t.expire_after} s`));
    return tr;
  }));
}

async function drawCharts() {
  const s = (await getJSON("/api/series"))[1];
  document.getElementById("charts-note").textContent = s.message || `(one point every ${s.interval} s)`;
  // The chart spans the points there are (a minute at least, the ring's window at most).
  const now = s.now ?? 0, oldest = s.t.length ? now - s.t[0] : 0;
  const span = Math.max(60, Math.min(Math.ceil(oldest / 60) * 60, s.window * (s.interval || 1)));
  const v = s.series, ms = (xs) => xs.map((x) => (x === null ? null : x * 1000));
  document.getElementById("charts").replaceChildren(
    lineChart("messages", "messages/s", "messages handled per second", s.t, now, span,
      [{ name: "messages/s", color: "#2a6fb0", values: v.messages_per_second }]),
    lineChart("restarts", "restarts/s", "restarts per second, all supervisors", s.t, now, span,
      [{ name: "restarts/s", color: "#c0392b", values: v.restarts_per_second }]),
    lineChart("dirty-calls", "dirty calls/s", "dirty pool calls per second", s.t, now, span,
      [{ name: "calls/s", color: "#27864a", values: v.dirty_calls_per_second },
       { name: "errors/s", color: "#c0392b", values: v.dirty_errors_per_second }]),
    lineChart("dirty-latency", "dirty latency", "milliseconds", s.t, now, span,
      [{ name: "mean", color: "#8e44ad", values: ms(v.dirty_latency_mean_seconds) },
       { name: "p99", color: "#e67e22", values: ms(v.dirty_latency_p99_seconds) }]));
}

// --- the loop --------------------------------------------------------------------------------

function route() {
  const h = decodeURIComponent(location.hash.replace(/^#\/?/, ""));
  const [page, ...rest] = h.split("/");
  return { page: page || "overview", arg: rest.join("/") };
}

async function refresh() {
  takeTokenFromAddress();
  const { page, arg } = route();
  const shown = { overview: "overview", process: "process", app: "app", ets: "ets", charts: "charts" }[page] || "overview";
  for (const p of document.querySelectorAll(".page")) p.hidden = p.id !== "page-" + shown;
  actions = (await getJSON("/api/actions"))[1];
  drawActionsState();
  const tree = (await getJSON("/api/tree"))[1];
  document.getElementById("node").textContent = tree.node;
  const links = document.getElementById("app-links");
  const names = tree.applications.map((a) => a.name);
  if (links.dataset.names !== names.join("\n")) {  // (redrawn only when they change: clicks hold)
    links.dataset.names = names.join("\n");
    links.replaceChildren(...names.map((name) =>
      el("a", { href: "#/app/" + encodeURIComponent(name), "data-page": "app:" + name }, name)));
  }
  for (const a of document.querySelectorAll("#nav a")) {
    a.classList.toggle("here", a.dataset.page === (shown === "app" ? "app:" + arg : shown));
  }
  if (shown === "overview") { drawTree(tree); await drawProcesses(); }
  else if (shown === "process") await drawProcess(arg);
  else if (shown === "app") drawApp(arg, tree);
  else if (shown === "ets") await drawTables();
  else await drawCharts();
  document.body.dataset.page = shown;
}

for (const th of document.querySelectorAll("th[data-sort]")) {
  th.addEventListener("click", () => { sortKey = th.dataset.sort; refresh(); });
}
window.addEventListener("hashchange", () => { refresh(); });
async function loop() {
  try { await refresh(); document.body.dataset.ready = "1"; } catch (e) { console.error(e); }
  setTimeout(loop, 1000);
}
loop();
