// pipkie's page: send a document to POST /extract, draw each field's boxes on the page that
// POST /render returns (the page as the service read it), let a person fix values, download JSON.
// Plain browser JavaScript, no build step and no dependency; every URL is relative to the page.
"use strict";

// Confidence under this is marked "low": on SROIE test, the shipped model's values under 0.8 were
// right about 1 time in 3, those above it 3 times in 4 or more (docs/WEB.md).
const LOW_CONFIDENCE = 0.8;
const COLOURS = ["#e6194b", "#2f9e44", "#1c7ed6", "#f08c00", "#9c36b5", "#0c8599", "#d6336c", "#5c940d",
                 "#862e9c", "#e67700"];
const SVG = "http://www.w3.org/2000/svg"; // the namespace of created SVG elements, not a fetch

const $ = (id) => document.getElementById(id);
const state = {
  file: null,       // the File being shown
  result: null,     // the service's Extraction, as answered
  rows: [],         // the table's rows: {key shown, group (one colour), field, path into result.fields}
  values: {},       // key -> the value shown (the person's edit, or the model's)
  colour: {},       // key -> colour
  pages: 1, page: 0,
  images: {},       // page -> object URL of its rendered PNG
  token: 0,         // bumps with every new document: late answers for an older one are dropped
};

function setState(name) { document.body.dataset.state = name; }

function status(text, busy = false) {
  $("status").textContent = text;
  $("status").classList.toggle("busy", busy);
}

// ---- service answers ------------------------------------------------------------------------
class ServiceError extends Error {
  constructor(status, body) {
    super(body.detail);
    this.status = status;
    this.code = body.code;
    this.detail = body.detail;
    this.requestId = body.request_id;
  }
}

async function call(path, form) {
  let res;
  try {
    res = await fetch(path, { method: "POST", body: form });
  } catch (e) {
    throw new ServiceError(0, { code: "network_error", detail: "the service did not answer (is it still running?)",
                                request_id: "" });
  }
  if (res.ok) return res;
  let body;
  try {
    body = await res.json();
  } catch (e) {
    body = { code: "http_" + res.status, detail: res.statusText || "error", request_id: "" };
  }
  throw new ServiceError(res.status, body);
}

function showError(err) {
  if (!(err instanceof ServiceError)) {
    err = new ServiceError(0, { code: "page_error", detail: String(err), request_id: "" });
  }
  $("error-status").textContent = err.status ? String(err.status) : "";
  $("error-code").textContent = err.code;
  $("error-detail").textContent = err.detail;
  $("error-id").textContent = err.requestId ? "request id " + err.requestId : "";
  $("error").hidden = false;
}

function clearError() { $("error").hidden = true; }

// ---- health: the model and its keys -----------------------------------------------------------
let modelKeys = [];

async function loadHealth() {
  try {
    const h = await (await fetch("health")).json();
    modelKeys = h.keys || [];
    $("model").textContent = (h.model || "model") + (h.status === "ok" ? "" : " (" + h.status + ")");
    $("keys").placeholder = modelKeys.length ? modelKeys.join(", ") : "company, date, total";
    const decode = $("decode");
    decode.replaceChildren(...(h.decodes || ["pip"]).map((d) => new Option(d, d)));
    $("defaults").disabled = modelKeys.length === 0;
  } catch (e) {
    $("model").textContent = "service unreachable";
  }
}

// ---- one document -----------------------------------------------------------------------------
function chooseFile(file) {
  if (!file) return;
  state.file = file;
  $("filename").textContent = file.name + " · " + formatBytes(file.size);
  $("extract").disabled = false;
  extract();
}

function formatBytes(n) {
  return n < 1024 ? n + " B" : n < 1048576 ? (n / 1024).toFixed(0) + " KB" : (n / 1048576).toFixed(1) + " MB";
}

async function extract() {
  if (!state.file) return;
  const token = ++state.token;
  clearError();
  setState("busy");
  $("extract").disabled = true;
  status("Reading " + state.file.name + " … (OCR of an image takes a few seconds)", true);
  for (const url of Object.values(state.images)) URL.revokeObjectURL(url);
  Object.assign(state, { result: null, images: {}, pages: 1, page: 0 });

  const form = new FormData();
  form.append("file", state.file);
  const keys = $("keys").value.trim();
  if (keys) form.append("keys", keys);
  form.append("decode", $("decode").value || "pip");
  const t0 = performance.now();
  const pageShown = showPage(0, token);  // the page is drawn while the model reads it
  try {
    const result = await (await call("extract", form)).json();
    const seconds = (performance.now() - t0) / 1000;
    await pageShown;  // its page count names the pages in the table
    if (token !== state.token) return;
    showResult(result, seconds);
    drawBoxes();
    setState("done");
  } catch (err) {
    if (token !== state.token) return;
    showError(err);
    $("results").hidden = true;
    status("No fields: the service refused the document.");
    setState("error");
  } finally {
    if (token === state.token) $("extract").disabled = false;
  }
}

// ---- the page image ---------------------------------------------------------------------------
async function showPage(page, token = state.token) {
  state.page = page;
  updatePager();
  try {
    if (!state.images[page]) {
      const form = new FormData();
      form.append("file", state.file);
      form.append("page", String(page));
      const res = await call("render", form);
      if (token !== state.token) return;
      state.pages = Number(res.headers.get("X-Page-Count")) || 1;
      state.images[page] = URL.createObjectURL(await res.blob());
    }
    if (token !== state.token || state.page !== page) return;
    const img = $("page-image");
    await new Promise((resolve) => {
      img.onload = img.onerror = resolve;
      img.src = state.images[page];
    });
    $("placeholder").hidden = true;
    $("page").hidden = false;
    updatePager();
    drawBoxes();
  } catch (err) {
    if (token !== state.token) return;
    $("page").hidden = true;
    $("placeholder").hidden = false;
    $("placeholder").textContent = err.code === "no_page_image"
      ? "Plain text has no page to show: the fields are in the table."
      : "No page to show: " + (err.detail || err);
  }
}

function updatePager() {
  $("pager").hidden = state.pages < 2;
  $("pageinfo").textContent = "page " + (state.page + 1) + " of " + state.pages;
  $("prev").disabled = state.page <= 0;
  $("next").disabled = state.page >= state.pages - 1;
}

function drawBoxes() {
  const svg = $("overlay");
  svg.replaceChildren();
  if (!state.result) return;
  for (const { key, field } of state.rows) {
    for (const b of field.boxes) {
      if (b.page !== state.page) continue;
      const r = document.createElementNS(SVG, "rect");
      r.setAttribute("x", b.x0);
      r.setAttribute("y", b.y0);
      r.setAttribute("width", Math.max(b.x1 - b.x0, 0.002));
      r.setAttribute("height", Math.max(b.y1 - b.y0, 0.002));
      r.setAttribute("fill", state.colour[key]);
      r.setAttribute("stroke", state.colour[key]);
      r.setAttribute("vector-effect", "non-scaling-stroke");
      r.dataset.key = key;
      r.addEventListener("mouseenter", () => focus(key));
      r.addEventListener("mouseleave", () => focus(null));
      svg.appendChild(r);
    }
  }
}

// ---- the table --------------------------------------------------------------------------------
// One row per flat key; a list of items gives one row per field of each item ("items 2 price"),
// and the fields of one item share a colour (as `pipkie extract --draw` does).
function tableRows(fields) {
  const out = [];
  for (const [key, field] of Object.entries(fields)) {
    if (!Array.isArray(field)) {
      out.push({ key, group: key, field, path: [key] });
      continue;
    }
    field.forEach((item, i) => {
      for (const [name, f] of Object.entries(item)) {
        out.push({ key: key + " " + (i + 1) + " " + name, group: key + " " + (i + 1), field: f, path: [key, i, name] });
      }
    });
  }
  return out;
}

function fieldAt(fields, path) {
  return path.length === 1 ? fields[path[0]] : fields[path[0]][path[1]][path[2]];
}

function showResult(result, seconds) {
  state.result = result;
  state.rows = tableRows(result.fields);
  state.values = {};
  state.colour = {};
  const body = $("fields").tBodies[0];
  body.replaceChildren();
  const groups = [...new Set(state.rows.map((r) => r.group))];
  for (const { key, group, field } of state.rows) {
    state.colour[key] = COLOURS[groups.indexOf(group) % COLOURS.length];
    state.values[key] = field.value;
    body.appendChild(fieldRow(key, field));
  }
  const n = state.rows.length;
  const found = state.rows.filter((r) => r.field.value !== null).length;
  $("doc-name").textContent = result.document;
  $("summary").textContent = found + " of " + n + " fields found · decode " + result.decode + " · model "
    + result.seconds.toFixed(2) + " s, answer in " + seconds.toFixed(1) + " s";
  $("truncated").hidden = !result.truncated;
  $("truncated").textContent = result.truncated
    ? "The document is longer than the model reads at once: " + result.dropped_tokens
      + " tokens from its middle were left out." : "";
  $("results").hidden = false;
  for (const t of body.querySelectorAll("textarea")) fitHeight(t);
  status(found + " of " + n + " fields found in " + result.document + ".");
}

function fieldRow(key, field) {
  const tr = document.createElement("tr");
  tr.dataset.key = key;
  const low = field.value !== null && field.confidence < LOW_CONFIDENCE;
  tr.classList.toggle("low", low);
  tr.classList.toggle("missing", field.value === null);

  const sw = cell(tr, "c-swatch");
  const dot = document.createElement("span");
  dot.className = "swatch";
  dot.style.background = state.colour[key];
  sw.appendChild(dot);

  const k = cell(tr, "c-key");
  k.textContent = key;
  const where = document.createElement("div");
  where.className = "where";
  where.textContent = placeOf(field);
  k.appendChild(where);

  const v = cell(tr, "c-value");
  const input = document.createElement("textarea");  // an address is long: it wraps
  input.className = "value";
  input.rows = 1;
  input.value = field.value ?? "";
  input.placeholder = "not found";
  input.spellcheck = false;
  input.setAttribute("aria-label", "value of " + key);
  input.addEventListener("input", () => { fitHeight(input); edit(key, input.value); });
  input.addEventListener("keydown", (e) => { if (e.key === "Enter") e.preventDefault(); });  // one line of text
  v.appendChild(input);
  const badges = document.createElement("div");
  badges.className = "badges";
  if (low) badges.appendChild(badge("low", "low"));
  const edited = badge("edited", "edited");
  edited.hidden = true;
  badges.appendChild(edited);
  const undo = document.createElement("button");
  undo.type = "button";
  undo.className = "ghost small undo";
  undo.textContent = "undo";
  undo.hidden = true;
  undo.addEventListener("click", () => { input.value = field.value ?? ""; fitHeight(input); edit(key, input.value); });
  badges.appendChild(undo);
  v.appendChild(badges);

  const c = cell(tr, "c-conf");
  // rounded down (the service gives 4 decimals): 0.7999 reads 79 %, as "low" says, and 0.995 not 100 %
  const pct = Math.floor(Math.round(field.confidence * 10000) / 100);
  const bar = document.createElement("div");
  bar.className = "meter";
  const fill = document.createElement("span");
  fill.style.width = pct + "%";
  bar.appendChild(fill);
  const num = document.createElement("span");
  num.className = "pct";
  num.textContent = pct + " %";
  c.append(num, bar);

  tr.addEventListener("mouseenter", () => focus(key));
  tr.addEventListener("mouseleave", () => focus(null));
  tr.addEventListener("click", (e) => {
    const first = field.boxes[0];
    if (e.target.tagName !== "TEXTAREA" && e.target.tagName !== "BUTTON" && first && first.page !== state.page) {
      showPage(first.page);
    }
  });
  return tr;
}

function fitHeight(textarea) {
  textarea.style.height = "auto";
  textarea.style.height = textarea.scrollHeight + 2 + "px";
}

function placeOf(field) {
  if (field.value === null) return "not in the document";
  if (!field.boxes.length) return "not located on the page";
  const pages = [...new Set(field.boxes.map((b) => b.page + 1))];
  const words = field.boxes.length + (field.boxes.length === 1 ? " word" : " words");
  return words + (state.pages > 1 ? ", page " + pages.join(", ") : "");
}

function cell(tr, cls) {
  const td = document.createElement("td");
  td.className = cls;
  tr.appendChild(td);
  return td;
}

function badge(text, cls) {
  const b = document.createElement("span");
  b.className = "badge " + cls;
  b.textContent = text;
  return b;
}

function edit(key, text) {
  const original = state.rows.find((r) => r.key === key).field.value;
  const value = text.trim() === "" ? null : text;
  state.values[key] = value;
  const tr = document.querySelector('tr[data-key="' + CSS.escape(key) + '"]');
  const changed = value !== original;
  tr.classList.toggle("edited", changed);
  tr.querySelector(".badge.edited").hidden = !changed;
  tr.querySelector(".undo").hidden = !changed;
}

function focus(key) {
  $("overlay").classList.toggle("focus", key !== null);
  for (const r of $("overlay").querySelectorAll("rect")) r.classList.toggle("hl", r.dataset.key === key);
  for (const tr of $("fields").tBodies[0].rows) tr.classList.toggle("hl", tr.dataset.key === key);
}

// ---- download ---------------------------------------------------------------------------------
function withEdits() {
  // The service's JSON with the person's values: each field says whether it was edited; an edited
  // one keeps the model's answer as model_value (its confidence and boxes are the model's).
  const out = JSON.parse(JSON.stringify(state.result));
  for (const { key, path } of state.rows) {
    const field = fieldAt(out.fields, path);
    field.edited = state.values[key] !== field.value;
    if (field.edited) {
      field.model_value = field.value;
      field.value = state.values[key];
    }
  }
  return out;
}

function download() {
  const blob = new Blob([JSON.stringify(withEdits(), null, 2) + "\n"], { type: "application/json" });
  const a = document.createElement("a");
  a.href = URL.createObjectURL(blob);
  a.download = (state.result.document || "document") + ".json";
  document.body.appendChild(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(a.href), 10000);
}

// ---- zoom: the page fits the viewer's height, or is shown larger (scrolled) ---------------------
let zoom = 1;

function setZoom(z) {
  zoom = Math.min(4, Math.max(1, z));
  $("page").style.height = zoom * 100 + "%";
  $("zoom-out").disabled = $("zoom-fit").disabled = zoom === 1;
  $("zoom-in").disabled = zoom === 4;
}

// ---- wiring -----------------------------------------------------------------------------------
function init() {
  $("low-threshold").textContent = String(Math.round(LOW_CONFIDENCE * 100));
  $("file").addEventListener("change", (e) => chooseFile(e.target.files[0]));
  const drop = $("drop");
  for (const ev of ["dragenter", "dragover"]) {
    drop.addEventListener(ev, (e) => { e.preventDefault(); drop.classList.add("over"); });
  }
  for (const ev of ["dragleave", "drop"]) {
    drop.addEventListener(ev, (e) => { e.preventDefault(); drop.classList.remove("over"); });
  }
  // a file dropped anywhere on the page (the box included) is read; the browser must not leave the
  // page to open it
  window.addEventListener("dragover", (e) => e.preventDefault());
  window.addEventListener("drop", (e) => { e.preventDefault(); chooseFile(e.dataTransfer?.files[0]); });
  $("form").addEventListener("submit", (e) => { e.preventDefault(); extract(); });
  $("defaults").addEventListener("click", () => { $("keys").value = modelKeys.join(", "); });
  $("download").addEventListener("click", download);
  $("prev").addEventListener("click", () => showPage(state.page - 1));
  $("next").addEventListener("click", () => showPage(state.page + 1));
  $("zoom-in").addEventListener("click", () => setZoom(zoom * 1.5));
  $("zoom-out").addEventListener("click", () => setZoom(zoom / 1.5));
  $("zoom-fit").addEventListener("click", () => setZoom(1));
  setZoom(1);
  loadHealth();
}

init();
