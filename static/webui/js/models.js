// The model picker: /v1/models (with each model's status) and /load_model's progress events.
import { APIProblem, apiJSON, streamSSE } from "./api.js";

/** A model's input modalities as the picker shows them beside its name. */
export const modalitiesOf = (model) => (model && model.modalities) || [];

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
      this.select.replaceChildren(new Option(error.status === 403 ? "No access: see the message above" : "No models", ""));
      throw error;
    }
    const usable = body.data.filter((m) => this.suits(m));
    this.models = new Map(usable.map((m) => [m.id, m]));
    const choices = [this.select.value, localStorage.getItem(this.storageKey), document.body.dataset.defaultModel];
    this.select.replaceChildren(...usable.map((m) => {
      const option = new Option(`${m.id} · ${modalitiesOf(m).join(", ")}`, m.id);
      option.dataset.modalities = modalitiesOf(m).join(" ");
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
    this.badge.title = status === "cached" ? "On disk, not in memory: the first request loads it." : "";
    this.loadButton.hidden = !model || status === "loaded" || this.loading !== null || !this.managesModels;
  }

  /** Load the chosen model if it is not in memory yet, showing /load_model's progress. */
  async ensureLoaded() {
    const model = this.models.get(this.select.value);
    if (!model || model.status === "loaded" || !this.managesModels) return;
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
