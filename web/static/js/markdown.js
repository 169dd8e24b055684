// A small Markdown renderer for untrusted text (model output): it builds DOM nodes with createElement and text
// nodes only, never parses HTML, and links only http(s) URLs, so nothing in the text can become script.
// Covers what chat replies use: fenced and inline code, bold, italic, headings, lists, quotes, rules, links.

const FENCE = /^\s*(```|~~~)\s*([\w+#.-]*)\s*$/;
const HEADING = /^(#{1,6})\s+(.*)$/;
const LIST_ITEM = /^\s*([-*+]|\d{1,9}[.)])\s+(.*)$/;
const QUOTE = /^\s*>\s?(.*)$/;
const RULE = /^\s*([-*_])(\s*\1){2,}\s*$/;

// Inline rules, tried at each position; the earliest match wins, then the first rule listed.
const INLINE = [
  { kind: "code", re: /(`+)([^`]|[^`][\s\S]*?[^`])\1(?!`)/ },
  { kind: "link", re: /\[([^\]\n]+)\]\(\s*<?([^)\s>]+)>?(?:\s+"[^"]*")?\s*\)/ },
  { kind: "url", re: /\bhttps?:\/\/[^\s<>()"']+[^\s<>()"'.,;:!?]/ },
  { kind: "bold", re: /\*\*(?=\S)([\s\S]*?\S)\*\*|(?<!\w)__(?=\S)([\s\S]*?\S)__(?!\w)/ },
  { kind: "italic", re: /\*(?=[^\s*])([^*]*?[^\s*])\*|(?<![\w])_(?=[^\s_])([^_]*?[^\s_])_(?![\w])/ },
];

/** The URL as an absolute http(s) URL, or null for anything else (javascript:, data:, relative paths...). */
export function safeHref(raw) {
  let url;
  try {
    url = new URL(raw);
  } catch {
    return null;
  }
  return url.protocol === "http:" || url.protocol === "https:" ? url.href : null;
}

function el(tag, className) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  return node;
}

function link(href, parent, label, inLink) {
  const safe = safeHref(href);
  if (!safe || inLink) {
    inline(label, parent, inLink);
    return;
  }
  const a = el("a");
  a.href = safe;
  a.rel = "noopener noreferrer nofollow";
  a.target = "_blank";
  inline(label, a, true);
  parent.appendChild(a);
}

function earliest(text, inLink) {
  let best = null;
  for (const rule of INLINE) {
    if (inLink && (rule.kind === "link" || rule.kind === "url")) continue;
    const m = rule.re.exec(text);
    if (m && (best === null || m.index < best.m.index)) best = { rule, m };
  }
  return best;
}

/** Inline Markdown of `text` appended to `parent` as text nodes and elements. */
export function inline(text, parent, inLink = false) {
  let rest = text;
  while (rest) {
    const hit = earliest(rest, inLink);
    if (!hit) {
      parent.appendChild(document.createTextNode(rest));
      return;
    }
    const { rule, m } = hit;
    if (m.index > 0) parent.appendChild(document.createTextNode(rest.slice(0, m.index)));
    if (rule.kind === "code") {
      const code = el("code");
      const body = m[2];
      // As in CommonMark, one space on each side lets a code span start or end with a backtick.
      code.textContent = body.length > 2 && body.startsWith(" ") && body.endsWith(" ") ? body.slice(1, -1) : body;
      parent.appendChild(code);
    } else if (rule.kind === "link") {
      link(m[2], parent, m[1], inLink);
    } else if (rule.kind === "url") {
      link(m[0], parent, m[0], inLink);
    } else {
      const node = el(rule.kind === "bold" ? "strong" : "em");
      inline(m[1] ?? m[2], node, inLink);
      parent.appendChild(node);
    }
    rest = rest.slice(m.index + m[0].length);
  }
}

function paragraph(lines, parent) {
  const p = el("p");
  lines.forEach((line, i) => {
    if (i > 0) p.appendChild(el("br"));
    inline(line, p);
  });
  parent.appendChild(p);
}

/** Render Markdown `text` into a DocumentFragment. An unclosed code fence (a reply still streaming) shows as
 * code so far. */
export function renderMarkdown(text) {
  const root = document.createDocumentFragment();
  const lines = String(text).replace(/\r\n?/g, "\n").split("\n");
  let i = 0;
  let para = [];
  const flush = () => {
    if (para.length) paragraph(para, root);
    para = [];
  };
  while (i < lines.length) {
    const line = lines[i];
    const fence = FENCE.exec(line);
    if (fence) {
      flush();
      const body = [];
      i += 1;
      while (i < lines.length && lines[i].trim() !== fence[1]) {
        body.push(lines[i]);
        i += 1;
      }
      i += 1; // the closing fence
      const pre = el("pre");
      const code = el("code");
      if (fence[2]) code.dataset.lang = fence[2];
      code.textContent = body.join("\n");
      pre.appendChild(code);
      root.appendChild(pre);
      continue;
    }
    if (!line.trim()) {
      flush();
      i += 1;
      continue;
    }
    if (RULE.test(line)) {
      flush();
      root.appendChild(el("hr"));
      i += 1;
      continue;
    }
    const heading = HEADING.exec(line);
    if (heading) {
      flush();
      const h = el(`h${Math.min(heading[1].length + 2, 6)}`);
      inline(heading[2], h);
      root.appendChild(h);
      i += 1;
      continue;
    }
    const item = LIST_ITEM.exec(line);
    if (item) {
      flush();
      const ordered = /\d/.test(item[1]);
      const list = el(ordered ? "ol" : "ul");
      if (ordered && parseInt(item[1], 10) !== 1) list.start = parseInt(item[1], 10);
      while (i < lines.length) {
        const next = LIST_ITEM.exec(lines[i]);
        if (!next || /\d/.test(next[1]) !== ordered) break;
        const li = el("li");
        inline(next[2], li);
        list.appendChild(li);
        i += 1;
      }
      root.appendChild(list);
      continue;
    }
    if (QUOTE.test(line)) {
      flush();
      const quote = el("blockquote");
      const quoted = [];
      while (i < lines.length && QUOTE.test(lines[i])) {
        quoted.push(QUOTE.exec(lines[i])[1]);
        i += 1;
      }
      paragraph(quoted, quote);
      root.appendChild(quote);
      continue;
    }
    para.push(line);
    i += 1;
  }
  flush();
  return root;
}
