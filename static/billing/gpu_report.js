// GPU cost report charts: cost per 1M useful tokens and idle share, per model and day.
(function () {
  if (typeof Chart === "undefined") {
    // No Chart.js (npm was missing at set-up): say so instead of blank cards.
    document.querySelector(".charts").hidden = true;
    document.getElementById("charts-missing").hidden = false;
    return;
  }
  const data = JSON.parse(document.getElementById("gpu-chart-data").textContent);
  const models = [...new Set(data.rows.map((r) => r.model))];
  function series(field) {
    return models.map((model) => ({
      label: model,
      spanGaps: true,
      data: data.days.map((day) => {
        const row = data.rows.find((r) => r.day === day && r.model === model);
        return row ? row[field] : null;
      }),
    }));
  }
  function draw(id, field, yTitle, max) {
    new Chart(document.getElementById(id), {
      type: "line",
      data: { labels: data.days, datasets: series(field) },
      options: {
        animation: false,
        scales: { y: { beginAtZero: true, max: max, title: { display: true, text: yTitle } } },
      },
    });
  }
  draw("cpm-chart", "cpm", "cost per 1M useful tokens");
  draw("idle-chart", "idle", "idle / (busy + idle)", 1);
})();
