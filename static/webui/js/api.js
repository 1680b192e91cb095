// The public API from our pages: same endpoints as the SDK, authenticated by the session cookie + CSRF header.

/** The CSRF token: our pages' meta tag, or a Django form's hidden field (the admin's pages). */
export function csrfToken() {
  const meta = document.querySelector('meta[name="csrf-token"]');
  if (meta) return meta.content;
  const field = document.querySelector("input[name=csrfmiddlewaretoken]");
  return field ? field.value : "";
}

const UNREACHABLE = "The server cannot be reached (is it running? is the network up?).";

/** fetch() with JSON body, the CSRF header and same-origin credentials; a network failure is an APIProblem
 * with status 0 (see `unreachable`). */
export async function apiFetch(path, { method = "GET", body, signal } = {}) {
  const headers = { "X-CSRFToken": csrfToken() };
  if (body !== undefined) headers["Content-Type"] = "application/json";
  try {
    return await fetch(path, {
      method, headers, signal, credentials: "same-origin",
      body: body === undefined ? undefined : JSON.stringify(body),
    });
  } catch (error) {
    if (error.name === "AbortError") throw error;
    throw new APIProblem(UNREACHABLE, { code: "unreachable" });
  }
}

/** An error a page can show: its text says what happened and what to do. */
export class APIProblem extends Error {
  constructor(message, { status = 0, code = null, retryAfter = null } = {}) {
    super(message);
    this.status = status;
    this.code = code;
    this.retryAfter = retryAfter;
  }
}

/** The OpenAI-shaped error of a response (or a stream's error event) as a message for people. */
export function describeError(status, error, retryAfter) {
  const message = (error && error.message) || `The server answered ${status}.`;
  const code = error && error.code;
  const wait = retryAfter ? ` Try again in ${retryAfter} s.` : "";
  if (status === 401) return "You are not logged in any more: reload the page and log in again.";
  if (status === 429) {
    const said = /try again/i.test(message) ? message : `${message}${wait || " Try again shortly."}`;
    return /rate limit/i.test(said) ? said : `Rate limit reached: ${said}`;
  }
  if (status === 503 && code === "no_worker") return `No inference worker is available right now.${wait}`;
  if (status === 503) return `The service is unavailable: ${message}${wait}`;
  if (status === 409) return `${message}${wait}`;
  return message;
}

export async function problemOf(response) {
  let error = null;
  try {
    error = (await response.json()).error;
  } catch (_) { /* not JSON */ }
  const retryAfter = response.headers.get("Retry-After");
  return new APIProblem(describeError(response.status, error, retryAfter),
    { status: response.status, code: error && error.code, retryAfter });
}

/** GET/POST/... returning parsed JSON, or throwing an APIProblem. */
export async function apiJSON(path, options) {
  const response = await apiFetch(path, options);
  if (!response.ok) throw await problemOf(response);
  return response.status === 204 ? null : response.json();
}

/**
 * POST a streaming request and call onEvent(parsed JSON) for each SSE `data:` event until `[DONE]`.
 * An error event in the stream (`{"error": …}`) throws an APIProblem. Aborting `signal` closes the
 * connection, which makes the server cancel the generation. A stream that closes before `[DONE]` was cut
 * off (the server stopped, the network went): that throws too, unless `endsWithDone` is false.
 */
export async function streamSSE(path, body, onEvent, signal, { endsWithDone = true } = {}) {
  const response = await apiFetch(path, { method: "POST", body, signal });
  if (!response.ok) throw await problemOf(response);
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    let value, done;
    try {
      ({ value, done } = await reader.read());
    } catch (error) {
      if (error.name === "AbortError") throw error;
      done = true; // the connection broke
    }
    if (done && !endsWithDone) return;
    if (done) throw new APIProblem("The answer was cut off: the connection to the server closed before it ended.");
    buffer += decoder.decode(value, { stream: true }).replace(/\r\n/g, "\n");
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const frame = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      const data = frame.split("\n").filter((l) => l.startsWith("data:")).map((l) => l.slice(5).trimStart()).join("\n");
      if (!data) continue; // a comment (": accepted") or an empty frame
      if (data === "[DONE]") return;
      const event = JSON.parse(data);
      if (event.error) {
        throw new APIProblem(describeError(statusOfCode(event.error), event.error, null),
          { status: statusOfCode(event.error), code: event.error.code });
      }
      onEvent(event);
    }
  }
}

function statusOfCode(error) {
  return { rate_limit_error: 429, service_unavailable: 503, authentication_error: 401 }[error.type] || 400;
}

/**
 * Whether a failure is the network's: the server could not be reached or an answer was cut off before
 * its end (status 0). A refusal of the server's (an HTTP error) is an answer; a Stop is neither.
 */
export const unreachable = (error) => error instanceof APIProblem && error.status === 0;

/** A message for any failure of a request: ours, the network's, or a Stop. */
export function messageOf(error) {
  if (error instanceof APIProblem) return error.message;
  if (error && error.name === "AbortError") return "Stopped.";
  return `The request failed: ${error && error.message ? error.message : error}.`;
}
