// Compare mode: one text continued by 2–4 models side by side (the same sampling and seed), and
// "Score text": each token's log-probability under each model, with its difference from the first.
import { apiJSON, messageOf } from "./api.js";
import { $, el, probabilityColour } from "./dom.js";
import { pickerEntries, writesText } from "./models.js";

const MAX_MODELS = 4;

function chosen() {
  return [...$("compare-models").querySelectorAll("input:checked")].map((box) => box.value);
}

function tokenSpans(logprobs, text, colour, title) {
  const { tokens, token_logprobs: lps, text_offset: offsets } = logprobs;
  const base = offsets.length ? offsets[0] : 0;
  return tokens.map((token, i) => {
    const end = i + 1 < offsets.length ? offsets[i + 1] : base + text.length;
    const span = el("span", { className: "tok", textContent: text.slice(offsets[i] - base, end - base), title: title(i) });
    span.style.backgroundColor = colour(i);
    span.dataset.logprob = lps[i] ?? "";
    return span;
  });
}

const probColour = (lp) => (lp === null || lp === undefined ? ""
  : probabilityColour(Math.exp(lp)));
// A token more likely under this model than under the first: green; less likely: red.
const deltaColour = (d) => (d === null ? "" : `var(${d >= 0 ? "--tok-high" : "--tok-low"})`);

function column(model, ...children) {
  const box = el("div", { className: "compare-column" }, el("h3", { textContent: model }), ...children);
  box.dataset.model = model;
  return box;
}

async function continueEach(prompt, fields) {
  const models = chosen();
  const seed = fields.seed ?? 0; // the same seed for every model, so their samples can be compared
  const results = await Promise.all(models.map((model) => apiJSON("/v1/completions", { method: "POST", body: {
    model, prompt, ...fields, seed, logprobs: 1 } })));
  return results.map((result, i) => {
    const choice = result.choices[0];
    const spans = tokenSpans(choice.logprobs, choice.text, (t) => probColour(choice.logprobs.token_logprobs[t]),
      (t) => `${(Math.exp(choice.logprobs.token_logprobs[t]) * 100).toFixed(1)}%`);
    const doc = el("div", { className: "compare-doc" }, el("span", { className: "muted", textContent: prompt }), ...spans);
    return column(models[i], doc, el("p", { className: "muted small", textContent: `${result.usage.completion_tokens} tokens · ${choice.finish_reason}` }));
  });
}

async function scoreEach(prompt) {
  const models = chosen();
  const results = await Promise.all(models.map((model) => apiJSON("/v1/completions", { method: "POST", body: {
    model, prompt, max_tokens: 0, echo: true, logprobs: 1 } })));
  const reference = results[0].choices[0].logprobs;
  return results.map((result, m) => {
    const choice = result.choices[0];
    const lps = choice.logprobs.token_logprobs;
    const same = choice.logprobs.tokens.length === reference.tokens.length
      && choice.logprobs.tokens.every((t, i) => t === reference.tokens[i]);
    const delta = (i) => (m === 0 || !same || lps[i] === null || reference.token_logprobs[i] === null ? null
      : lps[i] - reference.token_logprobs[i]);
    const spans = tokenSpans(choice.logprobs, choice.text, (i) => (m === 0 ? probColour(lps[i]) : deltaColour(delta(i))),
      (i) => (delta(i) === null ? `logprob ${lps[i] === null ? "–" : lps[i].toFixed(3)}`
        : `logprob ${lps[i].toFixed(3)} (${delta(i) >= 0 ? "+" : ""}${delta(i).toFixed(3)} against ${models[0]})`));
    spans.forEach((span, i) => { if (delta(i) !== null) span.dataset.delta = delta(i); });
    const scored = lps.filter((lp) => lp !== null);
    const total = scored.reduce((a, b) => a + b, 0);
    const summary = `sum of logprobs ${total.toFixed(3)} · perplexity ${Math.exp(-total / Math.max(scored.length, 1)).toFixed(2)}`
      + (m > 0 && !same ? " · other tokenizer: no per-token difference" : "");
    const box = column(models[m], el("div", { className: "compare-doc" }, ...spans),
      el("p", { className: "muted small summary", textContent: summary }));
    box.dataset.total = total;
    return box;
  });
}

/** Wire the compare box: its model checkboxes (filled from /v1/models), Continue with each, Score under each. */
export function initCompare({ prompt, fields, onError }) {
  const box = $("compare");
  const columns = $("compare-columns");
  const run = async (work) => {
    const text = prompt();
    if (!text) return onError("Write some text first.");
    if (chosen().length < 2) return onError(`Choose 2 to ${MAX_MODELS} models to compare.`);
    $("compare-status").textContent = "Working…";
    try {
      columns.replaceChildren(...await work(text));
      $("compare-status").textContent = "";
    } catch (error) {
      $("compare-status").textContent = "";
      onError(messageOf(error));
    }
  };
  box.addEventListener("toggle", async () => {
    if (!box.open || $("compare-models").childElementCount) return;
    try {
      const models = (await apiJSON("/v1/models")).data.filter(writesText);
      $("compare-models").replaceChildren(...pickerEntries(models).map(({ model, label }) => {
        const input = el("input", { type: "checkbox", value: model.id });
        input.addEventListener("change", () => {
          if (chosen().length > MAX_MODELS) input.checked = false;
        });
        const name = model.parent ? label : model.id;
        return el("label", { className: "inline" }, input, el("span", { className: "name", textContent: name, title: name }));
      }));
    } catch (error) { onError(messageOf(error)); }
  });
  $("compare-run").addEventListener("click", () => run((text) => continueEach(text, fields())));
  $("compare-score").addEventListener("click", () => run(scoreEach));
}
