// diagnose.html: the integrated-gradients viewer (pick a model and a question/answer; tokens shaded by attribution).
window.pageMain = function (page) {
  "use strict";
  const ig = page.data.attribution;
  const models = Object.keys(ig || {});
  if (!models.length) return;
  const $ = (id) => document.getElementById(id);
  const esc = (s) => String(s).replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" })[c]);
  const modelSelect = $("ig-model"), exampleSelect = $("ig-example");
  models.forEach((m) => modelSelect.add(new Option(m, m)));
  const fillExamples = () => {
    exampleSelect.innerHTML = "";
    ig[modelSelect.value].forEach((e, i) => exampleSelect.add(new Option(e.item_id + " — " + e.answer, String(i))));
  };
  const show = () => {
    const e = ig[modelSelect.value][Number(exampleSelect.value)];
    const scale = Math.max(...e.scores.map(Math.abs)) || 1;
    $("ig-tokens").innerHTML = e.tokens.map((t, i) => {
      const s = e.scores[i], a = Math.min(1, Math.abs(s) / scale).toFixed(3);
      const rgb = s >= 0 ? "42,157,92" : "209,73,91";
      const underline = e.roles[i] === "answer" ? "text-decoration: underline;" : "";
      return '<span data-score="' + s + '" title="' + s.toPrecision(4) + " (" + e.roles[i] + ')" style="background: rgba(' +
        rgb + "," + a + ");" + underline + '">' + esc(t) + "</span>";
    }).join("");
    const sum = e.scores.reduce((x, y) => x + y, 0);
    $("ig-summary").textContent = "μ(input) = " + e.mu_input.toFixed(4) + ", μ(pad baseline) = " + e.mu_baseline.toFixed(4) +
      ", sum of attributions = " + sum.toFixed(4) + ", convergence delta = " + e.delta.toExponential(2) +
      "; first answer token ranked " + e.first_answer_rank + " of " + e.tokens.length + ".";
    $("ig-top").innerHTML = e.top.map((t) => "<li><code>" + esc(t.token) + "</code> (" + esc(t.region) + "): " +
      (t.attribution >= 0 ? "+" : "") + t.attribution.toPrecision(4) + "</li>").join("");
  };
  modelSelect.addEventListener("change", () => { fillExamples(); show(); });
  exampleSelect.addEventListener("change", show);
  fillExamples();
  show();
};
