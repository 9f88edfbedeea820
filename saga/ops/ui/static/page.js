// Every page: shows each <time datetime> in the reader's local time beside its UTC text,
// and, while the "refresh every 5 s" box is ticked, replaces the page's #refreshable part
// with a fresh copy (no reload, no flicker; paused while the tab is hidden). The box's
// state is kept per page in localStorage.
"use strict";

function showLocalTimes(root) {
  const zone = Intl.DateTimeFormat().resolvedOptions().timeZone;
  for (const element of root.querySelectorAll("time[datetime]")) {
    const next = element.nextElementSibling;
    if (next && next.classList.contains("local")) continue;
    const instant = new Date(element.getAttribute("datetime"));
    if (Number.isNaN(instant.getTime())) continue;
    const local = document.createElement("span");
    local.className = "local";
    local.textContent = instant.toLocaleString(undefined, {
      year: "numeric", month: "2-digit", day: "2-digit",
      hour: "2-digit", minute: "2-digit", second: "2-digit", hour12: false,
    });
    local.title = "your local time (" + zone + ")";
    element.after(local);
  }
}

async function refresh() {
  const part = document.getElementById("refreshable");
  if (!part || document.hidden) return;
  const response = await fetch(window.location.href, { headers: { accept: "text/html" } });
  if (!response.ok) return;
  const fresh = new DOMParser().parseFromString(await response.text(), "text/html");
  const replacement = fresh.getElementById("refreshable");
  if (!replacement) return;
  part.replaceChildren(...Array.from(replacement.childNodes, (node) => document.adoptNode(node)));
  showLocalTimes(part);
  document.body.dataset.refreshed = String(Number(document.body.dataset.refreshed || 0) + 1);
}

function autoRefresh() {
  const box = document.getElementById("auto-refresh");
  if (!box) return;
  const remembered = "redsaga.refresh." + window.location.pathname;
  let timer = null;
  const apply = () => {
    if (timer !== null) clearInterval(timer);
    timer = box.checked ? setInterval(refresh, 5000) : null;
    try { localStorage.setItem(remembered, box.checked ? "1" : ""); } catch (_) { /* private mode */ }
  };
  try { box.checked = localStorage.getItem(remembered) === "1"; } catch (_) { /* private mode */ }
  box.addEventListener("change", apply);
  apply();
}

document.addEventListener("DOMContentLoaded", () => {
  showLocalTimes(document);
  autoRefresh();
});
