// A signed-in person's conversations, kept on the appliance (/api/conversations): they follow the person to any
// browser they sign in on, and nothing of them is written to this browser's storage. The page changes its copy at
// once; the changes reach the server one at a time, in order (a new chat is created on its first change, then
// only what changed is sent: the settings, or the whole list of messages after a turn).
import { explain, requestJson } from "./chat-api.js";
import { DEFAULTS } from "./chat-store.js";

const API = "/api/conversations";
const LISTED = 100; // the newest ones; older ones stay on the server

function fromServer(c) {
  return {
    id: c.id,
    title: c.title,
    system: c.system,
    temperature: c.temperature,
    maxTokens: c.max_tokens,
    messages: [],
    updated: Date.parse(c.updated_at),
    saved: true,
    loaded: false, // its messages are fetched when it is opened
  };
}

const settingsOf = (c) => ({ title: c.title, system: c.system, temperature: c.temperature, max_tokens: c.maxTokens });
// A reply that failed or was stopped before its first word is a note for the moment, not a message.
const messagesOf = (c) => c.messages.filter((m) => m.content).map((m) => ({ role: m.role, content: m.content }));

export class ServerStore {
  /** `csrf`: the session's token, sent with every change; `onStatus(text)`: a failed save in plain words, or "". */
  constructor(csrf, onStatus) {
    this.headers = { "X-CSRF-Token": csrf };
    this.onStatus = onStatus;
    this.queue = Promise.resolve();
    this.conversations = [];
    this.currentId = null;
    this.create(); // the page has a chat to type into while the list loads
  }

  get current() {
    return this.conversations.find((c) => c.id === this.currentId) || null;
  }

  /** The newest conversations, the newest of them opened (unless a chat was begun meanwhile). */
  async load() {
    let listed;
    try {
      listed = await requestJson("GET", `${API}?limit=${LISTED}`);
    } catch (err) {
      this.onStatus(`Your saved conversations could not be loaded. ${explain(err)}`);
      return;
    }
    const known = new Set(this.conversations.map((c) => c.id));
    const stored = listed.data.map(fromServer).filter((c) => !known.has(c.id));
    this.conversations.push(...stored);
    const placeholder = this.current;
    const untouched = (c) => !c.saved && !c.messages.length;
    if (!stored.length || !placeholder || !untouched(placeholder)) return;
    await this.select(stored[0].id);
    if (this.current !== placeholder && untouched(placeholder)) {
      this.conversations = this.conversations.filter((c) => c !== placeholder);
    }
  }

  /** Narrows the list to the conversations whose title or messages hold `q` (the server searches them all); an
   * empty `q` shows them all again. */
  async search(q) {
    this.query = q;
    if (!q) {
      this.matches = null;
      return;
    }
    let found;
    try {
      found = await requestJson("GET", `${API}?limit=${LISTED}&q=${encodeURIComponent(q)}`);
    } catch (err) {
      this.onStatus(`The search failed. ${explain(err)}`);
      return;
    }
    if (this.query !== q) return; // a later search has begun
    const known = new Set(this.conversations.map((c) => c.id));
    this.conversations.push(...found.data.map(fromServer).filter((c) => !known.has(c.id)));
    this.matches = new Set(found.data.map((c) => c.id));
  }

  /** The list to show: all, or what the search found. */
  get shown() {
    return this.matches ? this.conversations.filter((c) => this.matches.has(c.id)) : this.conversations;
  }

  /** Opens a conversation once its messages are here (until then the previous one stays open). */
  async select(id) {
    const c = this.conversations.find((x) => x.id === id);
    if (!c) return;
    if (!c.loaded) {
      try {
        const full = await requestJson("GET", `${API}/${encodeURIComponent(c.id)}`);
        c.messages = full.messages.map((m) => ({ role: m.role, content: m.content }));
        c.loaded = true;
        c.sentSettings = JSON.stringify(settingsOf(c));
        c.sentMessages = JSON.stringify(messagesOf(c));
      } catch (err) {
        this.onStatus(`This conversation could not be opened. ${explain(err)}`);
        return;
      }
    }
    this.currentId = c.id;
  }

  create() {
    const previous = this.current;
    const c = {
      id: `new-${Date.now().toString(36)}${Math.random().toString(36).slice(2, 8)}`,
      title: "New chat",
      system: previous ? previous.system : DEFAULTS.system,
      temperature: previous ? previous.temperature : DEFAULTS.temperature,
      maxTokens: previous ? previous.maxTokens : DEFAULTS.maxTokens,
      messages: [],
      updated: Date.now(),
      saved: false, // made on the server at its first change
      loaded: true,
    };
    this.conversations.unshift(c);
    this.currentId = c.id;
    return c;
  }

  rename(id, title) {
    const c = this.conversations.find((x) => x.id === id);
    if (c && title.trim()) {
      c.title = title.trim().slice(0, 120);
      this.touch(c);
    }
  }

  remove(id) {
    const c = this.conversations.find((x) => x.id === id);
    if (!c) return;
    this.conversations = this.conversations.filter((x) => x !== c);
    c.removed = true;
    this.enqueue(() => (c.saved ? requestJson("DELETE", `${API}/${encodeURIComponent(c.id)}`, { headers: this.headers }) : null));
    if (this.currentId === id) {
      this.currentId = null;
      const next = this.conversations.find((x) => x.loaded);
      if (next) this.currentId = next.id;
      else this.create();
    }
  }

  /** A conversation changed (a turn, a setting, its title): its changes go to the server, after those before. */
  touch(c) {
    c.updated = Date.now();
    this.enqueue(() => this.send(c));
  }

  /** Signing out: nothing more is sent (a reply stopped on the way out is not saved). */
  forget() {
    this.forgotten = true;
    this.conversations = [];
    this.currentId = null;
  }

  enqueue(change) {
    this.queue = this.queue
      .then(() => (this.forgotten ? null : change()))
      .then(
        () => this.onStatus(""),
        (err) => this.onStatus(`Not saved: ${explain(err)}`),
      );
  }

  async send(c) {
    if (c.removed) return;
    const settings = settingsOf(c);
    const messages = messagesOf(c);
    if (!c.saved) {
      const made = await requestJson("POST", API, { headers: this.headers, body: { ...settings, messages } });
      if (this.currentId === c.id) this.currentId = made.id;
      Object.assign(c, { id: made.id, saved: true });
    } else {
      const sentSettings = JSON.stringify(settings);
      if (sentSettings !== c.sentSettings) {
        await requestJson("PATCH", `${API}/${encodeURIComponent(c.id)}`, { headers: this.headers, body: settings });
      }
      c.sentSettings = sentSettings;
      const sentMessages = JSON.stringify(messages);
      if (c.loaded && sentMessages !== c.sentMessages) {
        await requestJson("PUT", `${API}/${encodeURIComponent(c.id)}/messages`, {
          headers: this.headers,
          body: { messages },
        });
      }
      if (c.loaded) c.sentMessages = sentMessages;
      return;
    }
    c.sentSettings = JSON.stringify(settings);
    c.sentMessages = JSON.stringify(messages);
  }
}
