// Small hand-written SVG line charts for the observer (no library: nodes run on closed networks).
"use strict";
const SVG = "http://www.w3.org/2000/svg";
const W = 560, H = 150, LEFT = 52, RIGHT = 8, TOP = 8, BOTTOM = 22;

function svg(tag, attrs, text) {
  const e = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, String(v));
  if (text !== undefined) e.textContent = text;
  return e;
}

function niceMax(value) {
  if (!(value > 0)) return 1;
  const p = Math.pow(10, Math.floor(Math.log10(value)));
  for (const m of [1, 2, 2.5, 5, 10]) if (m * p >= value) return m * p;
  return 10 * p;
}

function short(v) {
  if (v === 0) return "0";
  if (Math.abs(v) >= 1000) return (v / 1000).toFixed(v >= 10000 ? 0 : 1) + "k";
  if (Math.abs(v) < 0.01) return v.toExponential(0);
  return String(+v.toPrecision(3));
}

// One chart: `lines` is [{name, color, values}] over the times `t` (seconds, `now` the right
// edge, `span` seconds wide); null values leave gaps. Returns a <figure>.
function lineChart(id, title, unit, t, now, span, lines) {
  const fig = document.createElement("figure");
  fig.className = "chart";
  fig.dataset.chart = id;
  const cap = document.createElement("figcaption");
  cap.textContent = title;
  fig.append(cap);
  const box = svg("svg", { viewBox: `0 0 ${W} ${H}`, role: "img", "aria-label": title });
  const plotW = W - LEFT - RIGHT, plotH = H - TOP - BOTTOM;
  let max = 0, points = 0;
  for (const line of lines) for (const v of line.values) if (v !== null) { max = Math.max(max, v); points++; }
  fig.dataset.points = String(points);
  const top = niceMax(max);
  const x = (ti) => LEFT + plotW * (1 - (now - ti) / span);
  const y = (v) => TOP + plotH * (1 - v / top);
  for (const f of [0, 0.5, 1]) {
    box.append(svg("line", { x1: LEFT, x2: W - RIGHT, y1: y(top * f), y2: y(top * f), class: "grid" }));
    box.append(svg("text", { x: LEFT - 4, y: y(top * f) + 4, "text-anchor": "end" }, short(top * f)));
  }
  box.append(svg("text", { x: LEFT, y: H - 6 }, `−${Math.round(span / 60)} min`));
  box.append(svg("text", { x: W - RIGHT, y: H - 6, "text-anchor": "end" }, "now"));
  box.append(svg("text", { x: LEFT + plotW / 2, y: H - 6, "text-anchor": "middle" }, unit));
  for (const line of lines) {
    let d = "", pen = false;
    line.values.forEach((v, i) => {
      if (v === null || now - t[i] > span) { pen = false; return; }
      d += `${pen ? "L" : "M"}${x(t[i]).toFixed(1)},${y(v).toFixed(1)}`;
      pen = true;
    });
    if (d) box.append(svg("path", { d, stroke: line.color, class: "series", "data-series": line.name }));
  }
  fig.append(box);
  const legend = document.createElement("div");
  legend.className = "legend";
  for (const line of lines) {
    const last = [...line.values].reverse().find((v) => v !== null);
    const item = document.createElement("span");
    item.style.borderColor = line.color;
    item.textContent = `${line.name}: ${last === undefined ? "no data yet" : short(last)}`;
    legend.append(item);
  }
  fig.append(legend);
  if (points === 0) {
    const empty = document.createElement("p");
    empty.className = "empty";
    empty.textContent = "no data yet";
    fig.append(empty);
  }
  return fig;
}
