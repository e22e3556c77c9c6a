// The observer's page: polls the JSON API once a second and redraws the tree and the table.
"use strict";
const seen = new Map();      // child path -> last pid (a change flashes: a restart)
const handled = new Map();   // pid -> [time, messages handled] (for msgs/s)
let sortKey = "message_queue_len";

function el(tag, attrs, text) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  if (text !== undefined) e.textContent = text;
  return e;
}

function drawSupervisor(view, path) {
  const ul = el("ul", { class: "tree" });
  for (const child of view.children) {
    const key = path + "/" + child.id;
    const li = el("li");
    const running = typeof child.pid === "string" && child.pid.startsWith("<");
    const label = el("span", {
      class: "node " + child.type + (running ? "" : " down"),
      "data-child": key, "data-pid": String(child.pid),
    }, `${child.id} ${child.pid}`);
    const before = seen.get(key);
    if (before !== undefined && before !== child.pid) label.classList.add("flash");
    seen.set(key, child.pid);
    li.append(label);
    if (child.supervisor) li.append(drawSupervisor(child.supervisor, key));
    ul.append(li);
  }
  return ul;
}

async function refresh() {
  const tree = await (await fetch("/api/tree")).json();
  document.getElementById("node").textContent = tree.node;
  const root = el("ul", { class: "tree" });
  for (const app of tree.applications) {
    const li = el("li");
    const r = app.root;
    li.append(el("span", { class: "node supervisor", "data-app": app.name },
      r ? `${app.name} (${r.strategy}, restarts ${r.restarts_total})` : app.name));
    if (r) li.append(drawSupervisor(r, app.name));
    root.append(li);
  }
  document.getElementById("tree").replaceChildren(root);

  const now = performance.now() / 1000;
  const rows = (await (await fetch("/api/processes")).json()).processes;
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
    for (const v of [p.pid, p.registered_name ?? "", p.behaviour ?? "", p.message_queue_len,
                     p.rate.toFixed(1), p.memory]) tr.append(el("td", {}, String(v)));
    return tr;
  }));
}

for (const th of document.querySelectorAll("th[data-sort]")) {
  th.addEventListener("click", () => { sortKey = th.dataset.sort; refresh(); });
}
async function loop() {
  try { await refresh(); document.body.dataset.ready = "1"; } catch (e) { console.error(e); }
  setTimeout(loop, 1000);
}
loop();
