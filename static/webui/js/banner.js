// The error banner, one for the three pages (chat, playground, account): what went wrong, in words, and whether
// the server could not be reached (data-unreachable), which the connection banner clears when it answers again.

import { messageOf, unreachable } from "./api.js";

/** Shows `error` (a string, or anything `messageOf` reads) in `element`; `cause` (the error itself unless the
 * text says it differently) tells the connection whether the server is unreachable. */
export function showErrorIn(element, connection, error, cause = error) {
  element.textContent = typeof error === "string" ? error : messageOf(error);
  element.hidden = false;
  element.dataset.unreachable = unreachable(cause);
  connection.failed(cause);
}

/** Hides the banner if what it shows was the server being unreachable (it answers again). */
export function clearUnreachable(element) {
  if (element.dataset.unreachable === "true") element.hidden = true;
}
