// What of a conversation goes into the next request when it does not all fit the model's context: the chat's
// "Context overflow" setting. Counted by /tokenize exactly as the request renders (free for the pages).
//
//   rolling  (default) the oldest turns after the system prompt are left out until the rest fits with room
//            for an answer;
//   middle   the first turn is kept (it often says what the chat is about), the turns after it are left out,
//            oldest first, then the first one too if that is still not enough;
//   stop     nothing is left out: the page says the chat is full before sending, and offers a new chat
//            with the last turns carried over.
//
// A turn is a user message and what answers it (assistant messages, tool results); the last turn is always
// sent. What was left out is a list of [from, to) ranges of message indexes, kept in the answer's stats.
import { apiJSON } from "./api.js";

export const OVERFLOW = { rolling: "rolling window", middle: "truncate middle", stop: "stop at the limit" };
export const DEFAULT_OVERFLOW = "rolling";
export const NOT_SENT = "not sent: beyond the context";

/** Tokens kept free for the answer: Max tokens when set (at most half the context), else a quarter of
 * the context, at most 1024. */
export function answerRoom(limit, maxTokens) {
  if (maxTokens) return Math.min(maxTokens, Math.floor(limit / 2));
  return Math.min(1024, Math.floor(limit / 4));
}

/** [from, to) ranges of the turns before the last one (anything before the first user message goes with it). */
export function turnsOf(messages) {
  const starts = [];
  messages.forEach((m, i) => { if (m.role === "user") starts.push(i); });
  if (!starts.length) return { droppable: [], last: 0 };
  const bounds = [0, ...starts.slice(1), messages.length];
  const turns = bounds.slice(0, -1).map((from, i) => [from, bounds[i + 1]]);
  return { droppable: turns.slice(0, -1), last: turns[turns.length - 1][0] };
}

/** The order turns are left out in under `policy`. */
function dropOrder(droppable, policy) {
  return policy === "middle" ? [...droppable.slice(1), ...droppable.slice(0, 1)] : droppable;
}

/** Ranges, sorted and joined where they touch. */
export function joined(ranges) {
  const out = [];
  for (const [from, to] of [...ranges].sort((a, b) => a[0] - b[0])) {
    const last = out[out.length - 1];
    if (last && last[1] >= from) last[1] = Math.max(last[1], to);
    else out.push([from, to]);
  }
  return out;
}

export const isLeftOut = (ranges, index) => (ranges || []).some(([from, to]) => index >= from && index < to);

/** How many messages the ranges leave out. */
export const leftOutCount = (ranges) => (ranges || []).reduce((n, [from, to]) => n + to - from, 0);

/**
 * Which of `messages` the next request sends. `count(kept)` counts a request with those messages (the
 * system prompt, tools and template options as the page sends them) and resolves to {count, max_model_len},
 * or to null when /tokenize says it is over the context. Resolves to
 *   {fits, notSent: [[from, to)…], count, limit, room, lastTurnAlone?}
 * The fewest turns are left out that leave `room` for the answer; when even the last turn leaves less, it is
 * sent alone as long as it leaves any (Max tokens is then lowered to what is left, as for any request).
 * fits false: "stop" and no room for an answer, or the last turn alone fills the context.
 */
export async function planContext(messages, { policy = DEFAULT_OVERFLOW, maxTokens = null, count }) {
  const whole = await count(messages);
  if (whole && !whole.max_model_len) return { fits: true, notSent: [], count: whole.count, limit: null, room: 0 };
  const { droppable, last } = turnsOf(messages);
  // Over the context the count says nothing of the limit: the last turn alone says it (or nothing does).
  const lastTurn = whole || await count(messages.slice(last));
  if (!lastTurn) return { fits: false, notSent: [], count: null, limit: null, room: 0, lastTurnAlone: true };
  const limit = lastTurn.max_model_len;
  const room = answerRoom(limit, maxTokens);
  const plan = (fits, notSent, counted, extra = {}) => ({ fits, notSent, count: counted ? counted.count : null, limit, room, ...extra });
  if (whole && whole.count + room <= limit) return plan(true, [], whole);
  // One turn only: nothing to leave out, nothing a new chat would change; sent if it leaves any room at all.
  if (!droppable.length) {
    return whole && whole.count < limit ? plan(true, [], whole) : plan(false, [], whole, { lastTurnAlone: true });
  }
  if (policy === "stop") return plan(false, [], whole);
  const order = dropOrder(droppable, policy);
  const rangesWithout = (k) => joined(order.slice(0, k));
  const countWithout = (k) => count(messages.filter((_, i) => !isLeftOut(rangesWithout(k), i)));
  // Leaving out more never counts more: the fewest turns that leave room, by a binary search.
  const all = await countWithout(order.length);
  if (!all || all.count + room > limit) {
    return all && all.count < limit ? plan(true, rangesWithout(order.length), all)
      : plan(false, rangesWithout(order.length), all, { lastTurnAlone: true });
  }
  let [lo, hi, best] = [0, order.length, all]; // lo leaves no room, hi does
  while (hi - lo > 1) {
    const mid = (lo + hi) >> 1;
    const counted = await countWithout(mid);
    if (counted && counted.count + room <= limit) [hi, best] = [mid, counted];
    else lo = mid;
  }
  return plan(true, rangesWithout(hi), best);
}

/** A counter for planContext: `asked(messages)` is the /tokenize body for a request with those messages. */
export function tokenCounter(asked) {
  return async (messages) => {
    try {
      return await apiJSON("/tokenize", { method: "POST", body: asked(messages) });
    } catch (error) {
      if (error.code === "context_length_exceeded") return null;
      throw error;
    }
  };
}

/** The words for a plan that does not fit (under "stop", or a last turn longer than the context). */
export function fullMessage(plan, model, policy) {
  const numbers = plan.count && plan.limit ? ` (${plan.count} of its ${plan.limit} tokens, and an answer needs room too)`
    : plan.limit ? ` (more than its ${plan.limit} tokens)` : "";
  if (plan.lastTurnAlone) {
    return `Your last message alone is too long for ${model}'s context${plan.limit ? ` of ${plan.limit} tokens` : ""}: `
      + "nothing was sent. Shorten it, or pick a model with a longer context.";
  }
  return `This chat has reached the end of ${model}'s context${numbers}, and Context overflow is "${OVERFLOW[policy]}": `
    + "nothing was sent, your message stays in the box. Start a new chat with its last turns, or choose "
    + "another Context overflow in Settings.";
}

/** The last turns of `messages` that take at most `budget` tokens (at least the last turn). */
export async function lastTurnsWithin(messages, budget, count) {
  const { droppable, last } = turnsOf(messages);
  for (const [from] of droppable) {
    const counted = await count(messages.slice(from));
    if (counted && counted.count <= budget) return messages.slice(from);
  }
  return messages.slice(last);
}

/**
 * The playground's document under the rolling window (its one policy: a document has no turns, so
 * "truncate middle" does not apply, and its text is the user's to cut): when the document leaves no room
 * for `maxTokens`, its start is left out of the request, which sends the document's last tokens as token
 * ids; Max tokens is lowered to what is left, as in the chat. Changes `body` (prompt, max_tokens) and
 * resolves to null (it fits as it is), or {note, notSentChars} saying what was done.
 */
export async function fitDocument(body, text) {
  const tokenize = async (prompt) => {
    try {
      return await apiJSON("/tokenize", { method: "POST", body: { model: body.model, prompt } });
    } catch (error) {
      if (error.code === "context_length_exceeded") return null;
      throw error;
    }
  };
  // Over the context /tokenize gives no tokens: the document's end, shorter and shorter, until it does.
  let tail = text;
  let counted = await tokenize(tail);
  while (!counted && tail.length > 1) {
    tail = tail.slice(Math.floor(tail.length / 2));
    counted = await tokenize(tail);
  }
  if (!counted || !counted.max_model_len) return null; // not counted: the request will say why
  const limit = counted.max_model_len;
  const room = answerRoom(limit, body.max_tokens);
  const asked = body.max_tokens;
  if (tail === text && counted.count + asked <= limit) return null;
  if (tail === text && counted.count + room <= limit) {
    body.max_tokens = limit - counted.count;
    return { note: `Max tokens is ${asked}, but the text takes ${counted.count} of the model's ${limit} tokens: `
      + `this continuation may have at most ${body.max_tokens}.`, notSentChars: 0 };
  }
  const kept = counted.tokens.slice(-(limit - room));
  const keptText = (await apiJSON("/detokenize", { method: "POST", body: { model: body.model, tokens: kept } })).prompt;
  body.prompt = kept;
  body.max_tokens = Math.min(asked, limit - kept.length);
  const notSentChars = Math.max(0, text.length - keptText.length);
  return { notSentChars, note: `The first ${notSentChars} characters of the text were ${NOT_SENT} `
    + `(rolling window): the model continued its last ${kept.length} tokens of ${limit}.` };
}
