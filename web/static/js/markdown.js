// Markdown for untrusted text (model output). markdown-it parses it with raw HTML off, so the text cannot write
// markup of its own; DOMPurify then keeps only the elements Markdown makes and only http(s) URLs, as a second wall;
// highlight.js colours fenced code that names its language. All three are pinned npm builds served by the appliance.
import DOMPurify from "../vendor/purify.js";
import hljs from "../vendor/highlight.min.js";
import markdownit from "../vendor/markdown-it.min.js";

const ALLOWED_TAGS = [
  "p", "br", "strong", "em", "s", "code", "pre", "span", "a", "h3", "h4", "h5", "h6", "ul", "ol", "li",
  "blockquote", "hr", "table", "thead", "tbody", "tr", "th", "td",
];
const ALLOWED_ATTR = ["href", "class", "start"];
const HEADING_SHIFT = 2; // a reply's "# Title" sits under the page's own h1/h2
const ALIGN = /^text-align:(left|center|right)$/;

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

function highlight(code, language) {
  if (!language || !hljs.getLanguage(language)) return ""; // markdown-it escapes it as plain code
  return hljs.highlight(code, { language, ignoreIllegals: true }).value;
}

/** A link to anything but http(s) loses its <a> and keeps its text, so it reads the same but goes nowhere. */
function inertUnsafeLinks(tokens) {
  const kept = [];
  const open = [];
  for (const token of tokens) {
    if (token.type === "link_open") {
      const href = safeHref(token.attrGet("href"));
      open.push(href !== null);
      if (href === null) continue;
      token.attrSet("href", href);
    } else if (token.type === "link_close" && !open.pop()) {
      continue;
    }
    kept.push(token);
  }
  return kept;
}

/** Heading levels shifted, table alignment as classes (the CSP refuses style attributes), unsafe links inert. */
function tidy(state) {
  for (const token of state.tokens) {
    if (token.type === "heading_open" || token.type === "heading_close") {
      token.tag = `h${Math.min(Number(token.tag.slice(1)) + HEADING_SHIFT, 6)}`;
    } else if (token.type === "th_open" || token.type === "td_open") {
      const align = ALIGN.exec(token.attrGet("style") || "");
      token.attrs = align ? [["class", `align-${align[1]}`]] : null;
    } else if (token.type === "inline" && token.children) {
      token.children = inertUnsafeLinks(token.children);
    }
  }
}

const md = markdownit({ html: false, linkify: true, breaks: true, highlight });
md.disable("image"); // an image would fetch from wherever the text says
md.linkify.set({ fuzzyLink: false, fuzzyEmail: false, fuzzyIP: false }); // only URLs written with their scheme
md.validateLink = () => true; // every link parses, so that a refused one still shows its label (inertUnsafeLinks)
md.core.ruler.push("appliance_tidy", tidy);

/** Render Markdown `text` into a DocumentFragment. An unclosed code fence (a reply still streaming) shows as
 * code so far. */
export function renderMarkdown(text) {
  if (!DOMPurify.isSupported) {
    const fallback = document.createDocumentFragment();
    fallback.appendChild(document.createTextNode(String(text)));
    return fallback;
  }
  const fragment = DOMPurify.sanitize(md.render(String(text)), {
    ALLOWED_TAGS,
    ALLOWED_ATTR,
    ALLOWED_URI_REGEXP: /^https?:/i,
    RETURN_DOM_FRAGMENT: true,
  });
  for (const a of fragment.querySelectorAll("a")) {
    a.target = "_blank";
    a.rel = "noopener noreferrer nofollow";
  }
  return fragment;
}
