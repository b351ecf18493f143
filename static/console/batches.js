// The Batches page: progress bars move live over /ws/batches/ (the server
// sends what changed); without a socket, progress.json is polled every two
// seconds while a batch is active. A batch that ends reloads the page once
// (its files' links).
(function () {
  "use strict";
  const table = document.getElementById("batches");
  if (!table) return;
  const ENDED = ["completed", "failed", "expired", "cancelled"];
  const active = () =>
    Array.from(table.querySelectorAll("tr[data-batch]")).some(
      (row) => !ENDED.includes(row.dataset.status)
    );

  // Update the rows; true when a batch on the page has just ended.
  function update(batches) {
    let ended = false;
    for (const batch of batches) {
      const row = table.querySelector(`tr[data-batch="${batch.id}"]`);
      if (!row) continue;
      const wasActive = !ENDED.includes(row.dataset.status);
      row.dataset.status = batch.status;
      row.querySelector(".status").firstChild.textContent = batch.status;
      const bar = row.querySelector("progress");
      bar.max = Math.max(batch.total, 1);
      bar.value = batch.completed + batch.failed;
      row.querySelector(".counts").textContent =
        `${batch.completed} done, ${batch.failed} failed of ${batch.total}`;
      if (wasActive && batch.done) ended = true;
    }
    if (ended) window.location.reload();
    return ended;
  }

  async function poll() {
    if (!active()) return;
    try {
      const response = await fetch(table.dataset.progressUrl, {
        headers: { Accept: "application/json" },
      });
      if (!response.ok) throw new Error(response.status);
      if (update((await response.json()).batches)) return;
    } catch (error) {
      setTimeout(poll, 5000);
      return;
    }
    setTimeout(poll, 2000);
  }

  if (!active()) return;
  let live = false;
  try {
    const scheme = window.location.protocol === "https:" ? "wss" : "ws";
    const socket = new WebSocket(`${scheme}://${window.location.host}/ws/batches/`);
    socket.addEventListener("message", (event) => {
      live = true;
      const frame = JSON.parse(event.data);
      if (frame.type === "batches") update(frame.batches);
    });
    socket.addEventListener("close", () => {
      if (!live) poll();
    });
  } catch (error) {
    poll();
  }
})();
