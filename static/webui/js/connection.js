// When the server cannot be reached: a banner says so and the page tries again, with backoff, until it
// answers (then the banner goes and the page catches up). Nothing the user typed is touched meanwhile.
import { unreachable } from "./api.js";
import { $ } from "./dom.js";

const DELAYS_S = [1, 2, 4, 8, 15, 30];

export class Connection {
  /**
   * check(): resolves once the server answers (any answer: a refusal is an answer), rejects while it
   * cannot be reached; back(): what the page does once it can be reached again.
   */
  constructor({ check, back = () => {} }) {
    Object.assign(this, { check, back });
    this.banner = $("offline");
    this.when = $("offline-when");
    this.attempt = 0;
    this.due = 0;
    this.timer = null;
    this.down = false;
    $("offline-retry").addEventListener("click", () => this.tryNow());
  }

  /** Note a failure: one of the network's starts the retries (a server's refusal does not). */
  failed(error) {
    if (unreachable(error)) this.lost();
  }

  lost() {
    if (this.down) return;
    this.down = true;
    this.attempt = 0;
    this.banner.hidden = false;
    document.body.dataset.offline = "true";
    this.schedule();
  }

  schedule() {
    clearInterval(this.timer);
    this.due = Date.now() + DELAYS_S[Math.min(this.attempt, DELAYS_S.length - 1)] * 1000;
    const tick = () => {
      const left = Math.max(0, Math.ceil((this.due - Date.now()) / 1000));
      this.when.textContent = `Trying again in ${left} s.`;
      if (left === 0) this.tryNow();
    };
    tick();
    this.timer = setInterval(tick, 250);
  }

  async tryNow() {
    clearInterval(this.timer);
    this.when.textContent = "Trying again…";
    try {
      await this.check();
    } catch (error) {
      if (unreachable(error)) {
        this.attempt += 1;
        this.schedule();
        return;
      }
    }
    this.down = false;
    this.banner.hidden = true;
    delete document.body.dataset.offline;
    await this.back();
  }
}
