// /account: the team, its limits and what is left (GET /v1/key, as any client), the user's usage
// over time and their own keys (/ui/api/usage, /ui/api/keys), and the team's batches (GET /v1/batches,
// POST /v1/batches/{id}/cancel, the files from GET /v1/files/{id}/content: the public API, with the session).
import { apiJSON } from "./api.js";
import { showErrorIn } from "./banner.js";
import { Connection } from "./connection.js";
import { $, el } from "./dom.js";

// The server cannot be reached: a banner and retries with backoff; once it answers, the page is read again.
const connection = new Connection({ check: () => apiJSON("/v1/key"), back: () => location.reload() });

function showError(error) { showErrorIn($("error"), connection, error); }

const show = (value) => (value === null || value === undefined ? "–" : String(value));
const when = (iso) => (iso ? new Date(iso).toLocaleString() : "–");

function row(cells, header = false) {
  return el("tr", {}, ...cells.map((cell) => el(header ? "th" : "td", {},
    cell instanceof Node ? cell : document.createTextNode(show(cell)))));
}

function renderStatus(status) {
  const team = $("team");
  const models = status.models ? status.models.join(", ") : "every model";
  for (const [term, value] of [["Team", status.team], ["Models", models],
    ["Token budget", status.limit === null ? "none" : `${status.limit} tokens per ${status.limit_period_days} days`],
    ["Used this period", `${status.usage} tokens (${status.period_requests} requests)`],
    ["Budget left", status.limit_remaining === null ? "no budget" : `${status.limit_remaining} tokens`],
    ["Period resets", when(status.limit_reset)]]) {
    team.append(el("dt", { textContent: term }), el("dd", { textContent: value }));
  }
  $("limits").replaceChildren(
    row(["scope", "requests/min", "left", "tokens/min", "left", "parallel", "in flight"], true),
    ...status.rate_limit.map((s) => row([s.scope, s.requests_per_minute, s.remaining_requests, s.tokens_per_minute,
      s.remaining_tokens, s.max_parallel_requests, s.in_flight])));
}

function renderUsage(days) {
  const tokens = days.map((d) => d.prompt_tokens + d.completion_tokens);
  const most = Math.max(1, ...tokens);
  $("usage-bars").replaceChildren(...days.map((d, i) => {
    const bar = el("div", { className: "bar", title: `${d.day}: ${tokens[i]} tokens, ${d.requests} requests` });
    bar.style.height = `${(100 * tokens[i]) / most}%`;
    return bar;
  }));
  const used = days.filter((d) => d.requests);
  const total = (field) => used.reduce((sum, d) => sum + d[field], 0);
  $("usage-summary").textContent = `Last ${days.length} days: ${total("requests")} requests, `
    + `${total("prompt_tokens")} prompt + ${total("completion_tokens")} completion tokens (pages and keys).`;
  $("usage-table").replaceChildren(row(["day", "requests", "prompt tokens", "completion tokens"], true),
    ...used.reverse().map((d) => row([d.day, d.requests, d.prompt_tokens, d.completion_tokens])));
}

function renderKeys(keys) {
  $("keys").replaceChildren(row(["name", "key", "created", "last used", "expires", "status",
    el("span", { className: "sr-only", textContent: "action" })], true),
    ...keys.map((key) => {
      let action = "";
      if (key.active) {
        action = el("button", { type: "button", className: "small", textContent: "Revoke" });
        action.addEventListener("click", () => revoke(key).catch(showError));
      }
      const status = key.revoked_at ? "revoked" : key.active ? "active" : "expired";
      const tr = row([key.name, `${key.prefix}…`, when(key.created_at), when(key.last_used_at),
        when(key.expires_at), status, action]);
      tr.dataset.keyId = key.id;
      return tr;
    }));
}

async function refreshKeys() {
  renderKeys((await apiJSON("/ui/api/keys")).data);
}

async function revoke(key) {
  await apiJSON(`/ui/api/keys/${key.id}`, { method: "DELETE" });
  await refreshKeys();
}

const ACTIVE = new Set(["validating", "in_progress", "finalizing", "cancelling"]);
const CANCELLABLE = new Set(["validating", "in_progress"]);
const PAGE = 20;
const POLL_MS = 2000;
let batches = [];
let moreBatches = false;
let pollTimer = null;

function fileLink(fileId, name, text) {
  return el("a", { href: `/v1/files/${encodeURIComponent(fileId)}/content`, download: name, textContent: text });
}

const shortTime = (seconds) => (seconds
  ? new Date(seconds * 1000).toLocaleString(undefined, { dateStyle: "short", timeStyle: "short" }) : "–");

function batchRow(batch) {
  const counts = batch.request_counts || { completed: 0, failed: 0, total: 0 };
  const links = el("span", { className: "file-links" });
  if (batch.output_file_id) links.append(fileLink(batch.output_file_id, `${batch.id}_output.jsonl`, "output"), " ");
  if (batch.error_file_id) links.append(fileLink(batch.error_file_id, `${batch.id}_errors.jsonl`, "errors"));
  const status = el("span", { className: "batch-status" }, batch.status.replace("_", " "));
  const firstError = batch.errors && batch.errors.data && batch.errors.data[0];
  if (firstError) status.title = `${firstError.message}${firstError.line ? ` (line ${firstError.line})` : ""}`;
  if (CANCELLABLE.has(batch.status)) {
    const cancel = el("button", { type: "button", className: "small", textContent: "Cancel" });
    cancel.addEventListener("click", () => cancelBatch(batch, cancel).catch(showError));
    status.append(" ", cancel);
  }
  const tr = row([el("code", { textContent: batch.id }), batch.endpoint, status,
    `${counts.completed} / ${counts.failed} / ${counts.total}`, shortTime(batch.created_at),
    links.childNodes.length ? links : "–"]);
  tr.dataset.batchId = batch.id;
  tr.dataset.status = batch.status;
  return tr;
}

function renderBatches() {
  $("batches-empty").hidden = batches.length > 0;
  $("batches").hidden = batches.length === 0;
  $("batches").replaceChildren(
    row(["batch", "endpoint", "status", "done / failed / total", "created", "files"], true),
    ...batches.map(batchRow));
  $("more-batches").hidden = !moreBatches;
}

/** The newest batches again (as many as are shown), polled while any of them is still running. */
async function refreshBatches() {
  const limit = Math.min(100, Math.max(PAGE, batches.length));
  const page = await apiJSON(`/v1/batches?limit=${limit}`);
  batches = page.data;
  moreBatches = page.has_more;
  renderBatches();
  clearTimeout(pollTimer);
  if (batches.some((b) => ACTIVE.has(b.status)) && !document.hidden) {
    pollTimer = setTimeout(() => refreshBatches().catch(showError), POLL_MS);
  }
}

async function cancelBatch(batch, button) {
  button.disabled = true;
  await apiJSON(`/v1/batches/${encodeURIComponent(batch.id)}/cancel`, { method: "POST" });
  await refreshBatches();
}

$("more-batches").addEventListener("click", async () => {
  try {
    const last = batches[batches.length - 1];
    const page = await apiJSON(`/v1/batches?limit=${PAGE}&after=${encodeURIComponent(last.id)}`);
    batches = [...batches, ...page.data.filter((b) => !batches.some((o) => o.id === b.id))];
    moreBatches = page.has_more;
    renderBatches();
  } catch (error) {
    showError(error);
  }
});

document.addEventListener("visibilitychange", () => {
  if (!document.hidden && batches.some((b) => ACTIVE.has(b.status))) refreshBatches().catch(showError);
});

$("new-key").addEventListener("submit", async (event) => {
  event.preventDefault();
  const days = parseFloat($("key-days").value);
  try {
    const created = await apiJSON("/ui/api/keys", { method: "POST", body: {
      name: $("key-name").value, expires_days: Number.isFinite(days) ? days : null } });
    $("secret").textContent = created.secret;
    $("secret-box").hidden = false;
    $("key-name").value = "";
    $("key-days").value = "";
    await refreshKeys();
  } catch (error) {
    showError(error);
  }
});

$("copy-secret").addEventListener("click", () => {
  navigator.clipboard.writeText($("secret").textContent).then(
    () => { $("copy-secret").textContent = "Copied"; },
    () => { window.getSelection().selectAllChildren($("secret")); });
});

async function start() {
  const [status, usage] = await Promise.all([apiJSON("/v1/key"), apiJSON("/ui/api/usage?days=30")]);
  renderStatus(status.data);
  renderUsage(usage.data);
  await Promise.all([refreshKeys(), refreshBatches()]);
  document.body.dataset.ready = "true";
}

start().catch((error) => {
  showError(error);
  document.body.dataset.ready = "true";
});
