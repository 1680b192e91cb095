// /playground: a base model continues the text in place (/v1/completions with logprobs), token by token.
//
// The document is a list of segments: plain text (typed or pasted) and tokens (generated or scored),
// each token with its logprob and the top alternatives there. Tokens are coloured by probability;
// hovering shows the top 5; clicking one cuts the text there, puts it in, and continues.
import { apiJSON, streamSSE } from "./api.js";
import { clearUnreachable, showErrorIn } from "./banner.js";
import { Connection } from "./connection.js";
import { $, el, paintOnNextFrame, probabilityColour } from "./dom.js";
import { initCompare } from "./compare.js";
import { fitDocument } from "./context-window.js";
import { ModelPicker, writesText } from "./models.js";
import { initViewCode } from "./view-code.js";

const ui = {
  doc: $("doc"), continue: $("continue"), stop: $("stop"), undo: $("undo"), score: $("score"), clear: $("clear"),
  stats: $("stats"), error: $("error"), popover: $("popover"), maxTokens: $("max-tokens"),
  temperature: $("temperature"), topP: $("top-p"), topK: $("top-k"), seed: $("seed"), stops: $("stop-strings"),
};
const ALTERNATIVES = 5;
// Models that write text (a speech-to-text model is not one).
const picker = new ModelPicker(document.querySelector("[data-model-picker]"), "playground.model", showError, writesText);

let segments = [];      // [{kind: "text"|"token", text, logprob?, top?}]
const undoStack = [];   // earlier `segments`
let typing = false;     // an undo point was taken for the current run of typing
let running = null;     // AbortController of the generation in progress

// The server cannot be reached: a banner, retries with backoff (the model list), then the page goes on.
const connection = new Connection({ check: () => picker.refresh(), back: () => {
  clearUnreachable(ui.error);
} });

function showError(error) { showErrorIn(ui.error, connection, error); }

const documentText = () => segments.map((s) => s.text).join("");

const DOC_KEY = "playground.doc";
const SETTINGS_KEY = "playground.settings";
const SETTINGS = ["maxTokens", "temperature", "topP", "topK", "seed", "stops"];

/** The document, kept in this browser across reloads (text and token colours, per user's browser profile). */
function save() {
  try { localStorage.setItem(DOC_KEY, JSON.stringify(segments)); } catch (_) { /* over quota: not kept */ }
}

function load() {
  try {
    const kept = JSON.parse(localStorage.getItem(DOC_KEY));
    if (Array.isArray(kept)) segments = kept.filter((s) => s && typeof s.text === "string");
  } catch (_) { segments = []; }
}

/** The sampling settings, kept in this browser across reloads as the document is. */
function saveSettings() {
  const values = Object.fromEntries(SETTINGS.map((name) => [name, ui[name].value]));
  try { localStorage.setItem(SETTINGS_KEY, JSON.stringify(values)); } catch (_) { /* over quota: not kept */ }
}

function loadSettings() {
  let kept = null;
  try { kept = JSON.parse(localStorage.getItem(SETTINGS_KEY)); } catch (_) { /* not kept */ }
  if (!kept || typeof kept !== "object") return;
  for (const name of SETTINGS) if (typeof kept[name] === "string") ui[name].value = kept[name];
}

function remember() {
  undoStack.push(segments.map((s) => ({ ...s })));
  if (undoStack.length > 200) undoStack.shift();
  ui.undo.disabled = false;
  typing = false;
}

function undo() {
  if (!undoStack.length || running) return;
  segments = undoStack.pop();
  ui.undo.disabled = !undoStack.length;
  typing = false;
  render();
}

// --- rendering ---------------------------------------------------------------------------------

export function colourOf(logprob) {
  if (logprob === null || logprob === undefined) return "";
  return probabilityColour(Math.exp(logprob));
}

function render() {
  hidePopover();
  save();
  ui.doc.replaceChildren(...segments.map((segment, index) => {
    if (segment.kind !== "token") return document.createTextNode(segment.text);
    const span = el("span", { className: "tok", textContent: segment.text });
    span.dataset.i = index;
    span.style.backgroundColor = colourOf(segment.logprob);
    return span;
  }));
}

/** After typing: segments from the DOM. A token span whose text was changed becomes plain text. */
function syncFromDom() {
  if (!typing) {
    remember();
    typing = true;
  }
  const next = [];
  const kept = [];
  for (const node of ui.doc.childNodes) {
    const old = node.dataset ? segments[Number(node.dataset.i)] : undefined;
    if (old && old.kind === "token" && node.textContent === old.text) {
      next.push(old);
      kept.push([node, old]);
    } else {
      next.push({ kind: "text", text: node.nodeName === "BR" ? "\n" : node.textContent });
      if (node.dataset) {
        node.classList.remove("tok", "active");
        node.style.backgroundColor = "";
        delete node.dataset.i;
      }
    }
  }
  segments = merged(next);
  for (const [node, segment] of kept) node.dataset.i = segments.indexOf(segment);
  save();
}

/** Adjacent text segments joined, empty ones dropped (token segments kept as they are). */
function merged(list) {
  const out = [];
  for (const segment of list) {
    if (!segment.text) continue;
    const last = out[out.length - 1];
    if (segment.kind === "text" && last && last.kind === "text") out[out.length - 1] = { ...last, text: last.text + segment.text };
    else out.push(segment);
  }
  return out;
}

/**
 * The token segments of one generated (or echoed) text, cut at the logprobs' text offsets.
 * A token whose own text is empty (a character split over tokens) gives its text to the next.
 */
export function tokenSegments(text, logprobs, base = 0) {
  const { token_logprobs: lps, top_logprobs: tops, text_offset: offsets, tokens = [] } = logprobs;
  const out = [];
  const first = offsets.length ? offsets[0] - base : text.length;
  if (first > 0) out.push({ kind: "text", text: text.slice(0, first) });
  for (let i = 0; i < offsets.length; i += 1) {
    const start = offsets[i] - base;
    const end = i + 1 < offsets.length ? offsets[i + 1] - base : text.length;
    const piece = text.slice(start, end);
    if (piece) out.push({ kind: "token", text: piece, token: tokens[i], logprob: lps[i], top: topList(tops[i]) });
  }
  return out;
}

function topList(top) {
  return Object.entries(top || {}).sort((a, b) => b[1] - a[1]);
}

/** The bytes a `bytes:\\x98…` token stands for (a piece of a character), or null for a text token. */
export function bytesOf(token) {
  const match = /^bytes:((?:\\x[0-9a-f]{2})+)$/i.exec(token);
  return match ? match[1].split("\\x").filter(Boolean).map((h) => parseInt(h, 16)) : null;
}

/** How a token is shown: its text, or its bytes as ⟨e6 97⟩. */
export function tokenLabel(token) {
  const bytes = bytesOf(token);
  return bytes ? `⟨${bytes.map((b) => b.toString(16).padStart(2, "0")).join(" ")}⟩ bytes` : JSON.stringify(token);
}

/**
 * The text of `prefix` with `token` after it: a byte piece is put in as its bytes (they complete a
 * character with the bytes before it); null when they do not make whole characters yet.
 */
function withToken(prefix, lead, token) {
  const bytes = bytesOf(token);
  if (!bytes) return prefix + token;
  const all = new Uint8Array([...new TextEncoder().encode(prefix), ...lead, ...bytes]);
  try {
    return new TextDecoder("utf-8", { fatal: true }).decode(all);
  } catch (_) {
    return null;
  }
}

// --- the alternatives popover -------------------------------------------------------------------

let hideTimer = null;

function showPopover(span) {
  const segment = segments[Number(span.dataset.i)];
  if (!segment || segment.kind !== "token") return;
  clearTimeout(hideTimer);
  ui.doc.querySelectorAll(".tok.active").forEach((n) => n.classList.remove("active"));
  span.classList.add("active");
  const percent = (lp) => (lp === null || lp === undefined ? "–" : `${(Math.exp(lp) * 100).toFixed(1)}%`);
  const head = el("div", { className: "head" }, el("code", { textContent: JSON.stringify(segment.text) }),
    ` ${percent(segment.logprob)}`);
  const alternatives = segment.top.slice(0, ALTERNATIVES).map(([token, logprob]) => {
    const button = el("button", { type: "button", className: "alt", title: "Continue from this token" },
      el("code", { textContent: tokenLabel(token) }), el("span", { className: "p", textContent: percent(logprob) }));
    button.dataset.token = token;
    if (bytesOf(token)) button.dataset.bytes = "true";
    if (token === segment.text) button.classList.add("chosen");
    button.addEventListener("click", () => branch(Number(span.dataset.i), token, logprob, segment.top));
    return button;
  });
  ui.popover.replaceChildren(head, ...(alternatives.length ? alternatives
    : [el("div", { className: "muted small", textContent: "No alternatives (the first token has no context)." })]));
  ui.popover.hidden = false;
  const box = span.getBoundingClientRect();
  const width = ui.popover.offsetWidth;
  const height = ui.popover.offsetHeight;
  const left = Math.max(8, Math.min(box.left, window.innerWidth - width - 8));
  const below = box.bottom + 4;
  ui.popover.style.left = `${left}px`;
  ui.popover.style.top = `${below + height > window.innerHeight ? Math.max(8, box.top - height - 4) : below}px`;
}

function hidePopover() {
  ui.popover.hidden = true;
  ui.doc.querySelectorAll(".tok.active").forEach((n) => n.classList.remove("active"));
}

function hideSoon() {
  clearTimeout(hideTimer);
  hideTimer = setTimeout(hidePopover, 300);
}

// --- generation ---------------------------------------------------------------------------------

function intOrNull(input) {
  const value = parseInt(input.value, 10);
  return Number.isFinite(value) ? value : null;
}

function floatOrNull(input) {
  const value = parseFloat(input.value);
  return Number.isFinite(value) ? value : null;
}

function samplingFields() {
  const body = {};
  const fields = { temperature: floatOrNull(ui.temperature), top_p: floatOrNull(ui.topP), top_k: intOrNull(ui.topK),
    seed: intOrNull(ui.seed) };
  for (const [name, value] of Object.entries(fields)) if (value !== null) body[name] = value;
  const stops = ui.stops.value.split("\n").filter((s) => s !== "");
  if (stops.length) body.stop = stops;
  return body;
}

function setRunning(controller) {
  running = controller;
  ui.continue.hidden = Boolean(controller);
  ui.stop.hidden = !controller;
  for (const button of [ui.score, ui.clear]) button.disabled = Boolean(controller);
  ui.undo.disabled = Boolean(controller) || !undoStack.length;
  ui.doc.contentEditable = controller ? "false" : "plaintext-only";
}

/** Generate from the whole text; `undoPoint`: Undo comes back to the text as it is now. */
async function continueText(undoPoint = true) {
  if (running) return;
  const prompt = documentText();
  if (!prompt) {
    showError("Write some text first: the model continues it.");
    return;
  }
  ui.error.hidden = true;
  if (undoPoint) remember();
  typing = false;
  const base = segments;
  const generated = { text: "", tokens: [], token_logprobs: [], top_logprobs: [], text_offset: [] };
  const body = { model: picker.value, prompt, max_tokens: intOrNull(ui.maxTokens) ?? 32, logprobs: ALTERNATIVES,
    stream: true, stream_options: { include_usage: true }, ...samplingFields() };
  const controller = new AbortController();
  setRunning(controller);
  const started = performance.now();
  let usage = null;
  let finish = null;
  const paint = () => {
    segments = merged([...base, ...tokenSegments(generated.text, generated)]);
    render();
  };
  const repaint = paintOnNextFrame(() => running === controller && paint());
  let fitted = null;
  try {
    await picker.ensureLoaded();
    fitted = await fitDocument(body, prompt);
    document.body.dataset.notSentChars = fitted ? fitted.notSentChars : 0;
    await streamSSE("/v1/completions", body, (chunk) => {
      if (chunk.usage) usage = chunk.usage;
      const choice = (chunk.choices || [])[0];
      if (!choice) return;
      generated.text += choice.text;
      if (choice.logprobs) {
        for (const key of ["tokens", "token_logprobs", "top_logprobs", "text_offset"]) generated[key].push(...choice.logprobs[key]);
      }
      if (choice.finish_reason) finish = choice.finish_reason;
      repaint();
    }, controller.signal);
  } catch (error) {
    if (error.name !== "AbortError") showError(error);
    finish = error.name === "AbortError" ? "stopped" : "error";
  }
  setRunning(null);
  paint();
  const seconds = (performance.now() - started) / 1000;
  const count = usage ? usage.completion_tokens : generated.token_logprobs.length;
  ui.stats.textContent = `${count} tokens · ${(count / seconds).toFixed(1)} tokens/s · ${finish || "done"}`
    + (fitted ? ` · ${fitted.note}` : "");
  picker.refresh().catch((error) => connection.failed(error));
}

/** Cut the text before token `index`, put `token` there (a byte piece as its bytes), and continue from it. */
function branch(index, token, logprob, top) {
  if (running) return;
  const prefix = segments.slice(0, index).map((s) => s.text).join("");
  // The token there may be the last byte(s) of a character begun by earlier tokens: those bytes lead.
  const shown = segments[index];
  const own = shown && shown.token ? bytesOf(shown.token) : null;
  const whole = shown ? new TextEncoder().encode(shown.text) : new Uint8Array();
  const lead = own && own.length < whole.length ? [...whole.slice(0, whole.length - own.length)] : [];
  const text = withToken(prefix, lead, token);
  if (text === null) {
    showError(`${tokenLabel(token)} is part of a character whose other bytes are not in the text: it cannot be put in on its own.`);
    return;
  }
  remember();
  const prefixSegments = segments.slice(0, index);
  // A byte piece may complete a character the text ends with: the whole character becomes the token.
  const kept = text.startsWith(prefix) ? prefixSegments : merged([{ kind: "text", text: text.slice(0, -1) }]);
  const piece = text.startsWith(prefix) ? text.slice(prefix.length) : text.slice(-1);
  segments = [...kept, { kind: "token", text: piece, logprob, top }];
  render();
  save();
  continueText(false);
}

/** Score the text's own tokens: echo + logprobs with no new tokens. */
async function scoreText() {
  const prompt = documentText();
  if (!prompt || running) return;
  ui.error.hidden = true;
  try {
    await picker.ensureLoaded();
    const result = await apiJSON("/v1/completions", {
      method: "POST", body: { model: picker.value, prompt, max_tokens: 0, echo: true, logprobs: ALTERNATIVES },
    });
    const choice = result.choices[0];
    remember();
    segments = merged(tokenSegments(choice.text, choice.logprobs));
    render();
    const scored = choice.logprobs.token_logprobs.filter((lp) => lp !== null);
    const mean = scored.reduce((a, b) => a + b, 0) / Math.max(scored.length, 1);
    ui.stats.textContent = `${result.usage.prompt_tokens} prompt tokens · perplexity ${Math.exp(-mean).toFixed(2)}`;
  } catch (error) {
    showError(error);
  }
}

// --- wiring ---------------------------------------------------------------------------------------

ui.doc.addEventListener("input", syncFromDom);
ui.doc.addEventListener("mouseover", (event) => {
  const span = event.target.closest(".tok");
  if (span) showPopover(span);
});
ui.doc.addEventListener("mouseout", (event) => {
  if (event.target.closest(".tok")) hideSoon();
});
ui.doc.addEventListener("click", (event) => {
  const span = event.target.closest(".tok");
  if (span) showPopover(span);
});
ui.doc.addEventListener("focusin", (event) => {
  const span = event.target.closest(".tok");
  if (span) showPopover(span);
});
// Keyboard: Alt+→ / Alt+← go from token to token (showing its alternatives), Alt+↓ goes into them.
ui.doc.addEventListener("keydown", (event) => {
  if (!event.altKey) return;
  const tokens = [...ui.doc.querySelectorAll(".tok")];
  const active = ui.doc.querySelector(".tok.active");
  if (event.key === "ArrowRight" || event.key === "ArrowLeft") {
    event.preventDefault();
    const at = tokens.indexOf(active);
    const next = event.key === "ArrowRight" ? tokens[at + 1] || tokens[0] : tokens[at - 1] || tokens[tokens.length - 1];
    if (next) {
      showPopover(next);
      next.scrollIntoView({ block: "nearest" });
    }
  } else if (event.key === "ArrowDown" && active && !ui.popover.hidden) {
    event.preventDefault();
    const first = ui.popover.querySelector(".alt");
    if (first) first.focus();
  }
});
ui.popover.addEventListener("keydown", (event) => {
  const alts = [...ui.popover.querySelectorAll(".alt")];
  const at = alts.indexOf(document.activeElement);
  if (event.key === "ArrowDown" || event.key === "ArrowUp") {
    event.preventDefault();
    const next = alts[(at + (event.key === "ArrowDown" ? 1 : alts.length - 1)) % alts.length];
    if (next) next.focus();
  } else if (event.key === "Escape") {
    hidePopover();
    ui.doc.focus();
  }
});
ui.popover.addEventListener("mouseenter", () => clearTimeout(hideTimer));
ui.popover.addEventListener("mouseleave", hideSoon);
document.addEventListener("keydown", (event) => {
  if (event.key === "Enter" && (event.ctrlKey || event.metaKey)) {
    event.preventDefault();
    continueText();
  } else if (event.key === "Escape") {
    hidePopover();
  }
});
ui.continue.addEventListener("click", () => continueText());
ui.stop.addEventListener("click", () => running && running.abort());
ui.undo.addEventListener("click", undo);
ui.score.addEventListener("click", scoreText);
ui.clear.addEventListener("click", () => {
  remember();
  segments = [];
  render();
  ui.stats.textContent = "";
});

load();
render();
loadSettings();
for (const name of SETTINGS) ui[name].addEventListener("input", saveSettings);
initViewCode({ model: () => picker.value, prompt: documentText, fields: () => ({
  max_tokens: intOrNull(ui.maxTokens) ?? 32, logprobs: ALTERNATIVES, ...samplingFields() }) });
initCompare({ prompt: documentText, fields: () => ({ max_tokens: intOrNull(ui.maxTokens) ?? 32, ...samplingFields() }),
  onError: showError });
picker.refresh().catch(showError).finally(() => { document.body.dataset.ready = "true"; });
