// The Batches page: while a batch is active, poll progress.json every two
// seconds and update its row; reload once every batch is done (new files).
(function () {
  "use strict";
  const table = document.getElementById("batches");
  if (!table) return;
  const url = table.dataset.progressUrl;
  const active = () =>
    Array.from(table.querySelectorAll("tr[data-batch]")).some((row) =>
      ["validating", "in_progress", "finalizing", "cancelling"].includes(row.dataset.status)
    );

  async function poll() {
    if (!active()) return;
    let data;
    try {
      const response = await fetch(url, { headers: { Accept: "application/json" } });
      if (!response.ok) throw new Error(response.status);
      data = await response.json();
    } catch (error) {
      setTimeout(poll, 5000);
      return;
    }
    let finished = false;
    for (const batch of data.batches) {
      const row = table.querySelector(`tr[data-batch="${batch.id}"]`);
      if (!row) continue;
      const wasActive = !["completed", "failed", "expired", "cancelled"].includes(row.dataset.status);
      row.dataset.status = batch.status;
      row.querySelector(".status").firstChild.textContent = batch.status;
      const bar = row.querySelector("progress");
      bar.max = Math.max(batch.total, 1);
      bar.value = batch.completed + batch.failed;
      row.querySelector(".counts").textContent =
        `${batch.completed} done, ${batch.failed} failed of ${batch.total}`;
      if (wasActive && batch.done) finished = true;
    }
    if (finished) {
      window.location.reload();
      return;
    }
    setTimeout(poll, 2000);
  }
  setTimeout(poll, 2000);
})();
