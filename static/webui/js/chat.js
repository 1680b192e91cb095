// /chat: streams /v1/chat/completions, renders Markdown, keeps conversations on the server turn by turn.
//
// Nothing typed is lost: a message is checked before it leaves the box; the user's turn is saved
// before the answer streams; the answer (whole or partial: stopped, failed, tab closed) is saved
// after; a failed Regenerate keeps the old answer; Regenerate and Edit keep earlier versions (‹ n/m ›).
// The box and its attachments are composer.js, the conversation list chat-list.js, the request chat-request.js.
import { APIProblem, apiJSON, messageOf, streamSSE, unreachable } from "./api.js";
import { contentOf, mediaParts, textOf } from "./attachments.js";
import { exportJSON, exportMarkdown, importFile } from "./chat-io.js";
import { ConversationList } from "./chat-list.js";
import { checkSettings, fitToContext, mergeToolCall, readOptions as optionsOf, requestBody, tokenizeBody } from "./chat-request.js";
import { createConversation, flushOutbox, newId, pendingFor, saveOnLeave, unqueue, writeTurns } from "./chat-store.js";
import { asNewVersion, fillAnswer, messageElement, withVersion } from "./chat-view.js";
import { clearUnreachable, showErrorIn } from "./banner.js";
import { Composer } from "./composer.js";
import { Connection } from "./connection.js";
import { DEFAULT_OVERFLOW, NOT_SENT, fullMessage, isLeftOut, lastTurnsWithin, planContext, tokenCounter } from "./context-window.js";
import { $, el, paintOnNextFrame } from "./dom.js";
import { ModelPicker, modalitiesOf, writesText } from "./models.js";

const ui = {
  messages: $("messages"), send: $("send"), stop: $("stop"), error: $("error"), notice: $("notice"),
  system: $("system-prompt"), temperature: $("temperature"), topP: $("top-p"), maxTokens: $("max-tokens"),
  thinking: $("thinking"), tools: $("tools"), announce: $("announce"), exportBox: $("export"),
  overflow: $("overflow"), contextFull: $("context-full"), carryOver: $("carry-over"),
};
// Chat needs a model that writes text: text, image and audio input (a speech-to-text model is not one).
const picker = new ModelPicker(document.querySelector("[data-model-picker]"), "chat.model", showError, writesText);
const composer = new Composer({ picker, showError, messages: () => current.messages, isBusy: () => busy,
  plan: (messages) => planFor(messages) });
const sidebar = new ConversationList({
  currentId: () => current.id, open: openConversation, showError,
  renamed: (id, title) => { if (current.id === id) current.title = title; },
  deleted: (id) => { if (current.id === id) newConversation(); },
});

// The server cannot be reached: a banner, retries with backoff; once it answers, what waited is saved.
const connection = new Connection({ check: () => picker.refresh(), back: reconnected });

let current = blankConversation();
let streaming = null; // {controller, answer, at, base} while an answer streams
let busy = false;      // from a send until the answer is saved: no second turn meanwhile
let pinned = true;     // the reader is at the bottom of the messages: keep them there as the answer grows
let fullPlan = null;   // the plan that did not fit (stop at the limit): what "New chat with the last turns" uses

function blankConversation() {
  return { id: null, version: 0, title: "", model: "", system_prompt: "", options: {}, messages: [] };
}

/** Show an error (a failure or a text); `cause`: the failure behind a text (the server unreachable starts
 * the retries, and the error goes once it answers). */
function showError(error, cause = error) { showErrorIn(ui.error, connection, error, cause); }

/** A failure of something the user did not ask for now (the model list, the conversation list): when the
 * server cannot be reached the banner says so, anything else is shown. */
function backgroundError(error) {
  if (unreachable(error)) connection.failed(error);
  else showError(error);
}

function clearError() {
  ui.error.hidden = true;
  ui.contextFull.hidden = true;
}

/** The server answers again: the turns kept in this browser are saved, the list is read again. */
async function reconnected() {
  clearUnreachable(ui.error);
  const flushed = await flushOutbox().catch(() => new Set());
  // The open conversation again when some of it waited here (or it could not be opened at all).
  const wanted = current.id ?? conversationInUrl();
  if (wanted !== null && !busy && (flushed.has(wanted) || current.id !== wanted)) {
    await openConversation(wanted).catch(backgroundError);
  }
  if (flushed.size) notify(KEPT_TURNS_SAVED);
  await sidebar.refresh().catch(backgroundError);
}

function conversationInUrl() {
  const id = parseInt(new URLSearchParams(location.search).get("c"), 10);
  return Number.isFinite(id) ? id : null;
}

const KEPT_TURNS_SAVED = "Turns kept in this browser while the server was away are saved now.";

/** Nothing can be sent while the server cannot be reached: the text stays in the box. */
function unreachableNow() {
  if (!connection.down) return false;
  showError("The server cannot be reached, so nothing was sent: your message stays in the box. "
    + "The page keeps trying; send it once the banner above is gone.");
  ui.error.dataset.unreachable = "true";
  return true;
}

function notify(text) {
  ui.notice.textContent = text;
  ui.notice.hidden = !text;
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
  ui.overflow.value = o.overflow || DEFAULT_OVERFLOW;
  picker.value = conversation.model;
  clearError();
  notify(pendingFor(id).length ? "Some of this conversation is kept in this browser only: it is saved when the server answers again." : "");
  pinned = true;
  renderMessages();
  sidebar.render();
  sidebar.close();
}

function newConversation() {
  if (busy) return;
  current = blankConversation();
  history.replaceState(null, "", "/chat");
  clearError();
  notify("");
  renderMessages();
  sidebar.render();
  sidebar.close();
  composer.focus();
}

function readOptions() { return optionsOf(ui); }

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
  markNotSent(leftOutNow());
  if (pinned) ui.messages.scrollTop = ui.messages.scrollHeight;
  ui.exportBox.hidden = !current.messages.length;
  document.body.dataset.messages = current.messages.length;
  composer.scheduleMeter();
}

/** The messages the latest request left out: the one streaming now, else the latest answer's. */
function leftOutNow() {
  if (streaming && streaming.notSent) return streaming.notSent;
  const latest = [...current.messages].reverse().find((m) => m.role === "assistant" && m.stats);
  return (latest && latest.stats.not_sent) || [];
}

/** Mark the drawn messages the request leaves out ("not sent: beyond the context"). */
function markNotSent(ranges) {
  [...ui.messages.querySelectorAll(":scope > .message:not(.streaming)")].forEach((node, index) => {
    const out = isLeftOut(ranges, index);
    node.classList.toggle("not-sent", out);
    const label = node.querySelector(":scope > .not-sent-label");
    if (out && !label) node.prepend(el("p", { className: "not-sent-label", textContent: NOT_SENT }));
    if (!out && label) label.remove();
  });
  document.body.dataset.notSent = ranges.reduce((n, [from, to]) => n + to - from, 0);
}

/** What the next request sends of `base` (the messages before the answer) under the chat's Context overflow. */
function planFor(base, continues = null) {
  const options = readOptions();
  const asked = (kept) => tokenizeBody(requestBody({ model: picker.value, system: ui.system.value, options, base: kept,
    continues }));
  return planContext(base, { policy: options.overflow, maxTokens: options.max_tokens, count: tokenCounter(asked) });
}

/** The chat is full (or its last message alone is too long): say so, nothing is sent. */
function showFull(plan) {
  const policy = readOptions().overflow;
  showError(fullMessage(plan, picker.value, policy));
  fullPlan = plan;
  ui.contextFull.hidden = Boolean(plan.lastTurnAlone) || !current.messages.length;
}

/**
 * "New chat with the last turns": the turns at the end of this chat that take at most half the model's
 * context are carried over (copied, as they are) into a new chat with the same model and settings; the
 * message in the box stays there, to be sent in the new chat. The old chat is kept as it is.
 */
async function carryOver() {
  if (busy || !current.messages.length) return;
  setBusy(true);
  try {
    const options = readOptions();
    const asked = (kept) => tokenizeBody(requestBody({ model: picker.value, system: ui.system.value, options, base: kept }));
    const limit = (fullPlan && fullPlan.limit) || 0;
    const kept = await lastTurnsWithin(current.messages, Math.floor(limit / 2), tokenCounter(asked));
    const title = current.title || titleOf(current.messages);
    const next = blankConversation();
    next.model = picker.value;
    next.system_prompt = ui.system.value;
    next.options = options;
    next.messages = kept.map(({ versions: _v, version_index: _i, stats, ...m }) => {
      const copy = { ...m, id: newId() };
      if (stats) {
        const { not_sent: _n, ...rest } = stats;
        copy.stats = rest;
      }
      return copy;
    });
    await createConversation(next, `${title.slice(0, 180)} (continued)`);
    current = next;
    history.replaceState(null, "", `/chat?c=${current.id}`);
    clearError();
    notify(`A new chat with the last ${kept.length} messages of "${title}" carried over; `
      + "the earlier ones stay in that chat. Your message is still in the box.");
    sidebar.refresh().catch(backgroundError);
  } catch (error) {
    showError(error);
  } finally {
    setBusy(false);
    renderMessages();
    composer.focus();
  }
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
      if (!composer.text.trim()) composer.setDraft(area.value, isUser ? parts : []);
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
async function generate({ at, replaces = null, continues = null, plan = null }) {
  if (busy || unreachableNow()) return;
  const problem = checkSettings(picker.value, modalitiesOf(picker.model), readOptions());
  if (problem) {
    showError(problem);
    return;
  }
  setBusy(true);
  clearError();
  try {
    await saveSettings().catch(() => {});
    await streamAnswer(at, replaces, continues, plan);
  } finally {
    setBusy(false);
    renderMessages();
  }
}

/** `plan`: what of messages[:at] the request sends (planContext), when send() has planned it already. */
async function streamAnswer(at, replaces, continues, plan) {
  const base = current.messages.slice(0, at);
  const body = requestBody({ model: picker.value, system: ui.system.value, options: readOptions(), base, continues });
  const ask = { notSent: [] };
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
    plan ??= await planFor(base, continues);
    if (!plan.fits) {
      setStreaming(null);
      node.remove();
      showFull(plan);
      return;
    }
    if (plan.notSent.length) {
      ask.notSent = streaming.notSent = plan.notSent;
      body.messages = requestBody({ model: body.model, system: ui.system.value, options: readOptions(),
        base: base.filter((_, i) => !isLeftOut(plan.notSent, i)), continues }).messages;
      markNotSent(plan.notSent);
    }
    const fitted = await fitToContext(body, plan.limit ? { count: plan.count, max_model_len: plan.limit } : null);
    if (fitted) notify(fitted);
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
  if (ask.notSent.length) answer.stats.not_sent = ask.notSent;
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
  picker.refresh().catch(backgroundError);
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

/** Send the box: checked first (the text stays in the box on any problem), saved, then answered. */
async function send() {
  const text = composer.text;
  if (!text.trim() || busy || unreachableNow()) return;
  const problem = checkSettings(picker.value, modalitiesOf(picker.model), readOptions(), composer.pending);
  if (problem) {
    showError(problem);
    return;
  }
  clearError();
  const message = { id: newId(), role: "user", content: contentOf(text, composer.pending) };
  const parts = composer.pending;
  setBusy(true);
  current.messages = [...current.messages, message];
  composer.setDraft("", []);
  renderMessages();
  let plan = null;
  try {
    // What of the chat this turn sends (Context overflow); "stop at the limit" says so before anything is saved.
    // Not counted (no worker now, say): the turn is saved as ever, and the answer's request says why.
    plan = await planFor(current.messages).catch(() => null);
    if (plan && !plan.fits) throw new APIProblem(fullMessage(plan, picker.value, readOptions().overflow));
    await saveSettings().catch(() => {});
    if (current.id) {
      const outcome = await saveFrom(current.messages.length - 1);
      if (outcome === "merged") plan = null; // other messages came first: planned again with them
      if (outcome === "queued") {
        unqueue(current.id, [message]); // it goes back into the box instead
        notify("");
        throw new APIProblem("The server does not answer now.");
      }
    } else {
      await createConversation(current, titleOf(current.messages));
      history.replaceState(null, "", `/chat?c=${current.id}`);
      sidebar.refresh().catch(() => {});
    }
  } catch (error) {
    // Not saved, so not sent: the message goes back into the box.
    current.messages = current.messages.filter((m) => m !== message);
    composer.setDraft(text, parts);
    setBusy(false);
    renderMessages();
    if (plan && !plan.fits) showFull(plan);
    else showError(`${messageOf(error)} Your message is back in the box.`, error);
    return;
  }
  setBusy(false);
  await generate({ at: current.messages.length, plan });
}

// --- wiring ---------------------------------------------------------------------------------------

ui.messages.addEventListener("scroll", () => {
  pinned = ui.messages.scrollHeight - ui.messages.scrollTop - ui.messages.clientHeight < 40;
});
ui.stop.addEventListener("click", () => {
  if (streaming) streaming.controller.abort();
  composer.focus();
});
document.addEventListener("keydown", (event) => {
  if (event.key !== "Escape") return;
  if (sidebar.isOpen) sidebar.close({ refocus: true });
  else if (streaming) {
    streaming.controller.abort();
    composer.focus();
  }
});
window.addEventListener("pagehide", () => {
  // The tab is closing mid-answer: the partial answer is kept (outbox + a request that outlives the page).
  if (!streaming || !current.id) return;
  const { answer, at, replaces, continues } = streaming;
  if (!answer.content && !answer.reasoning_content) return;
  const partial = { ...answer, stats: { model: picker.value, finish_reason: "stopped" } };
  if (streaming.notSent && streaming.notSent.length) partial.stats.not_sent = streaming.notSent;
  if (!partial.tool_calls.length) delete partial.tool_calls;
  if (!partial.reasoning_content) delete partial.reasoning_content;
  placeAnswer(partial, at, replaces, continues);
  saveOnLeave(current, at, current.messages.slice(at));
});
$("new-chat").addEventListener("click", newConversation);
ui.carryOver.addEventListener("click", carryOver);
ui.overflow.addEventListener("change", () => composer.scheduleMeter());
composer.onSend = send;
$("export-md").addEventListener("click", () => exportMarkdown(current));
$("export-json").addEventListener("click", () => exportJSON(current));
$("import").addEventListener("change", async (event) => {
  const [file] = event.target.files;
  event.target.value = "";
  if (!file) return;
  try {
    const id = await importFile(file);
    await sidebar.refresh();
    await openConversation(id);
  } catch (error) { showError(error); }
});
picker.onChange = () => {
  composer.showAttachable();
  composer.scheduleMeter();
};

async function start() {
  const flushed = await flushOutbox().catch(() => new Set());
  await Promise.all([picker.refresh().catch(backgroundError), sidebar.refresh().catch(backgroundError)]);
  const id = conversationInUrl();
  if (id !== null) await openConversation(id);
  else renderMessages();
  if (flushed.size) notify(KEPT_TURNS_SAVED);
  composer.showAttachable();
  composer.grow();
  document.body.dataset.ready = "true";
}

start().catch((error) => {
  showError(error);
  document.body.dataset.ready = "true";
});
