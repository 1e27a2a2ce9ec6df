// report.html: sortable main table, method picker, threshold slider, records browser, provenance.
window.pageMain = function (page) {
  "use strict";
  const d = page.data;
  const R = d.records;
  const $ = (id) => document.getElementById(id);
  const PAGE_ROWS = 200;

  // ---- main table: click a header to sort (numbers by their value, missing values last)
  const table = $("main-table");
  table.querySelectorAll("th.sortable").forEach((th) => {
    th.addEventListener("click", () => {
      const col = Number(th.dataset.col);
      const asc = !th.classList.contains("sorted-asc");
      table.querySelectorAll("th.sortable").forEach((h) => h.classList.remove("sorted-asc", "sorted-desc"));
      th.classList.add(asc ? "sorted-asc" : "sorted-desc");
      const body = table.tBodies[0];
      const key = (tr) => {
        const cell = tr.children[col];
        if (col === 0) return cell.textContent;
        return cell.dataset.value === "" ? null : Number(cell.dataset.value);
      };
      const rows = Array.from(body.rows);
      rows.sort((a, b) => {
        const x = key(a), y = key(b);
        if (x === null) return y === null ? 0 : 1;
        if (y === null) return -1;
        const c = typeof x === "string" ? x.localeCompare(y) : x - y;
        return asc ? c : -c;
      });
      rows.forEach((r) => body.appendChild(r));
    });
  });

  // ---- per-method charts
  const fill = (select) => d.methods.forEach((m) => select.add(new Option(m, m)));
  const methodSelect = $("method-select");
  fill(methodSelect);
  const showMethod = (m) => {
    $("method-aurc").textContent = d.aurc[m] === null ? "–" : (100 * d.aurc[m]).toFixed(1);
    return Promise.all(["reliability", "histogram", "risk"].map((c) => page.signal(c, "method", m)));
  };
  methodSelect.addEventListener("change", () => showMethod(methodSelect.value));

  // ---- selective answering (answer when confidence >= threshold)
  const selMethod = $("sel-method");
  fill(selMethod);
  const slider = $("sel-threshold");
  slider.value = d.threshold;
  const selective = (m, t) => {
    const conf = R.confidence[m];
    let answered = 0, answeredRight = 0, refused = 0, refusedRight = 0;
    for (let i = 0; i < conf.length; i++) {
      if (conf[i] >= t) { answered++; answeredRight += R.correct[i]; } else { refused++; refusedRight += R.correct[i]; }
    }
    return {
      answered, n: conf.length,
      accuracy: answered ? answeredRight / answered : null,
      coverage: conf.length ? answered / conf.length : null,
      over: refused ? refusedRight / refused : null,
    };
  };
  const updateSelective = () => {
    const m = selMethod.value, t = Number(slider.value);
    const s = selective(m, t);
    $("sel-threshold-value").textContent = t.toFixed(2);
    $("sel-accuracy").textContent = page.fmtPct(s.accuracy);
    $("sel-coverage").textContent = page.fmtPct(s.coverage);
    $("sel-over").textContent = page.fmtPct(s.over);
    $("sel-answered").textContent = s.answered + " / " + s.n;
    page.signal("selective", "method", m);
    page.signal("selective", "threshold", t);
    renderRecords();
  };

  // ---- records browser
  const filter = $("rec-filter"), search = $("rec-search");
  const head = $("rec-table").tHead, body = $("rec-table").tBodies[0];
  const columns = (d.has_records ? ["id", "dataset", "question", "gold", "answer", "correct"]
    : ["id", "dataset", "correct"]).concat(d.methods);
  head.innerHTML = "<tr>" + columns.map((c) => "<th>" + escapeHtml(c) + "</th>").join("") + "</tr>";
  function escapeHtml(s) {
    return String(s).replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" })[c]);
  }
  function matching() {
    const m = selMethod.value, t = Number(slider.value), kind = filter.value;
    const q = search.value.trim().toLowerCase();
    const conf = R.confidence[m];
    const out = [];
    for (let i = 0; i < R.id.length; i++) {
      if (kind === "confident-wrong" && !(conf[i] >= t && R.correct[i] === 0)) continue;
      if (kind === "unsure-right" && !(conf[i] < t && R.correct[i] === 1)) continue;
      if (q && !(R.id[i] + " " + R.question[i] + " " + R.answer[i] + " " + R.gold[i]).toLowerCase().includes(q)) continue;
      out.push(i);
    }
    return out;
  }
  function renderRecords() {
    const rows = matching();
    $("rec-count").textContent = rows.length + " of " + R.id.length + " records";
    $("rec-count").dataset.count = rows.length;
    const shown = rows.slice(0, PAGE_ROWS);
    body.innerHTML = shown.map((i) => {
      const cells = columns.map((c) => {
        if (c === "correct") return '<td class="' + (R.correct[i] ? "ok" : "bad") + '">' + (R.correct[i] ? "✓" : "✗") + "</td>";
        if (d.methods.includes(c)) return '<td class="num">' + R.confidence[c][i].toFixed(3) + "</td>";
        return "<td>" + escapeHtml(R[c][i]) + "</td>";
      });
      return '<tr data-index="' + i + '">' + cells.join("") + "</tr>";
    }).join("");
    $("rec-more").textContent = rows.length > PAGE_ROWS ? "showing the first " + PAGE_ROWS + "; filter or search to narrow" : "";
  }
  slider.addEventListener("input", updateSelective);
  selMethod.addEventListener("change", updateSelective);
  filter.addEventListener("change", renderRecords);
  search.addEventListener("input", renderRecords);

  // ---- provenance
  const prov = d.provenance;
  $("provenance-list").innerHTML = Object.entries(prov)
    .filter(([, v]) => v !== null && v !== undefined && !(typeof v === "object" && Object.keys(v).length === 0))
    .map(([k, v]) => "<dt>" + escapeHtml(k) + "</dt><dd>" + escapeHtml(typeof v === "string" ? v : JSON.stringify(v)) + "</dd>")
    .join("");

  updateSelective();
  return showMethod(d.methods[0]);
};
