// /chat: streams /v1/chat/completions, renders Markdown, keeps conversations on the server (/ui/api/conversations).
import { apiJSON, messageOf, streamSSE } from "./api.js";
import { $, el, paintOnNextFrame } from "./dom.js";
import { renderMarkdown } from "./markdown.js";
import { ModelPicker } from "./models.js";

const ui = {
  list: $("conversation-list"), messages: $("messages"), prompt: $("prompt"), composer: $("composer"),
  send: $("send"), stop: $("stop"), error: $("error"), system: $("system-prompt"), temperature: $("temperature"),
  topP: $("top-p"), maxTokens: $("max-tokens"), thinking: $("thinking"), tools: $("tools"), sidebar: $("sidebar"),
};
const picker = new ModelPicker(document.querySelector("[data-model-picker]"), "chat.model", showError);

let conversations = [];
let current = blankConversation();
let streaming = null; // {controller, element, answer} while an answer streams
let busy = false;      // from a send until the conversation is saved: no second turn meanwhile

function blankConversation() {
  return { id: null, title: "", model: "", system_prompt: "", options: {}, messages: [] };
}

function showError(error) {
  ui.error.textContent = typeof error === "string" ? error : messageOf(error);
  ui.error.hidden = false;
}

function clearError() { ui.error.hidden = true; }

// --- conversations (sidebar) -----------------------------------------------------------------

async function refreshList() {
  conversations = (await apiJSON("/ui/api/conversations")).data;
  renderList();
}

function renderList() {
  ui.list.replaceChildren(...conversations.map((c) => {
    const item = el("li", { className: c.id === current.id ? "current" : "" });
    item.dataset.id = c.id;
    const open = el("button", { type: "button", className: "open", textContent: c.title, title: c.title });
    open.addEventListener("click", () => openConversation(c.id).catch(showError));
    const rename = el("button", { type: "button", className: "act", textContent: "Rename" });
    rename.addEventListener("click", () => startRename(item, c));
    const remove = el("button", { type: "button", className: "act", textContent: "Delete" });
    remove.addEventListener("click", () => confirmDelete(item, c));
    item.append(open, rename, remove);
    return item;
  }));
}

function startRename(item, conversation) {
  const input = el("input", { value: conversation.title, maxLength: 200, "aria-label": "New title" });
  let saved = false; // Enter saves, then the list redraws and the input's blur must not save again
  const save = async () => {
    if (saved) return;
    saved = true;
    const title = input.value.trim();
    if (title && title !== conversation.title) {
      await apiJSON(`/ui/api/conversations/${conversation.id}`, { method: "PATCH", body: { title } });
      if (current.id === conversation.id) current.title = title;
    }
    await refreshList();
  };
  input.addEventListener("keydown", (event) => {
    if (event.key === "Enter") save().catch(showError);
    if (event.key === "Escape") renderList();
  });
  input.addEventListener("blur", () => save().catch(showError));
  item.replaceChildren(input);
  input.focus();
  input.select();
}

function confirmDelete(item, conversation) {
  const yes = el("button", { type: "button", className: "act danger-text", textContent: "Delete it" });
  const no = el("button", { type: "button", className: "act", textContent: "Keep" });
  yes.addEventListener("click", async () => {
    try {
      await apiJSON(`/ui/api/conversations/${conversation.id}`, { method: "DELETE" });
      if (current.id === conversation.id) newConversation();
      await refreshList();
    } catch (error) { showError(error); }
  });
  no.addEventListener("click", renderList);
  item.replaceChildren(el("span", { className: "open", textContent: `Delete “${conversation.title}”?` }), yes, no);
}

async function openConversation(id) {
  if (busy) return;
  const conversation = await apiJSON(`/ui/api/conversations/${id}`);
  current = conversation;
  history.replaceState(null, "", `/chat?c=${id}`);
  ui.system.value = conversation.system_prompt || "";
  const o = conversation.options || {};
  ui.temperature.value = o.temperature ?? "";
  ui.topP.value = o.top_p ?? "";
  ui.maxTokens.value = o.max_tokens ?? "";
  ui.thinking.value = o.thinking || "auto";
  ui.tools.value = o.tools || "";
  picker.value = conversation.model;
  clearError();
  renderMessages();
  renderList();
  closeSidebar();
}

function newConversation() {
  if (busy) return;
  current = blankConversation();
  history.replaceState(null, "", "/chat");
  clearError();
  renderMessages();
  renderList();
  closeSidebar();
  ui.prompt.focus();
}

function numberOrNull(input, parse = parseFloat) {
  const value = parse(input.value);
  return Number.isFinite(value) ? value : null;
}

function readOptions() {
  return {
    temperature: numberOrNull(ui.temperature), top_p: numberOrNull(ui.topP),
    max_tokens: numberOrNull(ui.maxTokens, (v) => parseInt(v, 10)), thinking: ui.thinking.value, tools: ui.tools.value,
  };
}

/** Saves the whole conversation; the first save creates it and titles it after the first message. */
async function saveConversation() {
  current.system_prompt = ui.system.value;
  current.options = readOptions();
  current.model = picker.value;
  const body = {
    title: current.title || titleOf(current.messages), model: current.model, system_prompt: current.system_prompt,
    options: current.options, messages: current.messages,
  };
  const saved = current.id
    ? await apiJSON(`/ui/api/conversations/${current.id}`, { method: "PUT", body })
    : await apiJSON("/ui/api/conversations", { method: "POST", body });
  current.id = saved.id;
  current.title = saved.title;
  history.replaceState(null, "", `/chat?c=${saved.id}`);
  await refreshList();
}

function titleOf(messages) {
  const first = messages.find((m) => m.role === "user");
  const text = (first && first.content ? first.content : "New chat").replace(/\s+/g, " ").trim();
  return text.length > 60 ? `${text.slice(0, 57)}…` : text || "New chat";
}

// --- messages ------------------------------------------------------------------------------------

function renderMessages() {
  const nodes = current.messages.map((message, index) => messageElement(message, index));
  if (!nodes.length) nodes.push(el("p", { className: "empty-hint", textContent: "Start a conversation below." }));
  ui.messages.replaceChildren(...nodes);
  ui.messages.scrollTop = ui.messages.scrollHeight;
}

function messageElement(message, index) {
  const last = index === current.messages.length - 1;
  if (message.role === "user") {
    const node = el("div", { className: "message user" }, el("div", { className: "body", textContent: message.content }));
    const isLastUser = current.messages.slice(index + 1).every((m) => m.role !== "user");
    if (isLastUser && !streaming) {
      const actions = el("div", { className: "meta" });
      const edit = el("button", { type: "button", textContent: "Edit", title: "Edit this message and answer again" });
      edit.addEventListener("click", () => editMessage(node, index));
      actions.append(edit);
      if (last) {
        const retry = el("button", { type: "button", textContent: "Retry" });
        retry.addEventListener("click", () => generate());
        actions.append(retry);
      }
      node.append(actions);
    }
    return node;
  }
  const node = el("div", { className: "message assistant" });
  fillAnswer(node, message);
  node.append(statsLine(message.stats, last && !streaming));
  return node;
}

/** The answer's reasoning (collapsible), Markdown content and tool calls. */
function fillAnswer(node, message, live = false) {
  let body = node.querySelector(":scope > .body");
  if (!body) {
    body = el("div", { className: "body" });
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
    reasoning.querySelector(".text").textContent = message.reasoning_content;
  }
  body.innerHTML = renderMarkdown(message.content || "");
  body.classList.toggle("cursor", live);
  node.querySelectorAll(":scope > .tool-call").forEach((n) => n.remove());
  for (const call of message.tool_calls || []) {
    const box = el("div", { className: "tool-call" },
      el("div", {}, "Tool call ", el("span", { className: "name", textContent: call.function.name }),
        el("span", { className: "muted small", textContent: `  ${call.id}` })),
      el("pre", { textContent: prettyJSON(call.function.arguments) }));
    body.after(box);
  }
}

function prettyJSON(text) {
  try { return JSON.stringify(JSON.parse(text), null, 2); } catch (_) { return text; }
}

function statsLine(stats, withRegenerate) {
  const meta = el("div", { className: "meta" });
  if (stats) {
    const parts = [];
    if (stats.model) parts.push(stats.model);
    if (stats.tokens_per_second) parts.push(`${stats.tokens_per_second.toFixed(1)} tokens/s`);
    if (stats.usage) parts.push(`${stats.usage.prompt_tokens} prompt + ${stats.usage.completion_tokens} completion tokens`);
    if (stats.seconds !== undefined) parts.push(`${stats.seconds.toFixed(2)} s`);
    if (stats.finish_reason && stats.finish_reason !== "stop") parts.push(`finish: ${stats.finish_reason}`);
    meta.append(el("span", { className: "stats", textContent: parts.join(" · ") }));
  }
  if (withRegenerate) {
    const again = el("button", { type: "button", textContent: "Regenerate" });
    again.addEventListener("click", () => {
      current.messages.pop();
      generate();
    });
    meta.append(again);
  }
  return meta;
}

function editMessage(node, index) {
  if (busy) return;
  const area = el("textarea", { value: current.messages[index].content, rows: 3, "aria-label": "Edit message" });
  const save = el("button", { type: "button", className: "primary", textContent: "Save & send" });
  const cancel = el("button", { type: "button", textContent: "Cancel" });
  save.addEventListener("click", () => {
    if (!area.value.trim()) return;
    current.messages = current.messages.slice(0, index);
    current.messages.push({ role: "user", content: area.value });
    generate();
  });
  cancel.addEventListener("click", renderMessages);
  node.replaceChildren(el("div", { className: "edit-box" }, area, el("div", { className: "row" }, cancel, save)));
  area.focus();
}

// --- generation -------------------------------------------------------------------------------

function apiMessages() {
  const messages = [];
  if (ui.system.value.trim()) messages.push({ role: "system", content: ui.system.value });
  for (const m of current.messages) {
    const message = { role: m.role, content: m.content ?? null };
    if (m.tool_calls && m.tool_calls.length) message.tool_calls = m.tool_calls;
    if (m.tool_call_id) message.tool_call_id = m.tool_call_id;
    messages.push(message);
  }
  return messages;
}

function requestBody() {
  const o = readOptions();
  const body = { model: picker.value, messages: apiMessages(), stream: true, stream_options: { include_usage: true } };
  if (o.temperature !== null) body.temperature = o.temperature;
  if (o.top_p !== null) body.top_p = o.top_p;
  if (o.max_tokens !== null) body.max_tokens = o.max_tokens;
  if (o.thinking !== "auto") body.chat_template_kwargs = { enable_thinking: o.thinking === "on" };
  if (o.tools.trim()) {
    try { body.tools = JSON.parse(o.tools); } catch (_) { throw new Error("Tools is not valid JSON."); }
  }
  return body;
}

function setStreaming(state) {
  streaming = state;
  ui.send.hidden = Boolean(state);
  ui.stop.hidden = !state;
  document.body.classList.toggle("is-streaming", Boolean(state));
}

async function generate() {
  if (busy) return;
  setBusy(true);
  try {
    await generateAndSave();
  } finally {
    setBusy(false);
  }
}

function setBusy(state) {
  busy = state;
  if (state) {
    document.body.dataset.busy = "true";
    document.body.dataset.turns = Number(document.body.dataset.turns || 0) + 1;
  } else {
    delete document.body.dataset.busy;
  }
}

async function generateAndSave() {
  clearError();
  let body;
  try {
    body = requestBody();
  } catch (error) {
    showError(error.message);
    return;
  }
  if (!body.model) {
    showError("Pick a model first.");
    return;
  }
  const answer = { role: "assistant", content: "", reasoning_content: "", tool_calls: [] };
  renderMessages();
  const node = el("div", { className: "message assistant streaming" });
  ui.messages.append(node);
  fillAnswer(node, answer, true);
  const controller = new AbortController();
  setStreaming({ controller, node, answer });
  const started = performance.now();
  let firstTokenAt = null;
  let usage = null;
  let finishReason = null;
  const repaint = paintOnNextFrame(() => {
    if (!node.isConnected) return;
    fillAnswer(node, answer, true);
    ui.messages.scrollTop = ui.messages.scrollHeight;
  });
  try {
    await picker.ensureLoaded();
    await streamSSE("/v1/chat/completions", body, (chunk) => {
      node.dataset.requestId = chunk.id;
      if (chunk.usage) usage = chunk.usage;
      for (const choice of chunk.choices || []) {
        const delta = choice.delta || {};
        if (delta.content || delta.reasoning_content || delta.tool_calls) firstTokenAt ??= performance.now();
        if (delta.content) answer.content += delta.content;
        if (delta.reasoning_content) answer.reasoning_content += delta.reasoning_content;
        for (const call of delta.tool_calls || []) mergeToolCall(answer.tool_calls, call);
        if (choice.finish_reason) finishReason = choice.finish_reason;
      }
      repaint();
    }, controller.signal);
  } catch (error) {
    if (error.name === "AbortError") finishReason = "stopped";
    else showError(error);
  }
  const ended = performance.now();
  setStreaming(null);
  node.classList.remove("streaming");
  const produced = answer.content || answer.reasoning_content || answer.tool_calls.length;
  if (produced) {
    const generatedFor = (ended - (firstTokenAt ?? ended)) / 1000;
    const tokens = usage ? usage.completion_tokens : null;
    answer.stats = {
      model: body.model, seconds: (ended - started) / 1000, usage, finish_reason: finishReason || "error",
      tokens_per_second: tokens && generatedFor > 0 ? Math.max(tokens - 1, 1) / generatedFor : null,
    };
    if (!answer.reasoning_content) delete answer.reasoning_content;
    if (!answer.tool_calls.length) delete answer.tool_calls;
    current.messages.push(answer);
  }
  renderMessages();
  try {
    await saveConversation();
  } catch (error) {
    showError(error);
  }
  picker.refresh().catch(() => {});
}

function mergeToolCall(calls, delta) {
  let call = calls[delta.index];
  if (!call) {
    call = calls[delta.index] = { id: delta.id || "", type: "function", function: { name: "", arguments: "" } };
  }
  if (delta.id) call.id = delta.id;
  if (delta.function && delta.function.name) call.function.name += delta.function.name;
  if (delta.function && delta.function.arguments) call.function.arguments += delta.function.arguments;
}

function send() {
  const text = ui.prompt.value;
  if (!text.trim() || busy) return;
  current.messages.push({ role: "user", content: text });
  ui.prompt.value = "";
  generate();
}

// --- wiring ---------------------------------------------------------------------------------------

function closeSidebar() {
  ui.sidebar.classList.remove("open");
  $("sidebar-toggle").setAttribute("aria-expanded", "false");
}

ui.composer.addEventListener("submit", (event) => {
  event.preventDefault();
  send();
});
ui.prompt.addEventListener("keydown", (event) => {
  if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
    event.preventDefault();
    send();
  }
});
ui.stop.addEventListener("click", () => streaming && streaming.controller.abort());
$("new-chat").addEventListener("click", newConversation);
$("sidebar-toggle").addEventListener("click", () => {
  const open = ui.sidebar.classList.toggle("open");
  $("sidebar-toggle").setAttribute("aria-expanded", String(open));
});

async function start() {
  await Promise.all([picker.refresh(), refreshList()]);
  const id = parseInt(new URLSearchParams(location.search).get("c"), 10);
  if (Number.isFinite(id)) await openConversation(id);
  else renderMessages();
  document.body.dataset.ready = "true";
}

start().catch(showError);
