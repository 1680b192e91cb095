// The chat page's composer: the box (it grows with its text), the attachments of the message being
// written (attach, paste, drop; greyed out with a reason for a text-only model) and the context meter.
import { contentOf, modalityOf, partOf, partView } from "./attachments.js";
import { leftOutCount } from "./context-window.js";
import { $, el } from "./dom.js";
import { modalitiesOf } from "./models.js";

const ACCEPT = { image: "image/*", audio: "audio/wav,audio/x-wav,audio/mpeg", video: "video/*" };

export class Composer {
  /**
   * picker: the page's ModelPicker; showError(text); messages(): the conversation's messages now;
   * isBusy(): a turn is under way (the meter waits); plan(messages): what the next request sends of them
   * (context-window.js's planContext).
   */
  constructor({ picker, showError, messages, isBusy, plan }) {
    this.picker = picker;
    this.showError = showError;
    this.messages = messages;
    this.isBusy = isBusy;
    this.plan = plan;
    this.form = $("composer");
    this.prompt = $("prompt");
    this.attach = $("attach");
    this.attachLabel = $("attach-label");
    this.attachWhy = $("attach-why");
    this.list = $("attachments");
    this.meter = $("context-meter");
    this.pending = []; // attachments of the message being written (content parts)
    this.meterTimer = null;
    this.wire();
  }

  get text() { return this.prompt.value; }

  focus() { this.prompt.focus(); }

  setDraft(text, parts) {
    this.prompt.value = text;
    this.pending = parts;
    this.grow();
    this.renderAttachments();
  }

  grow() {
    this.prompt.style.height = "auto";
    this.prompt.style.height = `${Math.min(this.prompt.scrollHeight + 2, window.innerHeight * 0.4)}px`;
  }

  renderAttachments() {
    this.list.replaceChildren(...this.pending.map((part, index) => {
      const remove = el("button", { type: "button", className: "remove", textContent: "✕", "aria-label": `Remove ${part.name}` });
      remove.addEventListener("click", () => {
        this.pending = this.pending.filter((_, i) => i !== index);
        this.renderAttachments();
      });
      return el("div", { className: "attachment" }, partView(part), remove);
    }));
    this.list.hidden = !this.pending.length;
  }

  /** The attach button only for models that take media, saying why when greyed out. */
  showAttachable() {
    const { picker } = this;
    const takes = modalitiesOf(picker.model).filter((m) => m !== "text");
    this.attach.accept = takes.map((m) => ACCEPT[m]).join(",");
    this.attach.disabled = !takes.length;
    this.attachLabel.classList.toggle("disabled", !takes.length);
    this.attachLabel.title = takes.length ? `Attach ${takes.join(", ")} (or paste or drop it here)` : "";
    this.attachWhy.textContent = takes.length || !picker.value ? "" : `${picker.value} takes text only: no attachments.`;
  }

  async addFiles(files) {
    const takes = modalitiesOf(this.picker.model);
    for (const file of files) {
      const modality = modalityOf(file.type);
      if (!modality || !takes.includes(modality)) {
        this.showError(`${this.picker.value || "This model"} does not take ${modality || file.type || "this file"}: pick a model that does.`);
        continue;
      }
      try {
        this.pending = [...this.pending, await partOf(file)];
      } catch (error) {
        this.showError(error.message);
      }
    }
    this.renderAttachments();
  }

  scheduleMeter() {
    clearTimeout(this.meterTimer);
    this.meterTimer = setTimeout(() => this.measureContext().catch(() => { this.meter.textContent = ""; }), 700);
  }

  /** Tokens the next request takes of the model's context (the conversation and the draft, as the chat's
   * Context overflow sends them, counted by /tokenize: free for the pages, it spends none of the team's
   * requests), and how many earlier messages it leaves out. */
  async measureContext() {
    if (!this.picker.value || this.isBusy()) return;
    const messages = [...this.messages()];
    if (this.prompt.value.trim()) messages.push({ role: "user", content: contentOf(this.prompt.value, this.pending) });
    if (!messages.length) {
      this.meter.textContent = "";
      return;
    }
    const plan = await this.plan(messages);
    const left = leftOutCount(plan.notSent);
    this.meter.dataset.notSent = left;
    if (!plan.fits) {
      this.meter.textContent = plan.count && plan.limit ? `${plan.count} / ${plan.limit} tokens: full`
        : plan.limit ? `over ${plan.limit} tokens: full` : "more than the model's context";
      this.meter.classList.add("full");
      return;
    }
    const counted = plan.limit ? `${plan.count} / ${plan.limit} tokens` : `${plan.count} tokens`;
    this.meter.textContent = left ? `${counted} · ${left} earlier message${left === 1 ? "" : "s"} not sent` : counted;
    this.meter.classList.toggle("full", Boolean(plan.limit) && (left > 0 || plan.count > 0.9 * plan.limit));
  }

  /** Input, paste, drop and the attach button; Enter and submit call `onSend` (set by the page). */
  wire() {
    this.onSend = () => {};
    this.form.addEventListener("submit", (event) => {
      event.preventDefault();
      this.onSend();
    });
    this.prompt.addEventListener("keydown", (event) => {
      if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
        event.preventDefault();
        this.onSend();
      }
    });
    this.prompt.addEventListener("input", () => {
      this.grow();
      this.scheduleMeter();
    });
    this.prompt.addEventListener("paste", (event) => {
      const files = [...(event.clipboardData?.files || [])];
      if (files.length) {
        event.preventDefault();
        this.addFiles(files);
      }
    });
    this.form.addEventListener("dragover", (event) => {
      event.preventDefault();
      this.form.classList.add("dropping");
    });
    this.form.addEventListener("dragleave", () => this.form.classList.remove("dropping"));
    this.form.addEventListener("drop", (event) => {
      event.preventDefault();
      this.form.classList.remove("dropping");
      this.addFiles([...(event.dataTransfer?.files || [])]);
    });
    this.attach.addEventListener("change", () => {
      this.addFiles([...this.attach.files]);
      this.attach.value = "";
    });
  }
}
