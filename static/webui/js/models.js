// The model picker: /v1/models (with each model's status) and /load_model's progress events.
import { APIProblem, apiJSON, streamSSE, unreachable } from "./api.js";

/** The statuses of a model in memory (degraded: loaded, but failing most of its recent requests). */
const IN_MEMORY = new Set(["loaded", "degraded"]);

/** A model's input modalities as the picker shows them beside its name. */
export const modalitiesOf = (model) => (model && model.modalities) || [];

/** Whether a model writes text from text (chat and the playground): an embedding, scoring or
 * speech-to-text model cannot, whatever it takes as input. A LoRA adapter generates as its base does. */
export const writesText = (model) => modalitiesOf(model).includes("text") && ((model && model.tasks) || []).includes("generate");

/**
 * The models in the order a picker shows them, each with its label: every model followed by its LoRA
 * adapters (`local/lora-a · adapter of local/tiny-llama`); an adapter whose base this team may not see
 * comes at the end, labelled the same way.
 */
export function pickerEntries(models) {
  const adapters = models.filter((m) => m.parent);
  const placed = new Set();
  const entries = [];
  const adaptersOf = (base) => adapters.filter((a) => a.parent === base.id).map((a) => {
    placed.add(a.id);
    return { model: a, label: `${a.id} · adapter of ${a.parent}` };
  });
  for (const model of models.filter((m) => !m.parent)) {
    entries.push({ model, label: `${model.id} · ${modalitiesOf(model).join(", ")}` }, ...adaptersOf(model));
  }
  for (const adapter of adapters.filter((a) => !placed.has(a.id))) {
    entries.push({ model: adapter, label: `${adapter.id} · adapter of ${adapter.parent}` });
  }
  return entries;
}

export class ModelPicker {
  /**
   * root: the `[data-model-picker]` element; storageKey: where this page's last choice is remembered;
   * suits(model): whether this page can use the model (the others are not offered).
   * The choice: the last one made on this page, else the server's default model, else the first.
   */
  constructor(root, storageKey, onError, suits = () => true) {
    this.suits = suits;
    this.onChange = () => {};
    this.select = root.querySelector("[data-model-select]");
    this.badge = root.querySelector("[data-model-status]");
    this.loadButton = root.querySelector("[data-model-load]");
    this.progress = root.querySelector("[data-model-progress]");
    this.progressText = root.querySelector("[data-model-progress-text]");
    this.storageKey = storageKey;
    this.onError = onError;
    this.models = new Map();
    this.loading = null;
    // Loading is for operators (/load_model answers others 403): for them the first request loads the model.
    this.managesModels = document.body.dataset.managesModels === "true";
    this.select.addEventListener("change", () => {
      localStorage.setItem(this.storageKey, this.select.value);
      this.showStatus();
      this.onChange();
    });
    this.loadButton.addEventListener("click", () => this.ensureLoaded().catch(this.onError));
  }

  get value() { return this.select.value; }

  get model() { return this.models.get(this.select.value) || null; }

  set value(id) {
    if (id && this.models.has(id)) {
      this.select.value = id;
      this.showStatus();
    }
  }

  async refresh() {
    let body;
    try {
      body = await apiJSON("/v1/models");
    } catch (error) {
      if (unreachable(error)) {
        // Not an answer: the models known stay as they are, and the badge says why it is not theirs.
        if (!this.models.size) this.select.replaceChildren(new Option("The server cannot be reached", ""));
        this.badge.textContent = "unreachable";
        this.badge.className = "badge error";
        this.badge.title = "The server cannot be reached: the page keeps trying.";
        throw error;
      }
      this.models = new Map();
      this.select.replaceChildren(new Option(error.status === 403 ? "No access: see the message above" : "No models", ""));
      this.showStatus();
      throw error;
    }
    const usable = body.data.filter((m) => this.suits(m));
    this.models = new Map(usable.map((m) => [m.id, m]));
    const choices = [this.select.value, localStorage.getItem(this.storageKey), document.body.dataset.defaultModel];
    this.select.replaceChildren(...pickerEntries(usable).map(({ model, label }) => {
      const option = new Option(label, model.id);
      option.dataset.modalities = modalitiesOf(model).join(" ");
      if (model.parent) option.dataset.parent = model.parent;
      return option;
    }));
    if (!usable.length) this.select.replaceChildren(new Option("No model available", ""));
    const chosen = choices.find((id) => id && this.models.has(id));
    if (chosen) this.select.value = chosen;
    this.showStatus();
    this.onChange();
  }

  showStatus() {
    const model = this.models.get(this.select.value);
    const status = model ? model.status : "";
    this.badge.textContent = status;
    this.badge.className = `badge ${status}`;
    this.badge.title = status === "cached" ? "On disk, not in memory: the first request loads it."
      : status === "degraded" && model.health ? `Most of its recent requests failed: ${model.health.last_error}` : "";
    this.loadButton.hidden = !model || IN_MEMORY.has(status) || this.loading !== null || !this.managesModels;
  }

  /** Load the chosen model if it is not in memory yet, showing /load_model's progress. */
  async ensureLoaded() {
    const model = this.models.get(this.select.value);
    if (!model || IN_MEMORY.has(model.status) || !this.managesModels) return;
    if (this.loading) return this.loading;
    this.loading = this._load(model).finally(() => {
      this.loading = null;
      this.progress.hidden = true;
      this.progressText.textContent = "";
      this.showStatus();
    });
    return this.loading;
  }

  async _load(model) {
    this.loadButton.hidden = true;
    this.progress.hidden = false;
    this.progress.removeAttribute("value");
    this.badge.textContent = "loading";
    this.badge.className = "badge loading";
    await streamSSE("/load_model", { model: model.id }, (event) => {
      if (event.status === "loading") {
        const p = event.progress;
        if (p && p.total) {
          this.progress.max = p.total;
          this.progress.value = p.current;
        }
        this.progressText.textContent = `loading ${event.stage || ""}${p && p.total ? ` ${p.current}/${p.total}` : ""}`;
      } else if (event.status === "ready") {
        model.status = "loaded";
      } else if (event.status === "error") {
        model.status = "error";
        throw new APIProblem(`Loading ${model.id} failed: ${event.message || "unknown error"}`, { status: 503, code: event.code });
      }
    }, undefined, { endsWithDone: false });
  }
}
