// The console's few behaviours htmx does not cover: the copy button of a new key, and plain-words notices
// when a request fails (expired session, missing CSRF token, server down).
"use strict";

function notice(message) {
  const box = document.getElementById("notice");
  if (!box) return;
  box.textContent = message;
  box.hidden = !message;
}

async function copyFrom(selector, button) {
  const field = document.querySelector(selector);
  if (!field) return;
  try {
    // The clipboard API needs a secure context (https or localhost); on a LAN over http fall back to a selection.
    if (navigator.clipboard && window.isSecureContext) {
      await navigator.clipboard.writeText(field.value);
    } else {
      field.select();
      document.execCommand("copy");
    }
    button.textContent = "Copied";
  } catch (err) {
    field.select();
    button.textContent = "Select and copy";
  }
}

document.addEventListener("click", (event) => {
  const button = event.target.closest("button[data-copy]");
  if (button) copyFrom(button.dataset.copy, button);
});

document.addEventListener("htmx:responseError", (event) => {
  const xhr = event.detail.xhr;
  if (xhr.status === 403) notice("The page's security token was refused. Reload the page and try again.");
  else if (xhr.status === 401) notice("Your console session ended. Sign in again.");
  else notice(`The server answered ${xhr.status}: ${xhr.responseText.slice(0, 200)}`);
});

document.addEventListener("htmx:sendError", () => notice("The appliance cannot be reached; retrying."));
document.addEventListener("htmx:afterRequest", (event) => {
  if (event.detail.successful) notice("");
});
