// Colour scheme: the system's (prefers-color-scheme) unless the user chose light or dark, remembered here.
// A classic script in <head>, so the chosen scheme is set before the first paint (no white flash).
(function () {
  const KEY = "theme";
  const ORDER = ["system", "dark", "light"];
  const root = document.documentElement;

  function chosen() {
    const value = localStorage.getItem(KEY);
    return ORDER.includes(value) ? value : "system";
  }

  function apply(value) {
    if (value === "system") delete root.dataset.theme;
    else root.dataset.theme = value;
    const button = document.getElementById("theme-toggle");
    if (button) {
      button.textContent = `Theme: ${value}`;
      button.title = "Colour scheme: follow the system, dark or light (remembered in this browser)";
    }
  }

  apply(chosen());
  document.addEventListener("DOMContentLoaded", () => {
    apply(chosen());
    const button = document.getElementById("theme-toggle");
    if (!button) return;
    button.addEventListener("click", () => {
      const next = ORDER[(ORDER.indexOf(chosen()) + 1) % ORDER.length];
      localStorage.setItem(KEY, next);
      apply(next);
    });
  });
}());
