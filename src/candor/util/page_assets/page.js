// Shared by every candor page: read the payload, embed the charts, hand over to the page's own script.
(function () {
  "use strict";
  const page = {
    data: JSON.parse(document.getElementById("page-data").textContent),
    specs: JSON.parse(document.getElementById("page-charts").textContent),
    views: {},
    // Set a chart's signal (a Vega-Lite param) and redraw; a chart not on the page is skipped.
    signal(chart, name, value) {
      const view = page.views[chart];
      return view ? view.signal(name, value).runAsync() : Promise.resolve();
    },
    fmtPct(x) { return x === null || Number.isNaN(x) ? "–" : (100 * x).toFixed(1) + "%"; },
  };
  window.candorPage = page;
  const embeds = Object.entries(page.specs).map(([name, spec]) => {
    const el = document.getElementById("chart-" + name);
    if (!el) return Promise.resolve();
    return vegaEmbed(el, spec, { actions: false, renderer: "svg" }).then((r) => { page.views[name] = r.view; });
  });
  Promise.all(embeds)
    .then(() => (window.pageMain ? window.pageMain(page) : null))
    .then(() => { document.body.dataset.ready = "1"; })
    .catch((e) => { console.error(e); document.body.dataset.ready = "error"; });
})();
