// The health page's only script: confirmations for its buttons, and a refresh of the fleet
// view every 5 s that swaps the HTML in place (no full reload, no flicker).
"use strict";

document.addEventListener("submit", (event) => {
  const message = event.target.getAttribute("data-confirm");
  if (message && !window.confirm(message)) {
    event.preventDefault();
  }
});

const fleet = document.getElementById("fleet");
if (fleet) {
  const url = fleet.getAttribute("data-refresh");
  // The server answers 304 when the view is what we show: nothing to send, nothing to swap.
  let etag = null;
  setInterval(async () => {
    if (document.hidden) return;
    try {
      const headers = etag ? { "If-None-Match": etag } : {};
      const response = await fetch(url, { credentials: "same-origin", cache: "no-store", headers });
      if (response.status === 304) return;
      if (response.ok) {
        etag = response.headers.get("ETag");
        fleet.innerHTML = await response.text();
      } else if (response.status === 401 || response.redirected) {
        window.location = "/admin/login";
      }
    } catch (_) {
      // The service may be restarting: keep what is shown and try again.
    }
  }, 5000);
}
