// The health page's only script: confirmations for its buttons, and a refresh of the fleet
// view every 5 s that swaps the HTML in place (no full reload, no flicker).
"use strict";

document.addEventListener("submit", (event) => {
  const message = event.target.getAttribute("data-confirm");
  if (message && !window.confirm(message)) {
    event.preventDefault();
  }
});

// A digest's copy button puts the full digest on the clipboard (the page shows it short).
document.addEventListener("click", async (event) => {
  const button = event.target.closest("button.copy");
  if (!button) return;
  try {
    await navigator.clipboard.writeText(button.getAttribute("data-copy"));
    button.textContent = "copied";
    setTimeout(() => { button.textContent = "copy"; }, 1500);
  } catch (_) {
    // No clipboard (an insecure origin): the full digest is in the tooltip.
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
