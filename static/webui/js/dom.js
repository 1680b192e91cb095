// Building DOM nodes without HTML strings: text always goes in as text.

export const $ = (id) => document.getElementById(id);

/** el("button", {type: "button", textContent: "Go", "aria-label": "Go"}, child…) */
export function el(tag, props = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(props)) {
    if (key.includes("-")) node.setAttribute(key, value);
    else node[key] = value;
  }
  node.append(...children);
  return node;
}

/** A function that runs `paint` at the next animation frame, once however often it is called before. */
export function paintOnNextFrame(paint) {
  let pending = false;
  return () => {
    if (pending) return;
    pending = true;
    requestAnimationFrame(() => {
      pending = false;
      paint();
    });
  };
}

/** A token's background for its probability p (0..1): red (unlikely) to green (likely), mixed from the palette's
 * --tok-low and --tok-high so it follows the theme (the palette is written once, in app.css). */
export function probabilityColour(p) {
  return `color-mix(in hsl, var(--tok-low), var(--tok-high) ${Math.round(p * 100)}%)`;
}
