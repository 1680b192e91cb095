// The top bar's Menu on phones (the staff links, the theme and Log out, which fit the bar only on wide
// screens): opens and closes by its button, Esc (focus back on the button) or a click elsewhere.
(function () {
  const toggle = document.getElementById("menu-toggle");
  const menu = document.getElementById("topbar-menu");
  if (!toggle || !menu) return;

  function setOpen(open) {
    menu.classList.toggle("open", open);
    toggle.setAttribute("aria-expanded", String(open));
  }

  toggle.addEventListener("click", () => setOpen(!menu.classList.contains("open")));
  document.addEventListener("keydown", (event) => {
    if (event.key !== "Escape" || !menu.classList.contains("open")) return;
    event.stopImmediatePropagation(); // this Esc closes the menu, nothing else (a streaming answer goes on)
    setOpen(false);
    toggle.focus();
  });
  document.addEventListener("click", (event) => {
    if (!menu.contains(event.target) && !toggle.contains(event.target)) setOpen(false);
  });
}());
