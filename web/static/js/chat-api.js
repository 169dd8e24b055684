// The chat's client of the appliance's OpenAI-compatible API: a streamed chat completion read from a fetch
// body as Server-Sent Events, and the server's refusals put in plain words.

export class ApiError extends Error {
  constructor(status, body, retryAfter) {
    const error = (body && body.error) || {};
    super(error.message || `the server answered ${status}`);
    this.status = status;
    this.code = error.code || null;
    this.type = error.type || null;
    this.retryAfter = retryAfter;
  }
}

function retrySeconds(response) {
  const value = response.headers.get("Retry-After");
  if (!value) return null;
  const seconds = Number(value);
  if (Number.isFinite(seconds)) return Math.max(0, Math.round(seconds));
  const when = Date.parse(value);
  return Number.isNaN(when) ? null : Math.max(0, Math.round((when - Date.now()) / 1000));
}

async function errorOf(response) {
  let body = null;
  try {
    body = await response.json();
  } catch {
    body = null;
  }
  return new ApiError(response.status, body, retrySeconds(response));
}

/** What went wrong, for the person at the keyboard. */
export function explain(err) {
  if (!(err instanceof ApiError)) {
    return "The appliance could not be reached. Check the network and try again.";
  }
  const later = err.retryAfter !== null && err.retryAfter !== undefined ? ` Try again in ${err.retryAfter} s.` : "";
  if (err.status === 401) {
    if (err.code === "revoked_api_key") return "This API key has been revoked. Ask the operator for a new key.";
    if (err.code === "missing_api_key") return "Enter your API key in the settings first.";
    if (err.code === "session_expired") return "Your session has ended. Sign in again.";
    if (err.code === "csrf_token_invalid") return "This page is out of date. Reload it.";
    return "The API key was not accepted. Check it in the settings.";
  }
  if (err.type === "insufficient_quota" || err.code === "insufficient_quota") {
    const reset = /resets at ([^.;]+UTC)/.exec(err.message);
    const when = reset ? ` Your quota resets at ${reset[1]}.` : "";
    return `Your token quota is used up for now: what is left does not cover this conversation.${when}${later} A new chat (a shorter prompt) may still fit.`;
  }
  if (err.status === 429) return `Too many requests at once with this key.${later || " Wait for one to finish."}`;
  if (err.status === 503) {
    if (err.code === "not_ready") return `The model is still starting up.${later}`;
    if (err.code === "engine_unavailable") return `The engine stopped and is restarting by itself.${later}`;
    return `The server is overloaded right now.${later}`;
  }
  if (err.status === 400 || err.status === 413) return `The request was refused: ${err.message}`;
  return `The server failed (${err.status}): ${err.message}.${later}`;
}

/** A queue comment's place and ETA, e.g. ": queued position=3 eta=4" -> { position: 3, etaS: 4 }; null if not one. */
export function parseQueued(comment) {
  const match = /^queued position=(\d+)(?: eta=(\d+))?/.exec(comment);
  if (!match) return null;
  return { position: Number(match[1]), etaS: match[2] === undefined ? null : Number(match[2]) };
}

function ordinal(n) {
  const teen = n % 100 >= 11 && n % 100 <= 13;
  const suffix = teen ? "th" : { 1: "st", 2: "nd", 3: "rd" }[n % 10] || "th";
  return `${n}${suffix}`;
}

/** "Waiting for a seat — 3rd in line, about 4 s" */
export function waitingText({ position, etaS }) {
  const eta = etaS === null ? "" : `, about ${Math.max(1, etaS)} s`;
  return `Waiting for a seat — ${ordinal(position)} in line${eta}`;
}

function* events(buffer) {
  // Yields complete SSE events, { data } or { comment }, and leaves the unfinished tail in buffer.rest.
  const parts = buffer.text.split(/\r?\n\r?\n/);
  buffer.rest = parts.pop();
  for (const part of parts) {
    const lines = part.split(/\r?\n/);
    const data = lines
      .filter((line) => line.startsWith("data:"))
      .map((line) => line.slice(5).replace(/^ /, ""))
      .join("\n");
    if (data) yield { data };
    for (const line of lines) if (line.startsWith(":")) yield { comment: line.slice(1).trim() };
  }
}

/**
 * Stream one chat completion. `onQueued({ position, etaS })` hears where the request waits for a seat (the
 * server's comments before the first token); `onDelta(text)` gets each piece of content; resolves to
 * { usage, finishReason } at [DONE]; rejects with ApiError on a refusal (also one sent inside the stream),
 * or with the AbortError of `signal` when stopped.
 */
export async function streamChat({ auth, body, signal, onDelta, onQueued }) {
  const response = await fetch("/v1/chat/completions", {
    method: "POST",
    headers: { "Content-Type": "application/json", ...auth },
    body: JSON.stringify({ ...body, stream: true, stream_options: { include_usage: true } }),
    signal,
  });
  if (!response.ok) throw await errorOf(response);
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  const buffer = { text: "", rest: "" };
  const result = { usage: null, finishReason: null };
  for (;;) {
    const { value, done } = await reader.read();
    buffer.text = buffer.rest + (done ? decoder.decode() : decoder.decode(value, { stream: true }));
    if (done) buffer.text += "\n\n";
    for (const { data, comment } of events(buffer)) {
      if (comment !== undefined) {
        const queued = parseQueued(comment);
        if (queued && onQueued) onQueued(queued);
        continue;
      }
      if (data === "[DONE]") return result;
      const chunk = JSON.parse(data);
      if (chunk.error) throw new ApiError(500, chunk, null);
      if (chunk.usage) result.usage = chunk.usage;
      const choice = chunk.choices && chunk.choices[0];
      if (choice && choice.delta && choice.delta.content) onDelta(choice.delta.content);
      if (choice && choice.finish_reason) result.finishReason = choice.finish_reason;
    }
    if (done) return result;
  }
}

/** One JSON call to the appliance (the saved conversations' API): the parsed answer (null for 204), or ApiError. */
export async function requestJson(method, path, { headers = {}, body } = {}) {
  const response = await fetch(path, {
    method,
    headers: { ...(body === undefined ? {} : { "Content-Type": "application/json" }), ...headers },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  if (!response.ok) throw await errorOf(response);
  return response.status === 204 ? null : response.json();
}

export async function fetchModel(auth) {
  const response = await fetch("/v1/models", { headers: auth });
  if (!response.ok) throw await errorOf(response);
  const body = await response.json();
  return body.data && body.data.length ? body.data[0].id : "";
}
