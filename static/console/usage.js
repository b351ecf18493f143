// Draws the usage page's two stacked bar charts from the JSON the view embeds.
(function () {
  "use strict";
  const source = document.getElementById("usage-chart-data");
  if (!source) return;
  if (typeof Chart === "undefined") {
    // No Chart.js (npm was missing at set-up): say so instead of blank cards.
    document.querySelector(".charts").hidden = true;
    document.getElementById("charts-missing").hidden = false;
    return;
  }
  const data = JSON.parse(source.textContent);
  // Costs can be millionths of a unit: plain digits, never 7.000000E-6.
  const plain = (value) => Number(value).toLocaleString("en", { maximumSignificantDigits: 3 });
  const options = (unit) => ({
    responsive: true,
    animation: false,
    scales: {
      x: { stacked: true },
      y: { stacked: true, beginAtZero: true, title: { display: true, text: unit }, ticks: { callback: plain } },
    },
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
    draw("cost-chart", data.cost, "cost (" + data.currency + ")"),
  ];
})();
