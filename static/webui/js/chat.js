// /chat: streams /v1/chat/completions, renders Markdown, keeps conversations on the server turn by turn.
//
// Nothing typed is lost: a message is checked before it leaves the box; the user's turn is saved
// before the answer streams; the answer (whole or partial: stopped, failed, tab closed) is saved
// after; a failed Regenerate keeps the old answer; Regenerate and Edit keep earlier versions (‹ n/m ›).
import { apiJSON, messageOf, streamSSE } from "./api.js";
import { apiContent, contentOf, mediaParts, modalityOf, partModality, partOf, partView, textOf } from "./attachments.js";
import { exportJSON, exportMarkdown, importFile } from "./chat-io.js";
import { createConversation, flushOutbox, newId, pendingFor, saveOnLeave, writeTurns } from "./chat-store.js";
import { asNewVersion, fillAnswer, messageElement, withVersion } from "./chat-view.js";
import { $, el, paintOnNextFrame } from "./dom.js";
import { ModelPicker, modalitiesOf } from "./models.js";

const ui = {
  list: $("conversation-list"), messages: $("messages"), prompt: $("prompt"), composer: $("composer"),
  send: $("send"), stop: $("stop"), error: $("error"), notice: $("notice"), system: $("system-prompt"),
  temperature: $("temperature"), topP: $("top-p"), maxTokens: $("max-tokens"), thinking: $("thinking"),
  tools: $("tools"), sidebar: $("sidebar"), backdrop: $("sidebar-backdrop"), toggle: $("sidebar-toggle"),
  search: $("search"), attach: $("attach"), attachLabel: $("attach-label"), attachWhy: $("attach-why"),
  attachments: $("attachments"), meter: $("context-meter"), announce: $("announce"), exportBox: $("export"),
};
// Chat needs a model that writes text: text, image and audio input (a speech-to-text model is not one).
const picker = new ModelPicker(document.querySelector("[data-model-picker]"), "chat.model", showError,
  (model) => modalitiesOf(model).includes("text"));

let conversations = [];
let current = blankConversation();
let streaming = null; // {controller, answer, at, base} while an answer streams
let busy = false;      // from a send until the answer is saved: no second turn meanwhile
let pinned = true;     // the reader is at the bottom of the messages: keep them there as the answer grows
let pending = [];      // attachments of the message being written (content parts)

function blankConversation() {
  return { id: null, version: 0, title: "", model: "", system_prompt: "", options: {}, messages: [] };
}

function showError(error) {
  ui.error.textContent = typeof error === "string" ? error : messageOf(error);
  ui.error.hidden = false;
}

function clearError() { ui.error.hidden = true; }

function notify(text) {
  ui.notice.textContent = text;
  ui.notice.hidden = !text;
}

// --- conversations (sidebar) -----------------------------------------------------------------

async function refreshList() {
  conversations = (await apiJSON("/ui/api/conversations")).data;
  renderList();
}

function renderList() {
  const query = ui.search.value.trim().toLowerCase();
  const shown = conversations.filter((c) => !query || c.title.toLowerCase().includes(query));
  ui.list.replaceChildren(...shown.map((c) => {
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
  if (query && !shown.length) ui.list.append(el("li", { className: "muted small", textContent: "No title matches." }));
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
  notify(pendingFor(id).length ? "Some of this conversation is kept in this browser only: it is saved when the server answers again." : "");
  pinned = true;
  renderMessages();
  renderList();
  closeSidebar();
}

function newConversation() {
  if (busy) return;
  current = blankConversation();
  history.replaceState(null, "", "/chat");
  clearError();
  notify("");
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

function titleOf(messages) {
  const first = messages.find((m) => m.role === "user");
  const text = (first ? textOf(first.content) : "New chat").replace(/\s+/g, " ").trim();
  return text.length > 60 ? `${text.slice(0, 57)}…` : text || "New chat";
}

/** The settings as they are now, on the server too (a rename, another model: PATCH, never the messages). */
async function saveSettings() {
  current.system_prompt = ui.system.value;
  current.options = readOptions();
  current.model = picker.value;
  if (!current.id) return;
  await apiJSON(`/ui/api/conversations/${current.id}`, { method: "PATCH", body: {
    model: current.model, system_prompt: current.system_prompt, options: current.options } });
}

/** Write messages[at:] (the new turn, or a new version of one); says so when it is kept here only. */
async function saveFrom(at) {
  const outcome = await writeTurns(current, at, current.messages.slice(at));
  if (outcome === "queued") notify("Not saved yet (the server does not answer): kept in this browser, saved when it answers again.");
  if (outcome === "merged") notify("This conversation was changed in another tab or device: your turn was added after that.");
  return outcome;
}

// --- messages ------------------------------------------------------------------------------------

const actions = {
  edit: (node, index) => editMessage(node, index),
  retry: () => generate({ at: current.messages.length }),
  regenerate: (index) => generate({ at: index, replaces: current.messages[index] }),
  continue: (index) => generate({ at: index, continues: current.messages[index] }),
  version: (index, k) => switchVersion(index, k).catch(showError),
};

function renderMessages(upTo = current.messages.length) {
  const nodes = current.messages.slice(0, upTo).map((_, index) => messageElement(current.messages, index, actions, !busy));
  if (!nodes.length && !streaming) nodes.push(el("p", { className: "empty-hint", textContent: "Start a conversation below." }));
  ui.messages.replaceChildren(...nodes);
  if (pinned) ui.messages.scrollTop = ui.messages.scrollHeight;
  ui.exportBox.hidden = !current.messages.length;
  document.body.dataset.messages = current.messages.length;
  scheduleMeter();
}

async function switchVersion(index, k) {
  if (busy) return;
  current.messages = withVersion(current.messages, index, k);
  renderMessages();
  await saveFrom(index);
  renderMessages();
}

function editMessage(node, index) {
  if (busy) return;
  const message = current.messages[index];
  const area = el("textarea", { value: textOf(message.content), rows: 3, "aria-label": "Edit message" });
  const isUser = message.role === "user";
  const save = el("button", { type: "button", className: "primary", textContent: isUser ? "Save & send" : "Save" });
  const cancel = el("button", { type: "button", textContent: "Cancel" });
  save.addEventListener("click", async () => {
    if (isUser && !area.value.trim()) return;
    const parts = mediaParts(message.content); // attachments go with the edited text
    const edited = { id: newId(), role: message.role, content: contentOf(area.value, parts) };
    if (!isUser && message.stats) edited.stats = { ...message.stats, finish_reason: "edited" };
    const before = current.messages;
    setBusy(true);
    current.messages = [...current.messages.slice(0, index), asNewVersion(current.messages, index, edited)];
    renderMessages();
    try {
      await saveFrom(index);
    } catch (error) {
      current.messages = before; // not saved: the edited text goes into the box, nothing is lost
      setBusy(false);
      renderMessages();
      if (!ui.prompt.value.trim()) setDraft(area.value, isUser ? parts : []);
      showError(error);
      return;
    }
    setBusy(false);
    if (isUser) await generate({ at: current.messages.length });
    else renderMessages();
  });
  cancel.addEventListener("click", () => renderMessages());
  node.replaceChildren(el("div", { className: "edit-box" }, area, el("div", { className: "row" }, cancel, save)));
  area.focus();
}

// --- generation -------------------------------------------------------------------------------

function apiMessages(messages) {
  const out = [];
  if (ui.system.value.trim()) out.push({ role: "system", content: ui.system.value });
  for (const m of messages) {
    const message = { role: m.role, content: apiContent(m.content) };
    if (m.tool_calls && m.tool_calls.length) message.tool_calls = m.tool_calls;
    if (m.tool_call_id) message.tool_call_id = m.tool_call_id;
    out.push(message);
  }
  return out;
}

/** Everything a turn needs that can be wrong, checked before anything leaves the box. */
function checkSettings(model, parts = []) {
  if (!model) return "Pick a model first.";
  const takes = modalitiesOf(picker.model);
  const refused = parts.map(partModality).find((m) => m && !takes.includes(m));
  if (refused) return `${model} does not take ${refused}: remove the attachment or pick a model that does.`;
  const o = readOptions();
  if (o.tools.trim()) {
    try {
      const tools = JSON.parse(o.tools);
      if (!Array.isArray(tools)) return "Tools must be a JSON list.";
    } catch (_) { return "Tools is not valid JSON."; }
  }
  return null;
}

function requestBody(base, continues) {
  const o = readOptions();
  const body = { model: picker.value, messages: apiMessages(continues ? [...base, continues] : base), stream: true,
    stream_options: { include_usage: true } };
  if (continues) {
    body.continue_final_message = true;
    body.add_generation_prompt = false;
  }
  if (o.temperature !== null) body.temperature = o.temperature;
  if (o.top_p !== null) body.top_p = o.top_p;
  if (o.max_tokens !== null) body.max_tokens = o.max_tokens;
  if (o.thinking !== "auto") body.chat_template_kwargs = { enable_thinking: o.thinking === "on" };
  if (o.tools.trim()) body.tools = JSON.parse(o.tools);
  return body;
}

function setBusy(state) {
  busy = state;
  document.body.classList.toggle("is-streaming", state);
  if (state) {
    document.body.dataset.busy = "true";
    document.body.dataset.turns = Number(document.body.dataset.turns || 0) + 1;
  } else {
    delete document.body.dataset.busy;
  }
}

function setStreaming(state) {
  streaming = state;
  ui.send.hidden = Boolean(state);
  ui.stop.hidden = !state;
}

/**
 * Stream an answer to messages[:at] and put it at `at`: after them (a new turn), in place of
 * `replaces` as its new version (Regenerate), or as the rest of `continues` (Continue).
 * The messages change only once the answer has something in it: a failed Regenerate keeps the old one.
 */
async function generate({ at, replaces = null, continues = null }) {
  if (busy) return;
  const problem = checkSettings(picker.value);
  if (problem) {
    showError(problem);
    return;
  }
  setBusy(true);
  clearError();
  try {
    await saveSettings().catch(() => {});
    await streamAnswer(at, replaces, continues);
  } finally {
    setBusy(false);
    renderMessages();
  }
}

async function streamAnswer(at, replaces, continues) {
  const base = current.messages.slice(0, at);
  const body = requestBody(base, continues);
  const answer = { id: newId(), role: "assistant", content: continues ? textOf(continues.content) : "",
    reasoning_content: continues ? continues.reasoning_content || "" : "", tool_calls: [] };
  renderMessages(at);
  const node = el("div", { className: "message assistant streaming" });
  ui.messages.append(node);
  fillAnswer(node, answer, true);
  const controller = new AbortController();
  setStreaming({ controller, answer, at, replaces, continues });
  const started = performance.now();
  let firstTokenAt = null;
  let usage = null;
  let finishReason = null;
  const repaint = paintOnNextFrame(() => {
    if (!node.isConnected) return;
    fillAnswer(node, answer, true);
    if (pinned) ui.messages.scrollTop = ui.messages.scrollHeight;
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
  setStreaming(null);
  const produced = answer.content || answer.reasoning_content || answer.tool_calls.length;
  if (!produced) return; // nothing new: the messages (and an answer being regenerated) stay as they were
  const ended = performance.now();
  const generatedFor = (ended - (firstTokenAt ?? ended)) / 1000;
  const tokens = usage ? usage.completion_tokens : null;
  answer.stats = {
    model: body.model, seconds: (ended - started) / 1000, usage, finish_reason: finishReason || "error",
    tokens_per_second: tokens && generatedFor > 0 ? Math.max(tokens - 1, 1) / generatedFor : null,
  };
  if (!answer.reasoning_content) delete answer.reasoning_content;
  if (!answer.tool_calls.length) delete answer.tool_calls;
  placeAnswer(answer, at, replaces, continues);
  ui.announce.textContent = textOf(answer.content) || "The answer is a tool call.";
  renderMessages();
  try {
    await saveFrom(at);
  } catch (error) {
    showError(error);
  }
  picker.refresh().catch(() => {});
}

function placeAnswer(answer, at, replaces, continues) {
  if (continues) {
    current.messages = [...current.messages.slice(0, at), { ...continues, ...answer, id: continues.id }];
  } else if (replaces) {
    current.messages = [...current.messages.slice(0, at), asNewVersion(current.messages, at, answer)];
  } else {
    current.messages = [...current.messages.slice(0, at), answer];
  }
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

/** Send the box: checked first (the text stays in the box on any problem), saved, then answered. */
async function send() {
  const text = ui.prompt.value;
  if (!text.trim() || busy) return;
  const problem = checkSettings(picker.value, pending);
  if (problem) {
    showError(problem);
    return;
  }
  clearError();
  const message = { id: newId(), role: "user", content: contentOf(text, pending) };
  const parts = pending;
  setBusy(true);
  current.messages = [...current.messages, message];
  setDraft("", []);
  renderMessages();
  try {
    await saveSettings().catch(() => {});
    if (current.id) {
      const outcome = await saveFrom(current.messages.length - 1);
      if (outcome === "queued") throw new Error("The server does not answer");
    } else {
      await createConversation(current, titleOf(current.messages));
      history.replaceState(null, "", `/chat?c=${current.id}`);
      refreshList().catch(() => {});
    }
  } catch (error) {
    // Not saved, so not sent: the message goes back into the box.
    current.messages = current.messages.filter((m) => m !== message);
    setDraft(text, parts);
    setBusy(false);
    renderMessages();
    showError(`${messageOf(error)} Your message is back in the box.`);
    return;
  }
  setBusy(false);
  await generate({ at: current.messages.length });
}

// --- the composer: draft, attachments, context meter ------------------------------------------

function setDraft(text, parts) {
  ui.prompt.value = text;
  pending = parts;
  growComposer();
  renderAttachments();
}

function growComposer() {
  ui.prompt.style.height = "auto";
  ui.prompt.style.height = `${Math.min(ui.prompt.scrollHeight + 2, window.innerHeight * 0.4)}px`;
}

function renderAttachments() {
  ui.attachments.replaceChildren(...pending.map((part, index) => {
    const remove = el("button", { type: "button", className: "remove", textContent: "✕", "aria-label": `Remove ${part.name}` });
    remove.addEventListener("click", () => {
      pending = pending.filter((_, i) => i !== index);
      renderAttachments();
    });
    return el("div", { className: "attachment" }, partView(part), remove);
  }));
  ui.attachments.hidden = !pending.length;
}

/** The attach button only for models that take media, saying why when greyed out. */
function showAttachable() {
  const takes = modalitiesOf(picker.model).filter((m) => m !== "text");
  const accept = { image: "image/*", audio: "audio/wav,audio/x-wav,audio/mpeg", video: "video/*" };
  ui.attach.accept = takes.map((m) => accept[m]).join(",");
  ui.attach.disabled = !takes.length;
  ui.attachLabel.classList.toggle("disabled", !takes.length);
  ui.attachLabel.title = takes.length ? `Attach ${takes.join(", ")} (or paste or drop it here)` : "";
  ui.attachWhy.textContent = takes.length || !picker.value ? "" : `${picker.value} takes text only: no attachments.`;
}

async function addFiles(files) {
  const takes = modalitiesOf(picker.model);
  for (const file of files) {
    const modality = modalityOf(file.type);
    if (!modality || !takes.includes(modality)) {
      showError(`${picker.value || "This model"} does not take ${modality || file.type || "this file"}: pick a model that does.`);
      continue;
    }
    try {
      pending = [...pending, await partOf(file)];
    } catch (error) {
      showError(error.message);
    }
  }
  renderAttachments();
}

let meterTimer = null;

function scheduleMeter() {
  clearTimeout(meterTimer);
  meterTimer = setTimeout(() => measureContext().catch(() => { ui.meter.textContent = ""; }), 700);
}

/** Tokens the conversation (and the draft) takes of the model's context, as /tokenize counts them. */
async function measureContext() {
  if (!picker.value || busy) return;
  const texts = current.messages.map((m) => ({ role: m.role, content: textOf(m.content) }));
  if (ui.prompt.value.trim()) texts.push({ role: "user", content: ui.prompt.value });
  if (!texts.length) {
    ui.meter.textContent = "";
    return;
  }
  const counted = await apiJSON("/tokenize", { method: "POST", body: { model: picker.value, messages: texts } });
  ui.meter.textContent = counted.max_model_len ? `${counted.count} / ${counted.max_model_len} tokens`
    : `${counted.count} tokens`;
  ui.meter.classList.toggle("full", Boolean(counted.max_model_len) && counted.count > 0.9 * counted.max_model_len);
}

// --- wiring ---------------------------------------------------------------------------------------

function closeSidebar() {
  ui.sidebar.classList.remove("open");
  ui.backdrop.hidden = true;
  ui.toggle.setAttribute("aria-expanded", "false");
}

function openSidebar() {
  ui.sidebar.classList.add("open");
  ui.backdrop.hidden = false;
  ui.toggle.setAttribute("aria-expanded", "true");
  ui.search.focus();
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
ui.prompt.addEventListener("input", () => {
  growComposer();
  scheduleMeter();
});
ui.prompt.addEventListener("paste", (event) => {
  const files = [...(event.clipboardData?.files || [])];
  if (files.length) {
    event.preventDefault();
    addFiles(files);
  }
});
ui.composer.addEventListener("dragover", (event) => {
  event.preventDefault();
  ui.composer.classList.add("dropping");
});
ui.composer.addEventListener("dragleave", () => ui.composer.classList.remove("dropping"));
ui.composer.addEventListener("drop", (event) => {
  event.preventDefault();
  ui.composer.classList.remove("dropping");
  addFiles([...(event.dataTransfer?.files || [])]);
});
ui.attach.addEventListener("change", () => {
  addFiles([...ui.attach.files]);
  ui.attach.value = "";
});
ui.messages.addEventListener("scroll", () => {
  pinned = ui.messages.scrollHeight - ui.messages.scrollTop - ui.messages.clientHeight < 40;
});
ui.stop.addEventListener("click", () => {
  if (streaming) streaming.controller.abort();
  ui.prompt.focus();
});
document.addEventListener("keydown", (event) => {
  if (event.key !== "Escape") return;
  if (ui.sidebar.classList.contains("open")) closeSidebar();
  else if (streaming) {
    streaming.controller.abort();
    ui.prompt.focus();
  }
});
window.addEventListener("pagehide", () => {
  // The tab is closing mid-answer: the partial answer is kept (outbox + a request that outlives the page).
  if (!streaming || !current.id) return;
  const { answer, at, replaces, continues } = streaming;
  if (!answer.content && !answer.reasoning_content) return;
  const partial = { ...answer, stats: { model: picker.value, finish_reason: "stopped" } };
  if (!partial.tool_calls.length) delete partial.tool_calls;
  if (!partial.reasoning_content) delete partial.reasoning_content;
  placeAnswer(partial, at, replaces, continues);
  saveOnLeave(current, at, current.messages.slice(at));
});
$("new-chat").addEventListener("click", newConversation);
ui.toggle.addEventListener("click", () => (ui.sidebar.classList.contains("open") ? closeSidebar() : openSidebar()));
$("sidebar-close").addEventListener("click", closeSidebar);
ui.backdrop.addEventListener("click", closeSidebar);
ui.search.addEventListener("input", renderList);
$("export-md").addEventListener("click", () => exportMarkdown(current));
$("export-json").addEventListener("click", () => exportJSON(current));
$("import").addEventListener("change", async (event) => {
  const [file] = event.target.files;
  event.target.value = "";
  if (!file) return;
  try {
    const id = await importFile(file);
    await refreshList();
    await openConversation(id);
  } catch (error) { showError(error); }
});
picker.onChange = () => {
  showAttachable();
  scheduleMeter();
};

async function start() {
  const flushed = await flushOutbox().catch(() => new Set());
  await Promise.all([picker.refresh().catch(showError), refreshList()]);
  const id = parseInt(new URLSearchParams(location.search).get("c"), 10);
  if (Number.isFinite(id)) await openConversation(id);
  else renderMessages();
  if (flushed.size) notify("Turns kept in this browser while the server was away are saved now.");
  showAttachable();
  growComposer();
  document.body.dataset.ready = "true";
}

start().catch((error) => {
  showError(error);
  document.body.dataset.ready = "true";
});
