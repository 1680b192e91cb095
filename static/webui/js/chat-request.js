// What the chat page sends: the settings as options, the checks made before a message leaves the box,
// the /v1/chat/completions body (a new answer, or the rest of one with continue_final_message), its
// max_tokens fitted to the context, and tool-call deltas merged as they stream.
import { APIProblem, apiJSON } from "./api.js";
import { apiContent, partModality } from "./attachments.js";

function numberOrNull(input, parse = parseFloat) {
  const value = parse(input.value);
  return Number.isFinite(value) ? value : null;
}

/** fields: {temperature, topP, maxTokens, thinking, tools} inputs. */
export function readOptions(fields) {
  return {
    temperature: numberOrNull(fields.temperature), top_p: numberOrNull(fields.topP),
    max_tokens: numberOrNull(fields.maxTokens, (v) => parseInt(v, 10)), thinking: fields.thinking.value,
    tools: fields.tools.value, overflow: fields.overflow.value,
  };
}

export function apiMessages(system, messages) {
  const out = [];
  if (system.trim()) out.push({ role: "system", content: system });
  for (const m of messages) {
    const message = { role: m.role, content: apiContent(m.content) };
    if (m.tool_calls && m.tool_calls.length) message.tool_calls = m.tool_calls;
    if (m.tool_call_id) message.tool_call_id = m.tool_call_id;
    out.push(message);
  }
  return out;
}

/** Everything a turn needs that can be wrong, checked before anything leaves the box: a problem, or null. */
export function checkSettings(model, takes, options, parts = []) {
  if (!model) return "Pick a model first.";
  const refused = parts.map(partModality).find((m) => m && !takes.includes(m));
  if (refused) return `${model} does not take ${refused}: remove the attachment or pick a model that does.`;
  if (options.tools.trim()) {
    try {
      const tools = JSON.parse(options.tools);
      if (!Array.isArray(tools)) return "Tools must be a JSON list.";
    } catch (_) { return "Tools is not valid JSON."; }
  }
  return null;
}

/** The streamed request for an answer to `base` (or, with `continues`, the rest of that answer). */
export function requestBody({ model, system, options, base, continues }) {
  const o = options;
  const body = { model, messages: apiMessages(system, continues ? [...base, continues] : base), stream: true,
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

const TEMPLATE_FIELDS = ["tools", "chat_template_kwargs", "continue_final_message", "add_generation_prompt"];

/** The /tokenize body that counts `body`'s prompt as the request renders it. */
export function tokenizeBody(body) {
  const asked = { model: body.model, messages: body.messages };
  for (const field of TEMPLATE_FIELDS) if (field in body) asked[field] = body[field];
  return asked;
}

/**
 * A remembered Max tokens may be more than the context has left after the conversation: lower the
 * body's max_tokens to what is left and return a note saying so (null when it fits or is not set).
 * The prompt is counted by /tokenize exactly as the request renders it (free for the pages: it spends
 * no request quota). Throws an APIProblem when the prompt leaves no room at all.
 */
export async function fitToContext(body, known = null) {
  if (body.max_tokens === undefined) return null; // unset: the server gives the answer the rest of the context
  let counted = known;
  try {
    counted ??= await apiJSON("/tokenize", { method: "POST", body: tokenizeBody(body) });
  } catch (error) {
    if (error.code !== "context_length_exceeded") return null; // not counted: the answer's request will say why
    counted = { count: null, max_model_len: null };
  }
  const { count, max_model_len: limit } = counted;
  const left = limit && count !== null ? limit - count : 0;
  if (left >= body.max_tokens) return null;
  if (left < 1) {
    throw new APIProblem(`This conversation fills ${body.model}'s context${limit ? ` (${count} of ${limit} tokens)` : ""}: `
      + "start a new chat, or edit an earlier message to shorten it.", { status: 400, code: "context_length_exceeded" });
  }
  const note = `Max tokens is ${body.max_tokens}, but the conversation takes ${count} of the model's ${limit} tokens: `
    + `this answer may have at most ${left}.`;
  body.max_tokens = left;
  return note;
}

export function mergeToolCall(calls, delta) {
  let call = calls[delta.index];
  if (!call) {
    call = calls[delta.index] = { id: delta.id || "", type: "function", function: { name: "", arguments: "" } };
  }
  if (delta.id) call.id = delta.id;
  if (delta.function && delta.function.name) call.function.name += delta.function.name;
  if (delta.function && delta.function.arguments) call.function.arguments += delta.function.arguments;
}
