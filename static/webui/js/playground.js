// /playground: a base model continues the text in place (/v1/completions with logprobs), token by token.
//
// The document is a list of segments: plain text (typed or pasted) and tokens (generated or scored),
// each token with its logprob and the top alternatives there. Tokens are coloured by probability;
// hovering shows the top 5; clicking one cuts the text there, puts it in, and continues.
import { apiJSON, messageOf, streamSSE } from "./api.js";
import { $, el, paintOnNextFrame } from "./dom.js";
import { ModelPicker } from "./models.js";

const ui = {
  doc: $("doc"), continue: $("continue"), stop: $("stop"), undo: $("undo"), score: $("score"), clear: $("clear"),
  stats: $("stats"), error: $("error"), popover: $("popover"), maxTokens: $("max-tokens"),
  temperature: $("temperature"), topP: $("top-p"), topK: $("top-k"), seed: $("seed"), stops: $("stop-strings"),
};
const ALTERNATIVES = 5;
const picker = new ModelPicker(document.querySelector("[data-model-picker]"), "playground.model", showError);

let segments = [];      // [{kind: "text"|"token", text, logprob?, top?}]
const undoStack = [];   // earlier `segments`
let typing = false;     // an undo point was taken for the current run of typing
let running = null;     // AbortController of the generation in progress

function showError(error) {
  ui.error.textContent = typeof error === "string" ? error : messageOf(error);
  ui.error.hidden = false;
}

const documentText = () => segments.map((s) => s.text).join("");

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

function colourOf(logprob) {
  if (logprob === null || logprob === undefined) return "";
  const p = Math.exp(logprob);
  return `hsl(${Math.round(p * 130)}, 75%, ${Math.round(86 - 4 * p)}%)`;
}

function render() {
  hidePopover();
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
function tokenSegments(text, logprobs, base = 0) {
  const { token_logprobs: lps, top_logprobs: tops, text_offset: offsets } = logprobs;
  const out = [];
  const first = offsets.length ? offsets[0] - base : text.length;
  if (first > 0) out.push({ kind: "text", text: text.slice(0, first) });
  for (let i = 0; i < offsets.length; i += 1) {
    const start = offsets[i] - base;
    const end = i + 1 < offsets.length ? offsets[i + 1] - base : text.length;
    const piece = text.slice(start, end);
    if (piece) out.push({ kind: "token", text: piece, logprob: lps[i], top: topList(tops[i]) });
  }
  return out;
}

function topList(top) {
  return Object.entries(top || {}).sort((a, b) => b[1] - a[1]);
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
      el("code", { textContent: JSON.stringify(token) }), el("span", { className: "p", textContent: percent(logprob) }));
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
  const generated = { text: "", token_logprobs: [], top_logprobs: [], text_offset: [] };
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
  try {
    await picker.ensureLoaded();
    await streamSSE("/v1/completions", body, (chunk) => {
      if (chunk.usage) usage = chunk.usage;
      const choice = (chunk.choices || [])[0];
      if (!choice) return;
      generated.text += choice.text;
      if (choice.logprobs) {
        for (const key of ["token_logprobs", "top_logprobs", "text_offset"]) generated[key].push(...choice.logprobs[key]);
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
  ui.stats.textContent = `${count} tokens · ${(count / seconds).toFixed(1)} tokens/s · ${finish || "done"}`;
  picker.refresh().catch(() => {});
}

/** Cut the text before token `index`, put `token` there, and continue from it. */
function branch(index, token, logprob, top) {
  if (running) return;
  remember();
  segments = [...segments.slice(0, index), { kind: "token", text: token, logprob, top }];
  render();
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

picker.refresh().then(() => { document.body.dataset.ready = "true"; }).catch(showError);
