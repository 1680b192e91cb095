// The chat page's conversation list (a drawer on phones): search by title, open, rename, delete.
import { apiJSON } from "./api.js";
import { $, el } from "./dom.js";

export class ConversationList {
  /**
   * currentId(): the open conversation's id; open(id); renamed(id, title) and deleted(id): the open
   * conversation may need to know; showError(error).
   */
  constructor({ currentId, open, renamed, deleted, showError }) {
    Object.assign(this, { currentId, open, renamed, deleted, showError });
    this.conversations = [];
    this.list = $("conversation-list");
    this.search = $("search");
    this.sidebar = $("sidebar");
    this.backdrop = $("sidebar-backdrop");
    this.toggle = $("sidebar-toggle");
    this.toggle.addEventListener("click", () => (this.isOpen ? this.close() : this.openDrawer()));
    $("sidebar-close").addEventListener("click", () => this.close({ refocus: true }));
    this.backdrop.addEventListener("click", () => this.close({ refocus: true }));
    this.search.addEventListener("input", () => this.render());
  }

  get isOpen() { return this.sidebar.classList.contains("open"); }

  /** Close the drawer; `refocus`: focus goes back to the button that opened it (Esc, ✕, the backdrop). */
  close({ refocus = false } = {}) {
    if (refocus && this.isOpen) this.toggle.focus();
    this.sidebar.classList.remove("open");
    this.backdrop.hidden = true;
    this.toggle.setAttribute("aria-expanded", "false");
  }

  openDrawer() {
    this.sidebar.classList.add("open");
    this.backdrop.hidden = false;
    this.toggle.setAttribute("aria-expanded", "true");
    this.search.focus();
  }

  async refresh() {
    this.conversations = (await apiJSON("/ui/api/conversations")).data;
    this.render();
  }

  render() {
    const query = this.search.value.trim().toLowerCase();
    const shown = this.conversations.filter((c) => !query || c.title.toLowerCase().includes(query));
    this.list.replaceChildren(...shown.map((c) => {
      const item = el("li", { className: c.id === this.currentId() ? "current" : "" });
      item.dataset.id = c.id;
      const open = el("button", { type: "button", className: "open", textContent: c.title, title: c.title });
      open.addEventListener("click", () => this.open(c.id).catch(this.showError));
      const rename = el("button", { type: "button", className: "act row-action", textContent: "Rename" });
      rename.addEventListener("click", () => this.startRename(item, c));
      const remove = el("button", { type: "button", className: "act row-action", textContent: "Delete" });
      remove.addEventListener("click", () => this.confirmDelete(item, c));
      item.append(open, rename, remove);
      return item;
    }));
    if (query && !shown.length) this.list.append(el("li", { className: "muted small", textContent: "No title matches." }));
  }

  startRename(item, conversation) {
    const input = el("input", { value: conversation.title, maxLength: 200, "aria-label": "New title" });
    let saved = false; // Enter saves, then the list redraws and the input's blur must not save again
    const save = async () => {
      if (saved) return;
      saved = true;
      const title = input.value.trim();
      if (title && title !== conversation.title) {
        await apiJSON(`/ui/api/conversations/${conversation.id}`, { method: "PATCH", body: { title } });
        this.renamed(conversation.id, title);
      }
      await this.refresh();
    };
    input.addEventListener("keydown", (event) => {
      if (event.key === "Enter") save().catch(this.showError);
      if (event.key === "Escape") this.render();
    });
    input.addEventListener("blur", () => save().catch(this.showError));
    item.replaceChildren(input);
    input.focus();
    input.select();
  }

  confirmDelete(item, conversation) {
    const yes = el("button", { type: "button", className: "act danger-text", textContent: "Delete it" });
    const no = el("button", { type: "button", className: "act", textContent: "Keep" });
    yes.addEventListener("click", async () => {
      try {
        await apiJSON(`/ui/api/conversations/${conversation.id}`, { method: "DELETE" });
        this.deleted(conversation.id);
        await this.refresh();
      } catch (error) { this.showError(error); }
    });
    no.addEventListener("click", () => this.render());
    item.replaceChildren(el("span", { className: "open", textContent: `Delete “${conversation.title}”?` }), yes, no);
  }
}
