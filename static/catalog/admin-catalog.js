// The admin's catalog: "Preload now" and "Unload now" run from the page, each selected row showing
// its load live as /load_model streams it (stage, then tensors and bytes), or its unload, and
// the row's status, "loaded on" and "last used" cells read again when it is done. Without this
// script (or for "select all across pages") they are the plain admin actions.
//
// A module: the requests, their errors and the SSE stream are the pages' own (webui/js/api.js), the CSRF
// token the changelist form's.
import { apiFetch, apiJSON, problemOf, streamSSE } from "../webui/js/api.js";

const LIVE = { preload_now: "load", unload_now: "unload" };
const REREAD_CELLS = ["field-status", "field-loaded_on", "field-last_used"];

/** Bytes as the admin's size column writes them (filesizeformat: KB, MB, GB of 1024). */
function size(bytes) {
  const units = ["bytes", "KB", "MB", "GB", "TB"];
  let value = bytes;
  let unit = 0;
  while (value >= 1024 && unit < units.length - 1) {
    value /= 1024;
    unit += 1;
  }
  return unit === 0 ? `${value} bytes` : `${value.toFixed(1)} ${units[unit]}`;
}

/** What a /load_model progress event says, for people: the stage, then how far and how many bytes. */
function describe(event, modelBytes) {
  const p = event.progress || {};
  if (event.stage === "download" && p.total) return `downloading: ${size(p.current)} of ${size(p.total)}`;
  if (event.stage === "download") return "downloading";
  if (event.stage === "weights" && p.total) {
    const bytes = modelBytes ? `, ≈ ${size(Math.round((modelBytes * p.current) / p.total))} of ${size(modelBytes)}` : "";
    return `weights: ${p.current}/${p.total} tensors${bytes}`;
  }
  return `loading: ${event.stage || "starting"}`;
}

function messageList() {
  let list = document.querySelector("ul.messagelist.live");
  if (!list) {
    list = document.createElement("ul");
    list.className = "messagelist live";
    const region = document.createElement("div");
    region.setAttribute("role", "status");
    region.append(list);
    const content = document.getElementById("content");
    content.parentNode.insertBefore(region, content);
  }
  return list;
}

function say(level, text) {
  const item = document.createElement("li");
  item.className = level;
  item.textContent = text;
  messageList().append(item);
}

/** The cell's live view: a progress bar and a line of text, in place of the status. */
function showProgress(cell, text, fraction) {
  let bar = cell.querySelector("progress");
  let line = cell.querySelector(".progress-text");
  if (!bar) {
    bar = document.createElement("progress");
    bar.max = 1;
    line = document.createElement("span");
    line.className = "progress-text";
    cell.replaceChildren(bar, line);
  }
  if (fraction === null) bar.removeAttribute("value");
  else bar.value = fraction;
  bar.setAttribute("aria-label", text);
  line.textContent = text;
}

async function load(model, cell) {
  const started = performance.now();
  const bytes = Number(cell.dataset.bytes) || 0;
  showProgress(cell, "loading: asking a worker", null);
  let said = null;
  // /load_model's stream ends when the load does (no [DONE]); each event is a stage, an error, or ready.
  await streamSSE("/load_model", { model }, (event) => {
    if (said) return;
    if (event.status === "loading") {
      const p = event.progress || {};
      showProgress(cell, describe(event, bytes), p.total ? p.current / p.total : null);
    } else if (event.status === "error") {
      throw new Error(event.message || "the worker could not load it");
    } else if (event.status === "ready") {
      const seconds = ((performance.now() - started) / 1000).toFixed(1);
      said = event.cached === false ? `${model} loaded in ${seconds} s (${size(bytes)}).` : `${model} is loaded.`;
    }
  }, undefined, { endsWithDone: false });
  if (!said) throw new Error("the stream ended before the model was ready");
  return said;
}

async function unload(model, cell) {
  showProgress(cell, "unloading", null);
  const body = await apiJSON("/unload_model", { method: "POST", body: { model } });
  return body.status === "unloaded" ? `${model} unloaded from ${body.unloaded_on.join(", ")}.`
    : `${model} was not loaded on any worker.`;
}

/** The row's cells as the server shows them now (status, where loaded, last used). */
async function reread(row, model) {
  const response = await apiFetch(location.href);
  if (!response.ok) throw await problemOf(response);
  const page = new DOMParser().parseFromString(await response.text(), "text/html");
  const fresh = [...page.querySelectorAll("#result_list tbody tr")]
    .find((tr) => tr.querySelector(`.model-status[data-model="${CSS.escape(model)}"]`));
  if (!fresh) throw new Error("the row is not on the page any more");
  for (const name of REREAD_CELLS) {
    const [now, then] = [row.querySelector(`td.${name}`), fresh.querySelector(`td.${name}`)];
    if (now && then) now.innerHTML = then.innerHTML;
  }
}

/** `reread` until the row's status is `wanted` (null: once), for up to 5 s: the catalog records a load or an
 * unload from the worker's own report, which can reach the server a moment after the worker's answer did. */
async function rereadUntil(row, model, wanted) {
  for (let tries = 1; ; tries++) {
    await reread(row, model);
    if (wanted === null || row.querySelector(".model-status")?.textContent === wanted || tries >= 20) return;
    await new Promise((resolve) => setTimeout(resolve, 250));
  }
}

async function run(kind, rows) {
  for (const row of rows) {
    const status = row.querySelector(".model-status");
    const model = status.dataset.model;
    const cell = status.closest("td");
    cell.dataset.bytes = status.dataset.bytes;
    let wanted = null;
    try {
      say("success", await (kind === "load" ? load : unload)(model, cell));
      wanted = kind === "load" ? "loaded" : "cached";
    } catch (error) {
      say("error", `${kind === "load" ? "Loading" : "Unloading"} ${model} failed: ${error.message}`);
    }
    try {
      await rereadUntil(row, model, wanted);
    } catch (_) {
      showProgress(cell, "reload the page to see the status", 0);
    }
  }
}

function wire() {
  const form = document.getElementById("changelist-form");
  if (!form) return;
  form.addEventListener("submit", (event) => {
    const action = form.querySelector("select[name=action]");
    const kind = action && LIVE[action.value];
    const across = form.querySelector("input[name=select_across]");
    const rows = [...form.querySelectorAll("tr input.action-select:checked")].map((box) => box.closest("tr"));
    const go = event.submitter && event.submitter.name === "index";
    if (!kind || !go || !rows.length || (across && across.value === "1")) return;
    event.preventDefault();
    const button = event.submitter;
    button.disabled = true;
    run(kind, rows).finally(() => { button.disabled = false; });
  });
}

if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", wire);
else wire();
