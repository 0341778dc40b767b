// stackflow web UI: follow a run's events (Server-Sent Events) and refresh the page's
// sections they concern, without a reload. No other script runs on the pages.
"use strict";
(function () {
  const log = document.getElementById("events");
  if (!log || !log.dataset.stream) return;
  const live = document.getElementById("live");
  const regions = Array.from(document.querySelectorAll("[data-refresh]"));
  const due = new Set();
  let timer = null;

  function refresh(region) {
    const box = region.querySelector("textarea");
    const typed = box ? box.value : "";
    fetch(region.dataset.refresh, { credentials: "same-origin" })
      .then((r) => (r.ok ? r.text() : Promise.reject(new Error(String(r.status)))))
      .then((html) => {
        region.innerHTML = html;
        const again = region.querySelector("textarea");
        if (again && typed) again.value = typed;
      })
      .catch(() => {});
  }

  function schedule(type) {
    for (const region of regions) {
      const on = region.dataset.on.split(" ");
      if (on.includes("*") || on.includes(type)) due.add(region);
    }
    if (timer === null) {
      timer = setTimeout(() => {
        timer = null;
        due.forEach(refresh);
        due.clear();
      }, 300);
    }
  }

  function brief(type, data) {
    const what = data.phase || data.id || (data.resource && data.resource.id) || data.status || data.outcome || data.wait || "";
    const action = data.action ? data.action + " " : "";
    const when = data.time ? data.time.slice(11, 19) + " " : "";
    return when + type + " " + action + what + (data.error ? ": " + data.error : "");
  }

  const source = new EventSource(log.dataset.stream);
  for (const type of log.dataset.types.split(" ")) {
    source.addEventListener(type, (event) => {
      let data = {};
      try { data = JSON.parse(event.data); } catch (e) { data = {}; }
      const item = document.createElement("li");
      item.textContent = brief(type, data);
      log.prepend(item);
      while (log.children.length > 200) log.lastElementChild.remove();
      schedule(type);
      if (type === "phase" && live && data.phase) live.textContent = "Phase: " + data.phase;
      if (type === "run_complete") {
        source.close();
        if (live) live.textContent = "The run has ended.";
      }
    });
  }
})();
