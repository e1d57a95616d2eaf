// The health page's only script: confirmations for its buttons, and a refresh of the fleet
// view every 5 s that replaces only the pieces that changed (no full reload, no flicker).
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

// The header names at most this much: past it, pieces not named are simply sent again.
const HAVE_MAX = 4000;

// Puts a refresh's pieces in their slots: a kept piece is the one shown, a sent one replaces
// it. False when a kept piece is not on the page (then the next refresh asks for every one).
function applyPieces(fleet, html) {
  const incoming = document.createElement("template");
  incoming.innerHTML = html;
  const slots = new Map();
  for (const t of incoming.content.querySelectorAll("template[data-slot]")) {
    if (!slots.has(t.dataset.slot)) slots.set(t.dataset.slot, []);
    slots.get(t.dataset.slot).push(t);
  }
  const plan = [];
  for (const slot of fleet.querySelectorAll("[data-pieces]")) {
    const shown = new Map();
    for (const el of slot.children) shown.set(el.dataset.piece, el);
    const next = [];
    for (const t of slots.get(slot.dataset.pieces) || []) {
      const old = shown.get(t.dataset.piece);
      if (t.hasAttribute("data-kept")) {
        if (!old || old.dataset.hash !== t.dataset.hash) return false;
        next.push(old);
      } else if (old && old.contains(document.activeElement)) {
        next.push(old); // Never replace what the operator is typing in.
      } else {
        next.push(...t.content.children);
      }
    }
    plan.push([slot, next]);
  }
  for (const [slot, next] of plan) {
    const same = next.length === slot.children.length && next.every((el, i) => el === slot.children[i]);
    if (!same) slot.replaceChildren(...next);
  }
  return true;
}

const fleet = document.getElementById("fleet");
if (fleet) {
  const url = fleet.getAttribute("data-refresh");
  // The page's own view: a refresh that finds nothing changed is a 304 with no body.
  let etag = fleet.getAttribute("data-etag");
  let askAll = false;
  setInterval(async () => {
    if (document.hidden) return;
    try {
      const headers = {};
      if (etag) headers["If-None-Match"] = etag;
      if (!askAll) {
        let have = "";
        for (const el of fleet.querySelectorAll("[data-pieces] > [data-hash]")) {
          if (have.length + 17 > HAVE_MAX) break;
          have += (have ? " " : "") + el.dataset.hash;
        }
        headers["X-Fleet-Have"] = have;
      }
      const response = await fetch(url, { credentials: "same-origin", cache: "no-store", headers });
      if (response.status === 304) return;
      if (response.ok) {
        const applied = applyPieces(fleet, await response.text());
        etag = applied ? response.headers.get("ETag") : null;
        askAll = !applied;
      } else if (response.status === 401 || response.redirected) {
        window.location = "/admin/login";
      }
    } catch (_) {
      // The service may be restarting: keep what is shown and try again.
    }
  }, 5000);
}
