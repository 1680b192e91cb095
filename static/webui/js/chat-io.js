// A conversation out of the page (Markdown, or JSON in the chat API's message format) and back in.
import { apiJSON } from "./api.js";
import { apiContent, mediaParts, textOf } from "./attachments.js";
import { el } from "./dom.js";

function download(name, type, text) {
  const url = URL.createObjectURL(new Blob([text], { type }));
  const link = el("a", { href: url, download: name });
  document.body.append(link);
  link.click();
  link.remove();
  setTimeout(() => URL.revokeObjectURL(url), 10_000);
}

const fileName = (title, ext) => `${(title || "conversation").replace(/[^\w\- ]+/g, "").trim().slice(0, 60) || "conversation"}.${ext}`;

/** The conversation as the chat API's request would carry it: {model, messages: [system?, …]}. */
export function asOpenAI(conversation) {
  const messages = [];
  if (conversation.system_prompt) messages.push({ role: "system", content: conversation.system_prompt });
  for (const m of conversation.messages) {
    const message = { role: m.role, content: apiContent(m.content) };
    if (m.tool_calls) message.tool_calls = m.tool_calls;
    if (m.tool_call_id) message.tool_call_id = m.tool_call_id;
    messages.push(message);
  }
  return { title: conversation.title, model: conversation.model, messages };
}

export function exportJSON(conversation) {
  download(fileName(conversation.title, "json"), "application/json", `${JSON.stringify(asOpenAI(conversation), null, 2)}\n`);
}

export function exportMarkdown(conversation) {
  const lines = [`# ${conversation.title || "Conversation"}`, ""];
  if (conversation.model) lines.push(`Model: ${conversation.model}`, "");
  if (conversation.system_prompt) lines.push("## System", "", conversation.system_prompt, "");
  for (const m of conversation.messages) {
    lines.push(`## ${{ user: "User", assistant: "Assistant", tool: "Tool" }[m.role] || m.role}`, "");
    if (m.reasoning_content) lines.push("<details><summary>Reasoning</summary>", "", m.reasoning_content, "", "</details>", "");
    const text = textOf(m.content);
    if (text) lines.push(text, "");
    for (const part of mediaParts(m.content)) lines.push(`*(attachment: ${part.name || part.type})*`, "");
    for (const call of m.tool_calls || []) lines.push(`Tool call \`${call.function.name}\`:`, "", "```json", call.function.arguments, "```", "");
  }
  download(fileName(conversation.title, "md"), "text/markdown", lines.join("\n"));
}

/** A JSON file ({messages: […]} as exported, or a bare list of messages) as a new conversation; its id. */
export async function importFile(file) {
  let data;
  try {
    data = JSON.parse(await file.text());
  } catch (_) {
    throw new Error(`${file.name} is not JSON: import takes a conversation exported as JSON.`);
  }
  const list = Array.isArray(data) ? data : data && data.messages;
  if (!Array.isArray(list)) throw new Error(`${file.name} has no "messages" list.`);
  const system = list.filter((m) => m && m.role === "system").map((m) => textOf(m.content)).join("\n\n");
  const messages = list.filter((m) => m && m.role !== "system").map((m) => {
    const message = { role: m.role, content: m.content ?? null };
    if (m.tool_calls) message.tool_calls = m.tool_calls;
    if (m.tool_call_id) message.tool_call_id = m.tool_call_id;
    return message;
  });
  const first = messages.find((m) => m.role === "user");
  const title = (data.title || (first ? textOf(first.content) : "") || file.name).replace(/\s+/g, " ").trim().slice(0, 200);
  const saved = await apiJSON("/ui/api/conversations", { method: "POST", body: {
    title: title || "Imported", model: typeof data.model === "string" ? data.model.slice(0, 200) : "",
    system_prompt: system, messages } });
  return saved.id;
}
