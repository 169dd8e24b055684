// The chat's state in the browser's localStorage, signed out: the API key and the conversations (messages,
// system prompt, sampling settings). Nothing of it leaves the browser except in the requests the user sends.
// (Signed in, conversations live on the server: chat-server.js.)

const KEY_ITEM = "appliance.apiKey";
const CHATS_ITEM = "appliance.conversations.v1";
// maxTokens null: ask for no particular length, so the key's cap (or the server's default) applies and the
// request is never refused for asking more than the key allows.
export const DEFAULTS = Object.freeze({ system: "", temperature: 0.7, maxTokens: null });

function read(item, fallback) {
  try {
    const raw = localStorage.getItem(item);
    return raw === null ? fallback : JSON.parse(raw);
  } catch {
    return fallback;
  }
}

export function loadKey() {
  return localStorage.getItem(KEY_ITEM) || "";
}

export function saveKey(key) {
  if (key) localStorage.setItem(KEY_ITEM, key);
  else localStorage.removeItem(KEY_ITEM);
}

function newId() {
  return `c${Date.now().toString(36)}${Math.random().toString(36).slice(2, 8)}`;
}

/** A well-formed conversation from whatever was stored (old versions, hand edits). */
function normalize(c) {
  return {
    id: typeof c.id === "string" ? c.id : newId(),
    title: typeof c.title === "string" ? c.title : "New chat",
    system: typeof c.system === "string" ? c.system : DEFAULTS.system,
    temperature: Number.isFinite(c.temperature) ? c.temperature : DEFAULTS.temperature,
    maxTokens: Number.isInteger(c.maxTokens) && c.maxTokens >= 1 ? c.maxTokens : DEFAULTS.maxTokens,
    messages: Array.isArray(c.messages) ? c.messages.filter((m) => m && typeof m.content === "string") : [],
    updated: Number.isFinite(c.updated) ? c.updated : Date.now(),
  };
}

export class Store {
  constructor() {
    this.item = CHATS_ITEM;
    const saved = read(this.item, null);
    const list = saved && Array.isArray(saved.conversations) ? saved.conversations.map(normalize) : [];
    this.conversations = list;
    this.currentId = saved && list.some((c) => c.id === saved.currentId) ? saved.currentId : null;
    if (!this.current) this.create();
  }

  /** Everything is here already (the server's store loads). */
  async load() {}

  /** The list to show (only the server's store searches). */
  get shown() {
    return this.conversations;
  }

  get current() {
    return this.conversations.find((c) => c.id === this.currentId) || null;
  }

  save() {
    try {
      localStorage.setItem(this.item, JSON.stringify({ conversations: this.conversations, currentId: this.currentId }));
    } catch {
      // Storage full: the oldest conversation gives way, once.
      if (this.conversations.length > 1) {
        this.conversations.sort((a, b) => b.updated - a.updated).pop();
        localStorage.setItem(this.item, JSON.stringify({ conversations: this.conversations, currentId: this.currentId }));
      }
    }
  }

  create() {
    const previous = this.current;
    const c = normalize({
      title: "New chat",
      system: previous ? previous.system : DEFAULTS.system,
      temperature: previous ? previous.temperature : DEFAULTS.temperature,
      maxTokens: previous ? previous.maxTokens : DEFAULTS.maxTokens,
    });
    this.conversations.unshift(c);
    this.currentId = c.id;
    this.save();
    return c;
  }

  select(id) {
    if (this.conversations.some((c) => c.id === id)) this.currentId = id;
    this.save();
  }

  rename(id, title) {
    const c = this.conversations.find((x) => x.id === id);
    if (c && title.trim()) c.title = title.trim().slice(0, 120);
    this.save();
  }

  remove(id) {
    this.conversations = this.conversations.filter((c) => c.id !== id);
    if (this.currentId === id) this.currentId = this.conversations.length ? this.conversations[0].id : null;
    if (!this.current) this.create();
    this.save();
  }

  touch(c) {
    c.updated = Date.now();
    this.save();
  }
}
