// The chat page: conversations on the server (signed in) or in localStorage (with a key), a reply streamed token by token from /v1/chat/completions,
// Stop, per-reply timings, errors in plain words. Text goes into the page only as DOM text or through the
// Markdown renderer (markdown.js: raw HTML off, then sanitized into DOM nodes; no HTML string reaches the page).
import { explain, fetchModel, streamChat, waitingText } from "./chat-api.js";
import { ServerStore } from "./chat-server.js";
import { Store, loadKey, saveKey } from "./chat-store.js";
import { renderMarkdown } from "./markdown.js";

const $ = (id) => document.getElementById(id);
const person = document.body.dataset.person || "";
const csrf = document.querySelector('meta[name="csrf-token"]')?.content || "";
const showStatus = (text) => {
  $("sync-status").textContent = text;
  $("sync-status").hidden = !text;
};
const store = person ? new ServerStore(csrf, showStatus) : new Store();
let apiKey = person ? "" : loadKey(); // signed in, the session speaks for the person: no key in the browser
const auth = () => (csrf ? { "X-CSRF-Token": csrf } : { Authorization: `Bearer ${apiKey}` });
let model = document.body.dataset.model || "";
let running = null; // { controller, conversation } while a reply streams

function el(tag, className, text) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== undefined) node.textContent = text;
  return node;
}

function fmtMs(ms) {
  return ms < 1000 ? `${Math.round(ms)} ms` : `${(ms / 1000).toFixed(2)} s`;
}

function statsLine(stats) {
  if (!stats) return "";
  const parts = [];
  if (stats.ttftMs != null) parts.push(`TTFT ${fmtMs(stats.ttftMs)}`);
  if (stats.tokensPerS != null) parts.push(`${stats.tokensPerS.toFixed(1)} tok/s`);
  if (stats.promptTokens != null) parts.push(`${stats.promptTokens} prompt + ${stats.completionTokens} completion tokens`);
  if (stats.stopped) parts.push("stopped");
  else if (stats.finishReason === "length") parts.push("cut at max tokens");
  return parts.join(" · ");
}

function messageNode(message) {
  const node = el("article", `message ${message.role}`);
  const body = el("div", "content");
  if (message.role === "assistant") body.appendChild(renderMarkdown(message.content));
  else body.textContent = message.content;
  node.appendChild(body);
  if (message.waiting) node.appendChild(el("p", "waiting muted", message.waiting)).setAttribute("role", "status");
  if (message.error) node.appendChild(el("p", "error", message.error)).setAttribute("role", "alert");
  const line = statsLine(message.stats);
  if (line) node.appendChild(el("p", "stats", line));
  return node;
}

function renderMessages() {
  const c = store.current;
  const box = $("messages");
  box.replaceChildren(...c.messages.map(messageNode));
  if (!c.messages.length) box.appendChild(el("p", "empty muted", "Ask anything. Replies stream as they are written."));
  box.scrollTop = box.scrollHeight;
}

function renderList() {
  const items = store.shown.map((c) => {
    const li = el("li", c.id === store.currentId ? "active" : "");
    const open = el("button", "open", c.title);
    open.type = "button";
    open.addEventListener("click", async () => {
      if (running) return;
      await store.select(c.id);
      renderAll();
      document.body.classList.remove("sidebar-open");
    });
    const rename = el("button", "icon rename", "✎");
    rename.type = "button";
    rename.title = "Rename";
    rename.addEventListener("click", () => {
      const title = window.prompt("Rename the conversation", c.title);
      if (title !== null) store.rename(c.id, title);
      renderAll();
    });
    const remove = el("button", "icon delete", "✕");
    remove.type = "button";
    remove.title = "Delete";
    remove.addEventListener("click", () => {
      if (running && running.conversation === c) return;
      if (window.confirm(`Delete "${c.title}"?`)) store.remove(c.id);
      renderAll();
    });
    li.append(open, rename, remove);
    return li;
  });
  $("conversations").replaceChildren(...items);
}

function renderSettings() {
  const c = store.current;
  $("chat-title").textContent = c.title;
  $("system-prompt").value = c.system;
  $("temperature").value = String(c.temperature);
  $("max-tokens").value = c.maxTokens === null ? "" : String(c.maxTokens);
  $("api-key").value = apiKey;
  $("key-needed").hidden = Boolean(apiKey || csrf);
  $("model-line").textContent = model ? `Model: ${model}` : "";
}

function renderAll() {
  renderList();
  renderSettings();
  renderMessages();
}

function setRunning(value) {
  running = value;
  $("send").hidden = Boolean(value);
  $("stop").hidden = !value;
}

function setKey(key) {
  apiKey = key.trim();
  saveKey(apiKey);
  renderSettings();
}

async function send(text) {
  const c = store.current;
  if (!apiKey && !csrf) {
    $("key-needed").hidden = false;
    $("key-input").focus();
    return;
  }
  if (!c.messages.length) c.title = text.split("\n")[0].slice(0, 60) || "New chat";
  c.messages.push({ role: "user", content: text });
  const reply = { role: "assistant", content: "", stats: null };
  c.messages.push(reply);
  store.touch(c);
  renderAll();
  const history = c.messages.slice(0, -1).filter((m) => !m.error || m.content);
  const messages = [
    ...(c.system.trim() ? [{ role: "system", content: c.system }] : []),
    ...history.map((m) => ({ role: m.role, content: m.content })),
  ];
  const controller = new AbortController();
  setRunning({ controller, conversation: c });
  const started = performance.now();
  let firstAt = null;
  let pending = false; // one repaint at a time, however many deltas arrive
  let paintCost = 0; // ms the latest repaint took
  let paintedAt = 0;
  let current = $("messages").lastElementChild;
  const repaint = () => {
    const begun = performance.now();
    const next = messageNode(reply);
    // The messages may have been drawn again meanwhile (the saved conversations arriving after a send, on a slow
    // link): paint into the reply's node as it is shown now, not into one no longer on the page.
    if (!current.isConnected && store.current === c) current = $("messages").children[c.messages.indexOf(reply)];
    current.replaceWith(next);
    current = next;
    const box = $("messages");
    box.scrollTop = box.scrollHeight;
    paintedAt = performance.now();
    paintCost = paintedAt - begun;
  };
  // Each repaint renders the whole reply again (Markdown, then the sanitizer): 2 ms at 200 characters but
  // 15-35 ms at 8,000 and 50-60 at 19,000 on a busy 2-core machine (python -m tests.browser.render_bench).
  // Waiting 4x the last cost between repaints keeps a long reply's streaming to a fifth of the main thread.
  const scheduleRepaint = () => {
    if (pending) return;
    pending = true;
    const wait = Math.max(0, paintedAt + 4 * paintCost - performance.now());
    setTimeout(() => {
      requestAnimationFrame(() => {
        pending = false;
        repaint();
      });
    }, wait);
  };
  try {
    if (!model) model = await fetchModel(auth());
    const result = await streamChat({
      auth: auth(),
      signal: controller.signal,
      body: {
        model,
        messages,
        temperature: c.temperature,
        ...(c.maxTokens === null ? {} : { max_tokens: c.maxTokens }),
      },
      onQueued: (queued) => {
        reply.waiting = waitingText(queued);
        scheduleRepaint();
      },
      onDelta: (delta) => {
        if (firstAt === null) firstAt = performance.now();
        delete reply.waiting;
        reply.content += delta;
        scheduleRepaint();
      },
    });
    const ended = performance.now();
    const usage = result.usage || {};
    const n = usage.completion_tokens;
    reply.stats = {
      ttftMs: firstAt === null ? null : firstAt - started,
      tokensPerS: n && firstAt !== null && ended > firstAt ? n / ((ended - firstAt) / 1000) : null,
      promptTokens: usage.prompt_tokens ?? null,
      completionTokens: n ?? null,
      finishReason: result.finishReason,
    };
  } catch (err) {
    if (err.name === "AbortError") {
      reply.stats = { ttftMs: firstAt === null ? null : firstAt - started, stopped: true };
    } else {
      reply.error = explain(err);
    }
  } finally {
    delete reply.waiting; // a note for the moment, never kept with the conversation
    setRunning(null);
    store.touch(c);
    repaint();
  }
}

function bind() {
  $("composer").addEventListener("submit", (event) => {
    event.preventDefault();
    const text = $("prompt").value.trim();
    if (!text || running) return;
    $("prompt").value = "";
    send(text);
  });
  $("prompt").addEventListener("keydown", (event) => {
    if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
      event.preventDefault();
      $("composer").requestSubmit();
    }
  });
  $("stop").addEventListener("click", () => running && running.controller.abort());
  $("new-chat").addEventListener("click", () => {
    if (running) return;
    if ($("search")?.value) {
      $("search").value = ""; // the new chat is in no search's results
      store.search("");
    }
    store.create();
    renderAll();
    $("prompt").focus();
  });
  $("key-form").addEventListener("submit", (event) => {
    event.preventDefault();
    setKey($("key-input").value);
    $("prompt").focus();
  });
  $("api-key").addEventListener("change", (event) => setKey(event.target.value));
  $("system-prompt").addEventListener("change", (event) => {
    store.current.system = event.target.value;
    store.touch(store.current);
  });
  $("temperature").addEventListener("change", (event) => {
    const value = Number(event.target.value);
    if (Number.isFinite(value) && value >= 0 && value <= 2) store.current.temperature = value;
    store.touch(store.current);
    renderSettings();
  });
  $("max-tokens").addEventListener("change", (event) => {
    const text = event.target.value.trim();
    const value = Number(text);
    if (text === "") store.current.maxTokens = null;
    else if (Number.isInteger(value) && value >= 1) store.current.maxTokens = value;
    store.touch(store.current);
    renderSettings();
  });
  $("settings").addEventListener("submit", (event) => {
    event.preventDefault(); // Enter in a settings field saves it, never reloads the page
    setKey($("api-key").value);
  });
  $("toggle-settings").addEventListener("click", (event) => {
    $("settings").hidden = !$("settings").hidden;
    event.currentTarget.setAttribute("aria-expanded", String(!$("settings").hidden));
  });
  $("sign-out")?.addEventListener("submit", () => {
    if (running) running.controller.abort();
    store.forget(); // before the form leaves: the next person at this browser finds nothing
  });
  let searching = null;
  $("search")?.addEventListener("input", (event) => {
    clearTimeout(searching);
    const q = event.target.value.trim();
    searching = setTimeout(() => store.search(q).then(renderList), 250);
  });
  $("toggle-sidebar").addEventListener("click", (event) => {
    const open = document.body.classList.toggle("sidebar-open");
    event.currentTarget.setAttribute("aria-expanded", String(open));
  });
}

bind();
renderAll();
store.load().then(renderAll);
