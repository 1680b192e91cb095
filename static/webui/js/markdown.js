// Model output as Markdown: marked renders, DOMPurify sanitises, so output never injects markup or script.
/* global marked, DOMPurify */

marked.setOptions({ gfm: true, breaks: true });

DOMPurify.addHook("afterSanitizeAttributes", (node) => {
  if (node.tagName === "A") {
    node.setAttribute("target", "_blank");
    node.setAttribute("rel", "noopener noreferrer nofollow");
  }
});

const PURIFY = {
  USE_PROFILES: { html: true },
  FORBID_TAGS: ["style", "form", "input", "button", "textarea", "select", "iframe", "img", "video", "audio"],
  FORBID_ATTR: ["style", "class", "id"],
};

export function renderMarkdown(text) {
  return DOMPurify.sanitize(marked.parse(text || ""), PURIFY);
}
