// The chat page's writes to /ui/api/conversations: turn by turn, each naming the version it saw.
//
// A stale writer (another tab or device wrote first) gets 409: it re-reads the conversation and adds
// its own messages after what is there now, so no writer overwrites a turn it has not seen. A write
// the server cannot take now (it is down, the network is gone, the tab is closing) waits in this
// browser's outbox (localStorage) and is sent when the page next loads. Messages carry their own
// ids, so a write that did reach the server is never added twice.
import { APIProblem, apiFetch, apiJSON, csrfToken } from "./api.js";

const OUTBOX = "chat.outbox";

export function newId() {
  if (window.crypto && crypto.randomUUID) return crypto.randomUUID();
  return `m${Date.now().toString(36)}${Math.random().toString(36).slice(2, 10)}`;
}

function readOutbox() {
  try { return JSON.parse(localStorage.getItem(OUTBOX)) || []; } catch (_) { return []; }
}

function writeOutbox(entries) {
  try {
    if (entries.length) localStorage.setItem(OUTBOX, JSON.stringify(entries));
    else localStorage.removeItem(OUTBOX);
    return true;
  } catch (_) {
    return false; // over the browser's quota (big attachments): the error on screen says it is not saved
  }
}

export function pendingFor(conversationId) {
  return readOutbox().filter((entry) => entry.conversation === conversationId);
}

/** A write the server could not take now (not one it refused): network down, 5xx. */
function isTransient(error) {
  return !(error instanceof APIProblem) || error.status >= 500 || error.status === 0;
}

/** The new conversation, created with its first messages; sets conv.id and conv.version. */
export async function createConversation(conv, title) {
  const saved = await apiJSON("/ui/api/conversations", { method: "POST", body: {
    title, model: conv.model, system_prompt: conv.system_prompt, options: conv.options, messages: conv.messages,
  } });
  conv.id = saved.id;
  conv.version = saved.version;
  conv.title = saved.title;
  return saved;
}

function postTurns(id, version, at, messages) {
  return apiJSON(`/ui/api/conversations/${id}/turns`, { method: "POST", body: { version, at, messages } });
}

const stripVersions = ({ versions, version_index: _, ...message }) => message;

/**
 * Append the messages after what the server has now (the 409 path, and the outbox): the ones it
 * already has (same id) are left out. Returns the conversation as the server then keeps it.
 */
async function appendMissing(id, messages) {
  const latest = await apiJSON(`/ui/api/conversations/${id}`);
  const have = new Set(latest.messages.map((m) => m.id).filter(Boolean));
  const missing = messages.filter((m) => !m.id || !have.has(m.id)).map(stripVersions);
  if (!missing.length) return latest;
  const saved = await postTurns(id, latest.version, latest.messages.length, missing);
  return { ...latest, version: saved.version, messages: [...latest.messages, ...missing] };
}

/**
 * Write `messages` in place of conv.messages[at:] on the server (at = length: an append).
 * Returns "saved", "merged" (another writer came first: conv.messages is now the server's, with
 * ours after it) or "queued" (kept in the outbox; conv unchanged). Throws what the server refused.
 */
export async function writeTurns(conv, at, messages) {
  try {
    const saved = await postTurns(conv.id, conv.version, at, messages);
    conv.version = saved.version;
    return "saved";
  } catch (error) {
    if (error instanceof APIProblem && error.status === 409) {
      const latest = await appendMissing(conv.id, messages);
      conv.messages = latest.messages;
      conv.version = latest.version;
      return "merged";
    }
    if (isTransient(error)) {
      queue(conv.id, messages);
      return "queued";
    }
    throw error;
  }
}

export function queue(conversationId, messages) {
  const entries = readOutbox().filter((e) => !(e.conversation === conversationId
    && e.messages.every((m) => messages.some((n) => n.id === m.id))));
  entries.push({ conversation: conversationId, messages });
  return writeOutbox(entries);
}

/**
 * The tab is closing while an answer streams: keep the partial answer in the outbox (synchronous),
 * and try to write it at once with a request that outlives the page.
 */
export function saveOnLeave(conv, at, messages) {
  queue(conv.id, messages);
  try {
    fetch(`/ui/api/conversations/${conv.id}/turns`, {
      method: "POST", keepalive: true, credentials: "same-origin",
      headers: { "X-CSRFToken": csrfToken(), "Content-Type": "application/json" },
      body: JSON.stringify({ version: conv.version, at, messages }),
    }).then((response) => { if (response.ok) unqueue(conv.id, messages); }).catch(() => {});
  } catch (_) { /* keepalive bodies are limited to 64 kB: the outbox has it */ }
}

/** Take messages out of the outbox (kept there by a write that is not wanted any more). */
export function unqueue(conversationId, messages) {
  const ids = new Set(messages.map((m) => m.id));
  writeOutbox(readOutbox().filter((e) => !(e.conversation === conversationId && e.messages.every((m) => ids.has(m.id)))));
}

/** Send what the outbox holds; returns the ids of the conversations that changed. */
export async function flushOutbox() {
  const changed = new Set();
  for (const entry of readOutbox()) {
    try {
      await appendMissing(entry.conversation, entry.messages);
      changed.add(entry.conversation);
      unqueue(entry.conversation, entry.messages);
    } catch (error) {
      if (error instanceof APIProblem && error.status === 404) unqueue(entry.conversation, entry.messages);
      // anything else: still down, try next time
    }
  }
  return changed;
}

export { apiFetch };
