// Model output as Markdown: marked renders, DOMPurify sanitises, so output never injects markup or script.
// Then, on the sanitised DOM only: KaTeX draws math ($…$, $$…$$, \(…\), \[…\]) from data-tex attributes
// (as DOM nodes, which the page's CSP allows), highlight.js colours code, and code blocks get a Copy button.
/* global marked, DOMPurify, katex, hljs */
import { el } from "./dom.js";

const escapeAttr = (text) => text.replace(/[&<>"']/g, (c) => `&#${c.charCodeAt(0)};`);

const math = {
  extensions: [
    {
      name: "mathBlock", level: "block",
      start(src) { const m = src.match(/\$\$|\\\[/); return m ? m.index : undefined; },
      tokenizer(src) {
        const m = /^(?:\$\$([\s\S]+?)\$\$|\\\[([\s\S]+?)\\\])[ \t]*(?:\n|$)/.exec(src);
        if (m) return { type: "mathBlock", raw: m[0], text: (m[1] ?? m[2]).trim() };
        return undefined;
      },
      renderer(token) { return `<div data-math="block" data-tex="${escapeAttr(token.text)}"></div>\n`; },
    },
    {
      name: "mathInline", level: "inline",
      start(src) { const m = src.match(/\$|\\\(/); return m ? m.index : undefined; },
      tokenizer(src) {
        const m = /^(?:\$\$([\s\S]+?)\$\$|\$(?![\s$])((?:\\\$|[^$\n])+?)(?<!\s)\$(?!\d)|\\\(([\s\S]+?)\\\))/.exec(src);
        if (m) return { type: "mathInline", raw: m[0], text: m[1] ?? m[2] ?? m[3], display: m[1] !== undefined };
        return undefined;
      },
      renderer(token) {
        return `<span data-math="${token.display ? "block" : "inline"}" data-tex="${escapeAttr(token.text)}"></span>`;
      },
    },
  ],
};

marked.setOptions({ gfm: true, breaks: true });
marked.use(math);

DOMPurify.addHook("beforeSanitizeAttributes", (node) => {
  // marked names a code block's language in a class, and classes are not kept: keep it as data-lang.
  if (node.tagName === "CODE") {
    const lang = /(?:^|\s)language-([\w+#.-]{1,32})/.exec(node.getAttribute("class") || "");
    if (lang) node.setAttribute("data-lang", lang[1]);
  }
});
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

/** Copy `text` to the clipboard and say so on `button` for a moment. */
export async function copyText(button, text) {
  const label = button.textContent;
  try {
    await navigator.clipboard.writeText(text);
    button.textContent = "Copied";
  } catch (_) {
    button.textContent = "Copy failed";
  }
  setTimeout(() => { button.textContent = label; }, 1500);
}

/** Math, highlighting and copy buttons, on a sanitised subtree. */
function decorate(root) {
  for (const node of root.querySelectorAll("[data-tex]")) {
    if (typeof katex === "undefined") break;
    katex.render(node.dataset.tex, node, { displayMode: node.dataset.math === "block", throwOnError: false });
  }
  for (const code of root.querySelectorAll("pre > code")) {
    if (typeof hljs !== "undefined") {
      const lang = code.dataset.lang && hljs.getLanguage(code.dataset.lang) ? code.dataset.lang : null;
      const result = lang ? hljs.highlight(code.textContent, { language: lang, ignoreIllegals: true })
        : hljs.highlightAuto(code.textContent);
      code.innerHTML = result.value; // highlight.js escapes the text it wraps in its spans
      code.classList.add("hljs");
    }
    const pre = code.parentElement;
    const copy = el("button", { type: "button", className: "copy-code", textContent: "Copy",
      "aria-label": "Copy code" });
    copy.addEventListener("click", () => copyText(copy, code.textContent));
    const wrap = el("div", { className: "code-wrap" });
    pre.replaceWith(wrap);
    wrap.append(pre, copy);
    if (code.dataset.lang) wrap.append(el("span", { className: "code-lang", textContent: code.dataset.lang }));
  }
}

/**
 * A Markdown view that redraws only the blocks whose source changed: while an answer grows, the
 * blocks before the last stay the same DOM nodes, so a reader's selection in them survives.
 */
export class MarkdownView {
  constructor(root) {
    this.root = root;
    this.blocks = []; // [{raw, node}]
  }

  update(text) {
    const tokens = marked.lexer(text || "");
    tokens.forEach((token, index) => {
      const kept = this.blocks[index];
      if (kept && kept.raw === token.raw) return;
      const node = el("div", { className: "md-block" });
      const list = [token];
      list.links = tokens.links;
      node.innerHTML = DOMPurify.sanitize(marked.parser(list), PURIFY);
      decorate(node);
      if (kept) kept.node.replaceWith(node);
      else this.root.append(node);
      this.blocks[index] = { raw: token.raw, node };
    });
    for (const stale of this.blocks.splice(tokens.length)) stale.node.remove();
  }
}
