// How the chat page draws a message: user text and attachments, an answer's reasoning, Markdown and
// tool calls, a tool result, and the actions under each (‹ n/m › versions, Edit, Copy, Regenerate…).
import { mediaParts, partView, textOf } from "./attachments.js";
import { el } from "./dom.js";
import { MarkdownView, copyText } from "./markdown.js";

/** How many versions a message has and which one is shown: [n (1-based), m]. */
export function versionPosition(message) {
  const others = (message.versions || []).length;
  return [Math.min(message.version_index ?? others, others) + 1, others + 1];
}

/**
 * Messages with the version `k` (0-based) of message `index` shown: that version and what followed it
 * take the place of the shown one, which goes among the versions (with what follows it now).
 */
export function withVersion(messages, index, k) {
  const shown = messages[index];
  const others = shown.versions || [];
  const at = Math.min(shown.version_index ?? others.length, others.length);
  const { versions: _v, version_index: _i, ...plain } = shown;
  const all = [...others];
  all.splice(at, 0, { message: plain, tail: messages.slice(index + 1) });
  const chosen = all[k];
  const rest = all.filter((_, i) => i !== k);
  return [...messages.slice(0, index), { ...chosen.message, versions: rest, version_index: k }, ...chosen.tail];
}

/** `replacement` as a new version of messages[index], with every earlier one kept (and what followed them). */
export function asNewVersion(messages, index, replacement) {
  const shown = messages[index];
  const others = shown.versions || [];
  const at = Math.min(shown.version_index ?? others.length, others.length);
  const { versions: _v, version_index: _i, ...plain } = shown;
  const all = [...others];
  all.splice(at, 0, { message: plain, tail: messages.slice(index + 1) });
  return { ...replacement, versions: all, version_index: all.length };
}

function button(text, onClick, title = "") {
  const node = el("button", { type: "button", textContent: text, title });
  node.addEventListener("click", onClick);
  return node;
}

function versionNav(message, index, actions) {
  const [n, m] = versionPosition(message);
  if (m < 2) return [];
  const prev = button("‹", () => actions.version(index, n - 2), "Previous version");
  const next = button("›", () => actions.version(index, n), "Next version");
  prev.disabled = n <= 1;
  next.disabled = n >= m;
  prev.setAttribute("aria-label", "Previous version");
  next.setAttribute("aria-label", "Next version");
  return [el("span", { className: "versions" }, prev, el("span", { className: "count", textContent: `${n}/${m}` }), next)];
}

/** The element of messages[index]; `actions`: {edit, retry, regenerate, continue, version}; `idle`: no stream now. */
export function messageElement(messages, index, actions, idle) {
  const message = messages[index];
  const last = index === messages.length - 1;
  if (message.role === "user") {
    const node = el("div", { className: "message user" },
      el("div", { className: "body", textContent: textOf(message.content) }));
    const media = mediaParts(message.content);
    if (media.length) node.append(el("div", { className: "attached" }, ...media.map(partView)));
    const meta = el("div", { className: "meta" }, ...versionNav(message, index, actions));
    if (idle) {
      meta.append(button("Edit", () => actions.edit(node, index), "Edit this message and answer again"));
      if (last) meta.append(button("Retry", () => actions.retry()));
    }
    node.append(meta);
    return node;
  }
  if (message.role === "tool") {
    return el("div", { className: "message tool" },
      el("div", { className: "tool-result" },
        el("div", { className: "muted small", textContent: `Tool result${message.tool_call_id ? ` for ${message.tool_call_id}` : ""}` }),
        el("pre", { textContent: textOf(message.content) })));
  }
  const node = el("div", { className: "message assistant" });
  const view = fillAnswer(node, message);
  const meta = el("div", { className: "meta" }, ...versionNav(message, index, actions), statsText(message.stats));
  const copy = button("Copy", () => copyText(copy, textOf(message.content)), "Copy the answer as Markdown");
  meta.append(copy);
  if (idle) {
    meta.append(button("Edit", () => actions.edit(node, index)));
    meta.append(button("Regenerate", () => actions.regenerate(index)));
    if (last && message.stats && message.stats.finish_reason === "length") {
      meta.append(button("Continue", () => actions.continue(index), "Continue the answer where it was cut off"));
    }
  }
  node.append(meta);
  view.done = true;
  return node;
}

/** The answer's reasoning (collapsible), Markdown content (drawn incrementally) and tool calls. */
export function fillAnswer(node, message, live = false) {
  let body = node.querySelector(":scope > .body");
  if (!body) {
    body = el("div", { className: "body" });
    body.markdown = new MarkdownView(body);
    node.prepend(body);
  }
  let reasoning = node.querySelector(":scope > .reasoning");
  if (message.reasoning_content) {
    if (!reasoning) {
      reasoning = el("details", { className: "reasoning" }, el("summary"), el("div", { className: "text" }));
      reasoning.open = live;  // shown while streaming, even when the answer began in the same frame
      node.prepend(reasoning);
    }
    reasoning.querySelector("summary").textContent = live && !message.content ? "Thinking…" : "Reasoning";
    const text = reasoning.querySelector(".text");
    if (text.textContent !== message.reasoning_content) text.textContent = message.reasoning_content;
  }
  body.markdown.update(textOf(message.content));
  body.classList.toggle("cursor", live);
  node.querySelectorAll(":scope > .tool-call").forEach((n) => n.remove());
  for (const call of message.tool_calls || []) {
    const box = el("div", { className: "tool-call" },
      el("div", {}, "Tool call ", el("span", { className: "name", textContent: call.function.name }),
        el("span", { className: "muted small", textContent: `  ${call.id}` })),
      el("pre", { textContent: prettyJSON(call.function.arguments) }));
    body.after(box);
  }
  return body.markdown;
}

function prettyJSON(text) {
  try { return JSON.stringify(JSON.parse(text), null, 2); } catch (_) { return text; }
}

function statsText(stats) {
  if (!stats) return el("span");
  const parts = [];
  if (stats.model) parts.push(stats.model);
  if (stats.tokens_per_second) parts.push(`${stats.tokens_per_second.toFixed(1)} tokens/s`);
  if (stats.usage) parts.push(`${stats.usage.prompt_tokens} prompt + ${stats.usage.completion_tokens} completion tokens`);
  if (stats.seconds !== undefined) parts.push(`${stats.seconds.toFixed(2)} s`);
  if (stats.finish_reason && stats.finish_reason !== "stop") parts.push(`finish: ${stats.finish_reason}`);
  return el("span", { className: "stats", textContent: parts.join(" · ") });
}
