// Draws the usage page's two stacked bar charts from the JSON the view embeds.
(function () {
  "use strict";
  const source = document.getElementById("usage-chart-data");
  if (!source || typeof Chart === "undefined") return;
  const data = JSON.parse(source.textContent);
  const options = (unit) => ({
    responsive: true,
    animation: false,
    scales: { x: { stacked: true }, y: { stacked: true, beginAtZero: true, title: { display: true, text: unit } } },
    plugins: { legend: { position: "bottom" } },
  });
  const draw = (id, datasets, unit) =>
    new Chart(document.getElementById(id), {
      type: "bar",
      data: { labels: data.labels, datasets },
      options: options(unit),
    });
  window.usageCharts = [
    draw("tokens-chart", data.tokens, "tokens"),
    draw("cost-chart", data.cost, "cost"),
  ];
})();
