// The Kafscale console: one page, no framework, nothing loaded from elsewhere; the pages are in pages.js. Every
// value shown is put in with textContent (never as HTML), so a topic or a message cannot inject markup.
"use strict";

const REFRESH_MS = 5000;
let csrf = null;
let timer = null;
let current = null; // the page on screen: {refresh(), stop?()}

function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else if (v === true) el.setAttribute(k, "");
    else if (v !== false && v !== null && v !== undefined) el.setAttribute(k, v);
  }
  for (const c of children.flat()) el.append(c instanceof Node ? c : document.createTextNode(c ?? ""));
  return el;
}

function table(headers, rows, testid) {
  return h("table", {"data-testid": testid},
    h("thead", {}, h("tr", {}, headers.map(([label, cls]) => h("th", {class: cls || ""}, label)))),
    h("tbody", {}, rows.map(r => h("tr", {}, r.map((cell, i) =>
      h("td", {class: headers[i][1] || ""}, cell))))));
}

async function api(method, path, body) {
  const init = {method, headers: {}, credentials: "same-origin"};
  if (method !== "GET") init.headers["X-CSRF-Token"] = csrf || "";
  if (body !== undefined) { init.headers["Content-Type"] = "application/json"; init.body = JSON.stringify(body); }
  const res = await fetch(path, init);
  const data = await res.json().catch(() => ({error: `HTTP ${res.status}`}));
  if (res.status === 401 && path !== "/api/login") { showLogin(); throw new Error(data.error); }
  if (!res.ok) throw new Error(data.error || `HTTP ${res.status}`);
  return data;
}

function flash(text, bad) {
  const el = document.getElementById("flash");
  el.textContent = text;
  el.className = bad ? "flash bad" : "flash";
  el.hidden = false;
}

async function act(what, fn) {
  try { const r = await fn(); flash(what); if (current) current.refresh(); return r; }
  catch (e) { flash(e.message, true); return null; }
}

function pairs(text) { // "a=b" lines to an object
  const out = {};
  for (const line of text.split("\n")) {
    const i = line.indexOf("=");
    if (line.trim() && i > 0) out[line.slice(0, i).trim()] = line.slice(i + 1).trim();
  }
  return out;
}

function decode(b64, how) {
  if (b64 === null || b64 === undefined) return h("span", {class: "muted"}, "null");
  const bytes = Uint8Array.from(atob(b64), c => c.charCodeAt(0));
  if (how === "hex") return h("pre", {}, Array.from(bytes, b => b.toString(16).padStart(2, "0")).join(" "));
  const text = new TextDecoder("utf-8", {fatal: false}).decode(bytes);
  if (how === "json") {
    try { return h("pre", {}, JSON.stringify(JSON.parse(text), null, 2)); }
    catch { return h("pre", {class: "error"}, "not JSON: " + text); }
  }
  return h("pre", {}, text);
}

function when(ms) { // a record's timestamp; one outside what a Date can hold is shown as it is
  const d = new Date(ms);
  return Number.isFinite(d.getTime()) && ms >= 0 ? d.toISOString() : String(ms);
}

const num = v => (v === null || v === undefined) ? "-" : String(v);

function bytes(n) { // a size as people read it: 1.5 MiB; "-" when unknown
  if (n === null || n === undefined) return "-";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return i === 0 ? `${n} B` : `${n.toFixed(1)} ${units[i]}`;
}

function sparkline(values, testid) { // an SVG line of the last values (lag over time)
  if (values.length === 1) values = [values[0], values[0]]; // one sample: a level line
  const w = 320, ht = 60, max = Math.max(1, ...values);
  const ns = "http://www.w3.org/2000/svg";
  const svg = document.createElementNS(ns, "svg");
  svg.setAttribute("width", w); svg.setAttribute("height", ht); svg.setAttribute("class", "chart");
  svg.setAttribute("data-testid", testid);
  const pts = values.map((v, i) => `${(i / Math.max(1, values.length - 1)) * (w - 4) + 2},${ht - 2 - (v / max) * (ht - 4)}`);
  const line = document.createElementNS(ns, "polyline");
  line.setAttribute("points", pts.join(" ")); line.setAttribute("fill", "none");
  line.setAttribute("stroke", "#2f6fde"); line.setAttribute("stroke-width", "2");
  svg.append(line);
  return svg;
}

let links = {};
function rayLink(status) { // the shard's actor in the Ray dashboard: its logs, stack and flame graph are there
  if (!links.ray_dashboard || !status.pid) return "-";
  const page = /^[0-9a-f]+$/.test(status.actor_id || "") ? `actors/${status.actor_id}` : "actors";
  return h("a", {href: `${links.ray_dashboard}/#/${page}`, target: "_blank", rel: "noopener"}, `actor pid ${status.pid}`);
}

function confirmDelete(what, name, doDelete) { // the name typed again, as the API asks
  const input = h("input", {placeholder: `type ${name} to confirm`, "data-testid": "confirm-name"});
  return h("form", {class: "inline", onsubmit: async e => {
    e.preventDefault();
    if (input.value !== name) { flash(`type the ${what}'s name to delete it`, true); return; }
    await doDelete();
  }}, input, h("button", {class: "danger", type: "submit", "data-testid": "delete"}, `Delete ${what}`));
}


// ---------------------------------------------------------------- routing and login

async function route() {
  if (timer) clearInterval(timer);
  const [, page, arg] = (location.hash || "#/overview").split("/");
  const main = document.getElementById("page");
  main.replaceChildren();
  document.getElementById("flash").hidden = true;
  const name = arg ? decodeURIComponent(arg) : null;
  const kind = name ? page.replace(/s$/, "") : page;
  const make = Object.hasOwn(pages, kind) ? pages[kind] : pages.overview;
  document.querySelectorAll("nav a[data-page]").forEach(a => a.classList.toggle("active", a.dataset.page === page));
  current = make(main, name);
  const refresh = current.refresh.bind(current);
  current.refresh = async () => { try { await refresh(); } catch (e) { flash(e.message, true); } };
  await current.refresh();
  timer = setInterval(() => current.refresh(), REFRESH_MS);
}

function showLogin(disabled) {
  if (timer) clearInterval(timer);
  document.getElementById("app").hidden = true;
  document.getElementById("login").hidden = false;
  const warning = document.getElementById("login-disabled");
  if (disabled) { warning.textContent = disabled; warning.hidden = false; }
}

function showApp(session) {
  csrf = session.csrf;
  document.getElementById("login").hidden = true;
  document.getElementById("app").hidden = false;
  document.getElementById("whoami").textContent = session.username;
  const ray = document.getElementById("ray-dashboard");
  links = session.links || {};
  if (links.ray_dashboard) { ray.href = links.ray_dashboard; ray.hidden = false; }
  route();
}

async function start() {
  const session = await api("GET", "/api/session");
  if (session.logged_in) showApp(session); else showLogin(session.login_disabled);
  document.getElementById("login-form").addEventListener("submit", async e => {
    e.preventDefault();
    const err = document.getElementById("login-error");
    err.textContent = "";
    try {
      const s = await api("POST", "/api/login", {username: document.getElementById("username").value,
                                                 password: document.getElementById("password").value});
      const again = await api("GET", "/api/session");
      showApp({...s, links: again.links});
    } catch (ex) { err.textContent = ex.message; }
  });
  document.getElementById("logout").addEventListener("click", async () => {
    await api("POST", "/api/logout").catch(() => null);
    csrf = null;
    showLogin();
  });
  window.addEventListener("hashchange", () => { if (csrf) route(); });
}

start();
